//! Streaming weights past the memory wall. The matrices that are not pinned
//! are read from the model file by a background thread into a small ring of
//! reusable buffers, the next ones while the current one is multiplied, and
//! never through the mapping: with `O_DIRECT` the reads skip the page cache,
//! so nothing has to be evicted, unmapped or shot down from other cores'
//! TLBs afterwards (paging the mapping in and out cost more CPU than the
//! reads themselves), and under a memory cap the process holds its pinned
//! weights, the ring and nothing else. The pinned part of the model is locked
//! separately (`mlock` on the mapping).

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::experts::{ExpertCache, ExpertStats};
use super::{ForwardError, Layer, Matrix, Model, tensor_err};
use memwall_format::GgmlType;
use memwall_format::gguf::GgufModel;

/// Direct reads start, end and land on multiples of this (the largest
/// logical block size in use; 4 KiB also satisfies 512-byte devices).
const ALIGN: usize = 4096;

/// Where a streamed matrix lies in the model file.
#[derive(Clone, Copy, Debug)]
pub(super) struct Extent {
    /// Index of the file (of a split model).
    pub(super) file: usize,
    pub(super) offset: u64,
    pub(super) len: usize,
}

/// A buffer holding one matrix's bytes.
pub(super) struct Loaded {
    buf: Vec<u8>,
    start: usize,
    len: usize,
    ok: bool,
}

impl Loaded {
    /// A buffer with nothing read yet.
    pub(super) fn empty() -> Loaded {
        Loaded {
            buf: Vec::new(),
            start: 0,
            len: 0,
            ok: false,
        }
    }

    /// The matrix's bytes, or `None` if reading them failed (the caller then
    /// reads the mapping).
    pub(super) fn bytes(&self) -> Option<&[u8]> {
        if self.ok {
            self.buf.get(self.start..self.start + self.len)
        } else {
            None
        }
    }
}

/// One buffer of the ring. `buf` is `None` while the reader or a product
/// holds it.
struct Slot {
    pos: Option<usize>,
    ready: bool,
    buf: Option<Loaded>,
}

struct State {
    /// The position the forward pass is at: the reader keeps the positions
    /// from here on (cyclically) in the ring.
    head: usize,
    /// Positions a product is waiting for (one entry per waiting thread):
    /// read first, and never evicted to read ahead.
    waiting: Vec<usize>,
    slots: Vec<Slot>,
    stop: bool,
}

/// State shared with a reading thread, behind a lock, and the condition the
/// thread and the products wait on. Nothing is left half-updated under the
/// lock by a panic, so a poisoned lock is taken as it is.
pub(super) struct Monitor<S> {
    state: Mutex<S>,
    cv: Condvar,
}

impl<S> Monitor<S> {
    pub(super) fn new(state: S) -> Monitor<S> {
        Monitor {
            state: Mutex::new(state),
            cv: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, S> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn wait<'g>(&self, g: MutexGuard<'g, S>) -> MutexGuard<'g, S> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every waiter.
    pub(super) fn notify(&self) {
        self.cv.notify_all();
    }
}

struct Shared {
    /// The streamed matrices in the order the forward pass multiplies them.
    order: Vec<Extent>,
    m: Monitor<State>,
}

/// The reading thread and its ring of buffers.
pub(super) struct Streamer {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    /// Whether reads bypass the page cache.
    direct: bool,
}

impl Streamer {
    /// Starts reading `order` (extents of `paths`, the model's files) into
    /// `slots` buffers. `None` if a file cannot be opened again or the OS
    /// refuses a thread: products then read the mapping, as without
    /// streaming.
    pub(super) fn start(paths: &[PathBuf], order: Vec<Extent>, slots: usize) -> Option<Streamer> {
        if order.is_empty() || order.iter().any(|e| e.file >= paths.len()) {
            return None;
        }
        let opened: Vec<(File, bool)> = paths.iter().map(|p| open(p)).collect::<Option<_>>()?;
        let direct = opened.iter().all(|(_, d)| *d);
        let files: Vec<(File, bool)> = opened;
        let slots = (0..slots.max(2))
            .map(|_| Slot {
                pos: None,
                ready: false,
                buf: Some(Loaded::empty()),
            })
            .collect();
        let shared = Arc::new(Shared {
            order,
            m: Monitor::new(State {
                head: 0,
                waiting: Vec::new(),
                slots,
                stop: false,
            }),
        });
        let worker = shared.clone();
        let handle = std::thread::Builder::new()
            .name("memwall-stream".into())
            .spawn(move || run(&worker, &files))
            .ok()?;
        Some(Streamer {
            shared,
            handle: Some(handle),
            direct,
        })
    }

