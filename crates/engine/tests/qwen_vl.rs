//! Qwen2.5-VL and Qwen2-VL against HF transformers (tests/fixtures/qwen_vl, written by its
//! generate.py from tiny random weights): vision embeddings from the processor's patches,
//! M-RoPE positions against `get_rope_index`, prompt logits, and 16 greedy tokens, in f32.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmi_engine::engine::EngineOptions;
use lmi_engine::vision::mrope::{RunAt, chunk_positions, item_delta};
use lmi_engine::vision::{MediaKind, VisionInput};
use lmi_engine::{ChunkMedia, DType, Engine, LogitsWanted, SeqChunk};
use safetensors::SafeTensors;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen_vl")
}

struct Tensors(Vec<u8>);

impl Tensors {
    fn open(path: &Path) -> Self {
        Tensors(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }
    fn get(&self, name: &str) -> Option<Vec<f32>> {
        let st = SafeTensors::deserialize(&self.0).unwrap();
        let t = st.tensor(name).ok()?;
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        Some(
            t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        )
    }
    fn f32(&self, name: &str) -> Vec<f32> {
        self.get(name).unwrap_or_else(|| panic!("no tensor {name}"))
    }
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// An image's or the video's patches, made from the media files by `lmi_media` (whose own
/// tests compare it with the HF processor; here the stored `pixel_values` are checked too).
fn input(pre: &Tensors, prep: &Value, kind: &str, name: &str, t_scale: f32) -> Option<VisionInput> {
    let dir = fixtures();
    let cfg = lmi_media::ProcessorConfig::from_dir(&dir.join("qwen2_5_vl")).unwrap();
    let limits = lmi_media::ImageLimits::default();
    let read = |file: &str| {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        lmi_media::decode_image(&bytes, &limits).unwrap()
    };
    let (patches, kind) = if kind == "video" {
        let frames: Vec<String> = serde_json::from_value(prep["video"]["frames"].clone()).unwrap();
        let frames: Vec<_> = frames.iter().map(|f| read(f)).collect();
        (
            lmi_media::preprocess_video(&frames, &cfg).unwrap(),
            MediaKind::Video,
        )
    } else {
        let meta = prep["images"].get(name)?;
        let img = read(meta["file"].as_str().unwrap());
        (
            lmi_media::preprocess_image(&img, &cfg).unwrap(),
            MediaKind::Image,
        )
    };
    if let Some(stored) = pre.get(&format!("image.{name}.pixel_values")) {
        assert!(
            max_rel_diff(&patches.pixels, &stored) < 1e-6,
            "{name}: pixel values"
        );
    }
    Some(VisionInput {
        kind,
        grid_thw: patches.grid_thw,
        pixels: patches.pixels,
        merge_size: 2,
        t_scale,
    })
}

/// The encoder cache's key for an item: a hash of its patches.
fn pixel_hash(inp: &VisionInput) -> u128 {
    let bytes: Vec<u8> = inp.pixels.iter().flat_map(|v| v.to_le_bytes()).collect();
    lmi_media::content_hash(&bytes)
}

fn max_rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

fn load(model: &str) -> Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(64),
        ..Default::default()
    };
    Engine::load_cpu(&fixtures().join(model), &opts).unwrap()
}

/// Qwen2.5-VL video: temporal positions per grid step (seconds per step x tokens per second).
fn video_t_scale(reference: &Value, prompt: &Value) -> f32 {
    let tps = reference["video"]["tokens_per_second"]
        .as_f64()
        .unwrap_or(2.0);
    match prompt["second_per_grid_ts"]
        .as_array()
        .and_then(|a| a.first())
    {
        Some(s) => (s.as_f64().unwrap() * tps) as f32,
        None => 1.0,
    }
}

