//! The GGUF architectures memwall runs, as data: what differs between them,
//! and the tensors a file of each holds, named and shaped from the model's
//! dimensions. One table serves the forward pass's loader (names and the
//! differences), the converter's check of a planned file against
//! `config.json`, and the planner's tensor list; adding an architecture is its
//! rows here and its differences in the forward pass.
//!
//! Names and shapes follow llama.cpp 0c1e570 (`src/llama-arch.cpp`,
//! `src/llama-model.cpp`). Shapes are GGUF order: `ne[0]` (the row length)
//! first.

/// An architecture (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// `qwen35`: Qwen3.5 dense, gated delta-net layers between gated full
    /// attention layers.
    Qwen35,
    /// `qwen35moe`: Qwen3.5 with routed and shared experts.
    Qwen35Moe,
    /// `gemma4`: Gemma 4, sliding-window layers and global ones with wider
    /// heads, sandwich norms, GELU, a final logit softcap; optionally experts
    /// beside the dense MLP.
    Gemma4,
}

impl Arch {
    /// Every architecture, for messages.
    pub const ALL: [Arch; 8] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::CommandR,
        Arch::Qwen35,
        Arch::Qwen35Moe,
        Arch::Gemma4,
    ];

    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::CommandR => "command-r",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Gemma4 => "gemma4",
        }
    }

    /// The architecture named `name`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Rotary embedding in the NEOX layout (halves rotated together) rather
    /// than NORM (neighbouring pairs).
    pub fn rope_neox(self) -> bool {
        matches!(
            self,
            Arch::Qwen2
                | Arch::Qwen3
                | Arch::Qwen3Moe
                | Arch::Qwen35
                | Arch::Qwen35Moe
                | Arch::Gemma4
        )
    }

    /// LayerNorm (with an optional bias) rather than RMSNorm.
    pub fn layer_norm(self) -> bool {
        self == Arch::CommandR
    }

    /// Parallel blocks: the feed-forward part reads the attention norm's
    /// output (no `ffn_norm`) and both add to the residual at once.
    pub fn parallel_blocks(self) -> bool {
        self == Arch::CommandR
    }

    /// Whether the Q, K and V projections carry biases in every file.
    pub fn qkv_bias(self) -> bool {
        self == Arch::Qwen2
    }

    /// Whether queries and keys are normalised per head in every file.
    pub fn qk_norm(self) -> bool {
        matches!(
            self,
            Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe | Arch::Gemma4
        )
    }

    /// Hybrid stacks (Qwen3.5): linear-attention (gated delta-net) layers
    /// between full attention layers whose queries carry an output gate
    /// (`attn_q` is twice as wide), every norm before the FFN named
    /// `post_attention_norm`, and multi-token-prediction blocks after the
    /// last layer (`nextn_predict_layers`).
    pub fn hybrid(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe)
    }

    /// The norm before the feed-forward part of a block.
    pub fn ffn_norm(self) -> BlockTensor {
        if self.hybrid() {
            BlockTensor::AttnPostNorm
        } else {
            BlockTensor::FfnNorm
        }
    }

    /// The tensors a file of this architecture with dimensions `d` must
    /// hold, with their shapes: what the converter writes and the planner
    /// counts. (The loader also reads the optional ones a file may add:
    /// biases, `rope_freqs`, Command-R's per-head norms.)
    pub fn tensors(self, d: &Dims) -> Vec<Slot> {
        if let Some(g) = d.gemma.as_ref().filter(|_| self == Arch::Gemma4) {
            return gemma4_tensors(d, g);
        }
        let e = d.n_embd;
        let mut out = Vec::new();
        let mut put = |name: String, dims: Vec<u64>| out.push(Slot { name, dims });
        put(TOKEN_EMBD.into(), vec![e, d.n_vocab]);
        put(OUTPUT_NORM.into(), vec![e]);
        if !d.tied_embeddings {
            put(OUTPUT.into(), vec![e, d.n_vocab]);
        }
        for l in 0..d.n_layer + d.n_nextn {
            let b = |t: BlockTensor| t.name(l);
            put(b(BlockTensor::AttnNorm), vec![e]);
            match d.linear.filter(|_| d.is_recurrent(l)) {
                Some(lin) => {
                    let (k, v) = (
                        lin.n_k_heads * lin.head_k_dim,
                        lin.n_v_heads * lin.head_v_dim,
                    );
                    put(b(BlockTensor::AttnQkv), vec![e, 2 * k + v]);
                    put(b(BlockTensor::AttnGate), vec![e, v]);
                    put(b(BlockTensor::SsmConv1d), vec![lin.conv_kernel, 2 * k + v]);
                    put(b(BlockTensor::SsmDt), vec![lin.n_v_heads]);
                    put(b(BlockTensor::SsmA), vec![lin.n_v_heads]);
                    put(b(BlockTensor::SsmBeta), vec![e, lin.n_v_heads]);
                    put(b(BlockTensor::SsmAlpha), vec![e, lin.n_v_heads]);
                    put(b(BlockTensor::SsmNorm), vec![lin.head_v_dim]);
                    put(b(BlockTensor::SsmOut), vec![v, e]);
                }
                None => self.attention_tensors(d, l, &mut put),
            }
            if !self.parallel_blocks() {
                put(b(self.ffn_norm()), vec![e]);
            }
            if d.n_expert > 0 {
                let (x, f) = (d.n_expert, d.n_ff_expert);
                put(b(BlockTensor::FfnGateInp), vec![e, x]);
                put(b(BlockTensor::FfnGateExps), vec![e, f, x]);
                put(b(BlockTensor::FfnUpExps), vec![e, f, x]);
                put(b(BlockTensor::FfnDownExps), vec![f, e, x]);
            } else {
                put(b(BlockTensor::FfnGate), vec![e, d.n_ff]);
                put(b(BlockTensor::FfnUp), vec![e, d.n_ff]);
                put(b(BlockTensor::FfnDown), vec![d.n_ff, e]);
            }
            if d.n_ff_shared > 0 {
                let f = d.n_ff_shared;
                put(b(BlockTensor::FfnGateInpShexp), vec![e, 1]);
                put(b(BlockTensor::FfnGateShexp), vec![e, f]);
                put(b(BlockTensor::FfnUpShexp), vec![e, f]);
                put(b(BlockTensor::FfnDownShexp), vec![f, e]);
            }
            if l >= d.n_layer {
                put(b(BlockTensor::NextnEhProj), vec![2 * e, e]);
                put(b(BlockTensor::NextnEnorm), vec![e]);
                put(b(BlockTensor::NextnHnorm), vec![e]);
                put(b(BlockTensor::NextnSharedHeadNorm), vec![e]);
            }
        }
        out
    }

    /// The attention tensors of block `l`.
    fn attention_tensors(self, d: &Dims, l: u64, put: &mut impl FnMut(String, Vec<u64>)) {
        let b = |t: BlockTensor| t.name(l);
        let e = d.n_embd;
        let (q, kv) = (d.n_head * d.head_dim, d.n_head_kv * d.head_dim);
        // A hybrid stack's query projection also gives the output gate.
        let q_rows = if self.hybrid() { 2 * q } else { q };
        put(b(BlockTensor::AttnQ), vec![e, q_rows]);
        put(b(BlockTensor::AttnK), vec![e, kv]);
        put(b(BlockTensor::AttnV), vec![e, kv]);
        put(b(BlockTensor::AttnOutput), vec![q, e]);
        if self.qkv_bias() {
            put(b(BlockTensor::AttnQBias), vec![q]);
            put(b(BlockTensor::AttnKBias), vec![kv]);
            put(b(BlockTensor::AttnVBias), vec![kv]);
        }
        if self.qk_norm() {
            put(b(BlockTensor::AttnQNorm), vec![d.head_dim]);
            put(b(BlockTensor::AttnKNorm), vec![d.head_dim]);
        }
    }
}

