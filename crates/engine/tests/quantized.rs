//! Quantized weights served as they are stored, against the same weights dequantized to f32:
//! a tiny generated model is quantized to each block format and written as GGUF, then both
//! engines run the same prompts. The only difference left is the int8 rounding of the
//! activations that feed the quantized products.

use lmi_checkpoint::quant::QType;
use lmi_checkpoint::testing::{TinySpec, argmax, write_tiny_gguf, write_tiny_model};
use lmi_engine::engine::{Engine, EngineOptions};
use lmi_engine::{DType, LogitsWanted, SeqChunk};

fn spec() -> TinySpec {
    // Widths that split into K-quant super-blocks of 256.
    TinySpec {
        hidden_size: 256,
        intermediate_size: 512,
        num_heads: 4,
        num_kv_heads: 2,
        num_layers: 2,
        rope_scaling_llama3: false,
        seed: 11,
        ..TinySpec::llama()
    }
}

fn prompts() -> Vec<Vec<u32>> {
    (0..6u32)
        .map(|p| (0..12).map(|i| (p * 37 + i * 11 + 3) % 256).collect())
        .collect()
}

fn engine(
    dir: &std::path::Path,
    gguf: &std::path::Path,
    dtype: Option<DType>,
) -> Engine<lmi_engine::cpu::CpuBackend> {
    lmi_engine::load_cpu(
        dir,
        &EngineOptions {
            dtype,
            kv_blocks: Some(64),
            gguf: Some(gguf.to_path_buf()),
            ..Default::default()
        },
    )
    .unwrap()
}

fn chunk(tokens: Vec<u32>, start: usize, table: Vec<u32>, logits: LogitsWanted) -> SeqChunk {
    SeqChunk {
        tokens,
        start_pos: start,
        block_table: table,
        window_table: Vec::new(),
        logits,
        adapter: None,
    }
}

/// Greedy ids and every step's last logits for `n` tokens after `prompt`.
fn greedy(
    e: &mut Engine<lmi_engine::cpu::CpuBackend>,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let table: Vec<u32> = (0..8).collect();
    let out = e
        .forward_logits(&[chunk(prompt.to_vec(), 0, table.clone(), LogitsWanted::Last)])
        .unwrap();
    let mut rows = vec![out.row(0).to_vec()];
    let mut ids = vec![argmax(out.row(0))];
    while ids.len() < n {
        let pos = prompt.len() + ids.len() - 1;
        let o = e
            .forward_logits(&[chunk(
                vec![*ids.last().unwrap()],
                pos,
                table.clone(),
                LogitsWanted::Last,
            )])
            .unwrap();
        rows.push(o.row(0).to_vec());
        ids.push(argmax(o.row(0)));
    }
    (ids, rows)
}

#[test]
fn each_format_agrees_with_its_dequantized_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hf");
    let spec = spec();
    write_tiny_model(&dir, &spec).unwrap();
    for qt in [
        QType::Q8_0,
        QType::Q4_0,
        QType::Q4_1,
        QType::Q4_K,
        QType::Q6_K,
    ] {
        let gguf = tmp.path().join(format!("{}.gguf", qt.name()));
        write_tiny_gguf(&dir, &spec, &gguf, qt).unwrap();
        let mut q = engine(&dir, &gguf, None);
        assert_eq!(q.model().weights, qt.name());
        let mut f = engine(&dir, &gguf, Some(DType::F32));
        assert_eq!(f.model().weights, "f32");
        let (mut agree, mut worst) = (0, 0f32);
        for p in prompts() {
            let (qi, qr) = greedy(&mut q, &p, 32);
            let (fi, fr) = greedy(&mut f, &p, 32);
            agree += usize::from(qi == fi);
            // Compare logits while the two runs still read the same context.
            let same = qi.iter().zip(&fi).take_while(|(a, b)| a == b).count();
            for (a, b) in qr.iter().zip(&fr).take(same + 1) {
                let range = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                worst = worst.max(d / range);
            }
            // A random model's logits are flat: where greedy paths part, the f32 run's two
            // candidates must be within what two logits' errors can swap.
            if same < qi.len() {
                let row = &fr[same];
                let range = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                let margin = row[fi[same] as usize] - row[qi[same] as usize];
                assert!(
                    margin <= 0.04 * range,
                    "{qt:?}: paths part at token {same} with a margin of {margin} (largest logit {range})"
                );
            }
        }
        eprintln!(
            "{qt:?}: {agree}/6 prompts agree for 32 tokens; worst logit error {worst:.2e} of the largest logit"
        );
        // Activations are rounded to 1/254 of their block's largest magnitude (a relative
        // error of at most 0.4% per value, averaging out over a dot product); through two
        // layers and the LM head that moves logits by well under 2% of the largest one.
        assert!(
            worst < 0.02,
            "{qt:?}: logits differ by {worst} of the largest"
        );
    }
}

