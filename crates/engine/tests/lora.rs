//! A LoRA adapter applied per sequence equals running a checkpoint with the adapter merged into
//! its weights (W + s·B·A), while a sequence without the adapter in the same batch is unchanged.

use std::collections::HashMap;
use std::path::Path;

use lmi_checkpoint::peft::{LoraLimits, LoraWeights};
use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
use lmi_checkpoint::weights::SafetensorsDir;
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{DType, LogitsWanted, ModelConfig, SeqChunk};
use safetensors::tensor::{Dtype, TensorView};

fn write_f32(path: &Path, tensors: &HashMap<String, (Vec<usize>, Vec<f32>)>) {
    let bytes: HashMap<String, (Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, (s, v))| {
            (
                n.clone(),
                (s.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            )
        })
        .collect();
    let views: HashMap<String, TensorView<'_>> = bytes
        .iter()
        .map(|(n, (s, b))| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn val(i: usize, salt: usize) -> f32 {
    (((i * 7919 + salt * 104729) % 1000) as f32 / 1000.0 - 0.5) * 0.2
}

#[test]
fn adapter_equals_merged_weights_and_leaves_other_rows_alone() {
    let base = tempfile::tempdir().unwrap();
    write_tiny_model(base.path(), &TinySpec::llama()).unwrap();
    let c = ModelConfig::from_file(&base.path().join("config.json")).unwrap();
    let (r, alpha) = (2usize, 4.0f32);
    let targets = [
        ("self_attn.q_proj", c.q_size(), c.hidden_size),
        ("self_attn.v_proj", c.kv_size(), c.hidden_size),
        ("mlp.down_proj", c.hidden_size, c.intermediate_size),
    ];

    // The adapter, PEFT-named, and the merged checkpoint.
    let adapter_dir = tempfile::tempdir().unwrap();
    let st = SafetensorsDir::open(base.path()).unwrap();
    let mut merged: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    for name in st.names().map(str::to_string).collect::<Vec<_>>() {
        let shape = st.shape(&name).unwrap();
        merged.insert(
            name.clone(),
            (
                shape.clone(),
                st.load(&name, &shape, DType::F32).unwrap().to_f32_vec(),
            ),
        );
    }
    let mut lora: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    for l in 0..c.num_layers {
        for (ti, (m, out, inp)) in targets.iter().enumerate() {
            let a: Vec<f32> = (0..r * inp).map(|i| val(i, l * 10 + ti)).collect();
            let b: Vec<f32> = (0..out * r).map(|i| val(i, l * 10 + ti + 5)).collect();
            let p = format!("base_model.model.model.layers.{l}.{m}");
            lora.insert(format!("{p}.lora_A.weight"), (vec![r, *inp], a.clone()));
            lora.insert(format!("{p}.lora_B.weight"), (vec![*out, r], b.clone()));
            let w = &mut merged
                .get_mut(&format!("model.layers.{l}.{m}.weight"))
                .unwrap()
                .1;
            for o in 0..*out {
                for k in 0..*inp {
                    let d: f32 = (0..r).map(|j| b[o * r + j] * a[j * inp + k]).sum();
                    w[o * inp + k] += alpha / r as f32 * d;
                }
            }
        }
    }
    write_f32(&adapter_dir.path().join("adapter_model.safetensors"), &lora);
    std::fs::write(
        adapter_dir.path().join("adapter_config.json"),
        format!("{{\"r\": {r}, \"lora_alpha\": {alpha}}}"),
    )
    .unwrap();
    let merged_dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(base.path().join(f), merged_dir.path().join(f)).unwrap();
    }
    write_f32(&merged_dir.path().join("model.safetensors"), &merged);

    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(16),
        ..Default::default()
    };
    let tokens: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 256).collect();
    let chunk = |adapter, first_block| SeqChunk {
        tokens: tokens.clone(),
        start_pos: 0,
        block_table: vec![first_block, first_block + 1],
        window_table: Vec::new(),
        logits: LogitsWanted::All,
        adapter,
    };
    let mut e = lmi_engine::load_cpu(base.path(), &opts).unwrap();
    let limits = LoraLimits::default();
    assert!(LoraWeights::load(&base.path().join("missing"), &c, limits).is_err());
    let w = LoraWeights::load(adapter_dir.path(), &c, limits).unwrap();
    e.load_adapter(7, &w).unwrap();
    let mixed = e
        .forward_logits(&[chunk(Some(7), 0), chunk(None, 2)])
        .unwrap();
    let mut plain = lmi_engine::load_cpu(base.path(), &opts).unwrap();
    let base_out = plain.forward_logits(&[chunk(None, 0)]).unwrap();
    let mut m = lmi_engine::load_cpu(merged_dir.path(), &opts).unwrap();
    let merged_out = m.forward_logits(&[chunk(None, 0)]).unwrap();
    let n = tokens.len();
    let mut max_diff = 0.0f32;
    for t in 0..n {
        for (x, y) in mixed.row(t).iter().zip(merged_out.row(t)) {
            max_diff = max_diff.max((x - y).abs());
        }
        assert_eq!(
            mixed.row(n + t),
            base_out.row(t),
            "the row without adapter changed"
        );
    }
    assert!(max_diff < 1e-4, "adapter vs merged weights: {max_diff}");
    assert_ne!(
        mixed.row(0),
        base_out.row(0),
        "the adapter must change something"
    );
    assert!(
        e.forward_logits(&[chunk(Some(8), 0)]).is_err(),
        "an unknown adapter id is an error"
    );
}
