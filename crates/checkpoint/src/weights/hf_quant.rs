//! Quantized HF checkpoints, dequantized at load into the load's dtype: FP8 with per-block
//! `weight_scale_inv` (transformers' FineGrainedFP8), compressed-tensors' int8, FP8 and
//! packed intN weights with `weight_scale` per tensor, channel, group or block, AutoAWQ's
//! 4-bit GEMM layout, and GPTQ (v1 and v2 zero points, act-order's `g_idx`). The layouts
//! and formulas are the quantizers' own (checked on tests/fixtures/quantized/, generated and
//! dequantized by them).

use safetensors::Dtype as StDtype;

use super::host::{bf16_bytes_to_bits, f16_bytes_to_f32, f32_bytes_to_f32};
use crate::config::quantization::HfQuant;
use crate::error::{CheckpointError, Result};

/// A tensor as stored: its type, shape and bytes.
pub(crate) struct Raw<'a> {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub bytes: &'a [u8],
}

/// The tensors of a quantized weight, by name (`X.weight` → `X.weight_scale_inv`, …).
pub(crate) trait RawSource {
    fn has(&self, name: &str) -> bool;
    fn with_raw<T>(&self, name: &str, f: &mut dyn FnMut(Raw<'_>) -> Result<T>) -> Result<T>;
}

impl HfQuant {
    /// The name a weight's values are stored under (`weight_packed` when packed).
    pub(crate) fn stored_name(&self, name: &str) -> Option<String> {
        let stem = name.strip_suffix("weight")?;
        match self {
            HfQuant::Compressed(c) if c.packed => Some(format!("{stem}weight_packed")),
            HfQuant::AwqGemm { .. } | HfQuant::Gptq { .. } => Some(format!("{stem}qweight")),
            _ => Some(name.to_string()),
        }
    }

    fn scale_name(&self, name: &str) -> Option<String> {
        let stem = name.strip_suffix("weight")?;
        Some(match self {
            HfQuant::Fp8Block { .. } => format!("{stem}weight_scale_inv"),
            HfQuant::Compressed(_) => format!("{stem}weight_scale"),
            HfQuant::AwqGemm { .. } | HfQuant::Gptq { .. } => format!("{stem}scales"),
        })
    }

    /// `name`'s values dequantized to f32 when it is a quantized weight of this checkpoint
    /// (it has a scale beside it); None for any other tensor (norms, embeddings, ignored layers).
    pub(crate) fn dequantize(
        &self,
        src: &impl RawSource,
        name: &str,
        expected: &[usize],
    ) -> Result<Option<Vec<f32>>> {
        let (Some(stored), Some(scale_name)) = (self.stored_name(name), self.scale_name(name))
        else {
            return Ok(None);
        };
        if !src.has(&scale_name) || !src.has(&stored) {
            return Ok(None);
        }
        let bad = |msg: String| CheckpointError::UnsupportedDtype {
            name: name.to_string(),
            dtype: msg,
        };
        let [rows, cols] = match expected {
            [r, c] => [*r, *c],
            _ => {
                return Err(bad(format!(
                    "a quantized weight of shape {expected:?}, expected a matrix"
                )));
            }
        };
        // `[rows, cols]` of weight each scale covers (0: the whole dimension).
        let [gr, gc] = match self {
            HfQuant::AwqGemm { group } => {
                return awq_gemm(src, name, &stored, &scale_name, rows, cols, *group).map(Some);
            }
            HfQuant::Gptq { bits, v1 } => {
                return gptq(src, &stored, &scale_name, rows, cols, *bits, *v1).map(Some);
            }
            HfQuant::Fp8Block { block } => *block,
            HfQuant::Compressed(c) => c.grid,
        };
        let mut values = src.with_raw(&stored, &mut |raw| match (self, raw.dtype) {
            (HfQuant::Compressed(c), StDtype::I32) if c.packed => {
                unpack_rows(raw.bytes, rows, cols, c.num_bits).ok_or_else(|| {
                    bad(format!("weight_packed of shape {:?} does not hold {rows}x{cols} {}-bit values", raw.shape, c.num_bits))
                })
            }
            (_, StDtype::F8_E4M3) | (_, StDtype::I8) if raw.shape == expected => Ok(match raw.dtype {
                StDtype::I8 => raw.bytes.iter().map(|&b| b as i8 as f32).collect(),
                _ => raw.bytes.iter().map(|&b| fp8_e4m3(b)).collect(),
            }),
            (_, dtype) => Err(bad(format!("{dtype:?} of shape {:?} beside a scale (expected quantized values of shape {expected:?})", raw.shape))),
        })?;
        let (scales, scale_shape) = src.with_raw(&scale_name, &mut |raw| {
            Ok((floats(&scale_name, &raw)?, raw.shape.clone()))
        })?;
        let (gr, gc) = (
            if gr == 0 { rows } else { gr },
            if gc == 0 { cols } else { gc },
        );
        let (sr, sc) = (rows.div_ceil(gr), cols.div_ceil(gc));
        if scales.len() != sr * sc {
            return Err(bad(format!(
                "{scale_name} has shape {scale_shape:?}; {rows}x{cols} in cells of {gr}x{gc} needs {sr}x{sc} scales"
            )));
        }
        for (r, row) in values.chunks_exact_mut(cols).enumerate() {
            let srow = &scales[(r / gr) * sc..(r / gr + 1) * sc];
            for (c, v) in row.iter_mut().enumerate() {
                *v *= srow[c / gc];
            }
        }
        Ok(Some(values))
    }
}

/// Which nibble of an AWQ word holds column k of its eight (the packer's order 0,2,4,6,1,3,5,7,
/// inverted).
const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// A float tensor's values (F32, F16 or BF16) as f32.
fn floats(name: &str, raw: &Raw<'_>) -> Result<Vec<f32>> {
    Ok(match raw.dtype {
        StDtype::F32 => f32_bytes_to_f32(raw.bytes),
        StDtype::F16 => f16_bytes_to_f32(raw.bytes),
        StDtype::BF16 => bf16_bytes_to_bits(raw.bytes)
            .into_iter()
            .map(|b| half::bf16::from_bits(b).to_f32())
            .collect(),
        d => {
            return Err(CheckpointError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{d:?}"),
            });
        }
    })
}

/// Tensor `name`'s values, read by `values` once its shape is checked.
fn read<T>(
    src: &impl RawSource,
    name: &str,
    shape: &[usize],
    values: impl Fn(&Raw<'_>) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    src.with_raw(name, &mut |raw| {
        if raw.shape != shape {
            return Err(CheckpointError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                got: raw.shape.clone(),
            });
        }
        values(&raw)
    })
}

