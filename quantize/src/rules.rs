//! llama.cpp's per-tensor type selection: which tensors are quantized at all,
//! which get more bits in the `_S`/`_M`/`_L` mixes, and the fallbacks for rows
//! that are not a multiple of a type's block.
//!
//! Source: `src/llama-quant.cpp` of llama.cpp 0c1e570 (`tensor_allows_quantization`,
//! `llama_tensor_get_type_impl`, `tensor_type_fallback`, `llama_tensor_get_type`,
//! `init_quantize_state_counters`), re-expressed here; the tests compare every
//! tensor's type with what `llama-quantize` chose for tiny-zh and SmolLM2.
//! Branches for file types memwall cannot encode (IQ1–IQ3, NVFP4, Q1_0, Q2_0) are kept
//! so that `--dry-run` plans them the way llama.cpp would.

use memwall_format::GgmlType;
use memwall_format::ggml_type::FileTypeInfo;
use memwall_format::gguf::{Metadata, MetadataError};

/// The broad role of a tensor, from its name (`tensor_get_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// `token_embd.weight` (and Gemma's `per_layer_token_embd.weight`).
    TokenEmbd,
    /// `attn_q.weight`.
    AttnQ,
    /// `attn_v.weight`.
    AttnV,
    /// `attn_k.weight`.
    AttnK,
    /// Fused `attn_qkv.weight`.
    AttnQkv,
    /// MLA `attn_kv_b.weight`.
    AttnKvB,
    /// `attn_output.weight`.
    AttnOutput,
    /// Anything with `ffn_up` in its name (incl. experts).
    FfnUp,
    /// Anything with `ffn_gate` in its name (incl. experts and the router's
    /// `ffn_gate_inp`, which is never quantized).
    FfnGate,
    /// Anything with `ffn_down` in its name.
    FfnDown,
    /// `output.weight`.
    Output,
    /// Everything else.
    Other,
}

impl Category {
    /// The category of a tensor name; the first test that matches wins, in
    /// llama.cpp's order.
    pub fn of(name: &str) -> Category {
        if name == "output.weight" {
            return Category::Output;
        }
        if is_token_embd(name) {
            return Category::TokenEmbd;
        }
        const BY_SUBSTRING: [(&str, Category); 9] = [
            ("attn_qkv.weight", Category::AttnQkv),
            ("attn_kv_b.weight", Category::AttnKvB),
            ("attn_v.weight", Category::AttnV),
            ("attn_k.weight", Category::AttnK),
            ("attn_q.weight", Category::AttnQ),
            ("attn_output.weight", Category::AttnOutput),
            ("ffn_up", Category::FfnUp),
            ("ffn_gate", Category::FfnGate),
            ("ffn_down", Category::FfnDown),
        ];
        BY_SUBSTRING
            .iter()
            .find(|(s, _)| name.contains(s))
            .map_or(Category::Other, |&(_, c)| c)
    }

    /// Value-like attention tensors, which the mixes treat as most sensitive.
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

fn is_token_embd(name: &str) -> bool {
    name == "token_embd.weight" || name == "per_layer_token_embd.weight"
}

/// Substrings of tensors llama.cpp never quantizes (small, or not weights
/// of a matrix product).
const NEVER_QUANTIZED: [&str; 36] = [
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
    // BERT's position and token-type embeddings (LLM_TN names).
    "position_embd.weight",
];

/// Whether llama.cpp would quantize this tensor at all: 2-D or 3-D, named
/// `*weight`, not a norm, router, positional table or one of the small
/// tensors listed in `NEVER_QUANTIZED`; `output.weight` only when
/// `quantize_output` (false under `--leave-output-tensor`).
pub fn allows_quantization(name: &str, n_dims: usize, quantize_output: bool) -> bool {
    if n_dims < 2 || !name.ends_with("weight") {
        return false;
    }
    if !quantize_output && name == "output.weight" {
        return false;
    }
    if name == "token_types.weight" {
        return false;
    }
    !NEVER_QUANTIZED.iter().any(|s| name.contains(s))
}

/// Whether llama-quantize refuses to write `target` for the tensor `name`
/// of a file of type `ftype` without an importance matrix
/// (`tensor_requires_imatrix`): the 1–3-bit lattice i-quants (IQ1_S, IQ1_M,
/// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS) and Q2_K in a Q2_K_S file, except for the
/// token embeddings and the output head.
pub fn requires_imatrix(name: &str, target: GgmlType, ftype: &str) -> bool {
    if matches!(Category::of(name), Category::TokenEmbd | Category::Output) {
        return false;
    }
    match target {
        GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS => true,
        GgmlType::Q2_K => ftype == "Q2_K_S",
        _ => false,
    }
}

/// Dimensions as ggml counts them (`ggml_n_dims`): trailing 1s do not count.
pub fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// The number in a `blk.N.` prefix, as llama.cpp's `sscanf("blk.%d.")` reads
/// it (optional sign, then digits, then a dot).
pub fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest.find('.')?;
    rest[..end].parse().ok()
}

