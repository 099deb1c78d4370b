//! Will it fit? The arithmetic behind `memwall plan`: the exact weight bytes
//! of every quantization choice (from the model's tensor list and llama.cpp's
//! own mixing rules), the KV cache and working memory at a context length, and
//! what a device's RAM, memory bandwidth and storage allow.
//!
//! A model is described by its tensor list. From a GGUF that list is the
//! file's; from a Hugging Face `config.json` it is built the way llama.cpp's
//! converter names and shapes tensors ([`Shape::tensors`], checked against real
//! conversions in the tests). Bare parameter counts ([`Numbers`]) give the
//! seed's back-of-the-envelope arithmetic: params × bits ÷ 8, no per-tensor mix.
//!
//! ```
//! use memwall_quantize::fit::{Choice, Shape};
//!
//! let shape = Shape::dense("llama", 32, 4096, 14336, 32, 8, 128, 128256, false);
//! let q4 = Choice::by_name("Q4_K_M").unwrap().weights(&shape.facts(), &shape.tensors())?;
//! assert!((4.5..5.2).contains(&q4.bits_per_weight()));
//! # Ok::<(), memwall_quantize::fit::WeightsError>(())
//! ```

pub mod device;
pub mod estimate;
pub mod plan;

pub use device::Device;
pub use estimate::{
    Footprint, KvType, Load, Runtime, Speed, Token, decode_speed, footprint, token_speed,
};

use memwall_format::GgmlType;
use memwall_format::arch::{Arch, Dims, GemmaDims, LinearDims, Slot, recurrent_every};
use memwall_format::ggml_type::{FileTypeInfo, ShapeError, file_type_by_name};
use memwall_format::model_info::MetadataProblems;
use memwall_format::suggest::did_you_mean;

use crate::recipe::Recipe;
use crate::rules::{Category, MixError, MixOptions, Mixer, ModelFacts, llama_order};

/// The `config.json` architectures [`Shape::from_hf_config`] reads.
const PLANNED: [&str; 13] = [
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "CohereForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration",
];

/// Why a model's hyper-parameters cannot be planned: read from GGUF metadata
/// or a `config.json`, or a shape no model has ([`Shape::check`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ModelShapeError {
    /// The GGUF metadata lacks hyper-parameters, or has ill-typed ones.
    #[error(transparent)]
    Metadata(#[from] MetadataProblems),
    /// A GGUF file with neither a vocabulary size nor token embeddings.
    #[error("the model has neither a vocabulary size nor token embeddings")]
    NoVocabulary,
    /// A GGUF count that does not fit u32.
    #[error("{key} is {value}, too large")]
    TooLarge {
        /// The key, without the architecture (`block_count`).
        key: &'static str,
        /// Its value.
        value: u64,
    },
    /// A `config.json` without an `architectures` list.
    #[error("config.json has no architectures list")]
    NoArchitectures,
    /// A `config.json` of an architecture memwall does not plan.
    #[error(
        "architecture {class} is not one memwall plans{} (Llama, Mistral, Mixtral, \
         Qwen2, Qwen3, Qwen3-MoE, Command-R, Qwen3.5, Gemma 4); give the numbers instead",
        did_you_mean(class, PLANNED)
    )]
    UnplannedArchitecture {
        /// The class in `architectures` (`GPT2LMHeadModel`).
        class: String,
    },
    /// A `config.json` key that is not a non-negative integer.
    #[error("config.json: {key} is not a non-negative integer")]
    ConfigNotAnInteger {
        /// The key.
        key: &'static str,
    },
    /// A `config.json` without a required key.
    #[error("config.json has no {key}")]
    ConfigMissing {
        /// The key.
        key: &'static str,
    },
    /// A MoE `config.json` without an expert count.
    #[error("config.json has no num_local_experts / num_experts")]
    ConfigNoExperts,
    /// A `config.json` count that does not fit u32.
    #[error("config.json: {key} is {value}, too large")]
    ConfigTooLarge {
        /// The key.
        key: &'static str,
        /// Its value.
        value: u64,
    },
    /// A size outside the range models have.
    #[error("{what} is {value}; expected {lo} to {hi}")]
    OutOfRange {
        /// Which size (`hidden size`).
        what: &'static str,
        /// Its value.
        value: u64,
        /// The smallest allowed.
        lo: u64,
        /// The largest allowed.
        hi: u64,
    },
    /// A MoE shape using none, or more than all, of its experts.
    #[error("{used} experts used of {experts}: expected 1 to {experts}")]
    ExpertsUsed {
        /// Experts each token uses.
        used: u32,
        /// Experts per layer.
        experts: u32,
    },
    /// A dense shape without an FFN.
    #[error("the FFN width is 0")]
    NoFfn,
    /// A Gemma 4 variant with parts the tensor table does not hold.
    #[error(
        "{what} (Gemma 4 E2B/E4B) are not planned yet; the dense 31B and the 26B-A4B mixture are"
    )]
    UnplannedGemma4 {
        /// What the config has (`per-layer token embeddings`).
        what: &'static str,
    },
    /// More weights than [`MAX_WEIGHTS`].
    #[error(
        "the shape has {weights} weights; expected at most {} (2^44)",
        MAX_WEIGHTS
    )]
    TooManyWeights {
        /// The shape's weights.
        weights: u128,
    },
}

