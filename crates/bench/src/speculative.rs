//! `lmi bench speculative`: decode throughput with and without speculative decoding, through
//! the scheduler, on two tasks where drafts exist: rewriting a passage with small edits (the
//! client sends the edited passage as its `prediction`, or prompt lookup finds it in the
//! prompt) and quoting sentences of a passage (prompt lookup). Every speculative case's greedy
//! output is checked against the plain case's, token for token.
//!
//! Closed loop: `--batch` sizes of concurrent client threads, each running its requests back
//! to back. Decode tok/s sums each client's (tokens after the first) / (time from its first
//! token to its last), so prefill is left out, as the "decode tokens/s" asks.

use std::time::Instant;

use anyhow::Context;
use lmi_engine::engine::EngineOptions;
use lmi_scheduler::{
    DraftSource, Event, GenerateRequest, Handle, NgramLookup, SchedulerConfig, SpeculativeConfig,
};
use lmi_text::{ChatTemplate, Message, Tokenizer};

use crate::args::ModelArgs;

#[derive(clap::Args)]
pub struct SpeculativeArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Concurrent clients, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,8,16")]
    batch: Vec<usize>,
    /// Requests each client runs back to back (alternating passages).
    #[arg(long, default_value_t = 2)]
    requests: usize,
    /// Prompt lookup sizes and draft length (as option.speculative_ngram).
    #[arg(long, default_value = "2-4:8")]
    ngram: NgramLookup,
    /// The HTML report (a bar chart of each case's decode tokens/s beside the table).
    #[arg(long, default_value = "lmi-bench-speculative.html")]
    report: std::path::PathBuf,
}

const PASSAGES: [&str; 2] = [
    "The harbour town woke slowly in the grey light of autumn. Fishermen checked their nets along the quay while the smell of fresh bread drifted from the bakery on the corner. The old lighthouse keeper, who had watched the sea for forty years, liked to say that the colour of the water told you everything about the weather to come. Children walked to school in pairs, their bright coats the only flashes of colour against the stone walls. At the town hall, the council had gathered to organise the winter festival, a tradition that had survived two wars and a great storm. Every year the neighbours decorated the streets with lanterns, and every year someone argued about the programme. This year the debate was about whether the festival should move from the harbour to the park behind the church. The mayor listened patiently, as was his habit, and then reminded everyone that the festival had always belonged to the sea. By noon the decision was made, and the favourite stalls would stay by the water. In the afternoon the rain returned, but nobody seemed to mind. The town had spent centuries learning how to live with the weather, and a little rain was simply part of the rhythm of the season.",
    "Modern libraries are no longer quiet rooms full of dusty shelves. They have become busy centres where people meet, learn and share ideas. In many cities the library is the only public space that is open to everyone, free of charge, with no expectation that visitors buy anything. Librarians now organise coding clubs for teenagers, language classes for newcomers and workshops on how to recognise misleading news. They help job seekers write their applications and show older neighbours how to use a tablet to talk with their grandchildren. The buildings themselves have changed as well. Architects favour large windows, flexible furniture and spaces that can be rearranged for a concert in the evening or a study group in the morning. Some libraries lend tools, musical instruments and even seeds for the garden. Critics sometimes ask whether libraries still matter when so much information is online. The answer, according to those who use them, is that a library offers something the internet cannot: a calm place to think, a trained person to ask, and a community that values curiosity. As long as people want to learn together, the library will remain the heart of the neighbourhood.",
];

/// British spellings the rewrite task changes.
const EDITS: [(&str, &str); 9] = [
    ("harbour", "harbor"),
    ("colour", "color"),
    ("organise", "organize"),
    ("programme", "program"),
    ("favourite", "favorite"),
    ("centres", "centers"),
    ("recognise", "recognize"),
    ("neighbour", "neighbor"),
    ("favour", "favor"),
];

fn americanised(p: &str) -> String {
    EDITS
        .iter()
        .fold(p.to_string(), |s, (a, b)| s.replace(a, b))
}

#[derive(Clone, Copy, PartialEq)]
enum Task {
    Rewrite,
    Quote,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Plain,
    Prediction,
    Lookup,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "none",
            Mode::Prediction => "prediction",
            Mode::Lookup => "prompt lookup",
        }
    }
}

struct Prompt {
    ids: Vec<u32>,
    prediction: Vec<u32>,
    max_new: usize,
}

fn prompts(task: Task, tok: &Tokenizer, tpl: Option<&ChatTemplate>) -> anyhow::Result<Vec<Prompt>> {
    PASSAGES
        .iter()
        .map(|p| {
            let (ask, expected) = match task {
                Task::Rewrite => (
                    format!(
                        "Rewrite the passage below in American spelling (harbor, color, organize, program, favorite, center, recognize, neighbor). Change nothing else and reply with the passage only.\n\n{p}"
                    ),
                    americanised(p),
                ),
                Task::Quote => (
                    format!(
                        "Quote, word for word, the three sentences of the passage below that matter most. Reply with the quotes only.\n\n{p}"
                    ),
                    String::new(),
                ),
            };
            let text = match tpl {
                Some(t) => t.render(&[Message::new("user", ask)], true, false)?,
                None => ask,
            };
            let ids = tok.encode(&text, tpl.is_none())?;
            let prediction = tok.encode(&expected, false)?;
            let max_new = match task {
                Task::Rewrite => prediction.len() + 16,
                Task::Quote => 160,
            };
            Ok(Prompt {
                ids,
                prediction,
                max_new,
            })
        })
        .collect()
}

