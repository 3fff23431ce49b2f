use lmi_checkpoint::quant::{QMatrix, QType};
use lmi_checkpoint::testing::lcg;

use super::*;
use crate::qlinear::QPath;

/// The lane kernels this CPU runs.
fn isas() -> Vec<Isa> {
    let paths = QPath::available();
    let mut v = Vec::new();
    if paths.contains(&QPath::Lanes) && crate::amx::int8_available() {
        v.push(Isa::Amx);
    } else {
        eprintln!("no AMX-INT8 here: the tile kernel is not run");
    }
    if paths.contains(&QPath::Lanes) {
        v.push(Isa::Avx512Vnni);
    }
    if paths.contains(&QPath::LanesAvx2) {
        v.push(Isa::Avx2);
    }
    if v.is_empty() {
        eprintln!("no AVX2: the lane kernels are not run here");
    }
    v
}

/// Both activation precisions.
const BITS: [Bits; 2] = [Bits::Twelve, Bits::Eight];

/// The formats a kernel takes (every one).
fn formats(_: Isa) -> impl Iterator<Item = QType> {
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

/// Each kernel gives the reference's bits for every format it takes, row count (tiles of 1
/// to 4 and 8 rows; AVX2's octets of 8 and 16 rows turned around, with the rest in small
/// tiles) and a group of 16 weight rows cut short (to more and to fewer than 8 rows: AVX2's
/// halves), in parts; with 12-bit and 8-bit activations.
#[test]
fn kernel_equals_reference_bit_for_bit() {
    for isa in isas() {
        for bits in BITS {
            kernel_equals_reference(isa, bits);
        }
    }
}

fn kernel_equals_reference(isa: Isa, bits: Bits) {
    let mut seed = 7;
    for qt in formats(isa) {
        let k = if qt.block() == 256 { 512 } else { 288 };
        let parts = [
            LMatrix::new(&matrix(qt, 37, k, &mut seed)),
            LMatrix::new(&matrix(qt, 16, k, &mut seed)),
            LMatrix::new(&matrix(qt, 11, k, &mut seed)),
        ];
        let n = 64;
        // AMX: every row count a step of decode streams can have (tiles of 16, the rest in
        // one tile), and past one pass of 64 rows.
        let counts: Vec<usize> = if isa == Isa::Amx {
            (1..=64).chain([65, 80, 97]).collect()
        } else {
            vec![1, 2, 3, 4, 5, 8, 9, 15, 16, 23, 24, 40]
        };
        for m in counts {
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let mut out = vec![f32::NAN; m * n];
            qlinear_lanes(isa, bits, &x, m, &parts, &mut out);
            let a = LAct::new(&x, m, k, bits);
            for i in 0..m {
                for c in 0..n {
                    let (p, r) = match c {
                        0..37 => (&parts[0], c),
                        37..53 => (&parts[1], c - 37),
                        _ => (&parts[2], c - 53),
                    };
                    let want = reference(&a, i, p, r);
                    assert_eq!(
                        out[i * n + c].to_bits(),
                        want.to_bits(),
                        "{isa:?} {bits:?} {qt:?} m={m} row {i} col {c}: {} vs {want}",
                        out[i * n + c]
                    );
                }
            }
        }
    }
}

/// The reference is the product of the file's weights with 12-bit activations: within half a
/// step (amax/4094) per input of the f64 product; with 8-bit ones, within amax/254.
#[test]
fn reference_matches_dequantized_product() {
    for bits in BITS {
        reference_matches_dequantized(bits);
    }
}

fn reference_matches_dequantized(bits: Bits) {
    let half_steps = match bits {
        Bits::Twelve => 4094.0,
        Bits::Eight => 254.0,
    };
    let mut seed = 3;
    for qt in formats(Isa::Avx512Vnni) {
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
        let a = LAct::new(&x, m, k, bits);
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
                            / half_steps
                    })
                    .sum::<f64>()
                    + 1e-4;
                let got = f64::from(reference(&a, i, &w, r));
                assert!(
                    (got - want).abs() <= bound,
                    "{bits:?} {qt:?} {i},{r}: {got} vs {want} (bound {bound})"
                );
            }
        }
    }
}

