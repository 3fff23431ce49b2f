//! The one door to the engine: [`open`] loads a model on a [`Device`] and returns the engine
//! the scheduler drives, whichever backend runs it (`lmi-engine-cpu`, or `lmi-engine-cuda`
//! behind the `cuda` feature, on by default). The engine core's API (`lmi-engine-core`: the
//! step boundary, sampling parameters, options) is re-exported here, so a command that runs
//! models needs this crate and `lmi-checkpoint` for the files it reads.

mod open;

pub use lmi_engine_core::*;
pub use lmi_engine_cpu as cpu;
#[cfg(feature = "cuda")]
pub use lmi_engine_cuda as cuda;
pub use open::{Device, check_device, load_cpu, load_cpu_encoder, open};
