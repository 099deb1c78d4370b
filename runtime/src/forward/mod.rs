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

pub(crate) mod math;
mod rope;
mod stream;

pub use rope::{Rope, Yarn};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::kernels::attn::{self, KEY_TILE};
use crate::kernels::{KernelError, Kernels, Matmul, Pool, QMatrix, for_each_chunk};
use memwall_format::GgmlType;
use memwall_format::blocks::{DEQUANTIZABLE, dequantize_row};
use memwall_format::gguf::{GgufModel, Metadata};
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

/// The architectures the forward pass runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `llama`: Llama, Mistral, Mixtral.
    Llama,
    /// `qwen2`.
    Qwen2,
    /// `qwen3`.
    Qwen3,
    /// `qwen3moe`.
    Qwen3Moe,
    /// `command-r` (Cohere Command-R).
    CommandR,
}

impl Arch {
    /// Every architecture, for messages.
    pub const ALL: [Arch; 5] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::CommandR,
    ];

    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::CommandR => "command-r",
        }
    }

    /// The architecture named `name`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    fn neox(self) -> bool {
        matches!(self, Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe)
    }

    fn layer_norm(self) -> bool {
        self == Arch::CommandR
    }
}

/// The hyper-parameters the forward pass uses.
#[derive(Clone, Debug)]
pub struct Config {
    /// Architecture.
    pub arch: Arch,
    /// Hidden size.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Head size.
    pub head_dim: usize,
    /// Rotary embedding.
    pub rope: Rope,
    /// Norm epsilon (RMSNorm or LayerNorm, by architecture).
    pub eps: f32,
    /// Vocabulary size (rows of the output matrix).
    pub n_vocab: usize,
    /// Context length the session allows.
    pub n_ctx: usize,
    /// Experts per MoE layer (0: dense).
    pub n_expert: usize,
    /// Experts used per token.
    pub n_expert_used: usize,
    /// Factor on the routing weights (`expert_weights_scale`; 0 and 1 leave them).
    pub expert_weights_scale: f32,
    /// Factor on the logits (`logit_scale`, Command-R; else 1).
    pub logit_scale: f32,
    /// What the KV cache stores (set before opening sessions).
    pub kv_type: KvType,
}

/// A decodable matrix: `rows` rows of `cols` weights.
#[derive(Clone, Copy)]
struct Matrix<'a> {
    /// The GGUF tensor it comes from.
    name: &'a str,
    /// Which expert of a stacked tensor this is.
    expert: Option<usize>,
    ty: GgmlType,
    data: &'a [u8],
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// Rows of the whole tensor (all experts).
    total_rows: usize,
}

/// A norm: weights, and a bias for LayerNorm when the model has one.
struct Norm {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
}

/// The feed-forward part of a block.
enum Ffn<'a> {
    Dense {
        gate: Matrix<'a>,
        up: Matrix<'a>,
        down: Matrix<'a>,
    },
    /// Experts stacked in 3-D tensors; expert `e` is a slice of each.
    Moe {
        router: Matrix<'a>,
        gate: Matrix<'a>,
        up: Matrix<'a>,
        down: Matrix<'a>,
    },
}

struct Layer<'a> {
    attn_norm: Norm,
    wq: Matrix<'a>,
    wk: Matrix<'a>,
    wv: Matrix<'a>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    /// Per-head norms of queries and keys: one `head_dim` vector shared by all
    /// heads, or one per head.
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    wo: Matrix<'a>,
    bo: Option<Vec<f32>>,
    /// `None` for parallel blocks (Command-R), whose FFN reads the attention norm.
    ffn_norm: Option<Norm>,
    ffn: Ffn<'a>,
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
}

/// Float buffers handed back after use and handed out again, best fit first.
///
/// Every layer of a batch needs the same dozen buffers of up to a few
/// megabytes. Allocated fresh, each came from the system as new zero pages
/// and went back on free: 300 000 page faults in a 512-token SmolLM2 prompt,
/// 15 % of its time. Kept here, they are faulted in once.
#[derive(Default)]
struct Spare(Mutex<Vec<Vec<f32>>>);

/// Buffers kept at most; the largest stay.
const SPARE_BUFFERS: usize = 8;

impl Spare {
    /// `n` zeros, in the kept buffer that fits best (the largest, grown, when
    /// none holds `n`).
    fn take(&self, n: usize) -> Vec<f32> {
        let mut v = self.take_dirty(n);
        v.fill(0.0);
        v
    }

    /// [`Spare::take`] without the zeros: `n` values left from earlier use,
    /// for a caller that writes every one.
    fn take_dirty(&self, n: usize) -> Vec<f32> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let fits = (0..kept.len())
            .filter(|&i| kept[i].capacity() >= n)
            .min_by_key(|&i| kept[i].capacity());
        let largest = (0..kept.len()).max_by_key(|&i| kept[i].capacity());
        let mut v = fits
            .or(largest)
            .map(|i| kept.swap_remove(i))
            .unwrap_or_default();
        drop(kept);
        v.resize(n, 0.0);
        v
    }

    /// Lets every kept buffer go (after a forward pass: what a prompt needed
    /// is not held through the decoding that follows).
    fn clear(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Keeps `v` for a later [`Spare::take`] (or drops the smallest buffer).
    fn give(&self, v: Vec<f32>) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.push(v);
        if kept.len() > SPARE_BUFFERS {
            if let Some(i) = (0..kept.len()).min_by_key(|&i| kept[i].capacity()) {
                kept.swap_remove(i);
            }
        }
    }
}

/// A matrix's weights as the products read them: its own, or a replacement.
struct Weights<'m> {
    ty: GgmlType,
    data: &'m [u8],
    row_bytes: usize,
}

/// Sees the input of every weight matrix product of the forward pass, in
/// the order the forward pass computes them (calibration collects its
/// statistics through this).
pub trait Observer: Send + Sync {
    /// `x` holds `tokens` rows of the input to `tensor` (for a tensor that
    /// stacks experts, expert `expert`'s share of the tokens), one row per
    /// token, as the product reads them (before any activation rounding).
    fn matmul_input(&self, tensor: &str, expert: Option<usize>, x: &[f32], tokens: usize);
}

