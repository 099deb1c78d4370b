//! Which GGUF tensors a checkpoint becomes, in which order and type, and their
//! bytes: names mapped by the architecture's table, Q/K rows permuted where
//! llama.cpp permutes them, experts stacked into 3-D tensors, values converted
//! through `f32` exactly as llama.cpp's converter does (norms, biases and
//! routers stay F32; Q8_0 falls back to F16 for rows not a multiple of 32).

use std::collections::BTreeMap;

use memwall_format::GgmlType;
use memwall_format::blocks::{bf16_to_f32, f16_to_f32, f32_to_bf16};
use memwall_format::ggml_type::ShapeError;

use crate::arch::{
    Arch, Experts, SKIPPED_SUFFIXES, block_of, gemma4_name, gguf_name_for, mtp_name,
    text_model_name,
};
use crate::checkpoint::{Checkpoint, SourceTensor, SourceType};

/// Why the tensors of a checkpoint could not be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// An MoE config without an expert count (the keys looked for).
    #[error("config.json has none of {0:?}")]
    NoExpertCount(&'static [&'static str]),
    /// An expert of a stacked tensor is missing.
    #[error("missing expert tensor {0}")]
    MissingExpert(String),
    /// Llama 3's rope factors cannot be computed.
    #[error(transparent)]
    RopeFactors(#[from] RopeFactorsError),
    /// Q/K rows are to be permuted but the head count is missing.
    #[error("config.json has no num_attention_heads")]
    NoAttentionHeads,
    /// The config has no layer count (`num_hidden_layers`).
    #[error("config.json has no num_hidden_layers")]
    NoLayerCount,
    /// A linear-attention dimension is missing from the config.
    #[error("config.json has no {0} (or it is 0)")]
    NoLinearKey(&'static str),
    /// Value heads that are no multiple of the key heads.
    #[error(
        "config.json: linear_num_value_heads ({v_heads}) is not a multiple of linear_num_key_heads ({k_heads})"
    )]
    LinearHeads {
        /// Key heads.
        k_heads: usize,
        /// Value heads.
        v_heads: usize,
    },
    /// Tensors the architecture's table does not name.
    #[error("unexpected tensors for {arch}: {}", .tensors.join(", "))]
    UnexpectedTensors {
        /// `general.architecture`.
        arch: &'static str,
        /// The Hugging Face names.
        tensors: Vec<String>,
    },
    /// Stacked experts of another shape than `[experts, rows, columns]`
    /// (`gate_up_proj`: an even number of rows).
    #[error(
        "{tensor} has shape {shape:?}; stacked experts are [experts = {experts}, rows, columns] (gate_up_proj: gate rows then as many up rows)"
    )]
    FusedShape {
        /// The Hugging Face name.
        tensor: String,
        /// Its PyTorch shape.
        shape: Vec<usize>,
        /// The config's expert count.
        experts: usize,
    },
    /// A layer with another number of expert tensors than the config implies.
    #[error("layer {layer} has {found} expert tensors; expected {expected}")]
    ExpertTensors {
        /// The layer.
        layer: usize,
        /// Expert tensors found.
        found: usize,
        /// Expert tensors the config implies.
        expected: usize,
    },
}

/// Why Llama 3's (or Gemma 4's) rope frequency factors cannot be computed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RopeFactorsError {
    /// Gemma 4 without its global layers' head size.
    #[error("config.json has no global_head_dim (nor a per_layer_config giving it)")]
    NoGlobalHeadDim,
    /// Gemma 4 without the full attention layers' partial rotation.
    #[error("config.json: rope_parameters.full_attention has no partial_rotary_factor")]
    NoPartialRotary,
    /// No `head_dim`, and no `hidden_size` to derive it from.
    #[error("config.json has no hidden_size")]
    NoHiddenSize,
    /// No `head_dim`, and no (non-zero) `num_attention_heads` to derive it from.
    #[error("config.json has no num_attention_heads")]
    NoAttentionHeads,
}

/// The error of a [`RowEncoder`]: the quantizer's own error type, boxed (this
/// crate does not depend on the quantizer; the box keeps its type for
/// `downcast_ref`).
pub type RowEncodeError = Box<dyn std::error::Error + Send + Sync>;

