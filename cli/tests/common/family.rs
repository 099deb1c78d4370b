//! The checks every 2026 family (Qwen3.5, Gemma 4) passes through the
//! binary against what fixtures/synth/family_quant_reference.sh recorded
//! from llama.cpp: memwall-synth's tiny dense and MoE checkpoints converted
//! to F16, quantized with llama-quantize's mixes (byte for byte, with and
//! without an importance matrix), measured with llama-perplexity's
//! perplexity, and collected into llama-imatrix's importance matrix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{kld_mean, memwall_in, repo, stdout_of};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A family's recorded expectations and how its F16 input is made.
pub struct Family {
    /// The reference script's name for it (`qwen35`, `gemma4`).
    pub name: &'static str,
    /// Writes the checkpoint of a preset with its tokenizer into a folder.
    pub checkpoint: fn(&Path, &str, f32),
    /// `memwall convert` flags beyond the output type.
    pub convert_flags: &'static [&'static str],
}

pub fn sha(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

impl Family {
    pub fn recorded(&self) -> Value {
        let path = repo().join(format!("fixtures/synth/{}-quantize.json", self.name));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The F16 file of recorded variant `name` (its folder name is part of
    /// the file: `general.name`), checked against the file llama.cpp quantized.
    pub fn f16(&self, dir: &Path, name: &str, v: &Value) -> PathBuf {
        let hf = dir.join(name);
        let scale = self.recorded()["weight_scale"].as_f64().unwrap() as f32;
        (self.checkpoint)(&hf, v["preset"].as_str().unwrap(), scale);
        let out = dir.join(format!("{name}-F16.gguf"));
        let mut args = vec!["convert", s(&hf), "-o", s(&out), "--outtype", "f16"];
        args.extend(self.convert_flags);
        stdout_of(&args);
        assert_eq!(
            sha(&out),
            v["input_sha256"].as_str().unwrap(),
            "{name}: F16 input"
        );
        // Only the F16 file is read from here on; the checkpoint's disk goes
        // (with a 262 144-token vocabulary it is hundreds of megabytes).
        std::fs::remove_dir_all(&hf).unwrap();
        out
    }

    /// Every recorded mix, with and without the recorded importance matrix,
    /// is the file llama-quantize wrote; the types it refused are refused
    /// naming the tensor.
    pub fn check_mixes(&self) {
        let reference = self.recorded();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.gguf");
        let here = repo().join("fixtures/synth");
        for (name, v) in reference["variants"].as_object().unwrap() {
            let input = self.f16(dir.path(), name, v);
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
            // From the folder llama-quantize ran in, so that the imatrix's
            // recorded name (quantize.imatrix.file) is the same.
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

    /// `memwall perplexity` on the F16 file and on memwall's quantized files
    /// gives llama-perplexity's perplexity: F16 within 0.1 %; the quantized
    /// files within 1 % (a last-bit difference in an activation's rounding
    /// can move a token's expert).
    pub fn check_perplexity(&self) {
        let reference = self.recorded();
        let dir = tempfile::tempdir().unwrap();
        for (name, v) in reference["variants"].as_object().unwrap() {
            let input = self.f16(dir.path(), name, v);
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
                let limit = if ty == "f16" { 1e-3 } else { 1e-2 };
                assert!(
                    rel < limit,
                    "{name} {ty}: memwall {ours}, llama-perplexity {theirs} ({:.3} %)",
                    rel * 100.0
                );
            }
        }
    }

    /// `memwall calibrate imatrix` collects what llama-imatrix collected:
    /// the same entries and token counts, and sums within 1e-3 (dense) or
    /// 2e-2 (MoE: a few tokens route to other experts in either tool, as
    /// cli/tests/calibrate.rs measures for qwen3moe). Returns each variant's
    /// entries for the family's own checks.
    pub fn check_imatrix(&self) -> BTreeMap<String, Vec<String>> {
        let reference = self.recorded();
        let dir = tempfile::tempdir().unwrap();
        let mut entries = BTreeMap::new();
        for (name, v) in reference["variants"].as_object().unwrap() {
            let input = self.f16(dir.path(), name, v);
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
            entries.insert(name.clone(), ours.into_keys().collect());
        }
        entries
    }

    /// `memwall calibrate quantize` (AWQ + GPTQ on 16 windows of the
    /// held-out text) runs over every layer kind of each variant and writes
    /// the layout plain Q4_K_M writes (the same tensors, types and shapes),
    /// with a KL divergence from the F16 model below 0.9× plain Q4_K_M's.
    pub fn check_calibrate(&self) {
        let reference = self.recorded();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let text = repo().join("fixtures/perplexity");
        let layout = |path: &Path| -> Vec<(String, String, Vec<u64>)> {
            let bytes = std::fs::read(path).unwrap();
            let file = memwall_format::gguf::parse(&bytes).unwrap();
            let mut v: Vec<_> = (file.tensors.iter())
                .map(|t| (t.name.clone(), t.ty.name().to_owned(), t.dims.clone()))
                .collect();
            v.sort();
            v
        };
        for (name, v) in reference["variants"].as_object().unwrap() {
            let f16 = self.f16(d, name, v);
            let plain = d.join(format!("{name}-plain.gguf"));
            stdout_of(&["quantize", s(&f16), s(&plain), "Q4_K_M"]);
            let calibrated = d.join(format!("{name}-calibrated.gguf"));
            let run = memwall_in(
                &text,
                &[
                    "calibrate",
                    "quantize",
                    "-m",
                    s(&f16),
                    "--method",
                    "awq+gptq",
                    "-f",
                    "heldout-24k.txt",
                    "--samples",
                    "16",
                    "--seq-len",
                    "128",
                    "--type",
                    "Q4_K_M",
                    "-o",
                    s(&calibrated),
                ],
            );
            assert!(
                run.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&run.stderr)
            );
            assert_eq!(layout(&calibrated), layout(&plain), "{name}: layout");
            let base = d.join(format!("{name}.kld"));
            stdout_of(&[
                "perplexity",
                "-m",
                s(&f16),
                "-f",
                "fixtures/perplexity/heldout-24k.txt",
                "-c",
                "128",
                "--chunks",
                "16",
                "--save-logits",
                s(&base),
            ]);
            let (k_plain, k_calibrated) = (kld_mean(&plain, &base), kld_mean(&calibrated, &base));
            assert!(
                k_calibrated < 0.9 * k_plain,
                "{name}: calibrated {k_calibrated}, plain {k_plain}"
            );
            // One variant's files at a time: the logits of a 262 144-token
            // vocabulary are half a gigabyte.
            for file in [&f16, &plain, &calibrated, &base] {
                std::fs::remove_file(file).unwrap();
            }
        }
    }

    /// `memwall export` of each variant's F16 file, converted again, is the
    /// same file: the converter's transforms are undone exactly.
    pub fn check_export_round_trips(&self) {
        let reference = self.recorded();
        let dir = tempfile::tempdir().unwrap();
        for (name, v) in reference["variants"].as_object().unwrap() {
            let f16 = self.f16(dir.path(), name, v);
            // The folder's name becomes general.name: the original's.
            let back = dir.path().join("back");
            std::fs::create_dir_all(&back).unwrap();
            let folder = back.join(name);
            let run = memwall_in(
                dir.path(),
                &["export", s(&f16), s(&folder), "--dtype", "f32"],
            );
            let stderr = String::from_utf8_lossy(&run.stderr);
            assert_eq!(run.status.code(), Some(0), "{name}: {stderr}");
            let again = dir.path().join(format!("{name}-again.gguf"));
            let mut args = vec!["convert", s(&folder), "-o", s(&again), "--outtype", "f16"];
            args.extend(self.convert_flags);
            stdout_of(&args);
            assert_eq!(
                sha(&again),
                v["input_sha256"].as_str().unwrap(),
                "{name}: exported and converted again"
            );
            for file in [&f16, &again] {
                std::fs::remove_file(file).unwrap();
            }
            std::fs::remove_dir_all(&folder).unwrap();
        }
    }

    /// The planner's tensor list and llama.cpp's mixing rules, from
    /// config.json alone, give each tensor the type llama-quantize gave it,
    /// so the planned sizes are the files' sizes. Returns each variant's shape.
    pub fn check_plan_types(
        &self,
        config: impl Fn(&str) -> Value,
    ) -> Vec<(String, memwall_quantize::fit::Shape)> {
        use memwall_quantize::fit::{Choice, Shape};
        let reference = self.recorded();
        let mut shapes = Vec::new();
        for (name, v) in reference["variants"].as_object().unwrap() {
            let shape = Shape::from_hf_config(&config(v["preset"].as_str().unwrap())).unwrap();
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
            shapes.push((name.clone(), shape));
        }
        shapes
    }
}

/// Each tensor's type and SHA-256 in a GGUF file.
pub fn tensors(path: &Path) -> Vec<(String, String, String)> {
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

/// Each tensor of an importance-matrix file as values.
fn imatrix_tensors(path: &Path) -> BTreeMap<String, Vec<f32>> {
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
