//! Mixture-of-experts layers on the device (kernels/moe.cu): router, routing, the step's
//! assignments sorted by expert, two grouped products over tiles of one expert's rows, and
//! the weighted sum: six launches per layer whatever the batch, none per expert (six more and
//! an add for a shared expert). The products
//! run on tensor cores (kernels/moe_wmma.cu, tiles of 16 rows) where the layer's hidden size
//! and expert width are multiples of 16, else on CUDA cores (tiles of 8): decided per layer at
//! load, so a row's result never depends on the step it is in.
//!
//! The experts stay where `upload_weight` put them (one allocation per matrix, bf16); a
//! device table per layer ([`CudaExperts`], built at load) gives the kernels their addresses.
//! Every launch's shape depends on the step's row count and the layer's shape only (the tile
//! list has a fixed length, unused tiles return at once), so decode steps replay from CUDA
//! graphs; which experts a step wakes is read from device memory.
//!
//! A shared expert (Qwen2-MoE) runs the same launches as a layer of one expert that every row
//! picks, weighted by the sigmoid of its gate's logit (DeepSeek's ungated `shared_experts`:
//! weight 1, through a zero router), into a buffer added to the routed sum afterwards
//! (transformers' order): batch invariant and graph-replayable like the rest.
//!
//! DeepSeek-style routing (GLM-4.5, MiniMax-M2: sigmoid scores, the correction bias, the
//! group limit, routed scaling) is `moe_route_sigmoid` in place of `moe_route`.

use lmi_cuda::{DevPtr, Device, DeviceExt, ElemType, LaunchConfig};
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::moe::{ExpertActivation, MoeLayer, Routing};

use super::backend::{CudaBackend, CudaBuf, CudaWeight, rows_cols};
use super::memory::{DeviceBox, cuda_err};

pub const KERNELS: &[&str] = &[
    "moe_router_f32",
    "moe_router_bf16",
    "moe_route",
    "moe_route_sigmoid",
    "moe_sort",
    "moe_gate_up_f32",
    "moe_gate_up_bf16",
    "moe_down",
    "moe_gate_up_wmma_f32",
    "moe_gate_up_wmma_bf16",
    "moe_down_wmma",
    "moe_combine",
];

/// kernels/moe.cu's limits and shapes (`MOE_*`).
const MAX_EXPERTS: usize = 1024;
const MAX_GROUPS: usize = 32;
const MAX_TOP_K: usize = 32;
const TILE: usize = 8;
const THREADS: u32 = 256;
const BLOCK_COLS: usize = 16;
/// kernels/moe_wmma.cu's (`MOE_WTILE`, `MOE_W_THREADS`, `MOE_W_COLS`).
const WMMA_TILE: usize = 16;
const WMMA_THREADS: u32 = 128;
const WMMA_COLS: usize = 64;
/// A `MoeTile`'s words.
const TILE_WORDS: usize = 4;

/// A layer's experts as kernels/moe.cu's `MoeExpert` table: four addresses per expert
/// (gate_up, down, gate_up bias, down bias; 0 where there is none), and which kernels run its
/// products; its shared expert's likewise, as a table of one, with a zero `[1, hidden]` router
/// where the shared expert has no gate (DeepSeek's: weight 1, `MOE_ONE`).
pub struct CudaExperts<D: Device> {
    table: DeviceBox<D>,
    tensor_cores: bool,
    shared: Option<(DeviceBox<D>, bool, Option<DeviceBox<D>>)>,
}

impl<D: Device> CudaExperts<D> {
    /// Whether the layer's products run on tensor cores (kernels/moe_wmma.cu).
    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }
}

fn refuse(what: String) -> EngineError {
    EngineError::Backend(format!(
        "the CUDA backend cannot run this mixture of experts: {what}"
    ))
}

fn check_matrix<D: Device>(
    w: &CudaWeight<D>,
    shape: [usize; 2],
    dtype: ElemType,
    what: &str,
) -> Result<()> {
    if w.shape != shape || w.dtype != dtype {
        return Err(refuse(format!(
            "{what} is {:?} {:?}, expected {shape:?} {dtype:?}",
            w.shape, w.dtype
        )));
    }
    Ok(())
}