/// Why rows of an output tensor could not be produced or encoded. Every
/// variant names the tensor (GGUF name).
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// Rows past the end of a generated tensor.
    #[error("{tensor}: rows out of range")]
    RowsOutOfRange {
        /// The tensor.
        tensor: String,
    },
    /// Rows to permute that do not split into heads of even size.
    #[error("{tensor}: {rows} rows do not split into {heads} heads of even size")]
    Heads {
        /// The tensor.
        tensor: String,
        /// Rows per part.
        rows: usize,
        /// The head count.
        heads: usize,
    },
    /// The float path asked for a type that is not a float type.
    #[error("{tensor}: {} is not a float type", .ty.name())]
    NotFloat {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A NaN or infinite weight (refused unless `--allow-nonfinite`).
    #[error(
        "tensor {tensor} has a non-finite value ({value}) at element {index} (--allow-nonfinite writes it anyway)"
    )]
    NonFinite {
        /// The tensor.
        tensor: String,
        /// The value.
        value: f32,
        /// Its element index in the tensor.
        index: u64,
    },
    /// A shape the output type cannot hold.
    #[error("{tensor}: {error}")]
    Shape {
        /// The tensor.
        tensor: String,
        /// What is wrong with the shape.
        error: ShapeError,
    },
    /// The output buffer does not hold whole rows.
    #[error("{tensor}: rows do not fit the output")]
    RowsDoNotFit {
        /// The tensor.
        tensor: String,
    },
    /// The row encoder failed.
    #[error("{tensor}: {error}")]
    Row {
        /// The tensor.
        tensor: String,
        /// The encoder's error.
        error: RowEncodeError,
    },
}

/// `--outtype`: the type of the 2-D weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    /// Everything F32.
    F32,
    /// Weights F16.
    F16,
    /// Weights BF16.
    BF16,
    /// Weights Q8_0 (F16 where rows are not a multiple of 32).
    Q8_0,
}

impl OutType {
    /// Parses `f32`, `f16`, `bf16`, `q8_0` (any case).
    pub fn parse(s: &str) -> Option<OutType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(OutType::F32),
            "f16" => Some(OutType::F16),
            "bf16" => Some(OutType::BF16),
            "q8_0" => Some(OutType::Q8_0),
            _ => None,
        }
    }

    /// `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            OutType::F32 => 0,
            OutType::F16 => 1,
            OutType::Q8_0 => 7,
            OutType::BF16 => 32,
        }
    }
}

/// One output tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// GGUF name.
    pub name: String,
    /// GGUF shape (`ne[0]` first).
    pub dims: Vec<u64>,
    /// GGUF type.
    pub ty: GgmlType,
    /// Source tensors (indices into [`Checkpoint::tensors`]): one, or one per
    /// expert for a stacked tensor.
    pub parts: Vec<usize>,
    /// Head count for llama.cpp's Q/K row permutation, if it applies.
    pub permute_heads: Option<usize>,
    /// Values computed by the converter rather than read (Llama-3's `rope_freqs`).
    pub generated: Option<Vec<f32>>,
    /// Value heads reordered from grouped by key head to tiled (Qwen3.5's
    /// linear attention), along the rows or the columns.
    pub heads: Option<HeadOrder>,
    /// What is done to every value after it is read.
    pub values: Values,
    /// Rows taken from a stacked source tensor: a fused projection's half.
    pub slice: Option<RowSlice>,
}

/// Output rows read from every `stride` rows of one source tensor: output row
/// `r` is source row `(r / rows) · stride + offset + r % rows` (the gate or up
/// half of each expert of transformers 5's `mlp.experts.gate_up_proj`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSlice {
    /// Output rows per stride.
    pub rows: usize,
    /// Source rows per stride.
    pub stride: usize,
    /// First source row taken in each stride.
    pub offset: usize,
}

/// What the converter does to each value of a tensor (in `f32`, after the
/// source type's exact conversion to `f32`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Values {
    /// Nothing.
    #[default]
    AsRead,
    /// `x + 1`: Qwen3.5's zero-centred norm weights, stored as the factor.
    PlusOne,
    /// `-exp(x)`: a gated delta net's `A_log`, stored as the factor `a`.
    /// Computed correctly rounded; llama.cpp's converter takes PyTorch's
    /// `exp`, whose last bit depends on the CPU MKL runs on (docs/CONVERT.md).
    NegExp,
}

impl Values {
    fn apply(self, x: &mut [f32]) {
        match self {
            Values::AsRead => {}
            Values::PlusOne => x.iter_mut().for_each(|v| *v += 1.0),
            Values::NegExp => x
                .iter_mut()
                .for_each(|v| *v = -(f64::from(*v).exp() as f32)),
        }
    }
}

/// The axis along which [`HeadOrder`] moves value heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// Rows (a projection's outputs, convolution channels).
    Rows,
    /// Columns (the output projection's inputs, a vector's elements).
    Cols,
}

/// llama.cpp's `_reorder_v_heads`: from index `start` on, `k_heads × per_k`
/// heads of `head_dim` stored grouped by key head (`g0v0 g0v1 … g1v0 …`) are
/// written tiled (`g0v0 g1v0 … g0v1 g1v1 …`), so that value head `j` reads
/// key head `j % k_heads`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadOrder {
    /// Which axis moves.
    pub axis: Axis,
    /// First index of the value heads along it.
    pub start: usize,
    /// Key heads.
    pub k_heads: usize,
    /// Value heads per key head.
    pub per_k: usize,
    /// Size of a head along the axis.
    pub head_dim: usize,
}