/// A row's result is the same bits alone and in a batch of other rows.
#[test]
fn rows_are_batch_invariant() {
    for isa in isas() {
        let mut seed = 11;
        let (k, n) = (512, 40);
        for qt in formats(isa) {
            let w = [LMatrix::new(&matrix(qt, n, k, &mut seed))];
            // Tiles of 8, 8, 4 and 3 rows on AVX-512; on AVX2 two octets turned around,
            // then tiles of 4 and 3.
            let m = 23;
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
            for bits in BITS {
                let mut all = vec![0f32; m * n];
                qlinear_lanes(isa, bits, &x, m, &w, &mut all);
                for i in 0..m {
                    let mut one = vec![0f32; n];
                    qlinear_lanes(isa, bits, &x[i * k..(i + 1) * k], 1, &w, &mut one);
                    let at = "{isa:?} {bits:?} {qt:?} row {i}";
                    assert_eq!(one, all[i * n..(i + 1) * n], "{at}");
                }
            }
        }
    }
}

/// The codes that bound AVX2's int16 sums and the AMX tiles' `16·code` bytes: every code at
/// its largest against activations whose `hi` is at its most negative (−128) and most
/// positive (127). An overflow would show as a result other than the reference's.
#[test]
fn extreme_codes_do_not_overflow() {
    for isa in isas() {
        if matches!(isa, Isa::Avx2 | Isa::Amx) {
            extreme_codes(isa);
        }
    }
}

fn extreme_codes(isa: Isa) {
    let (k, n) = (512, 24);
    let mut seed = 13;
    for qt in formats(isa) {
        let mut qm = matrix(qt, n, k, &mut seed);
        // The code bytes of each block at their largest (MXFP4: +6, nibble 7).
        let (bb, codes, byte) = match qt {
            QType::Q4_0 => (18, 2..18, 0xff),
            QType::Q4_1 => (20, 4..20, 0xff),
            QType::MXFP4 => (17, 1..17, 0x77),
            QType::Q4_K => (144, 16..144, 0xff),
            QType::Q6_K => (210, 0..192, 0xff),
            QType::Q8_0 => (34, 2..34, 0x7f),
            QType::I8 => (32, 0..32, 0x7f),
        };
        for blk in qm.data.chunks_exact_mut(bb) {
            blk[codes.clone()].fill(byte);
        }
        let w = [LMatrix::new(&qm)];
        // One row (row-broadcast tiles) and 16 (turned-around octets, `avx2_rows.rs`).
        let cases = [(1.0f32, 1), (-1.0, 1), (1.0, 16), (-1.0, 16)];
        for ((sign, m), bits) in cases.into_iter().flat_map(|c| BITS.map(|b| (c, b))) {
            let x = vec![sign; m * k];
            let a = LAct::new(&x, m, k, bits);
            let hi = match bits {
                Bits::Twelve if sign < 0.0 => -128,
                Bits::Eight if sign < 0.0 => -127,
                _ => 127,
            };
            assert_eq!(a.q[0], hi);
            let mut out = vec![f32::NAN; m * n];
            qlinear_lanes(isa, bits, &x, m, &w, &mut out);
            for (c, &o) in out.iter().enumerate() {
                let want = reference(&a, c / n, &w[0], c % n);
                assert_eq!(
                    o.to_bits(),
                    want.to_bits(),
                    "{isa:?} {bits:?} {qt:?} x = {sign} row {} column {}: {o} vs {want}",
                    c / n,
                    c % n
                );
            }
        }
    }
}

/// The SIMD activation quantizer (AVX-512 or AVX2, whichever runs) gives the scalar one's
/// bits, at 12 and at 8 bits.
#[test]
fn activation_quantizers_agree() {
    for bits in BITS {
        activation_quantizers_agree_at(bits);
    }
}

fn activation_quantizers_agree_at(bits: Bits) {
    let mut seed = 5;
    let mut x: Vec<f32> = (0..32 * 40).map(|_| lcg(&mut seed) * 10.0).collect();
    x[..32].fill(0.0);
    x[40] = 1e30;
    let a = LAct::new(&x, 1, x.len(), bits);
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        let mut q = [0i8; 64];
        let (d, sum, sum16) = act::scalar_block(xb, &mut q, bits);
        assert_eq!(&a.q[b * 64..(b + 1) * 64], &q[..], "{bits:?} block {b}");
        assert_eq!(
            (a.d[b].to_bits(), a.sum[b], a.sum16[b]),
            (d.to_bits(), sum, sum16),
            "block {b}"
        );
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut q2 = [0i8; 64];
            // SAFETY: AVX2 was detected; 32 values in, 64 bytes out.
            let got = unsafe { act::x86::block_avx2(xb, &mut q2, bits) };
            assert_eq!(q2, q, "AVX2 {bits:?} block {b}");
            assert_eq!(
                (got.0.to_bits(), got.1, got.2),
                (d.to_bits(), sum, sum16),
                "AVX2 block {b}"
            );
        }
    }
}

