//! After the forward pass: prefix-cache registration, prompt logprobs, forks of parallel
//! sequences, appending each draw (detokenization, stop rules, events), and handing drafts
//! and beams to their modules.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use lmi_engine_core::StepOutput;
use lmi_engine_core::sampling::{Sampled, derive_seed};

use super::{Scheduler, lock};
use crate::event::{Event, FinishReason, Finished, PromptToken, Timings, TokenEvent};
use crate::step_plan::Planned;

impl Scheduler {
    pub(super) fn process(&mut self, planned: &[Planned], out: StepOutput) {
        let mut prompt_logprobs: Vec<Option<Vec<lmi_engine_core::TokenLogprob>>> =
            out.prompt_logprobs.into_iter().map(Some).collect();
        let mut samples: Vec<Option<Sampled>> = out.samples.into_iter().map(Some).collect();
        // (running index, sample) of every sequence that got a token this step, parallel
        // sequences forked now last.
        let mut appends: Vec<(usize, Sampled)> = Vec::new();
        let mut forked: Vec<(usize, Sampled)> = Vec::new();
        let mut drafted: Vec<(usize, Vec<Sampled>)> = Vec::new();
        for p in planned {
            let i = p.running;
            if self.running[i].spec.draft_len > 0 {
                // Verified after the others (it may append several tokens).
                let draws = p
                    .samples
                    .clone()
                    .filter_map(|k| samples[k].take())
                    .collect();
                drafted.push((i, draws));
                continue;
            }
            self.running[i].seq.kv.num_computed += p.tokens;
            self.register_full_blocks(i);
            if let Some(lp) = p.prompt_logprobs.and_then(|k| prompt_logprobs[k].take()) {
                self.collect_prompt_logprobs(i, p.start, p.tokens, lp);
            }
            let mut draws = p.samples.clone().filter_map(|k| samples[k].take());
            let Some(first) = draws.next() else { continue };
            let id = self.running[i].seq.req;
            if let Some(req) = self.requests.get_mut(&id)
                && req.beam.is_some()
            {
                // Beams advance together once all have drawn (beams.rs).
                req.forked = true;
                self.running[i].beam.pending = Some(first);
                continue;
            }
            if self.running[i].seq.index == 0
                && let Some(req) = self.requests.get_mut(&id)
                && !req.forked
            {
                // Fork parallel sequences (n > 1 / best_of) off the first one's prefill;
                // each drew its first token from these logits with its own seed.
                req.forked = true;
                req.alive = req.params.num_seqs();
                let seed = req.params.sampling.seed;
                for (idx, smp) in (1..).zip(draws) {
                    let f = self.fork_running(i, idx, derive_seed(seed, u64::from(idx)));
                    forked.push((f, smp));
                }
            }
            appends.push((i, first));
        }
        appends.extend(forked);
        let now = Instant::now();
        let mut finished: Vec<usize> = Vec::new();
        for (i, smp) in appends {
            if self.append_token(i, smp.token, smp.logprob, smp.top, now) {
                finished.push(i);
            }
        }
        for (i, draws) in drafted {
            if self.accept_draft(i, draws, now) {
                finished.push(i);
            }
        }
        finished.sort_unstable();
        for &i in finished.iter().rev() {
            let mut e = self.running.remove(i);
            self.release(&mut e);
            if let Some(r) = self.requests.get_mut(&e.seq.req) {
                r.alive = r.alive.saturating_sub(1);
                if r.alive == 0 {
                    self.requests.remove(&e.seq.req);
                }
            }
        }
        self.advance_beams();
    }

    /// Registers newly full blocks of running sequence `i` in the prefix cache, pinning those
    /// inside the request's pinned prefix.
    pub(super) fn register_full_blocks(&mut self, i: usize) {
        let s = &mut self.running[i].seq;
        let Some(r) = self.requests.get(&s.req) else {
            return;
        };
        let pin_upto = r.params.pin_prefix_tokens;
        self.kv
            .register_full_blocks(&mut s.kv, &s.tokens, r.cache_key(), pin_upto);
    }