impl HeadOrder {
    /// The source index of output index `i` along the axis.
    pub fn source(&self, i: usize) -> usize {
        if i < self.start {
            return i;
        }
        let (head, d) = (
            (i - self.start) / self.head_dim,
            (i - self.start) % self.head_dim,
        );
        if head >= self.k_heads * self.per_k {
            return i;
        }
        let (v, g) = (head / self.k_heads, head % self.k_heads);
        self.start + (g * self.per_k + v) * self.head_dim + d
    }

    /// The output index of source index `i` (the inverse of [`HeadOrder::source`]):
    /// the same move with the roles of key and value heads exchanged.
    pub fn target(&self, i: usize) -> usize {
        HeadOrder {
            k_heads: self.per_k,
            per_k: self.k_heads,
            ..*self
        }
        .source(i)
    }
}

fn config_usize(ckpt: &Checkpoint, keys: &[&str]) -> Option<usize> {
    keys.iter()
        .find_map(|k| ckpt.config().get(*k).and_then(|v| v.as_u64()))
        .map(|v| v as usize)
}

/// Plans every output tensor of `ckpt` for `arch`, in llama.cpp's order,
/// with the multi-token-prediction blocks a hybrid checkpoint carries.
pub fn plan(ckpt: &Checkpoint, arch: &Arch, outtype: OutType) -> Result<Vec<Planned>, PlanError> {
    plan_with(ckpt, arch, outtype, true)
}

/// The multi-token-prediction blocks a hybrid (Qwen3.5) checkpoint of this
/// config carries: `mtp_num_hidden_layers`, else as many as its `mtp.layers.M`
/// tensors show (llama.cpp counts them for Qwen3-Next).
pub fn nextn_blocks(ckpt: &Checkpoint, arch: &Arch) -> usize {
    if !arch.hybrid {
        return 0;
    }
    if let Some(n) = config_usize(ckpt, &["mtp_num_hidden_layers"]).filter(|&n| n > 0) {
        return n;
    }
    (ckpt.tensors().iter())
        .filter_map(|t| text_model_name(&t.name))
        .filter_map(|n| {
            let rest = n
                .strip_prefix("model.")
                .unwrap_or(&n)
                .strip_prefix("mtp.layers.")?;
            rest.split('.').next()?.parse::<usize>().ok()
        })
        .map(|m| m + 1)
        .max()
        .unwrap_or(0)
}

