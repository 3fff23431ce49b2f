//! Compiles requests' output constraints against the model's vocabulary, before anything is
//! queued, and keeps the recently used ones: clients tend to send the same schema with every
//! request, and compiling a schema costs milliseconds while starting from a compiled one costs
//! microseconds.
//!
//! The guide (the vocabulary's token trie and llguidance's parser factory: about 33 MiB and a
//! quarter of a second for a 49k vocabulary) is built at the first constrained request, as
//! vLLM builds its grammar backend: most deployments never ask for one, and the memory a model
//! takes should be its weights and KV cache.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use lmi_api::{ApiError, Constraint};
use lmi_scheduler::constraint::{Grammar, GrammarSpec, Guide};
use lmi_text::Tokenizer;

/// Compiled grammars kept.
const CACHED: usize = 64;

pub struct Grammars {
    source: GuideSource,
    /// Built at first use; the error says why there is none (the vocabulary could not be read).
    guide: OnceLock<Result<Guide, String>>,
    cache: Mutex<Cache>,
}

/// What the guide is built from.
pub struct GuideSource {
    pub model_dir: PathBuf,
    pub tokenizer: Tokenizer,
    pub vocab_size: usize,
    pub eos: Vec<u32>,
}

impl GuideSource {
    fn build(&self) -> Result<Guide, String> {
        let started = std::time::Instant::now();
        let guide = Guide::new(
            &self.model_dir,
            self.tokenizer.clone(),
            self.vocab_size,
            &self.eos,
        );
        match &guide {
            Ok(_) => tracing::info!(
                "structured output: vocabulary indexed in {:.0?}",
                started.elapsed()
            ),
            Err(e) => tracing::warn!("structured output is unavailable for this model: {e}"),
        }
        guide
    }
}

#[derive(Default)]
struct Cache {
    tick: u64,
    entries: HashMap<String, (Grammar, u64)>,
}

fn spec(c: &Constraint) -> GrammarSpec {
    match c {
        Constraint::JsonSchema(s) => GrammarSpec::JsonSchema(s.clone()),
        Constraint::JsonObject => GrammarSpec::JsonObject,
        Constraint::Regex(r) => GrammarSpec::Regex(r.clone()),
        Constraint::Choice(c) => GrammarSpec::Choice(c.clone()),
        Constraint::Grammar(g) => GrammarSpec::Lark(g.clone()),
    }
}

impl Grammars {
    /// Grammars over `source`'s vocabulary; nothing is read until the first constraint.
    pub fn new(source: GuideSource) -> Self {
        Grammars {
            source,
            guide: OnceLock::new(),
            cache: Mutex::new(Cache::default()),
        }
    }

    /// False when the model's vocabulary could not be read for constraints (before the first
    /// constraint: when the model has no `tokenizer.json`, which the guide reads).
    pub fn available(&self) -> bool {
        match self.guide.get() {
            Some(g) => g.is_ok(),
            None => self.source.model_dir.join("tokenizer.json").is_file(),
        }
    }

    /// The compiled form of `c`; a 4xx that says what is wrong when it does not compile.
    pub fn compile(&self, c: &Constraint) -> Result<Grammar, ApiError> {
        let guide = self.guide.get_or_init(|| self.source.build());
        let guide = guide.as_ref().map_err(|e| {
            ApiError::validation(format!(
                "structured output is unavailable for this model: {e}"
            ))
        })?;
        let key = serde_json::to_string(c).map_err(|e| ApiError::internal(e.to_string()))?;
        if let Some(g) = self.lookup(&key) {
            return Ok(g);
        }
        let g = guide.compile(&spec(c)).map_err(|e| {
            let what = match c {
                Constraint::JsonSchema(_) | Constraint::JsonObject => "JSON schema",
                Constraint::Regex(_) => "regex",
                Constraint::Choice(_) => "choice list",
                Constraint::Grammar(_) => "grammar",
            };
            ApiError::validation(format!("the {what} cannot be used: {e}"))
        })?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.entries.len() >= CACHED
            && let Some(oldest) = cache
                .entries
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
        {
            cache.entries.remove(&oldest);
        }
        cache.tick += 1;
        let t = cache.tick;
        cache.entries.insert(key, (g.clone(), t));
        Ok(g)
    }

    fn lookup(&self, key: &str) -> Option<Grammar> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.tick += 1;
        let t = cache.tick;
        let (g, used) = cache.entries.get_mut(key)?;
        *used = t;
        Some(g.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grammars(dir: &std::path::Path) -> Grammars {
        Grammars::new(GuideSource {
            model_dir: dir.to_path_buf(),
            tokenizer: Tokenizer::from_dir(dir).unwrap(),
            vocab_size: 260,
            eos: vec![258],
        })
    }

    #[test]
    fn the_guide_is_built_at_the_first_constraint_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        lmi_checkpoint::testing::write_tiny_tokenizer(dir.path()).unwrap();
        let g = grammars(dir.path());
        assert!(g.available());
        assert!(
            g.guide.get().is_none(),
            "nothing is built before a constraint"
        );
        g.compile(&Constraint::Regex("ab+".into())).unwrap();
        assert!(g.guide.get().is_some_and(Result::is_ok));
        g.compile(&Constraint::Choice(vec!["yes".into(), "no".into()]))
            .unwrap();
        assert!(g.available());
    }

    #[test]
    fn an_unreadable_vocabulary_is_a_clear_error_and_unavailable_after() {
        let dir = tempfile::tempdir().unwrap();
        lmi_checkpoint::testing::write_tiny_tokenizer(dir.path()).unwrap();
        let g = grammars(dir.path());
        std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
        assert!(g.available(), "not known before the first constraint");
        let e = g.compile(&Constraint::Regex("a".into())).unwrap_err();
        assert!(
            e.to_string()
                .contains("structured output is unavailable for this model"),
            "{e}"
        );
        assert!(!g.available());
    }
}
