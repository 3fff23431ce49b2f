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
        let scale = (f32::from(s) - 127.0).exp2();
        for (pair, &byte) in o.chunks_exact_mut(2).zip(b) {
            pair[0] = FP4[usize::from(byte & 0x0f)] * scale;
            pair[1] = FP4[usize::from(byte >> 4)] * scale;
        }
    }
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
}
