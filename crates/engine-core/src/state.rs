//! The recurrent-state cache beside the paged KV cache: models with linear-attention layers
//! (Gated DeltaNet) keep, per sequence, a fixed-size state in every such layer instead of K/V
//! per token. The engine holds `slots` of them per layer; the scheduler decides which slot a
//! sequence uses, which slots hold prefix snapshots, and when one is copied to another, as it
//! does for KV blocks. Nothing here knows which model kind fills a slot: Mamba-style and
//! short-convolution layers would size theirs the same way.

use crate::error::{EngineError, Result};

/// No slot (a chunk of a model without recurrent layers).
pub const NO_SLOT: u32 = u32::MAX;

/// The state slots an engine keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateConfig {
    pub slots: usize,
    /// Layers that keep a state.
    pub layers: usize,
    /// f32 values of one layer's state for one sequence.
    pub slot_len: usize,
}

impl StateConfig {
    /// Bytes of one slot across every layer.
    pub fn slot_bytes(&self) -> usize {
        self.layers * self.slot_len * 4
    }

    /// Bytes of every slot.
    pub fn bytes(&self) -> usize {
        self.slots * self.slot_bytes()
    }
}

/// One chunk's recurrent state in a step: the slot it continues from (reset to zero first when
/// the chunk starts its sequence) and leaves its state in, and the snapshots to take on the
/// way (the prefix cache's: the state after a block boundary, which a later request with the
/// same prefix resumes from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkState {
    pub slot: u32,
    /// `(tokens, slot)`: after the chunk's first `tokens` tokens (1 ..= its length), its state
    /// is copied into `slot`.
    pub snapshots: Vec<(u32, u32)>,
}

impl Default for ChunkState {
    fn default() -> Self {
        ChunkState {
            slot: NO_SLOT,
            snapshots: Vec::new(),
        }
    }
}

impl ChunkState {
    pub fn in_slot(slot: u32) -> Self {
        ChunkState {
            slot,
            snapshots: Vec::new(),
        }
    }
}

/// Checks a step's states against its chunks (`tokens` each) and the engine's `slots`: one per
/// chunk, every slot in range, no slot written twice, snapshots inside their chunk.
pub fn check_states(states: &[ChunkState], tokens: &[usize], slots: usize) -> Result<()> {
    if states.len() != tokens.len() {
        return Err(EngineError::Batch(format!(
            "this model keeps a recurrent state per sequence: the step has {} chunks and {} states",
            tokens.len(),
            states.len()
        )));
    }
    let mut written = std::collections::HashSet::new();
    for (k, (s, &n)) in states.iter().zip(tokens).enumerate() {
        let targets = std::iter::once(s.slot).chain(s.snapshots.iter().map(|&(_, slot)| slot));
        for slot in targets {
            if slot as usize >= slots {
                return Err(EngineError::Batch(format!(
                    "chunk {k}: state slot {slot} is outside the {slots} slots"
                )));
            }
            if !written.insert(slot) {
                return Err(EngineError::Batch(format!(
                    "chunk {k}: state slot {slot} is written twice in one step"
                )));
            }
        }
        if let Some(&(at, _)) = s
            .snapshots
            .iter()
            .find(|&&(at, _)| at == 0 || at as usize > n)
        {
            return Err(EngineError::Batch(format!(
                "chunk {k}: a snapshot after {at} tokens of a {n}-token chunk"
            )));
        }
    }
    Ok(())
}
