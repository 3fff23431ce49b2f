//! Logits processing on the device: draws and prompt-token scores with the CPU sampler's
//! semantics (`sampling::sample`, `sampling::token_logprob`).
//!
//! INTERIM: copies the requested rows to the host and runs the host sampler; to be replaced
//! by the device sampler (kernels/sampling.cu), which returns only ids and logprobs.

use std::sync::Arc;

use lmi_cuda::{Device, DeviceExt};

use super::backend::{CudaBackend, CudaBuf};
use super::memory::cuda_err;
use crate::error::Result;
use crate::sampling::process_logits_host;
use crate::step::{LogitsOutput, LogitsWork};

pub const KERNELS: &[&str] = &[];

pub struct Sampler<D: Device> {
    _dev: Arc<D>,
}

impl<D: Device> Sampler<D> {
    pub fn new(dev: &Arc<D>) -> Self {
        Sampler { _dev: dev.clone() }
    }
}

pub fn process<D: Device>(
    b: &CudaBackend<D>,
    logits: CudaBuf,
    rows: usize,
    vocab: usize,
    work: &LogitsWork<'_>,
) -> Result<LogitsOutput> {
    let mut host = b
        .device()
        .dtoh_vec::<f32>(logits.ptr, rows * vocab)
        .map_err(cuda_err)?;
    Ok(process_logits_host(&mut host, vocab, work))
}
