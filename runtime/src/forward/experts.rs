//! The experts of a mixture of experts, streamed one expert at a time. An
//! expert's rows of the stacked gate, up and down tensors are three
//! contiguous slices of the file (its *bundle*); a layer reads only the
//! bundles its router picked for the current tokens, into a pool of
//! bundle-sized slots that doubles as the cache of hot experts. A slot's
//! expert is kept by how often and how recently it was routed to
//! ([`touch`]): of the experts nobody waits for or holds, the one with the
//! lowest score is read over first. Reads go past the page cache where the
//! system allows (see `stream`), on a thread of their own, in the order the
//! layers asked for them, while the experts already in are multiplied.

use std::collections::VecDeque;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::stream::{Extent, Loaded, Monitor, open, read_extent};

/// An expert's gate, up and down rows, as read from the file.
pub(super) type Bundle = [Loaded; 3];

/// Scores halve over this many requests of a layer (routed tokens' worth of
/// forward passes): long enough that the steady favourites outrank an expert
/// a few tokens picked, short enough to follow a change of topic.
const HALF_LIFE: f64 = 256.0;

/// A profile counts as this many requests of history: enough to order the
/// experts it read in, few enough that the text being run, when it routes
/// otherwise, takes over within a few dozen tokens.
const PROFILE_REQUESTS: f64 = 32.0;

/// A cache slot. `data` is `None` while the reader fills it.
struct Slot {
    key: Option<usize>,
    ready: bool,
    data: Option<Arc<Bundle>>,
}

struct State {
    slots: Vec<Slot>,
    /// Key (`layer · n_expert + expert`) → the slot holding or reading it.
    at: Vec<Option<usize>>,
    /// Key → requests that have not taken it yet; such experts stay.
    wanted: Vec<u32>,
    /// Keys to read, in the order they were asked for.
    queue: VecDeque<usize>,
    /// Key → log₂ of its decayed use count, shifted by the time of the
    /// update ([`touch`]): comparable across keys without decaying them all.
    score: Vec<f64>,
    /// Requests so far (of any layer), the time scores decay by.
    clock: u64,
    /// Whether to read ahead what the previous token used in the next layer.
    speculate: bool,
    /// MoE layer → the keys its last request asked for.
    last: Vec<Vec<usize>>,
    /// Keys to read ahead when nothing is asked for ([`guess_victim`]).
    hints: VecDeque<usize>,
    /// All keys of the current guess, read or not (no guess reads over them).
    guess: Vec<usize>,
    /// Whether the slot's read was a guess (for the counters).
    guessed: Vec<bool>,
    /// Whether the slot took a guess since the last request (other guesses
    /// leave it alone).
    guess_round: Vec<bool>,
    counters: Counters,
    stop: bool,
}

#[derive(Clone, Default)]
struct Counters {
    /// Key → times routed to (each request counts an expert once).
    uses: Vec<u64>,
    hits: u64,
    misses: u64,
    bytes_read: u64,
    /// Of those, bytes read ahead on a guess.
    bytes_guessed: u64,
}

struct Shared {
    n_expert: usize,
    /// Key → where its gate, up and down rows lie.
    bundles: Vec<[Extent; 3]>,
    m: Monitor<State>,
}

/// `score` after one more use at `clock`: the decayed count `2^(s − t)`
/// (`t` = `clock / HALF_LIFE`) plus one, back in the shifted log domain.
fn touch(score: f64, clock: u64) -> f64 {
    let t = clock as f64 / HALF_LIFE;
    if score == f64::NEG_INFINITY {
        return t;
    }
    t + ((score - t).exp2() + 1.0).log2()
}

/// What the cache has done since it started.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertStats {
    /// Expert uses (a layer's request counts each routed expert once).
    pub requests: u64,
    /// Uses whose expert was in a slot or being read already.
    pub hits: u64,
    /// Bytes read from storage into the slots.
    pub bytes_read: u64,
    /// Of those, bytes read ahead on a guess (the previous token's experts of
    /// the next layer), before any layer asked for them.
    pub bytes_guessed: u64,
    /// Slots of the cache.
    pub slots: usize,
    /// Bytes of one bundle (the largest; what a slot holds).
    pub bundle_bytes: u64,
    /// Per MoE layer (in order): each expert's uses.
    pub uses: Vec<Vec<u64>>,
}

