//! GGUF back to a Hugging Face checkpoint (`memwall export`): every tensor
//! dequantized to BF16, F16 or F32 safetensors (sharded past a size, with
//! `model.safetensors.index.json`), llama.cpp's Q/K permutation undone, experts
//! unstacked, plus `config.json`, `generation_config.json`, `tokenizer.json`
//! and `tokenizer_config.json` built from the GGUF keys, so that
//! `transformers` loads the folder and `memwall convert` (or llama.cpp's
//! converter) turns it back into the same GGUF.
//!
//! The folder is written as `<out>.partial/` and renamed when complete.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use memwall_format::GgmlType;
use memwall_format::blocks::{
    DEQUANTIZABLE, DequantError, bf16_to_f32, dequantize_row, f16_to_f32, f32_to_bf16, f32_to_f16,
};
use memwall_format::direct::DirectWriter;
use memwall_format::ggml_type::ShapeError;
use memwall_format::gguf::{Array, GgufError, GgufModel, Metadata, MetadataError, TensorInfo};
use memwall_format::model_info::{HyperParams, MetadataProblems};
use memwall_format::progress::{Progress, Unit};
use rayon::prelude::*;
use serde_json::{Map, Value as Json, json};

use crate::arch::{ARCHS, Arch, gemma4_hf_name, hf_name, mtp_source_name};
use crate::tensors::{Axis, HeadOrder, LinearHeads, Values, hybrid_values, permuted_row_of_source};
use crate::vocab::{SPECIAL, token_type};

/// Element type of the exported safetensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportDtype {
    /// bfloat16, what most checkpoints are published in.
    Bf16,
    /// IEEE half.
    F16,
    /// float32: exact for every GGUF type.
    F32,
}

impl ExportDtype {
    /// Parses `bf16`, `f16` or `f32`.
    pub fn parse(s: &str) -> Option<ExportDtype> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Some(ExportDtype::Bf16),
            "f16" => Some(ExportDtype::F16),
            "f32" => Some(ExportDtype::F32),
            _ => None,
        }
    }

    fn size(self) -> u64 {
        match self {
            ExportDtype::F32 => 4,
            _ => 2,
        }
    }

    fn safetensors(self) -> &'static str {
        match self {
            ExportDtype::Bf16 => "BF16",
            ExportDtype::F16 => "F16",
            ExportDtype::F32 => "F32",
        }
    }

    fn torch(self) -> &'static str {
        match self {
            ExportDtype::Bf16 => "bfloat16",
            ExportDtype::F16 => "float16",
            ExportDtype::F32 => "float32",
        }
    }

    /// `v` rounded to this type, as `f32`.
    fn round(self, v: f32) -> f32 {
        match self {
            ExportDtype::F32 => v,
            ExportDtype::F16 => f16_to_f32(f32_to_f16(v)),
            ExportDtype::Bf16 => bf16_to_f32(f32_to_bf16(v)),
        }
    }

    /// The value `k` encodings away from `v` (a value of this type).
    fn step(self, v: f32, k: i32) -> f32 {
        match self {
            ExportDtype::F32 => f32::from_bits(v.to_bits().wrapping_add_signed(k)),
            ExportDtype::F16 => f16_to_f32(f32_to_f16(v).wrapping_add_signed(k as i16)),
            ExportDtype::Bf16 => bf16_to_f32(f32_to_bf16(v).wrapping_add_signed(k as i16)),
        }
    }

    fn put(self, x: &[f32], out: &mut [u8]) {
        match self {
            ExportDtype::F32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(x) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            ExportDtype::F16 | ExportDtype::Bf16 => {
                let f = if self == ExportDtype::F16 {
                    f32_to_f16
                } else {
                    f32_to_bf16
                };
                for (o, v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&f(*v).to_le_bytes());
                }
            }
        }
    }
}

