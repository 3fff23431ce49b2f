//! What Qwen3-VL's tower (and Qwen3.5's, the same without DeepStack) adds to Qwen2-VL's:
//! its weights' names (`linear_fc1`/`linear_fc2` MLPs, `merger.norm`, the DeepStack mergers,
//! the learned position table `pos_embed`) and the bilinear resampling of that square table to
//! each item's grid (transformers' `get_vision_interpolation_indices_and_weights` with
//! `align_corners=True`).

use lmi_checkpoint::DType;
use lmi_checkpoint::config::vision::VisionConfig;
use lmi_checkpoint::weights::WeightSource;

use super::tower::{Block, Linear, Merger, Mlp, Norm, VisionTower};
use crate::error::Result;

/// Loads a Qwen3-VL / Qwen3.5 tower under `prefix` (`model.visual` as transformers 5 and the
/// Hub's checkpoints name it).
pub(super) fn load(cfg: &VisionConfig, st: &WeightSource, prefix: &str) -> Result<VisionTower> {
    let t = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        Ok(st
            .load(&format!("{prefix}.{name}"), shape, DType::F32)?
            .to_f32_vec())
    };
    let lin = |name: &str, n: usize, k: usize| -> Result<Linear> {
        Ok(Linear {
            w: t(&format!("{name}.weight"), &[n, k])?,
            b: Some(t(&format!("{name}.bias"), &[n])?),
            n,
            k,
        })
    };
    // Every norm of this tower is a LayerNorm with a bias.
    let norm = |name: &str, len: usize| -> Result<Norm> {
        Ok(Norm {
            weight: t(&format!("{name}.weight"), &[len])?,
            bias: Some(t(&format!("{name}.bias"), &[len])?),
        })
    };
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (c, tp, p) = (cfg.in_chans, cfg.temporal_patch_size, cfg.patch_size);
    let patch_embed = Linear {
        w: t("patch_embed.proj.weight", &[h, c, tp, p, p])?,
        b: Some(t("patch_embed.proj.bias", &[h])?),
        n: h,
        k: cfg.patch_dim(),
    };
    let blocks = (0..cfg.depth)
        .map(|i| {
            let b = format!("blocks.{i}");
            Ok(Block {
                norm1: norm(&format!("{b}.norm1"), h)?,
                norm2: norm(&format!("{b}.norm2"), h)?,
                qkv: lin(&format!("{b}.attn.qkv"), 3 * h, h)?,
                proj: lin(&format!("{b}.attn.proj"), h, h)?,
                mlp: Mlp::Gelu {
                    fc1: lin(&format!("{b}.mlp.linear_fc1"), inter, h)?,
                    fc2: lin(&format!("{b}.mlp.linear_fc2"), h, inter)?,
                    act: cfg.act,
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let wide = h * cfg.merge_unit();
    let merger = |name: &str, norm_len: usize| -> Result<Merger> {
        Ok(Merger {
            norm: norm(&format!("{name}.norm"), norm_len)?,
            fc1: lin(&format!("{name}.linear_fc1"), wide, wide)?,
            fc2: lin(&format!("{name}.linear_fc2"), cfg.out_hidden_size, wide)?,
        })
    };
    let main = merger("merger", h)?;
    // The DeepStack mergers normalize the merged (4·hidden) rows, the main one each patch.
    let deepstack = (0..cfg.deepstack_visual_indexes.len())
        .map(|j| merger(&format!("deepstack_merger_list.{j}"), wide))
        .collect::<Result<Vec<_>>>()?;
    Ok(VisionTower::assemble(
        cfg,
        patch_embed,
        blocks,
        main,
        deepstack,
        Some(t("pos_embed.weight", &[cfg.num_position_embeddings, h])?),
    ))
}

/// One patch's learned position embedding: the table rows of its four bilinear taps and their
/// weights, (top-left, top-right, bottom-left, bottom-right) as transformers orders them.
pub type Taps = [(u32, f32); 4];

/// The taps of every patch of `grid` in the processor's patch order (merge windows of
/// `m × m`, raster order inside, frame after frame), from a `side × side` table. As
/// transformers computes them in f32: the source coordinate `index · (side − 1) / (size − 1)`
/// (align_corners), its floor and the next row/column (clamped to the table), weights
/// `1 − distance` (clamped at 0), the 2D weight the product of the two axes'.
pub fn position_taps(grid: [usize; 3], m: usize, side: usize) -> Vec<Taps> {
    let [t, h, w] = grid;
    let axis = |index: usize, size: usize| -> [(usize, f32); 2] {
        let src = (index as f32 * (side - 1) as f32) / (size.max(2) - 1) as f32;
        let floor = src.floor();
        let base = floor as usize;
        std::array::from_fn(|o| {
            let tap = (base + o).min(side - 1);
            let weight = (1.0 - (src - floor - o as f32).abs()).max(0.0);
            (tap, weight)
        })
    };
    let mut out = Vec::with_capacity(t * h * w);
    for _ in 0..t {
        for (r, c) in super::window::patch_rows_cols([1, h, w], m) {
            let (rows, cols) = (axis(r as usize, h), axis(c as usize, w));
            out.push(std::array::from_fn(|k| {
                let ((tr, wr), (tc, wc)) = (rows[k / 2], cols[k % 2]);
                ((tr * side + tc) as u32, wr * wc)
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::position_taps;

    #[test]
    fn corners_take_the_table_corners_and_weights_sum_to_one() {
        // A 4x6 grid over a 3x3 table: the first patch is the table's top-left row, the last
        // patch of the grid (row 3, column 5) its bottom-right.
        let taps = position_taps([1, 4, 6], 2, 3);
        assert_eq!(taps.len(), 24);
        assert_eq!(taps[0][0], (0, 1.0));
        let last = taps
            .iter()
            .flat_map(|t| t.iter())
            .filter(|(i, w)| *i == 8 && *w == 1.0)
            .count();
        assert_eq!(last, 1);
        for t in &taps {
            let s: f32 = t.iter().map(|(_, w)| w).sum();
            assert!((s - 1.0).abs() < 1e-6, "{t:?}");
        }
    }
}
