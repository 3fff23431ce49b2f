//! Constrained decoding through `llguidance`: JSON schemas, regexes, choices and Lark grammars
//! compiled against the model's vocabulary, one matcher per sequence. A matcher gives the
//! allowed-token bitset for the next draw (computed on a worker thread while the forward pass
//! runs, see `Scheduler::step`) and consumes each sampled token.
//!
//! The vocabulary's bytes come from the model's `tokenizer.json` (llguidance's own reader;
//! this spares a second `tokenizers` crate that `toktrie_hf_tokenizers` would pull in), and
//! strings the grammar forces are tokenized with the model's tokenizer.

use std::path::Path;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use lmi_text::Tokenizer;

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON schema (draft 2020-12 subset llguidance supports).
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
}

impl GrammarSpec {
    fn to_grammar(&self) -> Result<TopLevelGrammar, String> {
        Ok(match self {
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())?),
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))?)
            }
            GrammarSpec::Regex(r) => {
                regex_syntax::Parser::new()
                    .parse(r)
                    .map_err(|e| format!("invalid regex: {e}"))?;
                TopLevelGrammar::from_regex(r)
            }
            GrammarSpec::Choice(options) => {
                if options.is_empty() {
                    return Err("the choice list is empty".into());
                }
                let alternatives: Vec<String> =
                    options.iter().map(|o| regex_syntax::escape(o)).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// JSON without whitespace between tokens (`{"a":1,"b":[2,3]}`), unless the schema sets its own
/// `x-guidance` options: free whitespace lets a model pad forever and never close the object
/// within `max_new_tokens`, which is the failure users of constrained JSON report most.
fn compact(mut schema: serde_json::Value) -> Result<serde_json::Value, String> {
    let Some(obj) = schema.as_object_mut() else {
        return match schema {
            // `true` / `false` are valid schemas, but they have no room for options.
            serde_json::Value::Bool(_) => Ok(schema),
            _ => Err("a JSON schema must be an object or a boolean".into()),
        };
    };
    obj.entry("x-guidance")
        .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    Ok(schema)
}

/// The model's vocabulary as llguidance sees it.
struct Vocab {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s)
            .ok()
            .and_then(|t| self.tokenizer.encode(t, false).ok())
        {
            Some(ids) => ids,
            None => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one model; cheap to share.
pub struct Guide {
    factory: Arc<ParserFactory>,
    vocab_size: usize,
}

/// A compiled grammar: each sequence that uses it starts from a copy of this matcher.
#[derive(Clone)]
pub struct Grammar {
    start: Arc<std::sync::Mutex<Matcher>>,
    words: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    /// A fresh matcher for one sequence.
    pub fn start(&self) -> SeqConstraint {
        let m = self
            .start
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deep_clone();
        SeqConstraint {
            matcher: m,
            words: self.words,
        }
    }
}

impl Guide {
    /// From the model directory's `tokenizer.json`, the model's vocabulary size (which may
    /// exceed the tokenizer's) and its end-of-sequence ids.
    pub fn new(
        model_dir: &Path,
        tokenizer: Tokenizer,
        vocab_size: usize,
        eos: &[u32],
    ) -> Result<Self, String> {
        let path = model_dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut bytes = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        bytes.resize(vocab_size.max(bytes.len()), Vec::new());
        bytes.truncate(vocab_size);
        let first_eos = eos.first().copied().unwrap_or(0);
        let trie = TokTrie::from(&TokRxInfo::new(vocab_size as u32, first_eos), &bytes)
            .with_eos_tokens(eos);
        let env: TokEnv = Arc::new(Vocab { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Guide {
            factory: Arc::new(factory),
            vocab_size,
        })
    }

    /// Compiles `spec`; the error says what is wrong with it (invalid schema or regex, a
    /// JSON-schema feature llguidance does not implement, ...).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, String> {
        let parser = self
            .factory
            .create_parser(spec.to_grammar()?)
            .map_err(|e| e.to_string())?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(e);
        }
        Ok(Grammar {
            start: Arc::new(std::sync::Mutex::new(m)),
            words: self.vocab_size.div_ceil(32),
        })
    }
}

/// One sequence's position in its grammar.
pub struct SeqConstraint {
    matcher: Matcher,
    words: usize,
}

impl SeqConstraint {
    /// The tokens allowed next (end-of-sequence ids once the grammar is complete), as a
    /// bitset over the model's vocabulary.
    pub fn mask(&mut self) -> Result<Vec<u32>, String> {
        let v = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        let mut bits = v.as_slice().to_vec();
        bits.resize(self.words, 0);
        Ok(bits)
    }

    /// Moves past a sampled token.
    pub fn commit(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// An independent copy (a parallel sequence forked off this one).
    pub fn fork(&self) -> Self {
        SeqConstraint {
            matcher: self.matcher.deep_clone(),
            words: self.words,
        }
    }
}
