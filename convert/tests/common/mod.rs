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

/// The converter's options as the CLI sets them by default: `outtype`, the
/// pre-tokenizer `pre` (or recognised), the quantizer's encoder, no split,
/// multi-token-prediction blocks kept.
pub fn options(
    outtype: memwall_convert::tensors::OutType,
    pre: Option<&str>,
) -> memwall_convert::job::Options<'static> {
    memwall_convert::job::Options {
        outtype,
        pre: pre.map(str::to_owned),
        encode: &quantize,
        allow_nonfinite: false,
        split_max_size: None,
        no_mtp: false,
    }
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

/// A tensor as a record lists it: name, type, GGUF dims, SHA-256 of its bytes.
pub type TensorRecord = (String, String, Vec<u64>, String);

/// The planned tensors of a checkpoint, each encoded as the converter
/// writes it.
pub fn planned_tensors(
    ckpt: &memwall_convert::checkpoint::Checkpoint,
    planned: &[memwall_convert::tensors::Planned],
) -> Vec<TensorRecord> {
    use memwall_convert::tensors::{encode, rows};
    planned
        .iter()
        .map(|p| {
            let x = rows(ckpt, p, 0, p.rows()).unwrap();
            let bytes = encode(p, &x, &quantize).unwrap();
            (
                p.name.clone(),
                p.ty.name().to_uppercase(),
                p.dims.clone(),
                sha(&bytes),
            )
        })
        .collect()
}

/// The tensors of a record (`fixtures/gguf_record.py`'s `tensors` list).
pub fn recorded_tensors(want: &Value) -> Vec<TensorRecord> {
    want["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t[0].as_str().unwrap().to_owned(),
                t[1].as_str().unwrap().to_owned(),
                t[2].as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect(),
                t[3].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Our tensors equal the record's, one by one (a failure names the first
/// that differs).
pub fn assert_tensors(ours: &[TensorRecord], theirs: &[TensorRecord], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: tensor count");
    for (a, b) in ours.iter().zip(theirs) {
        assert_eq!(a, b, "{what}");
    }
}

/// Converts the checkpoint `dir` to `out` (`outtype`, the pre-tokenizer
/// `pre` or recognised, multi-token-prediction blocks unless `no_mtp`) and
/// checks the file's size and SHA-256 against the record `want`.
pub fn assert_converts_to(
    dir: &Path,
    out: &Path,
    (outtype, pre, no_mtp): (&str, Option<&str>, bool),
    want: &Value,
    what: &str,
) {
    use memwall_convert::job::{Options, convert};
    use memwall_convert::tensors::OutType;
    let options = Options {
        no_mtp,
        ..options(OutType::parse(outtype).unwrap(), pre)
    };
    convert(dir, out, &options, &memwall_format::progress::Silent).unwrap();
    let bytes = std::fs::read(out).unwrap();
    assert_eq!(
        bytes.len() as u64,
        want["bytes"].as_u64().unwrap(),
        "{what} {outtype}"
    );
    assert_eq!(
        sha(&bytes),
        want["sha256"].as_str().unwrap(),
        "{what} {outtype}"
    );
}

/// llama.cpp's tokenizer test files: texts separated by
/// `\n__ggml_vocab_test__\n` in `.inp`, one line of ids per text in `.out`; a
/// repeated text counts once (test-tokenizer-0 keeps them in a map).
pub fn vocab_test_cases(vocab: &Path) -> std::collections::BTreeMap<String, Vec<u32>> {
    let read = |ext: &str| {
        let mut p = vocab.as_os_str().to_owned();
        p.push(ext);
        std::fs::read_to_string(p).unwrap()
    };
    let (inp, out) = (read(".inp"), read(".out"));
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        let (text, next) = rest
            .split_once("\n__ggml_vocab_test__\n")
            .unwrap_or((rest, ""));
        texts.push(text);
        rest = next;
    }
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(texts.len(), lines.len(), ".inp and .out differ in length");
    texts
        .into_iter()
        .zip(lines)
        .map(|(text, line)| {
            let ids = line
                .split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect();
            (text.to_owned(), ids)
        })
        .collect()
}

/// Exports the vocabulary of llama.cpp's vocabulary file `vocab` into a
/// temporary folder and checks that the tokenizer.json there encodes (and,
/// with `decode`, decodes) llama.cpp's test texts as its `.inp`/`.out` say.
pub fn assert_exported_vocabulary_passes(vocab: &Path, decode: bool) -> tempfile::TempDir {
    use memwall_convert::export::tokenizer_files_of;
    let f = memwall_format::gguf::GgufFile::open(vocab).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in tokenizer_files_of(f.metadata()).unwrap() {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let tokenizer = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let cases = vocab_test_cases(vocab);
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for (text, want) in &cases {
        let got = tokenizer.encode(text.as_str(), false).unwrap();
        assert_eq!(got.get_ids(), want, "{text:?}");
        if decode {
            assert_eq!(tokenizer.decode(want, false).unwrap(), *text, "{text:?}");
        }
    }
    dir
}
