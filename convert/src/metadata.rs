//! The model keys llama.cpp's converter writes from `config.json`, in its
//! order: the hyper-parameters (`TextModel.set_gguf_parameters`), the file
//! type, then each architecture's own keys (`LlamaModel`, `Qwen2MoeModel`,
//! `CommandR2Model`), then `general.quantization_version`.
//!
//! Not yet here: the `general.*` naming keys and the tokenizer.

use memwall_format::gguf::{Array, Metadata, Value};

use crate::arch::Arch;
use crate::tensors::OutType;

/// `general.quantization_version` (`GGML_QUANT_VERSION`).
pub const QUANTIZATION_VERSION: u32 = 2;

/// A `config.json` hyper-parameter that is missing or cannot be written as
/// llama.cpp's converter writes it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigValueError {
    /// A key that must be a non-negative integer (that fits 32 bits) is not.
    #[error("config.json: {key} must be a non-negative integer, got {value}")]
    NotUnsigned {
        /// The key.
        key: &'static str,
        /// Its value.
        value: serde_json::Value,
    },
    /// A key that must be a number is not.
    #[error("config.json: {key} must be a number, got {value}")]
    NotNumber {
        /// The key.
        key: &'static str,
        /// Its value.
        value: serde_json::Value,
    },
    /// A number that overflows float32.
    #[error("config.json: {key} = {value} does not fit a 32-bit float")]
    F32Overflow {
        /// The key.
        key: &'static str,
        /// Its value.
        value: serde_json::Value,
    },
    /// A key the architecture needs is missing.
    #[error("config.json has no {0}")]
    Missing(&'static str),
    /// YaRN rope scaling without its original context length.
    #[error("config.json: YaRN rope scaling needs original_max_position_embeddings")]
    YarnOriginalContext,
    /// `layer_types` is not a list.
    #[error("config.json: layer_types must be a list of layer types")]
    NotLayerTypes,
    /// `layer_types` has another length than the layer count.
    #[error("config.json: layer_types has {found} entries for {layers} layers")]
    LayerTypes {
        /// Entries.
        found: usize,
        /// `num_hidden_layers`.
        layers: u32,
    },
    /// A rope type llama.cpp does not know.
    #[error(
        "config.json: rope type {0:?} is not one llama.cpp knows (default, linear, yarn, longrope, dynamic, llama3)"
    )]
    RopeType(String),
}

/// `rope.dimension_sections`: the config's `mrope_section` as INT32, padded
/// with zeros to four entries (llama.cpp keeps the first four).
fn mrope_sections(v: &serde_json::Value) -> Result<Value, ConfigValueError> {
    let bad = || ConfigValueError::NotUnsigned {
        key: "rope_parameters.mrope_section",
        value: v.clone(),
    };
    let mut out = Vec::new();
    for x in v.as_array().ok_or_else(bad)? {
        out.push(
            x.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(bad)?,
        );
    }
    out.resize(out.len().max(4), 0);
    out.truncate(4);
    Ok(Value::Array(Array::I32(out)))
}

