//! The device interface the CUDA backend is written against. [`crate::driver::CudaDevice`]
//! implements it on a GPU through cudarc; the test-only crate `lmi-cuda-emu` implements it on
//! the host (the same `.cu` files compiled as C++, one fiber per CUDA thread), so the backend's
//! host side and every kernel run in CI without a GPU.
//!
//! Device addresses are plain integers ([`DevPtr`]): a `CUdeviceptr` on a GPU, a host address
//! under emulation. Work is issued in order on one stream; only [`Device::dtoh`] and
//! [`Device::synchronize`] wait for it.

use crate::error::Result;

/// A device address: a `CUdeviceptr` on a GPU, a host address under emulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DevPtr(pub u64);

impl DevPtr {
    pub const NULL: DevPtr = DevPtr(0);

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevPtr {
        DevPtr(self.0 + bytes as u64)
    }

    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// One kernel argument, passed by value as `cuLaunchKernel` takes them. Each variant's size
/// must equal the kernel parameter's (`Ptr` and the 64-bit variants 8 bytes, the rest 4);
/// the emulator checks this against the kernel's signature.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    Ptr(DevPtr),
    U32(u32),
    I32(i32),
    F32(f32),
    U64(u64),
    F64(f64),
}

impl Arg {
    /// Size of the parameter in bytes.
    pub fn size(&self) -> usize {
        match self {
            Arg::Ptr(_) | Arg::U64(_) | Arg::F64(_) => 8,
            Arg::U32(_) | Arg::I32(_) | Arg::F32(_) => 4,
        }
    }

    /// The parameter's bytes, little-endian, in the first `size()` bytes.
    pub fn to_bits(&self) -> u64 {
        match *self {
            Arg::Ptr(p) => p.0,
            Arg::U64(v) => v,
            Arg::F64(v) => v.to_bits(),
            Arg::U32(v) => v as u64,
            Arg::I32(v) => v as u32 as u64,
            Arg::F32(v) => v.to_bits() as u64,
        }
    }
}

impl From<DevPtr> for Arg {
    fn from(p: DevPtr) -> Self {
        Arg::Ptr(p)
    }
}
impl From<u32> for Arg {
    fn from(v: u32) -> Self {
        Arg::U32(v)
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::I32(v)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Self {
        Arg::F32(v)
    }
}
impl From<u64> for Arg {
    fn from(v: u64) -> Self {
        Arg::U64(v)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Self {
        Arg::F64(v)
    }
}

/// A kernel resolved by [`Device::function`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Function(pub usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D grid of `blocks` blocks of `threads` threads.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    pub fn with_shared(mut self, bytes: u32) -> Self {
        self.shared_mem_bytes = bytes;
        self
    }
}

/// Element types a matrix product reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    F32,
    BF16,
}

impl ElemType {
    pub fn size(self) -> usize {
        match self {
            ElemType::F32 => 4,
            ElemType::BF16 => 2,
        }
    }
}

/// `out[m, n] (+)= Σ_k x[m, k] · w[n, k]` over row-major matrices (the `x · wᵀ` of a linear
/// layer with HF `[out, in]` weights), accumulated in f32. Leading dimensions are row strides
/// in elements, so `out` may be a column slice of a wider matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub x: DevPtr,
    pub x_type: ElemType,
    pub ldx: usize,
    pub w: DevPtr,
    pub w_type: ElemType,
    pub ldw: usize,
    pub out: DevPtr,
    pub out_type: ElemType,
    pub ldout: usize,
    /// Add to `out` instead of overwriting it (beta = 1).
    pub accumulate: bool,
}

/// What the backend sizes its launches by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    pub multiprocessors: u32,
    /// Largest dynamic shared memory a block may opt in to, in bytes.
    pub max_shared_mem_per_block: u32,
    pub total_memory: usize,
    /// False for a real GPU.
    pub emulated: bool,
}

