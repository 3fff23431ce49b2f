//! Gated DeltaNet hybrids (Qwen3.5 dense and MoE, Qwen3-Next) on the CUDA engine (bf16) for
//! the fixtures of `tests/fixtures/hybrid/` (`hybrid.rs` holds the CPU's checks), on the CPU
//! emulator in both thread orders and on the driver's device (a GPU, or the fake driver):
//! - every position of the six prompts, each prefilled alone, against transformers' f32
//!   logits and the CPU engine in bf16 (the yardstick: the device must be about as close to
//!   transformers as the CPU is in the same precision, and close to the CPU);
//! - the six decoded together (a prefill step, then 32 decode steps of one token each, fed
//!   transformers' greedy tokens, each sequence's state carried in its slot), the decode steps
//!   replayed from CUDA graphs: each step's logits judged the same way, its argmax against the
//!   CPU's and transformers' next greedy token; the same steps with graphs off, the same bits;
//! - prefill in chunks of 5 beside other sequences: each prompt's bits prefilled alone whole;
//! - a sequence resumed from a prefix snapshot (and its first K/V block): the cold run's bits;
//! - the load-time warm-up and graph capture (steps that name no states) change nothing.
//!
//! Chunks and snapshots are bit for bit on the emulator and the fake driver (whose products
//! are batch invariant); on a GPU, whose cuBLAS may pick its algorithm by a product's row
//! count, within bf16 rounding.

mod cuda_common;
mod hf_fixture;

use std::path::Path;
use std::sync::Arc;

use hf_fixture::{BF16_TOL, HybridRefs, argmax, blocks, chunk, hybrid_refs, rel_diff};
use lmi_cuda::Device;
use lmi_engine::cpu::CpuBackend;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::{EngineOptions, StepEngine, StepShape};
use lmi_engine::{Backend, ChunkState, DType, Engine, LogitsWanted};

const ARCHITECTURES: [&str; 3] = ["qwen3_5", "qwen3_5_moe", "qwen3_next"];
const SLOTS: usize = 16;
/// Blocks a sequence of the decode test may use (16 of 16 tokens each).
const SEQ_BLOCKS: usize = 16;
/// bf16 against f32 (transformers, or the CPU in bf16 where a routing decision flipped): at
/// most one position in eight beyond this. bf16 rounding upstream of a router flips a token
/// between two experts whose router logits are close (the MoE fixtures' margins are 1e-3),
/// which moves that position's logits by far more than rounding does (see cuda_moe.rs); a
/// wrong weight, state or gate would move every position.
const BF16_FLIP_TOL: f32 = 1e-1;
/// The device against the CPU engine in bf16, at the median row: both round at the same
/// places and differ by summation order (seen: 1.6e-3 for the dense model).
const CPU_TOL: f32 = 1e-2;
/// The same for the mixtures of experts: a routing decision flipped by that order changes a
/// token's hidden state by far more, and the recurrent state and the K/V carry it to every
/// later token of the sequence (seen: 1e-2).
const CPU_MOE_TOL: f32 = BF16_TOL;

fn options() -> EngineOptions {
    EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(96),
        state_slots: Some(SLOTS),
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

fn moe(name: &str) -> bool {
    name != "qwen3_5"
}

/// Whether the device's products are batch invariant (the emulator's and the fake driver's),
/// so that chunked and whole prefills agree bit for bit.
fn exact<D: Device>(dev: &Arc<D>) -> bool {
    dev.info().emulated || cuda_common::on_fake_driver()
}

/// A prompt's logits at every position, prefilled alone from slot 0.
fn prompt_logits<B: Backend>(e: &mut Engine<B>, p: &[u32]) -> Vec<Vec<f32>> {
    let out = e
        .forward_logits_states(
            &[chunk(p, 0, &blocks(0, p.len()), LogitsWanted::All)],
            &[ChunkState::in_slot(0)],
        )
        .unwrap();
    (0..p.len()).map(|t| out.row(t).to_vec()).collect()
}

/// A comparison's differences ([`rel_diff`] per row): median, worst, and how many exceed
/// [`BF16_FLIP_TOL`].
struct Diffs {
    median: f32,
    worst: f32,
    flips: usize,
    rows: usize,
}

impl Diffs {
    fn of(mut d: Vec<f32>) -> Self {
        let flips = d.iter().filter(|&&x| x > BF16_FLIP_TOL).count();
        d.sort_by(f32::total_cmp);
        Diffs {
            median: d[d.len() / 2],
            worst: d[d.len() - 1],
            flips,
            rows: d.len(),
        }
    }
}

impl std::fmt::Display for Diffs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "median {:.2e}, worst {:.2e}, {} of {} beyond {BF16_FLIP_TOL}",
            self.median, self.worst, self.flips, self.rows
        )
    }
}

