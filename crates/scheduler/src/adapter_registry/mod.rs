//! The adapter registry and the host tier of the LoRA cache.
//!
//! Registering an adapter (at start, from `<model dir>/adapters/*` and `option.adapters`, or
//! through LMI's management API) checks it against the base model without reading its
//! weights (`lmi_checkpoint::peft::inspect`); API registrations must also come from an allowed
//! directory. Weights are read off the async runtime and the scheduler thread: at
//! registration with `preload`, else by the first request that names the adapter, which
//! waits in the scheduler's queue until they are in. Up to `option.max_cpu_loras` adapters
//! keep their weights here, least recently used evicted first (never a pinned one; a
//! request already holding the weights keeps them alive). The engine tier (`max_loras`
//! slots) is the scheduler's (`adapters.rs`).

mod metrics;
mod paths;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::peft::{AdapterInfo, LoraLimits, LoraWeights, inspect};

use crate::{AdapterId, AdapterRef, AdapterWeights};

pub use metrics::AdapterMetrics;
pub use paths::AllowedDirs;

/// A registry failure, with the HTTP status LMI answers it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// `option.enable_lora` is off (400 "LoRA is not enabled.").
    Disabled,
    /// The request or the adapter is invalid (400): the message says why.
    Invalid(String),
    NotFound(String),
    Duplicate(String),
    /// Pins would fill every engine slot (507 "No free lora slots").
    NoFreeSlots,
    /// Reading the weights failed (424).
    Load(String),
}

impl RegistryError {
    pub fn status(&self) -> u16 {
        match self {
            RegistryError::Disabled | RegistryError::Invalid(_) => 400,
            RegistryError::NotFound(_) => 404,
            RegistryError::Duplicate(_) => 409,
            RegistryError::NoFreeSlots => 507,
            RegistryError::Load(_) => 424,
        }
    }
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::Disabled => f.write_str("LoRA is not enabled."),
            RegistryError::Invalid(m) | RegistryError::Load(m) => f.write_str(m),
            RegistryError::NotFound(name) => write!(f, "Adapter {name} not found"),
            RegistryError::Duplicate(name) => write!(
                f,
                "Adapter {name} is already registered: delete it first to register it again"
            ),
            RegistryError::NoFreeSlots => f.write_str("No free lora slots"),
        }
    }
}

impl std::error::Error for RegistryError {}

/// An adapter name that is not registered; `Display` lists the registered ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAdapter {
    pub name: String,
    pub available: Vec<String>,
}

impl std::fmt::Display for UnknownAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Adapter {} is not registered", self.name)?;
        if self.available.is_empty() {
            write!(f, "; no adapters are registered")
        } else {
            write!(f, "; available adapters: {}", self.available.join(", "))
        }
    }
}

impl std::error::Error for UnknownAdapter {}

/// How an adapter is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// Read the weights now (else at first use).
    pub preload: bool,
    pub pin: bool,
    /// Configured by the operator (start-up adapters): any directory, bare .safetensors
    /// files allowed. API registrations are not trusted.
    pub trusted: bool,
}

/// What the management API lists for an adapter (LMI's item).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AdapterItem {
    pub name: String,
    pub src: String,
    pub preload: bool,
    pub pin: bool,
}

struct Entry {
    id: AdapterId,
    src: PathBuf,
    preload: bool,
    pin: bool,
    info: AdapterInfo,
    /// The weights' cell while loading or loaded; None when cold (not read, or evicted).
    host: Option<Arc<AdapterWeights>>,
    last_used: u64,
    /// Shared by every [`AdapterRef`] handed out: its count of holders beyond this one is the
    /// number of requests (queued, running or pinning) that use the adapter now.
    name: Arc<str>,
}

impl Entry {
    fn item(&self, name: &str) -> AdapterItem {
        AdapterItem {
            name: name.to_string(),
            src: self.src.display().to_string(),
            preload: self.preload,
            pin: self.pin,
        }
    }

    fn host_ready(&self) -> bool {
        matches!(self.host.as_ref().and_then(|c| c.get()), Some(Ok(_)))
    }
}

#[derive(Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    next_id: AdapterId,
    tick: u64,
}

pub struct AdapterRegistry {
    enabled: bool,
    config: ModelConfig,
    limits: LoraLimits,
    allowed: AllowedDirs,
    max_cpu_loras: usize,
    state: Mutex<State>,
    metrics: AdapterMetrics,
}

