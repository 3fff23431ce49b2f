//! `lmi infer`: runs a TensorRT Edge-LLM batch input file (seed 000) through the rolling-batch
//! scheduler and writes `{"responses": [...]}` in request order.
//!
//! Order of work: the whole file is read and validated, then the model directory is resolved
//! and checked against the file (vision items, prompt lengths), and only then are the weights
//! loaded and requests run. Any failure exits non-zero and writes nothing.
//!
//! Batching: every request is queued at once and the scheduler runs at most `batch_size` of
//! them at a time (its `max_batch_size`), taking the next waiting request as soon as a running
//! one finishes. Requests of one batch may use different LoRA adapters (per-row adapters).
//! Sampling: the file's temperature / top_p / top_k apply to every request; request `i` draws
//! with seed `--seed + i`, and the engine's counter-based RNG makes its tokens independent of
//! what else is in the batch, so a file gives the same output for any batch_size.

use crate::infer as parts;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use lmi_checkpoint::peft::{LoraLimits, LoraWeights};
use lmi_engine::engine::EngineOptions;
use lmi_engine::sampling::SamplingParams;
use lmi_engine::{BLOCK_SIZE, DType, Device, ModelConfig};
use lmi_scheduler::{
    AdapterRef, AdapterWeights, Event, FinishReason, GenerateRequest, Handle, SchedulerConfig,
};
use lmi_text::Tokenizer;

use parts::input::InferInput;
use parts::output::{
    InferOutput, Response, ResponseTimings, Summary, check_writable, write_atomically,
};
use parts::prompt::{Prompt, PromptBuilder, TemplateSource, load_template};

use crate::reasoning::ReplyReasoning;

#[derive(clap::Args)]
pub struct Args {
    /// The batch input file (TensorRT Edge-LLM format).
    #[arg(long, short)]
    input: PathBuf,
    /// Where to write the responses JSON; stdout when absent. Written only when every request
    /// succeeded.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// HF model directory or GGUF file, Hub id org/name[:QUANT] or s3://bucket/prefix/; the
    /// default model when absent.
    #[arg(long)]
    model: Option<String>,
    /// Device: cpu, cuda or cuda:<ordinal>.
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Weight dtype in memory (f32, bf16 or int8); when absent the checkpoint's (a GGUF's
    /// quantized blocks as they are).
    #[arg(long)]
    dtype: Option<DType>,
    /// Request i samples with seed `seed + i`.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Memory for the KV cache, in MiB.
    #[arg(long, default_value_t = 1024)]
    kv_cache_mib: usize,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    // 1. The file, whole.
    let input = InferInput::from_file(&a.input)?;
    for w in &input.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(out) = &a.output {
        check_writable(out)?;
    }
    input.check_media_files().map_err(anyhow::Error::msg)?;
    input.check_lora_paths().map_err(anyhow::Error::msg)?;

    // 2. The model's description, checked against the file before any weight is loaded.
    let resolved = lmi_store::resolve(a.model.as_deref(), true)?;
    let dir = resolved.dir.clone();
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let model_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string());
    if config.vision.is_none()
        && let Some(m) = input.media_items().first()
    {
        bail!(
            "request {}, message {}: {} items need a vision encoder, and this model ({model_name}, {}) has none: remove the {} items or use a vision-language model",
            m.request,
            m.message,
            m.kind,
            config.architecture.hf_name(),
            m.kind
        );
    }
    let tokenizer = Tokenizer::from_dir(&dir).context("loading the tokenizer")?;
    let (template, source) = load_template(&dir, &tokenizer, &mut |w| eprintln!("warning: {w}"))?;
    let builder = PromptBuilder::new(
        template,
        source,
        input.apply_chat_template,
        input.enable_thinking,
    );
    if builder.lacks_template() {
        eprintln!(
            "warning: {model_name} has no chat template: apply_chat_template is true, but messages are concatenated raw"
        );
    }
    // A vision-language model reads the items' files (relative to the working directory, as
    // seed 000 says); the batch file sets no per-prompt limit.
    let vision = crate::media::VisionSetup::for_model(
        &dir,
        &config,
        &tokenizer,
        &crate::config::media::MediaOptions {
            max_images: usize::MAX,
            max_videos: usize::MAX,
            ..Default::default()
        },
    )?
    .map(|mut v| {
        v.files_from = Some(PathBuf::from("."));
        v
    });
    let prompts = build_prompts(
        &input,
        &builder,
        &tokenizer,
        config.max_position_embeddings,
        vision.as_ref(),
    )?;

    // 3. The engine, its adapters, the scheduler.
    let load_started = Instant::now();
    let opts = EngineOptions {
        dtype: a.dtype,
        gguf: resolved.gguf.clone(),
        kv_cache_bytes: a.kv_cache_mib << 20,
        ..Default::default()
    };
    let engine = lmi_engine::open(a.device, &dir, &opts)
        .with_context(|| format!("loading the model {}", dir.display()))?;
    let adapter_ids = load_adapters(engine.model_config(), &input)?;
    let needed = prompts
        .iter()
        .map(|(p, _)| (p.ids.len() + input.max_generate_length).div_ceil(BLOCK_SIZE))
        .max()
        .unwrap_or(0);
    if needed > engine.num_blocks() {
        bail!(
            "the longest request needs {needed} KV blocks of {BLOCK_SIZE} tokens, but the cache holds {}: raise --kv-cache-mib or lower max_generate_length",
            engine.num_blocks()
        );
    }
    eprintln!(
        "loaded {model_name} in {:.1} s (chat template: {}); running {} requests, batch_size {}",
        load_started.elapsed().as_secs_f64(),
        match builder.source {
            TemplateSource::JsonFile => "processed_chat_template.json",
            TemplateSource::DerivedFromJinja => "derived from the Jinja template",
            TemplateSource::Jinja => "Jinja",
            TemplateSource::None => "none",
        },
        input.requests.len(),
        input.batch_size
    );
    let handle = Handle::spawn(
        engine,
        tokenizer,
        SchedulerConfig {
            max_batch_size: input.batch_size,
            max_batch_tokens: crate::config::default_step_tokens(a.device),
            max_model_len: config.max_position_embeddings,
            max_waiting: input.requests.len() + 1,
            max_loras: input.available_lora_weights.len().max(1),
            ..Default::default()
        },
    );

    // 4. Run.
    let out = run_requests(&handle, &input, prompts, &adapter_ids, a.seed, &model_name)?;
    handle.shutdown();

    // 5. Write, whole.
    let json = serde_json::to_string_pretty(&out)? + "\n";
    match &a.output {
        Some(path) => {
            write_atomically(path, &json)?;
            eprintln!("wrote {}", path.display());
        }
        None => {
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(json.as_bytes())?;
            stdout.flush()?;
        }
    }
    eprintln!("{}", out.summary.line());
    Ok(())
}

