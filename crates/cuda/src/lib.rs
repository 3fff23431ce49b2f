//! The CUDA device layer, a leaf crate that knows nothing of models:
//! - [`kernels`]: the `.cu` files of the top-level `kernels/` folder, embedded in the binary;
//! - [`nvrtc`]: compiles them for the device's architecture (CUBIN), cached on disk
//!   ([`cache`]), with ptxas's per-kernel report ([`ptxas`]);
//! - [`device`]: the [`Device`] trait the engine's CUDA backend is written against;
//! - [`driver`]: [`CudaDevice`], its implementation on a GPU through cudarc
//!   (driver API, cuBLAS, CUDA graphs), loaded dynamically ([`libs`]): nothing here needs a
//!   CUDA toolkit to build, and a machine without a driver gets an error, never a panic.

pub mod cache;
pub mod device;
pub mod driver;
pub mod error;
pub mod kernels;
pub mod libs;
pub mod nvrtc;
pub mod ptxas;

pub use cache::KernelCache;
pub use device::{
    Arg, DevPtr, Device, DeviceExt, DeviceInfo, ElemType, Function, Gemm, LaunchConfig,
};
pub use driver::{CudaDevice, CudaGraph, probe};
pub use error::{CudaError, Result};
pub use kernels::KernelSource;
pub use nvrtc::{Arch, Compiled, Nvrtc, SpillPolicy};
