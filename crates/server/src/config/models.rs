//! The models one server holds (beyond the first, `option.model_id`):
//!
//! - `option.models=name=spec,name2=spec2` (or `--model` repeated, which replaces it): more
//!   models loaded at start, each with its own engine, scheduler and KV cache. A bare `spec`
//!   is named as `option.model_id` would be (its directory or GGUF file name, a Hub id).
//! - `option.models_dir=DIR`: every model directory or `.gguf` file directly in `DIR` may be
//!   loaded on demand, by its name, when a request names it.
//! - `option.max_loaded_models=N` and `option.models_memory=BYTES` (K/M/G): at most N models
//!   loaded, whose weights and KV caches take at most BYTES together; the least recently
//!   used idle model is unloaded to make room, a model with a request in flight never is.
//! - `option.model_load_timeout=SECONDS` (default 120): how long a request waits for its
//!   model to load.
//! - `option.evict_wait=SECONDS` (default 30): how long an on-demand load waits for a loaded
//!   model to become idle when every one has requests in flight; then 507 (0: at once).
//! - `SAGEMAKER_MULTI_MODEL=true`: SageMaker's multi-model contract (`POST /models` with a
//!   JSON body, `/models/{name}/invoke`); the server may start with no model.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use super::{Setting, nonneg, parse_bytes, source_of};

#[derive(Debug, Clone)]
pub struct ModelsConfig {
    /// Models loaded at start after the first: (name, spec); no name: named by its spec.
    pub extra: Vec<(Option<String>, String)>,
    /// option.models_dir: models loadable on demand by name.
    pub models_dir: Option<PathBuf>,
    /// option.max_loaded_models (None: no limit).
    pub max_loaded: Option<usize>,
    /// option.models_memory: bytes that the loaded models' weights and KV caches may take
    /// together (None: no limit but the memory the machine has left).
    pub memory_budget: Option<u64>,
    /// option.model_load_timeout.
    pub load_timeout: Duration,
    /// option.evict_wait.
    pub evict_wait: Duration,
    /// SAGEMAKER_MULTI_MODEL=true.
    pub sagemaker_multi_model: bool,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        ModelsConfig {
            extra: Vec::new(),
            models_dir: None,
            max_loaded: None,
            memory_budget: None,
            load_timeout: Duration::from_secs(120),
            evict_wait: Duration::from_secs(30),
            sagemaker_multi_model: false,
        }
    }
}

impl ModelsConfig {
    /// Whether the server may hold more than the one model it starts with.
    pub fn is_multi(&self) -> bool {
        !self.extra.is_empty() || self.models_dir.is_some() || self.sagemaker_multi_model
    }
}

/// `name=spec` (a name has no `/`, `:` or `=`), else a bare spec.
pub fn split_named(entry: &str) -> (Option<String>, String) {
    let entry = entry.trim();
    if let Some((name, spec)) = entry.split_once('=') {
        let name = name.trim();
        let plain = !name.is_empty() && !name.contains(['/', ':', '\\']);
        if plain && !spec.trim().is_empty() {
            return (Some(name.to_string()), spec.trim().to_string());
        }
    }
    (None, entry.to_string())
}

pub fn parse(
    raw: &BTreeMap<String, Setting>,
    sagemaker_multi_model: Option<&String>,
) -> anyhow::Result<ModelsConfig> {
    let mut c = ModelsConfig::default();
    if let Some(s) = raw.get("option.models") {
        c.extra = s
            .value
            .split(',')
            .filter(|e| !e.trim().is_empty())
            .map(split_named)
            .collect();
    }
    if let Some(s) = raw.get("option.models_dir").filter(|s| !s.value.is_empty()) {
        let dir = PathBuf::from(s.value.trim());
        if !dir.is_dir() {
            bail!(
                "option.models_dir={:?} ({}): no such directory",
                s.value,
                s.source
            );
        }
        c.models_dir = Some(dir);
    }
    if raw.contains_key("option.max_loaded_models") {
        let n = nonneg(raw, "option.max_loaded_models", 0)?;
        if n == 0 {
            bail!(
                "option.max_loaded_models=0 ({}): expected a positive integer",
                source_of(raw, "option.max_loaded_models")
            );
        }
        c.max_loaded = Some(n);
    }
    if let Some(s) = raw.get("option.models_memory") {
        let b = parse_bytes(&s.value)
            .with_context(|| format!("option.models_memory={:?} ({})", s.value, s.source))?;
        c.memory_budget = Some(b as u64);
    }
    c.load_timeout = Duration::from_secs(nonneg(raw, "option.model_load_timeout", 120)? as u64);
    c.evict_wait = Duration::from_secs(nonneg(raw, "option.evict_wait", 30)? as u64);
    c.sagemaker_multi_model = match sagemaker_multi_model.map(|v| v.trim().to_ascii_lowercase()) {
        None => false,
        Some(v) if v == "true" || v == "1" => true,
        Some(v) if v == "false" || v == "0" || v.is_empty() => false,
        Some(v) => bail!("SAGEMAKER_MULTI_MODEL={v:?}: expected true or false"),
    };
    Ok(c)
}