/// Every prompt alone (12 rows a step) and all six in one step (72 rows, past the bf16
/// tiles' threshold): the logits of each, alone, then as found in the shared step.
fn alone_and_together(e: &mut Engine<lmi_engine::cpu::CpuBackend>) -> (Vec<Vec<f32>>, Vec<f32>) {
    let ps = prompts();
    let alone: Vec<Vec<f32>> = ps
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let t: Vec<u32> = vec![i as u32];
            e.forward_logits(&[chunk(p.clone(), 0, t, LogitsWanted::All)])
                .unwrap()
                .data
        })
        .collect();
    let chunks: Vec<SeqChunk> = ps
        .iter()
        .enumerate()
        .map(|(i, p)| chunk(p.clone(), 0, vec![10 + i as u32], LogitsWanted::All))
        .collect();
    (alone, e.forward_logits(&chunks).unwrap().data)
}

/// A sequence's logits are bit-identical alone, beside others (a step of 72 rows: tiles of
/// four rows and more than one chunk of 64), and prefilled in chunks.
#[test]
fn quantized_logits_do_not_depend_on_the_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hf");
    let spec = spec();
    write_tiny_model(&dir, &spec).unwrap();
    for qt in [QType::Q4_K, QType::Q4_1, QType::Q8_0, QType::Q6_K] {
        let gguf = tmp.path().join(format!("{}.gguf", qt.name()));
        write_tiny_gguf(&dir, &spec, &gguf, qt).unwrap();
        let mut e = engine(&dir, &gguf, None);
        let ps = prompts();
        let (alone, together) = alone_and_together(&mut e);
        let v = spec.vocab_size;
        let mut row = 0;
        for (i, p) in ps.iter().enumerate() {
            let got = &together[row * v..(row + p.len()) * v];
            assert_eq!(got, &alone[i][..], "{qt:?} prompt {i} differs in a batch");
            row += p.len();
        }
        // The first prompt in two chunks of 5 and 7 tokens.
        let t = vec![20u32];
        let a = e
            .forward_logits(&[chunk(ps[0][..5].to_vec(), 0, t.clone(), LogitsWanted::All)])
            .unwrap();
        let b = e
            .forward_logits(&[chunk(ps[0][5..].to_vec(), 5, t, LogitsWanted::All)])
            .unwrap();
        let chunked: Vec<f32> = a.data.iter().chain(&b.data).copied().collect();
        assert_eq!(chunked, alone[0], "{qt:?}: chunked prefill differs");
    }
}

/// `--dtype int8` quantizes an f32 checkpoint per channel at load.
#[test]
fn int8_from_a_float_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hf");
    let spec = spec();
    write_tiny_model(&dir, &spec).unwrap();
    let opts = |d| EngineOptions {
        dtype: Some(d),
        kv_blocks: Some(64),
        ..Default::default()
    };
    let mut q = lmi_engine::load_cpu(&dir, &opts(DType::I8)).unwrap();
    assert_eq!(q.model().weights, "int8");
    let mut f = lmi_engine::load_cpu(&dir, &opts(DType::F32)).unwrap();
    let mut worst = 0f32;
    for p in prompts() {
        let (a, b) = (greedy(&mut q, &p, 1).1, greedy(&mut f, &p, 1).1);
        let range = b[0].iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = a[0]
            .iter()
            .zip(&b[0])
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(d / range);
    }
    // Per-channel weight rounding (1/254 of a row's largest weight) on top of the
    // activations' rounding.
    assert!(
        worst < 0.03,
        "int8: logits differ by {worst} of the largest"
    );
}