/// Why the metadata does not tell the type rules what they need.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FactsError {
    /// A key has a value of the wrong type.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// `general.architecture` is absent.
    #[error("metadata has no general.architecture")]
    NoArchitecture,
    /// A count is not a non-negative integer that fits u32.
    #[error("metadata key {key} is not a non-negative integer")]
    NotAnInteger {
        /// The key.
        key: String,
    },
    /// `{arch}.block_count` is absent.
    #[error("metadata has no {arch}.block_count")]
    NoBlockCount {
        /// The architecture.
        arch: String,
    },
    /// `{arch}.block_count` is 0 or more than 512.
    #[error("{arch}.block_count is {n_layer}; expected 1 to 512")]
    BlockCount {
        /// The architecture.
        arch: String,
        /// The count found.
        n_layer: u32,
    },
}

/// Why the type rules cannot choose a tensor's type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    /// The file type is a removed one: it has no base type.
    #[error("file type {ftype} has no base type")]
    NoBaseType {
        /// The file type's name.
        ftype: &'static str,
    },
    /// The chosen type does not fit the row length and has no fallback.
    #[error("no fallback is defined for type {ty} ({tensor})")]
    NoFallback {
        /// The chosen type.
        ty: GgmlType,
        /// The tensor.
        tensor: String,
    },
    /// An FFN tensor of a MoE model has no `blk.N.` in its name.
    #[error("cannot tell the layer of tensor {tensor}")]
    UnknownLayer {
        /// The tensor.
        tensor: String,
    },
    /// An FFN tensor of a MoE model is in a block the model does not have.
    #[error("tensor {tensor} is in layer {layer}; the model has {n_layer}")]
    LayerOutOfRange {
        /// The tensor.
        tensor: String,
        /// Its `blk.N` number.
        layer: i64,
        /// The model's blocks.
        n_layer: u32,
    },
}

/// What the type choice needs to know about the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFacts {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: u32,
    /// Attention heads of layer 0.
    pub n_head: u32,
    /// KV heads of layer 0 (defaults to `n_head`).
    pub n_head_kv: u32,
    /// `{arch}.expert_count` (0 for dense models).
    pub n_expert: u32,
}

impl ModelFacts {
    /// Reads the facts from GGUF metadata. Head counts may be per-layer
    /// arrays; llama.cpp's rules look at layer 0.
    pub fn from_metadata(meta: &Metadata) -> Result<ModelFacts, FactsError> {
        let arch = meta
            .get_str("general.architecture")?
            .ok_or(FactsError::NoArchitecture)?
            .to_owned();
        let int = |key: String| -> Result<Option<u32>, FactsError> {
            let Some(v) = meta.get(&key) else {
                return Ok(None);
            };
            let first = match v.as_array() {
                Some(a) => a.get(0).and_then(|e| e.as_u64()),
                None => v.as_u64(),
            };
            first
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or(FactsError::NotAnInteger { key })
        };
        let n_layer = int(format!("{arch}.block_count"))?
            .ok_or_else(|| FactsError::NoBlockCount { arch: arch.clone() })?;
        if n_layer == 0 || n_layer > 512 {
            return Err(FactsError::BlockCount { arch, n_layer });
        }
        let n_head = int(format!("{arch}.attention.head_count"))?.unwrap_or(0);
        let n_head_kv = int(format!("{arch}.attention.head_count_kv"))?.unwrap_or(n_head);
        let n_expert = int(format!("{arch}.expert_count"))?.unwrap_or(0);
        Ok(ModelFacts {
            arch,
            n_layer,
            n_head,
            n_head_kv,
            n_expert,
        })
    }

    fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp gives 70B-class models (80 layers with grouped-query
    /// attention) Q5_K value projections in the 3- and 4-bit mixes.
    fn is_70b(&self) -> bool {
        match self.arch.as_str() {
            "llama" => self.n_layer == 80 && self.n_head != self.n_head_kv,
            "qwen2" | "deci" | "olmo" => self.n_layer == 80,
            "jais2" => self.n_layer == 68,
            _ => false,
        }
    }

    fn is_falcon(&self) -> bool {
        self.arch == "falcon"
    }
}

/// Why a tensor got its type; shown by `--dry-run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Not quantized (1-D, a norm, a router, …): kept as it is.
    Kept,
    /// The file type's base type.
    Base,
    /// One of the mix's per-tensor rules.
    Mix,
    /// A `--tensor-type` pattern or recipe rule (its text).
    Pattern(String),
    /// `--output-tensor-type`.
    OutputType,
    /// `--token-embedding-type`.
    EmbeddingType,
    /// The chosen type does not fit the row length; this is the type it fell back from.
    Fallback(GgmlType),
}

/// A type override: tensors whose name the pattern finds (anywhere in the
/// name, as `std::regex_search` does) get `ty`, optionally only in some layers.
#[derive(Clone, Debug)]
pub struct Override {
    /// The pattern as written.
    pub text: String,
    /// Compiled pattern.
    pub regex: regex::Regex,
    /// Type to give.
    pub ty: GgmlType,
    /// Inclusive layer ranges the rule is limited to; empty means all tensors.
    pub layers: Vec<(u32, u32)>,
    /// Applies even when the file type is a float type. llama.cpp ignores
    /// `--tensor-type` for F32/F16/BF16 file types (false there); recipe
    /// rules always apply (true).
    pub always: bool,
}

impl Override {
    /// Whether the rule applies to a tensor name.
    pub fn matches(&self, name: &str) -> bool {
        if !self.regex.is_match(name) {
            return false;
        }
        if self.layers.is_empty() {
            return true;
        }
        layer_of(name).is_some_and(|l| {
            self.layers
                .iter()
                .any(|&(a, b)| (i64::from(a)..=i64::from(b)).contains(&l))
        })
    }
}

/// The options of `llama-quantize` that decide tensor types.
#[derive(Clone, Debug)]
pub struct MixOptions {
    /// The file type (`Q4_K_M`, …).
    pub ftype: &'static FileTypeInfo,
    /// `--pure`: every quantizable tensor gets the base type (after fallback).
    pub pure: bool,
    /// An importance matrix is given (changes a few IQ/Q4_0 rules).
    pub has_imatrix: bool,
    /// `--output-tensor-type`.
    pub output_type: Option<GgmlType>,
    /// `--token-embedding-type`.
    pub token_embedding_type: Option<GgmlType>,
    /// `--leave-output-tensor`.
    pub leave_output: bool,
    /// `--tensor-type` rules and recipe rules, first match wins.
    pub overrides: Vec<Override>,
}

/// A tensor's chosen type and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Output type.
    pub ty: GgmlType,
    /// Why.
    pub reason: Reason,
}

/// Chooses tensor types in llama.cpp's order; stateful, because the mixes
/// count value projections and FFN down projections as they go. Feed it the
/// tensors in the order they will be written.
pub struct Mixer {
    facts: ModelFacts,
    options: MixOptions,
    tied_embeddings: bool,
    n_attention_wv: u32,
    i_attention_wv: u32,
    i_ffn_down: u32,
    i_ffn_gate: u32,
    i_ffn_up: u32,
    /// How many tensors needed a fallback type.
    pub fallbacks: u32,
}

