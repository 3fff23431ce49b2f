//! `--engine null`: an engine that emits tokens without computing, to benchmark the front end
//! (HTTP, parsing, tokenization, scheduler, detokenization, formatting) alone. It keeps the
//! real model's config and tokenizer; each step returns the next tokens themselves (no logits,
//! so no sampling), cycling through the ids of an ordinary English text, so outputs detokenize
//! to real words.
//! The token depends only on the sequence's position, so outputs are the same alone or in any
//! batch. EOS never comes: requests run to max_new_tokens.

use std::collections::HashSet;
use std::path::Path;

use lmi_engine::batch::{LogitsWanted, SeqChunk};
use lmi_engine::config::ModelConfig;
use lmi_engine::engine::{Logits, StepEngine};
use lmi_engine::error::{EngineError, Result};
use lmi_engine::kv::KvCacheConfig;
use lmi_text::Tokenizer;

/// The text the null engine "generates", over and over.
const TEXT: &str = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles \
begins with a single step. All that glitters is not gold, and not all those who wander are \
lost. Knowledge speaks, but wisdom listens. The best way to predict the future is to invent it. ";

pub struct NullEngine {
    config: ModelConfig,
    num_blocks: usize,
    cycle: Vec<u32>,
    tokens_computed: u64,
    adapters: HashSet<u64>,
}

impl NullEngine {
    /// `kv_cache_bytes` sizes the (imaginary) block pool as the real engine would at 4 bytes
    /// per element, so admission behaves alike.
    pub fn new(config: ModelConfig, tokenizer: &Tokenizer, kv_cache_bytes: usize) -> Result<Self> {
        let vocab = config.vocab_size;
        let eos = tokenizer.eos_token_ids();
        let cycle: Vec<u32> = tokenizer
            .encode(TEXT, false)
            .map_err(|e| EngineError::Backend(format!("null engine: tokenizing its text: {e}")))?
            .into_iter()
            .filter(|&id| (id as usize) < vocab && !eos.contains(&id) && !tokenizer.is_special(id))
            .collect();
        if cycle.is_empty() {
            return Err(EngineError::Backend(
                "null engine: the tokenizer gives no ordinary token ids for English text".into(),
            ));
        }
        let num_blocks = KvCacheConfig::blocks_for_budget(&config, 4, kv_cache_bytes).max(1);
        Ok(NullEngine {
            config,
            num_blocks,
            cycle,
            tokens_computed: 0,
            adapters: HashSet::new(),
        })
    }

    /// Loads the model's config.json and builds the engine.
    pub fn load(dir: &Path, tokenizer: &Tokenizer, kv_cache_bytes: usize) -> Result<Self> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        Self::new(config, tokenizer, kv_cache_bytes)
    }

    /// The token the engine emits after `context_len` tokens of a sequence.
    pub fn token_at(&self, context_len: usize) -> u32 {
        self.cycle[context_len % self.cycle.len()]
    }
}

impl StepEngine for NullEngine {
    fn model_config(&self) -> &ModelConfig {
        &self.config
    }

    fn backend_name(&self) -> &'static str {
        "null"
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn step(&mut self, chunks: &[SeqChunk]) -> Result<Logits> {
        let vocab = self.config.vocab_size;
        let mut rows_per_seq = Vec::with_capacity(chunks.len());
        let mut hot = Vec::new();
        for c in chunks {
            let end = c.start_pos + c.tokens.len();
            let rows = match c.logits {
                LogitsWanted::None => 0,
                LogitsWanted::Last => 1.min(c.tokens.len()),
                LogitsWanted::All => c.tokens.len(),
            };
            for r in 0..rows {
                hot.push(self.token_at(end - rows + r + 1));
            }
            rows_per_seq.push(rows as u32);
            self.tokens_computed += c.tokens.len() as u64;
        }
        // Tokens, not logits: the sampler is not part of the front end being measured.
        Ok(Logits {
            data: Vec::new(),
            vocab,
            rows_per_seq,
            tokens: Some(hot),
        })
    }

    fn copy_blocks(&mut self, _pairs: &[(u32, u32)]) -> Result<()> {
        Ok(())
    }

    fn weight_bytes(&self) -> usize {
        0
    }

    fn tokens_computed(&self) -> u64 {
        self.tokens_computed
    }

    fn load_adapter(&mut self, id: u64, path: &Path) -> Result<()> {
        if !path.exists() {
            return Err(EngineError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such adapter"),
            ));
        }
        self.adapters.insert(id);
        Ok(())
    }

    fn unload_adapter(&mut self, id: u64) -> bool {
        self.adapters.remove(&id)
    }

    fn has_adapter(&self, id: u64) -> bool {
        self.adapters.contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_engine::testing::{TinySpec, write_tiny_model};
    use lmi_scheduler::{Event, GenerateRequest, Handle, SchedulerConfig};

    fn tiny() -> (tempfile::TempDir, Tokenizer) {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path(), &TinySpec::llama()).unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        (dir, tok)
    }

    fn run(handle: &Handle, prompt: &str, tok: &Tokenizer, n: usize) -> (String, usize) {
        let mut req = GenerateRequest::new(tok.encode(prompt, false).unwrap());
        req.stopping.max_new_tokens = n;
        let mut s = handle.submit(req).unwrap();
        let mut text = String::new();
        while let Some(ev) = s.blocking_recv() {
            match ev {
                Event::Token(t) => text.push_str(&t.text),
                Event::Finished(f) => return (f.text, f.generated_tokens),
                Event::Error(e) => panic!("{e}"),
                Event::Prefill(_) => {}
            }
        }
        panic!("stream ended without Finished ({text})")
    }

    #[test]
    fn emits_the_cycled_text_through_the_real_scheduler() {
        let (dir, tok) = tiny();
        let engine = NullEngine::load(dir.path(), &tok, 1 << 20).unwrap();
        let expected: Vec<u32> = (0..20).map(|i| engine.token_at(3 + i)).collect();
        let handle = Handle::spawn(Box::new(engine), tok.clone(), SchedulerConfig::default());
        // 3 prompt tokens: the generated tokens are the cycle from index 3 on.
        let (text, n) = run(&handle, "abc", &tok, 20);
        assert_eq!(n, 20);
        assert_eq!(text, tok.decode(&expected, true).unwrap());
        assert!(
            text.chars().filter(|c| c.is_ascii_alphabetic()).count() > 10,
            "{text:?}"
        );
        // Deterministic: same prompt length, same output.
        assert_eq!(run(&handle, "xyz", &tok, 20).0, text);
        handle.shutdown();
    }

    #[test]
    fn rows_follow_logits_wanted() {
        let (dir, tok) = tiny();
        let mut e = NullEngine::load(dir.path(), &tok, 1 << 20).unwrap();
        let chunk = |n: usize, start: usize, logits| SeqChunk {
            tokens: vec![1; n],
            start_pos: start,
            block_table: vec![0, 1],
            logits,
            adapter: None,
        };
        let out = e
            .step(&[
                chunk(4, 0, LogitsWanted::None),
                chunk(1, 7, LogitsWanted::Last),
                chunk(3, 0, LogitsWanted::All),
            ])
            .unwrap();
        assert_eq!(out.rows_per_seq, vec![0, 1, 3]);
        assert_eq!(out.num_rows(), 4);
        let t = out.tokens.as_ref().expect("the null engine returns tokens");
        assert_eq!(t[0], e.token_at(8));
        assert_eq!(t[1], e.token_at(1));
        assert_eq!(t[3], e.token_at(3));
        assert!(out.data.is_empty(), "no logits are computed");
        assert_eq!(e.tokens_computed(), 8);
    }
}
