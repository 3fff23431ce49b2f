//! [`EmuDevice`]: [`lmi_cuda::Device`] on the host.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use lmi_cuda::{Arg, CudaError, DevPtr, Device, DeviceInfo, Function, Gemm, LaunchConfig, Result};

use crate::ffi::{self, KernelInfo};
use crate::gemm;
use crate::graph::{Capture, EmuGraph, Op};
use crate::memory::Memory;

/// Dynamic shared memory a kernel may use without opting in (as on a GPU).
const DEFAULT_MAX_SHARED: u32 = 48 * 1024;
/// The opt-in limit of an H100 (sm_90).
const MAX_SHARED: u32 = 227 * 1024;
const DEFAULT_TOTAL_MEMORY: usize = 4 << 30;

/// The order the threads of a block (or the blocks of a grid) are run in. A kernel must give
/// the same result in both: a difference means a missing `__syncthreads` (or a race between
/// blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Linear id ascending (x fastest).
    #[default]
    Forward,
    /// Linear id descending.
    Reverse,
}

/// The order of threads within a block.
pub type ThreadOrder = Order;
/// The order of blocks within a grid.
pub type BlockOrder = Order;

impl Order {
    fn from_env(var: &str) -> Order {
        match std::env::var(var).as_deref() {
            Ok("reverse") | Ok("Reverse") | Ok("REVERSE") => Order::Reverse,
            _ => Order::Forward,
        }
    }

    fn from_u8(v: u8) -> Order {
        if v == 1 {
            Order::Reverse
        } else {
            Order::Forward
        }
    }
}

struct State {
    memory: Memory,
    capture: Option<Capture>,
    max_shared: HashMap<usize, u32>,
}

/// The CUDA device emulated on the CPU: the kernels of `kernels/` compiled as host C++, one
/// fiber per CUDA thread; memory in guarded, poisoned mappings; cuBLAS's product on the host;
/// graphs as recorded lists.
pub struct EmuDevice {
    id: u64,
    info: DeviceInfo,
    kernels: &'static [KernelInfo],
    state: Mutex<State>,
    thread_order: AtomicU8,
    block_order: AtomicU8,
    launches: AtomicU64,
}

