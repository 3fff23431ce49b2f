//! Plain sampling's state for one sequence: its seed (draws are keyed by seed and output
//! position), the cumulative logprob that ranks `best_of` sequences, and token times.

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub(crate) struct SamplingState {
    pub seed: u64,
    pub cum_logprob: f64,
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    pub inter_token: Vec<Duration>,
}

impl SamplingState {
    pub fn new(seed: u64) -> Self {
        SamplingState {
            seed,
            cum_logprob: 0.0,
            first_token_at: None,
            last_token_at: None,
            inter_token: Vec::new(),
        }
    }

    /// A fork's: its own seed, the same score and first-token time so far.
    pub fn fork(&self, seed: u64) -> Self {
        SamplingState {
            seed,
            inter_token: Vec::new(),
            ..self.clone()
        }
    }

    /// Records a token drawn with `logprob` at `now`.
    pub fn record(&mut self, logprob: f32, now: Instant) {
        self.cum_logprob += f64::from(logprob);
        match self.last_token_at {
            Some(t) => self.inter_token.push(now - t),
            None => self.first_token_at = Some(now),
        }
        self.last_token_at = Some(now);
    }
}