impl ExpertStats {
    /// Hits over requests (1 when nothing was asked).
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            1.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }

    /// The routing skew the uses show, averaged over the layers: the share of
    /// a layer's experts that takes 90 % of its uses, hottest first, and the
    /// hottest expert's share of its layer's uses.
    pub fn concentration(&self) -> (f64, f64) {
        let mut cover = 0.0;
        let mut top = 0.0;
        let mut n = 0.0;
        for layer in &self.uses {
            let total: u64 = layer.iter().sum();
            if total == 0 {
                continue;
            }
            let mut sorted = layer.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            let mut mass = 0;
            let k = 1 + sorted
                .iter()
                .position(|&c| {
                    mass += c;
                    mass * 10 >= total * 9
                })
                .unwrap_or(sorted.len() - 1);
            cover += k as f64 / layer.len() as f64;
            top += sorted[0] as f64 / total as f64;
            n += 1.0;
        }
        if n == 0.0 {
            (0.0, 0.0)
        } else {
            (cover / n, top / n)
        }
    }
}

/// The expert slots and their reader.
pub(super) struct ExpertCache {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    direct: bool,
    bundle_bytes: u64,
}

impl ExpertCache {
    /// Starts a cache of `slots` slots (at least two) over `bundles`
    /// (`n_expert` per layer, the layers in order) of the files `paths`.
    /// With `speculate`, a layer's request also guesses the next layer's
    /// experts from what the previous token used there, read while nothing
    /// else is asked for. `None` if a file cannot be opened again or the OS
    /// refuses a thread: the layers then read the mapping.
    pub(super) fn start(
        paths: &[PathBuf],
        n_expert: usize,
        bundles: Vec<[Extent; 3]>,
        slots: usize,
        speculate: bool,
    ) -> Option<ExpertCache> {
        if n_expert == 0
            || bundles.is_empty()
            || bundles.len() % n_expert != 0
            || bundles.iter().flatten().any(|e| e.file >= paths.len())
        {
            return None;
        }
        let files: Vec<(File, bool)> = paths.iter().map(|p| open(p)).collect::<Option<_>>()?;
        let direct = files.iter().all(|(_, d)| *d);
        let bundle_bytes = (bundles.iter())
            .map(|b| b.iter().map(|e| e.len as u64).sum::<u64>())
            .max()
            .unwrap_or(0);
        let n = bundles.len();
        let n_slots = slots.clamp(2, n.max(2));
        let slots = (0..n_slots)
            .map(|_| Slot {
                key: None,
                ready: false,
                data: Some(Arc::new([
                    Loaded::empty(),
                    Loaded::empty(),
                    Loaded::empty(),
                ])),
            })
            .collect();
        let shared = Arc::new(Shared {
            n_expert,
            bundles,
            m: Monitor::new(State {
                slots,
                at: vec![None; n],
                wanted: vec![0; n],
                queue: VecDeque::new(),
                score: vec![f64::NEG_INFINITY; n],
                clock: 0,
                speculate,
                last: vec![Vec::new(); n / n_expert],
                hints: VecDeque::new(),
                guess: Vec::new(),
                guessed: vec![false; n_slots],
                guess_round: vec![false; n_slots],
                counters: Counters {
                    uses: vec![0; n],
                    ..Counters::default()
                },
                stop: false,
            }),
        });
        let worker = shared.clone();
        let handle = std::thread::Builder::new()
            .name("memwall-experts".into())
            .spawn(move || run(&worker, &files))
            .ok()?;
        Some(ExpertCache {
            shared,
            handle: Some(handle),
            direct,
            bundle_bytes,
        })
    }

    /// Whether reads bypass the page cache (`O_DIRECT`).
    pub(super) fn direct(&self) -> bool {
        self.direct
    }

    /// Slots of the cache.
    pub(super) fn slots(&self) -> usize {
        self.shared.m.lock().slots.len()
    }

    /// Bytes of the largest bundle.
    pub(super) fn bundle_bytes(&self) -> u64 {
        self.bundle_bytes
    }

