//! Helpers shared by the converter's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use memwall_format::GgmlType;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The repository's `fixtures/` folder.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// SHA-256 as lowercase hex.
pub fn sha(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

/// The quantizer's row encoder, as the CLI passes it (Q8_0 output).
pub fn quantize(
    ty: GgmlType,
    x: &[f32],
    y: &mut [u8],
) -> Result<(), memwall_convert::tensors::RowEncodeError> {
    Ok(memwall_quantize::quantize_row(ty, x, y)?)
}

/// Keys the converter derives from config.json (not naming, not tokenizer).
pub fn is_model_key(k: &str) -> bool {
    !k.starts_with("tokenizer.")
        && ![
            "general.architecture",
            "general.type",
            "general.name",
            "general.size_label",
        ]
        .contains(&k)
}

/// The keys between `general.size_label` and the tokenizer, as (key, type, value text).
pub fn model_keys(meta: &memwall_format::gguf::Metadata) -> Vec<(String, String, String)> {
    use memwall_format::gguf::Value as V;
    meta.iter()
        .filter(|(k, _)| is_model_key(k))
        .map(|(k, v)| {
            let (ty, text) = match v {
                V::U32(n) => ("UINT32", n.to_string()),
                V::F32(f) => ("FLOAT32", f.to_string()),
                V::Bool(b) => ("BOOL", b.to_string()),
                V::String(s) => ("STRING", s.clone()),
                V::Array(memwall_format::gguf::Array::Bool(a)) => {
                    ("ARRAY", serde_json::json!(a).to_string())
                }
                V::Array(memwall_format::gguf::Array::I32(a)) => {
                    ("ARRAY", serde_json::json!(a).to_string())
                }
                other => ("OTHER", format!("{other:?}")),
            };
            (k.to_owned(), ty.to_owned(), text)
        })
        .collect()
}

pub fn recorded_keys(metadata: &Value) -> Vec<(String, String, String)> {
    metadata
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| is_model_key(k))
        .map(|(k, v)| {
            let ty = v["types"][0].as_str().unwrap().to_owned();
            let text = match ty.as_str() {
                "FLOAT32" => (v["value"].as_f64().unwrap() as f32).to_string(),
                "STRING" => v["value"].as_str().unwrap().to_owned(),
                _ => v["value"].to_string(),
            };
            (k.clone(), ty, text)
        })
        .collect()
}

/// Tokenizer keys as (key, type, value or SHA-256 of the JSON of long arrays).
pub fn tokenizer_keys(meta: &memwall_format::gguf::Metadata) -> Vec<(String, String)> {
    use memwall_format::gguf::{Array as A, Value as V};
    let json_sha = |v: serde_json::Value| {
        // Python's json.dumps(ensure_ascii=False): ", " between elements.
        let items: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.to_string())
            .collect();
        sha(format!("[{}]", items.join(", ")).as_bytes())
    };
    meta.iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| {
            let text = match v {
                V::U32(n) => format!("UINT32 {n}"),
                V::Bool(b) => format!("BOOL {}", if *b { "True" } else { "False" }),
                V::String(s) => format!("STRING {s}"),
                V::Array(A::String(a)) => format!("STRING[] {}", json_sha(serde_json::json!(a))),
                V::Array(A::I32(a)) => format!("INT32[] {}", json_sha(serde_json::json!(a))),
                other => format!("{other:?}"),
            };
            (k.to_owned(), text)
        })
        .collect()
}

pub fn recorded_tokenizer_keys(metadata: &Value) -> Vec<(String, String)> {
    metadata
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| {
            let types: Vec<&str> = v["types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect();
            let text = match (types.as_slice(), v.get("sha256")) {
                (["ARRAY", t], Some(h)) => format!("{t}[] {}", h.as_str().unwrap()),
                (["BOOL"], _) => format!(
                    "BOOL {}",
                    if v["value"].as_bool().unwrap() {
                        "True"
                    } else {
                        "False"
                    }
                ),
                (["STRING"], _) => format!("STRING {}", v["value"].as_str().unwrap()),
                ([t], _) => format!("{t} {}", v["value"]),
                _ => format!("{v}"),
            };
            (k.clone(), text)
        })
        .collect()
}