/// Qwen3.5's own keys after the file type, in llama.cpp's order
/// (`Qwen2MoeModel`, `_QwenMtpMixin`, `Qwen3NextModel`, `_Qwen35MRopeMixin`).
fn hybrid_keys(
    meta: &mut Metadata,
    config: &serde_json::Value,
    key: &dyn Fn(&str) -> String,
    nextn: u32,
) -> Result<(), ConfigValueError> {
    let h = Hparams(config);
    let need = |k: &'static str| h.uint(&[k])?.ok_or(ConfigValueError::Missing(k));
    for (k, v) in [
        (
            "expert_feed_forward_length",
            h.uint(&["moe_intermediate_size"])?,
        ),
        (
            "expert_shared_feed_forward_length",
            h.uint(&["shared_expert_intermediate_size"])?,
        ),
    ] {
        if let Some(v) = v {
            meta.set(key(k), Value::U32(v));
        }
    }
    if nextn > 0 {
        meta.set(key("nextn_predict_layers"), Value::U32(nextn));
    }
    let v_heads = need("linear_num_value_heads")?;
    for (gguf, hf) in [
        ("ssm.conv_kernel", "linear_conv_kernel_dim"),
        ("ssm.state_size", "linear_key_head_dim"),
        ("ssm.group_count", "linear_num_key_heads"),
    ] {
        meta.set(key(gguf), Value::U32(need(hf)?));
    }
    meta.set(key("ssm.time_step_rank"), Value::U32(v_heads));
    let inner = need("linear_value_head_dim")?.checked_mul(v_heads).ok_or(
        ConfigValueError::NotUnsigned {
            key: "linear_value_head_dim",
            value: config["linear_value_head_dim"].clone(),
        },
    )?;
    meta.set(key("ssm.inner_size"), Value::U32(inner));
    if let Some(types) = config.get("layer_types").filter(|v| !v.is_null()) {
        let layers = need("num_hidden_layers")?;
        let list = types.as_array().ok_or(ConfigValueError::NotLayerTypes)?;
        if list.len() != layers as usize {
            return Err(ConfigValueError::LayerTypes {
                found: list.len(),
                layers,
            });
        }
        let mut recurrent: Vec<bool> = list
            .iter()
            .map(|t| t.as_str() == Some("linear_attention"))
            .collect();
        recurrent.resize(recurrent.len() + nextn as usize, false);
        meta.set(
            key("attention.recurrent_layers"),
            Value::Array(Array::Bool(recurrent)),
        );
    }
    let interval = h.uint(&["full_attention_interval"])?.unwrap_or(4);
    meta.set(key("full_attention_interval"), Value::U32(interval));
    let rope = config
        .get("rope_parameters")
        .or_else(|| config.get("rope_scaling"))
        .filter(|v| v.is_object());
    let head_dim = match h.uint(&["head_dim"])? {
        Some(d) => d,
        None => {
            let hidden = need("hidden_size")?;
            hidden / need("num_attention_heads")?.max(1)
        }
    };
    let factor = rope
        .and_then(|r| r.get("partial_rotary_factor"))
        .and_then(|v| v.as_f64())
        .unwrap_or(0.25);
    meta.set(
        key("rope.dimension_count"),
        Value::U32((f64::from(head_dim) * factor) as u32),
    );
    if rope.and_then(|r| r.get("mrope_section")).is_none() {
        meta.set(
            key("rope.dimension_sections"),
            Value::Array(Array::I32(vec![11, 11, 10, 0])),
        );
    }
    Ok(())
}

/// Gemma 4's keys after the file type, in llama.cpp's order
/// (`Gemma3Model`, then `Gemma4Model.set_gguf_parameters`): keys written
/// again keep their place and take the later value, as gguf-py's writer
/// does (`key_length`, `value_length`, `head_count_kv`).
fn gemma4_keys(
    meta: &mut Metadata,
    config: &serde_json::Value,
    key: &dyn Fn(&str) -> String,
) -> Result<(), ConfigValueError> {
    let h = Hparams(config);
    let need = |k: &'static str| h.uint(&[k])?.ok_or(ConfigValueError::Missing(k));
    if let Some(cap) = h.float(&["final_logit_softcapping"])?.filter(|&c| c != 0.0) {
        meta.set(key("final_logit_softcapping"), Value::F32(cap));
    }
    for (gguf, hf) in [
        ("attention.sliding_window", "sliding_window"),
        ("attention.head_count_kv", "num_key_value_heads"),
        ("attention.shared_kv_layers", "num_kv_shared_layers"),
    ] {
        meta.set(key(gguf), Value::U32(need(hf)?));
    }
    meta.set(
        key("embedding_length_per_layer_input"),
        Value::U32(h.uint(&["hidden_size_per_layer_input"])?.unwrap_or(0)),
    );
    let types = config
        .get("layer_types")
        .and_then(|t| t.as_array())
        .ok_or(ConfigValueError::NotLayerTypes)?;
    let swa: Vec<bool> = types
        .iter()
        .map(|t| t.as_str() == Some("sliding_attention"))
        .collect();
    meta.set(
        key("attention.sliding_window_pattern"),
        Value::Array(Array::Bool(swa.clone())),
    );
    let head_full = need("global_head_dim")?;
    let head_swa = need("head_dim")?;
    meta.set(key("attention.key_length"), Value::U32(head_full));
    meta.set(key("attention.value_length"), Value::U32(head_full));
    meta.set(key("attention.key_length_swa"), Value::U32(head_swa));
    meta.set(key("attention.value_length_swa"), Value::U32(head_swa));
    if let Some(f) = h.uint(&["expert_intermediate_size", "moe_intermediate_size"])? {
        meta.set(key("expert_feed_forward_length"), Value::U32(f));
    }
    if config.get("use_double_wide_mlp").and_then(|v| v.as_bool()) == Some(true) {
        let n_ff = need("intermediate_size")?;
        let layers = need("num_hidden_layers")?;
        let first_shared = layers.saturating_sub(need("num_kv_shared_layers")?);
        let widths = (0..layers)
            .map(|l| if l < first_shared { n_ff } else { 2 * n_ff } as i32)
            .collect();
        meta.set(key("feed_forward_length"), Value::Array(Array::I32(widths)));
    }
    if let Some(kv_full) = h.uint(&["num_global_key_value_heads"])? {
        let kv_swa = need("num_key_value_heads")?;
        let heads = swa
            .iter()
            .map(|&s| if s { kv_swa } else { kv_full } as i32)
            .collect();
        meta.set(
            key("attention.head_count_kv"),
            Value::Array(Array::I32(heads)),
        );
    }
    // The sliding layers rotate their whole head (the full layers' partial
    // rotation is the rope_freqs tensor).
    meta.set(key("rope.dimension_count"), Value::U32(head_full));
    meta.set(key("rope.dimension_count_swa"), Value::U32(head_swa));
    Ok(())
}

