//! `lmi bench`: the benchmarks and load tools of the `lmi` binary (its `bench` subcommand).
//! Engine and scheduler benchmarks load a model in this process (`engine.rs`,
//! `scheduler.rs`, `lora.rs`, `structured.rs`, `speculative.rs`, `vision.rs`); `http.rs` and
//! `soak.rs` are clients of a running server. The load benchmarks also write a
//! self-contained HTML report with plots (`report.rs`).

mod args;
mod engine;
mod http;
mod lora;
mod report;
mod scheduler;
mod soak;
mod speculative;
mod structured;
mod vision;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Engine throughput: prefill and decode (each step drawing its tokens) at each batch size.
    Engine(engine::EngineArgs),
    /// Decode throughput through the rolling-batch scheduler at several concurrencies, and the
    /// scheduler's own share of each step.
    Scheduler(scheduler::SchedulerArgs),
    /// Drives a running server over HTTP (closed loop: concurrency, prompt and output lengths,
    /// streaming) and reports requests/s, output tok/s, TTFT, inter-token and E2E latency.
    Http(http::HttpArgs),
    /// Decode throughput with LoRA adapters (one, one per client, churn over many) against
    /// no adapter, through the adapter registry and the scheduler.
    Lora(lora::LoraArgs),
    /// Decode throughput with each request under its own JSON schema against unconstrained,
    /// and the time to compute one token mask (p50/p99).
    Structured(structured::StructuredArgs),
    /// Soak and faults against a running server: a mix of routes, clients that hang up
    /// mid-stream and malformed bodies; outcomes, KV blocks left and resident memory.
    Soak(soak::SoakArgs),
    /// Decode throughput with speculative decoding (client predictions, prompt lookup)
    /// against none, on a rewrite and a quoting task; checks the outputs are identical.
    Speculative(speculative::SpeculativeArgs),
    /// What images cost a vision-language model: preprocessing ms per megapixel, the vision
    /// encoder against our matrix product's rate, TTFT with and without an image, the
    /// encoder and prefix caches, and requests/s with each client sending its own image.
    Vision(vision::VisionArgs),
}

/// Runs one benchmark.
pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Engine(a) => engine::run(a),
        BenchCommand::Scheduler(a) => scheduler::run(a),
        BenchCommand::Http(a) => http::run(a),
        BenchCommand::Lora(a) => lora::run(a),
        BenchCommand::Structured(a) => structured::run(a),
        BenchCommand::Soak(a) => soak::run(a),
        BenchCommand::Speculative(a) => speculative::run(&a),
        BenchCommand::Vision(a) => vision::run(a),
    }
}

/// Joins a benchmark's client threads, in order.
fn join_clients<T>(threads: Vec<std::thread::JoinHandle<T>>) -> anyhow::Result<Vec<T>> {
    threads
        .into_iter()
        .map(|t| {
            t.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))
        })
        .collect()
}
