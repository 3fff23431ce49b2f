//! Multi-head latent attention on the CUDA engine (bf16) for the fixtures of
//! `tests/fixtures/mla/` (`mla.rs` holds the CPU's checks), dense and with DeepSeek-style
//! experts, on the CPU emulator in both thread orders and on the driver's device (a GPU, or
//! the fake driver):
//! - every position of the six prompts, each prefilled alone, against transformers' f32
//!   logits and the CPU engine in bf16 (the yardstick: the device must be about as close to
//!   transformers as the CPU is in the same precision, and close to the CPU);
//! - the six decoded together (a prefill step, then 32 decode steps fed transformers' greedy
//!   tokens) replayed from CUDA graphs: judged the same way, and the same bits as direct
//!   launches;
//! - prefill in chunks of 5 beside other sequences: each prompt's bits prefilled alone whole
//!   (on the emulator and the fake driver, whose products are batch invariant).

mod cuda_common;
mod hf_fixture;

use std::path::Path;
use std::sync::Arc;

use hf_fixture::{HybridRefs, blocks, chunk, hybrid_refs, rel_diff};
use lmi_cuda::Device;
use lmi_engine::cpu::CpuBackend;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::EngineOptions;
use lmi_engine::{Backend, DType, Engine, LogitsWanted};

const MODELS: [&str; 4] = [
    "deepseek_v3",
    "deepseek_v3_noq",
    "deepseek_v3_moe",
    "glm4_moe_lite",
];
/// The device against the CPU engine in bf16, at the median row: both round at the same
/// places and differ by summation order.
const CPU_TOL: f32 = 1e-2;
/// The same for the mixtures: an order flips a routing decision between close experts now
/// and then, which moves that token, and through the cache the later ones, by far more.
const CPU_MOE_TOL: f32 = hf_fixture::BF16_TOL;

fn moe(name: &str) -> bool {
    name.ends_with("moe") || name.starts_with("glm")
}
const SEQ_BLOCKS: usize = 16;

fn options() -> EngineOptions {
    EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(96),
        ..Default::default()
    }
}

fn cuda_engine<D: Device>(dev: &Arc<D>, dir: &Path, graphs: bool) -> Engine<CudaBackend<D>> {
    let backend = CudaBackend::with_graphs(dev.clone(), graphs).unwrap();
    Engine::load(backend, dir, &options()).unwrap()
}

fn cpu_engine(dir: &Path) -> Engine<CpuBackend> {
    lmi_engine::load_cpu(dir, &options()).unwrap()
}

fn exact<D: Device>(dev: &Arc<D>) -> bool {
    dev.info().emulated || cuda_common::on_fake_driver()
}

fn prompt_logits<B: Backend>(e: &mut Engine<B>, p: &[u32]) -> Vec<Vec<f32>> {
    let out = e
        .forward_logits(&[chunk(p, 0, &blocks(0, p.len()), LogitsWanted::All)])
        .unwrap();
    (0..p.len()).map(|t| out.row(t).to_vec()).collect()
}

fn median(mut d: Vec<f32>) -> f32 {
    d.sort_by(f32::total_cmp);
    d[d.len() / 2]
}

/// The device about as close to transformers as the CPU in bf16 is, and close to the CPU.
fn judge(what: &str, moe: bool, ours: &[Vec<f32>], cpu: &[Vec<f32>], theirs: &[Vec<f32>]) {
    let diffs = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        median(a.iter().zip(b).map(|(a, b)| rel_diff(a, b)).collect())
    };
    let (vs_hf, cpu_vs_hf, vs_cpu) = (diffs(ours, theirs), diffs(cpu, theirs), diffs(ours, cpu));
    eprintln!(
        "{what}: medians CUDA vs transformers {vs_hf:.2e}, CPU bf16 vs transformers \
         {cpu_vs_hf:.2e}, CUDA vs CPU bf16 {vs_cpu:.2e}"
    );
    let tol = if moe { CPU_MOE_TOL } else { CPU_TOL };
    assert!(vs_cpu < tol, "{what}: CUDA vs the CPU in bf16: {vs_cpu}");
    assert!(
        vs_hf <= 1.25 * cpu_vs_hf + 1e-3,
        "{what}: CUDA vs transformers {vs_hf}, the CPU in bf16 {cpu_vs_hf}"
    );
}

fn check_prompts<D: Device>(dev: &Arc<D>) {
    for name in MODELS {
        let dir = hf_fixture::fixture("mla", name);
        let r = hybrid_refs(&dir);
        let mut g = cuda_engine(dev, &dir, true);
        let mut c = cpu_engine(&dir);
        let (mut ours, mut cpu) = (Vec::new(), Vec::new());
        for p in &r.prompts {
            ours.extend(prompt_logits(&mut g, p));
            cpu.extend(prompt_logits(&mut c, p));
        }
        judge(
            &format!("{name}, prompt logits"),
            moe(name),
            &ours,
            &cpu,
            &r.prompt_logits.concat(),
        );
    }
}

