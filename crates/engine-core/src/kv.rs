//! Geometry of the paged KV cache. The block pool itself (allocation, prefix cache) belongs to
//! the scheduler; the engine only stores K/V at the slots a step's layout names.

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::dtype::DType;

/// Tokens per KV block.
pub const BLOCK_SIZE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheConfig {
    pub num_blocks: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Element type of the pools: bf16 for bf16 models (half the bytes attention streams),
    /// f32 otherwise.
    pub dtype: DType,
}

impl KvCacheConfig {
    pub fn new(model: &ModelConfig, num_blocks: usize, dtype: DType) -> Self {
        let (num_kv_heads, head_dim) = Self::geometry(model);
        KvCacheConfig {
            num_blocks,
            num_layers: model.num_attention_layers(),
            num_kv_heads,
            head_dim,
            dtype,
        }
    }

    /// The (heads, head_dim) of a layer's K and V pools. A latent-attention layer stores one
    /// record of [`MlaConfig::cache_width`] values a token (the normalized latent, then the
    /// rotated key part): its first half in the K pool, its second in the V pool, so that
    /// both pools keep one shape and a block costs what the record costs.
    ///
    /// [`MlaConfig::cache_width`]: lmi_checkpoint::config::mla::MlaConfig::cache_width
    pub fn geometry(model: &ModelConfig) -> (usize, usize) {
        match &model.mla {
            Some(m) => (1, m.cache_width() / 2),
            None => (model.num_kv_heads, model.head_dim),
        }
    }

    /// The KV element type for a model whose matrices are `weights`.
    pub fn dtype_for_weights(weights: DType) -> DType {
        match weights {
            // Quantized weights compute in f32 and keep K/V in bf16 (half the memory).
            DType::BF16 | DType::I8 => DType::BF16,
            DType::F32 | DType::F16 => DType::F32,
        }
    }

    /// Bytes of one block across all layers, K and V, for `elem_bytes`-sized elements.
    pub fn block_bytes(model: &ModelConfig, elem_bytes: usize) -> usize {
        // Per layer pool its own width: Gemma 4's global layers are wider, a latent-attention
        // layer keeps its record ([`Self::geometry`]).
        model.kv_elems_per_token() * BLOCK_SIZE * elem_bytes
    }

    /// How many blocks fit in `budget_bytes`.
    pub fn blocks_for_budget(model: &ModelConfig, elem_bytes: usize, budget_bytes: usize) -> usize {
        budget_bytes / Self::block_bytes(model, elem_bytes).max(1)
    }

    /// Bytes of one block of one layer, K and V.
    pub fn layer_block_bytes(&self) -> usize {
        2 * self.num_kv_heads * self.head_dim * BLOCK_SIZE * self.dtype.size()
    }

    /// The global layers' blocks `budget` bytes hold beside window pools of `window_blocks`
    /// for `local` of the `num_layers` layers.
    pub fn global_blocks(&self, budget: usize, window_blocks: usize, local: usize) -> usize {
        let per_block = self.layer_block_bytes().max(1);
        let window = window_blocks * local * per_block;
        budget.saturating_sub(window) / (per_block * self.num_layers.saturating_sub(local).max(1))
    }

    /// Elements of one layer's K (or V) pool: `[num_blocks, kv_heads, BLOCK_SIZE, head_dim]`.
    pub fn layer_elems(&self) -> usize {
        self.num_blocks * self.num_kv_heads * BLOCK_SIZE * self.head_dim
    }
}

/// Sliding-window layers' own KV pools (vLLM's hybrid allocator, for two kinds of layers): a
/// local layer reads only the last `size` keys, so its blocks before that go back to a pool
/// sized for the windows of a full step instead of for every context. The scheduler keeps a
/// second block table per sequence in this pool (`SeqChunk::window_table`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvWindow {
    /// Blocks in the local layers' pools.
    pub blocks: usize,
    /// Keys a local layer's query sees (its own and the `size - 1` before it).
    pub size: usize,
}

impl KvWindow {
    /// Window blocks a step of `seqs` sequences and `tokens` new tokens can hold at once:
    /// each sequence the blocks of its window (one more where the window straddles a block
    /// boundary, one for a partial last block) and as many for its prompt's last window
    /// (kept for the prefix cache until the sequence ends), plus its new tokens' blocks.
    pub fn blocks_for_step(size: usize, seqs: usize, tokens: usize) -> usize {
        seqs * 2 * (size.div_ceil(BLOCK_SIZE) + 2) + tokens.div_ceil(BLOCK_SIZE) + seqs
    }

    /// The first block a sequence still needs when its next token is at `position`: blocks
    /// before it are out of every later token's window.
    pub fn first_needed(size: usize, position: usize) -> usize {
        (position + 1).saturating_sub(size) / BLOCK_SIZE
    }
}
