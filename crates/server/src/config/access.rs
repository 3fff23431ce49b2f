//! Access control and request limits: API keys, CORS, the per-request time limit and the
//! request-shape limits (`option.api_key`, `LMI_API_KEYS`, `option.cors_allow_origin`, ...).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};

use super::{EnvVars, Setting, positive};

/// Environment variable with API keys (comma-separated), read besides `option.api_key`.
pub const API_KEYS_ENV: &str = "LMI_API_KEYS";
/// Environment variable naming a file of API keys (one per line, `#` comments).
pub const API_KEYS_FILE_ENV: &str = "LMI_API_KEYS_FILE";

#[derive(Clone, Default)]
pub struct AccessConfig {
    /// Accepted API keys; empty: no key needed. Never printed.
    pub api_keys: Vec<String>,
    /// `/metrics` needs a key too (option.protect_metrics).
    pub protect_metrics: bool,
    /// Origins allowed by CORS (option.cors_allow_origin, comma-separated, or `*`); empty: off.
    pub cors_allow_origin: Vec<String>,
    /// Longest time a request may take, queueing and streaming included
    /// (option.request_timeout, seconds; unset or 0: none).
    pub request_timeout: Option<Duration>,
    /// Most sequences (max of `n`, `best_of`) one request may ask for
    /// (option.max_sequences_per_request, default 16).
    pub max_sequences_per_request: usize,
    /// Longest request target (path + query) in bytes; longer ones get 414 (option.max_uri_bytes).
    pub max_uri_bytes: usize,
    /// Largest total of header names and values in bytes; more gets 431 (option.max_header_bytes).
    pub max_header_bytes: usize,
}

impl std::fmt::Debug for AccessConfig {
    // The keys themselves never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessConfig")
            .field("api_keys", &format_args!("{} key(s)", self.api_keys.len()))
            .field("protect_metrics", &self.protect_metrics)
            .field("cors_allow_origin", &self.cors_allow_origin)
            .field("request_timeout", &self.request_timeout)
            .field("max_sequences_per_request", &self.max_sequences_per_request)
            .field("max_uri_bytes", &self.max_uri_bytes)
            .field("max_header_bytes", &self.max_header_bytes)
            .finish()
    }
}

/// Keys whose values are secrets: shown as `<hidden>` in the printed configuration.
pub const SECRET_KEYS: &[&str] = &["option.api_key"];

fn split_keys(list: &str) -> impl Iterator<Item = String> + '_ {
    list.split([',', '\n'])
        .map(str::trim)
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .map(str::to_string)
}

fn read_key_file(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading API keys from {}", path.display()))?;
    Ok(split_keys(&text).collect())
}

