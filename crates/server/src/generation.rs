//! The bridge between the wire schemas and the scheduler: a resolved [`GenerationSpec`] and a
//! prompt (text, or chat messages rendered with the model's template) become a scheduler
//! request; its events become the neutral [`GenerationOut`] / [`StreamItem`]s the formatters
//! of `lmi_api` turn into bytes.

use std::sync::Arc;

use lmi_api::{
    ApiError, Draft, EarlyStop, FinishReason, GenerationOut, GenerationSpec, SequenceOut, TokenOut,
};
use lmi_engine::sampling::SamplingParams;
use lmi_scheduler::{Event, Finished, GenerateRequest, RequestStream, StoppingParams, SubmitError};

use crate::app::{AppState, LoadedModel};

/// What the model is asked to continue.
pub enum Prompt {
    Text(String),
    /// Token ids, used as they are (no special tokens added).
    Tokens(Vec<u32>),
    /// OpenAI-shaped messages, rendered with the model's chat template, and the tools
    /// (OpenAI tool objects) the model is offered; the request's `chat_template_kwargs` and
    /// thinking budget (`None`: the server's).
    Chat {
        messages: Vec<lmi_text::Message>,
        tools: Vec<serde_json::Value>,
        kwargs: serde_json::Map<String, serde_json::Value>,
        budget: Option<lmi_api::openai::ThinkingBudget>,
    },
}

