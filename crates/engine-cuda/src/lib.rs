//! The CUDA backend: [`CudaBackend`] implements the engine's `Backend` on an
//! `lmi_cuda::Device` — a GPU through cudarc in production, the CPU emulator of
//! `lmi-cuda-emu` in tests, so the same host code and kernels are checked without a GPU.

mod attention;
mod backend;
pub mod ceilings;
mod delta_net;
mod encoder;
mod graphs;
mod lora;
mod memory;
mod mla;
mod moe;
mod rope;
mod sampler;
pub mod step;
mod vision;

use std::path::Path;
use std::sync::Arc;

pub use backend::{CudaBackend, CudaBuf, CudaKv, CudaWeight};
pub use delta_net::CudaState;
use lmi_cuda::{CudaDevice, Device};
use memory::cuda_err;
pub use moe::CudaExperts;

use lmi_checkpoint::dtype::DType;
use lmi_engine_core::engine::{Engine, EngineOptions, StepEngine};
use lmi_engine_core::error::Result;

/// Whether a GPU can be used: the driver, NVRTC and cuBLAS load with matching CUDA versions
/// and the driver sees a GPU. Quick (no context is created); a missing `ordinal` is reported
/// by [`open`].
pub fn check(_ordinal: usize) -> Result<()> {
    let summary = lmi_cuda::probe().map_err(cuda_err)?;
    tracing::info!("CUDA: {summary}");
    Ok(())
}

/// Loads `dir` on GPU `ordinal`: weights in bf16, the KV cache in bf16.
pub fn open(ordinal: usize, dir: &Path, opts: &EngineOptions) -> Result<Box<dyn StepEngine>> {
    let dev = Arc::new(CudaDevice::open(ordinal).map_err(cuda_err)?);
    let info = dev.info().clone();
    tracing::info!(
        "CUDA device {ordinal}: {} (sm_{}{}, {} SMs, {} GiB)",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        info.total_memory >> 30
    );
    let backend = CudaBackend::new(dev)?;
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        ..opts.clone()
    };
    Ok(Box::new(Engine::load(backend, dir, &opts)?))
}