impl AccessConfig {
    pub fn load(raw: &BTreeMap<String, Setting>, env: &EnvVars) -> anyhow::Result<Self> {
        let value = |k: &str| raw.get(k).map(|s| s.value.trim().to_string());
        let mut api_keys: Vec<String> = Vec::new();
        if let Some(v) = value("option.api_key") {
            api_keys.extend(split_keys(&v));
        }
        if let Some(v) = env.get(API_KEYS_ENV) {
            api_keys.extend(split_keys(v));
        }
        let files = [
            value("option.api_key_file"),
            env.get(API_KEYS_FILE_ENV).cloned(),
        ];
        for f in files.into_iter().flatten().filter(|f| !f.is_empty()) {
            let keys = read_key_file(Path::new(&f))?;
            if keys.is_empty() {
                bail!("API key file {f}: no keys in it");
            }
            api_keys.extend(keys);
        }
        if let Some(k) = api_keys.iter().find(|k| k.chars().any(char::is_whitespace)) {
            bail!(
                "an API key contains whitespace ({} characters long): keys are single tokens",
                k.len()
            );
        }
        api_keys.sort();
        api_keys.dedup();
        let cors_allow_origin = value("option.cors_allow_origin")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|o| !o.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let request_timeout = match raw.get("option.request_timeout") {
            None => None,
            Some(s) => {
                let secs: f64 = s
                    .value
                    .trim()
                    .parse()
                    .ok()
                    .filter(|v: &f64| *v >= 0.0 && v.is_finite())
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "option.request_timeout={:?} ({}): expected seconds (0 for none)",
                            s.value,
                            s.source
                        )
                    })?;
                (secs > 0.0).then(|| Duration::from_secs_f64(secs))
            }
        };
        let protect_metrics = super::boolean(raw, "option.protect_metrics")?;
        Ok(AccessConfig {
            api_keys,
            protect_metrics,
            cors_allow_origin,
            request_timeout,
            max_sequences_per_request: positive(raw, "option.max_sequences_per_request", 16)?,
            max_uri_bytes: positive(raw, "option.max_uri_bytes", 8192)?,
            max_header_bytes: positive(raw, "option.max_header_bytes", 32 * 1024)?,
        })
    }

    /// Lines for the printed configuration (the keys are counted, not shown).
    pub fn summary(&self) -> Vec<(&'static str, String)> {
        let cors = if self.cors_allow_origin.is_empty() {
            "(off)".to_string()
        } else {
            self.cors_allow_origin.join(",")
        };
        vec![
            (
                "api keys",
                match self.api_keys.len() {
                    0 => "(none: open)".into(),
                    n => format!("{n} (protect_metrics {})", self.protect_metrics),
                },
            ),
            ("cors_allow_origin", cors),
            (
                "request_timeout",
                self.request_timeout
                    .map(|d| format!("{} s", d.as_secs_f64()))
                    .unwrap_or_else(|| "(none)".into()),
            ),
            (
                "max_sequences_per_request",
                self.max_sequences_per_request.to_string(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ServeArgs, ServingConfig};

    fn env(pairs: &[(&str, &str)]) -> EnvVars {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn keys_from_flag_env_and_file_are_merged_and_hidden() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("keys");
        std::fs::write(&file, "# team keys\nk-file-1\n\nk-file-2\n").unwrap();
        let cli = ServeArgs {
            api_key: Some("k-cli".into()),
            ..Default::default()
        };
        let e = env(&[
            ("LMI_API_KEYS", "k-env-1, k-env-2"),
            ("LMI_API_KEYS_FILE", file.to_str().unwrap()),
        ]);
        let c = ServingConfig::load(&cli, &e, None).unwrap();
        assert_eq!(
            c.access.api_keys,
            ["k-cli", "k-env-1", "k-env-2", "k-file-1", "k-file-2"]
        );
        let printed = format!("{}{:?}", c.summary(), c.access);
        assert!(
            !printed.contains("k-cli") && !printed.contains("k-env-1"),
            "{printed}"
        );
        assert!(printed.contains("<hidden>"), "{printed}");
    }

    #[test]
    fn defaults_are_open_and_unlimited_in_time() {
        let c = ServingConfig::load(&ServeArgs::default(), &env(&[]), None).unwrap();
        assert!(c.access.api_keys.is_empty() && c.access.cors_allow_origin.is_empty());
        assert_eq!(c.access.request_timeout, None);
        assert!(!c.access.protect_metrics);
        assert_eq!(c.access.max_sequences_per_request, 16);
    }

    #[test]
    fn timeout_cors_and_bad_values() {
        let cli = ServeArgs {
            options: vec![
                "option.request_timeout=1.5".into(),
                "option.cors_allow_origin=http://a.example, http://b.example".into(),
            ],
            ..Default::default()
        };
        let c = ServingConfig::load(&cli, &env(&[]), None).unwrap();
        assert_eq!(c.access.request_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(
            c.access.cors_allow_origin,
            ["http://a.example", "http://b.example"]
        );
        let bad = ServeArgs {
            options: vec!["option.request_timeout=soon".into()],
            ..Default::default()
        };
        let err = ServingConfig::load(&bad, &env(&[]), None).unwrap_err();
        assert!(err.to_string().contains("option.request_timeout"), "{err}");
        let missing = env(&[("LMI_API_KEYS_FILE", "/nonexistent/keys")]);
        assert!(ServingConfig::load(&ServeArgs::default(), &missing, None).is_err());
    }
}
