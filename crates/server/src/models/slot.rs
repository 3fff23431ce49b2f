//! One model's place in the registry: its phase, and the requests it has in flight.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use axum::Router;

use crate::app::AppState;

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
    /// Its last load failed (the error says why).
    Failed(super::LoadError),
    /// Its last load found no room (a 507: every loaded model busy, or the budget full of
    /// models that cannot be evicted). Not loaded, and not broken: the next request (or
    /// registration) tries again.
    NoRoom(super::LoadError),
    /// Being unregistered: finishing its requests, taking no new ones.
    Draining(Live),
}

impl Phase {
    /// Not loaded, and loadable again by the next request that names it.
    pub(super) fn loadable(&self) -> bool {
        matches!(self, Phase::Unloaded | Phase::Failed(_) | Phase::NoRoom(_))
    }

    /// Why its last load did not make it ready.
    pub fn error(&self) -> Option<&super::LoadError> {
        match self {
            Phase::Failed(e) | Phase::NoRoom(e) => Some(e),
            _ => None,
        }
    }

    pub(super) fn live(&self) -> Option<&Live> {
        match self {
            Phase::Loading { live, .. } | Phase::Ready(live) | Phase::Draining(live) => Some(live),
            _ => None,
        }
    }

    /// DJL's model status words (and NO_ROOM, ours).
    pub fn status(&self) -> &'static str {
        match self {
            Phase::Unloaded => "UNLOADED",
            Phase::Loading { .. } => "PENDING",
            Phase::Ready(_) => "READY",
            Phase::Failed(_) => "FAILED",
            Phase::NoRoom(_) => "NO_ROOM",
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
    pub(super) phase: Mutex<Phase>,
    /// Bumped at every phase change; waiters watch it.
    pub(super) changed: tokio::sync::watch::Sender<u64>,
    in_flight: Arc<AtomicUsize>,
    /// Requests waiting for this model to load.
    pub(super) waiting: AtomicUsize,
    /// An on-demand load of it is queued or running.
    pub(super) load_queued: AtomicBool,
    last_used: Mutex<Instant>,
}

impl Slot {
    pub(super) fn new(
        name: String,
        url: String,
        loaded_at_startup: bool,
        phase: Phase,
    ) -> Arc<Slot> {
        Arc::new(Slot {
            name,
            url,
            loaded_at_startup,
            phase: Mutex::new(phase),
            changed: tokio::sync::watch::channel(0).0,
            in_flight: Arc::new(AtomicUsize::new(0)),
            waiting: AtomicUsize::new(0),
            load_queued: AtomicBool::new(false),
            last_used: Mutex::new(Instant::now()),
        })
    }

    pub fn phase(&self) -> Phase {
        self.phase
            .lock()
            .map(|p| p.clone())
            .unwrap_or(Phase::Unloaded)
    }

    pub(super) fn set_phase(&self, p: Phase) {
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
    pub(super) fn acquire(self: &Arc<Self>) -> Option<(Live, InFlight)> {
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

    pub(super) fn last_used(&self) -> Instant {
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

/// A request waiting for its model to load (counted against option.job_queue_size).
pub(super) struct Waiter<'a>(pub(super) &'a Slot);

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}
