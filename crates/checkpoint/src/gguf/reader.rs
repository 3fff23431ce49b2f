//! GGUF v2/v3 parser over a memory-mapped file (little-endian only).
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 KV count, the KV pairs, the tensor
//! infos, zero padding to `general.alignment` (default 32), then tensor data. Offsets in the
//! tensor infos are relative to the start of the data section.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, UncheckedAdvice};

use crate::error::{CheckpointError, Result};
use crate::gguf::ggml_type::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value. Arrays may nest.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// Any integer type that is non-negative (converters store the same key as u32 or u64).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type, signed.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any numeric type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            // Via the shortest decimal that round-trips, so 1e-5f32 becomes 1e-5, not
            // 9.999999747378752e-6, in config.json.
            GgufValue::F32(v) => Some(v.to_string().parse().unwrap_or(f64::from(v))),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => self.as_u64().map(|v| v != 0),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::F32(_) => "f32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F64(_) => "f64",
        }
    }
}

/// A tensor's description; `dims[0]` is the fastest-varying axis (reverse for the HF shape).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row-major (PyTorch) shape: the GGUF dims reversed.
    pub fn hf_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Bytes the tensor occupies, or an error for types whose block size is unknown.
    pub fn byte_size(&self) -> Result<u64> {
        let (block, bytes) = self.ggml_type.block_layout().ok_or_else(|| {
            CheckpointError::Gguf(format!(
                "tensor {:?} has unknown ggml type {}",
                self.name, self.ggml_type
            ))
        })?;
        let inner = self.dims.first().copied().unwrap_or(1);
        if !inner.is_multiple_of(block) {
            return Err(CheckpointError::Gguf(format!(
                "tensor {:?} of type {} has a row of {inner} elements, not a multiple of the block size {block}",
                self.name, self.ggml_type
            )));
        }
        Ok(self.n_elements() / block * bytes)
    }
}

/// An open GGUF file: parsed metadata and tensor infos over the mapped bytes.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    pub version: u32,
    pub alignment: u64,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<TensorInfo>,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("tensors", &self.tensors.len())
            .field("metadata_keys", &self.metadata.len())
            .finish()
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| CheckpointError::io(path, e))?;
        // SAFETY: the file is opened read-only; like every mmap-based loader we rely on no one
        // truncating it while it is mapped.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError::io(path, e))?;
        let header = parse_header(&mmap)
            .map_err(|msg| CheckpointError::Gguf(format!("{}: {msg}", path.display())))?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version: header.version,
            alignment: header.alignment,
            metadata: header.metadata,
            tensors: header.tensors,
            data_offset: header.data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, GgufValue::as_u64, "a non-negative integer")
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, GgufValue::as_f64, "a number")
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, GgufValue::as_bool, "a bool")
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, GgufValue::as_str, "a string")
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&[GgufValue]>> {
        self.typed(key, GgufValue::as_array, "an array")
    }

    /// A required integer key; the error names the key.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?.ok_or_else(|| {
            CheckpointError::Gguf(format!("{}: missing key {key:?}", self.path.display()))
        })
    }

    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?.ok_or_else(|| {
            CheckpointError::Gguf(format!("{}: missing key {key:?}", self.path.display()))
        })
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        conv: impl Fn(&'a GgufValue) -> Option<T>,
        what: &str,
    ) -> Result<Option<T>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => conv(v).map(Some).ok_or_else(|| {
                CheckpointError::Gguf(format!(
                    "{}: key {key:?} should be {what}, found {}",
                    self.path.display(),
                    v.type_name()
                ))
            }),
        }
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Drops this process's pages of `bytes` (a slice of this file) once they are copied out,
    /// so that loading holds each part of the file only while reading it: otherwise the whole
    /// mapping is resident beside the weights built from it until loading ends (a peak of
    /// twice the file). The page cache keeps the pages; a later read faults them back in.
    pub fn release(&self, bytes: &[u8]) {
        let base = self.mmap.as_ptr() as usize;
        let start = bytes.as_ptr() as usize;
        if bytes.is_empty() || start < base || start + bytes.len() > base + self.mmap.len() {
            return;
        }
        const PAGE: usize = 4096;
        let lo = (start - base) / PAGE * PAGE;
        let hi = (start - base + bytes.len())
            .next_multiple_of(PAGE)
            .min(self.mmap.len());
        // SAFETY: a read-only file mapping that nothing writes: pages dropped are read again
        // from the page cache or the file, the same bytes, should anything touch them later
        // (neighbouring tensors' bytes on the boundary pages likewise). Advice is best effort.
        let _ = unsafe {
            self.mmap
                .unchecked_advise_range(UncheckedAdvice::DontNeed, lo, hi - lo)
        };
    }

    /// The raw bytes of a tensor, bounds-checked against the file.
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8]> {
        let size = info.byte_size()?;
        let start = self.data_offset.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.mmap.len() as u64 => {
                Ok(&self.mmap[s as usize..e as usize])
            }
            _ => Err(CheckpointError::Gguf(format!(
                "{}: tensor {:?} ({} bytes at data offset {}) runs past the end of the file ({} bytes); the file is truncated or corrupt",
                self.path.display(),
                info.name,
                size,
                info.offset,
                self.mmap.len()
            ))),
        }
    }
}

