//! Opening a model: every tensor the forward pass reads found once, its shape
//! and type checked, norms and biases decoded to `f32`.

use super::*;
use memwall_format::arch::{self, Arch, BlockTensor};

/// A decodable matrix: `rows` rows of `cols` weights.
#[derive(Clone, Copy)]
pub(super) struct Matrix<'a> {
    /// The GGUF tensor it comes from.
    pub(super) name: &'a str,
    /// Which expert of a stacked tensor this is.
    pub(super) expert: Option<usize>,
    pub(super) ty: GgmlType,
    pub(super) data: &'a [u8],
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) row_bytes: usize,
    /// Rows of the whole tensor (all experts).
    pub(super) total_rows: usize,
}

/// A norm: weights, and a bias for LayerNorm when the model has one.
pub(super) struct Norm {
    pub(super) weight: Vec<f32>,
    pub(super) bias: Option<Vec<f32>>,
}

/// The feed-forward part of a block.
pub(super) enum Ffn<'a> {
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

pub(super) struct Layer<'a> {
    pub(super) attn_norm: Norm,
    pub(super) wq: Matrix<'a>,
    pub(super) wk: Matrix<'a>,
    pub(super) wv: Matrix<'a>,
    pub(super) bq: Option<Vec<f32>>,
    pub(super) bk: Option<Vec<f32>>,
    pub(super) bv: Option<Vec<f32>>,
    /// Per-head norms of queries and keys: one `head_dim` vector shared by all
    /// heads, or one per head.
    pub(super) q_norm: Option<Vec<f32>>,
    pub(super) k_norm: Option<Vec<f32>>,
    pub(super) wo: Matrix<'a>,
    pub(super) bo: Option<Vec<f32>>,
    /// `None` for parallel blocks (Command-R), whose FFN reads the attention norm.
    pub(super) ffn_norm: Option<Norm>,
    pub(super) ffn: Ffn<'a>,
}

impl<'a> Layer<'a> {
    /// Every matrix of the layer, in the order the forward pass reads them.
    pub(super) fn matrices(&self) -> Vec<&Matrix<'a>> {
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

/// Finds tensors and checks their shapes and types.
pub(super) struct Loader<'g> {
    pub(super) gguf: &'g GgufModel,
}

impl<'g> Loader<'g> {
    pub(super) fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    /// The tensor `name` as `rows × cols` (trailing dimensions fold into rows).
    pub(super) fn matrix(&self, name: &str) -> Result<Matrix<'g>, ForwardError> {
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

