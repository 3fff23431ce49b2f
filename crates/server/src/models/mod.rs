//! The registry of models one server holds (issue 54). Each model is a [`Slot`]: its name,
//! where it comes from, and while it is loaded its own [`AppState`] (engine, scheduler
//! thread, KV cache, adapters, metrics) with the routes bound to it. The front router
//! (`dispatch.rs`) picks a slot per request and hands the request to that slot's routes, so
//! every route is written once, for one model. The management API (`manage.rs`) adds and
//! removes slots; models named by option.models_dir load on demand, and the least recently
//! used idle model is unloaded when option.max_loaded_models or option.models_memory need
//! room. A model with a request in flight is never unloaded: the request holds an
//! [`InFlight`] token until its response (stream) ends. `slot.rs` holds a model's phase and
//! counts, `lifecycle.rs` loading, eviction and unloading, `memory.rs` the budget's units.

pub mod dispatch;
mod error;
mod lifecycle;
pub mod manage;
mod memory;
pub mod metrics_text;
mod slot;

use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use crate::app::AppState;
use crate::config::ServingConfig;
use crate::metrics::ServerMetrics;

pub use error::LoadError;
pub use memory::footprint;
pub use slot::{InFlight, Live, Phase, Slot};

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

    /// Adds a registration's slot, in one step with the check that its name is free: a name
    /// that is only known (unloaded), failed or without room is taken over in its place (the default stays
    /// the default); one loaded, loading or draining is a 409.
    fn claim(&self, slot: Arc<Slot>) -> Result<(), LoadError> {
        let mut v = self
            .slots
            .write()
            .map_err(|_| LoadError::Busy("the registry's lock is poisoned".into()))?;
        match v.iter().position(|s| s.name == slot.name) {
            Some(i) => match v[i].phase() {
                p if p.loadable() => v[i] = slot,
                _ => {
                    return Err(LoadError::Conflict(format!(
                        "Model {} is already registered.",
                        slot.name
                    )));
                }
            },
            None => {
                if let Ok(mut d) = self.default.write()
                    && d.is_none()
                {
                    *d = Some(slot.name.clone());
                }
                v.push(slot);
            }
        }
        Ok(())
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
            Err(e) => slot.set_phase(Phase::Failed(LoadError::BadModel(format!("{e:#}")))),
        }
    }
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
        let reg = registry(&["option.models_memory=10M", "option.evict_wait=0"]);
        let a = ready(&reg, "a", 4);
        let b = ready(&reg, "b", 4);
        assert_eq!(reg.default_slot().unwrap().name, "a");
        // b used after a: a is the least recently used.
        drop(b.acquire().unwrap());
        assert_eq!(reg.idle_lru("c").unwrap().name, "a");
        // a busy: b is the one to go, even though used later.
        let busy_a = a.acquire().unwrap();
        assert_eq!(reg.idle_lru("c").unwrap().name, "b");
        // Both busy: no room, 507 (no wait with option.evict_wait=0).
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

    #[test]
    fn a_registration_takes_over_only_a_free_name_in_its_place() {
        let reg = registry(&[]);
        reg.add_loadable("a", "/a");
        ready(&reg, "b", 1);
        let again = |name: &str| Slot::new(name.into(), "/new".into(), false, Phase::Unloaded);
        assert_eq!(reg.claim(again("b")).unwrap_err().code(), 409);
        reg.claim(again("a")).unwrap();
        reg.claim(again("c")).unwrap();
        assert_eq!(reg.names(), ["a", "b", "c"]);
        let a = reg.default_slot().unwrap();
        assert_eq!((a.name.as_str(), a.url.as_str()), ("a", "/new"));
    }

    #[tokio::test]
    async fn max_loaded_models_counts_models() {
        let reg = registry(&["option.max_loaded_models=1", "option.evict_wait=0"]);
        let a = ready(&reg, "a", 1);
        reg.make_room("b", 1 << 20, true).await.unwrap();
        assert!(matches!(a.phase(), Phase::Unloaded));
        assert_eq!(reg.names(), ["a"]);
        reg.unregister("a").await.unwrap();
        assert!(reg.names().is_empty() && reg.default_slot().is_none());
        assert_eq!(reg.unregister("a").await.unwrap_err().code(), 404);
    }
}
