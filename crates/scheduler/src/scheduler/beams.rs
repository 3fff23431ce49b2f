//! Beam search, the step loop's side (the search and each beam's state: `strategy/beam.rs`):
//! once every beam of a request holds its draw, rank the candidates, extend, fork or free
//! beams, collect hypotheses, and send the best at the end.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use lmi_text::IncrementalDetokenizer;

use super::Scheduler;
use crate::entry::SeqEntry;
use crate::event::{Event, FinishReason, Finished, Timings, TokenEvent};
use crate::sequence::RequestId;
use crate::stop::StopMatcher;
use crate::strategy::beam::{BeamSearch, Hypothesis};

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
                    && !self.waiting.iter().any(|e| e.seq.req == **id)
                    && self.running.iter().any(|e| e.seq.req == **id)
                    && self
                        .running
                        .iter()
                        .filter(|e| e.seq.req == **id)
                        .all(|e| e.beam.pending.is_some())
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
            .filter(|&i| self.running[i].seq.req == id)
            .collect();
        let first = &self.running[beams[0]].seq;
        let len = first.tokens.len() - first.prompt_len + 1;
        let max_len = params
            .stopping
            .max_new_tokens
            .min(self.cfg.max_model_len.saturating_sub(first.prompt_len));

        let mut cands: Vec<Candidate> = Vec::new();
        for (b, &i) in beams.iter().enumerate() {
            let e = &self.running[i];
            for &(token, logprob) in e.beam.pending.iter().flat_map(|p| &p.top) {
                cands.push(Candidate {
                    beam: b,
                    token,
                    logprob,
                    cum: e.sampling.cum_logprob + f64::from(logprob),
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
                let seed = self.running[parent].sampling.seed;
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
                let e = &self.running[i];
                let cum = e.sampling.cum_logprob;
                let h = Hypothesis {
                    tokens: e.seq.output().to_vec(),
                    scores: e.beam.scores.clone(),
                    cum_logprob: cum,
                    score: search.score(cum, e.seq.output().len()),
                    reason,
                };
                search.add(h);
                remove.push(i);
            }
        }
        remove.sort_unstable();
        remove.dedup();
        for &i in remove.iter().rev() {
            let mut e = self.running.remove(i);
            self.release(&mut e);
        }
        let alive = self.running.iter().any(|e| e.seq.req == id);
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
        let e = &self.running[i];
        let mut tokens = e.seq.output().to_vec();
        tokens.push(c.token);
        let mut scores = e.beam.scores.clone();
        scores.push((c.logprob, pending_top(e)));
        Hypothesis {
            score: search.score(c.cum, tokens.len()),
            tokens,
            scores,
            cum_logprob: c.cum,
            reason,
        }
    }

    /// Appends candidate `c` to beam `i`; true when its text hit a stop string.
    fn extend_beam(&mut self, i: usize, c: &Candidate) -> bool {
        let e = &mut self.running[i];
        let top = pending_top(e);
        e.seq.tokens.push(c.token);
        e.sampling.cum_logprob = c.cum;
        e.beam.scores.push((c.logprob, top));
        e.beam.pending = None;
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        let s = &mut e.seq;
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

/// The top alternatives of the draw a beam holds.
fn pending_top(e: &SeqEntry) -> Vec<(u32, f32)> {
    e.beam
        .pending
        .as_ref()
        .map(|p| p.top.clone())
        .unwrap_or_default()
}