/// Checks a layer against what the kernels take and uploads its table.
pub(super) fn index<D: Device>(
    b: &CudaBackend<D>,
    layer: &MoeLayer<CudaWeight<D>>,
) -> Result<CudaExperts<D>> {
    let e = layer.experts.len();
    let (w, k) = (layer.width, layer.top_k);
    let h = layer.router.shape.get(1).copied().unwrap_or(0);
    if e == 0 || e > MAX_EXPERTS {
        return Err(refuse(format!("{e} experts (1 to {MAX_EXPERTS} run here)")));
    }
    if k == 0 || k > MAX_TOP_K.min(e) {
        return Err(refuse(format!(
            "{k} experts per token of {e} (at most {MAX_TOP_K})"
        )));
    }
    let sizes = |w: usize| {
        if !h.is_multiple_of(8) || !w.is_multiple_of(8) || h == 0 || w == 0 {
            return Err(refuse(format!(
                "hidden size {h} and expert width {w} must be multiples of 8"
            )));
        }
        Ok(h.is_multiple_of(16) && w.is_multiple_of(16))
    };
    let tensor_cores = sizes(w)?;
    check_matrix(&layer.router, [e, h], ElemType::F32, "the router")?;
    if let Routing::SigmoidGroupedTopK { n_group, .. } = layer.routing
        && (n_group == 0 || n_group > MAX_GROUPS || !e.is_multiple_of(n_group))
    {
        return Err(refuse(format!(
            "{n_group} expert groups of {e} experts (1 to {MAX_GROUPS} groups that divide them)"
        )));
    }
    let vector = |v: &Option<CudaWeight<D>>, len: usize, what: &str| -> Result<u64> {
        match v {
            None => Ok(0),
            Some(v) if v.shape == [len] && v.dtype == ElemType::F32 => Ok(v.ptr().0),
            Some(v) => Err(refuse(format!("{what} is {:?} {:?}", v.shape, v.dtype))),
        }
    };
    vector(&layer.router_bias, e, "the router's bias")?;
    vector(
        &layer.correction_bias,
        e,
        "the router's e_score_correction_bias",
    )?;
    let mut words = Vec::with_capacity(4 * e);
    for (i, x) in layer.experts.iter().enumerate() {
        check_matrix(
            &x.gate_up,
            [2 * w, h],
            ElemType::BF16,
            &format!("expert {i}'s gate_up"),
        )?;
        check_matrix(
            &x.down,
            [h, w],
            ElemType::BF16,
            &format!("expert {i}'s down"),
        )?;
        words.extend([
            x.gate_up.ptr().0,
            x.down.ptr().0,
            vector(&x.gate_up_bias, 2 * w, "a gate_up bias")?,
            vector(&x.down_bias, h, "a down bias")?,
        ]);
    }
    let upload = |words: &[u64]| -> Result<DeviceBox<D>> {
        let table = DeviceBox::new(&b.dev, words.len() * 8)?;
        b.dev.htod_slice(words, table.ptr()).map_err(cuda_err)?;
        Ok(table)
    };
    let shared = match &layer.shared {
        Some(s) => {
            let sw = s.width;
            let zero_router = match &s.gate {
                Some(gate) => {
                    check_matrix(gate, [1, h], ElemType::F32, "the shared expert's gate")?;
                    None
                }
                None => {
                    let z = DeviceBox::new(&b.dev, h * 4)?;
                    b.dev
                        .htod_slice(&vec![0f32; h], z.ptr())
                        .map_err(cuda_err)?;
                    Some(z)
                }
            };
            check_matrix(
                &s.gate_up,
                [2 * sw, h],
                ElemType::BF16,
                "the shared gate_up",
            )?;
            check_matrix(&s.down, [h, sw], ElemType::BF16, "the shared down")?;
            let tc = sizes(sw)?;
            Some((
                upload(&[s.gate_up.ptr().0, s.down.ptr().0, 0, 0])?,
                tc,
                zero_router,
            ))
        }
        None => None,
    };
    Ok(CudaExperts {
        table: upload(&words)?,
        tensor_cores,
        shared,
    })
}

/// An upper bound on the tiles of up to `tile` of `n` assignments over `experts` experts:
/// Σ_e ceil(count_e / tile) with at most min(experts, n) counts above zero.
fn max_tiles(n: usize, experts: usize, tile: usize) -> usize {
    (n + experts.min(n) * (tile - 1)).div_ceil(tile)
}

fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| EngineError::Backend(format!("{what} {v} is too large")))
}

