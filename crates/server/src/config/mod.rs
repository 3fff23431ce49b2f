//! The effective configuration of `lmi serve`, from (lowest to highest precedence): defaults,
//! TGI/SageMaker alias variables (only where the LMI variable is unset), `OPTION_*` /
//! `SERVING_*` / `HF_MODEL_ID` variables, serving.properties (LMI: the file beats the
//! environment), and CLI flags. Every raw key is kept with the place it came from.
//!
//! serving.properties is `--properties FILE`, else `<model dir>/serving.properties` (the
//! `--model` / `option.model_id` directory), else `<sagemaker dir>/serving.properties`
//! (`/opt/ml/model`), else none.

pub mod access;
pub mod env;
pub mod media;
pub mod models;
pub mod pooling;
pub mod properties;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use lmi_engine::{DType, Device};
use lmi_store::ResolvedModel;

pub use access::AccessConfig;
pub use env::EnvVars;

/// Where SageMaker puts the model artifacts.
pub const SAGEMAKER_MODEL_DIR: &str = "/opt/ml/model";

/// `lmi serve` flags. Each one sets a configuration key (shown in `--help`); `-o KEY=VALUE`
/// sets any other key.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ServeArgs {
    /// The model (option.model_id): an HF directory or GGUF file, a Hub id org/name
    /// (org/name:Q4_K_M for a GGUF repository), or s3://bucket/prefix/; the default model when
    /// absent. Repeat it to serve several (`--model chat=DIR --model NAME=DIR2`, option.models):
    /// the first is the default model.
    #[arg(long = "model", value_name = "MODEL")]
    pub models: Vec<String>,
    /// The first model, when set in code (the flag fills `models`).
    #[arg(skip)]
    pub model: Option<String>,
    /// Port to listen on (default 8080; SAGEMAKER_BIND_TO_PORT also sets it).
    #[arg(long)]
    pub port: Option<u16>,
    /// Address to listen on (default 0.0.0.0).
    #[arg(long)]
    pub host: Option<String>,
    /// serving.properties file (default: <model dir>/serving.properties, then /opt/ml/model/serving.properties).
    #[arg(long)]
    pub properties: Option<PathBuf>,
    /// Device (option.device): cpu (default), cuda or cuda:<ordinal>.
    #[arg(long)]
    pub device: Option<String>,
    /// `model` runs the model; `null` emits tokens without computing, to benchmark the front end (option.engine_mode).
    #[arg(long)]
    pub engine: Option<String>,
    /// Weight dtype (option.dtype): auto, fp32, bf16, fp16. auto = bf16 on the CPU backend.
    #[arg(long)]
    pub dtype: Option<String>,
    /// KV cache size in bytes; K/M/G suffixes are binary (option.kv_cache_bytes, default 1G).
    #[arg(long)]
    pub kv_cache_bytes: Option<String>,
    /// Sequences in the rolling batch (option.max_rolling_batch_size, default 32).
    #[arg(long, alias = "max-rolling-batch-size")]
    pub max_batch_size: Option<usize>,
    /// Tokens per step (option.max_rolling_batch_prefill_tokens; default 256 on the CPU, 4096
    /// on a GPU).
    #[arg(long, alias = "max-rolling-batch-prefill-tokens")]
    pub max_batch_prefill_tokens: Option<usize>,
    /// Longest prompt + output (option.max_model_len; default the model's).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Requests allowed to wait (job_queue_size, default 1000).
    #[arg(long)]
    pub job_queue_size: Option<usize>,
    /// In-flight requests before TGI routes answer 429 (option.max_concurrent_requests).
    #[arg(long)]
    pub max_concurrent_requests: Option<usize>,
    /// Largest request body in bytes; larger ones get 413 (max_request_size, default 2000000).
    #[arg(long)]
    pub payload_limit: Option<usize>,
    /// option.output_formatter: json, jsonlines, sse, ...
    #[arg(long)]
    pub output_formatter: Option<String>,
    /// TGI-shaped LMI output (option.tgi_compat=true).
    #[arg(long)]
    pub tgi_compat: bool,
    /// Enable LoRA adapters (option.enable_lora=true).
    #[arg(long)]
    pub enable_lora: bool,
    /// One KV pool for every layer: sliding-window layers keep their whole context, as before
    /// window pools (option.disable_hybrid_kv_cache_manager, vLLM's name).
    #[arg(long)]
    pub disable_hybrid_kv_cache_manager: bool,
    /// LoRA adapters to load at start: name=path,name2=path2 (option.adapters).
    #[arg(long)]
    pub adapters: Option<String>,
    /// Name the model is served under (option.served_model_name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// API key clients must send (`Authorization: Bearer KEY` or `x-api-key`); several
    /// comma-separated (option.api_key; also LMI_API_KEYS, option.api_key_file, LMI_API_KEYS_FILE).
    #[arg(long)]
    pub api_key: Option<String>,
    /// What the model is served for (option.task): text-generation, text-embedding or rerank;
    /// default: as its files say.
    #[arg(long)]
    pub task: Option<String>,
    /// Most inputs in one embedding or rerank request (option.max_client_batch_size, default
    /// 1024; list prompts of the generation routes: 4).
    #[arg(long)]
    pub max_client_batch_size: Option<usize>,
    /// Any other key: `-o option.max_loras=8`, `-o max_loras=8`, `-o batch_size=4`.
    #[arg(short = 'o', long = "option", value_name = "KEY=VALUE")]
    pub options: Vec<String>,
}

