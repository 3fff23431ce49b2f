//! Dequantization of ggml blocks to f32 (src: ggml `dequantize_row_*` in ggml-quants.c).

use half::{bf16, f16};

use crate::error::{CheckpointError, Result};
use crate::gguf::ggml_type::GgmlType;
use crate::quant::{QType, dequantize_block};

/// Dequantizes `n` elements of type `ty` from `data`; `name` is only for error messages.
pub fn dequantize(name: &str, ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    dequantize_into(name, ty, data, &mut out)?;
    Ok(out)
}

/// Like [`dequantize`], into a caller-provided buffer whose length is the element count.
pub fn dequantize_into(name: &str, ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    let n = out.len();
    let Some((block, bytes)) = ty.block_layout().filter(|_| ty.can_dequantize()) else {
        return Err(CheckpointError::Gguf(format!(
            "tensor {name:?} has type {ty}, which cannot be dequantized; supported types are F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, MXFP4 (re-quantize the model with one of these)"
        )));
    };
    let (block, bytes) = (block as usize, bytes as usize);
    if !n.is_multiple_of(block) || data.len() != n / block * bytes {
        return Err(CheckpointError::Gguf(format!(
            "tensor {name:?} of type {ty}: {} bytes do not hold {n} elements",
            data.len()
        )));
    }
    let blocks = data.chunks_exact(bytes).zip(out.chunks_exact_mut(block));
    match ty {
        GgmlType::F32 => {
            blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, o)| o[0] = f16::from_le_bytes([b[0], b[1]]).to_f32()),
        GgmlType::BF16 => {
            blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        _ => {
            let qt = QType::from_ggml(ty).expect("can_dequantize covers the float and block types");
            blocks.for_each(|(b, o)| dequantize_block(qt, b, o))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q8_0_block() {
        // d = 0.5 (exact in f16); q_i = i - 16.
        let mut b = h(0.5).to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let x = dequantize("t", GgmlType::Q8_0, &b, 32).unwrap();
        assert_eq!(x[0], -8.0);
        assert_eq!(x[16], 0.0);
        assert_eq!(x[31], 7.5);
    }

    #[test]
    fn q4_0_block() {
        // d = 2; qs[j] = low j, high 15 - j.
        let mut b = h(2.0).to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let x = dequantize("t", GgmlType::Q4_0, &b, 32).unwrap();
        assert_eq!(x[0], -16.0); // (0 - 8) * 2
        assert_eq!(x[15], 14.0); // (15 - 8) * 2
        assert_eq!(x[16], 14.0); // high nibble of qs[0] = 15
        assert_eq!(x[31], -16.0); // high nibble of qs[15] = 0
    }

    #[test]
    fn q4_1_block() {
        // d = 0.25, m = -1; qs[j] = low j, high 3.
        let mut b = h(0.25).to_vec();
        b.extend(h(-1.0));
        b.extend((0..16u8).map(|j| j | (3 << 4)));
        let x = dequantize("t", GgmlType::Q4_1, &b, 32).unwrap();
        assert_eq!(x[0], -1.0);
        assert_eq!(x[4], 0.0); // 4 * 0.25 - 1
        assert_eq!(x[15], 2.75); // 15 * 0.25 - 1
        assert_eq!(x[16], -0.25); // 3 * 0.25 - 1
        assert_eq!(x[31], -0.25);
    }

    #[test]
    fn float_types() {
        let b: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            dequantize("t", GgmlType::F32, &b, 2).unwrap(),
            vec![1.5, -2.0]
        );
        let b: Vec<u8> = [h(0.1), h(-3.0)].concat();
        let x = dequantize("t", GgmlType::F16, &b, 2).unwrap();
        assert_eq!(x, vec![f16::from_f32(0.1).to_f32(), -3.0]);
        // bf16 0x3fc0 = 1.5
        let x = dequantize("t", GgmlType::BF16, &[0xc0, 0x3f], 1).unwrap();
        assert_eq!(x, vec![1.5]);
    }

    #[test]
    fn unsupported_type_names_tensor_and_type() {
        let e = dequantize("blk.0.attn_q.weight", GgmlType(13), &[0; 176], 256)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("blk.0.attn_q.weight") && e.contains("Q5_K"),
            "{e}"
        );
    }

    #[test]
    fn wrong_length_is_an_error() {
        assert!(dequantize("t", GgmlType::Q8_0, &[0; 33], 32).is_err());
    }
}
