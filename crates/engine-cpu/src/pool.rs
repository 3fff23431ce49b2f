//! A fork-join pool for the forward pass's short parallel loops, whose threads spin between
//! them instead of sleeping.
//!
//! A decode step runs a few hundred parallel loops (each product, attention, the larger
//! row-wise ops), separated by a few microseconds to tens of microseconds of work on the
//! calling thread. Rayon's idle workers yield for a while and then sleep, and waking one costs
//! tens of microseconds (an IPI, more under a hypervisor): measured on a 2-vCPU VM, a loop of
//! 20 µs of work after 20 µs alone took 57 µs instead of 30, and after 100 µs alone 190 instead
//! of 110 (`examples/rayonprof.rs`), so at 16 decode rows the second core added only a fifth.
//! Here the workers spin on a generation counter for [`SPIN`] after their last task, then
//! sleep on a condition variable until the next loop; the caller takes tasks too.
//!
//! One caller at a time holds the pool; a loop started while another holds it (a second
//! engine's thread) runs on rayon instead, and a loop inside a task runs on its own thread.
//! Tasks are independent and write disjoint outputs, so results do not depend on which
//! thread runs which task.

use std::any::Any;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rayon::prelude::*;

/// How long an idle worker spins before it sleeps: longer than the gaps inside a step and
/// between steps of a busy server, short enough not to hold a core long once it goes quiet.
const SPIN: Duration = Duration::from_millis(2);

/// One loop: `f(i)` for `i < n`, handed out one index at a time.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Takes tasks until none are left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Relaxed);
            if i >= self.n {
                return;
            }
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| (self.f)(i)))
                && let Ok(mut slot) = self.panic.lock()
            {
                slot.get_or_insert(p);
            }
            self.done.fetch_add(1, Release);
        }
    }
}

struct Pool {
    workers: usize,
    /// The loop in progress (a `Job` on its caller's stack), or null.
    job: AtomicPtr<Job<'static>>,
    /// Bumped for every loop, so that workers see a new one.
    generation: AtomicUsize,
    /// Workers inside the current job: the caller waits for them to leave before its job
    /// goes out of scope.
    active: AtomicUsize,
    sleepers: AtomicUsize,
    busy: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

thread_local! {
    /// Whether this thread is running a pool task (its own loops run inline).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            workers: rayon::current_num_threads().max(1) - 1,
            job: AtomicPtr::new(std::ptr::null_mut()),
            generation: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        for w in 0..pool.workers {
            let spawned = std::thread::Builder::new()
                .name(format!("lmi-cpu-{w}"))
                .spawn(move || pool.worker());
            if spawned.is_err() {
                // Without that worker the loops still finish: the caller takes every task.
                tracing::warn!("could not start CPU worker thread {w}");
            }
        }
        pool
    })
}

impl Pool {
    fn worker(&self) {
        IN_TASK.with(|t| t.set(true));
        let mut seen = self.generation.load(SeqCst);
        loop {
            self.wait_past(seen);
            seen = self.generation.load(SeqCst);
            self.active.fetch_add(1, SeqCst);
            let job = self.job.load(SeqCst);
            if !job.is_null() {
                // SAFETY: the caller keeps its job alive until `active` is zero again, and it
                // reads `active` only after clearing `job` (both SeqCst): a job seen here is
                // still alive.
                unsafe { (*job).work() };
            }
            self.active.fetch_sub(1, SeqCst);
        }
    }

    /// Returns once the generation is past `seen`: spinning for [`SPIN`], then asleep.
    fn wait_past(&self, seen: usize) {
        let start = Instant::now();
        let mut spins = 0u32;
        while self.generation.load(Acquire) == seen {
            pause(spins);
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                let Ok(mut guard) = self.lock.lock() else {
                    return;
                };
                self.sleepers.fetch_add(1, SeqCst);
                while self.generation.load(SeqCst) == seen {
                    guard = match self.wake.wait(guard) {
                        Ok(g) => g,
                        Err(_) => break,
                    };
                }
                self.sleepers.fetch_sub(1, SeqCst);
                return;
            }
        }
    }

    /// Runs `job` with the workers; returns when every task is done and no worker is
    /// inside it.
    fn run(&self, job: &Job<'_>) {
        // SAFETY: only the lifetime is erased; `job` outlives every worker's use of it (the
        // wait on `active` below).
        let erased = job as *const Job<'_> as *mut Job<'static>;
        self.job.store(erased, SeqCst);
        self.generation.fetch_add(1, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            let _guard = self.lock.lock();
            self.wake.notify_all();
        }
        IN_TASK.with(|t| t.set(true));
        job.work();
        IN_TASK.with(|t| t.set(false));
        let mut spins = 0u32;
        while job.done.load(Acquire) < job.n {
            pause(spins);
            spins = spins.wrapping_add(1);
        }
        self.job.store(std::ptr::null_mut(), SeqCst);
        while self.active.load(SeqCst) != 0 {
            pause(spins);
            spins = spins.wrapping_add(1);
        }
    }
}

