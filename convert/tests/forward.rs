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
