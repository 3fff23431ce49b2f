//! The non-greedy path: temperature, truncation filters and the inverse-CDF draw.
//!
//! Candidates carry their logit `x` and `w = 2^((x - max) · log2(e) / T)`, the unnormalized
//! probability after temperature (the most likely token has `w = 1`), computed in f32 by
//! [`super::weight`] exactly as the CUDA sampler computes it; sums of weights are f64.
//! Candidates are ordered by logit descending, then id ascending (`w` is monotone in the
//! logit, so this is also `w` descending); every filter and the draw are defined on that
//! order. Nothing here sorts the whole vocabulary unless `typical_p` is active: top-k is a
//! selection, top-p and the draw are mass-guided selections ([`rank_by_mass`]).

use std::cell::RefCell;
use std::cmp::Ordering;

use super::SamplingParams;
use super::weight;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Cand {
    pub id: u32,
    /// The (cleaned, finite) logit.
    pub x: f32,
    /// [`weight::weight`] of `x`: positive, at most 1.
    pub w: f32,
}

impl Cand {
    /// The weight as an f64 term of a sum (exact).
    #[inline]
    pub fn mass(&self) -> f64 {
        f64::from(self.w)
    }
}

/// Logit descending, then id ascending (±0 compare equal: id order).
#[inline]
fn order(a: &Cand, b: &Cand) -> Ordering {
    b.x.partial_cmp(&a.x)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

thread_local! {
    /// Per-thread candidate buffer: a vocab-sized allocation per token would dominate the
    /// cost for small batches; rayon workers each keep their own.
    static CANDIDATES: RefCell<Vec<Cand>> = const { RefCell::new(Vec::new()) };
}

/// Draws a token from a cleaned row whose maximum `max` is finite, given `u` in `[0, 1)`.
/// `None` only when unvalidated params (e.g. `min_p > 1`, NaN temperature) leave no
/// candidate; the caller then takes the argmax.
pub(crate) fn draw(row: &[f32], max: f32, params: &SamplingParams, u: f64) -> Option<u32> {
    CANDIDATES.with(|cell| {
        let mut cands = cell.borrow_mut();
        survivors(row, max, params, &mut cands);
        if cands.is_empty() {
            return None;
        }
        let total: f64 = cands.iter().map(Cand::mass).sum();
        let target = u * total;
        // The crossing is usually among the few heaviest: rank those alone when they hold it.
        let n = HEAVY
            .iter()
            .find_map(|&w| heavy_first(&mut cands, w, target, total))
            .unwrap_or(cands.len());
        let r = rank_by_mass(&mut cands[..n], target, Crossing::Above);
        Some(cands[r].id)
    })
}

/// Weights (relative to the most likely token's 1) from which candidates count as heavy, tried
/// in turn: a peaked row's draw lands among a handful above 2^-8, a flat row's among
/// thousands above 2^-20.
const HEAVY: [f32; 2] = [1.0 / 256.0, 1.0 / (1u32 << 20) as f32];

/// Moves the candidates of weight at least `heavy` to the front and returns their count when
/// their mass alone passes `target` (by a margin no summation order can undo): the draw's
/// crossing is then among them, since every heavy candidate ranks before every light one, and
/// the selections need not touch the long tail a vocabulary has at any temperature. None
/// otherwise (the draw lands past them, with the probability of what lies past them).
fn heavy_first(cands: &mut [Cand], heavy: f32, target: f64, total: f64) -> Option<usize> {
    let mut n = 0;
    for i in 0..cands.len() {
        if cands[i].w >= heavy {
            cands.swap(n, i);
            n += 1;
        }
    }
    let heavy: f64 = cands[..n].iter().map(Cand::mass).sum();
    (n > 0 && heavy - target > total * 1e-9).then_some(n)
}

/// Fills `cands` with the tokens that survive temperature -> min_p -> top_k -> top_p ->
/// typical_p; each stage sees the (renormalized) survivors of the previous one. Never empty
/// when `max` is finite: the most probable token survives every stage but typical_p, and
/// typical_p keeps at least one token.
pub(crate) fn survivors(row: &[f32], max: f32, params: &SamplingParams, cands: &mut Vec<Cand>) {
    cands.clear();
    let scale = weight::scale(params.temperature);
    // min_p: p < min_p * p_max  <=>  w < min_p, since w_max = 1. Also drops w that
    // underflowed to 0 (below 2^-126 of the most likely token's at this temperature).
    let min_w = params.min_p;
    // Weights a block at a time (vectorized, the same bits as one by one).
    let mut ws = [0f32; 256];
    for (b, xs) in row.chunks(ws.len()).enumerate() {
        weight::weights(xs, max, scale, &mut ws);
        for (j, (&x, &w)) in xs.iter().zip(&ws).enumerate() {
            // A -inf logit weighs 0.
            if w > 0.0 && w >= min_w {
                cands.push(Cand {
                    id: (b * ws.len() + j) as u32,
                    x,
                    w,
                });
            }
        }
    }
    let k = params.top_k as usize;
    if k > 0 && k < cands.len() {
        cands.select_nth_unstable_by(k - 1, order);
        cands.truncate(k);
    }
    if params.top_p < 1.0 && !cands.is_empty() {
        let total: f64 = cands.iter().map(Cand::mass).sum();
        let r = rank_by_mass(cands, f64::from(params.top_p) * total, Crossing::AtLeast);
        cands.truncate(r + 1);
    }
    if params.typical_p < 1.0 && !cands.is_empty() {
        typical(cands, f64::from(params.typical_p));
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crossing {
    /// First rank whose inclusive cumulative mass is `>= target` (top-p).
    AtLeast,
    /// First rank whose inclusive cumulative mass is `> target` (inverse-CDF draw).
    Above,
}

/// Below this many candidates a plain sort + walk is cheaper than more selections.
const SORT_CUTOFF: usize = 64;
/// First probe: probability mass is usually concentrated in the head of the order.
const HEAD_PROBE: usize = 256;

/// Finds the rank `r` (in the `(w desc, id asc)` order) at which the cumulative mass
/// crosses `target`, without sorting everything: repeated `select_nth_unstable` splits
/// (first a small head, then halves) and descends into the side holding the crossing.
/// On return `cands[..r]` hold exactly the candidates ranked before `cands[r]`.
/// If rounding keeps the mass from ever crossing, the last candidate is returned.
/// `cands` must not be empty.
pub(crate) fn rank_by_mass(cands: &mut [Cand], target: f64, crossing: Crossing) -> usize {
    let crosses = |mass: f64| match crossing {
        Crossing::AtLeast => mass >= target,
        Crossing::Above => mass > target,
    };
    let (mut lo, mut hi, mut acc) = (0usize, cands.len(), 0.0f64);
    let mut first = true;
    while hi - lo > SORT_CUTOFF {
        let len = hi - lo;
        let k = if first {
            HEAD_PROBE.min(len / 2)
        } else {
            len / 2
        };
        first = false;
        let part = &mut cands[lo..hi];
        part.select_nth_unstable_by(k, order);
        let head: f64 = part[..k].iter().map(Cand::mass).sum();
        if crosses(acc + head) {
            hi = lo + k;
        } else {
            acc += head;
            lo += k;
        }
    }
    let part = &mut cands[lo..hi];
    part.sort_unstable_by(order);
    for (j, c) in part.iter().enumerate() {
        acc += c.mass();
        if crosses(acc) {
            return lo + j;
        }
    }
    hi - 1
}

/// HF `TypicalLogitsWarper` on the survivors: sort by `|-ln p - H|` ascending (ties id
/// ascending), find the first index where the cumulative probability reaches `mass`
/// (clamped to the last), keep every token whose score is `<=` the score there.
fn typical(cands: &mut Vec<Cand>, mass: f64) {
    let total: f64 = cands.iter().map(Cand::mass).sum();
    let ln_total = total.ln();
    let entropy: f64 = cands
        .iter()
        .map(|c| {
            let lp = c.mass().ln() - ln_total;
            -lp.exp() * lp
        })
        .sum();
    let mut scored: Vec<(f64, Cand)> = cands
        .iter()
        .map(|&c| ((-(c.mass().ln() - ln_total) - entropy).abs(), c))
        .collect();
    scored.sort_unstable_by(|a, b| {
        a.0.partial_cmp(&b.0)
            .unwrap_or(Ordering::Equal)
            .then(a.1.id.cmp(&b.1.id))
    });
    let mut cum = 0.0;
    let mut last = scored.len() - 1;
    for (j, (_, c)) in scored.iter().enumerate() {
        cum += c.mass() / total;
        if cum >= mass {
            last = j;
            break;
        }
    }
    let threshold = scored[last].0;
    cands.clear();
    cands.extend(
        scored
            .iter()
            .filter(|(s, _)| *s <= threshold)
            .map(|&(_, c)| c),
    );
}
