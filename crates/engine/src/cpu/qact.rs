//! Activations quantized to int8 per block of 32, as llama.cpp's Q8 activations: the inputs
//! of the quantized products (`qlinear.rs`).

/// Values per activation block.
pub(crate) const QK: usize = 32;
/// f32 lanes per block in `dl` and `s`: one per 4 values, the width of a `vpdpbusd` lane.
pub(crate) const LANES: usize = 8;

/// `rows × k` activations: per block of 32, the int8 values `q`, the scale `d` repeated in
/// each of 8 lanes (`dl`), and per lane `d · Σ q` over its 4 values (`s`), which the weight
/// formats with an offset (Q4_0, Q4_1, Q4_K, Q6_K) multiply by their per-lane minimum.
pub(crate) struct QAct {
    /// Blocks per row.
    pub nb: usize,
    pub q: Vec<i8>,
    pub dl: Vec<f32>,
    pub s: Vec<f32>,
}

impl QAct {
    /// Quantizes `rows` rows of `k` values (`k` a multiple of 32). Each row is quantized on
    /// its own, so a row's values never depend on the batch it is in.
    pub fn new(x: &[f32], rows: usize, k: usize) -> QAct {
        debug_assert!(k.is_multiple_of(QK) && x.len() >= rows * k);
        let nb = k / QK;
        let mut a = QAct {
            nb,
            q: vec![0; rows * k],
            dl: vec![0.0; rows * nb * LANES],
            s: vec![0.0; rows * nb * LANES],
        };
        let blocks = x[..rows * k]
            .chunks_exact(QK)
            .zip(a.q.chunks_exact_mut(QK))
            .zip(a.dl.chunks_exact_mut(LANES).zip(a.s.chunks_exact_mut(LANES)));
        for ((x, q), (dl, s)) in blocks {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            for (q, &v) in q.iter_mut().zip(x) {
                *q = (v * id).round() as i8;
            }
            dl.fill(d);
            for (l, s) in s.iter_mut().enumerate() {
                let sum: i32 = q[4 * l..4 * l + 4].iter().map(|&v| i32::from(v)).sum();
                *s = d * sum as f32;
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13).collect();
        let a = QAct::new(&x, 2, 32);
        assert_eq!(a.nb, 1);
        for (b, x) in x.chunks(32).enumerate() {
            let d = a.dl[b * LANES];
            for (t, &v) in x.iter().enumerate() {
                let back = f32::from(a.q[b * 32 + t]) * d;
                assert!((back - v).abs() <= d / 2.0 + 1e-6, "{back} vs {v}");
            }
            let total: f32 = a.s[b * LANES..(b + 1) * LANES].iter().sum();
            let want: i32 = a.q[b * 32..(b + 1) * 32].iter().map(|&v| i32::from(v)).sum();
            assert!((total - d * want as f32).abs() < 1e-4);
        }
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let a = QAct::new(&[0.0; 32], 1, 32);
        assert!(a.q.iter().all(|&v| v == 0) && a.dl.iter().all(|&v| v == 0.0));
    }
}
