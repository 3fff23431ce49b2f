//! Log-softmax statistics of a logits row: argmax, log-normalizer, top-n alternatives.

use std::cmp::Ordering;

/// NaN counts as `-inf` (never sampled, never panics); `+inf` becomes `f32::MAX` so the
/// log-normalizer stays finite.
#[inline]
pub(crate) fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        f32::MAX
    } else {
        x
    }
}

/// Logit descending, then id ascending: the order used for argmax and top-n.
#[inline]
fn by_logit_then_id(a: (u32, f32), b: (u32, f32)) -> Ordering {
    if a.1 > b.1 {
        Ordering::Less
    } else if a.1 < b.1 {
        Ordering::Greater
    } else {
        a.0.cmp(&b.0)
    }
}

/// What one pass over a (cleaned) row tells us.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowStats {
    /// Index of the largest logit, lowest id on ties (0 when every logit is `-inf`).
    pub argmax: u32,
    /// Largest logit (`-inf` when every logit is `-inf`).
    pub max: f32,
    /// `ln(sum(exp(x)))`, computed as `max + ln(sum(exp(x - max)))` in f64.
    log_norm: f64,
    len: usize,
}

impl RowStats {
    /// Cleans the row in place, then finds the argmax and the log-normalizer.
    pub(crate) fn scan_in_place(row: &mut [f32]) -> Self {
        for x in row.iter_mut() {
            *x = clean(*x);
        }
        Self::scan_raw(row)
    }

    /// [`RowStats::scan_in_place`] without the log-normalizer (`logprob` then gives NaN).
    pub(crate) fn scan_in_place_argmax(row: &mut [f32]) -> Self {
        for x in row.iter_mut() {
            *x = clean(*x);
        }
        let (argmax, max) = max_argmax(row);
        Self {
            argmax,
            max,
            log_norm: f64::NAN,
            len: row.len(),
        }
    }

    /// Scans a row that may hold NaN / inf without modifying it: one pass for the argmax
    /// (lowest id on ties), one vectorized pass for `Σ exp(x - max)`.
    pub(crate) fn scan_raw(row: &[f32]) -> Self {
        let (argmax, max) = max_argmax(row);
        let log_norm = if max == f32::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            // `clean` maps +inf to f32::MAX, which the shifted sum must see as the max too.
            let m = max;
            f64::from(m) + super::fast_exp::sum_exp_shifted_clean(row, m).ln()
        };
        Self {
            argmax,
            max,
            log_norm,
            len: row.len(),
        }
    }

    /// Log-probability of a token whose (cleaned) logit is `x`. A row with no finite logit
    /// is treated as all-equal logits (the limit of a uniform row): `-ln(vocab)`.
    pub(crate) fn logprob(&self, x: f32) -> f32 {
        if self.max == f32::NEG_INFINITY {
            -(self.len as f64).ln() as f32
        } else {
            (f64::from(x) - self.log_norm) as f32
        }
    }
}

/// The `n` most probable tokens as `(id, logprob)`, logprob descending, ties id ascending.
/// Tokens of probability zero (`-inf` logits: masked) are never listed, so fewer than `n`
/// entries come back when fewer tokens are possible.
pub(crate) fn top_n(row: &[f32], n: u32, stats: &RowStats) -> Vec<(u32, f32)> {
    let n = n as usize;
    if n == 0 {
        return Vec::new();
    }
    let finite = row
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as u32, clean(x)))
        .filter(|&(_, x)| x > f32::NEG_INFINITY);
    let mut best: Vec<(u32, f32)> = if n <= 32 {
        // Insertion into a short sorted buffer: one pass, rare inserts, no O(vocab) memory.
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        for cand in finite {
            let full = best.len() == n;
            if full
                && best
                    .last()
                    .is_some_and(|&w| by_logit_then_id(cand, w).is_ge())
            {
                continue;
            }
            let at = best.partition_point(|&b| by_logit_then_id(b, cand).is_lt());
            best.insert(at, cand);
            best.truncate(n);
        }
        best
    } else {
        let mut all: Vec<(u32, f32)> = finite.collect();
        if n < all.len() {
            all.select_nth_unstable_by(n - 1, |&a, &b| by_logit_then_id(a, b));
            all.truncate(n);
        }
        all.sort_unstable_by(|&a, &b| by_logit_then_id(a, b));
        all
    };
    for entry in &mut best {
        entry.1 = stats.logprob(entry.1);
    }
    best
}

/// Log-probability of `token` under `log_softmax` of the raw row, plus the top-`top_n`
/// alternatives: what prompt logprobs report. NaN logits count as `-inf`; a token outside
/// the row gets `-inf`.
pub fn token_logprob(logits: &[f32], token: u32, top_n: u32) -> (f32, Vec<(u32, f32)>) {
    let stats = RowStats::scan_raw(logits);
    let logprob = match logits.get(token as usize) {
        Some(&x) => stats.logprob(clean(x)),
        None => f32::NEG_INFINITY,
    };
    (logprob, self::top_n(logits, top_n, &stats))
}

/// The largest cleaned logit and its lowest index (`(0, -inf)` for a row of `-inf`).
pub(crate) fn max_argmax(row: &[f32]) -> (u32, f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature was detected.
        return unsafe { max_argmax512(row) };
    }
    max_argmax_scalar(row, 0, (0, f32::NEG_INFINITY))
}

pub(crate) fn max_argmax_scalar(
    row: &[f32],
    offset: usize,
    (mut argmax, mut max): (u32, f32),
) -> (u32, f32) {
    for (i, &x) in row.iter().enumerate() {
        let x = clean(x);
        if x > max {
            max = x;
            argmax = (offset + i) as u32;
        }
    }
    (argmax, max)
}

/// Sixteen lanes, each keeping its first maximum; then the lowest index among the lanes that
/// hold the overall maximum: the scalar scan's answer.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_argmax512(row: &[f32]) -> (u32, f32) {
    use std::arch::x86_64::*;
    let main = row.len() / 16 * 16;
    let (mut best, mut arg) = (f32::NEG_INFINITY, 0u32);
    if main > 0 {
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let fmax = _mm512_set1_ps(f32::MAX);
        let mut vmax = ninf;
        let mut vidx = _mm512_setzero_si512();
        let mut idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let step = _mm512_set1_epi32(16);
        let mut i = 0;
        while i < main {
            // SAFETY: i + 16 <= main <= row.len().
            let x = unsafe { _mm512_loadu_ps(row.as_ptr().add(i)) };
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            let x = _mm512_mask_mov_ps(_mm512_min_ps(x, fmax), nan, ninf);
            let gt = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, vmax);
            vmax = _mm512_mask_mov_ps(vmax, gt, x);
            vidx = _mm512_mask_mov_epi32(vidx, gt, idx);
            idx = _mm512_add_epi32(idx, step);
            i += 16;
        }
        let m = _mm512_reduce_max_ps(vmax);
        if m > f32::NEG_INFINITY {
            let at = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(vmax, _mm512_set1_ps(m));
            let big = _mm512_set1_epi32(i32::MAX);
            best = m;
            arg = _mm512_reduce_min_epi32(_mm512_mask_mov_epi32(big, at, vidx)) as u32;
        }
    }
    max_argmax_scalar(&row[main..], main, (arg, best))
}