/// Reads `config.json` values as llama.cpp's `find_hparam` does: the first
/// key present wins.
struct Hparams<'a>(&'a serde_json::Value);

impl Hparams<'_> {
    fn find(&self, keys: &[&'static str]) -> Option<&serde_json::Value> {
        keys.iter()
            .find_map(|k| self.0.get(*k).filter(|v| !v.is_null()))
    }

    fn uint(&self, keys: &[&'static str]) -> Result<Option<u32>, ConfigValueError> {
        self.find(keys)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| ConfigValueError::NotUnsigned {
                        key: keys[0],
                        value: v.clone(),
                    })
            })
            .transpose()
    }

    fn float(&self, keys: &[&'static str]) -> Result<Option<f32>, ConfigValueError> {
        match self.find(keys) {
            None => Ok(None),
            Some(v) if v.is_number() => float32(keys[0], v),
            Some(v) => Err(ConfigValueError::NotNumber {
                key: keys[0],
                value: v.clone(),
            }),
        }
    }
}

/// A JSON number as the float32 gguf-py writes (`None` when it is not a
/// number). gguf-py's `struct.pack` refuses a number that overflows float32,
/// so memwall does too rather than write infinity.
fn float32(key: &'static str, v: &serde_json::Value) -> Result<Option<f32>, ConfigValueError> {
    let Some(f) = v.as_f64() else {
        return Ok(None);
    };
    let x = f as f32;
    if x.is_finite() {
        Ok(Some(x))
    } else {
        Err(ConfigValueError::F32Overflow {
            key,
            value: v.clone(),
        })
    }
}

/// The hyper-parameter keys of `arch` for this config, in llama.cpp's order,
/// appended to `meta`, with the multi-token-prediction blocks the config
/// states (`mtp_num_hidden_layers`). Errors name the config key.
pub fn hparams(
    meta: &mut Metadata,
    config: &serde_json::Value,
    arch: &Arch,
    outtype: OutType,
) -> Result<(), ConfigValueError> {
    let nextn = if arch.hybrid {
        Hparams(config)
            .uint(&["mtp_num_hidden_layers"])?
            .unwrap_or(0)
    } else {
        0
    };
    hparams_with(meta, config, arch, outtype, nextn)
}

