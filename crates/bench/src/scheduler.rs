//! `lmi bench scheduler`: decode throughput through the rolling-batch scheduler at several
//! concurrencies, and the scheduler's own share of each step.

use std::time::Instant;

use lmi_engine::BLOCK_SIZE;
use lmi_engine::engine::EngineOptions;
use lmi_scheduler::{Event, GenerateRequest, Handle, SchedulerConfig};

use crate::args::ModelArgs;
use crate::report;

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

pub fn run(a: SchedulerArgs) -> anyhow::Result<()> {
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
    let report = report::Report {
        title: "lmi bench scheduler".into(),
        text,
        charts: vec![report::Chart::Line {
            title: "Decode tokens/s against concurrent requests".into(),
            x_label: "concurrent requests".into(),
            y_label: "decode tokens/s".into(),
            points,
        }],
    };
    report::write(&report, &a.report)?;
    println!("\nreport: {}", a.report.display());
    Ok(())
}
