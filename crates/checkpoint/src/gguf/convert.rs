//! GGUF → HF directory: model.safetensors, config.json, generation_config.json,
//! tokenizer.json, tokenizer_config.json.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use indicatif::{ProgressBar, ProgressStyle};
use safetensors::tensor::{Dtype, View};
use serde_json::Value;

use crate::dtype::DType;
use crate::error::{CheckpointError, Result};
use crate::gguf::dequant::dequantize;
use crate::gguf::hparams::{self, GgufArch, Hparams};
use crate::gguf::reader::{GgufFile, TensorInfo};
use crate::gguf::tensor_names::{self, Mapped, QkKind, unpermute_rows};
use crate::gguf::tokenizer;

/// Converts `gguf` into an HF checkpoint directory at `out_dir` with weights in `dtype`.
///
/// Everything is written into a temporary sibling directory that is renamed into place at the
/// end, so a failed conversion leaves nothing behind. `out_dir` must not exist, or be empty.
pub fn convert_gguf(gguf: &Path, out_dir: &Path, dtype: DType, progress: bool) -> Result<()> {
    convert_gguf_with(gguf, out_dir, dtype, true, progress)
}

/// Like [`convert_gguf`]; without `weights` only config, generation config and tokenizer files
/// are written (what serving a GGUF as it is needs beside the file itself).
pub fn convert_gguf_with(
    gguf: &Path,
    out_dir: &Path,
    dtype: DType,
    weights: bool,
    progress: bool,
) -> Result<()> {
    if dtype == DType::I8 {
        return Err(CheckpointError::Gguf(
            "lmi convert writes f32, f16 or bf16 checkpoints; int8 is a format the engine makes at load (serve with --dtype int8)".into(),
        ));
    }
    let g = GgufFile::open(gguf)?;
    let h = hparams::read(&g)?;
    let tok = tokenizer::build(&g, h.context_length)?;
    let tensors = plan_tensors(&g, &h, dtype, weights)?;

    if out_dir.exists() {
        let empty = std::fs::read_dir(out_dir)
            .map_err(|e| CheckpointError::io(out_dir, e))?
            .next()
            .is_none();
        if !empty {
            return Err(CheckpointError::Gguf(format!(
                "output directory {} already exists and is not empty; remove it or choose another",
                out_dir.display()
            )));
        }
    }
    let tmp = TempDir::new_beside(out_dir)?;

    if weights {
        write_weights(&g, tensors, &tmp.path, gguf, progress)?;
    }

    write_json(
        &tmp.path.join("config.json"),
        &hparams::config_json(&h, dtype),
    )?;
    write_json(
        &tmp.path.join("generation_config.json"),
        &hparams::generation_config_json(&h),
    )?;
    write_json(&tmp.path.join("tokenizer.json"), &tok.tokenizer_json)?;
    write_json(
        &tmp.path.join("tokenizer_config.json"),
        &tok.tokenizer_config_json,
    )?;
    tmp.persist(out_dir)
}

/// Writes `model.safetensors` into `dir`, one dequantized tensor in memory at a time.
fn write_weights(
    g: &GgufFile,
    tensors: BTreeMap<String, TensorPlan<'_>>,
    dir: &Path,
    gguf: &Path,
    progress: bool,
) -> Result<()> {
    let bar = if progress {
        let bar = ProgressBar::new(tensors.len() as u64);
        if let Ok(style) =
            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} tensors ({elapsed})")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(format!("converting {}", gguf.display()));
        bar
    } else {
        ProgressBar::hidden()
    };
    let failure = RefCell::new(None);
    let views: Vec<(String, LazyTensor)> = tensors
        .into_iter()
        .map(|p| {
            let view = LazyTensor {
                g,
                plan: p.1,
                bar: &bar,
                failure: &failure,
            };
            (p.0, view)
        })
        .collect();
    let st_path = dir.join("model.safetensors");
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), &st_path).map_err(|e| {
        CheckpointError::Safetensors {
            path: st_path.clone(),
            msg: e.to_string(),
        }
    })?;
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    // The safetensors writer creates its file 0600 (a tempfile); a model cache is shared.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&st_path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| CheckpointError::io(&st_path, e))?;
    }
    bar.finish_and_clear();
    Ok(())
}

/// One output tensor, checked up front so that producing its bytes cannot fail.
struct TensorPlan<'a> {
    info: &'a TensorInfo,
    shape: Vec<usize>,
    /// Number of heads to un-permute over, for llama-arch Q/K.
    unpermute_heads: Option<usize>,
    /// Added to every value: -1 for a Gemma norm (stored as 1 + w, HF holds w).
    shift: f32,
    dtype: DType,
}

