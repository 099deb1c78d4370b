//! The forward pass: the architectures memwall converts, run as llama.cpp
//! runs them. Weights stay in the GGUF (memory-mapped or read, any type
//! [`blocks::dequantize_row`] decodes); every tensor is found and its shape
//! and type checked once, when the model is opened, so running cannot fail on
//! the model itself.
//!
//! | architecture | norm | RoPE | attention extras | FFN |
//! |---|---|---|---|---|
//! | `llama` (Llama, Mistral, Mixtral) | RMS | NORM (+`rope_freqs`) | optional biases | SwiGLU or MoE |
//! | `qwen2` | RMS | NEOX | Q/K/V biases | SwiGLU |
//! | `qwen3` | RMS | NEOX | per-head RMSNorm of Q and K | SwiGLU |
//! | `qwen3moe` | RMS | NEOX | per-head RMSNorm of Q and K | MoE |
//! | `command-r` | LayerNorm | NORM | optional per-head LayerNorm of Q, K | SwiGLU, parallel; logit scale |
//!
//! RoPE scaling: linear, YaRN and Llama 3 frequency factors. The KV cache
//! holds `f16`, as llama.cpp's default cache does; queries are rounded to
//! `f16` for the `Q·K` products like ggml's F16 dot products.
//!
//! [`blocks::dequantize_row`]: memwall_format::blocks::dequantize_row

mod attention;
mod calibration;
mod config;
mod delta;
mod experts;
mod ffn;
mod load;
pub(crate) mod math;
mod rope;
mod session;
mod spare;
mod stream;

use calibration::Keeping;
pub use calibration::{Kept, Observer};
pub use config::{Act, Config, Heads, Linear, Swa};
pub use experts::ExpertStats;
pub use rope::{Rope, Yarn};
pub use session::{KvType, Session};
pub use stream::{ExpertCacheReport, Streaming, StreamingReport};

use load::{
    Attention, DeltaNet, DenseAndMoe, Experts, Ffn, Layer, Matrix, Mixer, Norm, Shared, decode,
};
use session::{Cache, UBATCH};
use spare::Spare;
use stream::Stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::kernels::attn::{self, KEY_TILE};
use crate::kernels::{KernelError, Kernels, Matmul, Pool, QMatrix, for_each_chunk};
use memwall_format::GgmlType;
use memwall_format::blocks::{DEQUANTIZABLE, dequantize_row};
use memwall_format::gguf::GgufModel;
use memwall_format::model_info::HyperParams;

/// Why a model cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// Metadata missing or wrong.
    #[error("{0}")]
    Metadata(String),
    /// A tensor is missing or has the wrong shape or type.
    #[error("tensor {name}: {message}")]
    Tensor {
        /// The tensor.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A token id past the vocabulary.
    #[error("token id {0} is not in the vocabulary")]
    Token(u32),
    /// The context is full.
    #[error("the context holds {0} tokens; no room for more")]
    ContextFull(usize),
    /// The compute kernels refused a call or cannot run here.
    #[error(transparent)]
    Kernels(#[from] KernelError),
    /// [`Model::forward_layer_until`] reached its matrix (never returned by it).
    #[error("stopped before {0}")]
    Stopped(String),
}

/// A model over a GGUF file, every tensor resolved.
pub struct Model<'a> {
    /// Its hyper-parameters.
    pub config: Config,
    embd: Matrix<'a>,
    layers: Vec<Layer<'a>>,
    output_norm: Norm,
    output: Matrix<'a>,
    /// Kernels, thread pool and activation buffers of every matrix product.
    matmul: Mutex<Matmul>,
    /// The same kernels, for attention and the elementwise loops.
    kernels: Kernels,
    /// Multiply decoded `f32` weights with unrounded activations instead.
    exact: bool,
    /// Threads for attention (the matrix products have their own in `matmul`).
    pool: Option<Arc<Pool>>,
    gguf: &'a GgufModel,
    /// Streaming of weights larger than the memory the model may use.
    stream: Option<Stream<'a>>,
    /// Who sees the inputs of the matrix products.
    observer: Option<Arc<dyn Observer>>,
    /// Weights replaced after loading (calibration tries quantized versions
    /// of a layer before moving on): tensor name → type and bytes.
    replaced: HashMap<String, (GgmlType, Arc<[u8]>)>,
    /// Stop the forward pass once this matrix's input has been observed.
    stop_at: Option<String>,
    /// Buffers of finished intermediate results, reused by the next layer.
    spare: Spare,
    /// The rotation tables of [`Model::forward_layer`]'s last batch and its
    /// first position: calibration runs every sample from position 0.
    layer_tables: Mutex<Option<(usize, Arc<Tables>)>>,
}

