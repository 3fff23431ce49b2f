//! Library versions, the rule on CUDA majors, and a one-line summary for the startup log.

use std::ffi::c_int;

use cudarc::cublas::sys::{cublasGetProperty, cublasStatus_t, libraryPropertyType};
use cudarc::driver::{result as drv, sys as drv_sys};

use crate::error::{CudaError, Result};
use crate::libs::{self, CUDA_MAJOR, CudaLib, LoadedLib};
use crate::nvrtc::{Arch, Nvrtc};

/// The versions of the three libraries, checked together by [`check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    /// The CUDA version the driver supports, e.g. (13, 0).
    pub driver: (u32, u32),
    pub nvrtc: (u32, u32),
    pub cublas: (u32, u32, u32),
}

impl std::fmt::Display for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Versions {
            driver: d,
            nvrtc: n,
            cublas: b,
        } = self;
        write!(
            f,
            "driver CUDA {}.{}, NVRTC {}.{}, cuBLAS {}.{}.{}",
            d.0, d.1, n.0, n.1, b.0, b.1, b.2
        )
    }
}

/// cudarc's bindings are CUDA 13's: NVRTC and cuBLAS must be 13.x, and the driver must run
/// CUDA 13 code (a newer driver runs it too).
pub fn check(v: &Versions) -> Result<()> {
    let refuse = |msg: String| Err(CudaError::Unavailable(msg));
    if v.driver.0 < CUDA_MAJOR {
        return refuse(format!(
            "the NVIDIA driver supports CUDA {}.{}, but lmi needs CUDA {CUDA_MAJOR}: update the \
             NVIDIA driver (580 or newer)",
            v.driver.0, v.driver.1
        ));
    }
    if v.nvrtc.0 != CUDA_MAJOR {
        return refuse(format!(
            "NVRTC {}.{} is not from CUDA {CUDA_MAJOR}: install `nvidia-cuda-nvrtc` 13.x (pip) or \
             the CUDA {CUDA_MAJOR} toolkit, or set {} to its library directory",
            v.nvrtc.0,
            v.nvrtc.1,
            libs::LIB_DIR_ENV
        ));
    }
    if v.cublas.0 != CUDA_MAJOR {
        return refuse(format!(
            "cuBLAS {}.{} is not from CUDA {CUDA_MAJOR}: install `nvidia-cublas` 13.x (pip) or the \
             CUDA {CUDA_MAJOR} toolkit, or set {} to its library directory",
            v.cublas.0,
            v.cublas.1,
            libs::LIB_DIR_ENV
        ));
    }
    Ok(())
}

/// The CUDA version the driver supports. Needs no `cuInit`.
pub fn driver_version(_driver: &LoadedLib) -> Result<(u32, u32)> {
    let mut v: c_int = 0;
    // SAFETY: the driver library is loaded (a `LoadedLib` proves it); `v` is valid for writes.
    unsafe { drv_sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| CudaError::Driver(format!("cuDriverGetVersion: {e:?}")))?;
    let v = v.max(0) as u32;
    Ok((v / 1000, v % 1000 / 10))
}

/// cuBLAS's (major, minor, patch). Needs no handle.
pub fn cublas_version(_cublas: &LoadedLib) -> Result<(u32, u32, u32)> {
    let get = |property| {
        let mut v: c_int = 0;
        // SAFETY: cuBLAS is loaded (a `LoadedLib` proves it); `v` is valid for writes.
        match unsafe { cublasGetProperty(property, &mut v) } {
            cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(v.max(0) as u32),
            e => Err(CudaError::Blas(format!("cublasGetProperty: {e:?}"))),
        }
    };
    Ok((
        get(libraryPropertyType::MAJOR_VERSION)?,
        get(libraryPropertyType::MINOR_VERSION)?,
        get(libraryPropertyType::PATCH_LEVEL)?,
    ))
}

/// Initializes the driver (`cuInit`); an error says why no GPU can be used.
pub fn init_driver(_driver: &LoadedLib) -> Result<()> {
    drv::init().map_err(|e| {
        CudaError::Unavailable(format!(
            "the NVIDIA driver is installed but cannot be used ({e:?}): check `nvidia-smi`, \
             CUDA_VISIBLE_DEVICES, and in a container `--gpus all`"
        ))
    })
}

/// The GPUs the driver sees: name and architecture.
fn gpus(driver: &LoadedLib) -> Result<Vec<String>> {
    init_driver(driver)?;
    let count = drv::device::get_count()
        .map_err(|e| CudaError::Driver(format!("cuDeviceGetCount: {e:?}")))?;
    (0..count)
        .map(|i| {
            let dev = drv::device::get(i)
                .map_err(|e| CudaError::Driver(format!("cuDeviceGet({i}): {e:?}")))?;
            let name = drv::device::get_name(dev)
                .map_err(|e| CudaError::Driver(format!("cuDeviceGetName: {e:?}")))?;
            let cc = compute_capability(dev)?;
            Ok(format!(
                "GPU {i}: {name} ({})",
                Arch::from_compute_capability(cc)
            ))
        })
        .collect()
}

