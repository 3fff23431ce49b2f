//! `lmi bench lora`: aggregate decode throughput with LoRA adapters, through the registry
//! (host tier) and the scheduler (engine tier), against the same load without adapters.
//!
//! Closed loop: `--concurrency` client threads each run `--requests` requests back to back
//! (prompt `--prompt-len` tokens, `--max-new-tokens` greedy tokens, EOS ignored). Cases: no
//! adapter; every request on one adapter; each thread on its own adapter; and `--adapters`
//! registered with `--max-loras` engine slots, each request drawing one uniformly (churn of
//! both tiers). Adapters are random rank-`--rank` PEFT adapters written for the model.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use lmi_checkpoint::testing::{PeftSpec, write_peft_adapter};
use lmi_engine::engine::EngineOptions;
use lmi_engine::lora::Target;
use lmi_scheduler::adapter_registry::{AdapterMetrics, AdapterRegistry, AllowedDirs, Registration};
use lmi_scheduler::{Event, GenerateRequest, Handle, SchedulerConfig};

use crate::args::{LoadArgs, ModelArgs};

#[derive(clap::Args)]
pub struct LoraArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[arg(long, default_value_t = 16)]
    rank: usize,
    /// Projections adapted: `qv` (PEFT's default for Llama) or `all` (every linear layer).
    #[arg(long, default_value = "qv")]
    targets: String,
    #[command(flatten)]
    load: LoadArgs,
    /// Adapters registered for the churn case.
    #[arg(long, default_value_t = 100)]
    adapters: usize,
    /// Engine slots (and host-tier size) for the churn case.
    #[arg(long, default_value_t = 8)]
    max_loras: usize,
}

/// Which adapter request `r` of client `c` uses.
#[derive(Clone, Copy)]
enum Pick {
    None,
    One,
    PerClient,
    Uniform(usize),
}

pub fn run(a: LoraArgs) -> anyhow::Result<()> {
    let (dir, dtype, _) = a.m.resolve()?;
    let config = lmi_engine::ModelConfig::from_file(&dir.join("config.json"))?;
    let targets: Vec<&'static str> = match a.targets.as_str() {
        "qv" => vec!["self_attn.q_proj", "self_attn.v_proj"],
        "all" => Target::ALL.map(Target::module).to_vec(),
        other => anyhow::bail!("--targets {other}: expected qv or all"),
    };
    let root = tempfile::tempdir()?;
    let count = a.adapters.max(a.load.concurrency);
    for i in 0..count {
        let spec = PeftSpec {
            targets: targets.clone(),
            scale: 0.02,
            ..PeftSpec::new(a.rank, i as u64)
        };
        write_peft_adapter(&root.path().join(format!("a{i}")), &config, &spec)?;
    }
    let mut text = format!(
        "model {} on {} ({} weights), rank-{} adapters on {}, {} clients x {} requests, prompt {} tokens, {} new tokens\n\n",
        dir.display(),
        a.m.device,
        ModelArgs::dtype_name(dtype),
        a.rank,
        a.targets,
        a.load.concurrency,
        a.load.requests,
        a.load.prompt_len,
        a.load.max_new_tokens
    );
    text.push_str(
        "| case | max_loras | decode tok/s (aggregate) | vs no adapter | engine loads | engine evictions | host loads | failed |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    print!("{text}");
    let mut bars = Vec::new();
    let cases = [
        ("no adapter", Pick::None, a.load.concurrency),
        ("one adapter", Pick::One, a.load.concurrency),
        (
            "a different adapter per client",
            Pick::PerClient,
            a.load.concurrency,
        ),
        (
            "churn: uniform over the registered",
            Pick::Uniform(a.adapters),
            a.max_loras,
        ),
    ];
    let mut base = None;
    for (name, pick, max_loras) in cases {
        let r = run_case(&a, &dir, root.path(), &config, pick, max_loras)?;
        let b = *base.get_or_insert(r.tok_s);
        let row = format!(
            "| {name} | {max_loras} | {:.1} | {:.0}% | {} | {} | {} | {} |",
            r.tok_s,
            r.tok_s / b * 100.0,
            r.engine_loads,
            r.engine_evictions,
            r.host_loads,
            r.failed
        );
        println!("{row}");
        text.push_str(&row);
        text.push('\n');
        bars.push((name.to_string(), r.tok_s));
    }
    let path = a
        .load
        .report
        .clone()
        .unwrap_or_else(|| "lmi-bench-lora.html".into());
    crate::report::write_cases(&path, "lmi bench lora", text, "decode tok/s", bars)
}