fn check_vision(model: &str) {
    let dir = fixtures();
    let (pre, prep) = (
        Tensors::open(&dir.join("preprocess.safetensors")),
        json(&dir.join("preprocess.json")),
    );
    let refs = Tensors::open(&dir.join(model).join("reference.safetensors"));
    let engine = load(model);
    let tower = engine.model().vision.as_ref().expect("a vision tower");
    let mut checked = 0;
    let names: Vec<String> = prep["images"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    for name in names {
        let Some(inp) = input(&pre, &prep, "image", &name, 1.0) else {
            continue;
        };
        let got = tower.forward(&inp).unwrap();
        let d = max_rel_diff(&got, &refs.f32(&format!("image.{name}.embeds")));
        assert!(
            d < 1e-4,
            "{model} {name}: embeddings differ by {d} (relative)"
        );
        checked += 1;
    }
    let video = input(&pre, &prep, "video", "", 1.0).unwrap();
    let d = max_rel_diff(&tower.forward(&video).unwrap(), &refs.f32("video.embeds"));
    assert!(d < 1e-4, "{model} video: embeddings differ by {d}");
    assert!(checked >= 4, "images checked: {checked}");
}

#[test]
fn qwen2_5_vl_vision_embeddings_match_hf() {
    check_vision("qwen2_5_vl");
}

#[test]
fn qwen2_vl_vision_embeddings_match_hf() {
    check_vision("qwen2_vl");
}

/// One prompt of the fixture: its token ids, and its media runs with their patches.
struct PromptCase {
    id: String,
    ids: Vec<u32>,
    media: Vec<(usize, Arc<VisionInput>)>,
    reference: Value,
}

fn prompts(model: &str) -> Vec<PromptCase> {
    let dir = fixtures();
    let (pre, prep) = (
        Tensors::open(&dir.join("preprocess.safetensors")),
        json(&dir.join("preprocess.json")),
    );
    let reference = json(&dir.join(model).join("reference.json"));
    let mut out = Vec::new();
    'prompts: for p in reference["prompts"].as_array().unwrap() {
        let ids: Vec<u32> = serde_json::from_value(p["input_ids"].clone()).unwrap();
        let mut media = Vec::new();
        let files: Vec<String> = media_files(&p["messages"]);
        for (m, file) in p["media"].as_array().unwrap().iter().zip(files) {
            let kind = m["kind"].as_str().unwrap();
            let name = Path::new(&file)
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let t_scale = if kind == "video" {
                video_t_scale(&reference, p)
            } else {
                1.0
            };
            let Some(inp) = input(&pre, &prep, kind, &name, t_scale) else {
                continue 'prompts;
            };
            assert_eq!(
                m["pad_end"].as_u64().unwrap() - m["pad_start"].as_u64().unwrap(),
                inp.tokens() as u64
            );
            media.push((m["pad_start"].as_u64().unwrap() as usize, Arc::new(inp)));
        }
        out.push(PromptCase {
            id: p["id"].to_string(),
            ids,
            media,
            reference: p.clone(),
        });
    }
    out
}

