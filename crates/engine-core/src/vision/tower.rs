//! A Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision transformer's weights on the host, in f32 (patch
//! embedding, Qwen3-VL's learned position table, blocks, the 2x2 patch merger and Qwen3-VL's
//! DeepStack mergers), and its geometry: which patches attend together (frames, Qwen2.5-VL's
//! windows) and what an item costs. Backends run it
//! ([`Backend::encode_vision`](crate::backend::Backend::encode_vision)): the CPU on these
//! host weights, the GPU on its upload of them.

use lmi_checkpoint::DType;
use lmi_checkpoint::config::vision::{VisionAct, VisionConfig, VisionVariant};
use lmi_checkpoint::weights::WeightSource;

use super::VisionInput;
use super::window::{frame_segments, window_index};
use crate::error::{EngineError, Result};

pub const NORM_EPS: f32 = 1e-6;

/// A norm: RMSNorm (Qwen2.5-VL) or LayerNorm with a bias (Qwen2-VL, Qwen3-VL).
pub struct Norm {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

pub struct Linear {
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
    pub n: usize,
    pub k: usize,
}

pub enum Mlp {
    /// `down(silu(gate(x)) · up(x))`
    SwiGlu {
        gate: Linear,
        up: Linear,
        down: Linear,
    },
    /// `fc2(quick_gelu(fc1(x)))`
    QuickGelu { fc1: Linear, fc2: Linear },
    /// `fc2(gelu(fc1(x)))`, GELU as `act` says (Qwen3-VL: tanh).
    Gelu {
        fc1: Linear,
        fc2: Linear,
        act: VisionAct,
    },
}

/// A patch merger: `fc2(gelu(fc1(x)))` over each token's `merge²` patches side by side, after
/// `norm` — over each patch (the main merger: `norm` is `hidden` wide) or over the merged row
/// (Qwen3-VL's DeepStack mergers: `merge² · hidden` wide).
pub struct Merger {
    pub norm: Norm,
    pub fc1: Linear,
    pub fc2: Linear,
}

pub struct Block {
    pub norm1: Norm,
    pub norm2: Norm,
    pub qkv: Linear,
    pub proj: Linear,
    pub mlp: Mlp,
}

pub struct VisionTower {
    cfg: VisionConfig,
    pub patch_embed: Linear,
    /// Qwen3-VL: the learned position table, `[num_position_embeddings, hidden]`, resampled
    /// to each item's grid ([`super::qwen3::position_taps`]) and added after the patch
    /// embedding.
    pub pos_embed: Option<Vec<f32>>,
    pub blocks: Vec<Block>,
    pub merger: Merger,
    /// Qwen3-VL: one merger per `deepstack_visual_indexes` entry, run on that block's output.
    pub deepstack: Vec<Merger>,
    /// Gemma 4's tower: its weights are all here (the fields above stay empty).
    pub gemma4: Option<Box<super::gemma4::Gemma4Tower>>,
}

impl VisionTower {
    /// A tower from its parts.
    pub(super) fn assemble(
        cfg: &VisionConfig,
        patch_embed: Linear,
        blocks: Vec<Block>,
        merger: Merger,
        deepstack: Vec<Merger>,
        pos_embed: Option<Vec<f32>>,
    ) -> Self {
        VisionTower {
            cfg: cfg.clone(),
            patch_embed,
            pos_embed,
            blocks,
            merger,
            deepstack,
            gemma4: None,
        }
    }

