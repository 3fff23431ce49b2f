//! The two ceilings a GPU benchmark is read against: device memory bandwidth (a large
//! device-to-device copy, bytes read plus written) and the bf16 matrix-product rate (cuBLAS,
//! f32 accumulation), both on random data, timed after a warm-up.

use std::sync::Arc;
use std::time::Instant;

use lmi_cuda::{CudaDevice, DevPtr, Device, ElemType, Gemm};
use lmi_engine_core::error::Result;

use super::memory::{DeviceBox, cuda_err};

#[derive(Debug, Clone, Copy)]
pub struct Ceilings {
    /// Bytes per second, read plus written.
    pub copy_bandwidth: f64,
    /// bf16 FLOP per second (2·m·n·k per product).
    pub bf16_flops: f64,
}

/// Measures GPU `ordinal`'s ceilings with a copy of `copy_bytes` and square products of side
/// `side` (1 GiB and 8192: a few seconds on a GPU).
pub fn measure(ordinal: usize, copy_bytes: usize, side: usize) -> Result<Ceilings> {
    let dev = Arc::new(CudaDevice::open(ordinal).map_err(cuda_err)?);
    measure_on(&dev, copy_bytes, side)
}

/// The ceilings on `dev` with a copy of `copy_bytes` and square products of side `side`.
pub fn measure_on<D: Device>(dev: &Arc<D>, copy_bytes: usize, side: usize) -> Result<Ceilings> {
    let fill = |b: &DeviceBox<D>, seed: u32| -> Result<()> {
        // Random bf16 bit patterns in a normal range (no NaN/inf): exponent 120..=134.
        let mut x = seed | 1;
        let v: Vec<u16> = (0..b.bytes() / 2)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let exp = 120 + (x >> 8) % 15;
                ((x & 0x8000) as u16) | ((exp as u16) << 7) | (x as u16 & 0x7f)
            })
            .collect();
        dev.htod(lmi_cuda::device::as_bytes(&v), b.ptr())
            .map_err(cuda_err)
    };
    let time = |reps: usize, f: &dyn Fn() -> Result<()>| -> Result<f64> {
        f()?;
        dev.synchronize().map_err(cuda_err)?;
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..reps {
                f()?;
            }
            dev.synchronize().map_err(cuda_err)?;
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        Ok(best)
    };

    let src = DeviceBox::new(dev, copy_bytes)?;
    let dst = DeviceBox::new(dev, copy_bytes)?;
    fill(&src, 1)?;
    let copy = time(10, &|| {
        dev.dtod(src.ptr(), dst.ptr(), copy_bytes).map_err(cuda_err)
    })?;

    let n = side;
    let a = DeviceBox::new(dev, n * n * 2)?;
    let b = DeviceBox::new(dev, n * n * 2)?;
    let c = DeviceBox::new(dev, n * n * 4)?;
    fill(&a, 2)?;
    fill(&b, 3)?;
    let gemm = |x: DevPtr, w: DevPtr, out: DevPtr| Gemm {
        m: n,
        n,
        k: n,
        x,
        x_type: ElemType::BF16,
        ldx: n,
        w,
        w_type: ElemType::BF16,
        ldw: n,
        out,
        out_type: ElemType::F32,
        ldout: n,
        accumulate: false,
    };
    let g = gemm(a.ptr(), b.ptr(), c.ptr());
    let product = time(10, &|| dev.gemm(&g).map_err(cuda_err))?;
    Ok(Ceilings {
        copy_bandwidth: 2.0 * copy_bytes as f64 / copy,
        bf16_flops: 2.0 * (n * n * n) as f64 / product,
    })
}
