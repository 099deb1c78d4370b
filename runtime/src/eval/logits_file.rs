//! The reference log-probabilities file of llama.cpp's KL-divergence mode
//! (`llama-perplexity --kl-divergence-base`), byte for byte:
//!
//! ```text
//! "_logits_"  n_ctx: u32  n_vocab: i32  n_chunk: i32  tokens: i32 × n_ctx·n_chunk
//! per chunk, per scored position (n_ctx − 1 − n_ctx/2 of them):
//!   scale: f32  min_log_prob: f32  q: u16 × n_vocab (padded to even)
//! ```
//!
//! `log p(i) ≈ scale · q[i] + min_log_prob`, with `q = 0` for logits more than
//! 16 below the maximum. All integers little-endian.

use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::EvalError;
use super::stats::nearest_int;
use memwall_format::atomic::AtomicFile;

const MAGIC: &[u8; 8] = b"_logits_";
const HEADER: usize = 8 + 4 + 4 + 4;

/// u16 slots per scored position: two f32 fields, then the vocabulary padded to even.
fn slots(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Writes a log-probability file as `<path>.partial`, renamed when complete.
pub struct LogitsWriter {
    path: PathBuf,
    file: Option<AtomicFile>,
    n_vocab: usize,
    chunk: Vec<u16>,
}

impl LogitsWriter {
    /// A writer for `path` (nothing is created until the evaluation starts).
    pub fn new(path: &Path) -> Self {
        LogitsWriter {
            path: path.to_owned(),
            file: None,
            n_vocab: 0,
            chunk: Vec::new(),
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
        let mut f = AtomicFile::create(&self.path).map_err(|e| self.io(e))?;
        let n_chunk = tokens.len() / n_ctx;
        let mut head = Vec::with_capacity(HEADER + 4 * tokens.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(n_ctx as u32).to_le_bytes());
        head.extend_from_slice(&(n_vocab as i32).to_le_bytes());
        head.extend_from_slice(&(n_chunk as i32).to_le_bytes());
        for &t in tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        f.write_all(&head).map_err(|e| self.io(e))?;
        self.file = Some(f);
        self.n_vocab = n_vocab;
        Ok(())
    }

    /// Quantizes one position's log-probabilities into the current chunk and
    /// returns the NLL of `next`, as llama.cpp computes it on this path.
    pub(super) fn record(&mut self, logits: &[f32], next: usize) -> f64 {
        let n = self.n_vocab;
        let start = self.chunk.len();
        self.chunk.resize(start + slots(n), 0);
        let out = &mut self.chunk[start..];
        let max = logits.iter().copied().fold(logits[0], f32::max);
        let min = logits
            .iter()
            .copied()
            .fold(logits[0], f32::min)
            .max(max - 16.0);
        let sum_exp: f64 = logits
            .iter()
            .map(|&l| crate::forward::math::exp(l - max) as f64)
            .sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let min_log_prob = min - max - log_sum_exp;
        let scale = (max - min) / 65535.0;
        let (s, m) = (scale.to_le_bytes(), min_log_prob.to_le_bytes());
        out[0] = u16::from_le_bytes([s[0], s[1]]);
        out[1] = u16::from_le_bytes([s[2], s[3]]);
        out[2] = u16::from_le_bytes([m[0], m[1]]);
        out[3] = u16::from_le_bytes([m[2], m[3]]);
        if scale != 0.0 {
            let inv = 1.0 / scale;
            for (q, &l) in out[4..4 + n].iter_mut().zip(logits) {
                *q = if l > min {
                    nearest_int(inv * (l - min)) as u16
                } else {
                    0
                };
            }
        }
        (max + log_sum_exp - logits[next]) as f64
    }

    /// Writes the positions recorded since the last chunk.
    pub(super) fn end_chunk(&mut self) -> Result<(), EvalError> {
        let bytes: Vec<u8> = self.chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.chunk.clear();
        let r = match self.file.as_mut() {
            Some(f) => f.write_all(&bytes),
            None => Ok(()),
        };
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
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err(err(
                "not a log-probability file (no _logits_ header); write one with `memwall perplexity --save-logits`".into(),
            ));
        }
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let (n_ctx, n_vocab, n_chunk) = (word(8) as usize, word(12) as usize, word(16) as usize);
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
        let scored = n_ctx - 1 - n_ctx / 2;
        let expected = (n_ctx as u128 * n_chunk as u128 * 4)
            + (n_chunk as u128 * scored as u128 * slots(n_vocab) as u128 * 2)
            + HEADER as u128;
        if expected != bytes.len() as u128 {
            return Err(err(format!(
                "{} bytes, but a context of {n_ctx}, a vocabulary of {n_vocab} and {n_chunk} chunks make {expected}: truncated or not from this format",
                bytes.len()
            )));
        }
        Ok(LogitsReader {
            path: path.to_owned(),
            bytes,
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
        let start = HEADER + i * self.n_ctx * 4;
        self.bytes[start..start + self.n_ctx * 4]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// The saved record of scored position `r` of chunk `i`: `(scale, min, q)`.
    pub(super) fn record(&self, i: usize, r: usize) -> (f32, f32, &[u8]) {
        let scored = self.n_ctx - 1 - self.n_ctx / 2;
        let rec = slots(self.n_vocab) * 2;
        let start = HEADER + self.n_chunk * self.n_ctx * 4 + (i * scored + r) * rec;
        let b = &self.bytes[start..start + rec];
        let f = |at: usize| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        (f(0), f(4), &b[8..8 + 2 * self.n_vocab])
    }
}
