//! Streaming weights past the memory wall. A background thread reads the
//! pages of the matrices about to be multiplied into memory
//! (`MADV_POPULATE_READ`: read from storage and mapped, so the compute threads
//! take no page faults) and pages out each matrix once its product is done
//! (`MADV_PAGEOUT`), in the order asked, so that under a memory cap the page
//! cache holds what comes next rather than what was used last — the opposite
//! of what least-recently-used eviction does with a model read in a cycle.
//! The pinned part of the model is locked separately (`mlock`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;

/// What to do with a range of a mapped model file.
#[derive(Clone, Copy, Debug)]
pub(super) enum Job {
    /// Read it in and map it.
    Populate,
    /// Reclaim its pages.
    PageOut,
}

/// The background thread and its queue: (job, unit, address, length).
pub(super) struct Prefetcher {
    tx: Option<Sender<(Job, usize, usize, usize)>>,
    handle: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts the thread (`None` if the OS refuses one; streaming then only
    /// pins). `wanted[u]` says whether unit `u` is still to be read: a read
    /// whose unit was used and released before the thread got to it is
    /// skipped (reading it then would fetch it twice per token).
    pub(super) fn start(wanted: Arc<[AtomicBool]>) -> Option<Prefetcher> {
        let (tx, rx) = channel::<(Job, usize, usize, usize)>();
        let handle = std::thread::Builder::new()
            .name("memwall-prefetch".into())
            .spawn(move || {
                let wanted = |unit: usize| wanted.get(unit).is_some_and(|w| w.load(Ordering::Relaxed));
                let mut pending = VecDeque::new();
                loop {
                    if pending.is_empty() {
                        match rx.recv() {
                            Ok(m) => pending.push_back(m),
                            Err(_) => break,
                        }
                    }
                    pending.extend(rx.try_iter());
                    let Some((job, unit, addr, len)) = pending.pop_front() else {
                        continue;
                    };
                    match job {
                        Job::PageOut => advise_range(Advice::PageOut, addr, len),
                        Job::Populate if wanted(unit) => {
                            advise_range(Advice::Start, addr, len);
                            // Start the next read as well, so that storage has
                            // work queued while this range is being mapped.
                            let next = pending
                                .iter()
                                .find(|(j, u, ..)| matches!(j, Job::Populate) && wanted(*u));
                            if let Some(&(_, _, addr, len)) = next {
                                advise_range(Advice::Start, addr, len);
                            }
                            advise_range(Advice::Map, addr, len);
                        }
                        Job::Populate => {}
                    }
                }
            })
            .ok()?;
        Some(Prefetcher {
            tx: Some(tx),
            handle: Some(handle),
        })
    }

    /// Queues the read of unit `unit`, `data`: a slice of a read-only file
    /// mapping that outlives this prefetcher.
    pub(super) fn populate(&self, unit: usize, data: &[u8]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send((Job::Populate, unit, data.as_ptr() as usize, data.len()));
        }
    }

    /// Queues the release of unit `unit`, `data` (after the reads queued
    /// before it).
    pub(super) fn page_out(&self, unit: usize, data: &[u8]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send((Job::PageOut, unit, data.as_ptr() as usize, data.len()));
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Closing the queue ends the thread; joining it means no advice is
        // given after the model (and the mapping it borrows) is gone.
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The advice the thread gives.
#[derive(Clone, Copy)]
enum Advice {
    /// Start reading the range (asynchronous).
    Start,
    /// Read what is not read yet and map it (returns when done).
    Map,
    /// Reclaim the range's pages.
    PageOut,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn advise_range(advice: Advice, addr: usize, len: usize) {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = addr / page * page;
    let len = len + (addr - start);
    // Starting the whole range's read first makes the kernel issue large
    // reads rather than fault it in a readahead window at a time.
    let flag = match advice {
        Advice::Start => libc::MADV_WILLNEED,
        Advice::Map => libc::MADV_POPULATE_READ,
        Advice::PageOut => libc::MADV_PAGEOUT,
    };
    // SAFETY: the range is (page-aligned) part of a read-only private mapping
    // of a model file that memwall never writes, and the mapping outlives the
    // prefetcher (see `Drop`). WILLNEED only starts reading, POPULATE_READ
    // only faults pages in; PAGEOUT reclaims clean file pages, which the next
    // access reads back unchanged. Errors (an old kernel without these,
    // locked pages) only mean no effect: before 5.14 there is no
    // POPULATE_READ, and the started read-ahead is all there is.
    unsafe { libc::madvise(start as *mut libc::c_void, len, flag) };
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn advise_range(_advice: Advice, _addr: usize, _len: usize) {}