/// The configuration of a model loaded from `url` beside the server's first: the server's
/// own, or, when `url` is a directory holding a serving.properties (as DJL Serving reads each
/// model's), that file's settings under the server's command line, over the environment.
pub fn config_for_model(
    base: &super::ServingConfig,
    url: &str,
    env: &super::EnvVars,
) -> anyhow::Result<super::ServingConfig> {
    let own = std::path::Path::new(url).join("serving.properties");
    if !own.is_file() {
        let mut c = base.clone();
        c.model_id = Some(url.to_string());
        return Ok(c);
    }
    // The server's command-line settings still win, but not the ones naming its models.
    const SERVER_ONLY: [&str; 5] = [
        "option.model_id",
        "option.served_model_name",
        "option.models",
        "option.models_dir",
        "option.adapters",
    ];
    let options = base
        .raw
        .iter()
        .filter(|(k, s)| s.source == super::Source::Cli && !SERVER_ONLY.contains(&k.as_str()))
        .map(|(k, s)| format!("{k}={}", s.value))
        .collect();
    let cli = super::ServeArgs {
        model: Some(url.to_string()),
        options,
        ..Default::default()
    };
    let mut c = super::ServingConfig::load(&cli, env, None)
        .with_context(|| format!("reading {}", own.display()))?;
    // One server: its address and its registry's limits are the first model's.
    c.host = base.host.clone();
    c.port = base.port;
    c.models = base.models.clone();
    Ok(c)
}

/// The models directly in `dir` (directories with a config.json, or `.gguf` files), by name,
/// sorted.
pub fn scan_dir(dir: &std::path::Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading option.models_dir {}", dir.display()))?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        let name = if p.is_dir() && p.join("config.json").is_file() {
            p.file_name()
        } else if p
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        {
            p.file_stem()
        } else {
            None
        };
        if let Some(n) = name {
            out.push((n.to_string_lossy().into_owned(), p.clone()));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &str)]) -> BTreeMap<String, Setting> {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    Setting {
                        value: v.to_string(),
                        source: super::super::Source::Cli,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn named_entries_and_bare_specs() {
        assert_eq!(
            split_named("chat=/m/a"),
            (Some("chat".into()), "/m/a".into())
        );
        assert_eq!(split_named("/m/a=b"), (None, "/m/a=b".into()));
        assert_eq!(
            split_named("Qwen/Qwen3-0.6B"),
            (None, "Qwen/Qwen3-0.6B".into())
        );
        let c = parse(&raw(&[("option.models", "a=/x, /y/b ,")]), None).unwrap();
        assert_eq!(
            c.extra,
            vec![(Some("a".into()), "/x".into()), (None, "/y/b".into())]
        );
        assert!(c.is_multi());
        assert!(!parse(&raw(&[]), None).unwrap().is_multi());
    }

    #[test]
    fn a_model_directory_brings_its_own_serving_properties() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        std::fs::create_dir(&dir).unwrap();
        let cli = super::super::ServeArgs {
            kv_cache_bytes: Some("8M".into()),
            max_batch_size: Some(3),
            ..Default::default()
        };
        let base = super::super::ServingConfig::load(&cli, &Default::default(), None).unwrap();
        let url = dir.to_string_lossy().into_owned();
        let c = config_for_model(&base, &url, &Default::default()).unwrap();
        assert_eq!(c.model_id.as_deref(), Some(url.as_str()));
        assert_eq!(c.max_rolling_batch_size, 3);
        std::fs::write(
            dir.join("serving.properties"),
            "option.max_rolling_batch_size=7\noption.max_loras=2\n",
        )
        .unwrap();
        let c = config_for_model(&base, &url, &Default::default()).unwrap();
        // The command line wins over the file; the file over the defaults.
        assert_eq!(c.max_rolling_batch_size, 3);
        assert_eq!(c.max_loras, 2);
        assert_eq!(c.kv_cache_bytes, 8 << 20);
        std::fs::write(dir.join("serving.properties"), "option.max_loras=none\n").unwrap();
        let e = config_for_model(&base, &url, &Default::default()).unwrap_err();
        assert!(format!("{e:#}").contains("serving.properties"), "{e:#}");
    }

    #[test]
    fn several_models_on_a_gpu_need_kv_cache_bytes() {
        let load = |opts: &[&str]| {
            let cli = super::super::ServeArgs {
                options: opts.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            };
            super::super::ServingConfig::load(&cli, &Default::default(), None)
        };
        let e = load(&["option.device=cuda", "option.models=b=/b"]).unwrap_err();
        assert!(e.to_string().contains("option.kv_cache_bytes"), "{e}");
        load(&[
            "option.device=cuda",
            "option.models=b=/b",
            "option.kv_cache_bytes=1G",
        ])
        .unwrap();
        load(&["option.device=cuda"]).unwrap();
    }

    #[test]
    fn limits_are_checked() {
        let c = parse(
            &raw(&[
                ("option.max_loaded_models", "2"),
                ("option.models_memory", "3G"),
                ("option.model_load_timeout", "5"),
                ("option.evict_wait", "0"),
            ]),
            Some(&"true".to_string()),
        )
        .unwrap();
        assert_eq!(c.max_loaded, Some(2));
        assert_eq!(c.memory_budget, Some(3 << 30));
        assert_eq!(c.load_timeout, Duration::from_secs(5));
        assert_eq!(c.evict_wait, Duration::ZERO);
        assert!(c.sagemaker_multi_model && c.is_multi());
        let e = parse(&raw(&[("option.max_loaded_models", "0")]), None).unwrap_err();
        assert!(e.to_string().contains("positive"), "{e}");
        let e = parse(&raw(&[("option.models_dir", "/no/such/dir")]), None).unwrap_err();
        assert!(e.to_string().contains("no such directory"), "{e}");
        let e = parse(&raw(&[]), Some(&"yes".to_string())).unwrap_err();
        assert!(e.to_string().contains("SAGEMAKER_MULTI_MODEL"), "{e}");
    }
}
