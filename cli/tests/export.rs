//! `memwall export` as a user runs it: GGUF → checkpoint folder → GGUF again.

mod common;

use common::{memwall, stdout_of};
use sha2::{Digest, Sha256};

#[test]
fn export_then_convert_gives_back_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("tiny-zh");
    let original = common::repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf");
    let report = stdout_of(&[
        "export",
        original.to_str().unwrap(),
        ckpt.to_str().unwrap(),
        "--dtype",
        "f32",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["architecture"], "LlamaForCausalLM");
    assert_eq!(report["dtype"], "f32");
    let files: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(files.contains(&"model.safetensors") && files.contains(&"tokenizer.json"));
    let out = dir.path().join("again.gguf");
    stdout_of(&[
        "convert",
        ckpt.to_str().unwrap(),
        "--pre",
        "gpt-2",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        Sha256::digest(std::fs::read(&out).unwrap()),
        Sha256::digest(std::fs::read(&original).unwrap())
    );
}

#[test]
fn export_errors_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let original = common::repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf");
    let run = |args: &[&str]| {
        let o = memwall(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        String::from_utf8(o.stderr).unwrap()
    };
    let busy = dir.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("x"), "x").unwrap();
    let err = run(&["export", original.to_str().unwrap(), busy.to_str().unwrap()]);
    assert!(err.contains("not empty"), "{err}");
    let out = dir.path().join("out");
    let err = run(&[
        "export",
        original.to_str().unwrap(),
        out.to_str().unwrap(),
        "--dtype",
        "q4_0",
    ]);
    assert!(err.contains("bf16, f16 or f32"), "{err}");
    let err = run(&["export", "no-such.gguf", out.to_str().unwrap()]);
    assert!(
        err.contains("no-such.gguf") && err.contains("hint:"),
        "{err}"
    );
    assert!(!out.exists());
}