/// What to export to.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// Element type of the weights.
    pub dtype: ExportDtype,
    /// Largest safetensors file (tensor bytes); more data is sharded as
    /// `transformers` shards (`model-0000i-of-0000n.safetensors` and an index).
    pub max_shard_size: u64,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            dtype: ExportDtype::Bf16,
            max_shard_size: 5_000_000_000,
        }
    }
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The GGUF could not be read.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The GGUF holds something a checkpoint cannot express (or the output
    /// folder is not empty).
    #[error("{}: {problem}", path.display())]
    Model {
        /// The GGUF file (the output folder for [`ModelError::NotEmpty`]).
        path: PathBuf,
        /// What is wrong.
        problem: ModelError,
    },
    /// Writing the folder failed (the cause is the error's source).
    #[error("{}", path.display())]
    Io {
        /// The file or folder being written.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Why a GGUF cannot be exported as it is ([`ExportError::Model`], which
/// names the file).
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The hyper-parameters cannot be read.
    #[error(transparent)]
    HyperParams(#[from] MetadataProblems),
    /// A metadata key has the wrong type (or a required one is missing).
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// A key export needs is missing.
    #[error("missing key {0}")]
    MissingKey(String),
    /// An architecture memwall does not export.
    #[error(
        "architecture {arch}{} cannot be exported; memwall exports {}",
        if *experts { " (with experts)" } else { "" },
        .known.join(", ")
    )]
    Architecture {
        /// `general.architecture`.
        arch: String,
        /// Whether the file has experts.
        experts: bool,
        /// The architectures memwall exports.
        known: Vec<&'static str>,
    },
    /// A tensor type memwall cannot dequantize.
    #[error("tensor {tensor}: type {} cannot be dequantized by memwall yet", .ty.name())]
    NotDequantizable {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
    },
    /// Llama 3's rope factors, which config.json cannot express.
    #[error(
        "rope_freqs.weight (Llama 3 rope scaling) cannot be turned back into config.json's rope_scaling"
    )]
    RopeFreqs,
    /// A stacked expert tensor that is not 3-D.
    #[error("tensor {tensor}: expected [experts, rows, columns], got {shape:?}")]
    ExpertShape {
        /// The tensor.
        tensor: String,
        /// Its PyTorch shape.
        shape: Vec<u64>,
    },
    /// A tensor without a Hugging Face name.
    #[error("tensor {tensor} has no Hugging Face name in {model_type}")]
    NoHfName {
        /// The tensor.
        tensor: String,
        /// The `model_type` exported to.
        model_type: &'static str,
    },
    /// Rows to un-permute that do not split into heads of even size.
    #[error("tensor {tensor}: {rows} rows do not split into {heads} heads of even size")]
    Heads {
        /// The tensor.
        tensor: String,
        /// Its rows.
        rows: u64,
        /// The head count.
        heads: u64,
    },
    /// A special token kind without a GGUF key (a bug).
    #[error("internal: no GGUF key for the special token {0}")]
    NoSpecialKey(&'static str),
    /// A tensor export needs is missing.
    #[error("missing tensor {0}")]
    MissingTensor(&'static str),
    /// Rope scaling of a type that needs a factor, without one.
    #[error("{key} is {kind} but has no factor")]
    RopeFactor {
        /// `<arch>.rope.scaling.type`.
        key: String,
        /// The scaling type.
        kind: &'static str,
    },
    /// A rope scaling type export does not write.
    #[error(
        "{key} = {kind} cannot be exported yet (memwall exports default, linear and yarn rope)"
    )]
    RopeScaling {
        /// `<arch>.rope.scaling.type`.
        key: String,
        /// The scaling type.
        kind: String,
    },
    /// An array element that is not an integer.
    #[error("{key}: element {index} is not an integer")]
    NotInteger {
        /// The key.
        key: String,
        /// The element.
        index: usize,
    },
    /// A vocabulary model export does not write.
    #[error(
        "tokenizer.ggml.model = {0}: memwall exports byte-level BPE (gpt2), SentencePiece (llama) and Gemma 4 (gemma4) vocabularies"
    )]
    TokenizerModel(String),
    /// `tokenizer.json` could not be serialised.
    #[error("{0}")]
    Serialize(serde_json::Error),
    /// A special token id past the vocabulary (in `tokenizer_config.json`).
    #[error("the {kind} token id {id} is past the vocabulary")]
    TokenPastVocabulary {
        /// The special token kind.
        kind: &'static str,
        /// The id.
        id: u64,
    },
    /// A special token id past the vocabulary (in the post-processor).
    #[error("tokenizer.ggml.{kind}_token_id {id} is past the vocabulary")]
    SpecialPastVocabulary {
        /// The special token kind.
        kind: &'static str,
        /// The id.
        id: u64,
    },
    /// A named chat template that is missing.
    #[error("tokenizer.chat_templates names {name} but {key} is missing")]
    MissingTemplate {
        /// The template's name.
        name: String,
        /// Its key.
        key: String,
    },
    /// Scores of another type than f32.
    #[error("tokenizer.ggml.scores is not an array of f32")]
    ScoresType,
    /// Tokens, token types and scores of different lengths.
    #[error("{tokens} tokens, {types} token types, {scores} scores")]
    VocabularyLengths {
        /// Tokens.
        tokens: usize,
        /// Token types.
        types: usize,
        /// Scores.
        scores: usize,
    },
    /// A SentencePiece vocabulary without an unknown token.
    #[error(
        "a SentencePiece vocabulary needs tokenizer.ggml.unknown_token_id (sentencepiece requires an unknown piece)"
    )]
    NoUnknownToken,
    /// A pre-tokenizer export cannot write as `tokenizer.json`.
    #[error(
        "tokenizer.ggml.pre = {0}: memwall does not know its tokenizer.json form; it exports {known}",
        known = EXPORTED_PRE.join(", ")
    )]
    PreTokenizer(String),
    /// Token types of another count than the tokens.
    #[error("tokenizer.ggml.token_type has {types} entries for {tokens} tokens")]
    TokenTypes {
        /// Token types.
        types: usize,
        /// Tokens.
        tokens: usize,
    },
    /// A merge that is not two parts.
    #[error("tokenizer.ggml.merges: {0:?} is not \"left right\"")]
    Merge(String),
    /// A tensor listed but not found when written.
    #[error("tensor {0} vanished")]
    Vanished(String),
    /// A tensor shape its type cannot hold.
    #[error("tensor {tensor}: {error}")]
    Shape {
        /// The tensor.
        tensor: String,
        /// What is wrong with the shape.
        error: ShapeError,
    },
    /// A tensor that could not be dequantized.
    #[error("tensor {tensor}: {error}")]
    Dequantize {
        /// The tensor.
        tensor: String,
        /// The decoder's error.
        error: DequantError,
    },
    /// Linear-attention sizes that do not split into heads.
    #[error(
        "ssm.time_step_rank ({v_heads}) is not a multiple of ssm.group_count ({k_heads}), or ssm.inner_size ({inner}) of it"
    )]
    LinearHeads {
        /// `ssm.group_count`: key heads.
        k_heads: u64,
        /// `ssm.time_step_rank`: value heads.
        v_heads: u64,
        /// `ssm.inner_size`.
        inner: u64,
    },
    /// A tensor the converter computed in F32 that was stored otherwise.
    #[error("tensor {tensor}: expected F32 (the converter writes it so), found {}", .ty.name())]
    NotF32 {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A decay factor `ssm_a = -exp(A_log)` that is not negative.
    #[error("tensor {tensor}: value {value} at {index} is not negative, so it is no -exp(A_log)")]
    NotNegative {
        /// The tensor.
        tensor: String,
        /// The value.
        value: f32,
        /// Its index.
        index: u64,
    },
    /// Gemma 4 with per-layer embeddings or shared key/value layers.
    #[error(
        "Gemma 4 with per-layer embeddings ({per_layer}) or key/value sharing ({shared} layers), the E2B/E4B variants, is not exported (memwall does not convert it either)"
    )]
    Gemma4PerLayer {
        /// `embedding_length_per_layer_input`.
        per_layer: u64,
        /// `attention.shared_kv_layers`.
        shared: u64,
    },
    /// A `rope_freqs.weight` that is not Gemma 4's partial rotation.
    #[error(
        "rope_freqs.weight is not {pairs} F32 factors of 1 (rotated pairs) then 1e30, so it is no partial_rotary_factor"
    )]
    Gemma4RopeFreqs {
        /// Pairs of the full layers' heads.
        pairs: usize,
    },
    /// The output folder has files.
    #[error("exists and is not empty; choose a new folder or remove it")]
    NotEmpty,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct ExportSummary {
    /// `architectures[0]` of the written config.
    pub hf_class: String,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes: u64,
    /// Files in the folder, in the order written.
    pub files: Vec<String>,
}

/// One output tensor: a whole GGUF tensor, or one expert of a stacked one.
struct Piece {
    hf: String,
    source: String,
    /// Rows of the GGUF tensor this piece covers.
    first_row: u64,
    rows: u64,
    row_len: u64,
    /// PyTorch shape.
    shape: Vec<u64>,
    /// Rows per head when llama.cpp's Q/K permutation is to be undone.
    head: Option<u64>,
    /// Value heads the converter tiled (Qwen3.5's linear attention): row or
    /// column `j` of the checkpoint is the GGUF's `order.target(j)`.
    heads: Option<HeadOrder>,
    /// What the converter did to every value, undone on the way out.
    values: Values,
}

impl Piece {
    fn bytes(&self, dtype: ExportDtype) -> u64 {
        self.rows * self.row_len * dtype.size()
    }
}

fn model_error(path: &Path, problem: ModelError) -> ExportError {
    ExportError::Model {
        path: path.to_owned(),
        problem,
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The hyper-parameters of the file (read once), with errors that name the
/// key for the ones export needs.
struct Keys<'a> {
    hp: &'a HyperParams,
}

impl Keys<'_> {
    /// `value`, or an error naming `<arch>.key`.
    fn require<T>(&self, key: &str, value: Option<T>) -> Result<T, ModelError> {
        value.ok_or_else(|| ModelError::MissingKey(format!("{}.{key}", self.hp.architecture)))
    }
}

/// The shortest decimal that reads back as the same f32, so config.json says
/// 1e-05 rather than 9.999999747378752e-06.
fn f32_decimal(v: f64) -> f64 {
    format!("{}", v as f32).parse().unwrap_or(v)
}

/// Whether export can undo what the converter did to `arch`'s tensors
/// (every architecture memwall converts).
fn exported(_arch: &Arch) -> bool {
    true
}

/// The class export writes: the text model's (`…ForCausalLM`), which
/// `model_type` names, when the architecture also lists a multimodal one.
fn text_class(arch: &Arch) -> &'static str {
    (arch.hf_classes.iter())
        .find(|c| c.ends_with("ForCausalLM"))
        .unwrap_or(&arch.hf_classes[0])
}

/// The linear-attention head counts of a hybrid (Qwen3.5) file, from its
/// `ssm.*` keys, for undoing the value-head reordering.
fn linear_heads(keys: &Keys) -> Result<LinearHeads, ModelError> {
    let hp = keys.hp;
    let k_heads = keys.require("ssm.group_count", hp.ssm_group_count)?;
    let v_heads = keys.require("ssm.time_step_rank", hp.ssm_time_step_rank)?;
    let head_k = keys.require("ssm.state_size", hp.ssm_state_size)?;
    let inner = keys.require("ssm.inner_size", hp.ssm_inner_size)?;
    if k_heads == 0 || v_heads == 0 || v_heads % k_heads != 0 || inner % v_heads != 0 {
        return Err(ModelError::LinearHeads {
            k_heads,
            v_heads,
            inner,
        });
    }
    Ok(LinearHeads {
        k_heads: k_heads as usize,
        v_heads: v_heads as usize,
        head_k: head_k as usize,
        head_v: (inner / v_heads) as usize,
    })
}

