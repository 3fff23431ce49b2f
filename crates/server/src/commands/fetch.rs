//! `lmi fetch MODEL`: fetches a model (a Hub id or an S3 prefix) into its cache and prints
//! the directory, without serving it: to fill a shared volume before replicas start (an
//! init container), or to check a name and its credentials.

use lmi_store::{Fetch, ModelSource};

#[derive(clap::Args)]
pub struct Args {
    /// Hub id org/name (org/name:Q4_K_M for a GGUF repository, @revision), s3://bucket/prefix/,
    /// or a local path (checked, nothing fetched).
    model: String,
    /// Branch, tag, commit or refs/pr/N for a Hub id without @revision (also HF_REVISION).
    #[arg(long)]
    revision: Option<String>,
    /// A LoRA adapter (adapter_config.json and its safetensors), not a model.
    #[arg(long)]
    adapter: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut fetch = Fetch::from_env(true);
    if a.revision.is_some() {
        fetch.revision = a.revision;
    }
    if a.adapter {
        let dir = lmi_store::resolve_adapter(&a.model, &fetch)?;
        println!("{}", dir.display());
        return Ok(());
    }
    // The model's own files (a GGUF's path, not the directory its config is imported into).
    let r = lmi_store::resolve_with(Some(&a.model), &fetch)?;
    let shown = match (
        ModelSource::parse(Some(&a.model), fetch.revision.as_deref())?,
        &r.gguf,
    ) {
        (ModelSource::Hub(_), Some(g)) => g.clone(),
        _ => r.dir.clone(),
    };
    eprintln!("{}", r.origin);
    println!("{}", shown.display());
    Ok(())
}
