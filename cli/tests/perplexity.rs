//! `memwall perplexity` against llama-perplexity (0c1e570): the same files, text,
//! context and chunk count give the same perplexity within 0.1 %, for tiny-zh and
//! SmolLM2-135M-Instruct at F16, Q8_0, Q6_K, Q5_K_M, Q4_K_M and IQ4_XS and for a
//! synthetic qwen3-moe model; and KL divergence agrees with llama.cpp's, through
//! its own log-probability file format. Expectations: fixtures/perplexity/record.sh.
//!
//! Every model is rebuilt here with memwall's converter and quantizer, and its
//! SHA-256 must equal the file llama.cpp measured (memwall writes the same bytes).

mod common;

use std::path::{Path, PathBuf};

use common::{memwall, repo, stdout_of};
use serde_json::Value;
use sha2::{Digest, Sha256};

const TEXT: &str = "fixtures/perplexity/heldout-24k.txt";

fn recorded() -> Value {
    let text =
        std::fs::read_to_string(repo().join("fixtures/perplexity/llama-perplexity.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sha(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The F16 model of `name`, built the way record.sh built it, in `dir`.
fn f16_model(name: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{name}-F16.gguf"));
    match name {
        "tiny-zh" => {
            std::fs::copy(
                repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf"),
                &out,
            )
            .unwrap();
        }
        "smollm2" => return common::smollm2_f16(dir),
        "moe" => return common::moe_f16(dir),
        _ => unreachable!("{name}"),
    }
    out
}

fn perplexity(model: &Path, chunks: usize, extra: &[&str]) -> Value {
    let chunks = chunks.to_string();
    let mut args = vec![
        "perplexity",
        "-m",
        s(model),
        "-c",
        "128",
        "--chunks",
        &chunks,
        "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&stdout_of(&args)).unwrap()
}

/// Runs every recorded (model, type) of `name` over `chunks` chunks and returns
/// the relative differences from llama-perplexity's running value at that chunk.
fn agree(name: &str, chunks: usize) -> Vec<(String, f64)> {
    let dir = tempfile::tempdir().unwrap();
    let f16 = f16_model(name, dir.path());
    let mut report = Vec::new();
    for run in recorded()["runs"].as_array().unwrap() {
        if run["model"] != name {
            continue;
        }
        let ty = run["type"].as_str().unwrap();
        let model = if ty == "F16" {
            f16.clone()
        } else {
            let out = dir.path().join(format!("{name}-{ty}.gguf"));
            stdout_of(&["quantize", s(&f16), s(&out), ty]);
            out
        };
        assert_eq!(
            sha(&model),
            run["sha256"].as_str().unwrap(),
            "{name} {ty}: not the file llama.cpp measured"
        );
        let ours = perplexity(&model, chunks, &["-f", TEXT]);
        let theirs = run["chunk_ppl"][chunks - 1].as_f64().unwrap();
        let rel = (ours["ppl"].as_f64().unwrap() / theirs - 1.0).abs();
        report.push((ty.to_owned(), rel));
    }
    report
}

/// F16 everywhere, and every type of tiny-zh, within 0.1 %. SmolLM2's quantized
/// files and the MoE's only within `quantized`: their outcome hangs on discrete
/// decisions that last-bit differences flip. SmolLM2 puts activations of several
/// hundred on the BOS token every window starts with, so one Q8 rounding of that
/// row moves the whole window; the MoE's routing picks different experts. llama.cpp's
/// own builds disagree by as much (docs/RUNTIME.md, "Agreement with llama.cpp").
fn check(name: &str, report: &[(String, f64)], quantized: f64) {
    assert!(!report.is_empty());
    for (ty, rel) in report {
        let limit = if ty == "F16" { 1e-3 } else { quantized };
        assert!(
            *rel < limit,
            "{name} {ty}: perplexity differs from llama-perplexity by {:.3} % (limit {:.1} %), all: {report:?}",
            rel * 100.0,
            limit * 100.0
        );
    }
}

#[test]
fn tiny_zh_perplexity_equals_llama_perplexity() {
    // The whole text: 72 windows, 4536 scored tokens.
    check("tiny-zh", &agree("tiny-zh", 72), 1e-3);
}

#[test]
fn smollm2_perplexity_equals_llama_perplexity() {
    check("smollm2", &agree("smollm2", 4), 3e-2);
}

#[test]
fn moe_perplexity_equals_llama_perplexity() {
    check("moe", &agree("moe", 16), 1e-2);
}

#[test]
fn kl_divergence_agrees_with_llama_perplexity() {
    let dir = tempfile::tempdir().unwrap();
    let f16 = f16_model("tiny-zh", dir.path());
    let q4 = dir.path().join("q4.gguf");
    stdout_of(&["quantize", s(&f16), s(&q4), "Q4_K_M"]);
    let base = dir.path().join("base.kld");
    let kld = recorded()["kld"].clone();
    let chunks = kld["chunks"].as_u64().unwrap() as usize;
    perplexity(&f16, chunks, &["-f", TEXT, "--save-logits", s(&base)]);
    let ours = perplexity(&q4, chunks, &["--kl-divergence", s(&base)]);
    let theirs = &kld["stats"];
    let close = |ours: f64, key: &str, tolerance: f64| {
        let t = theirs[key].as_f64().unwrap();
        assert!(
            (ours - t).abs() <= tolerance * t.abs(),
            "{key}: memwall {ours}, llama.cpp {t}"
        );
    };
    close(ours["ppl"]["value"].as_f64().unwrap(), "Mean PPL(Q)", 1e-3);
    close(
        ours["ppl_base"]["value"].as_f64().unwrap(),
        "Mean PPL(base)",
        1e-3,
    );
    close(ours["kld"]["mean"].as_f64().unwrap(), "Mean    KLD", 0.03);
    close(ours["kld"]["median"].as_f64().unwrap(), "Median  KLD", 0.05);
    close(
        100.0 * ours["same_top"]["value"].as_f64().unwrap(),
        "Same top p",
        0.01,
    );
    close(
        100.0 * ours["delta_p"]["rms"]["value"].as_f64().unwrap(),
        "RMS Δp",
        0.05,
    );
}

#[test]
fn log_probability_files_are_llama_cpp_s_format() {
    // llama-perplexity -c 64 --chunks 2 --kl-divergence-base on tiny-zh's F16.
    let theirs = repo().join("fixtures/perplexity/kld-base-tiny-zh.bin");
    let dir = tempfile::tempdir().unwrap();
    let f16 = f16_model("tiny-zh", dir.path());
    let ours = dir.path().join("ours.kld");
    let chunks = "2";
    stdout_of(&[
        "perplexity",
        "-m",
        s(&f16),
        "-f",
        TEXT,
        "-c",
        "64",
        "--chunks",
        chunks,
        "--save-logits",
        s(&ours),
    ]);
    let (a, b) = (
        std::fs::read(&ours).unwrap(),
        std::fs::read(&theirs).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    // Header and the evaluated tokens are byte-identical (the tokenizer agrees too).
    let header = 20 + 4 * 64 * 2;
    assert_eq!(a[..header], b[..header]);
    // The same model against llama.cpp's saved log-probabilities: next to no divergence.
    let kld: Value = serde_json::from_str(&stdout_of(&[
        "perplexity",
        "-m",
        s(&f16),
        "--kl-divergence",
        s(&theirs),
        "--json",
    ]))
    .unwrap();
    assert!(kld["kld"]["mean"].as_f64().unwrap() < 1e-4, "{kld}");
    assert!(kld["same_top"]["value"].as_f64().unwrap() > 0.99, "{kld}");
}

#[test]
fn a_top_k_reference_is_small_and_gives_the_full_reference_s_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let f16 = f16_model("tiny-zh", dir.path());
    let q4 = dir.path().join("q4.gguf");
    stdout_of(&["quantize", s(&f16), s(&q4), "Q4_K_M"]);
    let (full, top) = (dir.path().join("full.kld"), dir.path().join("top.kld"));
    let chunks = 24;
    perplexity(&f16, chunks, &["-f", TEXT, "--save-logits", s(&full)]);
    let saved = perplexity(
        &f16,
        chunks,
        &["-f", TEXT, "--save-logits", s(&top), "--top-k", "16"],
    );
    assert_eq!(saved["saved_layout"]["layout"], "top-k");
    // Header with k, the tokens, then per scored position 8 + 16·k bytes.
    let scored = 128 - 1 - 64;
    let size = 24 + 4 * 128 * chunks + chunks * scored * (8 + 16 * 16);
    assert_eq!(std::fs::metadata(&top).unwrap().len() as usize, size);
    assert!(std::fs::metadata(&full).unwrap().len() as usize > 20 * size);
    let a = perplexity(&q4, chunks, &["--kl-divergence", s(&full)]);
    let b = perplexity(&q4, chunks, &["--kl-divergence", s(&top)]);
    assert_eq!(a["reference"]["layout"], "full");
    assert_eq!(b["reference"]["layout"], "top-k");
    assert_eq!(b["reference"]["k"], 16);
    let value = |v: &Value, key: &[&str]| key.iter().fold(v, |v, k| &v[k]).as_f64().unwrap();
    let (ka, kb) = (value(&a, &["kld", "mean"]), value(&b, &["kld", "mean"]));
    assert!((kb / ka - 1.0).abs() < 0.01, "KLD full {ka}, top-k {kb}");
    assert_eq!(a["same_top"], b["same_top"]);
    assert_eq!(a["ppl"], b["ppl"]);
    // The base's perplexity is exact in the top-k file (the full one rounds to 16 bits).
    let (base, printed) = (value(&b, &["ppl_base", "value"]), value(&saved, &["ppl"]));
    assert!((base / printed - 1.0).abs() < 1e-6, "{base} vs {printed}");
    // The model against its own top-k reference: no divergence.
    let own = perplexity(&f16, chunks, &["--kl-divergence", s(&top)]);
    assert!(value(&own, &["kld", "mean"]) < 1e-5, "{own}");
}

#[test]
fn bad_top_k_references_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let f16 = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
    let top = dir.path().join("top.kld");
    perplexity(
        Path::new(f16),
        2,
        &["-f", TEXT, "--save-logits", s(&top), "--top-k", "4"],
    );
    let refused = |file: &Path, wanted: &[&str]| {
        let out = memwall(&["perplexity", "-m", f16, "--kl-divergence", s(file)]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(wanted.iter().all(|w| err.contains(w)), "{err}");
    };
    let bytes = std::fs::read(&top).unwrap();
    let cut = dir.path().join("cut.kld");
    std::fs::write(&cut, &bytes[..bytes.len() - 4]).unwrap();
    refused(&cut, &["cut.kld", "truncated"]);
    // k larger than the vocabulary.
    let mut wide = bytes.clone();
    wide[20..24].copy_from_slice(&100_000u32.to_le_bytes());
    let wide_path = dir.path().join("wide.kld");
    std::fs::write(&wide_path, &wide).unwrap();
    refused(&wide_path, &["wide.kld", "top 100000"]);
    // A token id past the vocabulary in the second position of the first chunk.
    let mut bad = bytes.clone();
    let record = 8 + 16 * 4;
    let at = 24 + 4 * 128 * 2 + record + 8;
    bad[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let bad_path = dir.path().join("bad.kld");
    std::fs::write(&bad_path, &bad).unwrap();
    refused(&bad_path, &["bad.kld", "chunk 0, position 1", "4294967295"]);
    // --top-k only shapes a reference being saved.
    let out = memwall(&[
        "perplexity",
        "-m",
        f16,
        "--kl-divergence",
        s(&top),
        "--top-k",
        "8",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--save-logits"));
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "太短了。").unwrap();
    let out = memwall(&[
        "perplexity",
        "-m",
        "fixtures/tiny-zh/reference/tiny-zh-f16.gguf",
        "-f",
        s(&short),
        "-c",
        "128",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs at least 256"), "{err}");
    // A truncated log-probability file is refused with its size.
    let cut = dir.path().join("cut.kld");
    let bytes = std::fs::read(repo().join("fixtures/perplexity/kld-base-tiny-zh.bin")).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    let out = memwall(&[
        "perplexity",
        "-m",
        "fixtures/tiny-zh/reference/tiny-zh-f16.gguf",
        "--kl-divergence",
        s(&cut),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cut.kld") && err.contains("truncated"),
        "{err}"
    );
    // Not a log-probability file at all.
    let out = memwall(&[
        "perplexity",
        "-m",
        "fixtures/tiny-zh/reference/tiny-zh-f16.gguf",
        "--kl-divergence",
        TEXT,
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--save-logits"));
}

#[test]
fn memory_modes_give_the_same_perplexity() {
    let model = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
    let ppl = |extra: &[&str]| {
        let mut args = vec![
            "perplexity",
            "-m",
            model,
            "-f",
            TEXT,
            "-c",
            "64",
            "--chunks",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        let v: Value = serde_json::from_str(&stdout_of(&args)).unwrap();
        v["ppl"].as_f64().unwrap()
    };
    let mapped = ppl(&[]);
    assert_eq!(ppl(&["--no-mmap"]), mapped);
    assert_eq!(ppl(&["--mlock"]), mapped);
    assert_eq!(ppl(&["-t", "1"]), mapped);
}
