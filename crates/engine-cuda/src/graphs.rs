//! CUDA graphs of decode steps, one per [`GraphKey`] (padded batch size, block-table width,
//! adapter rows or not).
//!
//! A key's first step runs directly (it sizes the arena), its second is captured and
//! replayed, and every later one is replayed; the engine runs every key twice at load, so all
//! are captured before the first request. A graph records device addresses, so it is kept
//! only while the arena and step buffers it was captured over stay where they are (`epoch`);
//! a capture that fails marks the key to run directly from then on (an error in the log, and
//! `lmi_cuda_graphs{state="failed"}`).

use std::any::Any;
use std::collections::HashMap;

use super::step::GraphKey;

pub struct Captured<G> {
    pub graph: G,
    /// What the captured closure returned (handles to its output buffers).
    pub result: Box<dyn Any + Send>,
    /// Where the arena stood after the captured forward pass.
    pub arena_mark: (usize, usize),
    pub epoch: u64,
}

enum Entry<G> {
    Seen,
    Failed,
    Ready(Captured<G>),
}

pub enum Plan<'a, G> {
    /// Run directly.
    Direct,
    /// Run directly, then capture next time.
    WarmUp,
    Capture,
    Replay(&'a Captured<G>),
}

pub struct GraphCache<G> {
    enabled: bool,
    entries: HashMap<GraphKey, Entry<G>>,
}

impl<G> GraphCache<G> {
    pub fn new(enabled: bool) -> Self {
        GraphCache {
            enabled,
            entries: HashMap::new(),
        }
    }

    /// What to do for a step of `key` when the buffers are at `epoch`.
    pub fn plan(&mut self, key: Option<GraphKey>, epoch: u64) -> Plan<'_, G> {
        let Some(key) = key.filter(|_| self.enabled) else {
            return Plan::Direct;
        };
        let stale = matches!(self.entries.get(&key), Some(Entry::Ready(c)) if c.epoch != epoch);
        if stale {
            self.entries.insert(key, Entry::Seen);
        }
        if let std::collections::hash_map::Entry::Vacant(v) = self.entries.entry(key) {
            v.insert(Entry::Seen);
            return Plan::WarmUp;
        }
        match self.entries.get(&key) {
            None => Plan::WarmUp,
            Some(Entry::Seen) => Plan::Capture,
            Some(Entry::Failed) => Plan::Direct,
            Some(Entry::Ready(c)) => Plan::Replay(c),
        }
    }

    pub fn store(&mut self, key: GraphKey, captured: Captured<G>) {
        self.entries.insert(key, Entry::Ready(captured));
    }

    pub fn fail(&mut self, key: GraphKey) {
        self.entries.insert(key, Entry::Failed);
    }

    pub fn len(&self) -> usize {
        self.entries
            .values()
            .filter(|e| matches!(e, Entry::Ready(_)))
            .count()
    }

    pub fn stats(&self) -> lmi_engine_core::backend::GraphStats {
        lmi_engine_core::backend::GraphStats {
            captured: self.len(),
            failed: self
                .entries
                .values()
                .filter(|e| matches!(e, Entry::Failed))
                .count(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seqs: usize) -> Option<GraphKey> {
        Some(GraphKey {
            seqs,
            block_stride: 16,
            lora: false,
        })
    }

    fn captured(epoch: u64) -> Captured<u32> {
        Captured {
            graph: 7,
            result: Box::new(()),
            arena_mark: (1, 0),
            epoch,
        }
    }

    #[test]
    fn warm_up_capture_then_replay_until_the_buffers_move() {
        let mut c = GraphCache::<u32>::new(true);
        assert!(matches!(c.plan(None, 0), Plan::Direct));
        assert!(matches!(c.plan(key(4), 0), Plan::WarmUp));
        assert!(matches!(c.plan(key(4), 0), Plan::Capture));
        c.store(key(4).unwrap(), captured(0));
        assert!(matches!(c.plan(key(4), 0), Plan::Replay(_)));
        assert_eq!(c.len(), 1);
        // The arena moved: capture again.
        assert!(matches!(c.plan(key(4), 1), Plan::Capture));
        c.fail(key(4).unwrap());
        assert!(matches!(c.plan(key(4), 1), Plan::Direct));
        assert!(matches!(
            GraphCache::<u32>::new(false).plan(key(4), 0),
            Plan::Direct
        ));
    }
}