/// Gemma 4's tensors, as llama.cpp's converter writes them: `rope_freqs`
/// first, per layer the sandwich norms, the attention (a global layer's
/// heads wider, without `attn_v` when its values are its keys), the GELU MLP
/// with its `layer_output_scale`, and for the mixture the router with its
/// scales and the fused `gate_up` experts.
fn gemma4_tensors(d: &Dims, g: &GemmaDims) -> Vec<Slot> {
    let e = d.n_embd;
    let mut out = Vec::new();
    let mut put = |name: String, dims: Vec<u64>| out.push(Slot { name, dims });
    put(ROPE_FREQS.into(), vec![g.global_head_dim / 2]);
    put(TOKEN_EMBD.into(), vec![e, d.n_vocab]);
    put(OUTPUT_NORM.into(), vec![e]);
    if !d.tied_embeddings {
        put(OUTPUT.into(), vec![e, d.n_vocab]);
    }
    for l in 0..d.n_layer {
        let b = |t: BlockTensor| t.name(l);
        let global = !g.sliding.get(l as usize).copied().unwrap_or(true);
        let (hd, kv) = if global {
            (
                g.global_head_dim,
                if g.k_eq_v {
                    g.global_kv_heads
                } else {
                    d.n_head_kv
                },
            )
        } else {
            (d.head_dim, d.n_head_kv)
        };
        let q = d.n_head * hd;
        put(b(BlockTensor::AttnNorm), vec![e]);
        put(b(BlockTensor::LayerOutputScale), vec![1]);
        put(b(BlockTensor::AttnQ), vec![e, q]);
        put(b(BlockTensor::AttnK), vec![e, kv * hd]);
        if !(global && g.k_eq_v) {
            put(b(BlockTensor::AttnV), vec![e, kv * hd]);
        }
        put(b(BlockTensor::AttnOutput), vec![q, e]);
        put(b(BlockTensor::AttnQNorm), vec![hd]);
        put(b(BlockTensor::AttnKNorm), vec![hd]);
        put(b(BlockTensor::AttnPostNorm), vec![e]);
        put(b(BlockTensor::FfnNorm), vec![e]);
        put(b(BlockTensor::PostFfwNorm), vec![e]);
        put(b(BlockTensor::FfnGate), vec![e, d.n_ff]);
        put(b(BlockTensor::FfnUp), vec![e, d.n_ff]);
        put(b(BlockTensor::FfnDown), vec![d.n_ff, e]);
        if d.n_expert > 0 {
            let (x, f) = (d.n_expert, d.n_ff_expert);
            put(b(BlockTensor::FfnGateInp), vec![e, x]);
            put(b(BlockTensor::FfnGateInpScale), vec![e]);
            put(b(BlockTensor::FfnDownExpsScale), vec![x]);
            put(b(BlockTensor::FfnGateUpExps), vec![e, 2 * f, x]);
            put(b(BlockTensor::FfnDownExps), vec![f, e, x]);
            put(b(BlockTensor::PreFfwNorm2), vec![e]);
            put(b(BlockTensor::PostFfwNorm1), vec![e]);
            put(b(BlockTensor::PostFfwNorm2), vec![e]);
        }
    }
    out
}

