//! SentencePiece vocabularies (`tokenizer.model`) against llama.cpp's converter:
//! memwall-synth's tiny llama, mistral and mixtral checkpoints with the tokenizer of
//! fixtures/spm (byte fallback, added tokens from added_tokens.json and
//! tokenizer_config.json, padding ids) convert to llama.cpp's files byte for byte
//! (recorded by fixtures/spm/convert_reference.sh).

mod common;

use common::{fixtures, options, sha};

use std::path::{Path, PathBuf};

use memwall_convert::job::convert;
use memwall_convert::tensors::OutType;
use memwall_fixtures::synth::{Options, preset, write_checkpoint};
use memwall_format::gguf::{Array, GgufFile, Value};
use memwall_format::progress::Silent;
use serde_json::Value as Json;

fn recorded() -> Json {
    let text = std::fs::read_to_string(fixtures().join("spm/llama-convert.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn checkpoint(dir: &Path, arch: &str) -> PathBuf {
    let mut p = preset(&format!("tiny-{arch}")).unwrap();
    p.shape.vocab = 2008;
    let options = Options {
        tokenizer_dir: Some(fixtures().join("spm")),
        ..Options::default()
    };
    let out = dir.join(arch);
    write_checkpoint(&out, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    out
}

#[test]
fn vocabulary_equals_llama_cpps() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path(), "llama");
    let out = dir.path().join("l.gguf");
    convert(&ckpt, &out, &options(OutType::F16, None), &Silent).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let m = f.metadata();
    let want = &reference["vocab"];
    let tokens: Vec<&str> = want["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap(),
        tokens.as_slice()
    );
    let Some(Value::Array(Array::F32(scores))) = m.get("tokenizer.ggml.scores") else {
        panic!("no scores");
    };
    let want_scores: Vec<f32> = want["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(scores, &want_scores);
    let Some(Value::Array(Array::I32(types))) = m.get("tokenizer.ggml.token_type") else {
        panic!("no token types");
    };
    let want_types: Vec<i32> = want["token_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_i64().unwrap() as i32)
        .collect();
    assert_eq!(types, &want_types);
}

#[test]
fn whole_files_equal_llama_cpps() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    for (arch, expected) in reference["archs"].as_object().unwrap() {
        let ckpt = checkpoint(dir.path(), arch);
        let st = std::fs::read(ckpt.join("model.safetensors")).unwrap();
        assert_eq!(
            sha(&st),
            expected["safetensors_sha256"].as_str().unwrap(),
            "{arch}: synth input"
        );
        for (outtype, want) in expected["outtypes"].as_object().unwrap() {
            let out = dir.path().join(format!("{arch}-{outtype}.gguf"));
            convert(
                &ckpt,
                &out,
                &options(OutType::parse(outtype).unwrap(), None),
                &Silent,
            )
            .unwrap();
            let bytes = std::fs::read(&out).unwrap();
            assert_eq!(
                sha(&bytes),
                want["sha256"].as_str().unwrap(),
                "{arch} {outtype}"
            );
        }
    }
}

#[test]
fn damaged_tokenizer_model_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path(), "llama");
    let model = ckpt.join("tokenizer.model");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() - 3]).unwrap();
    let out = dir.path().join("x.gguf");
    let err = convert(&ckpt, &out, &options(OutType::F16, None), &Silent)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer.model"), "{err}");
    assert!(!out.exists());
    std::fs::write(
        &model,
        b"not a protobuf at all \xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    )
    .unwrap();
    let err = convert(&ckpt, &out, &options(OutType::F16, None), &Silent)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tokenizer.model"), "{err}");
}
