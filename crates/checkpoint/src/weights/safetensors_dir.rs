use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use super::hf_quant::{Raw, RawSource};
use super::host::{HostData, HostTensor, bf16_bytes_to_bits, f16_bytes_to_f32, f32_bytes_to_f32};
use crate::config::quantization::HfQuant;
use crate::dtype::DType;
use crate::error::{CheckpointError, Result};

/// The safetensors files of an HF model directory, memory-mapped, with a name → file index.
pub struct SafetensorsDir {
    dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    index: HashMap<String, usize>,
    /// The directory's `quantization_config`, when its weights are dequantized at load.
    quant: Option<HfQuant>,
}

impl SafetensorsDir {
    /// Opens `model.safetensors`, or every shard listed in `model.safetensors.index.json`,
    /// or else every `*.safetensors` file in the directory.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let mut paths: Vec<PathBuf> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| CheckpointError::io(&index_path, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| CheckpointError::Safetensors {
                    path: index_path.clone(),
                    msg: e.to_string(),
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| CheckpointError::Safetensors {
                    path: index_path.clone(),
                    msg: "no \"weight_map\" object".into(),
                })?;
            let mut shards: Vec<PathBuf> = map
                .values()
                .filter_map(|f| f.as_str())
                .map(|f| dir.join(f))
                .collect();
            shards.sort();
            shards.dedup();
            shards
        } else if single.exists() {
            vec![single]
        } else {
            let rd = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect()
        };
        paths.sort();
        if paths.is_empty() {
            return Err(CheckpointError::Safetensors {
                path: dir.to_path_buf(),
                msg: "no model.safetensors, model.safetensors.index.json or *.safetensors found"
                    .into(),
            });
        }
        Self::from_files(dir, paths)
    }

    /// Opens one safetensors file.
    pub fn open_file(path: &Path) -> Result<Self> {
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::from_files(dir, vec![path.to_path_buf()])
    }

    fn from_files(dir: &Path, paths: Vec<PathBuf>) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for (i, p) in paths.into_iter().enumerate() {
            let f = File::open(&p).map_err(|e| CheckpointError::io(&p, e))?;
            // SAFETY: the file is opened read-only; a concurrent writer would be a user error
            // that at worst yields wrong weights, as with any reader.
            let mmap = unsafe { Mmap::map(&f) }.map_err(|e| CheckpointError::io(&p, e))?;
            let names = SafeTensors::read_metadata(&mmap)
                .map_err(|e| CheckpointError::Safetensors {
                    path: p.clone(),
                    msg: e.to_string(),
                })?
                .1
                .tensors()
                .into_keys()
                .collect::<Vec<_>>();
            for n in names {
                index.insert(n, i);
            }
            files.push((p, mmap));
        }
        Ok(SafetensorsDir {
            dir: dir.to_path_buf(),
            files,
            index,
            quant: read_quantization(dir)?,
        })
    }

    /// Shape of tensor `name`, if present.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let &fi = self.index.get(name)?;
        let st = SafeTensors::deserialize(&self.files[fi].1).ok()?;
        st.tensor(name).ok().map(|v| v.shape().to_vec())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
            || self
                .quant
                .as_ref()
                .and_then(|q| q.stored_name(name))
                .is_some_and(|stored| self.index.contains_key(&stored))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(|s| s.as_str())
    }

    /// Reads tensor `name`, checks its shape, and converts it to `dtype` (a quantized weight
    /// dequantized first).
    pub fn load(&self, name: &str, expected: &[usize], dtype: DType) -> Result<HostTensor> {
        if let Some(q) = &self.quant
            && let Some(values) = q.dequantize(self, name, expected)?
        {
            return Ok(HostTensor::f32(expected.to_vec(), values).to_dtype(dtype));
        }
        self.with_view(name, expected, |view| {
            let bytes = view.data();
            let data = match view.dtype() {
                StDtype::F32 => HostData::F32(f32_bytes_to_f32(bytes)),
                StDtype::F16 => HostData::F32(f16_bytes_to_f32(bytes)),
                StDtype::BF16 => HostData::BF16(bf16_bytes_to_bits(bytes)),
                other => {
                    return Err(CheckpointError::UnsupportedDtype {
                        name: name.to_string(),
                        dtype: format!("{other:?}"),
                    });
                }
            };
            Ok(HostTensor {
                shape: expected.to_vec(),
                data,
            }
            .to_dtype(dtype))
        })
    }

    /// Rows `rows` of the 2-D tensor `name` (`[n, width]`) in f32, the others left unread (an
    /// LM head's few rows out of its vocabulary).
    pub fn load_rows(
        &self,
        name: &str,
        shape: [usize; 2],
        rows: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let [n, width] = shape;
        if let Some(&r) = rows.iter().find(|&&r| r >= n) {
            return Err(CheckpointError::ShapeMismatch {
                name: format!("{name} (row {r})"),
                got: vec![n, width],
                expected: vec![r + 1, width],
            });
        }
        if self.quant.is_some() {
            let all = self.load(name, &shape, DType::F32)?.to_f32_vec();
            return Ok(rows
                .iter()
                .map(|&r| all[r * width..(r + 1) * width].to_vec())
                .collect());
        }
        self.with_view(name, &shape, |view| {
            let bytes = view.data();
            let row = |r: usize, size: usize| &bytes[r * width * size..(r + 1) * width * size];
            rows.iter()
                .map(|&r| match view.dtype() {
                    StDtype::F32 => Ok(f32_bytes_to_f32(row(r, 4))),
                    StDtype::F16 => Ok(f16_bytes_to_f32(row(r, 2))),
                    StDtype::BF16 => Ok(bf16_bytes_to_bits(row(r, 2))
                        .into_iter()
                        .map(|b| f32::from_bits((b as u32) << 16))
                        .collect()),
                    other => Err(CheckpointError::UnsupportedDtype {
                        name: name.to_string(),
                        dtype: format!("{other:?}"),
                    }),
                })
                .collect()
        })
    }

    /// The bytes of a U8 tensor `name` of shape `expected` (MXFP4 blocks and scales).
    pub fn load_u8(&self, name: &str, expected: &[usize]) -> Result<Vec<u8>> {
        self.with_view(name, expected, |view| match view.dtype() {
            StDtype::U8 => Ok(view.data().to_vec()),
            other => Err(CheckpointError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?} (expected U8)"),
            }),
        })
    }

    /// Runs `f` on tensor `name`'s view, whatever its shape.
    fn with_any_view<T>(
        &self,
        name: &str,
        f: impl FnOnce(&safetensors::tensor::TensorView<'_>) -> Result<T>,
    ) -> Result<T> {
        let &fi = self
            .index
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                name: name.to_string(),
                dir: self.dir.clone(),
            })?;
        let (path, mmap) = &self.files[fi];
        let st = SafeTensors::deserialize(mmap).map_err(|e| CheckpointError::Safetensors {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        let view = st.tensor(name).map_err(|e| CheckpointError::Safetensors {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        f(&view)
    }

    /// Runs `f` on tensor `name`'s view once its shape is checked.
    fn with_view<T>(
        &self,
        name: &str,
        expected: &[usize],
        f: impl FnOnce(&safetensors::tensor::TensorView<'_>) -> Result<T>,
    ) -> Result<T> {
        self.with_any_view(name, |view| {
            if view.shape() != expected {
                return Err(CheckpointError::ShapeMismatch {
                    name: name.to_string(),
                    got: view.shape().to_vec(),
                    expected: expected.to_vec(),
                });
            }
            f(view)
        })
    }
}

impl RawSource for SafetensorsDir {
    fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn with_raw<T>(&self, name: &str, f: &mut dyn FnMut(Raw<'_>) -> Result<T>) -> Result<T> {
        self.with_any_view(name, |view| {
            f(Raw {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                bytes: view.data(),
            })
        })
    }
}

/// The `quantization_config` of `dir/config.json` when its weights are dequantized here (a
/// directory without config.json, or one that does not parse, has none: the config parser
/// reports what is wrong with it).
fn read_quantization(dir: &Path) -> Result<Option<HfQuant>> {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return Ok(None);
    };
    let Ok(serde_json::Value::Object(config)) = serde_json::from_str(&text) else {
        return Ok(None);
    };
    HfQuant::from_config(&config).map_err(|msg| CheckpointError::Config {
        path: dir.join("config.json"),
        msg,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_rows_reads_the_rows_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let path = dir.path().join("model.safetensors");
        crate::testing::write_f32_safetensors(&path, vec![("w".into(), vec![4, 3], values)])
            .unwrap();
        let st = SafetensorsDir::open(dir.path()).unwrap();
        let rows = st.load_rows("w", [4, 3], &[3, 1]).unwrap();
        assert_eq!(rows, [vec![4.5, 5.0, 5.5], vec![1.5, 2.0, 2.5]]);
        let e = st.load_rows("w", [4, 3], &[4]).unwrap_err().to_string();
        assert!(e.contains("row 4"), "{e}");
        assert!(
            st.load_rows("w", [3, 4], &[0]).is_err(),
            "the shape is checked"
        );
    }
}