/// The fallback for a row length the type's block does not divide
/// (`tensor_type_fallback`); `None` when there is none.
pub(crate) fn fallback_for(ty: GgmlType) -> Option<GgmlType> {
    use GgmlType::*;
    Some(match ty {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_0 | Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other if other.block_size() <= 32 => other,
        _ => return None,
    })
}

impl Mixer {
    /// A mixer for a model whose tensors (all of them, in output order) are `names`.
    pub fn new<'a>(
        facts: ModelFacts,
        options: MixOptions,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Mixer {
        let mut tied_embeddings = true;
        let mut n_attention_wv = 0;
        for name in names {
            let category = Category::of(name);
            if category.is_attn_v() {
                n_attention_wv += 1;
            }
            if category == Category::Output {
                tied_embeddings = false;
            }
        }
        Mixer {
            facts,
            options,
            tied_embeddings,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
            fallbacks: 0,
        }
    }

    /// The options this mixer applies.
    pub fn options(&self) -> &MixOptions {
        &self.options
    }

    /// Whether `token_embd.weight` doubles as the output projection.
    pub fn tied_embeddings(&self) -> bool {
        self.tied_embeddings
    }

    /// The type of the next tensor (`llama_tensor_get_type`). `dims` is the
    /// GGUF shape (`dims[0]` the row length), `current` its type in the input.
    pub fn choose(
        &mut self,
        name: &str,
        dims: &[u64],
        current: GgmlType,
    ) -> Result<Choice, MixError> {
        let keep = Choice {
            ty: current,
            reason: Reason::Kept,
        };
        if !allows_quantization(name, n_dims(dims), !self.options.leave_output) {
            return Ok(keep);
        }
        let category = Category::of(name);
        if let Some(ty) = self.options.token_embedding_type {
            // `per_layer_token_embd` may still be named by an explicit pattern.
            let named = name == "per_layer_token_embd.weight"
                && self.options.overrides.iter().any(|o| o.matches(name));
            if category == Category::TokenEmbd && !named {
                return Ok(Choice {
                    ty,
                    reason: Reason::EmbeddingType,
                });
            }
        }
        if let (Some(ty), Category::Output) = (self.options.output_type, category) {
            return Ok(Choice {
                ty,
                reason: Reason::OutputType,
            });
        }
        let base = self.options.ftype.base.ok_or(MixError::NoBaseType {
            ftype: self.options.ftype.name,
        })?;
        if !base.is_quantized() {
            if let Some(o) = self
                .options
                .overrides
                .iter()
                .find(|o| o.always && o.matches(name))
            {
                return self.fit(
                    name,
                    dims,
                    Choice {
                        ty: o.ty,
                        reason: Reason::Pattern(o.text.clone()),
                    },
                );
            }
            return Ok(Choice {
                ty: base,
                reason: Reason::Base,
            });
        }
        let mut choice = Choice {
            ty: base,
            reason: Reason::Base,
        };
        if let Some(o) = self.options.overrides.iter().find(|o| o.matches(name)) {
            choice = Choice {
                ty: o.ty,
                reason: Reason::Pattern(o.text.clone()),
            };
        } else if !self.options.pure {
            let ty = self.mix_type(base, name, dims, category)?;
            let reason = if ty == base {
                Reason::Base
            } else {
                Reason::Mix
            };
            choice = Choice { ty, reason };
        }
        self.fit(name, dims, choice)
    }