/// The model's own layers: the block count less the multi-token-prediction
/// blocks llama.cpp appends.
fn own_layers(keys: &Keys) -> u64 {
    let hp = keys.hp;
    hp.block_count
        .saturating_sub(hp.nextn_predict_layers.unwrap_or(0))
}

/// The architecture table entry for a GGUF architecture (MoE or not).
fn target(hp: &HyperParams) -> Result<&'static Arch, ModelError> {
    let name = hp.architecture.as_str();
    let moe = hp.expert_count.unwrap_or(0) > 0;
    ARCHS
        .iter()
        .filter(|a| exported(a))
        // Gemma 4's experts sit beside its dense MLP, under their own names.
        .find(|a| a.gguf == name && (a.gemma || a.experts.is_some() == moe))
        .ok_or_else(|| {
            let mut known: Vec<&str> = ARCHS
                .iter()
                .filter(|a| exported(a))
                .map(|a| a.gguf)
                .collect();
            known.dedup();
            ModelError::Architecture {
                arch: name.to_owned(),
                experts: moe,
                known,
            }
        })
}

/// The output tensors, in GGUF order with experts unstacked.
fn pieces(model: &GgufModel, arch: &Arch, keys: &Keys) -> Result<Vec<Piece>, ModelError> {
    let (n_head, n_head_kv) = (keys.hp.head_count, keys.hp.head_count_kv);
    let linear = if arch.hybrid {
        Some(linear_heads(keys)?)
    } else {
        None
    };
    let mut out = Vec::new();
    for (_, t) in model.tensors() {
        if !DEQUANTIZABLE.contains(&t.ty) {
            return Err(ModelError::NotDequantizable {
                tensor: t.name.clone(),
                ty: t.ty,
            });
        }
        let row_len = t.dims[0];
        let rows = t.elements / row_len.max(1);
        let mut shape: Vec<u64> = t.dims.iter().rev().copied().collect();
        if t.name == "rope_freqs.weight" {
            if arch.gemma {
                // Generated from config.json's partial rotation (checked there).
                continue;
            }
            return Err(ModelError::RopeFreqs);
        }
        let stacked = arch.experts.and_then(|e| {
            let (module, suffix) = t.name.rsplit_once('.')?;
            let (blk, kind) = module.strip_prefix("blk.")?.split_once('.')?;
            let (proj, _) = e.stacked.iter().find(|(_, g)| *g == kind)?;
            Some((e, blk.to_owned(), *proj, suffix.to_owned()))
        });
        if let Some((e, blk, proj, suffix)) = stacked {
            let n = shape[0];
            if n == 0 || t.dims.len() != 3 {
                return Err(ModelError::ExpertShape {
                    tensor: t.name.clone(),
                    shape,
                });
            }
            shape.remove(0);
            for x in 0..n {
                let module = e.module.replace("{}", &x.to_string());
                out.push(Piece {
                    hf: format!("model.layers.{blk}.{module}.{proj}.{suffix}"),
                    source: t.name.clone(),
                    first_row: x * (rows / n),
                    rows: rows / n,
                    row_len,
                    shape: shape.clone(),
                    head: None,
                    heads: None,
                    values: Values::AsRead,
                });
            }
            continue;
        }
        // Gemma 4 has neither stacked experts nor a Q/K permutation nor
        // hybrid transforms: only its names differ.
        let hf = if arch.gemma {
            gemma4_hf_name(&t.name)
        } else {
            hf_name(arch, &t.name)
        };
        let hf = hf.ok_or_else(|| ModelError::NoHfName {
            tensor: t.name.clone(),
            model_type: arch.model_type,
        })?;
        let heads = match t.name.rsplit('.').nth(1) {
            Some("attn_q") if arch.permute_qk => Some(n_head),
            Some("attn_k") if arch.permute_qk => Some(n_head_kv),
            _ => None,
        };
        let head = match heads {
            Some(h) if h > 0 && rows % (2 * h) == 0 => Some(rows / h),
            Some(h) => {
                return Err(ModelError::Heads {
                    tensor: t.name.clone(),
                    rows,
                    heads: h,
                });
            }
            None => None,
        };
        let (heads, values) = match &linear {
            Some(lin) => (lin.order(&hf), hybrid_values(&hf)),
            None => (None, Values::AsRead),
        };
        if values == Values::NegExp && t.ty != GgmlType::F32 {
            return Err(ModelError::NotF32 {
                tensor: t.name.clone(),
                ty: t.ty,
            });
        }
        if arch.hybrid && t.name.contains(".ssm_conv1d.") && shape.len() == 2 {
            // `[channels, taps]` back to the checkpoint's `[channels, 1, taps]`.
            shape.insert(1, 1);
        }
        out.push(Piece {
            hf,
            source: t.name.clone(),
            first_row: 0,
            rows,
            row_len,
            shape,
            head,
            heads,
            values,
        });
    }
    if arch.hybrid {
        // The multi-token-prediction block under its checkpoint names.
        let n_layer = own_layers(keys) as usize;
        for p in &mut out {
            p.hf = mtp_source_name(&p.hf, n_layer);
        }
    }
    Ok(out)
}

/// Writes `x` as JSON (a number of a GGUF float key kept short).
fn num(v: f64) -> Json {
    serde_json::Number::from_f64(v).map_or(Json::Null, Json::Number)
}

fn token_id(meta: &Metadata, kind: &'static str) -> Result<Option<u64>, ModelError> {
    let (_, key) = SPECIAL
        .iter()
        .find(|(k, _)| *k == kind)
        .ok_or(ModelError::NoSpecialKey(kind))?;
    Ok(meta.get_u64(key)?)
}