/// The tensors to write; `weights` false only checks that every tensor is one we know.
fn plan_tensors<'a>(
    g: &'a GgufFile,
    h: &Hparams,
    dtype: DType,
    weights: bool,
) -> Result<BTreeMap<String, TensorPlan<'a>>> {
    if weights && h.linear.is_some() {
        // Serving reads these files' rearranged tensors straight from them
        // (`weights/gguf_source.rs`); writing them out as safetensors is not done yet.
        return Err(CheckpointError::Gguf(
            "lmi convert does not write the Gated DeltaNet hybrids (qwen35, qwen35moe, \
             qwen3next) as safetensors yet: serve the GGUF as it is (lmi serve --model \
             FILE.gguf)"
                .into(),
        ));
    }
    let mut out = BTreeMap::new();
    for info in &g.tensors {
        let (name, qk) = match tensor_names::map_in(&info.name, h) {
            Some(Mapped::Hf { name, qk }) => (name, qk),
            Some(Mapped::Skip) => continue,
            Some(Mapped::Experts { .. }) if !weights => continue,
            Some(Mapped::Rearranged(_)) if !weights => {
                // A block type lmi cannot read is refused now, not when the engine loads.
                if !info.ggml_type.can_dequantize() {
                    dequantize(&info.name, info.ggml_type, &[], 0)?;
                }
                continue;
            }
            Some(Mapped::Rearranged(_)) => {
                return Err(CheckpointError::Gguf(format!(
                    "tensor {:?} is rearranged by llama.cpp's converter in a way lmi convert \
                     does not undo yet: serve the GGUF as it is",
                    info.name
                )));
            }
            Some(Mapped::Experts { .. }) => {
                return Err(CheckpointError::Gguf(format!(
                    "tensor {:?} holds a mixture of experts' stacked experts, which lmi convert \
                     does not write as safetensors yet: serve the GGUF as it is \
                     (lmi serve --model FILE.gguf)",
                    info.name
                )));
            }
            None => {
                return Err(CheckpointError::Gguf(format!(
                    "tensor {:?} has no HF equivalent known to lmi; this GGUF is not a llama, qwen2, qwen3, qwen3moe, gemma3, gpt-oss, qwen35, qwen35moe, qwen3next, smollm3 or olmo2 model",
                    info.name
                )));
            }
        };
        if !info.ggml_type.can_dequantize() {
            // Produces the error that names the tensor and its type.
            dequantize(&info.name, info.ggml_type, &[], 0)?;
        }
        g.tensor_data(info)?; // bounds check now, not mid-write
        let shape = info.hf_shape();
        let unpermute_heads = match (h.arch, qk) {
            (a, Some(QkKind::Q)) if a.permutes_qk() => Some(h.num_heads as usize),
            (a, Some(QkKind::K)) if a.permutes_qk() => Some(h.num_kv_heads as usize),
            _ => None,
        };
        if let Some(heads) = unpermute_heads {
            let rows = shape.first().copied().unwrap_or(0);
            if !rows.is_multiple_of(2 * heads) {
                return Err(CheckpointError::Gguf(format!(
                    "tensor {:?} has {rows} rows, which do not split into {heads} heads of even size",
                    info.name
                )));
            }
        }
        let shift = if h.arch == GgufArch::Gemma3 && name.ends_with("norm.weight") {
            -1.0
        } else {
            0.0
        };
        out.insert(
            name,
            TensorPlan {
                info,
                shape,
                unpermute_heads,
                shift,
                dtype,
            },
        );
    }
    Ok(out)
}

/// A tensor whose bytes are produced when the safetensors writer asks for them, so only one
/// dequantized tensor is in memory at a time.
struct LazyTensor<'a> {
    g: &'a GgufFile,
    plan: TensorPlan<'a>,
    bar: &'a ProgressBar,
    failure: &'a RefCell<Option<CheckpointError>>,
}

impl LazyTensor<'_> {
    fn values(&self) -> Result<Vec<f32>> {
        let info = self.plan.info;
        let data = self.g.tensor_data(info)?;
        let x = dequantize(&info.name, info.ggml_type, data, info.n_elements() as usize)?;
        let mut x = match self.plan.unpermute_heads {
            Some(heads) => {
                let row_len = self.plan.shape.get(1..).map_or(1, |s| s.iter().product());
                unpermute_rows(&x, heads, row_len)
            }
            None => x,
        };
        if self.plan.shift != 0.0 {
            x.iter_mut().for_each(|v| *v += self.plan.shift);
        }
        Ok(x)
    }
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        match self.plan.dtype {
            DType::F32 | DType::I8 => Dtype::F32,
            DType::F16 => Dtype::F16,
            DType::BF16 => Dtype::BF16,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.plan.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        self.bar.inc(1);
        match self.values() {
            Ok(x) => Cow::Owned(encode(&x, self.plan.dtype)),
            Err(e) => {
                // Planning makes this unreachable in practice; report it after the write.
                self.failure.borrow_mut().get_or_insert(e);
                Cow::Owned(vec![0; self.data_len()])
            }
        }
    }

    fn data_len(&self) -> usize {
        self.plan.info.n_elements() as usize * self.plan.dtype.size()
    }
}

/// f32 → little-endian bytes of `dtype` (bf16/f16 rounded to nearest even by `half`).
fn encode(x: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 | DType::I8 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => x
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::BF16 => x
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CheckpointError::Gguf(format!("serializing {}: {e}", path.display())))?;
    std::fs::write(path, text).map_err(|e| CheckpointError::io(path, e))
}

/// A directory next to the destination that is removed unless persisted.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    fn new_beside(dest: &Path) -> Result<Self> {
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|e| CheckpointError::io(&parent, e))?;
        let base = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = parent.join(format!(".{base}.tmp-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path).map_err(|e| CheckpointError::io(&path, e))?;
        Ok(TempDir { path, keep: false })
    }

    fn persist(mut self, dest: &Path) -> Result<()> {
        if dest.exists() {
            // Checked empty by the caller; rename cannot replace a directory on every platform.
            std::fs::remove_dir(dest).map_err(|e| CheckpointError::io(dest, e))?;
        }
        std::fs::rename(&self.path, dest).map_err(|e| CheckpointError::io(dest, e))?;
        self.keep = true;
        Ok(())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
