//! `lmi bench engine`: prefill and decode throughput of the engine alone at several batch
//! sizes, and batch-1 decode against the memory roofline (weight bytes per step over a
//! bandwidth measured here).

use std::path::PathBuf;
use std::time::Instant;

use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::sampling::SamplingParams;
use lmi_engine::{BLOCK_SIZE, DType, Device, LogitsWanted, SampleRequest, SeqChunk, StepBatch};
use lmi_scheduler::{Event, GenerateRequest, Handle, SchedulerConfig};
use rayon::prelude::*;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Engine throughput: prefill and decode (each step drawing its tokens) at each batch size.
    Engine(EngineArgs),
    /// Decode throughput through the rolling-batch scheduler at several concurrencies, and the
    /// scheduler's own share of each step.
    Scheduler(SchedulerArgs),
    /// Drives a running server over HTTP (closed loop: concurrency, prompt and output lengths,
    /// streaming) and reports requests/s, output tok/s, TTFT, inter-token and E2E latency.
    Http(super::bench_http::HttpArgs),
    /// Decode throughput with LoRA adapters (one, one per client, churn over many) against
    /// no adapter, through the adapter registry and the scheduler.
    Lora(super::bench_lora::LoraArgs),
    /// Decode throughput with each request under its own JSON schema against unconstrained,
    /// and the time to compute one token mask (p50/p99).
    Structured(super::bench_structured::StructuredArgs),
    /// Soak and faults against a running server: a mix of routes, clients that hang up
    /// mid-stream and malformed bodies; outcomes, KV blocks left and resident memory.
    Soak(super::bench_soak::SoakArgs),
    /// Decode throughput with speculative decoding (client predictions, prompt lookup)
    /// against none, on a rewrite and a quoting task; checks the outputs are identical.
    Speculative(super::bench_speculative::SpeculativeArgs),
    /// What images cost a vision-language model: preprocessing ms per megapixel, the vision
    /// encoder against our matrix product's rate, TTFT with and without an image, the
    /// encoder and prefix caches, and requests/s with each client sending its own image.
    Vision(super::bench_vision::VisionArgs),
}

/// Joins a benchmark's client threads, in order.
pub fn join_clients<T>(threads: Vec<std::thread::JoinHandle<T>>) -> anyhow::Result<Vec<T>> {
    threads
        .into_iter()
        .map(|t| {
            t.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))
        })
        .collect()
}

/// A closed-loop load: client threads each running requests back to back.
#[derive(clap::Args)]
pub struct LoadArgs {
    /// Client threads.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Requests each client thread runs back to back.
    #[arg(long, default_value_t = 3)]
    pub requests: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// The HTML report (a bar chart of each case's throughput beside the table); by default
    /// `lmi-bench-<command>.html` in the working directory.
    #[arg(long)]
    pub report: Option<std::path::PathBuf>,
}

/// The model a benchmark loads, and where (flattened into each benchmark's arguments).
#[derive(clap::Args)]
pub struct ModelArgs {
    /// HF model directory or GGUF file; the default model when absent.
    #[arg(long)]
    pub model: Option<String>,
    /// Device: cpu, cuda or cuda:<ordinal>.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Weight dtype in memory (f32, bf16, int8); when absent a GGUF's quantized blocks as
    /// they are on the CPU, else bf16.
    #[arg(long)]
    pub dtype: Option<DType>,
}

impl ModelArgs {
    /// The model directory, the dtype to ask the engine for, and the GGUF it came from.
    pub fn resolve(&self) -> anyhow::Result<(PathBuf, Option<DType>, Option<PathBuf>)> {
        let r = lmi_store::resolve(self.model.as_deref(), true)?;
        let dtype = self
            .dtype
            .or_else(|| self.device.auto_dtype(r.gguf.is_some()));
        Ok((r.dir, dtype, r.gguf))
    }

    pub fn dtype_name(dtype: Option<DType>) -> String {
        dtype.map_or_else(|| "GGUF blocks as stored".to_string(), |d| d.to_string())
    }
}

