//! Qwen3.5 through the binary, as a user runs it: memwall-synth's tiny dense
//! and MoE checkpoints converted, quantized with llama-quantize's mixes — the
//! same files, byte for byte, with and without an importance matrix — and
//! measured with the perplexity llama-perplexity gives.
//! Expectations: fixtures/synth/qwen35_quant_reference.sh.

mod common;

use std::path::{Path, PathBuf};

use common::{memwall_in, repo, stdout_of};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn recorded() -> Value {
    let text = std::fs::read_to_string(repo().join("fixtures/synth/qwen35-quantize.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sha(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The F16 file of recorded variant `name` (its folder name is part of the
/// file: `general.name`), checked against the file llama.cpp quantized.
fn f16(dir: &Path, name: &str, v: &Value) -> PathBuf {
    use memwall_fixtures::synth::{Options, preset, write_checkpoint};
    let hf = dir.join(name);
    let options = Options {
        tokenizer_dir: Some(repo().join("fixtures/smollm2")),
        weight_scale: recorded()["weight_scale"].as_f64().unwrap() as f32,
        ..Options::default()
    };
    let mut p = preset(v["preset"].as_str().unwrap()).unwrap();
    p.shape.vocab = 49152;
    write_checkpoint(&hf, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    let out = dir.join(format!("{name}-F16.gguf"));
    stdout_of(&[
        "convert",
        s(&hf),
        "-o",
        s(&out),
        "--outtype",
        "f16",
        "--pre",
        "smollm",
    ]);
    assert_eq!(
        sha(&out),
        v["input_sha256"].as_str().unwrap(),
        "{name}: F16 input"
    );
    out
}

/// Each tensor's type and SHA-256 in a GGUF file.
fn tensors(path: &Path) -> Vec<(String, String, String)> {
    let bytes = std::fs::read(path).unwrap();
    let file = memwall_format::gguf::parse(&bytes).unwrap();
    file.tensors
        .iter()
        .map(|t| {
            let data = &bytes[(file.data_offset + t.offset) as usize..][..t.size as usize];
            (
                t.name.clone(),
                t.ty.name().to_uppercase(),
                format!("{:x}", Sha256::digest(data)),
            )
        })
        .collect()
}

fn recorded_tensors(entry: &Value) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = entry["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, t)| {
            (
                name.clone(),
                t[0].as_str().unwrap().to_owned(),
                t[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn qwen35_mixes_are_the_files_llama_quantize_writes() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let here = repo().join("fixtures/synth");
    for (name, v) in reference["variants"].as_object().unwrap() {
        let input = f16(dir.path(), name, v);
        for (mix, want) in v["mix"].as_object().unwrap() {
            stdout_of(&["quantize", s(&input), s(&out), mix]);
            let mut ours = tensors(&out);
            ours.sort();
            assert_eq!(ours, recorded_tensors(want), "{name} {mix}");
            assert_eq!(
                sha(&out),
                want["sha256"].as_str().unwrap(),
                "{name} {mix}: file"
            );
        }
        // From the folder llama-quantize ran in, so that the imatrix's recorded
        // name (quantize.imatrix.file) is the same.
        let imatrix = v["imatrix"].as_str().unwrap();
        assert_eq!(
            sha(&here.join(imatrix)),
            v["imatrix_sha256"].as_str().unwrap()
        );
        for (mix, want) in v["imatrix_mix"].as_object().unwrap() {
            let run = memwall_in(
                &here,
                &["quantize", "--imatrix", imatrix, s(&input), s(&out), mix],
            );
            assert!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
            let mut ours = tensors(&out);
            ours.sort();
            assert_eq!(ours, recorded_tensors(want), "{name} {mix} --imatrix");
            assert_eq!(
                sha(&out),
                want["sha256"].as_str().unwrap(),
                "{name} {mix} --imatrix: file"
            );
        }
        // The types that need an entry for every tensor are refused, as
        // llama-quantize refuses them: the imatrix has none for the
        // multi-token-prediction block, which the forward pass does not run.
        for (mix, theirs) in v["imatrix_refused"].as_object().unwrap() {
            let run = memwall_in(
                &here,
                &["quantize", "--imatrix", imatrix, s(&input), s(&out), mix],
            );
            let stderr = String::from_utf8_lossy(&run.stderr);
            assert_eq!(run.status.code(), Some(1), "{name} {mix}: {stderr}");
            let tensor = theirs
                .as_str()
                .unwrap()
                .split_whitespace()
                .find(|w| w.starts_with("blk."));
            assert!(
                stderr.contains(tensor.unwrap()) && stderr.contains("importance matrix"),
                "{name} {mix}: {stderr} (llama-quantize: {theirs})"
            );
        }
    }
}

#[test]
fn qwen35_perplexity_equals_llama_perplexity() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    for (name, v) in reference["variants"].as_object().unwrap() {
        let input = f16(dir.path(), name, v);
        for (ty, want) in v["perplexity"].as_object().unwrap() {
            let model = if ty == "f16" {
                input.clone()
            } else {
                let out = dir.path().join(format!("{name}-{ty}.gguf"));
                stdout_of(&["quantize", s(&input), s(&out), ty]);
                out
            };
            let chunks = want["chunks"].as_array().unwrap().len().to_string();
            let ours: Value = serde_json::from_str(&stdout_of(&[
                "perplexity",
                "-m",
                s(&model),
                "-f",
                "fixtures/perplexity/heldout-24k.txt",
                "-c",
                "128",
                "--chunks",
                &chunks,
                "--json",
            ]))
            .unwrap();
            let (ours, theirs) = (ours["ppl"].as_f64().unwrap(), want["ppl"].as_f64().unwrap());
            let rel = (ours / theirs - 1.0).abs();
            // F16 within 0.1 %; the quantized files within 1 %: a last-bit
            // difference in an activation's rounding can move a token's expert.
            let limit = if ty == "f16" { 1e-3 } else { 1e-2 };
            assert!(
                rel < limit,
                "{name} {ty}: memwall {ours}, llama-perplexity {theirs} ({:.3} %)",
                rel * 100.0
            );
        }
    }
}

/// The planner's tensor list and llama.cpp's mixing rules, from config.json
/// alone, give each tensor the type llama-quantize gave it (the
/// multi-token-prediction block included), so the planned sizes are the
/// files' sizes; the linear layers have no KV cache but a fixed state.
#[test]
fn the_plan_of_a_qwen35_config_has_llama_quantizes_types_and_a_fixed_state() {
    use memwall_fixtures::synth::{config_json, preset};
    use memwall_quantize::fit::{Choice, KvType, Shape};
    let reference = recorded();
    for (name, v) in reference["variants"].as_object().unwrap() {
        let mut p = preset(v["preset"].as_str().unwrap()).unwrap();
        p.shape.vocab = 49152;
        let shape = Shape::from_hf_config(&config_json(p.arch, &p.shape)).unwrap();
        let tensors = shape.tensors();
        for (mix, want) in v["mix"].as_object().unwrap() {
            let weights = Choice::by_name(mix)
                .unwrap()
                .weights(&shape.facts(), &tensors)
                .unwrap();
            let mut ours: Vec<(String, String)> = tensors
                .iter()
                .zip(&weights.parts)
                .map(|(t, p)| (t.name.clone(), p.ty.name().to_uppercase()))
                .collect();
            ours.sort();
            let theirs: Vec<(String, String)> = recorded_tensors(want)
                .into_iter()
                .map(|(n, ty, _)| (n, ty))
                .collect();
            assert_eq!(ours, theirs, "{name} {mix}");
        }
        // One linear layer and one attention layer; the state of the linear
        // one: (4 − 1) taps × 512 channels + 4 value heads × 64 × 64, in f32.
        assert_eq!(shape.attention_layers(), 1, "{name}");
        assert_eq!(
            shape.recurrent_state_bytes(),
            4 * (3 * 512 + 4 * 64 * 64),
            "{name}"
        );
        assert_eq!(
            shape.kv_bytes_per_token(KvType::F16),
            2 * 2 * 64 * 2,
            "{name}: K and V of 2 heads × 64 in f16, one layer"
        );
    }
}

/// `memwall run --chat` over a hybrid model: the second turn continues the
/// first one's state (its prompt starts with the whole first turn), and a
/// greedy reply is what the same prompt gives in a fresh process.
#[test]
fn a_qwen35_chat_continues_its_recurrent_state_between_turns() {
    use common::memwall_with_stdin;
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    let v = &reference["variants"]["qwen3.5"];
    let model = f16(dir.path(), "qwen3.5", v);
    let chat = |input: &str| -> Value {
        let out = memwall_with_stdin(
            &[
                "run",
                "-m",
                s(&model),
                "--chat",
                "-n",
                "6",
                "--temp",
                "0",
                "--json",
            ],
            input.as_bytes(),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let two = chat("Say hello.\nAnd again.\n");
    let turns = two["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{two}");
    let ids = |t: &Value| -> Vec<u64> {
        t["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    assert!(ids(&turns[1]).starts_with(&ids(&turns[0])), "history kept");
    for t in turns {
        assert!(t["generated_tokens"].as_u64().unwrap() > 0, "{t}");
    }
    // The same first turn alone: the same greedy reply.
    let one = chat("Say hello.\n");
    assert_eq!(one["turns"][0]["reply"], turns[0]["reply"]);
}

/// Each tensor of an importance-matrix file as values.
fn imatrix_tensors(path: &Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let header = memwall_format::gguf::parse(&bytes).unwrap();
    header
        .tensors
        .iter()
        .map(|t| {
            let start = (header.data_offset + t.offset) as usize;
            let values = bytes[start..start + t.size as usize]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (t.name.clone(), values)
        })
        .collect()
}

/// `memwall calibrate imatrix` collects what llama-imatrix collects from a
/// hybrid model: an entry for every matrix the forward pass multiplies (the
/// linear layers' and the shared expert's included, none for the
/// multi-token-prediction block), the same token counts, and sums within
/// 1e-3 (dense) or 2e-2 (MoE: a few tokens route to other experts in either
/// tool, as cli/tests/calibrate.rs measures for qwen3moe).
#[test]
fn qwen35_importance_matrices_equal_llama_imatrixs() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    for (name, v) in reference["variants"].as_object().unwrap() {
        let input = f16(dir.path(), name, v);
        let out = dir.path().join(format!("{name}-imatrix.gguf"));
        let run = memwall_in(
            &repo().join("fixtures/perplexity"),
            &[
                "calibrate",
                "imatrix",
                "-m",
                s(&input),
                "-f",
                "heldout-24k.txt",
                "-c",
                "128",
                "-b",
                "128",
                "--chunks",
                "16",
                "-o",
                s(&out),
            ],
        );
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let theirs = imatrix_tensors(
            &repo()
                .join("fixtures/synth")
                .join(v["imatrix"].as_str().unwrap()),
        );
        let ours = imatrix_tensors(&out);
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            theirs.keys().collect::<Vec<_>>(),
            "{name}: entries"
        );
        assert!(
            ours.keys().any(|k| k.contains(".attn_qkv.")),
            "{name}: linear layers"
        );
        assert!(
            !ours.keys().any(|k| k.starts_with("blk.2.")),
            "{name}: no MTP block"
        );
        let limit = if name.contains("moe") { 2e-2 } else { 1e-3 };
        for (k, l) in &theirs {
            let o = &ours[k];
            assert_eq!(l.len(), o.len(), "{name} {k}");
            let scale = l
                .iter()
                .fold(0f32, |m, x| m.max(x.abs()))
                .max(f32::MIN_POSITIVE);
            let diff = l.iter().zip(o).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let tolerance = if k.ends_with(".counts") { 2e-3 } else { limit };
            assert!(diff / scale <= tolerance, "{name} {k}: {:e}", diff / scale);
        }
    }
}