/// [`hparams`] with `nextn` multi-token-prediction blocks written after the
/// model's own (a hybrid stack's; 0 for `--no-mtp`).
pub fn hparams_with(
    meta: &mut Metadata,
    config: &serde_json::Value,
    arch: &Arch,
    outtype: OutType,
    nextn: u32,
) -> Result<(), ConfigValueError> {
    let h = Hparams(config);
    let a = arch.gguf;
    let key = |k: &str| format!("{a}.{k}");
    let put_u32 = |meta: &mut Metadata, k: &str, v: Option<u32>| {
        if let Some(v) = v {
            meta.set(key(k), Value::U32(v));
        }
    };
    let block_count = h
        .uint(&["n_layers", "num_hidden_layers", "n_layer", "num_layers"])?
        .ok_or(ConfigValueError::Missing("num_hidden_layers"))?;
    let block_count = block_count.saturating_add(nextn);
    meta.set(key("block_count"), Value::U32(block_count));
    // Command-R's config understates its context; llama.cpp prefers model_max_length.
    let ctx_keys: &[&str] = if a == "command-r" {
        &[
            "model_max_length",
            "max_position_embeddings",
            "n_ctx",
            "n_positions",
            "max_length",
            "max_sequence_length",
        ]
    } else {
        &[
            "max_position_embeddings",
            "n_ctx",
            "n_positions",
            "max_length",
            "max_sequence_length",
            "model_max_length",
        ]
    };
    put_u32(meta, "context_length", h.uint(ctx_keys)?);
    put_u32(
        meta,
        "embedding_length",
        h.uint(&["hidden_size", "n_embd", "dim"])?,
    );
    put_u32(
        meta,
        "feed_forward_length",
        h.uint(&[
            "prefix_dense_intermediate_size",
            "dense_intermediate_size",
            "intermediate_size",
            "n_inner",
            "hidden_dim",
        ])?,
    );
    put_u32(
        meta,
        "attention.head_count",
        h.uint(&["num_attention_heads", "n_head", "n_heads"])?,
    );
    put_u32(
        meta,
        "attention.head_count_kv",
        h.uint(&["num_key_value_heads", "n_kv_heads"])?,
    );
    if config.get("is_causal") == Some(&serde_json::Value::Bool(false)) {
        meta.set(key("attention.causal"), Value::Bool(false));
    }
    // Rope parameters: transformers 5's rope_parameters, or the older rope_scaling + rope_theta.
    let rope = config
        .get("rope_parameters")
        .or_else(|| config.get("rope_scaling"))
        .filter(|v| v.is_object());
    // Models with rope parameters per layer kind (Gemma 4): the full attention
    // layers' set, as llama.cpp reads it.
    let rope = rope.map(|r| r.get("full_attention").unwrap_or(r));
    let rope_get = |k: &str| rope.and_then(|r| r.get(k));
    let rope_type = rope_get("rope_type")
        .or_else(|| rope_get("type"))
        .and_then(|v| v.as_str());
    let rope_f32 = |k: &'static str| rope_get(k).map_or(Ok(None), |v| float32(k, v));
    match rope_type {
        // llama3 is written as the rope_freqs tensor (tensors::llama3_rope_factors) for
        // llama; llama.cpp writes nothing for it elsewhere, nor for dynamic scaling.
        // Gemma 4's proportional rope is written as the rope_freqs tensor.
        None | Some("default") | Some("dynamic") | Some("proportional") => {}
        Some(t) if t.eq_ignore_ascii_case("llama3") => {}
        Some("linear") => {
            if let Some(f) = rope_f32("factor")? {
                meta.set(key("rope.scaling.type"), "linear");
                meta.set(key("rope.scaling.factor"), Value::F32(f));
            }
        }
        Some("yarn") => {
            if let Some(f) = rope_f32("factor")? {
                meta.set(key("rope.scaling.type"), "yarn");
                meta.set(key("rope.scaling.factor"), Value::F32(f));
                let original = rope_get("original_max_position_embeddings")
                    .or_else(|| config.get("original_max_position_embeddings"))
                    .and_then(|v| v.as_u64())
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or(ConfigValueError::YarnOriginalContext)?;
                meta.set(
                    key("rope.scaling.original_context_length"),
                    Value::U32(original),
                );
                let attn = match rope_f32("attention_factor")? {
                    Some(a) => Some(a),
                    None => rope_f32("attn_factor")?,
                };
                for (k, v) in [
                    (
                        "rope.scaling.yarn_ext_factor",
                        rope_f32("extrapolation_factor")?,
                    ),
                    ("rope.scaling.yarn_attn_factor", attn),
                    ("rope.scaling.yarn_beta_fast", rope_f32("beta_fast")?),
                    ("rope.scaling.yarn_beta_slow", rope_f32("beta_slow")?),
                ] {
                    if let Some(v) = v {
                        meta.set(key(k), Value::F32(v));
                    }
                }
            }
        }
        // The factors of LongRoPE models are tensors of architectures memwall does not
        // convert; for these llama.cpp writes the type alone.
        Some("su") | Some("longrope") => {
            meta.set(key("rope.scaling.type"), "longrope");
        }
        Some(other) => {
            return Err(ConfigValueError::RopeType(other.to_owned()));
        }
    }
    // Multi-axis rotary sections (Qwen3.5), padded to four.
    if let Some(sections) = config
        .get("rope_parameters")
        .or_else(|| config.get("rope_scaling"))
        .and_then(|r| r.get("mrope_section"))
    {
        meta.set(key("rope.dimension_sections"), mrope_sections(sections)?);
    }
    let theta = rope_f32("rope_theta")?;
    let theta = match theta {
        Some(t) => Some(t),
        None => h.float(&[
            "global_rope_theta",
            "rope_global_theta",
            "rope_theta_global",
            "rope_theta",
            "rotary_emb_base",
        ])?,
    };
    if let Some(t) = theta {
        meta.set(key("rope.freq_base"), Value::F32(t));
    }
    let swa_theta = config
        .get("rope_parameters")
        .and_then(|r| r.get("sliding_attention"))
        .and_then(|r| r.get("rope_theta"));
    if let Some(t) = swa_theta.map_or(Ok(None), |v| float32("rope_theta", v))? {
        meta.set(key("rope.freq_base_swa"), Value::F32(t));
    }
    if let Some(eps) = h.float(&["rms_norm_eps", "norm_eps"])? {
        meta.set(key("attention.layer_norm_rms_epsilon"), Value::F32(eps));
    }
    if let Some(eps) = h.float(&["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])? {
        meta.set(key("attention.layer_norm_epsilon"), Value::F32(eps));
    }
    put_u32(
        meta,
        "expert_count",
        h.uint(&["num_local_experts", "num_experts", "n_routed_experts"])?,
    );
    put_u32(
        meta,
        "expert_used_count",
        h.uint(&[
            "num_experts_per_tok",
            "num_experts_per_token",
            "top_k_experts",
        ])?,
    );
    if let Some(head_dim) = h.uint(&["head_dim"])? {
        meta.set(key("attention.key_length"), Value::U32(head_dim));
        meta.set(key("attention.value_length"), Value::U32(head_dim));
    }
    meta.set("general.file_type", Value::U32(outtype.file_type()));
    match a {
        "llama" => {
            let vocab = h
                .uint(&["vocab_size"])?
                .ok_or(ConfigValueError::Missing("vocab_size"))?;
            meta.set(key("vocab_size"), Value::U32(vocab));
            let rope_dim = match h.uint(&["head_dim"])? {
                Some(d) => d,
                None => {
                    let hidden = h
                        .uint(&["hidden_size"])?
                        .ok_or(ConfigValueError::Missing("hidden_size"))?;
                    let heads = h.uint(&["num_attention_heads"])?.filter(|&n| n > 0);
                    hidden / heads.ok_or(ConfigValueError::Missing("num_attention_heads"))?
                }
            };
            meta.set(key("rope.dimension_count"), Value::U32(rope_dim));
        }
        "qwen3moe" => {
            put_u32(
                meta,
                "expert_feed_forward_length",
                h.uint(&["moe_intermediate_size"])?,
            );
            put_u32(
                meta,
                "expert_shared_feed_forward_length",
                h.uint(&["shared_expert_intermediate_size"])?,
            );
        }
        "qwen35" | "qwen35moe" => hybrid_keys(meta, config, &key, nextn)?,
        "gemma4" => gemma4_keys(meta, config, &key)?,
        "command-r" => {
            let scale = h
                .float(&["logit_scale"])?
                .ok_or(ConfigValueError::Missing("logit_scale"))?;
            meta.set(key("logit_scale"), Value::F32(scale));
            meta.set(key("rope.scaling.type"), "none");
        }
        _ => {}
    }
    meta.set(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    Ok(())
}
