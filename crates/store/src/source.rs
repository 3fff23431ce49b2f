//! What a model argument names, decided in one place for `--model`, `option.model_id`,
//! `HF_MODEL_ID`, adapters and draft models: an existing local path first, then an
//! `s3://bucket/prefix/`, then a Hub id `org/name` (`:QUANT` for a GGUF repository,
//! `@revision` for any).

use std::path::{Path, PathBuf};

use crate::error::{Result, StoreError};
use crate::hub::HubRef;
use crate::s3::S3Uri;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// No argument: the default model.
    Default,
    Local(PathBuf),
    S3(S3Uri),
    Hub(HubRef),
}

const FORMS: &str = "a local directory or .gguf file, s3://bucket/prefix/, or a Hugging Face Hub id org/name (org/name:Q4_K_M for a GGUF repository, org/name@revision)";

impl ModelSource {
    /// Reads `spec`; `revision` (option.revision) applies to a Hub id that names none.
    pub fn parse(spec: Option<&str>, revision: Option<&str>) -> Result<Self> {
        let Some(spec) = spec.map(str::trim).filter(|s| !s.is_empty()) else {
            return Ok(ModelSource::Default);
        };
        if Path::new(spec).exists() {
            return Ok(ModelSource::Local(PathBuf::from(spec)));
        }
        if spec.starts_with("s3://") {
            return S3Uri::parse(spec).map(ModelSource::S3);
        }
        if let Some(r) = hub_ref(spec) {
            return Ok(ModelSource::Hub(HubRef {
                revision: r.revision.or_else(|| revision.map(str::to_string)),
                ..r
            }));
        }
        Err(StoreError::Source(format!(
            "model {spec:?} does not exist here and is not a model name: expected {FORMS}"
        )))
    }

    /// What to call it in messages and /info.
    pub fn describe(&self) -> String {
        match self {
            ModelSource::Default => crate::DEFAULT_MODEL_NAME.to_string(),
            ModelSource::Local(p) => p.display().to_string(),
            ModelSource::S3(u) => u.to_string(),
            ModelSource::Hub(h) => h.repo.clone(),
        }
    }
}

/// `org/name[:QUANT][@revision]`, the Hub's rules for names: letters, digits, `-`, `_`, `.`,
/// neither starting nor ending with `-` or `.`, no `--` or `..`, at most 96 characters.
fn hub_ref(spec: &str) -> Option<HubRef> {
    let (rest, revision) = match spec.split_once('@') {
        Some((r, rev)) if !rev.is_empty() => (r, Some(rev.to_string())),
        Some(_) => return None,
        None => (spec, None),
    };
    let (repo, quant) = match rest.split_once(':') {
        Some((r, q))
            if !q.is_empty()
                && q.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            (r, Some(q.to_string()))
        }
        Some(_) => return None,
        None => (rest, None),
    };
    let (org, name) = repo.split_once('/')?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 96
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && !s.starts_with(['-', '.'])
            && !s.ends_with(['-', '.'])
            && !s.contains("--")
            && !s.contains("..")
    };
    (ok(org) && ok(name)).then(|| HubRef {
        repo: repo.to_string(),
        revision,
        quant,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(repo: &str, revision: Option<&str>, quant: Option<&str>) -> ModelSource {
        ModelSource::Hub(HubRef {
            repo: repo.into(),
            revision: revision.map(Into::into),
            quant: quant.map(Into::into),
        })
    }

    #[test]
    fn one_rule_for_every_model_argument() {
        let p = |s| ModelSource::parse(Some(s), None);
        assert_eq!(
            ModelSource::parse(None, None).unwrap(),
            ModelSource::Default
        );
        assert_eq!(
            p("Qwen/Qwen3-0.6B").unwrap(),
            hub("Qwen/Qwen3-0.6B", None, None)
        );
        assert_eq!(
            p("unsloth/Qwen3-0.6B-GGUF:Q4_K_M").unwrap(),
            hub("unsloth/Qwen3-0.6B-GGUF", None, Some("Q4_K_M"))
        );
        assert_eq!(p("o/lora@v2").unwrap(), hub("o/lora", Some("v2"), None));
        assert_eq!(
            ModelSource::parse(Some("o/m"), Some("refs/pr/3")).unwrap(),
            hub("o/m", Some("refs/pr/3"), None)
        );
        assert_eq!(
            ModelSource::parse(Some("o/m@abc"), Some("main")).unwrap(),
            hub("o/m", Some("abc"), None),
            "the name's own revision wins"
        );
        // An existing path wins over a name that reads like a Hub id.
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("org");
        std::fs::create_dir_all(local.join("name")).unwrap();
        let spec = local.join("name");
        assert_eq!(
            p(spec.to_str().unwrap()).unwrap(),
            ModelSource::Local(spec.clone())
        );
        match p("s3://bucket/qwen3/").unwrap() {
            ModelSource::S3(u) => {
                assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("bucket", "qwen3/"))
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            "/no/such/dir",
            "just-a-name",
            "a/b/c",
            "-o/name",
            "o/na..me",
            "o/m:",
            "o/m@",
            "o/m:Q4 K",
        ] {
            let e = p(bad).unwrap_err().to_string();
            assert!(
                e.contains("s3://bucket/prefix/") && e.contains("org/name"),
                "{bad}: {e}"
            );
        }
    }
}