    /// Replaces a type whose block does not divide the row length by its
    /// fallback (`tensor_type_fallback`), or F16 when that does not fit either.
    fn fit(&mut self, name: &str, dims: &[u64], choice: Choice) -> Result<Choice, MixError> {
        let row = dims.first().copied().unwrap_or(0);
        if row % choice.ty.block_size() == 0 {
            return Ok(choice);
        }
        self.fallbacks += 1;
        let from = choice.ty;
        let mut ty = fallback_for(from).ok_or_else(|| MixError::NoFallback {
            ty: from,
            tensor: name.to_owned(),
        })?;
        if row % ty.block_size() != 0 {
            ty = GgmlType::F16;
        }
        Ok(Choice {
            ty,
            reason: Reason::Fallback(from),
        })
    }

    /// The mix's rules (`llama_tensor_get_type_impl`), starting from the base type.
    fn mix_type(
        &mut self,
        base: GgmlType,
        name: &str,
        dims: &[u64],
        category: Category,
    ) -> Result<GgmlType, MixError> {
        use GgmlType as T;
        let ft = self.options.ftype.name;
        let f = &self.facts;
        let falcon = f.is_falcon();
        let gqa = f.n_gqa();
        let n_expert = f.n_expert;
        let has_imatrix = self.options.has_imatrix;
        let use_more_bits =
            |i: u32, n: u32| i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2;
        let is = |names: &[&str]| names.contains(&ft);
        let iq_low = ["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"];
        let iq2s_or_m = is(&["IQ2_S", "IQ2_M"]);
        let mut ty = base;

        if category == Category::Output || (self.tied_embeddings && category == Category::TokenEmbd)
        {
            if let Some(t) = self.options.output_type {
                return Ok(t);
            }
            let nx = dims.first().copied().unwrap_or(0);
            if ft == "MXFP4_MOE" || falcon || nx % base.block_size() != 0 {
                ty = T::Q8_0;
            } else if is(&[
                "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M",
            ]) {
                ty = T::Q5_K;
            } else if ty != T::Q8_0 {
                ty = T::Q6_K;
            }
            return Ok(ty);
        }
        if ft == "MXFP4_MOE" {
            return Ok(if dims.get(2).copied().unwrap_or(1) > 1 {
                T::MXFP4
            } else {
                T::Q8_0
            });
        }
        match category {
            Category::TokenEmbd => {
                if let Some(t) = self.options.token_embedding_type {
                    ty = t;
                } else if is(&["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"]) {
                    ty = T::Q2_K;
                } else if is(&["IQ2_S", "IQ2_M", "IQ3_XXS"]) {
                    ty = T::IQ3_S;
                } else if is(&["TQ1_0", "TQ2_0", "Q2_0"]) {
                    ty = T::Q4_K;
                }
            }
            _ if is(&iq_low) => {
                if category.is_attn_v() {
                    ty = if gqa >= 4 || n_expert >= 4 {
                        T::Q4_K
                    } else if iq2s_or_m {
                        T::IQ3_S
                    } else {
                        T::Q2_K
                    };
                    self.i_attention_wv += 1;
                } else if n_expert == 8 && category == Category::AttnK {
                    ty = T::Q4_K;
                } else if category == Category::FfnDown {
                    if self.i_ffn_down < f.n_layer / 8 {
                        ty = if iq2s_or_m { T::IQ3_S } else { T::Q2_K };
                    }
                    self.i_ffn_down += 1;
                } else if category == Category::AttnOutput {
                    if n_expert == 8 {
                        ty = T::Q5_K;
                    } else if is(&["IQ1_S", "IQ1_M"]) {
                        ty = T::IQ2_XXS;
                    } else if iq2s_or_m {
                        ty = T::IQ3_S;
                    }
                }
            }
            c if c.is_attn_v() => {
                let i = self.i_attention_wv;
                match ft {
                    "Q2_K" => ty = if gqa >= 4 { T::Q4_K } else { T::Q3_K },
                    "Q2_K_S" if gqa >= 4 => ty = T::Q4_K,
                    "IQ3_XXS" => {
                        ty = if gqa >= 4 {
                            T::Q4_K
                        } else if !has_imatrix {
                            T::IQ3_S
                        } else {
                            T::IQ3_XXS
                        }
                    }
                    "IQ3_XS" | "IQ3_S" if gqa >= 4 => ty = T::Q4_K,
                    "IQ3_M" => ty = T::Q4_K,
                    "Q3_K_M" => ty = if i < 2 { T::Q5_K } else { T::Q4_K },
                    "Q3_K_L" => ty = T::Q5_K,
                    "IQ4_NL" | "IQ4_XS" if gqa >= 4 => ty = T::Q5_K,
                    "Q4_K_M" | "Q5_K_M" if use_more_bits(i, self.n_attention_wv) => ty = T::Q6_K,
                    "Q4_K_S" if i < 4 => ty = T::Q5_K,
                    _ => {}
                }
                if f.is_70b() && matches!(ty, T::Q3_K | T::Q4_K) {
                    ty = T::Q5_K;
                }
                if n_expert == 8 {
                    ty = T::Q8_0;
                }
                self.i_attention_wv += 1;
            }
            Category::AttnK => {
                if n_expert == 8 {
                    ty = T::Q8_0;
                } else if ft == "IQ3_XS" {
                    ty = T::IQ3_XXS;
                } else if ft == "IQ3_XXS" {
                    ty = T::IQ2_S;
                }
            }
            Category::AttnQ => {
                if ft == "IQ3_XS" {
                    ty = T::IQ3_XXS;
                } else if ft == "IQ3_XXS" {
                    ty = T::IQ2_S;
                }
            }
            Category::FfnDown => {
                let (i, n) = self.layer_info(self.i_ffn_down, name)?;
                match ft {
                    "Q2_K" => ty = T::Q3_K,
                    "Q2_K_S" if i < n / 8 => ty = T::Q4_K,
                    "IQ3_XXS" if !has_imatrix => ty = if i < n / 8 { T::Q4_K } else { T::Q3_K },
                    "Q3_K_M" => {
                        ty = if i < n / 16 {
                            T::Q5_K
                        } else if !falcon || use_more_bits(i, n) {
                            T::Q4_K
                        } else {
                            T::Q3_K
                        }
                    }
                    "IQ3_M" if i < n / 8 || (n_expert == 8 && use_more_bits(i, n)) => ty = T::Q4_K,
                    "Q3_K_L" => ty = if falcon { T::Q4_K } else { T::Q5_K },
                    "Q4_K_M" => {
                        if falcon {
                            ty = if i < n / 16 {
                                T::Q6_K
                            } else if use_more_bits(i, n) {
                                T::Q5_K
                            } else {
                                T::Q4_K
                            };
                        } else if use_more_bits(i, n) {
                            ty = T::Q6_K;
                        }
                    }
                    "IQ4_NL" | "IQ4_XS" if i < n / 8 && !has_imatrix => ty = T::Q5_K,
                    "Q5_K_M" if use_more_bits(i, n) => ty = T::Q6_K,
                    "Q4_K_S" if !falcon && i < n / 8 => ty = T::Q5_K,
                    "Q4_0" | "Q5_0" if has_imatrix && i < n / 8 => {
                        ty = if ft == "Q4_0" { T::Q4_1 } else { T::Q5_1 }
                    }
                    _ => {}
                }
                self.i_ffn_down += 1;
            }
            Category::AttnOutput => {
                if !falcon {
                    if n_expert == 8 {
                        if is(&[
                            "Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S",
                            "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS",
                        ]) {
                            ty = T::Q5_K;
                        }
                    } else {
                        match ft {
                            "Q2_K" => ty = T::Q3_K,
                            "IQ3_XXS" => ty = T::IQ3_S,
                            "Q3_K_M" | "IQ3_M" => ty = T::Q4_K,
                            "Q3_K_L" => ty = T::Q5_K,
                            _ => {}
                        }
                    }
                } else if ft == "Q3_K_L" {
                    ty = T::Q4_K;
                }
            }
            Category::AttnQkv => match ft {
                "Q3_K_M" | "Q3_K_L" | "IQ3_M" => ty = T::Q4_K,
                "Q4_K_M" => ty = T::Q5_K,
                "Q5_K_M" => ty = T::Q6_K,
                _ => {}
            },
            Category::FfnGate | Category::FfnUp => {
                let counter = if category == Category::FfnGate {
                    self.i_ffn_gate
                } else {
                    self.i_ffn_up
                };
                let (i, n) = self.layer_info(counter, name)?;
                if ft == "IQ3_XS" && i >= n / 8 && i < 7 * n / 8 {
                    ty = T::IQ3_XXS;
                }
                if category == Category::FfnGate {
                    self.i_ffn_gate += 1;
                } else {
                    self.i_ffn_up += 1;
                }
            }
            _ => {}
        }
        Ok(ty)
    }

