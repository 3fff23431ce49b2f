use std::path::PathBuf;

use anyhow::Context;
use lmi_engine::DType;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to import.
    gguf: PathBuf,
    /// Output directory (must not exist yet).
    out_dir: PathBuf,
    /// dtype of the written safetensors.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
}

fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse()
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.out_dir.exists(),
        "{} already exists: choose a new output directory",
        a.out_dir.display()
    );
    lmi_engine::gguf::convert_gguf(&a.gguf, &a.out_dir, a.dtype, true)
        .with_context(|| format!("converting {}", a.gguf.display()))?;
    eprintln!("wrote {}", a.out_dir.display());
    Ok(())
}