/// A matrix's weights as the products read them: its own, or a replacement.
struct Weights<'m> {
    ty: GgmlType,
    data: &'m [u8],
    row_bytes: usize,
}

fn meta_err(e: impl std::fmt::Display) -> ForwardError {
    ForwardError::Metadata(e.to_string())
}

fn tensor_err(name: &str, message: impl Into<String>) -> ForwardError {
    ForwardError::Tensor {
        name: name.to_owned(),
        message: message.into(),
    }
}

impl<'a> Model<'a> {
    /// The kernels the forward pass runs.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// The threads the matrix products run on (`None`: the calling thread
    /// alone), for a caller's own parallel work between them.
    pub fn pool(&self) -> Option<Arc<Pool>> {
        self.pool.clone()
    }

    /// Runs the matrix products on `threads` threads (default: every core)
    /// with `kernels` (default: the best this CPU runs, or `MEMWALL_KERNELS`).
    pub fn set_compute(&mut self, kernels: Kernels, threads: usize) {
        let matmul = Matmul::new(kernels, threads);
        self.pool = matmul.pool();
        self.matmul = Mutex::new(matmul);
        self.kernels = kernels;
    }

    /// Exact arithmetic for comparisons with a float32 reference: weights
    /// decoded to `f32` and multiplied with unrounded activations (slow), and
    /// an `f32` KV cache. The default follows llama.cpp: activations quantized
    /// to the weight type's dot-product type, `f16` cache.
    pub fn set_exact(&mut self, exact: bool) {
        self.exact = exact;
        self.config.kv_type = if exact { KvType::F32 } else { KvType::F16 };
    }

    /// Shows the input of every weight matrix product to `observer` (none:
    /// stop showing).
    pub fn set_observer(&mut self, observer: Option<Arc<dyn Observer>>) {
        self.observer = observer;
    }

