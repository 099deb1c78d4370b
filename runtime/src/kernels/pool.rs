//! A fork-join pool for the many small parallel loops of decoding.
//!
//! Decoding one token runs a few hundred matrix-vector products and attention
//! loops of 10–500 µs each. Handing each to a sleeping rayon pool and waiting
//! on its latch cost 16–23 µs per loop on a 2-core host (`memwall plan
//! --measure-host`'s fixed cost per product): two futex wake-ups, one to start
//! the workers and one to resume the caller. Here the caller takes part in the
//! work and the workers poll between loops, so a hand-off is a few cache-line
//! transfers; after [`IDLE`] without work they sleep on a condition variable,
//! so an idle model costs no CPU. Polling yields the core after a few hundred
//! pauses, so more threads than cores (`-t 8` on 2 cores) is slow, not stuck. ggml's thread pool spins the same
//! way between graph nodes.
//!
//! Tasks are claimed from a shared counter, so which thread runs a task varies
//! but each task's arithmetic does not: results never depend on the threads.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Polls of the job counter with a pause instruction between them; after
/// these a waiting thread yields its core between polls.
const SPIN: u32 = 256;

/// How long an idle worker keeps polling before it sleeps. Longer than the gap
/// between two loops of one decoded token (sampling included), so workers stay
/// awake while tokens are generated.
const IDLE: Duration = Duration::from_millis(2);

/// The current job: a lifetime-erased borrow of the caller's closure and its
/// task count. Valid from the `epoch` increment that publishes it until every
/// worker has reported back (`busy` reaches zero), which [`Pool::run`] waits
/// for before returning.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
}

struct Shared {
    /// Incremented (Release) once per job after `job` is written.
    epoch: AtomicU64,
    job: UnsafeCell<Job>,
    /// The next unclaimed task of the current job.
    next: AtomicUsize,
    /// Workers that have not finished the current job yet.
    busy: AtomicUsize,
    /// Workers asleep (or about to be) on `wake`.
    sleepers: AtomicUsize,
    /// A task panicked on a worker; the caller re-raises it.
    panicked: AtomicBool,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread holding `Pool::caller`, while no
// worker reads it (all have reported back for the previous job), and read by
// workers only after an Acquire load of `epoch` that follows the write. The
// closure it points to is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// Threads that run the tasks of one loop at a time, the caller included.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one job at a time.
    caller: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.threads())
    }
}

impl Pool {
    /// A pool of `threads` threads in all: the caller and `threads - 1`
    /// workers. `None` when the system refuses a thread (callers then run
    /// loops on their own thread).
    pub fn new(threads: usize) -> Option<Pool> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(Job { f: &|_| {}, n: 0 }),
            next: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut pool = Pool {
            shared,
            workers: Vec::new(),
            caller: Mutex::new(()),
        };
        for i in 1..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("memwall-worker-{i}"))
                .spawn(move || worker(&shared))
                .ok()?;
            pool.workers.push(handle);
        }
        Some(pool)
    }

    /// Threads that run tasks, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0) … f(n - 1)`, spread over the pool's threads, and returns
    /// when all have run. A panic in a task is re-raised here.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        // A nested or concurrent call runs on its own thread rather than wait.
        let guard = match self.caller.try_lock() {
            Ok(g) => g,
            Err(_) => {
                (0..n).for_each(f);
                return;
            }
        };
        if n <= 1 || self.workers.is_empty() {
            (0..n).for_each(f);
            return;
        }
        let s = &*self.shared;
        // SAFETY: only `f`'s lifetime is erased; the pointer is dropped by every
        // worker before this function returns (the `busy` wait below).
        let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        // SAFETY: no worker reads `job` now: all reported back for the last job
        // (`busy` was zero when that call returned) and none has seen the new
        // epoch yet.
        unsafe { *s.job.get() = Job { f: f_static, n } };
        s.next.store(0, Ordering::Relaxed);
        s.busy.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| claim(s, f, n)));
        let mut spins = 0u32;
        while s.busy.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        drop(guard);
        if let Err(payload) = mine {
            std::panic::resume_unwind(payload);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a task of the thread pool panicked");
        }
    }
}

/// Claims and runs tasks of the current job until none are left.
fn claim(s: &Shared, f: &(dyn Fn(usize) + Sync), n: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            return;
        }
        f(i);
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let mut idle_since = None;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            spins += 1;
            if spins < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < IDLE {
                std::thread::yield_now();
                continue;
            }
            // Sleep until the next job. `sleepers` is raised before the epoch
            // is checked again under the lock, and the caller reads `sleepers`
            // after raising the epoch: one of the two sees the other.
            let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            spins = 0;
            idle_since = None;
        };
        seen = epoch;
        // SAFETY: the Acquire load of `epoch` above follows the caller's write
        // of `job`, and the caller keeps the closure alive until `busy` is 0.
        let job = unsafe { *s.job.get() };
        // SAFETY: as above.
        let f = unsafe { &*job.f };
        if catch_unwind(AssertUnwindSafe(|| claim(s, f, job.n))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.busy.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _l = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Splits `out` into `chunk`-sized pieces and runs `work(index, piece)` for
/// each on `pool` (or on this thread without one), like rayon's
/// `par_chunks_mut().enumerate().for_each()`.
pub fn for_each_chunk<T: Send>(
    pool: Option<&Pool>,
    out: &mut [T],
    chunk: usize,
    work: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk = chunk.max(1);
    let n = out.len().div_ceil(chunk);
    match pool {
        Some(p) if n > 1 => {
            let len = out.len();
            let base = SendPtr(out.as_mut_ptr());
            p.run(n, &|i| {
                let start = i * chunk;
                let end = (start + chunk).min(len);
                // SAFETY: task `i` is the only one given elements
                // `start..end`, which lie inside `out`, borrowed mutably for
                // the whole `run`.
                let piece =
                    unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
                work(i, piece);
            });
        }
        _ => out
            .chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| work(i, c)),
    }
}

/// A raw pointer that may cross threads (disjoint pieces only; see
/// [`for_each_chunk`]).
struct SendPtr<T>(*mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SendPtr<T> {}

impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: used only to hand disjoint sub-slices of one `&mut [T]` to tasks.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_on_any_thread_count() {
        for threads in [1, 2, 3, 8] {
            let pool = Pool::new(threads).unwrap();
            for n in [0, 1, 2, 7, 100, 1000] {
                let mut out = vec![0u32; n];
                for_each_chunk(Some(&pool), &mut out, 3, |i, c| {
                    for (j, v) in c.iter_mut().enumerate() {
                        *v += (i * 3 + j) as u32 + 1;
                    }
                });
                assert!(out.iter().enumerate().all(|(i, &v)| v == i as u32 + 1));
            }
        }
    }

    #[test]
    fn sleeping_workers_wake_for_the_next_job() {
        let pool = Pool::new(3).unwrap();
        let count = AtomicUsize::new(0);
        pool.run(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        // Long enough for every worker to stop spinning and sleep.
        std::thread::sleep(std::time::Duration::from_millis(200));
        pool.run(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 20);
    }

    #[test]
    fn a_panicking_task_is_re_raised_and_the_pool_still_works() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, &|i| assert!(i != 40, "task 40"));
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(64, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 64);
    }
}