/// How weights are kept when the model is larger than the RAM it may use:
/// `resident_bytes` of the most reused matrices (the output head, then the
/// matrices of the first layers, in order, each that still fits) are locked
/// in RAM; the rest is read from the file, a matrix at a time, into a ring of
/// buffers holding `prefetch` layers' worth of bytes (at least two
/// matrices), by a background thread that reads ahead of the products, past
/// the page cache where the system allows. Reading overlaps computing, and
/// the memory held is the pinned part, the ring and nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Streaming {
    /// Bytes of weights to lock in RAM.
    pub resident_bytes: u64,
    /// Read ahead this many layers' worth of bytes (the average streamed
    /// layer; the ring holds at least two matrices).
    pub prefetch: usize,
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
    /// Bytes of matrix weights read from storage per token at most (the rest).
    pub streamed_bytes: u64,
    /// Bytes of the read-ahead buffers (0 when nothing streams or the reading
    /// thread could not start: products then read the mapping).
    pub ring_bytes: u64,
    /// Whether streamed reads bypass the page cache (`O_DIRECT`).
    pub direct: bool,
}

/// Streaming state: the streamed matrices and their reader.
struct Stream<'a> {
    /// Tensor name → position in the reader's order and the tensor's bytes
    /// in the mapping.
    by_name: HashMap<&'a str, (usize, &'a [u8])>,
    reader: stream::Streamer,
}

impl<'a> Layer<'a> {
    /// Every matrix of the layer, in the order the forward pass reads them.
    fn matrices(&self) -> Vec<&Matrix<'a>> {
        let mut v = vec![&self.wq, &self.wk, &self.wv, &self.wo];
        match &self.ffn {
            Ffn::Dense { gate, up, down } => v.extend([gate, up, down]),
            Ffn::Moe {
                router,
                gate,
                up,
                down,
            } => v.extend([router, gate, up, down]),
        }
        v
    }
}

/// What the KV cache stores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// `f16`, llama.cpp's default; queries are rounded to `f16` for `Q·K` too.
    #[default]
    F16,
    /// `f32`: exact, for comparisons with a float32 reference.
    F32,
}

/// One layer's keys or values: position-major, then head, then dimension.
#[derive(Clone)]
enum Cache {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

impl Cache {
    fn len(&self) -> usize {
        match self {
            Cache::F16(c) => c.len(),
            Cache::F32(c) => c.len(),
        }
    }

    fn truncate(&mut self, n: usize) {
        match self {
            Cache::F16(c) => c.truncate(n),
            Cache::F32(c) => c.truncate(n),
        }
    }

    fn extend(&mut self, kernels: &Kernels, values: &[f32]) {
        match self {
            Cache::F16(c) => {
                let at = c.len();
                c.resize(at + values.len(), 0);
                kernels.narrow_f16(values, &mut c[at..]);
            }
            Cache::F32(c) => c.extend_from_slice(values),
        }
    }

    /// Values `start..start + out.len()`, as `f32`.
    fn read(&self, kernels: &Kernels, start: usize, out: &mut [f32]) {
        match self {
            Cache::F16(c) => kernels.widen_f16(&c[start..start + out.len()], out),
            Cache::F32(c) => out.copy_from_slice(&c[start..start + out.len()]),
        }
    }
}

/// The keys and values attention reads: the cache itself, or (for a batch)
/// its first positions decoded to `f32`, laid out head by head.
enum Kv<'c> {
    Cache(&'c Cache, &'c Cache),
    /// Keys transposed, `[head][dim][pos]` with `stride` positions per dim
    /// (padded with zeros to a multiple of [`KEY_TILE`]); values `[head][pos][dim]`.
    Dense {
        kt: &'c [f32],
        stride: usize,
        v: &'c [f32],
    },
}

/// The first `n` positions of `cache` as `f32`, head by head: `[head][pos][dim]`,
/// written over every value of `out` (`n` times the KV width).
fn by_head(k: &Kernels, cache: &Cache, n: usize, c: &Config, mut out: Vec<f32>) -> Vec<f32> {
    let (heads, hd) = (c.n_head_kv, c.head_dim);
    let kvd = heads * hd;
    assert_eq!(out.len(), n * kvd, "by_head buffer");
    for (h, dst) in out.chunks_exact_mut(n * hd).enumerate() {
        for (j, d) in dst.chunks_exact_mut(hd).enumerate() {
            cache.read(k, j * kvd + h * hd, d);
        }
    }
    out
}

/// The first `n` positions of `cache` as `f32`, transposed head by head:
/// `[head][dim][pos]`, each dim padded with zeros to the returned stride (a
/// multiple of [`KEY_TILE`]), in `out`: zeros, the KV width times `n`
/// rounded up to [`KEY_TILE`].
fn by_head_transposed(
    k: &Kernels,
    cache: &Cache,
    n: usize,
    c: &Config,
    mut out: Vec<f32>,
) -> (Vec<f32>, usize) {
    let (heads, hd) = (c.n_head_kv, c.head_dim);
    let kvd = heads * hd;
    let stride = n.next_multiple_of(KEY_TILE);
    assert_eq!(out.len(), heads * hd * stride, "by_head_transposed buffer");
    let mut row = vec![0f32; hd];
    for (h, dst) in out.chunks_exact_mut(hd * stride).enumerate() {
        for j in 0..n {
            cache.read(k, j * kvd + h * hd, &mut row);
            for (d, &x) in row.iter().enumerate() {
                dst[d * stride + j] = x;
            }
        }
    }
    (out, stride)
}

/// `s ← exp_fast(s − max s)` for every score; returns their sequential sum.
fn softmax_numerators(kernels: &Kernels, scores: &mut [f32]) -> f32 {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for s in scores.iter_mut() {
        *s -= max;
    }
    kernels.exp_fast_in_place(scores);
    let mut sum = 0f32;
    for s in scores.iter() {
        sum += *s;
    }
    sum
}

/// The KV cache and position of one sequence.
pub struct Session {
    k: Vec<Cache>,
    v: Vec<Cache>,
    n_past: usize,
}

impl Session {
    /// Tokens already in the cache.
    pub fn len(&self) -> usize {
        self.n_past
    }

    /// Whether nothing has been evaluated yet.
    pub fn is_empty(&self) -> bool {
        self.n_past == 0
    }

