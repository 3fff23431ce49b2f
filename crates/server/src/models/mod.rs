//! The registry of models one server holds (issue 54). Each model is a [`Slot`]: its name,
//! where it comes from, and while it is loaded its own [`AppState`] (engine, scheduler
//! thread, KV cache, adapters, metrics) with the routes bound to it. The front router
//! (`dispatch.rs`) picks a slot per request and hands the request to that slot's routes, so
//! every route is written once, for one model. The management API (`manage.rs`) adds and
//! removes slots; models named by option.models_dir load on demand, and the least recently
//! used idle model is unloaded when option.max_loaded_models or option.models_memory need
//! room. A model with a request in flight is never unloaded: the request holds an
//! [`InFlight`] token until its response (stream) ends.

pub mod dispatch;
pub mod manage;
pub mod metrics_text;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;

use crate::app::AppState;
use crate::config::ServingConfig;
use crate::metrics::ServerMetrics;

/// Where a slot is in its life.
#[derive(Clone)]
pub enum Phase {
    /// Known (option.models_dir, or unloaded to make room): loads when a request names it.
    Unloaded,
    /// Loading; `on_demand`: requests wait for it (at start they get the 503 of a loading
    /// server, as a single-model server gives).
    Loading {
        live: Live,
        on_demand: bool,
    },
    Ready(Live),
    /// Its last load failed (the message says why).
    Failed(String),
    /// Being unregistered: finishing its requests, taking no new ones.
    Draining(Live),
}

impl Phase {
    fn live(&self) -> Option<&Live> {
        match self {
            Phase::Loading { live, .. } | Phase::Ready(live) | Phase::Draining(live) => Some(live),
            _ => None,
        }
    }

    /// DJL's model status words.
    pub fn status(&self) -> &'static str {
        match self {
            Phase::Unloaded => "UNLOADED",
            Phase::Loading { .. } => "PENDING",
            Phase::Ready(_) => "READY",
            Phase::Failed(_) => "FAILED",
            Phase::Draining(_) => "UNREGISTERING",
        }
    }
}

/// A loaded (or loading) model: its state and its routes.
#[derive(Clone)]
pub struct Live {
    pub state: Arc<AppState>,
    pub app: Router,
    /// Weights and KV cache, as counted against option.models_memory.
    pub bytes: u64,
    pub since: SystemTime,
}

pub struct Slot {
    pub name: String,
    /// The spec it loads from (path, Hub id, s3:// prefix), as registered.
    pub url: String,
    pub loaded_at_startup: bool,
    phase: Mutex<Phase>,
    /// Bumped at every phase change; waiters watch it.
    changed: tokio::sync::watch::Sender<u64>,
    in_flight: Arc<AtomicUsize>,
    /// Requests waiting for this model to load.
    waiting: AtomicUsize,
    last_used: Mutex<Instant>,
}

impl Slot {
    fn new(name: String, url: String, loaded_at_startup: bool, phase: Phase) -> Arc<Slot> {
        Arc::new(Slot {
            name,
            url,
            loaded_at_startup,
            phase: Mutex::new(phase),
            changed: tokio::sync::watch::channel(0).0,
            in_flight: Arc::new(AtomicUsize::new(0)),
            waiting: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
        })
    }

    pub fn phase(&self) -> Phase {
        self.phase
            .lock()
            .map(|p| p.clone())
            .unwrap_or(Phase::Unloaded)
    }

