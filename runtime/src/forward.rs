//! The scalar reference forward pass: the specification every faster kernel
//! will be tested against. Weights stay in the GGUF (memory-mapped, any type
//! [`blocks::dequantize_row`] decodes); each matrix row is decoded once per
//! call and multiplied with every token of the batch, in `f32`.
//!
//! This first part covers the llama architecture as llama.cpp runs it
//! (`LLM_ARCH_LLAMA`, also Mistral): RMSNorm, RoPE in the NORM layout (the
//! converter permuted Q/K rows for it) with `rope_freqs` factors and linear
//! scaling, grouped-query causal attention over an `f32` KV cache, SwiGLU,
//! tied or untied output. Other architectures are refused by name.

use crate::GgmlType;
use crate::blocks::{DEQUANTIZABLE, dequantize_row};
use crate::gguf::{GgufModel, Metadata};
use crate::model_info::HyperParams;

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
}

/// The hyper-parameters the forward pass uses.
#[derive(Clone, Debug)]
pub struct Config {
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
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// RoPE base.
    pub rope_base: f32,
    /// Linear rope scaling: positions are divided by this.
    pub rope_scale: f32,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Vocabulary size (rows of the output matrix).
    pub n_vocab: usize,
    /// Context length the session allows.
    pub n_ctx: usize,
}

/// A decodable matrix: `rows` rows of `cols` weights.
struct Matrix<'a> {
    name: String,
    ty: GgmlType,
    data: &'a [u8],
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// A llama-architecture model over a GGUF file.
pub struct Model<'a> {
    gguf: &'a GgufModel,
    /// Its hyper-parameters.
    pub config: Config,
    freq_factors: Option<Vec<f32>>,
}

/// The KV cache and position of one sequence.
pub struct Session {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
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

impl<'a> Model<'a> {
    /// Reads the hyper-parameters and checks every tensor the forward pass needs
    /// (shape and type), so that running cannot fail on the model itself.
    pub fn new(gguf: &'a GgufModel, n_ctx: usize) -> Result<Self, ForwardError> {
        let meta = gguf.metadata();
        let hp = HyperParams::try_from(meta).map_err(meta_err)?;
        if hp.architecture != "llama" {
            return Err(ForwardError::Metadata(format!(
                "architecture {} is not run yet; the reference forward pass runs llama (and mistral)",
                hp.architecture
            )));
        }
        let a = &hp.architecture;
        if let Some(t) = hp
            .rope_scaling_type
            .as_deref()
            .filter(|t| *t != "none" && *t != "linear")
        {
            return Err(ForwardError::Metadata(format!(
                "{a}.rope.scaling.type {t} is not run yet (none and linear are)"
            )));
        }
        if hp.expert_count.unwrap_or(0) > 0 {
            return Err(ForwardError::Metadata(
                "mixture-of-experts models are not run yet".into(),
            ));
        }
        let head_dim = hp.head_dim() as usize;
        let n_embd = hp.embedding_length as usize;
        let embd = gguf
            .tensor("token_embd.weight")
            .ok_or_else(|| tensor_err("token_embd.weight", "missing"))?
            .0;
        let config = Config {
            n_embd,
            n_layer: hp.block_count as usize,
            n_head: hp.head_count as usize,
            n_head_kv: hp.head_count_kv as usize,
            head_dim,
            n_rot: hp.rope_dimension_count.map_or(head_dim, |d| d as usize),
            rope_base: hp.rope_freq_base.unwrap_or(10000.0) as f32,
            rope_scale: match hp.rope_scaling_type.as_deref() {
                Some("linear") => hp.rope_scaling_factor.unwrap_or(1.0) as f32,
                _ => 1.0,
            },
            eps: f32_of(meta, &format!("{a}.attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
            n_vocab: embd.dims.get(1).copied().unwrap_or(0) as usize,
            n_ctx,
        };
        if config.n_head == 0
            || config.n_head_kv == 0
            || config.n_head % config.n_head_kv != 0
            || config.n_rot > head_dim
            || config.n_rot % 2 != 0
        {
            return Err(ForwardError::Metadata(format!(
                "{} heads, {} KV heads, head size {head_dim}, {} rotated dims do not fit together",
                config.n_head, config.n_head_kv, config.n_rot
            )));
        }
        let freq_factors = match gguf.tensor("rope_freqs.weight") {
            Some((t, data)) => {
                if t.ty != GgmlType::F32 || t.elements as usize != config.n_rot / 2 {
                    return Err(tensor_err(
                        "rope_freqs.weight",
                        format!("expected {} F32 values", config.n_rot / 2),
                    ));
                }
                Some(
                    data.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                )
            }
            None => None,
        };
        let model = Model {
            gguf,
            config,
            freq_factors,
        };
        model.check()?;
        Ok(model)
    }

    fn matrix(&self, name: &str) -> Result<Matrix<'a>, ForwardError> {
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
            name: name.to_owned(),
            ty: info.ty,
            data,
            rows,
            cols,
            row_bytes,
        })
    }