impl ServeArgs {
    /// The first model's (name, spec): `model`, else the first `--model`.
    pub fn first_model(&self) -> Option<(Option<String>, String)> {
        match &self.model {
            Some(m) => Some((None, m.clone())),
            None => self.models.first().map(|m| models::split_named(m)),
        }
    }

    /// The configuration keys the flags set.
    fn settings(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut out: Vec<(String, String)> = Vec::new();
        for o in &self.options {
            let (k, v) = o
                .split_once('=')
                .with_context(|| format!("--option {o:?}: expected KEY=VALUE"))?;
            out.push((normalize_key(k.trim()), v.trim().to_string()));
        }
        let mut set = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push((k.to_string(), v));
            }
        };
        if let Some(first) = self.first_model() {
            set("option.model_id", Some(first.1));
            if let Some(name) = first.0.filter(|_| self.served_model_name.is_none()) {
                set("option.served_model_name", Some(name));
            }
        }
        let rest = if self.model.is_some() {
            &self.models[..]
        } else {
            self.models.get(1..).unwrap_or_default()
        };
        if !rest.is_empty() {
            set("option.models", Some(rest.join(",")));
        }
        set("port", self.port.map(|p| p.to_string()));
        set("host", self.host.clone());
        set("option.device", self.device.clone());
        set("option.engine_mode", self.engine.clone());
        set("option.dtype", self.dtype.clone());
        set("option.kv_cache_bytes", self.kv_cache_bytes.clone());
        set(
            "option.max_rolling_batch_size",
            self.max_batch_size.map(|v| v.to_string()),
        );
        set(
            "option.max_rolling_batch_prefill_tokens",
            self.max_batch_prefill_tokens.map(|v| v.to_string()),
        );
        set(
            "option.max_model_len",
            self.max_model_len.map(|v| v.to_string()),
        );
        set("job_queue_size", self.job_queue_size.map(|v| v.to_string()));
        set(
            "option.max_concurrent_requests",
            self.max_concurrent_requests.map(|v| v.to_string()),
        );
        set(
            "max_request_size",
            self.payload_limit.map(|v| v.to_string()),
        );
        set("option.output_formatter", self.output_formatter.clone());
        set("option.tgi_compat", self.tgi_compat.then(|| "true".into()));
        set(
            "option.enable_lora",
            self.enable_lora.then(|| "true".into()),
        );
        set(
            "option.disable_hybrid_kv_cache_manager",
            self.disable_hybrid_kv_cache_manager.then(|| "true".into()),
        );
        set("option.adapters", self.adapters.clone());
        set("option.served_model_name", self.served_model_name.clone());
        set("option.api_key", self.api_key.clone());
        set("option.task", self.task.clone());
        set(
            "option.max_client_batch_size",
            self.max_client_batch_size.map(|v| v.to_string()),
        );
        Ok(out)
    }
}

/// `max_loras` → `option.max_loras`; global keys and `option.*` stay as they are.
fn normalize_key(k: &str) -> String {
    if k.starts_with("option.") || env::GLOBAL_KEYS.contains(&k) || k == "port" || k == "host" {
        k.to_string()
    } else {
        format!("option.{k}")
    }
}

/// Where a configuration value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Env(String),
    Properties(PathBuf),
    Cli,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Env(var) => write!(f, "env {var}"),
            Source::Properties(p) => write!(f, "{}", p.display()),
            Source::Cli => f.write_str("command line"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub value: String,
    pub source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineMode {
    /// Run the model.
    Model,
    /// Emit tokens without computing ([`crate::null_engine::NullEngine`]).
    Null,
}

/// option.dtype as asked; [`ServingConfig::engine_dtype`] resolves `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DTypeChoice {
    Auto,
    Fixed(DType),
}