pub fn run(a: &SpeculativeArgs) -> anyhow::Result<()> {
    let (dir, dtype, _) = a.m.resolve()?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let template = ChatTemplate::from_model_dir(&dir).ok().flatten();
    let mut text = format!(
        "lmi bench speculative: {} ({}, {}), {} request(s) per client, prompt lookup {}-{}:{}\n",
        dir.display(),
        a.m.device,
        ModelArgs::dtype_name(dtype),
        a.requests,
        a.ngram.min,
        a.ngram.max,
        a.ngram.k
    );
    text.push_str(
        "\n| task | clients | draft | decode tok/s | vs none | drafted / kept | identical |\n|---|---:|---|---:|---:|---:|---|\n",
    );
    print!("{text}");
    let mut bars = Vec::new();
    for task in [Task::Rewrite, Task::Quote] {
        let ps = prompts(task, &tokenizer, template.as_ref())?;
        let modes: &[Mode] = match task {
            Task::Rewrite => &[Mode::Plain, Mode::Prediction, Mode::Lookup],
            Task::Quote => &[Mode::Plain, Mode::Lookup],
        };
        for &b in &a.batch {
            let mut base: Option<Case> = None;
            for &mode in modes {
                let c = run_case(a, &dir, &tokenizer, &ps, b, mode)?;
                let (ratio, same) = match &base {
                    Some(p) => (
                        format!("{:.2}x", c.tok_s / p.tok_s),
                        if c.outputs == p.outputs { "yes" } else { "NO" }.to_string(),
                    ),
                    None => ("1.00x".into(), "-".into()),
                };
                let task_name = if task == Task::Rewrite {
                    "rewrite"
                } else {
                    "quote"
                };
                let row = format!(
                    "| {task_name} | {b} | {} | {:.1} | {ratio} | {} / {} | {same} |",
                    mode.name(),
                    c.tok_s,
                    c.drafted,
                    c.kept,
                );
                println!("{row}");
                text.push_str(&row);
                text.push('\n');
                bars.push((format!("{task_name} x{b} {}", mode.name()), c.tok_s));
                if c.failed > 0 {
                    println!("  ({} requests failed)", c.failed);
                }
                if mode == Mode::Plain {
                    base = Some(c);
                }
            }
        }
    }
    crate::report::write_cases(
        &a.report,
        "lmi bench speculative",
        text,
        "decode tok/s",
        bars,
    )
}

struct Case {
    tok_s: f64,
    drafted: u64,
    kept: u64,
    failed: usize,
    /// Every client's outputs, in order.
    outputs: Vec<Vec<Vec<u32>>>,
}

fn run_case(
    a: &SpeculativeArgs,
    dir: &std::path::Path,
    tokenizer: &Tokenizer,
    prompts: &[Prompt],
    clients: usize,
    mode: Mode,
) -> anyhow::Result<Case> {
    let longest = prompts
        .iter()
        .map(|p| p.ids.len() + p.max_new)
        .max()
        .unwrap_or(0);
    let (_, dtype, gguf) = a.m.resolve()?;
    let opts = EngineOptions {
        dtype,
        gguf: gguf.clone(),
        kv_blocks: Some(longest.div_ceil(lmi_engine::BLOCK_SIZE) * clients + 8),
        ..Default::default()
    };
    let engine = lmi_engine::open(a.m.device, dir, &opts)
        .with_context(|| format!("loading {}", dir.display()))?;
    let handle = Handle::spawn(
        engine,
        tokenizer.clone(),
        SchedulerConfig {
            max_batch_size: clients,
            max_batch_tokens: 4096,
            max_model_len: longest + 1,
            max_waiting: clients * 2,
            max_loras: 0,
            speculative: SpeculativeConfig {
                ngram: (mode == Mode::Lookup).then_some(a.ngram),
                ..Default::default()
            },
        },
    );
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let handle = handle.clone();
            let reqs: Vec<GenerateRequest> = (0..a.requests)
                .map(|r| {
                    let p = &prompts[(c + r) % prompts.len()];
                    let mut req = GenerateRequest::new(p.ids.clone());
                    req.stopping.max_new_tokens = p.max_new;
                    if mode == Mode::Prediction {
                        req.draft = p.prediction.clone();
                    }
                    req
                })
                .collect();
            std::thread::spawn(move || -> (f64, usize, Vec<Vec<u32>>) {
                let (mut tokens, mut secs, mut failed, mut outs) = (0usize, 0f64, 0, Vec::new());
                for req in reqs {
                    let Ok(mut s) = handle.submit(req) else {
                        failed += 1;
                        continue;
                    };
                    let (mut first, mut last, mut out) = (None, None, Vec::new());
                    while let Some(e) = s.blocking_recv() {
                        match e {
                            Event::Token(t) => {
                                let now = Instant::now();
                                first.get_or_insert(now);
                                last = Some(now);
                                out.push(t.id);
                            }
                            Event::Error(_) => failed += 1,
                            _ => {}
                        }
                    }
                    if let (Some(f), Some(l)) = (first, last) {
                        tokens += out.len().saturating_sub(1);
                        secs += (l - f).as_secs_f64();
                    }
                    outs.push(out);
                }
                let rate = if secs > 0.0 {
                    tokens as f64 / secs
                } else {
                    0.0
                };
                (rate, failed, outs)
            })
        })
        .collect();
    let (mut tok_s, mut failed, mut outputs) = (0.0, 0, Vec::new());
    for (r, f, o) in crate::join_clients(threads)? {
        tok_s += r;
        failed += f;
        outputs.push(o);
    }
    let snap = handle.metrics().snapshot();
    let src = match mode {
        Mode::Lookup => DraftSource::PromptLookup as usize,
        _ => DraftSource::Client as usize,
    };
    let case = Case {
        tok_s,
        drafted: snap.spec_proposed[src],
        kept: snap.spec_accepted[src],
        failed,
        outputs,
    };
    handle.shutdown();
    Ok(case)
}
