//! `memwall quantize` as a user runs it: the plan, split models, recipes and
//! the failure paths (exit code, message, nothing left at the output).

mod common;

use std::path::Path;

use common::{memwall, repo, stdout_of as ok};
use sha2::{Digest, Sha256};

fn fails(args: &[&str]) -> String {
    let out = memwall(args);
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail");
    assert!(out.stdout.is_empty());
    String::from_utf8(out.stderr).unwrap()
}

fn sha(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

const TINY_ZH: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";

#[test]
fn dry_run_plans_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.gguf");
    let out_s = out.to_str().unwrap();
    let text = ok(&["quantize", TINY_ZH, out_s, "Q4_K_M", "--dry-run"]);
    assert!(!out.exists());
    insta::assert_snapshot!(text.replace(out_s, "OUT"));
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        "quantize",
        TINY_ZH,
        out_s,
        "Q4_K_M",
        "--dry-run",
        "--json",
    ]))
    .unwrap();
    assert_eq!(json["tensors"].as_array().unwrap().len(), 39);
    // The planned file size is the size of the file then written.
    ok(&["quantize", TINY_ZH, out_s, "Q4_K_M"]);
    assert_eq!(
        json["totals"]["file_bytes"].as_u64().unwrap(),
        std::fs::metadata(&out).unwrap().len()
    );
}

#[test]
fn json_report_and_default_output_name() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("tiny-zh-f16.gguf");
    std::fs::copy(repo().join(TINY_ZH), &input).unwrap();
    let report: serde_json::Value = serde_json::from_str(&ok(&[
        "quantize",
        input.to_str().unwrap(),
        "q8_0",
        "--json",
        "-t",
        "1",
    ]))
    .unwrap();
    let written = dir.path().join("tiny-zh-Q8_0.gguf");
    assert_eq!(report["files"][0]["path"].as_str(), written.to_str());
    assert_eq!(report["threads"], 1);
    assert_eq!(report["file_type"]["name"], "Q8_0");
    assert!(written.exists());
}

#[test]
fn split_models_merge_or_keep_their_split_like_llama_quantize() {
    let text =
        std::fs::read_to_string(repo().join("fixtures/llamacpp/split-quantize.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = "fixtures/llamacpp/tiny-q4_k_m-split-00001-of-00003.gguf";
    let merged = dir.path().join("merged.gguf");
    let err = fails(&["quantize", input, merged.to_str().unwrap(), "Q8_0"]);
    assert!(err.contains("--allow-requantize"), "{err}");
    ok(&[
        "quantize",
        input,
        merged.to_str().unwrap(),
        "Q8_0",
        "--allow-requantize",
    ]);
    assert_eq!(sha(&merged), expected["merged"].as_str().unwrap());
    let kept = dir.path().join("kept.gguf");
    ok(&[
        "quantize",
        input,
        kept.to_str().unwrap(),
        "Q8_0",
        "--allow-requantize",
        "--keep-split",
    ]);
    for (i, want) in expected["kept"].as_array().unwrap().iter().enumerate() {
        let part = dir.path().join(format!("kept-{:05}-of-00003.gguf", i + 1));
        assert_eq!(sha(&part), want.as_str().unwrap(), "{}", part.display());
    }
}

#[test]
fn recipes_by_name_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.gguf");
    ok(&[
        "quantize",
        TINY_ZH,
        out.to_str().unwrap(),
        "--recipe",
        "attn-q8-ffn-q4",
    ]);
    let shown = ok(&["inspect", out.to_str().unwrap()]);
    assert!(shown.contains("memwall.recipe.name") && shown.contains("attn-q8-ffn-q4"));
    let recipe = dir.path().join("mine.toml");
    std::fs::write(
        &recipe,
        "name = \"mine\"\nbase = \"Q5_K_M\"\n[[rule]]\nmatch = 'attn_v'\ntype = \"Q8_0\"\n\
         [[rule]]\nmatch = 'no_such_tensor'\ntype = \"Q8_0\"\n",
    )
    .unwrap();
    let out = memwall(&[
        "quantize",
        TINY_ZH,
        dir.path().join("m.gguf").to_str().unwrap(),
        "--recipe",
        recipe.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("warning: rule 'no_such_tensor' = q8_0 matches no tensor"),
        "{stderr}"
    );
    let err = fails(&["quantize", TINY_ZH, "x.gguf", "--recipe", "no-such-recipe"]);
    assert!(err.contains("built-in: attn-f16-ffn-q4"), "{err}");
}

#[test]
fn bad_input_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let out_s = out.to_str().unwrap();
    let err = fails(&["quantize", TINY_ZH, out_s, "Q9_K"]);
    assert!(
        err.contains("unknown quantization type 'Q9_K'") && err.contains("Q4_K_M"),
        "{err}"
    );
    let err = fails(&[
        "quantize",
        TINY_ZH,
        out_s,
        "Q4_K_M",
        "--tensor-type",
        "attn_v",
    ]);
    assert!(err.contains("expected REGEX=TYPE"), "{err}");
    let err = fails(&[
        "quantize",
        TINY_ZH,
        out_s,
        "Q4_K_M",
        "--output-tensor-type",
        "q7",
    ]);
    assert!(
        err.contains("--output-tensor-type: unknown tensor type 'q7'"),
        "{err}"
    );
    // A truncated input: the error names the file, and nothing is written.
    let bytes = std::fs::read(repo().join(TINY_ZH)).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = fails(&["quantize", cut.to_str().unwrap(), out_s, "Q4_K_M"]);
    assert!(err.contains("cut.gguf") && err.contains("hint:"), "{err}");
    // An imatrix that is not one.
    let err = fails(&["quantize", TINY_ZH, out_s, "Q4_K_M", "--imatrix", TINY_ZH]);
    assert!(err.contains("missing imatrix metadata"), "{err}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().count() == 1,
        "only cut.gguf may exist"
    );
}