struct Header {
    version: u32,
    alignment: u64,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<TensorInfo>,
    data_offset: u64,
}

fn parse_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic = c
        .take(4)
        .map_err(|_| "file is shorter than a GGUF header".to_string())?;
    if magic != MAGIC {
        return Err(format!(
            "not a GGUF file (magic {magic:02x?}, expected \"GGUF\")"
        ));
    }
    let version = c.u32()?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "unsupported GGUF version {version} (supported: 2, 3)"
        ));
    }
    let n_tensors = c.u64()?;
    let n_kv = c.u64()?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string().map_err(|e| format!("metadata key #{i}: {e}"))?;
        let ty = c.u32()?;
        let value = c
            .value(ty, 0)
            .map_err(|e| format!("metadata key {key:?}: {e}"))?;
        metadata.insert(key, value);
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => {
                return Err(format!(
                    "general.alignment must be a power of two, found {v:?}"
                ));
            }
        },
    };
    // Every tensor info is at least 24 bytes: bound the allocation by what the file can hold.
    if n_tensors > (bytes.len() as u64) / 24 {
        return Err(format!(
            "tensor count {n_tensors} is larger than the file can hold"
        ));
    }
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string().map_err(|e| format!("tensor info #{i}: {e}"))?;
        let n_dims = c.u32()?;
        if n_dims > 8 {
            return Err(format!(
                "tensor {name:?} has {n_dims} dimensions (at most 8 are allowed)"
            ));
        }
        let dims = (0..n_dims)
            .map(|_| c.u64())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_none()
        {
            return Err(format!(
                "tensor {name:?} has dims {dims:?} whose product overflows"
            ));
        }
        let ggml_type = GgmlType(c.u32()?);
        let offset = c.u64()?;
        if !offset.is_multiple_of(alignment) {
            return Err(format!(
                "tensor {name:?} offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        });
    }
    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    Ok(Header {
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
    })
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "unexpected end of file at byte {} (wanted {n} more bytes)",
                self.pos
            ));
        };
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn len(&mut self) -> std::result::Result<usize, String> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len() - self.pos)
            .ok_or_else(|| {
                format!(
                    "length {n} at byte {} runs past the end of the file",
                    self.pos - 8
                )
            })
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.len()?;
        let at = self.pos;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| format!("string at byte {at} is not valid UTF-8"))
    }

    fn value(&mut self, ty: u32, depth: u32) -> std::result::Result<GgufValue, String> {
        Ok(match ty {
            0 => GgufValue::U8(u8::from_le_bytes(self.array()?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("bool has byte value {b} (expected 0 or 1)")),
            },
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth >= 8 {
                    return Err("arrays nested more than 8 deep".into());
                }
                let elem = self.u32()?;
                // Every element takes at least one byte, so the count is bounded by the file.
                let n = self.len()?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    #[test]
    fn parses_header_kv_types_and_tensor_infos() {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes()); // tensors
        b.extend(4u64.to_le_bytes()); // kv
        string(&mut b, "a.count");
        b.extend(10u32.to_le_bytes());
        b.extend(7u64.to_le_bytes());
        string(&mut b, "a.eps");
        b.extend(6u32.to_le_bytes());
        b.extend(0.5f32.to_le_bytes());
        string(&mut b, "a.nested");
        b.extend(9u32.to_le_bytes());
        b.extend(9u32.to_le_bytes()); // array of arrays
        b.extend(1u64.to_le_bytes());
        b.extend(5u32.to_le_bytes()); // of i32
        b.extend(2u64.to_le_bytes());
        b.extend((-3i32).to_le_bytes());
        b.extend(4i32.to_le_bytes());
        string(&mut b, "a.name");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "hi");
        string(&mut b, "w");
        b.extend(2u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend(0u32.to_le_bytes()); // F32
        b.extend(0u64.to_le_bytes());
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        let data_start = b.len();
        for i in 0..6 {
            b.extend((i as f32).to_le_bytes());
        }
        let h = parse_header(&b).unwrap();
        assert_eq!(h.version, 3);
        assert_eq!(h.data_offset as usize, data_start);
        assert_eq!(h.metadata["a.count"].as_u64(), Some(7));
        assert_eq!(h.metadata["a.eps"].as_f64(), Some(0.5));
        assert_eq!(h.metadata["a.name"].as_str(), Some("hi"));
        let nested = h.metadata["a.nested"].as_array().unwrap();
        assert_eq!(
            nested[0],
            GgufValue::Array(vec![GgufValue::I32(-3), GgufValue::I32(4)])
        );
        assert_eq!(h.tensors[0].hf_shape(), vec![3, 2]);
        assert_eq!(h.tensors[0].byte_size().unwrap(), 24);
    }

    #[test]
    fn rejects_bad_magic_and_truncation() {
        let e = parse_header(b"GGML\x03\0\0\0").err().unwrap();
        assert!(e.contains("not a GGUF file"), "{e}");
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(1000u64.to_le_bytes()); // key length past the end
        let e = parse_header(&b).err().unwrap();
        assert!(e.contains("metadata key #0"), "{e}");
    }
}
