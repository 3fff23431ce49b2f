//! Forks: a running sequence copied into another that shares its KV blocks copy-on-write
//! (the shared partial block is copied when either writes to it, see `KvManager::grow`).
//! Parallel sequences (`n`, `best_of`) fork off the first one's prefill; beams fork off their
//! parents.

use super::Scheduler;

impl Scheduler {
    /// Forks running sequence `i` as sequence `index` of its request drawing with `seed`;
    /// returns the fork's running index.
    pub(super) fn fork_running(&mut self, i: usize, index: u32, seed: u64) -> usize {
        let base = &self.running[i];
        let kv = self.kv.share(&base.seq.kv);
        let fork = base.fork(index, seed, kv);
        self.running.push(fork);
        self.running.len() - 1
    }
}