    /// Whether reads bypass the page cache (`O_DIRECT`).
    pub(super) fn direct(&self) -> bool {
        self.direct
    }

    /// The bytes of streamed matrix `pos`, waiting for the reader if they are
    /// not in yet. Hand them back with [`Streamer::release`].
    pub(super) fn acquire(&self, pos: usize) -> Loaded {
        let sh = &self.shared;
        let mut st = sh.m.lock();
        st.head = pos;
        st.waiting.push(pos);
        sh.m.notify();
        loop {
            let found = st
                .slots
                .iter_mut()
                .find(|s| s.pos == Some(pos) && s.ready && s.buf.is_some());
            if let Some(buf) = found.and_then(|s| s.buf.take()) {
                if let Some(i) = st.waiting.iter().position(|&p| p == pos) {
                    st.waiting.swap_remove(i);
                }
                return buf;
            }
            st = sh.m.wait(st);
        }
    }

    /// Returns what [`Streamer::acquire`] handed out for `pos`.
    pub(super) fn release(&self, pos: usize, loaded: Loaded) {
        let sh = &self.shared;
        let mut st = sh.m.lock();
        if let Some(s) = st
            .slots
            .iter_mut()
            .find(|s| s.pos == Some(pos) && s.ready && s.buf.is_none())
        {
            s.buf = Some(loaded);
        }
        sh.m.notify();
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        self.shared.m.lock().stop = true;
        self.shared.m.notify();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The reader: keeps the ring filled with the positions from the head on.
fn run(sh: &Shared, files: &[(File, bool)]) {
    let n = sh.order.len();
    loop {
        let mut st = sh.m.lock();
        let (slot, pos, mut loaded) = loop {
            if st.stop {
                return;
            }
            // What a product waits for comes first and may take any slot
            // nobody holds or waits for; reading ahead (the positions from the
            // head on) only takes slots outside that window.
            let k = st.slots.len().min(n);
            let head = st.head;
            let in_window = |p: usize| (p + n - head) % n < k;
            let present = |p: usize| st.slots.iter().any(|s| s.pos == Some(p));
            let waited = |p: Option<usize>| p.is_some_and(|p| st.waiting.contains(&p));
            let urgent = st.waiting.iter().copied().find(|&p| !present(p));
            let pick = match urgent {
                Some(p) => st
                    .slots
                    .iter()
                    .position(|s| s.buf.is_some() && !waited(s.pos))
                    .map(|i| (i, p)),
                None => (0..k)
                    .map(|i| (head + i) % n)
                    .find(|&p| !present(p))
                    .and_then(|p| {
                        st.slots
                            .iter()
                            .position(|s| {
                                s.buf.is_some()
                                    && !waited(s.pos)
                                    && s.pos.is_none_or(|q| !in_window(q))
                            })
                            .map(|i| (i, p))
                    }),
            };
            if let Some((i, p)) = pick {
                let s = &mut st.slots[i];
                if let Some(buf) = s.buf.take() {
                    s.pos = Some(p);
                    s.ready = false;
                    break (i, p, buf);
                }
            }
            st = sh.m.wait(st);
        };
        drop(st);
        let e = sh.order[pos];
        let (file, direct) = &files[e.file];
        read_extent(file, e, *direct, &mut loaded);
        let mut st = sh.m.lock();
        st.slots[slot].buf = Some(loaded);
        st.slots[slot].ready = true;
        sh.m.notify();
    }
}

/// Opens the model file for reading past the page cache where the system
/// allows it (`O_DIRECT`; tmpfs and some file systems refuse it).
pub(super) fn open(path: &std::path::Path) -> Option<(File, bool)> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        if let Ok(f) = direct {
            return Some((f, true));
        }
    }
    File::open(path).ok().map(|f| (f, false))
}

/// Reads `e` into `out` (aligned for direct reads), growing its buffer as
/// needed; `out.ok` says whether every byte arrived.
pub(super) fn read_extent(file: &File, e: Extent, direct: bool, out: &mut Loaded) {
    let first = e.offset / ALIGN as u64 * ALIGN as u64;
    let lead = (e.offset - first) as usize;
    let total = (lead + e.len).div_ceil(ALIGN) * ALIGN;
    if out.buf.len() < total + ALIGN {
        out.buf.resize(total + ALIGN, 0);
    }
    let addr = out.buf.as_ptr() as usize;
    let pad = addr.next_multiple_of(ALIGN) - addr;
    let got = read_at(file, &mut out.buf[pad..pad + total], first);
    out.start = pad + lead;
    out.len = e.len;
    out.ok = got >= lead + e.len;
    if !direct {
        drop_cached(file, first, total);
    }
}

/// Reads from `offset` until `buf` is full or the file ends; returns the
/// bytes read (an error ends the read early).
#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> usize {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    got
}