/// Judges the device's logits rows against transformers' and the CPU engine's in bf16, and
/// the CPU's against transformers' as the yardstick: both engines round weights, matrix
/// inputs and K/V to bf16 at the same places, so the device must be about as close to
/// transformers as the CPU is (bf16 moves the MoE fixtures' logits by 6e-2 at the median on
/// the CPU too, hybrid.rs), and close to the CPU itself but for routing flips.
fn judge(what: &str, moe: bool, ours: &[Vec<f32>], cpu: &[Vec<f32>], theirs: &[Vec<f32>]) {
    let diffs = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        Diffs::of(a.iter().zip(b).map(|(a, b)| rel_diff(a, b)).collect())
    };
    let (vs_hf, cpu_vs_hf, vs_cpu) = (diffs(ours, theirs), diffs(cpu, theirs), diffs(ours, cpu));
    eprintln!(
        "{what}:\n  CUDA vs transformers:        {vs_hf}\n  CPU bf16 vs transformers:    \
         {cpu_vs_hf}\n  CUDA vs CPU bf16:            {vs_cpu}"
    );
    let tol = if moe { CPU_MOE_TOL } else { CPU_TOL };
    assert!(
        vs_cpu.median < tol && vs_cpu.flips <= vs_cpu.rows / 8,
        "{what}: CUDA vs the CPU in bf16: {vs_cpu}"
    );
    assert!(
        vs_hf.median <= 1.25 * cpu_vs_hf.median + 1e-3
            && vs_hf.flips <= cpu_vs_hf.flips + vs_hf.rows / 8,
        "{what}: CUDA vs transformers {vs_hf}, the CPU in bf16 {cpu_vs_hf}"
    );
}

fn check_prompts<D: Device>(dev: &Arc<D>) {
    for name in ARCHITECTURES {
        let dir = hf_fixture::fixture("hybrid", name);
        let r = hybrid_refs(&dir);
        let mut g = cuda_engine(dev, &dir, true);
        let mut c = cpu_engine(&dir);
        let (mut ours, mut cpu) = (Vec::new(), Vec::new());
        for p in &r.prompts {
            ours.extend(prompt_logits(&mut g, p));
            cpu.extend(prompt_logits(&mut c, p));
        }
        let theirs: Vec<Vec<f32>> = r.prompt_logits.concat();
        judge(
            &format!("{name}, prompt logits"),
            moe(name),
            &ours,
            &cpu,
            &theirs,
        );
    }
}

#[test]
fn hybrid_prompts_match_transformers_and_the_cpu() {
    on_every_raw_device!(check_prompts);
}

/// The six prompts prefilled in one step (each its own slot), then 32 decode steps fed
/// transformers' greedy tokens: every step's logits rows, `[step][sequence]`.
fn decode<B: Backend>(e: &mut Engine<B>, r: &HybridRefs) -> Vec<Vec<Vec<f32>>> {
    let n = r.prompts.len();
    let tables: Vec<Vec<u32>> = (0..n)
        .map(|i| blocks((SEQ_BLOCKS * i) as u32, SEQ_BLOCKS * 16))
        .collect();
    let states: Vec<ChunkState> = (0..n as u32).map(ChunkState::in_slot).collect();
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
        let out = e.forward_logits_states(&chunks, &states).unwrap();
        steps.push((0..n).map(|i| out.row(i).to_vec()).collect());
    }
    steps
}

