//! Compiles requests' output constraints against the model's vocabulary, before anything is
//! queued, and keeps the recently used ones: clients tend to send the same schema with every
//! request, and compiling a schema costs milliseconds while starting from a compiled one costs
//! microseconds.

use std::collections::HashMap;
use std::sync::Mutex;

use lmi_api::{ApiError, Constraint};
use lmi_scheduler::constraint::{Grammar, GrammarSpec, Guide};

/// Compiled grammars kept.
const CACHED: usize = 64;

pub struct Grammars {
    /// Why there is no guide, when the model's vocabulary could not be read.
    guide: Result<Guide, String>,
    cache: Mutex<Cache>,
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
    pub fn new(guide: Result<Guide, String>) -> Self {
        if let Err(e) = &guide {
            tracing::warn!("structured output is unavailable for this model: {e}");
        }
        Grammars {
            guide,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// False when the model's vocabulary could not be read for constraints.
    pub fn available(&self) -> bool {
        self.guide.is_ok()
    }

    /// The compiled form of `c`; a 4xx that says what is wrong when it does not compile.
    pub fn compile(&self, c: &Constraint) -> Result<Grammar, ApiError> {
        let guide = self.guide.as_ref().map_err(|e| {
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
