//! `config.json` as llama.cpp's converter sees it. llama.cpp reads the config
//! through `transformers.AutoConfig(...).to_dict()`, which fills every key the
//! file leaves out with the config class's default; those defaults reach the
//! GGUF (a Llama config without `head_dim` still gets `attention.key_length`,
//! a Qwen3 one gets 128). memwall reads the file itself and fills the keys it
//! uses from this table, taken from transformers 5.24.0
//! (`AutoConfig.for_model(model_type).to_dict()`, printed by
//! fixtures/synth/config_defaults_reference.sh).

use serde_json::{Map, Value};

/// How a missing key is filled.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// A constant integer.
    Int(u64),
    /// A constant float.
    Float(f64),
    /// The value of another key (`num_key_value_heads` = `num_attention_heads`).
    Same(&'static str),
    /// `hidden_size / num_attention_heads`.
    HiddenPerHead,
}

use Fill::{Float, HiddenPerHead, Int, Same};

/// Per `model_type`: (key, default), for the keys memwall reads.
const DEFAULTS: &[(&str, &[(&str, Fill)])] = &[
    (
        "llama",
        &[
            ("max_position_embeddings", Int(2048)),
            ("num_key_value_heads", Same("num_attention_heads")),
            ("rope_theta", Float(10000.0)),
            ("rms_norm_eps", Float(1e-6)),
            ("head_dim", HiddenPerHead),
        ],
    ),
    (
        "mistral",
        &[
            ("max_position_embeddings", Int(131072)),
            ("num_key_value_heads", Int(8)),
            ("rope_theta", Float(10000.0)),
            ("rms_norm_eps", Float(1e-6)),
            ("head_dim", HiddenPerHead),
        ],
    ),
    (
        "mixtral",
        &[
            ("max_position_embeddings", Int(131072)),
            ("num_key_value_heads", Int(8)),
            ("rope_theta", Float(1e6)),
            ("rms_norm_eps", Float(1e-5)),
            ("num_local_experts", Int(8)),
            ("num_experts_per_tok", Int(2)),
        ],
    ),
    (
        "qwen2",
        &[
            ("max_position_embeddings", Int(32768)),
            ("num_key_value_heads", Int(32)),
            ("rope_theta", Float(10000.0)),
            ("rms_norm_eps", Float(1e-6)),
        ],
    ),
    (
        "qwen3",
        &[
            ("max_position_embeddings", Int(32768)),
            ("num_key_value_heads", Int(32)),
            ("rope_theta", Float(10000.0)),
            ("rms_norm_eps", Float(1e-6)),
            ("head_dim", Int(128)),
        ],
    ),
    (
        "qwen3_moe",
        &[
            ("max_position_embeddings", Int(32768)),
            ("num_key_value_heads", Int(4)),
            ("rope_theta", Float(10000.0)),
            ("rms_norm_eps", Float(1e-6)),
            ("num_experts", Int(128)),
            ("num_experts_per_tok", Int(8)),
            ("moe_intermediate_size", Int(768)),
        ],
    ),
    ("qwen3_5_text", QWEN35),
    ("qwen3_5_moe_text", QWEN35),
    (
        "cohere",
        &[
            ("max_position_embeddings", Int(8192)),
            ("num_key_value_heads", Same("num_attention_heads")),
            ("rope_theta", Float(500000.0)),
            ("layer_norm_eps", Float(1e-5)),
            ("logit_scale", Float(0.0625)),
        ],
    ),
];

/// Qwen3.5's text models (`Qwen3_5TextConfig`, `Qwen3_5MoeTextConfig`).
const QWEN35: &[(&str, Fill)] = &[
    ("max_position_embeddings", Int(32768)),
    ("rms_norm_eps", Float(1e-6)),
    ("head_dim", Int(256)),
    ("linear_conv_kernel_dim", Int(4)),
    ("linear_key_head_dim", Int(128)),
    ("linear_value_head_dim", Int(128)),
    ("linear_num_key_heads", Int(16)),
    ("linear_num_value_heads", Int(32)),
];

/// Keys that stand for the same setting: one present means the default is not needed.
fn aliases(key: &str) -> &[&str] {
    match key {
        "num_experts" | "num_local_experts" => &["num_experts", "num_local_experts"],
        _ => &[],
    }
}

fn present(c: &Map<String, Value>, key: &str) -> bool {
    let set = |k: &str| c.get(k).is_some_and(|v| !v.is_null());
    if key == "rope_theta" {
        // transformers 5 keeps the base inside rope_parameters.
        let nested = ["rope_parameters", "rope_scaling"]
            .iter()
            .any(|r| c.get(*r).and_then(|p| p.get("rope_theta")).is_some());
        return set(key) || nested;
    }
    set(key) || aliases(key).iter().any(|k| set(k))
}

