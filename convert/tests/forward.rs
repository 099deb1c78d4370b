//! Converted checkpoints run as transformers runs them: memwall-synth's tiny
//! checkpoint of every architecture (and the rope scalings the converter maps),
//! converted to F32 GGUF by memwall and run by the runtime's forward pass, against
//! transformers' float32 logits recorded by fixtures/synth/forward_reference.sh.
//! This covers the converter and the runtime together: a tensor written wrongly
//! or a layout run wrongly both move the logits.

mod common;

use common::{fixtures, quantize, sha};

use memwall_convert::job::{Options as Convert, convert};
use memwall_convert::tensors::OutType;
use memwall_fixtures::synth::{Options, preset, write_checkpoint};
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;
use memwall_runtime::forward::Model;
use serde_json::Value;

#[test]
fn every_architecture_runs_like_transformers() {
    let text = std::fs::read_to_string(fixtures().join("synth/forward.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<u32> = reference["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        tokenizer_dir: Some(fixtures().join("smollm2")),
        weight_scale: reference["weight_scale"].as_f64().unwrap() as f32,
        ..Options::default()
    };
    for (name, v) in reference["variants"].as_object().unwrap() {
        let mut p = preset(v["preset"].as_str().unwrap()).unwrap();
        p.shape.vocab = 49152;
        let hf = dir.path().join(name);
        write_checkpoint(&hf, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
        let st = std::fs::read(hf.join("model.safetensors")).unwrap();
        assert_eq!(
            sha(&st),
            v["safetensors_sha256"].as_str().unwrap(),
            "{name}: synth input"
        );
        let config_path = hf.join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
        for (k, value) in v["config_patch"].as_object().unwrap() {
            config[k] = value.clone();
        }
        std::fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
        let out = dir.path().join(format!("{name}.gguf"));
        let convert_options = Convert {
            outtype: OutType::F32,
            pre: Some("smollm".into()),
            encode: &quantize,
            allow_nonfinite: false,
            split_max_size: None,
            no_mtp: false,
        };
        convert(&hf, &out, &convert_options, &Silent).unwrap();
        let gguf = GgufModel::open(&out).unwrap();
        let mut model = Model::new(&gguf, 64).unwrap_or_else(|e| panic!("{name}: {e}"));
        model.set_exact(true);
        let logits = model.forward(&mut model.session(), &ids).unwrap();
        let n = model.config.n_vocab;
        let mut worst = 0f32;
        for (pos, top) in v["top_k"].as_array().unwrap().iter().enumerate() {
            let row = &logits[pos * n..(pos + 1) * n];
            let argmax = (0..n).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            let top = top.as_array().unwrap();
            assert_eq!(
                argmax as u64,
                top[0][0].as_u64().unwrap(),
                "{name} position {pos}: top-1"
            );
            for entry in top {
                let id = entry[0].as_u64().unwrap() as usize;
                let value = entry[1].as_f64().unwrap() as f32;
                worst = worst.max((row[id] - value).abs());
            }
        }
        // Measured 2026-11-29: 4.2e-7 (cohere, logits scaled by 1/16) to 3.3e-5 (mixtral).
        assert!(worst < 2e-4, "{name}: largest logit difference {worst}");
        std::fs::remove_dir_all(&hf).unwrap();
        std::fs::remove_file(&out).unwrap();
    }
}

/// memwall-synth's tiny Qwen3.5 checkpoint `preset` converted to `outtype`.
fn qwen35_model(dir: &std::path::Path, preset_name: &str, outtype: OutType) -> std::path::PathBuf {
    let mut p = preset(preset_name).unwrap();
    p.shape.vocab = 49152;
    let hf = dir.join(preset_name);
    let options = Options {
        tokenizer_dir: Some(fixtures().join("smollm2")),
        weight_scale: 5.0,
        ..Options::default()
    };
    write_checkpoint(&hf, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    let out = dir.join(format!("{preset_name}-{outtype:?}.gguf"));
    let convert_options = Convert {
        outtype,
        pre: Some("smollm".into()),
        encode: &quantize,
        allow_nonfinite: false,
        split_max_size: None,
        no_mtp: false,
    };
    convert(&hf, &out, &convert_options, &Silent).unwrap();
    out
}

/// Qwen3.5's gated delta-net and gated attention layers (dense and MoE with a
/// shared expert) against transformers' float32 logits: the prompt (its
/// chunked delta rule) and three tokens decoded after it (its recurrent one),
/// recorded by fixtures/synth/forward_qwen35_reference.sh.
#[test]
fn qwen35_runs_like_transformers() {
    let text = std::fs::read_to_string(fixtures().join("synth/forward-qwen35.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<u32> = reference["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let prompt = reference["prompt_tokens"].as_u64().unwrap() as usize;
    let dir = tempfile::tempdir().unwrap();
    let variants = reference["variants"].as_object().unwrap();
    assert_eq!(variants.len(), 2);
    for (name, v) in variants {
        let preset_name = v["preset"].as_str().unwrap();
        let out = qwen35_model(dir.path(), preset_name, OutType::F32);
        let st = std::fs::read(dir.path().join(preset_name).join("model.safetensors")).unwrap();
        assert_eq!(
            sha(&st),
            v["safetensors_sha256"].as_str().unwrap(),
            "{name}: synth input"
        );
        let gguf = GgufModel::open(&out).unwrap();
        let mut model = Model::new(&gguf, 64).unwrap_or_else(|e| panic!("{name}: {e}"));
        model.set_exact(true);
        // The prompt at once, then one token at a time, as transformers ran it.
        let mut session = model.session();
        let mut logits = model.forward(&mut session, &ids[..prompt]).unwrap();
        for &t in &ids[prompt..] {
            logits.extend(model.forward(&mut session, &[t]).unwrap());
        }
        let n = model.config.n_vocab;
        let mut worst = 0f32;
        for (pos, top) in v["top_k"].as_array().unwrap().iter().enumerate() {
            let row = &logits[pos * n..(pos + 1) * n];
            let argmax = (0..n).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            let top = top.as_array().unwrap();
            assert_eq!(
                argmax as u64,
                top[0][0].as_u64().unwrap(),
                "{name} position {pos}: top-1"
            );
            for entry in top {
                let id = entry[0].as_u64().unwrap() as usize;
                let value = entry[1].as_f64().unwrap() as f32;
                worst = worst.max((row[id] - value).abs());
            }
        }
        // Measured 2026-12-05: 1.9e-5 (dense).
        assert!(worst < 2e-4, "{name}: largest logit difference {worst}");
    }
}

/// A prompt evaluated at once and token by token gives the same bits on
/// the default path (quantized activations, f16 cache), for Qwen3.5's
/// recurrent state as for the KV cache; and rewinding a session with linear
/// layers starts it over.
#[test]
fn qwen35_batches_and_single_tokens_give_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..19).map(|i| (i * 7919 + 13) % 49152).collect();
    for preset_name in ["tiny-qwen3.5", "tiny-qwen3.5-moe"] {
        let out = qwen35_model(dir.path(), preset_name, OutType::Q8_0);
        let gguf = GgufModel::open(&out).unwrap();
        let model = Model::new(&gguf, 64).unwrap();
        let mut whole = model.session();
        let batch = model.forward(&mut whole, &ids).unwrap();
        let mut single = model.session();
        let mut one = Vec::new();
        for &t in &ids {
            one.extend(model.forward(&mut single, &[t]).unwrap());
        }
        assert!(
            batch
                .iter()
                .zip(&one)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{preset_name}: batch and token-by-token differ"
        );
        // A rewind cannot step the recurrent state back: everything goes.
        whole.truncate(5);
        assert_eq!(whole.len(), 0, "{preset_name}");
        let again = model.forward(&mut whole, &ids).unwrap();
        assert_eq!(again, batch, "{preset_name}: after starting over");
    }
}
