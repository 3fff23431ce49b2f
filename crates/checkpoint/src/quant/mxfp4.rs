//! MXFP4 (the OCP microscaling format gpt-oss's experts are published in): blocks of 32 FP4
//! (E2M1) values sharing a power-of-two scale. transformers' layout: per block 16 bytes, two
//! values a byte (low nibble first), and one byte of exponent biased by 127.

/// The 16 E2M1 values by code.
const FP4: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Values per block.
pub const MXFP4_BLOCK: usize = 32;

/// `blocks` (16 bytes per block) and `scales` (a byte per block) into `out` (32 per block).
/// Exact: every value is an FP4 value times a power of two, which f32 holds.
pub fn dequantize_mxfp4(blocks: &[u8], scales: &[u8], out: &mut [f32]) {
    debug_assert_eq!(blocks.len(), scales.len() * 16);
    for ((b, &s), o) in blocks
        .chunks_exact(16)
        .zip(scales)
        .zip(out.chunks_exact_mut(MXFP4_BLOCK))
    {
        let scale = e8m0(s);
        for (pair, &byte) in o.chunks_exact_mut(2).zip(b) {
            pair[0] = FP4[usize::from(byte & 0x0f)] * scale;
            pair[1] = FP4[usize::from(byte >> 4)] * scale;
        }
    }
}

/// One ggml MXFP4 block (`block_mxfp4`, 17 bytes: the exponent byte, then 16 bytes whose low
/// nibbles are values 0..16 and high nibbles values 16..32; llama.cpp's converter moves
/// transformers' nibbles there, the codes are the same) into 32 values.
pub(crate) fn dequantize_ggml_block(block: &[u8], out: &mut [f32]) {
    let scale = e8m0(block[0]);
    for (j, &byte) in block[1..17].iter().enumerate() {
        out[j] = FP4[usize::from(byte & 0x0f)] * scale;
        out[j + 16] = FP4[usize::from(byte >> 4)] * scale;
    }
}

/// 2^(e − 127), the E8M0 scale (e = 255, NaN in the format, reads as 2^128 = inf).
pub(crate) fn e8m0(e: u8) -> f32 {
    (f32::from(e) - 127.0).exp2()
}

/// Half the E8M0 scale, 2^(e − 128), as the int8 kernels apply it (to the doubled values):
/// exponents 0 and 1 (values under 1e-37) read as 0, which every kernel path shares.
#[inline]
pub fn half_e8m0(e: u8) -> f32 {
    f32::from_bits(u32::from(e.max(1) - 1) << 23)
}

/// Twice each code's value: integers of magnitude at most 12, what the int8 kernels multiply
/// (against half the block's scale).
pub const FP4_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// One ggml MXFP4 block of 32 values, as ggml's reference quantizer writes it
/// (`quantize_row_mxfp4_ref`): the power of two that puts the largest magnitude in [4, 8)
/// (values past 6 take the largest code), each value the nearest code, ties to the smaller
/// magnitude.
pub(crate) fn quantize_ggml_block(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let e = if amax > 0.0 && amax.is_finite() {
        (amax.log2().floor() as i32 - 2 + 127).clamp(0, 254)
    } else {
        0
    };
    let scale = e8m0(e as u8);
    let code = |v: f32| -> u8 {
        let m = (v / scale).abs();
        let (mut best, mut dist) = (0u8, m);
        for (c, &f) in FP4.iter().enumerate().take(8).skip(1) {
            if (m - f).abs() < dist {
                (best, dist) = (c as u8, (m - f).abs());
            }
        }
        if v < 0.0 && best != 0 { best | 8 } else { best }
    };
    out.push(e as u8);
    out.extend((0..16).map(|j| code(x[j]) | (code(x[j + 16]) << 4)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_low_first_times_the_block_scale() {
        let mut blocks = [0u8; 16];
        blocks[0] = 0x72; // 1.0 then 6.0
        blocks[15] = 0x9f; // -6.0 then -0.5
        let mut out = [0f32; 32];
        dequantize_mxfp4(&blocks, &[125], &mut out);
        assert_eq!(&out[..2], &[0.25, 1.5]);
        assert_eq!(&out[30..], &[-1.5, -0.125]);
        assert!(out[2..30].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn ggml_blocks_decode_and_quantize() {
        let mut block = [0u8; 17];
        block[0] = 126; // 2^-1
        block[1] = 0x9f; // value 0: -6.0, value 16: -0.5
        block[16] = 0x07; // value 15: 6.0, value 31: 0
        let mut x = [0f32; 32];
        dequantize_ggml_block(&block, &mut x);
        assert_eq!((x[0], x[16], x[15], x[31]), (-3.0, -0.25, 3.0, 0.0));
        // Values on the grid come back as they were.
        let mut again = Vec::new();
        quantize_ggml_block(&x, &mut again);
        assert_eq!(again, block);
        for (c, &f) in FP4.iter().enumerate() {
            assert_eq!(f32::from(FP4_X2[c]), 2.0 * f);
        }
    }

    /// Bytes of gguf-py 0.19's `quantize(x, MXFP4)` (ggml's reference quantizer) for
    /// x[i] = sin(0.37 i) · (1 + i % 5) / 10, x[5] = 0, x[40] = 3.5 / 8 (a tie).
    #[test]
    fn quantizes_as_ggml_does() {
        let mut x: Vec<f32> = (0..64)
            .map(|i| ((i as f64 * 0.37).sin() * (1 + i % 5) as f64 * 0.1) as f32)
            .collect();
        x[5] = 0.0;
        x[40] = 3.5 / 8.0;
        let mut got = Vec::new();
        for b in x.chunks_exact(32) {
            quantize_ggml_block(b, &mut got);
        }
        let want: [u8; 34] = [
            123, 160, 2, 69, 119, 55, 80, 101, 117, 98, 27, 154, 221, 254, 255, 191, 218, 123, 253,
            252, 144, 1, 68, 102, 119, 55, 87, 99, 82, 59, 158, 203, 237, 254,
        ];
        assert_eq!(got, want);
    }
}