/// [`plan`], without the multi-token-prediction blocks when `nextn` is
/// false (llama.cpp's `--no-mtp`).
pub fn plan_with(
    ckpt: &Checkpoint,
    arch: &Arch,
    outtype: OutType,
    nextn: bool,
) -> Result<Vec<Planned>, PlanError> {
    let n_head = config_usize(ckpt, &["num_attention_heads", "n_heads"]);
    let n_head_kv = config_usize(ckpt, &["num_key_value_heads", "n_kv_heads"]).or(n_head);
    let n_experts = arch
        .experts
        .map(|e| config_usize(ckpt, e.count_keys).ok_or(PlanError::NoExpertCount(e.count_keys)))
        .transpose()?;
    let n_layer = config_usize(
        ckpt,
        &["num_hidden_layers", "n_layers", "n_layer", "num_layers"],
    );
    let linear = if arch.hybrid {
        Some(LinearHeads::of(ckpt)?)
    } else {
        None
    };
    // The names llama.cpp maps: other towers of a multimodal checkpoint
    // dropped, `mtp.*` renamed as the blocks after the model's own.
    let mut names: Vec<(String, usize)> = Vec::with_capacity(ckpt.tensors().len());
    for (i, t) in ckpt.tensors().iter().enumerate() {
        let Some(mut name) = text_model_name(&t.name) else {
            continue;
        };
        if arch.gemma {
            name = gemma4_name(&name);
        }
        if arch.hybrid && (name.starts_with("mtp.") || name.starts_with("model.mtp.")) {
            if !nextn {
                continue;
            }
            let n = n_layer.ok_or(PlanError::NoLayerCount)?;
            match mtp_name(&name, n) {
                Some((renamed, _)) => names.push((renamed, i)),
                None => names.push((name, i)),
            }
            continue;
        }
        names.push((name, i));
    }
    let index: BTreeMap<&str, usize> = names.iter().map(|(n, i)| (n.as_str(), *i)).collect();
    // llama.cpp emits generated tensors before the checkpoint's.
    let mut out = Vec::new();
    let factors = if arch.gemma {
        Some(gemma4_rope_factors(ckpt.config())?)
    } else if arch.gguf == "llama" {
        llama3_rope_factors(ckpt.config())?
    } else {
        None
    };
    if let Some(factors) = factors {
        out.push(Planned {
            name: "rope_freqs.weight".into(),
            dims: vec![factors.len() as u64],
            ty: GgmlType::F32,
            parts: Vec::new(),
            permute_heads: None,
            generated: Some(factors),
            heads: None,
            values: Values::AsRead,
            slice: None,
        });
    }
    let mut pending: BTreeMap<usize, usize> = BTreeMap::new();
    let mut unknown = Vec::new();
    for (hf, i) in &names {
        let (hf, i) = (hf.as_str(), *i);
        let t = &ckpt.tensors()[i];
        if SKIPPED_SUFFIXES.iter().any(|s| hf.ends_with(s)) {
            continue;
        }
        if let (Some(experts), Some(n)) = (arch.experts, n_experts) {
            if let Some(layer) = expert_layer(hf, experts.module) {
                let seen = pending.entry(layer).or_insert(0);
                *seen += 1;
                if *seen == n * experts.stacked.len() {
                    for (w, g) in experts.stacked {
                        let mut parts = Vec::with_capacity(n);
                        for x in 0..n {
                            let module = experts.module.replace("{}", &x.to_string());
                            let name = format!("model.layers.{layer}.{module}.{w}.weight");
                            parts.push(
                                *index
                                    .get(name.as_str())
                                    .ok_or(PlanError::MissingExpert(name))?,
                            );
                        }
                        let first = &ckpt.tensors()[parts[0]];
                        let mut dims: Vec<u64> =
                            first.shape.iter().rev().map(|&d| d as u64).collect();
                        dims.push(n as u64);
                        let name = format!("blk.{layer}.{g}.weight");
                        let ty = weight_type(&name, &dims, outtype);
                        out.push(Planned {
                            name,
                            dims,
                            ty,
                            parts,
                            permute_heads: None,
                            generated: None,
                            heads: None,
                            values: Values::AsRead,
                            slice: None,
                        });
                    }
                }
                continue;
            }
            if let Some(layer) = fused_layer(hf, experts) {
                fused(&mut out, ckpt, hf, i, layer, n, outtype)?;
                continue;
            }
        }
        let Some(name) = gguf_name_for(arch, hf) else {
            unknown.push(t.name.clone());
            continue;
        };
        let mut dims: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
        if name.contains(".ssm_conv1d.") {
            // `[channels, 1, taps]` squeezed to `[channels, taps]`.
            dims.retain(|&d| d != 1);
        }
        let ty = weight_type(&name, &dims, outtype);
        let permute_heads = match (arch.permute_qk, hf.rsplit_once('.')) {
            (true, Some((m, _))) if m.ends_with("self_attn.q_proj") => n_head,
            (true, Some((m, _))) if m.ends_with("self_attn.k_proj") => n_head_kv,
            _ => None,
        };
        if arch.permute_qk && permute_heads.is_none() && name.contains(".attn_q.") {
            return Err(PlanError::NoAttentionHeads);
        }
        let (heads, values) = match &linear {
            Some(lin) => (lin.order(hf), hybrid_values(hf)),
            None => (None, Values::AsRead),
        };
        out.push(Planned {
            name,
            dims,
            ty,
            parts: vec![i],
            permute_heads,
            generated: None,
            heads,
            values,
            slice: None,
        });
    }
    if !unknown.is_empty() {
        return Err(PlanError::UnexpectedTensors {
            arch: arch.gguf,
            tensors: unknown,
        });
    }
    if let Some((layer, seen)) = pending
        .iter()
        .find(|&(_, &s)| Some(s) != n_experts.map(|n| n * 3))
    {
        return Err(PlanError::ExpertTensors {
            layer: *layer,
            found: *seen,
            expected: n_experts.unwrap_or(0) * 3,
        });
    }
    Ok(out)
}

/// The block of a stacked expert tensor `model.layers.N.mlp.experts.<proj>`
/// (with or without `.weight`) of a layout that has them.
fn fused_layer(name: &str, experts: &Experts) -> Option<usize> {
    let (n, rest) = block_of(name)?;
    let proj = rest.strip_suffix(".weight").unwrap_or(rest);
    let (module, proj) = proj.rsplit_once('.')?;
    let stacked_module = experts.module.strip_suffix(".{}")?;
    (experts.fused && module == stacked_module && matches!(proj, "gate_up_proj" | "down_proj"))
        .then_some(n)
}

/// Plans transformers 5's stacked experts as llama.cpp's `Qwen2MoeModel`
/// does: `down_proj` `[experts, hidden, ffn]` as it is, `gate_up_proj`
/// `[experts, 2 × ffn, hidden]` split into each expert's first half (gate)
/// and second half (up).
fn fused(
    out: &mut Vec<Planned>,
    ckpt: &Checkpoint,
    hf: &str,
    i: usize,
    layer: usize,
    n_experts: usize,
    outtype: OutType,
) -> Result<(), PlanError> {
    let shape = &ckpt.tensors()[i].shape;
    let gate_up = hf.trim_end_matches(".weight").ends_with("gate_up_proj");
    let bad = || PlanError::FusedShape {
        tensor: hf.to_owned(),
        shape: shape.clone(),
        experts: n_experts,
    };
    if shape.len() != 3 || shape[0] != n_experts || (gate_up && shape[1] % 2 != 0) {
        return Err(bad());
    }
    let mut push = |kind: &str, rows: usize, slice: Option<RowSlice>| {
        let dims = vec![shape[2] as u64, rows as u64, shape[0] as u64];
        let name = format!("blk.{layer}.{kind}.weight");
        let ty = weight_type(&name, &dims, outtype);
        out.push(Planned {
            name,
            dims,
            ty,
            parts: vec![i],
            permute_heads: None,
            generated: None,
            heads: None,
            values: Values::AsRead,
            slice,
        });
    };
    if gate_up {
        let ffn = shape[1] / 2;
        for (kind, offset) in [("ffn_gate_exps", 0), ("ffn_up_exps", ffn)] {
            let slice = RowSlice {
                rows: ffn,
                stride: 2 * ffn,
                offset,
            };
            push(kind, ffn, Some(slice));
        }
    } else {
        push("ffn_down_exps", shape[1], None);
    }
    Ok(())
}

