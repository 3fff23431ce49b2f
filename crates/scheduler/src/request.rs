//! What a caller submits: the prompt (token ids, and media spans) and every generation
//! control, already validated and tokenized by the front end.

use std::sync::{Arc, OnceLock};

use lmi_engine_core::lora::LoraWeights;
use lmi_engine_core::sampling::SamplingParams;

use crate::prompt::Prompt;

/// An opaque adapter id; prefix-cache hashes are keyed by it (KV differs per adapter). Ids
/// are never reused for other weights.
pub type AdapterId = u64;

/// An adapter's host weights, filled once by whoever reads them from disk (off the
/// scheduler thread); a request whose adapter is still loading waits in the queue.
#[derive(Debug, Default)]
pub struct AdapterWeights(OnceLock<Result<Arc<LoraWeights>, String>>);

impl AdapterWeights {
    /// Weights still being read.
    pub fn pending() -> Self {
        Self::default()
    }

    pub fn ready(w: Arc<LoraWeights>) -> Self {
        let cell = OnceLock::new();
        let _ = cell.set(Ok(w));
        AdapterWeights(cell)
    }

    /// Completes a pending load (the first call wins).
    pub fn set(&self, r: Result<Arc<LoraWeights>, String>) {
        let _ = self.0.set(r);
    }

    /// None while loading; the weights, or why they could not be read.
    pub fn get(&self) -> Option<&Result<Arc<LoraWeights>, String>> {
        self.0.get()
    }
}

/// The LoRA adapter a request runs with.
#[derive(Clone)]
pub struct AdapterRef {
    pub id: AdapterId,
    /// The name it was asked for by (error messages).
    pub name: Arc<str>,
    pub weights: Arc<AdapterWeights>,
}

impl std::fmt::Debug for AdapterRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.weights.get() {
            None => "loading",
            Some(Ok(_)) => "ready",
            Some(Err(_)) => "failed",
        };
        write!(f, "AdapterRef({} {:?}, {state})", self.id, self.name)
    }
}

#[derive(Debug, Clone)]
pub struct StoppingParams {
    pub max_new_tokens: usize,
    /// Extra stop token ids besides the model's EOS ids.
    pub stop_token_ids: Vec<u32>,
    /// Stop strings, matched on the detokenized output across token boundaries.
    pub stop_strings: Vec<String>,
    /// Keep the matched stop string at the end of the output.
    pub include_stop_str_in_output: bool,
    /// Do not stop at EOS ids (stop token ids still stop).
    pub ignore_eos: bool,
}

impl Default for StoppingParams {
    fn default() -> Self {
        StoppingParams {
            max_new_tokens: 30,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            include_stop_str_in_output: false,
            ignore_eos: false,
        }
    }
}

/// When beam search stops (HF `early_stopping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlyStopping {
    /// `false`: stop once no live beam can beat the worst kept hypothesis at the current
    /// length (HF's heuristic).
    Heuristic,
    /// `true`: stop as soon as `width` hypotheses are finished.
    Done,
    /// `"never"`: stop once no live beam can beat them at any length (the canonical rule).
    Never,
}

/// Beam search (HF `generate()` semantics): `width` beams, hypotheses scored by cumulative
/// log-probability / generated length ^ `length_penalty`, the best `num_return` returned.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamParams {
    pub width: usize,
    pub length_penalty: f32,
    pub early_stopping: EarlyStopping,
    pub num_return: usize,
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Token ids, and media items standing as placeholder tokens (`Prompt::from(ids)`).
    pub prompt: Prompt,
    /// `min_new_tokens` and the seed live here too.
    pub sampling: SamplingParams,
    pub stopping: StoppingParams,
    /// Sequences returned (`n`); `best_of` ≥ n are generated, ranked by cumulative logprob.
    pub n: usize,
    pub best_of: usize,
    /// Return prompt logprobs, with this many alternatives per position.
    pub prompt_logprobs: Option<u32>,
    pub skip_special_tokens: bool,
    pub adapter: Option<AdapterRef>,
    /// Constrained decoding: every sequence's output must match this grammar.
    pub constraint: Option<crate::constraint::Grammar>,
    /// Pin the KV blocks of the first this-many prompt tokens (a system prompt) in the prefix
    /// cache so they survive eviction (Edge-LLM's save_system_prompt_kv_cache).
    pub pin_prefix_tokens: usize,
    /// Speculative decoding: tokens the client expects the output to be (OpenAI
    /// `prediction`, TensorRT-LLM `draft_input_ids`); empty for none. Only speed depends on it.
    pub draft: Vec<u32>,
    /// Beam search instead of sampling (greedy scores; `n`/`best_of` stay 1).
    pub beam: Option<BeamParams>,
}

impl GenerateRequest {
    /// A text prompt with default controls.
    pub fn new(prompt: Vec<u32>) -> Self {
        Self::with_prompt(Prompt::text(prompt))
    }

    /// A prompt of spans (text and media) with default controls.
    pub fn with_prompt(prompt: Prompt) -> Self {
        GenerateRequest {
            prompt,
            sampling: SamplingParams::default(),
            stopping: StoppingParams::default(),
            n: 1,
            best_of: 1,
            prompt_logprobs: None,
            skip_special_tokens: true,
            adapter: None,
            constraint: None,
            pin_prefix_tokens: 0,
            draft: Vec::new(),
            beam: None,
        }
    }

    /// Parallel sequences this request runs.
    pub fn num_seqs(&self) -> usize {
        match &self.beam {
            Some(b) => b.width.max(1),
            None => self.best_of.max(self.n).max(1),
        }
    }

    pub fn adapter_id(&self) -> Option<AdapterId> {
        self.adapter.as_ref().map(|a| a.id)
    }
}

/// An embedding or scoring request ([`lmi_checkpoint::pooling::PoolerInfo`]): one input, run
/// whole in one step as prefill-only work (no chunking, no prefix cache; its blocks are freed
/// when the step ends). Its stream carries one [`crate::Event::Pooled`] (or an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolingRequest {
    /// The input's token ids, prompt and special tokens included, already truncated.
    pub tokens: Vec<u32>,
    /// A BERT pair input: the first token of the second segment (token type 1).
    pub segment_b: Option<usize>,
}