    fn set_phase(&self, p: Phase) {
        if let Ok(mut g) = self.phase.lock() {
            *g = p;
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Requests in flight on this model.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Takes a request onto the model when it is ready (or loading at start): counted in
    /// flight from here, under the phase lock, so no eviction can start between the check
    /// and the count.
    fn acquire(self: &Arc<Self>) -> Option<(Live, InFlight)> {
        let g = self.phase.lock().ok()?;
        let live = match &*g {
            Phase::Ready(l) => l.clone(),
            Phase::Loading {
                live,
                on_demand: false,
            } => live.clone(),
            _ => return None,
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
        Some((live, InFlight { slot: self.clone() }))
    }

    fn last_used(&self) -> Instant {
        self.last_used
            .lock()
            .map(|t| *t)
            .unwrap_or_else(|_| Instant::now())
    }
}

/// A request in flight on a model; dropped when its response (stream) ends. The model
/// counts as used until then (least recently used: by the end of its last request).
pub struct InFlight {
    slot: Arc<Slot>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut t) = self.slot.last_used.lock() {
            *t = Instant::now();
        }
        self.slot.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a model could not be loaded or registered, with the HTTP code DJL and SageMaker give.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    /// 404: no such model.
    NotFound(String),
    /// 409: the name is taken.
    Conflict(String),
    /// 507: it does not fit in the memory (or model count) left.
    NoRoom(String),
    /// 400: its files are missing or not a model.
    BadModel(String),
    /// 503: too many requests waiting, or it did not load in time.
    Busy(String),
}

impl LoadError {
    pub fn code(&self) -> u16 {
        match self {
            LoadError::NotFound(_) => 404,
            LoadError::Conflict(_) => 409,
            LoadError::NoRoom(_) => 507,
            LoadError::BadModel(_) => 400,
            LoadError::Busy(_) => 503,
        }
    }
    pub fn message(&self) -> &str {
        match self {
            LoadError::NotFound(m)
            | LoadError::Conflict(m)
            | LoadError::NoRoom(m)
            | LoadError::BadModel(m)
            | LoadError::Busy(m) => m,
        }
    }
    /// DJL's exception type names.
    pub fn kind(&self) -> &'static str {
        match self {
            LoadError::NotFound(_) => "ModelNotFoundException",
            LoadError::Conflict(_) => "ConflictException",
            LoadError::NoRoom(_) => "InsufficientMemoryException",
            LoadError::BadModel(_) => "BadRequestException",
            LoadError::Busy(_) => "ServiceUnavailableException",
        }
    }
}

pub struct Registry {
    pub base: Arc<ServingConfig>,
    /// The state the guard layers (API keys, limits, CORS) read; never loaded.
    pub front: Arc<AppState>,
    slots: RwLock<Vec<Arc<Slot>>>,
    default: RwLock<Option<String>>,
    /// One load or eviction decision at a time.
    admit: tokio::sync::Mutex<()>,
}

impl Registry {
    pub fn new(base: Arc<ServingConfig>, front: Arc<AppState>) -> Arc<Registry> {
        Arc::new(Registry {
            base,
            front,
            slots: RwLock::new(Vec::new()),
            default: RwLock::new(None),
            admit: tokio::sync::Mutex::new(()),
        })
    }

