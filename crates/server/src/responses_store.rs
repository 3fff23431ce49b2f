//! The Responses API's store: finished responses kept in memory, at most
//! `option.responses_store` of them (least recently used dropped first; 0 keeps none), so a
//! conversation can go on by `previous_response_id` and `GET`/`DELETE /v1/responses/{id}`
//! find them. Nothing survives a restart, as nothing here is written to disk.

use std::collections::HashMap;
use std::sync::Mutex;

use lmi_api::openai::ChatMessage;
use serde_json::Value;

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response object as it was returned.
    pub response: Value,
    /// The conversation up to and including this response's reply, without `instructions`
    /// (a continuation brings its own, as OpenAI's does).
    pub conversation: Vec<ChatMessage>,
}

struct Entry {
    stored: Stored,
    used: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    clock: u64,
}

pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl ResponseStore {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// False when the store is off (`option.responses_store=0`).
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves plain data behind: keep using it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn put(&self, id: String, stored: Stored) {
        if self.capacity == 0 {
            return;
        }
        let mut g = self.lock();
        g.clock += 1;
        let used = g.clock;
        g.entries.insert(id, Entry { stored, used });
        // Over capacity by one at most: drop the least recently used (a scan over at most
        // `capacity` entries, once per stored response).
        if g.entries.len() > self.capacity
            && let Some(oldest) = g
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
        {
            g.entries.remove(&oldest);
        }
    }

    /// The stored response (and marks it used).
    /// Whether `id` is stored (without counting as a use).
    pub fn contains(&self, id: &str) -> bool {
        self.lock().entries.contains_key(id)
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        let mut g = self.lock();
        g.clock += 1;
        let now = g.clock;
        let e = g.entries.get_mut(id)?;
        e.used = now;
        Some(e.stored.clone())
    }

    pub fn remove(&self, id: &str) -> bool {
        self.lock().entries.remove(id).is_some()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(n: u64) -> Stored {
        Stored {
            response: serde_json::json!({"n": n}),
            conversation: Vec::new(),
        }
    }

    #[test]
    fn least_recently_used_goes_first() {
        let s = ResponseStore::new(2);
        s.put("a".into(), stored(1));
        s.put("b".into(), stored(2));
        assert!(s.get("a").is_some()); // a is now newer than b
        s.put("c".into(), stored(3));
        assert_eq!(s.len(), 2);
        assert!(s.get("b").is_none());
        assert_eq!(s.get("a").unwrap().response["n"], 1);
        assert!(s.remove("c") && !s.remove("c"));
    }

    #[test]
    fn zero_keeps_nothing() {
        let s = ResponseStore::new(0);
        s.put("a".into(), stored(1));
        assert!(!s.enabled() && s.get("a").is_none());
    }
}