/// What Gemma 4 adds to the dimensions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GemmaDims {
    /// Head size of the global (full attention) layers.
    pub global_head_dim: u64,
    /// KV heads of the global layers when their values are their keys.
    pub global_kv_heads: u64,
    /// The global layers have no `attn_v` (values are the raw keys).
    pub k_eq_v: bool,
    /// Which layers are sliding-window layers.
    pub sliding: Vec<bool>,
}

/// The dimensions a file's tensor shapes follow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dims {
    /// Transformer blocks.
    pub n_layer: u64,
    /// Hidden size.
    pub n_embd: u64,
    /// Query heads.
    pub n_head: u64,
    /// Key/value heads.
    pub n_head_kv: u64,
    /// Size of one attention head.
    pub head_dim: u64,
    /// Dense FFN width.
    pub n_ff: u64,
    /// Experts per block (0: dense).
    pub n_expert: u64,
    /// FFN width of one expert.
    pub n_ff_expert: u64,
    /// Vocabulary size.
    pub n_vocab: u64,
    /// The output head reuses the token embeddings (no `output.weight`).
    pub tied_embeddings: bool,
    /// FFN width of the shared expert beside the routed ones (0: none).
    pub n_ff_shared: u64,
    /// The linear-attention layers' dimensions (hybrid architectures).
    pub linear: Option<LinearDims>,
    /// Which of the `n_layer` blocks are linear-attention layers (empty:
    /// none; the multi-token-prediction blocks never are).
    pub recurrent: Vec<bool>,
    /// Multi-token-prediction blocks after the `n_layer` blocks.
    pub n_nextn: u64,
    /// Gemma 4's layer kinds and global heads.
    pub gemma: Option<GemmaDims>,
}

impl Dims {
    /// Whether block `l` is a linear-attention layer.
    pub fn is_recurrent(&self, l: u64) -> bool {
        self.recurrent.get(l as usize).copied().unwrap_or(false)
    }
}

/// The dimensions of a gated delta-net layer (`<arch>.ssm.*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinearDims {
    /// Width of the short causal convolution (`ssm.conv_kernel`).
    pub conv_kernel: u64,
    /// Key heads (`ssm.group_count`).
    pub n_k_heads: u64,
    /// Size of a key head (`ssm.state_size`).
    pub head_k_dim: u64,
    /// Value heads (`ssm.time_step_rank`).
    pub n_v_heads: u64,
    /// Size of a value head (`ssm.inner_size / ssm.time_step_rank`).
    pub head_v_dim: u64,
}

