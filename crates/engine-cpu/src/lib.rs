//! The CPU backend ([`CpuBackend`], the engine core's `Backend` on the host): f32
//! activations and accumulation; f32, bf16 (AMX tiles where the CPU has them) or quantized
//! weights (ggml's blocks as stored, through the lane or int8 kernels); SIMD kernels with a
//! fixed reduction order (batch invariant, see `simd.rs`), threads through `pool.rs` (the
//! forward pass's loops, on spinning workers) and rayon (loading, vision); the
//! encoders' ops (`encoder.rs`, `encoder_attention.rs`); and the host vision tower
//! (`vision.rs`).

mod amx;
mod attention;
mod backend;
mod delta_net;
mod encoder;
mod encoder_attention;
mod group_scores;
mod kv_pool;
mod linear;
mod lora;
mod mla;
mod moe;
mod ops;
mod panel;
pub mod pool;
mod qact;
pub mod qlanes;
pub mod qlinear;
mod qpack;
pub mod simd;
pub mod vision;
pub mod vision_gemma4;
mod weight_arena;

pub use amx::available as amx_available;
pub use backend::{CpuBackend, CpuKv, CpuRope, CpuWeight};
pub use delta_net::CpuState;
pub use kv_pool::KvPool;
pub use linear::linear;
