//! `memwall validate`: passes a good quantization, fails (exit 1, naming the
//! problem) on damaged numbers, a missing tensor, or a KL divergence over the limit.

mod common;

use common::{memwall, repo, stdout_of};
use memwall_format::gguf::{GgufFile, GgufWriter, TensorSpec};
use serde_json::Value;

const F16: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const TEXT: &str = "fixtures/perplexity/heldout-24k.txt";

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

fn q4(dir: &std::path::Path) -> std::path::PathBuf {
    let out = dir.join("q4.gguf");
    stdout_of(&["quantize", F16, s(&out), "Q4_K_M"]);
    out
}

#[test]
fn a_good_quantization_passes_against_its_reference() {
    let dir = tempfile::tempdir().unwrap();
    let q4 = q4(dir.path());
    let out = stdout_of(&[
        "validate",
        s(&q4),
        "--reference",
        F16,
        "-f",
        TEXT,
        "-c",
        "128",
        "--chunks",
        "8",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["passed"], true, "{v}");
    let names: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["finite", "structure", "forward", "kld"]);
    let kld = v["comparison"]["kld_mean"].as_f64().unwrap();
    assert!(kld > 0.0 && kld < 0.02, "{kld}");
    // The same with a limit below what Q4_K_M reaches: exit 1, and the text says why.
    let out = memwall(&[
        "validate",
        s(&q4),
        "--reference",
        F16,
        "-f",
        TEXT,
        "-c",
        "128",
        "--chunks",
        "8",
        "--max-kld",
        "0.0001",
    ]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAIL kld"), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("failed validation"));
}

#[test]
fn damaged_numbers_fail_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    let mut bytes = std::fs::read(repo().join(F16)).unwrap();
    let file = GgufFile::open(&repo().join(F16)).unwrap();
    let info = file.tensor("blk.1.ffn_up.weight").unwrap();
    let at = (file.header().data_offset + info.offset) as usize + 2 * 1000;
    bytes[at..at + 2].copy_from_slice(&0x7c00u16.to_le_bytes()); // f16 +inf
    std::fs::write(&bad, &bytes).unwrap();
    let out = memwall(&["validate", s(&bad)]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("FAIL finite") && text.contains("blk.1.ffn_up.weight: value 1000"),
        "{text}"
    );
}

#[test]
fn a_missing_tensor_fails_the_structure_check() {
    // tiny-zh rewritten without its output norm.
    let dir = tempfile::tempdir().unwrap();
    let src = repo().join(F16);
    let file = GgufFile::open(&src).unwrap();
    let header = file.header();
    let keep: Vec<_> = header
        .tensors
        .iter()
        .filter(|t| t.name != "output_norm.weight")
        .collect();
    let specs = keep.iter().map(|t| TensorSpec::from(*t)).collect();
    let out = dir.path().join("cut.gguf");
    let mut w = GgufWriter::create(&out, header.version, header.metadata.clone(), specs).unwrap();
    for t in &keep {
        w.write_tensor(&t.name, file.tensor_data(t)).unwrap();
    }
    w.commit().unwrap();
    let out = memwall(&["validate", s(&dir.path().join("cut.gguf"))]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("FAIL structure") && text.contains("output_norm.weight: missing"),
        "{text}"
    );
}