#[derive(clap::Args)]
pub struct SchedulerArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Concurrent requests to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<usize>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 64)]
    prompt_len: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// The HTML report (decode tokens/s against concurrency beside the table).
    #[arg(long, default_value = "lmi-bench-scheduler.html")]
    report: std::path::PathBuf,
}

#[derive(clap::Args)]
pub struct EngineArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Batch sizes to measure (default 1,4,16,64 on the CPU; 1,8,64,256 on a GPU).
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Decode steps measured per batch size (after one warm-up step).
    #[arg(long, default_value_t = 16)]
    decode_steps: usize,
    /// On a GPU, the ceilings' sizes: MiB copied for the bandwidth, side of the square bf16
    /// products for the matrix rate (small ones for a rehearsal on the fake driver).
    #[arg(long, value_delimiter = ',', default_values_t = [1024, 8192])]
    ceiling_sizes: Vec<usize>,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Engine(a) => engine(a),
        BenchCommand::Scheduler(a) => scheduler(a),
        BenchCommand::Http(a) => super::bench_http::run(a),
        BenchCommand::Lora(a) => super::bench_lora::run(a),
        BenchCommand::Structured(a) => super::bench_structured::run(a),
        BenchCommand::Soak(a) => super::bench_soak::run(a),
        BenchCommand::Speculative(a) => super::bench_speculative::run(&a),
        BenchCommand::Vision(a) => super::bench_vision::run(a),
    }
}

/// Read bandwidth of main memory: the best of a few parallel passes over a 1 GiB buffer.
pub fn measure_read_bandwidth() -> f64 {
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let threads = rayon::current_num_threads();
    let mut best = 0.0f64;
    for _ in 0..4 {
        let t = Instant::now();
        let sum: u64 = buf
            .par_chunks(words.div_ceil(threads))
            .map(|c| {
                let mut acc = [0u64; 8];
                for w in c.chunks_exact(8) {
                    for i in 0..8 {
                        acc[i] = acc[i].wrapping_add(w[i]);
                    }
                }
                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
            })
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / t.elapsed().as_secs_f64());
    }
    best
}

