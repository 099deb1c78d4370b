//! `memwall inspect` as a user runs it: snapshot tests of what it prints.

mod common;

use common::{memwall, repo, stdout_of};

const SMOLLM2: &str = "fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

fn require_smollm2() {
    assert!(
        repo().join(SMOLLM2).exists(),
        "missing fixture {SMOLLM2}: run fixtures/fetch.sh (scripts/test.sh runs it for you)"
    );
}

#[test]
fn inspect_smollm2() {
    require_smollm2();
    insta::assert_snapshot!(stdout_of(&["inspect", SMOLLM2]));
}

#[test]
fn inspect_smollm2_json() {
    require_smollm2();
    let text = stdout_of(&["inspect", "--json", SMOLLM2]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["totals"]["all"]["parameters"], 134_515_008);
    assert_eq!(v["tensors"].as_array().unwrap().len(), 272);
    assert_eq!(v["hyperparameters"]["block_count"], 30);
    assert_eq!(v["tokenizer"]["pre"], "smollm");
    assert_eq!(v["file_type"]["name"], "Q4_1");
    let tokens = &v["metadata"].as_array().unwrap()[24];
    assert_eq!(tokens["key"], "tokenizer.ggml.tokens");
    assert_eq!(tokens["value"]["len"], 49152);
    // --full lists every element.
    let full = stdout_of(&["inspect", "--json", "--full", SMOLLM2]);
    let v: serde_json::Value = serde_json::from_str(&full).unwrap();
    assert_eq!(v["metadata"][24]["value"].as_array().unwrap().len(), 49152);
}

#[test]
fn inspect_llama_cpp_quantized_json() {
    insta::assert_snapshot!(stdout_of(&[
        "inspect",
        "--json",
        "fixtures/llamacpp/tiny-q4_k_m.gguf"
    ]));
}

#[test]
fn inspect_split_model() {
    insta::assert_snapshot!(stdout_of(&[
        "inspect",
        "fixtures/llamacpp/tiny-q4_k_m-split-00002-of-00003.gguf"
    ]));
}

#[test]
fn inspect_errors_are_clear_and_exit_nonzero() {
    let out = memwall(&["inspect", "Cargo.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    insta::assert_snapshot!(String::from_utf8(out.stderr).unwrap(), @r#"
    memwall: error: Cargo.toml: not a valid GGUF file: at byte 0: bad magic "[wor", expected "GGUF" (is this a GGUF file?)
    hint: the file is damaged, truncated or not GGUF; download or convert it again (a .safetensors checkpoint needs `memwall convert` first)
    "#);

    let out = memwall(&["inspect", "no/such/file.gguf"]);
    assert_eq!(out.status.code(), Some(1));
    insta::assert_snapshot!(String::from_utf8(out.stderr).unwrap(), @r"
    memwall: error: no/such/file.gguf: No such file or directory (os error 2)
    hint: check that the path exists and is readable
    ");

    let out = memwall(&["inspect"]);
    assert_eq!(out.status.code(), Some(2), "usage errors exit with 2");
}