/// The typed configuration of `lmi serve`, plus every raw key with its source.
#[derive(Debug, Clone)]
pub struct ServingConfig {
    /// option.model_id: a directory, GGUF file, Hub id, `s3://` prefix, or None for the
    /// default model.
    pub model_id: Option<String>,
    /// How names are fetched: option.revision, and the Hub's and S3's settings from the
    /// environment (HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE, AWS_REGION, …).
    pub fetch: lmi_store::Fetch,
    /// option.served_model_name, if set (else the model's directory name).
    pub served_model_name: Option<String>,
    /// The models beyond the first, and the limits on what is loaded (`models.rs`).
    pub models: models::ModelsConfig,
    pub properties_file: Option<PathBuf>,
    pub host: String,
    pub port: u16,
    pub device: Device,
    /// option.tensor_parallel_degree (also TENSOR_PARALLEL_DEGREE, SM_NUM_GPUS): GPUs offered;
    /// `max` counts as 1. One process uses one GPU, so more than 1 is served on the first
    /// with a warning at start. When option.device is unset, a positive value means cuda.
    pub tensor_parallel_degree: Option<usize>,
    pub engine_mode: EngineMode,
    pub dtype: DTypeChoice,
    pub kv_cache_bytes: usize,
    /// On a GPU, the share of its memory the engine takes (option.gpu_memory_utilization,
    /// default 0.9 unless option.kv_cache_bytes is set); the KV cache gets the rest after
    /// the weights. None on the CPU.
    pub gpu_memory_utilization: Option<f32>,
    /// option.rolling_batch (recorded; every value runs the built-in rolling batch scheduler).
    pub rolling_batch: String,
    pub max_rolling_batch_size: usize,
    /// Tokens per engine step; see [`default_step_tokens`].
    pub max_rolling_batch_prefill_tokens: usize,
    /// None: the model's max_position_embeddings.
    pub max_model_len: Option<usize>,
    pub output_formatter: Option<String>,
    pub tgi_compat: bool,
    /// option.disable_hybrid_kv_cache_manager: see `EngineOptions::window_pools`.
    pub window_pools: bool,
    pub enable_lora: bool,
    pub max_loras: usize,
    pub max_cpu_loras: usize,
    /// Largest LoRA rank accepted (option.max_lora_rank, default 16 as LMI/vLLM).
    pub max_lora_rank: usize,
    /// Directories adapters may be registered from besides the model directory
    /// (option.adapter_dirs, comma-separated).
    pub adapter_dirs: Vec<PathBuf>,
    /// `tool_choice: "auto"` allowed (option.enable_auto_tool_choice). Default true, unlike
    /// LMI/vLLM where it must be turned on: the call format comes from the chat template.
    pub enable_auto_tool_choice: bool,
    /// How the model writes tool calls (option.tool_call_parser, vLLM's names); None: read
    /// from the chat template.
    pub tool_call_parser: Option<lmi_text::tools::ToolCallFormat>,
    /// How the model marks its reasoning (option.reasoning_parser: `think`, or vLLM's
    /// `qwen3` / `deepseek_r1` / `openai_gptoss`; `none` turns reading it off); None: read
    /// from the template.
    pub reasoning_parser: Option<ReasoningParserChoice>,
    /// Tokens a reply may spend reasoning when the request names no budget
    /// (option.reasoning_budget: -1, the default, for no limit; 0 for none).
    pub reasoning_budget: lmi_api::openai::ThinkingBudget,
    /// Images and video: per-prompt limits, pixel cap, fetchable hosts.
    pub media: media::MediaOptions,
    /// Prompt-lookup speculative decoding (option.speculative_ngram: `true` or `MIN-MAX:K`);
    /// off by default. Client drafts (`prediction`, `draft_input_ids`) are always used.
    pub speculative_ngram: Option<lmi_scheduler::NgramLookup>,
    /// A smaller model sharing the tokenizer that drafts for speculative decoding
    /// (option.speculative_draft_model: an HF directory or a GGUF file, a Hub id or an s3:// prefix).
    pub speculative_draft_model: Option<String>,
    /// Draft with the checkpoint's multi-token-prediction layer where it holds one
    /// (option.speculative_mtp; DeepSeek-V3, Kimi K2, GLM-4.5–4.7, GLM-4.7-Flash): off when
    /// a draft model is named. Default: on the CPU; off on CUDA, where its steps would not
    /// replay from CUDA graphs (the head reads hidden states a graph does not return).
    pub speculative_mtp: bool,
    /// option.adapters: (name, path) loaded at start, besides `<model dir>/adapters/<name>/`.
    pub adapters: Vec<(String, PathBuf)>,
    /// Dynamic batching (LMI `batch_size`, alias `max_dynamic_batch_size`) and its delay.
    pub batch_size: usize,
    pub max_batch_delay_ms: u64,
    /// Requests allowed to wait in the scheduler queue; more get 503 (LMI) / 429 (TGI).
    pub job_queue_size: usize,
    /// In-flight requests before TGI routes answer 429: option.max_concurrent_requests, else
    /// MAX_CONCURRENT_REQUESTS, else job_queue_size + max_rolling_batch_size.
    pub max_concurrent_requests: usize,
    /// Request body limit in bytes (413 beyond).
    pub max_request_size: usize,
    /// After SIGTERM, how long in-flight requests may run before the server exits anyway
    /// (option.drain_timeout, seconds, default 60; orchestrators' grace periods must exceed it).
    pub drain_timeout_secs: u64,
    /// TGI validation limits (tgi.md §1.5 defaults), reported by /info.
    pub max_best_of: usize,
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: usize,
    pub max_client_batch_size: usize,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`
    /// (option.responses_store, default 1024, least recently used dropped; 0 keeps none).
    pub responses_store: usize,
    /// API keys, CORS, time and shape limits.
    pub access: AccessConfig,
    /// Embedding and scoring models: option.task and the inputs one request may carry.
    pub pooling: pooling::PoolingOptions,
    /// Every key, `option.*` and global, with its winning value and source.
    pub raw: BTreeMap<String, Setting>,
}

/// option.reasoning_parser as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParserChoice {
    Format(lmi_text::ReasoningFormat),
    /// `none`: replies are not read for reasoning, whatever the template.
    Off,
}

impl ServingConfig {
    /// Loads from the process environment, looking in /opt/ml/model last.
    pub fn from_process(cli: &ServeArgs) -> anyhow::Result<Self> {
        let env: EnvVars = std::env::vars().collect();
        Self::load(cli, &env, Some(Path::new(SAGEMAKER_MODEL_DIR)))
    }

    /// Merges CLI > serving.properties > env > aliases > defaults. `sagemaker_dir` is where
    /// serving.properties and the model are looked for last (`/opt/ml/model` in production).
    pub fn load(
        cli: &ServeArgs,
        env: &EnvVars,
        sagemaker_dir: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let mut raw: BTreeMap<String, Setting> = BTreeMap::new();
        for e in env::settings(env) {
            raw.insert(
                e.key,
                Setting {
                    value: e.value,
                    source: Source::Env(e.var),
                },
            );
        }
        if let Some(port) = env.get("SAGEMAKER_BIND_TO_PORT") {
            raw.insert(
                "port".into(),
                Setting {
                    value: port.clone(),
                    source: Source::Env("SAGEMAKER_BIND_TO_PORT".into()),
                },
            );
        }
        let cli_settings = cli.settings()?;

        // Find serving.properties: --properties, the model directory, the SageMaker directory.
        let model_hint = cli
            .first_model()
            .map(|m| m.1)
            .or_else(|| raw.get("option.model_id").map(|s| s.value.clone()));
        let properties_file = if let Some(p) = &cli.properties {
            if !p.is_file() {
                bail!("--properties {}: no such file", p.display());
            }
            Some(p.clone())
        } else if let Some(uri) = model_hint.as_deref().filter(|m| m.starts_with("s3://")) {
            // LMI reads the serving.properties inside the model's S3 prefix.
            let uri = lmi_store::s3::S3Uri::parse(uri)?;
            let s3 = lmi_store::s3::S3Config::from_vars(|k| env.get(k).cloned());
            lmi_store::s3::properties(&s3, &uri)?
        } else {
            let in_model_dir = model_hint
                .as_deref()
                .map(|m| Path::new(m).join("serving.properties"))
                .filter(|p| p.is_file());
            in_model_dir.or_else(|| {
                sagemaker_dir
                    .map(|d| d.join("serving.properties"))
                    .filter(|p| p.is_file())
            })
        };
        if let Some(path) = &properties_file {
            for (k, v) in properties::read(path)? {
                raw.insert(
                    k,
                    Setting {
                        value: v,
                        source: Source::Properties(path.clone()),
                    },
                );
            }
        }
        for (k, v) in cli_settings {
            raw.insert(
                k,
                Setting {
                    value: v,
                    source: Source::Cli,
                },
            );
        }

        // option.model_id falls back to the directory holding serving.properties, then to the
        // SageMaker directory, when that holds a model.
        let model_id = raw
            .get("option.model_id")
            .map(|s| s.value.clone())
            .or_else(|| {
                let props_dir = properties_file
                    .as_deref()
                    .and_then(Path::parent)
                    .filter(|d| d.join("config.json").is_file());
                let sm = sagemaker_dir.filter(|d| d.join("config.json").is_file());
                props_dir.or(sm).map(|d| d.to_string_lossy().into_owned())
            });

        let get = |k: &str| raw.get(k);
        let str_of = |k: &str| get(k).map(|s| s.value.clone()).filter(|v| !v.is_empty());

        let tensor_parallel_degree = gpu_count(&raw)?;
        let device = match str_of("option.device") {
            // SM_NUM_GPUS / option.tensor_parallel_degree say GPUs are there to be used.
            None if tensor_parallel_degree.is_some_and(|n| n > 0) => Device::Cuda(0),
            None => Device::Cpu,
            Some(d) => d.parse::<Device>().map_err(|e| {
                anyhow::anyhow!("option.device ({}): {e}", source_of(&raw, "option.device"))
            })?,
        };
        let engine_mode = match str_of("option.engine_mode").as_deref() {
            None | Some("model") | Some("real") => EngineMode::Model,
            Some("null") | Some("none") | Some("noop") => EngineMode::Null,
            Some(other) => bail!(
                "option.engine_mode={other} ({}): expected `model` or `null`",
                source_of(&raw, "option.engine_mode")
            ),
        };
        let dtype = match str_of("option.dtype").as_deref() {
            None | Some("auto") => DTypeChoice::Auto,
            Some(d) => DTypeChoice::Fixed(d.parse::<DType>().map_err(|e| {
                anyhow::anyhow!(
                    "option.dtype ({}): {e}; or auto",
                    source_of(&raw, "option.dtype")
                )
            })?),
        };
        if let (Device::Cuda(_), DTypeChoice::Fixed(DType::I8)) = (device, dtype) {
            bail!(
                "option.dtype=int8 ({}): the CUDA engine keeps weights in bf16; use bf16, fp16 or auto",
                source_of(&raw, "option.dtype")
            );
        }
        if let (Device::Cuda(_), DTypeChoice::Fixed(DType::F32)) = (device, dtype) {
            bail!(
                "option.dtype=fp32 ({}): the CUDA engine keeps weights in bf16; use bf16, fp16 or auto",
                source_of(&raw, "option.dtype")
            );
        }
        let kv_cache_bytes = match get("option.kv_cache_bytes") {
            None => 1 << 30,
            Some(s) => parse_bytes(&s.value)
                .with_context(|| format!("option.kv_cache_bytes={:?} ({})", s.value, s.source))?,
        };
        let gpu_memory_utilization = match (device, get("option.gpu_memory_utilization")) {
            (Device::Cpu, _) => None,
            (Device::Cuda(_), Some(v)) => {
                let f: f32 = v
                    .value
                    .trim()
                    .parse()
                    .ok()
                    .filter(|f| *f > 0.0 && *f <= 1.0)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "option.gpu_memory_utilization={:?} ({}): expected a number in (0, 1]",
                            v.value,
                            v.source
                        )
                    })?;
                Some(f)
            }
            (Device::Cuda(_), None) if get("option.kv_cache_bytes").is_some() => None,
            (Device::Cuda(_), None) => Some(0.9),
        };
        // vLLM's names (LMI passes option.<EngineArgs name> through) count when LMI's are unset.
        let either = |lmi: &'static str, vllm: &'static str| {
            if raw.contains_key(lmi) || !raw.contains_key(vllm) {
                lmi
            } else {
                vllm
            }
        };
        let max_rolling_batch_size = positive(
            &raw,
            either("option.max_rolling_batch_size", "option.max_num_seqs"),
            32,
        )?;
        let max_rolling_batch_prefill_tokens = positive(
            &raw,
            either(
                "option.max_rolling_batch_prefill_tokens",
                "option.max_num_batched_tokens",
            ),
            default_step_tokens(device),
        )?;
        let max_model_len = match get("option.max_model_len") {
            None => None,
            Some(_) => Some(positive(&raw, "option.max_model_len", 0)?),
        };
        let max_loras = positive(&raw, "option.max_loras", 4)?;
        let max_cpu_loras = positive(&raw, "option.max_cpu_loras", max_loras)?.max(max_loras);
        let max_lora_rank = positive(&raw, "option.max_lora_rank", 16)?;
        let adapter_dirs: Vec<PathBuf> = str_of("option.adapter_dirs")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        let batch_size = if raw.contains_key("batch_size") {
            positive(&raw, "batch_size", 1)?
        } else {
            positive(&raw, "max_dynamic_batch_size", 1)?
        };
        let job_queue_size = positive(&raw, "job_queue_size", 1000)?;
        let max_concurrent_requests = positive(
            &raw,
            "option.max_concurrent_requests",
            job_queue_size + max_rolling_batch_size,
        )?;
        let adapters = match str_of("option.adapters") {
            None => Vec::new(),
            Some(list) => parse_adapters(&list)?,
        };
        let enable_lora = boolean(&raw, "option.enable_lora")? || !adapters.is_empty();
        let enable_auto_tool_choice = match get("option.enable_auto_tool_choice") {
            None => true,
            Some(_) => boolean(&raw, "option.enable_auto_tool_choice")?,
        };
        let tool_call_parser = match str_of("option.tool_call_parser") {
            None => None,
            Some(name) => Some(
                lmi_text::tools::ToolCallFormat::from_name(&name).map_err(|e| {
                    anyhow::anyhow!(
                        "option.tool_call_parser ({}): {e}",
                        source_of(&raw, "option.tool_call_parser")
                    )
                })?,
            ),
        };
        let reasoning_parser = match str_of("option.reasoning_parser") {
            None => None,
            Some(name) if name.trim().eq_ignore_ascii_case("none") => {
                Some(ReasoningParserChoice::Off)
            }
            Some(name) => Some(
                lmi_text::ReasoningFormat::from_name(&name)
                    .map(ReasoningParserChoice::Format)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "option.reasoning_parser={name:?} ({}): expected one of {}, or none",
                            source_of(&raw, "option.reasoning_parser"),
                            lmi_text::ReasoningFormat::NAMES.join(", ")
                        )
                    })?,
            ),
        };
        let reasoning_budget = match str_of("option.reasoning_budget") {
            None => lmi_api::openai::ThinkingBudget::Unlimited,
            Some(v) => v
                .trim()
                .parse::<i64>()
                .ok()
                .and_then(lmi_api::openai::ThinkingBudget::from_i64)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "option.reasoning_budget={v:?} ({}): expected -1 (no limit) or a count of tokens",
                        source_of(&raw, "option.reasoning_budget")
                    )
                })?,
        };
        let speculative_ngram = match str_of("option.speculative_ngram") {
            None => None,
            Some(v) if v.trim().eq_ignore_ascii_case("false") => None,
            Some(v) => Some(v.parse().map_err(|e| {
                anyhow::anyhow!(
                    "option.speculative_ngram ({}): {e}",
                    source_of(&raw, "option.speculative_ngram")
                )
            })?),
        };
        let speculative_draft_model = str_of("option.speculative_draft_model");
        let port = match get("port") {
            None => 8080,
            Some(s) => s.value.trim().parse::<u16>().map_err(|_| {
                anyhow::anyhow!("port={:?} ({}): expected 0..65535", s.value, s.source)
            })?,
        };
        let drain_timeout_secs = nonneg(&raw, "option.drain_timeout", 60)? as u64;
        let models = models::parse(&raw, env.get("SAGEMAKER_MULTI_MODEL"))?;
        if models.is_multi() && gpu_memory_utilization.is_some() {
            bail!(
                "several models on one GPU (option.models, option.models_dir or \
                 SAGEMAKER_MULTI_MODEL) size each one's KV cache in bytes: set \
                 option.kv_cache_bytes and unset option.gpu_memory_utilization (a share of the \
                 GPU would go to the first model whole)"
            );
        }
        let var = |k: &str| env.get(k).cloned();
        // option.revision (HF_REVISION among its sources) names the served model's revision.
        let fetch = lmi_store::Fetch {
            revision: str_of("option.revision"),
            ..lmi_store::Fetch::from_vars(var, true)
        };
        Ok(ServingConfig {
            model_id,
            fetch,
            served_model_name: str_of("option.served_model_name"),
            properties_file,
            host: str_of("host").unwrap_or_else(|| "0.0.0.0".into()),
            port,
            device,
            tensor_parallel_degree,
            engine_mode,
            dtype,
            kv_cache_bytes,
            gpu_memory_utilization,
            rolling_batch: str_of("option.rolling_batch").unwrap_or_else(|| "auto".into()),
            max_rolling_batch_size,
            max_rolling_batch_prefill_tokens,
            max_model_len,
            output_formatter: str_of("option.output_formatter"),
            tgi_compat: boolean(&raw, "option.tgi_compat")?,
            window_pools: !boolean(&raw, "option.disable_hybrid_kv_cache_manager")?,
            enable_lora,
            max_loras,
            max_cpu_loras,
            max_lora_rank,
            adapter_dirs,
            enable_auto_tool_choice,
            tool_call_parser,
            reasoning_parser,
            reasoning_budget,
            media: media::parse(&raw)?,
            speculative_ngram,
            speculative_draft_model,
            speculative_mtp: boolean_or(&raw, "option.speculative_mtp", device == Device::Cpu)?,
            adapters,
            batch_size,
            max_batch_delay_ms: nonneg(&raw, "max_batch_delay", 100)? as u64,
            job_queue_size,
            max_concurrent_requests,
            max_request_size: positive(&raw, "max_request_size", 2_000_000)?,
            drain_timeout_secs,
            max_best_of: positive(&raw, "option.max_best_of", 2)?,
            max_stop_sequences: nonneg(&raw, "option.max_stop_sequences", 4)?,
            max_top_n_tokens: nonneg(&raw, "option.max_top_n_tokens", 5)?,
            max_client_batch_size: positive(&raw, "option.max_client_batch_size", 4)?,
            responses_store: nonneg(&raw, "option.responses_store", 1024)?,
            access: AccessConfig::load(&raw, env)?,
            pooling: pooling::parse(&raw)?,
            models,
            raw,
        })
    }

    /// The weight dtype the engine loads for an HF checkpoint: `auto` is bf16 (on the CPU 2x
    /// faster decode than f32; the CUDA engine keeps every matrix in bf16).
    pub fn engine_dtype(&self) -> DType {
        match self.dtype {
            DTypeChoice::Auto => DType::BF16,
            DTypeChoice::Fixed(d) => d,
        }
    }

    /// The dtype to ask the engine for `model`: `auto` as the model's kind and the device
    /// decide ([`Device::auto_dtype`]).
    pub fn engine_dtype_for(&self, model: &ResolvedModel) -> Option<DType> {
        match self.dtype {
            DTypeChoice::Auto => self.device.auto_dtype(&model.dir, model.gguf.is_some()),
            DTypeChoice::Fixed(d) => Some(d),
        }
    }

    /// The raw value of any key (`option.foo` or a global key).
    #[cfg(test)]
    pub fn option(&self, key: &str) -> Option<&str> {
        self.raw.get(key).map(|s| s.value.as_str())
    }

    /// The effective configuration, printed at start.
    pub fn summary(&self) -> String {
        let mut s = String::from("effective configuration:\n");
        let model = self.model_id.as_deref().unwrap_or("(default model)");
        let props = self
            .properties_file
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "(none)".into());
        let dtype = match self.dtype {
            DTypeChoice::Auto if self.device == Device::Cpu => {
                "auto (a GGUF's blocks as stored, else bf16)".to_string()
            }
            DTypeChoice::Auto => format!("{} (auto)", self.engine_dtype()),
            DTypeChoice::Fixed(d) => d.to_string(),
        };
        let max_len = self
            .max_model_len
            .map(|v| v.to_string())
            .unwrap_or_else(|| "(model's)".into());
        let lines = [
            ("model_id", model.to_string()),
            (
                "revision",
                self.fetch
                    .revision
                    .clone()
                    .unwrap_or_else(|| "(main)".into()),
            ),
            ("hub", self.fetch.hub.summary()),
            ("serving.properties", props),
            ("listen", format!("{}:{}", self.host, self.port)),
            ("device", self.device.to_string()),
            (
                "tensor_parallel_degree",
                self.tensor_parallel_degree
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "(unset)".into()),
            ),
            (
                "engine_mode",
                format!("{:?}", self.engine_mode).to_lowercase(),
            ),
            ("dtype", dtype),
            (
                "kv_cache_bytes",
                match self.gpu_memory_utilization {
                    Some(f) => format!("(gpu_memory_utilization {f})"),
                    None => self.kv_cache_bytes.to_string(),
                },
            ),
            ("rolling_batch", self.rolling_batch.clone()),
            (
                "max_rolling_batch_size",
                self.max_rolling_batch_size.to_string(),
            ),
            (
                "max_rolling_batch_prefill_tokens",
                self.max_rolling_batch_prefill_tokens.to_string(),
            ),
            ("max_model_len", max_len),
            (
                "output_formatter",
                self.output_formatter
                    .clone()
                    .unwrap_or_else(|| "(per request)".into()),
            ),
            ("tgi_compat", self.tgi_compat.to_string()),
            ("window_pools", self.window_pools.to_string()),
            ("speculative_mtp", self.speculative_mtp.to_string()),
            ("enable_lora", self.enable_lora.to_string()),
            (
                "max_loras / max_cpu_loras",
                format!("{} / {}", self.max_loras, self.max_cpu_loras),
            ),
            ("batch_size", self.batch_size.to_string()),
            ("max_batch_delay_ms", self.max_batch_delay_ms.to_string()),
            ("job_queue_size", self.job_queue_size.to_string()),
            (
                "max_concurrent_requests",
                self.max_concurrent_requests.to_string(),
            ),
            ("max_request_size", self.max_request_size.to_string()),
            ("drain_timeout (s)", self.drain_timeout_secs.to_string()),
            (
                "task",
                self.pooling
                    .task
                    .map_or("(the model's)", |t| t.as_str())
                    .to_string(),
            ),
        ];
        for (k, v) in lines.into_iter().chain(self.access.summary()) {
            let _ = writeln!(s, "  {k:<34} {v}");
        }
        if !self.raw.is_empty() {
            s.push_str("  set keys (value <- source):\n");
            for (k, set) in &self.raw {
                let value = if access::SECRET_KEYS.contains(&k.as_str()) {
                    "<hidden>"
                } else {
                    set.value.as_str()
                };
                let _ = writeln!(s, "    {k} = {value} <- {}", set.source);
            }
        }
        s
    }
}

fn source_of(raw: &BTreeMap<String, Setting>, key: &str) -> String {
    raw.get(key)
        .map(|s| s.source.to_string())
        .unwrap_or_else(|| "default".into())
}

/// option.tensor_parallel_degree: a GPU count, or `max` (LMI: every GPU; here one).
fn gpu_count(raw: &BTreeMap<String, Setting>) -> anyhow::Result<Option<usize>> {
    let Some(s) = raw.get("option.tensor_parallel_degree") else {
        return Ok(None);
    };
    let v = s.value.trim();
    if v.eq_ignore_ascii_case("max") {
        return Ok(Some(1));
    }
    v.parse::<usize>().map(Some).map_err(|_| {
        anyhow::anyhow!(
            "option.tensor_parallel_degree={:?} ({}): expected a GPU count or max",
            s.value,
            s.source
        )
    })
}

fn nonneg(raw: &BTreeMap<String, Setting>, key: &str, default: usize) -> anyhow::Result<usize> {
    match raw.get(key) {
        None => Ok(default),
        Some(s) => s.value.trim().parse::<usize>().map_err(|_| {
            anyhow::anyhow!(
                "{key}={:?} ({}): expected a non-negative integer",
                s.value,
                s.source
            )
        }),
    }
}

/// Tokens per step when option.max_rolling_batch_prefill_tokens is unset. On the CPU 256:
/// the engine's step buffers grow with the step (about 140 KB a token for a 1B model: 4096
/// tokens held 570 MiB beyond the weights and the KV cache, 512 held 50 MiB more than 256),
/// and a step holds every stream's next token (4096 prompt tokens of a 1B model are about
/// 20 s on two cores), while the kernels are already at full speed from 64 rows (a 1B model
/// serves 16 and 64 streams, and prefills, as fast with 256 as with 512). A GPU takes LMI's
/// 4096.
pub fn default_step_tokens(device: Device) -> usize {
    match device {
        Device::Cpu => 256,
        Device::Cuda(_) => 4096,
    }
}

fn positive(raw: &BTreeMap<String, Setting>, key: &str, default: usize) -> anyhow::Result<usize> {
    let v = nonneg(raw, key, default)?;
    if v == 0 && raw.contains_key(key) {
        bail!(
            "{key}=0 ({}): expected a positive integer",
            source_of(raw, key)
        );
    }
    Ok(v)
}

fn boolean(raw: &BTreeMap<String, Setting>, key: &str) -> anyhow::Result<bool> {
    boolean_or(raw, key, false)
}

fn boolean_or(raw: &BTreeMap<String, Setting>, key: &str, default: bool) -> anyhow::Result<bool> {
    match raw.get(key) {
        None => Ok(default),
        Some(s) => match s.value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" | "" => Ok(false),
            _ => bail!("{key}={:?} ({}): expected true or false", s.value, s.source),
        },
    }
}

/// `1073741824`, `1G`, `1GiB`, `512M`, `64k` (binary multiples).
pub fn parse_bytes(s: &str) -> anyhow::Result<usize> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let n: usize = num
        .parse()
        .map_err(|_| anyhow::anyhow!("expected a byte count such as 1073741824 or 1G"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => bail!("unknown size unit {other:?}: use K, M or G"),
    };
    let bytes = n.checked_mul(mult).context("size overflows")?;
    if bytes == 0 {
        bail!("must be positive");
    }
    Ok(bytes)
}

/// `a=/p/a,b=/p/b` or plain paths (named after their last component).
pub fn parse_adapters(list: &str) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, path) = match item.split_once('=') {
            Some((n, p)) => (n.trim().to_string(), PathBuf::from(p.trim())),
            None => {
                let p = PathBuf::from(item);
                let name = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .with_context(|| format!("option.adapters: cannot name adapter {item:?}"))?;
                (name, p)
            }
        };
        if name.is_empty() {
            bail!("option.adapters: empty adapter name in {item:?}");
        }
        out.push((name, path));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
