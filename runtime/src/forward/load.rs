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
    /// Experts picked by a router.
    Moe {
        router: Matrix<'a>,
        experts: Experts<'a>,
        /// A shared expert every token runs, when the model has one.
        shared: Option<Box<Shared<'a>>>,
    },
    /// Gemma 4's mixture: a dense MLP and routed experts side by side.
    DenseAndMoe(Box<DenseAndMoe<'a>>),
}

/// Experts stacked in 3-D tensors; expert `x` is a slice of each.
pub(super) struct Experts<'a> {
    /// Each expert's `ff` gate rows, followed in the same tensor by its `ff`
    /// up rows when `up` is `None` (Gemma 4's `ffn_gate_up_exps`).
    pub(super) gate: Matrix<'a>,
    pub(super) up: Option<Matrix<'a>>,
    pub(super) down: Matrix<'a>,
    /// Rows of one expert's gate (and of its up) projection.
    pub(super) ff: usize,
    /// A factor on each expert's output (Gemma 4's `ffn_down_exps.scale`).
    pub(super) scale: Option<Vec<f32>>,
}

impl<'a> Experts<'a> {
    /// The stacked tensors, in the order an expert's product reads them.
    pub(super) fn matrices(&self) -> Vec<&Matrix<'a>> {
        let mut v = vec![&self.gate];
        v.extend(&self.up);
        v.push(&self.down);
        v
    }

    /// Expert `x`'s slices of [`Experts::matrices`], in that order.
    pub(super) fn expert(&self, x: usize) -> Vec<Matrix<'a>> {
        let gate_rows = if self.up.is_some() {
            self.ff
        } else {
            2 * self.ff
        };
        let mut v = vec![self.gate.expert(x, gate_rows)];
        v.extend(self.up.map(|u| u.expert(x, self.ff)));
        v.push(
            self.down
                .expert(x, self.down.rows / (self.gate.rows / gate_rows)),
        );
        v
    }
}

/// Gemma 4's feed-forward part of a mixture-of-experts block: the dense
/// GeGLU reads the FFN norm of the residual and is normed again; the router
/// reads the residual (RMS-normed without weights, times `router_scale`),
/// the experts its second pre-norm; their sum is normed; the two add.
pub(super) struct DenseAndMoe<'a> {
    pub(super) gate: Matrix<'a>,
    pub(super) up: Matrix<'a>,
    pub(super) down: Matrix<'a>,
    /// After the dense MLP (`post_ffw_norm_1`).
    pub(super) post_norm_1: Norm,
    pub(super) router: Matrix<'a>,
    /// `ffn_gate_inp.scale`, applied after the router input's `1/√n_embd`.
    pub(super) router_scale: Vec<f32>,
    /// Before the experts (`pre_ffw_norm_2`).
    pub(super) pre_norm_2: Norm,
    pub(super) experts: Experts<'a>,
    /// After the experts' sum (`post_ffw_norm_2`).
    pub(super) post_norm_2: Norm,
}

/// The shared expert of a mixture (Qwen3.5): a SwiGLU every token runs,
/// its output scaled by `sigmoid(gate_inp · h)`.
pub(super) struct Shared<'a> {
    /// One row: the input of the sigmoid gate.
    pub(super) gate_inp: Matrix<'a>,
    pub(super) gate: Matrix<'a>,
    pub(super) up: Matrix<'a>,
    pub(super) down: Matrix<'a>,
}

/// What mixes the tokens of a block: attention, or a gated delta net.
pub(super) enum Mixer<'a> {
    Attention(Attention<'a>),
    Linear(DeltaNet<'a>),
}

/// A gated delta-net layer (Qwen3.5's linear attention). Value heads are in
/// the file's tiled order: value head `j` reads key head `j % n_k_heads`.
pub(super) struct DeltaNet<'a> {
    pub(super) lin: Linear,
    /// Queries, keys and values before the convolution (`attn_qkv`).
    pub(super) qkv: Matrix<'a>,
    /// The output gate `z` (`attn_gate`).
    pub(super) z: Matrix<'a>,
    /// Per value head: the write strength before its sigmoid (`ssm_beta`).
    pub(super) beta: Matrix<'a>,
    /// Per value head: the decay's input (`ssm_alpha`).
    pub(super) alpha: Matrix<'a>,
    /// The causal convolution: `conv_kernel` taps per channel, oldest first.
    pub(super) conv: Vec<f32>,
    /// Added to `alpha` before the softplus (`ssm_dt.bias`).
    pub(super) dt_bias: Vec<f32>,
    /// `-exp(A_log)` per value head (`ssm_a`).
    pub(super) a: Vec<f32>,
    /// RMSNorm weight of a value head's output (`ssm_norm`).
    pub(super) norm: Vec<f32>,
    pub(super) out: Matrix<'a>,
}

