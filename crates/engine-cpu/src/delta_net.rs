//! Gated DeltaNet on the CPU (Qwen3.5 / Qwen3-Next linear attention), token by token in the
//! recurrent form for prefill and decode alike: a sequence's outputs are then computed the
//! same way whatever the step holds and however its prompt was cut into chunks (batch
//! invariance, and a snapshot at any token). Per token and value head the state update costs
//! `4 · dk · dv` flops, a few percent of the layer's projections, so the chunked form's
//! speed-up is not needed on a CPU.
//!
//! Per sequence: the causal depthwise convolution over `[q k v]` (its last `kernel - 1` inputs
//! kept in the state), SiLU; then per value head `h` (reading key head `h / (nv / nk)`):
//! q and k L2-normalized, q scaled by `1 / sqrt(dk)`, `β = σ(b)`, `g = -exp(A_log) ·
//! softplus(a + dt_bias)`, and with the state `S` (`dk × dv`):
//! `S ← e^g · S;  S ← S + k ⊗ β (v − Sᵀk);  o = Sᵀq`, then `o` RMS-normalized, times the norm's
//! weight and `silu(z)`.

use lmi_checkpoint::config::linear_attn::LinearAttnConfig;
use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::state::StateConfig;

use crate::qlinear::SendPtr;

/// One linear-attention layer's states: `slots` of `slot_len` f32 each, a slot holding the
/// convolution's inputs `[conv_dim, kernel - 1]` (oldest first) then a `[dk, dv]` matrix per
/// value head.
pub struct CpuState {
    pub data: Vec<f32>,
    pub slot_len: usize,
}

impl CpuState {
    pub fn zeroed(cfg: &StateConfig) -> Result<Self> {
        let len = cfg.slots.checked_mul(cfg.slot_len).ok_or_else(|| {
            EngineError::Backend("recurrent state slots overflow the address space".into())
        })?;
        Ok(CpuState {
            data: vec![0.0; len],
            slot_len: cfg.slot_len,
        })
    }

    pub fn copy(&mut self, pairs: &[(u32, u32)]) {
        let n = self.slot_len;
        for &(s, d) in pairs {
            let (s, d) = (s as usize * n, d as usize * n);
            self.data.copy_within(s..s + n, d);
        }
    }
}

/// The layer's weights as f32 slices.
pub struct Weights<'a> {
    pub dims: &'a LinearAttnConfig,
    /// `[conv_dim, kernel]`.
    pub conv: &'a [f32],
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
    pub norm: &'a [f32],
    pub eps: f32,
}

/// Below this much work (values of state touched) a step stays on the calling thread.
const PAR_WORK: usize = 1 << 16;

