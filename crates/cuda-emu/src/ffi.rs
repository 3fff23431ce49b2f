//! The C API of the runtime (emu/runtime.cpp) and the kernel registry it exposes.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Mutex, OnceLock};

unsafe extern "C" {
    fn lmi_emu_kernel_count() -> usize;
    fn lmi_emu_kernel_name(k: usize) -> *const c_char;
    fn lmi_emu_kernel_file(k: usize) -> *const c_char;
    fn lmi_emu_kernel_param_count(k: usize) -> usize;
    fn lmi_emu_kernel_param_size(k: usize, p: usize) -> usize;
    fn lmi_emu_kernel_param_type(k: usize, p: usize) -> *const c_char;
    fn lmi_emu_launch(
        kernel: usize,
        grid: *const u32,
        block: *const u32,
        shared_bytes: u32,
        reverse_threads: c_int,
        reverse_blocks: c_int,
        params: *mut *mut c_void,
    ) -> c_int;
    fn lmi_emu_last_error() -> *const c_char;
}

/// One parameter of a kernel's signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// The C++ type, as the compiler spells it (`float const*`, `unsigned int`).
    pub ty: String,
    pub size: usize,
}

/// A kernel compiled into the emulator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInfo {
    pub name: String,
    /// The `.cu` file it comes from.
    pub file: String,
    pub params: Vec<Param>,
}

fn string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the runtime returns NUL-terminated strings that live as long as the registry.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Every kernel of `kernels/` and `test_kernels/`, in the order of their launch indices.
pub fn kernels() -> &'static [KernelInfo] {
    static KERNELS: OnceLock<Vec<KernelInfo>> = OnceLock::new();
    KERNELS.get_or_init(|| {
        // SAFETY: plain queries of the runtime's registry; indices stay below the counts it
        // reports.
        unsafe {
            (0..lmi_emu_kernel_count())
                .map(|k| KernelInfo {
                    name: string(lmi_emu_kernel_name(k)),
                    file: string(lmi_emu_kernel_file(k)),
                    params: (0..lmi_emu_kernel_param_count(k))
                        .map(|p| Param {
                            ty: string(lmi_emu_kernel_param_type(k, p)),
                            size: lmi_emu_kernel_param_size(k, p),
                        })
                        .collect(),
                })
                .collect()
        }
    })
}

/// Static shared memory, the fiber stacks and the built-in variables are process-wide: one
/// launch runs at a time.
static LAUNCH_LOCK: Mutex<()> = Mutex::new(());

/// Runs kernel `index` with `values` (one little-endian slot per parameter, already checked
/// against the signature). Returns the runtime's message on failure.
pub(crate) fn launch(
    index: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    reverse_threads: bool,
    reverse_blocks: bool,
    values: &mut [u64],
) -> Result<(), String> {
    let mut params: Vec<*mut c_void> = values
        .iter_mut()
        .map(|v| v as *mut u64 as *mut c_void)
        .collect();
    let _guard = LAUNCH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: `params` holds one pointer per kernel parameter, each to 8 readable bytes whose
    // first `size` bytes are the argument (little-endian); the caller checked the sizes. The
    // kernel's memory accesses are the caller's contract (guard pages catch the wrong ones).
    let rc = unsafe {
        lmi_emu_launch(
            index,
            grid.as_ptr(),
            block.as_ptr(),
            shared_bytes,
            c_int::from(reverse_threads),
            c_int::from(reverse_blocks),
            params.as_mut_ptr(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        // SAFETY: the message is the calling thread's, valid until its next launch.
        Err(string(unsafe { lmi_emu_last_error() }))
    }
}