/// (major, minor) of a device the driver returned.
pub fn compute_capability(dev: drv_sys::CUdevice) -> Result<(u32, u32)> {
    use drv_sys::CUdevice_attribute::*;
    let attr = |a| {
        // SAFETY: `dev` came from cuDeviceGet, so the driver is loaded and initialized.
        unsafe { drv::device::get_attribute(dev, a) }
            .map(|v| v.max(0) as u32)
            .map_err(|e| CudaError::Driver(format!("cuDeviceGetAttribute({a:?}): {e:?}")))
    };
    Ok((
        attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// What the CUDA device layer can use on this machine, in one line: for the startup log
/// (`Ok`), or as the reason `--device cuda` is refused (`Err`, saying what to install).
pub fn probe() -> Result<String> {
    let mut found = Vec::new();
    let mut problems = Vec::new();

    let driver = libs::load(CudaLib::Driver).and_then(|lib| {
        let version = driver_version(lib)?;
        let gpus = gpus(lib)?;
        if gpus.is_empty() {
            return Err(CudaError::Unavailable(
                "the NVIDIA driver sees no GPU: check `nvidia-smi` and CUDA_VISIBLE_DEVICES".into(),
            ));
        }
        found.push(format!(
            "NVIDIA driver for CUDA {}.{} ({}), {}",
            version.0,
            version.1,
            lib.path.display(),
            gpus.join(", ")
        ));
        Ok(version)
    });
    let nvrtc = Nvrtc::load().inspect(|n| {
        let (major, minor) = n.version();
        found.push(format!("NVRTC {major}.{minor} ({})", n.path().display()));
    });
    let cublas = libs::load(CudaLib::Cublas).and_then(|lib| {
        let v = cublas_version(lib)?;
        found.push(format!(
            "cuBLAS {}.{}.{} ({})",
            v.0,
            v.1,
            v.2,
            lib.path.display()
        ));
        Ok(v)
    });

    match (driver, nvrtc, cublas) {
        (Ok(driver), Ok(nvrtc), Ok(cublas)) => {
            let versions = Versions {
                driver,
                nvrtc: nvrtc.version(),
                cublas,
            };
            match check(&versions) {
                Ok(()) => return Ok(found.join("; ")),
                Err(e) => problems.push(e.to_string()),
            }
        }
        (driver, nvrtc, cublas) => {
            problems.extend(driver.err().map(|e| e.to_string()));
            problems.extend(nvrtc.err().map(|e| e.to_string()));
            problems.extend(cublas.err().map(|e| e.to_string()));
        }
    }
    let mut summary = format!("CUDA is unavailable: {}", problems.join("; "));
    if !found.is_empty() {
        summary.push_str(&format!(" (found: {})", found.join("; ")));
    }
    Err(CudaError::Unavailable(summary))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: Versions = Versions {
        driver: (13, 0),
        nvrtc: (13, 5),
        cublas: (13, 1, 0),
    };

    #[test]
    fn matching_majors_pass_and_a_newer_driver_is_fine() {
        assert!(check(&OK).is_ok());
        assert!(
            check(&Versions {
                driver: (14, 2),
                ..OK
            })
            .is_ok()
        );
    }

    #[test]
    fn mismatched_majors_are_refused_with_what_to_do() {
        let old_driver = check(&Versions {
            driver: (12, 8),
            ..OK
        })
        .expect_err("old driver");
        assert!(
            old_driver.to_string().contains("supports CUDA 12.8"),
            "{old_driver}"
        );
        assert!(
            old_driver.to_string().contains("update the NVIDIA driver"),
            "{old_driver}"
        );
        let nvrtc = check(&Versions {
            nvrtc: (12, 9),
            ..OK
        })
        .expect_err("old NVRTC");
        assert!(nvrtc.to_string().contains("nvidia-cuda-nvrtc"), "{nvrtc}");
        let cublas = check(&Versions {
            cublas: (12, 9, 1),
            ..OK
        })
        .expect_err("old cuBLAS");
        assert!(cublas.to_string().contains("nvidia-cublas"), "{cublas}");
        assert_eq!(
            OK.to_string(),
            "driver CUDA 13.0, NVRTC 13.5, cuBLAS 13.1.0"
        );
    }

    #[test]
    fn probe_explains_a_machine_without_a_driver() {
        // Whatever this machine has, probe answers without panicking; without a driver it
        // says so and what to install.
        let result = probe();
        eprintln!("probe: {result:?}");
        match result {
            Ok(summary) => assert!(summary.contains("NVIDIA driver"), "{summary}"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("CUDA is unavailable: "), "{msg}");
                if libs::load(CudaLib::Driver).is_err() {
                    assert!(msg.contains("no NVIDIA driver found"), "{msg}");
                    assert!(msg.contains("install the NVIDIA driver"), "{msg}");
                }
            }
        }
    }
}
