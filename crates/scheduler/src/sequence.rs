//! One generated sequence: its tokens, its KV blocks, its detokenizer and its stop rules.
//! Nothing a strategy keeps lives here (see `entry.rs`).

use lmi_text::IncrementalDetokenizer;

use crate::kv_manager::SeqBlocks;
use crate::stop::StopMatcher;

pub type RequestId = u64;

pub(crate) struct Sequence {
    pub req: RequestId,
    pub index: u32,
    /// Admission order, newest preempted first.
    pub arrival: u64,
    /// Prompt followed by the output so far (and a draft being verified, see `SpecState`).
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub kv: SeqBlocks,
    pub detok: IncrementalDetokenizer,
    pub stop: StopMatcher,
}

impl Sequence {
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Tokens not in the KV cache yet.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.kv.num_computed
    }

    /// A copy of the first `len` tokens as sequence `index`, on blocks `kv` (shared by the
    /// KV manager).
    pub fn fork(&self, index: u32, len: usize, kv: SeqBlocks) -> Sequence {
        Sequence {
            req: self.req,
            index,
            arrival: self.arrival,
            tokens: self.tokens[..len].to_vec(),
            prompt_len: self.prompt_len,
            kv,
            detok: self.detok.clone(),
            stop: self.stop.clone(),
        }
    }
}