    /// The layer of an FFN tensor: the running count for dense models, the
    /// `blk.N.` number for MoE models (whose expert tensors are not in
    /// layer order).
    fn layer_info(&self, counter: u32, name: &str) -> Result<(u32, u32), MixError> {
        let n = self.facts.n_layer;
        if self.facts.n_expert.max(1) > 1 {
            let layer = layer_of(name).ok_or_else(|| MixError::UnknownLayer {
                tensor: name.to_owned(),
            })?;
            if layer < 0 || layer >= i64::from(n) {
                return Err(MixError::LayerOutOfRange {
                    tensor: name.to_owned(),
                    layer,
                    n_layer: n,
                });
            }
            return Ok((layer as u32, n));
        }
        Ok((counter, n))
    }
}

/// llama.cpp's tensor order (`weight_name_comparer`): by `blk.N` layer
/// (tensors outside blocks first), then by name.
pub fn llama_order(a: &str, b: &str) -> std::cmp::Ordering {
    let la = layer_of(a).unwrap_or(-1);
    let lb = layer_of(b).unwrap_or(-1);
    la.cmp(&lb).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_llama_cpp_precedence() {
        assert_eq!(Category::of("output.weight"), Category::Output);
        assert_eq!(Category::of("token_embd.weight"), Category::TokenEmbd);
        assert_eq!(Category::of("blk.3.attn_qkv.weight"), Category::AttnQkv);
        assert_eq!(Category::of("blk.3.attn_v.weight"), Category::AttnV);
        assert_eq!(
            Category::of("blk.0.ffn_gate_exps.weight"),
            Category::FfnGate
        );
        assert_eq!(
            Category::of("blk.0.ffn_down_shexp.weight"),
            Category::FfnDown
        );
        assert_eq!(Category::of("blk.0.attn_norm.weight"), Category::Other);
    }

    #[test]
    fn quantizable_tensors() {
        assert!(allows_quantization("blk.0.attn_q.weight", 2, true));
        assert!(allows_quantization("blk.0.ffn_up_exps.weight", 3, true));
        assert!(!allows_quantization("blk.0.attn_norm.weight", 1, true));
        assert!(!allows_quantization("blk.0.attn_q_norm.weight", 2, true));
        assert!(!allows_quantization("blk.0.ffn_gate_inp.weight", 2, true));
        assert!(!allows_quantization("blk.0.attn_q.bias", 2, true));
        assert!(!allows_quantization("output.weight", 2, false));
        assert!(allows_quantization("output.weight", 2, true));
        assert!(!allows_quantization("rope_freqs.weight", 1, true));
    }

    #[test]
    fn layers_parse_like_sscanf() {
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("token_embd.weight"), None);
        let mut names = vec![
            "output.weight",
            "blk.10.a",
            "blk.2.b",
            "blk.2.a",
            "token_embd.weight",
        ];
        names.sort_by(|a, b| llama_order(a, b));
        assert_eq!(
            names,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
    }

    #[test]
    fn fallbacks_match_llama_cpp() {
        assert_eq!(fallback_for(GgmlType::Q4_K), Some(GgmlType::Q5_0));
        assert_eq!(fallback_for(GgmlType::Q6_K), Some(GgmlType::Q8_0));
        assert_eq!(fallback_for(GgmlType::IQ4_XS), Some(GgmlType::IQ4_NL));
        assert_eq!(fallback_for(GgmlType::Q8_0), Some(GgmlType::Q8_0));
    }
}