    /// Asks for `experts` (distinct) of MoE layer `layer`: the ones not in
    /// a slot are read, in this order, as soon as slots free up. Take them
    /// with [`Request::next`], in whatever order they arrive.
    pub(super) fn request(&self, layer: usize, experts: &[usize]) -> Request<'_> {
        let sh = &self.shared;
        let mut st = sh.m.lock();
        st.clock += 1;
        let clock = st.clock;
        let mut pending = Vec::with_capacity(experts.len());
        for &x in experts {
            let k = layer * sh.n_expert + x;
            if x >= sh.n_expert || k >= st.at.len() {
                continue;
            }
            st.score[k] = touch(st.score[k], clock);
            st.wanted[k] += 1;
            st.counters.uses[k] += 1;
            if st.at[k].is_some() {
                st.counters.hits += 1;
            } else {
                st.counters.misses += 1;
                st.queue.push_back(k);
            }
            pending.push(k);
        }
        if st.speculate && layer < st.last.len() {
            // Checked when read: the misses above may still push them out.
            st.last[layer].clone_from(&pending);
            let next = (layer + 1) % st.last.len();
            st.guess = st.last[next].clone();
            st.hints = st.guess.clone().into();
            st.guess_round.iter_mut().for_each(|g| *g = false);
        }
        sh.m.notify();
        Request {
            cache: self,
            pending,
        }
    }

    /// Fills the cache from a profile: `weights[key]` is how often the expert
    /// is routed to per request (0 for unknown). Seeds every known expert's
    /// score with the uses [`PROFILE_REQUESTS`] such requests would give it
    /// ([`touch`] decays them like any), then reads the most used experts, as
    /// many as there are slots, and returns how many it read.
    pub(super) fn prewarm(&self, weights: &[f64]) -> usize {
        let sh = &self.shared;
        let n = sh.bundles.len().min(weights.len());
        let mut order: Vec<usize> = (0..n).filter(|&k| weights[k] > 0.0).collect();
        order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
        let pending = {
            let mut st = sh.m.lock();
            order.truncate(st.slots.len());
            let t = st.clock as f64 / HALF_LIFE;
            for (k, &w) in weights.iter().enumerate().take(n) {
                if w > 0.0 && w.is_finite() {
                    st.score[k] = t + (w * PROFILE_REQUESTS).log2();
                }
            }
            let mut pending = Vec::new();
            for &k in &order {
                if st.at[k].is_none() {
                    st.wanted[k] += 1;
                    st.queue.push_back(k);
                    pending.push(k);
                }
            }
            sh.m.notify();
            pending
        };
        let mut request = Request {
            cache: self,
            pending,
        };
        let mut read = 0;
        while request.next().is_some() {
            read += 1;
        }
        read
    }

    /// What the cache has done so far.
    pub(super) fn stats(&self) -> ExpertStats {
        let st = self.shared.m.lock();
        let c = &st.counters;
        ExpertStats {
            requests: c.hits + c.misses,
            hits: c.hits,
            bytes_read: c.bytes_read,
            bytes_guessed: c.bytes_guessed,
            slots: st.slots.len(),
            bundle_bytes: self.bundle_bytes,
            uses: c
                .uses
                .chunks(self.shared.n_expert)
                .map(<[u64]>::to_vec)
                .collect(),
        }
    }
}

impl Drop for ExpertCache {
    fn drop(&mut self) {
        self.shared.m.lock().stop = true;
        self.shared.m.notify();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Experts a layer asked for and has not taken yet; dropping it gives up
/// the rest.
pub(super) struct Request<'c> {
    cache: &'c ExpertCache,
    pending: Vec<usize>,
}

impl<'c> Request<'c> {
    /// The next expert that is in (waiting for the reader if none is), or
    /// `None` when all were taken. The slot stays while the bundle is held.
    pub(super) fn next(&mut self) -> Option<(usize, Held<'c>)> {
        let sh = &self.cache.shared;
        let mut st = sh.m.lock();
        loop {
            if self.pending.is_empty() {
                return None;
            }
            let found = self.pending.iter().position(|&k| {
                st.at[k].is_some_and(|s| st.slots[s].ready && st.slots[s].data.is_some())
            });
            if let Some(i) = found {
                let k = self.pending.remove(i);
                let slot = st.at[k].unwrap_or_default();
                let data = st.slots[slot].data.clone()?;
                st.wanted[k] -= 1;
                return Some((
                    k % sh.n_expert,
                    Held {
                        shared: sh,
                        data: Some(data),
                    },
                ));
            }
            st = sh.m.wait(st);
        }
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let sh = &self.cache.shared;
        let mut st = sh.m.lock();
        for &k in &self.pending {
            st.wanted[k] -= 1;
        }
        sh.m.notify();
    }
}

/// A bundle in use: its slot is not read over until this is dropped.
pub(super) struct Held<'c> {
    shared: &'c Shared,
    data: Option<Arc<Bundle>>,
}

