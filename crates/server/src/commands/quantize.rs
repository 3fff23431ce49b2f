use std::path::PathBuf;

use anyhow::Context;
use lmi_checkpoint::quant::QType;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to re-quantize.
    gguf: PathBuf,
    /// The GGUF file to write (must not exist yet).
    out: PathBuf,
    /// Block type for the weight matrices: q8_0, q4_0, q4_1, q4_k, q6_k or mxfp4.
    #[arg(long = "type")]
    qtype: QType,
}

/// Re-quantizes every weight matrix of a GGUF into one block type (norms and other vectors
/// stay as they are); the metadata, tokenizer included, is copied.
pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.out.exists(),
        "{} already exists: choose a new output file",
        a.out.display()
    );
    lmi_checkpoint::gguf::writer::requantize(&a.gguf, &a.out, a.qtype)
        .with_context(|| format!("re-quantizing {}", a.gguf.display()))?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
