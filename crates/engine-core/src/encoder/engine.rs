//! [`EncoderEngine`]: an encoder behind the scheduler's step boundary. It keeps no K/V, so
//! every chunk is a whole sequence from position 0 with a pool request, and its block pool
//! only numbers positions: big enough for the largest step, so that the scheduler's block
//! accounting runs unchanged (as the global tables of a model whose layers are all local).

use std::path::Path;

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::pooling::{PoolerInfo, Pooling};

use super::{Encoder, EncoderInputs};
use crate::backend::{Backend, Feature, refused};
use crate::batch::BatchLayout;
use crate::engine::{EngineOptions, StepEngine, StepShape};
use crate::error::{EngineError, Result};
use crate::kv::BLOCK_SIZE;
use crate::lora::LoraWeights;
use crate::pooler::pool;
use crate::step::{StepBatch, StepOutput};

pub struct EncoderEngine<B: Backend> {
    backend: B,
    model: Encoder<B>,
    pooler: PoolerInfo,
    num_blocks: usize,
    weight_bytes: usize,
    /// The matrices' format, as `/info` reports it (`f32`, `bf16`).
    weights: String,
    tokens_computed: u64,
    /// Step scratch: each token's position and type ids.
    positions: Vec<u32>,
    types: Vec<u32>,
    ids: Vec<u32>,
}

/// Blocks that number the positions of the largest step: `shape.tokens` spread over
/// `shape.seqs` sequences (each may end in a partial block), and at least one input of
/// `max_input` tokens.
fn position_blocks(shape: StepShape, max_input: usize) -> usize {
    let step = shape.tokens.div_ceil(BLOCK_SIZE) + shape.seqs.max(1);
    step.max(max_input.div_ceil(BLOCK_SIZE)).max(1)
}

impl<B: Backend> EncoderEngine<B> {
    /// Loads the encoder in `dir` on `backend`; `opts.task` may make a classifier's or
    /// embedder's pooler explicit (an encoder never generates).
    pub fn load(backend: B, dir: &Path, opts: &EngineOptions) -> Result<Self> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        if !backend.supports(Feature::Encoder) {
            return Err(refused(backend.name(), Feature::Encoder));
        }
        if opts.gguf.is_some() {
            return Err(EngineError::Backend(
                "an encoder's GGUF is not read: serve its HF directory".into(),
            ));
        }
        let pooler = PoolerInfo::read(dir, &config, opts.task)?.ok_or_else(|| {
            EngineError::Backend("an encoder must embed or score (option.task)".into())
        })?;
        let model = Encoder::load(&backend, dir, config, opts.dtype, &pooler)?;
        let weight_bytes = model.weight_bytes(&backend);
        let model_dtype = model.dtype;
        let num_blocks = opts
            .kv_blocks
            .unwrap_or_else(|| position_blocks(opts.max_step, pooler.max_input_tokens));
        Ok(EncoderEngine {
            backend,
            model,
            pooler,
            num_blocks,
            weight_bytes,
            weights: model_dtype.to_string(),
            tokens_computed: 0,
            positions: Vec::new(),
            types: Vec::new(),
            ids: Vec::new(),
        })
    }

    pub fn model(&self) -> &Encoder<B> {
        &self.model
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Which chunk each of `batch`'s pool requests names, checked: every chunk is pooled
    /// once, whole, and nothing else is asked of the step.
    fn check(&self, batch: &StepBatch<'_>) -> Result<()> {
        let n = batch.chunks.len();
        if !batch.samples.is_empty() || !batch.prompt_logprobs.is_empty() {
            return Err(EngineError::Batch(
                "an encoder draws no tokens and scores no prompts: its steps only pool".into(),
            ));
        }
        if !batch.media.is_empty() || !batch.states.is_empty() {
            return Err(EngineError::Batch(
                "an encoder takes no media and keeps no states".into(),
            ));
        }
        if batch.pools.len() != n {
            return Err(EngineError::Batch(format!(
                "an encoder pools every chunk of its step: {} pool requests for {n} chunks",
                batch.pools.len()
            )));
        }
        let mut seen = vec![false; n];
        let max = self.model.config.max_position_embeddings;
        for (i, p) in batch.pools.iter().enumerate() {
            let c = batch.chunks.get(p.chunk).ok_or_else(|| {
                EngineError::Batch(format!("pool request {i} names chunk {} of {n}", p.chunk))
            })?;
            if std::mem::replace(&mut seen[p.chunk], true) {
                return Err(EngineError::Batch(format!(
                    "chunk {} has two pool requests",
                    p.chunk
                )));
            }
            if c.start_pos != 0 {
                return Err(EngineError::Batch(format!(
                    "chunk {} starts at position {}: an encoder keeps no K/V, so a sequence \
                     runs whole in one step",
                    p.chunk, c.start_pos
                )));
            }
            if c.tokens.len() > max {
                return Err(EngineError::Batch(format!(
                    "chunk {} holds {} tokens, more than the model's {max} positions",
                    p.chunk,
                    c.tokens.len()
                )));
            }
            if c.adapter.is_some() {
                return Err(EngineError::Batch(
                    "LoRA adapters on encoders are not supported".into(),
                ));
            }
        }
        Ok(())
    }

    /// Each token's position and type ids, and the rows to read back: the first or last
    /// token of each sequence (all of them for mean pooling, None).
    fn inputs(&mut self, batch: &StepBatch<'_>, layout: &mut BatchLayout) -> Option<()> {
        let enc = &self.model.encoder;
        self.positions.clear();
        self.types.clear();
        let two_types = enc.type_vocab_size > 1;
        let mut segment = vec![None; batch.chunks.len()];
        for p in batch.pools {
            segment[p.chunk] = p.segment_b;
        }
        for (c, seg) in batch.chunks.iter().zip(&segment) {
            enc.position_ids(&c.tokens, &mut self.ids);
            self.positions.extend_from_slice(&self.ids);
            // A model with one token type (XLM-R) gives both segments type 0, as its
            // tokenizer does.
            let b = seg.filter(|_| two_types).unwrap_or(c.tokens.len());
            self.types
                .extend((0..c.tokens.len()).map(|t| u32::from(t >= b)));
        }
        let rows = &layout.cu_tokens;
        layout.logits_rows = match self.model.head.pooling() {
            Pooling::Cls => rows[..rows.len() - 1].to_vec(),
            Pooling::Last => rows[1..].iter().map(|&r| r - 1).collect(),
            Pooling::Mean => return None,
        };
        Some(())
    }
}

