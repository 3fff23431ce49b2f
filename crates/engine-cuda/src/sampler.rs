//! Logits processing on the device: draws and prompt-token scores with the CPU sampler's
//! semantics (`sampling::sample_masked`, `sampling::token_logprob`), in one kernel launch
//! (`sampler_run`, kernels/sampling.cu) between one upload and one download.
//!
//! # Per step
//! The host packs every job (a draw or a score) into one upload: a 72-byte record per job
//! (row, flags, filters, the weights' `scale = sampling::weight::scale(temperature)` (f32)
//! and the draw's `u = uniform(seed, output.len())`, both computed here by the CPU's code, the
//! mask slot)
//! followed by the processors as a compact list of per-token edits (bias, repetition,
//! presence/frequency, ban), produced by `sampling::processors::for_each_edit`, the code the
//! CPU path applies itself, so the two can never edit different tokens, then the token masks
//! of constrained draws. The edits are sorted by token (stably: one token's edits keep the
//! CPU's order). A draw's `RowSample::allowed` is waited for after everything else is packed
//! (it may still be computed while the forward pass runs); each mask adds `ceil(vocab / 32)`
//! words to the upload, cut or zero-padded to that length (tokens past a mask's end are not
//! allowed); an unmasked job, or one whose `wait` says `None` (unconstrained, as on the CPU),
//! adds nothing. One block per job then edits its row (in place when no other job reads that
//! row, else in a private copy from the step arena), and one download returns ids, logprobs
//! and top-n pairs. Scratch comes from the step arena; the upload and result buffers are kept
//! here and grow by powers of two.
//!
//! # Kernel (one block of 512 threads per job; the row stays in L2 between passes)
//! * **Masks** are folded into every read of the row, never written into it: a masked token
//!   reads as `-inf` (its logit is not even loaded), which is what the CPU's `apply_mask`
//!   before every processor leaves there, since the edits map `-inf` to `-inf` or NaN (for
//!   valid parameters: `repetition_penalty > 0`). So masked tokens drop out of the stats,
//!   every filter, the draw, logprobs and top-n, and a lifted ban cannot bring one back; edits
//!   skip them and a private copy leaves them out (so no pass ever reads a masked logit).
//! * **Stats** (every job): one pass for the argmax (lowest id on ties) and an online
//!   log-sum-exp (f32 exponentials, f64 partial sums). Greedy jobs stop here (plus top-n):
//!   about one read of the row. If bans leave no finite logit, the saved pre-ban values are put
//!   back and the stats redone, as the CPU does.
//! * **Ordering without sorting**: a candidate's rank key is `(order_key(logit) << 32) | !id`,
//!   which orders candidates by logit descending, then id ascending. `locate` finds the
//!   candidate at which a cumulative count or mass crosses a target: a 16-way search over key
//!   intervals, each level one pass with per-thread histogram columns in shared memory
//!   (counts and f64 masses, reduced in a fixed order: deterministic, no float atomics), until
//!   at most 4096 candidates remain; those are gathered, bitonic-sorted in shared memory and
//!   scanned. The first level splits the logit range evenly (from the row's lowest finite
//!   logit to its max), so the top digits, where the mass and the first ranks are, hold few
//!   candidates; later levels split the key range evenly.
//! * **Sampled path**: temperature underflow and `min_p` keep the logits at or above one key,
//!   found by a 32-way search of warp 0 over the key space (`w` is monotone in the logit);
//!   `top_k` is a count search; `top_p` and the draw are mass searches (`u · total`, first
//!   candidate whose inclusive cumulative mass exceeds it); `typical_p` computes total and
//!   entropy in two passes, then a mass search over the typical score's key (`w / total`
//!   per candidate, as the CPU accumulates it), keeping the candidates whose score is at most
//!   the crossing one's. Every weight is `sampling::weight::weight(x, max, scale)`: f32
//!   arithmetic (`2^t` by range reduction and a polynomial, no library `exp`) that the kernel
//!   repeats operation for operation, so it has the CPU's bits; weights are summed in f64.
//! * **Top-n** (n ≤ 4096; the API allows 1024): a count search for the n-th candidate, then
//!   the n survivors are gathered and sorted in shared memory. **Scores** run the stats and
//!   top-n on the raw row (`token_logprob`: no processing).
//!
//! # Exactness
//! Tokens equal the CPU's whenever the logits agree, except where the two compute the same
//! quantity with different rounding (masks involve none: a token is allowed or not, and the
//! masked row's stats, filters and draw then follow the rules below like any other row's):
//! * f64 sums (each filter's total, the cumulative masses) are added in a different order
//!   (tree of per-thread partial sums vs the CPU's sequential walk over a partially sorted
//!   buffer), so they agree to a few ulps of the total (at most about `n · 2^-53` relative
//!   over `n` candidates, typically far less); a draw or a top-p / typical-p boundary can
//!   differ only when `u · total` (or the target) lies within that distance of a cumulative
//!   boundary. The same holds for the CPU's "rounding never crosses: take the last
//!   candidate" fallback, which the device reproduces on its own sums.
//! * Weights are equal, bit for bit, on every device: `t = (x - max) · scale` and `2^t` use
//!   only f32 additions, multiplications (`__fadd_rn` / `__fmul_rn` in the kernel: never fused
//!   into FMAs, which would round once instead of twice), a comparison and exponent bits, all
//!   correctly rounded in IEEE arithmetic on the GPU, the host and the emulator alike. Both
//!   sides order candidates by logit, then id, so equal weights of distinct logits
//!   (neighbouring logits can share an f32 weight, more often at high temperatures) rank the
//!   same. `w` is monotone in the logit by construction (`sampling::weight`), so the `min_p` /
//!   underflow cutoff found by a search over logits is exactly the CPU's per-token test
//!   (`w > 0 && w >= min_p`); the test `min_p_at_a_tokens_exact_weight_matches_the_cpu` sets
//!   `min_p` to a token's exact weight and fails for a device weight one unit in the last
//!   place off.
//! * `typical_p`'s scores use `log` and `exp` in f64 on the (equal) weights: CUDA's vs the
//!   host's libm can differ in the last bit, which matters only at a score boundary.
//! * Log-probabilities use `expf` and a different summation than the CPU's polynomial `exp`:
//!   within about 1e-6 (the tests allow 1e-4).
//!
//! # Cost
//! Greedy: one pass over the row (top-n adds one or two search passes and a gather). Sampled:
//! the stats pass, then per search (top-k, top-p, the draw) usually one or two level passes
//! plus one gather pass (a simulation of a 128K row of Gaussian logits with a few outliers:
//! top-p 0.9, the draw, top-k 50 and top-n 1024 each settle after one level, the draw at
//! u = 0.999 and top-k 10000 after two). Only candidates still in play compute their weight:
//! without top-k the first mass level computes one per token, the dominant cost at 128K (with
//! the f64 add of its histogram column); with top-k (a count search, integer only) or after
//! top-p, later passes compute weights for the few survivors only. A weight is about 25 f32 /
//! integer instructions and one f32 → f64 conversion (sm_90 SASS: 11 FADD, 8 FMUL, 3 FSETP,
//! FMNMX, a few integer ops, F2F), no f64 arithmetic; the f64 `exp` it replaces was 20 f64
//! instructions (14 DFMA) and two conversions, at half the f32 rate on H100 and A100 and
//! 1/64 of it on L4, L40S and A10-class GPUs. `typical_p` is a slow path (two more passes,
//! then a search over the score's f64 key, its first level spread evenly over the scores'
//! analytic range, whose every level evaluates `exp` and `log` per candidate). Every pass of a
//! masked job also reads its mask (4 bytes per 32 tokens) and loads only the allowed logits,
//! so a tight mask makes its passes cheaper; unmasked jobs read no mask. One block of 512
//! threads per job (83 registers on sm_90, 81 on sm_80 with NVRTC 13.5, 84 with 13.0; no
//! spills; 96 KiB of dynamic and 1.1 KiB of static shared memory: one block per SM at a time,
//! so registers below 128 cost no occupancy).