/// A request ready for the scheduler.
pub struct Job {
    pub prompt_text: String,
    pub prompt_ids: Vec<u32>,
    pub spec: GenerationSpec,
    pub seed: u64,
    pub request: GenerateRequest,
    /// How the replies are read for reasoning (chat prompts of a model with a parser).
    pub reasoning: Option<crate::reasoning::ReplyReasoning>,
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

/// Converts OpenAI-shaped messages (any serde form of them) to the chat-template messages.
pub fn chat_messages<T: serde::Serialize>(msgs: &[T]) -> Result<Vec<lmi_text::Message>, ApiError> {
    let v = serde_json::to_value(msgs).map_err(|e| ApiError::internal(e.to_string()))?;
    serde_json::from_value(v)
        .map_err(|e| ApiError::validation(format!("messages: {e}")).with_param("messages"))
}

/// Renders and tokenizes the prompt, checks it against the model's limits, and builds the
/// scheduler request. Errors are validation errors that say what to change.
pub fn prepare(model: &LoadedModel, prompt: Prompt, spec: GenerationSpec) -> Result<Job, ApiError> {
    prepare_with(model, prompt, spec, |_, _| Ok(()))
}

/// [`prepare`] with a schema's own length rule, `check(prompt_tokens, spec)`, applied to the
/// spec before the request is built from it (the spec is the one owner of the parameters).
pub fn prepare_with(
    model: &LoadedModel,
    prompt: Prompt,
    mut spec: GenerationSpec,
    check: impl FnOnce(usize, &mut GenerationSpec) -> Result<(), ApiError>,
) -> Result<Job, ApiError> {
    let tok = &model.tokenizer;
    check_sequences(&spec, model.max_sequences)?;
    let mut reasoning = None;
    let vision = model.vision.as_ref();
    let mut items = Vec::new();
    let (prompt_text, add_special) = match prompt {
        // TGI: markdown images in the text, for a vision-language model.
        Prompt::Text(t) => match vision {
            Some(v) => {
                let (text, urls) = crate::media::markdown::extract_images(&t, &v.image_marker);
                let refs: Vec<crate::media::MediaRef> = urls
                    .into_iter()
                    .map(|url| crate::media::MediaRef {
                        kind: lmi_engine::vision::MediaKind::Image,
                        url,
                    })
                    .collect();
                items =
                    crate::media::load_all(vision, &refs).map_err(|e| e.with_param("inputs"))?;
                (text, true)
            }
            None => (t, true),
        },
        Prompt::Tokens(ids) => return prepare_ids(model, ids, spec, check),
        Prompt::Chat {
            messages,
            tools,
            kwargs,
            budget,
        } => {
            let template = model.chat_template.as_ref().ok_or_else(|| {
                ApiError::validation(
                    "this model has no chat template: send `inputs` text instead of `messages`",
                )
            })?;
            // Limits are checked before any item is read; items are read before rendering.
            items = crate::media::load_all(vision, &crate::media::refs_of_messages(&messages))?;
            // A template that knows tools renders them; for one that does not, the tools and
            // the tool turns are written into the messages in the model's call format.
            let native = template.supports_tools();
            let msgs =
                lmi_text::tools::prepare_messages(model.tool_format, &messages, &tools, native);
            let offered = (native && !tools.is_empty()).then_some(tools.as_slice());
            let text = template
                .render_with_kwargs(&msgs, offered, true, &kwargs)
                .map_err(|e| {
                    ApiError::validation(format!("chat template: {e}")).with_param("messages")
                })?;
            let (read, constraint) = crate::reasoning::plan(
                model.reasoning,
                &text,
                budget,
                model.reasoning_budget,
                spec.constraint.as_ref(),
            )?;
            // Harmony's channels are special tokens: its readers need them in the text.
            if read.is_some_and(|r| r.format.reads_special_tokens()) {
                spec.skip_special_tokens = false;
            }
            reasoning = read;
            spec.constraint = constraint;
            // Templates write their own BOS; HF tokenizes chat text without special tokens.
            (text, false)
        }
    };
    // Gemma 4 writes a video's frames (timestamps, boi/eoi) into the text before tokenizing.
    let text = crate::media::gemma4_video::rewrite_text(vision, &prompt_text, &items)?;
    let ids = tok
        .encode(&text, add_special)
        .map_err(|e| ApiError::validation(format!("tokenizing the input: {e}")))?;
    let prompt = crate::media::expand(vision, ids, items)?;
    build(model, prompt_text, prompt, spec, reasoning, check)
}

/// [`prepare_with`] for a prompt of token ids: each must be in the vocabulary; the prompt's
/// text (for echo and `inputs`) is their decoding.
fn prepare_ids(
    model: &LoadedModel,
    ids: Vec<u32>,
    spec: GenerationSpec,
    check: impl FnOnce(usize, &mut GenerationSpec) -> Result<(), ApiError>,
) -> Result<Job, ApiError> {
    let tok = &model.tokenizer;
    if let Some(bad) = ids.iter().find(|&&id| tok.id_to_token(id).is_none()) {
        return Err(ApiError::validation(format!(
            "prompt token id {bad} is not in the model's vocabulary ({} tokens)",
            tok.vocab_size()
        ))
        .with_param("prompt"));
    }
    let text = tok
        .decode(&ids, false)
        .map_err(|e| ApiError::validation(format!("decoding the prompt's token ids: {e}")))?;
    build(model, text, ids.into(), spec, None, check)
}

/// The scheduler request for a tokenized prompt, checked against the model's limits.
fn build(
    model: &LoadedModel,
    prompt_text: String,
    prompt: lmi_scheduler::Prompt,
    mut spec: GenerationSpec,
    reasoning: Option<crate::reasoning::ReplyReasoning>,
    check: impl FnOnce(usize, &mut GenerationSpec) -> Result<(), ApiError>,
) -> Result<Job, ApiError> {
    let tok = &model.tokenizer;
    let mut ids = prompt.to_vec();
    if ids.is_empty() {
        return Err(ApiError::validation("`inputs` cannot be empty").with_param("inputs"));
    }
    let mut prompt = Some(prompt);
    if let Some(t) = spec.truncate
        && t > 0
        && ids.len() > t
    {
        if prompt.as_ref().is_some_and(|p| !p.media().is_empty()) {
            return Err(ApiError::validation(format!(
                "truncate={t} would cut a prompt with images ({} tokens): raise truncate or \
                 send a shorter prompt",
                ids.len()
            ))
            .with_param("truncate"));
        }
        ids.drain(..ids.len() - t);
        prompt = None;
    }
    if spec.beam.is_some() && spec.stream {
        // As LMI: beams change until the search ends, so there is nothing to stream.
        return Err(ApiError::validation(
            "beam search cannot stream: send the request with \"stream\": false, or without beams",
        )
        .with_param("stream"));
    }
    let max_len = model.max_model_len;
    spec.fit_context(ids.len(), max_len)?;
    check(ids.len(), &mut spec)?;
    let adapter = model
        .adapters
        .resolve(spec.adapter.as_deref())
        .map_err(|e| ApiError::validation(e.to_string()).with_param("adapters"))?;
    let mut bad_words = spec.bad_word_ids.clone();
    for w in &spec.bad_words {
        let seq = tok
            .encode(w, false)
            .map_err(|e| ApiError::validation(format!("bad word {w:?}: {e}")))?;
        if !seq.is_empty() {
            bad_words.push(seq);
        }
    }
    let seed = spec.seed.unwrap_or_else(random_seed);
    let top_n = spec.top_n_tokens.max(spec.logprobs.unwrap_or(0));
    let sampling = SamplingParams {
        temperature: spec.temperature,
        top_k: spec.top_k,
        top_p: spec.top_p,
        min_p: spec.min_p,
        typical_p: spec.typical_p,
        repetition_penalty: spec.repetition_penalty,
        presence_penalty: spec.presence_penalty,
        frequency_penalty: spec.frequency_penalty,
        no_repeat_ngram_size: spec.no_repeat_ngram_size,
        logit_bias: spec.logit_bias.clone(),
        bad_words,
        min_new_tokens: spec.min_new_tokens as u32,
        seed,
        top_logprobs: top_n,
        logprob: spec.needs_token_logprobs(),
    };
    let prompt_logprobs = if spec.decoder_input_details || spec.prompt_logprobs.is_some() {
        Some(spec.prompt_logprobs.unwrap_or(0).max(top_n))
    } else {
        None
    };
    let request = GenerateRequest {
        prompt: prompt.unwrap_or_else(|| ids.clone().into()),
        sampling,
        stopping: StoppingParams {
            max_new_tokens: spec.max_new_tokens,
            stop_token_ids: spec.stop_token_ids.clone(),
            stop_strings: spec.stop_strings.clone(),
            include_stop_str_in_output: spec.include_stop_str_in_output,
            ignore_eos: spec.ignore_eos,
        },
        // Beams return their hypotheses as sequences 0..num_return themselves.
        n: if spec.beam.is_some() {
            1
        } else {
            spec.n.max(1) as usize
        },
        best_of: if spec.beam.is_some() {
            1
        } else {
            spec.best_of.max(spec.n).max(1) as usize
        },
        prompt_logprobs,
        skip_special_tokens: spec.skip_special_tokens,
        adapter,
        constraint: spec
            .constraint
            .as_ref()
            .map(|c| model.grammars.compile(c))
            .transpose()?,
        pin_prefix_tokens: 0,
        beam: spec.beam.as_ref().map(|b| lmi_scheduler::BeamParams {
            width: b.width as usize,
            length_penalty: b.length_penalty,
            early_stopping: match b.early_stopping {
                EarlyStop::Heuristic => lmi_scheduler::EarlyStopping::Heuristic,
                EarlyStop::Done => lmi_scheduler::EarlyStopping::Done,
                EarlyStop::Never => lmi_scheduler::EarlyStopping::Never,
            },
            num_return: b.num_return as usize,
        }),
        draft: match &spec.draft {
            None => Vec::new(),
            Some(Draft::Tokens(ids)) => ids.clone(),
            Some(Draft::Text(text)) => tok.encode(text, false).map_err(|e| {
                ApiError::validation(format!("tokenizing the prediction: {e}"))
                    .with_param("prediction")
            })?,
        },
    };
    Ok(Job {
        prompt_text,
        prompt_ids: ids,
        spec,
        seed,
        request,
        reasoning,
    })
}

/// n, best_of and the beam width within option.max_sequences_per_request: each sequence holds
/// KV blocks and a batch slot, so one request must not take the whole server.
fn check_sequences(spec: &GenerationSpec, max: usize) -> Result<(), ApiError> {
    let beams = spec.beam.as_ref().map_or(0, |b| b.width as usize);
    let (param, asked) = [
        ("n", spec.n as usize),
        ("best_of", spec.best_of as usize),
        ("num_beams", beams),
    ]
    .into_iter()
    .rev() // max_by_key keeps the last of equals: name n before best_of
    .max_by_key(|&(_, v)| v)
    .unwrap_or(("n", 0));
    if asked > max {
        return Err(ApiError::validation(format!(
            "{param} must be at most {max} on this server (option.max_sequences_per_request), got {asked}"
        ))
        .with_param(param));
    }
    Ok(())
}

/// Hands a job to the scheduler.
pub fn submit(model: &LoadedModel, job: &Job) -> Result<RequestStream, ApiError> {
    model
        .handle
        .submit(job.request.clone())
        .map_err(submit_error)
}

pub fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull(_) => ApiError::overloaded(),
        SubmitError::Stopped => ApiError::unhealthy(),
        // Sampling parameters are validated once, here (Handle::submit), before anything
        // is queued; the message starts with the field's name.
        SubmitError::InvalidParams(m) => {
            let field = m.split(' ').next().unwrap_or("").to_string();
            ApiError::validation(m).with_param(field)
        }
        other => ApiError::validation(other.to_string()),
    }
}

