//! Perplexity and KL divergence, computed as `llama-perplexity` computes them.
//!
//! The text's tokens are cut into chunks of `n_ctx`; each chunk is evaluated
//! from an empty cache with its first token replaced by BOS (when the
//! vocabulary adds one), and only the second half of each window is scored, so
//! that every scored token has at least `n_ctx / 2` tokens of context. The
//! estimate is `exp(mean NLL)` with the standard error of the mean NLL carried
//! through `exp`.
//!
//! KL divergence compares a model with a reference whose log-probabilities of
//! the same windows were saved first ([`LogitsWriter`]); the file format is
//! llama.cpp's (`--kl-divergence-base`), so either tool can read the other's.

mod logits_file;
mod stats;

pub use logits_file::{Layout, LogitsReader, LogitsWriter};
pub use stats::{KldStats, Summary};

use crate::forward::{ForwardError, Model};
use memwall_format::cleanup::ScratchFile;
use memwall_format::progress::{Progress, Unit};

/// Why an evaluation failed.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The model could not be run.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// The text is too short for one chunk pair.
    #[error(
        "the text has {tokens} tokens; perplexity with a context of {n_ctx} needs at least {} (use a longer text or a smaller -c)",
        2 * n_ctx
    )]
    TooShort {
        /// Tokens in the text.
        tokens: usize,
        /// Context length asked for.
        n_ctx: usize,
    },
    /// A setting is out of range.
    #[error("{0}")]
    Settings(String),
    /// The log-probability file cannot be used.
    #[error("{path}: {message}")]
    LogitsFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// How to cut and evaluate the text.
#[derive(Clone, Debug)]
pub struct Options {
    /// Tokens per window (`-c`).
    pub n_ctx: usize,
    /// Tokens per forward call (`-b`); at most `n_ctx` are used.
    pub n_batch: usize,
    /// Evaluate at most this many chunks (`--chunks`).
    pub max_chunks: Option<usize>,
    /// The BOS id that replaces each chunk's first token, when the vocabulary adds BOS.
    pub bos: Option<u32>,
    /// Run the output head on every position, not only the scored half (so
    /// that an [`Observer`](crate::forward::Observer) sees all of them, as
    /// llama-imatrix's `--process-output` does).
    pub all_outputs: bool,
}

/// The perplexity of a text.
#[derive(Clone, Debug, PartialEq)]
pub struct Perplexity {
    /// Tokens in the text.
    pub tokens: usize,
    /// Chunks evaluated.
    pub chunks: usize,
    /// Tokens scored.
    pub scored: usize,
    /// The estimate.
    pub ppl: f64,
    /// Its standard error (`±`, as llama-perplexity prints it).
    pub plus_minus: f64,
    /// The running estimate after each chunk (llama-perplexity's `[1]…,[2]…`).
    pub chunk_ppl: Vec<f64>,
}

impl Options {
    fn check(&self, tokens: usize) -> Result<(usize, usize), EvalError> {
        if self.n_ctx < 4 {
            return Err(EvalError::Settings(format!(
                "a context of {} tokens is too small to score (at least 4)",
                self.n_ctx
            )));
        }
        if self.n_batch == 0 {
            return Err(EvalError::Settings(
                "the batch size must be at least 1".into(),
            ));
        }
        if tokens < 2 * self.n_ctx {
            return Err(EvalError::TooShort {
                tokens,
                n_ctx: self.n_ctx,
            });
        }
        let max = tokens / self.n_ctx;
        let chunks = self.max_chunks.map_or(max, |c| c.min(max));
        if chunks == 0 {
            return Err(EvalError::Settings("--chunks must be at least 1".into()));
        }
        Ok((chunks, self.n_ctx / 2))
    }
}

/// The logits of positions `first..n_ctx` of one window, `n_ctx - first` rows.
fn window_logits(
    model: &Model,
    window: &[u32],
    first: usize,
    options: &Options,
) -> Result<Vec<f32>, EvalError> {
    let mut tokens = window.to_vec();
    if let Some(bos) = options.bos {
        tokens[0] = bos;
    }
    let mut session = model.session();
    let batch = options.n_batch.min(tokens.len());
    let skip = if options.all_outputs { 0 } else { first };
    let mut logits = Vec::with_capacity((tokens.len() - skip) * model.config.n_vocab);
    for (b, piece) in tokens.chunks(batch).enumerate() {
        let start = b * batch;
        let from = skip.saturating_sub(start).min(piece.len());
        logits.extend(model.forward_from(&mut session, piece, from)?);
    }
    if skip < first {
        logits.drain(..(first - skip) * model.config.n_vocab);
    }
    Ok(logits)
}