/// One device and its single stream. Every method issues work in stream order.
///
/// # Safety contract
/// Kernels and copies read and write raw device addresses: callers keep every address they
/// pass inside a live allocation of this device. Violations are memory errors on the device
/// (caught by guard pages under emulation).
pub trait Device: Send + Sync + 'static {
    /// A captured sequence of work that can be replayed.
    type Graph: Send;

    fn info(&self) -> &DeviceInfo;

    /// Resolves a kernel of the embedded sources by its `extern "C"` name.
    fn function(&self, name: &str) -> Result<Function>;
    /// Lets `f` use up to `bytes` of dynamic shared memory (needed above 48 KiB).
    fn set_max_dynamic_shared(&self, f: Function, bytes: u32) -> Result<()>;

    /// `bytes` of device memory, uninitialized (poisoned under emulation).
    fn alloc(&self, bytes: usize) -> Result<DevPtr>;
    /// Frees an allocation from [`Device::alloc`] once the work issued so far is done.
    fn free(&self, ptr: DevPtr);
    fn memset_zero(&self, dst: DevPtr, bytes: usize) -> Result<()>;
    /// Copies host bytes to the device. `src` may be reused as soon as this returns.
    fn htod(&self, src: &[u8], dst: DevPtr) -> Result<()>;
    /// Copies device bytes to the host, after all work issued before it.
    fn dtoh(&self, src: DevPtr, dst: &mut [u8]) -> Result<()>;
    fn dtod(&self, src: DevPtr, dst: DevPtr, bytes: usize) -> Result<()>;

    fn launch(&self, f: Function, cfg: &LaunchConfig, args: &[Arg]) -> Result<()>;
    fn gemm(&self, g: &Gemm) -> Result<()>;

    /// Waits for all work issued so far.
    fn synchronize(&self) -> Result<()>;

    /// `(free, total)` bytes of device memory once the work issued so far has finished, with
    /// the memory the allocator keeps for reuse handed back first (what a measurement of the
    /// memory in use wants). Waits for the device.
    fn memory_info(&self) -> Result<(usize, usize)>;

    /// Starts recording: launches, products, memsets and device copies issued until
    /// [`Device::end_capture`] are recorded, not run. Host copies and allocation are refused
    /// while recording.
    fn begin_capture(&self) -> Result<()>;
    fn end_capture(&self) -> Result<Self::Graph>;
    /// Runs a captured graph: the same launches with the same arguments.
    fn replay(&self, graph: &Self::Graph) -> Result<()>;
}

/// Typed helpers over [`Device`]'s byte copies.
pub trait DeviceExt: Device {
    fn htod_slice<T: Pod>(&self, src: &[T], dst: DevPtr) -> Result<()> {
        self.htod(as_bytes(src), dst)
    }
    fn dtoh_vec<T: Pod + Default + Clone>(&self, src: DevPtr, len: usize) -> Result<Vec<T>> {
        let mut v = vec![T::default(); len];
        self.dtoh(src, as_bytes_mut(&mut v))?;
        Ok(v)
    }
}

impl<D: Device + ?Sized> DeviceExt for D {}

/// Plain data with no padding or invalid bit patterns, copied to and from the device as bytes.
///
/// # Safety
/// Implementors must be `Copy`, contain no padding, and accept every bit pattern.
pub unsafe trait Pod: Copy + 'static {}
// SAFETY: primitive numbers have no padding and accept every bit pattern.
unsafe impl Pod for u8 {}
unsafe impl Pod for u16 {}
unsafe impl Pod for u32 {}
unsafe impl Pod for u64 {}
unsafe impl Pod for i32 {}
unsafe impl Pod for i64 {}
unsafe impl Pod for f32 {}
unsafe impl Pod for f64 {}

pub fn as_bytes<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: T is Pod (no padding), and u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub fn as_bytes_mut<T: Pod>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: T is Pod, so any bytes written are a valid T.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}
