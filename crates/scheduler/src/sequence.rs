//! One generated sequence and the request it belongs to.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lmi_text::IncrementalDetokenizer;
use tokio::sync::mpsc::Sender;

use crate::block_pool::BlockHash;
use crate::constraint::SeqConstraint;
use crate::event::{Event, PromptToken};
use crate::request::GenerateRequest;
use crate::scheduler::DraftSource;
use crate::stop::StopMatcher;

pub type RequestId = u64;

/// State shared by a request's parallel sequences.
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
    pub beam: Option<crate::scheduler::BeamSearch>,
}

impl RequestState {
    /// Sends an event; false when the client has gone away.
    pub fn send(&self, e: Event) -> bool {
        self.tx.try_send(e).is_ok()
    }
}

pub(crate) struct Sequence {
    pub req: RequestId,
    pub index: u32,
    pub seed: u64,
    /// Admission order, newest preempted first.
    pub arrival: u64,
    /// Prompt followed by the output so far.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose K/V are in the cache.
    pub num_computed: usize,
    pub block_table: Vec<u32>,
    /// Hashes of the full blocks registered in the prefix cache, in order.
    pub hashes: Vec<BlockHash>,
    pub detok: IncrementalDetokenizer,
    pub stop: StopMatcher,
    pub cum_logprob: f64,
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    pub inter_token: Vec<Duration>,
    /// Constrained decoding: where the output stands in the request's grammar (shared with
    /// the worker computing its next mask).
    pub constraint: Option<Arc<Mutex<SeqConstraint>>>,
    /// Speculative decoding: the last `draft_len` tokens are a draft not verified yet.
    pub draft_len: usize,
    pub draft_source: DraftSource,
    /// The next draft's length (adapted to what was accepted).
    pub spec_k: usize,
    pub draft_accepted: usize,
    pub draft_rejected: usize,
    /// Beam search: this step's draw (its top alternatives are the beam's candidates), held
    /// until every beam of the request has one.
    pub beam_pending: Option<lmi_engine::sampling::Sampled>,
    /// Beam search: logprob and top alternatives of each output token.
    pub beam_scores: Vec<(f32, Vec<(u32, f32)>)>,
    /// Speculative decoding: this sequence in the draft model's cache, and its proposal.
    pub draft_kv: crate::scheduler::DraftKv,
}

impl Sequence {
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// A copy that continues independently: its own grammar state, no draft. The caller
    /// takes a reference on each block (see `Scheduler::fork_running`).
    pub fn fork(&self, index: u32, seed: u64) -> Sequence {
        Sequence {
            req: self.req,
            index,
            seed,
            arrival: self.arrival,
            tokens: self.tokens[..self.tokens.len() - self.draft_len].to_vec(),
            prompt_len: self.prompt_len,
            num_computed: self.num_computed,
            block_table: self.block_table.clone(),
            hashes: self.hashes.clone(),
            detok: self.detok.clone(),
            stop: self.stop.clone(),
            cum_logprob: self.cum_logprob,
            first_token_at: self.first_token_at,
            last_token_at: self.last_token_at,
            inter_token: Vec::new(),
            constraint: self.constraint.as_ref().map(|c| {
                let c = c.lock().unwrap_or_else(|e| e.into_inner());
                Arc::new(Mutex::new(c.fork()))
            }),
            draft_len: 0,
            draft_source: self.draft_source,
            spec_k: self.spec_k,
            draft_accepted: 0,
            draft_rejected: 0,
            beam_pending: self.beam_pending.clone(),
            beam_scores: self.beam_scores.clone(),
            draft_kv: Default::default(),
        }
    }

    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }
}
