//! Constrained decoding's token masks, computed on worker threads while the forward pass
//! runs (the engine waits for each right before its draw).

use std::sync::Arc;
use std::time::Instant;

use lmi_engine_core::TokenMask;

use super::{Scheduler, lock};

impl Scheduler {
    /// Starts the mask of every constrained sequence that draws this step (one per scheduled
    /// sequence, None for the others).
    pub(super) fn start_masks(
        &mut self,
        scheduled: &[(usize, usize)],
    ) -> Vec<Option<Arc<TokenMask>>> {
        scheduled
            .iter()
            .map(|&(i, n)| {
                let e = &self.running[i];
                let c = e.constraint.as_ref()?;
                if e.seq.kv.num_computed + n != e.seq.tokens.len() {
                    return None; // a prefill chunk that draws nothing
                }
                let mask = Arc::new(TokenMask::pending());
                let (m, c, metrics) = (mask.clone(), c.clone(), self.metrics.clone());
                self.mask_pool().spawn(move || {
                    let t = Instant::now();
                    let bits = lock(&c).mask();
                    metrics.record_mask(t.elapsed());
                    if let Err(e) = &bits {
                        tracing::warn!("computing a constraint mask: {e}");
                    }
                    m.set(bits.ok());
                });
                Some(mask)
            })
            .collect()
    }

    /// The workers computing constraint masks (started on first use).
    pub(super) fn mask_pool(&mut self) -> &rayon::ThreadPool {
        self.mask_pool.get_or_insert_with(|| {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("lmi-mask-{i}"))
                .build()
                .unwrap_or_else(|e| {
                    tracing::warn!("mask worker pool: {e}; using one thread");
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(1)
                        .build()
                        .expect("a one-thread pool")
                })
        })
    }
}