    /// Loads the tower's weights (`visual.*`, or `model.visual.*` as newer transformers save).
    pub fn load(cfg: &VisionConfig, st: &WeightSource) -> Result<Self> {
        if cfg.variant == VisionVariant::Gemma4 {
            let empty = || Linear {
                w: Vec::new(),
                b: None,
                n: 0,
                k: 0,
            };
            let merger = Merger {
                norm: Norm {
                    weight: Vec::new(),
                    bias: None,
                },
                fc1: empty(),
                fc2: empty(),
            };
            let mut t = Self::assemble(cfg, empty(), Vec::new(), merger, Vec::new(), None);
            t.gemma4 = Some(Box::new(super::gemma4::Gemma4Tower::load(cfg, st)?));
            return Ok(t);
        }
        let prefix = if st.contains("visual.patch_embed.proj.weight") {
            "visual"
        } else {
            "model.visual"
        };
        if cfg.variant == VisionVariant::Qwen3Vl {
            return super::qwen3::load(cfg, st, prefix);
        }
        let t = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            Ok(st
                .load(&format!("{prefix}.{name}"), shape, DType::F32)?
                .to_f32_vec())
        };
        let lin = |name: &str, n: usize, k: usize, bias: bool| -> Result<Linear> {
            Ok(Linear {
                w: t(&format!("{name}.weight"), &[n, k])?,
                b: if bias {
                    Some(t(&format!("{name}.bias"), &[n])?)
                } else {
                    None
                },
                n,
                k,
            })
        };
        let h = cfg.hidden_size;
        let layer_norm = cfg.variant == VisionVariant::Qwen2Vl;
        let norm = |name: &str, len: usize| -> Result<Norm> {
            Ok(Norm {
                weight: t(&format!("{name}.weight"), &[len])?,
                bias: if layer_norm {
                    Some(t(&format!("{name}.bias"), &[len])?)
                } else {
                    None
                },
            })
        };
        let (c, tp, p) = (cfg.in_chans, cfg.temporal_patch_size, cfg.patch_size);
        let patch_embed = Linear {
            w: t("patch_embed.proj.weight", &[h, c, tp, p, p])?,
            b: None,
            n: h,
            k: cfg.patch_dim(),
        };
        let mut blocks = Vec::with_capacity(cfg.depth);
        for i in 0..cfg.depth {
            let b = format!("blocks.{i}");
            let inter = cfg.intermediate_size;
            let mlp = match cfg.variant {
                VisionVariant::Qwen25Vl => Mlp::SwiGlu {
                    gate: lin(&format!("{b}.mlp.gate_proj"), inter, h, true)?,
                    up: lin(&format!("{b}.mlp.up_proj"), inter, h, true)?,
                    down: lin(&format!("{b}.mlp.down_proj"), h, inter, true)?,
                },
                VisionVariant::Qwen2Vl | VisionVariant::Qwen3Vl | VisionVariant::Gemma4 => {
                    Mlp::QuickGelu {
                        fc1: lin(&format!("{b}.mlp.fc1"), inter, h, true)?,
                        fc2: lin(&format!("{b}.mlp.fc2"), h, inter, true)?,
                    }
                }
            };
            blocks.push(Block {
                norm1: norm(&format!("{b}.norm1"), h)?,
                norm2: norm(&format!("{b}.norm2"), h)?,
                qkv: lin(&format!("{b}.attn.qkv"), 3 * h, h, true)?,
                proj: lin(&format!("{b}.attn.proj"), h, h, true)?,
                mlp,
            });
        }
        let wide = h * cfg.merge_unit();
        let merger = Merger {
            norm: norm("merger.ln_q", h)?,
            fc1: lin("merger.mlp.0", wide, wide, true)?,
            fc2: lin("merger.mlp.2", cfg.out_hidden_size, wide, true)?,
        };
        Ok(Self::assemble(
            cfg,
            patch_embed,
            blocks,
            merger,
            Vec::new(),
            None,
        ))
    }

