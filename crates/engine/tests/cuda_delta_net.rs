//! Gated DeltaNet's ops on the CUDA backend (kernels/delta_net.cu) against the CPU backend's
//! (engine-cpu/src/delta_net.rs), through the `Backend` trait, on the CPU emulator in both
//! thread orders and on the driver's device (a GPU, or the fake driver):
//! - three steps on one layer's slots: fresh prefill chunks (one shorter than the
//!   convolution), chunks that continue (one crossing its previous chunk's convolution window),
//!   a sequence resumed from a snapshot copied into its slot, then a decode step padded as a
//!   graph's. Every step's outputs (f32 and bf16) and every slot of the state against the CPU's;
//! - on the device alone, bit for bit: a sequence run whole and alone equals it run in two
//!   chunks beside others (batch and chunk invariance), and the resumed one equals the rows
//!   after its snapshot;
//! - padding sequences (no slot) read and write no state;
//! - slot copies in order, dependent pairs included; the sigmoid gate in f32 and bf16.
//!
//! Shapes: the fixtures' heads (16 × 16, 4 value heads over 2 key heads), a published key head
//! (128) with value heads of 48 (not a multiple of a warp's 32 columns), and key heads of 200
//! (the 32-row kernel, rows not a multiple of its 8 warps) with a convolution of 2.

mod cuda_common;

use cuda_common::{assert_close, bf16_round, cpu, random, to_host};
use lmi_checkpoint::config::linear_attn::LinearAttnConfig;
use lmi_checkpoint::weights::HostTensor;
use lmi_cuda::Device;
use lmi_engine::backend::DeltaNet;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::{Backend, BatchLayout, ChunkState, LogitsWanted, SeqChunk, StateConfig};

const SLOTS: usize = 12;

fn dims(nk: usize, nv: usize, dk: usize, dv: usize, kernel: usize) -> LinearAttnConfig {
    LinearAttnConfig {
        layers: vec![true],
        num_k_heads: nk,
        num_v_heads: nv,
        head_k_dim: dk,
        head_v_dim: dv,
        conv_kernel: kernel,
    }
}

/// The layer's weights besides its projections, on one backend.
struct Weights<B: Backend> {
    conv: B::Weight,
    a_log: B::Weight,
    dt_bias: B::Weight,
    norm: B::Weight,
}

fn weights<B: Backend>(b: &B, d: &LinearAttnConfig, seed: u64) -> Weights<B> {
    let up = |v: Vec<f32>| b.upload_weight(HostTensor::f32(vec![v.len()], v)).unwrap();
    let nv = d.num_v_heads;
    Weights {
        conv: up(random(d.conv_dim() * d.conv_kernel, seed, 0.8)),
        // Decays e^g from about 0.1 to 1 (A_log, dt_bias and a as the fixtures hold them).
        a_log: up(random(nv, seed + 1, 1.0)),
        dt_bias: up(random(nv, seed + 2, 1.0)),
        norm: up(random(d.head_v_dim, seed + 3, 1.0)
            .iter()
            .map(|x| 1.0 + x)
            .collect()),
    }
}

fn layer<'a, B: Backend>(d: &'a LinearAttnConfig, w: &'a Weights<B>) -> DeltaNet<'a, B> {
    DeltaNet {
        dims: d,
        conv: &w.conv,
        a_log: &w.a_log,
        dt_bias: &w.dt_bias,
        norm: &w.norm,
        eps: 1e-6,
    }
}

/// One chunk of a step: `(start position, tokens, state)`.
type Chunk = (usize, usize, ChunkState);

fn layout(chunks: &[Chunk]) -> BatchLayout {
    let seqs: Vec<SeqChunk> = chunks
        .iter()
        .map(|(start, n, _)| SeqChunk {
            tokens: vec![1; *n],
            start_pos: *start,
            block_table: vec![0; (start + n).div_ceil(16)],
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter: None,
        })
        .collect();
    let mut l = BatchLayout::new(&seqs, 1).unwrap();
    l.states = chunks.iter().map(|c| c.2.clone()).collect();
    l
}