fn media_files(messages: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for m in messages.as_array().into_iter().flatten() {
        for part in m["content"].as_array().into_iter().flatten() {
            for key in ["image", "video"] {
                if let Some(f) = part[key].as_str() {
                    out.push(f.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn mrope_positions_match_get_rope_index() {
    for model in ["qwen2_5_vl", "qwen2_vl"] {
        for case in prompts(model) {
            let want: Vec<Vec<u32>> =
                serde_json::from_value(case.reference["position_ids"].clone()).unwrap();
            let runs: Vec<RunAt<'_>> = case
                .media
                .iter()
                .map(|(start, inp)| RunAt {
                    offset: *start,
                    len: inp.tokens(),
                    item_offset: 0,
                    input: inp,
                })
                .collect();
            let mut got = Vec::new();
            chunk_positions(0, case.ids.len(), 0, &runs, &mut got);
            for (i, p) in got.chunks(3).enumerate() {
                assert_eq!(
                    p,
                    [want[0][i], want[1][i], want[2][i]],
                    "{model} prompt {} position {i}",
                    case.id
                );
            }
            let delta: i64 = case.media.iter().map(|(_, m)| item_delta(m)).sum();
            assert_eq!(
                delta,
                case.reference["rope_deltas"].as_i64().unwrap(),
                "{model} prompt {}",
                case.id
            );
        }
    }
}

fn chunk(tokens: Vec<u32>, start_pos: usize, logits: LogitsWanted) -> SeqChunk {
    let blocks = (start_pos + tokens.len()).div_ceil(16);
    SeqChunk {
        tokens,
        start_pos,
        block_table: (0..blocks as u32).collect(),
        logits,
        adapter: None,
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn check_logits_and_greedy(model: &str) {
    let refs = Tensors::open(&fixtures().join(model).join("reference.safetensors"));
    let mut engine = load(model);
    let mut cases = 0;
    for case in prompts(model) {
        let r = &case.reference;
        let n = case.ids.len();
        let media: Vec<ChunkMedia> = case
            .media
            .iter()
            .map(|(start, inp)| ChunkMedia {
                chunk: 0,
                offset: *start,
                len: inp.tokens(),
                item_offset: 0,
                hash: pixel_hash(inp),
                input: Some(inp.clone()),
            })
            .collect();
        let logits = engine
            .forward_logits_media(
                &[chunk(case.ids.clone(), 0, LogitsWanted::All)],
                &media,
                &[],
            )
            .unwrap();
        let positions: Vec<usize> = serde_json::from_value(r["logits_positions"].clone()).unwrap();
        let want = refs.f32(&format!("prompt.{}.logits", case.id.trim_matches('"')));
        let cols = want.len() / positions.len();
        for (k, &p) in positions.iter().enumerate() {
            let d = max_rel_diff(&logits.row(p)[..cols], &want[k * cols..(k + 1) * cols]);
            assert!(
                d < 1e-4,
                "{model} prompt {}: logits at {p} differ by {d}",
                case.id
            );
        }
        // The top 16 over the whole vocabulary at the same positions.
        let top_vals = refs.f32(&format!("prompt.{}.topk_values", case.id.trim_matches('"')));
        let k = top_vals.len() / positions.len();
        for (j, &p) in positions.iter().enumerate() {
            let mut row: Vec<f32> = logits.row(p).to_vec();
            row.sort_by(|a, b| b.total_cmp(a));
            let d = max_rel_diff(&row[..k], &top_vals[j * k..(j + 1) * k]);
            assert!(
                d < 1e-4,
                "{model} prompt {}: top-{k} at {p} differ by {d}",
                case.id
            );
        }

        // Greedy decoding, each token at its sequence index plus the prompt's M-RoPE delta.
        let delta: i64 = case.media.iter().map(|(_, m)| item_delta(m)).sum();
        let want: Vec<u32> = serde_json::from_value(r["greedy_tokens"].clone()).unwrap();
        let mut got = vec![argmax(logits.row(n - 1))];
        while got.len() < want.len() {
            let pos = n + got.len() - 1;
            let step = chunk(vec![*got.last().unwrap()], pos, LogitsWanted::Last);
            let l = engine.forward_logits_media(&[step], &[], &[delta]).unwrap();
            got.push(argmax(l.row(0)));
        }
        assert_eq!(got, want, "{model} prompt {}: greedy tokens", case.id);
        cases += 1;
    }
    assert!(cases >= 3, "{model}: {cases} prompts checked");
}

#[test]
fn qwen2_5_vl_prompt_logits_and_greedy_tokens_match_hf() {
    check_logits_and_greedy("qwen2_5_vl");
}

#[test]
fn qwen2_vl_prompt_logits_and_greedy_tokens_match_hf() {
    check_logits_and_greedy("qwen2_vl");
}