    /// The kernels and thread count in use.
    pub fn compute(&self) -> (Kernels, usize) {
        let m = self.lock();
        (m.kernels(), m.threads())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Matmul> {
        // A panic inside a matrix product leaves only scratch buffers behind.
        self.matmul.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `y = W·x` for `t_n` tokens: `x` is `t_n × cols`, the result `t_n × rows`.
    fn matmul(&self, m: &Matrix, x: &[f32], t_n: usize) -> Result<Vec<f32>, ForwardError> {
        self.matmul_sharing(m, x, t_n, &mut None)
    }

    /// [`Model::matmul`] of one of several matrices that read the same `x`
    /// in turn ([`Matmul::matmul_sharing`]: `shared` starts as `None`).
    fn matmul_sharing(
        &self,
        m: &Matrix,
        x: &[f32],
        t_n: usize,
        shared: &mut Option<u64>,
    ) -> Result<Vec<f32>, ForwardError> {
        if let Some(o) = &self.observer {
            o.matmul_input(m.name, m.expert, x, t_n);
        }
        if self.stop_at.as_deref() == Some(m.name) && m.expert.is_none() {
            return Err(ForwardError::Stopped(m.name.to_owned()));
        }
        let streamed = self.stream.as_ref().and_then(|s| {
            let &(pos, whole) = s.by_name.get(m.name)?;
            let not_replaced = !self.replaced.contains_key(m.name);
            not_replaced.then_some((s.reader.as_ref()?, pos, whole))
        });
        let Some((s, pos, whole)) = streamed else {
            return self.product(m, None, x, t_n, shared);
        };
        let loaded = s.acquire(pos);
        // `m` is the whole tensor or one expert's rows of it.
        let own = (m.data.as_ptr() as usize)
            .checked_sub(whole.as_ptr() as usize)
            .and_then(|off| loaded.bytes()?.get(off..off + m.data.len()));
        // A failed read leaves the mapping to read.
        let y = self.product(m, own, x, t_n, shared);
        s.release(pos, loaded);
        y
    }

    /// [`Model::matmul`]'s arithmetic, on `data` (the streamed copy of `m`'s
    /// bytes) when given.
    fn product(
        &self,
        m: &Matrix,
        data: Option<&[u8]>,
        x: &[f32],
        t_n: usize,
        shared: &mut Option<u64>,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut w = self.weights(m);
        if let Some(d) = data {
            w.data = d;
        }
        // Every output is written below (or the buffer dropped on an error).
        let mut y = self.spare.take_dirty(t_n * m.rows);
        if self.exact {
            let mut row = vec![0f32; m.cols];
            for r in 0..m.rows {
                dequantize_row(
                    w.ty,
                    &w.data[r * w.row_bytes..(r + 1) * w.row_bytes],
                    &mut row,
                )
                .map_err(|e| tensor_err(m.name, e.to_string()))?;
                for t in 0..t_n {
                    let xt = &x[t * m.cols..(t + 1) * m.cols];
                    y[t * m.rows + r] = row.iter().zip(xt).map(|(a, b)| a * b).sum();
                }
            }
            return Ok(y);
        }
        let q = QMatrix::new(w.ty, w.data, m.rows, m.cols)?;
        self.lock().matmul_sharing(&q, x, &mut y, shared)?;
        Ok(y)
    }

    /// The weights `m`'s products read: a replacement if one was installed.
    fn weights<'m>(&'m self, m: &'m Matrix) -> Weights<'m> {
        let Some((ty, bytes)) = self.replaced.get(m.name) else {
            return Weights {
                ty: m.ty,
                data: m.data,
                row_bytes: m.row_bytes,
            };
        };
        // Checked against the tensor's shape when it was installed.
        let row_bytes = bytes.len() / m.total_rows;
        let first = m.expert.map_or(0, |x| x * m.rows);
        Weights {
            ty: *ty,
            data: &bytes[first * row_bytes..(first + m.rows) * row_bytes],
            row_bytes,
        }
    }

    /// Evaluates `tokens` after what `session` holds and returns their logits,
    /// `tokens.len() × n_vocab`, row by row.
    pub fn forward(&self, session: &mut Session, tokens: &[u32]) -> Result<Vec<f32>, ForwardError> {
        self.forward_from(session, tokens, 0)
    }

    /// Like [`Model::forward`], but returns the logits of `tokens[first..]` only
    /// (the output head is the largest matrix of small models), and without an
    /// observer or a stop the last layer's feed-forward part runs on those rows
    /// alone (the same bits: each row's products do not depend on the others).
    pub fn forward_from(
        &self,
        session: &mut Session,
        tokens: &[u32],
        first: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        if session.n_past + tokens.len() > c.n_ctx {
            return Err(ForwardError::ContextFull(c.n_ctx));
        }
        // Sliding-window layers' rings hold one micro-batch beyond the window.
        if c.swa.is_none() || tokens.len() <= UBATCH {
            return self.forward_batch(session, tokens, first);
        }
        let mut logits = Vec::new();
        for (i, piece) in tokens.chunks(UBATCH).enumerate() {
            let skip = first.saturating_sub(i * UBATCH).min(piece.len());
            logits.extend(self.forward_batch(session, piece, skip)?);
        }
        Ok(logits)
    }

    /// [`Model::forward_from`] of one batch.
    fn forward_batch(
        &self,
        session: &mut Session,
        tokens: &[u32],
        first: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let t_n = tokens.len();
        let e = c.n_embd;
        if t_n == 1 {
            // A decoded token needs far smaller buffers than the batch before
            // it left: they go back to the system now. Batches in a row (a
            // long prompt's micro-batches, perplexity's chunks, repeated
            // prompts) keep them, faulted in once.
            self.spare.clear();
        }
        let mut x = self.embed(tokens)?;
        let tables = Tables::new(c, session.n_past, t_n);
        let mut h = vec![0f32; t_n * e];
        let first = first.min(t_n);
        // After the last layer's attention only the returned rows are read
        // (llama.cpp drops the others there too); an observer or a stop
        // inside the model sees every row.
        let watched = self.observer.is_some() || self.stop_at.is_some();
        let n_layers = self.layers.len();
        for l in 0..n_layers {
            let keep = if l + 1 == n_layers && !watched {
                first
            } else {
                0
            };
            self.layer_step(l, &mut x, &mut h, &tables, session, Rows::From(keep))?;
        }
        session.n_past += t_n;
        let rows = t_n - first;
        let mut out = vec![0f32; rows * e];
        self.norm(&x[first * e..], &self.output_norm, &mut out);
        let mut logits = self.matmul(&self.output, &out, rows)?;
        if c.logit_scale != 1.0 {
            logits.iter_mut().for_each(|v| *v *= c.logit_scale);
        }
        if let Some(cap) = c.final_softcap {
            self.softcap(&mut logits, cap);
        }
        Ok(logits)
    }

    /// Layer `l` over the hidden states `x` of the tokens whose RoPE tables
    /// are `tables`, with `h` as scratch of the same size. Every token's
    /// keys and values go to the cache; the rows of `x` before row `keep`
    /// are left as they are after the attention (nothing reads them).
    fn layer_step(
        &self,
        l: usize,
        x: &mut [f32],
        h: &mut [f32],
        tables: &Tables,
        session: &mut Session,
        rows: Rows,
    ) -> Result<(), ForwardError> {
        let (keep, mut kept) = match rows {
            Rows::From(keep) => (keep, None),
            Rows::Kept(k) => (0, Some(k)),
        };
        let layer = &self.layers[l];
        let (e, t_n) = (self.config.n_embd, tables.len() - keep);
        self.norm(x, &layer.attn_norm, h);
        let attn = match kept.as_deref().and_then(Keeping::attention) {
            Some(a) => self.spare_copy(a),
            None => {
                let mut attn = match &layer.mixer {
                    Mixer::Attention(a) => {
                        let k = kept.as_deref_mut();
                        self.attention_block(a, h, tables, session, l, k)?
                    }
                    Mixer::Linear(d) => {
                        self.delta_net_block(d, h, tables.len(), &mut session.state[l])?
                    }
                };
                if let Some(post) = &layer.post_attn_norm {
                    self.norm_in_place(&mut attn[keep * e..], post, &mut h[keep * e..]);
                }
                if let Some(k) = kept.as_deref_mut() {
                    k.keep_attention(&attn);
                }
                attn
            }
        };
        let (x, h, a) = (&mut x[keep * e..], &mut h[keep * e..], &attn[keep * e..]);
        if t_n > 0 {
            let ffn = if let Some(ffn_norm) = &layer.ffn_norm {
                self.add(x, a);
                self.show_residual(l, x, t_n);
                self.norm(x, ffn_norm, h);
                let mut ffn = self.ffn_kept(l, &layer.ffn, h, x, t_n, kept)?;
                if let Some(post) = &layer.post_ffn_norm {
                    self.norm_in_place(&mut ffn, post, h);
                }
                self.add(x, &ffn);
                ffn
            } else {
                // Parallel block: attention and FFN both read the attention norm.
                let ffn = self.ffn_kept(l, &layer.ffn, h, x, t_n, kept)?;
                self.add(x, a);
                self.add(x, &ffn);
                ffn
            };
            if let Some(s) = layer.out_scale {
                self.scale(x, s);
            }
            self.show_residual(l, x, t_n);
            self.spare.give(ffn);
        }
        self.spare.give(attn);
        Ok(())
    }

    /// Shows the residual stream after a block to the observer.
    fn show_residual(&self, l: usize, x: &[f32], t_n: usize) {
        if let Some(o) = &self.observer {
            o.residual(l, x, t_n);
        }
    }

    /// `x ← norm(x)`, with `scratch` (as long as `x`) as scratch.
    fn norm_in_place(&self, x: &mut [f32], norm: &Norm, scratch: &mut [f32]) {
        let scratch = &mut scratch[..x.len()];
        self.norm(x, norm, scratch);
        x.copy_from_slice(scratch);
    }

    /// `x ← c·tanh(x/c)` as ggml writes it (scale by 1/c, tanh, scale by
    /// c), element by element over the pool: a vocabulary of 262 144 logits
    /// per token.
    fn softcap(&self, x: &mut [f32], cap: f32) {
        let inv = 1.0 / cap;
        for_each_chunk(self.pool.as_deref(), x, NORM_VALUES, |_, x| {
            x.iter_mut().for_each(|v| *v = math::tanh(*v * inv) * cap);
        });
    }

    /// `x ← s·x`, element by element over the pool.
    fn scale(&self, x: &mut [f32], s: f32) {
        for_each_chunk(self.pool.as_deref(), x, NORM_VALUES, |_, x| {
            x.iter_mut().for_each(|v| *v *= s);
        });
    }

    fn norm(&self, x: &[f32], norm: &Norm, out: &mut [f32]) {
        // Row by row, rows split over the pool.
        let n = norm.weight.len();
        let rows = (NORM_VALUES / n.max(1)).max(1);
        for_each_chunk(self.pool.as_deref(), out, rows * n, |c, out| {
            let x = &x[c * rows * n..][..out.len()];
            if self.config.arch.layer_norm() {
                layer_norm(x, &norm.weight, norm.bias.as_deref(), self.config.eps, out);
            } else {
                rms_norm(x, &norm.weight, self.config.eps, out);
            }
        });
    }

    /// `x ← x + y`, element by element over the pool.
    fn add(&self, x: &mut [f32], y: &[f32]) {
        for_each_chunk(self.pool.as_deref(), x, NORM_VALUES, |c, x| {
            add(x, &y[c * NORM_VALUES..]);
        });
    }
}

/// How a layer step runs its rows.
enum Rows<'k, 'r> {
    /// Every row, but those before this one only up to the attention's
    /// output (their keys and values go to the cache; nothing reads the rest).
    From(usize),
    /// Every row, with the results an earlier calibration pass kept.
    Kept(&'k mut Keeping<'r>),
}

/// Values per task of the element-wise loops over a batch (norms, residual
/// adds): large enough that a task outlasts its hand-off.
const NORM_VALUES: usize = 16384;

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()) {
            add(row, b);
        }
    }
}