/// [`lmi_engine_core::Backend::gated_delta_net`] on the host: `proj` `[tokens, proj_dim]`,
/// `out` `[tokens, value_dim]`.
pub fn gated_delta_net(
    proj: &[f32],
    step: &BatchLayout,
    w: &Weights<'_>,
    state: &mut CpuState,
    out: &mut [f32],
) -> Result<()> {
    let d = w.dims;
    let (conv_dim, k1) = (d.conv_dim(), d.conv_kernel - 1);
    let pd = d.proj_dim();
    let n = step.num_tokens();
    let seqs = step.num_seqs();
    if step.states.len() != seqs {
        return Err(EngineError::Batch(format!(
            "a step of {seqs} sequences with {} state slots",
            step.states.len()
        )));
    }
    let slot_len = state.slot_len;
    // The convolution, per sequence: its outputs (after SiLU) for every token of the step.
    let mut conv_out = vec![0f32; n * conv_dim];
    {
        let st = SendPtr(state.data.as_mut_ptr());
        let co = SendPtr(conv_out.as_mut_ptr());
        let run = |s: usize| {
            let (a, b) = (step.cu_tokens[s] as usize, step.cu_tokens[s + 1] as usize);
            let cs = &step.states[s];
            // SAFETY: slots are distinct per step (checked when the step was prepared), so
            // each sequence writes only its own slot's convolution inputs and snapshots, and
            // only its own rows of `conv_out`.
            let slot = unsafe {
                std::slice::from_raw_parts_mut(ptr(&st).add(cs.slot as usize * slot_len), slot_len)
            };
            if step.start_pos(s) == 0 {
                slot.fill(0.0);
            }
            let rows = unsafe {
                std::slice::from_raw_parts_mut(ptr(&co).add(a * conv_dim), (b - a) * conv_dim)
            };
            conv_seq(
                proj,
                pd,
                a..b,
                w.conv,
                d.conv_kernel,
                &mut slot[..conv_dim * k1],
                rows,
                |at, inputs| {
                    for &(_, snap) in cs.snapshots.iter().filter(|&&(t, _)| t as usize == at) {
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(
                                ptr(&st).add(snap as usize * slot_len),
                                conv_dim * k1,
                            )
                        };
                        dst.copy_from_slice(inputs);
                    }
                },
            );
        };
        if n * conv_dim * d.conv_kernel < PAR_WORK || seqs < 2 {
            (0..seqs).for_each(run);
        } else {
            crate::pool::run(seqs, run);
        }
    }
    // The recurrence, per (sequence, value head).
    let (nv, dk, dv) = (d.num_v_heads, d.head_k_dim, d.head_v_dim);
    let (kd, vd) = (d.key_dim(), d.value_dim());
    let per_k = nv / d.num_k_heads;
    let mat = dk * dv;
    let st = SendPtr(state.data.as_mut_ptr());
    let o = SendPtr(out.as_mut_ptr());
    let conv_out = &conv_out;
    let head = |task: usize| {
        let (s, h) = (task / nv, task % nv);
        let (a, b) = (step.cu_tokens[s] as usize, step.cu_tokens[s + 1] as usize);
        let cs = &step.states[s];
        let matrix = |slot: u32| slot as usize * slot_len + conv_dim * k1 + h * mat;
        // SAFETY: (sequence, head) tasks touch disjoint state matrices and output columns.
        let sm = unsafe { std::slice::from_raw_parts_mut(ptr(&st).add(matrix(cs.slot)), mat) };
        let kh = h / per_k;
        let (mut q, mut k) = (vec![0f32; dk], vec![0f32; dk]);
        let mut o_row = vec![0f32; dv];
        let decay = -w.a_log[h].exp();
        for t in a..b {
            let x = &conv_out[t * conv_dim..(t + 1) * conv_dim];
            q.copy_from_slice(&x[kh * dk..(kh + 1) * dk]);
            k.copy_from_slice(&x[kd + kh * dk..kd + (kh + 1) * dk]);
            let v = &x[2 * kd + h * dv..2 * kd + (h + 1) * dv];
            l2_normalize(&mut q);
            l2_normalize(&mut k);
            let qs = 1.0 / (dk as f32).sqrt();
            q.iter_mut().for_each(|x| *x *= qs);
            let p = &proj[t * pd..(t + 1) * pd];
            let beta = sigmoid(p[conv_dim + vd + h]);
            let g = decay * softplus(p[conv_dim + vd + nv + h] + w.dt_bias[h]);
            let e = g.exp();
            let mut delta = vec![0f32; dv];
            delta_rule(sm, &k, &q, v, e, beta, &mut delta, &mut o_row);
            // The gated RMSNorm: o / rms(o) · w · silu(z).
            let z = &p[conv_dim + h * dv..conv_dim + (h + 1) * dv];
            let ss: f32 = o_row.iter().map(|x| x * x).sum();
            let inv = 1.0 / (ss / dv as f32 + w.eps).sqrt();
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr(&o).add(t * vd + h * dv), dv) };
            for j in 0..dv {
                dst[j] = o_row[j] * inv * w.norm[j] * silu(z[j]);
            }
            let done = (t - a + 1) as u32;
            for &(_, snap) in cs.snapshots.iter().filter(|&&(at, _)| at == done) {
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(ptr(&st).add(matrix(snap)), mat) };
                dst.copy_from_slice(sm);
            }
        }
    };
    let tasks = seqs * nv;
    if n * nv * mat < PAR_WORK || tasks < 2 {
        (0..tasks).for_each(head);
    } else {
        crate::pool::run(tasks, head);
    }
    Ok(())
}