/// Why the weights of a choice (or of a file as stored) cannot be counted.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WeightsError {
    /// llama.cpp's type rules cannot choose a tensor's type.
    #[error(transparent)]
    Mix(#[from] MixError),
    /// A tensor's shape cannot be stored in its type.
    #[error("{tensor}: {error}")]
    Size {
        /// The tensor.
        tensor: String,
        /// Why.
        error: ShapeError,
    },
}

/// One tensor: name, GGUF shape and stored type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorShape {
    /// GGUF name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in GGUF order (row length first).
    pub dims: Vec<u64>,
    /// Type before quantization (F32 for vectors, F16 for matrices of a
    /// converted model).
    pub ty: GgmlType,
}

impl TensorShape {
    /// Number of weights.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Most weights a [`Shape`] may have (2^44, about 17.6 trillion): sums of
/// tensor sizes, bytes and footprints then stay far inside u64.
pub const MAX_WEIGHTS: u128 = 1 << 44;

/// The hyper-parameters that decide tensor shapes and the KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// llama.cpp's architecture name (`llama`, `qwen2`, `qwen3`, `qwen3moe`, `command-r`).
    pub arch: String,
    /// Transformer blocks.
    pub n_layer: u32,
    /// Hidden size.
    pub n_embd: u64,
    /// Dense FFN width (unused when every layer is MoE).
    pub n_ff: u64,
    /// Query heads.
    pub n_head: u32,
    /// Key/value heads.
    pub n_head_kv: u32,
    /// Size of one attention head.
    pub head_dim: u64,
    /// Vocabulary size.
    pub n_vocab: u64,
    /// Experts per MoE layer (0 for a dense model).
    pub n_expert: u32,
    /// Experts each token uses.
    pub n_expert_used: u32,
    /// FFN width of one expert.
    pub n_ff_expert: u64,
    /// The output head reuses the token embeddings.
    pub tied_embeddings: bool,
    /// Training context length (0 when unknown).
    pub ctx_train: u64,
    /// FFN width of a shared expert beside the routed ones (0: none).
    pub n_ff_shared: u64,
    /// Multi-token-prediction blocks stored after the `n_layer` that run
    /// (Qwen3.5's `nextn_predict_layers`): in the file, never read by a
    /// decoded token.
    pub n_nextn: u32,
    /// The linear-attention layers of a hybrid stack (Qwen3.5): their sizes.
    pub linear: Option<LinearDims>,
    /// Which of the `n_layer` blocks are linear-attention layers (empty: none).
    pub recurrent: Vec<bool>,
    /// Gemma 4's layer kinds and global heads (`head_dim` and `n_head_kv`
    /// are then the sliding-window layers').
    pub gemma: Option<GemmaDims>,
    /// Tokens a sliding-window layer sees (0: no such layers).
    pub window: u64,
}

/// Positions a sliding-window layer's cache holds beyond its window: one
/// micro-batch (memwall's ring; llama.cpp's default `n_ubatch`, its SWA
/// cache padded to 256 more).
pub const SWA_UBATCH: u64 = 512;

/// One attention layer's cache: KV heads, head size, and the window it sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionLayer {
    /// Key/value heads.
    pub n_head_kv: u64,
    /// Head size.
    pub head_dim: u64,
    /// Tokens it sees (`None`: all).
    pub window: Option<u64>,
}

impl Shape {
    /// A dense model.
    #[allow(clippy::too_many_arguments)]
    pub fn dense(
        arch: &str,
        n_layer: u32,
        n_embd: u64,
        n_ff: u64,
        n_head: u32,
        n_head_kv: u32,
        head_dim: u64,
        n_vocab: u64,
        tied_embeddings: bool,
    ) -> Shape {
        Shape {
            arch: arch.to_owned(),
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_expert: 0,
            tied_embeddings,
            ctx_train: 0,
            n_ff_shared: 0,
            n_nextn: 0,
            linear: None,
            recurrent: Vec::new(),
            gemma: None,
            window: 0,
        }
    }

