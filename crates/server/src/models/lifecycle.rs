//! Loading, unloading and evicting models: registration, on-demand loads, making room
//! (least recently used idle model first), draining, and stopping a model's scheduler.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::memory::{available_memory, footprint};
use super::slot::Waiter;
use super::{InFlight, Live, LoadError, Phase, Registry, Slot};

impl Registry {
    /// Registers `name` from `url` and loads it (management API). `synchronous=false`: the
    /// load runs in the background and this returns once it is admitted.
    pub async fn register(
        self: &Arc<Self>,
        name: &str,
        url: &str,
        synchronous: bool,
    ) -> Result<(), LoadError> {
        let slot = Slot::new(name.to_string(), url.to_string(), false, Phase::Unloaded);
        self.claim(slot.clone())?;
        let load = {
            let reg = self.clone();
            let slot = slot.clone();
            // A registration takes the room there is: 507 tells SageMaker (or the operator)
            // to unload another model first.
            async move { reg.load(&slot, false).await }
        };
        if synchronous {
            let r = load.await;
            if r.is_err() {
                // A registration that fails leaves nothing behind.
                self.remove(name);
            }
            r
        } else {
            tokio::spawn(async move {
                if let Err(e) = load.await {
                    tracing::error!("loading the model failed: {}", e.message());
                }
            });
            Ok(())
        }
    }

