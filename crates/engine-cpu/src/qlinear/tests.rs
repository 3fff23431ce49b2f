use lmi_checkpoint::testing::lcg;

use super::*;

/// f64 product of the dequantized weights with the exact inputs.
fn reference(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f64> {
    let mut o = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            o[i * n + j] = (0..k)
                .map(|t| f64::from(x[i * k + t]) * f64::from(w[j * k + t]))
                .sum();
        }
    }
    o
}

fn run(path: QPath, x: &[f32], m: usize, parts: &[QMatrix], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * n];
    let w = QWeight::for_path(parts.to_vec(), path);
    qlinear_with(path, x, m, &w, None, &mut out);
    out
}

/// Every path and format against dequantize-then-f64: the only error left is the int8
/// rounding of the inputs, at most half a step (amax/254) per input, so the error of an
/// output is bounded by Σ|w|·amax/254 over its blocks.
#[test]
fn every_format_and_path_matches_dequantized_weights() {
    let mut seed = 1;
    // k = 768 is 24 sub-blocks of 32 (even) and 3 K-quant blocks; 288 = 9 (odd), Q8/Q4 only.
    for &(m, k, n) in &[(5usize, 768usize, 19usize), (1, 768, 13), (9, 288, 11)] {
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 4.0).collect();
        let wf: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        for qt in QType::ALL {
            if !k.is_multiple_of(qt.block()) {
                continue;
            }
            let w = QMatrix::quantize(qt, n, k, &wf).unwrap();
            let deq = w.dequantize();
            let want = reference(&x, m, &deq, n, k);
            for path in QPath::available() {
                let got = run(path, &x, m, std::slice::from_ref(&w), n);
                for i in 0..m {
                    let amax: Vec<f32> = x[i * k..(i + 1) * k]
                        .chunks(32)
                        .map(|b| b.iter().fold(0f32, |a, v| a.max(v.abs())))
                        .collect();
                    for j in 0..n {
                        let bound: f64 = deq[j * k..(j + 1) * k]
                            .chunks(32)
                            .zip(&amax)
                            .map(|(w, &a)| {
                                w.iter().map(|v| f64::from(v.abs())).sum::<f64>() * f64::from(a)
                                    / 254.0
                            })
                            .sum::<f64>()
                            + 1e-4;
                        let (g, e) = (f64::from(got[i * n + j]), want[i * n + j]);
                        assert!(
                            (g - e).abs() <= bound,
                            "{qt:?} {path:?} m={m} k={k} [{i},{j}]: {g} vs {e} (bound {bound})"
                        );
                    }
                }
            }
        }
    }
}

/// A row's outputs are bit-identical alone and in any batch, for every path and format, and
/// VNNI and non-VNNI instructions of one width agree exactly where they run the same
/// arithmetic (the AVX-512 VNNI kernel reads signed formats offset by 128, the others by sign).
#[test]
fn rows_are_bit_identical_whatever_the_batch() {
    let mut seed = 2;
    let (m, k, n) = (13, 512, 37);
    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
    let wf: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
    let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
    for qt in QType::ALL {
        let parts = vec![QMatrix::quantize(qt, n, k, &wf).unwrap()];
        let mut by_path = Vec::new();
        for path in QPath::available() {
            let w = QWeight::for_path(parts.clone(), path);
            let mut full = vec![0.0; m * n];
            qlinear_with(path, &x, m, &w, Some(&bias), &mut full);
            for r in 0..m {
                let mut one = vec![0.0; n];
                qlinear_with(path, &x[r * k..(r + 1) * k], 1, &w, Some(&bias), &mut one);
                assert_eq!(
                    &full[r * n..(r + 1) * n],
                    &one[..],
                    "{qt:?} {path:?} row {r}"
                );
            }
            by_path.push((path, full));
        }
        let same = |a: QPath, b: QPath| {
            let get = |p| by_path.iter().find(|(q, _)| *q == p).map(|(_, v)| v);
            if let (Some(x), Some(y)) = (get(a), get(b)) {
                assert_eq!(x, y, "{qt:?}: {a:?} and {b:?} differ");
            }
        };
        // Signed formats: the VNNI kernel offsets them by 128 (a min term), the other does not.
        if !matches!(qt, QType::Q8_0 | QType::I8 | QType::MXFP4) {
            same(QPath::Avx512Vnni, QPath::Avx512);
        }
        same(QPath::AvxVnni, QPath::Avx2);
        // The AVX2 lane kernel gives the AVX-512 one's bits.
        same(QPath::Lanes, QPath::LanesAvx2);
    }
}

/// A fused matrix of mixed formats (Q4_K_M's QKV) equals its parts side by side, on every
/// path.
#[test]
fn mixed_parts_concatenate_columns() {
    let mut seed = 3;
    let (m, k) = (3, 256);
    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
    for last in [QType::Q8_0, QType::Q4_1] {
        let parts: Vec<QMatrix> = [(QType::Q4_K, 8), (QType::Q6_K, 5), (last, 3)]
            .iter()
            .map(|&(qt, rows)| {
                let w: Vec<f32> = (0..rows * k).map(|_| lcg(&mut seed)).collect();
                QMatrix::quantize(qt, rows, k, &w).unwrap()
            })
            .collect();
        for path in QPath::available() {
            let fused = run(path, &x, m, &parts, 16);
            let mut col = 0;
            for p in &parts {
                let alone = run(path, &x, m, std::slice::from_ref(p), p.rows);
                for i in 0..m {
                    assert_eq!(
                        &fused[i * 16 + col..i * 16 + col + p.rows],
                        &alone[i * p.rows..(i + 1) * p.rows],
                        "{path:?} {:?} row {i}",
                        p.qtype
                    );
                }
                col += p.rows;
            }
        }
    }
}

/// The AVX-512 layout dequantizes to the same values as the file's blocks.
#[test]
fn packed_rows_dequantize_like_the_file() {
    let mut seed = 4;
    for &(k, n) in &[(288usize, 3usize), (512, 5)] {
        let wf: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        for qt in QType::ALL {
            if !k.is_multiple_of(qt.block()) {
                continue;
            }
            let m = QMatrix::quantize(qt, n, k, &wf).unwrap();
            let p = crate::qpack::Packed::new(&m);
            for r in 0..n {
                let (mut a, mut b) = (vec![0.0; k], vec![0.0; k]);
                m.dequantize_row(r, &mut a);
                p.dequantize_row(r, &mut b);
                assert_eq!(a, b, "{qt:?} row {r}");
            }
        }
    }
}