/// RMSNorm of each `weight.len()`-wide row of `x`, times `weight` (sums in
/// `f64`, as ggml accumulates them).
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
        for ((o, v), w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// RMSNorm of each `n`-wide row of `x`, without weights.
fn rms_norm_plain(x: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
        for (o, v) in or.iter_mut().zip(xr) {
            *o = v * scale;
        }
    }
}

/// The rotation tables of a batch: per token, `(cos, sin)` of every pair,
/// for the model's rotation and for its sliding-window layers' (empty when it
/// has none).
pub(super) struct Tables {
    pub(super) full: Vec<Vec<(f32, f32)>>,
    pub(super) swa: Vec<Vec<(f32, f32)>>,
}

impl Tables {
    /// The tables of `t_n` tokens from position `first`.
    pub(super) fn new(c: &Config, first: usize, t_n: usize) -> Tables {
        let of = |rope: &Rope| -> Vec<Vec<(f32, f32)>> {
            (0..t_n)
                .map(|t| {
                    let mut table = Vec::new();
                    rope.table(first + t, &mut table);
                    table
                })
                .collect()
        };
        Tables {
            full: of(&c.rope),
            swa: c.swa.as_ref().map_or_else(Vec::new, |s| of(&s.rope)),
        }
    }

    /// Tokens of the batch.
    pub(super) fn len(&self) -> usize {
        self.full.len()
    }
}

/// LayerNorm (mean removed, unit variance) of each row, times `weight`, plus `bias`.
fn layer_norm(x: &[f32], weight: &[f32], bias: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean = (xr.iter().map(|&v| v as f64).sum::<f64>() / n as f64) as f32;
        let var: f64 = xr
            .iter()
            .map(|&v| {
                let d = (v - mean) as f64;
                d * d
            })
            .sum();
        let scale = 1.0 / ((var / n as f64) as f32 + eps).sqrt();
        for (i, (o, v)) in or.iter_mut().zip(xr).enumerate() {
            *o = (v - mean) * scale * weight[i] + bias.map_or(0.0, |b| b[i]);
        }
    }
}
