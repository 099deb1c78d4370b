//! Qwen3.5 against llama.cpp's converter: memwall-synth's tiny dense and MoE
//! checkpoints, as text models and inside their multimodal checkpoints, with
//! and without the multi-token-prediction block, at four output types
//! (expectations recorded by fixtures/synth/family_convert_reference.sh qwen35).

mod common;

use common::{
    assert_converts_to, assert_tensors, fixtures, model_keys, planned_tensors, recorded_keys,
    recorded_tensors, recorded_tokenizer_keys, sha, tokenizer_keys,
};

use std::path::{Path, PathBuf};

use memwall_convert::arch::Arch;
use memwall_convert::checkpoint::Checkpoint;
use memwall_convert::metadata::hparams_with;
use memwall_convert::naming::{naming, parameter_counts};
use memwall_convert::tensors::{Axis, HeadOrder, OutType, nextn_blocks, plan_with};
use memwall_fixtures::synth::{Options, preset, write_checkpoint};
use memwall_format::gguf::Metadata;
use serde_json::Value;

fn recorded() -> Value {
    let text = std::fs::read_to_string(fixtures().join("synth/qwen35-convert.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn flags(entry: &Value, key: &str) -> Vec<String> {
    entry[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect()
}

/// Writes the checkpoint of recorded variant `name` into `dir/name`, checking
/// that it is the input llama.cpp converted.
fn checkpoint(dir: &Path, name: &str, entry: &Value) -> PathBuf {
    let mut p = preset(entry["preset"].as_str().unwrap()).unwrap();
    p.shape.vocab = 49152;
    let options = Options {
        tokenizer_dir: Some(fixtures().join("smollm2")),
        multimodal: flags(entry, "synth_flags").contains(&"--multimodal".to_owned()),
        fused_experts: flags(entry, "synth_flags").contains(&"--fused-experts".to_owned()),
        ..Options::default()
    };
    let out = dir.join(name);
    write_checkpoint(&out, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    for (file, want) in entry["safetensors_sha256"].as_object().unwrap() {
        let bytes = std::fs::read(out.join(file)).unwrap();
        assert_eq!(
            sha(&bytes),
            want.as_str().unwrap(),
            "{name}: synth input {file}"
        );
    }
    out
}

fn nextn(entry: &Value) -> bool {
    !flags(entry, "convert_flags").contains(&"--no-mtp".to_owned())
}

fn arch_of(ckpt: &Checkpoint) -> &'static Arch {
    Arch::for_class(ckpt.config()["architectures"][0].as_str().unwrap()).unwrap()
}

#[test]
fn every_qwen35_checkpoint_converts_tensor_for_tensor_as_llama_cpp() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    for (name, entry) in reference["variants"].as_object().unwrap() {
        let ckpt = Checkpoint::open(&checkpoint(dir.path(), name, entry)).unwrap();
        let arch = arch_of(&ckpt);
        for (outtype, want) in entry["outtypes"].as_object().unwrap() {
            let planned =
                plan_with(&ckpt, arch, OutType::parse(outtype).unwrap(), nextn(entry)).unwrap();
            assert_tensors(
                &planned_tensors(&ckpt, &planned),
                &recorded_tensors(want),
                &format!("{name} {outtype}"),
            );
        }
    }
}

#[test]
fn qwen35_metadata_equals_llama_cpps() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    for (name, entry) in reference["variants"].as_object().unwrap() {
        let path = checkpoint(dir.path(), name, entry);
        let ckpt = Checkpoint::open(&path).unwrap();
        let arch = arch_of(&ckpt);
        let n = if nextn(entry) {
            nextn_blocks(&ckpt, arch)
        } else {
            0
        };
        for (outtype, want) in entry["outtypes"].as_object().unwrap() {
            let outtype = OutType::parse(outtype).unwrap();
            let mut meta = Metadata::new();
            hparams_with(&mut meta, ckpt.config(), arch, outtype, n as u32).unwrap();
            assert_eq!(
                model_keys(&meta),
                recorded_keys(&want["metadata"]),
                "{name} {outtype:?}"
            );
        }
        // Naming (the size label counts the MTP block, as llama.cpp's does) and
        // the tokenizer keys.
        let planned = plan_with(&ckpt, arch, OutType::F16, nextn(entry)).unwrap();
        let counts = parameter_counts(planned.iter().map(|p| (p.name.as_str(), p.dims.as_slice())));
        let naming = naming(&path, ckpt.config(), counts, &Default::default());
        let meta = &entry["outtypes"]["f16"]["metadata"];
        assert_eq!(
            naming.name.as_deref(),
            meta["general.name"]["value"].as_str(),
            "{name}"
        );
        assert_eq!(
            naming.size_label.as_deref(),
            meta["general.size_label"]["value"].as_str(),
            "{name}"
        );
        let v = memwall_convert::vocab::load_bpe(&path, ckpt.config(), arch.gguf).unwrap();
        let mut tok = Metadata::new();
        memwall_convert::vocab::write_vocab(&mut tok, &v, "smollm");
        assert_eq!(
            tokenizer_keys(&tok),
            recorded_tokenizer_keys(meta),
            "{name}"
        );
    }
}

#[test]
fn whole_qwen35_files_equal_llama_cpps() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    for (name, entry) in reference["variants"].as_object().unwrap() {
        let path = checkpoint(dir.path(), name, entry);
        for (outtype, want) in entry["outtypes"].as_object().unwrap() {
            let flags = (outtype.as_str(), Some("smollm"), !nextn(entry));
            assert_converts_to(&path, &out, flags, want, name);
        }
    }
}