/// Attention weights of a block.
pub(super) struct Attention<'a> {
    /// This layer's heads.
    pub(super) heads: Heads,
    /// A sliding-window layer (the model's [`Config::swa`]).
    pub(super) swa: bool,
    pub(super) wq: Matrix<'a>,
    pub(super) wk: Matrix<'a>,
    /// `None`: the values are the keys as projected (Gemma 4's global layers).
    pub(super) wv: Option<Matrix<'a>>,
    pub(super) bq: Option<Vec<f32>>,
    pub(super) bk: Option<Vec<f32>>,
    pub(super) bv: Option<Vec<f32>>,
    /// Per-head norms of queries and keys: one `head_dim` vector shared by all
    /// heads, or one per head.
    pub(super) q_norm: Option<Vec<f32>>,
    pub(super) k_norm: Option<Vec<f32>>,
    pub(super) wo: Matrix<'a>,
    pub(super) bo: Option<Vec<f32>>,
    /// The query projection also gives a sigmoid gate on the output (Qwen3.5:
    /// each head's queries followed by its gate).
    pub(super) gated: bool,
    /// Values RMS-normed per head without weights (Gemma 4).
    pub(super) v_norm: bool,
}

pub(super) struct Layer<'a> {
    pub(super) attn_norm: Norm,
    pub(super) mixer: Mixer<'a>,
    /// On the attention's output before the residual add (Gemma's sandwich).
    pub(super) post_attn_norm: Option<Norm>,
    /// `None` for parallel blocks (Command-R), whose FFN reads the attention norm.
    pub(super) ffn_norm: Option<Norm>,
    pub(super) ffn: Ffn<'a>,
    /// On the FFN's output before the residual add (Gemma's sandwich).
    pub(super) post_ffn_norm: Option<Norm>,
    /// A factor on the block's output (Gemma 4's `layer_output_scale`).
    pub(super) out_scale: Option<f32>,
}

