//! Beam search with HF `generate()` semantics. A request's beams are sequences sharing KV
//! blocks copy-on-write (the fork machinery of `n`/`best_of`). Each beam draws greedily with
//! `2 * width` top alternatives; the draw waits on the sequence (`beam_pending`) until every
//! beam of the request has one, then the request advances as a whole:
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

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use lmi_text::IncrementalDetokenizer;

use super::Scheduler;
use crate::event::{Event, FinishReason, Finished, Timings, TokenEvent};
use crate::request::{BeamParams, EarlyStopping};
use crate::sequence::{RequestId, Sequence};
use crate::stop::StopMatcher;

/// A finished hypothesis.
#[derive(Debug, Clone)]
pub(crate) struct Hypothesis {
    pub tokens: Vec<u32>,
    pub scores: Vec<(f32, Vec<(u32, f32)>)>,
    pub cum_logprob: f64,
    pub score: f64,
    pub reason: FinishReason,
}

/// A beam request's state besides its beams.
#[derive(Debug, Clone)]
pub struct BeamSearch {
    params: BeamParams,
    /// Top alternatives the client asked for (draws ask for at least `2 * width`).
    user_top_n: usize,
    /// The best `width` hypotheses, best first.
    hyps: Vec<Hypothesis>,
    next_index: u32,
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

    fn score(&self, cum: f64, len: usize) -> f64 {
        cum / (len.max(1) as f64).powf(f64::from(self.params.length_penalty))
    }

    fn add(&mut self, h: Hypothesis) {
        let at = self.hyps.partition_point(|x| x.score >= h.score);
        self.hyps.insert(at, h);
        self.hyps.truncate(self.params.width);
    }

    /// HF's `BeamHypotheses.is_done`: `best_cum` is the best candidate's cumulative logprob at
    /// generated length `len`; `max_len` the most tokens a beam may generate.
    fn is_done(&self, best_cum: f64, len: usize, max_len: usize) -> bool {
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

/// One continuation of a beam.
#[derive(Debug, Clone)]
struct Candidate {
    /// Position of the beam in the request's beam list.
    beam: usize,
    token: u32,
    logprob: f32,
    cum: f64,
}

impl Scheduler {
    /// Advances every beam request whose beams all hold this step's draw.
    pub(super) fn advance_beams(&mut self) {
        let ready: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(id, r)| {
                r.beam.is_some()
                    && !self.waiting.iter().any(|s| s.req == **id)
                    && self.running.iter().any(|s| s.req == **id)
                    && self
                        .running
                        .iter()
                        .filter(|s| s.req == **id)
                        .all(|s| s.beam_pending.is_some())
            })
            .map(|(&id, _)| id)
            .collect();
        for id in ready {
            self.advance_beam_group(id);
        }
    }

    fn advance_beam_group(&mut self, id: RequestId) {
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        let params = r.params.clone();
        let stop_ids = r.stop_ids.clone();
        let Some(mut search) = r.beam.clone() else {
            return;
        };
        let width = search.params.width;
        let beams: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].req == id)
            .collect();
        let first = &self.running[beams[0]];
        let len = first.tokens.len() - first.prompt_len + 1;
        let max_len = params
            .stopping
            .max_new_tokens
            .min(self.cfg.max_model_len.saturating_sub(first.prompt_len));

        let mut cands: Vec<Candidate> = Vec::new();
        for (b, &i) in beams.iter().enumerate() {
            let s = &self.running[i];
            for &(token, logprob) in s.beam_pending.iter().flat_map(|p| &p.top) {
                cands.push(Candidate {
                    beam: b,
                    token,
                    logprob,
                    cum: s.cum_logprob + f64::from(logprob),
                });
            }
        }
        cands.sort_by(|a, b| {
            b.cum
                .total_cmp(&a.cum)
                .then(a.beam.cmp(&b.beam))
                .then(a.token.cmp(&b.token))
        });
        let best_cum = cands.first().map_or(f64::NEG_INFINITY, |c| c.cum);
        let mut chosen: Vec<Candidate> = Vec::new();
        for (rank, c) in cands.into_iter().enumerate() {
            if stop_ids.contains(&c.token) {
                if rank < width {
                    let h = self.hypothesis(beams[c.beam], &c, FinishReason::EosToken, &search);
                    search.add(h);
                }
                continue;
            }
            chosen.push(c);
            if chosen.len() == width {
                break;
            }
        }

