//! Host tensors and the HF checkpoint reader (single or sharded safetensors).

mod host;
mod safetensors_dir;

pub use host::{HostData, HostTensor};
pub use safetensors_dir::SafetensorsDir;
