//! `memwall convert` as a user runs it.

mod common;

use common::{memwall, stdout_of};
use sha2::{Digest, Sha256};

#[test]
fn tiny_zh_converts_to_llama_cpps_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tz.gguf");
    stdout_of(&[
        "convert",
        "fixtures/tiny-zh",
        "--pre",
        "gpt-2",
        "-o",
        out.to_str().unwrap(),
    ]);
    let ours = Sha256::digest(std::fs::read(&out).unwrap());
    let theirs = Sha256::digest(
        std::fs::read(common::repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf")).unwrap(),
    );
    assert_eq!(ours, theirs);
}

#[test]
fn missing_pre_tokenizer_and_bad_paths_fail_with_a_next_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let run = |args: &[&str]| {
        let o = memwall(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        String::from_utf8(o.stderr).unwrap()
    };
    // tiny-zh's vocabulary is its own: llama.cpp does not recognise it either.
    let err = run(&["convert", "fixtures/tiny-zh", "-o", out.to_str().unwrap()]);
    assert!(
        err.contains("not one llama.cpp recognises") && err.contains("--pre"),
        "{err}"
    );
    let err = run(&["convert", "HuggingFaceTB/SmolLM2-135M", "--pre", "smollm"]);
    assert!(err.contains("huggingface-cli download"), "{err}");
    let err = run(&[
        "convert",
        "fixtures/tiny-zh",
        "--pre",
        "gpt-2",
        "--outtype",
        "q4_k",
    ]);
    assert!(err.contains("f32, f16, bf16 or q8_0"), "{err}");
    // A checkpoint without weights: named, and nothing written.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(
        empty.join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"]}"#,
    )
    .unwrap();
    let err = run(&[
        "convert",
        empty.to_str().unwrap(),
        "--pre",
        "gpt-2",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(err.contains("no model.safetensors"), "{err}");
    assert!(!out.exists());
}
