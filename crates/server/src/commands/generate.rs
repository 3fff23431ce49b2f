//! `lmi generate`: one prompt through the engine, streamed to stdout. A direct loop over the
//! engine (one sequence, contiguous blocks); serving goes through the scheduler instead.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, bail};
use lmi_engine::engine::EngineOptions;
use lmi_engine::sampling::{SamplingParams, SequenceContext};
use lmi_engine::{BLOCK_SIZE, DType, Device, LogitsWanted, SampleRequest, SeqChunk, StepBatch};
use lmi_text::{IncrementalDetokenizer, Tokenizer};

#[derive(clap::Args)]
pub struct Args {
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
    /// The prompt text.
    #[arg(long, short)]
    prompt: String,
    /// Apply the model's chat template to the prompt as one user message.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let resolved = lmi_store::resolve(a.model.as_deref(), true)?;
    let dir = resolved.dir.clone();
    let tokenizer = Tokenizer::from_dir(&dir).context("loading the tokenizer")?;
    let prompt_text = if a.chat {
        let template = lmi_text::ChatTemplate::from_model_dir(&dir)?
            .context("the model has no chat template; drop --chat")?;
        let messages = vec![lmi_text::Message::new("user", a.prompt.as_str())];
        template.render(&messages, true, false)?
    } else {
        a.prompt.clone()
    };
    let prompt = tokenizer.encode(&prompt_text, true)?;
    if prompt.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let total = prompt.len() + a.max_new_tokens;
    let blocks = total.div_ceil(BLOCK_SIZE);
    let opts = EngineOptions {
        dtype: a.dtype,
        gguf: resolved.gguf.clone(),
        kv_blocks: Some(blocks),
        // One block table (and state slot), laid out here.
        window_pools: false,
        state_slots: Some(1),
        ..Default::default()
    };
    let mut engine = lmi_engine::open(a.device, &dir, &opts)?;
    let params = SamplingParams {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        seed: a.seed,
        ..Default::default()
    };
    params.validate().map_err(anyhow::Error::msg)?;
    let eos = tokenizer.eos_token_ids();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut detok = IncrementalDetokenizer::new(true);
    let mut output: Vec<u32> = Vec::new();
    let mut stdout = std::io::stdout();
    let started = Instant::now();
    let mut first_token = None;
    let mut chunk = SeqChunk {
        tokens: prompt.clone(),
        start_pos: 0,
        block_table: table,
        window_table: Vec::new(),
        logits: LogitsWanted::Last,
        adapter: None,
    };
    // A model with recurrent layers keeps the sequence's state in slot 0.
    let states = match engine.state_config() {
        Some(_) => vec![lmi_engine::ChunkState::in_slot(0)],
        None => Vec::new(),
    };
    while output.len() < a.max_new_tokens {
        let draw = SampleRequest {
            chunk: 0,
            position: chunk.tokens.len() - 1,
            params: &params,
            seed: params.seed,
            ctx: SequenceContext {
                prompt: &prompt,
                output: &output,
                stop_ids: &eos,
            },
            allowed: None,
        };
        let out = engine.step(&StepBatch {
            chunks: std::slice::from_ref(&chunk),
            samples: &[draw],
            prompt_logprobs: &[],
            media: &[],
            rope_deltas: &[],
            states: &states,
            pools: &[],
            mtp: &[],
        })?;
        let tok = out
            .samples
            .first()
            .map(|s| s.token)
            .context("the engine drew no token")?;
        first_token.get_or_insert_with(|| started.elapsed());
        output.push(tok);
        if !a.ignore_eos && eos.contains(&tok) {
            break;
        }
        write!(stdout, "{}", detok.push(&tokenizer, tok)?)?;
        stdout.flush()?;
        chunk.start_pos += chunk.tokens.len();
        chunk.tokens = vec![tok];
    }
    writeln!(stdout, "{}", detok.flush(&tokenizer)?)?;
    let elapsed = started.elapsed();
    let ttft = first_token.unwrap_or(elapsed);
    let decode = output.len().saturating_sub(1);
    eprintln!(
        "[{} prompt tokens, {} generated; first token {:.0} ms; decode {:.1} tok/s]",
        prompt.len(),
        output.len(),
        ttft.as_secs_f64() * 1e3,
        decode as f64 / (elapsed - ttft).as_secs_f64().max(1e-9)
    );
    Ok(())
}
