//! Encoder throughput and latency on the CPU: an all-MiniLM-L6-v2-shaped model (BERT, 6
//! layers, hidden 384, 12 heads, intermediate 1536, vocab 30522; random f32 weights, mean
//! pooling, Normalize) embedding 1,000 sentences of 32–128 tokens, in steps of at most
//! `--tokens` tokens (the scheduler's prefill budget), and one at a time (batch-1 latency).
//!
//! `cargo bench -p lmi-engine --bench embed -- [--dir D] [--tokens 4096] [--dtype bf16]`.
//! The model directory (with a WordPiece `vocab.txt` whose words are `w5`, `w6`, ...) and the
//! sentences (`sentences.json`: each one's ids and its text in those words) are written to
//! `--dir` when absent, so that sentence-transformers can be timed on the same model and
//! inputs (`SentenceTransformer(D).encode(texts)`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use lmi_checkpoint::testing::{lcg, write_f32_safetensors};
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{BLOCK_SIZE, DType, LogitsWanted, PoolRequest, SeqChunk, StepBatch};

const H: usize = 384;
const LAYERS: usize = 6;
const INTER: usize = 1536;
const VOCAB: usize = 30522;
const SENTENCES: usize = 1000;

fn write_model(dir: &Path) {
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    let config = format!(
        r#"{{"architectures":["BertModel"],"hidden_act":"gelu","hidden_size":{H},"intermediate_size":{INTER},
        "layer_norm_eps":1e-12,"max_position_embeddings":512,"model_type":"bert","num_attention_heads":12,
        "num_hidden_layers":{LAYERS},"pad_token_id":0,"position_embedding_type":"absolute","type_vocab_size":2,
        "vocab_size":{VOCAB}}}"#
    );
    std::fs::write(dir.join("config.json"), config).unwrap();
    let mut seed = 1u64;
    let mut t = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n = shape.iter().product();
        let v = (0..n).map(|_| lcg(&mut seed) * scale + offset).collect();
        t.push((name, shape, v));
    };
    add(
        "embeddings.word_embeddings.weight".into(),
        vec![VOCAB, H],
        0.1,
        0.0,
    );
    add(
        "embeddings.position_embeddings.weight".into(),
        vec![512, H],
        0.1,
        0.0,
    );
    add(
        "embeddings.token_type_embeddings.weight".into(),
        vec![2, H],
        0.1,
        0.0,
    );
    add("embeddings.LayerNorm.weight".into(), vec![H], 0.1, 1.0);
    add("embeddings.LayerNorm.bias".into(), vec![H], 0.05, 0.0);
    let fan = |k: usize| 1.0 / (k as f32).sqrt();
    for l in 0..LAYERS {
        let p = format!("encoder.layer.{l}");
        for n in ["query", "key", "value"] {
            add(
                format!("{p}.attention.self.{n}.weight"),
                vec![H, H],
                fan(H),
                0.0,
            );
            add(format!("{p}.attention.self.{n}.bias"), vec![H], 0.05, 0.0);
        }
        add(
            format!("{p}.attention.output.dense.weight"),
            vec![H, H],
            fan(H),
            0.0,
        );
        add(
            format!("{p}.attention.output.dense.bias"),
            vec![H],
            0.05,
            0.0,
        );
        add(
            format!("{p}.attention.output.LayerNorm.weight"),
            vec![H],
            0.1,
            1.0,
        );
        add(
            format!("{p}.attention.output.LayerNorm.bias"),
            vec![H],
            0.05,
            0.0,
        );
        add(
            format!("{p}.intermediate.dense.weight"),
            vec![INTER, H],
            fan(H),
            0.0,
        );
        add(
            format!("{p}.intermediate.dense.bias"),
            vec![INTER],
            0.05,
            0.0,
        );
        add(
            format!("{p}.output.dense.weight"),
            vec![H, INTER],
            fan(INTER),
            0.0,
        );
        add(format!("{p}.output.dense.bias"), vec![H], 0.05, 0.0);
        add(format!("{p}.output.LayerNorm.weight"), vec![H], 0.1, 1.0);
        add(format!("{p}.output.LayerNorm.bias"), vec![H], 0.05, 0.0);
    }
    add("pooler.dense.weight".into(), vec![H, H], fan(H), 0.0);
    add("pooler.dense.bias".into(), vec![H], 0.05, 0.0);
    write_f32_safetensors(&dir.join("model.safetensors"), t).unwrap();
    let files = [
        (
            "modules.json",
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
            {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#
                .to_string(),
        ),
        (
            "1_Pooling/config.json",
            format!(r#"{{"word_embedding_dimension":{H},"pooling_mode_mean_tokens":true}}"#),
        ),
        (
            "sentence_bert_config.json",
            r#"{"max_seq_length":256,"do_lower_case":false}"#.into(),
        ),
        (
            "tokenizer_config.json",
            r#"{"tokenizer_class":"BertTokenizer","do_lower_case":false,"model_max_length":512}"#
                .into(),
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    // Ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]; id i ≥ 5 is the word `w{i}`.
    let mut vocab: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    vocab.extend((5..VOCAB).map(|i| format!("w{i}")));
    std::fs::write(dir.join("vocab.txt"), vocab.join("\n") + "\n").unwrap();
}

/// Sentences of 32–128 tokens (`[CLS]` words `[SEP]`), their ids and text.
fn sentences(dir: &Path) -> Vec<Vec<u32>> {
    let path = dir.join("sentences.json");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        return v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            })
            .collect();
    }
    let mut seed = 7u64;
    let mut next = || ((lcg(&mut seed) + 1.0) * 0.5 * 1e6) as usize;
    let ids: Vec<Vec<u32>> = (0..SENTENCES)
        .map(|_| {
            let len = 32 + next() % 97;
            let mut s = vec![2u32];
            s.extend((0..len - 2).map(|_| (5 + next() % (VOCAB - 5)) as u32));
            s.push(3);
            s
        })
        .collect();
    let texts: Vec<String> = ids
        .iter()
        .map(|s| {
            let words: Vec<String> = s[1..s.len() - 1].iter().map(|i| format!("w{i}")).collect();
            words.join(" ")
        })
        .collect();
    let json = serde_json::json!({ "ids": ids, "texts": texts });
    std::fs::write(&path, json.to_string()).unwrap();
    ids
}