    /// Forgets everything after the first `n` tokens (keeps the cache's memory).
    pub fn truncate(&mut self, n: usize) {
        if n < self.n_past {
            let per = |c: &Cache| c.len() / self.n_past;
            for c in self.k.iter_mut().chain(self.v.iter_mut()) {
                let keep = per(c) * n;
                c.truncate(keep);
            }
            self.n_past = n;
        }
    }
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

fn f32_of(meta: &Metadata, key: &str) -> Result<Option<f32>, ForwardError> {
    Ok(meta.get_f64(key).map_err(meta_err)?.map(|v| v as f32))
}

/// Finds tensors and checks their shapes and types.
struct Loader<'g> {
    gguf: &'g GgufModel,
}

impl<'g> Loader<'g> {
    fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    /// The tensor `name` as `rows × cols` (trailing dimensions fold into rows).
    fn matrix(&self, name: &str) -> Result<Matrix<'g>, ForwardError> {
        let (info, data) = self
            .gguf
            .tensor(name)
            .ok_or_else(|| tensor_err(name, "missing"))?;
        if !DEQUANTIZABLE.contains(&info.ty) {
            return Err(tensor_err(
                name,
                format!("type {} is not decoded yet", info.ty.name()),
            ));
        }
        let cols = info.dims[0] as usize;
        let rows = (info.elements / info.dims[0].max(1)) as usize;
        let row_bytes = info
            .ty
            .tensor_size(&[info.dims[0]])
            .map_err(|e| tensor_err(name, e.to_string()))?
            .bytes as usize;
        Ok(Matrix {
            name: &info.name,
            expert: None,
            ty: info.ty,
            data,
            rows,
            cols,
            row_bytes,
            total_rows: rows,
        })
    }

    fn shaped(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix<'g>, ForwardError> {
        let m = self.matrix(name)?;
        if m.rows != rows || m.cols != cols {
            return Err(tensor_err(
                name,
                format!("shape {}×{}, expected {rows}×{cols}", m.rows, m.cols),
            ));
        }
        Ok(m)
    }

    /// `n_expert` stacked `rows × cols` matrices, as one `n_expert·rows × cols` matrix.
    fn experts(
        &self,
        name: &str,
        n_expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix<'g>, ForwardError> {
        let m = self.shaped(name, n_expert * rows, cols)?;
        let dims = self.gguf.tensor(name).map(|(info, _)| info.dims.clone());
        if dims.is_none_or(|d| d.len() != 3 || d[2] as usize != n_expert) {
            return Err(tensor_err(
                name,
                format!("expected {n_expert} experts in the third dimension"),
            ));
        }
        Ok(m)
    }

    /// A vector of `len` values, decoded to `f32`.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ForwardError> {
        let m = self.matrix(name)?;
        if m.rows * m.cols != len {
            return Err(tensor_err(
                name,
                format!("{} values, expected {len}", m.rows * m.cols),
            ));
        }
        let mut out = vec![0f32; len];
        for (r, chunk) in out.chunks_exact_mut(m.cols).enumerate() {
            dequantize_row(m.ty, m.row(r), chunk).map_err(|e| tensor_err(name, e.to_string()))?;
        }
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(tensor_err(name, format!("value {i} is {}", out[i])));
        }
        Ok(out)
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, ForwardError> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    fn norm(&self, prefix: &str, len: usize) -> Result<Norm, ForwardError> {
        Ok(Norm {
            weight: self.vector(&format!("{prefix}.weight"), len)?,
            bias: self.optional_vector(&format!("{prefix}.bias"), len)?,
        })
    }

    /// A per-head norm weight: `head_dim` values shared by all heads, or one set per head.
    fn head_norm(
        &self,
        name: &str,
        head_dim: usize,
        heads: usize,
    ) -> Result<Option<Vec<f32>>, ForwardError> {
        if !self.has(name) {
            return Ok(None);
        }
        let m = self.matrix(name)?;
        let len = m.rows * m.cols;
        if len != head_dim && len != head_dim * heads {
            return Err(tensor_err(
                name,
                format!("{len} values, expected {head_dim} or {}", head_dim * heads),
            ));
        }
        self.vector(name, len).map(Some)
    }
}

impl Matrix<'_> {
    fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Expert `x` of a tensor that stacks experts of `n` rows each.
    fn expert(&self, x: usize, n: usize) -> Self {
        Matrix {
            data: &self.data[x * n * self.row_bytes..(x + 1) * n * self.row_bytes],
            rows: n,
            expert: Some(x),
            ..*self
        }
    }
}

