//! The CUDA device layer, a leaf crate that knows nothing of models:
//! - [`kernels`]: the `.cu` files of the top-level `kernels/` folder, embedded in the binary;
//! - [`nvrtc`]: compiles them for the device's architecture (CUBIN), cached on disk;
//! - [`device`]: the [`Device`] trait the engine's CUDA backend is written against;
//! - [`driver`]: [`CudaDevice`], its implementation on a GPU through cudarc
//!   (driver API, cuBLAS, CUDA graphs), loaded dynamically: nothing here needs a CUDA toolkit
//!   to build, and a machine without a driver gets an error, never a panic.

pub mod device;
pub mod error;

pub use device::{
    Arg, DevPtr, Device, DeviceExt, DeviceInfo, ElemType, Function, Gemm, LaunchConfig,
};
pub use error::{CudaError, Result};