/// One streamed token, with its alternatives and, on a sequence's last token, the result.
pub struct StreamToken {
    pub index: u32,
    pub token: TokenOut,
    pub top: Vec<TokenOut>,
    pub finish: Option<FinishReason>,
}

pub enum StreamItem {
    Token(StreamToken),
    Error(ApiError),
}

#[derive(Default)]
struct SeqAcc {
    tokens: Vec<TokenOut>,
    top: Vec<Vec<TokenOut>>,
    finished: Option<Finished>,
}

/// Folds scheduler events into the neutral result.
pub struct Accumulator {
    tokenizer: lmi_text::Tokenizer,
    prompt_text: String,
    prompt_tokens: usize,
    seed: u64,
    keep: usize,
    want_top: bool,
    prefill: Vec<TokenOut>,
    prefill_top: Vec<Vec<TokenOut>>,
    seqs: Vec<SeqAcc>,
}

fn to_finish(r: lmi_scheduler::FinishReason) -> FinishReason {
    match r {
        lmi_scheduler::FinishReason::Length => FinishReason::Length,
        lmi_scheduler::FinishReason::EosToken => FinishReason::EosToken,
        lmi_scheduler::FinishReason::StopSequence => FinishReason::StopSequence,
    }
}

impl Accumulator {
    pub fn new(model: &LoadedModel, job: &Job) -> Self {
        Accumulator {
            tokenizer: model.tokenizer.clone(),
            prompt_text: job.prompt_text.clone(),
            prompt_tokens: job.prompt_ids.len(),
            seed: job.seed,
            keep: job
                .request
                .beam
                .as_ref()
                .map_or(job.request.n, |b| b.num_return),
            want_top: job.request.sampling.top_logprobs > 0,
            prefill: Vec::new(),
            prefill_top: Vec::new(),
            seqs: Vec::new(),
        }
    }

