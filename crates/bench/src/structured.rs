//! `lmi bench structured`: aggregate decode throughput with every request under its own JSON
//! schema against the same load unconstrained, and the time to compute one token mask.
//!
//! Closed loop: `--concurrency` client threads each run `--requests` requests back to back
//! (prompt `--prompt-len` tokens, `--max-new-tokens` greedy tokens). Each client's schema is a
//! different variation of a moderately complex one (an object holding a long array of records
//! with strings, bounded numbers, enums, booleans, optional and nested fields) whose shortest
//! document is longer than `--max-new-tokens`, so constrained and unconstrained requests
//! decode the same number of tokens and the throughputs compare like for like.

use std::time::Instant;

use anyhow::Context;
use lmi_engine::engine::EngineOptions;
use lmi_scheduler::constraint::{Grammar, GrammarSpec, Guide};
use lmi_scheduler::{Event, GenerateRequest, Handle, SchedulerConfig};
use serde_json::{Value, json};

use crate::args::{LoadArgs, ModelArgs};

#[derive(clap::Args)]
pub struct StructuredArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    load: LoadArgs,
}

/// Client `i`'s schema: the same shape with its own names, enums and bounds.
pub fn schema(i: usize) -> Value {
    let colors = [
        "red", "green", "blue", "amber", "violet", "teal", "black", "white",
    ];
    let enum_values: Vec<String> = (0..3 + i % 4)
        .map(|k| format!("{}_{i}", colors[(i + k) % colors.len()]))
        .collect();
    json!({
        "type": "object",
        "properties": {
            format!("batch_{i}"): {"type": "string", "maxLength": 12},
            "records": {
                "type": "array",
                "minItems": 200,
                "items": {
                    "type": "object",
                    "properties": {
                        format!("id_{i}"): {"type": "integer", "minimum": 0, "maximum": 1000 + i},
                        "label": {"type": "string", "maxLength": 8 + i % 5},
                        "score": {"type": "number", "minimum": -1, "maximum": 1},
                        "kind": {"enum": enum_values},
                        "flag": {"type": "boolean"},
                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
                        "where": {
                            "type": "object",
                            "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                            "required": ["x"],
                            "additionalProperties": false
                        }
                    },
                    "required": [format!("id_{i}"), "label", "kind", "flag"],
                    "additionalProperties": false
                }
            }
        },
        "required": [format!("batch_{i}"), "records"],
        "additionalProperties": false
    })
}