        // Children: the first of a parent extends it in place, the others are forks of it.
        let mut extended = vec![false; beams.len()];
        let mut targets: Vec<(usize, Candidate)> = Vec::new();
        for c in chosen {
            let parent = beams[c.beam];
            if !extended[c.beam] {
                extended[c.beam] = true;
                targets.push((parent, c));
            } else {
                let idx = search.next_index;
                search.next_index += 1;
                let seed = self.running[parent].seed;
                targets.push((self.fork_running(parent, idx, seed), c));
            }
        }
        let mut remove: Vec<usize> = beams
            .iter()
            .zip(&extended)
            .filter(|(_, e)| !**e)
            .map(|(&i, _)| i)
            .collect();
        let at_limit = len >= max_len;
        for (i, c) in targets {
            let hit = self.extend_beam(i, &c);
            if hit || at_limit {
                let reason = if hit {
                    FinishReason::StopSequence
                } else {
                    FinishReason::Length
                };
                let s = &self.running[i];
                let h = Hypothesis {
                    tokens: s.output().to_vec(),
                    scores: s.beam_scores.clone(),
                    cum_logprob: s.cum_logprob,
                    score: search.score(s.cum_logprob, s.output().len()),
                    reason,
                };
                search.add(h);
                remove.push(i);
            }
        }
        remove.sort_unstable();
        remove.dedup();
        for &i in remove.iter().rev() {
            let mut s = self.running.remove(i);
            self.release(&mut s);
        }
        let alive = self.running.iter().any(|s| s.req == id);
        let done = !alive || at_limit || search.is_done(best_cum, len, max_len);
        if done {
            self.finish_beams(id, search);
        } else if let Some(r) = self.requests.get_mut(&id) {
            r.beam = Some(search);
        }
    }

    /// The hypothesis of beam `i` (a running index) ending with stop token `c`.
    fn hypothesis(
        &self,
        i: usize,
        c: &Candidate,
        reason: FinishReason,
        search: &BeamSearch,
    ) -> Hypothesis {
        let s = &self.running[i];
        let mut tokens = s.output().to_vec();
        tokens.push(c.token);
        let mut scores = s.beam_scores.clone();
        scores.push((c.logprob, self.pending_top(s)));
        Hypothesis {
            score: search.score(c.cum, tokens.len()),
            tokens,
            scores,
            cum_logprob: c.cum,
            reason,
        }
    }

    fn pending_top(&self, s: &Sequence) -> Vec<(u32, f32)> {
        s.beam_pending
            .as_ref()
            .map(|p| p.top.clone())
            .unwrap_or_default()
    }

    /// Appends candidate `c` to beam `i`; true when its text hit a stop string.
    fn extend_beam(&mut self, i: usize, c: &Candidate) -> bool {
        let top = self.pending_top(&self.running[i]);
        let s = &mut self.running[i];
        s.tokens.push(c.token);
        s.cum_logprob = c.cum;
        s.beam_scores.push((c.logprob, top));
        s.beam_pending = None;
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        let delta = s.detok.push(&self.tokenizer, c.token).unwrap_or_default();
        s.stop.push(&delta).1
    }

    /// Sends the best `num_return` hypotheses (best first) and ends the request.
    fn finish_beams(&mut self, id: RequestId, search: BeamSearch) {
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        let p = &r.params;
        let now = Instant::now();
        let submitted = r.submitted;
        for (k, h) in search
            .hyps
            .iter()
            .take(search.params.num_return)
            .enumerate()
        {
            let mut detok = IncrementalDetokenizer::with_prompt_tail(
                &p.prompt,
                &self.tokenizer,
                p.skip_special_tokens,
            );
            let mut stop = StopMatcher::new(
                &p.stopping.stop_strings,
                p.stopping.include_stop_str_in_output,
            );
            for (j, (&token, (logprob, top))) in h.tokens.iter().zip(&h.scores).enumerate() {
                let last = j + 1 == h.tokens.len();
                let delta = detok.push(&self.tokenizer, token).unwrap_or_default();
                let (mut text, _) = stop.push(&delta);
                if last && h.reason != FinishReason::StopSequence {
                    if let Ok(rest) = detok.flush(&self.tokenizer) {
                        text.push_str(&stop.push(&rest).0);
                    }
                    text.push_str(&stop.finish());
                }
                r.send(Event::Token(TokenEvent {
                    index: k as u32,
                    id: token,
                    text,
                    logprob: *logprob,
                    top: top.iter().take(search.user_top_n).copied().collect(),
                    special: self.tokenizer.is_special(token),
                    finish: last.then_some(h.reason),
                }));
            }
            r.send(Event::Finished(Finished {
                index: k as u32,
                reason: h.reason,
                text: stop.text().to_string(),
                generated_tokens: h.tokens.len(),
                prompt_tokens: p.prompt.len(),
                cached_prompt_tokens: r.cached_prompt_tokens,
                cumulative_logprob: h.cum_logprob,
                timings: Timings {
                    queue: r.first_scheduled.map(|t| t - submitted).unwrap_or_default(),
                    time_to_first_token: now - submitted,
                    total: now - submitted,
                    inter_token: Vec::new(),
                },
                accepted_draft_tokens: 0,
                rejected_draft_tokens: 0,
            }));
        }
        self.drop_request(id);
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
