//! The engine tier of the LoRA adapter cache: which adapters are uploaded into the engine's
//! `max_loras` slots. Least recently used adapters are evicted to make room, but never a
//! pinned one or one a running sequence uses; a request whose adapter finds no slot waits
//! (other requests go ahead of it). Pinned adapters count against the slots for good, and
//! may take every slot but one, so that an unpinned adapter can always run.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use lmi_engine_core::engine::StepEngine;
use lmi_engine_core::lora::LoraWeights;

use crate::request::AdapterId;

#[derive(Debug)]
struct Resident {
    last_used: u64,
}

/// What became of an attempt to make an adapter resident.
#[derive(Debug, PartialEq)]
pub(crate) enum Residency {
    Ready,
    /// Every slot is pinned or used by a running sequence: try again later.
    NoSlot,
    /// The engine refused the weights.
    Failed(String),
}

#[derive(Debug)]
pub(crate) struct AdapterSlots {
    max: usize,
    resident: HashMap<AdapterId, Resident>,
    /// Pinned adapters, with their weights so they can be (re)loaded when a slot frees.
    pinned: HashMap<AdapterId, Arc<LoraWeights>>,
    /// Unregistered while in use: unloaded once no running sequence uses them.
    retired: HashSet<AdapterId>,
    tick: u64,
    pub loads: u64,
    pub evictions: u64,
}

impl AdapterSlots {
    pub fn new(max: usize) -> Self {
        AdapterSlots {
            max: max.max(1),
            resident: HashMap::new(),
            pinned: HashMap::new(),
            retired: HashSet::new(),
            tick: 0,
            loads: 0,
            evictions: 0,
        }
    }

    pub fn resident(&self) -> usize {
        self.resident.len()
    }

    pub fn pinned(&self) -> usize {
        self.pinned.len()
    }

    /// Makes `id` resident, evicting the least recently used idle adapter if every slot is
    /// taken. `busy` holds the adapters of running sequences.
    pub fn ensure(
        &mut self,
        engine: &mut dyn StepEngine,
        id: AdapterId,
        weights: &LoraWeights,
        busy: &HashSet<AdapterId>,
    ) -> Residency {
        self.tick += 1;
        if let Some(r) = self.resident.get_mut(&id) {
            r.last_used = self.tick;
            return Residency::Ready;
        }
        if self.resident.len() >= self.max {
            let victim = self
                .resident
                .iter()
                .filter(|(v, _)| !self.pinned.contains_key(v) && !busy.contains(v))
                .min_by_key(|(_, r)| r.last_used)
                .map(|(&v, _)| v);
            let Some(v) = victim else {
                return Residency::NoSlot;
            };
            self.evict(engine, v);
        }
        match engine.load_adapter(id, weights) {
            Ok(()) => {
                self.resident.insert(
                    id,
                    Resident {
                        last_used: self.tick,
                    },
                );
                self.retired.remove(&id);
                self.loads += 1;
                tracing::debug!(adapter = id, "LoRA adapter loaded into the engine");
                Residency::Ready
            }
            Err(e) => Residency::Failed(e.to_string()),
        }
    }

    fn evict(&mut self, engine: &mut dyn StepEngine, id: AdapterId) {
        engine.unload_adapter(id);
        self.resident.remove(&id);
        self.evictions += 1;
        tracing::debug!(adapter = id, "LoRA adapter evicted from the engine");
    }

    /// Pins `id`: it is loaded now if a slot can be had (else as soon as one frees, see
    /// [`AdapterSlots::load_pinned`]) and never evicted. Refused when pins would take the
    /// last slot (requests for other adapters would wait forever).
    pub fn pin(&mut self, id: AdapterId, weights: Arc<LoraWeights>) -> Result<(), String> {
        if !self.pinned.contains_key(&id) && self.pinned.len() + 1 >= self.max {
            return Err(format!(
                "No free lora slots: {} of max_loras {} are pinned, and one must stay free",
                self.pinned.len(),
                self.max
            ));
        }
        self.pinned.insert(id, weights);
        Ok(())
    }

    /// Loads pinned adapters that are not resident yet, where slots allow.
    pub fn load_pinned(&mut self, engine: &mut dyn StepEngine, busy: &HashSet<AdapterId>) {
        let missing: Vec<(AdapterId, Arc<LoraWeights>)> = self
            .pinned
            .iter()
            .filter(|(id, _)| !self.resident.contains_key(id))
            .map(|(&id, w)| (id, w.clone()))
            .collect();
        for (id, w) in missing {
            if let Residency::Failed(e) = self.ensure(engine, id, &w, busy) {
                tracing::error!(adapter = id, "loading a pinned LoRA adapter: {e}");
                self.pinned.remove(&id);
            }
        }
    }

    /// Forgets `id` (unregistered): unpinned, and unloaded now or once idle.
    pub fn retire(
        &mut self,
        engine: &mut dyn StepEngine,
        id: AdapterId,
        busy: &HashSet<AdapterId>,
    ) {
        self.pinned.remove(&id);
        if !self.resident.contains_key(&id) {
            return;
        }
        if busy.contains(&id) {
            self.retired.insert(id);
        } else {
            self.evict(engine, id);
        }
    }

    /// Unloads retired adapters no running sequence uses any more.
    pub fn unload_retired(&mut self, engine: &mut dyn StepEngine, busy: &HashSet<AdapterId>) {
        let idle: Vec<AdapterId> = self
            .retired
            .iter()
            .filter(|id| !busy.contains(id))
            .copied()
            .collect();
        for id in idle {
            self.retired.remove(&id);
            if self.resident.contains_key(&id) {
                self.evict(engine, id);
            }
        }
    }
}
