//! Vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the vision tower that turns an image's or a
//! video's patches into language-model embeddings, the encoder cache that keeps them, and
//! M-RoPE, the three-component positions (time, height, width) the language model rotates by.
//!
//! The backend runs the tower (the CPU on the host weights in f32, the GPU on its upload);
//! its embeddings replace the placeholder tokens' embeddings in the prefill step that
//! computes them (`engine/media.rs`, [`crate::model::Model::forward`]'s `inputs`).

pub mod cache;
pub mod gemma4;
pub mod mrope;
pub mod qwen3;
pub mod tower;
pub mod window;

pub use cache::EncoderCache;
pub use lmi_checkpoint::config::vision::{VisionAct, VisionConfig, VisionVariant};
pub use tower::VisionTower;

/// What a media item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    Image,
    Video,
}

/// A media item as the processor made it: patches ready for the vision tower.
#[derive(Clone, PartialEq)]
pub struct VisionInput {
    pub kind: MediaKind,
    /// Grid of patches: frames / temporal patch size, rows, columns.
    pub grid_thw: [usize; 3],
    /// `[t·h·w, channels · temporal patch · patch · patch]`, patches in the processor's order
    /// (each group of `merge²` consecutive patches becomes one token).
    pub pixels: Vec<f32>,
    /// Patches per side merged into one token (2).
    pub merge_size: usize,
    /// M-RoPE temporal positions per grid step: 1 for an image and for Qwen2-VL video;
    /// seconds per grid step × the model's tokens per second for Qwen2.5-VL video.
    pub t_scale: f32,
}

/// Without the patches' values (thousands of them).
impl std::fmt::Debug for VisionInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisionInput")
            .field("kind", &self.kind)
            .field("grid_thw", &self.grid_thw)
            .field("pixels", &format_args!("[{} values]", self.pixels.len()))
            .field("merge_size", &self.merge_size)
            .field("t_scale", &self.t_scale)
            .finish()
    }
}

impl VisionInput {
    /// Tokens the item takes in the language model's sequence.
    pub fn tokens(&self) -> usize {
        let [t, h, w] = self.grid_thw;
        t * h * w / (self.merge_size * self.merge_size).max(1)
    }

    /// The token grid (time, rows, columns) after merging.
    pub fn token_grid(&self) -> [usize; 3] {
        let m = self.merge_size.max(1);
        [self.grid_thw[0], self.grid_thw[1] / m, self.grid_thw[2] / m]
    }

    /// M-RoPE positions the item spans: the text after it continues from the item's start
    /// plus this (its largest position plus one).
    pub fn rope_extent(&self) -> usize {
        let [t, h, w] = self.token_grid();
        let t_last = mrope::temporal_offset(t.saturating_sub(1), self.t_scale);
        (t_last as usize)
            .max(h.saturating_sub(1))
            .max(w.saturating_sub(1))
            + 1
    }
}
