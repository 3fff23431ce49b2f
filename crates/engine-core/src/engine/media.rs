//! What a step of a vision-language model adds before its forward pass: every token's M-RoPE
//! position, and the encoder embeddings of the media runs it computes (from the encoder
//! cache, or the vision tower on a miss).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batch::{BatchLayout, ChunkMedia, SeqChunk};
use crate::error::{EngineError, Result};
use crate::model::InputEmbeds;
use crate::vision::mrope::{RunAt, chunk_positions};
use crate::vision::{EncoderCache, VisionInput};

/// What the encoder did in one step (metrics).
#[derive(Debug, Default, Clone, Copy)]
pub struct EncoderStats {
    pub items_encoded: u64,
    pub cache_hits: u64,
    pub time: Duration,
}

/// Runs the vision tower on one media item (on the backend or the host).
pub type Encode<'a> = &'a dyn Fn(&VisionInput) -> Result<Vec<f32>>;

/// Fills `layout.rope_positions` from the chunks, their media runs and their M-RoPE deltas.
/// `frame_items`: the model takes a video one temporal patch per item, each with its
/// timestamp text before it (Qwen3-VL, Qwen3.5), so an item of several is refused.
pub fn rope_positions(
    chunks: &[SeqChunk],
    media: &[ChunkMedia],
    deltas: &[i64],
    frame_items: bool,
    layout: &mut BatchLayout,
) -> Result<()> {
    let mut pos = Vec::with_capacity(3 * layout.num_tokens());
    for (k, c) in chunks.iter().enumerate() {
        let runs = media
            .iter()
            .filter(|m| m.chunk == k)
            .map(|m| {
                let input = m.input.as_deref().ok_or_else(no_patches)?;
                if frame_items && input.grid_thw[0] != 1 {
                    return Err(EngineError::Batch(format!(
                        "this model takes a video one temporal patch at a time (grid {:?} has {}): \
                         each frame pair is an item of its own, after its timestamp text",
                        input.grid_thw, input.grid_thw[0]
                    )));
                }
                Ok(RunAt {
                    offset: m.offset,
                    len: m.len,
                    item_offset: m.item_offset,
                    input,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let delta = deltas.get(k).copied().unwrap_or(0);
        chunk_positions(c.start_pos, c.tokens.len(), delta, &runs, &mut pos);
    }
    layout.rope_positions = pos;
    Ok(())
}

/// The embeddings of the step's media runs, at their rows of the step; `encode` runs the
/// vision tower (None: the model has none). The tower gives `width` values per token: its
/// `hidden` embedding, then as many DeepStack features (Qwen3-VL) as `width` holds more.
pub fn media_embeds(
    encode: Option<Encode<'_>>,
    cache: &mut EncoderCache,
    media: &[ChunkMedia],
    layout: &BatchLayout,
    (hidden, width): (usize, usize),
    stats: &mut EncoderStats,
) -> Result<InputEmbeds> {
    let extra = (width / hidden.max(1)).saturating_sub(1);
    let mut e = InputEmbeds {
        deepstack: vec![Vec::new(); extra],
        ..Default::default()
    };
    for m in media {
        let encode = encode.ok_or_else(|| {
            EngineError::Batch("this model has no vision tower: it takes no media items".into())
        })?;
        let emb = match cache.get(m.hash) {
            Some(x) => {
                stats.cache_hits += 1;
                x
            }
            None => {
                let input = m.input.as_deref().ok_or_else(no_patches)?;
                let t = Instant::now();
                let x = Arc::new(encode(input)?);
                stats.time += t.elapsed();
                stats.items_encoded += 1;
                cache.insert(m.hash, x.clone());
                x
            }
        };
        let (from, to) = (m.item_offset * width, (m.item_offset + m.len) * width);
        if emb.len() < to {
            return Err(EngineError::Batch(format!(
                "a media item of {} tokens has placeholders up to {}",
                emb.len() / width.max(1),
                m.item_offset + m.len
            )));
        }
        let first = layout.cu_tokens[m.chunk] as usize + m.offset;
        e.runs.push(crate::model::MediaRun {
            rows: e.rows.len()..e.rows.len() + m.len,
            to_end: to == emb.len(),
        });
        e.rows.extend((first..first + m.len).map(|r| r as u32));
        for row in emb[from..to].chunks(width) {
            e.data.extend_from_slice(&row[..hidden]);
            for (d, f) in e.deepstack.iter_mut().enumerate() {
                f.extend_from_slice(&row[(d + 1) * hidden..(d + 2) * hidden]);
            }
        }
    }
    Ok(e)
}

fn no_patches() -> EngineError {
    EngineError::Batch("a media item reached the engine without its patches".into())
}