use std::sync::{Arc, Mutex};

use lmi_cuda::{Arg, DevPtr, Device, DeviceExt, ElemType, LaunchConfig};
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::sampling::processors::{Edit, for_each_edit};
use lmi_engine_core::sampling::{Sampled, uniform, weight};
use lmi_engine_core::step::{LogitsOutput, LogitsWork, TokenLogprob};

use super::backend::{CudaBackend, CudaBuf, lock};
use super::memory::{DeviceBox, cuda_err};

pub const KERNELS: &[&str] = &["sampler_run"];

/// Threads per block (`SMP_THREADS`).
const THREADS: u32 = 512;
/// Dynamic shared memory of `sampler_run` (`SMP_DYN_BYTES`).
const SHARED_BYTES: u32 = 16 * 512 * 12;
/// The largest top-n the kernel lists (`SMP_CAP`).
pub const MAX_TOP_N: u32 = 4096;

/// Size of one job record (`struct Job`).
const JOB_BYTES: usize = 72;
const JOB_GREEDY: u32 = 1;
const JOB_SCORE: u32 = 2;
const JOB_COPY: u32 = 4;
const JOB_BANS: u32 = 8;
const JOB_MASK: u32 = 16;

/// Words per job of the result header: token, logprob bits, top count, 0.
const HEADER_WORDS: usize = 4;

