//! Emulated device memory: each allocation is its own mapping, placed so that it ends just
//! before a `PROT_NONE` guard page (a kernel reading or writing past the end faults at once),
//! and filled with 0xFF (NaN as f32 or bf16) so reading memory nothing wrote shows up as NaN.
//!
//! CUDA allocations start 256-byte aligned, so up to 255 bytes of slack can sit between an
//! allocation's end and its guard page; those stay poisoned, and writes there are reported
//! after the launch that made them.
//!
//! Allocations of [`SPARSE_BYTES`] or more are not poisoned: filling them would touch every
//! page, and tests use such sizes for sparse buffers (a KV pool with block ids above 2^20,
//! whose few used blocks alone are written). Their unwritten bytes read as zeros.

use std::collections::BTreeMap;

use lmi_cuda::{CudaError, DevPtr, Result};

const ALIGN: usize = 256;
const POISON: u8 = 0xff;
/// From this size on, an allocation is left as the kernel maps it (zero pages, untouched).
pub(crate) const SPARSE_BYTES: usize = 1 << 30;

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

#[derive(Debug)]
struct Allocation {
    map_base: usize,
    map_len: usize,
    len: usize,
    /// Poisoned bytes between the end and the guard page.
    slack: usize,
}

/// The live allocations of one device, by start address.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    live: BTreeMap<u64, Allocation>,
    used: usize,
}

impl Memory {
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    pub(crate) fn alloc(&mut self, bytes: usize, limit: usize) -> Result<DevPtr> {
        if self.used.saturating_add(bytes) > limit {
            return Err(CudaError::Driver(format!(
                "out of memory: allocating {bytes} bytes with {} of the emulated device's {limit} \
                 in use (LMI_EMU_TOTAL_MEMORY_MB raises the limit)",
                self.used
            )));
        }
        let page = page_size();
        let rounded = bytes.div_ceil(ALIGN) * ALIGN;
        let data = rounded.div_ceil(page) * page;
        let map_len = data + page;
        // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(CudaError::Driver(format!(
                "out of memory: mmap of {map_len} bytes failed: {}",
                std::io::Error::last_os_error()
            )));
        }
        let base = base as usize;
        // SAFETY: the last page of the mapping just made; the poisoned range lies inside it.
        unsafe {
            if libc::mprotect((base + data) as *mut libc::c_void, page, libc::PROT_NONE) != 0 {
                let err = std::io::Error::last_os_error();
                libc::munmap(base as *mut libc::c_void, map_len);
                return Err(CudaError::Driver(format!(
                    "mprotect of a guard page failed: {err}"
                )));
            }
            if bytes < SPARSE_BYTES {
                std::ptr::write_bytes((base + data - rounded) as *mut u8, POISON, rounded);
            } else {
                // Only the slack, where overruns are looked for.
                std::ptr::write_bytes(
                    (base + data - rounded + bytes) as *mut u8,
                    POISON,
                    rounded - bytes,
                );
            }
        }
        let start = (base + data - rounded) as u64;
        self.live.insert(
            start,
            Allocation {
                map_base: base,
                map_len,
                len: bytes,
                slack: rounded - bytes,
            },
        );
        self.used += bytes;
        Ok(DevPtr(start))
    }

    pub(crate) fn free(&mut self, ptr: DevPtr) -> Result<()> {
        let a = self.live.remove(&ptr.0).ok_or_else(|| {
            CudaError::Invalid(format!(
                "free of {:#x}, which is not the start of a live allocation (double free?)",
                ptr.0
            ))
        })?;
        self.used -= a.len;
        // SAFETY: the mapping was made by `alloc` and is no longer registered.
        unsafe { libc::munmap(a.map_base as *mut libc::c_void, a.map_len) };
        Ok(())
    }

    /// The allocation holding `addr` (its one-past-the-end address included): (start, len).
    pub(crate) fn find(&self, addr: u64) -> Option<(u64, usize)> {
        let (&start, a) = self.live.range(..=addr).next_back()?;
        (addr <= start + a.len as u64).then_some((start, a.len))
    }

    /// Checks that `[ptr, ptr + bytes)` lies inside one live allocation.
    pub(crate) fn check(&self, ptr: DevPtr, bytes: usize, what: &str) -> Result<()> {
        let fits = self.find(ptr.0).is_some_and(|(start, len)| {
            ptr.0
                .checked_add(bytes as u64)
                .is_some_and(|end| end <= start + len as u64)
        });
        if fits {
            return Ok(());
        }
        let near = match self.find(ptr.0) {
            Some((start, len)) => format!(
                "it starts {} bytes into the allocation at {start:#x} of {len} bytes",
                ptr.0 - start
            ),
            None => "no live allocation holds its start (freed, or never allocated?)".into(),
        };
        Err(CudaError::Invalid(format!(
            "{what}: {bytes} bytes at {:#x} do not fit in one live allocation: {near}",
            ptr.0
        )))
    }

    /// Bytes written into the slack after the allocation holding `addr` (reported, then
    /// poisoned again): a kernel wrote past the allocation's end.
    pub(crate) fn take_overrun(&self, addr: u64) -> Option<String> {
        let (start, a) = self.live.range(..=addr).next_back()?;
        if addr > start + a.len as u64 || a.slack == 0 {
            return None;
        }
        let end = (start + a.len as u64) as *mut u8;
        // SAFETY: the slack lies between the allocation's end and its guard page, inside the
        // mapping.
        let slack = unsafe { std::slice::from_raw_parts_mut(end, a.slack) };
        let first = slack.iter().position(|&b| b != POISON)?;
        let last = slack.iter().rposition(|&b| b != POISON).unwrap_or(first);
        slack.fill(POISON);
        Some(format!(
            "wrote past the end of the allocation at {start:#x} of {} bytes (bytes {}..={} \
             after its start changed)",
            a.len,
            a.len + first,
            a.len + last
        ))
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        for a in self.live.values() {
            // SAFETY: mappings made by `alloc`; the device is going away with them.
            unsafe { libc::munmap(a.map_base as *mut libc::c_void, a.map_len) };
        }
    }
}