/// Qwen3.5's layer pattern: every `interval`-th layer (counting from 1) is a
/// full attention layer, the others linear (`full_attention_interval`).
pub fn recurrent_every(n_layer: u64, interval: u64) -> Vec<bool> {
    (1..=n_layer)
        .map(|i| interval == 0 || i % interval != 0)
        .collect()
}

/// One tensor of the table: its GGUF name and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// GGUF name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in GGUF order.
    pub dims: Vec<u64>,
}

/// Token embeddings.
pub const TOKEN_EMBD: &str = "token_embd.weight";
/// The final norm.
pub const OUTPUT_NORM: &str = "output_norm.weight";
/// The final norm's bias (LayerNorm architectures, optional).
pub const OUTPUT_NORM_BIAS: &str = "output_norm.bias";
/// The output head (absent when tied to the embeddings).
pub const OUTPUT: &str = "output.weight";
/// Llama 3's rotary frequency factors (optional).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// A tensor of every block (`blk.N.…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum BlockTensor {
    AttnNorm,
    AttnNormBias,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnOutputBias,
    AttnQNorm,
    AttnKNorm,
    FfnNorm,
    FfnNormBias,
    FfnGateInp,
    FfnGate,
    FfnUp,
    FfnDown,
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    AttnPostNorm,
    AttnQkv,
    AttnGate,
    SsmConv1d,
    SsmDt,
    SsmA,
    SsmBeta,
    SsmAlpha,
    SsmNorm,
    SsmOut,
    FfnGateInpShexp,
    FfnGateShexp,
    FfnUpShexp,
    FfnDownShexp,
    NextnEhProj,
    NextnEnorm,
    NextnHnorm,
    NextnSharedHeadNorm,
    LayerOutputScale,
    PostFfwNorm,
    FfnGateInpScale,
    FfnDownExpsScale,
    FfnGateUpExps,
    PreFfwNorm2,
    PostFfwNorm1,
    PostFfwNorm2,
}