struct CaseResult {
    tok_s: f64,
    engine_loads: u64,
    engine_evictions: u64,
    host_loads: u64,
    failed: usize,
}

fn run_case(
    a: &LoraArgs,
    dir: &Path,
    adapters_dir: &Path,
    config: &lmi_engine::ModelConfig,
    pick: Pick,
    max_loras: usize,
) -> anyhow::Result<CaseResult> {
    let per_seq = (a.load.prompt_len + a.load.max_new_tokens).div_ceil(lmi_engine::BLOCK_SIZE);
    let (_, dtype, gguf) = a.m.resolve()?;
    let opts = EngineOptions {
        dtype,
        gguf: gguf.clone(),
        kv_blocks: Some(per_seq * a.load.concurrency + 8),
        ..Default::default()
    };
    let engine = lmi_engine::open(a.m.device, dir, &opts)?;
    let tokenizer = lmi_text::Tokenizer::from_dir(dir)?;
    let vocab = config.vocab_size as u32;
    let handle = Handle::spawn(
        engine,
        tokenizer,
        SchedulerConfig {
            max_batch_size: a.load.concurrency,
            max_batch_tokens: (a.load.prompt_len * a.load.concurrency).max(512),
            max_model_len: a.load.prompt_len + a.load.max_new_tokens + 1,
            max_waiting: a.load.concurrency * 2,
            max_loras,
            ..Default::default()
        },
    );
    let metrics = AdapterMetrics::register(&prometheus::Registry::new())?;
    let registry = AdapterRegistry::new(
        true,
        config.clone(),
        a.rank.max(16),
        AllowedDirs::new([adapters_dir]),
        max_loras,
        metrics.clone(),
    );
    let registered = match pick {
        Pick::None => 0,
        Pick::One => 1,
        Pick::PerClient => a.load.concurrency,
        Pick::Uniform(n) => n,
    };
    let lazy = Registration {
        preload: false,
        pin: false,
        trusted: false,
    };
    for i in 0..registered {
        registry
            .register(&format!("a{i}"), &adapters_dir.join(format!("a{i}")), lazy)
            .with_context(|| format!("registering adapter a{i}"))?;
    }
    let started = Instant::now();
    let threads: Vec<_> = (0..a.load.concurrency)
        .map(|c| {
            let (handle, registry) = (handle.clone(), registry.clone());
            let (reqs, plen, max_new) = (a.load.requests, a.load.prompt_len, a.load.max_new_tokens);
            std::thread::spawn(move || -> (usize, usize) {
                let (mut tokens, mut failed) = (0, 0);
                for r in 0..reqs {
                    let name = match pick {
                        Pick::None => None,
                        Pick::One => Some("a0".to_string()),
                        Pick::PerClient => Some(format!("a{c}")),
                        Pick::Uniform(n) => Some(format!("a{}", (c * 7919 + r * 104729) % n)),
                    };
                    let mut req = GenerateRequest::new(
                        (0..plen)
                            .map(|i| ((c * 31 + r * 7 + i * 104729) as u32) % vocab)
                            .collect(),
                    );
                    req.stopping.max_new_tokens = max_new;
                    req.stopping.ignore_eos = true;
                    req.adapter = match registry.resolve(name.as_deref()) {
                        Ok(a) => a,
                        Err(_) => {
                            failed += 1;
                            continue;
                        }
                    };
                    let Ok(mut s) = handle.submit(req) else {
                        failed += 1;
                        continue;
                    };
                    while let Some(e) = s.blocking_recv() {
                        match e {
                            Event::Token(_) => tokens += 1,
                            Event::Error(_) => failed += 1,
                            _ => {}
                        }
                    }
                }
                (tokens, failed)
            })
        })
        .collect();
    let (mut tokens, mut failed) = (0, 0);
    for (n, f) in crate::join_clients(threads)? {
        tokens += n;
        failed += f;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let m = handle.metrics().snapshot();
    handle.shutdown();
    Ok(CaseResult {
        tok_s: tokens as f64 / elapsed,
        engine_loads: m.lora_engine_loads,
        engine_evictions: m.lora_engine_evictions,
        host_loads: metrics.host_loads.get(),
        failed,
    })
}
