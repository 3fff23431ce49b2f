//! The fake CUDA driver (`fake/`): a `libcuda.so.1` and a `libcublas.so.13` that run the driver
//! and cuBLAS calls of `lmi_cuda::CudaDevice` on the CPU, kernels through this crate's
//! emulator, so the real host code (launch parameters, async copies and the staging ring,
//! stream-ordered frees, graph capture, the cuBLAS mapping) runs without a GPU. Built by
//! `build.rs` beside the emulator's static library.

use std::path::Path;

/// The folder holding the fake `libcuda.so.1` and `libcublas.so.13` (for `LMI_CUDA_LIB_DIR`),
/// or `None` in the AddressSanitizer build, which has none.
pub fn driver_dir() -> Option<&'static Path> {
    let dir = env!("LMI_CUDA_FAKE_DIR");
    (!dir.is_empty()).then(|| Path::new(dir))
}

/// Makes this process's `lmi_cuda` load the fake driver and cuBLAS. Call it before anything
/// loads a CUDA library; NVRTC is still looked for as usual (it compiles the kernels the fake
/// driver loads).
pub fn install() -> Result<&'static Path, String> {
    let dir = driver_dir().ok_or("the sanitized build of lmi-cuda-emu has no fake driver")?;
    lmi_cuda::libs::use_lib_dir(dir).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// Whether the machine has an NVIDIA driver of its own: a `libcuda.so.1` the loader finds
/// that is not this fake. Tests then use the GPU; the fake cannot be installed beside it (both
/// are `libcuda.so.1`).
pub fn system_driver_present() -> bool {
    // SAFETY: loading runs the library's initializers, which have no preconditions; a driver
    // found here stays loaded, as the device layer would load it anyway.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        !h.is_null() && libc::dlsym(h, c"lmi_fake_has_context".as_ptr()).is_null()
    }
}

/// Whether NVRTC, which compiles the kernels the fake driver loads, can be used here; the
/// error says why not.
pub fn nvrtc_available() -> Result<(), String> {
    lmi_cuda::Nvrtc::load()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// How many times the host has waited for the fake device so far (synchronizations, copies to
/// pageable memory, frees that wait), for tests that a step does not wait where it must not.
/// `None` unless the fake driver is the one loaded.
pub fn synchronizations() -> Option<u64> {
    // SAFETY: RTLD_NOLOAD only looks up an already-loaded libcuda.so.1; the symbol, when the
    // fake exports it, has this signature and no preconditions.
    unsafe {
        let h = libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        );
        if h.is_null() {
            return None;
        }
        let f = libc::dlsym(h, c"lmi_fake_synchronizations".as_ptr());
        if f.is_null() {
            return None;
        }
        let f: extern "C" fn() -> u64 = std::mem::transmute(f);
        Some(f())
    }
}
