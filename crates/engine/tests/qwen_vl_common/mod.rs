//! Shared by the Qwen-VL tests (CPU and CUDA): the fixture (tests/fixtures/qwen_vl, written
//! by its generate.py with HF transformers), its prompts with their media made into patches
//! by `lmi_media`, and comparisons.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmi_engine::engine::{EngineOptions, Logits};
use lmi_engine::vision::mrope::item_delta;
use lmi_engine::vision::{MediaKind, VisionInput};
use lmi_engine::{ChunkMedia, DType, Engine, LogitsWanted, SeqChunk};
use safetensors::SafeTensors;
use serde_json::Value;

/// The fixture directory: in the source tree this binary was built from, else (a test binary
/// carried to a GPU machine, tests/gpu/run.sh) under the working directory, the repository.
pub fn fixtures() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen_vl");
    if built.is_dir() {
        built
    } else {
        PathBuf::from("tests/fixtures/qwen_vl")
    }
}

pub struct Tensors(Vec<u8>);

impl Tensors {
    pub fn open(path: &Path) -> Self {
        Tensors(std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }
    pub fn get(&self, name: &str) -> Option<Vec<f32>> {
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
    pub fn f32(&self, name: &str) -> Vec<f32> {
        self.get(name).unwrap_or_else(|| panic!("no tensor {name}"))
    }
}

pub fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// An image's or the video's patches, made from the media files by `lmi_media` (whose own
/// tests compare it with the HF processor; here the stored `pixel_values` are checked too).
pub fn input(
    pre: &Tensors,
    prep: &Value,
    kind: &str,
    name: &str,
    t_scale: f32,
) -> Option<VisionInput> {
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
pub fn pixel_hash(inp: &VisionInput) -> u128 {
    let bytes: Vec<u8> = inp.pixels.iter().flat_map(|v| v.to_le_bytes()).collect();
    lmi_media::content_hash(&bytes)
}

pub fn max_rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

pub fn options(dtype: DType) -> EngineOptions {
    EngineOptions {
        dtype: Some(dtype),
        kv_blocks: Some(64),
        ..Default::default()
    }
}

/// The CPU engine in f32.
pub fn load(model: &str) -> Engine<lmi_engine::cpu::CpuBackend> {
    lmi_engine::load_cpu(&fixtures().join(model), &options(DType::F32)).unwrap()
}

/// Qwen2.5-VL video: temporal positions per grid step (seconds per step x tokens per second).
pub fn video_t_scale(reference: &Value, prompt: &Value) -> f32 {
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

/// One prompt of the fixture: its token ids, and its media runs with their patches.
pub struct PromptCase {
    pub id: String,
    pub ids: Vec<u32>,
    pub media: Vec<(usize, Arc<VisionInput>)>,
    pub reference: Value,
}

impl PromptCase {
    /// How much the prompt's items shift the M-RoPE positions of the tokens after them.
    pub fn delta(&self) -> i64 {
        self.media.iter().map(|(_, m)| item_delta(m)).sum()
    }

    /// HF's 16 greedy tokens.
    pub fn greedy(&self) -> Vec<u32> {
        serde_json::from_value(self.reference["greedy_tokens"].clone()).unwrap()
    }

    /// The reference's logits positions and its logits there (their first columns).
    fn reference_logits(&self, refs: &Tensors) -> (Vec<usize>, Vec<f32>) {
        let positions = serde_json::from_value(self.reference["logits_positions"].clone()).unwrap();
        let id = self.id.trim_matches('"');
        (positions, refs.f32(&format!("prompt.{id}.logits")))
    }

    /// The prompt's logits (every row) at the reference's positions against HF's: the
    /// position that differs most, and by how much relative to HF's largest value there.
    pub fn worst_logits(&self, logits: &Logits, refs: &Tensors) -> (usize, f32) {
        let (positions, want) = self.reference_logits(refs);
        let cols = want.len() / positions.len();
        positions
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                let d = max_rel_diff(&logits.row(p)[..cols], &want[k * cols..(k + 1) * cols]);
                (p, d)
            })
            .fold((0, 0f32), |a, b| if b.1 > a.1 { b } else { a })
    }

    /// The same for the top 16 logits over the whole vocabulary.
    pub fn worst_top_logits(&self, logits: &Logits, refs: &Tensors) -> (usize, f32) {
        let (positions, _) = self.reference_logits(refs);
        let id = self.id.trim_matches('"');
        let top = refs.f32(&format!("prompt.{id}.topk_values"));
        let k = top.len() / positions.len();
        positions
            .iter()
            .enumerate()
            .map(|(j, &p)| {
                let mut row: Vec<f32> = logits.row(p).to_vec();
                row.sort_by(|a, b| b.total_cmp(a));
                (p, max_rel_diff(&row[..k], &top[j * k..(j + 1) * k]))
            })
            .fold((0, 0f32), |a, b| if b.1 > a.1 { b } else { a })
    }
}

pub fn prompts(model: &str) -> Vec<PromptCase> {
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

pub fn media_files(messages: &Value) -> Vec<String> {
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

pub fn chunk(tokens: Vec<u32>, start_pos: usize, logits: LogitsWanted) -> SeqChunk {
    let blocks = (start_pos + tokens.len()).div_ceil(16);
    SeqChunk {
        tokens,
        start_pos,
        block_table: (0..blocks as u32).collect(),
        window_table: Vec::new(),
        logits,
        adapter: None,
    }
}

pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// A case's media runs as one chunk's (chunk 0, from its first token).
pub fn chunk_media(case: &PromptCase) -> Vec<ChunkMedia> {
    case.media
        .iter()
        .map(|(start, inp)| ChunkMedia {
            chunk: 0,
            offset: *start,
            len: inp.tokens(),
            item_offset: 0,
            hash: pixel_hash(inp),
            input: Some(inp.clone()),
        })
        .collect()
}
