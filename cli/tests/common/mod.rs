//! Running the `memwall` binary from the integration tests.
#![allow(dead_code)]

pub mod family;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (commands run there, so fixture paths are relative to it).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `memwall ARGS` in the repository root.
pub fn memwall(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap()
}

/// Runs `memwall ARGS` in `dir`.
pub fn memwall_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// Runs `memwall ARGS` in the repository root with `input` on standard input.
pub fn memwall_with_stdin(args: &[&str], input: &[u8]) -> Output {
    memwall_in_with_stdin(&repo(), args, input)
}

/// Runs `memwall ARGS` in `dir` with `input` on standard input.
pub fn memwall_in_with_stdin(dir: &Path, args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `memwall ARGS`, which must fail as a usage error (exit 2); returns stderr.
pub fn usage_error(args: &[&str]) -> String {
    let out = memwall(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} should be a usage error: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// Runs `memwall ARGS`, which must fail (exit 1) with nothing on stdout; returns stderr.
pub fn error_of(args: &[&str]) -> String {
    let out = memwall(args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?} should fail: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// Runs `memwall ARGS`, which must succeed, and returns its stdout.
pub fn stdout_of(args: &[&str]) -> String {
    let out = memwall(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// SmolLM2-135M-Instruct at F16 in `dir`: the wheel's Q4_1 GGUF exported by
/// memwall and converted back (the file llama.cpp's converter makes of that
/// export; the recorded expectations name its SHA-256). The folder name
/// `smol` is part of the file: `general.name` comes from it.
pub fn smollm2_f16(dir: &Path) -> PathBuf {
    let hf = dir.join("smol");
    let out = dir.join("smollm2-F16.gguf");
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    stdout_of(&[
        "export",
        "fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
        &s(&hf),
    ]);
    stdout_of(&["convert", &s(&hf), "-o", &s(&out), "--outtype", "f16"]);
    out
}

/// The synthetic qwen3-moe model at F16 in `dir`: memwall-synth's
/// `tiny-qwen3-moe` with SmolLM2's vocabulary at weight scale 5, converted by
/// memwall (the same bytes as llama.cpp's converter with `--pre smollm`; the
/// recorded expectations name its SHA-256).
pub fn moe_f16(dir: &Path) -> PathBuf {
    use memwall_fixtures::synth::{Options, preset, write_checkpoint};
    let hf = dir.join("moe");
    let out = dir.join("moe-F16.gguf");
    let options = Options {
        tokenizer_dir: Some(repo().join("fixtures/smollm2")),
        weight_scale: 5.0,
        ..Options::default()
    };
    let mut p = preset("tiny-qwen3-moe").unwrap();
    p.shape.vocab = 49152;
    write_checkpoint(&hf, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    stdout_of(&[
        "convert",
        &s(&hf),
        "-o",
        &s(&out),
        "--outtype",
        "f16",
        "--pre",
        "smollm",
    ]);
    out
}

/// Mean KL divergence of `model` from the logits `memwall perplexity
/// --save-logits` saved in `base`.
pub fn kld_mean(model: &Path, base: &Path) -> f64 {
    let out = stdout_of(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "--kl-divergence",
        base.to_str().unwrap(),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["kld"]["mean"].as_f64().unwrap()
}