impl<B: Backend> StepEngine for EncoderEngine<B> {
    fn model_config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    fn weights_format(&self) -> &str {
        &self.weights
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn product_kernel(&self, rows: usize) -> String {
        self.backend.product_kernel(rows, false)
    }

    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput> {
        self.check(batch)?;
        if batch.chunks.is_empty() {
            return Ok(StepOutput::default());
        }
        let mut layout = BatchLayout::new(batch.chunks, self.num_blocks)?;
        let gathered = self.inputs(batch, &mut layout).is_some();
        let hidden = self.model.config.hidden_size;
        let tokens = layout.num_tokens();
        let (backend, model) = (&self.backend, &self.model);
        let inputs = EncoderInputs {
            positions: &self.positions,
            types: &self.types,
            cu: &layout.cu_tokens,
        };
        let states = backend.run_forward(|| {
            let step = backend.upload_step(&layout)?;
            let states = model.forward(backend, &step, &inputs)?;
            match gathered {
                // One row per sequence: the rows pooling reads.
                true => {
                    let rows = layout.logits_rows.len();
                    let mut picked = backend.alloc(rows * hidden)?;
                    backend.gather_logit_rows(&states, &step, hidden, &mut picked)?;
                    backend.recycle(states);
                    backend.to_host(picked, rows * hidden)
                }
                false => backend.to_host(states, tokens * hidden),
            }
        })?;
        self.tokens_computed += tokens as u64;
        let pooling = self.model.head.pooling();
        let pooled = batch
            .pools
            .iter()
            .map(|p| {
                let rows = match gathered {
                    true => &states[p.chunk * hidden..(p.chunk + 1) * hidden],
                    false => {
                        let (a, b) = (layout.cu_tokens[p.chunk], layout.cu_tokens[p.chunk + 1]);
                        &states[a as usize * hidden..b as usize * hidden]
                    }
                };
                self.model.head.apply(pool(rows, hidden, pooling))
            })
            .collect();
        Ok(StepOutput {
            pooled,
            ..Default::default()
        })
    }

    /// Nothing to copy: the blocks only number positions.
    fn copy_blocks(&mut self, _pairs: &[(u32, u32)]) -> Result<()> {
        Ok(())
    }

    fn pooler(&self) -> Option<&PoolerInfo> {
        Some(&self.pooler)
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    fn resident_weight_bytes(&self) -> usize {
        self.model.resident_bytes(&self.backend)
    }

    fn tokens_computed(&self) -> u64 {
        self.tokens_computed
    }

    fn load_adapter(&mut self, id: u64, _weights: &LoraWeights) -> Result<()> {
        Err(EngineError::Batch(format!(
            "LoRA adapter {id}: adapters on encoders are not supported"
        )))
    }

    fn unload_adapter(&mut self, _id: u64) -> bool {
        false
    }

    fn has_adapter(&self, _id: u64) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_pool_holds_the_largest_step() {
        let shape = StepShape {
            seqs: 4,
            tokens: 100,
            context: None,
        };
        // Four sequences of 25 tokens take two blocks each; 7 + 4 cover any split.
        assert_eq!(position_blocks(shape, 64), 11);
        // One input of the model's longest still fits.
        assert_eq!(position_blocks(shape, 512), 32);
    }
}
