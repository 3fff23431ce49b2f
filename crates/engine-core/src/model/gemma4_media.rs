//! Images in a Gemma 4 step: what the language model does differently at an image's soft
//! tokens (transformers' `Gemma4Model.forward`), and what lmi refuses.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use lmi_checkpoint::config::ModelConfig;

/// Refuses images where the language model would attend differently than lmi does: with
/// `use_bidirectional_attention` "vision" (gemma-4-26B-A4B, 31B), an image's soft tokens
/// attend to each other both ways in the sliding layers; lmi's attention is causal, so each
/// would see only the ones before it.
pub(super) fn check(c: &ModelConfig) -> Result<()> {
    let g = c.vision.as_ref().and_then(|v| v.gemma4.as_ref());
    match g {
        None => Err(EngineError::Batch(
            "this Gemma 4 model has no vision tower: it takes no images".into(),
        )),
        Some(g) if g.bidirectional_images => Err(EngineError::Batch(
            "images are not served for this Gemma 4 model yet: its config sets \
             use_bidirectional_attention (an image's tokens attend to each other both ways in \
             the sliding layers), which lmi's causal attention does not do; the E2B and E4B \
             models (causal) take images"
                .into(),
        )),
        Some(_) => Ok(()),
    }
}

/// The per-layer table's rows at an image's soft tokens: the pad token's row (`media_row`),
/// as transformers looks up `pad_token_id` in place of the image token.
pub(super) fn pad_rows<B: Backend>(
    backend: &B,
    tok: &mut B::Buf,
    width: usize,
    e: &super::InputEmbeds,
    media_row: Option<&[f32]>,
) -> Result<()> {
    let row = media_row.ok_or_else(|| {
        EngineError::Backend("Gemma 4's per-layer table has no pad row for images".into())
    })?;
    let data = row.repeat(e.rows.len());
    backend.write_rows(tok, width, &e.rows, &data)
}