    pub(super) fn shaped(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix<'g>, ForwardError> {
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
    pub(super) fn experts(
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
    pub(super) fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ForwardError> {
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

    pub(super) fn optional_vector(
        &self,
        name: &str,
        len: usize,
    ) -> Result<Option<Vec<f32>>, ForwardError> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    pub(super) fn norm(&self, weight: &str, bias: &str, len: usize) -> Result<Norm, ForwardError> {
        Ok(Norm {
            weight: self.vector(weight, len)?,
            bias: self.optional_vector(bias, len)?,
        })
    }

    /// A per-head norm weight: `head_dim` values shared by all heads, or one set per head.
    pub(super) fn head_norm(
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
    pub(super) fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Expert `x` of a tensor that stacks experts of `n` rows each.
    pub(super) fn expert(&self, x: usize, n: usize) -> Self {
        Matrix {
            data: &self.data[x * n * self.row_bytes..(x + 1) * n * self.row_bytes],
            rows: n,
            expert: Some(x),
            ..*self
        }
    }
}

/// Row `r` of `m`, decoded into `out` (matrices are checked when the model is
/// opened, so this fails only if that check and the decoder disagree).
pub(super) fn decode(m: &Matrix, r: usize, out: &mut [f32]) -> Result<(), ForwardError> {
    dequantize_row(m.ty, m.row(r), out).map_err(|e| ForwardError::Tensor {
        name: format!("a {} matrix", m.ty.name()),
        message: e.to_string(),
    })
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
        let load = Loader { gguf };
        let head_dim = hp.head_dim() as usize;
        let n_embd = hp.embedding_length as usize;
        let embd = load.matrix(arch::TOKEN_EMBD)?;
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
        let f32_of = |v: Option<f64>| v.map(|v| v as f32);
        let attn_factor = f32_of(hp.rope_scaling_attn_factor).unwrap_or(1.0);
        let (yarn, mscale) = if scaling == "yarn" {
            let orig = hp
                .rope_scaling_original_context_length
                .unwrap_or(hp.context_length);
            let log_mul = f32_of(hp.yarn_log_multiplier).unwrap_or(0.0);
            let f = 1.0 / freq_scale;
            // transformers' `attention_factor`, when the config states it, replaces the
            // computed magnitude. llama.cpp 0c1e570 reads this key and the betas only
            // for a few architectures (grok, mistral3) and runs the rest with defaults.
            let stated = f32_of(hp.yarn_attn_factor);
            let m = if let Some(m) = stated {
                m
            } else if log_mul != 0.0 {
                rope::yarn_mscale(f, 1.0) / rope::yarn_mscale(f, log_mul)
            } else {
                rope::yarn_mscale(f, 1.0)
            };
            let yarn = Yarn {
                orig_ctx: orig.min(u32::MAX as u64) as u32,
                beta_fast: f32_of(hp.yarn_beta_fast).unwrap_or(32.0),
                beta_slow: f32_of(hp.yarn_beta_slow).unwrap_or(1.0),
            };
            (Some(yarn), m * attn_factor)
        } else {
            (None, attn_factor)
        };
        let freq_factors = if load.has(arch::ROPE_FREQS) {
            Some(load.vector(arch::ROPE_FREQS, n_rot / 2)?)
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
                neox: arch.rope_neox(),
                yarn,
                mscale,
                freq_factors,
            },
            eps: eps.unwrap_or(1e-5) as f32,
            n_vocab: embd.rows,
            n_ctx,
            n_expert: hp.expert_count.unwrap_or(0) as usize,
            n_expert_used: hp.expert_used_count.unwrap_or(0) as usize,
            expert_weights_scale: f32_of(hp.expert_weights_scale).unwrap_or(0.0),
            logit_scale: f32_of(hp.logit_scale).unwrap_or(1.0),
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
                arch::TOKEN_EMBD,
                format!("{} columns, expected {n_embd}", embd.cols),
            ));
        }
        let output = if load.has(arch::OUTPUT) {
            load.shaped(arch::OUTPUT, c.n_vocab, n_embd)?
        } else {
            embd
        };
        let output_norm = load.norm(arch::OUTPUT_NORM, arch::OUTPUT_NORM_BIAS, n_embd)?;
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

    pub(super) fn layer(
        load: &Loader<'a>,
        c: &Config,
        l: usize,
    ) -> Result<Layer<'a>, ForwardError> {
        use BlockTensor as T;
        let n = |t: T| t.name(l as u64);
        let (q, kv) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim);
        let e = c.n_embd;
        let ffn_norm = if c.arch.parallel_blocks() {
            None
        } else {
            Some(load.norm(&n(T::FfnNorm), &n(T::FfnNormBias), e)?)
        };
        let ffn = if c.n_expert > 0 {
            let router = load.shaped(&n(T::FfnGateInp), c.n_expert, e)?;
            let gate = load.matrix(&n(T::FfnGateExps))?;
            let ff = gate.rows / c.n_expert;
            Ffn::Moe {
                router,
                gate: load.experts(&n(T::FfnGateExps), c.n_expert, ff, e)?,
                up: load.experts(&n(T::FfnUpExps), c.n_expert, ff, e)?,
                down: load.experts(&n(T::FfnDownExps), c.n_expert, e, ff)?,
            }
        } else {
            let gate = load.matrix(&n(T::FfnGate))?;
            Ffn::Dense {
                gate: load.shaped(&n(T::FfnGate), gate.rows, e)?,
                up: load.shaped(&n(T::FfnUp), gate.rows, e)?,
                down: load.shaped(&n(T::FfnDown), e, gate.rows)?,
            }
        };
        Ok(Layer {
            attn_norm: load.norm(&n(T::AttnNorm), &n(T::AttnNormBias), e)?,
            wq: load.shaped(&n(T::AttnQ), q, e)?,
            wk: load.shaped(&n(T::AttnK), kv, e)?,
            wv: load.shaped(&n(T::AttnV), kv, e)?,
            bq: load.optional_vector(&n(T::AttnQBias), q)?,
            bk: load.optional_vector(&n(T::AttnKBias), kv)?,
            bv: load.optional_vector(&n(T::AttnVBias), kv)?,
            q_norm: load.head_norm(&n(T::AttnQNorm), c.head_dim, c.n_head)?,
            k_norm: load.head_norm(&n(T::AttnKNorm), c.head_dim, c.n_head_kv)?,
            wo: load.shaped(&n(T::AttnOutput), e, q)?,
            bo: load.optional_vector(&n(T::AttnOutputBias), e)?,
            ffn_norm,
            ffn,
        })
    }
}