/// An I32 tensor's words (packed values, group indices).
fn words(name: &str, raw: &Raw<'_>) -> Result<Vec<u32>> {
    if raw.dtype != StDtype::I32 {
        return Err(CheckpointError::UnsupportedDtype {
            name: name.to_string(),
            dtype: format!("{:?} (expected I32)", raw.dtype),
        });
    }
    Ok(raw
        .bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

fn read_i32(src: &impl RawSource, name: &str, shape: &[usize]) -> Result<Vec<u32>> {
    read(src, name, shape, |raw| words(name, raw))
}

fn read_floats(src: &impl RawSource, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    read(src, name, shape, |raw| floats(name, raw))
}

/// AutoAWQ's GEMM layout, transposed into the `[out, in]` weight: w[o][i] = (q[i][o] −
/// z[i/g][o]) · s[i/g][o] (autoawq's `dequantize_gemm`).
fn awq_gemm(
    src: &impl RawSource,
    name: &str,
    qweight: &str,
    scales: &str,
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<Vec<f32>> {
    let (out, inp) = (rows, cols);
    if out % 8 != 0 || inp % group != 0 {
        return Err(CheckpointError::UnsupportedDtype {
            name: name.to_string(),
            dtype: format!(
                "AWQ of shape [{out}, {inp}]: the outputs must be a multiple of 8 and the inputs of the group size {group}"
            ),
        });
    }
    let groups = inp / group;
    let q = read_i32(src, qweight, &[inp, out / 8])?;
    let zname = format!(
        "{}qzeros",
        qweight.strip_suffix("qweight").unwrap_or(qweight)
    );
    let z = read_i32(src, &zname, &[groups, out / 8])?;
    let s = read_floats(src, scales, &[groups, out])?;
    let nibble = |words: &[u32], row: usize, col: usize| -> f32 {
        let w = words[row * (out / 8) + col / 8];
        ((w >> (4 * AWQ_NIBBLE[col % 8])) & 0xf) as f32
    };
    let mut w = vec![0f32; out * inp];
    for i in 0..inp {
        let g = i / group;
        for o in 0..out {
            w[o * inp + i] = (nibble(&q, i, o) - nibble(&z, g, o)) * s[g * out + o];
        }
    }
    Ok(w)
}

/// GPTQ, transposed into the `[out, in]` weight: w[o][i] = (q[i][o] − z[g][o]) · s[g][o] with
/// g = g_idx[i] (i / group without g_idx), values packed `32 / bits` to a word, the first in
/// the lowest bits, and v1's zero points stored minus one (gptqmodel's `dequantize_weight`
/// after its v1 → v2 conversion).
fn gptq(
    src: &impl RawSource,
    qweight: &str,
    scales: &str,
    rows: usize,
    cols: usize,
    bits: u32,
    v1: bool,
) -> Result<Vec<f32>> {
    let (out, inp) = (rows, cols);
    let per_word = (32 / bits) as usize;
    let stem = qweight.strip_suffix("qweight").unwrap_or(qweight);
    let bad = |msg: String| CheckpointError::UnsupportedDtype {
        name: qweight.to_string(),
        dtype: msg,
    };
    if inp % per_word != 0 || out % per_word != 0 {
        return Err(bad(format!(
            "GPTQ of shape [{out}, {inp}] with {bits}-bit words"
        )));
    }
    let q = read_i32(src, qweight, &[inp / per_word, out])?;
    let groups = src.with_raw(scales, &mut |raw| {
        Ok(raw.shape.first().copied().unwrap_or(0))
    })?;
    let s = read_floats(src, scales, &[groups, out])?;
    let z = read_i32(src, &format!("{stem}qzeros"), &[groups, out / per_word])?;
    let g_name = format!("{stem}g_idx");
    let g_idx: Vec<usize> = if src.has(&g_name) {
        read_i32(src, &g_name, &[inp])?
            .into_iter()
            .map(|g| g as usize)
            .collect()
    } else {
        let group = inp.div_ceil(groups.max(1));
        (0..inp).map(|i| i / group).collect()
    };
    if let Some(&g) = g_idx.iter().find(|&&g| g >= groups) {
        return Err(bad(format!("g_idx names group {g} of {groups}")));
    }
    let mask = (1u32 << bits) - 1;
    let field = |word: u32, k: usize| ((word >> (bits as usize * k)) & mask) as f32;
    let plus = if v1 { 1.0 } else { 0.0 };
    let mut w = vec![0f32; out * inp];
    for i in 0..inp {
        let g = g_idx[i];
        for o in 0..out {
            let qv = field(q[(i / per_word) * out + o], i % per_word);
            let zv = field(z[g * (out / per_word) + o / per_word], o % per_word) + plus;
            w[o * inp + i] = (qv - zv) * s[g * out + o];
        }
    }
    Ok(w)
}

/// compressed-tensors' dense packing: a row's value i at bit i·bits of its little-endian int32
/// words, stored plus 2^(bits-1).
fn unpack_rows(bytes: &[u8], rows: usize, cols: usize, bits: u32) -> Option<Vec<f32>> {
    let words_per_row = (cols * bits as usize).div_ceil(32);
    if bytes.len() != rows * words_per_row * 4 {
        return None;
    }
    let offset = 1i32 << (bits - 1);
    let mask = (1u64 << bits) - 1;
    let mut out = Vec::with_capacity(rows * cols);
    for row in bytes.chunks_exact(words_per_row * 4) {
        let word = |i: usize| -> u64 {
            row.get(i * 4..i * 4 + 4).map_or(0, |b| {
                u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            })
        };
        for i in 0..cols {
            let bit = i * bits as usize;
            let (w, shift) = (bit / 32, bit % 32);
            let two = word(w) | (word(w + 1) << 32);
            let v = ((two >> shift) & mask) as i32 - offset;
            out.push(v as f32);
        }
    }
    Some(out)
}

/// FP8 E4M3 (the `fn` variant: no infinities, 0x7f/0xff NaN) to f32.
pub fn fp8_e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let man = f32::from(b & 0x07);
    if exp == 0x0f && man == 7.0 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors held in memory, for the dequantization alone.
    struct Mem(Vec<(String, StDtype, Vec<usize>, Vec<u8>)>);

    impl RawSource for Mem {
        fn has(&self, name: &str) -> bool {
            self.0.iter().any(|t| t.0 == name)
        }
        fn with_raw<T>(&self, name: &str, f: &mut dyn FnMut(Raw<'_>) -> Result<T>) -> Result<T> {
            let t = self.0.iter().find(|t| t.0 == name).expect("tensor");
            f(Raw {
                dtype: t.1,
                shape: t.2.clone(),
                bytes: &t.3,
            })
        }
    }

    #[test]
    fn fp8_blocks_at_uneven_edges() {
        // A 3x5 weight in blocks of 2x4 (as DeepSeek's 576-row matrices in blocks of 128): a
        // 2x2 grid whose last row and column of blocks are partial.
        let one = 0x38u8; // 1.0 in E4M3
        let scales: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let src = Mem(vec![
            (
                "w.weight".into(),
                StDtype::F8_E4M3,
                vec![3, 5],
                vec![one; 15],
            ),
            (
                "w.weight_scale_inv".into(),
                StDtype::F32,
                vec![2, 2],
                scales,
            ),
        ]);
        let q = HfQuant::Fp8Block { block: [2, 4] };
        let w = q.dequantize(&src, "w.weight", &[3, 5]).unwrap().unwrap();
        assert_eq!(
            w,
            [
                1.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0
            ]
        );
        // A scale grid that does not fit the blocks is refused, naming both.
        let bad = Mem(vec![
            (
                "w.weight".into(),
                StDtype::F8_E4M3,
                vec![3, 5],
                vec![one; 15],
            ),
            (
                "w.weight_scale_inv".into(),
                StDtype::F32,
                vec![1, 2],
                vec![0; 8],
            ),
        ]);
        let e = q
            .dequantize(&bad, "w.weight", &[3, 5])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs 2x2 scales"), "{e}");
        // No scale beside it: not a quantized weight (the plain loader decides).
        assert!(q.dequantize(&src, "w.bias", &[5]).unwrap().is_none());
    }

    #[test]
    fn fp8_e4m3_values() {
        assert_eq!(fp8_e4m3(0x00), 0.0);
        assert_eq!(fp8_e4m3(0x38), 1.0);
        assert_eq!(fp8_e4m3(0xb8), -1.0);
        assert_eq!(fp8_e4m3(0x7e), 448.0); // the largest
        assert_eq!(fp8_e4m3(0x01), 2f32.powi(-9)); // the smallest subnormal
        assert!(fp8_e4m3(0x7f).is_nan());
    }

    #[test]
    fn unpacks_dense_int4_and_int3() {
        // int4: values -8..7 stored +8, eight to a word, the first in the lowest bits.
        let vals: Vec<i32> = (0..8).map(|i| i - 4).collect();
        let word: u32 = vals
            .iter()
            .enumerate()
            .map(|(i, v)| ((v + 8) as u32) << (4 * i))
            .sum();
        assert_eq!(
            unpack_rows(&word.to_le_bytes(), 1, 8, 4).unwrap(),
            vals.iter().map(|&v| v as f32).collect::<Vec<_>>()
        );
        // int3: eleven values cross a word boundary (bits 30..33).
        let vals: Vec<i64> = (0..11).map(|i| (i % 8) - 4).collect();
        let mut bits: u64 = 0;
        for (i, v) in vals.iter().enumerate() {
            bits |= ((v + 4) as u64) << (3 * i);
        }
        let bytes = bits.to_le_bytes();
        assert_eq!(
            unpack_rows(&bytes, 1, 11, 3).unwrap(),
            vals.iter().map(|&v| v as f32).collect::<Vec<_>>()
        );
        assert!(unpack_rows(&bytes[..4], 1, 11, 3).is_none());
    }
}