pub struct Sampler<D: Device> {
    dev: Arc<D>,
    state: Mutex<State<D>>,
}

/// Host staging and the device buffers that outlive a step.
struct State<D: Device> {
    bytes: Vec<u8>,
    ops: Vec<(u32, u32, f32)>,
    upload: Option<DeviceBox<D>>,
    results: Option<DeviceBox<D>>,
    shared_configured: bool,
}

impl<D: Device> Sampler<D> {
    pub fn new(dev: &Arc<D>) -> Self {
        Sampler {
            dev: dev.clone(),
            state: Mutex::new(State {
                bytes: Vec::new(),
                ops: Vec::new(),
                upload: None,
                results: None,
                shared_configured: false,
            }),
        }
    }
}

/// A device buffer of at least `bytes`, replaced by one twice as large when too small.
fn ensure<D: Device>(
    dev: &Arc<D>,
    slot: &mut Option<DeviceBox<D>>,
    bytes: usize,
) -> Result<DevPtr> {
    if slot.as_ref().is_none_or(|b| b.bytes() < bytes) {
        *slot = None;
        *slot = Some(DeviceBox::new(dev, bytes.next_power_of_two().max(4096))?);
    }
    Ok(slot.as_ref().map(|b| b.ptr()).unwrap_or_default())
}

/// What the host decided for one job.
struct JobPlan {
    row: u32,
    flags: u32,
    token: u32,
    top_n: u32,
    top_off: u32,
    ops_off: u32,
    ops_cnt: u32,
    copy_slot: u32,
    min_p: f32,
    top_p: f32,
    typical_p: f32,
    top_k: u32,
    /// `sampling::weight::scale(temperature)`: the weights' factor, as the CPU computes it.
    scale: f32,
    u: f64,
    /// Index of the job's mask among the uploaded ones (with `JOB_MASK`).
    mask_slot: u32,
}