    /// Reads the shape from GGUF metadata and the tensor list.
    pub fn from_gguf(model: &memwall_format::gguf::GgufModel) -> Result<Shape, ModelShapeError> {
        use memwall_format::model_info::HyperParams;
        let meta = model.metadata();
        let hp = HyperParams::try_from(meta)?;
        let arch = hp.architecture.clone();
        let has = |name: &str| model.tensors().any(|(_, t)| t.name == name);
        let n_vocab = match hp.vocab_size {
            Some(v) => v,
            None => model
                .tensors()
                .find(|(_, t)| t.name == "token_embd.weight")
                .and_then(|(_, t)| t.dims.get(1).copied())
                .ok_or(ModelShapeError::NoVocabulary)?,
        };
        let small = |value: u64, key: &'static str| {
            u32::try_from(value).map_err(|_| ModelShapeError::TooLarge { key, value })
        };
        let linear = match (
            hp.ssm_conv_kernel,
            hp.ssm_group_count,
            hp.ssm_state_size,
            hp.ssm_time_step_rank,
            hp.ssm_inner_size,
        ) {
            (
                Some(conv_kernel),
                Some(n_k_heads),
                Some(head_k_dim),
                Some(n_v_heads),
                Some(inner),
            ) if n_v_heads > 0 => Some(LinearDims {
                conv_kernel,
                n_k_heads,
                head_k_dim,
                n_v_heads,
                head_v_dim: inner / n_v_heads,
            }),
            _ => None,
        };
        let n_layer = hp.n_layer();
        let recurrent = match linear {
            Some(_) => (0..n_layer).map(|l| hp.is_recurrent(l)).collect(),
            None => Vec::new(),
        };
        // Gemma 4: the sliding-window layers' heads are the shape's, the
        // global ones' (wider, and with values that are their keys when they
        // have no attn_v) its gemma part.
        let sliding = hp
            .sliding_window_pattern
            .clone()
            .filter(|_| arch == "gemma4");
        let (head_dim, n_head_kv, gemma) = match sliding {
            Some(sliding) => {
                let kv_of = |l: usize| {
                    hp.head_count_kv_layers
                        .as_ref()
                        .and_then(|v| v.get(l).copied())
                        .unwrap_or(hp.head_count_kv)
                };
                let first = |want: bool| sliding.iter().position(|&s| s == want).unwrap_or(0);
                let (global, swa_kv) = (first(false), kv_of(first(true)));
                let g = GemmaDims {
                    global_head_dim: hp.head_dim(),
                    global_kv_heads: kv_of(global),
                    k_eq_v: !has(&format!("blk.{global}.attn_v.weight")),
                    sliding,
                };
                (hp.key_length_swa.unwrap_or(hp.head_dim()), swa_kv, Some(g))
            }
            None => (hp.head_dim(), hp.head_count_kv, None),
        };
        Ok(Shape {
            window: hp.sliding_window.filter(|_| gemma.is_some()).unwrap_or(0),
            gemma,
            n_layer: small(n_layer, "block_count")?,
            n_nextn: small(hp.block_count - n_layer, "nextn_predict_layers")?,
            n_ff_shared: hp.expert_shared_feed_forward_length.unwrap_or(0),
            linear,
            recurrent,
            n_embd: hp.embedding_length,
            n_ff: hp.feed_forward_length.unwrap_or(0),
            n_head: small(hp.head_count, "head_count")?,
            n_head_kv: small(n_head_kv, "head_count_kv")?,
            head_dim,
            n_vocab,
            n_expert: small(hp.expert_count.unwrap_or(0), "expert_count")?,
            n_expert_used: small(hp.expert_used_count.unwrap_or(0), "expert_used_count")?,
            n_ff_expert: hp.expert_feed_forward_length.unwrap_or(0),
            tied_embeddings: !has("output.weight"),
            ctx_train: hp.context_length,
            arch,
        })
    }

    /// Reads the shape from a Hugging Face `config.json` (with transformers'
    /// defaults filled in), for the architectures memwall converts.
    pub fn from_hf_config(config: &serde_json::Value) -> Result<Shape, ModelShapeError> {
        let class = config["architectures"][0]
            .as_str()
            .ok_or(ModelShapeError::NoArchitectures)?;
        let (arch, moe) = match class {
            "Qwen3_5ForCausalLM" | "Qwen3_5ForConditionalGeneration" => ("qwen35", false),
            "Qwen3_5MoeForCausalLM" | "Qwen3_5MoeForConditionalGeneration" => ("qwen35moe", true),
            "LlamaForCausalLM" | "MistralForCausalLM" => ("llama", false),
            "MixtralForCausalLM" => ("llama", true),
            "Qwen2ForCausalLM" => ("qwen2", false),
            "Qwen3ForCausalLM" => ("qwen3", false),
            "Qwen3MoeForCausalLM" => ("qwen3moe", true),
            "CohereForCausalLM" => ("command-r", false),
            "Gemma4ForCausalLM" | "Gemma4ForConditionalGeneration" => ("gemma4", false),
            other => {
                return Err(ModelShapeError::UnplannedArchitecture {
                    class: other.to_owned(),
                });
            }
        };
        let text = config.get("text_config").unwrap_or(config);
        let num = |key: &'static str| -> Result<Option<u64>, ModelShapeError> {
            match text.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or(ModelShapeError::ConfigNotAnInteger { key }),
            }
        };
        let need = |key: &'static str| num(key)?.ok_or(ModelShapeError::ConfigMissing { key });
        let n_embd = need("hidden_size")?;
        let n_head = need("num_attention_heads")?;
        let n_head_kv = num("num_key_value_heads")?.unwrap_or(n_head);
        let head_dim = match num("head_dim")? {
            Some(d) => d,
            // Qwen3_5TextConfig's default.
            None if arch.starts_with("qwen35") => 256,
            None => n_embd / n_head.max(1),
        };
        let gemma = arch == "gemma4";
        // Gemma 4's experts come beside its dense MLP (enable_moe_block).
        let moe = moe
            || (gemma
                && text
                    .get("enable_moe_block")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(false));
        let n_expert = if moe {
            num("num_local_experts")?
                .or(num("num_experts")?)
                .ok_or(ModelShapeError::ConfigNoExperts)?
        } else {
            0
        };
        let n_ff = num("intermediate_size")?.unwrap_or(0);
        let n_ff_expert = if moe {
            num("moe_intermediate_size")?.unwrap_or(n_ff)
        } else {
            0
        };
        let tied_default = arch == "command-r";
        let hybrid = arch.starts_with("qwen35");
        let n_layer = need("num_hidden_layers")?;
        // Qwen3.5: transformers' defaults (Qwen3_5TextConfig) for what a
        // config leaves out, the converter's multi-token-prediction blocks.
        let (linear, recurrent, n_nextn, n_ff_shared) = if hybrid {
            let or = |key: &'static str, default: u64| -> Result<u64, ModelShapeError> {
                Ok(num(key)?.unwrap_or(default))
            };
            let linear = LinearDims {
                conv_kernel: or("linear_conv_kernel_dim", 4)?,
                n_k_heads: or("linear_num_key_heads", 16)?,
                head_k_dim: or("linear_key_head_dim", 128)?,
                n_v_heads: or("linear_num_value_heads", 32)?,
                head_v_dim: or("linear_value_head_dim", 128)?,
            };
            let recurrent = match text
                .get("layer_types")
                .and_then(serde_json::Value::as_array)
            {
                Some(types) => types
                    .iter()
                    .map(|t| t.as_str() == Some("linear_attention"))
                    .collect(),
                None => recurrent_every(n_layer, or("full_attention_interval", 4)?),
            };
            let shared = if moe {
                or("shared_expert_intermediate_size", 512)?
            } else {
                0
            };
            (
                Some(linear),
                recurrent,
                or("mtp_num_hidden_layers", 0)?,
                shared,
            )
        } else {
            (None, Vec::new(), 0, 0)
        };
        let small = |value: u64, key: &'static str| {
            u32::try_from(value).map_err(|_| ModelShapeError::ConfigTooLarge { key, value })
        };
        let (gemma, window) = if gemma {
            if num("hidden_size_per_layer_input")?.unwrap_or(0) > 0 {
                return Err(ModelShapeError::UnplannedGemma4 {
                    what: "per-layer token embeddings",
                });
            }
            if num("num_kv_shared_layers")?.unwrap_or(0) > 0 {
                return Err(ModelShapeError::UnplannedGemma4 {
                    what: "layers sharing another layer's KV cache",
                });
            }
            let sliding: Vec<bool> = match text.get("layer_types").and_then(|t| t.as_array()) {
                Some(types) => types
                    .iter()
                    .map(|t| t.as_str() == Some("sliding_attention"))
                    .collect(),
                None => return Err(ModelShapeError::ConfigMissing { key: "layer_types" }),
            };
            let k_eq_v = text
                .get("attention_k_eq_v")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false);
            let g = GemmaDims {
                global_head_dim: num("global_head_dim")?.unwrap_or(head_dim),
                global_kv_heads: num("num_global_key_value_heads")?.unwrap_or(n_head_kv),
                k_eq_v,
                sliding,
            };
            (Some(g), need("sliding_window")?)
        } else {
            (None, 0)
        };
        let shape = Shape {
            gemma,
            window,
            arch: arch.to_owned(),
            n_layer: small(n_layer, "num_hidden_layers")?,
            n_nextn: small(n_nextn, "mtp_num_hidden_layers")?,
            n_ff_shared,
            linear,
            recurrent,
            n_embd,
            n_ff,
            n_head: small(n_head, "num_attention_heads")?,
            n_head_kv: small(n_head_kv, "num_key_value_heads")?,
            head_dim,
            n_vocab: need("vocab_size")?,
            n_expert: small(n_expert, "num_experts")?,
            n_expert_used: small(
                if moe {
                    num("num_experts_per_tok")?
                        .or(num("top_k_experts")?)
                        .unwrap_or(if arch == "qwen35moe" { 8 } else { 2 })
                } else {
                    0
                },
                "num_experts_per_tok",
            )?,
            n_ff_expert,
            tied_embeddings: text
                .get("tie_word_embeddings")
                .and_then(serde_json::Value::as_bool)
                .or_else(|| {
                    config
                        .get("tie_word_embeddings")
                        .and_then(serde_json::Value::as_bool)
                })
                .unwrap_or(tied_default),
            ctx_train: num("max_position_embeddings")?.unwrap_or(0),
        };
        shape.check()?;
        Ok(shape)
    }

    /// Refuses shapes no model has (zero sizes, absurd counts): the planner's
    /// arithmetic then never overflows.
    pub fn check(&self) -> Result<(), ModelShapeError> {
        let fields = [
            ("layers", u64::from(self.n_layer), 1, 4096),
            ("hidden size", self.n_embd, 1, 1 << 20),
            ("heads", u64::from(self.n_head), 1, 4096),
            ("KV heads", u64::from(self.n_head_kv), 1, 4096),
            ("head size", self.head_dim, 1, 1 << 16),
            ("vocabulary", self.n_vocab, 1, 1 << 24),
            ("FFN width", self.n_ff, 0, 1 << 22),
            ("experts", u64::from(self.n_expert), 0, 4096),
            ("expert FFN width", self.n_ff_expert, 0, 1 << 22),
        ];
        for (what, value, lo, hi) in fields {
            if value < lo || value > hi {
                return Err(ModelShapeError::OutOfRange {
                    what,
                    value,
                    lo,
                    hi,
                });
            }
        }
        if self.n_expert > 0 && (self.n_expert_used == 0 || self.n_expert_used > self.n_expert) {
            return Err(ModelShapeError::ExpertsUsed {
                used: self.n_expert_used,
                experts: self.n_expert,
            });
        }
        if self.n_expert == 0 && self.n_ff == 0 {
            return Err(ModelShapeError::NoFfn);
        }
        if let Some(g) = &self.gemma {
            let kinds = g.sliding.len() as u64;
            if kinds != u64::from(self.n_layer) {
                return Err(ModelShapeError::OutOfRange {
                    what: "layer kinds (layer_types)",
                    value: kinds,
                    lo: u64::from(self.n_layer),
                    hi: u64::from(self.n_layer),
                });
            }
            for (what, value) in [
                ("global head size", g.global_head_dim),
                ("global KV heads", g.global_kv_heads),
            ] {
                if !(1..=1 << 16).contains(&value) {
                    return Err(ModelShapeError::OutOfRange {
                        what,
                        value,
                        lo: 1,
                        hi: 1 << 16,
                    });
                }
            }
        }
        // Each bound above keeps one tensor's size within u64, but not the sums
        // over all of them (4096 layers of 4096 experts of 2^20 × 2^22 weights
        // is about 2^67); the largest published models have about 2^41 weights.
        let weights = self.weight_count();
        if weights > MAX_WEIGHTS {
            return Err(ModelShapeError::TooManyWeights { weights });
        }
        Ok(())
    }

    /// Weights of [`Shape::tensors`] (no overflow: u128 over bounded fields).
    fn weight_count(&self) -> u128 {
        let e = u128::from(self.n_embd);
        // Gemma 4's global layers: heads possibly wider, and more of them.
        let (head, kv_heads) = match &self.gemma {
            Some(g) => (
                self.head_dim.max(g.global_head_dim),
                u64::from(self.n_head_kv).max(g.global_kv_heads),
            ),
            None => (self.head_dim, u64::from(self.n_head_kv)),
        };
        let head = u128::from(head);
        let q = u128::from(self.n_head) * head;
        let kv = u128::from(kv_heads) * head;
        let dense = 3 * e * u128::from(self.n_ff);
        let ffn = if self.n_expert > 0 {
            let x = u128::from(self.n_expert);
            // Gemma 4 runs its dense MLP beside the experts.
            let beside = if self.gemma.is_some() { dense } else { 0 };
            e * x + 3 * e * u128::from(self.n_ff_expert) * x + beside
        } else {
            dense
        };
        // Attention matrices, norms, biases and q/k norms (an upper bound for
        // the architectures that have fewer), then the FFN.
        let layer = 2 * e * q + 2 * e * kv + 2 * e + q + 2 * kv + 2 * head + ffn;
        let heads = if self.tied_embeddings { 1 } else { 2 };
        u128::from(self.n_layer) * layer + heads * e * u128::from(self.n_vocab) + e
    }

    /// What llama.cpp's mixing rules need to know.
    pub fn facts(&self) -> ModelFacts {
        ModelFacts {
            arch: self.arch.clone(),
            // llama.cpp's rules count every block in the file.
            n_layer: self.n_layer + self.n_nextn,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            n_expert: self.n_expert,
        }
    }

    /// Layers with a KV cache: all but a hybrid stack's linear-attention layers.
    pub fn attention_layers(&self) -> u32 {
        let linear = self.recurrent.iter().filter(|&&r| r).count() as u32;
        self.n_layer.saturating_sub(linear)
    }

    /// The layers with a KV cache, in order.
    pub fn attention_caches(&self) -> Vec<AttentionLayer> {
        let plain = AttentionLayer {
            n_head_kv: u64::from(self.n_head_kv),
            head_dim: self.head_dim,
            window: None,
        };
        if let Some(g) = &self.gemma {
            return (g.sliding.iter())
                .map(|&sliding| {
                    if sliding {
                        AttentionLayer {
                            window: Some(self.window),
                            ..plain
                        }
                    } else {
                        AttentionLayer {
                            n_head_kv: if g.k_eq_v {
                                g.global_kv_heads
                            } else {
                                plain.n_head_kv
                            },
                            head_dim: g.global_head_dim,
                            window: None,
                        }
                    }
                })
                .collect();
        }
        vec![plain; self.attention_layers() as usize]
    }

    /// KV cache bytes per token of context, of the layers that keep every
    /// token (a sliding-window layer's cache stops growing: [`Shape::kv_bytes`]).
    pub fn kv_bytes_per_token(&self, kv: KvType) -> u64 {
        let per_token: u64 = (self.attention_caches().iter())
            .filter(|l| l.window.is_none())
            .map(|l| 2 * l.n_head_kv * l.head_dim)
            .sum();
        kv.bytes(per_token)
    }

    /// KV cache bytes with `ctx` tokens in the context: each attention
    /// layer's keys and values per token, a sliding-window layer's for at
    /// most its window and one micro-batch ([`SWA_UBATCH`]).
    pub fn kv_bytes(&self, kv: KvType, ctx: u64) -> u64 {
        let values: u64 = (self.attention_caches().iter())
            .map(|l| {
                let held = l.window.map_or(ctx, |w| ctx.min(w + SWA_UBATCH));
                2 * l.n_head_kv * l.head_dim * held
            })
            .sum();
        kv.bytes(values)
    }

    /// Multiply-adds of one decoded token's attention with `kv_tokens` in the
    /// cache (`q·k` and `p·v`: two per head dimension and key seen).
    pub fn attention_ops(&self, kv_tokens: u64) -> u64 {
        (self.attention_caches().iter())
            .map(|l| {
                let seen = l.window.map_or(kv_tokens, |w| kv_tokens.min(w));
                2 * u64::from(self.n_head) * l.head_dim * seen
            })
            .sum()
    }

    /// Bytes of the linear-attention layers' state, whatever the context
    /// (`f32`: the convolution's last inputs and each value head's
    /// `head_k_dim × head_v_dim` matrix per layer, as llama.cpp keeps them).
    pub fn recurrent_state_bytes(&self) -> u64 {
        let Some(l) = self.linear else {
            return 0;
        };
        let channels = 2 * l.n_k_heads * l.head_k_dim + l.n_v_heads * l.head_v_dim;
        let per_layer =
            l.conv_kernel.saturating_sub(1) * channels + l.n_v_heads * l.head_k_dim * l.head_v_dim;
        let layers = self.recurrent.iter().filter(|&&r| r).count() as u64;
        4 * per_layer * layers
    }

    /// Units of fixed per-token cost of one decoded token: each matrix
    /// product (four attention projections and three FFN products per layer;
    /// per used expert, plus the router, in MoE layers; the output head) and
    /// each attention head of each layer (a task of its own in the runtime).
    pub fn dispatches_per_token(&self) -> u64 {
        let mut ffn = if self.n_expert > 0 {
            3 * u64::from(self.n_expert_used) + 1
        } else {
            3
        };
        if self.n_ff_shared > 0 {
            ffn += 4;
        }
        if self.gemma.is_some() && self.n_expert > 0 {
            // The dense MLP beside the experts.
            ffn += 3;
        }
        // A linear-attention layer has five products and one task per value head.
        let attention = u64::from(self.attention_layers()) * (4 + ffn + u64::from(self.n_head));
        let linear = u64::from(self.n_layer - self.attention_layers())
            * (5 + ffn + self.linear.map_or(0, |l| l.n_v_heads));
        attention + linear + 1
    }

    /// The tensors llama.cpp's converter writes for this shape (F16 matrices,
    /// F32 vectors), in llama.cpp's order.
    pub fn tensors(&self) -> Vec<TensorShape> {
        // Architectures without a table of their own (a GGUF file of another
        // family) are counted with Llama's tensors.
        let arch = Arch::from_name(&self.arch).unwrap_or(Arch::Llama);
        let dims = Dims {
            n_layer: u64::from(self.n_layer),
            n_embd: self.n_embd,
            n_head: u64::from(self.n_head),
            n_head_kv: u64::from(self.n_head_kv),
            head_dim: self.head_dim,
            n_ff: self.n_ff,
            n_expert: u64::from(self.n_expert),
            n_ff_expert: self.n_ff_expert,
            n_vocab: self.n_vocab,
            tied_embeddings: self.tied_embeddings,
            n_ff_shared: self.n_ff_shared,
            linear: self.linear,
            recurrent: self.recurrent.clone(),
            n_nextn: u64::from(self.n_nextn),
            gemma: self.gemma.clone(),
        };
        let mut out: Vec<TensorShape> = arch
            .tensors(&dims)
            .into_iter()
            .map(|Slot { name, dims }| {
                // The converter keeps vectors, the routers and the convolutions in F32.
                let ty = if dims.len() > 1
                    && !name.contains("ffn_gate_inp")
                    && !name.contains("ssm_conv1d")
                {
                    GgmlType::F16
                } else {
                    GgmlType::F32
                };
                TensorShape { name, dims, ty }
            })
            .collect();
        out.sort_by(|a, b| llama_order(&a.name, &b.name));
        out
    }
}

