//! `--engine null`: an engine that emits tokens without computing, to benchmark the front end
//! (HTTP, parsing, tokenization, scheduler, detokenization, formatting) alone. It keeps the
//! real model's config and tokenizer; each draw returns the next token of a cycle through the
//! ids of an ordinary English text (no logits, no sampling), so outputs detokenize to real
//! words. Prompt logprobs come back as 0.
//! The token depends only on the sequence's position, so outputs are the same alone or in any
//! batch. EOS never comes: requests run to max_new_tokens.

use std::collections::HashSet;
use std::path::Path;

use lmi_checkpoint::config::ModelConfig;
use lmi_engine::engine::StepEngine;
use lmi_engine::error::{EngineError, Result};
use lmi_engine::kv::KvCacheConfig;
use lmi_engine::lora::LoraWeights;
use lmi_engine::sampling::Sampled;
use lmi_engine::{StepBatch, StepOutput, TokenLogprob};
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

    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput> {
        let samples = batch
            .samples
            .iter()
            .map(|r| {
                let c = batch.chunks.get(r.chunk).ok_or_else(|| {
                    EngineError::Batch(format!("sample request names chunk {}", r.chunk))
                })?;
                Ok(Sampled {
                    token: self.token_at(c.start_pos + r.position + 1),
                    logprob: 0.0,
                    top: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let prompt_logprobs = batch
            .prompt_logprobs
            .iter()
            .map(|p| {
                let zero = TokenLogprob {
                    logprob: 0.0,
                    top: Vec::new(),
                };
                vec![zero; p.targets.len()]
            })
            .collect();
        self.tokens_computed += batch
            .chunks
            .iter()
            .map(|c| c.tokens.len() as u64)
            .sum::<u64>();
        Ok(StepOutput {
            samples,
            prompt_logprobs,
            pooled: Vec::new(),
            drafts: Vec::new(),
            sample_time: Default::default(),
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

    fn load_adapter(&mut self, id: u64, _weights: &LoraWeights) -> Result<()> {
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
    use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
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
                Event::Prefill(_) | Event::Pooled(_) => {}
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
    fn draws_follow_the_cycle() {
        use lmi_engine::sampling::{SamplingParams, SequenceContext};
        use lmi_engine::{LogitsWanted, PromptLogprobRequest, SampleRequest, SeqChunk};
        let (dir, tok) = tiny();
        let mut e = NullEngine::load(dir.path(), &tok, 1 << 20).unwrap();
        let chunk = |n: usize, start: usize, logits| SeqChunk {
            tokens: vec![1; n],
            start_pos: start,
            block_table: vec![0, 1],
            window_table: Vec::new(),
            logits,
            adapter: None,
        };
        let chunks = [
            chunk(4, 0, LogitsWanted::None),
            chunk(1, 7, LogitsWanted::Last),
            chunk(3, 0, LogitsWanted::All),
        ];
        let params = SamplingParams::default();
        let draw = |chunk, position| SampleRequest {
            chunk,
            position,
            params: &params,
            seed: 0,
            ctx: SequenceContext::default(),
            allowed: None,
        };
        let out = e
            .step(&StepBatch {
                chunks: &chunks,
                samples: &[draw(1, 0), draw(2, 2), draw(2, 2)],
                prompt_logprobs: &[PromptLogprobRequest {
                    chunk: 2,
                    targets: &[1, 1],
                    top_n: 0,
                }],
                media: &[],
                rope_deltas: &[],
                states: &[],
                pools: &[],
                mtp: &[],
            })
            .unwrap();
        let tokens: Vec<u32> = out.samples.iter().map(|s| s.token).collect();
        assert_eq!(tokens, vec![e.token_at(8), e.token_at(3), e.token_at(3)]);
        assert_eq!(out.prompt_logprobs.len(), 1);
        assert_eq!(out.prompt_logprobs[0].len(), 2);
        assert_eq!(e.tokens_computed(), 8);
    }
}
