//! Media spans in prompts, at the scheduler level, on the real CPU engine of the tiny random
//! Qwen2.5-VL (tests/fixtures/qwen_vl) with made-up patches: the prefix cache keys an item's
//! positions by its hash (the same item reuses its blocks, another item with the same
//! placeholder ids never does), chunked prefill never cuts an item and gives the tokens an
//! unchunked prefill gives, an item wider than the step budget is refused, and each step tells
//! the engine which chunk positions belong to which item and each chunk's M-RoPE delta.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use lmi_engine::backend::GraphStats;
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::lora::LoraWeights;
use lmi_engine::vision::{MediaKind, VisionInput};
use lmi_engine::{ChunkMedia, DType, ModelConfig, StepBatch, StepOutput};
use lmi_scheduler::{Handle, MediaSpan, Prompt, SchedulerConfig, Span, SubmitError};
use lmi_text::Tokenizer;

/// What one engine step was asked: each chunk's (start position, tokens), and the media runs.
#[derive(Debug, Clone)]
struct SeenStep {
    chunks: Vec<(usize, usize)>,
    /// The media runs, without their patches.
    media: Vec<ChunkMedia>,
    rope_deltas: Vec<i64>,
}

/// The real engine, with every step it runs written down.
struct Recording {
    inner: Box<dyn StepEngine>,
    steps: Arc<Mutex<Vec<SeenStep>>>,
}

impl StepEngine for Recording {
    fn model_config(&self) -> &ModelConfig {
        self.inner.model_config()
    }
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn step(&mut self, batch: &StepBatch<'_>) -> lmi_engine::Result<StepOutput> {
        self.steps.lock().unwrap().push(SeenStep {
            chunks: batch
                .chunks
                .iter()
                .map(|c| (c.start_pos, c.tokens.len()))
                .collect(),
            media: batch
                .media
                .iter()
                .map(|m| ChunkMedia {
                    input: None,
                    ..m.clone()
                })
                .collect(),
            rope_deltas: batch.rope_deltas.to_vec(),
        });
        self.inner.step(batch)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> lmi_engine::Result<()> {
        self.inner.copy_blocks(pairs)
    }
    fn weight_bytes(&self) -> usize {
        self.inner.weight_bytes()
    }
    fn tokens_computed(&self) -> u64 {
        self.inner.tokens_computed()
    }
    fn load_adapter(&mut self, id: u64, weights: &LoraWeights) -> lmi_engine::Result<()> {
        self.inner.load_adapter(id, weights)
    }
    fn unload_adapter(&mut self, id: u64) -> bool {
        self.inner.unload_adapter(id)
    }
    fn has_adapter(&self, id: u64) -> bool {
        self.inner.has_adapter(id)
    }
    fn graph_stats(&self) -> Option<GraphStats> {
        self.inner.graph_stats()
    }
}

type Steps = Arc<Mutex<Vec<SeenStep>>>;

fn spawn_recorded(dir: &std::path::Path, blocks: usize, cfg: SchedulerConfig) -> (Handle, Steps) {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(blocks),
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(dir, &opts).unwrap();
    let steps: Steps = Arc::default();
    let rec = Recording {
        inner: Box::new(engine),
        steps: steps.clone(),
    };
    let tok = Tokenizer::from_dir(dir).unwrap();
    (Handle::spawn(Box::new(rec), tok, cfg), steps)
}

/// The fixture model (a vision-language model: its engine encodes the items).
fn vl_model() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen_vl/qwen2_5_vl")
}

/// The model's image placeholder token.
const IMAGE: u32 = 49155;

/// An image of `len` tokens (a grid of rows x columns as square as `len` allows), its
/// patches made from `hash`; its M-RoPE delta is `max(rows, columns) - len`.
fn image(placeholder: u32, len: usize, hash: u128) -> Span {
    let rows = (1..=len)
        .filter(|r| len.is_multiple_of(*r) && r * r <= len)
        .max()
        .unwrap_or(1);
    let cols = len / rows.max(1);
    let grid = [1, 2 * rows, 2 * cols];
    let n: usize = grid.iter().product::<usize>() * 1176;
    let input = (len > 0).then(|| {
        Arc::new(VisionInput {
            kind: MediaKind::Image,
            grid_thw: grid,
            pixels: (0..n)
                .map(|i| ((i as u128 * 2654435761 + hash * 40503) % 1000) as f32 / 500.0 - 1.0)
                .collect(),
            merge_size: 2,
            t_scale: 1.0,
        })
    });
    Span::Media(MediaSpan {
        placeholder,
        len,
        hash,
        input,
    })
}

fn run(h: &Handle, p: &Prompt) -> Output {
    let mut r = request(p.to_vec(), 6, None);
    r.prompt = p.clone();
    let out = collect(h.submit(r).unwrap());
    assert!(out.error.is_none(), "{:?}", out.error);
    out
}

fn cached(o: &Output) -> usize {
    o.seqs[0].finished.as_ref().unwrap().cached_prompt_tokens
}

/// Takes the steps recorded so far.
fn take(steps: &Steps) -> Vec<SeenStep> {
    std::mem::take(&mut *steps.lock().unwrap())
}

