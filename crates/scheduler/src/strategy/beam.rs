//! Beam search with HF `generate()` semantics: the request's search (hypotheses, numbering)
//! and each beam's state; the step loop's side is `scheduler/beams.rs`. A request's beams are
//! sequences sharing KV blocks copy-on-write (the fork machinery of `n`/`best_of`). Each beam
//! draws greedily with `2 * width` top alternatives; the draw waits beside the sequence
//! (`BeamState::pending`) until every beam of the request has one, then the request advances
//! as a whole:
//!
//! 1. candidates (beam, token) are ranked by the beam's cumulative logprob + the token's;
//! 2. going down the ranking, a stop token (EOS, stop ids) ranked within the first `width`
//!    finishes a hypothesis; other candidates become the next beams until there are `width`;
//! 3. a parent with one child extends in place, one with several is forked, one with none is
//!    freed; a beam whose text hits a stop string, or that reaches the length limit, becomes a
//!    hypothesis;
//! 4. hypotheses are scored `cum_logprob / generated_len ^ length_penalty` (the stop token
//!    counted), the `width` best kept; `early_stopping` decides when to stop (HF's rule).
//!
//! Nothing streams: the best `num_return` hypotheses are sent at the end, as sequences
//! 0..num_return, best first.

use lmi_engine_core::sampling::Sampled;

use crate::event::FinishReason;
use crate::request::{BeamParams, EarlyStopping};

/// A finished hypothesis.
#[derive(Debug, Clone)]
pub(crate) struct Hypothesis {
    pub tokens: Vec<u32>,
    pub scores: Vec<(f32, Vec<(u32, f32)>)>,
    pub cum_logprob: f64,
    pub score: f64,
    pub reason: FinishReason,
}

/// A beam request's state besides its beams (kept in the request's state).
#[derive(Debug, Clone)]
pub(crate) struct BeamSearch {
    pub params: BeamParams,
    /// Top alternatives the client asked for (draws ask for at least `2 * width`).
    pub user_top_n: usize,
    /// The best `width` hypotheses, best first.
    pub hyps: Vec<Hypothesis>,
    pub next_index: u32,
}

/// One beam's state, kept beside its sequence (see `SeqEntry`).
#[derive(Debug, Clone, Default)]
pub(crate) struct BeamState {
    /// This step's draw (its top alternatives are the beam's candidates), held until every
    /// beam of the request has one.
    pub pending: Option<Sampled>,
    /// Logprob and top alternatives of each output token.
    pub scores: Vec<(f32, Vec<(u32, f32)>)>,
}

impl BeamSearch {
    pub(crate) fn new(params: BeamParams, user_top_n: usize) -> Self {
        BeamSearch {
            params,
            user_top_n,
            hyps: Vec::new(),
            next_index: 1,
        }
    }

    pub fn score(&self, cum: f64, len: usize) -> f64 {
        cum / (len.max(1) as f64).powf(f64::from(self.params.length_penalty))
    }

    pub fn add(&mut self, h: Hypothesis) {
        let at = self.hyps.partition_point(|x| x.score >= h.score);
        self.hyps.insert(at, h);
        self.hyps.truncate(self.params.width);
    }

    /// HF's `BeamHypotheses.is_done`: `best_cum` is the best candidate's cumulative logprob at
    /// generated length `len`; `max_len` the most tokens a beam may generate.
    pub fn is_done(&self, best_cum: f64, len: usize, max_len: usize) -> bool {
        if self.hyps.len() < self.params.width {
            return false;
        }
        let worst = self.hyps.last().map_or(f64::NEG_INFINITY, |h| h.score);
        match self.params.early_stopping {
            EarlyStopping::Done => true,
            EarlyStopping::Heuristic => worst >= self.score(best_cum, len),
            EarlyStopping::Never => {
                let at = if self.params.length_penalty > 0.0 {
                    max_len
                } else {
                    len
                };
                worst >= self.score(best_cum, at)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyp(score: f64) -> Hypothesis {
        Hypothesis {
            tokens: vec![],
            scores: vec![],
            cum_logprob: score,
            score,
            reason: FinishReason::EosToken,
        }
    }

    fn search(early: EarlyStopping, lp: f32) -> BeamSearch {
        BeamSearch::new(
            BeamParams {
                width: 2,
                length_penalty: lp,
                early_stopping: early,
                num_return: 1,
            },
            0,
        )
    }

    #[test]
    fn keeps_the_width_best_and_stops_by_hf_rules() {
        let mut s = search(EarlyStopping::Heuristic, 1.0);
        for x in [-3.0, -1.0, -2.0] {
            s.add(hyp(x));
        }
        let scores: Vec<f64> = s.hyps.iter().map(|h| h.score).collect();
        assert_eq!(scores, vec![-1.0, -2.0]);
        // Heuristic: a live beam at cum -5 over 2 tokens scores -2.5 < -2: done.
        assert!(s.is_done(-5.0, 2, 10));
        assert!(!s.is_done(-3.0, 2, 10));
        // Never with a positive length penalty: judged at the longest length (-5/10 = -0.5).
        let mut n = search(EarlyStopping::Never, 1.0);
        n.hyps = s.hyps.clone();
        assert!(!n.is_done(-5.0, 2, 10));
        // True: done as soon as `width` hypotheses exist.
        let mut t = search(EarlyStopping::Done, 1.0);
        t.add(hyp(-9.0));
        assert!(!t.is_done(0.0, 1, 10));
        t.add(hyp(-9.0));
        assert!(t.is_done(0.0, 1, 10));
    }
}