/// `config.json` for the exported model.
fn config(
    meta: &Metadata,
    arch: &Arch,
    keys: &Keys,
    model: &GgufModel,
    dtype: ExportDtype,
) -> Result<Json, ModelError> {
    let mut c = Map::new();
    let class = text_class(arch);
    c.insert("architectures".into(), json!([class]));
    c.insert("model_type".into(), json!(arch.model_type));
    let embd = model
        .tensor("token_embd.weight")
        .ok_or(ModelError::MissingTensor("token_embd.weight"))?
        .0;
    c.insert(
        "vocab_size".into(),
        json!(embd.dims.get(1).copied().unwrap_or(0)),
    );
    let hp = keys.hp;
    c.insert("hidden_size".into(), json!(hp.embedding_length));
    match hp.feed_forward_length {
        // Qwen3.5's mixture has no dense FFN.
        None if arch.hybrid && arch.experts.is_some() => {}
        ff => {
            let ff = keys.require("feed_forward_length", ff)?;
            c.insert("intermediate_size".into(), json!(ff));
        }
    }
    c.insert("num_hidden_layers".into(), json!(own_layers(keys)));
    c.insert("num_attention_heads".into(), json!(hp.head_count));
    c.insert("num_key_value_heads".into(), json!(hp.head_count_kv));
    if let Some(d) = hp.key_length {
        c.insert("head_dim".into(), json!(d));
    }
    c.insert("max_position_embeddings".into(), json!(hp.context_length));
    if let Some(eps) = hp.rms_norm_eps {
        c.insert("rms_norm_eps".into(), num(f32_decimal(eps)));
    }
    if let Some(eps) = hp.layer_norm_eps {
        c.insert("layer_norm_eps".into(), num(f32_decimal(eps)));
    }
    let scaling_key = format!("{}.rope.scaling.type", arch.gguf);
    let theta = num(hp.rope_freq_base.map_or(10000.0, f32_decimal));
    if arch.gemma {
        return gemma4_config(c, keys, model, theta, meta, dtype);
    }
    if arch.hybrid {
        let tied = model.tensor("output.weight").is_none();
        c.insert("tie_word_embeddings".into(), json!(tied));
        return hybrid_config(c, keys, theta, &scaling_key, meta, dtype);
    }
    c.insert("rope_theta".into(), theta);
    let factor = hp.rope_scaling_factor.map(f32_decimal);
    match hp.rope_scaling_type.as_deref() {
        None | Some("none") => {}
        Some("linear") => {
            let factor = factor.ok_or_else(|| ModelError::RopeFactor {
                key: scaling_key.clone(),
                kind: "linear",
            })?;
            c.insert(
                "rope_scaling".into(),
                json!({"rope_type": "linear", "factor": num(factor)}),
            );
        }
        Some("yarn") => {
            let factor = factor.ok_or_else(|| ModelError::RopeFactor {
                key: scaling_key.clone(),
                kind: "yarn",
            })?;
            let original = keys.require(
                "rope.scaling.original_context_length",
                hp.rope_scaling_original_context_length,
            )?;
            let mut r = Map::new();
            r.insert("rope_type".into(), json!("yarn"));
            r.insert("factor".into(), num(factor));
            r.insert("original_max_position_embeddings".into(), json!(original));
            for (v, name) in [
                (hp.yarn_ext_factor, "extrapolation_factor"),
                (hp.yarn_attn_factor, "attention_factor"),
                (hp.yarn_beta_fast, "beta_fast"),
                (hp.yarn_beta_slow, "beta_slow"),
            ] {
                if let Some(v) = v {
                    r.insert(name.into(), num(f32_decimal(v)));
                }
            }
            c.insert("rope_scaling".into(), Json::Object(r));
        }
        Some(other) => {
            return Err(ModelError::RopeScaling {
                key: scaling_key,
                kind: other.to_owned(),
            });
        }
    }
    c.insert("hidden_act".into(), json!("silu"));
    c.insert(
        "tie_word_embeddings".into(),
        json!(model.tensor("output.weight").is_none()),
    );
    if arch.experts.is_some() {
        let experts = hp.expert_count.unwrap_or(0);
        let used = keys.require("expert_used_count", hp.expert_used_count)?;
        if arch.model_type == "mixtral" {
            c.insert("num_local_experts".into(), json!(experts));
        } else {
            c.insert("num_experts".into(), json!(experts));
            if let Some(n) = hp.expert_feed_forward_length {
                c.insert("moe_intermediate_size".into(), json!(n));
            }
            // llama.cpp's qwen3moe graph renormalises the chosen experts' weights.
            c.insert("norm_topk_prob".into(), json!(true));
            c.insert("decoder_sparse_step".into(), json!(1));
            c.insert("mlp_only_layers".into(), json!([]));
        }
        c.insert("num_experts_per_tok".into(), json!(used));
    }
    match arch.gguf {
        "command-r" => {
            let scale = f32_decimal(keys.require("logit_scale", hp.logit_scale)?);
            c.insert("logit_scale".into(), num(scale));
            c.insert(
                "use_qk_norm".into(),
                json!(model.tensor("blk.0.attn_q_norm.weight").is_some()),
            );
        }
        "qwen2" => {
            c.insert("use_sliding_window".into(), json!(false));
        }
        _ => {}
    }
    finish_config(c, meta, dtype)
}

/// The keys every config ends with: special token ids, `torch_dtype`.
fn finish_config(
    mut c: Map<String, Json>,
    meta: &Metadata,
    dtype: ExportDtype,
) -> Result<Json, ModelError> {
    // A SentencePiece folder has no tokenizer.json to name special tokens by content;
    // gguf-py then takes every *_token_id from config.json.
    let sentencepiece = meta.get_str("tokenizer.ggml.model").ok().flatten() == Some("llama");
    let kinds: &[&str] = if sentencepiece {
        &["bos", "eos", "unk", "sep", "pad", "cls", "mask"]
    } else {
        &["bos", "eos", "pad"]
    };
    for kind in kinds {
        if let Some(id) = token_id(meta, kind)? {
            c.insert(format!("{kind}_token_id"), json!(id));
        }
    }
    c.insert("torch_dtype".into(), json!(dtype.torch()));
    Ok(Json::Object(c))
}

