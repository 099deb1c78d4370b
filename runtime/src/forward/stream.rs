//! Streaming weights past the memory wall. A background thread reads the
//! pages of the layers about to run into memory (`MADV_POPULATE_READ`: read
//! from storage and mapped, so the compute threads take no page faults) and
//! pages out the layers just used (`MADV_PAGEOUT`), so that under a memory cap
//! the page cache holds what comes next rather than what was used last — the
//! opposite of what least-recently-used eviction does with a model read in a
//! cycle. The pinned part of the model is locked separately (`mlock`).

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

/// The background thread and its queue.
pub(super) struct Prefetcher {
    tx: Option<Sender<(Job, usize, usize)>>,
    handle: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts the thread (`None` if the OS refuses one; streaming then only pins).
    pub(super) fn start() -> Option<Prefetcher> {
        let (tx, rx) = channel::<(Job, usize, usize)>();
        let handle = std::thread::Builder::new()
            .name("memwall-prefetch".into())
            .spawn(move || {
                for (job, addr, len) in rx {
                    advise(job, addr, len);
                }
            })
            .ok()?;
        Some(Prefetcher {
            tx: Some(tx),
            handle: Some(handle),
        })
    }

    /// Queues `job` for `data`, a slice of a read-only file mapping that
    /// outlives this prefetcher.
    pub(super) fn send(&self, job: Job, data: &[u8]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send((job, data.as_ptr() as usize, data.len()));
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

#[cfg(any(target_os = "linux", target_os = "android"))]
fn advise(job: Job, addr: usize, len: usize) {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = addr / page * page;
    let len = len + (addr - start);
    let advice = match job {
        Job::Populate => {
            // Start the whole range's read first: the kernel then issues large
            // reads rather than faulting it in a readahead window at a time.
            // SAFETY: as below; WILLNEED only starts reading.
            unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_WILLNEED) };
            libc::MADV_POPULATE_READ
        }
        Job::PageOut => libc::MADV_PAGEOUT,
    };
    // SAFETY: the range is (page-aligned) part of a read-only private mapping
    // of a model file that memwall never writes, and the mapping outlives the
    // prefetcher (see `Drop`). POPULATE_READ only faults pages in; PAGEOUT
    // reclaims clean file pages, which the next access reads back unchanged.
    // Errors (an old kernel without these, locked pages) only mean no effect.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
    if r != 0 && matches!(job, Job::Populate) {
        // Kernels before 5.14: ask for asynchronous read-ahead instead.
        // SAFETY: as above; WILLNEED only starts reading.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_WILLNEED) };
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn advise(_job: Job, _addr: usize, _len: usize) {}
