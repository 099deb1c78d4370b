//! Text generation over a model: a [`Generator`] holds the model, its
//! tokenizer, a sampler and the tokens its KV cache holds, so that a prompt
//! sharing a prefix with what was evaluated before (the next turn of a chat)
//! reuses it. [`Generator::generate`] hands whole UTF-8 text to a sink as it
//! comes, holding back what could still turn into a stop string, and stops at
//! the end-of-generation token, a stop string, the token limit or a full
//! context.
//!
//! ```no_run
//! use memwall_format::gguf::GgufModel;
//! use memwall_runtime::forward::Model;
//! use memwall_runtime::generate::Generator;
//! use memwall_runtime::sampling::{Sampler, SamplerConfig};
//! use memwall_runtime::tokenizer::Tokenizer;
//!
//! let gguf = GgufModel::open("model.gguf".as_ref())?;
//! let model = Model::new(&gguf, 2048)?;
//! let tokenizer = Tokenizer::from_gguf(gguf.metadata())?;
//! let sampler = Sampler::new(SamplerConfig::default());
//! let mut g = Generator::new(model, tokenizer, sampler, 512);
//! let prompt = g.tokenizer().encode("The capital of France is", true, true);
//! let (text, stats) = g.generate(&prompt, 32, &[], &mut |piece| print!("{piece}"))?;
//! println!("\n{} tokens, stopped by {}", stats.generated, stats.stopped_by.name());
//! # let _ = text;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::{Duration, Instant};

use crate::forward::{ForwardError, Model, Session};
use crate::residency::storage_read_bytes;
use crate::sampling::Sampler;
use crate::tokenizer::Tokenizer;

/// Why a generation could not run.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// No tokens to start from.
    #[error("the prompt is empty (and the model adds no BOS token); give some text")]
    EmptyPrompt,
    /// The prompt does not fit the context.
    #[error("the prompt needs {need} tokens; the context holds {n_ctx} (raise -c)")]
    PromptTooLong {
        /// Tokens the cache would hold.
        need: usize,
        /// The context length.
        n_ctx: usize,
    },
    /// The forward pass failed.
    #[error(transparent)]
    Forward(#[from] ForwardError),
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stop {
    /// The token limit.
    #[default]
    Length,
    /// An end-of-generation token (not part of the text).
    EndOfGeneration,
    /// A stop string (cut from the text).
    StopString,
    /// The context is full.
    Context,
}

impl Stop {
    /// The name `memwall run` prints: `length`, `eog`, `stop`, `context`.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Length => "length",
            Stop::EndOfGeneration => "eog",
            Stop::StopString => "stop",
            Stop::Context => "context",
        }
    }
}

/// Timings of one generation.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Tokens of the prompt (including any reused from the cache).
    pub prompt_tokens: usize,
    /// Time to evaluate the prompt.
    pub prompt_time: Duration,
    /// Time to the first sampled token.
    pub first_token: Duration,
    /// Tokens generated.
    pub generated: usize,
    /// Time spent generating.
    pub decode_time: Duration,
    /// Why it ended.
    pub stopped_by: Stop,
    /// Bytes read from storage while generating, when the OS reports it.
    pub decode_read: Option<u64>,
}

/// A model, its tokenizer, a sampler and the tokens its cache holds.
pub struct Generator<'a> {
    model: Model<'a>,
    tokenizer: Tokenizer,
    sampler: Sampler,
    session: Session,
    evaluated: Vec<u32>,
    batch: usize,
}

impl<'a> Generator<'a> {
    /// A generator with an empty cache; prompts are evaluated in batches of
    /// at most `batch` tokens.
    pub fn new(model: Model<'a>, tokenizer: Tokenizer, sampler: Sampler, batch: usize) -> Self {
        Generator {
            session: model.session(),
            model,
            tokenizer,
            sampler,
            evaluated: Vec::new(),
            batch: batch.max(1),
        }
    }

    /// The model.
    pub fn model(&self) -> &Model<'a> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The sampler (to reset it between conversations).
    pub fn sampler_mut(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// Evaluates `tokens` after what the cache holds, reusing the longest
    /// common prefix, and returns the logits of the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, GenerateError> {
        if tokens.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let common = self
            .evaluated
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        // A model with linear-attention layers cannot step back: its session
        // may keep fewer tokens than asked (none).
        self.session.truncate(common);
        let common = self.session.len();
        self.evaluated.truncate(common);
        let rest = &tokens[common..];
        if self.evaluated.len() + rest.len() > self.model.config.n_ctx {
            return Err(GenerateError::PromptTooLong {
                need: self.evaluated.len() + rest.len(),
                n_ctx: self.model.config.n_ctx,
            });
        }
        // Batches of at most `batch` tokens; only the last token's logits are kept.
        let mut logits = Vec::new();
        for chunk in rest.chunks(self.batch) {
            let last = chunk.as_ptr_range().end == rest.as_ptr_range().end;
            let first = if last { chunk.len() - 1 } else { chunk.len() };
            logits = self.model.forward_from(&mut self.session, chunk, first)?;
            self.evaluated.extend_from_slice(chunk);
        }
        Ok(logits)
    }

    /// Generates at most `n_predict` tokens after `prompt`, handing `sink`
    /// each piece of whole UTF-8 text that can no longer become part of a
    /// stop string. Returns the text (cut at a stop string) and the timings.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n_predict: usize,
        stops: &[String],
        sink: &mut dyn FnMut(&str),
    ) -> Result<(String, Stats), GenerateError> {
        let started = Instant::now();
        let mut stats = Stats {
            prompt_tokens: prompt.len(),
            ..Stats::default()
        };
        for &t in prompt {
            self.sampler.accept(t);
        }
        let mut logits = self.feed(prompt)?;
        stats.prompt_time = started.elapsed();
        let mut decoder = self.tokenizer.stream_decoder(false);
        let mut text = String::new();
        let mut emitted = 0;
        let hold = stops
            .iter()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        let decode_start = Instant::now();
        let read_start = storage_read_bytes();
        for i in 0..n_predict {
            let id = self.sampler.sample(&logits);
            if i == 0 {
                stats.first_token = started.elapsed();
            }
            if self.tokenizer.is_eog(id) {
                stats.stopped_by = Stop::EndOfGeneration;
                break;
            }
            self.sampler.accept(id);
            stats.generated += 1;
            text.push_str(&decoder.push(id));
            if let Some(at) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
                text.truncate(at);
                stats.stopped_by = Stop::StopString;
                break;
            }
            // Hand over what cannot be the start of a stop string.
            let mut upto = text.len().saturating_sub(hold);
            while !text.is_char_boundary(upto) {
                upto -= 1;
            }
            if upto > emitted {
                sink(&text[emitted..upto]);
                emitted = upto;
            }
            if self.evaluated.len() >= self.model.config.n_ctx {
                stats.stopped_by = Stop::Context;
                break;
            }
            logits = self.model.forward(&mut self.session, &[id])?;
            self.evaluated.push(id);
        }
        // An incomplete UTF-8 character left by the last token is dropped,
        // never handed over as a replacement character.
        drop(decoder);
        if text.len() > emitted {
            sink(&text[emitted..]);
        }
        stats.decode_time = decode_start.elapsed();
        stats.decode_read = read_start
            .zip(storage_read_bytes())
            .map(|(a, b)| b.saturating_sub(a));
        Ok((text, stats))
    }
}
