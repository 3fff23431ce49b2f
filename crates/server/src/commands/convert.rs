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
    #[arg(long, default_value = "f32")]
    dtype: DType,
    /// Write no weights: only config, generation config and tokenizer, what serving the GGUF
    /// itself (its blocks as stored) needs beside the file.
    #[arg(long)]
    no_weights: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.out_dir.exists(),
        "{} already exists: choose a new output directory",
        a.out_dir.display()
    );
    lmi_checkpoint::gguf::convert::convert_gguf_with(
        &a.gguf,
        &a.out_dir,
        a.dtype,
        !a.no_weights,
        true,
    )
    .with_context(|| format!("converting {}", a.gguf.display()))?;
    write_json_chat_template(&a.out_dir, &a.gguf);
    eprintln!("wrote {}", a.out_dir.display());
    Ok(())
}

/// Writes `processed_chat_template.json` (seed 003) beside the converted model, derived from
/// its Jinja chat template as TensorRT Edge-LLM's export does. A template that cannot be
/// written in the JSON form only gets a warning: the Jinja template still serves.
fn write_json_chat_template(dir: &std::path::Path, gguf: &std::path::Path) {
    let derived = (|| -> anyhow::Result<Option<lmi_text::JsonChatTemplate>> {
        let tok = lmi_text::Tokenizer::from_dir(dir)?;
        let Some(src) = tok.chat_template() else {
            return Ok(None);
        };
        let mut t = lmi_text::derive_json_template(src, tok.bos_token(), tok.eos_token())?;
        t.model_path = Some(gguf.display().to_string());
        Ok(Some(t))
    })();
    let path = dir.join(lmi_text::chat::JSON_TEMPLATE_FILE);
    match derived {
        Ok(Some(t)) => {
            let written = serde_json::to_string_pretty(&t)
                .map_err(anyhow::Error::from)
                .and_then(|json| Ok(std::fs::write(&path, json + "\n")?));
            match written {
                Ok(()) => eprintln!("wrote {}", path.display()),
                Err(e) => eprintln!("warning: cannot write {}: {e}", path.display()),
            }
        }
        Ok(None) => eprintln!(
            "warning: the model has no chat template; no {} written",
            lmi_text::chat::JSON_TEMPLATE_FILE
        ),
        Err(e) => eprintln!(
            "warning: cannot derive {} from the model's chat template ({e:#}); the Jinja template in tokenizer_config.json still applies",
            lmi_text::chat::JSON_TEMPLATE_FILE
        ),
    }
}