/// The tensors of a GGUF file, in llama.cpp's order.
pub fn gguf_tensors(model: &memwall_format::gguf::GgufModel) -> Vec<TensorShape> {
    let mut out: Vec<TensorShape> = model
        .tensors()
        .map(|(_, t)| TensorShape {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        })
        .collect();
    out.sort_by(|a, b| llama_order(&a.name, &b.name));
    out
}

/// A quantization choice: a llama.cpp file type or a recipe.
#[derive(Clone, Debug)]
pub struct Choice {
    /// What the user types: `Q4_K_M`, `attn-f16-ffn-q4`, a recipe's name.
    pub label: String,
    /// The file type (a recipe's base).
    pub ftype: &'static FileTypeInfo,
    /// The recipe, when the choice is one.
    pub recipe: Option<Recipe>,
}

/// The file types `memwall plan` lists by default, largest first.
pub const DEFAULT_TYPES: [&str; 11] = [
    "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "IQ4_XS", "Q3_K_M", "Q3_K_S",
    "Q2_K",
];

impl Choice {
    /// A file type (`Q4_K_M`) or a built-in recipe (`attn-f16-ffn-q4`) by name.
    pub fn by_name(name: &str) -> Option<Choice> {
        if let Some(ftype) = file_type_by_name(name) {
            return Some(Choice {
                label: ftype.name.to_owned(),
                ftype,
                recipe: None,
            });
        }
        Recipe::preset(name).map(Choice::recipe)
    }