    pub fn slots(&self) -> Vec<Arc<Slot>> {
        self.slots.read().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn names(&self) -> Vec<String> {
        self.slots().iter().map(|s| s.name.clone()).collect()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Slot>> {
        self.slots().into_iter().find(|s| s.name == name)
    }

    /// The model routes that name none go to (the first registered).
    pub fn default_slot(&self) -> Option<Arc<Slot>> {
        let name = self.default.read().ok()?.clone()?;
        self.get(&name)
    }

    /// Whether the server holds (or may hold) several models: then `/ping`, `/v1/models` and
    /// `/metrics` speak for all of them and bodies are read for their `model`. A server of one
    /// model answers exactly as before the registry.
    pub fn is_multi(&self) -> bool {
        self.base.models.is_multi() || self.slots().len() > 1
    }

    fn insert(&self, slot: Arc<Slot>) {
        if let Ok(mut d) = self.default.write()
            && d.is_none()
        {
            *d = Some(slot.name.clone());
        }
        if let Ok(mut s) = self.slots.write() {
            s.push(slot);
        }
    }

    fn remove(&self, name: &str) {
        if let Ok(mut s) = self.slots.write() {
            s.retain(|x| x.name != name);
        }
        if let Ok(mut d) = self.default.write()
            && d.as_deref() == Some(name)
        {
            *d = self
                .slots
                .read()
                .ok()
                .and_then(|s| s.first().map(|x| x.name.clone()));
        }
    }

    /// The configuration a model named `name` loads with: the server's with its own spec,
    /// or its directory's serving.properties under the server's command line
    /// (`config::models::config_for_model`); option.adapters and
    /// option.speculative_draft_model belong to the first model (each model still finds the
    /// adapters in its own directory's `adapters/`).
    fn config_for(&self, name: &str, url: &str) -> anyhow::Result<ServingConfig> {
        let env: crate::config::EnvVars = std::env::vars().collect();
        let mut c = crate::config::models::config_for_model(&self.base, url, &env)?;
        c.served_model_name = Some(name.to_string());
        c.adapters.clear();
        c.speculative_draft_model = None;
        Ok(c)
    }

    /// A fresh state for the model `name` loading from `url`, with its own metrics.
    pub fn state_for(&self, name: &str, url: &str) -> anyhow::Result<Arc<AppState>> {
        let config = Arc::new(self.config_for(name, url)?);
        let (model_name, model_id) = crate::commands::serve::model_names(&config);
        Ok(Arc::new(AppState::new(
            config,
            Arc::new(ServerMetrics::new()),
            model_name,
            model_id,
        )))
    }

    fn live(state: Arc<AppState>, bytes: u64) -> Live {
        Live {
            app: crate::router::model_routes(state.clone()),
            state,
            bytes,
            since: SystemTime::now(),
        }
    }

    /// Registers a model loading at start: its state exists now (its routes answer 503
    /// until it is loaded, as a single-model server's do); [`Registry::finish_start`] ends it.
    pub fn add_starting(&self, state: Arc<AppState>, url: &str) {
        let name = state.model_name.clone();
        self.insert(Slot::new(
            name,
            url.to_string(),
            true,
            Phase::Loading {
                live: Self::live(state, 0),
                on_demand: false,
            },
        ));
    }

    /// Registers a model that loads when a request names it.
    pub fn add_loadable(&self, name: &str, url: &str) {
        if self.get(name).is_none() {
            self.insert(Slot::new(
                name.to_string(),
                url.to_string(),
                false,
                Phase::Unloaded,
            ));
        }
    }

    /// A model added to option.models_dir since the server started, by name.
    pub fn rescan(&self, name: &str) -> Option<Arc<Slot>> {
        let dir = self.base.models.models_dir.as_ref()?;
        let found = crate::config::models::scan_dir(dir).ok()?;
        let (_, path) = found.into_iter().find(|(n, _)| n == name)?;
        self.add_loadable(name, &path.to_string_lossy());
        self.get(name)
    }

    /// Marks a model loading at start as loaded (or failed).
    pub fn finish_start(&self, name: &str, result: anyhow::Result<crate::app::LoadedModel>) {
        let Some(slot) = self.get(name) else { return };
        let Phase::Loading { live, .. } = slot.phase() else {
            return;
        };
        match result {
            Ok(model) => {
                let bytes = footprint(&model.model_dir, self.base.kv_cache_bytes);
                if live.state.set_loaded(model).is_ok() {
                    slot.set_phase(Phase::Ready(Live { bytes, ..live }));
                }
            }
            Err(e) => slot.set_phase(Phase::Failed(format!("{e:#}"))),
        }
    }

    /// Registers `name` from `url` and loads it (management API). `synchronous=false`: the
    /// load runs in the background and this returns once it is admitted.
    pub async fn register(
        self: &Arc<Self>,
        name: &str,
        url: &str,
        synchronous: bool,
    ) -> Result<(), LoadError> {
        if let Some(s) = self.get(name) {
            // A failed or unloaded registration may be registered again.
            match s.phase() {
                Phase::Failed(_) | Phase::Unloaded => self.remove(name),
                _ => {
                    return Err(LoadError::Conflict(format!(
                        "Model {name} is already registered."
                    )));
                }
            }
        }
        let slot = Slot::new(name.to_string(), url.to_string(), false, Phase::Unloaded);
        self.insert(slot.clone());
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

    /// Loads `slot` (its phase Unloaded or Failed); `evict`: unloads idle models to make
    /// room (on demand), else answers 507 when it does not fit.
    async fn load(self: &Arc<Self>, slot: &Arc<Slot>, evict: bool) -> Result<(), LoadError> {
        let admit = self.admit.lock().await;
        match slot.phase() {
            Phase::Unloaded | Phase::Failed(_) => {}
            // Another request started it meanwhile.
            _ => return Ok(()),
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
            let msg = format!("model {} ({}): {e:#}", slot.name, slot.url);
            slot.set_phase(Phase::Failed(msg.clone()));
            LoadError::BadModel(msg)
        })?;
        let bytes = footprint(resolved.gguf.as_deref().unwrap_or(&resolved.dir), kv);
        if let Err(e) = self.make_room(&slot.name, bytes, evict).await {
            slot.set_phase(Phase::Unloaded);
            return Err(e);
        }
        let state = self.state_for(&slot.name, &slot.url).map_err(|e| {
            let msg = format!("model {} ({}): {e:#}", slot.name, slot.url);
            slot.set_phase(Phase::Failed(msg.clone()));
            LoadError::BadModel(msg)
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
                slot.set_phase(Phase::Failed(msg.clone()));
                Err(LoadError::BadModel(msg))
            }
            Err(e) => {
                slot.set_phase(Phase::Failed(e.to_string()));
                Err(LoadError::BadModel(e.to_string()))
            }
        }
    }

    /// Bytes the loaded models take, and how many there are (loading ones count).
    fn usage(&self) -> (u64, usize) {
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
    /// is allowed; waits (up to option.model_load_timeout) while every candidate is busy;
    /// 507 when it cannot ever fit, or no model became idle in time.
    async fn make_room(&self, name: &str, bytes: u64, evict: bool) -> Result<(), LoadError> {
        let m = &self.base.models;
        let deadline = Instant::now() + m.load_timeout;
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
    fn idle_lru(&self, except: &str) -> Option<Arc<Slot>> {
        self.slots()
            .into_iter()
            .filter(|s| s.name != except && matches!(s.phase(), Phase::Ready(_)))
            .filter(|s| s.in_flight() == 0 && s.waiting.load(Ordering::SeqCst) == 0)
            .min_by_key(|s| s.last_used())
    }

    /// Unloads an idle ready model (it stays registered, loadable again). Returns false when
    /// a request reached it first.
    async fn unload(&self, slot: &Arc<Slot>, why: &str) -> bool {
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
                Phase::Unloaded | Phase::Failed(_) => None,
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
            match slot.phase() {
                Phase::Failed(m) if started => return Err(failed_load(&m)),
                Phase::Unloaded | Phase::Failed(_) => {
                    // This request starts the load (again, after a failure); others wait on
                    // the phase change.
                    started = true;
                    slot.set_phase(Phase::Unloaded);
                    let reg = self.clone();
                    let s = slot.clone();
                    tokio::spawn(async move {
                        if let Err(e) = reg.load(&s, true).await {
                            tracing::warn!("on-demand load: {}", e.message());
                            if matches!(e, LoadError::NoRoom(_)) {
                                s.set_phase(Phase::Failed(e.message().to_string()));
                            }
                        }
                    });
                }
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

/// A failed load reads as 507 when it was for room, else as the bad model it is.
fn failed_load(m: &str) -> LoadError {
    if m.contains("does not fit") || m.contains("needs about") {
        LoadError::NoRoom(m.to_string())
    } else {
        LoadError::BadModel(m.to_string())
    }
}

struct Waiter<'a>(&'a Slot);

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
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

/// The weights' bytes on disk (a GGUF file, or the checkpoint files of a directory) plus the
/// KV cache: what a model takes from option.models_memory.
pub fn footprint(path: &Path, kv_cache_bytes: usize) -> u64 {
    let weights = if path.is_file() {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    } else {
        std::fs::read_dir(path)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        let p = e.path();
                        p.extension().is_some_and(|x| {
                            x == "safetensors" || x == "gguf" || x == "bin" || x == "pt"
                        })
                    })
                    .filter_map(|e| e.metadata().ok().map(|m| m.len()))
                    .sum()
            })
            .unwrap_or(0)
    };
    weights + kv_cache_bytes as u64
}

/// MemAvailable from /proc/meminfo (None elsewhere).
fn available_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{EnvVars, ServeArgs};

    fn registry(options: &[&str]) -> Arc<Registry> {
        let cli = ServeArgs {
            options: options.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let config = Arc::new(ServingConfig::load(&cli, &EnvVars::new(), None).unwrap());
        let front = Arc::new(AppState::new(
            config.clone(),
            Arc::new(ServerMetrics::new()),
            "front".into(),
            "front".into(),
        ));
        Registry::new(config, front)
    }

    /// A ready slot of `mib` MiB (its state never loads: only the registry's rules run).
    fn ready(reg: &Registry, name: &str, mib: u64) -> Arc<Slot> {
        let live = Registry::live(reg.state_for(name, "/nowhere").unwrap(), mib << 20);
        let slot = Slot::new(name.into(), "/nowhere".into(), false, Phase::Ready(live));
        reg.insert(slot.clone());
        slot
    }

    #[tokio::test]
    async fn eviction_takes_the_least_recently_used_idle_model_never_a_busy_one() {
        let reg = registry(&["option.models_memory=10M", "option.model_load_timeout=0"]);
        let a = ready(&reg, "a", 4);
        let b = ready(&reg, "b", 4);
        assert_eq!(reg.default_slot().unwrap().name, "a");
        // b used after a: a is the least recently used.
        drop(b.acquire().unwrap());
        assert_eq!(reg.idle_lru("c").unwrap().name, "a");
        // a busy: b is the one to go, even though used later.
        let busy_a = a.acquire().unwrap();
        assert_eq!(reg.idle_lru("c").unwrap().name, "b");
        // Both busy: no room, 507 (no wait with model_load_timeout=0).
        let busy_b = b.acquire().unwrap();
        let e = reg.make_room("c", 4 << 20, true).await.unwrap_err();
        assert_eq!(e.code(), 507, "{e:?}");
        assert!(matches!(a.phase(), Phase::Ready(_)) && matches!(b.phase(), Phase::Ready(_)));
        // b's request ends: b is unloaded for c, a (busy) stays.
        drop(busy_b);
        reg.make_room("c", 4 << 20, true).await.unwrap();
        assert!(matches!(b.phase(), Phase::Unloaded));
        assert!(matches!(a.phase(), Phase::Ready(_)));
        // Bigger than the whole budget: 507 at once, nothing unloaded.
        let e = reg.make_room("d", 11 << 20, true).await.unwrap_err();
        assert_eq!(e.code(), 507);
        assert!(e.message().contains("option.models_memory"), "{e:?}");
        // A registration does not evict: 507 while a (now idle) holds the room.
        drop(busy_a);
        ready(&reg, "c", 4);
        let e = reg.make_room("d", 4 << 20, false).await.unwrap_err();
        assert_eq!(e.code(), 507);
        assert!(matches!(a.phase(), Phase::Ready(_)));
    }

    #[tokio::test]
    async fn max_loaded_models_counts_models() {
        let reg = registry(&["option.max_loaded_models=1", "option.model_load_timeout=0"]);
        let a = ready(&reg, "a", 1);
        reg.make_room("b", 1 << 20, true).await.unwrap();
        assert!(matches!(a.phase(), Phase::Unloaded));
        assert_eq!(reg.names(), ["a"]);
        reg.unregister("a").await.unwrap();
        assert!(reg.names().is_empty() && reg.default_slot().is_none());
        assert_eq!(reg.unregister("a").await.unwrap_err().code(), 404);
    }
}