/// Decoding: each step's logits judged as the prompts' ([`judge`]), and its argmax against
/// the CPU's (in bf16) and transformers' next greedy token. bf16 rounding moves logits by more
/// than these tiny models' greedy margins (2e-3): the CPU in bf16 parts from transformers at
/// some 16 of 192 tokens, and the device may not part more often; from the CPU it parts only
/// where the two are a near tie for the CPU (the dense model).
fn check_decode<D: Device>(dev: &Arc<D>) {
    for name in ARCHITECTURES {
        let dir = hf_fixture::fixture("hybrid", name);
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
        let (mut vs_cpu, mut ours_vs_hf, mut cpu_vs_hf) = (Vec::new(), 0, 0);
        for (step, (rows, cpu_rows)) in ours.iter().zip(&cpu).enumerate() {
            for (i, (row, cpu_row)) in rows.iter().zip(cpu_rows).enumerate() {
                let (got, cpu_tok) = (argmax(row), argmax(cpu_row));
                if got != cpu_tok {
                    vs_cpu.push((i, step, cpu_row[cpu_tok as usize] - cpu_row[got as usize]));
                }
                if let Some(&want) = r.greedies[i].get(step) {
                    ours_vs_hf += usize::from(got != want);
                    cpu_vs_hf += usize::from(cpu_tok != want);
                }
            }
        }
        let tokens = r.greedies.iter().map(Vec::len).sum::<usize>();
        eprintln!(
            "{name}, greedy tokens of {tokens}: CUDA parts from transformers at {ours_vs_hf}, \
             the CPU in bf16 at {cpu_vs_hf}; CUDA from the CPU at {} (prompt, step, the CPU's \
             margin): {vs_cpu:?}",
            vs_cpu.len()
        );
        // The dense model parts from the CPU only at near ties; a mixture also where a flipped
        // routing decision moved the logits (seen: 3 of 192), at most one token in 32.
        if moe(name) {
            assert!(
                vs_cpu.len() <= tokens / 32,
                "{name}: {} greedy tokens differ from the CPU's",
                vs_cpu.len()
            );
        } else {
            for &(i, step, margin) in &vs_cpu {
                let scale = cpu[step][i].iter().fold(1f32, |m, x| m.max(x.abs()));
                assert!(
                    margin <= 2e-2 * scale,
                    "{name} prompt {i} step {step}: CUDA and the CPU part by a margin of {margin}"
                );
            }
        }
        assert!(
            ours_vs_hf <= cpu_vs_hf + tokens / 32,
            "{name}: {ours_vs_hf} greedy tokens differ from transformers', the CPU's {cpu_vs_hf}"
        );
        // Graphs replay exactly what direct launches compute.
        let direct = decode(&mut cuda_engine(dev, &dir, false), &r);
        assert!(
            direct == ours,
            "{name}: graph replays differ from direct launches"
        );
    }
}

#[test]
fn hybrid_decoding_matches_transformers_and_replays_from_graphs() {
    on_every_raw_device!(check_decode);
}

/// Prefill in chunks of 5 (every prompt cut, the state carried between steps), beside other
/// sequences (slots in reverse order): each prompt's logits prefilled alone and whole.
fn check_chunked<D: Device>(dev: &Arc<D>) {
    for name in ARCHITECTURES {
        let dir = hf_fixture::fixture("hybrid", name);
        let r = hybrid_refs(&dir);
        // The fused down projection of steps of at most 8 rows sums in another order than the
        // products of larger steps: off, as this is about the recurrent state.
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
            let states: Vec<ChunkState> = live
                .iter()
                .map(|&i| ChunkState::in_slot((SLOTS - 1 - i) as u32))
                .collect();
            let out = e.forward_logits_states(&chunks, &states).unwrap();
            let mut row = 0;
            for (&i, c) in live.iter().zip(&chunks) {
                for _ in 0..c.tokens.len() {
                    cut[i].push(out.row(row).to_vec());
                    row += 1;
                }
            }
        }
        if exact(dev) {
            assert!(cut == whole, "{name}: chunked prefill changed the logits");
        } else {
            let worst = cut
                .iter()
                .flatten()
                .zip(whole.iter().flatten())
                .map(|(a, b)| rel_diff(a, b))
                .fold(0f32, f32::max);
            eprintln!("{name}: chunked prefill within {worst:.2e} of whole on this GPU");
            assert!(
                worst < BF16_TOL,
                "{name}: chunked prefill differs by {worst}"
            );
        }
    }
}

#[test]
fn hybrid_chunked_prefill_gives_the_whole_prompts_logits() {
    on_every_raw_device!(check_chunked);
}