    /// Loads `slot` (its phase Unloaded, Failed or NoRoom); `evict`: unloads idle models to make
    /// room (on demand), else answers 507 when it does not fit.
    pub(super) async fn load(
        self: &Arc<Self>,
        slot: &Arc<Slot>,
        evict: bool,
    ) -> Result<(), LoadError> {
        let admit = self.admit.lock().await;
        if !slot.phase().loadable() {
            // Another request started it meanwhile.
            return Ok(());
        }
        let url = slot.url.clone();
        let fetch = self.base.fetch.clone();
        let kv = self.base.kv_cache_bytes;
        let resolved = tokio::task::spawn_blocking(move || {
            lmi_store::resolve_with(Some(url.as_str()), &fetch)
        })
        .await
        .map_err(|e| LoadError::BadModel(e.to_string()))?
        .map_err(|e| {
            let e = LoadError::BadModel(format!("model {} ({}): {e:#}", slot.name, slot.url));
            slot.set_phase(Phase::Failed(e.clone()));
            e
        })?;
        let bytes = footprint(resolved.gguf.as_deref().unwrap_or(&resolved.dir), kv);
        if let Err(e) = self.make_room(&slot.name, bytes, evict).await {
            // Says why it is not loaded; the next request tries again.
            slot.set_phase(Phase::NoRoom(e.clone()));
            return Err(e);
        }
        let state = self.state_for(&slot.name, &slot.url).map_err(|e| {
            let e = LoadError::BadModel(format!("model {} ({}): {e:#}", slot.name, slot.url));
            slot.set_phase(Phase::Failed(e.clone()));
            e
        })?;
        let live = Self::live(state, bytes);
        slot.set_phase(Phase::Loading {
            live: live.clone(),
            on_demand: true,
        });
        drop(admit);
        let state = live.state.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            crate::commands::serve::load_model(&state.config, &state.metrics)
        })
        .await;
        match loaded {
            Ok(Ok(model)) => {
                crate::release_freed_memory();
                tracing::info!(
                    "model {:?} ready: {} ({} KV blocks)",
                    slot.name,
                    model.model_dir.display(),
                    model.handle.limits().num_blocks
                );
                let _ = live.state.set_loaded(model);
                slot.set_phase(Phase::Ready(live));
                Ok(())
            }
            Ok(Err(e)) => {
                let msg = format!("model {} ({}) failed to load: {e:#}", slot.name, slot.url);
                tracing::error!("{msg}");
                let e = LoadError::BadModel(msg);
                slot.set_phase(Phase::Failed(e.clone()));
                Err(e)
            }
            Err(e) => {
                let e = LoadError::BadModel(e.to_string());
                slot.set_phase(Phase::Failed(e.clone()));
                Err(e)
            }
        }
    }

    /// Bytes the loaded models take, and how many there are (loading ones count).
    pub(super) fn usage(&self) -> (u64, usize) {
        let mut bytes = 0;
        let mut n = 0;
        for s in self.slots() {
            if let Some(l) = s.phase().live() {
                bytes += l.bytes;
                n += 1;
            }
        }
        (bytes, n)
    }

    /// Unloads least recently used idle models until `bytes` more fit and one more model
    /// is allowed; waits (up to option.evict_wait) while every candidate is busy;
    /// 507 when it cannot ever fit, or no model became idle in time.
    pub(super) async fn make_room(
        &self,
        name: &str,
        bytes: u64,
        evict: bool,
    ) -> Result<(), LoadError> {
        let m = &self.base.models;
        let deadline = Instant::now() + m.evict_wait;
        loop {
            let (used, n) = self.usage();
            let budget = m.memory_budget.unwrap_or(u64::MAX);
            let fits_memory = used.saturating_add(bytes) <= budget;
            let fits_count = m.max_loaded.is_none_or(|max| n < max);
            if fits_memory && fits_count {
                // Without a budget, the memory the machine has left is the limit.
                if m.memory_budget.is_none()
                    && let Some(avail) = available_memory()
                    && bytes > avail
                {
                    return Err(LoadError::NoRoom(format!(
                        "model {name} needs about {} MiB and {} MiB are available: unload a model first",
                        bytes >> 20,
                        avail >> 20
                    )));
                }
                return Ok(());
            }
            if bytes > budget {
                return Err(LoadError::NoRoom(format!(
                    "model {name} needs about {} MiB, more than option.models_memory ({} MiB)",
                    bytes >> 20,
                    budget >> 20
                )));
            }
            let victim = if evict { self.idle_lru(name) } else { None };
            let deadline = if evict { deadline } else { Instant::now() };
            match victim {
                Some(victim) => {
                    self.unload(&victim, "to make room").await;
                }
                None if Instant::now() >= deadline => {
                    let busy = if evict {
                        ", each with requests in flight"
                    } else {
                        ""
                    };
                    return Err(LoadError::NoRoom(format!(
                        "model {name} (about {} MiB) does not fit: {n} models loaded{busy}, \
                         taking {} MiB of option.models_memory ({}){}; unload one first",
                        bytes >> 20,
                        used >> 20,
                        m.memory_budget
                            .map(|b| format!("{} MiB", b >> 20))
                            .unwrap_or_else(|| "no limit".into()),
                        m.max_loaded
                            .map(|x| format!(", option.max_loaded_models={x}"))
                            .unwrap_or_default()
                    )));
                }
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// The least recently used loaded model with nothing in flight or waiting, but `except`.
    pub(super) fn idle_lru(&self, except: &str) -> Option<Arc<Slot>> {
        self.slots()
            .into_iter()
            .filter(|s| s.name != except && matches!(s.phase(), Phase::Ready(_)))
            .filter(|s| s.in_flight() == 0 && s.waiting.load(Ordering::SeqCst) == 0)
            .min_by_key(|s| s.last_used())
    }

    /// Unloads an idle ready model (it stays registered, loadable again). Returns false when
    /// a request reached it first.
    pub(super) async fn unload(&self, slot: &Arc<Slot>, why: &str) -> bool {
        let live = {
            let Ok(mut g) = slot.phase.lock() else {
                return false;
            };
            match &*g {
                Phase::Ready(l) if slot.in_flight() == 0 => {
                    let l = l.clone();
                    *g = Phase::Unloaded;
                    l
                }
                _ => return false,
            }
        };
        slot.changed.send_modify(|n| *n += 1);
        tracing::info!("unloading model {:?} {why}", slot.name);
        stop(live).await;
        true
    }

    /// DELETE: no new requests, the ones in flight finish (up to option.drain_timeout), then
    /// the model is unloaded and forgotten.
    pub async fn unregister(&self, name: &str) -> Result<(), LoadError> {
        let slot = self
            .get(name)
            .ok_or_else(|| LoadError::NotFound(format!("Model not found: {name}")))?;
        let live = {
            let Ok(mut g) = slot.phase.lock() else {
                return Err(LoadError::Busy("registry lock poisoned".into()));
            };
            match &*g {
                Phase::Ready(l) => {
                    let l = l.clone();
                    *g = Phase::Draining(l.clone());
                    Some(l)
                }
                Phase::Loading { .. } => {
                    return Err(LoadError::Busy(format!(
                        "Model {name} is loading: unregister it once loaded"
                    )));
                }
                Phase::Draining(_) => {
                    return Err(LoadError::NotFound(format!(
                        "Model {name} is already being unregistered"
                    )));
                }
                Phase::Unloaded | Phase::Failed(_) | Phase::NoRoom(_) => None,
            }
        };
        slot.changed.send_modify(|n| *n += 1);
        if let Some(live) = live {
            let deadline = Instant::now() + Duration::from_secs(self.base.drain_timeout_secs);
            while slot.in_flight() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // The phase lets go of the state too, so the scheduler can stop.
            slot.set_phase(Phase::Unloaded);
            self.remove(name);
            stop(live).await;
        } else {
            self.remove(name);
        }
        tracing::info!("model {name:?} unregistered");
        Ok(())
    }

    /// The slot's routes for one request: loads it on demand (the request waits, bounded by
    /// option.job_queue_size waiters and option.model_load_timeout).
    pub async fn ready(self: &Arc<Self>, slot: &Arc<Slot>) -> Result<(Live, InFlight), LoadError> {
        if let Some(r) = slot.acquire() {
            return Ok(r);
        }
        let waiting = slot.waiting.fetch_add(1, Ordering::SeqCst) + 1;
        let _waiter = Waiter(slot);
        if waiting > self.base.job_queue_size {
            return Err(LoadError::Busy(format!(
                "{waiting} requests already wait for model {} to load (option.job_queue_size)",
                slot.name
            )));
        }
        let deadline = Instant::now() + self.base.models.load_timeout;
        let mut changes = slot.changed.subscribe();
        let mut started = false;
        loop {
            if let Some(r) = slot.acquire() {
                return Ok(r);
            }
            let queued = slot.load_queued.load(Ordering::SeqCst);
            let phase = slot.phase();
            match phase {
                // The load this request waited for failed, or found no room.
                Phase::Failed(e) | Phase::NoRoom(e) if started && !queued => {
                    return Err(e.for_request());
                }
                // Not loaded and no load on its way: this request starts one (again, after a
                // failure: a model's files may have been fixed, or another model may have
                // become idle); others wait on the phase.
                _ if phase.loadable() && !slot.load_queued.swap(true, Ordering::SeqCst) => {
                    started = true;
                    let reg = self.clone();
                    let s = slot.clone();
                    tokio::spawn(async move {
                        let r = reg.load(&s, true).await;
                        if let Err(e) = r {
                            tracing::warn!("on-demand load: {}", e.message());
                            // Its waiters read why (a bad model or no room already says so).
                            if s.phase().error().is_none() {
                                s.set_phase(Phase::Failed(e));
                            }
                        }
                        s.load_queued.store(false, Ordering::SeqCst);
                        s.changed.send_modify(|n| *n += 1);
                    });
                }
                // Another request's load is on its way.
                _ if phase.loadable() => started = true,
                Phase::Draining(_) => {
                    return Err(LoadError::NotFound(format!(
                        "Model {} is being unregistered",
                        slot.name
                    )));
                }
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LoadError::Busy(format!(
                    "model {} did not load within option.model_load_timeout ({} s)",
                    slot.name,
                    self.base.models.load_timeout.as_secs()
                )));
            }
            let _ =
                tokio::time::timeout(left.min(Duration::from_millis(200)), changes.changed()).await;
        }
    }

    /// Stops every model (at shutdown).
    pub async fn shutdown(&self) {
        for s in self.slots() {
            let live = s.phase().live().cloned();
            s.set_phase(Phase::Unloaded);
            if let Some(l) = live {
                stop(l).await;
            }
        }
    }
}

/// Stops a model's scheduler once nothing holds its state, and gives its memory back.
async fn stop(live: Live) {
    let Live { state, app, .. } = live;
    drop(app);
    let _ = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut state = state;
        loop {
            match Arc::try_unwrap(state) {
                Ok(s) => {
                    if let Some(m) = s.into_model() {
                        m.handle.shutdown();
                    }
                    break;
                }
                Err(s) if Instant::now() < deadline => {
                    state = s;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => {
                    tracing::warn!("a model's state is still held after 30 s; not waiting");
                    break;
                }
            }
        }
        crate::release_freed_memory();
    })
    .await;
}