/// The rest of a Qwen3.5 `config.json` (`qwen3_5_text`, `qwen3_5_moe_text`)
/// after the sizes: transformers 5's `rope_parameters` (partial rotation,
/// interleaved M-RoPE sections), the layer types, the gated delta net's sizes,
/// the experts and the multi-token-prediction blocks.
fn hybrid_config(
    mut c: Map<String, Json>,
    keys: &Keys,
    theta: Json,
    scaling_key: &str,
    meta: &Metadata,
    dtype: ExportDtype,
) -> Result<Json, ModelError> {
    let hp = keys.hp;
    if let Some(kind) = hp.rope_scaling_type.as_deref().filter(|k| *k != "none") {
        return Err(ModelError::RopeScaling {
            key: scaling_key.to_owned(),
            kind: kind.to_owned(),
        });
    }
    let head_dim = keys.require("attention.key_length", hp.key_length)?;
    let rotated = keys.require("rope.dimension_count", hp.rope_dimension_count)?;
    let mut sections = hp.rope_dimension_sections.clone().unwrap_or_default();
    while sections.len() > 3 && sections.last() == Some(&0) {
        sections.pop();
    }
    c.insert(
        "rope_parameters".into(),
        json!({
            "rope_type": "default",
            "rope_theta": theta,
            "partial_rotary_factor": num(rotated as f64 / head_dim.max(1) as f64),
            "mrope_section": sections,
            "mrope_interleaved": true,
        }),
    );
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("attention_bias".into(), json!(false));
    let n_layer = own_layers(keys) as usize;
    if let Some(recurrent) = &hp.recurrent_layers {
        let types: Vec<&str> = (recurrent.iter().take(n_layer))
            .map(|&r| {
                if r {
                    "linear_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        c.insert("layer_types".into(), json!(types));
    }
    if let Some(interval) = hp.full_attention_interval {
        c.insert("full_attention_interval".into(), json!(interval));
    }
    let lin = linear_heads(keys)?;
    c.insert(
        "linear_conv_kernel_dim".into(),
        json!(keys.require("ssm.conv_kernel", hp.ssm_conv_kernel)?),
    );
    c.insert("linear_key_head_dim".into(), json!(lin.head_k));
    c.insert("linear_value_head_dim".into(), json!(lin.head_v));
    c.insert("linear_num_key_heads".into(), json!(lin.k_heads));
    c.insert("linear_num_value_heads".into(), json!(lin.v_heads));
    c.insert(
        "mtp_num_hidden_layers".into(),
        json!(hp.nextn_predict_layers.unwrap_or(0)),
    );
    if hp.expert_count.unwrap_or(0) > 0 {
        c.insert("num_experts".into(), json!(hp.expert_count));
        c.insert(
            "num_experts_per_tok".into(),
            json!(keys.require("expert_used_count", hp.expert_used_count)?),
        );
        for (k, v) in [
            ("moe_intermediate_size", hp.expert_feed_forward_length),
            (
                "shared_expert_intermediate_size",
                hp.expert_shared_feed_forward_length,
            ),
        ] {
            if let Some(v) = v {
                c.insert(k.into(), json!(v));
            }
        }
    }
    finish_config(c, meta, dtype)
}

/// The rest of a Gemma 4 text `config.json` (`gemma4_text`): the two kinds
/// of layers (sliding and full attention, each with its head size, key/value
/// heads and rope), the full layers' partial rotation read back from
/// `rope_freqs.weight`, the soft cap, and the experts beside the MLP. The
/// per-layer-embedding variants (E2B, E4B) are refused.
fn gemma4_config(
    mut c: Map<String, Json>,
    keys: &Keys,
    model: &GgufModel,
    theta: Json,
    meta: &Metadata,
    dtype: ExportDtype,
) -> Result<Json, ModelError> {
    let hp = keys.hp;
    let per_layer = hp.embedding_length_per_layer_input.unwrap_or(0);
    let shared = hp.shared_kv_layers.unwrap_or(0);
    if per_layer > 0 || shared > 0 {
        return Err(ModelError::Gemma4PerLayer { per_layer, shared });
    }
    let swa = keys.require(
        "attention.sliding_window_pattern",
        hp.sliding_window_pattern.clone(),
    )?;
    let types: Vec<&str> = (swa.iter())
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let head_full = keys.require("attention.key_length", hp.key_length)?;
    let head_swa = keys.require("attention.key_length_swa", hp.key_length_swa)?;
    // Key/value heads per layer kind (one number when every layer has the same).
    let kv = |sliding: bool| -> u64 {
        match &hp.head_count_kv_layers {
            Some(per) => (swa.iter().zip(per))
                .find(|(s, _)| **s == sliding)
                .map_or(hp.head_count_kv, |(_, &n)| n),
            None => hp.head_count_kv,
        }
    };
    c.insert("head_dim".into(), json!(head_swa));
    c.insert("global_head_dim".into(), json!(head_full));
    c.insert("num_key_value_heads".into(), json!(kv(true)));
    c.insert("num_global_key_value_heads".into(), json!(kv(false)));
    c.insert("layer_types".into(), json!(types));
    c.insert(
        "sliding_window".into(),
        json!(keys.require("attention.sliding_window", hp.sliding_window)?),
    );
    if let Some(cap) = hp.final_logit_softcapping {
        c.insert("final_logit_softcapping".into(), num(f32_decimal(cap)));
    }
    // The full layers rotate the pairs whose factor is 1 (the others 1e30).
    let (info, data) = model
        .tensor("rope_freqs.weight")
        .ok_or(ModelError::MissingTensor("rope_freqs.weight"))?;
    let pairs = (head_full / 2) as usize;
    let factors: Vec<f32> = if info.ty == GgmlType::F32 {
        data.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    } else {
        Vec::new()
    };
    let rotated = factors.iter().take_while(|&&f| f == 1.0).count();
    let partial = f32_decimal(2.0 * rotated as f64 / head_full.max(1) as f64);
    let expected = (head_full as f64 * partial / 2.0) as usize;
    if factors.len() != pairs
        || factors[rotated..].iter().any(|&f| f != 1e30)
        || expected != rotated
    {
        return Err(ModelError::Gemma4RopeFreqs { pairs });
    }
    let swa_theta = num(hp.rope_freq_base_swa.map_or(10000.0, f32_decimal));
    c.insert(
        "rope_parameters".into(),
        json!({
            "full_attention": {"partial_rotary_factor": num(partial), "rope_theta": theta,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": swa_theta, "rope_type": "default"},
        }),
    );
    // A full layer without a value projection reads its keys as values.
    let k_eq_v = swa.iter().enumerate().any(|(l, &s)| {
        !s && model.tensor(&format!("blk.{l}.attn_k.weight")).is_some()
            && model.tensor(&format!("blk.{l}.attn_v.weight")).is_none()
    });
    c.insert("attention_k_eq_v".into(), json!(k_eq_v));
    c.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
    c.insert("hidden_size_per_layer_input".into(), json!(0));
    c.insert("num_kv_shared_layers".into(), json!(0));
    c.insert("attention_bias".into(), json!(false));
    c.insert(
        "tie_word_embeddings".into(),
        json!(model.tensor("output.weight").is_none()),
    );
    let experts = hp.expert_count.unwrap_or(0);
    c.insert("enable_moe_block".into(), json!(experts > 0));
    if experts > 0 {
        c.insert("num_experts".into(), json!(experts));
        c.insert(
            "top_k_experts".into(),
            json!(keys.require("expert_used_count", hp.expert_used_count)?),
        );
        c.insert(
            "moe_intermediate_size".into(),
            json!(keys.require("expert_feed_forward_length", hp.expert_feed_forward_length)?),
        );
    }
    finish_config(c, meta, dtype)
}

/// The `tokenizers` pre-tokenizer that splits text as llama.cpp's pre-tokenizer
/// `pre` does, for the pre-tokenizers of the families memwall converts.
fn pre_tokenizer(pre: &str) -> Option<Json> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |regex: &str| json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false});
    // The two regexes, as llama.cpp's llama-vocab.cpp lists them for these names.
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let digits = json!({"type": "Digits", "individual_digits": true});
    Some(match pre {
        "gpt-2" => byte_level(true),
        "smollm" | "command-r" => {
            json!({"type": "Sequence", "pretokenizers": [digits, byte_level(true)]})
        }
        "llama-bpe" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3), byte_level(false)]})
        }
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [split(QWEN2), byte_level(false)]}),
        "qwen35" => {
            json!({"type": "Sequence", "pretokenizers": [split(QWEN35), byte_level(false)]})
        }
        _ => return None,
    })
}

/// Pre-tokenizers [`pre_tokenizer`] knows, for messages.
pub const EXPORTED_PRE: &[&str] = &[
    "gpt-2",
    "smollm",
    "command-r",
    "llama-bpe",
    "qwen2",
    "qwen35",
];

/// GGUF merges (`"left right"`) as tokenizer.json's pairs.
fn merge_pairs(merges: &[String]) -> Result<Vec<Json>, ModelError> {
    merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| ModelError::Merge(m.clone()))
        })
        .collect()
}

fn token_list(meta: &Metadata) -> Result<&[String], ModelError> {
    meta.get_str_array("tokenizer.ggml.tokens")?
        .ok_or_else(|| ModelError::MissingKey("tokenizer.ggml.tokens".into()))
}

fn ints(meta: &Metadata, key: &str) -> Result<Vec<i64>, ModelError> {
    match meta.get_array(key)? {
        Some(Array::I32(v)) => Ok(v.iter().map(|&x| x as i64).collect()),
        Some(a) => (0..a.len())
            .map(|i| {
                a.get(i)
                    .and_then(|v| v.as_i64())
                    .ok_or_else(|| ModelError::NotInteger {
                        key: key.to_owned(),
                        index: i,
                    })
            })
            .collect(),
        None => Ok(Vec::new()),
    }
}

/// The tokenizer files [`export`] writes for a GGUF's vocabulary (a model's
/// or a vocabulary-only file's): `tokenizer.json` for byte-level BPE,
/// `tokenizer.model` for SentencePiece, each with `tokenizer_config.json`;
/// (file name, bytes).
pub fn tokenizer_files_of(meta: &Metadata) -> Result<Vec<(&'static str, Vec<u8>)>, ModelError> {
    let hp = HyperParams::try_from(meta)?;
    tokenizer_files(meta, &Keys { hp: &hp })
}

/// The tokenizer files: `tokenizer.json` for byte-level BPE, `tokenizer.model` for
/// SentencePiece, each with `tokenizer_config.json`; (file name, bytes).
fn tokenizer_files(
    meta: &Metadata,
    keys: &Keys,
) -> Result<Vec<(&'static str, Vec<u8>)>, ModelError> {
    let model = meta.require_str("tokenizer.ggml.model")?;
    match model {
        "gpt2" => {
            let (tokenizer, config) = tokenizer(meta, keys)?;
            let tok = serde_json::to_vec(&tokenizer).map_err(ModelError::Serialize)?;
            Ok(vec![
                ("tokenizer_config.json", pretty(&config)),
                ("tokenizer.json", tok),
            ])
        }
        "llama" => sentencepiece_files(meta, keys),
        "gemma4" => gemma4_tokenizer_files(meta, keys),
        other => Err(ModelError::TokenizerModel(other.to_owned())),
    }
}