impl Default for EmuDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl EmuDevice {
    /// A device with every compiled kernel. Thread and block orders start as
    /// `LMI_EMU_THREAD_ORDER` / `LMI_EMU_BLOCK_ORDER` say (`forward`, the default, or
    /// `reverse`), so a whole test suite can be rerun in the other order.
    pub fn new() -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let total_memory = std::env::var("LMI_EMU_TOTAL_MEMORY_MB")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .map_or(DEFAULT_TOTAL_MEMORY, |mb| mb << 20);
        EmuDevice {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            info: DeviceInfo {
                name: "emulated (CPU)".into(),
                compute_capability: (9, 0),
                multiprocessors: 132,
                max_shared_mem_per_block: MAX_SHARED,
                total_memory,
                emulated: true,
            },
            kernels: ffi::kernels(),
            state: Mutex::new(State {
                memory: Memory::default(),
                capture: None,
                max_shared: HashMap::new(),
            }),
            thread_order: AtomicU8::new(Order::from_env("LMI_EMU_THREAD_ORDER") as u8),
            block_order: AtomicU8::new(Order::from_env("LMI_EMU_BLOCK_ORDER") as u8),
            launches: AtomicU64::new(0),
        }
    }

    /// A device of `total` bytes (tests with sparse buffers larger than the default 4 GiB:
    /// allocations of 1 GiB and more are not poisoned, so they cost only what is written).
    pub fn with_total_memory(total: usize) -> Self {
        let mut d = Self::new();
        d.info.total_memory = total;
        d
    }

    pub fn set_thread_order(&self, order: ThreadOrder) {
        self.thread_order.store(order as u8, Ordering::Relaxed);
    }

    pub fn thread_order(&self) -> ThreadOrder {
        Order::from_u8(self.thread_order.load(Ordering::Relaxed))
    }

    pub fn set_block_order(&self, order: BlockOrder) {
        self.block_order.store(order as u8, Ordering::Relaxed);
    }

    pub fn block_order(&self) -> BlockOrder {
        Order::from_u8(self.block_order.load(Ordering::Relaxed))
    }

    /// Kernel launches run so far (a replayed graph counts each of its launches; captured
    /// launches count when replayed, not when recorded).
    pub fn launch_count(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// Names of every kernel compiled in (from `kernels/` and the emulator's `test_kernels/`).
    pub fn kernel_names(&self) -> Vec<&'static str> {
        self.kernels.iter().map(|k| k.name.as_str()).collect()
    }

    /// A kernel's file and signature, by name.
    pub fn kernel_info(&self, name: &str) -> Option<&'static KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }

    /// Bytes currently allocated.
    pub fn memory_in_use(&self) -> usize {
        self.lock().memory.used()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent (every mutation is a
        // single step), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses `what` while capturing, and invalidates the capture as CUDA does.
    fn refuse_in_capture(state: &mut State, what: &str) -> Result<()> {
        if let Some(c) = state.capture.as_mut() {
            let msg = format!("{what} is not allowed while a graph is being captured");
            c.invalid.get_or_insert_with(|| msg.clone());
            return Err(CudaError::Invalid(msg));
        }
        Ok(())
    }

    fn kernel(&self, f: Function) -> Result<&'static KernelInfo> {
        self.kernels
            .get(f.0)
            .ok_or_else(|| CudaError::Invalid(format!("no kernel with index {}", f.0)))
    }

    /// Everything about a launch that can be checked without running it.
    fn check_launch(
        &self,
        state: &State,
        f: Function,
        cfg: &LaunchConfig,
        args: &[Arg],
    ) -> Result<()> {
        let k = self.kernel(f)?;
        let signature = || {
            k.params
                .iter()
                .map(|p| p.ty.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if args.len() != k.params.len() {
            return Err(CudaError::Invalid(format!(
                "launch of `{}` ({}): {} arguments given, the kernel takes {}: ({})",
                k.name,
                k.file,
                args.len(),
                k.params.len(),
                signature()
            )));
        }
        for (i, (a, p)) in args.iter().zip(&k.params).enumerate() {
            if a.size() != p.size {
                return Err(CudaError::Invalid(format!(
                    "launch of `{}` ({}): parameter {i} is `{}` ({} bytes) but argument {a:?} is \
                     {} bytes; the kernel takes ({})",
                    k.name,
                    k.file,
                    p.ty,
                    p.size,
                    a.size(),
                    signature()
                )));
            }
            if let Arg::Ptr(ptr) = a
                && !ptr.is_null()
                && state.memory.find(ptr.0).is_none()
            {
                return Err(CudaError::Invalid(format!(
                    "launch of `{}`: argument {i} ({}) = {:#x} is not inside any live allocation \
                     (freed, or never allocated?)",
                    k.name, p.ty, ptr.0
                )));
            }
        }
        let limit = state
            .max_shared
            .get(&f.0)
            .copied()
            .unwrap_or(DEFAULT_MAX_SHARED);
        if cfg.shared_mem_bytes > limit {
            return Err(CudaError::Invalid(format!(
                "launch of `{}`: {} bytes of dynamic shared memory exceed the kernel's limit of \
                 {limit} (raise it with set_max_dynamic_shared, up to {MAX_SHARED})",
                k.name, cfg.shared_mem_bytes
            )));
        }
        Ok(())
    }

    fn run_launch(
        &self,
        state: &State,
        f: Function,
        cfg: &LaunchConfig,
        args: &[Arg],
    ) -> Result<()> {
        self.check_launch(state, f, cfg, args)?;
        let k = self.kernel(f)?;
        let mut values: Vec<u64> = args.iter().map(Arg::to_bits).collect();
        let (g, b) = (cfg.grid, cfg.block);
        ffi::launch(
            f.0,
            [g.0, g.1, g.2],
            [b.0, b.1, b.2],
            cfg.shared_mem_bytes,
            self.thread_order() == Order::Reverse,
            self.block_order() == Order::Reverse,
            &mut values,
        )
        .map_err(CudaError::Driver)?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        for (i, a) in args.iter().enumerate() {
            if let Arg::Ptr(p) = a
                && let Some(msg) = state.memory.take_overrun(p.0)
            {
                return Err(CudaError::Driver(format!(
                    "kernel `{}` ({}) {msg}; argument {i} points into it",
                    k.name, k.file
                )));
            }
        }
        Ok(())
    }

    fn run_op(&self, state: &State, op: &Op) -> Result<()> {
        match op {
            Op::Launch { f, cfg, args } => self.run_launch(state, *f, cfg, args),
            Op::Gemm(g) => gemm::gemm(&state.memory, g),
            Op::MemsetZero { dst, bytes } => {
                state.memory.check(*dst, *bytes, "memset_zero")?;
                // SAFETY: the range lies inside a live allocation (checked above).
                unsafe { std::ptr::write_bytes(dst.0 as *mut u8, 0, *bytes) };
                Ok(())
            }
            Op::Dtod { src, dst, bytes } => {
                state.memory.check(*src, *bytes, "dtod source")?;
                state.memory.check(*dst, *bytes, "dtod destination")?;
                // SAFETY: both ranges lie inside live allocations; `copy` allows overlap.
                unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, *bytes) };
                Ok(())
            }
        }
    }

    /// Records `op` while capturing (after checking what can be checked now), else runs it.
    fn issue(&self, op: Op) -> Result<()> {
        let mut state = self.lock();
        if state.capture.is_some() {
            let checked = match &op {
                Op::Launch { f, cfg, args } => self.check_launch(&state, *f, cfg, args),
                Op::MemsetZero { dst, bytes } => state.memory.check(*dst, *bytes, "memset_zero"),
                Op::Dtod { src, dst, bytes } => state
                    .memory
                    .check(*src, *bytes, "dtod source")
                    .and_then(|()| state.memory.check(*dst, *bytes, "dtod destination")),
                Op::Gemm(_) => Ok(()),
            };
            checked?;
            if let Some(c) = state.capture.as_mut() {
                c.ops.push(op);
            }
            return Ok(());
        }
        self.run_op(&state, &op)
    }
}