impl Held<'_> {
    /// The gate, up and down bytes, or `None` for a part whose read failed
    /// (the caller then reads the mapping).
    pub(super) fn part(&self, i: usize) -> Option<&[u8]> {
        self.data.as_ref()?.get(i)?.bytes()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Let go first, so the reader sees the slot free when it wakes.
        drop(self.data.take());
        let _st = self.shared.m.lock();
        self.shared.m.notify();
    }
}

/// The slot to read over: an empty one, else the lowest-scored expert that
/// nobody holds or waits for.
fn victim(st: &State) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, s) in st.slots.iter().enumerate() {
        let Some(data) = &s.data else { continue };
        let score = match s.key {
            None => return Some(i),
            Some(k) if s.ready && st.wanted[k] == 0 && Arc::strong_count(data) == 1 => st.score[k],
            Some(_) => continue,
        };
        if best.is_none_or(|(_, b)| score < b) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// The slot a guess `k` may take: an empty one, else the lowest-scored
/// expert nobody holds, waits for or guesses, if it scores below what `k`
/// will score once it is used as guessed. A steadily used expert thus stays,
/// while one used once long ago gives way.
fn guess_victim(st: &State, k: usize) -> Option<usize> {
    let bar = touch(st.score[k], st.clock);
    let mut best: Option<(usize, f64)> = None;
    for (i, s) in st.slots.iter().enumerate() {
        let Some(data) = &s.data else { continue };
        let Some(old) = s.key else { return Some(i) };
        let free = s.ready && st.wanted[old] == 0 && Arc::strong_count(data) == 1;
        if !free || st.guess_round[i] || st.guess.contains(&old) || st.score[old] >= bar {
            continue;
        }
        if best.is_none_or(|(_, b)| st.score[old] < b) {
            best = Some((i, st.score[old]));
        }
    }
    best.map(|(i, _)| i)
}

/// The reader: reads what the layers asked for, in order, into victims.
fn run(sh: &Shared, files: &[(File, bool)]) {
    loop {
        let mut st = sh.m.lock();
        let (slot, key, mut data) = loop {
            if st.stop {
                return;
            }
            // Requests given up or read since are dropped from the queue.
            while let Some(&k) = st.queue.front() {
                if st.wanted[k] == 0 || st.at[k].is_some() {
                    st.queue.pop_front();
                } else {
                    break;
                }
            }
            let mut pick = None;
            if let (Some(&k), Some(i)) = (st.queue.front(), victim(&st)) {
                st.queue.pop_front();
                pick = Some((i, k, false));
            } else if st.queue.is_empty() {
                // Nothing asked for: a guess, into a slot it outranks. Those
                // with no such slot yet wait (a product may let one go).
                let state = &mut *st;
                let (at, wanted) = (&state.at, &state.wanted);
                state.hints.retain(|&k| at[k].is_none() && wanted[k] == 0);
                let placed = (0..st.hints.len())
                    .find_map(|j| guess_victim(&st, st.hints[j]).map(|i| (j, i)));
                if let Some((j, i)) = placed {
                    if let Some(k) = st.hints.remove(j) {
                        pick = Some((i, k, true));
                    }
                }
            }
            if let Some((i, k, guess)) = pick {
                let old = st.slots[i].key.replace(k);
                if let Some(old) = old {
                    st.at[old] = None;
                }
                st.at[k] = Some(i);
                st.guessed[i] = guess;
                st.guess_round[i] = guess;
                let s = &mut st.slots[i];
                s.ready = false;
                if let Some(data) = s.data.take() {
                    break (i, k, data);
                }
            }
            st = sh.m.wait(st);
        };
        drop(st);
        // The victim had no other holder, so this is the only handle.
        let mut read = 0;
        if let Some(parts) = Arc::get_mut(&mut data) {
            for (part, &e) in parts.iter_mut().zip(&sh.bundles[key]) {
                let (file, direct) = &files[e.file];
                read_extent(file, e, *direct, part);
                read += e.len as u64;
            }
        }
        let mut st = sh.m.lock();
        st.counters.bytes_read += read;
        if st.guessed[slot] {
            st.counters.bytes_guessed += read;
        }
        let s = &mut st.slots[slot];
        s.data = Some(data);
        s.ready = true;
        sh.m.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `len` bytes whose byte `i` is `i · 13 mod 251`.
    fn pattern_file(name: &str, len: usize) -> (PathBuf, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
        let path =
            std::env::temp_dir().join(format!("memwall-experts-{}-{name}", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    }

    /// `layers × experts` bundles over a file laid out like a GGUF's stacked
    /// tensors: per layer, all gates, then all ups, then all downs, each part
    /// of odd length at odd offsets.
    fn bundles(layers: usize, experts: usize) -> (Vec<[Extent; 3]>, usize) {
        let part = [3001usize, 3001, 2777];
        let mut v = Vec::new();
        let mut offset = 123u64;
        let mut layout = vec![
            [Extent {
                file: 0,
                offset: 0,
                len: 0
            }; 3];
            layers * experts
        ];
        for l in 0..layers {
            for (p, &len) in part.iter().enumerate() {
                for x in 0..experts {
                    layout[l * experts + x][p] = Extent {
                        file: 0,
                        offset,
                        len,
                    };
                    offset += len as u64;
                }
            }
        }
        v.extend(layout);
        (v, offset as usize + 5)
    }

    fn check(held: &Held, b: &[Extent; 3], bytes: &[u8]) {
        for (p, e) in b.iter().enumerate() {
            let want = &bytes[e.offset as usize..e.offset as usize + e.len];
            assert_eq!(held.part(p), Some(want), "part {p} at {}", e.offset);
        }
    }

    #[test]
    fn a_request_hands_out_each_expert_once_with_its_own_bytes() {
        let (b, len) = bundles(2, 8);
        let (path, bytes) = pattern_file("once", len);
        for slots in [2, 3, 16] {
            let cache = ExpertCache::start(std::slice::from_ref(&path), 8, b.clone(), slots, false)
                .unwrap();
            // More experts than slots: the reader waits for taken ones to go.
            for (layer, want) in [(0, vec![7, 0, 3, 5, 1]), (1, vec![2, 6]), (0, vec![0, 7])] {
                let mut r = cache.request(layer, &want);
                let mut got = Vec::new();
                while let Some((x, held)) = r.next() {
                    check(&held, &b[layer * 8 + x], &bytes);
                    got.push(x);
                }
                got.sort_unstable();
                let mut want = want.clone();
                want.sort_unstable();
                assert_eq!(got, want, "slots {slots}");
            }
            let s = cache.stats();
            assert_eq!(s.requests, 9);
            assert_eq!(s.uses[0][0], 2);
            assert_eq!(s.uses[1][6], 1);
            if slots == 16 {
                // Everything fits: the last request hits twice, nothing is read twice.
                assert_eq!(s.hits, 2);
                assert_eq!(s.bytes_read, 7 * (3001 + 3001 + 2777));
            }
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_most_used_experts_stay() {
        let (b, len) = bundles(1, 16);
        let (path, _) = pattern_file("hot", len);
        let cache = ExpertCache::start(std::slice::from_ref(&path), 16, b, 4, false).unwrap();
        let take_all = |experts: &[usize]| {
            let mut r = cache.request(0, experts);
            while r.next().is_some() {}
        };
        // Experts 0 and 1 in every other request, the others once each: the
        // cold ones take turns in the two slots the hot ones leave.
        for cold in 2..16 {
            take_all(&[0, 1]);
            take_all(&[cold]);
        }
        let before = cache.stats();
        take_all(&[0, 1]);
        let after = cache.stats();
        assert_eq!(after.hits - before.hits, 2, "0 and 1 are still in");
        assert_eq!(after.bytes_read, before.bytes_read);
        assert_eq!(
            after.hits,
            2 * 13 + 2,
            "every cold expert and the first 0, 1 missed"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_abandoned_request_frees_its_experts() {
        let (b, len) = bundles(1, 8);
        let (path, bytes) = pattern_file("abandon", len);
        let cache =
            ExpertCache::start(std::slice::from_ref(&path), 8, b.clone(), 2, false).unwrap();
        {
            let mut r = cache.request(0, &[0, 1, 2, 3]);
            let _first = r.next().unwrap();
            // An error in the product drops the request with three experts left.
        }
        let mut r = cache.request(0, &[4, 5, 6]);
        let mut n = 0;
        while let Some((x, held)) = r.next() {
            check(&held, &b[x], &bytes);
            n += 1;
        }
        assert_eq!(
            n, 3,
            "two slots are enough once the abandoned experts let go"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn threads_share_the_slots_without_waiting_forever() {
        let (b, len) = bundles(3, 8);
        let (path, bytes) = pattern_file("threads", len);
        let cache = ExpertCache::start(std::slice::from_ref(&path), 8, b.clone(), 3, true).unwrap();
        std::thread::scope(|scope| {
            for t in 0..3usize {
                let (cache, b, bytes) = (&cache, &b, &bytes);
                scope.spawn(move || {
                    for i in 0..40usize {
                        let layer = (i + t) % 3;
                        let want: Vec<usize> = (0..3).map(|j| (i * (t + 1) + j * 3) % 8).collect();
                        let mut r = cache.request(layer, &want);
                        while let Some((x, held)) = r.next() {
                            check(&held, &b[layer * 8 + x], bytes);
                        }
                    }
                });
            }
        });
        drop(cache);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_short_file_leaves_the_mapping_to_read() {
        let (b, len) = bundles(1, 4);
        let (path, bytes) = pattern_file("short", len - 3000);
        let cache =
            ExpertCache::start(std::slice::from_ref(&path), 4, b.clone(), 2, false).unwrap();
        let mut r = cache.request(0, &[0, 3]);
        while let Some((x, held)) = r.next() {
            if x == 0 {
                check(&held, &b[0], &bytes);
            } else {
                // The last down part runs past the end of the file.
                assert_eq!(held.part(2), None);
            }
        }
        drop(r);
        let bad = vec![
            [Extent {
                file: 1,
                offset: 0,
                len: 1,
            }; 3],
        ];
        assert!(ExpertCache::start(std::slice::from_ref(&path), 1, bad, 2, false).is_none());
        drop(cache);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_profile_fills_the_cache_with_the_most_used_experts() {
        let (b, len) = bundles(2, 8);
        let (path, _) = pattern_file("profile", len);
        let cache = ExpertCache::start(std::slice::from_ref(&path), 8, b, 3, false).unwrap();
        let mut weights = vec![0.0; 16];
        weights[5] = 0.9;
        weights[12] = 0.5;
        weights[1] = 0.2;
        weights[2] = 0.1;
        assert_eq!(cache.prewarm(&weights), 3, "as many as there are slots");
        let s = cache.stats();
        assert_eq!(s.requests, 0, "reading a profile is not routing");
        // Layer 0's expert 5, layer 1's expert 4 and layer 0's expert 1 are in.
        let mut r = cache.request(0, &[5, 1]);
        while r.next().is_some() {}
        drop(r);
        let mut r = cache.request(1, &[4]);
        while r.next().is_some() {}
        drop(r);
        assert_eq!(cache.stats().hits, 3);
        // A cold expert takes the least used slot, not the hottest one.
        let mut r = cache.request(1, &[7]);
        while r.next().is_some() {}
        drop(r);
        let mut r = cache.request(0, &[5]);
        while r.next().is_some() {}
        drop(r);
        assert_eq!(cache.stats().hits, 4);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_previous_tokens_experts_of_the_next_layer_are_read_ahead() {
        let (b, len) = bundles(2, 8);
        let (path, bytes) = pattern_file("guess", len);
        let cache = ExpertCache::start(std::slice::from_ref(&path), 8, b.clone(), 4, true).unwrap();
        let take = |layer: usize, experts: &[usize]| {
            let mut r = cache.request(layer, experts);
            while let Some((x, held)) = r.next() {
                check(&held, &b[layer * 8 + x], &bytes);
            }
        };
        // Token 1 uses experts 1, 2 of layer 0 and 3, 4 of layer 1 (the four
        // slots); token 2's 5, 6 and 7 in layer 0 push out 1, 2 and one of
        // layer 1's. That request guesses layer 1's 3 and 4 (token 1's): the
        // missing one is read back, over an expert just used, before layer 1
        // asks, while the other, part of the guess, stays.
        take(0, &[1, 2]);
        take(1, &[3, 4]);
        take(0, &[5, 6, 7]);
        let wait = std::time::Instant::now();
        while cache.stats().bytes_guessed == 0 && wait.elapsed().as_secs() < 10 {
            std::thread::yield_now();
        }
        let s = cache.stats();
        assert_eq!(s.bytes_guessed, 3001 + 3001 + 2777, "one guess was read");
        take(1, &[3, 4]);
        let after = cache.stats();
        assert_eq!(after.hits - s.hits, 2, "both of layer 1's experts were in");
        assert_eq!(
            after.bytes_read,
            after.bytes_guessed + 7 * (3001 + 3001 + 2777),
            "seven misses and the guess"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn scores_rank_frequent_above_recent_and_decay() {
        let mut often = f64::NEG_INFINITY;
        for c in 0..10 {
            often = touch(often, c);
        }
        let once = touch(f64::NEG_INFINITY, 10);
        assert!(often > once);
        // Long unused, ten old uses fall below one fresh one.
        let fresh = touch(f64::NEG_INFINITY, 10 + 4 * HALF_LIFE as u64);
        assert!(often < fresh);
    }
}