    /// Adds the scores of prompt tokens `start + 1 ..= start + n` (those inside the prompt)
    /// and sends them all once the prompt is done.
    pub(super) fn collect_prompt_logprobs(
        &mut self,
        i: usize,
        start: usize,
        n: usize,
        scores: Vec<lmi_engine_core::TokenLogprob>,
    ) {
        let s = &self.running[i].seq;
        let Some(r) = self.requests.get_mut(&s.req) else {
            return;
        };
        if start == 0 {
            r.prompt_logprobs.push(PromptToken {
                id: s.tokens[0],
                logprob: None,
                top: vec![],
            });
        }
        for (j, sc) in scores.into_iter().enumerate() {
            r.prompt_logprobs.push(PromptToken {
                id: s.tokens[start + j + 1],
                logprob: Some(sc.logprob),
                top: sc.top,
            });
        }
        if start + n >= s.prompt_len {
            r.prompt_logprobs_sent = true;
            let lp = std::mem::take(&mut r.prompt_logprobs);
            r.send(Event::Prefill(lp));
        }
    }

    /// Appends a sampled token to running sequence `i`, sends its event, applies the stop
    /// rules. Returns true when the sequence is finished.
    pub(super) fn append_token(
        &mut self,
        i: usize,
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
        now: Instant,
    ) -> bool {
        let e = &mut self.running[i];
        let Some(r) = self.requests.get(&e.seq.req) else {
            return true;
        };
        let p = &r.params;
        e.seq.tokens.push(token);
        // Constrained output moves on in its grammar; a complete grammar ends the sequence.
        let mut grammar_done = false;
        if let Some(c) = &e.constraint {
            let mut c = lock(c);
            if let Err(err) = c.commit(token) {
                r.send(Event::Error(format!("the output left its grammar: {err}")));
                return true;
            }
            grammar_done = c.is_finished();
        }
        e.sampling.record(logprob, now);
        let s = &mut e.seq;
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        let generated = s.tokens.len() - s.prompt_len;

        let delta = match s.detok.push(&self.tokenizer, token) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("detokenizing token {token}: {e}");
                String::new()
            }
        };
        let is_stop_id = p.stopping.stop_token_ids.contains(&token)
            || (!p.stopping.ignore_eos && self.eos.contains(&token));
        let mut reason = None;
        let mut text = String::new();
        if is_stop_id {
            reason = Some(FinishReason::EosToken);
        } else {
            let (emit, hit) = s.stop.push(&delta);
            text = emit;
            if hit {
                reason = Some(FinishReason::StopSequence);
            } else if grammar_done {
                // The grammar's last token is output; it ends the sequence like an EOS would.
                reason = Some(FinishReason::EosToken);
            }
        }
        if reason.is_none()
            && (generated >= p.stopping.max_new_tokens || s.tokens.len() >= self.cfg.max_model_len)
        {
            reason = Some(FinishReason::Length);
        }
        if matches!(reason, Some(FinishReason::Length | FinishReason::EosToken)) {
            // Release held-back text and any incomplete character at the end.
            if let Ok(rest) = s.detok.flush(&self.tokenizer) {
                let (emit, _) = s.stop.push(&rest);
                text.push_str(&emit);
            }
            text.push_str(&s.stop.finish());
        }
        let alive = r.send(Event::Token(TokenEvent {
            index: s.index,
            id: token,
            text,
            logprob,
            top,
            special: self.tokenizer.is_special(token),
            finish: reason,
        }));
        let Some(reason) = reason else { return !alive };
        let submitted = r.submitted;
        let draws = &mut e.sampling;
        let timings = Timings {
            queue: r.first_scheduled.map(|t| t - submitted).unwrap_or_default(),
            time_to_first_token: draws
                .first_token_at
                .map(|t| t - submitted)
                .unwrap_or_default(),
            total: now - submitted,
            inter_token: std::mem::take(&mut draws.inter_token),
        };
        r.send(Event::Finished(Finished {
            index: s.index,
            reason,
            text: s.stop.text().to_string(),
            generated_tokens: generated,
            prompt_tokens: s.prompt_len,
            cached_prompt_tokens: r.cached_prompt_tokens,
            cumulative_logprob: draws.cum_logprob,
            timings,
            accepted_draft_tokens: e.spec.accepted,
            rejected_draft_tokens: e.spec.rejected,
        }));
        true
    }
}