#[test]
fn the_same_item_reuses_its_blocks_and_another_never_does() {
    let (h, steps) = spawn_recorded(&vl_model(), 64, cfg(4, 4096));
    // Text 0..4, an item 4..44, text 44..46: two full blocks can be reused, the second
    // ending inside the item.
    let with = |hash| {
        Prompt::from_spans([
            Span::Text(prompt(4, 1)),
            image(IMAGE, 40, hash),
            Span::Text(prompt(2, 2)),
        ])
    };
    let first = run(&h, &with(0xA));
    assert_eq!(cached(&first), 0);
    let seen = take(&steps);
    assert_eq!(seen[0].chunks, vec![(0, 46)]);
    let whole = ChunkMedia {
        chunk: 0,
        offset: 4,
        len: 40,
        item_offset: 0,
        hash: 0xA,
        input: None,
    };
    assert_eq!(seen[0].media, vec![whole.clone()]);
    assert!(seen[1..].iter().all(|s| s.media.is_empty()), "decode steps");
    // A 5x8-token image spans 8 M-RoPE positions: the tokens after it trail by 32.
    assert!(
        seen[0].rope_deltas.is_empty(),
        "nothing ends before the prefill"
    );
    assert!(seen[1..].iter().all(|s| s.rope_deltas == [-32]), "{seen:?}");

    let again = run(&h, &with(0xA));
    assert_eq!(cached(&again), 32, "both full blocks reused");
    assert_eq!(again.tokens(), first.tokens());
    // The engine is told the rest of the item starts 28 placeholders in.
    let seen = take(&steps);
    assert_eq!(seen[0].chunks, vec![(32, 14)]);
    let rest = ChunkMedia {
        offset: 0,
        len: 12,
        item_offset: 28,
        ..whole.clone()
    };
    assert_eq!(seen[0].media, vec![rest]);

    // The same placeholder ids for another item: its first block already differs.
    let other = run(&h, &with(0xB));
    assert_eq!(cached(&other), 0, "another item never reuses the blocks");
    take(&steps);

    // A text block before the item is shared; the item's blocks are not.
    let after_text = |hash| {
        Prompt::from_spans([
            Span::Text(prompt(16, 3)),
            image(IMAGE, 20, hash),
            Span::Text(prompt(4, 4)),
        ])
    };
    assert_eq!(cached(&run(&h, &after_text(0xC))), 0);
    assert_eq!(cached(&run(&h, &after_text(0xC))), 32);
    assert_eq!(
        cached(&run(&h, &after_text(0xD))),
        16,
        "only the text block"
    );
    wait_pool_whole(&h, 0);
}

#[test]
fn chunked_prefill_never_cuts_an_item() {
    // A 24-token budget; text 0..10, an item 10..30, text 30..40. Cutting by the budget alone
    // would end the first chunk at 24, inside the item.
    let (h, steps) = spawn_recorded(&vl_model(), 64, cfg(4, 24));
    let p = Prompt::from_spans([
        Span::Text(prompt(10, 5)),
        image(IMAGE, 20, 7),
        Span::Text(prompt(10, 6)),
    ]);
    let out = run(&h, &p);
    let seen = take(&steps);
    let prefill: Vec<(usize, usize)> = seen.iter().take(3).map(|s| s.chunks[0]).collect();
    assert_eq!(prefill, vec![(0, 10), (10, 24), (34, 6)]);
    for s in &seen {
        for &(start, n) in &s.chunks {
            let inside = |pos: usize| 10 < pos && pos < 30;
            let (a, b) = (10, 30);
            assert!(
                !inside(start) && !inside(start + n),
                "chunk {start}..{} cuts the item {a}..{b}",
                start + n
            );
        }
    }
    let runs: Vec<&ChunkMedia> = seen.iter().flat_map(|s| &s.media).collect();
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].offset, runs[0].len, runs[0].item_offset),
        (0, 20, 0)
    );

    // The chunk after the item carries its M-RoPE delta (a 4x5-token image: -15).
    assert_eq!(seen[2].rope_deltas, vec![-15]);
    wait_pool_whole(&h, 0);

    // The same prompt prefilled in one chunk gives the same tokens.
    let (whole, steps) = spawn_recorded(&vl_model(), 64, cfg(4, 4096));
    assert_eq!(run(&whole, &p).tokens(), out.tokens());
    assert_eq!(take(&steps)[0].chunks, vec![(0, 40)]);
}

#[test]
fn an_item_wider_than_the_step_budget_is_refused() {
    let (h, _) = spawn_recorded(&vl_model(), 64, cfg(4, 24));
    let submit = |spans: Vec<Span>| {
        let p = Prompt::from_spans(spans);
        let mut r = request(p.to_vec(), 4, None);
        r.prompt = p;
        h.submit(r).err()
    };
    let too_wide = submit(vec![Span::Text(vec![1, 2]), image(IMAGE, 25, 1)]);
    match too_wide {
        Some(SubmitError::InvalidParams(m)) => {
            assert!(m.contains("25 tokens") && m.contains("budget of 24"), "{m}")
        }
        e => panic!("expected a refusal, got {e:?}"),
    }
    assert!(submit(vec![Span::Text(vec![1]), image(IMAGE, 24, 1)]).is_none());
    let outside = submit(vec![Span::Text(vec![1]), image(60000, 4, 1)]);
    assert!(
        matches!(&outside, Some(SubmitError::InvalidParams(m)) if m.contains("60000")),
        "{outside:?}"
    );
    let empty = submit(vec![Span::Text(vec![1]), image(IMAGE, 0, 1)]);
    assert!(
        matches!(empty, Some(SubmitError::InvalidParams(_))),
        "{empty:?}"
    );
}