impl<'a> Layer<'a> {
    /// The layer's routed experts, when it has them.
    pub(super) fn experts(&self) -> Option<&Experts<'a>> {
        match &self.ffn {
            Ffn::Moe { experts, .. } => Some(experts),
            Ffn::DenseAndMoe(m) => Some(&m.experts),
            Ffn::Dense { .. } => None,
        }
    }

    /// Every matrix of the layer, in the order the forward pass reads them.
    pub(super) fn matrices(&self) -> Vec<&Matrix<'a>> {
        let mut v = match &self.mixer {
            Mixer::Attention(a) => {
                let mut v = vec![&a.wq, &a.wk];
                v.extend(&a.wv);
                v.push(&a.wo);
                v
            }
            Mixer::Linear(d) => vec![&d.qkv, &d.z, &d.beta, &d.alpha, &d.out],
        };
        match &self.ffn {
            Ffn::Dense { gate, up, down } => v.extend([gate, up, down]),
            Ffn::Moe {
                router,
                experts,
                shared,
            } => {
                v.push(router);
                v.extend(experts.matrices());
                if let Some(s) = shared {
                    v.extend([&s.gate_inp, &s.gate, &s.up, &s.down]);
                }
            }
            Ffn::DenseAndMoe(m) => {
                v.extend([&m.gate, &m.up, &m.down, &m.router]);
                v.extend(m.experts.matrices());
            }
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

    /// A convolution of `channels` rows of `taps` values, decoded to `f32`.
    pub(super) fn conv(
        &self,
        name: &str,
        channels: usize,
        taps: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let m = self.shaped(name, channels, taps)?;
        self.vector(name, m.rows * m.cols)
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

/// Qwen3.5's interleaved rotary sections (`rope.dimension_sections`, four
/// counts), for the architectures that rotate with them.
fn sections(arch: Arch, hp: &HyperParams) -> Result<Option<[u32; 4]>, ForwardError> {
    if !arch.hybrid() {
        return Ok(None);
    }
    let Some(v) = &hp.rope_dimension_sections else {
        return Ok(None);
    };
    let mut s = [0u32; 4];
    for (slot, &n) in s.iter_mut().zip(v.iter()) {
        *slot = u32::try_from(n).map_err(|_| {
            ForwardError::Metadata(format!(
                "{}.rope.dimension_sections holds {n}, not a count",
                arch.name()
            ))
        })?;
    }
    Ok(Some(s))
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
        let gemma = arch == Arch::Gemma4;
        if gemma {
            refuse_unrun_gemma4(&hp)?;
        }
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
        let linear = if arch.hybrid() {
            let need = |v: Option<u64>, key: &str| {
                v.filter(|&n| n > 0)
                    .map(|n| n as usize)
                    .ok_or_else(|| ForwardError::Metadata(format!("{a}.{key} is missing or zero")))
            };
            let n_v_heads = need(hp.ssm_time_step_rank, "ssm.time_step_rank")?;
            let inner = need(hp.ssm_inner_size, "ssm.inner_size")?;
            let lin = Linear {
                conv_kernel: need(hp.ssm_conv_kernel, "ssm.conv_kernel")?,
                n_k_heads: need(hp.ssm_group_count, "ssm.group_count")?,
                head_k_dim: need(hp.ssm_state_size, "ssm.state_size")?,
                n_v_heads,
                head_v_dim: inner / n_v_heads,
            };
            // llama.cpp's kernels take square states (head_k_dim = head_v_dim).
            if inner % n_v_heads != 0
                || n_v_heads % lin.n_k_heads != 0
                || lin.head_v_dim != lin.head_k_dim
                || lin.conv_kernel > 64
            {
                return Err(ForwardError::Metadata(format!(
                    "{a}.ssm: {} key heads of {}, {n_v_heads} value heads of {inner} values in all, \
                     a {}-tap convolution do not fit together",
                    lin.n_k_heads, lin.head_k_dim, lin.conv_kernel
                )));
            }
            if let Some(r) = &hp.recurrent_layers
                && (r.len() as u64) < hp.n_layer()
            {
                return Err(ForwardError::Metadata(format!(
                    "{a}.attention.recurrent_layers has {} entries for {} blocks",
                    r.len(),
                    hp.n_layer()
                )));
            }
            Some(lin)
        } else {
            None
        };
        if hp.nextn_predict_layers.unwrap_or(0) >= hp.block_count && hp.block_count > 0 {
            return Err(ForwardError::Metadata(format!(
                "{a}.nextn_predict_layers is {}, and the file has {} blocks in all",
                hp.nextn_predict_layers.unwrap_or(0),
                hp.block_count
            )));
        }
        let mut config = Config {
            arch,
            n_embd,
            // Multi-token-prediction blocks are stored after the model's own
            // and do not run in the forward pass (as in llama.cpp's).
            n_layer: hp.n_layer() as usize,
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
                sections: sections(arch, &hp)?,
            },
            eps: eps.unwrap_or(1e-5) as f32,
            n_vocab: embd.rows,
            n_ctx,
            n_expert: hp.expert_count.unwrap_or(0) as usize,
            n_expert_used: hp.expert_used_count.unwrap_or(0) as usize,
            expert_weights_scale: f32_of(hp.expert_weights_scale).unwrap_or(0.0),
            logit_scale: f32_of(hp.logit_scale).unwrap_or(1.0),
            kv_type: KvType::F16,
            linear,
            swa: None,
            attn_scale: gemma.then_some(1.0),
            embd_scale: gemma.then(|| (n_embd as f32).sqrt()),
            final_softcap: f32_of(hp.final_logit_softcapping).filter(|&c| c > 0.0),
            act: if gemma { Act::GeluTanh } else { Act::Silu },
        };
        config.swa = sliding_window(&hp, &config.rope)?;
        let c = &config;
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
            .map(|l| {
                let heads = layer_heads(&hp, c, l)?;
                Self::layer(&load, c, l, hp.is_recurrent(l as u64), heads)
            })
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
            layer_tables: Mutex::new(None),
        })
    }

    pub(super) fn layer(
        load: &Loader<'a>,
        c: &Config,
        l: usize,
        recurrent: bool,
        heads: LayerHeads,
    ) -> Result<Layer<'a>, ForwardError> {
        use BlockTensor as T;
        let n = |t: T| t.name(l as u64);
        let e = c.n_embd;
        let ffn_norm = if c.arch.parallel_blocks() {
            None
        } else {
            Some(load.norm(&n(c.arch.ffn_norm()), &n(T::FfnNormBias), e)?)
        };
        let sandwich = c.arch == Arch::Gemma4;
        let plain = |t: T| -> Result<Option<Norm>, ForwardError> {
            if !sandwich {
                return Ok(None);
            }
            Ok(Some(Norm {
                weight: load.vector(&n(t), e)?,
                bias: None,
            }))
        };
        let out_scale = load
            .optional_vector(&n(T::LayerOutputScale), 1)?
            .map(|v| v[0]);
        let ffn = if sandwich && c.n_expert > 0 {
            Ffn::DenseAndMoe(Box::new(Self::load_dense_and_moe(load, c, l)?))
        } else if c.n_expert > 0 {
            let router = load.shaped(&n(T::FfnGateInp), c.n_expert, e)?;
            let gate = load.matrix(&n(T::FfnGateExps))?;
            let ff = gate.rows / c.n_expert;
            let shared = if load.has(&n(T::FfnUpShexp)) {
                let gate = load.matrix(&n(T::FfnGateShexp))?;
                Some(Box::new(Shared {
                    gate_inp: load.shaped(&n(T::FfnGateInpShexp), 1, e)?,
                    gate: load.shaped(&n(T::FfnGateShexp), gate.rows, e)?,
                    up: load.shaped(&n(T::FfnUpShexp), gate.rows, e)?,
                    down: load.shaped(&n(T::FfnDownShexp), e, gate.rows)?,
                }))
            } else {
                None
            };
            Ffn::Moe {
                router,
                experts: Experts {
                    gate: load.experts(&n(T::FfnGateExps), c.n_expert, ff, e)?,
                    up: Some(load.experts(&n(T::FfnUpExps), c.n_expert, ff, e)?),
                    down: load.experts(&n(T::FfnDownExps), c.n_expert, e, ff)?,
                    ff,
                    scale: None,
                },
                shared,
            }
        } else {
            let gate = load.matrix(&n(T::FfnGate))?;
            Ffn::Dense {
                gate: load.shaped(&n(T::FfnGate), gate.rows, e)?,
                up: load.shaped(&n(T::FfnUp), gate.rows, e)?,
                down: load.shaped(&n(T::FfnDown), e, gate.rows)?,
            }
        };
        let mixer = match c.linear.filter(|_| recurrent) {
            Some(lin) => Mixer::Linear(Self::delta_net(load, c, l, lin)?),
            None => Mixer::Attention(Self::attention_weights(load, c, l, heads)?),
        };
        Ok(Layer {
            attn_norm: load.norm(&n(T::AttnNorm), &n(T::AttnNormBias), e)?,
            mixer,
            post_attn_norm: plain(T::AttnPostNorm)?,
            ffn_norm,
            ffn,
            post_ffn_norm: plain(T::PostFfwNorm)?,
            out_scale,
        })
    }

    /// Gemma 4's dense MLP and experts of layer `l`.
    fn load_dense_and_moe(
        load: &Loader<'a>,
        c: &Config,
        l: usize,
    ) -> Result<DenseAndMoe<'a>, ForwardError> {
        use BlockTensor as T;
        let n = |t: T| t.name(l as u64);
        let (e, x) = (c.n_embd, c.n_expert);
        let norm = |t: T| -> Result<Norm, ForwardError> {
            Ok(Norm {
                weight: load.vector(&n(t), e)?,
                bias: None,
            })
        };
        let gate = load.matrix(&n(T::FfnGate))?;
        let gate_up = load.matrix(&n(T::FfnGateUpExps))?;
        if gate_up.rows % (2 * x) != 0 {
            return Err(tensor_err(
                &n(T::FfnGateUpExps),
                format!(
                    "{} rows do not split into {x} experts' gate and up rows",
                    gate_up.rows
                ),
            ));
        }
        let ff = gate_up.rows / (2 * x);
        Ok(DenseAndMoe {
            gate: load.shaped(&n(T::FfnGate), gate.rows, e)?,
            up: load.shaped(&n(T::FfnUp), gate.rows, e)?,
            down: load.shaped(&n(T::FfnDown), e, gate.rows)?,
            post_norm_1: norm(T::PostFfwNorm1)?,
            router: load.shaped(&n(T::FfnGateInp), x, e)?,
            router_scale: load.vector(&n(T::FfnGateInpScale), e)?,
            pre_norm_2: norm(T::PreFfwNorm2)?,
            experts: Experts {
                gate: load.experts(&n(T::FfnGateUpExps), x, 2 * ff, e)?,
                up: None,
                down: load.experts(&n(T::FfnDownExps), x, e, ff)?,
                ff,
                scale: load.optional_vector(&n(T::FfnDownExpsScale), x)?,
            },
            post_norm_2: norm(T::PostFfwNorm2)?,
        })
    }

    fn attention_weights(
        load: &Loader<'a>,
        c: &Config,
        l: usize,
        LayerHeads { heads, swa }: LayerHeads,
    ) -> Result<Attention<'a>, ForwardError> {
        use BlockTensor as T;
        let n = |t: T| t.name(l as u64);
        let (q, kv, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
        let e = c.n_embd;
        let gated = c.arch.hybrid();
        let gemma = c.arch == Arch::Gemma4;
        // Gemma 4's layers without `attn_v` take their keys as values.
        let wv = if gemma && !load.has(&n(T::AttnV)) {
            None
        } else {
            Some(load.shaped(&n(T::AttnV), kv, e)?)
        };
        Ok(Attention {
            heads,
            swa,
            wq: load.shaped(&n(T::AttnQ), if gated { 2 * q } else { q }, e)?,
            wk: load.shaped(&n(T::AttnK), kv, e)?,
            wv,
            bq: load.optional_vector(&n(T::AttnQBias), q)?,
            bk: load.optional_vector(&n(T::AttnKBias), kv)?,
            bv: load.optional_vector(&n(T::AttnVBias), kv)?,
            q_norm: load.head_norm(&n(T::AttnQNorm), hd, heads.n_head)?,
            k_norm: load.head_norm(&n(T::AttnKNorm), hd, heads.n_head_kv)?,
            wo: load.shaped(&n(T::AttnOutput), e, q)?,
            bo: load.optional_vector(&n(T::AttnOutputBias), e)?,
            gated,
            v_norm: gemma,
        })
    }

    fn delta_net(
        load: &Loader<'a>,
        c: &Config,
        l: usize,
        lin: Linear,
    ) -> Result<DeltaNet<'a>, ForwardError> {
        use BlockTensor as T;
        let n = |t: T| t.name(l as u64);
        let e = c.n_embd;
        let heads = lin.n_v_heads;
        Ok(DeltaNet {
            lin,
            qkv: load.shaped(&n(T::AttnQkv), lin.conv_dim(), e)?,
            z: load.shaped(&n(T::AttnGate), lin.value_dim(), e)?,
            beta: load.shaped(&n(T::SsmBeta), heads, e)?,
            alpha: load.shaped(&n(T::SsmAlpha), heads, e)?,
            conv: load.conv(&n(T::SsmConv1d), lin.conv_dim(), lin.conv_kernel)?,
            dt_bias: load.vector(&n(T::SsmDt), heads)?,
            a: load.vector(&n(T::SsmA), heads)?,
            norm: load.vector(&n(T::SsmNorm), lin.head_v_dim)?,
            out: load.shaped(&n(T::SsmOut), e, lin.value_dim())?,
        })
    }
}