    /// A tower of `cfg`'s shape with deterministic random weights (benchmarks of full-size
    /// towers without their checkpoints).
    pub fn random(cfg: &VisionConfig, seed: u64) -> Self {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut values = |len: usize, scale: f32| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
                })
                .collect()
        };
        let mut lin = |n: usize, k: usize, bias: bool| Linear {
            w: values(n * k, 1.0 / (k as f32).sqrt()),
            b: bias.then(|| vec![0.0; n]),
            n,
            k,
        };
        let h = cfg.hidden_size;
        let layer_norm = cfg.variant != VisionVariant::Qwen25Vl;
        let norm = |len: usize| Norm {
            weight: vec![1.0; len],
            bias: layer_norm.then(|| vec![0.0; len]),
        };
        let qwen3 = cfg.variant == VisionVariant::Qwen3Vl;
        let patch_embed = lin(h, cfg.patch_dim(), qwen3);
        let inter = cfg.intermediate_size;
        let blocks = (0..cfg.depth)
            .map(|_| Block {
                norm1: norm(h),
                norm2: norm(h),
                qkv: lin(3 * h, h, true),
                proj: lin(h, h, true),
                mlp: match cfg.variant {
                    VisionVariant::Qwen25Vl => Mlp::SwiGlu {
                        gate: lin(inter, h, true),
                        up: lin(inter, h, true),
                        down: lin(h, inter, true),
                    },
                    VisionVariant::Qwen2Vl => Mlp::QuickGelu {
                        fc1: lin(inter, h, true),
                        fc2: lin(h, inter, true),
                    },
                    VisionVariant::Qwen3Vl | VisionVariant::Gemma4 => Mlp::Gelu {
                        fc1: lin(inter, h, true),
                        fc2: lin(h, inter, true),
                        act: cfg.act,
                    },
                },
            })
            .collect();
        let wide = h * cfg.merge_unit();
        let mut merger = |norm_len: usize| Merger {
            norm: norm(norm_len),
            fc1: lin(wide, wide, true),
            fc2: lin(cfg.out_hidden_size, wide, true),
        };
        let main = merger(h);
        let deepstack = cfg
            .deepstack_visual_indexes
            .iter()
            .map(|_| merger(wide))
            .collect();
        let pos_embed = qwen3.then(|| values(cfg.num_position_embeddings * h, 0.5));
        Self::assemble(cfg, patch_embed, blocks, main, deepstack, pos_embed)
    }

    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Multiply-adds of one item through the tower (the benchmark's FLOP count / 2): its
    /// matrix products and attention's two products per head.
    pub fn macs(&self, input: &VisionInput) -> u64 {
        let grid = input.grid_thw;
        if let Some(g) = &self.gemma4 {
            return g.macs(&self.cfg, grid.iter().product());
        }
        let n = (grid.iter().product::<usize>()) as u64;
        let (h, i) = (
            self.cfg.hidden_size as u64,
            self.cfg.intermediate_size as u64,
        );
        let mlp = match self.cfg.variant {
            VisionVariant::Qwen25Vl => 3 * h * i,
            VisionVariant::Qwen2Vl | VisionVariant::Qwen3Vl | VisionVariant::Gemma4 => 2 * h * i,
        };
        let wide = h * self.cfg.merge_unit() as u64;
        // q·kᵀ and p·v: 2 · len² · h per segment of `len` patches.
        let attn = |bounds: &[usize]| -> u64 {
            bounds
                .windows(2)
                .map(|s| 2 * ((s[1] - s[0]) as u64).pow(2) * h)
                .sum()
        };
        let full = attn(&frame_segments(grid));
        let windowed = self.windows(grid).map(|(_, b)| attn(&b));
        let attention: u64 = (0..self.blocks.len())
            .map(|l| match windowed {
                Some(w) if !self.cfg.fullatt_block_indexes.contains(&l) => w,
                _ => full,
            })
            .sum();
        n * self.cfg.patch_dim() as u64 * h
            + self.blocks.len() as u64 * n * (4 * h * h + mlp)
            + attention
            + (1 + self.deepstack.len() as u64) * n / self.cfg.merge_unit() as u64
                * (wide * wide + wide * self.cfg.out_hidden_size as u64)
    }

    /// Qwen2.5-VL's attention windows over a grid: the merge units' order (each window's
    /// together) and the windows' bounds in patches; None for a tower without windows.
    pub fn windows(&self, grid: [usize; 3]) -> Option<(Vec<usize>, Vec<usize>)> {
        let cfg = &self.cfg;
        let m = cfg.spatial_merge_size;
        (cfg.variant == VisionVariant::Qwen25Vl && cfg.window_size > 0).then(|| {
            let side = (cfg.window_size / m / cfg.patch_size).max(1);
            window_index(grid, m, side)
        })
    }

    /// Checks an item's patches against the tower (their count, grid and merge size).
    pub fn check_input(&self, input: &VisionInput) -> Result<()> {
        let cfg = &self.cfg;
        let m = cfg.spatial_merge_size;
        let grid = input.grid_thw;
        let n: usize = grid.iter().product();
        if input.merge_size != m
            || !grid[1].is_multiple_of(m)
            || !grid[2].is_multiple_of(m)
            || input.pixels.len() != n * cfg.patch_dim()
        {
            return Err(EngineError::Batch(format!(
                "a media item's patches ({} values, grid {grid:?}, merge {}) do not fit the vision tower (patch size {} values, merge {m})",
                input.pixels.len(),
                input.merge_size,
                cfg.patch_dim()
            )));
        }
        Ok(())
    }
}

/// Reorders groups of `width` values: group `k` of the result is group `order[k]` of `x`.
/// The merger's output rows (`width` each) back in the placeholders' order from the window
/// order `order` (unchanged without windows).
pub fn unwindow(out: Vec<f32>, order: Option<&[usize]>, width: usize) -> Vec<f32> {
    let Some(order) = order else { return out };
    let mut back = vec![0f32; out.len()];
    for (k, &orig) in order.iter().enumerate() {
        back[orig * width..(orig + 1) * width].copy_from_slice(&out[k * width..(k + 1) * width]);
    }
    back
}

pub fn permute_units<T: Copy>(x: &[T], order: &[usize], width: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for &o in order {
        out.extend_from_slice(&x[o * width..(o + 1) * width]);
    }
    out
}
