//! What a caller submits: token ids and every generation control, already validated and
//! tokenized by the front end.

use lmi_engine::sampling::SamplingParams;

/// An opaque adapter id; prefix-cache hashes are keyed by it (KV differs per adapter).
pub type AdapterId = u64;

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

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    /// `min_new_tokens` and the seed live here too.
    pub sampling: SamplingParams,
    pub stopping: StoppingParams,
    /// Sequences returned (`n`); `best_of` ≥ n are generated, ranked by cumulative logprob.
    pub n: usize,
    pub best_of: usize,
    /// Return prompt logprobs, with this many alternatives per position.
    pub prompt_logprobs: Option<u32>,
    pub skip_special_tokens: bool,
    pub adapter: Option<AdapterId>,
    /// Pin the KV blocks of the first this-many prompt tokens (a system prompt) in the prefix
    /// cache so they survive eviction (Edge-LLM's save_system_prompt_kv_cache).
    pub pin_prefix_tokens: usize,
}

impl GenerateRequest {
    pub fn new(prompt: Vec<u32>) -> Self {
        GenerateRequest {
            prompt,
            sampling: SamplingParams::default(),
            stopping: StoppingParams::default(),
            n: 1,
            best_of: 1,
            prompt_logprobs: None,
            skip_special_tokens: true,
            adapter: None,
            pin_prefix_tokens: 0,
        }
    }

    /// Parallel sequences this request runs.
    pub fn num_seqs(&self) -> usize {
        self.best_of.max(self.n).max(1)
    }
}