#[test]
fn mla_prompts_match_transformers_and_the_cpu() {
    on_every_raw_device!(check_prompts);
}

/// The six prompts prefilled in one step, then 32 decode steps fed transformers' greedy
/// tokens: every step's logits rows, `[step][sequence]`.
fn decode<B: Backend>(e: &mut Engine<B>, r: &HybridRefs) -> Vec<Vec<Vec<f32>>> {
    let n = r.prompts.len();
    let tables: Vec<Vec<u32>> = (0..n)
        .map(|i| blocks((SEQ_BLOCKS * i) as u32, SEQ_BLOCKS * 16))
        .collect();
    let mut steps = Vec::new();
    for step in 0..=r.greedies[0].len() {
        let chunks: Vec<_> = (0..n)
            .map(|i| {
                let p = &r.prompts[i];
                match step {
                    0 => chunk(p, 0, &tables[i], LogitsWanted::Last),
                    _ => {
                        let tok = r.greedies[i][step - 1];
                        chunk(&[tok], p.len() + step - 1, &tables[i], LogitsWanted::Last)
                    }
                }
            })
            .collect();
        let out = e.forward_logits(&chunks).unwrap();
        steps.push((0..n).map(|i| out.row(i).to_vec()).collect());
    }
    steps
}

fn check_decode<D: Device>(dev: &Arc<D>) {
    for name in MODELS {
        let dir = hf_fixture::fixture("mla", name);
        let r = hybrid_refs(&dir);
        let mut g = cuda_engine(dev, &dir, true);
        let ours = decode(&mut g, &r);
        assert!(
            g.backend().graphs_captured() > 0,
            "{name}: decode steps replay from CUDA graphs"
        );
        let cpu = decode(&mut cpu_engine(&dir), &r);
        let theirs: Vec<Vec<f32>> = (0..ours.len())
            .flat_map(|step| {
                (0..r.prompts.len())
                    .map(|i| r.full_logits[i][r.prompts[i].len() + step - 1].clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        judge(
            &format!("{name}, decode logits"),
            moe(name),
            &ours.concat(),
            &cpu.concat(),
            &theirs,
        );
        let direct = decode(&mut cuda_engine(dev, &dir, false), &r);
        assert!(
            direct == ours,
            "{name}: graph replays differ from direct launches"
        );
    }
}

#[test]
fn mla_decoding_matches_transformers_and_replays_from_graphs() {
    on_every_raw_device!(check_decode);
}

/// Prefill in chunks of 5 beside other sequences: each prompt's logits prefilled alone and
/// whole, bit for bit where the products are batch invariant.
fn check_chunked<D: Device>(dev: &Arc<D>) {
    if !exact(dev) {
        return;
    }
    for name in MODELS {
        let dir = hf_fixture::fixture("mla", name);
        let r = hybrid_refs(&dir);
        let load = || {
            let b = CudaBackend::with_graphs(dev.clone(), true).unwrap();
            b.set_fused_down_rows(0);
            Engine::load(b, &dir, &options()).unwrap()
        };
        let mut e = load();
        let whole: Vec<Vec<Vec<f32>>> =
            r.prompts.iter().map(|p| prompt_logits(&mut e, p)).collect();
        let mut e = load();
        let n = r.prompts.len();
        let tables: Vec<Vec<u32>> = (0..n).map(|i| blocks(16 * i as u32, 64)).collect();
        let mut cut: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n];
        let longest = r.prompts.iter().map(Vec::len).max().unwrap();
        for start in (0..longest).step_by(5) {
            let live: Vec<usize> = (0..n).filter(|&i| start < r.prompts[i].len()).collect();
            let chunks: Vec<_> = live
                .iter()
                .map(|&i| {
                    let p = &r.prompts[i];
                    let end = (start + 5).min(p.len());
                    chunk(&p[start..end], start, &tables[i], LogitsWanted::All)
                })
                .collect();
            let out = e.forward_logits(&chunks).unwrap();
            let mut row = 0;
            for (&i, c) in live.iter().zip(&chunks) {
                for _ in 0..c.tokens.len() {
                    cut[i].push(out.row(row).to_vec());
                    row += 1;
                }
            }
        }
        assert_eq!(cut, whole, "{name}: chunked prefill changed the logits");
    }
}

#[test]
fn mla_chunked_prefill_gives_the_whole_prompts_logits() {
    on_every_raw_device!(check_chunked);
}