/// `out[r] = Σ weight · expert(x[r])` over each row's routed experts, plus its shared
/// expert's (see the module).
pub(super) fn forward<D: Device>(
    b: &CudaBackend<D>,
    x: &CudaBuf,
    rows: usize,
    hidden: usize,
    layer: &MoeLayer<CudaWeight<D>>,
    experts: &CudaExperts<D>,
    out: &mut CudaBuf,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    if out.dtype != ElemType::F32 {
        return Err(EngineError::Backend(
            "a mixture's output must be f32".into(),
        ));
    }
    let (routing, sigmoid) = match layer.routing {
        Routing::SoftmaxTopK { renormalize: false } => (0, None),
        Routing::SoftmaxTopK { renormalize: true } => (1, None),
        Routing::TopKSoftmax => (2, None),
        Routing::SigmoidGroupedTopK {
            n_group,
            topk_group,
            renormalize,
            scaling,
        } => (
            0,
            Some(Sigmoid {
                n_group: n_group as u32,
                topk_group: topk_group as u32,
                renormalize: u32::from(renormalize),
                scaling,
                bias: layer
                    .correction_bias
                    .as_ref()
                    .map_or(DevPtr::NULL, |b| b.ptr()),
            }),
        ),
    };
    let routed = Group {
        router: layer.router.ptr(),
        sigmoid,
        router_bias: layer.router_bias.as_ref(),
        routing,
        table: &experts.table,
        tensor_cores: experts.tensor_cores,
        experts: layer.experts.len(),
        top_k: layer.top_k,
        width: layer.width,
        activation: layer.activation,
    };
    grouped(b, x, rows, hidden, &routed, out)?;
    let (Some(s), Some((table, tc, zero_router))) = (&layer.shared, &experts.shared) else {
        return Ok(());
    };
    let (router, routing) = match (&s.gate, zero_router) {
        (Some(gate), _) => (gate.ptr(), SIGMOID_GATE),
        (None, Some(z)) => (z.ptr(), ONE),
        (None, None) => return Err(refuse("a shared expert without its router".into())),
    };
    let shared = Group {
        router,
        sigmoid: None,
        router_bias: None,
        routing,
        table,
        tensor_cores: *tc,
        experts: 1,
        top_k: 1,
        width: s.width,
        activation: ExpertActivation::Silu,
    };
    let y = b.arena_alloc(rows * hidden, ElemType::F32)?;
    grouped(b, x, rows, hidden, &shared, &y)?;
    b.launch(
        "add_f32",
        super::backend::elementwise(rows * hidden),
        &[
            out.ptr.into(),
            y.ptr.into(),
            ((rows * hidden) as u64).into(),
        ],
    )
}

/// kernels/moe.cuh's `MOE_SIGMOID_GATE`: a shared expert's weight, σ(its gate's logit).
const SIGMOID_GATE: u32 = 3;
/// kernels/moe.cuh's `MOE_ONE`: an ungated shared expert's weight, 1.
const ONE: u32 = 4;

/// [`Routing::SigmoidGroupedTopK`] as kernels/moe.cu's `moe_route_sigmoid` takes it.
struct Sigmoid {
    n_group: u32,
    topk_group: u32,
    renormalize: u32,
    scaling: f32,
    /// The `[experts]` correction bias, or null.
    bias: DevPtr,
}

/// Experts that the grouped launches run: a layer's routed ones, or its shared expert as a
/// table of one that every row picks.
struct Group<'a, D: Device> {
    /// `[experts, hidden]` f32.
    router: DevPtr,
    /// DeepSeek-style routing (`moe_route_sigmoid`), else `routing`'s code (`moe_route`).
    sigmoid: Option<Sigmoid>,
    router_bias: Option<&'a CudaWeight<D>>,
    /// kernels/moe.cuh's routing code.
    routing: u32,
    table: &'a DeviceBox<D>,
    tensor_cores: bool,
    experts: usize,
    top_k: usize,
    width: usize,
    activation: ExpertActivation,
}

