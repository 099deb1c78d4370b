//! Reference log-probability files, in two layouts.
//!
//! **Full**: llama.cpp's KL-divergence base (`llama-perplexity
//! --kl-divergence-base`), byte for byte:
//!
//! ```text
//! "_logits_"  n_ctx: u32  n_vocab: i32  n_chunk: i32  tokens: i32 × n_ctx·n_chunk
//! per chunk, per scored position (n_ctx − 1 − n_ctx/2 of them):
//!   scale: f32  min_log_prob: f32  q: u16 × n_vocab (padded to even)
//! ```
//!
//! `log p(i) ≈ scale · q[i] + min_log_prob`, with `q = 0` for logits more than
//! 16 below the maximum.
//!
//! **Top-k**: memwall's compact reference, for vocabularies where the full
//! layout runs to gigabytes (8 + 16k bytes per position instead of 2·n_vocab + 8):
//!
//! ```text
//! "_topklp_"  n_ctx: u32  n_vocab: i32  n_chunk: i32  k: u32  tokens: i32 × n_ctx·n_chunk
//! per chunk, per scored position:
//!   log_p_next: f32   the log-probability of the text's next token
//!   log_p_rest: f32   the log of the mass outside the k most likely tokens (−∞ when none)
//!   id: u32 × k       the k most likely tokens, most likely first (ties: lower id)
//!   log_p: f32 × k    their log-probabilities
//!   id: u32 × k       k draws from the rest, in proportion to their probabilities
//!   log_p: f32 × k    their log-probabilities
//! ```
//!
//! The draws are systematic: the rest's tokens in id order are laid along
//! its cumulative probability and read at `(j + u) / k` of it, `j = 0..k`,
//! with `u` uniform per position from a fixed seed, so a file is a function
//! of the logits. (With no rest the draws are id 0 with `−∞`.)
//!
//! All integers little-endian.

use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::EvalError;
use super::stats::nearest_int;
use memwall_format::atomic::AtomicFile;

const MAGIC: &[u8; 8] = b"_logits_";
const TOP_K_MAGIC: &[u8; 8] = b"_topklp_";

/// What a reference file keeps of each scored position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every token's log-probability in 16 bits (llama.cpp's format).
    Full,
    /// The `k` most likely tokens' log-probabilities, the mass of the rest and
    /// the next token's log-probability (memwall's format).
    TopK(usize),
}

impl Layout {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            Layout::Full => MAGIC,
            Layout::TopK(_) => TOP_K_MAGIC,
        }
    }

    fn header_bytes(self) -> usize {
        match self {
            Layout::Full => 8 + 4 + 4 + 4,
            Layout::TopK(_) => 8 + 4 + 4 + 4 + 4,
        }
    }

    fn record_bytes(self, n_vocab: usize) -> usize {
        match self {
            // Two f32 fields, then the vocabulary's u16s padded to even.
            Layout::Full => 2 * (2 * n_vocab.div_ceil(2) + 4),
            Layout::TopK(k) => 8 + 16 * k,
        }
    }
}

/// Writes a log-probability file as `<path>.partial`, renamed when complete.
pub struct LogitsWriter {
    path: PathBuf,
    layout: Layout,
    file: Option<AtomicFile>,
    n_vocab: usize,
    chunk: Vec<u8>,
    order: Vec<u32>,
    kept: Vec<bool>,
    draws: u64,
}

impl LogitsWriter {
    /// A writer of llama.cpp's full layout for `path` (nothing is created
    /// until the evaluation starts).
    pub fn new(path: &Path) -> Self {
        Self::with_layout(path, Layout::Full)
    }

    /// A writer of `layout` for `path`; a top-k larger than the vocabulary
    /// keeps the whole vocabulary.
    pub fn with_layout(path: &Path, layout: Layout) -> Self {
        LogitsWriter {
            path: path.to_owned(),
            layout,
            file: None,
            n_vocab: 0,
            chunk: Vec::new(),
            order: Vec::new(),
            kept: Vec::new(),
            draws: 0x6d65_6d77_616c_6c00,
        }
    }

