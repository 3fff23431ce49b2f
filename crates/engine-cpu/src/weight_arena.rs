//! Storage for repacked weight matrices: many matrices end to end in large slabs.
//!
//! mimalloc rounds an allocation up to its size class and backs large ones with transparent
//! huge pages, so the rounding is resident too: the 3,072 expert matrices (296 KiB each) of a
//! Qwen3-MoE-shaped model held 184 MiB (19%) more than their bytes. Slabs of 64 MiB filled in
//! order leave only the untouched end of each slab, which is not resident (but for the rest
//! of its last huge page).

use std::alloc::Layout;
use std::sync::{Arc, Mutex, Weak};

/// Bytes of a slab; a matrix larger than half of one gets a slab of its own.
const SLAB: usize = 64 << 20;
/// Alignment of a slab (a huge page) and of every buffer in it (a cache line).
const SLAB_ALIGN: usize = 2 << 20;
const ALIGN: usize = 64;

struct Slab {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: a slab is plain memory; the buffers carved from it are disjoint.
unsafe impl Send for Slab {}
unsafe impl Sync for Slab {}

impl Slab {
    fn new(bytes: usize) -> Arc<Slab> {
        let layout = Layout::from_size_align(bytes.max(ALIGN), SLAB_ALIGN)
            .expect("a weight slab's size fits a Layout");
        // SAFETY: the layout's size is non-zero. Uninitialized: each buffer zeroes its range,
        // so the pages nothing is carved from are never touched.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // Huge pages whatever the global allocator: the server's (mimalloc) backs large
        // blocks with them already, the system allocator (the crate's benches and examples,
        // an embedder) does not where the kernel's policy is `madvise`, and a mixture's
        // experts streamed from 4 KiB pages were 13% slower (`examples/moeprof.rs`). Advice
        // only: a kernel without transparent huge pages ignores it.
        #[cfg(target_os = "linux")]
        // SAFETY: the slab's own range, just allocated.
        unsafe {
            libc::madvise(ptr.cast(), layout.size(), libc::MADV_HUGEPAGE);
        }
        Arc::new(Slab { ptr, layout })
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `Slab::new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Where buffers are carved: the slab being filled and its bytes used. Weak: a slab whose
/// matrices were all dropped (a model unloaded) is freed rather than kept for the next.
pub(crate) struct Arena {
    current: Mutex<Option<(Weak<Slab>, usize)>>,
}

/// The arena every repacked weight matrix comes from.
static WEIGHTS: Arena = Arena::new();

/// A zeroed, 64-byte aligned byte buffer inside a slab, owned by one matrix.
pub(crate) struct ArenaBuf {
    _slab: Arc<Slab>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer's range is its own (no other buffer overlaps it), like a `Vec<u8>`.
unsafe impl Send for ArenaBuf {}
unsafe impl Sync for ArenaBuf {}

impl ArenaBuf {
    /// `len` zero bytes from the weights' arena.
    pub(crate) fn zeroed(len: usize) -> ArenaBuf {
        WEIGHTS.zeroed(len)
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes at `ptr`, alive while `_slab` is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` is the only way to this range.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Arena {
    pub(crate) const fn new() -> Arena {
        Arena {
            current: Mutex::new(None),
        }
    }

    /// `len` zero bytes.
    pub(crate) fn zeroed(&self, len: usize) -> ArenaBuf {
        let (slab, offset) = self.carve(len.next_multiple_of(ALIGN));
        // SAFETY: `offset + len` lies inside the slab (`carve`), and no other buffer has it.
        let ptr = unsafe { slab.ptr.add(offset) };
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        ArenaBuf {
            _slab: slab,
            ptr,
            len,
        }
    }

    /// A slab with `len` free bytes and where they start.
    fn carve(&self, len: usize) -> (Arc<Slab>, usize) {
        if len > SLAB / 2 {
            return (Slab::new(len), 0);
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((weak, used)) = current.as_mut()
            && let Some(slab) = weak.upgrade()
            && *used + len <= SLAB
        {
            let at = *used;
            *used += len;
            return (slab, at);
        }
        let slab = Slab::new(SLAB);
        *current = Some((Arc::downgrade(&slab), len));
        (slab, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_disjoint() {
        let arena = Arena::new();
        let mut bufs: Vec<ArenaBuf> = [100, 64, 4096, 1, 3 << 20]
            .iter()
            .map(|&n| arena.zeroed(n))
            .collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert!(b.bytes().iter().all(|&x| x == 0));
            b.bytes_mut().fill(i as u8 + 1);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.bytes().iter().all(|&x| x == i as u8 + 1),
                "buffer {i} overwritten"
            );
        }
        // End to end in one slab.
        assert_eq!(bufs[1].as_ptr() as usize, bufs[0].as_ptr() as usize + 128);
        assert!(bufs.iter().all(|b| Arc::ptr_eq(&b._slab, &bufs[0]._slab)));
        // One larger than half a slab has a slab of its own; the arena goes on after it.
        let big = arena.zeroed(SLAB / 2 + 1);
        assert_eq!(big.as_ptr() as usize % SLAB_ALIGN, 0);
        assert!(!Arc::ptr_eq(&big._slab, &bufs[0]._slab));
        let after = arena.zeroed(8);
        assert!(Arc::ptr_eq(&after._slab, &bufs[0]._slab));
        // Past a slab's end, the next slab.
        let rest = arena.zeroed(SLAB / 2);
        let next = arena.zeroed(SLAB / 2);
        assert!(Arc::ptr_eq(&rest._slab, &bufs[0]._slab));
        assert!(!Arc::ptr_eq(&next._slab, &bufs[0]._slab));
    }

    #[test]
    fn a_slab_is_freed_with_its_last_buffer() {
        let arena = Arena::new();
        let (a, b) = (arena.zeroed(1000), arena.zeroed(1000));
        let slab = Arc::downgrade(&a._slab);
        drop(a);
        assert_eq!(slab.strong_count(), 1);
        drop(b);
        assert_eq!(slab.strong_count(), 0, "the arena kept a slab nothing uses");
        // The next buffer starts a new slab.
        assert_eq!(arena.zeroed(8).as_ptr() as usize % SLAB_ALIGN, 0);
    }
}
