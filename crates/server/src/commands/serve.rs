//! `lmi serve`: the HTTP server. The port is bound at once and the model loads in the
//! background, so `/ping` answers 503 ("PENDING") until it is ready rather than refusing
//! connections (LMI's `wait_model_loading=true` would bind only after loading; SageMaker and
//! Kubernetes probes both handle 503 better than connection refused). SIGTERM / SIGINT stop
//! accepting, finish in-flight requests (for at most option.drain_timeout), stop the
//! scheduler, and exit 0.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use lmi_engine::engine::StepShape;
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_scheduler::{Handle, SchedulerConfig};
use lmi_text::tools::ToolCallFormat;
use lmi_text::{ChatTemplate, Tokenizer};

use crate::app::{AppState, LoadedModel};
use crate::config::{EngineMode, ServeArgs, ServingConfig};
use crate::grammars::{Grammars, GuideSource};
use crate::metrics::ServerMetrics;
use crate::models::Registry;
use crate::null_engine::NullEngine;
use lmi_scheduler::adapter_registry::{AdapterRegistry, AllowedDirs, Registration};

/// How long to wait for the scheduler thread to drain after the HTTP server has stopped.
const SCHEDULER_DRAIN: Duration = Duration::from_secs(30);

/// `lmi serve` flags (boxed: they are many, and `Command` holds one of each subcommand's).
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub serve: Box<ServeArgs>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let config = ServingConfig::from_process(&a.serve)?;
    eprintln!("{}", config.summary());
    if let Some(n) = config.tensor_parallel_degree.filter(|n| *n > 1) {
        tracing::warn!(
            "tensor_parallel_degree {n} (SM_NUM_GPUS or option.tensor_parallel_degree): one process serves on one GPU; run one replica per GPU"
        );
    }
    // Before the port is bound: a GPU that cannot be used is a configuration error.
    lmi_engine::check_device(config.device)
        .with_context(|| format!("option.device={}", config.device))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lmi-http")
        .build()
        .context("starting the async runtime")?;
    let result = rt.block_on(serve(config));
    // A model load still running (signal during loading) must not hold the exit.
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The name the model answers to, and its id for TGI's /info.
pub fn model_names(config: &ServingConfig) -> (String, String) {
    let id = config
        .model_id
        .clone()
        .unwrap_or_else(|| lmi_store::DEFAULT_MODEL_NAME.to_string());
    let name = config
        .served_model_name
        .clone()
        .unwrap_or_else(|| match &config.model_id {
            None => lmi_store::DEFAULT_MODEL_NAME.to_string(),
            Some(m) => {
                // A Hub id: served under the repository's id, as vLLM and TGI do.
                if let Ok(lmi_store::ModelSource::Hub(r)) =
                    lmi_store::ModelSource::parse(Some(m), None)
                {
                    return r.repo;
                }
                let p = Path::new(m.trim_end_matches('/'));
                let stem = if p
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
                {
                    p.file_stem()
                } else {
                    p.file_name()
                };
                stem.map(|s| s.to_string_lossy().into_owned())
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| m.clone())
            }
        });
    (name, id)
}