    /// A recipe.
    pub fn recipe(recipe: Recipe) -> Choice {
        Choice {
            label: recipe.name.clone(),
            ftype: recipe.base,
            recipe: Some(recipe),
        }
    }

    /// Every default file type, then every built-in recipe.
    pub fn defaults() -> Vec<Choice> {
        let mut out: Vec<Choice> = DEFAULT_TYPES
            .iter()
            .filter_map(|n| Choice::by_name(n))
            .collect();
        out.extend(
            crate::recipe::PRESETS
                .iter()
                .filter_map(|(n, _)| Choice::by_name(n)),
        );
        out
    }

    /// The weights this choice gives the tensors (llama-quantize's mix without
    /// an importance matrix, with the recipe's rules on top).
    pub fn weights(
        &self,
        facts: &ModelFacts,
        tensors: &[TensorShape],
    ) -> Result<Weights, WeightsError> {
        let recipe = self.recipe.as_ref();
        let options = MixOptions {
            ftype: self.ftype,
            pure: false,
            has_imatrix: false,
            output_type: recipe.and_then(|r| r.output),
            token_embedding_type: recipe.and_then(|r| r.token_embedding),
            leave_output: false,
            overrides: recipe.map(|r| r.rules.clone()).unwrap_or_default(),
        };
        let mut mixer = Mixer::new(
            facts.clone(),
            options,
            tensors.iter().map(|t| t.name.as_str()),
        );
        let mut parts = Vec::with_capacity(tensors.len());
        let kinds = Kind::all(tensors);
        for (t, kind) in tensors.iter().zip(kinds) {
            let choice = mixer.choose(&t.name, &t.dims, t.ty)?;
            let bytes = choice
                .ty
                .tensor_size(&t.dims)
                .map_err(|error| WeightsError::Size {
                    tensor: t.name.clone(),
                    error,
                })?;
            let bytes = bytes.bytes;
            parts.push(Part {
                ty: choice.ty,
                elements: t.elements(),
                bytes,
                kind,
            });
        }
        Ok(Weights { parts })
    }
}

