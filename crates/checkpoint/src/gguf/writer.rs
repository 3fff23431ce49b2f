//! Writing GGUF v3 files: metadata, tensor infos, and 32-byte aligned tensor data; and
//! re-quantizing a GGUF's matrices into another block type (`lmi quantize`).

use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{CheckpointError, Result};
use crate::gguf::dequant::dequantize;
use crate::gguf::ggml_type::GgmlType;
use crate::gguf::reader::{GgufFile, GgufValue};
use crate::quant::{QMatrix, QType};

const ALIGN: usize = 32;

/// A tensor to write. `dims` are in GGUF order: `dims[0]` is the row length.
pub struct TensorOut {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub data: Vec<u8>,
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn put_value(b: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => b.push(*x),
        GgufValue::I8(x) => b.extend(x.to_le_bytes()),
        GgufValue::U16(x) => b.extend(x.to_le_bytes()),
        GgufValue::I16(x) => b.extend(x.to_le_bytes()),
        GgufValue::U32(x) => b.extend(x.to_le_bytes()),
        GgufValue::I32(x) => b.extend(x.to_le_bytes()),
        GgufValue::F32(x) => b.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => b.push(u8::from(*x)),
        GgufValue::String(s) => put_str(b, s),
        GgufValue::Array(items) => {
            // An empty array's element type is not recoverable; u8 reads back as empty too.
            b.extend(items.first().map_or(0, type_id).to_le_bytes());
            b.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(b, i));
        }
        GgufValue::U64(x) => b.extend(x.to_le_bytes()),
        GgufValue::I64(x) => b.extend(x.to_le_bytes()),
        GgufValue::F64(x) => b.extend(x.to_le_bytes()),
    }
}

/// Writes a GGUF file (into a temporary sibling renamed into place).
pub fn write(path: &Path, metadata: &[(String, GgufValue)], tensors: &[TensorOut]) -> Result<()> {
    let mut head = b"GGUF".to_vec();
    head.extend(3u32.to_le_bytes());
    head.extend((tensors.len() as u64).to_le_bytes());
    head.extend((metadata.len() as u64).to_le_bytes());
    for (key, v) in metadata {
        put_str(&mut head, key);
        head.extend(type_id(v).to_le_bytes());
        put_value(&mut head, v);
    }
    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut head, &t.name);
        head.extend((t.dims.len() as u32).to_le_bytes());
        t.dims.iter().for_each(|d| head.extend(d.to_le_bytes()));
        head.extend(t.ggml_type.0.to_le_bytes());
        head.extend((offset as u64).to_le_bytes());
        offset += t.data.len().div_ceil(ALIGN) * ALIGN;
    }
    head.resize(head.len().div_ceil(ALIGN) * ALIGN, 0);
    let tmp = path.with_extension("gguf.partial");
    let io = |e| CheckpointError::io(&tmp, e);
    let mut w = BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    w.write_all(&head).map_err(io)?;
    let pad = [0u8; ALIGN];
    for t in tensors {
        w.write_all(&t.data).map_err(io)?;
        let rem = t.data.len().div_ceil(ALIGN) * ALIGN - t.data.len();
        w.write_all(&pad[..rem]).map_err(io)?;
    }
    w.into_inner()
        .map_err(|e| CheckpointError::io(&tmp, e.into_error()))?
        .sync_all()
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| CheckpointError::io(path, e))
}

/// llama.cpp's `general.file_type` for a file mostly of `qtype`.
fn file_type(qtype: QType) -> u32 {
    match qtype {
        QType::Q4_0 => 2,
        QType::Q4_1 => 3,
        QType::Q8_0 => 7,
        QType::Q4_K => 14,
        QType::Q6_K => 18,
        // MOSTLY_MXFP4_MOE: llama.cpp's files keep attention in another type.
        QType::MXFP4 => 38,
        QType::I8 => 0,
    }
}

/// Writes `dst`: `src` with every weight matrix (and stack of experts' matrices) whose rows
/// split into `qtype` blocks re-quantized to `qtype` (norms, biases, other vectors and a
/// mixture of experts' router are kept as they are).
pub fn requantize(src: &Path, dst: &Path, qtype: QType) -> Result<()> {
    let ggml = qtype.ggml().ok_or_else(|| {
        CheckpointError::Gguf(format!(
            "{} has no GGUF block type; choose q8_0, q4_0, q4_1, q4_k, q6_k or mxfp4",
            qtype.name()
        ))
    })?;
    let g = GgufFile::open(src)?;
    let mut metadata: Vec<(String, GgufValue)> = g
        .metadata
        .iter()
        .filter(|(k, _)| k.as_str() != "general.file_type")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.push(("general.file_type".into(), GgufValue::U32(file_type(qtype))));
    let mut tensors = Vec::with_capacity(g.tensors.len());
    for info in &g.tensors {
        let data = g.tensor_data(info)?;
        let cols = info.dims.first().copied().unwrap_or(1) as usize;
        let rows = (info.n_elements() as usize).checked_div(cols).unwrap_or(0);
        // Matrices and stacked experts (3-D, quantized row by row); a mixture's router (and a
        // shared expert's gate) stays as it is, as llama.cpp's quantizer keeps it (its
        // choices flip on small errors).
        let matrix = info.dims.len() >= 2
            && info.name.ends_with(".weight")
            && !info.name.ends_with("ffn_gate_inp.weight")
            && !info.name.ends_with("ffn_gate_inp_shexp.weight");
        let (ggml_type, data) = if matrix && cols.is_multiple_of(qtype.block()) {
            let x = dequantize(&info.name, info.ggml_type, data, rows * cols)?;
            let m = QMatrix::quantize(qtype, rows, cols, &x).map_err(CheckpointError::Gguf)?;
            (ggml, m.data)
        } else {
            (info.ggml_type, data.to_vec())
        };
        tensors.push(TensorOut {
            name: info.name.clone(),
            dims: info.dims.clone(),
            ggml_type,
            data,
        });
    }
    write(dst, &metadata, &tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.gguf");
        let meta = vec![
            (
                "general.architecture".to_string(),
                GgufValue::String("llama".into()),
            ),
            (
                "a.list".to_string(),
                GgufValue::Array(vec![GgufValue::I32(-3), GgufValue::I32(4)]),
            ),
            ("a.f".to_string(), GgufValue::F64(0.5)),
        ];
        let m = QMatrix::quantize(QType::Q4_1, 2, 64, &[0.25; 128]).unwrap();
        let tensors = vec![
            TensorOut {
                name: "w.weight".into(),
                dims: vec![64, 2],
                ggml_type: GgmlType::Q4_1,
                data: m.data.clone(),
            },
            TensorOut {
                name: "n.weight".into(),
                dims: vec![3],
                ggml_type: GgmlType::F32,
                data: [1f32, 2.0, 3.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            },
        ];
        write(&p, &meta, &tensors).unwrap();
        let g = GgufFile::open(&p).unwrap();
        assert_eq!(g.get_str("general.architecture").unwrap(), Some("llama"));
        assert_eq!(g.get("a.list"), Some(&meta[1].1));
        assert_eq!(g.get("a.f"), Some(&meta[2].1));
        let w = g.tensor("w.weight").unwrap();
        assert_eq!(g.tensor_data(w).unwrap(), &m.data[..]);
        let n = g.tensor("n.weight").unwrap();
        assert_eq!(
            dequantize("n", n.ggml_type, g.tensor_data(n).unwrap(), 3).unwrap(),
            vec![1.0, 2.0, 3.0]
        );
    }
}
