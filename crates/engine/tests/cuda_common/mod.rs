//! Shared by the CUDA backend tests: the devices a test runs on (the CPU emulator in both
//! thread orders always; a real GPU when a driver is present), host ↔ buffer helpers, and
//! comparisons that say where two results differ.

#![allow(dead_code)]

use std::sync::Arc;

use lmi_cuda::Device;
use lmi_cuda_emu::{EmuDevice, ThreadOrder};
use lmi_engine::Backend;
use lmi_engine::cpu::CpuBackend;
use lmi_engine::cuda::{CudaBackend, CudaBuf};

/// Runs `check` on a CUDA backend over every available device: the emulator with CUDA
/// threads run in forward order, then in reverse order (a missing `__syncthreads` shows in
/// one of them), then a GPU if this machine has a driver (else says it skipped).
#[macro_export]
macro_rules! on_every_device {
    ($check:ident) => {{
        for order in [
            lmi_cuda_emu::ThreadOrder::Forward,
            lmi_cuda_emu::ThreadOrder::Reverse,
        ] {
            let dev = $crate::cuda_common::emulator(order);
            let b = lmi_engine::cuda::CudaBackend::with_graphs(dev, true).unwrap();
            $check(&b);
        }
        match $crate::cuda_common::gpu() {
            Some(dev) => {
                let b = lmi_engine::cuda::CudaBackend::with_graphs(dev, true).unwrap();
                $check(&b);
            }
            None => eprintln!(
                "{}: no NVIDIA driver here; ran on the emulator only",
                stringify!($check)
            ),
        }
    }};
}

pub fn emulator(order: ThreadOrder) -> Arc<EmuDevice> {
    let dev = EmuDevice::new();
    dev.set_thread_order(order);
    Arc::new(dev)
}

/// GPU 0 when a driver is present.
pub fn gpu() -> Option<Arc<lmi_cuda::driver::CudaDevice>> {
    lmi_cuda::driver::CudaDevice::open(0).ok().map(Arc::new)
}

/// Deterministic values in [-scale, scale).
pub fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn to_host<D: Device>(b: &CudaBackend<D>, buf: &CudaBuf) -> Vec<f32> {
    b.to_host(*buf, buf.len).unwrap()
}

pub fn cpu() -> CpuBackend {
    CpuBackend::new()
}

/// Asserts `|got - want| <= atol + rtol * |want|` everywhere, naming the first miss.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= atol + rtol * w.abs() || (g.is_nan() && w.is_nan());
        assert!(
            ok,
            "{what}: element {i} is {g}, expected {w} (of {})",
            got.len()
        );
    }
}

/// Rounds to bf16 and back (what a bf16 buffer holds).
pub fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect()
}

/// A CPU buffer with `data`.
pub fn cpu_buf(data: &[f32]) -> Vec<f32> {
    data.to_vec()
}