/// What a tensor is to the decode loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Token embeddings: one row read per token (all of it when tied to the output).
    Embedding,
    /// The output head.
    Output,
    /// A routed expert stack: a token reads `used / n_expert` of it.
    Expert,
    /// Any other matrix: read whole for every token.
    Matrix,
    /// Norms and biases.
    Vector,
    /// A multi-token-prediction block's tensor: stored, never read by the
    /// forward pass.
    Idle,
}

impl Kind {
    /// The role of every tensor of a model: [`Kind::of`], and
    /// [`Kind::Idle`] for every tensor of a block that holds `nextn.*`
    /// tensors.
    pub fn all(tensors: &[TensorShape]) -> Vec<Kind> {
        let block = |name: &str| -> Option<u64> {
            name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
        };
        let nextn: std::collections::BTreeSet<u64> = tensors
            .iter()
            .filter(|t| t.name.contains(".nextn."))
            .filter_map(|t| block(&t.name))
            .collect();
        tensors
            .iter()
            .map(|t| match block(&t.name) {
                Some(b) if nextn.contains(&b) => Kind::Idle,
                _ => Kind::of(t),
            })
            .collect()
    }

    /// The role of `t`.
    pub fn of(t: &TensorShape) -> Kind {
        match Category::of(&t.name) {
            Category::TokenEmbd => Kind::Embedding,
            Category::Output => Kind::Output,
            _ if t.name.contains("_exps.") => Kind::Expert,
            _ if t.dims.len() > 1 => Kind::Matrix,
            _ => Kind::Vector,
        }
    }
}

