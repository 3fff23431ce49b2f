//! What the scheduler keeps per request, shared by its parallel sequences (or beams).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::Sender;

use crate::event::{Event, PromptToken};
use crate::kv_manager::CacheKey;
use crate::request::GenerateRequest;
use crate::strategy::beam::BeamSearch;

pub(crate) struct RequestState {
    pub params: Arc<GenerateRequest>,
    pub tx: Sender<Event>,
    pub submitted: Instant,
    pub first_scheduled: Option<Instant>,
    pub prompt_logprobs: Vec<PromptToken>,
    pub prompt_logprobs_sent: bool,
    /// Sequences not finished yet (before the fork: 1).
    pub alive: usize,
    pub forked: bool,
    pub cached_prompt_tokens: usize,
    /// Stop ids handed to the sampler (masked before min_new_tokens).
    pub stop_ids: Vec<u32>,
    /// Beam search: finished hypotheses and beam numbering.
    pub beam: Option<BeamSearch>,
}

impl RequestState {
    /// Sends an event; false when the client has gone away.
    pub fn send(&self, e: Event) -> bool {
        self.tx.try_send(e).is_ok()
    }

    /// What its sequences' KV is keyed by besides token ids.
    pub fn cache_key(&self) -> CacheKey<'_> {
        CacheKey {
            media: self.params.prompt.media(),
            adapter: self.params.adapter_id(),
        }
    }
}