/// Fills the keys `config` leaves out (or sets to null) as transformers does for
/// its `model_type`; other model types are left as they are.
pub fn with_defaults(config: &mut Value) {
    let Some(c) = config.as_object_mut() else {
        return;
    };
    let model_type = c.get("model_type").and_then(Value::as_str).unwrap_or("");
    if model_type == "gemma4_text" {
        gemma4_defaults(c);
        return;
    }
    let qwen35 = model_type.starts_with("qwen3_5");
    let Some((_, defaults)) = DEFAULTS.iter().find(|(t, _)| *t == model_type) else {
        if let Some(text) = c.get_mut("text_config") {
            with_defaults(text);
        }
        return;
    };
    if qwen35 {
        qwen35_defaults(c);
    }
    for (key, default) in defaults.iter() {
        if present(c, key) {
            continue;
        }
        let value = match *default {
            Int(n) => Value::from(n),
            Float(f) => Value::from(f),
            Same(other) => match c.get(other) {
                Some(v) if !v.is_null() => v.clone(),
                _ => continue,
            },
            HiddenPerHead => {
                let get = |k: &str| c.get(k).and_then(Value::as_u64);
                match (get("hidden_size"), get("num_attention_heads")) {
                    (Some(h), Some(n)) if n > 0 => Value::from(h / n),
                    _ => continue,
                }
            }
        };
        c.insert((*key).to_owned(), value);
    }
}

/// What `Qwen3_5TextConfig` derives: `layer_types` from
/// `full_attention_interval` (default 4), and the rope parameters' default
/// base and `partial_rotary_factor` (0.25); the MoE model's expert counts.
fn qwen35_defaults(c: &mut Map<String, Value>) {
    let layers = c.get("num_hidden_layers").and_then(Value::as_u64);
    if let (None, Some(n)) = (c.get("layer_types").filter(|v| !v.is_null()), layers) {
        let interval = c
            .get("full_attention_interval")
            .and_then(Value::as_u64)
            .unwrap_or(4)
            .max(1);
        let types: Vec<Value> = (1..=n)
            .map(|i| {
                Value::from(if i % interval == 0 {
                    "full_attention"
                } else {
                    "linear_attention"
                })
            })
            .collect();
        c.insert("layer_types".into(), Value::Array(types));
    }
    let theta = c.get("rope_theta").cloned();
    let rope = c
        .entry("rope_parameters")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(r) = rope.as_object_mut() {
        let theta = theta.unwrap_or(Value::from(10000.0));
        r.entry("rope_theta").or_insert(theta);
        r.entry("rope_type").or_insert(Value::from("default"));
        r.entry("partial_rotary_factor")
            .or_insert(Value::from(0.25));
    }
    if c.get("model_type").and_then(Value::as_str) == Some("qwen3_5_moe_text") {
        for (key, default) in [
            ("num_key_value_heads", 2),
            ("num_experts", 256),
            ("num_experts_per_tok", 8),
            ("moe_intermediate_size", 512),
            ("shared_expert_intermediate_size", 512),
        ] {
            c.entry(key).or_insert(Value::from(default));
        }
    } else {
        c.entry("num_key_value_heads").or_insert(Value::from(4));
    }
}