#[cfg(not(unix))]
fn read_at(_file: &File, _buf: &mut [u8], _offset: u64) -> usize {
    0
}

/// Buffered reads leave the bytes in the page cache: drop them, so that the
/// cache does not grow by the streamed bytes.
fn drop_cached(file: &File, offset: u64, len: usize) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only advises the kernel about a range of an
        // open file descriptor; it touches no memory of this process.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = (file, offset, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `len` bytes whose byte `i` is `i · 7 mod 251`, and its bytes.
    fn pattern_file(name: &str, len: usize) -> (PathBuf, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let path =
            std::env::temp_dir().join(format!("memwall-stream-{}-{name}", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    }

    /// Unaligned offsets and lengths, one larger than a buffer page, one
    /// inside a single page, the last reaching the end of the file.
    fn extents(len: usize) -> Vec<Extent> {
        let spans = [
            (0, 4096),
            (4096 + 17, 70_001),
            (80_000, 33),
            (90_123, 40_000),
        ];
        let mut v: Vec<Extent> = spans
            .iter()
            .map(|&(offset, len)| Extent {
                file: 0,
                offset,
                len,
            })
            .collect();
        v.push(Extent {
            file: 0,
            offset: (len - 5000) as u64,
            len: 5000,
        });
        v
    }

    #[test]
    fn the_ring_hands_out_every_extent_in_any_order() {
        let (path, bytes) = pattern_file("order", 200_003);
        let order = extents(bytes.len());
        for slots in [2, 3, 8] {
            let s = Streamer::start(std::slice::from_ref(&path), order.clone(), slots).unwrap();
            // Three passes in the forward pass's order, then out of order and
            // the same position twice in a row (the experts of one tensor).
            let seq: Vec<usize> = (0..3 * order.len())
                .map(|i| i % order.len())
                .chain([3, 0, 4, 4, 2, 1, 1])
                .collect();
            for pos in seq {
                let l = s.acquire(pos);
                let e = order[pos];
                let want = &bytes[e.offset as usize..e.offset as usize + e.len];
                assert_eq!(l.bytes(), Some(want), "slots {slots} position {pos}");
                s.release(pos, l);
            }
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn threads_share_the_ring_without_waiting_forever() {
        let (path, bytes) = pattern_file("threads", 200_003);
        let order = extents(bytes.len());
        let s = Streamer::start(std::slice::from_ref(&path), order.clone(), 2).unwrap();
        std::thread::scope(|scope| {
            for t in 0..3 {
                let (s, order, bytes) = (&s, &order, &bytes);
                scope.spawn(move || {
                    for i in 0..50 {
                        let pos = (i * (t + 1)) % order.len();
                        let l = s.acquire(pos);
                        let e = order[pos];
                        let want = &bytes[e.offset as usize..e.offset as usize + e.len];
                        assert_eq!(l.bytes(), Some(want));
                        s.release(pos, l);
                    }
                });
            }
        });
        drop(s);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_read_past_the_end_leaves_the_mapping_to_read() {
        let (path, bytes) = pattern_file("short", 10_000);
        let order = vec![
            Extent {
                file: 0,
                offset: 9_000,
                len: 2_000,
            },
            Extent {
                file: 0,
                offset: 0,
                len: 100,
            },
        ];
        let s = Streamer::start(std::slice::from_ref(&path), order, 2).unwrap();
        let l = s.acquire(0);
        assert_eq!(l.bytes(), None, "the file ends 1000 bytes early");
        s.release(0, l);
        let l = s.acquire(1);
        assert_eq!(l.bytes(), Some(&bytes[..100]));
        s.release(1, l);
        assert!(Streamer::start(std::slice::from_ref(&path), Vec::new(), 2).is_none());
        let bad = vec![Extent {
            file: 1,
            offset: 0,
            len: 1,
        }];
        assert!(
            Streamer::start(std::slice::from_ref(&path), bad, 2).is_none(),
            "no file 1"
        );
        drop(s);
        std::fs::remove_file(&path).unwrap();
    }
}

/// How weights are kept when the model is larger than the RAM it may use:
/// `resident_bytes` of the most reused matrices (the output head, then the
/// matrices of the first layers, in order, each that still fits) are locked
/// in RAM; the rest is read from the file, a matrix at a time, into a ring of
/// buffers holding `prefetch` layers' worth of bytes (at least two
/// matrices), by a background thread that reads ahead of the products, past
/// the page cache where the system allows. Reading overlaps computing, and
/// the memory held is the pinned part, the ring and nothing else.
///
/// A mixture of experts keeps every dense matrix (attention, router, output
/// head) ahead of its experts; what the budget leaves after them is a cache
/// of expert-sized slots (at least `n_expert_used + 2`), and a layer reads
/// only the experts its router picks that are not in it (`experts`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Streaming {
    /// Bytes of weights to lock in RAM.
    pub resident_bytes: u64,
    /// Read ahead this many layers' worth of bytes (the average streamed
    /// layer; the ring holds at least two matrices).
    pub prefetch: usize,
    /// Of a mixture of experts: also read ahead, while the reader is idle,
    /// the experts the previous token used in the next layer (into slots of
    /// experts that rank below them once used).
    pub speculate: bool,
}

/// What [`Model::enable_streaming`] set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamingReport {
    /// Bytes of weights locked in RAM.
    pub pinned_bytes: u64,
    /// Layers pinned whole (from the first; later matrices may be pinned too).
    pub pinned_layers: usize,
    /// Whether the output head is pinned.
    pub output_pinned: bool,
    /// Bytes of matrix weights read from storage per token at most (the rest;
    /// of a mixture of experts, the dense matrices not pinned and
    /// `n_expert_used` experts per layer).
    pub streamed_bytes: u64,
    /// Bytes of the read-ahead buffers (0 when nothing streams or the reading
    /// thread could not start: products then read the mapping).
    pub ring_bytes: u64,
    /// Whether streamed reads bypass the page cache (`O_DIRECT`).
    pub direct: bool,
    /// The cache of experts, when the experts stream.
    pub experts: Option<ExpertCacheReport>,
}

/// The cache of a mixture of experts' streamed experts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertCacheReport {
    /// Experts (of all layers) the cache holds at once.
    pub slots: usize,
    /// Experts in the model (layers × experts per layer).
    pub experts: usize,
    /// Bytes of one expert's gate, up and down rows (the largest).
    pub bundle_bytes: u64,
    /// Experts read in ahead from a profile ([`Model::prewarm_experts`]).
    pub prewarmed: usize,
}

/// Streaming state: the streamed matrices and their reader.
pub(super) struct Stream<'a> {
    /// Tensor name → position in the reader's order and the tensor's bytes
    /// in the mapping.
    pub(super) by_name: HashMap<&'a str, (usize, &'a [u8])>,
    pub(super) reader: Option<Streamer>,
    /// The streamed experts: the cache, and layer → its MoE layers' index.
    pub(super) experts: Option<(ExpertCache, HashMap<usize, usize>)>,
}