fn engine(a: EngineArgs) -> anyhow::Result<()> {
    let &[copy_mib, side] = a.ceiling_sizes.as_slice() else {
        anyhow::bail!("--ceiling-sizes takes two numbers: MiB copied, product side");
    };
    let (dir, dtype, gguf) = a.m.resolve()?;
    let batches = match (a.batch.is_empty(), a.m.device) {
        (false, _) => a.batch.clone(),
        (true, Device::Cpu) => vec![1, 4, 16, 64],
        (true, Device::Cuda(_)) => vec![1, 8, 64, 256],
    };
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let per_seq = (a.prompt_len + a.decode_steps + 1).div_ceil(BLOCK_SIZE);
    let opts = EngineOptions {
        dtype,
        gguf: gguf.clone(),
        kv_blocks: Some(per_seq * max_batch),
        // The bench lays out its own block tables, one per sequence.
        window_pools: false,
        ..Default::default()
    };
    let mut engine = lmi_engine::open(a.m.device, &dir, &opts)?;
    let vocab = engine.model_config().vocab_size as u32;
    let (bw, what) = match a.m.device {
        Device::Cpu => (
            measure_read_bandwidth(),
            "memory read bandwidth".to_string(),
        ),
        Device::Cuda(ordinal) => {
            let c = lmi_engine::cuda::ceilings::measure(ordinal, copy_mib << 20, side)?;
            let what = format!(
                "device copy bandwidth (read + written; bf16 product rate {:.0} TFLOP/s)",
                c.bf16_flops / 1e12
            );
            (c.copy_bandwidth, what)
        }
    };
    let weight_bytes = engine.weight_bytes();
    let c = engine.model_config();
    let kv_elem = if dtype == Some(DType::F32) && a.m.device == Device::Cpu {
        4
    } else {
        2
    };
    let kv_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * kv_elem;
    // A decode step reads every weight once and every sequence's K/V (mean context).
    let context = a.prompt_len + a.decode_steps / 2;
    // A mixture of experts reads more experts for more tokens.
    let roofline = |b: usize, weights: usize| (weights + b * context * kv_per_token) as f64 / bw;
    println!(
        "model {} on {} ({} weights, {:.1} MB held; {:.1} MB of weights and {:.1} KB of K/V per token of context read per decode step), {} host threads, {what} {:.2} GB/s",
        dir.display(),
        a.m.device,
        ModelArgs::dtype_name(dtype),
        engine.resident_weight_bytes() as f64 / 1e6,
        weight_bytes as f64 / 1e6,
        kv_per_token as f64 / 1e3,
        rayon::current_num_threads(),
        bw / 1e9
    );
    println!(
        "batch-1 decode roofline: {:.2} ms/token ({:.1} tok/s)\n",
        roofline(1, weight_bytes) * 1e3,
        1.0 / roofline(1, weight_bytes)
    );
    // Rates use the median step: on a shared machine a neighbour's burst lands on a few steps
    // and would otherwise decide the mean (printed beside it).
    println!(
        "| batch | prefill tok/s | decode step ms (median) | (mean) | decode tok/s | vs batch 1 | roofline ms | of roofline | decode products on |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut base = None;
    for &b in &batches {
        let limit = roofline(b, engine.step_weight_bytes(b));
        let mut chunks: Vec<SeqChunk> = (0..b)
            .map(|s| SeqChunk {
                tokens: (0..a.prompt_len)
                    .map(|i| ((s * 7919 + i * 104729) as u32) % vocab)
                    .collect(),
                start_pos: 0,
                block_table: ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect(),
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            })
            .collect();
        let t = Instant::now();
        greedy_step(engine.as_mut(), &chunks)?;
        let prefill = (b * a.prompt_len) as f64 / t.elapsed().as_secs_f64();
        let mut step = |chunks: &mut Vec<SeqChunk>| -> anyhow::Result<()> {
            for c in chunks.iter_mut() {
                c.start_pos += c.tokens.len();
                c.tokens = vec![(c.start_pos as u32 * 31) % vocab];
            }
            greedy_step(engine.as_mut(), chunks)?;
            Ok(())
        };
        step(&mut chunks)?; // warm-up
        let mut steps = Vec::with_capacity(a.decode_steps);
        for _ in 0..a.decode_steps.max(1) {
            let t = Instant::now();
            step(&mut chunks)?;
            steps.push(t.elapsed().as_secs_f64());
        }
        let mean = steps.iter().sum::<f64>() / steps.len() as f64;
        steps.sort_by(f64::total_cmp);
        let per_step = steps[steps.len() / 2];
        let tps = b as f64 / per_step;
        let base_tps = *base.get_or_insert(tps);
        println!(
            "| {b} | {prefill:.0} | {:.2} | {:.2} | {tps:.1} | {:.2}x | {:.2} | {:.0}% | {} |",
            per_step * 1e3,
            mean * 1e3,
            tps / base_tps,
            limit * 1e3,
            limit / per_step * 100.0,
            engine.product_kernel(b)
        );
    }
    Ok(())
}

/// One engine step that draws the next token of every chunk greedily (as serving does: the
/// step includes the draw).
fn greedy_step(engine: &mut dyn StepEngine, chunks: &[SeqChunk]) -> anyhow::Result<()> {
    let params = SamplingParams::default();
    let samples = SampleRequest::at_each_last_token(chunks, &params);
    engine.step(&StepBatch {
        chunks,
        samples: &samples,
        prompt_logprobs: &[],
        media: &[],
        rope_deltas: &[],
    })?;
    Ok(())
}

fn scheduler(a: SchedulerArgs) -> anyhow::Result<()> {
    let (dir, dtype, gguf) = a.m.resolve()?;
    let tokenizer = lmi_text::Tokenizer::from_dir(&dir)?;
    let mut text = format!(
        "model {} ({} weights), prompt {} tokens, {} new tokens per request, {} threads\n\n",
        dir.display(),
        ModelArgs::dtype_name(dtype),
        a.prompt_len,
        a.max_new_tokens,
        rayon::current_num_threads()
    );
    text.push_str(
        "| concurrent requests | decode tok/s (aggregate) | mean step ms | scheduler share of step | of which sampling | scheduler share without sampling |\n|---:|---:|---:|---:|---:|---:|\n",
    );
    print!("{text}");
    let mut points = Vec::new();
    for &c in &a.concurrency {
        let per_seq = (a.prompt_len + a.max_new_tokens).div_ceil(BLOCK_SIZE);
        let opts = EngineOptions {
            dtype,
            gguf: gguf.clone(),
            kv_blocks: Some(per_seq * c + 8),
            ..Default::default()
        };
        let engine = lmi_engine::open(a.m.device, &dir, &opts)?;
        let vocab = engine.model_config().vocab_size as u32;
        let cfg = SchedulerConfig {
            max_batch_size: c,
            max_batch_tokens: (a.prompt_len * c).max(512),
            max_model_len: a.prompt_len + a.max_new_tokens + 1,
            max_waiting: c,
            max_loras: 4,
            ..Default::default()
        };
        let handle = Handle::spawn(engine, tokenizer.clone(), cfg);
        let streams = (0..c)
            .map(|s| {
                let prompt = (0..a.prompt_len)
                    .map(|i| ((s * 7919 + i * 104729) as u32) % vocab)
                    .collect();
                let mut r = GenerateRequest::new(prompt);
                r.stopping.max_new_tokens = a.max_new_tokens;
                r.stopping.ignore_eos = true;
                handle.submit(r)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Decode throughput: from the moment every request has its first token to the end.
        let mut threads = Vec::new();
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        for mut s in streams {
            let tx = first_tx.clone();
            threads.push(std::thread::spawn(move || {
                let mut n = 0usize;
                while let Some(e) = s.blocking_recv() {
                    if let Event::Token(_) = e {
                        n += 1;
                        if n == 1 {
                            let _ = tx.send(());
                        }
                    }
                }
                n
            }));
        }
        for _ in 0..c {
            first_rx.recv()?;
        }
        let before = handle.metrics().snapshot();
        let t = Instant::now();
        let total: usize = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
        let elapsed = t.elapsed().as_secs_f64();
        let after = handle.metrics().snapshot();
        let decode_tokens = total - c;
        let steps = (after.steps - before.steps).max(1);
        let step_ns = after.step_nanos - before.step_nanos;
        let fwd_ns = after.forward_nanos - before.forward_nanos;
        let sample_ns = after.sample_nanos - before.sample_nanos;
        let pct = |ns: u64| ns as f64 / step_ns.max(1) as f64 * 100.0;
        let row = format!(
            "| {c} | {:.1} | {:.1} | {:.2}% | {:.2}% | {:.2}% |",
            decode_tokens as f64 / elapsed,
            step_ns as f64 / steps as f64 / 1e6,
            pct(step_ns - fwd_ns),
            pct(sample_ns),
            pct(step_ns - fwd_ns - sample_ns)
        );
        println!("{row}");
        text.push_str(&row);
        text.push('\n');
        points.push((c as f64, decode_tokens as f64 / elapsed));
        handle.shutdown();
    }
    let report = super::bench_report::Report {
        title: "lmi bench scheduler".into(),
        text,
        charts: vec![super::bench_report::Chart::Line {
            title: "Decode tokens/s against concurrent requests".into(),
            x_label: "concurrent requests".into(),
            y_label: "decode tokens/s".into(),
            points,
        }],
    };
    super::bench_report::write(&report, &a.report)?;
    println!("\nreport: {}", a.report.display());
    Ok(())
}
