//! `lmi`: one binary for serving, batch inference, model conversion and benchmarks.

mod app;
mod chat_job;
mod commands;
mod config;
mod dynamic_batch;
mod generation;
mod grammars;
mod guard;
mod infer;
mod media;
mod metrics;
mod models;
mod null_engine;
mod pooling;
mod reasoning;
mod reply;
mod responses_store;
mod router;
mod routes;
mod tool_calls;

use clap::{Parser, Subcommand};

/// Freed memory stays in the process: the engine allocates step-sized buffers (megabytes of
/// logits and activations) every step, and the system allocator would hand them back to the
/// kernel and fault them in zeroed again each time.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Hands the pages this thread has freed back to the kernel. Loading a model parses megabytes
/// of JSON and GGUF metadata into short-lived structures (about 40 MiB for the default model's
/// tokenizer); the loading thread then goes idle, and mimalloc would keep those pages resident
/// for the life of the process.
pub(crate) fn release_freed_memory() {
    // SAFETY: mi_collect only walks the calling thread's heap and abandoned segments.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

#[derive(Parser)]
#[command(
    name = "lmi",
    version,
    about = "LLM inference server with LMI, TGI and OpenAI wire formats"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model over HTTP (LMI, TGI and OpenAI routes) on port 8080.
    Serve(commands::serve::Args),
    /// Run a batch input file (TensorRT Edge-LLM format) and write the responses.
    Infer(commands::infer::Args),
    /// Generate text from a prompt (the default model when --model is not given).
    Generate(commands::generate::Args),
    /// Fetch a model (Hub id or s3:// prefix) into its cache and print its directory.
    Fetch(commands::fetch::Args),
    /// Import a GGUF file into an HF model directory (safetensors, config, tokenizer).
    Convert(commands::convert::Args),
    /// Re-quantize a GGUF's weight matrices into one block type (q8_0, q4_0, q4_1, q4_k, q6_k, mxfp4).
    Quantize(commands::quantize::Args),
    /// Benchmarks: `lmi bench engine` measures the engine alone.
    #[command(subcommand)]
    Bench(lmi_bench::BenchCommand),
}

/// Errors end the process with one line (`error: what: why: ...`) and exit status 1.
fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Serve(a) => commands::serve::run(a),
        Command::Infer(a) => commands::infer::run(a),
        Command::Generate(a) => commands::generate::run(a),
        Command::Fetch(a) => commands::fetch::run(a),
        Command::Convert(a) => commands::convert::run(a),
        Command::Quantize(a) => commands::quantize::run(a),
        Command::Bench(b) => lmi_bench::run(b),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