impl<'a> Model<'a> {
    /// Streams the weights (see [`Streaming`]). Needs a memory-mapped model;
    /// fails when the OS refuses to lock the resident part.
    pub fn enable_streaming(&mut self, s: Streaming) -> Result<StreamingReport, ForwardError> {
        if !self.gguf.is_mapped() {
            return Err(ForwardError::Metadata(
                "streaming needs the model memory-mapped (drop --no-mmap)".into(),
            ));
        }
        let n_expert = self.config.n_expert;
        let experts_of = |layer: &Layer<'a>| {
            let x = layer.experts().filter(|_| n_expert > 0)?;
            Some(x.matrices().into_iter().copied().collect::<Vec<_>>())
        };
        let expert_bytes: u64 = (self.layers.iter())
            .filter_map(experts_of)
            .flatten()
            .map(|m| m.data.len() as u64)
            .sum();
        let sizes: Vec<u64> = (self.layers.iter())
            .flat_map(Layer::matrices)
            .map(|m| m.data.len() as u64)
            .collect();
        let all = sizes.iter().sum::<u64>() + self.output.data.len() as u64;
        let everything = s.resident_bytes >= all;
        // Experts stream one at a time when they do not all fit: the dense
        // matrices go first, and the cache gets at least a token's experts
        // and two to read ahead.
        let stream_experts = expert_bytes > 0 && !everything;
        let bundles = self.layers.iter().filter_map(experts_of).count() * n_expert;
        let bundle_bytes = (self.layers.iter())
            .filter_map(experts_of)
            .map(|ms| ms.iter().map(|m| m.data.len() as u64).sum::<u64>() / n_expert as u64)
            .max()
            .unwrap_or(0);
        let min_cache = if stream_experts {
            (self.config.n_expert_used + 2).min(bundles) as u64 * bundle_bytes
        } else {
            0
        };
        let is_expert = |m: &Matrix<'a>, layer: &Layer<'a>| {
            stream_experts
                && experts_of(layer).is_some_and(|ms| ms.iter().any(|e| e.name == m.name))
        };
        // The ring of read-ahead buffers comes out of the budget when the
        // matrices it reads do not all fit: `prefetch` layers' worth of bytes
        // plus one matrix, in buffers the size of the largest.
        let dense: Vec<u64> = (self.layers.iter())
            .flat_map(|l| l.matrices().into_iter().filter(move |m| !is_expert(m, l)))
            .map(|m| m.data.len() as u64)
            .collect();
        let dense_all = dense.iter().sum::<u64>() + self.output.data.len() as u64;
        let largest = dense.iter().copied().max().unwrap_or(0).max(1);
        let per_layer = dense_all / self.layers.len().max(1) as u64;
        let slots = (per_layer * s.prefetch as u64 / largest + 1).max(2);
        let mut budget = s.resident_bytes.saturating_sub(min_cache);
        if !everything && budget < dense_all {
            budget = budget.saturating_sub(slots * largest);
        }
        // The output head is read for every token: pinned first, then the
        // matrices in the order the forward pass multiplies them, each that
        // still fits.
        let mut order: Vec<&Matrix<'a>> = Vec::new();
        let mut pinned: Vec<bool> = Vec::new();
        let output_pinned = self.output.data.len() as u64 <= budget;
        if output_pinned {
            budget -= self.output.data.len() as u64;
        }
        let mut pinned_layers = 0;
        for (l, layer) in self.layers.iter().enumerate() {
            let mut whole = !experts_of(layer).is_some_and(|_| stream_experts);
            for m in layer.matrices() {
                if is_expert(m, layer) {
                    continue;
                }
                let size = m.data.len() as u64;
                let pin = size <= budget;
                if pin {
                    budget -= size;
                }
                whole &= pin;
                order.push(m);
                pinned.push(pin);
            }
            if whole && pinned_layers == l {
                pinned_layers += 1;
            }
        }
        order.push(&self.output);
        pinned.push(output_pinned);
        let mut report = StreamingReport {
            pinned_bytes: 0,
            pinned_layers,
            output_pinned,
            streamed_bytes: 0,
            ring_bytes: 0,
            direct: false,
            experts: None,
        };
        let mut by_name = HashMap::new();
        let mut extents = Vec::new();
        for (m, pin) in order.iter().zip(&pinned) {
            if *pin {
                crate::residency::lock_range(self.gguf, m.data).map_err(|e| {
                    ForwardError::Metadata(format!(
                        "locking {} of weights in RAM failed ({e}); lower --resident or raise `ulimit -l`",
                        report.pinned_bytes + m.data.len() as u64
                    ))
                })?;
                report.pinned_bytes += m.data.len() as u64;
            } else {
                report.streamed_bytes += m.data.len() as u64;
                by_name.insert(m.name, (extents.len(), m.data));
                extents.push(self.extent(m.name, m.data)?);
            }
        }
        // Every token looks up its embedding row in the mapping.
        crate::residency::advise_random(self.gguf, self.embd.data);
        let paths: Vec<_> = (self.gguf.files().iter())
            .map(|f| f.path().to_owned())
            .collect();
        let mut reader = None;
        let largest = extents.iter().map(|e| e.len as u64).max().unwrap_or(0);
        // Sized by what streams: an output head that did not fit makes fewer,
        // larger buffers (at least two matrices are always held).
        if let Some(fit) = (per_layer * s.prefetch as u64).checked_div(largest) {
            let slots = (fit + 1).clamp(2, slots) as usize;
            if let Some(r) = Streamer::start(&paths, extents, slots) {
                report.ring_bytes = slots as u64 * largest;
                report.direct = r.direct();
                reader = Some(r);
            }
        }
        let mut experts = None;
        if stream_experts {
            let mut layers = HashMap::new();
            let mut parts = Vec::with_capacity(bundles);
            for (l, layer) in self.layers.iter().enumerate() {
                let Some(experts) = layer.experts() else {
                    continue;
                };
                layers.insert(l, layers.len());
                for x in 0..n_expert {
                    // Fused gate and up rows: the third part is empty.
                    let ms = experts.expert(x);
                    let last = ms[ms.len() - 1];
                    let mut bundle = [self.extent(last.name, &last.data[..0])?; 3];
                    for (slot, m) in bundle.iter_mut().zip(&ms) {
                        *slot = self.extent(m.name, m.data)?;
                    }
                    parts.push(bundle);
                }
                report.streamed_bytes += self.config.n_expert_used as u64 * bundle_bytes;
            }
            let cache_slots =
                ((min_cache + budget) / bundle_bytes.max(1)).min(bundles as u64) as usize;
            if let Some(cache) =
                ExpertCache::start(&paths, n_expert, parts, cache_slots, s.speculate)
            {
                report.direct = cache.direct() && (reader.is_none() || report.direct);
                report.experts = Some(ExpertCacheReport {
                    slots: cache.slots(),
                    experts: bundles,
                    bundle_bytes: cache.bundle_bytes(),
                    prewarmed: 0,
                });
                experts = Some((cache, layers));
            }
        }
        if reader.is_some() || experts.is_some() {
            self.stream = Some(Stream {
                by_name,
                reader,
                experts,
            });
        }
        Ok(report)
    }

    /// Where `data` (of tensor `name`) lies in the model's files.
    fn extent(&self, name: &str, data: &[u8]) -> Result<Extent, ForwardError> {
        let (file, offset) = self
            .gguf
            .locate(data)
            .ok_or_else(|| tensor_err(name, "its data lies outside the model's files"))?;
        Ok(Extent {
            file,
            offset,
            len: data.len(),
        })
    }

    /// Fills the cache of streamed experts from a calibration profile:
    /// `imatrix`, an importance-matrix GGUF (as `memwall calibrate` and
    /// llama-imatrix write them), whose `<expert tensor>.counts` hold the
    /// tokens routed to each expert. The most routed experts are read now, as
    /// many as the cache holds, and every expert starts with the score such
    /// use would give it. Returns the experts read (0 when the experts do not
    /// stream); fails on counts that do not fit this model.
    pub fn prewarm_experts(&self, imatrix: &GgufModel) -> Result<usize, ForwardError> {
        let Some((cache, layers)) = self.stream.as_ref().and_then(|s| s.experts.as_ref()) else {
            return Ok(0);
        };
        let (n_expert, used) = (self.config.n_expert, self.config.n_expert_used);
        let mut weights = vec![0.0; layers.len() * n_expert];
        let mut found = 0;
        for (l, layer) in self.layers.iter().enumerate() {
            let (Some(&moe_layer), Some(experts)) = (layers.get(&l), layer.experts()) else {
                continue;
            };
            let Some((name, info, data)) = experts.matrices().iter().find_map(|m| {
                let name = format!("{}.counts", m.name);
                let (info, data) = imatrix.tensor(&name)?;
                Some((name, info, data))
            }) else {
                continue;
            };
            if info.ty != GgmlType::F32
                || info.elements != n_expert as u64
                || data.len() != 4 * n_expert
            {
                return Err(tensor_err(
                    &name,
                    format!(
                        "expected {n_expert} f32 counts (one per expert), found {} {} values",
                        info.elements,
                        info.ty.name()
                    ),
                ));
            }
            let counts: Vec<f64> = (data.chunks_exact(4))
                .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect();
            if counts.iter().any(|c| !c.is_finite() || *c < 0.0) {
                return Err(tensor_err(&name, "counts must be finite and not negative"));
            }
            let total: f64 = counts.iter().sum();
            if total > 0.0 {
                for (x, c) in counts.iter().enumerate() {
                    // The chance that a token routes to expert x.
                    weights[moe_layer * n_expert + x] = c * used as f64 / total;
                }
                found += 1;
            }
        }
        if found == 0 {
            return Err(ForwardError::Metadata(
                "the profile has no per-expert counts for this model's expert tensors \
                 (`<tensor>.counts`, as memwall calibrate and llama-imatrix write them)"
                    .into(),
            ));
        }
        Ok(cache.prewarm(&weights))
    }

    /// What the cache of streamed experts has done so far (`None` when the
    /// experts do not stream).
    pub fn expert_stats(&self) -> Option<ExpertStats> {
        let (cache, _) = self.stream.as_ref()?.experts.as_ref()?;
        Some(cache.stats())
    }
}
