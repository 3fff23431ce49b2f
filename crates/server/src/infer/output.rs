//! The responses file of `lmi infer`, written whole or not at all.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct InferOutput {
    /// One per request, in request order.
    pub responses: Vec<Response>,
    pub summary: Summary,
}

#[derive(Debug, Clone, Serialize)]
pub struct Response {
    /// The reply; for a model whose chat template reasons, the answer after the reasoning.
    pub output_text: String,
    /// The reasoning (a `<think>` block, gpt-oss's analysis channel), split from the answer
    /// as the server's `reasoning_content` is; absent when the reply has none or the prompt
    /// was not templated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_text: Option<String>,
    /// "length", "eos_token" or "stop_sequence".
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache (a saved system prompt, or any
    /// earlier request's identical full blocks).
    pub reused_prompt_tokens: usize,
    pub timings: ResponseTimings,
}

#[derive(Debug, Clone, Serialize)]
pub struct ResponseTimings {
    pub queue_ms: f64,
    pub time_to_first_token_ms: f64,
    pub total_ms: f64,
    /// generated_tokens / total time of this request.
    pub tokens_per_second: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub model: String,
    pub requests: usize,
    pub batch_size: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub reused_prompt_tokens: usize,
    pub wall_time_s: f64,
    /// Generated tokens of all requests / wall time of the run (model load excluded).
    pub generated_tokens_per_second: f64,
}

impl Summary {
    /// The one-line summary printed on stderr.
    pub fn line(&self) -> String {
        format!(
            "{} requests, {} prompt tokens ({} reused from the prefix cache), {} generated tokens in {:.2} s: {:.1} generated tokens/s (batch_size {})",
            self.requests,
            self.prompt_tokens,
            self.reused_prompt_tokens,
            self.generated_tokens,
            self.wall_time_s,
            self.generated_tokens_per_second,
            self.batch_size
        )
    }
}

/// Writes `text` to `path` atomically: a temporary file in the same directory, then a rename,
/// so readers never see a partial file and a failure leaves nothing behind.
pub fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".lmi-infer-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Fails early when `path` could not be written at the end (its directory is missing).
pub fn check_writable(path: &Path) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    anyhow::ensure!(
        dir.is_dir(),
        "cannot write --output {}: the directory {} does not exist",
        path.display(),
        dir.display()
    );
    anyhow::ensure!(
        !path.is_dir(),
        "cannot write --output {}: it is a directory",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write_atomically(&p, "one").unwrap();
        write_atomically(&p, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(check_writable(&dir.path().join("missing/out.json")).is_err());
    }
}