fn build_prompts(
    input: &InferInput,
    builder: &PromptBuilder,
    tokenizer: &Tokenizer,
    max_len: usize,
    vision: Option<&crate::media::VisionSetup>,
) -> anyhow::Result<Vec<(Prompt, lmi_scheduler::Prompt)>> {
    let mut prompts = Vec::with_capacity(input.requests.len());
    for (i, r) in input.requests.iter().enumerate() {
        let items = crate::media::load_all(vision, &crate::media::refs_of_messages(&r.messages))
            .map_err(|e| anyhow::anyhow!("request {i}: {}", e.message))?;
        // Gemma 4 writes a video's frames into the text before tokenizing.
        let rewrite = |text: &str| {
            crate::media::gemma4_video::rewrite_text(vision, text, &items)
                .map(|t| t.into_owned())
                .map_err(|e| anyhow::anyhow!("{}", e.message))
        };
        let mut p = builder
            .build_with(tokenizer, &r.messages, rewrite)
            .with_context(|| {
                format!("request {i}: field \"messages\": cannot render the prompt")
            })?;
        // Each item's placeholder widened to its patches' tokens.
        let spans = crate::media::expand(vision, p.ids.clone(), items)
            .map_err(|e| anyhow::anyhow!("request {i}: {}", e.message))?;
        p.ids = spans.to_vec();
        if p.ids.is_empty() {
            bail!("request {i}: field \"messages\": the prompt is empty after tokenization");
        }
        if p.ids.len() + input.max_generate_length > max_len {
            bail!(
                "request {i}: field \"messages\": the prompt has {} tokens, and with max_generate_length {} that exceeds the model's maximum length of {max_len} tokens",
                p.ids.len(),
                input.max_generate_length
            );
        }
        prompts.push((p, spans));
    }
    Ok(prompts)
}

/// Reads every adapter of `available_lora_weights` (ids 1.. in name order; the scheduler
/// loads them into the engine as requests need them); returns each request's adapter.
fn load_adapters(
    config: &ModelConfig,
    input: &InferInput,
) -> anyhow::Result<Vec<Option<AdapterRef>>> {
    let mut refs = std::collections::HashMap::new();
    for (k, (name, path)) in input.available_lora_weights.iter().enumerate() {
        let weights =
            LoraWeights::load(path, config, LoraLimits::default()).with_context(|| {
                format!(
                    "field \"available_lora_weights\", adapter \"{name}\": cannot load {}",
                    path.display()
                )
            })?;
        let adapter = AdapterRef {
            id: k as u64 + 1,
            name: Arc::from(name.as_str()),
            weights: Arc::new(AdapterWeights::ready(Arc::new(weights))),
        };
        refs.insert(name.as_str(), adapter);
    }
    Ok(input
        .requests
        .iter()
        .map(|r| r.lora_name.as_deref().and_then(|n| refs.get(n).cloned()))
        .collect())
}

