//! Images in a Gemma 4 step: what the language model does differently at an image's soft
//! tokens (transformers' `Gemma4Model.forward`), and what lmi refuses.

use super::InputEmbeds;
use crate::backend::{Backend, Feature};
use crate::batch::BatchLayout;
use crate::error::{EngineError, Result};
use lmi_checkpoint::config::ModelConfig;

/// Checks that this model takes images here, and where its config sets
/// `use_bidirectional_attention` "vision" (gemma-4-26B-A4B, 31B; transformers'
/// `create_masks_for_vision_model`) gives each token of the step the last position its query
/// sees in the sliding layers: an image's soft tokens see every soft token of their image
/// (the window still counted back from their own position), the rest only up to themselves.
/// The global layers stay causal. A step must then hold an image's tokens up to its last (the
/// scheduler never cuts one; its first tokens may come from a prefix-cache hit, their K/V
/// computed with the whole image; a direct caller's cut is refused).
pub(super) fn check<B: Backend>(
    c: &ModelConfig,
    backend: &B,
    e: &InputEmbeds,
    layout: &BatchLayout,
) -> Result<Option<Vec<u32>>> {
    let g = c.vision.as_ref().and_then(|v| v.gemma4.as_ref());
    match g {
        None => Err(EngineError::Batch(
            "this Gemma 4 model has no vision tower: it takes no images".into(),
        )),
        Some(g) if g.bidirectional_images => {
            if !backend.supports(Feature::BidirectionalImages) {
                return Err(EngineError::Batch(format!(
                    "images are not served for this Gemma 4 model on {} yet: its config sets \
                     use_bidirectional_attention (an image's tokens attend to each other both \
                     ways in the sliding layers); use --device cpu, or an E2B/E4B model",
                    backend.name()
                )));
            }
            let mut through = layout.positions.clone();
            for run in &e.runs {
                if !run.to_end {
                    return Err(EngineError::Batch(
                        "an image of this Gemma 4 model must be computed in one step (its \
                         tokens attend to each other both ways): this step's chunk cuts it"
                            .into(),
                    ));
                }
                let rows = &e.rows[run.rows.clone()];
                if let Some(&last) = rows.last() {
                    let end = layout.positions[last as usize];
                    for &r in rows {
                        through[r as usize] = end;
                    }
                }
            }
            Ok(Some(through))
        }
        Some(_) => Ok(None),
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