    /// The matrix `name`, which must be `rows × cols`.
    fn shaped(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix<'a>, ForwardError> {
        let m = self.matrix(name)?;
        if m.rows != rows || m.cols != cols {
            return Err(tensor_err(
                name,
                format!("shape {}×{}, expected {rows}×{cols}", m.rows, m.cols),
            ));
        }
        Ok(m)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ForwardError> {
        let m = self.shaped(name, 1, len)?;
        let mut out = vec![0f32; len];
        dequantize_row(m.ty, m.data, &mut out).map_err(|e| tensor_err(name, e.to_string()))?;
        Ok(out)
    }

    fn output(&self) -> Result<Matrix<'a>, ForwardError> {
        let c = &self.config;
        let name = if self.gguf.tensor("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        self.shaped(name, c.n_vocab, c.n_embd)
    }

    fn check(&self) -> Result<(), ForwardError> {
        let c = &self.config;
        let (q, kv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        self.shaped("token_embd.weight", c.n_vocab, c.n_embd)?;
        self.vector("output_norm.weight", c.n_embd)?;
        self.output()?;
        for l in 0..c.n_layer {
            let b = |s: &str| format!("blk.{l}.{s}.weight");
            self.vector(&b("attn_norm"), c.n_embd)?;
            self.vector(&b("ffn_norm"), c.n_embd)?;
            self.shaped(&b("attn_q"), q, c.n_embd)?;
            self.shaped(&b("attn_k"), kv, c.n_embd)?;
            self.shaped(&b("attn_v"), kv, c.n_embd)?;
            self.shaped(&b("attn_output"), c.n_embd, q)?;
            let gate = self.matrix(&b("ffn_gate"))?;
            self.shaped(&b("ffn_up"), gate.rows, c.n_embd)?;
            self.shaped(&b("ffn_gate"), gate.rows, c.n_embd)?;
            self.shaped(&b("ffn_down"), c.n_embd, gate.rows)?;
        }
        Ok(())
    }

    /// An empty session with room for `config.n_ctx` tokens.
    pub fn session(&self) -> Session {
        Session {
            k: vec![Vec::new(); self.config.n_layer],
            v: vec![Vec::new(); self.config.n_layer],
            n_past: 0,
        }
    }

    /// Evaluates `tokens` after what `session` holds and returns their logits,
    /// `tokens.len() × n_vocab`, row by row.
    pub fn forward(&self, session: &mut Session, tokens: &[u32]) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let t_n = tokens.len();
        if session.n_past + t_n > c.n_ctx {
            return Err(ForwardError::ContextFull(c.n_ctx));
        }
        let embd = self.matrix("token_embd.weight")?;
        let mut x = vec![0f32; t_n * c.n_embd];
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= c.n_vocab {
                return Err(ForwardError::Token(id));
            }
            let row = &embd.data[id as usize * embd.row_bytes..(id as usize + 1) * embd.row_bytes];
            dequantize_row(embd.ty, row, &mut x[t * c.n_embd..(t + 1) * c.n_embd])
                .map_err(|e| tensor_err(&embd.name, e.to_string()))?;
        }
        let (qd, kvd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let mut h = vec![0f32; t_n * c.n_embd];
        for l in 0..c.n_layer {
            let b = |s: &str| format!("blk.{l}.{s}.weight");
            rms_norm(&x, &self.vector(&b("attn_norm"), c.n_embd)?, c.eps, &mut h);
            let mut q = matmul(&self.matrix(&b("attn_q"))?, &h, t_n)?;
            let mut k = matmul(&self.matrix(&b("attn_k"))?, &h, t_n)?;
            let v = matmul(&self.matrix(&b("attn_v"))?, &h, t_n)?;
            for t in 0..t_n {
                let pos = (session.n_past + t) as f32;
                for head in q[t * qd..(t + 1) * qd].chunks_exact_mut(c.head_dim) {
                    self.rope(head, pos);
                }
                for head in k[t * kvd..(t + 1) * kvd].chunks_exact_mut(c.head_dim) {
                    self.rope(head, pos);
                }
            }
            session.k[l].extend_from_slice(&k);
            session.v[l].extend_from_slice(&v);
            let attn = self.attention(&q, &session.k[l], &session.v[l], session.n_past, t_n);
            let o = matmul(&self.matrix(&b("attn_output"))?, &attn, t_n)?;
            for (x, o) in x.iter_mut().zip(&o) {
                *x += o;
            }
            rms_norm(&x, &self.vector(&b("ffn_norm"), c.n_embd)?, c.eps, &mut h);
            let mut gate = matmul(&self.matrix(&b("ffn_gate"))?, &h, t_n)?;
            let up = matmul(&self.matrix(&b("ffn_up"))?, &h, t_n)?;
            for (g, u) in gate.iter_mut().zip(&up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
            let down = matmul(&self.matrix(&b("ffn_down"))?, &gate, t_n)?;
            for (x, d) in x.iter_mut().zip(&down) {
                *x += d;
            }
        }
        session.n_past += t_n;
        rms_norm(
            &x,
            &self.vector("output_norm.weight", c.n_embd)?,
            c.eps,
            &mut h,
        );
        matmul(&self.output()?, &h, t_n)
    }

    /// RoPE, NORM layout: dimension pairs (2i, 2i+1) of the first `n_rot`
    /// rotated by `pos · base^(-2i/n_rot)` (divided by `rope_freqs[i]` when present).
    fn rope(&self, head: &mut [f32], pos: f32) {
        let c = &self.config;
        let pos = pos / c.rope_scale;
        for i in 0..c.n_rot / 2 {
            let mut theta = pos * c.rope_base.powf(-2.0 * i as f32 / c.n_rot as f32);
            if let Some(f) = &self.freq_factors {
                theta /= f[i];
            }
            let (sin, cos) = theta.sin_cos();
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * cos - b * sin;
            head[2 * i + 1] = a * sin + b * cos;
        }
    }

    /// Causal grouped-query attention of the `t_n` new queries over the cache.
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], n_past: usize, t_n: usize) -> Vec<f32> {
        let c = &self.config;
        let (qd, kvd, hd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.head_dim);
        let group = c.n_head / c.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0f32; t_n * qd];
        let mut scores = Vec::new();
        for t in 0..t_n {
            let n_kv = n_past + t + 1;
            for head in 0..c.n_head {
                let kv_head = head / group;
                let qh = &q[t * qd + head * hd..t * qd + (head + 1) * hd];
                scores.clear();
                for j in 0..n_kv {
                    let kh = &k[j * kvd + kv_head * hd..j * kvd + (kv_head + 1) * hd];
                    scores.push(dot(qh, kh) * scale);
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let oh = &mut out[t * qd + head * hd..t * qd + (head + 1) * hd];
                for (j, s) in scores.iter().enumerate() {
                    let vh = &v[j * kvd + kv_head * hd..j * kvd + (kv_head + 1) * hd];
                    let p = s / sum;
                    for (o, x) in oh.iter_mut().zip(vh) {
                        *o += p * x;
                    }
                }
            }
        }
        out
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// RMSNorm of each `weight.len()`-wide row of `x`, times `weight`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// `y = W·x` for `t_n` tokens: `x` is `t_n × cols`, the result `t_n × rows`.
/// Each row of `W` is decoded once.
fn matmul(m: &Matrix, x: &[f32], t_n: usize) -> Result<Vec<f32>, ForwardError> {
    let mut y = vec![0f32; t_n * m.rows];
    let mut row = vec![0f32; m.cols];
    for r in 0..m.rows {
        let bytes = &m.data[r * m.row_bytes..(r + 1) * m.row_bytes];
        dequantize_row(m.ty, bytes, &mut row).map_err(|e| tensor_err(&m.name, e.to_string()))?;
        for t in 0..t_n {
            y[t * m.rows + r] = dot(&row, &x[t * m.cols..(t + 1) * m.cols]);
        }
    }
    Ok(y)
}