/// One round of a wait: a few hundred cycles' pause at first, then the rest of the time
/// slice to others, so that a waiter on a busy machine does not keep the thread it waits
/// for (descheduled) off the core.
#[inline]
fn pause(spins: u32) {
    if spins < 256 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Runs `f(i)` for every `i < n`, in parallel on the pool (the calling thread included);
/// returns when all have run. A panic in a task is raised here once all have finished.
pub fn run(n: usize, f: impl Fn(usize) + Sync) {
    if n == 0 {
        return;
    }
    let inline = n == 1 || IN_TASK.with(|t| t.get());
    let pool = if inline { None } else { Some(pool()) };
    let Some(pool) = pool.filter(|p| p.workers > 0) else {
        (0..n).for_each(f);
        return;
    };
    if pool.busy.swap(true, Acquire) {
        let f = &f;
        (0..n).into_par_iter().for_each(f);
        return;
    }
    let job = Job {
        f: &f,
        n,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    pool.run(&job);
    pool.busy.store(false, Release);
    if let Some(p) = job.panic.into_inner().ok().flatten() {
        resume_unwind(p);
    }
}

/// Threads a loop may run on (the caller and the workers).
pub fn threads() -> usize {
    pool().workers + 1
}

/// Shares a pointer to disjoint parts of a slice with the tasks.
struct Parts<T>(*mut T);
// SAFETY: each task touches only its own part (see `chunks_mut`).
unsafe impl<T: Send> Send for Parts<T> {}
unsafe impl<T: Send> Sync for Parts<T> {}

/// `f(c, chunk)` for each `size`-long chunk of `out` (the last may be shorter), as [`run`].
pub fn chunks_mut<T: Send>(out: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let size = size.max(1);
    let len = out.len();
    let base = Parts(out.as_mut_ptr());
    run(len.div_ceil(size), |c| {
        let start = c * size;
        let base = &base;
        // SAFETY: chunk c is out[start..start + size] (clipped), disjoint from every other
        // task's and inside `out`, which outlives the loop.
        let chunk =
            unsafe { std::slice::from_raw_parts_mut(base.0.add(start), size.min(len - start)) };
        f(c, chunk);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        for n in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            run(n, |i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
        }
    }

    #[test]
    fn chunks_cover_the_slice_and_nested_loops_run_inline() {
        let mut out = vec![0usize; 103];
        chunks_mut(&mut out, 10, |c, chunk| {
            assert!(chunk.len() == 10 || (c == 10 && chunk.len() == 3));
            let inner = AtomicUsize::new(0);
            run(4, |_| {
                inner.fetch_add(1, Relaxed);
            });
            chunk.fill(c + inner.load(Relaxed));
        });
        for (j, &v) in out.iter().enumerate() {
            assert_eq!(v, j / 10 + 4);
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_after_the_rest() {
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            run(64, |i| {
                ran.fetch_add(1, Relaxed);
                assert!(i != 7, "task 7 fails");
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Relaxed), 64);
        // The pool is free again.
        let after = AtomicUsize::new(0);
        run(8, |_| {
            after.fetch_add(1, Relaxed);
        });
        assert_eq!(after.load(Relaxed), 8);
    }

    #[test]
    fn loops_from_several_threads_all_finish() {
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        run(16, |i| {
                            sum.fetch_add(i + t, Relaxed);
                        });
                        assert_eq!(sum.load(Relaxed), 120 + 16 * t);
                    }
                });
            }
        });
    }
}