/// 8-bit activations are 16 times an integer in [-127, 127] (all `lo` bytes zero, `hi` the
/// integer) with the block's largest magnitude at ±127, and they are within half a step
/// (amax/254) of the input.
#[test]
fn eight_bit_activations_are_whole_bytes() {
    let mut seed = 17;
    let (m, k) = (3, 256);
    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 5.0).collect();
    let a = LAct::new(&x, m, k, Bits::Eight);
    assert!(!a.lo);
    for (blk, (xb, q)) in x.chunks_exact(QK).zip(a.q.chunks_exact(2 * QK)).enumerate() {
        assert!(q[QK..].iter().all(|&l| l == 0), "block {blk}: lo bytes");
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(q[..QK].iter().map(|h| h.unsigned_abs()).max(), Some(127));
        let d = a.d[blk];
        let mut sum = 0;
        for (v, &h) in xb.iter().zip(&q[..QK]) {
            let got = d * 16.0 * f32::from(h);
            assert!((got - v).abs() <= amax / 254.0 * 1.0001, "{got} vs {v}");
            sum += 16 * i32::from(h);
        }
        assert_eq!(a.sum[blk], sum, "block {blk}: sum");
    }
}

/// Activations quantized on the pool's threads (many rows, a tile of rows a task) are each
/// row's alone, in both layouts: bytes, scales, sums and the tiles' copies of them; a tiled
/// layout's padding rows stay zero.
#[test]
fn activations_in_parallel_equal_row_by_row() {
    let mut seed = 19;
    let (m, k) = (83, 512);
    let nb = k / QK;
    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 4.0).collect();
    for bits in BITS {
        for a in [LAct::new(&x, m, k, bits), LAct::tiled(&x, m, k, bits)] {
            let at = format!("{bits:?} tiled={}", a.tiled);
            for r in 0..m {
                let one = LAct::new(&x[r * k..(r + 1) * k], 1, k, bits);
                for b in 0..nb {
                    // SAFETY: both blocks exist and hold 64 bytes.
                    let (got, want) = unsafe {
                        (
                            std::slice::from_raw_parts(a.block(r, b), 2 * QK),
                            std::slice::from_raw_parts(one.block(0, b), 2 * QK),
                        )
                    };
                    assert_eq!(got, want, "{at} row {r} block {b}");
                    let i = r * nb + b;
                    let scales = (a.d[i].to_bits(), a.sum[i], a.sum16[i], a.ms[i].to_bits());
                    let want = (
                        one.d[b].to_bits(),
                        one.sum[b],
                        one.sum16[b],
                        one.ms[b].to_bits(),
                    );
                    assert_eq!(scales, want, "{at} row {r} block {b}");
                    if a.tiled {
                        let t = &a.tsc[r / act::TILE_ROWS * nb + b];
                        let j = r % act::TILE_ROWS;
                        let tile = (t.d[j].to_bits(), t.sum[j], t.sum16[j], t.ms[j].to_bits());
                        assert_eq!(tile, scales, "{at} row {r} block {b}: tile scales");
                    }
                }
            }
            if a.tiled {
                let pad = m..m.next_multiple_of(act::TILE_ROWS);
                for r in pad {
                    for b in 0..nb {
                        // SAFETY: padding rows of the last tile exist in the tiled layout.
                        let q = unsafe { std::slice::from_raw_parts(a.block(r, b), 2 * QK) };
                        assert!(q.iter().all(|&v| v == 0), "{at} padding row {r}");
                        let t = &a.tsc[r / act::TILE_ROWS * nb + b];
                        assert_eq!(t.d[r % act::TILE_ROWS], 0.0, "{at} padding row {r}");
                    }
                }
            }
        }
    }
}