/// `out[r] = Σ weight · expert(x[r])` over the group's picks for each row: router, routing,
/// sort, the two grouped products, the weighted sum.
fn grouped<D: Device>(
    b: &CudaBackend<D>,
    x: &CudaBuf,
    rows: usize,
    hidden: usize,
    g: &Group<'_, D>,
    out: &CudaBuf,
) -> Result<()> {
    let (e, k, width) = (g.experts, g.top_k, g.width);
    let n = rows * k;
    let tc = g.tensor_cores;
    let tile = if tc { WMMA_TILE } else { TILE };
    let tiles = max_tiles(n, e, tile);
    if tiles > 65_535 {
        return Err(EngineError::Backend(format!(
            "a step of {rows} rows is too large for one mixture-of-experts launch"
        )));
    }
    let (rows32, e32, k32) = (u32_of("rows", rows)?, u32_of("experts", e)?, k as u32);
    let (h32, w32) = (u32_of("hidden", hidden)?, u32_of("width", width)?);
    let xbf16 = x.dtype == ElemType::BF16;
    let bias = g.router_bias.map_or(DevPtr::NULL, |v| v.ptr());

    let logits = b.arena_alloc(rows * e, ElemType::F32)?;
    b.launch(
        if xbf16 {
            "moe_router_bf16"
        } else {
            "moe_router_f32"
        },
        LaunchConfig {
            grid: (e.div_ceil(8) as u32, rows.min(65_535) as u32, 1),
            block: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        },
        &[
            logits.ptr.into(),
            x.ptr.into(),
            g.router.into(),
            bias.into(),
            rows32.into(),
            e32.into(),
            h32.into(),
        ],
    )?;

    // u32 arrays live in f32-sized arena slots.
    let ids = b.arena_alloc(n, ElemType::F32)?;
    let weights = b.arena_alloc(n, ElemType::F32)?;
    let route_grid = LaunchConfig::linear(rows.div_ceil(8) as u32, THREADS);
    match &g.sigmoid {
        Some(s) => b.launch(
            "moe_route_sigmoid",
            route_grid,
            &[
                ids.ptr.into(),
                weights.ptr.into(),
                logits.ptr.into(),
                s.bias.into(),
                rows32.into(),
                e32.into(),
                k32.into(),
                s.n_group.into(),
                s.topk_group.into(),
                s.renormalize.into(),
                s.scaling.into(),
            ],
        )?,
        None => b.launch(
            "moe_route",
            route_grid,
            &[
                ids.ptr.into(),
                weights.ptr.into(),
                logits.ptr.into(),
                rows32.into(),
                e32.into(),
                k32.into(),
                g.routing.into(),
            ],
        )?,
    }

    let order = b.arena_alloc(n, ElemType::F32)?;
    let slot = b.arena_alloc(n, ElemType::F32)?;
    let tile_list = b.arena_alloc(tiles * TILE_WORDS, ElemType::F32)?;
    b.launch(
        "moe_sort",
        LaunchConfig::linear(1, THREADS),
        &[
            order.ptr.into(),
            slot.ptr.into(),
            tile_list.ptr.into(),
            ids.ptr.into(),
            u32_of("assignments", n)?.into(),
            e32.into(),
            (tiles as u32).into(),
            (tile as u32).into(),
        ],
    )?;

    let (activation, alpha, limit): (u32, f32, f32) = match g.activation {
        ExpertActivation::Silu => (0, 0.0, 0.0),
        ExpertActivation::ClampedSwiGlu { alpha, limit } => (1, alpha, limit),
        // Gemma 4's experts (kernels/moe.cuh's MOE_GELU_TANH).
        ExpertActivation::GeluTanh => (2, 0.0, 0.0),
    };
    let act = b.arena_alloc(n * width, ElemType::BF16)?;
    let products = |cols: usize| LaunchConfig {
        grid: match tc {
            true => (cols.div_ceil(WMMA_COLS) as u32, tiles as u32, 1),
            false => (cols.div_ceil(BLOCK_COLS) as u32, tiles as u32, 1),
        },
        block: (if tc { WMMA_THREADS } else { THREADS }, 1, 1),
        shared_mem_bytes: 0,
    };
    let gate_up = match (tc, xbf16) {
        (true, true) => "moe_gate_up_wmma_bf16",
        (true, false) => "moe_gate_up_wmma_f32",
        (false, true) => "moe_gate_up_bf16",
        (false, false) => "moe_gate_up_f32",
    };
    b.launch(
        gate_up,
        products(width),
        &[
            act.ptr.into(),
            x.ptr.into(),
            g.table.ptr().into(),
            tile_list.ptr.into(),
            order.ptr.into(),
            k32.into(),
            h32.into(),
            w32.into(),
            activation.into(),
            alpha.into(),
            limit.into(),
        ],
    )?;

    let y = b.arena_alloc(n * hidden, ElemType::F32)?;
    b.launch(
        if tc { "moe_down_wmma" } else { "moe_down" },
        products(hidden),
        &[
            y.ptr.into(),
            act.ptr.into(),
            g.table.ptr().into(),
            tile_list.ptr.into(),
            h32.into(),
            w32.into(),
        ],
    )?;

    b.launch(
        "moe_combine",
        rows_cols(rows, hidden)?,
        &[
            out.ptr.into(),
            y.ptr.into(),
            weights.ptr.into(),
            slot.ptr.into(),
            k32.into(),
            h32.into(),
            ((rows * hidden) as u64).into(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tile_bound_holds_for_every_split_of_the_assignments() {
        // Worst case: as many experts as possible each hold one more than a multiple of a tile.
        for tile in [TILE, WMMA_TILE] {
            for (n, e) in [(1, 64), (8, 64), (64, 8), (64, 128), (4096, 128), (9, 1)] {
                let busy = e.min(n);
                let worst: usize = (0..busy)
                    .map(|i| n / busy + usize::from(i < n % busy))
                    .map(|c| c.div_ceil(tile))
                    .sum();
                assert!(
                    worst <= max_tiles(n, e, tile),
                    "{n} over {e} experts, tiles of {tile}"
                );
            }
        }
    }
}
