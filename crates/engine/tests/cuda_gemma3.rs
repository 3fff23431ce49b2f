//! Gemma 3 on the CUDA engine (bf16) against HF transformers' f32 logits for the fixtures of
//! `tests/fixtures/gemma3/` (`gemma3.rs` holds the CPU's checks), on the CPU emulator (and on
//! the driver's device when there is one): the prompt's logits, then 32 decode steps, each fed
//! transformers' greedy token, run far past the local layers' window of 8 keys and replay from
//! CUDA graphs. Each step's logits must be within bf16's tolerance and its argmax must be
//! transformers' next token (the fixtures' greedy margins are above 0.5).

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use hf_fixture::{BF16_TOL, WindowRing, blocks, chunk, reference, rel_diff};
use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::StepShape;
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{DType, Engine, KvWindow, LogitsWanted, SeqChunk};

fn check_gemma3<D: Device>(dev: &Arc<D>) {
    for name in ["gemma3", "gemma3_linear"] {
        let dir = hf_fixture::fixture("gemma3", name);
        let r = reference(&dir);
        let opts = EngineOptions {
            dtype: Some(DType::BF16),
            kv_blocks: Some(64),
            ..Default::default()
        };
        let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
        let mut e = Engine::load(backend, &dir, &opts).unwrap();
        let table = blocks(3, r.prompt.len() + r.greedy.len());
        let out = e
            .forward_logits(&[chunk(&r.prompt, 0, &table, LogitsWanted::All)])
            .unwrap();
        let mut worst = (0..r.prompt.len())
            .map(|t| rel_diff(out.row(t), &r.prompt_logits[t]))
            .fold(0f32, f32::max);
        let mut next = lmi_checkpoint::testing::argmax(out.row(r.prompt.len() - 1));
        for (step, &want) in r.greedy.iter().enumerate() {
            assert_eq!(next, want, "{name}: greedy token {step}");
            let pos = r.prompt.len() + step;
            let out = e
                .forward_logits(&[chunk(&[want], pos, &table, LogitsWanted::Last)])
                .unwrap();
            worst = worst.max(rel_diff(out.row(0), &r.full_logits[pos]));
            next = lmi_checkpoint::testing::argmax(out.row(0));
        }
        eprintln!("{name}: CUDA bf16 logits within {worst:.2e} of transformers'");
        assert!(worst < BF16_TOL, "{name}: logits differ by {worst}");
        assert!(
            e.backend().graphs_captured() > 0,
            "{name}: decode steps replay from CUDA graphs"
        );
    }
}

#[test]
fn gemma3_in_bf16_matches_transformers() {
    on_every_raw_device!(check_gemma3);
}

/// The local layers' K/V in window pools of their own (`KvWindow`), blocks handed back as the
/// window leaves them and straight to the sequence's next block, decode steps replayed from
/// CUDA graphs: every position's logits the bits of the engine with one table, for Gemma 3
/// and for a model whose every layer is local. (A local
/// layer left on the global table would read and write past its pool, which the emulator
/// does not check; the CPU's `gemma3.rs` test catches that.)
fn check_window_pools<D: Device>(dev: &Arc<D>) {
    // Gemma 3's local and global layers, and Mistral's window on every layer (no global pool).
    for (group, name) in [("gemma3", "gemma3"), ("mistral", "mistral_window")] {
        check_window_pools_of(dev, &hf_fixture::fixture(group, name));
    }
}

fn check_window_pools_of<D: Device>(dev: &Arc<D>, dir: &std::path::Path) {
    let r = reference(dir);
    let seq: Vec<u32> = r.prompt.iter().chain(&r.greedy).copied().collect();
    let load = |window_pools: bool| {
        let opts = EngineOptions {
            dtype: Some(DType::BF16),
            kv_blocks: Some(64),
            max_step: StepShape {
                seqs: 1,
                tokens: 16,
                context: None,
            },
            window_pools,
            ..Default::default()
        };
        let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
        Engine::load(backend, dir, &opts).unwrap()
    };
    let (mut plain, mut windowed) = (load(false), load(true));
    assert!(plain.kv_window().is_none());
    let w = windowed
        .kv_window()
        .expect("window pools on the CUDA engine");
    assert_eq!(w, KvWindow { blocks: 8, size: 8 });
    // Global ids beyond the window pool's: a local layer on the wrong table reads outside it.
    let table = blocks(40, seq.len());
    let mut ring = WindowRing::new(w);
    let mut start = 0;
    while start < seq.len() {
        let len = if start == 0 { r.prompt.len() } else { 1 };
        let c = chunk(&seq[start..start + len], start, &table, LogitsWanted::All);
        let want = plain.forward_logits(std::slice::from_ref(&c)).unwrap();
        let got = windowed
            .forward_logits(&[SeqChunk {
                window_table: ring.table_for(start, len),
                ..c
            }])
            .unwrap();
        assert_eq!(
            got.data,
            want.data,
            "{}, position {start}: window pools changed logits",
            dir.display()
        );
        start += len;
    }
    assert!(
        ring.reused,
        "no block left the window ({} tokens)",
        seq.len()
    );
    assert!(
        windowed.backend().graphs_captured() > 0,
        "decode steps replay from graphs"
    );
}

#[test]
fn window_pools_give_the_same_bits() {
    on_every_raw_device!(check_window_pools);
}

/// With a share of the device's memory, the window pools are sized for the step shape and the
/// global layers' pools take what they leave; the decode graphs captured at load run on both
/// tables.
fn check_window_pools_in_a_device_share<D: Device>(dev: &Arc<D>) {
    let dir = hf_fixture::fixture("gemma3", "gemma3");
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        memory_fraction: Some(0.2),
        max_step: StepShape {
            seqs: 2,
            tokens: 32,
            context: Some(64),
        },
        ..Default::default()
    };
    let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let e = Engine::load(backend, &dir, &opts).unwrap();
    let w = e.kv_window().expect("window pools in a device share");
    assert_eq!(w.blocks, KvWindow::blocks_for_step(8, 2, 32));
    cuda_common::assert_share_filled(dev.as_ref(), 0.2);
    // One global layer of seven: its blocks take nearly all the share.
    assert!(
        e.num_blocks() > 100 * w.blocks,
        "{} global blocks",
        e.num_blocks()
    );
    let stats = e.graph_stats().expect("CUDA graphs");
    assert!(stats.captured > 0 && stats.failed == 0, "{stats:?}");
}

#[test]
fn window_pools_fill_a_device_share() {
    if cuda_common::in_child() {
        if let Some(dev) = cuda_common::driver() {
            check_window_pools_in_a_device_share(&dev);
        }
        return;
    }
    for order in cuda_common::emulator_orders() {
        check_window_pools_in_a_device_share(&cuda_common::emulator(order));
    }
    // The driver's device is one per process, and the other tests here allocate on it:
    // measured alone, in a child process.
    cuda_common::run_in_child("window_pools_fill_a_device_share", &[]);
}