/// A layer's attention heads, and whether it is a sliding-window layer.
#[derive(Clone, Copy)]
pub(super) struct LayerHeads {
    heads: Heads,
    swa: bool,
}

/// Layer `l`'s heads: the model's, or (Gemma 4) per layer, the
/// sliding-window layers' head size their own.
fn layer_heads(hp: &HyperParams, c: &Config, l: usize) -> Result<LayerHeads, ForwardError> {
    let a = c.arch.name();
    let swa = c.swa.is_some()
        && (hp.sliding_window_pattern.as_ref()).is_some_and(|p| p.get(l).copied().unwrap_or(false));
    let n_head_kv = match &hp.head_count_kv_layers {
        Some(v) => *v.get(l).ok_or_else(|| {
            ForwardError::Metadata(format!(
                "{a}.attention.head_count_kv has {} entries for {} blocks",
                v.len(),
                c.n_layer
            ))
        })? as usize,
        None => c.n_head_kv,
    };
    let (head_dim, n_rot) = match (&c.swa, swa) {
        (Some(s), true) => {
            let k = hp.key_length_swa.map_or(c.head_dim, |d| d as usize);
            if hp.value_length_swa.is_some_and(|v| v as usize != k) {
                return Err(ForwardError::Metadata(format!(
                    "{a}.attention.value_length_swa differs from key_length_swa ({k}); \
                     llama.cpp runs equal sizes only"
                )));
            }
            (k, s.rope.n_rot)
        }
        _ => (c.head_dim, c.rope.n_rot),
    };
    let heads = Heads {
        n_head: c.n_head,
        n_head_kv,
        head_dim,
    };
    if heads.n_head == 0
        || n_head_kv == 0
        || heads.n_head % n_head_kv != 0
        || n_rot > head_dim
        || n_rot % 2 != 0
        || head_dim == 0
    {
        return Err(ForwardError::Metadata(format!(
            "block {l}: {} heads, {n_head_kv} KV heads, head size {head_dim}, {n_rot} rotated dims \
             do not fit together",
            heads.n_head
        )));
    }
    Ok(LayerHeads { heads, swa })
}