fn run_requests(
    handle: &Handle,
    input: &InferInput,
    prompts: Vec<(Prompt, lmi_scheduler::Prompt)>,
    adapters: &[Option<AdapterRef>],
    seed: u64,
    model_name: &str,
) -> anyhow::Result<InferOutput> {
    let n = input.requests.len();
    let started = Instant::now();
    let mut streams = Vec::with_capacity(n);
    let mut readers = Vec::with_capacity(n);
    for (i, ((p, spans), r)) in prompts.into_iter().zip(&input.requests).enumerate() {
        let mut req = GenerateRequest::new(p.ids);
        req.prompt = spans;
        req.sampling = SamplingParams {
            temperature: input.temperature,
            top_p: input.top_p,
            top_k: input.top_k,
            seed: seed.wrapping_add(i as u64),
            ..Default::default()
        };
        req.sampling
            .validate()
            .map_err(|e| anyhow::anyhow!("request {i}: {e}"))?;
        req.stopping.max_new_tokens = input.max_generate_length;
        // Harmony's channels are special tokens: its reader needs them in the text.
        if p.reasoning.is_some_and(|r| r.format.reads_special_tokens()) {
            req.skip_special_tokens = false;
        }
        readers.push(p.reasoning);
        req.adapter = adapters[i].clone();
        if r.save_system_prompt_kv_cache {
            req.pin_prefix_tokens = p.system_tokens;
        }
        streams.push(
            handle
                .submit(req)
                .map_err(|e| anyhow::anyhow!("request {i}: {e}"))?,
        );
    }

    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} requests {msg}",
        )?
        .progress_chars("=> "),
    );
    let done = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (bar, done, handle) = (bar.clone(), done.clone(), handle.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let m = handle.metrics().snapshot();
                let secs = started.elapsed().as_secs_f64().max(1e-9);
                bar.set_message(format!(
                    "{} tokens generated, {:.1} tok/s, {} running",
                    m.generated_tokens,
                    m.generated_tokens as f64 / secs,
                    m.running
                ));
                bar.tick();
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    let result = collect(&mut streams, &readers, &bar);
    done.store(true, Ordering::Relaxed);
    let _ = ticker.join();
    bar.finish_and_clear();
    let responses = result?;

    let wall = started.elapsed().as_secs_f64();
    let sum = |f: fn(&Response) -> usize| responses.iter().map(f).sum::<usize>();
    let generated = sum(|r| r.generated_tokens);
    let summary = Summary {
        model: model_name.to_owned(),
        requests: n,
        batch_size: input.batch_size,
        prompt_tokens: sum(|r| r.prompt_tokens),
        generated_tokens: generated,
        reused_prompt_tokens: sum(|r| r.reused_prompt_tokens),
        wall_time_s: wall,
        generated_tokens_per_second: generated as f64 / wall.max(1e-9),
    };
    Ok(InferOutput { responses, summary })
}

/// Reads every stream to its end, in request order.
fn collect(
    streams: &mut [lmi_scheduler::RequestStream],
    readers: &[Option<ReplyReasoning>],
    bar: &ProgressBar,
) -> anyhow::Result<Vec<Response>> {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut responses = Vec::with_capacity(streams.len());
    for (i, stream) in streams.iter_mut().enumerate() {
        let (mut finished, mut last) = (None, None);
        while let Some(ev) = stream.blocking_recv() {
            match ev {
                Event::Finished(f) => finished = Some(f),
                Event::Error(e) => bail!("request {i}: generation failed: {e}"),
                Event::Token(t) => last = Some(t),
                Event::Prefill(_) => {}
                Event::Pooled(_) => bail!("request {i}: got a pooled output, not tokens"),
            }
        }
        let f = finished
            .with_context(|| format!("request {i}: the scheduler stopped before it finished"))?;
        let total = f.timings.total.as_secs_f64();
        let (reasoning_text, output_text) = match readers.get(i).copied().flatten() {
            Some(r) => {
                // Kept special tokens leave the EOS token's text at the end: not the reply's.
                let text = match &last {
                    Some(t) if t.special && f.reason == FinishReason::EosToken => {
                        f.text.strip_suffix(t.text.as_str()).unwrap_or(&f.text)
                    }
                    _ => &f.text,
                };
                lmi_text::split_reasoning(r.format, text, r.starts_inside)
            }
            None => (None, f.text),
        };
        responses.push(Response {
            output_text,
            reasoning_text,
            finish_reason: f.reason.as_str(),
            prompt_tokens: f.prompt_tokens,
            generated_tokens: f.generated_tokens,
            reused_prompt_tokens: f.cached_prompt_tokens,
            timings: ResponseTimings {
                queue_ms: ms(f.timings.queue),
                time_to_first_token_ms: ms(f.timings.time_to_first_token),
                total_ms: ms(f.timings.total),
                tokens_per_second: if total > 0.0 {
                    f.generated_tokens as f64 / total
                } else {
                    0.0
                },
            },
        });
        bar.inc(1);
    }
    Ok(responses)
}