/// Runs `l` on the device with `proj` (`[tokens, proj_dim]`), padding rows' projections
/// appended when the layout was padded; the outputs of the layout's rows, in f32 or bf16.
fn run_gpu<D: Device>(
    g: &CudaBackend<D>,
    d: &LinearAttnConfig,
    w: &Weights<CudaBackend<D>>,
    state: &mut lmi_engine::cuda::CudaState<D>,
    l: &BatchLayout,
    proj: &[f32],
    bf16: bool,
) -> Vec<f32> {
    let n = l.num_tokens();
    let step = g.upload_step(l).unwrap();
    let mut p = proj.to_vec();
    p.resize(n * d.proj_dim(), 0.5);
    let gp = g.upload_f32(&p).unwrap();
    let mut out = match bf16 {
        true => g.alloc_matmul_input(n * d.value_dim()).unwrap(),
        false => g.alloc(n * d.value_dim()).unwrap(),
    };
    g.gated_delta_net(&gp, &step, layer(d, w), state, &mut out)
        .unwrap();
    to_host(g, &out)
}

fn gpu_slots<D: Device>(g: &CudaBackend<D>, state: &lmi_engine::cuda::CudaState<D>) -> Vec<f32> {
    (0..SLOTS)
        .flat_map(|s| state.read_slot(g, s).unwrap())
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// Projections of `tokens` rows: q k v, z, b and a, each about as large as a real layer's.
fn projections(d: &LinearAttnConfig, tokens: usize, seed: u64) -> Vec<f32> {
    random(tokens * d.proj_dim(), seed, 1.5)
}

fn check_case<D: Device>(g: &CudaBackend<D>, d: &LinearAttnConfig, seed: u64) {
    let c = cpu();
    let what = format!(
        "{} key heads of {}, {} value heads of {}, kernel {}",
        d.num_k_heads, d.head_k_dim, d.num_v_heads, d.head_v_dim, d.conv_kernel
    );
    let cfg = StateConfig {
        slots: SLOTS,
        layers: 1,
        slot_len: d.state_len(),
    };
    let (cw, gw) = (weights(&c, d, seed), weights(g, d, seed));
    let mut cs = c.alloc_states(&cfg).unwrap().remove(0);
    let mut gs = g.alloc_states(&cfg).unwrap().remove(0);
    let pd = d.proj_dim();
    let vd = d.value_dim();
    // Sequence A: 20 tokens, in two chunks (13 then 7); B: one token; C: 2 tokens (fewer than
    // the convolution's kernel − 1 inputs when it is 4), then 2 more; D: A's tokens 5.. resumed
    // from A's snapshot after 5.
    let a = projections(d, 20, seed + 10);
    let b = projections(d, 1, seed + 11);
    let cc = projections(d, 4, seed + 12);
    let rows = |p: &[f32], r: std::ops::Range<usize>| p[r.start * pd..r.end * pd].to_vec();
    let snap = |slot, snaps: Vec<(u32, u32)>| ChunkState {
        slot,
        snapshots: snaps,
    };
    // Each step: its chunks, their projections, and the slot copies before it.
    type Step = (Vec<Chunk>, Vec<f32>, Vec<(u32, u32)>);
    let steps: Vec<Step> = vec![
        (
            vec![
                (0, 13, snap(2, vec![(5, 6), (13, 7)])),
                (0, 1, snap(0, vec![])),
                (0, 2, snap(4, vec![(1, 5)])),
            ],
            [rows(&a, 0..13), b.clone(), rows(&cc, 0..2)].concat(),
            vec![],
        ),
        (
            vec![
                (13, 7, snap(2, vec![])),
                (2, 2, snap(4, vec![])),
                (5, 8, snap(3, vec![(8, 8)])),
            ],
            [rows(&a, 13..20), rows(&cc, 2..4), rows(&a, 5..13)].concat(),
            // D resumes from A's snapshot after 5 tokens.
            vec![(6, 3)],
        ),
    ];
    let mut device_outs = Vec::new();
    for (i, (chunks, proj, copies)) in steps.iter().enumerate() {
        c.copy_states(&mut cs, &cfg, copies).unwrap();
        g.copy_states(&mut gs, &cfg, copies).unwrap();
        let l = layout(chunks);
        let n = l.num_tokens();
        let mut want = c.alloc(n * vd).unwrap();
        c.gated_delta_net(
            proj,
            &c.upload_step(&l).unwrap(),
            layer(d, &cw),
            &mut cs,
            &mut want,
        )
        .unwrap();
        // bf16 first, on a copy of the slots, then f32 on the slots themselves.
        let before = gpu_slots(g, &gs);
        let got16 = run_gpu(g, d, &gw, &mut gs, &l, proj, true);
        let got = {
            restore(g, &mut gs, &cfg, &before);
            run_gpu(g, d, &gw, &mut gs, &l, proj, false)
        };
        let slots = gpu_slots(g, &gs);
        eprintln!(
            "{what}, step {i}: outputs within {:.1e} of the CPU's, state within {:.1e}",
            max_diff(&got, &want),
            max_diff(&slots, &cs.data)
        );
        assert_close(&format!("{what}: step {i}"), &got, &want, 2e-5, 2e-5);
        assert_close(
            &format!("{what}: step {i} in bf16"),
            &got16,
            &bf16_round(&want),
            1e-4,
            1.0 / 64.0,
        );
        assert_close(
            &format!("{what}: state slots after step {i}"),
            &slots,
            &cs.data,
            1e-5,
            1e-5,
        );
        device_outs.push(got);
    }
    // On the device alone: A whole and alone in a fresh slot is A's two chunks, bit for bit,
    // and D (resumed after 5 tokens) is A's rows 5..13.
    let whole = run_gpu(
        g,
        d,
        &gw,
        &mut gs,
        &layout(&[(0, 20, snap(9, vec![]))]),
        &a,
        false,
    );
    let cut: Vec<f32> = [&device_outs[0][..13 * vd], &device_outs[1][..7 * vd]].concat();
    assert_eq!(whole, cut, "{what}: A in two chunks beside others");
    let resumed = &device_outs[1][9 * vd..17 * vd];
    assert_eq!(resumed, &whole[5 * vd..13 * vd], "{what}: D resumed");
    // The snapshot D took after 8 of its tokens is A's state after 13.
    assert_eq!(
        gs.read_slot(g, 8).unwrap(),
        gs.read_slot(g, 7).unwrap(),
        "{what}: snapshots"
    );

    // A decode step of A, C and D padded to a graph's 4 sequences: the padding reads and
    // writes no state, and the real rows are the CPU's.
    let chunks = vec![
        (20, 1, snap(2, vec![])),
        (4, 1, snap(4, vec![])),
        (13, 1, snap(3, vec![])),
    ];
    let proj = projections(d, 3, seed + 13);
    let l = layout(&chunks);
    let mut want = c.alloc(3 * vd).unwrap();
    c.gated_delta_net(
        &proj,
        &c.upload_step(&l).unwrap(),
        layer(d, &cw),
        &mut cs,
        &mut want,
    )
    .unwrap();
    let padded = g.prepare_layout(l);
    assert_eq!(padded.num_seqs(), 4, "{what}: padded to a graph's size");
    // Slots the step does not name, whatever they hold, stay as they were.
    let untouched: Vec<usize> = (0..SLOTS).filter(|s| ![2, 3, 4].contains(s)).collect();
    let before: Vec<Vec<f32>> = untouched
        .iter()
        .map(|&s| gs.read_slot(g, s).unwrap())
        .collect();
    let got = run_gpu(g, d, &gw, &mut gs, &padded, &proj, false);
    assert_close(
        &format!("{what}: decode"),
        &got[..3 * vd],
        &want,
        2e-5,
        2e-5,
    );
    assert!(
        got[3 * vd..].iter().all(|&x| x == 0.0),
        "{what}: a padding row's output is zero"
    );
    for (&s, b) in untouched.iter().zip(&before) {
        assert_eq!(&gs.read_slot(g, s).unwrap(), b, "{what}: slot {s}");
    }
    for s in [2, 3, 4] {
        let len = cfg.slot_len;
        assert_close(
            &format!("{what}: slot {s} after decoding"),
            &gs.read_slot(g, s).unwrap(),
            &cs.data[s * len..(s + 1) * len],
            1e-5,
            1e-5,
        );
    }
}

/// Writes `slots` (every slot's values) back into the device's state.
fn restore<D: Device>(
    g: &CudaBackend<D>,
    state: &mut lmi_engine::cuda::CudaState<D>,
    cfg: &StateConfig,
    slots: &[f32],
) {
    assert_eq!(slots.len(), cfg.slots * cfg.slot_len);
    state.write_slots(g, slots).unwrap();
}

fn check_delta_net<D: Device>(g: &CudaBackend<D>) {
    check_case(g, &dims(2, 4, 16, 16, 4), 1);
    check_case(g, &dims(1, 2, 128, 48, 4), 2);
    check_case(g, &dims(2, 2, 200, 40, 2), 3);
}

#[test]
fn gated_delta_net_matches_the_cpu_and_keeps_its_state() {
    on_every_device!(check_delta_net);
}

/// Copies in order: a chain (2 → 9 → 10) and a slot overwritten after it was read (3 → 2).
fn check_copies<D: Device>(g: &CudaBackend<D>) {
    let d = dims(2, 4, 16, 16, 4);
    let cfg = StateConfig {
        slots: SLOTS,
        layers: 1,
        slot_len: d.state_len(),
    };
    let mut gs = g.alloc_states(&cfg).unwrap().remove(0);
    let len = cfg.slot_len;
    assert!(
        gpu_slots(g, &gs).iter().all(|&x| x == 0.0),
        "slots start zeroed"
    );
    let values = random(SLOTS * len, 5, 1.0);
    gs.write_slots(g, &values).unwrap();
    let pairs = [(2, 9), (9, 10), (3, 2), (0, 11)];
    let mut want = values.clone();
    for &(s, d) in &pairs {
        let (s, d) = (s as usize * len, d as usize * len);
        want.copy_within(s..s + len, d);
    }
    g.copy_states(&mut gs, &cfg, &pairs).unwrap();
    assert_eq!(gpu_slots(g, &gs), want, "copies in order");
    let err = g
        .copy_states(&mut gs, &cfg, &[(1, SLOTS as u32)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside"), "{err}");
}

#[test]
fn state_slot_copies_run_in_order() {
    on_every_device!(check_copies);
}

fn check_sigmoid_mul<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let n = 1000;
    let x = bf16_round(&random(n, 6, 3.0));
    let gate = random(n, 7, 12.0);
    let mut want = x.clone();
    c.sigmoid_mul(&mut want, &gate, n).unwrap();
    let gg = g.upload_f32(&gate).unwrap();
    let mut gx = g.upload_f32(&x).unwrap();
    g.sigmoid_mul(&mut gx, &gg, n).unwrap();
    assert_close("sigmoid_mul", &to_host(g, &gx), &want, 1e-6, 1e-6);
    // bf16 x (its values are bf16 already): rounded once.
    let mut gx16 = g.alloc_matmul_input(n).unwrap();
    let bits: Vec<u16> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    lmi_cuda::DeviceExt::htod_slice(g.device().as_ref(), &bits, gx16.ptr).unwrap();
    g.sigmoid_mul(&mut gx16, &gg, n).unwrap();
    assert_close(
        "sigmoid_mul in bf16",
        &to_host(g, &gx16),
        &bf16_round(&want),
        1e-6,
        1.0 / 128.0,
    );
}

#[test]
fn sigmoid_gate_matches_the_cpu() {
    on_every_device!(check_sigmoid_mul);
}
