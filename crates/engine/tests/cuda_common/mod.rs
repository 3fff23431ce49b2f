//! Shared by the CUDA backend tests: the devices a test runs on (the CPU emulator in both
//! thread orders; then the real host code, `CudaDevice`, on a GPU when the machine has a
//! driver, else on the fake driver), host ↔ buffer helpers, and comparisons that say where two
//! results differ.
//!
//! `LMI_REQUIRE_GPU=1` (the device runbook) makes a machine without a usable GPU a failure
//! instead of a run on the fake driver; `LMI_TEST_DEVICE_ONLY=1` (the runbook too) skips the
//! emulator passes, which a GPU's host has no use for.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use lmi_cuda::{CudaDevice, Device};
use lmi_cuda_emu::{EmuDevice, ThreadOrder, fake};
use lmi_engine::Backend;
use lmi_engine::cpu::CpuBackend;
use lmi_engine::cuda::{CudaBackend, CudaBuf};

/// Runs `check` on a CUDA backend over every available device: the emulator with CUDA
/// threads run in forward order, then in reverse order (a missing `__syncthreads` shows in
/// one of them), then `CudaDevice` on a GPU or the fake driver ([`driver`]).
#[macro_export]
macro_rules! on_every_device {
    ($check:ident) => {{
        for order in $crate::cuda_common::emulator_orders() {
            let dev = $crate::cuda_common::emulator(order);
            let b = lmi_engine::cuda::CudaBackend::with_graphs(dev, true).unwrap();
            $check(&b);
        }
        if let Some(dev) = $crate::cuda_common::driver() {
            let _turn = $crate::cuda_common::driver_turn();
            let b = lmi_engine::cuda::CudaBackend::with_graphs(dev, true).unwrap();
            $check(&b);
        }
    }};
}

/// Runs `check(&Arc<device>)` on the emulator in both thread orders, then on the driver's
/// `CudaDevice` (a GPU or the fake driver) when it opens: for checks that build their own
/// backends or engines.
#[macro_export]
macro_rules! on_every_raw_device {
    ($check:ident) => {{
        for order in $crate::cuda_common::emulator_orders() {
            $check(&$crate::cuda_common::emulator(order));
        }
        if let Some(dev) = $crate::cuda_common::driver() {
            let _turn = $crate::cuda_common::driver_turn();
            $check(&dev);
        }
    }};
}

/// The emulator's thread orders to test in: both, unless `LMI_TEST_DEVICE_ONLY=1`.
pub fn emulator_orders() -> Vec<ThreadOrder> {
    if required("LMI_TEST_DEVICE_ONLY") {
        Vec::new()
    } else {
        vec![ThreadOrder::Forward, ThreadOrder::Reverse]
    }
}

pub fn emulator(order: ThreadOrder) -> Arc<EmuDevice> {
    let dev = EmuDevice::new();
    dev.set_thread_order(order);
    Arc::new(dev)
}

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// `CudaDevice` 0, shared by the tests of this process: on the machine's GPU when it has a
/// driver (or `LMI_CUDA_LIB_DIR` names one), else on the fake driver of `lmi-cuda-emu`. `None`
/// (after saying why) when neither opens, which fails the test under `LMI_REQUIRE_GPU=1`, or
/// for the fake under `LMI_REQUIRE_NVRTC=1` (NVRTC compiles what it runs).
pub fn driver() -> Option<Arc<CudaDevice>> {
    static DEV: OnceLock<Result<Arc<CudaDevice>, String>> = OnceLock::new();
    let dev = DEV.get_or_init(|| {
        let explicit = std::env::var_os(lmi_cuda::libs::LIB_DIR_ENV).is_some();
        let gpu = explicit || fake::system_driver_present();
        if !gpu {
            fake::install()?;
        }
        let dev = CudaDevice::open(0).map_err(|e| e.to_string())?;
        eprintln!(
            "CUDA tests run on {} as well as the emulator",
            dev.info().name
        );
        Ok(Arc::new(dev))
    });
    match dev {
        Ok(_) if required("LMI_REQUIRE_GPU") && on_fake_driver() => {
            panic!("LMI_REQUIRE_GPU=1 but this machine has no NVIDIA driver (the fake ran)")
        }
        Ok(d) => Some(d.clone()),
        Err(e) if required("LMI_REQUIRE_GPU") || required("LMI_REQUIRE_NVRTC") => {
            panic!("the CUDA device cannot be opened: {e}")
        }
        Err(e) => {
            eprintln!("the CUDA device cannot be opened ({e}): ran on the emulator only");
            None
        }
    }
}

/// The driver's device is one per process with one stream, shared by the tests running in
/// parallel: a graph one test captures would record another's launches (and a copy from the
/// host during a capture is refused). Hold this while using it.
pub fn driver_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this process is a child started by [`run_in_child`].
pub fn in_child() -> bool {
    std::env::var_os("LMI_CUDA_TEST_CHILD").is_some()
}

/// Runs this test binary's `test` alone in a child process with `env` set, for a check that
/// needs the driver's device to itself (its memory measured, or sized by `env`); fails with
/// the child's output if the child fails. The test sees [`in_child`].
pub fn run_in_child(test: &str, env: &[(&str, &str)]) {
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--nocapture"])
        .env("LMI_CUDA_TEST_CHILD", "1")
        .envs(env.iter().copied())
        .output()
        .expect("running the child");
    assert!(
        out.status.success(),
        "{test}, alone on the driver:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `CudaDevice` on a real GPU, for the checks that mean nothing on the fake driver
/// (checkpoint agreement, speed); `None` when there is none.
pub fn gpu() -> Option<Arc<CudaDevice>> {
    driver().filter(|_| !on_fake_driver())
}

/// Whether the driver in use is the fake one.
pub fn on_fake_driver() -> bool {
    let driver = lmi_cuda::libs::load(lmi_cuda::libs::CudaLib::Driver);
    driver.is_ok_and(|d| fake::driver_dir().is_some_and(|dir| d.path.starts_with(dir)))
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

/// The KV cache filled `fraction` of the device's memory but for the margin kept for graphs
/// and rounding.
pub fn assert_share_filled<D: Device>(dev: &D, fraction: f64) {
    let (free, total) = dev.memory_info().unwrap();
    let share = (fraction * total as f64) as usize;
    let used = total - free;
    assert!(
        used <= share,
        "{used} of {total} in use, over the share {share}"
    );
    assert!(
        used + (300 << 20) >= share,
        "{used} of {total} in use: the share {share} not filled"
    );
}