/// Pools `batch` in one step.
fn step(e: &mut dyn StepEngine, batch: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let mut next = 0u32;
    let chunks: Vec<SeqChunk> = batch
        .iter()
        .map(|ids| {
            let n = ids.len().div_ceil(BLOCK_SIZE) as u32;
            let table = (next..next + n).collect();
            next += n;
            SeqChunk {
                tokens: ids.clone(),
                start_pos: 0,
                block_table: table,
                window_table: Vec::new(),
                logits: LogitsWanted::None,
                adapter: None,
            }
        })
        .collect();
    let pools: Vec<PoolRequest> = (0..batch.len())
        .map(|chunk| PoolRequest {
            chunk,
            segment_b: None,
        })
        .collect();
    e.step(&StepBatch {
        chunks: &chunks,
        samples: &[],
        prompt_logprobs: &[],
        media: &[],
        rope_deltas: &[],
        states: &[],
        pools: &pools,
        mtp: &[],
    })
    .unwrap()
    .pooled
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = arg(&args, "--dir").map_or_else(
        || std::env::temp_dir().join("lmi-bench-minilm"),
        PathBuf::from,
    );
    let budget: usize = arg(&args, "--tokens").map_or(4096, |t| t.parse().unwrap());
    let dtype: Option<DType> = arg(&args, "--dtype").map(|d| d.parse().unwrap());
    let latency: usize = arg(&args, "--latency").map_or(200, |t| t.parse().unwrap());
    if !dir.join("model.safetensors").exists() {
        write_model(&dir);
    }
    let mut ids = sentences(&dir);
    if let Some(n) = arg(&args, "--count") {
        ids.truncate(n.parse().unwrap());
    }
    let tokens: usize = ids.iter().map(Vec::len).sum();
    let opts = EngineOptions {
        dtype,
        kv_blocks: Some(1 << 12),
        ..Default::default()
    };
    let mut e = lmi_engine::load_cpu_encoder(&dir, &opts).unwrap();
    println!(
        "{} (weights {}, {} threads), {} sentences, {tokens} tokens",
        dir.display(),
        e.weights_format(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        ids.len()
    );
    // Warm-up: the buffers reach their sizes.
    step(&mut e, &ids[..32]);
    for _ in 0..2 {
        let t = Instant::now();
        let mut done = 0usize;
        let mut start = 0;
        while start < ids.len() {
            let mut end = start;
            let mut n = 0;
            while end < ids.len() && n + ids[end].len() <= budget {
                n += ids[end].len();
                end += 1;
            }
            done += step(&mut e, &ids[start..end]).len();
            start = end;
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "throughput: {done} sentences in {s:.3} s = {:.1} sentences/s, {:.0} tokens/s (steps of ≤ {budget} tokens)",
            done as f64 / s,
            tokens as f64 / s
        );
    }
    let t = Instant::now();
    let latency = latency.min(ids.len()).max(1);
    for s in &ids[..latency] {
        step(&mut e, std::slice::from_ref(s));
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / latency as f64;
    println!("batch 1: {ms:.2} ms per sentence (mean of {latency})");
}
