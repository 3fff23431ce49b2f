//! The engine tier of the LoRA adapter cache, seen from the scheduler: which adapters are
//! busy, whether a waiting request's adapter can run now, pins and retirement.

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;

use super::Scheduler;
use crate::adapters::Residency;
use crate::request::{AdapterId, AdapterRef};
use crate::sequence::Sequence;

/// Whether a waiting request's adapter lets it run now.
pub(super) enum AdapterWait {
    Ready,
    /// Its weights are loading, or every engine slot is pinned or in use.
    Hold,
    Failed(String),
}

impl Scheduler {
    /// Adapters of running sequences (never evicted).
    pub(super) fn busy_adapters(&self) -> HashSet<AdapterId> {
        self.running
            .iter()
            .filter_map(|e| self.requests.get(&e.seq.req)?.params.adapter_id())
            .collect()
    }

    /// Whether `seq`'s adapter is loaded into the engine (loading it if a slot can be had).
    pub(super) fn adapter_ready(&mut self, seq: &Sequence) -> AdapterWait {
        let Some(a) = self
            .requests
            .get(&seq.req)
            .and_then(|r| r.params.adapter.clone())
        else {
            return AdapterWait::Ready;
        };
        let weights = match a.weights.get() {
            None => return AdapterWait::Hold,
            Some(Err(e)) => {
                return AdapterWait::Failed(format!("LoRA adapter {}: {e}", a.name));
            }
            Some(Ok(w)) => w.clone(),
        };
        let busy = self.busy_adapters();
        let r = self
            .adapters
            .ensure(self.engine.as_mut(), a.id, &weights, &busy);
        self.update_adapter_metrics();
        match r {
            Residency::Ready => AdapterWait::Ready,
            Residency::NoSlot => AdapterWait::Hold,
            Residency::Failed(e) => AdapterWait::Failed(format!("LoRA adapter {}: {e}", a.name)),
        }
    }

    /// Pins an adapter in the engine (LMI's `pin=true`): loaded as soon as a slot can be
    /// had, never evicted. Refused ("No free lora slots") when pins would take the last slot.
    pub fn pin_adapter(&mut self, a: &AdapterRef) -> Result<(), String> {
        let weights = match a.weights.get() {
            Some(Ok(w)) => w.clone(),
            Some(Err(e)) => return Err(e.clone()),
            None => return Err("its weights are not loaded".into()),
        };
        self.adapters.pin(a.id, weights)?;
        let busy = self.busy_adapters();
        self.adapters.load_pinned(self.engine.as_mut(), &busy);
        self.update_adapter_metrics();
        Ok(())
    }

    /// Forgets an unregistered adapter: unpinned, unloaded once no running sequence uses it.
    pub fn retire_adapter(&mut self, id: AdapterId) {
        let busy = self.busy_adapters();
        self.adapters.retire(self.engine.as_mut(), id, &busy);
        self.update_adapter_metrics();
    }

    pub(super) fn update_adapter_metrics(&self) {
        let m = &self.metrics;
        m.lora_engine_resident
            .store(self.adapters.resident() as u64, Relaxed);
        m.lora_pinned.store(self.adapters.pinned() as u64, Relaxed);
        m.lora_engine_loads.store(self.adapters.loads, Relaxed);
        m.lora_engine_evictions
            .store(self.adapters.evictions, Relaxed);
    }
}