/// A snapshot of the state after 16 tokens (taken while another sequence prefills) and its
/// first K/V block: a sequence with the same first 16 tokens resumes from copies of them and
/// gets the cold run's logits.
fn check_snapshot<D: Device>(dev: &Arc<D>) {
    for name in ARCHITECTURES {
        let dir = hf_fixture::fixture("hybrid", name);
        let r = hybrid_refs(&dir);
        let p = &r.prompts[5];
        assert!(p.len() > 32);
        let cold = prompt_logits(&mut cuda_engine(dev, &dir, true), p);
        let mut e = cuda_engine(dev, &dir, true);
        let mut other: Vec<u32> = p[..16].to_vec();
        other.extend([5, 6, 7, 8, 9]);
        e.forward_logits_states(
            &[chunk(&other, 0, &[0, 1], LogitsWanted::Last)],
            &[ChunkState {
                slot: 1,
                snapshots: vec![(16, 9)],
            }],
        )
        .unwrap();
        e.copy_states(&[(9, 4)]).unwrap();
        let out = e
            .forward_logits_states(
                &[chunk(&p[16..], 16, &[0, 10, 11], LogitsWanted::All)],
                &[ChunkState::in_slot(4)],
            )
            .unwrap();
        for (t, want) in cold.iter().enumerate().skip(16) {
            let got = out.row(t - 16);
            if exact(dev) {
                assert_eq!(got, want, "{name}: position {t}");
            } else {
                let d = rel_diff(got, want);
                assert!(d < BF16_TOL, "{name}: position {t} differs by {d}");
            }
        }
    }
}

#[test]
fn hybrid_prefix_snapshot_resumes_as_the_cold_run() {
    on_every_raw_device!(check_snapshot);
}

/// With a share of the device's memory the engine runs its load-time warm-up step (which
/// fills slots of its own) and captures every decode graph over steps that name no states:
/// then three prompts prefilled and decoded replay those graphs and give the bits of an
/// engine loaded without any of that.
fn check_warm_up<D: Device>(dev: &Arc<D>) {
    let dir = hf_fixture::fixture("hybrid", "qwen3_next");
    let r = hybrid_refs(&dir);
    let opts = EngineOptions {
        memory_fraction: Some(0.2),
        max_step: StepShape {
            seqs: 3,
            tokens: 40,
            context: Some(64),
        },
        kv_blocks: None,
        state_slots: None,
        ..options()
    };
    let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let mut warm = Engine::load(backend, &dir, &opts).unwrap();
    let stats = warm.graph_stats().expect("CUDA graphs");
    // Batch sizes 1, 2 and 4 (what 3 pads to), block tables of 16 (64 tokens need 4).
    assert_eq!((stats.captured, stats.failed), (3, 0));
    let mut cold = cuda_engine(dev, &dir, true);
    let run = |e: &mut Engine<CudaBackend<D>>| {
        let tables: Vec<Vec<u32>> = (0..3).map(|i| blocks(4 * i as u32, 64)).collect();
        let states: Vec<ChunkState> = (0..3).map(ChunkState::in_slot).collect();
        let mut logits = Vec::new();
        for step in 0..5 {
            let chunks: Vec<_> = (0..3)
                .map(|i| {
                    let p = &r.prompts[i];
                    match step {
                        0 => chunk(p, 0, &tables[i], LogitsWanted::Last),
                        _ => chunk(
                            &[r.greedies[i][step - 1]],
                            p.len() + step - 1,
                            &tables[i],
                            LogitsWanted::Last,
                        ),
                    }
                })
                .collect();
            logits.push(e.forward_logits_states(&chunks, &states).unwrap().data);
        }
        logits
    };
    assert!(
        run(&mut warm) == run(&mut cold),
        "the warm-up changed the logits"
    );
    assert_eq!(
        warm.graph_stats().map(|s| s.captured),
        Some(3),
        "no capture after load"
    );
}

#[test]
fn hybrid_warm_up_and_graph_capture_leave_the_states_alone() {
    if cuda_common::in_child() {
        if let Some(dev) = cuda_common::driver() {
            check_warm_up(&dev);
        }
        return;
    }
    if !cuda_common::emulator_orders().is_empty() {
        check_warm_up(&cuda_common::emulator(lmi_cuda_emu::ThreadOrder::Forward));
    }
    // The driver's device is one per process and the other tests allocate on it: measured
    // alone, in a child process.
    cuda_common::run_in_child(
        "hybrid_warm_up_and_graph_capture_leave_the_states_alone",
        &[],
    );
}