    fn piece(&self, id: u32, logprob: f32) -> TokenOut {
        let text = self.tokenizer.decode(&[id], false).unwrap_or_default();
        TokenOut::new(id, text, Some(logprob), self.tokenizer.is_special(id))
    }

    /// Applies one event; returns what a streaming response should send for it.
    pub fn apply(&mut self, e: Event) -> Option<StreamItem> {
        match e {
            Event::Prefill(p) => {
                if p.iter().any(|t| !t.top.is_empty()) {
                    self.prefill_top = p
                        .iter()
                        .map(|t| t.top.iter().map(|&(id, lp)| self.piece(id, lp)).collect())
                        .collect();
                }
                self.prefill = p
                    .into_iter()
                    .map(|t| {
                        let mut o = self.piece(t.id, t.logprob.unwrap_or(0.0));
                        o.logprob = t.logprob;
                        o
                    })
                    .collect();
                None
            }
            Event::Token(t) => {
                let i = t.index as usize;
                while self.seqs.len() <= i {
                    self.seqs.push(SeqAcc::default());
                }
                let top: Vec<TokenOut> = t.top.iter().map(|&(id, lp)| self.piece(id, lp)).collect();
                let token = TokenOut::new(t.id, t.text, Some(t.logprob), t.special);
                let s = &mut self.seqs[i];
                s.tokens.push(token.clone());
                if self.want_top {
                    s.top.push(top.clone());
                }
                Some(StreamItem::Token(StreamToken {
                    index: t.index,
                    token,
                    top,
                    finish: t.finish.map(to_finish),
                }))
            }
            Event::Finished(f) => {
                let i = f.index as usize;
                while self.seqs.len() <= i {
                    self.seqs.push(SeqAcc::default());
                }
                self.seqs[i].finished = Some(f);
                None
            }
            Event::Error(m) => Some(StreamItem::Error(ApiError::generation(m))),
            Event::Pooled(_) => Some(StreamItem::Error(ApiError::generation(
                "a generation request got a pooled output",
            ))),
        }
    }