#[test]
fn value_heads_go_from_grouped_to_tiled_and_back() {
    // Two key heads with three value heads each, heads of two values, after
    // four other rows: g0v0 g0v1 g0v2 g1v0 g1v1 g1v2 → g0v0 g1v0 g0v1 g1v1 g0v2 g1v2.
    let order = HeadOrder {
        axis: Axis::Rows,
        start: 4,
        k_heads: 2,
        per_k: 3,
        head_dim: 2,
    };
    let sources: Vec<usize> = (0..16).map(|i| order.source(i)).collect();
    assert_eq!(
        sources,
        [0, 1, 2, 3, 4, 5, 10, 11, 6, 7, 12, 13, 8, 9, 14, 15]
    );
    for i in 0..20 {
        assert_eq!(order.target(order.source(i)), i);
    }
}

#[test]
fn stacked_experts_convert_to_the_file_of_per_expert_tensors() {
    // Qwen3-MoE's converter is llama.cpp's same `Qwen2MoeModel` path as
    // Qwen3.5-MoE's (recorded above as qwen3.5-moe-vl-fused).
    use memwall_convert::job::convert;
    use memwall_format::progress::Silent;
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny-qwen3-moe", "tiny-qwen3.5-moe"] {
        let mut p = preset(name).unwrap();
        p.shape.vocab = 49152;
        let mut files = Vec::new();
        for fused in [false, true] {
            let options = Options {
                tokenizer_dir: Some(fixtures().join("smollm2")),
                fused_experts: fused,
                ..Options::default()
            };
            // The same folder name: it becomes general.name.
            let ckpt = dir.path().join(format!("{fused}")).join(name);
            write_checkpoint(&ckpt, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
            let stacked = Checkpoint::open(&ckpt)
                .unwrap()
                .tensors()
                .iter()
                .filter(|t| t.name.ends_with("mlp.experts.gate_up_proj"))
                .count();
            assert_eq!(stacked > 0, fused, "{name}");
            let out = dir.path().join(format!("{name}-{fused}.gguf"));
            let flags = common::options(OutType::F16, Some("smollm"));
            convert(&ckpt, &out, &flags, &Silent).unwrap();
            files.push(std::fs::read(&out).unwrap());
        }
        assert!(files[0] == files[1], "{name}: the two files differ");
    }
}
