//! RoPE on the device (`kernels/rope.cu`): the frequency table, `Backend::rope`, and the fused
//! per-layer op `Backend::qk_norm_rope_write_kv` (q/k head norms, RoPE, K/V write: one launch).
//!
//! The kernels take no f64: each frequency `f` (radians per position) is uploaded as its turns
//! per position in 0.64 fixed point, `round(frac(f / 2π) · 2⁶⁴)`, so a position's angle is
//! `pos · step` in wrapping u64 arithmetic — exact for every u32 position, reduced to a
//! fraction of a turn for free — and the kernel evaluates f32 polynomials on the remainder
//! after the nearest quarter turn. Against the CPU's f64 angles (Llama 3.1's θ = 500,000 with
//! its rope_scaling, head_dim 128, every position to 131,072) cos and sin differ by at most
//! 9.3e-8 (tested in `tests/cuda_ops.rs`; an f32 product `pos · f` would be off by 6e-3).

use lmi_cuda::{DevPtr, Device, DeviceExt, LaunchConfig};
use lmi_engine_core::backend::QkvLayout;
use lmi_engine_core::error::{EngineError, Result};

use super::backend::{CudaBackend, CudaBuf, CudaKv, CudaWeight};
use super::memory::{DeviceBox, cuda_err};
use super::step::CudaStep;

/// Warps per block of the kernels (`ROPE_WARPS` in rope.cu): a head each at a time.
const WARPS: usize = 4;
/// The largest head the kernels take (`2 · 32 · ROPE_PAIRS` in rope.cu).
pub(super) const MAX_HEAD_DIM: usize = 512;

/// The RoPE frequencies on the device: one u64 step per rotated pair, and for M-RoPE the
/// position component (0 time, 1 row, 2 column) each pair turns with (one u32 per pair).
pub struct CudaRope<D: Device> {
    steps: DeviceBox<D>,
    components: Option<DeviceBox<D>>,
    pairs: usize,
}

/// 1/(2π) as a sum of two f64 (the second the first's rounding error).
const INV_TWO_PI: (f64, f64) = (0.159_154_943_091_895_35, -9.839_338_337_591_243e-18);

/// Each frequency's turns per position in 0.64 fixed point, `round(frac(f / 2π) · 2⁶⁴)`,
/// within one unit (the quotient is formed in double-double): a position `p < 2³²` then
/// gets its angle's fraction of a turn within 2⁻³² of a turn.
pub fn rope_steps(inv_freq: &[f64]) -> Vec<u64> {
    const TWO_64: f64 = 18_446_744_073_709_551_616.0;
    inv_freq
        .iter()
        .map(|&f| {
            let hi = f * INV_TWO_PI.0;
            let lo = f.mul_add(INV_TWO_PI.0, -hi) + f * INV_TWO_PI.1;
            // Both parts scaled by 2⁶⁴ (exact) and rounded; whole turns wrap away.
            let whole = (hi - hi.floor()) * TWO_64;
            (whole.round() as i128 + (lo * TWO_64).round() as i128) as u64
        })
        .collect()
}

impl<D: Device> CudaRope<D> {
    /// The table's turns per position, one per frequency (`rope_steps`).
    pub(super) fn steps_ptr(&self) -> lmi_cuda::DevPtr {
        self.steps.ptr()
    }

    /// How many frequencies the table holds.
    pub(super) fn pairs(&self) -> usize {
        self.pairs
    }

    pub(super) fn upload(dev: &std::sync::Arc<D>, inv_freq: &[f64]) -> Result<Self> {
        let steps = rope_steps(inv_freq);
        let mem = DeviceBox::new(dev, steps.len() * 8)?;
        dev.htod_slice(&steps, mem.ptr()).map_err(cuda_err)?;
        Ok(CudaRope {
            steps: mem,
            components: None,
            pairs: steps.len(),
        })
    }

    /// M-RoPE: pair `i` turns with component `components[i]` (0 time, 1 row, 2 column) of a
    /// token's position (contiguous sections for Qwen2-VL, interleaved for Qwen3-VL).
    pub(crate) fn upload_mrope(
        dev: &std::sync::Arc<D>,
        inv_freq: &[f64],
        components: &[u8],
    ) -> Result<Self> {
        if components.len() != inv_freq.len() || components.iter().any(|&c| c > 2) {
            return Err(EngineError::Backend(format!(
                "M-RoPE components {components:?} do not fit the {} rotary frequencies",
                inv_freq.len()
            )));
        }
        let components: Vec<u32> = components.iter().map(|&c| u32::from(c)).collect();
        let mem = DeviceBox::new(dev, components.len().max(1) * 4)?;
        dev.htod_slice(&components, mem.ptr()).map_err(cuda_err)?;
        Ok(CudaRope {
            components: Some(mem),
            ..Self::upload(dev, inv_freq)?
        })
    }