/// The sliding-window layers' window and rotation, for a file that marks
/// such layers (`attention.sliding_window_pattern`).
fn sliding_window(hp: &HyperParams, rope: &Rope) -> Result<Option<Swa>, ForwardError> {
    let Some(pattern) = &hp.sliding_window_pattern else {
        return Ok(None);
    };
    if !pattern.iter().any(|&s| s) {
        return Ok(None);
    }
    let a = &hp.architecture;
    if (pattern.len() as u64) < hp.n_layer() {
        return Err(ForwardError::Metadata(format!(
            "{a}.attention.sliding_window_pattern has {} entries for {} blocks",
            pattern.len(),
            hp.n_layer()
        )));
    }
    let window = hp.sliding_window.filter(|&w| w > 0).ok_or_else(|| {
        ForwardError::Metadata(format!(
            "{a}.attention.sliding_window is missing or zero, and the file has sliding-window layers"
        ))
    })?;
    let head = hp.key_length_swa.or(hp.key_length);
    let n_rot = hp
        .rope_dimension_count_swa
        .or(head)
        .map_or(rope.n_rot, |d| d as usize);
    Ok(Some(Swa {
        window: usize::try_from(window).unwrap_or(usize::MAX),
        rope: Rope {
            n_rot,
            base: hp.rope_freq_base_swa.map_or(rope.base, |b| b as f32),
            // The global layers' frequency factors (Gemma 4's partial
            // rotation) are theirs alone.
            freq_factors: None,
            ..rope.clone()
        },
        full_cache: false,
    }))
}

/// Gemma 4 variants whose extra parts are not run yet, refused by name.
fn refuse_unrun_gemma4(hp: &HyperParams) -> Result<(), ForwardError> {
    let a = &hp.architecture;
    if let Some(n) = hp.embedding_length_per_layer_input.filter(|&n| n > 0) {
        return Err(ForwardError::Metadata(format!(
            "{a}.embedding_length_per_layer_input is {n}: per-layer token embeddings (Gemma 4 E2B, \
             E4B) are not run yet; the dense 31B and the 26B-A4B mixture are"
        )));
    }
    if let Some(n) = hp.shared_kv_layers.filter(|&n| n > 0) {
        return Err(ForwardError::Metadata(format!(
            "{a}.attention.shared_kv_layers is {n}: layers that reuse another layer's KV cache \
             (Gemma 4 E2B, E4B) are not run yet"
        )));
    }
    Ok(())
}