/// `tokenizer_config.json` keys both vocabulary kinds write: special tokens by
/// content, the add_* flags the GGUF states, context, chat template.
fn common_tokenizer_config(
    meta: &Metadata,
    keys: &Keys,
    tokens: &[String],
    tc: &mut Map<String, Json>,
) -> Result<(), ModelError> {
    for k in ["bos", "eos", "sep"] {
        if let Some(v) = meta.get_bool(&format!("tokenizer.ggml.add_{k}_token"))? {
            tc.insert(format!("add_{k}_token"), json!(v));
        }
    }
    for kind in ["bos", "eos", "unk", "pad"] {
        if let Some(id) = token_id(meta, kind)? {
            let t = tokens
                .get(id as usize)
                .ok_or(ModelError::TokenPastVocabulary { kind, id })?;
            tc.insert(format!("{kind}_token"), json!(t));
        }
    }
    tc.insert("model_max_length".into(), json!(keys.hp.context_length));
    tc.insert("clean_up_tokenization_spaces".into(), json!(false));
    if let Some(v) = meta.get_bool("tokenizer.ggml.add_space_prefix")? {
        tc.insert("add_prefix_space".into(), json!(v));
    }
    let default = meta.get_str("tokenizer.chat_template")?;
    let names = meta.get_str_array("tokenizer.chat_templates")?;
    match names {
        // Named templates: the list form of tokenizer_config.json.
        Some(names) if !names.is_empty() => {
            let mut list = Vec::new();
            if let Some(t) = default {
                list.push(json!({"name": "default", "template": t}));
            }
            for name in names {
                let key = format!("tokenizer.chat_template.{name}");
                let t = meta
                    .get_str(&key)?
                    .ok_or_else(|| ModelError::MissingTemplate {
                        name: name.clone(),
                        key: key.clone(),
                    })?;
                list.push(json!({"name": name, "template": t}));
            }
            tc.insert("chat_template".into(), Json::Array(list));
        }
        _ => {
            if let Some(t) = default {
                tc.insert("chat_template".into(), json!(t));
            }
        }
    }
    Ok(())
}

/// A SentencePiece vocabulary as `tokenizer.model` (a BPE model with the GGUF's
/// pieces, scores and types; byte fallback when there are byte pieces) and a
/// `tokenizer_config.json` whose `added_tokens_decoder` lists the tokens llama.cpp
/// took from one (score −1000, control or user-defined), so that converting the
/// folder gives the same vocabulary back.
fn sentencepiece_files(
    meta: &Metadata,
    keys: &Keys,
) -> Result<Vec<(&'static str, Vec<u8>)>, ModelError> {
    use crate::sentencepiece::{Model, Piece, piece_type, write};
    let tokens = token_list(meta)?;
    let types = ints(meta, "tokenizer.ggml.token_type")?;
    let scores: Vec<f32> = match meta.get_array("tokenizer.ggml.scores")? {
        Some(Array::F32(v)) => v.clone(),
        Some(_) => return Err(ModelError::ScoresType),
        None => vec![0.0; tokens.len()],
    };
    if types.len() != tokens.len() || scores.len() != tokens.len() {
        return Err(ModelError::VocabularyLengths {
            tokens: tokens.len(),
            types: types.len(),
            scores: scores.len(),
        });
    }
    let unk = token_id(meta, "unk")?.ok_or(ModelError::NoUnknownToken)?;
    // Trailing ids llama.cpp filled with [PADi] are not pieces.
    let mut n = tokens.len();
    while n > 0
        && types[n - 1] == token_type::UNUSED as i64
        && tokens[n - 1] == format!("[PAD{}]", n - 1)
    {
        n -= 1;
    }
    let mut decoder = Map::new();
    let mut pieces = Vec::with_capacity(n);
    for i in 0..n {
        let ty = types[i] as i32;
        let kind = if i as u64 == unk {
            piece_type::UNKNOWN
        } else if (1..=6).contains(&ty) {
            ty
        } else {
            piece_type::NORMAL
        };
        // llama.cpp writes user-defined tokens with spaces; pieces spell them with ▁.
        let text = if ty == token_type::USER_DEFINED {
            tokens[i].replace(' ', "▁")
        } else {
            tokens[i].clone()
        };
        if scores[i] == -1000.0 && (ty == token_type::CONTROL || ty == token_type::USER_DEFINED) {
            let special = ty == token_type::CONTROL;
            decoder.insert(
                i.to_string(),
                json!({"content": text, "lstrip": false, "normalized": !special,
                       "rstrip": false, "single_word": false, "special": special}),
            );
        }
        pieces.push(Piece {
            piece: text,
            score: scores[i],
            kind,
        });
    }
    let add_dummy_prefix = meta
        .get_bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
    let byte_fallback = pieces.iter().any(|p| p.kind == piece_type::BYTE);
    let id = |kind: &'static str| -> Result<Option<u32>, ModelError> {
        Ok(token_id(meta, kind)?.map(|v| v as u32))
    };
    let model = write(
        &Model {
            pieces,
            add_dummy_prefix,
        },
        unk as u32,
        id("bos")?,
        id("eos")?,
        byte_fallback,
    );
    let mut tc = Map::new();
    tc.insert("tokenizer_class".into(), json!("LlamaTokenizer"));
    common_tokenizer_config(meta, keys, tokens, &mut tc)?;
    tc.insert("added_tokens_decoder".into(), Json::Object(decoder));
    Ok(vec![
        ("tokenizer_config.json", pretty(&Json::Object(tc))),
        ("tokenizer.model", model),
    ])
}

/// Gemma 4's vocabulary as its checkpoints ship it: a byte-fallback BPE over
/// text whose spaces are written `▁` (`tokenizer.json`), and a
/// `tokenizer_config.json` that names every control token a special one (the
/// named kinds, the rest in `extra_special_tokens`), so that llama.cpp's
/// converter, which types the special tokens control and a few of them
/// user-defined, gives the same token types back. The chat template goes into
/// `chat_template.jinja`, as the published checkpoints have it.
fn gemma4_tokenizer_files(
    meta: &Metadata,
    keys: &Keys,
) -> Result<Vec<(&'static str, Vec<u8>)>, ModelError> {
    let tokens = token_list(meta)?;
    let types = ints(meta, "tokenizer.ggml.token_type")?;
    if types.len() != tokens.len() {
        return Err(ModelError::TokenTypes {
            types: types.len(),
            tokens: tokens.len(),
        });
    }
    let merges = meta.get_str_array("tokenizer.ggml.merges")?.unwrap_or(&[]);
    let unk = token_id(meta, "unk")?.ok_or(ModelError::NoUnknownToken)?;
    let unk_token = tokens
        .get(unk as usize)
        .ok_or(ModelError::TokenPastVocabulary {
            kind: "unk",
            id: unk,
        })?;
    let mut vocab = Map::new();
    let mut added = Vec::new();
    let mut special = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), json!(i));
        if types[i] == token_type::CONTROL as i64 || types[i] == token_type::USER_DEFINED as i64 {
            added.push(
                json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}),
            );
            special.push(t.clone());
        }
    }
    let merges = merge_pairs(merges)?;
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "},
                          "behavior": "MergedWithPrevious", "invert": false},
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk_token,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    });
    let mut tc = Map::new();
    tc.insert("tokenizer_class".into(), json!("GemmaTokenizer"));
    common_tokenizer_config(meta, keys, tokens, &mut tc)?;
    // The template ships in its own file; the converter states the BOS and
    // space-prefix flags itself, after the template (flags here would move them).
    let template = tc.remove("chat_template");
    for flag in [
        "add_bos_token",
        "add_eos_token",
        "add_sep_token",
        "add_prefix_space",
    ] {
        tc.remove(flag);
    }
    if let Some(id) = token_id(meta, "mask")? {
        let t = tokens
            .get(id as usize)
            .ok_or(ModelError::TokenPastVocabulary { kind: "mask", id })?;
        tc.insert("mask_token".into(), json!(t));
    }
    let named: Vec<&Json> = [
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "mask_token",
    ]
    .iter()
    .filter_map(|k| tc.get(*k))
    .collect();
    let extra: Vec<String> = special
        .into_iter()
        .filter(|t| !named.contains(&&json!(t)))
        .collect();
    tc.insert("extra_special_tokens".into(), json!(extra));
    let tok = serde_json::to_vec(&tokenizer).map_err(ModelError::Serialize)?;
    let mut files = vec![
        ("tokenizer_config.json", pretty(&Json::Object(tc))),
        ("tokenizer.json", tok),
    ];
    if let Some(Json::String(t)) = template {
        files.push(("chat_template.jinja", t.into_bytes()));
    }
    Ok(files)
}

