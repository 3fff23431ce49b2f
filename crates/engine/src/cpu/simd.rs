//! SIMD primitives with a fixed reduction order.
//!
//! Every dot product here is the same sequence of operations whatever else is computed beside
//! it: lane-wise FMAs over consecutive `LANES`-wide chunks, a fixed horizontal sum, then a
//! scalar tail. That makes every kernel built on them *batch invariant*: a sequence's logits
//! are bit-identical alone, in any batch, prefilled at once or in chunks (a seeded request then
//! yields the same tokens however it was scheduled).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Scalar,
}

pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::env::var_os("LMI_CPU_NO_AVX512").is_none()
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    })
}

/// AVX512-BF16 dot products (`vdpbf16ps`): bf16 weights are then multiplied with inputs
/// rounded to bf16 (round-to-nearest-even, as GPUs do), two products per lane per
/// instruction, accumulated in f32. `LMI_CPU_NO_BF16_DOT` turns it off.
pub fn has_bf16_dot() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            isa() == Isa::Avx512
                && std::env::var_os("LMI_CPU_NO_BF16_DOT").is_none()
                && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// A weight element type: f32, or bf16 bit patterns widened to f32 on load.
pub trait WElem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
}

impl WElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl WElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self as u32) << 16)
    }
}

/// `Σ a[i]·b[i]` in the canonical order.
pub fn dot<W: WElem>(a: &[f32], b: &[W]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut out = [0.0f32; 1];
    // SAFETY: one row of each, lengths checked above; the tile reads a.len() elements.
    unsafe {
        crate::cpu::linear::tile_dispatch::<W>(
            isa(),
            1,
            1,
            a.as_ptr(),
            0,
            b.as_ptr(),
            0,
            a.len(),
            out.as_mut_ptr(),
            0,
        )
    };
    out[0]
}

/// `y += alpha · x`.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}