    fn io(&self, e: std::io::Error) -> EvalError {
        EvalError::LogitsFile {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Writes the header and the evaluated tokens.
    pub(super) fn begin(
        &mut self,
        n_ctx: usize,
        n_vocab: usize,
        tokens: &[u32],
    ) -> Result<(), EvalError> {
        if let Layout::TopK(k) = self.layout {
            if k == 0 {
                return Err(EvalError::Settings(
                    "a top-k reference needs k of at least 1".into(),
                ));
            }
            self.layout = Layout::TopK(k.min(n_vocab));
        }
        let mut f = AtomicFile::create(&self.path).map_err(|e| self.io(e))?;
        let n_chunk = tokens.len() / n_ctx;
        let mut head = Vec::with_capacity(self.layout.header_bytes() + 4 * tokens.len());
        head.extend_from_slice(self.layout.magic());
        head.extend_from_slice(&(n_ctx as u32).to_le_bytes());
        head.extend_from_slice(&(n_vocab as i32).to_le_bytes());
        head.extend_from_slice(&(n_chunk as i32).to_le_bytes());
        if let Layout::TopK(k) = self.layout {
            head.extend_from_slice(&(k as u32).to_le_bytes());
        }
        for &t in tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        f.write_all(&head).map_err(|e| self.io(e))?;
        self.file = Some(f);
        self.n_vocab = n_vocab;
        Ok(())
    }

    /// Records one position's log-probabilities into the current chunk and
    /// returns the NLL of `next`, as llama.cpp computes it on this path.
    pub(super) fn record(&mut self, logits: &[f32], next: usize) -> f64 {
        let max = logits.iter().copied().fold(logits[0], f32::max);
        let sum_exp: f64 = logits
            .iter()
            .map(|&l| crate::forward::math::exp(l - max) as f64)
            .sum();
        let log_sum_exp = sum_exp.ln() as f32;
        match self.layout {
            Layout::Full => self.record_full(logits, max, log_sum_exp),
            Layout::TopK(k) => self.record_top_k(logits, k, next, max, sum_exp),
        }
        (max + log_sum_exp - logits[next]) as f64
    }

    fn record_full(&mut self, logits: &[f32], max: f32, log_sum_exp: f32) {
        let n = self.n_vocab;
        let min = logits
            .iter()
            .copied()
            .fold(logits[0], f32::min)
            .max(max - 16.0);
        let min_log_prob = min - max - log_sum_exp;
        let scale = (max - min) / 65535.0;
        let start = self.chunk.len();
        self.chunk.resize(start + self.layout.record_bytes(n), 0);
        let out = &mut self.chunk[start..];
        out[0..4].copy_from_slice(&scale.to_le_bytes());
        out[4..8].copy_from_slice(&min_log_prob.to_le_bytes());
        if scale != 0.0 {
            let inv = 1.0 / scale;
            for (q, &l) in out[8..8 + 2 * n].chunks_exact_mut(2).zip(logits) {
                let v = if l > min {
                    nearest_int(inv * (l - min)) as u16
                } else {
                    0
                };
                q.copy_from_slice(&v.to_le_bytes());
            }
        }
    }

    fn record_top_k(&mut self, logits: &[f32], k: usize, next: usize, max: f32, sum_exp: f64) {
        let log_sum_exp = sum_exp.ln() as f32;
        self.order.clear();
        self.order.extend(0..logits.len() as u32);
        // Most likely first; equal logits by id, so the order is a function of the row.
        let before = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        if k < self.order.len() {
            self.order.select_nth_unstable_by(k - 1, before);
        }
        let top = &mut self.order[..k];
        top.sort_unstable_by(before);
        let kept: f64 = top
            .iter()
            .map(|&i| crate::forward::math::exp(logits[i as usize] - max) as f64)
            .sum();
        let rest = sum_exp - kept;
        let log_p_rest = if k < logits.len() && rest > 0.0 {
            (rest.ln() - sum_exp.ln()) as f32
        } else {
            f32::NEG_INFINITY
        };
        let log_p = |i: u32| logits[i as usize] - max - log_sum_exp;
        // k ids, then their k log-probabilities.
        let entries = |out: &mut Vec<u8>, ids: &[u32], lp: &dyn Fn(u32) -> f32| {
            out.extend(ids.iter().flat_map(|i| i.to_le_bytes()));
            out.extend(ids.iter().flat_map(|&i| lp(i).to_le_bytes()));
        };
        self.chunk
            .extend_from_slice(&log_p(next as u32).to_le_bytes());
        self.chunk.extend_from_slice(&log_p_rest.to_le_bytes());
        entries(&mut self.chunk, top, &log_p);
        // The draws from the rest, in id order along its cumulative mass.
        let u = crate::sampling::uniform(&mut self.draws);
        let mut draws = Vec::with_capacity(k);
        if log_p_rest > f32::NEG_INFINITY {
            self.kept.clear();
            self.kept.resize(logits.len(), false);
            for &i in top.iter() {
                self.kept[i as usize] = true;
            }
            let mut cumulative = 0f64;
            let mut last = 0;
            for (i, &l) in logits.iter().enumerate() {
                if self.kept[i] {
                    continue;
                }
                last = i as u32;
                cumulative += crate::forward::math::exp(l - max) as f64;
                while draws.len() < k && (draws.len() as f64 + u) / k as f64 * rest < cumulative {
                    draws.push(last);
                }
            }
            // Rounding can leave the last targets a hair past the sum.
            draws.resize(k, last);
            entries(&mut self.chunk, &draws, &log_p);
        } else {
            entries(&mut self.chunk, &vec![0; k], &|_| f32::NEG_INFINITY);
        }
    }

    /// Writes the positions recorded since the last chunk.
    pub(super) fn end_chunk(&mut self) -> Result<(), EvalError> {
        let r = match self.file.as_mut() {
            Some(f) => f.write_all(&self.chunk),
            None => Ok(()),
        };
        self.chunk.clear();
        r.map_err(|e| self.io(e))
    }

    /// Flushes, syncs and renames the file into place.
    pub(super) fn finish(&mut self) -> Result<(), EvalError> {
        match self.file.take() {
            Some(f) => f.commit().map_err(|e| self.io(e)),
            None => Ok(()),
        }
    }
}

/// A log-probability file, memory-mapped and checked against its header.
pub struct LogitsReader {
    path: PathBuf,
    bytes: Bytes,
    layout: Layout,
    n_ctx: usize,
    n_vocab: usize,
    n_chunk: usize,
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// One scored position of a reference file.
pub(super) enum Record<'a> {
    /// `log p(i) = scale · q[i] + min_log_prob`, `q` as little-endian u16s.
    Full {
        scale: f32,
        min_log_prob: f32,
        q: &'a [u8],
    },
    /// The most likely tokens and the draws from the rest (ids and
    /// log-probabilities as little-endian u32/f32), the log of the rest's mass
    /// and the next token's log-probability.
    TopK {
        log_p_next: f32,
        log_p_rest: f32,
        ids: &'a [u8],
        log_p: &'a [u8],
        drawn_ids: &'a [u8],
        drawn_log_p: &'a [u8],
    },
}

fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

impl LogitsReader {
    /// Opens `path`; its size must be exactly what the header implies.
    pub fn open(path: &Path) -> Result<Self, EvalError> {
        let err = |message: String| EvalError::LogitsFile {
            path: path.to_owned(),
            message,
        };
        let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
        let len = file.metadata().map_err(|e| err(e.to_string()))?.len();
        let bytes = if len == 0 {
            Bytes::Owned(Vec::new())
        } else {
            // SAFETY: read-only mapping of a file memwall does not write; a file
            // truncated by another process while mapped is outside the contract,
            // as for GGUF inputs.
            Bytes::Mapped(unsafe { Mmap::map(&file) }.map_err(|e| err(e.to_string()))?)
        };
        let layout = match bytes.get(..8) {
            Some(m) if m == MAGIC => Layout::Full,
            Some(m) if m == TOP_K_MAGIC && bytes.len() >= Layout::TopK(0).header_bytes() => {
                Layout::TopK(word(&bytes, 20) as usize)
            }
            _ => {
                return Err(err(
                    "not a log-probability file (no _logits_ or _topklp_ header); write one with `memwall perplexity --save-logits`".into(),
                ));
            }
        };
        if bytes.len() < layout.header_bytes() {
            return Err(err(format!(
                "{} bytes: shorter than the header",
                bytes.len()
            )));
        }
        let (n_ctx, n_vocab, n_chunk) = (
            word(&bytes, 8) as usize,
            word(&bytes, 12) as usize,
            word(&bytes, 16) as usize,
        );
        if n_ctx < 4
            || n_vocab == 0
            || n_vocab > i32::MAX as usize
            || n_chunk == 0
            || n_chunk > i32::MAX as usize
        {
            return Err(err(format!(
                "header claims context {n_ctx}, vocabulary {n_vocab}, {n_chunk} chunks"
            )));
        }
        if let Layout::TopK(k) = layout
            && (k == 0 || k > n_vocab)
        {
            return Err(err(format!(
                "header claims the top {k} of a vocabulary of {n_vocab}"
            )));
        }
        let scored = n_ctx - 1 - n_ctx / 2;
        let expected = (n_ctx as u128 * n_chunk as u128 * 4)
            + (n_chunk as u128 * scored as u128 * layout.record_bytes(n_vocab) as u128)
            + layout.header_bytes() as u128;
        if expected != bytes.len() as u128 {
            return Err(err(format!(
                "{} bytes, but a context of {n_ctx}, a vocabulary of {n_vocab} and {n_chunk} chunks make {expected}: truncated or not from this format",
                bytes.len()
            )));
        }
        Ok(LogitsReader {
            path: path.to_owned(),
            bytes,
            layout,
            n_ctx,
            n_vocab,
            n_chunk,
        })
    }

    pub(super) fn error(&self, message: String) -> EvalError {
        EvalError::LogitsFile {
            path: self.path.clone(),
            message,
        }
    }

    /// What the file keeps of each position.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Context length the reference was evaluated with.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The reference's vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Chunks saved.
    pub fn n_chunk(&self) -> usize {
        self.n_chunk
    }

    /// The tokens of chunk `i`.
    pub fn tokens(&self, i: usize) -> Vec<u32> {
        let start = self.layout.header_bytes() + i * self.n_ctx * 4;
        self.bytes[start..start + self.n_ctx * 4]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// The saved record of scored position `r` of chunk `i`. A top-k record
    /// naming a token outside the vocabulary is an error.
    pub(super) fn record(&self, i: usize, r: usize) -> Result<Record<'_>, EvalError> {
        let scored = self.n_ctx - 1 - self.n_ctx / 2;
        let rec = self.layout.record_bytes(self.n_vocab);
        let start =
            self.layout.header_bytes() + self.n_chunk * self.n_ctx * 4 + (i * scored + r) * rec;
        let record = parse(self.layout, self.n_vocab, &self.bytes[start..start + rec]);
        if let Record::TopK { ids, drawn_ids, .. } = &record
            && let Some(bad) = ids
                .chunks_exact(4)
                .chain(drawn_ids.chunks_exact(4))
                .map(|id| word(id, 0) as usize)
                .find(|&id| id >= self.n_vocab)
        {
            return Err(self.error(format!(
                "chunk {i}, position {r}: token {bad} is outside the vocabulary of {}",
                self.n_vocab
            )));
        }
        Ok(record)
    }
}

/// The fields of one record of `layout` (`b` is exactly its bytes).
fn parse(layout: Layout, n_vocab: usize, b: &[u8]) -> Record<'_> {
    let f = |at: usize| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    match layout {
        Layout::Full => Record::Full {
            scale: f(0),
            min_log_prob: f(4),
            q: &b[8..8 + 2 * n_vocab],
        },
        Layout::TopK(k) => {
            let field = |n: usize| &b[8 + 4 * k * n..8 + 4 * k * (n + 1)];
            Record::TopK {
                log_p_next: f(0),
                log_p_rest: f(4),
                ids: field(0),
                log_p: field(1),
                drawn_ids: field(2),
                drawn_log_p: field(3),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::stats::KldAccumulator;
    use super::*;

    /// A reproducible row of logits with a long tail, and a perturbed copy.
    fn rows(state: &mut u64, n: usize, noise: f64) -> (Vec<f32>, Vec<f32>) {
        let mut base = Vec::with_capacity(n);
        let mut model = Vec::with_capacity(n);
        for i in 0..n {
            let u = crate::sampling::uniform(state);
            let l = 8.0 * u - (i as f64).sqrt() * 0.05;
            base.push(l as f32);
            model.push((l + noise * (crate::sampling::uniform(state) - 0.5)) as f32);
        }
        (base, model)
    }

    /// KL(p ‖ q) of two rows of logits, in f64 over the whole vocabulary.
    fn exact_kld(base: &[f32], model: &[f32]) -> f64 {
        let log_norm = |row: &[f32]| {
            let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
            max + row
                .iter()
                .map(|&l| (l as f64 - max).exp())
                .sum::<f64>()
                .ln()
        };
        let (lp, lq) = (log_norm(base), log_norm(model));
        base.iter()
            .zip(model)
            .map(|(&p, &q)| {
                let (p, q) = (p as f64 - lp, q as f64 - lq);
                p.exp() * (p - q)
            })
            .sum()
    }

    /// Writes `positions` rows of a `n_vocab` vocabulary as `layout` and returns
    /// the mean KL divergence the accumulator makes of them, and the exact one.
    fn mean_kld(layout: Layout, n_vocab: usize, positions: usize, noise: f64) -> (f64, f64) {
        let mut writer = LogitsWriter::with_layout(Path::new("unused"), layout);
        writer.n_vocab = n_vocab;
        let mut acc = KldAccumulator::default();
        let (mut state, mut exact) = (7u64, 0f64);
        for pos in 0..positions {
            let (base, model) = rows(&mut state, n_vocab, noise);
            writer.record(&base, pos % n_vocab);
            let record = parse(layout, n_vocab, &writer.chunk);
            assert_eq!(writer.chunk.len(), layout.record_bytes(n_vocab));
            acc.add(&model, record, pos % n_vocab);
            writer.chunk.clear();
            exact += exact_kld(&base, &model);
        }
        (acc.finish().kld.mean, exact / positions as f64)
    }

    #[test]
    fn top_k_kl_divergence_with_drawn_rest_is_within_a_percent_of_the_exact_one() {
        for (k, noise) in [(4, 1.0), (16, 1.0), (16, 0.2), (64, 3.0)] {
            let (ours, exact) = mean_kld(Layout::TopK(k), 3000, 400, noise);
            assert!(
                (ours / exact - 1.0).abs() < 0.01,
                "k {k}, noise {noise}: top-k {ours}, exact {exact}"
            );
        }
    }

    #[test]
    fn a_top_k_as_large_as_the_vocabulary_is_exact() {
        let (ours, exact) = mean_kld(Layout::TopK(50), 50, 40, 1.0);
        assert!((ours / exact - 1.0).abs() < 1e-5, "{ours} vs {exact}");
    }

    #[test]
    fn draws_come_from_outside_the_top_k_in_proportion_to_probability() {
        // Two likely tokens, then a rest of four with masses 1 : 1 : 2 : 4.
        let logits = [5.0f32, 0.0, 6.0, 0.0, 2f32.ln(), 4f32.ln()];
        let mut writer = LogitsWriter::with_layout(Path::new("unused"), Layout::TopK(2));
        writer.n_vocab = logits.len();
        let mut seen = [0usize; 6];
        for _ in 0..4000 {
            writer.record(&logits, 0);
            let Record::TopK { ids, drawn_ids, .. } = parse(Layout::TopK(2), 6, &writer.chunk)
            else {
                unreachable!()
            };
            assert_eq!(ids, [2u32.to_le_bytes(), 0u32.to_le_bytes()].concat());
            for id in drawn_ids.chunks_exact(4) {
                seen[word(id, 0) as usize] += 1;
            }
            writer.chunk.clear();
        }
        assert_eq!((seen[0], seen[2]), (0, 0));
        // 8000 draws: 1000, 1000, 2000, 4000 expected; systematic draws stay close.
        for (id, expected) in [(1, 1000.0), (3, 1000.0), (4, 2000.0), (5, 4000.0)] {
            let got = seen[id] as f64;
            assert!(
                (got / expected - 1.0).abs() < 0.05,
                "token {id}: {got} draws"
            );
        }
    }
}