fn tokenizer(meta: &Metadata, keys: &Keys) -> Result<(Json, Json), ModelError> {
    let pre = meta.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
    let pre_tokenizer =
        pre_tokenizer(pre).ok_or_else(|| ModelError::PreTokenizer(pre.to_owned()))?;
    let tokens = token_list(meta)?;
    let types = ints(meta, "tokenizer.ggml.token_type")?;
    if !types.is_empty() && types.len() != tokens.len() {
        return Err(ModelError::TokenTypes {
            types: types.len(),
            tokens: tokens.len(),
        });
    }
    let ty = |i: usize| types.get(i).copied().unwrap_or(token_type::NORMAL as i64);
    let merges = meta.get_str_array("tokenizer.ggml.merges")?.unwrap_or(&[]);
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        // llama.cpp fills ids the tokenizer lacks with `[PADi]`; they are not tokens.
        if ty(i) == token_type::UNUSED as i64 && *t == format!("[PAD{i}]") {
            continue;
        }
        vocab.insert(t.clone(), json!(i));
        let t_ty = ty(i);
        if t_ty == token_type::CONTROL as i64 || t_ty == token_type::USER_DEFINED as i64 {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": t_ty == token_type::USER_DEFINED as i64,
                "special": t_ty == token_type::CONTROL as i64,
            }));
        }
    }
    let merges = merge_pairs(merges)?;
    // Written back only when the GGUF says: llama.cpp writes what the checkpoint said.
    let flag = |k: &str| -> Result<Option<bool>, MetadataError> {
        meta.get_bool(&format!("tokenizer.ggml.add_{k}_token"))
    };
    let (add_bos, add_eos) = (flag("bos")?, flag("eos")?);
    let token_of = |kind: &'static str| -> Result<Option<(u64, String)>, ModelError> {
        Ok(match token_id(meta, kind)? {
            Some(id) => Some((
                id,
                tokens
                    .get(id as usize)
                    .ok_or(ModelError::SpecialPastVocabulary { kind, id })?
                    .clone(),
            )),
            None => None,
        })
    };
    // The post-processor adds BOS/EOS as the GGUF says, for transformers; llama.cpp's
    // converter reads the same flags back from it and from tokenizer_config.json.
    let post_processor = if add_bos == Some(true) || add_eos == Some(true) {
        let first = token_of("bos")?.filter(|_| add_bos == Some(true));
        let last = token_of("eos")?.filter(|_| add_eos == Some(true));
        let special = |(_, t): &(u64, String)| json!({"SpecialToken": {"id": t, "type_id": 0}});
        let seq = |id: &str, ty: u32| json!({"Sequence": {"id": id, "type_id": ty}});
        let around = |middle: Vec<Json>| -> Vec<Json> {
            first
                .iter()
                .map(special)
                .chain(middle)
                .chain(last.iter().map(special))
                .collect()
        };
        let special_tokens: Map<String, Json> = first
            .iter()
            .chain(&last)
            .map(|(id, t)| (t.clone(), json!({"id": t, "ids": [id], "tokens": [t]})))
            .collect();
        json!({"type": "TemplateProcessing", "single": around(vec![seq("A", 0)]),
               "pair": around(vec![seq("A", 0), seq("B", 1)]), "special_tokens": special_tokens})
    } else {
        Json::Null
    };
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    });
    let mut tc = Map::new();
    tc.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    common_tokenizer_config(meta, keys, tokens, &mut tc)?;
    Ok((tokenizer, Json::Object(tc)))
}

fn generation_config(meta: &Metadata) -> Result<Json, ModelError> {
    let mut g = Map::new();
    for kind in ["bos", "eos", "pad"] {
        if let Some(id) = token_id(meta, kind)? {
            g.insert(format!("{kind}_token_id"), json!(id));
        }
    }
    Ok(Json::Object(g))
}

/// Rows converted per step: bounded memory whatever the tensor size.
const CHUNK_VALUES: u64 = 4 << 20;

/// Writes one piece's data (dequantized, un-permuted, converted) to `w`.
fn write_piece(
    model: &GgufModel,
    p: &Piece,
    dtype: ExportDtype,
    w: &mut impl Write,
    path: &Path,
    progress: &dyn Progress,
) -> Result<(), ExportError> {
    let input = model.files()[0].path();
    let (info, data): (&TensorInfo, &[u8]) = model
        .tensor(&p.source)
        .ok_or_else(|| model_error(input, ModelError::Vanished(p.source.clone())))?;
    let row_bytes = info
        .ty
        .tensor_size(&[p.row_len])
        .map_err(|error| {
            model_error(
                input,
                ModelError::Shape {
                    tensor: p.source.clone(),
                    error,
                },
            )
        })?
        .bytes;
    let row_len = p.row_len as usize;
    // Whole heads per chunk, so that un-permuting stays inside the chunk; a
    // tensor whose value heads move along its rows in one chunk.
    let unit = p.head.unwrap_or(1);
    let row_order = p.heads.filter(|h| h.axis == Axis::Rows);
    let col_order = p.heads.filter(|h| h.axis == Axis::Cols);
    let chunk_rows = match row_order {
        Some(_) => p.rows,
        None => ((CHUNK_VALUES / p.row_len.max(1)) / unit).max(1) * unit,
    };
    let mut start = 0;
    while start < p.rows {
        let count = chunk_rows.min(p.rows - start);
        let first = p.first_row + start;
        let src = &data[(first * row_bytes) as usize..((first + count) * row_bytes) as usize];
        let mut x = vec![0f32; count as usize * row_len];
        x.par_chunks_mut(row_len)
            .zip(src.par_chunks(row_bytes as usize))
            .try_for_each(|(dst, src)| dequantize_row(info.ty, src, dst))
            .map_err(|error| {
                model_error(
                    input,
                    ModelError::Dequantize {
                        tensor: p.source.clone(),
                        error,
                    },
                )
            })?;
        let mut out = vec![0u8; x.len() * dtype.size() as usize];
        let out_row = row_len * dtype.size() as usize;
        out.par_chunks_mut(out_row)
            .enumerate()
            .try_for_each(|(s, o)| {
                let r = match (p.head, row_order) {
                    (Some(head), _) => permuted_row_of_source(s, head as usize),
                    (None, Some(order)) => order.target(s),
                    (None, None) => s,
                };
                let row = &x[r * row_len..(r + 1) * row_len];
                if col_order.is_none() && p.values == Values::AsRead {
                    dtype.put(row, o);
                    return Ok(());
                }
                let mut v: Vec<f32> = match col_order {
                    Some(order) => (0..row_len).map(|j| row[order.target(j)]).collect(),
                    None => row.to_vec(),
                };
                let index = (start + r as u64) * p.row_len;
                undo_values(p.values, &mut v, dtype, &p.source, index)?;
                dtype.put(&v, o);
                Ok(())
            })
            .map_err(|e| model_error(input, e))?;
        w.write_all(&out).map_err(io_error(path))?;
        model.release(&p.source, first * row_bytes..(first + count) * row_bytes);
        progress.advance(out.len() as u64);
        start += count;
    }
    Ok(())
}

/// Undoes what the converter did to the values of a row (`index`: the row's
/// first value in the GGUF tensor, for messages).
fn undo_values(
    values: Values,
    row: &mut [f32],
    dtype: ExportDtype,
    tensor: &str,
    index: u64,
) -> Result<(), ModelError> {
    match values {
        Values::AsRead => {}
        // Exact: the stored `1 + w` is within a factor of two of 1.
        Values::PlusOne => row.iter_mut().for_each(|v| *v -= 1.0),
        Values::NegExp => {
            for (i, v) in row.iter_mut().enumerate() {
                if v.is_nan() || *v >= 0.0 {
                    return Err(ModelError::NotNegative {
                        tensor: tensor.to_owned(),
                        value: *v,
                        index: index + i as u64,
                    });
                }
                *v = a_log_of(*v, dtype);
            }
        }
    }
    Ok(())
}

