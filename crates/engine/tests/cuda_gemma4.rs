//! Gemma 4 on the CUDA engine: not yet (its per-layer inputs, soft-capping and K/V pools of
//! two widths have no kernels). The model is refused at load with an error that names it and
//! says what runs it (the CPU engine), before any weight is uploaded; on the emulator and on
//! the driver's device when there is one.

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::EngineOptions;
use lmi_engine::{DType, Engine};

fn check_refused<D: Device>(dev: &Arc<D>) {
    for name in ["e2b", "a4b"] {
        let dir = hf_fixture::fixture("gemma4", name);
        let opts = EngineOptions {
            dtype: Some(DType::BF16),
            kv_blocks: Some(16),
            ..Default::default()
        };
        let backend = CudaBackend::with_graphs(dev.clone(), false).unwrap();
        let err = match Engine::load(backend, &dir, &opts) {
            Ok(_) => panic!("{name}: Gemma 4 loaded on the CUDA engine"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("does not run Gemma 4") && err.contains("--device cpu"),
            "{name}: {err}"
        );
    }
}

#[test]
fn gemma4_is_refused_at_load() {
    on_every_raw_device!(check_refused);
}