/// What `Gemma4TextConfig` makes of a config (its `__post_init__` and
/// defaults), for the keys the converter reads: `layer_types` (every sixth
/// layer global by default, and the last always), the two rope parameter
/// sets, and the global layers' head size and KV heads resolved from
/// `global_head_dim` / `num_global_key_value_heads` (the latter only with
/// `attention_k_eq_v`) or from a saved `per_layer_config`, left as
/// `global_head_dim` and, when it applies, `num_global_key_value_heads`.
fn gemma4_defaults(c: &mut Map<String, Value>) {
    for (key, default) in [
        ("hidden_size", Value::from(2304)),
        ("intermediate_size", Value::from(9216)),
        ("num_hidden_layers", Value::from(30)),
        ("num_attention_heads", Value::from(8)),
        ("num_key_value_heads", Value::from(4)),
        ("head_dim", Value::from(256)),
        ("max_position_embeddings", Value::from(131_072)),
        ("rms_norm_eps", Value::from(1e-6)),
        ("sliding_window", Value::from(512)),
        ("vocab_size", Value::from(262_144)),
        ("hidden_size_per_layer_input", Value::from(256)),
        ("num_kv_shared_layers", Value::from(0)),
        ("attention_k_eq_v", Value::from(false)),
        ("use_double_wide_mlp", Value::from(false)),
        ("tie_word_embeddings", Value::from(true)),
    ] {
        if c.get(key).is_none_or(Value::is_null) {
            c.insert(key.to_owned(), default);
        }
    }
    let n = c
        .get("num_hidden_layers")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if c.get("layer_types").is_none_or(Value::is_null) {
        let types = (1..=n)
            .map(|i| {
                Value::from(if i % 6 == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                })
            })
            .collect();
        c.insert("layer_types".into(), Value::Array(types));
    }
    if let Some(Value::Array(types)) = c.get_mut("layer_types")
        && let Some(last) = types.last_mut()
    {
        *last = Value::from("full_attention");
    }
    if c.get("rope_parameters").is_none_or(Value::is_null) {
        c.insert(
            "rope_parameters".into(),
            serde_json::json!({
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1000000.0},
            }),
        );
    }
    // The global layers' overrides: a saved per_layer_config, else the
    // published keys.
    let full: Vec<usize> = c
        .get("layer_types")
        .and_then(Value::as_array)
        .map(|t| {
            t.iter()
                .enumerate()
                .filter(|(_, v)| v.as_str() == Some("full_attention"))
                .map(|(i, _)| i)
                .collect()
        })
        .unwrap_or_default();
    let overrides = c
        .get("per_layer_config")
        .and_then(Value::as_object)
        .map(|m| {
            let find = |key: &str| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.parse::<usize>().ok()?, v.get(key)?.clone())))
                    .find(|(l, _)| full.contains(l))
                    .map(|(_, v)| v)
            };
            (find("head_dim"), find("num_key_value_heads"))
        });
    let (head, kv) = match overrides {
        Some(o) => o,
        None => {
            let k_eq_v = c
                .get("attention_k_eq_v")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            (
                Some(
                    c.get("global_head_dim")
                        .cloned()
                        .unwrap_or(Value::from(512)),
                ),
                c.get("num_global_key_value_heads")
                    .filter(|v| !v.is_null() && k_eq_v)
                    .cloned(),
            )
        }
    };
    match head {
        Some(h) => c.insert("global_head_dim".into(), h),
        None => c.remove("global_head_dim"),
    };
    match kv {
        Some(k) => c.insert("num_global_key_value_heads".into(), k),
        None => c.remove("num_global_key_value_heads"),
    };
}

/// Gemma 4's layer kinds and global heads from a config (after
/// [`with_defaults`]), for the tensor table; `None` for other models.
pub fn gemma_dims(c: &Value) -> Option<memwall_format::arch::GemmaDims> {
    if c.get("model_type").and_then(Value::as_str) != Some("gemma4_text") {
        return None;
    }
    let num = |k: &str| c.get(k).and_then(Value::as_u64);
    let sliding = c
        .get("layer_types")?
        .as_array()?
        .iter()
        .map(|t| t.as_str() == Some("sliding_attention"))
        .collect();
    let k_eq_v = c
        .get("attention_k_eq_v")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Some(memwall_format::arch::GemmaDims {
        global_head_dim: num("global_head_dim").or(num("head_dim"))?,
        global_kv_heads: num("num_global_key_value_heads").or(num("num_key_value_heads"))?,
        k_eq_v,
        sliding,
    })
}

/// A multimodal config (Qwen3.5's `…ForConditionalGeneration`) as llama.cpp's
/// converter reads it for the text model: the keys of `text_config` (with
/// its own defaults) moved to the top, over the outer ones. The outer
/// `architectures` stays, naming the checkpoint's class.
pub fn flatten_text_config(config: &mut Value) {
    let Some(c) = config.as_object_mut() else {
        return;
    };
    let Some(Value::Object(text)) = c.get("text_config").cloned() else {
        return;
    };
    let architectures = c.get("architectures").cloned();
    for (k, v) in text {
        c.insert(k, v);
    }
    if let Some(a) = architectures {
        c.insert("architectures".into(), a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fills_what_transformers_fills() {
        let mut c = json!({"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9});
        with_defaults(&mut c);
        assert_eq!(c["head_dim"], 64);
        assert_eq!(c["num_key_value_heads"], 9);
        assert_eq!(c["max_position_embeddings"], 2048);
        let mut c = json!({"model_type": "qwen3", "head_dim": null,
            "rope_parameters": {"rope_theta": 5.0}, "num_key_value_heads": 2});
        with_defaults(&mut c);
        assert_eq!(c["head_dim"], 128);
        assert_eq!(c["num_key_value_heads"], 2);
        assert!(c.get("rope_theta").is_none());
        let mut c = json!({"model_type": "qwen3_moe", "num_local_experts": 4});
        with_defaults(&mut c);
        assert!(c.get("num_experts").is_none());
        let mut c = json!({"model_type": "gpt2"});
        with_defaults(&mut c);
        assert_eq!(c, json!({"model_type": "gpt2"}));
    }
}