/// One tensor of a quantized model.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    /// Its type after quantization.
    pub ty: GgmlType,
    /// Weights.
    pub elements: u64,
    /// Bytes.
    pub bytes: u64,
    /// Its role.
    pub kind: Kind,
}

/// Weight bytes of a quantized model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Weights {
    /// Every tensor.
    pub parts: Vec<Part>,
}

impl Weights {
    /// The weights of `tensors` as they are stored (a GGUF file's own types).
    pub fn as_stored(tensors: &[TensorShape]) -> Result<Weights, WeightsError> {
        let parts = tensors
            .iter()
            .zip(Kind::all(tensors))
            .map(|(t, kind)| {
                let size =
                    t.ty.tensor_size(&t.dims)
                        .map_err(|error| WeightsError::Size {
                            tensor: t.name.clone(),
                            error,
                        })?;
                Ok(Part {
                    ty: t.ty,
                    elements: t.elements(),
                    bytes: size.bytes,
                    kind,
                })
            })
            .collect::<Result<Vec<_>, WeightsError>>()?;
        Ok(Weights { parts })
    }

    /// All tensor bytes.
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    /// All weights.
    pub fn elements(&self) -> u64 {
        self.parts.iter().map(|p| p.elements).sum()
    }

    /// Bits per weight over all tensors.
    pub fn bits_per_weight(&self) -> f64 {
        self.bytes() as f64 * 8.0 / self.elements().max(1) as f64
    }

    /// Bytes per ggml type, largest first.
    pub fn by_type(&self) -> Vec<(GgmlType, u64)> {
        let mut out: Vec<(GgmlType, u64)> = Vec::new();
        for p in &self.parts {
            match out.iter_mut().find(|(t, _)| *t == p.ty) {
                Some(slot) => slot.1 += p.bytes,
                None => out.push((p.ty, p.bytes)),
            }
        }
        out.sort_by_key(|t| std::cmp::Reverse(t.1));
        out
    }

