//! The Hub settings huggingface_hub reads from the environment, read the same way so that a
//! cache one fills the other uses: endpoint, token, cache directory, offline mode.

use std::path::PathBuf;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where the Hub is, who we are to it, where its files are kept, and whether to ask it at all.
#[derive(Clone)]
pub struct HubConfig {
    /// `HF_ENDPOINT`, without a trailing slash.
    pub endpoint: String,
    pub token: Option<Token>,
    /// The standard cache (`models--org--name/{blobs,refs,snapshots}`).
    pub cache: PathBuf,
    /// `HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE`: read the cache only.
    pub offline: bool,
}

/// An access token and the variable or file it came from. Never printed whole.
#[derive(Clone)]
pub struct Token {
    pub(crate) value: String,
    pub from: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (from {})", self.masked(), self.from)
    }
}

impl std::fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token)
            .field("cache", &self.cache)
            .field("offline", &self.offline)
            .finish()
    }
}

impl Token {
    pub fn new(value: impl Into<String>, from: impl Into<String>) -> Self {
        Token {
            value: value.into(),
            from: from.into(),
        }
    }

    /// `hf_…` and the last four characters, as huggingface_hub's `hf auth whoami` shows.
    pub fn masked(&self) -> String {
        let v = &self.value;
        let tail: String = v
            .chars()
            .rev()
            .take(4)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if v.chars().count() <= 8 {
            "****".into()
        } else {
            format!("{}…{tail}", v.chars().take(3).collect::<String>())
        }
    }
}

impl HubConfig {
    /// From the process environment.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From any variable lookup (tests pass a map).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let home = get("HOME").map(PathBuf::from);
        // huggingface_hub: HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface.
        let hf_home = get("HF_HOME").map(PathBuf::from).or_else(|| {
            get("XDG_CACHE_HOME")
                .map(|x| PathBuf::from(x).join("huggingface"))
                .or_else(|| home.map(|h| h.join(".cache").join("huggingface")))
        });
        let cache = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        let token = get("HF_TOKEN")
            .map(|t| Token::new(t.trim(), "HF_TOKEN"))
            .or_else(|| {
                get("HUGGING_FACE_HUB_TOKEN")
                    .map(|t| Token::new(t.trim(), "HUGGING_FACE_HUB_TOKEN"))
            })
            .or_else(|| {
                let path = get("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .or_else(|| hf_home.as_ref().map(|h| h.join("token")))?;
                let text = std::fs::read_to_string(&path).ok()?;
                let t = text.trim();
                (!t.is_empty()).then(|| Token::new(t, path.display().to_string()))
            });
        let truthy = |k: &str| {
            get(k).is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_uppercase().as_str(),
                    "1" | "ON" | "YES" | "TRUE"
                )
            })
        };
        HubConfig {
            endpoint: get("HF_ENDPOINT")
                .map(|e| e.trim().trim_end_matches('/').to_string())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            token,
            cache,
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
        }
    }

    /// One line for the effective configuration: endpoint, token (masked), cache, offline.
    pub fn summary(&self) -> String {
        let token = match &self.token {
            Some(t) => format!("{} (from {})", t.masked(), t.from),
            None => "(none)".into(),
        };
        format!(
            "{} token {token}, cache {}{}",
            self.endpoint,
            self.cache.display(),
            if self.offline { ", offline" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> HubConfig {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubConfig::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn cache_and_endpoint_follow_huggingface_hub() {
        let c = config(&[("HOME", "/home/u")]);
        assert_eq!(c.cache, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert!(!c.offline && c.token.is_none());
        let c = config(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x")]);
        assert_eq!(c.cache, PathBuf::from("/x/huggingface/hub"));
        let c = config(&[("HF_HOME", "/hf"), ("XDG_CACHE_HOME", "/x")]);
        assert_eq!(c.cache, PathBuf::from("/hf/hub"));
        let c = config(&[("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/old")]);
        assert_eq!(c.cache, PathBuf::from("/old"));
        let c = config(&[("HUGGINGFACE_HUB_CACHE", "/old"), ("HF_HUB_CACHE", "/new")]);
        assert_eq!(c.cache, PathBuf::from("/new"));
        let c = config(&[
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_HUB_OFFLINE", "1"),
        ]);
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert!(c.offline);
        assert!(config(&[("TRANSFORMERS_OFFLINE", "yes")]).offline);
        assert!(!config(&[("HF_HUB_OFFLINE", "0")]).offline);
    }

    #[test]
    fn token_order_and_masking() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap();
        std::fs::write(dir.path().join("token"), "hf_fromhomefile0000\n").unwrap();
        let file = dir.path().join("other");
        std::fs::write(&file, "hf_frompathfile1111").unwrap();
        let file = file.to_str().unwrap();
        let t = |vars: &[(&str, &str)]| config(vars).token.map(|t| (t.value, t.from));
        assert_eq!(t(&[("HF_HOME", home)]).unwrap().0, "hf_fromhomefile0000");
        assert_eq!(
            t(&[("HF_HOME", home), ("HF_TOKEN_PATH", file)]).unwrap().0,
            "hf_frompathfile1111"
        );
        let both = [
            ("HF_HOME", home),
            ("HUGGING_FACE_HUB_TOKEN", "hf_legacy"),
            ("HF_TOKEN", "hf_new"),
        ];
        assert_eq!(t(&both).unwrap(), ("hf_new".into(), "HF_TOKEN".into()));
        assert_eq!(t(&both[..2]).unwrap().0, "hf_legacy");
        let c = config(&[("HF_TOKEN", "hf_abcdefghijklmnopWXYZ")]);
        let shown = c.summary();
        assert!(shown.contains("hf_…WXYZ"), "{shown}");
        assert!(!shown.contains("abcdefgh"), "{shown}");
        assert!(!format!("{c:?}").contains("abcdefgh"));
    }
}
