//! Arguments the benchmarks that load a model share: the model and where it runs, and a
//! closed-loop load.

use std::path::PathBuf;

use lmi_engine::{DType, Device};

/// A closed-loop load: client threads each running requests back to back.
#[derive(clap::Args)]
pub struct LoadArgs {
    /// Client threads.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Requests each client thread runs back to back.
    #[arg(long, default_value_t = 3)]
    pub requests: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// The HTML report (a bar chart of each case's throughput beside the table); by default
    /// `lmi-bench-<command>.html` in the working directory.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// The model a benchmark loads, and where (flattened into each benchmark's arguments).
#[derive(clap::Args)]
pub struct ModelArgs {
    /// HF model directory or GGUF file, Hub id org/name[:QUANT] or s3://bucket/prefix/; the
    /// default model when absent.
    #[arg(long)]
    pub model: Option<String>,
    /// Device: cpu, cuda or cuda:<ordinal>.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Weight dtype in memory (f32, bf16, int8); when absent a GGUF's quantized blocks as
    /// they are on the CPU, else bf16.
    #[arg(long)]
    pub dtype: Option<DType>,
}

impl ModelArgs {
    /// The model directory, the dtype to ask the engine for, and the GGUF it came from.
    pub fn resolve(&self) -> anyhow::Result<(PathBuf, Option<DType>, Option<PathBuf>)> {
        let r = lmi_store::resolve(self.model.as_deref(), true)?;
        let dtype = self
            .dtype
            .or_else(|| self.device.auto_dtype(&r.dir, r.gguf.is_some()));
        Ok((r.dir, dtype, r.gguf))
    }

    pub fn dtype_name(dtype: Option<DType>) -> String {
        dtype.map_or_else(|| "GGUF blocks as stored".to_string(), |d| d.to_string())
    }
}