    /// The kernels' M-RoPE arguments for `step`: its (time, row, column) positions and the
    /// component table, or nulls (rotary positions are `step.positions`). An M-RoPE table
    /// with a step that has no M-RoPE positions rotates by the plain positions, as the CPU
    /// backend does (text-only positions are the same in all three components).
    fn mrope_args(&self, step: &CudaStep) -> (DevPtr, DevPtr) {
        match &self.components {
            Some(c) if !step.rope_positions.is_null() => (step.rope_positions, c.ptr()),
            _ => (DevPtr::NULL, DevPtr::NULL),
        }
    }

    /// Checks that `layout`'s heads fit the kernels and this table; returns the pairs that
    /// turn: every one of a head's (head_dim / 2), or fewer for partial RoPE (Qwen3.5's
    /// quarter of each head: pair `i` is `(i, i + pairs)`, the rest of the head unturned, as
    /// the CPU's `rope_by` does).
    fn check(&self, layout: QkvLayout) -> Result<u32> {
        let d = layout.head_dim;
        if !d.is_multiple_of(2) || d == 0 || d > MAX_HEAD_DIM {
            return Err(EngineError::Backend(format!(
                "CUDA RoPE takes even head sizes up to {MAX_HEAD_DIM}, not {d}"
            )));
        }
        if self.pairs == 0 || self.pairs > d / 2 {
            return Err(EngineError::Backend(format!(
                "the RoPE table has {} frequencies, head_dim {d} takes 1 to {}",
                self.pairs,
                d / 2
            )));
        }
        u32_arg("a QKV row", layout.row_width())?;
        Ok(self.pairs as u32)
    }
}

/// `v` as a kernel's u32 argument, or an error naming `what` when it does not fit.
pub(super) fn u32_arg(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        EngineError::Backend(format!(
            "{what} of {v} elements is too large for the kernels' 32-bit indices"
        ))
    })
}

/// The grid of `kernels/rope.cu` over `tokens` tokens of `heads` heads: each token's heads
/// split among up to one block per `WARPS` heads, fewer as tokens add up (each block
/// computes the token's cos and sin once; two blocks per SM fill the GPU).
fn grid<D: Device>(b: &CudaBackend<D>, tokens: usize, heads: usize) -> Result<(u32, u32, u32)> {
    let target = 2 * b.dev.info().multiprocessors as usize;
    let per_token = (target / tokens.max(1)).clamp(1, heads.div_ceil(WARPS).max(1));
    Ok((u32_arg("a step", tokens)?, per_token as u32, 1))
}