pub fn run(a: StructuredArgs) -> anyhow::Result<()> {
    let (dir, dtype, _) = a.m.resolve()?;
    let tokenizer = lmi_text::Tokenizer::from_dir(&dir)?;
    let config = lmi_engine::ModelConfig::from_file(&dir.join("config.json"))?;
    let mut eos = config.eos_token_ids.clone();
    eos.extend(tokenizer.eos_token_ids());
    let guide = Guide::new(&dir, tokenizer.clone(), config.vocab_size, &eos)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let t = Instant::now();
    let grammars: Vec<Grammar> = (0..a.load.concurrency)
        .map(|i| {
            guide
                .compile(&GrammarSpec::JsonSchema(schema(i)))
                .map_err(|e| anyhow::anyhow!("schema {i}: {e}"))
        })
        .collect::<anyhow::Result<_>>()?;
    let compile_ms = t.elapsed().as_secs_f64() * 1e3 / a.load.concurrency as f64;
    let mut text = format!(
        "model {} on {} ({} weights), {} clients x {} requests, prompt {} tokens, {} new tokens; \
         {} schemas compiled in {compile_ms:.1} ms each\n\n",
        dir.display(),
        a.m.device,
        ModelArgs::dtype_name(dtype),
        a.load.concurrency,
        a.load.requests,
        a.load.prompt_len,
        a.load.max_new_tokens,
        a.load.concurrency,
    );
    text.push_str(
        "| case | decode tok/s (aggregate) | vs unconstrained | masks | mask p50 (µs) | mask p99 (µs) | mask mean (µs) | failed |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    print!("{text}");
    let mut bars = Vec::new();
    let mut base = None;
    let mut outputs = Vec::new();
    for (name, constrained) in [
        ("unconstrained", None),
        ("a different JSON schema per client", Some(&grammars)),
    ] {
        let r = run_case(&a, &dir, &tokenizer, constrained)?;
        outputs = r.outputs;
        let b = *base.get_or_insert(r.tok_s);
        let us = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
        let row = format!(
            "| {name} | {:.1} | {:.0}% | {} | {} | {} | {} | {} |",
            r.tok_s,
            r.tok_s / b * 100.0,
            r.masks,
            us(r.p50),
            us(r.p99),
            us(r.mean),
            r.failed
        );
        println!("{row}");
        text.push_str(&row);
        text.push('\n');
        bars.push((name.to_string(), r.tok_s));
    }
    // The same masks again on one thread with nothing else running: the cost of a mask
    // itself, apart from the contention with the forward pass measured above.
    let mut times: Vec<u32> = Vec::new();
    for (g, tokens) in grammars.iter().zip(&outputs) {
        let mut c = g.start();
        for &t in tokens {
            let started = Instant::now();
            c.mask().map_err(|e| anyhow::anyhow!("{e}"))?;
            times.push(started.elapsed().as_micros() as u32);
            c.commit(t).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    times.sort_unstable();
    let q = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    if !times.is_empty() {
        println!(
            "\nmasks alone (one thread, replaying each client's first output): {} masks, p50 {} µs, p99 {} µs, max {} µs",
            times.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
    let path = a
        .load
        .report
        .clone()
        .unwrap_or_else(|| "lmi-bench-structured.html".into());
    crate::report::write_cases(&path, "lmi bench structured", text, "decode tok/s", bars)
}

struct CaseResult {
    tok_s: f64,
    masks: u64,
    p50: Option<u32>,
    p99: Option<u32>,
    mean: Option<u32>,
    failed: usize,
    /// The tokens of each client's first request.
    outputs: Vec<Vec<u32>>,
}

fn run_case(
    a: &StructuredArgs,
    dir: &std::path::Path,
    tokenizer: &lmi_text::Tokenizer,
    grammars: Option<&Vec<Grammar>>,
) -> anyhow::Result<CaseResult> {
    let per_seq = (a.load.prompt_len + a.load.max_new_tokens).div_ceil(lmi_engine::BLOCK_SIZE);
    let (_, dtype, gguf) = a.m.resolve()?;
    let opts = EngineOptions {
        dtype,
        gguf: gguf.clone(),
        kv_blocks: Some(per_seq * a.load.concurrency + 8),
        ..Default::default()
    };
    let engine = lmi_engine::open(a.m.device, dir, &opts)
        .with_context(|| format!("loading {}", dir.display()))?;
    let vocab = engine.model_config().vocab_size as u32;
    let handle = Handle::spawn(
        engine,
        tokenizer.clone(),
        SchedulerConfig {
            max_batch_size: a.load.concurrency,
            max_batch_tokens: (a.load.prompt_len * a.load.concurrency).max(512),
            max_model_len: a.load.prompt_len + a.load.max_new_tokens + 1,
            max_waiting: a.load.concurrency * 2,
            max_loras: 0,
            ..Default::default()
        },
    );
    let started = Instant::now();
    let threads: Vec<_> = (0..a.load.concurrency)
        .map(|c| {
            let handle = handle.clone();
            let grammar = grammars.map(|g| g[c].clone());
            let (reqs, plen, max_new) = (a.load.requests, a.load.prompt_len, a.load.max_new_tokens);
            std::thread::spawn(move || -> (usize, usize, Vec<u32>) {
                let (mut tokens, mut failed, mut first) = (0, 0, Vec::new());
                for r in 0..reqs {
                    let mut req = GenerateRequest::new(
                        (0..plen)
                            .map(|i| ((c * 31 + r * 7 + i * 104729) as u32) % vocab)
                            .collect(),
                    );
                    req.stopping.max_new_tokens = max_new;
                    // Unconstrained requests ignore EOS so both cases decode every token; the
                    // grammar cannot end before max_new_tokens anyway.
                    req.stopping.ignore_eos = grammar.is_none();
                    req.constraint = grammar.clone();
                    let Ok(mut s) = handle.submit(req) else {
                        failed += 1;
                        continue;
                    };
                    while let Some(e) = s.blocking_recv() {
                        match e {
                            Event::Token(t) => {
                                tokens += 1;
                                if r == 0 {
                                    first.push(t.id);
                                }
                            }
                            Event::Error(_) => failed += 1,
                            _ => {}
                        }
                    }
                }
                (tokens, failed, first)
            })
        })
        .collect();
    let (mut tokens, mut failed, mut outputs) = (0, 0, Vec::new());
    for (n, f, first) in crate::join_clients(threads)? {
        tokens += n;
        failed += f;
        outputs.push(first);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let m = handle.metrics();
    let snap = m.snapshot();
    let result = CaseResult {
        tok_s: tokens as f64 / elapsed,
        masks: snap.masks,
        p50: m.mask_quantile_micros(0.5),
        p99: m.mask_quantile_micros(0.99),
        mean: (snap.masks > 0).then(|| (snap.mask_nanos / snap.masks / 1000) as u32),
        failed,
        outputs,
    };
    handle.shutdown();
    Ok(result)
}
