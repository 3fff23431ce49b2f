//! LMI's dynamic batching for the list-of-inputs schema: a batch opens with its first request
//! and is released when it holds `batch_size` inputs or `max_batch_delay` has passed since it
//! opened; its requests then enter the rolling batch together (the same scheduler step).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

pub struct DynamicBatcher {
    batch_size: usize,
    max_delay: Duration,
    open: Mutex<Option<Open>>,
}

struct Open {
    id: u64,
    inputs: usize,
    release: watch::Sender<bool>,
}

impl DynamicBatcher {
    pub fn new(batch_size: usize, max_delay: Duration) -> Self {
        DynamicBatcher {
            batch_size: batch_size.max(1),
            max_delay,
            open: Mutex::new(None),
        }
    }

    /// Waits until the batch this request of `inputs` inputs joins is released.
    pub async fn admit(&self, inputs: usize) {
        if self.batch_size <= 1 {
            return;
        }
        let (mut rx, timer) = {
            let Ok(mut open) = self.open.lock() else {
                return;
            };
            let fits = open
                .as_ref()
                .is_some_and(|b| b.inputs + inputs <= self.batch_size);
            if fits && let Some(b) = open.as_mut() {
                b.inputs += inputs;
                let rx = b.release.subscribe();
                if b.inputs >= self.batch_size
                    && let Some(full) = open.take()
                {
                    let _ = full.release.send(true);
                }
                (rx, None)
            } else {
                // Release the batch that cannot take us, and open a new one.
                if let Some(prev) = open.take() {
                    let _ = prev.release.send(true);
                }
                let (tx, rx) = watch::channel(false);
                let id = rand_id();
                if inputs >= self.batch_size {
                    let _ = tx.send(true);
                    (rx, None)
                } else {
                    *open = Some(Open {
                        id,
                        inputs,
                        release: tx,
                    });
                    (rx, Some(id))
                }
            }
        };
        if let Some(id) = timer {
            tokio::select! {
                _ = rx.wait_for(|v| *v) => {}
                _ = tokio::time::sleep(self.max_delay) => {
                    if let Ok(mut open) = self.open.lock()
                        && open.as_ref().is_some_and(|b| b.id == id)
                        && let Some(b) = open.take()
                    {
                        let _ = b.release.send(true);
                    }
                }
            }
        }
        let _ = rx.wait_for(|v| *v).await;
    }
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[tokio::test]
    async fn releases_when_full_or_after_the_delay() {
        let b = Arc::new(DynamicBatcher::new(4, Duration::from_millis(200)));
        let t = Instant::now();
        tokio::join!(b.admit(2), b.admit(2));
        assert!(
            t.elapsed() < Duration::from_millis(150),
            "a full batch goes at once"
        );
        let t = Instant::now();
        b.admit(1).await;
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(190),
            "a lone request waits for the delay: {waited:?}"
        );
        let t = Instant::now();
        DynamicBatcher::new(1, Duration::from_secs(5))
            .admit(3)
            .await;
        assert!(
            t.elapsed() < Duration::from_millis(50),
            "batch_size 1 never waits"
        );
    }
}
