use super::*;
use crate::cpu::qlinear::QPath;

/// Whether this CPU runs the lane kernels.
fn available() -> bool {
    QPath::available().contains(&QPath::Lanes)
}
use crate::quant::{QMatrix, QType};
use crate::testing::lcg;

fn formats() -> impl Iterator<Item = QType> {
    QType::ALL.into_iter()
}

fn matrix(qt: QType, n: usize, k: usize, seed: &mut u64) -> QMatrix {
    let wf: Vec<f32> = (0..n * k).map(|_| lcg(seed)).collect();
    if qt == QType::I8 {
        let mut m = QMatrix::quantize(QType::Q8_0, n, k, &wf).unwrap();
        // Per-channel int8: the Q8_0 values without their block scales, a scale per row.
        let mut data = Vec::with_capacity(n * k);
        for blk in m.data.chunks_exact(34) {
            data.extend_from_slice(&blk[2..]);
        }
        m.qtype = QType::I8;
        m.data = data;
        m.row_scale = (0..n).map(|r| 0.01 + r as f32 * 1e-3).collect();
        return m;
    }
    QMatrix::quantize(qt, n, k, &wf).unwrap()
}

/// The kernel gives the reference's bits for every format, row count (tiles of 1 to 4 and 8 rows)
/// and a group of 16 weight rows cut short, in parts.
#[test]
fn kernel_equals_reference_bit_for_bit() {
    if !available() {
        eprintln!("no AVX512-VNNI: the lane kernels are not run here");
        return;
    }
    let mut seed = 7;
    for qt in formats() {
        let k = if qt.block() == 256 { 512 } else { 288 };
        let parts = [
            LMatrix::new(&matrix(qt, 37, k, &mut seed)),
            LMatrix::new(&matrix(qt, 16, k, &mut seed)),
        ];
        let n = 53;
        for m in [1usize, 2, 3, 4, 5, 8, 9, 15] {
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let mut out = vec![f32::NAN; m * n];
            qlinear_lanes(&x, m, &parts, &mut out);
            let a = LAct::new(&x, m, k);
            for i in 0..m {
                for c in 0..n {
                    let (p, r) = if c < 37 {
                        (&parts[0], c)
                    } else {
                        (&parts[1], c - 37)
                    };
                    let want = reference(&a, i, p, r);
                    assert_eq!(
                        out[i * n + c].to_bits(),
                        want.to_bits(),
                        "{qt:?} m={m} row {i} col {c}: {} vs {want}",
                        out[i * n + c]
                    );
                }
            }
        }
    }
}

/// The reference is the product of the file's weights with 12-bit activations: within half a
/// step (amax/4094) per input of the f64 product.
#[test]
fn reference_matches_dequantized_product() {
    let mut seed = 3;
    for qt in formats() {
        let (m, k, n) = (3, if qt.block() == 256 { 512 } else { 288 }, 21);
        let qm = matrix(qt, n, k, &mut seed);
        let w = LMatrix::new(&qm);
        let mut deq = vec![0f32; n * k];
        for r in 0..n {
            qm.dequantize_row(r, &mut deq[r * k..(r + 1) * k]);
            let mut mine = vec![0f32; k];
            w.dequantize_row(r, &mut mine);
            assert_eq!(mine, deq[r * k..(r + 1) * k], "{qt:?} row {r} dequantized");
        }
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 4.0).collect();
        let a = LAct::new(&x, m, k);
        for i in 0..m {
            for r in 0..n {
                let (xr, wr) = (&x[i * k..(i + 1) * k], &deq[r * k..(r + 1) * k]);
                let want: f64 = xr
                    .iter()
                    .zip(wr)
                    .map(|(&x, &w)| f64::from(x) * f64::from(w))
                    .sum();
                let bound: f64 = xr
                    .chunks(QK)
                    .zip(wr.chunks(QK))
                    .map(|(xb, wb)| {
                        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                        wb.iter().map(|v| f64::from(v.abs())).sum::<f64>() * f64::from(amax)
                            / 4094.0
                    })
                    .sum::<f64>()
                    + 1e-4;
                let got = f64::from(reference(&a, i, &w, r));
                assert!(
                    (got - want).abs() <= bound,
                    "{qt:?} {i},{r}: {got} vs {want} (bound {bound})"
                );
            }
        }
    }
}

/// A row's result is the same bits alone and in a batch of other rows.
#[test]
fn rows_are_batch_invariant() {
    if !available() {
        return;
    }
    let mut seed = 11;
    let (k, n) = (512, 40);
    for qt in formats() {
        let w = [LMatrix::new(&matrix(qt, n, k, &mut seed))];
        let m = 7;
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let mut all = vec![0f32; m * n];
        qlinear_lanes(&x, m, &w, &mut all);
        for i in 0..m {
            let mut one = vec![0f32; n];
            qlinear_lanes(&x[i * k..(i + 1) * k], 1, &w, &mut one);
            assert_eq!(one, all[i * n..(i + 1) * n], "{qt:?} row {i}");
        }
    }
}

/// The AVX-512 activation quantizer gives the scalar one's bits.
#[test]
fn activation_quantizers_agree() {
    let mut seed = 5;
    let mut x: Vec<f32> = (0..32 * 40).map(|_| lcg(&mut seed) * 10.0).collect();
    x[..32].fill(0.0);
    x[40] = 1e30;
    let a = LAct::new(&x, 1, x.len());
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        let mut q = [0i8; 64];
        let (d, sum, sum16) = act::scalar_block(xb, &mut q);
        assert_eq!(&a.q[b * 64..(b + 1) * 64], &q[..], "block {b}");
        assert_eq!(
            (a.d[b].to_bits(), a.sum[b], a.sum16[b]),
            (d.to_bits(), sum, sum16),
            "block {b}"
        );
    }
}
