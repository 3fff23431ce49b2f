//! Shared helpers: a tiny random model with its byte-level tokenizer, and stream collection.

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
use lmi_engine::DType;
use lmi_engine::engine::EngineOptions;
use lmi_scheduler::{
    Event, FinishReason, Finished, GenerateRequest, Handle, RequestStream, SchedulerConfig,
};
use lmi_text::Tokenizer;

pub fn tiny_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &TinySpec::llama()).unwrap();
    dir
}

pub fn spawn(dir: &Path, blocks: usize, cfg: SchedulerConfig) -> Handle {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(blocks),
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(dir, &opts).unwrap();
    let tok = Tokenizer::from_dir(dir).unwrap();
    Handle::spawn(Box::new(engine), tok, cfg)
}

pub fn cfg(max_batch: usize, budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_size: max_batch,
        max_batch_tokens: budget,
        max_model_len: 512,
        max_waiting: 1000,
        max_loras: 4,
        ..Default::default()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SeqOut {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub text: String,
    pub finished: Option<Finished>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub seqs: Vec<SeqOut>,
    pub prefill: Option<Vec<lmi_scheduler::PromptToken>>,
    pub error: Option<String>,
}

impl Output {
    pub fn tokens(&self) -> Vec<Vec<u32>> {
        self.seqs.iter().map(|s| s.tokens.clone()).collect()
    }
    pub fn reason(&self, i: usize) -> FinishReason {
        self.seqs[i].finished.as_ref().unwrap().reason
    }
}

pub fn collect(mut s: RequestStream) -> Output {
    let mut out = Output {
        seqs: vec![],
        prefill: None,
        error: None,
    };
    while let Some(e) = s.blocking_recv() {
        match e {
            Event::Prefill(p) => out.prefill = Some(p),
            Event::Token(t) => {
                let i = t.index as usize;
                while out.seqs.len() <= i {
                    out.seqs.push(SeqOut {
                        tokens: vec![],
                        logprobs: vec![],
                        text: String::new(),
                        finished: None,
                    });
                }
                out.seqs[i].tokens.push(t.id);
                out.seqs[i].logprobs.push(t.logprob);
                out.seqs[i].text.push_str(&t.text);
            }
            Event::Finished(f) => {
                let i = f.index as usize;
                out.seqs[i].finished = Some(f);
            }
            Event::Error(e) => out.error = Some(e),
            Event::Pooled(p) => out.error = Some(format!("a generation stream got {p:?}")),
        }
    }
    out
}

/// Waits until the pool holds only `pinned` blocks (requests release blocks asynchronously).
pub fn wait_pool_whole(h: &Handle, pinned: u64) {
    let t = Instant::now();
    loop {
        let used = h.metrics().snapshot().kv_blocks_used;
        if used == pinned {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "pool not whole: {used} blocks used, {pinned} pinned"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the gauges show nothing running or waiting. The scheduler updates them at the
/// end of a step, after it has sent that step's results: a test that reads them right after
/// its last result may see the step before's.
pub fn wait_idle(h: &Handle) {
    let t = Instant::now();
    loop {
        let m = h.metrics().snapshot();
        if (m.running, m.waiting, m.pooling_waiting) == (0, 0, 0) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still {} running, {} waiting ({} pooling)",
            m.running,
            m.waiting,
            m.pooling_waiting
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 7919) >> 7) % 256)
        .collect()
}

pub fn request(prompt: Vec<u32>, max_new: usize, seed: Option<u64>) -> GenerateRequest {
    let mut r = GenerateRequest::new(prompt);
    r.stopping.max_new_tokens = max_new;
    r.stopping.ignore_eos = true;
    if let Some(s) = seed {
        r.sampling.temperature = 0.9;
        r.sampling.top_p = 0.95;
        r.sampling.top_k = 40;
        r.sampling.seed = s;
    }
    r
}

/// A finished request's sequences (by index), from the events left on its channel: their
/// tokens and logprobs. Panics on an error event.
pub fn drain_tokens(rx: &mut tokio::sync::mpsc::Receiver<Event>) -> Vec<(Vec<u32>, Vec<f32>)> {
    let mut seqs: Vec<(Vec<u32>, Vec<f32>)> = Vec::new();
    while let Ok(e) = rx.try_recv() {
        match e {
            Event::Token(t) => {
                let i = t.index as usize;
                if seqs.len() <= i {
                    seqs.resize(i + 1, Default::default());
                }
                seqs[i].0.push(t.id);
                seqs[i].1.push(t.logprob);
            }
            Event::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    seqs
}

/// Each request's sequences (by index): their tokens and logprobs.
pub type Run = Vec<Vec<(Vec<u32>, Vec<f32>)>>;

/// Adds `reqs` (ids from `first_id`) to `s` and steps it until they are done.
pub fn run_to_end(
    s: &mut lmi_scheduler::Scheduler,
    reqs: Vec<GenerateRequest>,
    first_id: u64,
) -> Run {
    let rxs: Vec<_> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let (tx, rx) = tokio::sync::mpsc::channel(4096);
            s.add(first_id + i as u64, r, tx).unwrap();
            rx
        })
        .collect();
    for _ in 0..5000 {
        if !s.has_work() {
            break;
        }
        s.step();
    }
    assert!(!s.has_work(), "requests did not finish");
    rxs.into_iter()
        .map(|mut rx| drain_tokens(&mut rx))
        .collect()
}
