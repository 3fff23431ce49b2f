//! [`CudaDevice`]: the [`Device`] trait on a GPU, through cudarc's `result`/`sys` layers
//! (raw device addresses, one non-blocking stream, cuBLAS on the same stream, CUDA graphs by
//! stream capture).
//!
//! Every library is loaded through [`crate::libs`] before cudarc is called, so a machine
//! without a driver gets [`CudaError::Unavailable`], never cudarc's panic.

mod gemm;
mod params;
mod probe;
mod staging;

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use cudarc::cublas::sys::cublasHandle_t;
use cudarc::driver::result::{self as drv, DriverError};
use cudarc::driver::sys::{self as drv_sys, CUdevice_attribute::*};

pub use probe::{Versions, probe};

use crate::cache::KernelCache;
use crate::device::{Arg, DevPtr, Device, DeviceInfo, Function, Gemm, LaunchConfig};
use crate::error::{CudaError, Result};
use crate::libs::{self, CudaLib};
use crate::nvrtc::{Arch, Nvrtc, SpillPolicy};
use params::KernelParams;
use staging::{Slot, StagingRing};

/// Pinned staging buffer for a step's copies (token ids, positions, block tables, the
/// sampler's jobs and grammar masks); `staging.rs` states when its space may be reused. A step
/// at batch 256 uploads several MiB (its block tables at long contexts, a 128k-vocabulary
/// mask per constrained row: 4 MiB) and must not wait for the device to do it.
const STAGING_BYTES: usize = 64 << 20;
/// Copies at least this large (weights at load) go directly from pageable memory and wait.
const DIRECT_COPY_BYTES: usize = 16 << 20;
/// cuBLAS workspace, set once so that graph capture never allocates (NVIDIA recommends
/// 32 MiB on Hopper, 4 MiB before).
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// A GPU, its primary context and one non-blocking stream, with every embedded kernel
/// compiled for it and loaded.
pub struct CudaDevice {
    info: DeviceInfo,
    versions: Versions,
    device: drv_sys::CUdevice,
    /// Null until retained; then released on drop.
    ctx: drv_sys::CUcontext,
    /// Null until created.
    stream: drv_sys::CUstream,
    /// `cuMemAllocAsync`/`cuMemFreeAsync` where the device has memory pools.
    stream_ordered_alloc: bool,
    modules: Vec<drv_sys::CUmodule>,
    functions: Mutex<Functions>,
    blas: Mutex<Blas>,
    staging: Mutex<Staging>,
    capture: Mutex<Capture>,
}

// SAFETY: CUDA driver and cuBLAS handles are plain identifiers usable from any thread once the
// context is current there, which every method ensures first (`bind`). The host-side state
// that changes (function table, cuBLAS handle, staging buffer, capture state) is behind
// mutexes.
unsafe impl Send for CudaDevice {}
// SAFETY: as above.
unsafe impl Sync for CudaDevice {}

#[derive(Default)]
struct Functions {
    by_name: HashMap<String, usize>,
    handles: Vec<drv_sys::CUfunction>,
}

struct Blas {
    handle: cublasHandle_t,
    workspace: drv_sys::CUdeviceptr,
}

struct Staging {
    /// Pinned host memory of `STAGING_BYTES`, or null.
    host: *mut u8,
    ring: StagingRing,
}

#[derive(Default)]
struct Capture {
    active: bool,
    /// Frees asked for while capturing: issued at `end_capture`, after the work before it.
    deferred_frees: Vec<DevPtr>,
}

/// A captured graph, instantiated; destroyed on drop (drop it before its device).
pub struct CudaGraph {
    exec: drv_sys::CUgraphExec,
    ctx: drv_sys::CUcontext,
}