/// The `A_log` the converter turned into `a = -exp(A_log)`: of the `dtype`
/// values next to `ln(-a)`, the nearest one that the converter's `-exp` maps
/// back to `a` (so that converting the export gives the same file), else the
/// nearest.
fn a_log_of(a: f32, dtype: ExportDtype) -> f32 {
    let forward = |v: f32| -(f64::from(v).exp() as f32);
    let nearest = dtype.round((-f64::from(a)).ln() as f32);
    if forward(nearest) == a {
        return nearest;
    }
    (1..=4)
        .flat_map(|k| [k, -k])
        .map(|k| dtype.step(nearest, k))
        .find(|&c| forward(c) == a)
        .unwrap_or(nearest)
}

/// The safetensors header for `pieces`, padded to a multiple of 8 bytes.
fn safetensors_header(pieces: &[&Piece], dtype: ExportDtype) -> Vec<u8> {
    let mut h = Map::new();
    h.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0;
    for p in pieces {
        let end = offset + p.bytes(dtype);
        h.insert(
            p.hf.clone(),
            json!({"dtype": dtype.safetensors(), "shape": p.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    // A `Value` with string keys always serialises.
    let mut text = serde_json::to_vec(&Json::Object(h)).unwrap_or_default();
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ExportError> {
    let mut f = File::create(path).map_err(io_error(path))?;
    f.write_all(bytes).map_err(io_error(path))?;
    f.sync_all().map_err(io_error(path))
}

fn pretty(v: &Json) -> Vec<u8> {
    // A `Value` with string keys always serialises.
    let mut s = serde_json::to_vec_pretty(v).unwrap_or_default();
    s.push(b'\n');
    s
}

/// `<out>.partial`, the folder written before the rename.
pub fn partial_dir(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Exports the GGUF model at `input` (a single file or the first of a split)
/// into the folder `out`, which must not exist or be empty.
pub fn export(
    input: &Path,
    out: &Path,
    options: &ExportOptions,
    progress: &dyn Progress,
) -> Result<ExportSummary, ExportError> {
    let model = GgufModel::open(input)?;
    let meta = model.metadata();
    let fail = |problem: ModelError| model_error(input, problem);
    let hp = HyperParams::try_from(meta).map_err(|e| fail(e.into()))?;
    let arch = target(&hp).map_err(fail)?;
    let keys = Keys { hp: &hp };
    let pieces = pieces(&model, arch, &keys).map_err(fail)?;
    let config = config(meta, arch, &keys, &model, options.dtype).map_err(fail)?;
    let tokenizer = tokenizer_files(meta, &keys).map_err(fail)?;
    let generation = generation_config(meta).map_err(fail)?;

    if out.exists() {
        let empty = fs::read_dir(out).map_err(io_error(out))?.next().is_none();
        if !empty {
            return Err(model_error(out, ModelError::NotEmpty));
        }
    }
    let partial = partial_dir(out);
    // Removed by the signal handlers too (a Ctrl-C half way), until renamed.
    let _listed = memwall_format::cleanup::register_dir(&partial);
    if partial.exists() {
        fs::remove_dir_all(&partial).map_err(io_error(&partial))?;
    }
    fs::create_dir_all(&partial).map_err(io_error(&partial))?;
    let result = write_all(
        &model,
        &partial,
        &pieces,
        [&config, &generation],
        &tokenizer,
        options,
        progress,
    );
    let files = match result {
        Ok(files) => files,
        Err(e) => {
            let _ = fs::remove_dir_all(&partial);
            return Err(e);
        }
    };
    if out.exists() {
        fs::remove_dir(out).map_err(io_error(out))?;
    }
    fs::rename(&partial, out).map_err(io_error(out))?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Ok(d) = File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(ExportSummary {
        hf_class: text_class(arch).to_owned(),
        tensors: pieces.len(),
        bytes: pieces.iter().map(|p| p.bytes(options.dtype)).sum(),
        files,
    })
}

fn write_all(
    model: &GgufModel,
    dir: &Path,
    pieces: &[Piece],
    [config, generation]: [&Json; 2],
    tokenizer: &[(&'static str, Vec<u8>)],
    options: &ExportOptions,
    progress: &dyn Progress,
) -> Result<Vec<String>, ExportError> {
    let dtype = options.dtype;
    let mut files = Vec::new();
    for (name, value) in [
        ("config.json", config),
        ("generation_config.json", generation),
    ] {
        write_file(&dir.join(name), &pretty(value))?;
        files.push(name.to_owned());
    }
    for (name, bytes) in tokenizer {
        write_file(&dir.join(name), bytes)?;
        files.push((*name).to_owned());
    }

    // Shards in tensor order, each at most max_shard_size (a bigger tensor alone).
    let mut shards: Vec<Vec<&Piece>> = Vec::new();
    let mut current: Vec<&Piece> = Vec::new();
    let mut size = 0;
    for p in pieces {
        let b = p.bytes(dtype);
        if !current.is_empty() && size + b > options.max_shard_size {
            shards.push(std::mem::take(&mut current));
            size = 0;
        }
        current.push(p);
        size += b;
    }
    shards.push(current);
    let n = shards.len();
    let total: u64 = pieces.iter().map(|p| p.bytes(dtype)).sum();
    progress.start("exporting", total, Unit::Bytes);
    let mut weight_map = std::collections::BTreeMap::new();
    for (i, shard) in shards.iter().enumerate() {
        let name = if n == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        };
        let path = dir.join(&name);
        // Large and written once: around the page cache where the system allows.
        let mut w = DirectWriter::create(&path).map_err(io_error(&path))?;
        w.write_all(&safetensors_header(shard, dtype))
            .map_err(io_error(&path))?;
        for p in shard {
            progress.item(&p.hf);
            write_piece(model, p, dtype, &mut w, &path, progress)?;
            weight_map.insert(p.hf.clone(), name.clone());
        }
        let file = w.finish().map_err(io_error(&path))?;
        file.sync_all().map_err(io_error(&path))?;
        files.push(name);
    }
    progress.finish();
    if n > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join("model.safetensors.index.json");
        write_file(&path, &pretty(&index))?;
        files.push("model.safetensors.index.json".to_owned());
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_maps_back_to_the_stored_decay_in_every_dtype() {
        let forward = |v: f32| -(f64::from(v).exp() as f32);
        for dtype in [ExportDtype::F32, ExportDtype::Bf16, ExportDtype::F16] {
            for i in 0..2000 {
                // A_log of gated delta nets: logs of 1..16, and some near 0.
                let a_log = dtype.round(-0.5 + 3.3 * i as f32 / 2000.0);
                let a = forward(a_log);
                assert_eq!(forward(a_log_of(a, dtype)), a, "{dtype:?} {a_log}");
            }
        }
    }

    #[test]
    fn a_decay_that_is_not_negative_names_the_tensor_and_index() {
        let mut row = [-1.5f32, 0.25, -2.0];
        let err = undo_values(Values::NegExp, &mut row, ExportDtype::F32, "blk.0.ssm_a", 8)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "tensor blk.0.ssm_a: value 0.25 at 9 is not negative, so it is no -exp(A_log)"
        );
    }

    #[test]
    fn plus_one_norms_come_back_exactly() {
        for i in 0..1000 {
            let w = ExportDtype::Bf16.round((i as f32 - 500.0) * 1.7e-4);
            let mut row = [w + 1.0];
            undo_values(Values::PlusOne, &mut row, ExportDtype::Bf16, "n", 0).unwrap();
            assert_eq!(ExportDtype::Bf16.round(row[0]), w, "{w}");
        }
    }
}