/// What llama.cpp's converter does to the values of a Qwen3.5 tensor
/// (`Qwen3NextModel.modify_tensors`, on the renamed tensor): norms but the
/// gated one of the linear attention get `+1`, `A_log` becomes `-exp(A_log)`.
pub(crate) fn hybrid_values(hf: &str) -> Values {
    if hf.ends_with(".A_log") {
        Values::NegExp
    } else if hf.ends_with("norm.weight") && !hf.ends_with("linear_attn.norm.weight") {
        Values::PlusOne
    } else {
        Values::AsRead
    }
}

/// The linear-attention head counts of a hybrid config, for the value-head
/// reordering.
pub(crate) struct LinearHeads {
    pub(crate) k_heads: usize,
    pub(crate) v_heads: usize,
    pub(crate) head_k: usize,
    pub(crate) head_v: usize,
}

impl LinearHeads {
    fn of(ckpt: &Checkpoint) -> Result<LinearHeads, PlanError> {
        let need = |key: &'static str| {
            config_usize(ckpt, &[key])
                .filter(|&n| n > 0)
                .ok_or(PlanError::NoLinearKey(key))
        };
        let heads = LinearHeads {
            k_heads: need("linear_num_key_heads")?,
            v_heads: need("linear_num_value_heads")?,
            head_k: need("linear_key_head_dim")?,
            head_v: need("linear_value_head_dim")?,
        };
        if heads.v_heads % heads.k_heads != 0 {
            return Err(PlanError::LinearHeads {
                k_heads: heads.k_heads,
                v_heads: heads.v_heads,
            });
        }
        Ok(heads)
    }

    /// How llama.cpp reorders the value heads of linear-attention tensor
    /// `hf`, when there are more value heads than key heads.
    pub(crate) fn order(&self, hf: &str) -> Option<HeadOrder> {
        if self.k_heads == self.v_heads || !hf.contains("linear_attn.") {
            return None;
        }
        let order = |axis, start, head_dim| HeadOrder {
            axis,
            start,
            k_heads: self.k_heads,
            per_k: self.v_heads / self.k_heads,
            head_dim,
        };
        let qk = 2 * self.k_heads * self.head_k;
        if hf.contains(".in_proj_qkv.") || hf.contains(".conv1d.") {
            Some(order(Axis::Rows, qk, self.head_v))
        } else if hf.contains(".in_proj_z.") {
            Some(order(Axis::Rows, 0, self.head_v))
        } else if hf.contains(".in_proj_b.") || hf.contains(".in_proj_a.") {
            Some(order(Axis::Rows, 0, 1))
        } else if hf.ends_with(".A_log") || hf.ends_with(".dt_bias") {
            // One row of one value per head.
            Some(order(Axis::Cols, 0, 1))
        } else if hf.contains(".out_proj.") {
            Some(order(Axis::Cols, 0, self.head_v))
        } else {
            None
        }
    }
}

/// Gemma 4's `rope_freqs.weight` (`Gemma4Model.generate_extra_tensors`): its
/// global layers rotate only `partial_rotary_factor` of each head's pairs
/// ("proportional" rope), which ggml's NEOX layout expresses as frequency
/// divisors: 1 for the rotated pairs, 1e30 (no rotation) for the others.
pub fn gemma4_rope_factors(config: &serde_json::Value) -> Result<Vec<f32>, RopeFactorsError> {
    let head = config
        .get("global_head_dim")
        .and_then(|v| v.as_u64())
        .ok_or(RopeFactorsError::NoGlobalHeadDim)?;
    let p = config
        .get("rope_parameters")
        .and_then(|r| r.get("full_attention"))
        .and_then(|r| r.get("partial_rotary_factor"))
        .and_then(|v| v.as_f64())
        .ok_or(RopeFactorsError::NoPartialRotary)?;
    let rotated = (head as f64 * p / 2.0) as usize;
    let pairs = (head / 2) as usize;
    let mut factors = vec![1.0f32; rotated.min(pairs)];
    factors.resize(pairs, 1e30);
    Ok(factors)
}