impl AdapterRegistry {
    pub fn new(
        enabled: bool,
        config: ModelConfig,
        max_rank: usize,
        allowed: AllowedDirs,
        max_cpu_loras: usize,
        metrics: AdapterMetrics,
    ) -> Arc<Self> {
        Arc::new(AdapterRegistry {
            enabled,
            config,
            limits: LoraLimits {
                max_rank,
                require_peft_dir: true,
            },
            allowed,
            max_cpu_loras: max_cpu_loras.max(1),
            state: Mutex::new(State {
                next_id: 1,
                ..Default::default()
            }),
            metrics,
        })
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `src` under `name` after checking it against the base model (blocking: the
    /// adapter's config and safetensors header are read, and its weights with `preload`).
    /// Pinning is the caller's next step ([`AdapterRegistry::adapter_ref`] then the
    /// scheduler), since the engine's slots decide it.
    pub fn register(
        self: &Arc<Self>,
        name: &str,
        src: &Path,
        how: Registration,
    ) -> Result<AdapterId, RegistryError> {
        if !self.enabled {
            return Err(RegistryError::Disabled);
        }
        let name = name.trim();
        if name.is_empty() || name.len() > 256 || name.chars().any(|c| c.is_control() || c == '/') {
            return Err(RegistryError::Invalid(
                "name must be 1 to 256 characters, without '/' or control characters".into(),
            ));
        }
        if how.pin && !how.preload {
            return Err(RegistryError::Invalid(
                "pin=true needs preload=true: a pinned adapter is loaded at registration".into(),
            ));
        }
        if self.state().entries.contains_key(name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        let src = if how.trusted {
            src.to_path_buf()
        } else {
            self.allowed.check(src).map_err(RegistryError::Invalid)?
        };
        let limits = LoraLimits {
            require_peft_dir: !how.trusted,
            ..self.limits
        };
        let info = inspect(&src, &self.config, limits)
            .map_err(|e| RegistryError::Invalid(e.to_string()))?;
        let host = if how.preload {
            let t = Instant::now();
            let w = LoraWeights::read(&info, &self.config)
                .map_err(|e| RegistryError::Load(e.to_string()))?;
            self.metrics.observe_load(t.elapsed());
            Some(Arc::new(AdapterWeights::ready(Arc::new(w))))
        } else {
            None
        };
        let id = {
            let mut st = self.state();
            if st.entries.contains_key(name) {
                return Err(RegistryError::Duplicate(name.to_string()));
            }
            let id = st.next_id;
            st.next_id += 1;
            st.tick += 1;
            let tick = st.tick;
            st.entries.insert(
                name.to_string(),
                Entry {
                    id,
                    src,
                    preload: how.preload,
                    pin: false,
                    info,
                    host,
                    last_used: tick,
                    name: Arc::from(name),
                },
            );
            self.evict_host(&mut st, Some(name));
            self.update_gauges(&st);
            id
        };
        tracing::info!("LoRA adapter {name:?} registered (id {id})");
        Ok(id)
    }

    /// Reads `name`'s weights now if they are not here (blocking): LMI's `preload=true`,
    /// and what pinning needs first.
    pub fn preload(self: &Arc<Self>, name: &str) -> Result<AdapterRef, RegistryError> {
        if !self.enabled {
            return Err(RegistryError::Disabled);
        }
        let r = self
            .adapter_ref(name)
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        // A load may be under way on another thread: wait for it.
        let started = Instant::now();
        loop {
            match r.weights.get() {
                Some(Ok(_)) => break,
                Some(Err(e)) => return Err(RegistryError::Load(e.clone())),
                None if started.elapsed() > std::time::Duration::from_secs(600) => {
                    return Err(RegistryError::Load(
                        "reading the weights took over 10 minutes".into(),
                    ));
                }
                None => std::thread::sleep(std::time::Duration::from_millis(2)),
            }
        }
        let mut st = self.state();
        if let Some(e) = st.entries.get_mut(name) {
            e.preload = true;
        }
        Ok(r)
    }

    /// Records `preload=false`: the weights may be dropped from host memory when others need
    /// the room.
    pub fn set_preload_off(&self, name: &str) -> Result<(), RegistryError> {
        let mut st = self.state();
        let e = st
            .entries
            .get_mut(name)
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        if e.pin {
            return Err(RegistryError::Invalid(
                "a pinned adapter stays loaded: preload=false is refused".into(),
            ));
        }
        e.preload = false;
        Ok(())
    }

    /// Marks a registered adapter pinned (after the scheduler pinned it in the engine).
    pub fn set_pinned(&self, name: &str) {
        let mut st = self.state();
        if let Some(e) = st.entries.get_mut(name) {
            e.pin = true;
        }
        self.update_gauges(&st);
    }

    /// Unregisters `name`; returns its id for the scheduler to retire.
    pub fn remove(&self, name: &str) -> Result<AdapterId, RegistryError> {
        if !self.enabled {
            return Err(RegistryError::Disabled);
        }
        let mut st = self.state();
        let e = st
            .entries
            .remove(name)
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))?;
        self.update_gauges(&st);
        tracing::info!("LoRA adapter {name:?} unregistered (id {})", e.id);
        Ok(e.id)
    }

    pub fn get(&self, name: &str) -> Result<AdapterItem, RegistryError> {
        if !self.enabled {
            return Err(RegistryError::Disabled);
        }
        self.state()
            .entries
            .get(name)
            .map(|e| e.item(name))
            .ok_or_else(|| RegistryError::NotFound(name.to_string()))
    }

    pub fn list(&self) -> Vec<AdapterItem> {
        self.state()
            .entries
            .iter()
            .map(|(n, e)| e.item(n))
            .collect()
    }

    /// Adapters that requests hold now, split as vLLM's `lora_requests_info` reports them:
    /// weights ready (running, or admissible at once) and weights still loading (waiting).
    pub fn in_use(&self) -> (Vec<String>, Vec<String>) {
        let (mut running, mut waiting) = (Vec::new(), Vec::new());
        for (n, e) in &self.state().entries {
            if Arc::strong_count(&e.name) <= 1 {
                continue;
            }
            match e.host.as_ref().and_then(|c| c.get()) {
                Some(Ok(_)) => running.push(n.clone()),
                _ => waiting.push(n.clone()),
            }
        }
        (running, waiting)
    }

    pub fn names(&self) -> Vec<String> {
        self.state().entries.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.state().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.state().entries.is_empty()
    }

    /// The adapter a request names: None or "" is the base model. A registered adapter whose
    /// weights are not here starts loading now, off this thread; the request waits for them
    /// in the scheduler's queue.
    pub fn resolve(
        self: &Arc<Self>,
        name: Option<&str>,
    ) -> Result<Option<AdapterRef>, UnknownAdapter> {
        let Some(name) = name.map(str::trim).filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        let r = self.adapter_ref(name).ok_or_else(|| UnknownAdapter {
            name: name.to_string(),
            available: self.names(),
        })?;
        self.metrics.count_request(name);
        Ok(Some(r))
    }

    /// A reference to `name`'s weights (loading them if cold), marking it used.
    pub fn adapter_ref(self: &Arc<Self>, name: &str) -> Option<AdapterRef> {
        let mut st = self.state();
        st.tick += 1;
        let tick = st.tick;
        let e = st.entries.get_mut(name)?;
        e.last_used = tick;
        let failed = matches!(e.host.as_ref().and_then(|c| c.get()), Some(Err(_)));
        let weights = match &e.host {
            Some(cell) if !failed => cell.clone(),
            _ => {
                let cell = Arc::new(AdapterWeights::pending());
                e.host = Some(cell.clone());
                self.start_load(name, e.info.clone(), cell.clone());
                cell
            }
        };
        Some(AdapterRef {
            id: e.id,
            name: e.name.clone(),
            weights,
        })
    }

    /// Reads an adapter's weights on a thread of its own, then updates the host tier.
    fn start_load(self: &Arc<Self>, name: &str, info: AdapterInfo, cell: Arc<AdapterWeights>) {
        let this = Arc::clone(self);
        let name = name.to_string();
        let cell2 = cell.clone();
        let spawned = std::thread::Builder::new()
            .name("lmi-lora-load".into())
            .spawn(move || {
                let t = Instant::now();
                let r = LoraWeights::read(&info, &this.config)
                    .map(Arc::new)
                    .map_err(|e| e.to_string());
                this.metrics.observe_load(t.elapsed());
                if let Err(e) = &r {
                    tracing::error!("loading LoRA adapter {name:?}: {e}");
                }
                // Ready and the tier back to size in one step under the lock: whoever sees
                // these weights ready also sees the eviction they caused (a request that came
                // in between found the evicted adapter still resident).
                let mut st = this.state();
                cell2.set(r);
                this.evict_host(&mut st, Some(&name));
                this.update_gauges(&st);
            });
        if let Err(e) = spawned {
            cell.set(Err(format!("cannot start a loader thread: {e}")));
        }
    }

    /// Keeps at most `max_cpu_loras` adapters' weights here: the least recently used
    /// unpinned ones are dropped (requests holding them keep them until they finish).
    fn evict_host(&self, st: &mut State, keep: Option<&str>) {
        loop {
            let ready = st.entries.values().filter(|e| e.host_ready()).count();
            if ready <= self.max_cpu_loras {
                return;
            }
            let victim = st
                .entries
                .iter()
                .filter(|(n, e)| e.host_ready() && !e.pin && Some(n.as_str()) != keep)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(n, _)| n.clone());
            let Some(v) = victim else { return };
            if let Some(e) = st.entries.get_mut(&v) {
                e.host = None;
                self.metrics.host_evictions.inc();
                tracing::debug!("LoRA adapter {v:?} evicted from host memory");
            }
        }
    }

    fn update_gauges(&self, st: &State) {
        self.metrics.registered.set(st.entries.len() as i64);
        let host = st.entries.values().filter(|e| e.host_ready()).count();
        self.metrics.host_resident.set(host as i64);
    }
}

#[cfg(test)]
mod tests;