/// One token's update of one head's state `s` (`dk × dv`, row i for key dimension i), two
/// passes over it: `u = Sᵀk`, `delta = β (v − e·u)`; then `S ← e·S + k ⊗ delta` and
/// `o = Sᵀq` from the new rows. (HF decays S first and then reads `Sᵀk`; `e·(Sᵀk)` is the same
/// value one pass cheaper.) With AVX2 the loops along a row run 8 lanes wide: plain multiplies
/// and adds in the same order, so the bits are those of the scalar loop.
#[allow(clippy::too_many_arguments)]
fn delta_rule(
    s: &mut [f32],
    k: &[f32],
    q: &[f32],
    v: &[f32],
    e: f32,
    beta: f32,
    delta: &mut [f32],
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa() != crate::simd::Isa::Scalar {
        // SAFETY: AVX2 was detected (every non-scalar ISA of `simd` has it).
        unsafe { delta_rule_avx2(s, k, q, v, e, beta, delta, o) };
        return;
    }
    delta_rule_body(s, k, q, v, e, beta, delta, o);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn delta_rule_avx2(
    s: &mut [f32],
    k: &[f32],
    q: &[f32],
    v: &[f32],
    e: f32,
    beta: f32,
    delta: &mut [f32],
    o: &mut [f32],
) {
    delta_rule_body(s, k, q, v, e, beta, delta, o);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn delta_rule_body(
    s: &mut [f32],
    k: &[f32],
    q: &[f32],
    v: &[f32],
    e: f32,
    beta: f32,
    delta: &mut [f32],
    o: &mut [f32],
) {
    let dv = delta.len();
    delta.fill(0.0);
    for (row, &ki) in s.chunks_exact(dv).zip(k) {
        for (d, &r) in delta.iter_mut().zip(row) {
            *d += r * ki;
        }
    }
    for (d, &vj) in delta.iter_mut().zip(v) {
        *d = (vj - e * *d) * beta;
    }
    o.fill(0.0);
    for ((row, &ki), &qi) in s.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((r, &dj), oj) in row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
            *r = e * *r + ki * dj;
            *oj += *r * qi;
        }
    }
}

/// The convolution over tokens `rows` of `proj` (their first `conv_dim` values), continuing
/// from `inputs` (the last `kernel - 1` inputs per channel, `[conv_dim, kernel - 1]`, oldest
/// first), which it leaves holding the chunk's last ones. `snapshot(t, inputs)` is called
/// with the inputs as they stand after each token `t` (1-based within the chunk).
#[allow(clippy::too_many_arguments)]
fn conv_seq(
    proj: &[f32],
    pd: usize,
    rows: std::ops::Range<usize>,
    conv: &[f32],
    kernel: usize,
    inputs: &mut [f32],
    out: &mut [f32],
    mut snapshot: impl FnMut(usize, &[f32]),
) {
    let k1 = kernel - 1;
    let conv_dim = inputs.len() / k1;
    for (j, t) in rows.enumerate() {
        let x = &proj[t * pd..t * pd + conv_dim];
        let o = &mut out[j * conv_dim..(j + 1) * conv_dim];
        for c in 0..conv_dim {
            let wc = &conv[c * kernel..(c + 1) * kernel];
            let past = &mut inputs[c * k1..(c + 1) * k1];
            let mut acc = wc[k1] * x[c];
            for (i, &p) in past.iter().enumerate() {
                acc += wc[i] * p;
            }
            o[c] = silu(acc);
            past.copy_within(1.., 0);
            past[k1 - 1] = x[c];
        }
        snapshot(j + 1, inputs);
    }
}

/// The pointer, through the wrapper (a closure that names the field would capture the bare
/// pointer, which is not `Sync`).
fn ptr(p: &SendPtr) -> *mut f32 {
    p.0
}