// SAFETY: a graph exec handle may be launched and destroyed from any thread with its context
// current, which `replay` and `drop` ensure.
unsafe impl Send for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: `exec` came from cuGraphInstantiate and is destroyed once, with its context
        // current. Errors (the context already gone) leave nothing to free.
        unsafe {
            let _ = drv::ctx::set_current(self.ctx);
            let _ = drv::graph::exec_destroy(self.exec);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Maps a driver error to ours, naming the call.
fn driver_err(call: &str) -> impl FnOnce(DriverError) -> CudaError + '_ {
    move |e| {
        let what = e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        CudaError::Driver(format!("{call}: {:?} ({what})", e.0))
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`: checks the libraries and their versions, compiles every embedded
    /// kernel for the GPU's architecture (through the disk cache of
    /// [`KernelCache::from_env`]) and loads them. Without an NVIDIA driver this returns
    /// [`CudaError::Unavailable`] at once, saying what to install.
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::open_with_cache(ordinal, &KernelCache::from_env())
    }

    pub fn open_with_cache(ordinal: usize, cache: &KernelCache) -> Result<Self> {
        let driver = libs::load(CudaLib::Driver)?;
        probe::init_driver(driver)?;
        let driver_version = probe::driver_version(driver)?;

        let count = drv::device::get_count().map_err(driver_err("cuDeviceGetCount"))?;
        let index = i32::try_from(ordinal)
            .ok()
            .filter(|&i| i < count)
            .ok_or_else(|| {
                CudaError::Invalid(format!(
                    "GPU {ordinal} requested, but the driver sees {count} (check \
                     CUDA_VISIBLE_DEVICES)"
                ))
            })?;
        let device = drv::device::get(index).map_err(driver_err("cuDeviceGet"))?;
        let (info, stream_ordered_alloc) = device_info(device)?;

        let nvrtc = Nvrtc::load()?;
        let cublas = libs::load(CudaLib::Cublas)?;
        let versions = Versions {
            driver: driver_version,
            nvrtc: nvrtc.version(),
            cublas: probe::cublas_version(cublas)?,
        };
        probe::check(&versions)?;

        // Compile before touching the GPU: no context is needed, and a failure leaves
        // nothing to clean up.
        let arch = Arch::from_compute_capability(info.compute_capability);
        let started = Instant::now();
        // A spill on this machine's NVRTC (perhaps an older 13.x than CI's) costs speed, not
        // correctness: logged, never a refusal.
        let compiled = nvrtc.compile_all(arch, cache, SpillPolicy::Warn)?;
        let cached = compiled.iter().filter(|(_, c)| c.from_cache).count();
        tracing::info!(
            "kernels for {arch}: {} files ({cached} from the cache{}) in {:.2?}",
            compiled.len(),
            cache
                .dir()
                .map(|d| format!(" {}", d.display()))
                .unwrap_or_default(),
            started.elapsed()
        );
        for (source, c) in &compiled {
            for w in c.warnings() {
                tracing::warn!(
                    "{} on NVRTC {}.{}: {w} (slower than intended; CI builds it without)",
                    source.name,
                    nvrtc.version().0,
                    nvrtc.version().1
                );
            }
            for f in c.report().iter().filter(|f| f.entry) {
                tracing::debug!(
                    file = source.name,
                    kernel = %f.name,
                    registers = f.registers,
                    stack = f.stack_frame_bytes,
                    smem = f.shared_mem_bytes,
                    "kernel resources"
                );
            }
        }

        // From here on, `dev`'s Drop releases whatever has been created if a step fails.
        let mut dev = CudaDevice {
            info,
            versions,
            device,
            ctx: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            stream_ordered_alloc,
            modules: Vec::new(),
            functions: Mutex::default(),
            blas: Mutex::new(Blas {
                handle: std::ptr::null_mut(),
                workspace: 0,
            }),
            staging: Mutex::new(Staging {
                host: std::ptr::null_mut(),
                ring: StagingRing::new(STAGING_BYTES),
            }),
            capture: Mutex::default(),
        };
        // SAFETY: `device` came from cuDeviceGet after cuInit.
        dev.ctx = unsafe { drv::primary_ctx::retain(device) }
            .map_err(driver_err("cuDevicePrimaryCtxRetain"))?;
        dev.bind()?;
        dev.stream = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .map_err(driver_err("cuStreamCreate"))?;
        if dev.stream_ordered_alloc {
            dev.keep_pool_memory()?;
        }
        for (source, c) in &compiled {
            // SAFETY: the context is current; `c.cubin` is a whole CUBIN image, alive for the
            // call (the driver copies it).
            let module = unsafe { drv::module::load_data(c.cubin.as_ptr().cast()) }
                .map_err(driver_err(&format!("cuModuleLoadData({})", source.name)))?;
            dev.modules.push(module);
        }
        dev.init_blas()?;
        // SAFETY: the context is current; the buffer is freed in Drop.
        let host =
            unsafe { drv::malloc_host(STAGING_BYTES, 0) }.map_err(driver_err("cuMemHostAlloc"))?;
        lock(&dev.staging).host = host.cast();

        tracing::info!(
            "CUDA device {ordinal}: {} ({arch}, {} SMs, {:.1} GiB, {} KiB shared memory per \
             block); {versions}; NVRTC from {}, cuBLAS from {}",
            dev.info.name,
            dev.info.multiprocessors,
            dev.info.total_memory as f64 / (1u64 << 30) as f64,
            dev.info.max_shared_mem_per_block / 1024,
            nvrtc.path().display(),
            cublas.path.display(),
        );
        Ok(dev)
    }

    /// The versions of the driver, NVRTC and cuBLAS in use.
    pub fn versions(&self) -> Versions {
        self.versions
    }

    /// Makes this device's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        if drv::ctx::get_current().map_err(driver_err("cuCtxGetCurrent"))? != Some(self.ctx) {
            // SAFETY: `ctx` is the retained primary context, live until Drop.
            unsafe { drv::ctx::set_current(self.ctx) }.map_err(driver_err("cuCtxSetCurrent"))?;
        }
        Ok(())
    }

    /// Freed memory stays in the device's pool for the next allocation instead of returning
    /// to the driver at every synchronization (the pool's default).
    fn keep_pool_memory(&self) -> Result<()> {
        let mut threshold = u64::MAX;
        // SAFETY: the context is current; the attribute takes a u64, which `threshold` is.
        unsafe {
            let pool = drv::device::get_default_mem_pool(self.device)
                .map_err(driver_err("cuDeviceGetDefaultMemPool"))?;
            drv::mem_pool::set_attribute(
                pool,
                drv_sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
            .map_err(driver_err("cuMemPoolSetAttribute"))
        }
    }

    fn init_blas(&mut self) -> Result<()> {
        let blas = self.blas.get_mut().unwrap_or_else(|p| p.into_inner());
        let blas_err = |call: &'static str| {
            move |e: cudarc::cublas::result::CublasError| {
                CudaError::Blas(format!("{call}: {:?}", e.0))
            }
        };
        blas.handle = cudarc::cublas::result::create_handle().map_err(blas_err("cublasCreate"))?;
        // SAFETY: the context is current (cuBLAS uses the primary context).
        blas.workspace = unsafe { drv::malloc_sync(BLAS_WORKSPACE_BYTES) }
            .map_err(driver_err("cuMemAlloc (cuBLAS workspace)"))?;
        // SAFETY: live handle and stream. The stream first: cublasSetStream resets the
        // workspace to cuBLAS's own pool, which would allocate during graph capture.
        unsafe {
            cudarc::cublas::result::set_stream(blas.handle, self.stream.cast())
                .map_err(blas_err("cublasSetStream"))?;
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                blas.handle,
                blas.workspace as usize as *mut c_void,
                BLAS_WORKSPACE_BYTES,
            )
            .result()
            .map_err(blas_err("cublasSetWorkspace"))?;
        }
        Ok(())
    }

    fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if lock(&self.capture).active {
            return Err(CudaError::Invalid(format!(
                "{what} while capturing a graph: only launches, products, memsets and device \
                 copies can be recorded"
            )));
        }
        Ok(())
    }

    fn sync_stream(&self) -> Result<()> {
        // SAFETY: the stream is live until Drop.
        unsafe { drv::stream::synchronize(self.stream) }.map_err(driver_err("cuStreamSynchronize"))
    }

    /// The staging offset for a copy of `len` bytes, after synchronizing the stream if the
    /// buffer is full; `None` when the copy should go directly (large copies).
    fn staging_slot(&self, staging: &mut Staging, len: usize) -> Result<Option<usize>> {
        if len >= DIRECT_COPY_BYTES {
            return Ok(None);
        }
        match staging.ring.reserve(len) {
            None => Ok(None),
            Some(Slot::At(offset)) => Ok(Some(offset)),
            Some(Slot::AfterSync(offset)) => {
                self.sync_stream()?;
                Ok(Some(offset))
            }
        }
    }

    fn free_now(&self, ptr: DevPtr) -> Result<()> {
        // SAFETY: `ptr` came from `alloc` (the caller's contract) and is freed once; async
        // frees wait for the work issued before them, sync ones for the stream first.
        unsafe {
            if self.stream_ordered_alloc {
                drv::free_async(ptr.0, self.stream).map_err(driver_err("cuMemFreeAsync"))
            } else {
                self.sync_stream()?;
                drv::free_sync(ptr.0).map_err(driver_err("cuMemFree"))
            }
        }
    }
}

/// What the backend sizes its launches by, and whether memory pools are supported.
fn device_info(device: drv_sys::CUdevice) -> Result<(DeviceInfo, bool)> {
    let attr = |a| {
        // SAFETY: `device` came from cuDeviceGet after cuInit.
        unsafe { drv::device::get_attribute(device, a) }
            .map(|v| v.max(0) as u32)
            .map_err(driver_err("cuDeviceGetAttribute"))
    };
    let info = DeviceInfo {
        name: drv::device::get_name(device).map_err(driver_err("cuDeviceGetName"))?,
        compute_capability: probe::compute_capability(device)?,
        multiprocessors: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        max_shared_mem_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        // SAFETY: as above.
        total_memory: unsafe { drv::device::total_mem(device) }
            .map_err(driver_err("cuDeviceTotalMem"))?,
        emulated: false,
    };
    let pools = attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0;
    Ok((info, pools))
}

impl Device for CudaDevice {
    type Graph = CudaGraph;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn function(&self, name: &str) -> Result<Function> {
        let mut functions = lock(&self.functions);
        if let Some(&i) = functions.by_name.get(name) {
            return Ok(Function(i));
        }
        let c_name = CString::new(name).map_err(|_| CudaError::UnknownKernel(name.to_string()))?;
        self.bind()?;
        for &module in &self.modules {
            // SAFETY: the module is loaded until Drop; the context is current.
            match unsafe { drv::module::get_function(module, c_name.clone()) } {
                Ok(f) => {
                    let i = functions.handles.len();
                    functions.handles.push(f);
                    functions.by_name.insert(name.to_string(), i);
                    return Ok(Function(i));
                }
                Err(DriverError(drv_sys::CUresult::CUDA_ERROR_NOT_FOUND)) => continue,
                Err(e) => return Err(driver_err("cuModuleGetFunction")(e)),
            }
        }
        Err(CudaError::UnknownKernel(name.to_string()))
    }

    fn set_max_dynamic_shared(&self, f: Function, bytes: u32) -> Result<()> {
        if bytes > self.info.max_shared_mem_per_block {
            return Err(CudaError::Invalid(format!(
                "{bytes} bytes of dynamic shared memory requested; {} allows at most {} per block",
                self.info.name, self.info.max_shared_mem_per_block
            )));
        }
        let handle = self.handle(f)?;
        self.bind()?;
        // SAFETY: `handle` is a function of a loaded module; the context is current.
        unsafe {
            drv::function::set_function_attribute(
                handle,
                drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(driver_err(
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
        ))
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        self.refuse_while_capturing("alloc")?;
        if bytes == 0 {
            return Ok(DevPtr::NULL);
        }
        self.bind()?;
        // SAFETY: the context is current and the stream live; the memory is returned
        // uninitialized, as the trait says.
        let ptr = unsafe {
            if self.stream_ordered_alloc {
                drv::malloc_async(self.stream, bytes)
                    .map_err(driver_err(&format!("cuMemAllocAsync({bytes} bytes)")))
            } else {
                drv::malloc_sync(bytes).map_err(driver_err(&format!("cuMemAlloc({bytes} bytes)")))
            }
        };
        ptr.map(DevPtr)
    }

    fn free(&self, ptr: DevPtr) {
        if ptr.is_null() {
            return;
        }
        {
            let mut capture = lock(&self.capture);
            if capture.active {
                capture.deferred_frees.push(ptr);
                return;
            }
        }
        if let Err(e) = self.bind().and_then(|()| self.free_now(ptr)) {
            tracing::error!("freeing device memory at {:#x}: {e}", ptr.0);
        }
    }

    fn memset_zero(&self, dst: DevPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller keeps `dst..dst+bytes` inside a live allocation (trait contract).
        unsafe { drv::memset_d8_async(dst.0, 0, bytes, self.stream) }
            .map_err(driver_err("cuMemsetD8Async"))
    }

    fn htod(&self, src: &[u8], dst: DevPtr) -> Result<()> {
        self.refuse_while_capturing("htod")?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut staging = lock(&self.staging);
        let Some(offset) = self.staging_slot(&mut staging, src.len())? else {
            // Large: from the caller's pageable memory, then wait, so `src` may be reused on
            // return. The wait also retires every staged copy.
            // SAFETY: `src` is alive until the synchronization below; `dst` per the contract.
            unsafe { drv::memcpy_htod_async(dst.0, src, self.stream) }
                .map_err(driver_err("cuMemcpyHtoDAsync"))?;
            self.sync_stream()?;
            staging.ring.rewind();
            return Ok(());
        };
        // SAFETY: `offset + len <= STAGING_BYTES` (the ring's guarantee) and no copy in flight
        // reads this range (the staging invariant); the pinned buffer lives until Drop.
        unsafe {
            let staged = std::slice::from_raw_parts_mut(staging.host.add(offset), src.len());
            staged.copy_from_slice(src);
            drv::memcpy_htod_async(dst.0, &*staged, self.stream)
                .map_err(driver_err("cuMemcpyHtoDAsync"))
        }
    }

    fn dtoh(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        self.refuse_while_capturing("dtoh")?;
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut staging = lock(&self.staging);
        let Some(offset) = self.staging_slot(&mut staging, dst.len())? else {
            // SAFETY: `dst` is alive until the synchronization below; `src` per the contract.
            unsafe { drv::memcpy_dtoh_async(dst, src.0, self.stream) }
                .map_err(driver_err("cuMemcpyDtoHAsync"))?;
            self.sync_stream()?;
            staging.ring.rewind();
            return Ok(());
        };
        // SAFETY: as in `htod`: the range is inside the pinned buffer and unused by copies in
        // flight; it is read only after the synchronization completes the copy.
        unsafe {
            let staged = std::slice::from_raw_parts_mut(staging.host.add(offset), dst.len());
            drv::memcpy_dtoh_async(&mut *staged, src.0, self.stream)
                .map_err(driver_err("cuMemcpyDtoHAsync"))?;
            self.sync_stream()?;
            dst.copy_from_slice(staged);
        }
        staging.ring.rewind();
        Ok(())
    }

    fn dtod(&self, src: DevPtr, dst: DevPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges lie in live allocations (trait contract).
        unsafe { drv::memcpy_dtod_async(dst.0, src.0, bytes, self.stream) }
            .map_err(driver_err("cuMemcpyDtoDAsync"))
    }

    fn launch(&self, f: Function, cfg: &LaunchConfig, args: &[Arg]) -> Result<()> {
        let (g, b) = (cfg.grid, cfg.block);
        if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
            return Err(CudaError::Invalid(format!(
                "launch with an empty grid or block: {cfg:?}"
            )));
        }
        let handle = self.handle(f)?;
        let mut params = KernelParams::new(args)?;
        let mut pointers = params.pointers();
        self.bind()?;
        // SAFETY: `handle` belongs to a loaded module; `pointers` points into `params`, both
        // alive and unmoved for the call (cuLaunchKernel copies the values). The arguments
        // match the kernel's parameters and address live memory: the caller's contract.
        unsafe {
            drv::launch_kernel(
                handle,
                g,
                b,
                cfg.shared_mem_bytes,
                self.stream,
                &mut pointers[..params.len()],
            )
        }
        .map_err(driver_err("cuLaunchKernel"))
    }

    fn gemm(&self, g: &Gemm) -> Result<()> {
        let Some(p) = gemm::to_blas(g)? else {
            return Ok(());
        };
        self.bind()?;
        let blas = lock(&self.blas);
        // SAFETY: the handle is live and bound to our stream; the operands lie in live
        // allocations of the sizes `g` implies (trait contract).
        unsafe { gemm::run(blas.handle, &p) }
    }

    fn synchronize(&self) -> Result<()> {
        self.refuse_while_capturing("synchronize")?;
        self.bind()?;
        let mut staging = lock(&self.staging);
        self.sync_stream()?;
        staging.ring.rewind();
        Ok(())
    }

    fn memory_info(&self) -> Result<(usize, usize)> {
        self.synchronize()?;
        if self.stream_ordered_alloc {
            // SAFETY: the default pool of our device; the stream is idle (synchronized).
            unsafe {
                let pool = drv::device::get_default_mem_pool(self.device)
                    .map_err(driver_err("cuDeviceGetDefaultMemPool"))?;
                drv::mem_pool::trim_to(pool, 0).map_err(driver_err("cuMemPoolTrimTo"))?;
            }
        }
        drv::mem_get_info().map_err(driver_err("cuMemGetInfo"))
    }

    fn begin_capture(&self) -> Result<()> {
        let mut capture = lock(&self.capture);
        if capture.active {
            return Err(CudaError::Invalid(
                "begin_capture while already capturing".into(),
            ));
        }
        self.bind()?;
        // Thread-local mode: other threads may keep allocating, while unsafe calls from this
        // thread fail instead of silently breaking the capture.
        // SAFETY: the stream is live.
        unsafe {
            drv::stream::begin_capture(
                self.stream,
                drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(driver_err("cuStreamBeginCapture"))?;
        capture.active = true;
        Ok(())
    }

    fn end_capture(&self) -> Result<CudaGraph> {
        let deferred = {
            let mut capture = lock(&self.capture);
            if !capture.active {
                return Err(CudaError::Invalid(
                    "end_capture without begin_capture".into(),
                ));
            }
            capture.active = false;
            std::mem::take(&mut capture.deferred_frees)
        };
        self.bind()?;
        let result = self.instantiate_capture();
        for ptr in deferred {
            self.free(ptr);
        }
        result
    }

    fn replay(&self, graph: &CudaGraph) -> Result<()> {
        self.bind()?;
        // SAFETY: the exec is live (owned by `graph`) and belongs to this device's context.
        unsafe { drv::graph::launch(graph.exec, self.stream) }.map_err(driver_err("cuGraphLaunch"))
    }
}

impl CudaDevice {
    /// Ends the stream's capture and instantiates the graph recorded.
    fn instantiate_capture(&self) -> Result<CudaGraph> {
        // SAFETY: the stream is capturing (`end_capture` checked).
        let graph = unsafe { drv::stream::end_capture(self.stream) }
            .map_err(driver_err("cuStreamEndCapture"))?;
        if graph.is_null() {
            return Err(CudaError::Driver(
                "cuStreamEndCapture returned no graph".into(),
            ));
        }
        let flags = drv_sys::CUgraphInstantiate_flags(0);
        // SAFETY: `graph` is the live graph just captured; the exec does not depend on it, so
        // it is destroyed at once. The exec is owned by the returned `CudaGraph`.
        let exec = unsafe {
            let exec = drv::graph::instantiate(graph, flags);
            let _ = drv::graph::destroy(graph);
            exec.map_err(driver_err("cuGraphInstantiate"))?
        };
        let graph = CudaGraph {
            exec,
            ctx: self.ctx,
        };
        // Uploading now makes the first replay as fast as the others.
        // SAFETY: live exec and stream.
        unsafe { drv::graph::upload(graph.exec, self.stream) }
            .map_err(driver_err("cuGraphUpload"))?;
        Ok(graph)
    }

    fn handle(&self, f: Function) -> Result<drv_sys::CUfunction> {
        lock(&self.functions)
            .handles
            .get(f.0)
            .copied()
            .ok_or_else(|| {
                CudaError::Invalid(format!(
                    "{f:?} was not returned by this device's `function`"
                ))
            })
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.ctx.is_null() {
            return;
        }
        // Errors here leave nothing else to do: log them and keep releasing.
        let log = |what: &str, r: std::result::Result<(), DriverError>| {
            if let Err(e) = r {
                tracing::warn!("releasing the CUDA device: {what}: {e:?}");
            }
        };
        // SAFETY: each handle was created in `open` and is released once, after the stream has
        // finished the work that could use it.
        unsafe {
            log("cuCtxSetCurrent", drv::ctx::set_current(self.ctx));
            let capture = self.capture.get_mut().unwrap_or_else(|p| p.into_inner());
            if capture.active {
                capture.active = false;
                let _ = drv::stream::end_capture(self.stream).map(|g| {
                    if !g.is_null() {
                        let _ = drv::graph::destroy(g);
                    }
                });
            }
            if !self.stream.is_null() {
                log("cuStreamSynchronize", drv::stream::synchronize(self.stream));
            }
            for ptr in std::mem::take(&mut capture.deferred_frees) {
                log("cuMemFree", drv::free_sync(ptr.0));
            }
            let blas = self.blas.get_mut().unwrap_or_else(|p| p.into_inner());
            if !blas.handle.is_null() {
                let _ = cudarc::cublas::result::destroy_handle(blas.handle);
            }
            if blas.workspace != 0 {
                log(
                    "cuMemFree (cuBLAS workspace)",
                    drv::free_sync(blas.workspace),
                );
            }
            let staging = self.staging.get_mut().unwrap_or_else(|p| p.into_inner());
            if !staging.host.is_null() {
                log("cuMemFreeHost", drv::free_host(staging.host.cast()));
            }
            for module in self.modules.drain(..) {
                log("cuModuleUnload", drv::module::unload(module));
            }
            if !self.stream.is_null() {
                log("cuStreamDestroy", drv::stream::destroy(self.stream));
            }
            log(
                "cuDevicePrimaryCtxRelease",
                drv::primary_ctx::release(self.device),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_without_a_driver_is_a_quick_clear_error() {
        let started = Instant::now();
        let result = CudaDevice::open(0);
        let elapsed = started.elapsed();
        let err = match result {
            Ok(dev) => {
                eprintln!("opened {:?}: the no-driver path is not tested", dev.info());
                return;
            }
            Err(e) if libs::load(CudaLib::Driver).is_ok() => {
                eprintln!("a driver is present, but: {e}; the no-driver path is not tested");
                return;
            }
            Err(e) => e,
        };
        eprintln!("CudaDevice::open(0) in {elapsed:?}: {err}");
        assert!(elapsed.as_secs() < 5, "took {elapsed:?}");
        let CudaError::Unavailable(msg) = &err else {
            panic!("not Unavailable: {err}");
        };
        assert!(msg.starts_with("no NVIDIA driver found"), "{msg}");
        assert!(msg.contains("install the NVIDIA driver"), "{msg}");
        // And again: the answer is remembered, not a panic the second time.
        assert!(matches!(
            CudaDevice::open(1),
            Err(CudaError::Unavailable(_))
        ));
    }

    #[test]
    fn the_device_is_usable_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<CudaDevice>();
        send::<CudaGraph>();
    }
}