impl<'a> Model<'a> {
    /// Reads the hyper-parameters and resolves every tensor the forward pass
    /// needs (shape and type), so that running cannot fail on the model itself.
    pub fn new(gguf: &'a GgufModel, n_ctx: usize) -> Result<Self, ForwardError> {
        let meta = gguf.metadata();
        let hp = HyperParams::try_from(meta).map_err(meta_err)?;
        let arch = Arch::from_name(&hp.architecture).ok_or_else(|| {
            ForwardError::Metadata(format!(
                "architecture {} is not run; memwall runs {}",
                hp.architecture,
                Arch::ALL.map(Arch::name).join(", ")
            ))
        })?;
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let load = Loader { gguf };
        let head_dim = hp.head_dim() as usize;
        let n_embd = hp.embedding_length as usize;
        let embd = load.matrix("token_embd.weight")?;
        let n_rot = hp.rope_dimension_count.map_or(head_dim, |d| d as usize);
        let factor = hp.rope_scaling_factor.unwrap_or(1.0) as f32;
        let scaling = hp.rope_scaling_type.as_deref().unwrap_or("none");
        let freq_scale = match scaling {
            "none" => 1.0,
            "linear" | "yarn" if factor > 0.0 => 1.0 / factor,
            "linear" | "yarn" => 1.0,
            other => {
                return Err(ForwardError::Metadata(format!(
                    "{a}.rope.scaling.type {other} is not run (none, linear and yarn are)"
                )));
            }
        };
        let attn_factor = f32_of(meta, &key("rope.scaling.attn_factor"))?.unwrap_or(1.0);
        let (yarn, mscale) = if scaling == "yarn" {
            let orig = meta
                .get_u64(&key("rope.scaling.original_context_length"))
                .map_err(meta_err)?
                .unwrap_or(hp.context_length);
            let log_mul = f32_of(meta, &key("rope.scaling.yarn_log_multiplier"))?.unwrap_or(0.0);
            let f = 1.0 / freq_scale;
            // transformers' `attention_factor`, when the config states it, replaces the
            // computed magnitude. llama.cpp 0c1e570 reads this key and the betas only
            // for a few architectures (grok, mistral3) and runs the rest with defaults.
            let stated = f32_of(meta, &key("rope.scaling.yarn_attn_factor"))?;
            let m = if let Some(m) = stated {
                m
            } else if log_mul != 0.0 {
                rope::yarn_mscale(f, 1.0) / rope::yarn_mscale(f, log_mul)
            } else {
                rope::yarn_mscale(f, 1.0)
            };
            let yarn = Yarn {
                orig_ctx: orig.min(u32::MAX as u64) as u32,
                beta_fast: f32_of(meta, &key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
                beta_slow: f32_of(meta, &key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
            };
            (Some(yarn), m * attn_factor)
        } else {
            (None, attn_factor)
        };
        let freq_factors = if load.has("rope_freqs.weight") {
            Some(load.vector("rope_freqs.weight", n_rot / 2)?)
        } else {
            None
        };
        let eps = if arch.layer_norm() {
            hp.layer_norm_eps
        } else {
            hp.rms_norm_eps
        };
        let config = Config {
            arch,
            n_embd,
            n_layer: hp.block_count as usize,
            n_head: hp.head_count as usize,
            n_head_kv: hp.head_count_kv as usize,
            head_dim,
            rope: Rope {
                n_rot,
                base: hp.rope_freq_base.unwrap_or(10000.0) as f32,
                freq_scale,
                neox: arch.neox(),
                yarn,
                mscale,
                freq_factors,
            },
            eps: eps.unwrap_or(1e-5) as f32,
            n_vocab: embd.rows,
            n_ctx,
            n_expert: hp.expert_count.unwrap_or(0) as usize,
            n_expert_used: hp.expert_used_count.unwrap_or(0) as usize,
            expert_weights_scale: f32_of(meta, &key("expert_weights_scale"))?.unwrap_or(0.0),
            logit_scale: f32_of(meta, &key("logit_scale"))?.unwrap_or(1.0),
            kv_type: KvType::F16,
        };
        let c = &config;
        if c.n_head == 0
            || c.n_head_kv == 0
            || c.n_head % c.n_head_kv != 0
            || n_rot > head_dim
            || n_rot % 2 != 0
            || head_dim == 0
        {
            return Err(ForwardError::Metadata(format!(
                "{} heads, {} KV heads, head size {head_dim}, {n_rot} rotated dims do not fit together",
                c.n_head, c.n_head_kv
            )));
        }
        if c.n_expert > 0 && (c.n_expert_used == 0 || c.n_expert_used > c.n_expert) {
            return Err(ForwardError::Metadata(format!(
                "{a}.expert_used_count is {}, expected 1..={}",
                c.n_expert_used, c.n_expert
            )));
        }
        if n_embd == 0 || embd.cols != n_embd {
            return Err(tensor_err(
                "token_embd.weight",
                format!("{} columns, expected {n_embd}", embd.cols),
            ));
        }
        let output = if load.has("output.weight") {
            load.shaped("output.weight", c.n_vocab, n_embd)?
        } else {
            embd
        };
        let output_norm = load.norm("output_norm", n_embd)?;
        let layers = (0..c.n_layer)
            .map(|l| Self::layer(&load, c, l))
            .collect::<Result<Vec<_>, _>>()?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let kernels = Kernels::from_env()?;
        let matmul = Matmul::new(kernels, threads);
        let pool = matmul.pool();
        Ok(Model {
            config,
            embd,
            layers,
            output_norm,
            output,
            matmul: Mutex::new(matmul),
            kernels,
            exact: false,
            pool,
            gguf,
            stream: None,
            observer: None,
            replaced: HashMap::new(),
            stop_at: None,
            spare: Spare::default(),
        })
    }

    /// Streams the weights (see [`Streaming`]). Needs a memory-mapped model;
    /// fails when the OS refuses to lock the resident part.
    pub fn enable_streaming(&mut self, s: Streaming) -> Result<StreamingReport, ForwardError> {
        if !self.gguf.is_mapped() {
            return Err(ForwardError::Metadata(
                "streaming needs the model memory-mapped (drop --no-mmap)".into(),
            ));
        }
        // The ring of read-ahead buffers comes out of the budget when not
        // everything fits: `prefetch` layers' worth of bytes plus one matrix,
        // in buffers the size of the largest matrix of a layer.
        let sizes: Vec<u64> = (self.layers.iter())
            .flat_map(Layer::matrices)
            .map(|m| m.data.len() as u64)
            .collect();
        let all = sizes.iter().sum::<u64>() + self.output.data.len() as u64;
        let largest = sizes.iter().copied().max().unwrap_or(0).max(1);
        let per_layer = all / self.layers.len().max(1) as u64;
        let slots = (per_layer * s.prefetch as u64 / largest + 1).max(2);
        let mut budget = if s.resident_bytes >= all {
            s.resident_bytes
        } else {
            s.resident_bytes.saturating_sub(slots * largest)
        };
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
            let mut whole = true;
            for m in layer.matrices() {
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
                let (file, offset) = self
                    .gguf
                    .locate(m.data)
                    .ok_or_else(|| tensor_err(m.name, "its data lies outside the model's files"))?;
                by_name.insert(m.name, (extents.len(), m.data));
                extents.push(stream::Extent {
                    file,
                    offset,
                    len: m.data.len(),
                });
            }
        }
        let largest = extents.iter().map(|e| e.len as u64).max().unwrap_or(0);
        // Sized by what streams: an output head that did not fit makes fewer,
        // larger buffers (at least two matrices are always held).
        if let Some(fit) = (per_layer * s.prefetch as u64).checked_div(largest) {
            let slots = (fit + 1).clamp(2, slots) as usize;
            let paths: Vec<_> = self
                .gguf
                .files()
                .iter()
                .map(|f| f.path().to_owned())
                .collect();
            if let Some(reader) = stream::Streamer::start(&paths, extents, slots) {
                report.ring_bytes = slots as u64 * largest;
                report.direct = reader.direct();
                self.stream = Some(Stream { by_name, reader });
            }
        }
        Ok(report)
    }

    fn layer(load: &Loader<'a>, c: &Config, l: usize) -> Result<Layer<'a>, ForwardError> {
        let n = |s: &str| format!("blk.{l}.{s}");
        let (q, kv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let e = c.n_embd;
        let ffn_norm = if c.arch == Arch::CommandR {
            None
        } else {
            Some(load.norm(&n("ffn_norm"), e)?)
        };
        let ffn = if c.n_expert > 0 {
            let router = load.shaped(&n("ffn_gate_inp.weight"), c.n_expert, e)?;
            let gate = load.matrix(&n("ffn_gate_exps.weight"))?;
            let ff = gate.rows / c.n_expert;
            Ffn::Moe {
                router,
                gate: load.experts(&n("ffn_gate_exps.weight"), c.n_expert, ff, e)?,
                up: load.experts(&n("ffn_up_exps.weight"), c.n_expert, ff, e)?,
                down: load.experts(&n("ffn_down_exps.weight"), c.n_expert, e, ff)?,
            }
        } else {
            let gate = load.matrix(&n("ffn_gate.weight"))?;
            Ffn::Dense {
                gate: load.shaped(&n("ffn_gate.weight"), gate.rows, e)?,
                up: load.shaped(&n("ffn_up.weight"), gate.rows, e)?,
                down: load.shaped(&n("ffn_down.weight"), e, gate.rows)?,
            }
        };
        Ok(Layer {
            attn_norm: load.norm(&n("attn_norm"), e)?,
            wq: load.shaped(&n("attn_q.weight"), q, e)?,
            wk: load.shaped(&n("attn_k.weight"), kv, e)?,
            wv: load.shaped(&n("attn_v.weight"), kv, e)?,
            bq: load.optional_vector(&n("attn_q.bias"), q)?,
            bk: load.optional_vector(&n("attn_k.bias"), kv)?,
            bv: load.optional_vector(&n("attn_v.bias"), kv)?,
            q_norm: load.head_norm(&n("attn_q_norm.weight"), c.head_dim, c.n_head)?,
            k_norm: load.head_norm(&n("attn_k_norm.weight"), c.head_dim, c.n_head_kv)?,
            wo: load.shaped(&n("attn_output.weight"), e, q)?,
            bo: load.optional_vector(&n("attn_output.bias"), e)?,
            ffn_norm,
            ffn,
        })
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
            not_replaced.then_some((s, pos, whole))
        });
        let Some((s, pos, whole)) = streamed else {
            return self.product(m, None, x, t_n, shared);
        };
        let loaded = s.reader.acquire(pos);
        // `m` is the whole tensor or one expert's rows of it.
        let own = (m.data.as_ptr() as usize)
            .checked_sub(whole.as_ptr() as usize)
            .and_then(|off| loaded.bytes()?.get(off..off + m.data.len()));
        // A failed read leaves the mapping to read.
        let y = self.product(m, own, x, t_n, shared);
        s.reader.release(pos, loaded);
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

    /// `down · (silu(gate · h) ⊙ (up · h))`.
    fn swiglu(
        &self,
        gate: &Matrix,
        up: &Matrix,
        down: &Matrix,
        h: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut shared = None;
        let mut g = self.matmul_sharing(gate, h, t_n, &mut shared)?;
        let u = self.matmul_sharing(up, h, t_n, &mut shared)?;
        // Element by element, so any split over threads gives the same bits.
        const CHUNK: usize = 4096;
        for_each_chunk(self.pool.as_deref(), &mut g, CHUNK, |c, gs| {
            let mut e: Vec<f32> = gs.iter().map(|g| -g).collect();
            self.kernels.exp_fast_in_place(&mut e);
            for ((g, u), e) in gs.iter_mut().zip(&u[c * CHUNK..]).zip(&e) {
                *g = *g / (1.0 + e) * u;
            }
        });
        let y = self.matmul(down, &g, t_n);
        self.spare.give(g);
        self.spare.give(u);
        y
    }

    /// An empty session with room for `config.n_ctx` tokens.
    ///
    /// The cache is reserved for the whole context at once: address space
    /// only (the system backs pages when tokens are written), and it never
    /// moves, so memory grows with the tokens held and nothing else (growing
    /// by doubling left freed copies in the heap: peak RSS jumped by a whole
    /// cache's size at powers of two).
    pub fn session(&self) -> Session {
        let c = &self.config;
        let n = c.n_ctx.saturating_mul(c.n_head_kv * c.head_dim);
        // A reservation the system refuses only costs the guarantee above.
        fn reserved<T>(n: usize) -> Vec<T> {
            let mut v = Vec::new();
            let _ = v.try_reserve_exact(n);
            v
        }
        let empty = || match c.kv_type {
            KvType::F16 => Cache::F16(reserved(n)),
            KvType::F32 => Cache::F32(reserved(n)),
        };
        Session {
            k: (0..c.n_layer).map(|_| empty()).collect(),
            v: (0..c.n_layer).map(|_| empty()).collect(),
            n_past: 0,
        }
    }

    /// Evaluates `tokens` after what `session` holds and returns their logits,
    /// `tokens.len() × n_vocab`, row by row.
    pub fn forward(&self, session: &mut Session, tokens: &[u32]) -> Result<Vec<f32>, ForwardError> {
        self.forward_from(session, tokens, 0)
    }

    /// Like [`Model::forward`], but returns the logits of `tokens[first..]` only
    /// (the output head is the largest matrix of small models).
    pub fn forward_from(
        &self,
        session: &mut Session,
        tokens: &[u32],
        first: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let t_n = tokens.len();
        if session.n_past + t_n > c.n_ctx {
            return Err(ForwardError::ContextFull(c.n_ctx));
        }
        let e = c.n_embd;
        let mut x = self.embed(tokens)?;
        let tables: Vec<Vec<(f32, f32)>> = (0..t_n)
            .map(|t| {
                let mut table = Vec::new();
                c.rope.table(session.n_past + t, &mut table);
                table
            })
            .collect();
        let mut h = vec![0f32; t_n * e];
        for l in 0..self.layers.len() {
            self.layer_step(l, &mut x, &mut h, &tables, session)?;
        }
        session.n_past += t_n;
        // The layers shared the spare buffers; the next call (one decoded
        // token, typically) needs far smaller ones.
        self.spare.clear();
        let first = first.min(t_n);
        let rows = t_n - first;
        let mut out = vec![0f32; rows * e];
        self.norm(&x[first * e..], &self.output_norm, &mut out);
        let mut logits = self.matmul(&self.output, &out, rows)?;
        if c.logit_scale != 1.0 {
            logits.iter_mut().for_each(|v| *v *= c.logit_scale);
        }
        Ok(logits)
    }

    /// Layer `l` over the hidden states `x` of the tokens whose RoPE tables
    /// are `tables`, with `h` as scratch of the same size.
    fn layer_step(
        &self,
        l: usize,
        x: &mut [f32],
        h: &mut [f32],
        tables: &[Vec<(f32, f32)>],
        session: &mut Session,
    ) -> Result<(), ForwardError> {
        let layer = &self.layers[l];
        let t_n = tables.len();
        self.norm(x, &layer.attn_norm, h);
        let attn = self.attention_block(layer, h, tables, session, l)?;
        let ffn = if let Some(ffn_norm) = &layer.ffn_norm {
            self.add(x, &attn);
            self.norm(x, ffn_norm, h);
            let ffn = self.ffn(&layer.ffn, h, t_n)?;
            self.add(x, &ffn);
            ffn
        } else {
            // Parallel block: attention and FFN both read the attention norm.
            let ffn = self.ffn(&layer.ffn, h, t_n)?;
            self.add(x, &attn);
            self.add(x, &ffn);
            ffn
        };
        self.spare.give(attn);
        self.spare.give(ffn);
        Ok(())
    }

    /// The embeddings of `tokens`, one row of `n_embd` per token: the input
    /// of layer 0 for [`Model::forward_layer`].
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, ForwardError> {
        let e = self.config.n_embd;
        let mut x = vec![0f32; tokens.len() * e];
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= self.config.n_vocab {
                return Err(ForwardError::Token(id));
            }
            decode(&self.embd, id as usize, &mut x[t * e..(t + 1) * e])?;
        }
        Ok(x)
    }

    /// Runs layer `l` alone over one sequence whose hidden states (one row of
    /// `n_embd` per token, positions from 0) are `x`, replacing them with the
    /// layer's output. Calibration runs a model this way, one layer at a time
    /// over all its samples.
    pub fn forward_layer(&self, l: usize, x: &mut [f32]) -> Result<(), ForwardError> {
        let c = &self.config;
        let t_n = x.len() / c.n_embd;
        if l >= c.n_layer || x.len() != t_n * c.n_embd {
            return Err(ForwardError::Metadata(format!(
                "layer {l} of {} over {} values (not a multiple of {})",
                c.n_layer,
                x.len(),
                c.n_embd
            )));
        }
        if t_n > c.n_ctx {
            return Err(ForwardError::ContextFull(c.n_ctx));
        }
        let tables: Vec<Vec<(f32, f32)>> = (0..t_n)
            .map(|t| {
                let mut table = Vec::new();
                c.rope.table(t, &mut table);
                table
            })
            .collect();
        let mut session = self.session();
        let mut h = vec![0f32; x.len()];
        self.layer_step(l, x, &mut h, &tables, &mut session)
    }

    /// Like [`Model::forward_layer`] without changing `x`, but stops as soon
    /// as the input of matrix `tensor` has been shown to the observer (the
    /// rest of the layer is not computed). Stacked expert tensors never stop
    /// the pass: every expert's input is shown.
    pub fn forward_layer_until(
        &mut self,
        l: usize,
        x: &[f32],
        tensor: &str,
    ) -> Result<(), ForwardError> {
        let mut tmp = x.to_vec();
        self.stop_at = Some(tensor.to_owned());
        let result = self.forward_layer(l, &mut tmp);
        self.stop_at = None;
        match result {
            Ok(()) | Err(ForwardError::Stopped(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the weights of matrix `name` (a tensor the forward pass
    /// reads) with `data` of type `ty`, which must hold the same shape.
    pub fn replace_matrix(
        &mut self,
        name: &str,
        ty: GgmlType,
        data: Arc<[u8]>,
    ) -> Result<(), ForwardError> {
        let (cols, rows) = self
            .all_matrices()
            .find(|m| m.name == name)
            .map(|m| (m.cols, m.total_rows))
            .ok_or_else(|| tensor_err(name, "is not a matrix of this model"))?;
        if !DEQUANTIZABLE.contains(&ty) {
            return Err(tensor_err(
                name,
                format!("type {} is not decoded", ty.name()),
            ));
        }
        let row_bytes = ty
            .tensor_size(&[cols as u64])
            .map_err(|e| tensor_err(name, e.to_string()))?
            .bytes as usize;
        if data.len() != rows * row_bytes {
            return Err(tensor_err(
                name,
                format!(
                    "replacement of {} bytes; {rows} rows of {cols} {} weights take {}",
                    data.len(),
                    ty.name(),
                    rows * row_bytes
                ),
            ));
        }
        self.replaced.insert(name.to_owned(), (ty, data));
        Ok(())
    }

    /// Replaces a norm's weight or bias vector (`blk.N.attn_norm.weight`,
    /// `blk.N.ffn_norm.bias`, `output_norm.weight`, …).
    pub fn replace_norm(&mut self, name: &str, values: Vec<f32>) -> Result<(), ForwardError> {
        let (prefix, field) = name
            .rsplit_once('.')
            .ok_or_else(|| tensor_err(name, "is not a norm"))?;
        let norm = if prefix == "output_norm" {
            Some(&mut self.output_norm)
        } else {
            prefix
                .strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(l, kind)| {
                    let layer = self.layers.get_mut(l.parse::<usize>().ok()?)?;
                    match kind {
                        "attn_norm" => Some(&mut layer.attn_norm),
                        "ffn_norm" => layer.ffn_norm.as_mut(),
                        _ => None,
                    }
                })
        }
        .ok_or_else(|| tensor_err(name, "is not a norm of this model"))?;
        let slot = match field {
            "weight" => &mut norm.weight,
            "bias" => norm
                .bias
                .as_mut()
                .ok_or_else(|| tensor_err(name, "this norm has no bias"))?,
            _ => return Err(tensor_err(name, "is not a norm weight or bias")),
        };
        if values.len() != slot.len() || values.iter().any(|v| !v.is_finite()) {
            return Err(tensor_err(
                name,
                format!("replacement must be {} finite values", slot.len()),
            ));
        }
        *slot = values;
        Ok(())
    }

    /// Every weight matrix of the model.
    fn all_matrices(&self) -> impl Iterator<Item = &Matrix<'a>> {
        self.layers
            .iter()
            .flat_map(|layer| {
                let mut v = vec![&layer.wq, &layer.wk, &layer.wv, &layer.wo];
                match &layer.ffn {
                    Ffn::Dense { gate, up, down } => v.extend([gate, up, down]),
                    Ffn::Moe {
                        router,
                        gate,
                        up,
                        down,
                    } => v.extend([router, gate, up, down]),
                }
                v
            })
            .chain([&self.output])
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

    /// Per-head norm of `t_n` rows of `heads` heads.
    fn head_norm(&self, x: &mut [f32], weight: &[f32], heads: usize) {
        let c = &self.config;
        let hd = c.head_dim;
        let mut tmp = vec![0f32; hd];
        for (i, head) in x.chunks_exact_mut(hd).enumerate() {
            let h = i % heads;
            let w = if weight.len() == hd {
                weight
            } else {
                &weight[h * hd..(h + 1) * hd]
            };
            if c.arch.layer_norm() {
                layer_norm(head, w, None, c.eps, &mut tmp);
            } else {
                rms_norm(head, w, c.eps, &mut tmp);
            }
            head.copy_from_slice(&tmp);
        }
    }

    /// Q/K/V projections, RoPE, the cache update, attention and the output projection.
    fn attention_block(
        &self,
        layer: &Layer,
        h: &[f32],
        tables: &[Vec<(f32, f32)>],
        session: &mut Session,
        l: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let t_n = tables.len();
        let (qd, kvd, hd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.head_dim);
        let mut shared = None;
        let mut q = self.matmul_sharing(&layer.wq, h, t_n, &mut shared)?;
        let mut k = self.matmul_sharing(&layer.wk, h, t_n, &mut shared)?;
        let mut v = self.matmul_sharing(&layer.wv, h, t_n, &mut shared)?;
        add_bias(&mut q, layer.bq.as_deref());
        add_bias(&mut k, layer.bk.as_deref());
        add_bias(&mut v, layer.bv.as_deref());
        if let Some(w) = &layer.q_norm {
            self.head_norm(&mut q, w, c.n_head);
        }
        if let Some(w) = &layer.k_norm {
            self.head_norm(&mut k, w, c.n_head_kv);
        }
        for (t, table) in tables.iter().enumerate() {
            for head in q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                c.rope.apply(head, table);
            }
            for head in k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                c.rope.apply(head, table);
            }
        }
        session.k[l].extend(&self.kernels, &k);
        session.v[l].extend(&self.kernels, &v);
        let attn = self.attention(&q, &session.k[l], &session.v[l], session.n_past, t_n);
        for b in [q, k, v] {
            self.spare.give(b);
        }
        let mut o = self.matmul(&layer.wo, &attn, t_n)?;
        self.spare.give(attn);
        add_bias(&mut o, layer.bo.as_deref());
        Ok(o)
    }

    /// Causal grouped-query attention of the `t_n` new queries over the cache.
    fn attention(&self, q: &[f32], k: &Cache, v: &Cache, n_past: usize, t_n: usize) -> Vec<f32> {
        let c = &self.config;
        let (qd, kvd, hd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.head_dim);
        // An f16 cache: the queries rounded to f16 as well, as ggml converts
        // them for its f16 products (once here, not per work item).
        let rounded = (c.kv_type == KvType::F16).then(|| {
            const VALUES: usize = 4096;
            let mut r = self.spare.take_dirty(q.len());
            for_each_chunk(self.pool.as_deref(), &mut r, VALUES, |i, r| {
                let mut halves = [0u16; VALUES];
                let halves = &mut halves[..r.len()];
                self.kernels.narrow_f16(&q[i * VALUES..][..r.len()], halves);
                self.kernels.widen_f16(halves, r);
            });
            r
        });
        let q = rounded.as_deref().unwrap_or(q);
        // Every value is written by one work item below.
        let mut out = self.spare.take_dirty(t_n * qd);
        // For a batch, decode the cache to f32 once, by KV head, instead of
        // once per query (same values, so the same result).
        let n_kv = n_past + t_n;
        let dense = (t_n > 1).then(|| {
            (
                by_head_transposed(
                    &self.kernels,
                    k,
                    n_kv,
                    c,
                    self.spare.take(kvd * n_kv.next_multiple_of(KEY_TILE)),
                ),
                by_head(&self.kernels, v, n_kv, c, self.spare.take_dirty(kvd * n_kv)),
            )
        });
        let view = match &dense {
            Some(((kt, stride), v)) => Kv::Dense {
                kt,
                stride: *stride,
                v,
            },
            None => Kv::Cache(k, v),
        };
        // One work item per (token, head), or for a batch per (token, KV
        // head) with the query heads that share it: each writes its own slice
        // of `out` with the same arithmetic on any thread, so the result does
        // not depend on threads. Each sums into its own small buffer first
        // (when `out` was fresh zero pages, reading before writing faulted
        // them in twice, the second time with a TLB flush on every core).
        let group = c.n_head / c.n_head_kv;
        let heads = if dense.is_some() { group } else { 1 };
        let per = c.n_head / heads;
        let work = |i: usize, oh: &mut [f32]| {
            let (t, first) = (i / per, i % per * heads);
            let mut acc = vec![0f32; heads * hd];
            self.attend(
                &q[t * qd + first * hd..][..heads * hd],
                first,
                &view,
                n_past + t + 1,
                &mut acc,
            );
            oh.copy_from_slice(&acc);
        };
        for_each_chunk(self.pool.as_deref(), &mut out, heads * hd, work);
        if let Some(((kt, _), v)) = dense {
            self.spare.give(kt);
            self.spare.give(v);
        }
        if let Some(r) = rounded {
            self.spare.give(r);
        }
        out
    }

    /// The query heads `first..` (`q.len() / head_dim` of them, all reading
    /// one KV head) over the first `n_kv` cached positions, into `out` (`q`
    /// already rounded to f16 for an f16 cache).
    ///
    /// Each score is the sequential sum `((q0·k0 + q1·k1) + q2·k2) + …` (from
    /// `-0.0`, as `Iterator::sum`), and the output the sequential sum over
    /// positions of `(s_j / Σs) · v_j`, whichever layout the cache is read from
    /// and however many heads are taken together, so a batch and
    /// token-by-token decoding give the same bits.
    fn attend(&self, q: &[f32], first: usize, kv: &Kv, n_kv: usize, out: &mut [f32]) {
        let c = &self.config;
        let (kvd, hd) = (c.n_head_kv * c.head_dim, c.head_dim);
        let kv_head = first / (c.n_head / c.n_head_kv);
        let scale = 1.0 / (hd as f32).sqrt();
        let kernels = &self.kernels;
        match kv {
            Kv::Cache(k, v) => {
                let mut buf = vec![0f32; hd];
                let mut scores = Vec::with_capacity(n_kv);
                for (qh, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
                    scores.clear();
                    for j in 0..n_kv {
                        k.read(kernels, j * kvd + kv_head * hd, &mut buf);
                        let dot: f32 = qh.iter().zip(&buf).map(|(a, b)| a * b).sum();
                        scores.push(dot * scale);
                    }
                    let sum = softmax_numerators(kernels, &mut scores);
                    for (j, s) in scores.iter().enumerate() {
                        v.read(kernels, j * kvd + kv_head * hd, &mut buf);
                        kernels.axpy(out, s / sum, &buf);
                    }
                }
            }
            Kv::Dense { kt, stride, v } => {
                let kt = &kt[kv_head * hd * stride..][..hd * stride];
                let v = &v[kv_head * v.len() / c.n_head_kv..];
                let mut tiles = [[0f32; KEY_TILE]; attn::HEADS];
                let mut scores = Vec::new();
                for (qh, out) in q
                    .chunks(attn::HEADS * hd)
                    .zip(out.chunks_mut(attn::HEADS * hd))
                {
                    let heads = qh.len() / hd;
                    scores.clear();
                    scores.resize(heads * n_kv, 0.0);
                    for j0 in (0..n_kv).step_by(KEY_TILE) {
                        kernels.key_tiles(qh, hd, &kt[j0..], *stride, &mut tiles[..heads]);
                        let m = KEY_TILE.min(n_kv - j0);
                        for (row, tile) in scores.chunks_exact_mut(n_kv).zip(&tiles) {
                            for (s, &dot) in row[j0..j0 + m].iter_mut().zip(tile) {
                                *s = dot * scale;
                            }
                        }
                    }
                    let mut sums = [0f32; attn::HEADS];
                    for (sum, row) in sums.iter_mut().zip(scores.chunks_exact_mut(n_kv)) {
                        *sum = softmax_numerators(kernels, row);
                    }
                    kernels.weighted_rows(out, &mut scores, &sums[..heads], v);
                }
            }
        }
    }

    fn ffn(&self, ffn: &Ffn, h: &[f32], t_n: usize) -> Result<Vec<f32>, ForwardError> {
        match ffn {
            Ffn::Dense { gate, up, down } => self.swiglu(gate, up, down, h, t_n),
            Ffn::Moe {
                router,
                gate,
                up,
                down,
            } => self.moe(router, gate, up, down, h, t_n),
        }
    }

    /// Mixture of experts: softmax over the router's logits, the top
    /// `n_expert_used` experts per token with their probabilities renormalised
    /// to sum 1, and the weighted sum of those experts' SwiGLU outputs.
    fn moe(
        &self,
        router: &Matrix,
        gate: &Matrix,
        up: &Matrix,
        down: &Matrix,
        h: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let (e, n_exp) = (c.n_embd, c.n_expert);
        let ff = gate.rows / n_exp;
        let logits = self.matmul(router, h, t_n)?;
        // Per expert: the tokens routed to it, with their weights.
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_exp];
        for t in 0..t_n {
            let row = &logits[t * n_exp..(t + 1) * n_exp];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let probs: Vec<f32> = row.iter().map(|v| math::exp(v - max)).collect();
            let total: f32 = probs.iter().sum();
            let mut order: Vec<usize> = (0..n_exp).collect();
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let chosen = &order[..c.n_expert_used];
            let sum: f32 = chosen.iter().map(|&i| probs[i] / total).sum();
            for &i in chosen {
                let mut w = probs[i] / total / sum;
                if c.expert_weights_scale != 0.0 && c.expert_weights_scale != 1.0 {
                    w *= c.expert_weights_scale;
                }
                routed[i].push((t, w));
            }
        }
        let mut out = vec![0f32; t_n * e];
        for (x, tokens) in routed.iter().enumerate() {
            if tokens.is_empty() {
                continue;
            }
            let mut input = Vec::with_capacity(tokens.len() * e);
            for &(t, _) in tokens {
                input.extend_from_slice(&h[t * e..(t + 1) * e]);
            }
            let y = self.swiglu(
                &gate.expert(x, ff),
                &up.expert(x, ff),
                &down.expert(x, e),
                &input,
                tokens.len(),
            )?;
            for (i, &(t, w)) in tokens.iter().enumerate() {
                for (o, v) in out[t * e..(t + 1) * e].iter_mut().zip(&y[i * e..]) {
                    *o += w * v;
                }
            }
        }
        Ok(out)
    }
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

/// Row `r` of `m`, decoded into `out` (matrices are checked when the model is
/// opened, so this fails only if that check and the decoder disagree).
fn decode(m: &Matrix, r: usize, out: &mut [f32]) -> Result<(), ForwardError> {
    dequantize_row(m.ty, m.row(r), out).map_err(|e| ForwardError::Tensor {
        name: format!("a {} matrix", m.ty.name()),
        message: e.to_string(),
    })
}