impl BlockTensor {
    /// The name without `blk.N.`, e.g. `attn_q.weight`.
    pub fn suffix(self) -> &'static str {
        use BlockTensor as T;
        match self {
            T::AttnNorm => "attn_norm.weight",
            T::AttnNormBias => "attn_norm.bias",
            T::AttnQ => "attn_q.weight",
            T::AttnK => "attn_k.weight",
            T::AttnV => "attn_v.weight",
            T::AttnOutput => "attn_output.weight",
            T::AttnQBias => "attn_q.bias",
            T::AttnKBias => "attn_k.bias",
            T::AttnVBias => "attn_v.bias",
            T::AttnOutputBias => "attn_output.bias",
            T::AttnQNorm => "attn_q_norm.weight",
            T::AttnKNorm => "attn_k_norm.weight",
            T::FfnNorm => "ffn_norm.weight",
            T::FfnNormBias => "ffn_norm.bias",
            T::FfnGateInp => "ffn_gate_inp.weight",
            T::FfnGate => "ffn_gate.weight",
            T::FfnUp => "ffn_up.weight",
            T::FfnDown => "ffn_down.weight",
            T::FfnGateExps => "ffn_gate_exps.weight",
            T::FfnUpExps => "ffn_up_exps.weight",
            T::FfnDownExps => "ffn_down_exps.weight",
            T::AttnPostNorm => "post_attention_norm.weight",
            T::AttnQkv => "attn_qkv.weight",
            T::AttnGate => "attn_gate.weight",
            T::SsmConv1d => "ssm_conv1d.weight",
            T::SsmDt => "ssm_dt.bias",
            T::SsmA => "ssm_a",
            T::SsmBeta => "ssm_beta.weight",
            T::SsmAlpha => "ssm_alpha.weight",
            T::SsmNorm => "ssm_norm.weight",
            T::SsmOut => "ssm_out.weight",
            T::FfnGateInpShexp => "ffn_gate_inp_shexp.weight",
            T::FfnGateShexp => "ffn_gate_shexp.weight",
            T::FfnUpShexp => "ffn_up_shexp.weight",
            T::FfnDownShexp => "ffn_down_shexp.weight",
            T::NextnEhProj => "nextn.eh_proj.weight",
            T::NextnEnorm => "nextn.enorm.weight",
            T::NextnHnorm => "nextn.hnorm.weight",
            T::NextnSharedHeadNorm => "nextn.shared_head_norm.weight",
            T::LayerOutputScale => "layer_output_scale.weight",
            T::PostFfwNorm => "post_ffw_norm.weight",
            T::FfnGateInpScale => "ffn_gate_inp.scale",
            T::FfnDownExpsScale => "ffn_down_exps.scale",
            T::FfnGateUpExps => "ffn_gate_up_exps.weight",
            T::PreFfwNorm2 => "pre_ffw_norm_2.weight",
            T::PostFfwNorm1 => "post_ffw_norm_1.weight",
            T::PostFfwNorm2 => "post_ffw_norm_2.weight",
        }
    }

    /// The name in block `l`, e.g. `blk.3.attn_q.weight`.
    pub fn name(self, l: u64) -> String {
        format!("blk.{l}.{}", self.suffix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_name(a.name()), Some(a));
        }
        assert_eq!(Arch::from_name("gemma"), None);
        assert_eq!(BlockTensor::AttnQ.name(7), "blk.7.attn_q.weight");
    }

    #[test]
    fn tables_differ_where_the_architectures_do() {
        let d = Dims {
            n_layer: 1,
            n_embd: 8,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 4,
            n_ff: 16,
            n_vocab: 10,
            ..Dims::default()
        };
        let names =
            |a: Arch| -> Vec<String> { a.tensors(&d).into_iter().map(|s| s.name).collect() };
        let has = |a: Arch, n: &str| names(a).iter().any(|x| x == n);
        assert!(has(Arch::Qwen2, "blk.0.attn_q.bias") && !has(Arch::Llama, "blk.0.attn_q.bias"));
        assert!(has(Arch::Qwen3, "blk.0.attn_k_norm.weight"));
        assert!(!has(Arch::CommandR, "blk.0.ffn_norm.weight"));
        assert!(has(Arch::Llama, "output.weight"));
        let moe = Dims {
            n_expert: 4,
            n_ff_expert: 6,
            ..d
        };
        let t = Arch::Qwen3Moe.tensors(&moe);
        let down = t.iter().find(|s| s.name == "blk.0.ffn_down_exps.weight");
        assert_eq!(down.map(|s| s.dims.clone()), Some(vec![6, 8, 4]));
        assert!(!t.iter().any(|s| s.name == "blk.0.ffn_gate.weight"));
    }

    #[test]
    fn hybrid_stacks_alternate_linear_and_gated_attention_layers_then_nextn_blocks() {
        let d = Dims {
            n_layer: 4,
            n_embd: 8,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 4,
            n_ff: 16,
            n_vocab: 10,
            linear: Some(LinearDims {
                conv_kernel: 4,
                n_k_heads: 1,
                head_k_dim: 4,
                n_v_heads: 2,
                head_v_dim: 4,
            }),
            recurrent: recurrent_every(4, 4),
            n_nextn: 1,
            ..Dims::default()
        };
        assert_eq!(d.recurrent, [true, true, true, false]);
        let t = Arch::Qwen35.tensors(&d);
        let dims = |n: &str| t.iter().find(|s| s.name == n).map(|s| s.dims.clone());
        assert_eq!(dims("blk.0.attn_qkv.weight"), Some(vec![8, 16]));
        assert_eq!(dims("blk.0.ssm_conv1d.weight"), Some(vec![4, 16]));
        assert_eq!(dims("blk.0.ssm_a"), Some(vec![2]));
        assert_eq!(dims("blk.0.attn_q.weight"), None);
        assert_eq!(dims("blk.3.attn_q.weight"), Some(vec![8, 16]));
        assert_eq!(dims("blk.3.post_attention_norm.weight"), Some(vec![8]));
        assert_eq!(dims("blk.3.ffn_norm.weight"), None);
        assert_eq!(dims("blk.4.nextn.eh_proj.weight"), Some(vec![16, 8]));
        assert_eq!(dims("blk.4.attn_q.weight"), Some(vec![8, 16]));
        assert_eq!(dims("blk.3.nextn.eh_proj.weight"), None);
        let moe = Dims {
            n_expert: 4,
            n_ff_expert: 6,
            n_ff_shared: 6,
            ..d
        };
        let t = Arch::Qwen35Moe.tensors(&moe);
        let dims = |n: &str| t.iter().find(|s| s.name == n).map(|s| s.dims.clone());
        assert_eq!(dims("blk.1.ffn_gate_inp_shexp.weight"), Some(vec![8, 1]));
        assert_eq!(dims("blk.4.ffn_down_shexp.weight"), Some(vec![6, 8]));
    }
}