fn launch_config<D: Device>(
    b: &CudaBackend<D>,
    tokens: usize,
    heads: usize,
) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid: grid(b, tokens, heads)?,
        block: (32 * WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// `Backend::rope`: q and k heads rotated in place.
pub(super) fn rope<D: Device>(
    b: &CudaBackend<D>,
    qkv: &CudaBuf,
    step: &CudaStep,
    layout: QkvLayout,
    rope: &CudaRope<D>,
) -> Result<()> {
    let (mpos, comp) = rope.mrope_args(step);
    rotate(
        b,
        qkv.ptr,
        step.num_tokens,
        step.positions,
        mpos,
        comp,
        layout,
        rope,
    )
}

/// A vision tower's 2D rotary embedding on its `[q | k | v]` rows (`layout`: as many k heads
/// as q heads): pair `i` turns with component `rope`'s table gives it of each row's three
/// positions `positions[3r ..]` (row, column, unused).
pub(super) fn rope_rows<D: Device>(
    b: &CudaBackend<D>,
    qkv: DevPtr,
    rows: usize,
    positions: DevPtr,
    layout: QkvLayout,
    rope: &CudaRope<D>,
) -> Result<()> {
    let comp = rope
        .components
        .as_ref()
        .map(|c| c.ptr())
        .ok_or_else(|| EngineError::Backend("a 2D rotary table needs its components".into()))?;
    // `positions` stands in for the plain positions too: the kernel reads them only
    // without a component table.
    rotate(b, qkv, rows, positions, positions, comp, layout, rope)
}

#[allow(clippy::too_many_arguments)]
fn rotate<D: Device>(
    b: &CudaBackend<D>,
    qkv: DevPtr,
    tokens: usize,
    positions: DevPtr,
    mpos: DevPtr,
    comp: DevPtr,
    layout: QkvLayout,
    rope: &CudaRope<D>,
) -> Result<()> {
    let rot = rope.check(layout)?;
    if tokens == 0 {
        return Ok(());
    }
    let heads = layout.q_heads + layout.kv_heads;
    b.launch(
        "rope",
        launch_config(b, tokens, heads)?,
        &[
            qkv.into(),
            positions.into(),
            rope.steps.ptr().into(),
            mpos.into(),
            comp.into(),
            (layout.q_heads as u32).into(),
            (layout.kv_heads as u32).into(),
            (layout.head_dim as u32).into(),
            rot.into(),
        ],
    )
}

/// `Backend::qk_norm_rope_write_kv` in one launch, a warp per q, k or v head.
#[allow(clippy::too_many_arguments)]
pub(super) fn qk_norm_rope_write_kv<D: Device>(
    b: &CudaBackend<D>,
    qkv: &CudaBuf,
    step: &CudaStep,
    layout: QkvLayout,
    qk_norm: Option<(&CudaWeight<D>, &CudaWeight<D>, f32)>,
    rope: &CudaRope<D>,
    k_cache: &CudaKv<D>,
    v_cache: &CudaKv<D>,
) -> Result<()> {
    let rot = rope.check(layout)?;
    let tokens = step.num_tokens;
    if tokens == 0 {
        return Ok(());
    }
    let (q_norm, k_norm, eps) = match qk_norm {
        Some((q, k, eps)) => {
            for w in [q, k] {
                if w.shape != [layout.head_dim] {
                    return Err(EngineError::Backend(format!(
                        "a q/k norm of shape {:?} for head_dim {}",
                        w.shape, layout.head_dim
                    )));
                }
            }
            (q.ptr(), k.ptr(), eps)
        }
        None => (DevPtr::NULL, DevPtr::NULL, 0.0),
    };
    if qkv.len < tokens * layout.row_width() {
        return Err(EngineError::Backend(format!(
            "qkv holds {} values, {tokens} rows of {} expected",
            qkv.len,
            layout.row_width()
        )));
    }
    let heads = layout.q_heads + 2 * layout.kv_heads;
    let (mpos, comp) = rope.mrope_args(step);
    b.launch(
        "qk_norm_rope_write_kv",
        launch_config(b, tokens, heads)?,
        &[
            qkv.ptr.into(),
            k_cache.ptr().into(),
            v_cache.ptr().into(),
            step.positions.into(),
            step.slots.into(),
            rope.steps.ptr().into(),
            mpos.into(),
            comp.into(),
            q_norm.into(),
            k_norm.into(),
            eps.into(),
            (layout.q_heads as u32).into(),
            (layout.kv_heads as u32).into(),
            (layout.head_dim as u32).into(),
            rot.into(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `round(f · 2⁶⁴ / 2π) mod 2⁶⁴`, computed with exact rational arithmetic from π
    /// (Machin's formula, 80 digits) outside this code.
    const EXACT: [(f64, u64); 5] = [
        (1.0, 2_935_890_503_282_001_226),
        (0.5, 1_467_945_251_641_000_613),
        (1.0 / 1_073_741_824.0, 2_734_261_102),
        (7.0, 2_104_489_449_264_456_969),
        (0.3, 880_767_150_984_600_335),
    ];

    #[test]
    fn steps_are_the_turns_per_position_in_fixed_point() {
        let got = rope_steps(&EXACT.map(|(f, _)| f));
        for ((f, want), got) in EXACT.iter().zip(got) {
            let diff = got.wrapping_sub(*want) as i64;
            assert!(diff.abs() <= 1, "f = {f}: {got}, expected {want}");
        }
    }

    #[test]
    fn a_position_times_its_step_is_the_angle_in_turns() {
        // Llama 3's slowest frequency with scaling, and its fastest, at positions where an
        // f64 product still holds the angle to ~1e-10 turn.
        let fs = [1.0 / 500_000f64.powf(126.0 / 128.0) / 8.0, 1.0, 0.012_345];
        for (f, step) in fs.iter().zip(rope_steps(&fs)) {
            for pos in [0u32, 1, 17, 8191, 131_071, 1 << 20] {
                let turns = pos as f64 * f / std::f64::consts::TAU;
                let want = turns - turns.floor();
                let got = (pos as u64).wrapping_mul(step) as f64 / 18_446_744_073_709_551_616.0;
                let err = (got - want).abs().min(1.0 - (got - want).abs());
                assert!(err < 1e-9, "f {f}, pos {pos}: {got} turns, expected {want}");
            }
        }
    }
}