    fn tied(&self) -> bool {
        !self.parts.iter().any(|p| p.kind == Kind::Output)
    }

    /// The share of a part one decoded token reads, for a model whose tokens
    /// use `used` of `n_expert` experts.
    fn share(&self, p: &Part, n_expert: u32, used: u32) -> f64 {
        match p.kind {
            Kind::Embedding if self.tied() => 1.0,
            // One row of the vocabulary: negligible.
            Kind::Embedding => 0.0,
            Kind::Expert if n_expert > 0 => f64::from(used) / f64::from(n_expert),
            Kind::Idle => 0.0,
            _ => 1.0,
        }
    }

    /// Weight bytes one decoded token reads.
    pub fn bytes_per_token(&self, n_expert: u32, used: u32) -> u64 {
        self.parts
            .iter()
            .map(|p| (p.bytes as f64 * self.share(p, n_expert, used)).round() as u64)
            .sum()
    }

    /// Bytes one decoded token reads from storage when `resident` bytes of
    /// the weights stay in RAM, as memwall streams them. A dense model reads
    /// the share of its per-token bytes that is not resident. A mixture of
    /// experts keeps its dense matrices first and caches experts in what is
    /// left (at least `used + 2` of them): it reads the routed experts that
    /// miss the cache, [`expert_miss_rate`] of them, and the dense matrices
    /// that did not fit.
    pub fn streamed_bytes_per_token(&self, n_expert: u32, used: u32, resident: u64) -> u64 {
        let total = self.bytes();
        if resident >= total || total == 0 {
            return 0;
        }
        let sum = |keep: &dyn Fn(&Part) -> bool| -> u64 {
            self.parts.iter().filter(|p| keep(p)).map(|p| p.bytes).sum()
        };
        let experts = sum(&|p| p.kind == Kind::Expert);
        if n_expert == 0 || used == 0 || experts == 0 {
            let share = (total - resident) as f64 / total as f64;
            return (self.bytes_per_token(n_expert, used) as f64 * share).round() as u64;
        }
        // What streaming pins: matrices read whole by every token.
        let dense = sum(&|p| self.share(p, n_expert, used) >= 1.0 && p.kind != Kind::Vector);
        if resident >= dense + experts {
            return 0;
        }
        // Gate, up and down stacks per MoE layer.
        let stacks = self.parts.iter().filter(|p| p.kind == Kind::Expert).count() as u64;
        let bundles = (stacks / 3).max(1) * u64::from(n_expert);
        let bundle = experts / bundles;
        let min_cache = (u64::from(used) + 2).min(bundles) * bundle;
        let pinned = resident.saturating_sub(min_cache).min(dense);
        let cache = resident.saturating_sub(pinned).max(min_cache).min(experts);
        let routed = experts as f64 * f64::from(used) / f64::from(n_expert);
        let miss = expert_miss_rate(cache as f64 / experts as f64);
        (routed * miss).round() as u64 + (dense - pinned)
    }

    /// Weights one decoded token multiplies, per type.
    pub fn products_per_token(&self, n_expert: u32, used: u32) -> Vec<(GgmlType, u64)> {
        let mut out: Vec<(GgmlType, u64)> = Vec::new();
        for p in self.parts.iter().filter(|p| p.kind != Kind::Vector) {
            let n = (p.elements as f64 * self.share(p, n_expert, used)).round() as u64;
            if n == 0 {
                continue;
            }
            match out.iter_mut().find(|(t, _)| *t == p.ty) {
                Some(slot) => slot.1 += n,
                None => out.push((p.ty, n)),
            }
        }
        out
    }
}

/// How unevenly a mixture of experts routes, for [`expert_miss_rate`]: the
/// σ of a log-normal expert popularity. σ = 1.28 puts 90 % of the routing in
/// the hottest half of the experts, what llama-imatrix's counts show for
/// Qwen3-30B-A3B (58–65 of 128 experts; docs/BENCHMARKS.md).
pub const ROUTING_SKEW: f64 = 1.28;

/// The share of routed experts a cache of the most used `fraction` of the
/// experts misses, for log-normal popularity of σ [`ROUTING_SKEW`]: its
/// hottest fraction `f` takes `Φ(Φ⁻¹(f) + σ)` of the routing.
pub fn expert_miss_rate(fraction: f64) -> f64 {
    if fraction <= 0.0 {
        return 1.0;
    }
    if fraction >= 1.0 {
        return 0.0;
    }
    1.0 - normal_cdf(inverse_normal_cdf(fraction) + ROUTING_SKEW)
}

/// Φ, from erfc (Numerical Recipes' Chebyshev fit, relative error < 1.2e-7).
fn normal_cdf(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let c = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let poly = c.iter().rev().fold(0.0, |acc, &k| acc * t + k);
    let erfc = t * (-z * z + poly).exp();
    if x >= 0.0 {
        1.0 - 0.5 * erfc
    } else {
        0.5 * erfc
    }
}

/// Φ⁻¹ by bisection on [`normal_cdf`] (the plan needs a few digits).
fn inverse_normal_cdf(p: f64) -> f64 {
    let (mut lo, mut hi) = (-9.0f64, 9.0f64);
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if normal_cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}