    /// Timings of sequence 0, once finished (for metrics).
    pub fn timings(&self) -> Option<&lmi_scheduler::Timings> {
        self.seqs.first()?.finished.as_ref().map(|f| &f.timings)
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// The prompt's tokens with their logprobs, and their alternatives, once the prefill is
    /// done (empty unless prompt logprobs were asked).
    pub fn prefill(&self) -> (&[TokenOut], &[Vec<TokenOut>]) {
        (&self.prefill, &self.prefill_top)
    }

    pub fn generated_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// Draft tokens (speculative decoding) kept and left out, over the finished sequences.
    pub fn draft_tokens(&self) -> (usize, usize) {
        let done = || self.seqs.iter().filter_map(|s| s.finished.as_ref());
        (
            done().map(|f| f.accepted_draft_tokens).sum(),
            done().map(|f| f.rejected_draft_tokens).sum(),
        )
    }

    /// The result so far for sequence 0 (streams finish one sequence: n = 1).
    pub fn snapshot(&self, finish: FinishReason) -> GenerationOut {
        let s = self.seqs.first();
        let tokens = s.map(|s| s.tokens.clone()).unwrap_or_default();
        GenerationOut {
            inputs: self.prompt_text.clone(),
            prompt_tokens: self.prompt_tokens,
            prefill: self.prefill.clone(),
            prefill_top: self.prefill_top.clone(),
            best: SequenceOut {
                text: tokens.iter().map(|t| t.text.as_str()).collect(),
                finish_reason: finish,
                generated_tokens: tokens.len(),
                tokens,
                top_tokens: s.map(|s| s.top.clone()).unwrap_or_default(),
                seed: Some(self.seed),
                accepted_draft_tokens: 0,
                rejected_draft_tokens: 0,
            },
            others: Vec::new(),
        }
    }

    /// The final result: sequences ranked by cumulative logprob (best_of), the best `n` kept.
    pub fn finish(self) -> Result<GenerationOut, ApiError> {
        let mut seqs: Vec<(f64, usize, SequenceOut)> = Vec::new();
        for (i, s) in self.seqs.into_iter().enumerate() {
            let f = s.finished.ok_or_else(ApiError::incomplete)?;
            seqs.push((
                f.cumulative_logprob,
                i,
                SequenceOut {
                    text: f.text,
                    finish_reason: to_finish(f.reason),
                    generated_tokens: f.generated_tokens,
                    tokens: s.tokens,
                    top_tokens: s.top,
                    seed: Some(self.seed),
                    accepted_draft_tokens: f.accepted_draft_tokens,
                    rejected_draft_tokens: f.rejected_draft_tokens,
                },
            ));
        }
        if seqs.is_empty() {
            return Err(ApiError::incomplete());
        }
        if seqs.len() > self.keep {
            seqs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        }
        let mut it = seqs.into_iter().map(|(_, _, s)| s);
        let best = it.next().ok_or_else(ApiError::incomplete)?;
        let others: Vec<SequenceOut> = it.collect();
        Ok(GenerationOut {
            inputs: self.prompt_text,
            prompt_tokens: self.prompt_tokens,
            prefill: self.prefill,
            prefill_top: self.prefill_top,
            best,
            others,
        })
    }
}

/// Runs a job to the end; reports it to the request's metrics tracker.
pub async fn run(
    model: &LoadedModel,
    job: &Job,
    tracker: crate::metrics::RequestTracker,
) -> Result<GenerationOut, ApiError> {
    let mut stream = match submit(model, job) {
        Ok(s) => s,
        Err(e) => {
            fail(tracker, &e);
            return Err(e);
        }
    };
    let mut acc = Accumulator::new(model, job);
    while let Some(e) = stream.recv().await {
        if let Some(StreamItem::Error(err)) = acc.apply(e) {
            report(tracker, &acc, Some(err.error_type()), None);
            return Err(err);
        }
    }
    report(tracker, &acc, None, Some(job.spec.max_new_tokens));
    acc.finish()
}

/// Reports a request that failed before generating.
pub fn fail(tracker: crate::metrics::RequestTracker, e: &ApiError) {
    tracker.finish(crate::metrics::RequestOutcome {
        error: Some(e.error_type()),
        ..Default::default()
    });
}

/// Reports a finished (or failed) request to the metrics.
pub fn report(
    tracker: crate::metrics::RequestTracker,
    acc: &Accumulator,
    error: Option<&str>,
    max_new_tokens: Option<usize>,
) {
    let t = acc.timings();
    tracker.finish(crate::metrics::RequestOutcome {
        error,
        duration: std::time::Duration::ZERO,
        queue: t.map(|t| t.queue),
        time_to_first_token: t.map(|t| t.time_to_first_token),
        inter_token: t.map(|t| t.inter_token.as_slice()).unwrap_or(&[]),
        prompt_tokens: acc.prompt_tokens(),
        generated_tokens: acc.generated_tokens(),
        max_new_tokens,
    });
}

/// The loaded model, or 503 while loading; on an embedding or scoring model the 400 that
/// names the routes it serves (every generation route starts here).
pub fn loaded(state: &Arc<AppState>) -> Result<&LoadedModel, ApiError> {
    let model = state.model().ok_or_else(ApiError::unhealthy)?;
    crate::pooling::require_generative(state).map_err(|e| ApiError::wrong_task(e.message))?;
    Ok(model)
}