/// Perplexity of `tokens` (the whole text, BOS already added when the
/// vocabulary adds one). With `save`, each window's log-probabilities are
/// written for a later [`kl_divergence`].
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    options: &Options,
    mut save: Option<&mut LogitsWriter>,
    progress: &dyn Progress,
) -> Result<Perplexity, EvalError> {
    let (chunks, first) = options.check(tokens.len())?;
    let n_ctx = options.n_ctx;
    let n_vocab = model.config.n_vocab;
    if let Some(w) = save.as_deref_mut() {
        w.begin(n_ctx, n_vocab, &tokens[..chunks * n_ctx])?;
    }
    progress.start("perplexity", chunks as u64, Unit::Items);
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut chunk_ppl = Vec::with_capacity(chunks);
    for i in 0..chunks {
        let window = &tokens[i * n_ctx..(i + 1) * n_ctx];
        let logits = window_logits(model, window, first, options)?;
        // Row r holds position first + r and predicts the token after it.
        for r in 0..n_ctx - 1 - first {
            let row = &logits[r * n_vocab..(r + 1) * n_vocab];
            let next = window[first + r + 1] as usize;
            let v = match save.as_deref_mut() {
                Some(w) => w.record(row, next),
                None => -stats::log_softmax(row, next),
            };
            nll += v;
            nll2 += v * v;
        }
        if let Some(w) = save.as_deref_mut() {
            w.end_chunk()?;
        }
        count += n_ctx - 1 - first;
        chunk_ppl.push((nll / count as f64).exp());
        progress.advance(1);
    }
    progress.finish();
    if let Some(w) = save {
        w.finish()?;
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    let var = nll2 / count as f64 - mean * mean;
    let plus_minus = if var > 0.0 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        tokens: tokens.len(),
        chunks,
        scored: count,
        ppl,
        plus_minus,
        chunk_ppl,
    })
}

/// A reference model's evaluation on a text, kept for comparing other models
/// with it: its perplexity, and its log-probabilities in a scratch file
/// (removed when the baseline is dropped, and by the signal handlers).
pub struct Baseline {
    /// The reference's perplexity.
    pub perplexity: Perplexity,
    logits: LogitsReader,
    _scratch: ScratchFile,
}

impl Baseline {
    /// Evaluates `reference` on `tokens`, saving its log-probabilities to
    /// `scratch` (every token's: llama.cpp's layout).
    pub fn new(
        reference: &Model,
        tokens: &[u32],
        options: &Options,
        scratch: ScratchFile,
        progress: &dyn Progress,
    ) -> Result<Baseline, EvalError> {
        Self::with_layout(reference, tokens, options, scratch, Layout::Full, progress)
    }

    /// Like [`Baseline::new`], keeping what `layout` keeps of each position
    /// (a top-k reference is a few KiB a position whatever the vocabulary).
    pub fn with_layout(
        reference: &Model,
        tokens: &[u32],
        options: &Options,
        scratch: ScratchFile,
        layout: Layout,
        progress: &dyn Progress,
    ) -> Result<Baseline, EvalError> {
        let mut writer = LogitsWriter::with_layout(scratch.path(), layout);
        let perplexity = perplexity(reference, tokens, options, Some(&mut writer), progress)?;
        let logits = LogitsReader::open(scratch.path())?;
        Ok(Baseline {
            perplexity,
            logits,
            _scratch: scratch,
        })
    }

    /// Perplexity, KL divergence and top-token agreement of `model` against
    /// the reference, over the same windows.
    pub fn compare(
        &self,
        model: &Model,
        options: &Options,
        progress: &dyn Progress,
    ) -> Result<KldStats, EvalError> {
        kl_divergence(model, &self.logits, options, progress)
    }
}

/// KL divergence of `model` from the reference whose log-probabilities `base`
/// holds, over the same windows (the tokens come from the file). `max_chunks`
/// limits the chunks read.
pub fn kl_divergence(
    model: &Model,
    base: &LogitsReader,
    options: &Options,
    progress: &dyn Progress,
) -> Result<KldStats, EvalError> {
    let n_ctx = base.n_ctx();
    let n_vocab = model.config.n_vocab;
    if base.n_vocab() != n_vocab {
        return Err(base.error(format!(
            "saved with a vocabulary of {} tokens; this model has {n_vocab}",
            base.n_vocab()
        )));
    }
    if n_ctx < 4 {
        return Err(base.error(format!("context of {n_ctx} tokens is too small")));
    }
    let options = Options {
        n_ctx,
        ..options.clone()
    };
    let first = n_ctx / 2;
    let chunks = options
        .max_chunks
        .map_or(base.n_chunk(), |c| c.min(base.n_chunk()));
    let mut acc = stats::KldAccumulator::default();
    progress.start("KL divergence", chunks as u64, Unit::Items);
    for i in 0..chunks {
        let window = base.tokens(i);
        let logits = window_logits(model, &window, first, &options)?;
        for r in 0..n_ctx - 1 - first {
            let row = &logits[r * n_vocab..(r + 1) * n_vocab];
            let next = window[first + r + 1] as usize;
            acc.add(row, base.record(i, r)?, next);
        }
        progress.advance(1);
    }
    progress.finish();
    Ok(acc.finish())
}
