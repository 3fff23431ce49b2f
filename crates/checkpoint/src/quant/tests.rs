use super::*;
use crate::testing::lcg;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Blocks of random bytes dequantized by gguf-py 0.19.0 (`gguf.quants.dequantize`), an
/// implementation independent of ours: values at a few positions, their sum and |sum|.
#[test]
fn k_quants_dequantize_as_gguf_py_does() {
    let cases: [(QType, &str, [f64; 15], f64, f64); 2] = [
        (
            QType::Q4_K,
            "4c22451fa94106a0956a26afbccdafe562f90a945f5693c642276ad5ab2da7394551370e99b2d74c3427fa48d732a1df70aca1e926115901dd06f27f8f063cd25e19a621f9bd0ccc21397c1ec795ca7748dc03d17a88934d85527357a2e64647f03e2fb81f223f4192c58efd5185f0711ef7677a1f132a818d882195a100b28d6b236b82481bd9fe630dc3ce3be4ebca",
            [
                0.8594017028808594,
                4.389095306396484,
                4.389095306396484,
                2.3721275329589844,
                7.414546966552734,
                -0.22437286376953125,
                -0.13828277587890625,
                -0.26976776123046875,
                0.4534492492675781,
                2.421222686767578,
                4.023838043212891,
                7.811801910400391,
                2.2978363037109375,
                2.3272323608398438,
                5.134010314941406,
            ],
            504.1355285644531,
            526.45703125,
        ),
        (
            QType::Q6_K,
            "b72f45b35223479f6e794d57037e2cfde9e15a7789781e3721a557d8e5a703296dcb81db3f65cf9c1bdc5d1d8fc83f0b0bb4db71be572209851d3d24f4c0cf83fe4363f82f4759778955f6ced681cbea7179ced2c8f814a13472ff70ce369d8385452a44f318337f08cd1e614f235d3f83bc45fee9ee0403a79be118544441317c9311f85e0429b19f7ec0e156f65a3322e791b880ee995e3f0d307d2fbaf400693a179e0d027ed4e58be7a9ebc28a271d43a78855638144eb6603f7b2725de11fe6ac2f88a68182869793f0aad6ded84d1c",
            [
                -3.254985809326172,
                4.036182403564453,
                3.7757835388183594,
                -0.9827957153320312,
                2.5115890502929688,
                -10.231155395507812,
                -5.724575042724609,
                -13.607940673828125,
                6.934169769287109,
                12.70074462890625,
                1.0247955322265625,
                5.2919769287109375,
                2.08319091796875,
                -2.88958740234375,
                -3.191986083984375,
            ],
            -46.20399856567383,
            1320.1004447937012,
        ),
    ];
    let at = [
        0, 1, 15, 16, 31, 32, 63, 64, 100, 127, 128, 150, 191, 200, 255,
    ];
    for (qt, bytes, want, sum, abs) in cases {
        let b = hex(bytes);
        assert_eq!(b.len(), qt.block_bytes());
        let mut v = [0f32; 256];
        dequantize_block(qt, &b, &mut v);
        for (&i, &w) in at.iter().zip(&want) {
            assert!(
                (f64::from(v[i]) - w).abs() < 1e-5,
                "{qt:?}[{i}] {} vs {w}",
                v[i]
            );
        }
        let s: f64 = v.iter().map(|&x| f64::from(x)).sum();
        let a: f64 = v.iter().map(|&x| f64::from(x).abs()).sum();
        assert!(
            (s - sum).abs() < 1e-3 && (a - abs).abs() < 1e-3,
            "{qt:?}: {s} {a}"
        );
    }
}

/// Our quantizers write what the dequantizers read, within each format's step.
#[test]
fn quantize_then_dequantize_stays_within_a_step() {
    let mut seed = 5;
    let (rows, cols) = (3, 512);
    let x: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed) * 2.0).collect();
    for qt in QType::ALL {
        let m = QMatrix::quantize(qt, rows, cols, &x).unwrap();
        assert_eq!(m.data.len(), rows * cols / qt.block() * qt.block_bytes());
        let back = m.dequantize();
        // Values lie in [-1, 1]; 4-bit formats step by about 2/15 (K-quants' 6-bit scales
        // add a little), 6-bit by 2/63, 8-bit by 2/255.
        let tol = match qt {
            QType::Q4_0 => 0.13, // the largest magnitude maps to -8: the other end may be a whole step off
            QType::Q4_1 => 0.075,
            QType::Q4_K => 0.1,
            QType::Q6_K => 0.03,
            QType::Q8_0 | QType::I8 => 0.005,
            // ggml's rule puts the largest magnitude in [4, 8) of the scale, whose largest
            // code is 6: a block's top values (here up to 1.0) may be clipped to 0.75.
            QType::MXFP4 => 0.25,
        };
        let worst = x
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= tol, "{qt:?}: worst error {worst} > {tol}");
    }
}

#[test]
fn scaling_a_matrix_scales_every_value_as_stored() {
    let mut seed = 11;
    let (rows, cols) = (3, 512);
    let x: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
    for qt in QType::ALL {
        let m = QMatrix::quantize(qt, rows, cols, &x).unwrap();
        let Some(scaled) = m.scaled(0.37) else {
            assert_eq!(qt, QType::MXFP4, "{qt:?} refused a scale");
            continue;
        };
        assert_eq!(scaled.data.len(), m.data.len());
        let (a, b) = (m.dequantize(), scaled.dequantize());
        // Within the f16 rounding of each block's scales (2^-11 relative, twice for a
        // minimum term), in units of the largest value.
        let worst = a
            .iter()
            .zip(&b)
            .map(|(a, b)| (a * 0.37 - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1.5e-3, "{qt:?}: off by {worst}");
        assert!(a.iter().zip(&b).any(|(a, b)| *a != *b), "{qt:?} unchanged");
    }
    // Out of f16's range: refused, not saturated.
    let big = QMatrix::quantize(QType::Q8_0, 1, 32, &[1000.0; 32]).unwrap();
    assert!(big.scaled(1e6).is_none());
}

#[test]
fn permuting_rows_moves_whole_rows() {
    let mut seed = 9;
    let x: Vec<f32> = (0..4 * 256).map(|_| lcg(&mut seed)).collect();
    let m = QMatrix::quantize(QType::Q4_K, 4, 256, &x).unwrap();
    let p = m.permute_rows(&[2, 0, 3, 1]);
    let (a, b) = (m.dequantize(), p.dequantize());
    for (dst, src) in [2, 0, 3, 1].iter().enumerate() {
        assert_eq!(
            &b[dst * 256..(dst + 1) * 256],
            &a[src * 256..(src + 1) * 256]
        );
    }
}

#[test]
fn sizes_are_checked() {
    assert!(QMatrix::new(QType::Q4_K, 1, 128, vec![0; 72], vec![]).is_err());
    assert!(QMatrix::new(QType::Q8_0, 2, 32, vec![0; 34], vec![]).is_err());
    assert!(QMatrix::new(QType::I8, 1, 32, vec![0; 32], vec![]).is_err());
    assert!(QMatrix::new(QType::I8, 1, 32, vec![0; 32], vec![1.0]).is_ok());
}