async fn serve(config: ServingConfig) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let (model_name, model_id) = model_names(&config);
    // The first model shares its metrics with the guard layers (401s, timeouts), so a server
    // of one model counts them where it always did.
    let metrics = Arc::new(ServerMetrics::new());
    let front = Arc::new(AppState::new(
        config.clone(),
        metrics.clone(),
        model_name.clone(),
        model_id.clone(),
    ));
    let registry = Registry::new(config.clone(), front);
    let starting = register_start_models(&registry, &config, metrics, model_name, model_id)?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    tracing::info!(
        "listening on {} (models {:?} loading)",
        listener.local_addr()?,
        starting
            .iter()
            .map(|s| s.model_name.as_str())
            .collect::<Vec<_>>()
    );

    let load_error: Arc<Mutex<Option<anyhow::Error>>> = Arc::default();
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<()>();
    {
        let registry = registry.clone();
        let load_error = load_error.clone();
        // One at a time: they share the CPU threads (and the disk).
        tokio::task::spawn_blocking(move || {
            for state in starting {
                match load_model(&state.config, &state.metrics) {
                    Ok(model) => {
                        crate::release_freed_memory();
                        let what = format!(
                            "{} ({} backend, {}, max_model_len {}, {} KV blocks, {} adapters)",
                            model.model_dir.display(),
                            model.backend,
                            model.dtype,
                            model.max_model_len,
                            model.handle.limits().num_blocks,
                            model.adapters.len()
                        );
                        registry.finish_start(&state.model_name, Ok(model));
                        if state.is_ready() {
                            tracing::info!("model ready: {what}");
                        }
                    }
                    Err(e) => {
                        tracing::error!("loading the model {:?} failed: {e:#}", state.model_name);
                        if let Ok(mut slot) = load_error.lock() {
                            *slot = Some(e);
                        }
                        let _ = failed_tx.send(());
                        return;
                    }
                }
            }
        });
    }

    let app = crate::router::front(registry.clone());
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("TCP_NODELAY: {e}");
        }
    });
    // Set once a signal starts the drain, so the drain can be bounded.
    let draining = Arc::new(tokio::sync::Notify::new());
    let shutdown = {
        let draining = draining.clone();
        async move {
            tokio::select! {
                _ = shutdown_signal() => {
                    tracing::info!("shutting down: no new connections, finishing in-flight requests");
                    draining.notify_one();
                }
                Ok(()) = failed_rx => {}
            }
        }
    };
    let drain_limit = Duration::from_secs(config.drain_timeout_secs);
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    let mut drained = true;
    tokio::select! {
        r = server => r.context("HTTP server")?,
        _ = async {
            draining.notified().await;
            tokio::time::sleep(drain_limit).await;
        } => {
            tracing::warn!(
                "requests still in flight after option.drain_timeout ({drain_limit:?}); exiting"
            );
            drained = false;
        }
    }

    if let Some(e) = load_error.lock().ok().and_then(|mut e| e.take()) {
        return Err(e.context("loading the model"));
    }
    if drained {
        // Every scheduler finishes its work and stops (each waits for its routes to let go).
        if tokio::time::timeout(SCHEDULER_DRAIN, registry.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("the schedulers did not stop within {SCHEDULER_DRAIN:?}");
        }
    } else {
        tracing::warn!("requests still hold the server state; not waiting for the schedulers");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Registers the models loaded at start (the first is `option.model_id`, or the embedded
/// default unless option.models_dir or SAGEMAKER_MULTI_MODEL let the server start with
/// none; then `option.models` / repeated `--model`) and the ones option.models_dir makes
/// loadable. Returns the states to load, in order.
fn register_start_models(
    registry: &Arc<Registry>,
    config: &Arc<ServingConfig>,
    metrics: Arc<ServerMetrics>,
    model_name: String,
    model_id: String,
) -> anyhow::Result<Vec<Arc<AppState>>> {
    let mut starting = Vec::new();
    let m = &config.models;
    let none_at_start =
        config.model_id.is_none() && (m.models_dir.is_some() || m.sagemaker_multi_model);
    if !none_at_start {
        let state = Arc::new(AppState::new(
            config.clone(),
            metrics,
            model_name,
            model_id.clone(),
        ));
        registry.add_starting(state.clone(), &model_id);
        starting.push(state);
    }
    for (name, spec) in &m.extra {
        let name = match name {
            Some(n) => n.clone(),
            None => {
                let mut c = (**config).clone();
                c.model_id = Some(spec.clone());
                c.served_model_name = None;
                model_names(&c).0
            }
        };
        if registry.get(&name).is_some() {
            anyhow::bail!(
                "two models are named {name:?} (option.models / --model): name one with NAME=PATH"
            );
        }
        let state = registry
            .state_for(&name, spec)
            .with_context(|| format!("model {name:?} ({spec})"))?;
        registry.add_starting(state.clone(), spec);
        starting.push(state);
    }
    if let Some(dir) = &m.models_dir {
        let before = registry.slots().len();
        for (name, path) in crate::config::models::scan_dir(dir)? {
            registry.add_loadable(&name, &path.to_string_lossy());
        }
        tracing::info!(
            "option.models_dir {}: {} models loadable on demand",
            dir.display(),
            registry.slots().len() - before
        );
    }
    Ok(starting)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Resolves, loads and starts everything the routes need (blocking: run off the runtime).
pub fn load_model(config: &ServingConfig, metrics: &ServerMetrics) -> anyhow::Result<LoadedModel> {
    let resolved = lmi_store::resolve_with(config.model_id.as_deref(), &config.fetch)?;
    let dir = resolved.dir.clone();
    let tokenizer = Tokenizer::from_dir(&dir)
        .with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
    let chat_template = ChatTemplate::from_model_dir(&dir)
        .with_context(|| format!("loading the chat template of {}", dir.display()))?;
    // An embedding or scoring model runs each input whole in one step: the step budget must
    // hold its longest input (sized before the engine, whose step buffers follow it).
    let step_tokens = match pooler_hint(&dir, config) {
        Some(max_input) => crate::config::pooling::step_tokens(config, max_input),
        None => config.max_rolling_batch_prefill_tokens,
    };
    if step_tokens != config.max_rolling_batch_prefill_tokens {
        tracing::info!(
            "tokens per step raised from {} to {step_tokens}: an embedding or scoring input runs \
             whole in one step (option.max_rolling_batch_prefill_tokens sets it)",
            config.max_rolling_batch_prefill_tokens
        );
    }
    let (engine, dtype): (Box<dyn StepEngine>, String) = match config.engine_mode {
        EngineMode::Model => {
            let dtype = config.engine_dtype_for(&resolved);
            let source = resolved.gguf.as_deref().unwrap_or(&dir);
            let opts = EngineOptions {
                dtype,
                kv_cache_bytes: config.kv_cache_bytes,
                kv_blocks: None,
                memory_fraction: config.gpu_memory_utilization,
                gguf: resolved.gguf.clone(),
                max_step: StepShape {
                    seqs: config.max_rolling_batch_size,
                    tokens: step_tokens,
                    context: config.max_model_len,
                },
                window_pools: config.window_pools,
                task: config.pooling.task,
                mtp_draft: config.speculative_mtp && config.speculative_draft_model.is_none(),
                ..Default::default()
            };
            let engine = lmi_engine::open(config.device, &dir, &opts)
                .with_context(|| format!("loading the model {}", source.display()))?;
            let weights = engine.weights_format().to_string();
            tracing::info!(
                "loaded {} on {}, weights in {weights}",
                source.display(),
                config.device
            );
            let blocks = engine.num_blocks();
            let all_local = engine
                .model_config()
                .sliding_window
                .as_ref()
                .is_some_and(|s| s.local.iter().all(|&l| l));
            match engine.kv_window() {
                Some(w) if all_local => tracing::info!(
                    "KV cache: every layer is a {}-token sliding window, in {} blocks of their \
                     own; the sequences' tables number up to {blocks} blocks ({} tokens) in all",
                    w.size,
                    w.blocks,
                    blocks * lmi_engine::BLOCK_SIZE
                ),
                Some(w) => tracing::info!(
                    "KV cache: {blocks} blocks ({} tokens) for the global layers; the \
                     {}-token sliding-window layers keep {} blocks of their own",
                    blocks * lmi_engine::BLOCK_SIZE,
                    w.size,
                    w.blocks
                ),
                None => tracing::info!(
                    "KV cache: {blocks} blocks ({} tokens)",
                    blocks * lmi_engine::BLOCK_SIZE
                ),
            }
            (engine, weights)
        }
        EngineMode::Null => {
            tracing::info!(
                "null engine: emitting tokens without computing ({} config and tokenizer)",
                dir.display()
            );
            let engine = NullEngine::load(&dir, &tokenizer, config.kv_cache_bytes)?;
            (Box::new(engine), "none".to_string())
        }
    };
    let model_config = engine.model_config().clone();
    let found = adapter_paths(&dir, config)?;
    let enabled = config.enable_lora || !found.is_empty();
    let allowed = AllowedDirs::new(
        std::iter::once(dir.as_path()).chain(config.adapter_dirs.iter().map(PathBuf::as_path)),
    );
    let adapters = AdapterRegistry::new(
        enabled,
        model_config.clone(),
        config.max_lora_rank,
        allowed,
        config.max_cpu_loras,
        metrics.adapters.clone(),
    );
    // Adapters configured by the operator: read now, loaded into the engine at first use.
    let at_start = Registration {
        preload: true,
        pin: false,
        trusted: true,
    };
    for (name, path) in found {
        // A Hub id or s3:// prefix is fetched first; a path is used as it is.
        let path = match path.to_str() {
            Some(spec) if !path.exists() => {
                lmi_store::resolve_adapter(spec, &config.fetch.without_revision())
                    .with_context(|| format!("LoRA adapter {name:?} ({spec})"))?
            }
            _ => path,
        };
        adapters
            .register(&name, &path, at_start)
            .map_err(|e| anyhow::anyhow!("LoRA adapter {name:?} ({}): {e}", path.display()))?;
    }
    let max_model_len = config
        .max_model_len
        .unwrap_or(model_config.max_position_embeddings);
    if max_model_len > model_config.max_position_embeddings {
        tracing::warn!(
            "option.max_model_len {max_model_len} exceeds the model's max_position_embeddings {}",
            model_config.max_position_embeddings
        );
    }
    let backend = engine.backend_name();
    let draft = match (&config.speculative_draft_model, config.engine_mode) {
        (Some(name), EngineMode::Model) => {
            let draft = lmi_store::resolve_with(Some(name), &config.fetch.without_revision())
                .with_context(|| format!("option.speculative_draft_model {name:?}"))?;
            let ddir = draft.dir.clone();
            tracing::info!(
                "loading the draft model {} on {}",
                ddir.display(),
                config.device
            );
            // Its KV cache takes a quarter of the model's byte budget (sized in bytes on a GPU
            // too: leave room with option.gpu_memory_utilization).
            let opts = EngineOptions {
                dtype: config.engine_dtype_for(&draft),
                kv_cache_bytes: config.kv_cache_bytes / 4,
                gguf: draft.gguf,
                // The draft model's block manager keeps one table per sequence.
                window_pools: false,
                ..Default::default()
            };
            Some(
                lmi_engine::open(config.device, &ddir, &opts)
                    .with_context(|| format!("loading the draft model {}", ddir.display()))?,
            )
        }
        _ => None,
    };
    let scheduler_config = SchedulerConfig {
        max_batch_size: config.max_rolling_batch_size,
        max_batch_tokens: step_tokens,
        max_model_len,
        max_waiting: config.job_queue_size,
        max_loras: config.max_loras,
        speculative: lmi_scheduler::SpeculativeConfig {
            ngram: config.speculative_ngram,
            ..Default::default()
        },
    };
    let handle = match draft {
        None => Handle::spawn(engine, tokenizer.clone(), scheduler_config),
        Some(d) => Handle::spawn_with_draft_model(engine, d, tokenizer.clone(), scheduler_config)
            .map_err(|e| anyhow::anyhow!("option.speculative_draft_model: {e}"))?,
    };
    let guide = GuideSource {
        model_dir: dir.clone(),
        tokenizer: tokenizer.clone(),
        vocab_size: model_config.vocab_size,
        eos: handle.limits().eos_token_ids.clone(),
    };
    let tool_format = config
        .tool_call_parser
        .unwrap_or_else(|| ToolCallFormat::detect(chat_template.as_ref()));
    tracing::info!("tool calls read in the {tool_format} format");
    let reasoning = match config.reasoning_parser {
        Some(crate::config::ReasoningParserChoice::Format(f)) => Some(f),
        Some(crate::config::ReasoningParserChoice::Off) => None,
        None => chat_template.as_ref().and_then(|t| t.reasoning_format()),
    };
    if let Some(f) = reasoning {
        tracing::info!("replies read for reasoning ({f:?}, `{}`)", f.close_tag());
    }
    if let Some(p) = &handle.limits().pooler {
        tracing::info!(
            "serves {} ({:?} pooling, {} outputs, inputs up to {} tokens): {}",
            p.task.as_str(),
            p.pooling,
            p.dimensions,
            p.max_input_tokens,
            crate::pooling::routes_for(p.task)
        );
    }
    let vision =
        crate::media::VisionSetup::for_model(&dir, &model_config, &tokenizer, &config.media)?;
    if let Some(v) = &vision {
        tracing::info!(
            "takes images: up to {} per prompt, at most {} pixels each",
            v.options.max_images,
            v.processor.max_pixels
        );
    }
    Ok(LoadedModel {
        grammars: Grammars::new(guide),
        tool_format,
        reasoning,
        reasoning_budget: config.reasoning_budget,
        handle,
        tokenizer,
        chat_template,
        adapters,
        max_model_len,
        model_dir: dir,
        origin: resolved.origin,
        backend,
        dtype,
        max_sequences: config.access.max_sequences_per_request,
        vision,
    })
}

/// The longest input of the model in `dir` when it is an embedding or scoring model (as
/// option.task and its files say); None for a generative one, or when its files cannot be
/// read (loading the engine then says why).
fn pooler_hint(dir: &Path, config: &ServingConfig) -> Option<usize> {
    if config.engine_mode == EngineMode::Null {
        return None;
    }
    let model = lmi_checkpoint::config::ModelConfig::from_file(&dir.join("config.json")).ok()?;
    let pooler =
        lmi_checkpoint::pooling::PoolerInfo::read(dir, &model, config.pooling.task).ok()??;
    (pooler.task != lmi_checkpoint::pooling::Task::Generate).then_some(pooler.max_input_tokens)
}

/// `<model dir>/adapters/<name>/` (directories or .safetensors files), then option.adapters
/// (which wins for a name given twice).
fn adapter_paths(dir: &Path, config: &ServingConfig) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let adapters_dir = dir.join("adapters");
    if adapters_dir.is_dir() {
        let entries = std::fs::read_dir(&adapters_dir)
            .with_context(|| format!("reading {}", adapters_dir.display()))?;
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            let is_st = p.extension().is_some_and(|e| e == "safetensors");
            let name = if p.is_dir() {
                p.file_name()
            } else if is_st {
                p.file_stem()
            } else {
                None
            };
            if let Some(name) = name {
                found.push((name.to_string_lossy().into_owned(), p.clone()));
            }
        }
    }
    for (name, path) in &config.adapters {
        found.retain(|(n, _)| n != name);
        found.push((name.clone(), path.clone()));
    }
    if !found.is_empty() && !config.enable_lora {
        tracing::info!(
            "found {} LoRA adapter(s) under {}: enabling LoRA",
            found.len(),
            adapters_dir.display()
        );
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EnvVars;

    fn config(model: Option<&str>, served: Option<&str>) -> ServingConfig {
        let cli = ServeArgs {
            model: model.map(str::to_string),
            served_model_name: served.map(str::to_string),
            ..Default::default()
        };
        ServingConfig::load(&cli, &EnvVars::new(), None).unwrap()
    }

    #[test]
    fn model_names_follow_the_model_path() {
        let (name, id) = model_names(&config(None, None));
        assert_eq!(
            (name.as_str(), id.as_str()),
            ("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct")
        );
        let (name, id) = model_names(&config(Some("/opt/ml/model/"), None));
        assert_eq!((name.as_str(), id.as_str()), ("model", "/opt/ml/model/"));
        let (name, _) = model_names(&config(Some("/x/tiny-q8.gguf"), None));
        assert_eq!(name, "tiny-q8");
        let (name, _) = model_names(&config(Some("/x/y"), Some("served")));
        assert_eq!(name, "served");
        let (name, id) = model_names(&config(Some("Qwen/Qwen3-0.6B-GGUF:Q8_0"), None));
        assert_eq!(
            (name.as_str(), id.as_str()),
            ("Qwen/Qwen3-0.6B-GGUF", "Qwen/Qwen3-0.6B-GGUF:Q8_0")
        );
        // (Set after loading: loading an s3:// model id reads its serving.properties from S3.)
        let mut s3 = config(None, None);
        s3.model_id = Some("s3://b/models/qwen3/".into());
        assert_eq!(model_names(&s3).0, "qwen3");
    }
}