impl JobPlan {
    fn write(&self, out: &mut Vec<u8>) {
        let words = [
            self.row,
            self.flags,
            self.token,
            self.top_n,
            self.top_off,
            self.ops_off,
            self.ops_cnt,
            self.copy_slot,
            self.min_p.to_bits(),
            self.top_p.to_bits(),
            self.typical_p.to_bits(),
            self.top_k,
            self.scale.to_bits(),
            0,
        ];
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&self.u.to_le_bytes());
        for w in [self.mask_slot, 0] {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    fn score(row: usize, token: u32, top_n: u32) -> Self {
        JobPlan {
            row: row as u32,
            flags: JOB_SCORE,
            token,
            top_n,
            top_off: 0,
            ops_off: 0,
            ops_cnt: 0,
            copy_slot: 0,
            min_p: 0.0,
            top_p: 1.0,
            typical_p: 1.0,
            top_k: 0,
            scale: 0.0,
            u: 0.0,
            mask_slot: 0,
        }
    }
}

fn edit_code(e: Edit) -> (u32, f32) {
    match e {
        Edit::Bias(b) => (0, b),
        Edit::Repetition(p) => (1, p),
        Edit::Subtract(v) => (2, v),
        Edit::Ban => (3, 0.0),
    }
}

pub fn process<D: Device>(
    b: &CudaBackend<D>,
    logits: CudaBuf,
    rows: usize,
    vocab: usize,
    work: &LogitsWork<'_>,
) -> Result<LogitsOutput> {
    let n_jobs = work.samples.len() + work.scores.len();
    if n_jobs == 0 {
        return Ok(LogitsOutput::default());
    }
    if vocab == 0 {
        // Nothing to read on the device: the CPU's answers for an empty row.
        return Ok(lmi_engine_core::step::process_logits_host(&mut [], 0, work));
    }
    check_shape(&logits, rows, vocab, work)?;
    let sampler = &b.sampler;
    let mut st = lock(&sampler.state);
    let st = &mut *st;
    if !st.shared_configured {
        let f = sampler
            .dev
            .function("sampler_run")
            .map_err(|e| EngineError::Backend(format!("loading kernel sampler_run: {e}")))?;
        sampler
            .dev
            .set_max_dynamic_shared(f, SHARED_BYTES)
            .map_err(cuda_err)?;
        st.shared_configured = true;
    }

    // Rows read by more than one job: a draw that edits such a row works on a copy.
    let mut readers = vec![0u32; rows];
    for s in &work.samples {
        readers[s.row] += 1;
    }
    for s in &work.scores {
        readers[s.row] += 1;
    }

    let mut jobs = Vec::with_capacity(n_jobs);
    st.ops.clear();
    let (mut copies, mut top_total) = (0u32, 0u64);
    for s in &work.samples {
        let p = s.params;
        let start = st.ops.len();
        let mut bans = false;
        for_each_edit(p, &s.ctx, vocab, |id, e| {
            bans |= e == Edit::Ban;
            let (kind, v) = edit_code(e);
            st.ops.push((id, kind, v));
        });
        // Stable: one token's edits keep the CPU's order.
        st.ops[start..].sort_by_key(|op| op.0);
        let ops_cnt = (st.ops.len() - start) as u32;
        let mut flags = 0;
        if p.is_greedy() {
            flags |= JOB_GREEDY;
        }
        if bans {
            flags |= JOB_BANS;
        }
        let mut copy_slot = 0;
        if ops_cnt > 0 && readers[s.row] > 1 {
            flags |= JOB_COPY;
            copy_slot = copies;
            copies += 1;
        }
        let top_n = top_n_of(p.top_logprobs, vocab)?;
        jobs.push(JobPlan {
            row: s.row as u32,
            flags,
            token: 0,
            top_n,
            top_off: top_total as u32,
            ops_off: start as u32,
            ops_cnt,
            copy_slot,
            min_p: p.min_p,
            top_p: p.top_p,
            typical_p: p.typical_p,
            top_k: p.top_k,
            scale: weight::scale(p.temperature),
            u: uniform(s.seed, s.ctx.output.len() as u64),
            mask_slot: 0,
        });
        top_total += u64::from(top_n);
    }
    for s in &work.scores {
        let top_n = top_n_of(s.top_n, vocab)?;
        let mut job = JobPlan::score(s.row, s.token, top_n);
        job.top_off = top_total as u32;
        jobs.push(job);
        top_total += u64::from(top_n);
    }
    if top_total > u64::from(u32::MAX / 2) {
        return Err(EngineError::Backend(
            "the step asks for too many top logprobs".into(),
        ));
    }

    // Constrained draws: wait for the masks as late as the single upload allows (they may be
    // computed while the forward pass runs). `None` from `wait` is an unconstrained draw.
    let masks: Vec<_> = work
        .samples
        .iter()
        .map(|s| s.allowed.and_then(|m| m.wait()))
        .collect();
    let mut mask_slots = 0u32;
    for (job, mask) in jobs.iter_mut().zip(&masks) {
        if mask.is_some() {
            job.flags |= JOB_MASK;
            job.mask_slot = mask_slots;
            mask_slots += 1;
        }
    }
    let mask_words = vocab.div_ceil(32);

    // One upload: jobs, then the ops (id, kind, value) at a 16-byte boundary, then the masks
    // (`mask_words` each, in slot order) at a 16-byte boundary.
    st.bytes.clear();
    st.bytes.reserve(
        jobs.len() * JOB_BYTES + st.ops.len() * 12 + mask_slots as usize * mask_words * 4 + 32,
    );
    for j in &jobs {
        j.write(&mut st.bytes);
    }
    debug_assert_eq!(st.bytes.len(), jobs.len() * JOB_BYTES);
    let ops_at = st.bytes.len().next_multiple_of(16);
    st.bytes.resize(ops_at, 0);
    for &(id, kind, v) in &st.ops {
        for w in [id, kind, v.to_bits()] {
            st.bytes.extend_from_slice(&w.to_le_bytes());
        }
    }
    let masks_at = st.bytes.len().next_multiple_of(16);
    st.bytes.resize(masks_at, 0);
    for bits in masks.iter().flatten() {
        // Exactly `mask_words` words: bits past the vocabulary are never read, and tokens past
        // a short mask's end are not allowed (zero words).
        let given = bits.len().min(mask_words);
        for w in &bits[..given] {
            st.bytes.extend_from_slice(&w.to_le_bytes());
        }
        let end = st.bytes.len() + (mask_words - given) * 4;
        st.bytes.resize(end, 0);
    }
    let upload = ensure(&sampler.dev, &mut st.upload, st.bytes.len())?;
    b.device().htod(&st.bytes, upload).map_err(cuda_err)?;

    let out_words = HEADER_WORDS * n_jobs + 2 * top_total as usize;
    let results = ensure(&sampler.dev, &mut st.results, out_words * 4)?;
    let copy_buf = if copies > 0 {
        b.arena_alloc(copies as usize * vocab, ElemType::F32)?.ptr
    } else {
        DevPtr::NULL
    };
    let saved = if st.ops.is_empty() {
        DevPtr::NULL
    } else {
        b.arena_alloc(st.ops.len(), ElemType::F32)?.ptr
    };
    let cfg = LaunchConfig::linear(n_jobs as u32, THREADS).with_shared(SHARED_BYTES);
    b.launch(
        "sampler_run",
        cfg,
        &[
            logits.ptr.into(),
            (vocab as u32).into(),
            upload.into(),
            upload.offset(ops_at).into(),
            if mask_slots > 0 {
                upload.offset(masks_at)
            } else {
                DevPtr::NULL
            }
            .into(),
            copy_buf.into(),
            saved.into(),
            results.into(),
            Arg::U32(n_jobs as u32),
        ],
    )?;
    let words = b
        .device()
        .dtoh_vec::<u32>(results, out_words)
        .map_err(cuda_err)?;
    Ok(decode(&words, &jobs, work.samples.len()))
}

fn check_shape(logits: &CudaBuf, rows: usize, vocab: usize, work: &LogitsWork<'_>) -> Result<()> {
    if logits.dtype != ElemType::F32 || logits.len < rows * vocab {
        return Err(EngineError::Backend(format!(
            "sampling needs {rows} x {vocab} f32 logits, got {} {:?} values",
            logits.len, logits.dtype
        )));
    }
    if vocab > u32::MAX as usize / 2 {
        return Err(EngineError::Backend(format!(
            "vocabulary of {vocab} tokens"
        )));
    }
    let bad = work
        .samples
        .iter()
        .map(|s| s.row)
        .chain(work.scores.iter().map(|s| s.row))
        .find(|&r| r >= rows);
    match bad {
        Some(r) => Err(EngineError::Backend(format!(
            "a logits request reads row {r} of {rows}"
        ))),
        None => Ok(()),
    }
}

/// Top-n entries a job can return: at most the vocabulary, at most [`MAX_TOP_N`].
fn top_n_of(n: u32, vocab: usize) -> Result<u32> {
    if n > MAX_TOP_N {
        return Err(EngineError::Backend(format!(
            "top logprobs of {n} tokens: the CUDA sampler lists at most {MAX_TOP_N}"
        )));
    }
    Ok(n.min(vocab as u32))
}

fn decode(words: &[u32], jobs: &[JobPlan], n_samples: usize) -> LogitsOutput {
    let pairs = &words[HEADER_WORDS * jobs.len()..];
    let mut out = LogitsOutput::default();
    for (i, job) in jobs.iter().enumerate() {
        let h = &words[HEADER_WORDS * i..HEADER_WORDS * (i + 1)];
        let count = h[2].min(job.top_n) as usize;
        let at = 2 * job.top_off as usize;
        let top = pairs[at..at + 2 * count]
            .chunks_exact(2)
            .map(|p| (p[0], f32::from_bits(p[1])))
            .collect();
        let logprob = f32::from_bits(h[1]);
        if i < n_samples {
            out.samples.push(Sampled {
                token: h[0],
                logprob,
                top,
            });
        } else {
            out.scores.push(TokenLogprob { logprob, top });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define name <literal>f` in kernels/sampling.cu.
    fn kernel_constant(name: &str) -> f32 {
        let src = lmi_cuda::kernels::source("sampling.cu").expect("kernels/sampling.cu");
        let line = src
            .text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("#define {name} in kernels/sampling.cu"));
        line.trim()
            .trim_end_matches('f')
            .parse()
            .unwrap_or_else(|e| panic!("{name} = {line}: {e}"))
    }

    #[test]
    fn the_kernel_weighs_with_the_cpus_constants() {
        for (i, &c) in weight::EXP2_COEFFS.iter().enumerate() {
            let k = kernel_constant(&format!("SMP_EXP2_C{}", i + 1));
            assert_eq!(k.to_bits(), c.to_bits(), "coefficient {}", i + 1);
        }
        assert_eq!(kernel_constant("SMP_ROUND"), 12_582_912.0);
    }

    #[test]
    fn a_job_record_is_the_kernels_struct() {
        let mut job = JobPlan::score(3, 7, 2);
        job.scale = 1.5;
        job.u = 0.25;
        job.mask_slot = 9;
        let mut bytes = Vec::new();
        job.write(&mut bytes);
        assert_eq!(bytes.len(), JOB_BYTES);
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        // struct Job: ..., top_k at 44, scale at 48, u at 56, mask_slot at 64.
        assert_eq!(f32::from_bits(word(48)), 1.5);
        assert_eq!(f64::from_le_bytes(bytes[56..64].try_into().unwrap()), 0.25);
        assert_eq!(word(64), 9);
    }
}