/// Llama 3's per-dimension rope frequency factors (`rope_freqs.weight`), when
/// the config asks for `llama3` rope scaling: llama.cpp's
/// `LlamaModel.generate_extra_tensors`, with each operation in `f32` as
/// PyTorch performs it (`scalar / tensor` is a reciprocal, then a product).
/// The power is computed correctly rounded; PyTorch's is not always, so other
/// parameters than the recorded Llama 3.1/3.2 ones could differ in a last bit.
pub fn llama3_rope_factors(
    config: &serde_json::Value,
) -> Result<Option<Vec<f32>>, RopeFactorsError> {
    let rope = config
        .get("rope_parameters")
        .or_else(|| config.get("rope_scaling"))
        .filter(|v| v.is_object());
    let Some(rope) = rope else {
        return Ok(None);
    };
    let kind = rope
        .get("rope_type")
        .or_else(|| rope.get("type"))
        .and_then(|v| v.as_str());
    if !kind.is_some_and(|k| k.eq_ignore_ascii_case("llama3")) {
        return Ok(None);
    }
    let num =
        |v: Option<&serde_json::Value>, default: f64| v.and_then(|v| v.as_f64()).unwrap_or(default);
    let base = num(
        rope.get("rope_theta").or_else(|| config.get("rope_theta")),
        10000.0,
    );
    let dim = match config.get("head_dim").and_then(|v| v.as_u64()) {
        Some(d) => d,
        None => {
            let hidden = config
                .get("hidden_size")
                .and_then(|v| v.as_u64())
                .ok_or(RopeFactorsError::NoHiddenSize)?;
            let heads = config
                .get("num_attention_heads")
                .and_then(|v| v.as_u64())
                .filter(|&h| h > 0)
                .ok_or(RopeFactorsError::NoAttentionHeads)?;
            hidden / heads
        }
    };
    let factor = num(rope.get("factor"), 8.0) as f32;
    let low = num(rope.get("low_freq_factor"), 1.0);
    let high = num(rope.get("high_freq_factor"), 4.0);
    let old = num(rope.get("original_max_position_embeddings"), 8192.0);
    let (low_wavelen, high_wavelen) = ((old / low) as f32, (old / high) as f32);
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let factors = (0..dim)
        .step_by(2)
        .map(|i| {
            let e = i as f32 / dim as f32;
            let freq = 1.0 / (base.powf(f64::from(e)) as f32);
            let wavelen = (1.0 / freq) * two_pi;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = ((1.0 / wavelen) * old as f32 - low as f32) / (high - low) as f32;
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect();
    Ok(Some(factors))
}

/// The block of an expert tensor `model.layers.N.<module with X>.<proj>.weight`.
fn expert_layer(name: &str, module: &str) -> Option<usize> {
    let (n, rest) = block_of(name)?;
    let (prefix, after) = module.split_once("{}")?;
    let rest = rest.strip_prefix(prefix)?;
    let (x, rest) = rest.split_once('.')?;
    x.parse::<usize>().ok()?;
    let rest = rest
        .strip_prefix(after.trim_start_matches('.'))
        .unwrap_or(rest);
    rest.ends_with(".weight").then_some(n)
}

/// llama.cpp's choice of type for one tensor (`prepare_tensors`).
fn weight_type(name: &str, dims: &[u64], outtype: OutType) -> GgmlType {
    let n_dims = dims.len();
    if n_dims <= 1
        || name.ends_with("_norm.weight")
        || name.contains("ffn_gate_inp")
        || name.contains(".ssm_conv1d.")
        || !name.ends_with(".weight")
    {
        return GgmlType::F32;
    }
    match outtype {
        OutType::F32 => GgmlType::F32,
        OutType::F16 => GgmlType::F16,
        OutType::BF16 => GgmlType::BF16,
        OutType::Q8_0 if dims[0] % 32 == 0 => GgmlType::Q8_0,
        OutType::Q8_0 => GgmlType::F16,
    }
}

/// Decodes one source row into `out` (its length).
fn decode(t: &SourceTensor, bytes: &[u8], out: &mut [f32]) {
    match t.ty {
        SourceType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        SourceType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        SourceType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

/// llama.cpp's `LlamaModel.permute` as a row mapping: within each head of
/// `head` rows, output row `2i + j` comes from source row `j·head/2 + i`.
fn permuted_source_row(row: usize, head: usize) -> usize {
    let (h, within) = (row / head, row % head);
    h * head + (within % 2) * (head / 2) + within / 2
}

/// The inverse of [`permuted_source_row`]: the output row that source row `row` becomes
/// (`memwall export` undoes the permutation with it).
pub(crate) fn permuted_row_of_source(row: usize, head: usize) -> usize {
    let (h, within, half) = (row / head, row % head, head / 2);
    h * head + 2 * (within % half) + within / half
}

impl Planned {
    /// Rows of the output tensor (all dims but the first multiplied).
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product::<u64>().max(1)
    }
}

/// Output rows `[start, start + count)` as `f32`: each row is read from its
/// source tensor (the expert it belongs to; through llama.cpp's Q/K permutation),
/// so a tensor is converted in bounded pieces.
pub fn rows(
    ckpt: &Checkpoint,
    p: &Planned,
    start: u64,
    count: u64,
) -> Result<Vec<f32>, EncodeError> {
    let row_len = p.dims[0] as usize;
    if let Some(values) = &p.generated {
        let (a, b) = (start as usize * row_len, (start + count) as usize * row_len);
        return values
            .get(a..b)
            .map(<[f32]>::to_vec)
            .ok_or_else(|| EncodeError::RowsOutOfRange {
                tensor: p.name.clone(),
            });
    }
    let (per_part, perm) = row_mapping(p)?;
    let mut x = vec![0f32; count as usize * row_len];
    let cols = p.heads.filter(|h| h.axis == Axis::Cols);
    let mut read = vec![0f32; if cols.is_some() { row_len } else { 0 }];
    for (r, dst) in (start..start + count).zip(x.chunks_exact_mut(row_len.max(1))) {
        let (t, data) = source_row(ckpt, p, per_part, perm, r);
        match &cols {
            Some(order) => {
                decode(t, data, &mut read);
                for (c, v) in dst.iter_mut().enumerate() {
                    *v = read[order.source(c)];
                }
            }
            None => decode(t, data, dst),
        }
        p.values.apply(dst);
    }
    Ok(x)
}

/// How output rows map onto source rows: rows per part, rows per head when
/// permuted. Errors when the rows do not split into the heads.
fn row_mapping(p: &Planned) -> Result<(u64, Option<usize>), EncodeError> {
    let per_part = p.rows() / p.parts.len().max(1) as u64;
    let perm = match p.permute_heads {
        Some(heads) => {
            let n = per_part as usize;
            if heads == 0 || n % (2 * heads) != 0 {
                return Err(EncodeError::Heads {
                    tensor: p.name.clone(),
                    rows: n,
                    heads,
                });
            }
            Some(n / heads)
        }
        None => None,
    };
    Ok((per_part, perm))
}

/// The source tensor and bytes of output row `r`.
fn source_row<'a>(
    ckpt: &'a Checkpoint,
    p: &Planned,
    per_part: u64,
    perm: Option<usize>,
    r: u64,
) -> (&'a SourceTensor, &'a [u8]) {
    let part = (r / per_part) as usize;
    let mut local = (r % per_part) as usize;
    if let Some(head) = perm {
        local = permuted_source_row(local, head);
    }
    if let Some(order) = p.heads.filter(|h| h.axis == Axis::Rows) {
        local = order.source(local);
    }
    if let Some(s) = p.slice {
        local = (local / s.rows) * s.stride + s.offset + local % s.rows;
    }
    let t = &ckpt.tensors()[p.parts[part]];
    let bytes = t.ty.size() * p.dims[0] as usize;
    (t, &ckpt.data(t)[local * bytes..(local + 1) * bytes])
}

/// Whether the fast float path ([`float_rows`]) converts `p`.
pub fn is_float_copy(p: &Planned) -> bool {
    p.generated.is_none()
        && p.values == Values::AsRead
        && p.heads.is_none_or(|h| h.axis == Axis::Rows)
        && matches!(p.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Output rows `[start, start + count)` of a float tensor ([`is_float_copy`])
/// straight into `out`, a few thousand values at a time through small buffers:
/// the same bytes as [`rows`] then [`encode`], without whole-chunk
/// intermediates. Non-finite values are an error unless `allow_nonfinite`.
pub fn float_rows(
    ckpt: &Checkpoint,
    p: &Planned,
    start: u64,
    count: u64,
    out: &mut [u8],
    allow_nonfinite: bool,
) -> Result<(), EncodeError> {
    use half::slice::HalfFloatSliceExt;
    const BLOCK: usize = 2048;
    let row_len = p.dims[0] as usize;
    let size = match p.ty {
        GgmlType::F32 => 4,
        GgmlType::F16 | GgmlType::BF16 => 2,
        ty => {
            return Err(EncodeError::NotFloat {
                tensor: p.name.clone(),
                ty,
            });
        }
    };
    let (per_part, perm) = row_mapping(p)?;
    let mut f = [0f32; BLOCK];
    let mut h = [half::f16::ZERO; BLOCK];
    for (r, orow) in (start..start + count).zip(out.chunks_exact_mut(row_len.max(1) * size)) {
        let (t, src) = source_row(ckpt, p, per_part, perm, r);
        let blocks = src
            .chunks(BLOCK * t.ty.size())
            .zip(orow.chunks_mut(BLOCK * size));
        for (b, (sblk, oblk)) in blocks.enumerate() {
            let n = oblk.len() / size;
            let f = &mut f[..n];
            decode(t, sblk, f);
            // A branch-free test first (it vectorizes); the position only on failure.
            if !allow_nonfinite && f.iter().fold(false, |bad, v| bad | !v.is_finite()) {
                let i = f.iter().position(|v| !v.is_finite()).unwrap_or(0);
                return Err(EncodeError::NonFinite {
                    tensor: p.name.clone(),
                    value: f[i],
                    index: r * row_len as u64 + (b * BLOCK + i) as u64,
                });
            }
            match p.ty {
                GgmlType::F16 => {
                    let h = &mut h[..n];
                    h.convert_from_f32_slice(f);
                    for (o, v) in oblk.chunks_exact_mut(2).zip(h.iter()) {
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                }
                GgmlType::BF16 => {
                    for (o, &v) in oblk.chunks_exact_mut(2).zip(f.iter()) {
                        o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
                    }
                }
                _ => {
                    for (o, v) in oblk.chunks_exact_mut(4).zip(f.iter()) {
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Encodes one row of weights as a quantized type (the quantizer's
/// `quantize_row`, passed in so that this crate depends on the runtime only).
pub type RowEncoder = dyn Fn(GgmlType, &[f32], &mut [u8]) -> Result<(), RowEncodeError> + Sync;

/// Encodes planned values; `encode` quantizes rows for the quantized types.
pub fn encode(p: &Planned, x: &[f32], encode: &RowEncoder) -> Result<Vec<u8>, EncodeError> {
    let size =
        p.ty.tensor_size(&p.dims)
            .map_err(|error| EncodeError::Shape {
                tensor: p.name.clone(),
                error,
            })?;
    let mut out = vec![0u8; size.bytes as usize];
    encode_into(p, x, &mut out, encode)?;
    Ok(out)
}

/// Encodes whole rows `x` of `p` into `out`, which holds exactly their bytes.
pub fn encode_into(
    p: &Planned,
    x: &[f32],
    out: &mut [u8],
    encode: &RowEncoder,
) -> Result<(), EncodeError> {
    match p.ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            // half converts with F16C / FP16 instructions where the CPU has them;
            // rounding is to nearest even, as numpy's astype(float16) and f32_to_f16.
            use half::slice::HalfFloatSliceExt;
            let mut h = vec![half::f16::ZERO; x.len()];
            h.convert_from_f32_slice(x);
            for (o, v) in out.chunks_exact_mut(2).zip(&h) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
            }
        }
        ty => {
            let row = p.dims[0] as usize;
            let rows = x.len() / row.max(1);
            if rows == 0 || out.len() % rows != 0 {
                return Err(EncodeError::RowsDoNotFit {
                    tensor: p.name.clone(),
                });
            }
            let row_bytes = out.len() / rows;
            for (xs, ys) in x.chunks_exact(row).zip(out.chunks_exact_mut(row_bytes)) {
                encode(ty, xs, ys).map_err(|error| EncodeError::Row {
                    tensor: p.name.clone(),
                    error,
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_halves_of_each_head() {
        // 2 heads of 4 rows: [0 1 2 3 | 4 5 6 7] → [0 2 1 3 | 4 6 5 7].
        let order: Vec<usize> = (0..8).map(|r| permuted_source_row(r, 4)).collect();
        assert_eq!(order, [0, 2, 1, 3, 4, 6, 5, 7]);
        for head in [2, 4, 64, 128] {
            for r in 0..3 * head {
                assert_eq!(
                    permuted_row_of_source(permuted_source_row(r, head), head),
                    r
                );
            }
        }
    }

    #[test]
    fn half_rounds_like_the_scalar_reference() {
        // F16C (or FP16) through `half` and ggml-style scalar rounding agree on every
        // non-NaN value: normal, subnormal, halfway cases, overflow to infinity.
        use half::slice::HalfFloatSliceExt;
        use memwall_format::blocks::f32_to_f16;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut xs: Vec<f32> = (0..1_000_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                f32::from_bits(state as u32)
            })
            .filter(|x| !x.is_nan())
            .collect();
        xs.extend([
            0.0, -0.0, 65504.0, 65520.0, 65519.99, 6.1e-5, 5.96e-8, 2.98e-8, 1e-9,
        ]);
        xs.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
        ]);
        let mut h = vec![half::f16::ZERO; xs.len()];
        h.convert_from_f32_slice(&xs);
        for (x, h) in xs.iter().zip(&h) {
            assert_eq!(h.to_bits(), f32_to_f16(*x), "{x:e}");
        }
    }

    #[test]
    fn expert_names() {
        assert_eq!(
            expert_layer(
                "model.layers.3.mlp.experts.7.down_proj.weight",
                "mlp.experts.{}"
            ),
            Some(3)
        );
        assert_eq!(
            expert_layer(
                "model.layers.0.block_sparse_moe.experts.1.w2.weight",
                "block_sparse_moe.experts.{}"
            ),
            Some(0)
        );
        assert_eq!(
            expert_layer("model.layers.0.mlp.gate.weight", "mlp.experts.{}"),
            None
        );
    }
}