fn l2_normalize(x: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// PyTorch's softplus (β 1, threshold 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_engine_core::state::ChunkState;
    use lmi_engine_core::{LogitsWanted, SeqChunk};

    fn dims() -> LinearAttnConfig {
        LinearAttnConfig {
            layers: vec![true],
            num_k_heads: 1,
            num_v_heads: 2,
            head_k_dim: 4,
            head_v_dim: 3,
            conv_kernel: 4,
        }
    }

    fn layout(lens: &[(usize, usize)], states: Vec<ChunkState>) -> BatchLayout {
        let chunks: Vec<SeqChunk> = lens
            .iter()
            .map(|&(start, n)| SeqChunk {
                tokens: vec![1; n],
                start_pos: start,
                block_table: vec![0; (start + n).div_ceil(16)],
                window_table: Vec::new(),
                logits: LogitsWanted::None,
                adapter: None,
            })
            .collect();
        let mut l = BatchLayout::new(&chunks, 1).unwrap();
        l.states = states;
        l
    }

    fn rand(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(40503));
                ((x >> 8) % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// A sequence run whole, run in two chunks (the state carried between), and run beside
    /// another sequence gives the same bits; a snapshot taken mid-chunk resumes exactly.
    #[test]
    fn chunks_batches_and_snapshots_give_the_same_bits() {
        let d = dims();
        let cfg = StateConfig {
            slots: 4,
            layers: 1,
            slot_len: d.state_len(),
        };
        let conv = rand(d.conv_dim() * 4, 1);
        let (a_log, dt, norm) = (rand(2, 2), rand(2, 3), rand(3, 4));
        let w = Weights {
            dims: &d,
            conv: &conv,
            a_log: &a_log,
            dt_bias: &dt,
            norm: &norm,
            eps: 1e-6,
        };
        let pd = d.proj_dim();
        let proj = rand(11 * pd, 5);
        let vd = d.value_dim();
        let run =
            |lens: &[(usize, usize)], states: Vec<ChunkState>, proj: &[f32], st: &mut CpuState| {
                let l = layout(lens, states);
                let mut out = vec![0f32; l.num_tokens() * vd];
                gated_delta_net(proj, &l, &w, st, &mut out).unwrap();
                out
            };
        let mut st = CpuState::zeroed(&cfg).unwrap();
        let whole = run(
            &[(0, 11)],
            vec![ChunkState {
                slot: 0,
                snapshots: vec![(5, 3)],
            }],
            &proj,
            &mut st,
        );
        // Two chunks, 5 then 6 tokens.
        let mut st2 = CpuState::zeroed(&cfg).unwrap();
        st2.data.iter_mut().for_each(|x| *x = 7.0); // a fresh sequence zeroes its slot
        let mut cut = run(
            &[(0, 5)],
            vec![ChunkState::in_slot(1)],
            &proj[..5 * pd],
            &mut st2,
        );
        cut.extend(run(
            &[(5, 6)],
            vec![ChunkState::in_slot(1)],
            &proj[5 * pd..],
            &mut st2,
        ));
        assert_eq!(cut, whole);
        // From the snapshot after 5 tokens.
        let mut st3 = CpuState::zeroed(&cfg).unwrap();
        st3.data.copy_from_slice(&st.data);
        let rest = run(
            &[(5, 6)],
            vec![ChunkState::in_slot(3)],
            &proj[5 * pd..],
            &mut st3,
        );
        assert_eq!(rest, whole[5 * vd..]);
        // Beside another sequence.
        let other = rand(4 * pd, 9);
        let both: Vec<f32> = other.iter().chain(&proj).copied().collect();
        let mut st4 = CpuState::zeroed(&cfg).unwrap();
        let busy = run(
            &[(0, 4), (0, 11)],
            vec![ChunkState::in_slot(2), ChunkState::in_slot(0)],
            &both,
            &mut st4,
        );
        assert_eq!(&busy[4 * vd..], &whole[..]);
    }
}