impl Device for EmuDevice {
    type Graph = EmuGraph;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn function(&self, name: &str) -> Result<Function> {
        self.kernels
            .iter()
            .position(|k| k.name == name)
            .map(Function)
            .ok_or_else(|| CudaError::UnknownKernel(name.to_string()))
    }

    fn set_max_dynamic_shared(&self, f: Function, bytes: u32) -> Result<()> {
        let k = self.kernel(f)?;
        if bytes > MAX_SHARED {
            return Err(CudaError::Invalid(format!(
                "`{}`: {bytes} bytes of dynamic shared memory exceed the device's {MAX_SHARED}",
                k.name
            )));
        }
        self.lock().max_shared.insert(f.0, bytes);
        Ok(())
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        let mut state = self.lock();
        Self::refuse_in_capture(&mut state, "alloc")?;
        let limit = self.info.total_memory;
        state.memory.alloc(bytes, limit)
    }

    fn free(&self, ptr: DevPtr) {
        let mut state = self.lock();
        if Self::refuse_in_capture(&mut state, "free").is_err() {
            return; // the capture is invalidated: end_capture reports it
        }
        if let Err(e) = state.memory.free(ptr) {
            drop(state);
            if std::thread::panicking() {
                eprintln!("lmi-cuda-emu: {e}");
            } else {
                panic!("lmi-cuda-emu: {e}");
            }
        }
    }

    fn memset_zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        self.issue(Op::MemsetZero { dst, bytes })
    }

    fn htod(&self, src: &[u8], dst: DevPtr) -> Result<()> {
        let mut state = self.lock();
        Self::refuse_in_capture(&mut state, "htod")?;
        state.memory.check(dst, src.len(), "htod")?;
        // SAFETY: the destination lies inside a live allocation (checked above), which no Rust
        // reference aliases.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.0 as *mut u8, src.len()) };
        Ok(())
    }

    fn dtoh(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        let mut state = self.lock();
        Self::refuse_in_capture(&mut state, "dtoh")?;
        state.memory.check(src, dst.len(), "dtoh")?;
        // SAFETY: the source lies inside a live allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn dtod(&self, src: DevPtr, dst: DevPtr, bytes: usize) -> Result<()> {
        self.issue(Op::Dtod { src, dst, bytes })
    }

    fn launch(&self, f: Function, cfg: &LaunchConfig, args: &[Arg]) -> Result<()> {
        self.issue(Op::Launch {
            f,
            cfg: *cfg,
            args: args.to_vec(),
        })
    }

    fn gemm(&self, g: &Gemm) -> Result<()> {
        self.issue(Op::Gemm(*g))
    }

    fn synchronize(&self) -> Result<()> {
        Self::refuse_in_capture(&mut self.lock(), "synchronize")
    }

    fn memory_info(&self) -> Result<(usize, usize)> {
        let mut state = self.lock();
        Self::refuse_in_capture(&mut state, "memory_info")?;
        let total = self.info.total_memory;
        Ok((total.saturating_sub(state.memory.used()), total))
    }

    fn begin_capture(&self) -> Result<()> {
        let mut state = self.lock();
        if state.capture.is_some() {
            return Err(CudaError::Invalid(
                "begin_capture while already capturing".into(),
            ));
        }
        state.capture = Some(Capture::default());
        Ok(())
    }

    fn end_capture(&self) -> Result<EmuGraph> {
        let capture = self
            .lock()
            .capture
            .take()
            .ok_or_else(|| CudaError::Invalid("end_capture without begin_capture".into()))?;
        if let Some(msg) = capture.invalid {
            return Err(CudaError::Invalid(format!(
                "the capture was invalidated: {msg}"
            )));
        }
        Ok(EmuGraph {
            device: self.id,
            ops: capture.ops,
        })
    }

    fn replay(&self, graph: &EmuGraph) -> Result<()> {
        if graph.device != self.id {
            return Err(CudaError::Invalid(
                "replay of a graph captured on another device".into(),
            ));
        }
        let mut state = self.lock();
        Self::refuse_in_capture(&mut state, "replay")?;
        for (i, op) in graph.ops.iter().enumerate() {
            self.run_op(&state, op).map_err(|e| {
                CudaError::Driver(format!("replay, operation {i} of {}: {e}", graph.ops.len()))
            })?;
        }
        Ok(())
    }
}
