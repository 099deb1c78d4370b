//! Tensors against llama.cpp's converter: every output tensor's name, type,
//! shape and bytes, in order, for tiny-zh (llama.cpp's F16 conversion is
//! committed) and for memwall-synth's tiny checkpoint of every supported
//! architecture at f16, bf16, f32 and q8_0 (expectations recorded by
//! fixtures/synth/convert_reference.sh).

mod common;

use common::{
    fixtures, model_keys, options, quantize, recorded_keys, recorded_tokenizer_keys, sha,
    tokenizer_keys,
};

use std::path::{Path, PathBuf};

use memwall_convert::arch::Arch;
use memwall_convert::checkpoint::Checkpoint;
use memwall_convert::naming::{naming, parameter_counts};
use memwall_convert::tensors::{OutType, encode, plan, rows};
use memwall_fixtures::synth::{Options, preset, write_checkpoint};
use memwall_format::gguf::GgufFile;
use serde_json::Value;

fn class(ckpt: &Checkpoint) -> &'static Arch {
    let class = ckpt.config()["architectures"][0].as_str().unwrap();
    Arch::for_class(class).unwrap()
}

/// (name, type, dims, sha256) of every tensor memwall would write.
fn converted(ckpt: &Checkpoint, outtype: OutType) -> Vec<(String, String, Vec<u64>, String)> {
    plan(ckpt, class(ckpt), outtype)
        .unwrap()
        .iter()
        .map(|p| {
            let bytes = encode(p, &rows(ckpt, p, 0, p.rows()).unwrap(), &quantize).unwrap();
            (
                p.name.clone(),
                p.ty.name().to_uppercase(),
                p.dims.clone(),
                sha(&bytes),
            )
        })
        .collect()
}

/// llama.cpp's recorded conversions of the synthetic checkpoints.
fn recorded() -> Value {
    let text = std::fs::read_to_string(fixtures().join("synth/llama-convert.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Writes memwall-synth's tiny checkpoint of `arch` (vocabulary 49152, SmolLM2's
/// tokenizer) into `dir/arch`, checking it is the input llama.cpp converted.
fn synth_checkpoint(dir: &Path, arch: &str, expected: &Value) -> PathBuf {
    let options = Options {
        tokenizer_dir: Some(fixtures().join("smollm2")),
        ..Options::default()
    };
    let mut p = preset(&format!("tiny-{arch}")).unwrap();
    p.shape.vocab = 49152;
    let out = dir.join(arch);
    write_checkpoint(&out, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    let st = std::fs::read(out.join("model.safetensors")).unwrap();
    assert_eq!(
        sha(&st),
        expected["safetensors_sha256"].as_str().unwrap(),
        "{arch}: synth input"
    );
    out
}

#[test]
fn tiny_zh_tensors_equal_llama_cpp_f16_conversion() {
    let ckpt = Checkpoint::open(&fixtures().join("tiny-zh")).unwrap();
    let reference = GgufFile::open(&fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let ours = converted(&ckpt, OutType::F16);
    let theirs: Vec<_> = reference
        .tensors()
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.ty.name().to_uppercase(),
                t.dims.clone(),
                sha(reference.tensor_data(t)),
            )
        })
        .collect();
    assert_eq!(ours, theirs);
}

#[test]
fn every_architecture_and_outtype_equals_llama_cpp() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    for (arch, expected) in reference["archs"].as_object().unwrap() {
        let out = synth_checkpoint(dir.path(), arch, expected);
        let ckpt = Checkpoint::open(&out).unwrap();
        // Naming keys from the folder name and the parameter count.
        let planned = plan(&ckpt, class(&ckpt), OutType::F16).unwrap();
        let counts = parameter_counts(planned.iter().map(|p| (p.name.as_str(), p.dims.as_slice())));
        let n = naming(&out, ckpt.config(), counts, &Default::default());
        let meta = &expected["outtypes"]["f16"]["metadata"];
        assert_eq!(
            n.name.as_deref(),
            meta["general.name"]["value"].as_str(),
            "{arch}"
        );
        assert_eq!(
            n.size_label.as_deref(),
            meta["general.size_label"]["value"].as_str(),
            "{arch}"
        );
        for (outtype, want) in expected["outtypes"].as_object().unwrap() {
            let ours = converted(&ckpt, OutType::parse(outtype).unwrap());
            let theirs: Vec<_> = want["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let dims = t[2]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d.as_u64().unwrap())
                        .collect();
                    (
                        t[0].as_str().unwrap().to_owned(),
                        t[1].as_str().unwrap().to_owned(),
                        dims,
                        t[3].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            assert_eq!(ours.len(), theirs.len(), "{arch} {outtype}: tensor count");
            for (a, b) in ours.iter().zip(&theirs) {
                assert_eq!(a, b, "{arch} {outtype}");
            }
        }
    }
}

#[test]
fn hyper_parameter_keys_equal_llama_cpp() {
    use memwall_convert::metadata::hparams;
    use memwall_format::gguf::Metadata;
    // tiny-zh, against the committed conversion.
    let ckpt = Checkpoint::open(&fixtures().join("tiny-zh")).unwrap();
    let mut meta = Metadata::new();
    hparams(&mut meta, ckpt.config(), class(&ckpt), OutType::F16).unwrap();
    let reference = GgufFile::open(&fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    assert_eq!(model_keys(&meta), model_keys(reference.metadata()));
    // Every architecture and output type, against the recorded conversions.
    let reference = recorded();
    for (arch, expected) in reference["archs"].as_object().unwrap() {
        let p = preset(&format!("tiny-{arch}")).unwrap();
        let mut shape = p.shape.clone();
        shape.vocab = 49152;
        let config = memwall_fixtures::synth::config_json(p.arch, &shape);
        let class = config["architectures"][0].as_str().unwrap();
        for (outtype, want) in expected["outtypes"].as_object().unwrap() {
            let mut meta = Metadata::new();
            hparams(
                &mut meta,
                &config,
                Arch::for_class(class).unwrap(),
                OutType::parse(outtype).unwrap(),
            )
            .unwrap();
            assert_eq!(
                model_keys(&meta),
                recorded_keys(&want["metadata"]),
                "{arch} {outtype}"
            );
        }
    }
}

#[test]
fn tokenizer_keys_equal_llama_cpp() {
    use memwall_convert::vocab::{load_bpe, write_vocab};
    use memwall_format::gguf::Metadata;
    // tiny-zh against its committed conversion (pre-tokenizer named: gpt-2).
    let dir = fixtures().join("tiny-zh");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let v = load_bpe(&dir, ckpt.config(), "llama").unwrap();
    let mut meta = Metadata::new();
    write_vocab(&mut meta, &v, "gpt-2");
    let reference = GgufFile::open(&dir.join("reference/tiny-zh-f16.gguf")).unwrap();
    assert_eq!(tokenizer_keys(reference.metadata()).len(), 10);
    assert_eq!(tokenizer_keys(&meta), tokenizer_keys(reference.metadata()));
    // SmolLM2's tokenizer in every synthetic architecture (llama.cpp names it smollm).
    let reference = recorded();
    let tokdir = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixtures().join("smollm2").join(f), tokdir.path().join(f)).unwrap();
    }
    for (arch, expected) in reference["archs"].as_object().unwrap() {
        let p = preset(&format!("tiny-{arch}")).unwrap();
        let mut shape = p.shape.clone();
        shape.vocab = 49152;
        let config = memwall_fixtures::synth::config_json(p.arch, &shape);
        let gguf_arch = Arch::for_class(config["architectures"][0].as_str().unwrap())
            .unwrap()
            .gguf;
        let v = load_bpe(tokdir.path(), &config, gguf_arch).unwrap();
        let mut meta = Metadata::new();
        write_vocab(&mut meta, &v, "smollm");
        let want = recorded_tokenizer_keys(&expected["outtypes"]["f16"]["metadata"]);
        assert!(
            want.len() >= 10,
            "{arch}: the recording has the tokenizer keys"
        );
        assert_eq!(tokenizer_keys(&meta), want, "{arch}");
    }
}

#[test]
fn whole_files_equal_llama_cpp() {
    use memwall_convert::job::convert;
    use memwall_format::progress::Silent;
    let out_dir = tempfile::tempdir().unwrap();
    // tiny-zh: the committed conversion, byte for byte.
    let out = out_dir.path().join("tiny-zh.gguf");
    let gpt2 = options(OutType::F16, Some("gpt-2"));
    convert(&fixtures().join("tiny-zh"), &out, &gpt2, &Silent).unwrap();
    assert_eq!(
        sha(&std::fs::read(&out).unwrap()),
        sha(&std::fs::read(fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap())
    );
    // Every synthetic architecture at every output type: the recorded file hashes.
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    for (arch, expected) in reference["archs"].as_object().unwrap() {
        let ckpt = synth_checkpoint(dir.path(), arch, expected);
        for (outtype, want) in expected["outtypes"].as_object().unwrap() {
            // The pre-tokenizer recognised from the tokenizer, as llama.cpp does.
            common::assert_converts_to(&ckpt, &out, (outtype, None, false), want, arch);
        }
    }
}

#[test]
fn split_output_equals_llama_cpps_parts() {
    use memwall_convert::job::{Options as Convert, convert, parse_split_size};
    use memwall_format::progress::Silent;
    let text =
        std::fs::read_to_string(fixtures().join("tiny-zh/reference/llamacpp-split.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = Convert {
        split_max_size: Some(parse_split_size("4M").unwrap()),
        ..options(OutType::F16, Some("gpt-2"))
    };
    let written = convert(
        &fixtures().join("tiny-zh"),
        &dir.path().join("tz.gguf"),
        &options,
        &Silent,
    )
    .unwrap();
    let parts = reference["parts"].as_object().unwrap();
    assert_eq!(written.len(), parts.len());
    for path in &written {
        let name = path.file_name().unwrap().to_str().unwrap();
        let want = &parts[name];
        assert_eq!(
            sha(&std::fs::read(path).unwrap()),
            want["sha256"].as_str().unwrap(),
            "{name}"
        );
    }
    // And the split model opens as one, with every tensor of the unsplit conversion.
    let model = memwall_format::gguf::GgufModel::open(&written[0]).unwrap();
    assert_eq!(model.tensor_count(), 39);
    assert_eq!(parse_split_size("2G").unwrap(), 2_000_000_000);
    assert!(parse_split_size("2T").is_err() && parse_split_size("x").is_err());
}

#[test]
fn llama3_rope_factors_equal_pytorchs_and_the_file_llama_cpps() {
    use memwall_convert::job::convert;
    use memwall_convert::tensors::llama3_rope_factors;
    use memwall_format::progress::Silent;
    // The factors, bit for bit, for Llama 3.1's and 3.2's rope parameters (recorded from torch).
    let text = std::fs::read_to_string(fixtures().join("synth/rope_freqs.json")).unwrap();
    let recorded: Value = serde_json::from_str(&text).unwrap();
    for case in recorded["cases"].as_array().unwrap() {
        let config = serde_json::json!({
            "head_dim": case["head_dim"],
            "rope_scaling": {
                "rope_type": "llama3",
                "rope_theta": case["rope_theta"],
                "factor": case["factor"],
                "low_freq_factor": case["low_freq_factor"],
                "high_freq_factor": case["high_freq_factor"],
                "original_max_position_embeddings": case["original_max_position_embeddings"],
            },
        });
        let ours: Vec<u32> = llama3_rope_factors(&config)
            .unwrap()
            .unwrap()
            .iter()
            .map(|f| f.to_bits())
            .collect();
        let theirs: Vec<u32> = case["bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ours, theirs, "{}", case["name"]);
    }
    // A whole conversion with Llama 3.1's rope scaling: llama.cpp's file.
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("synth/llama3-rope.json")).unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth_checkpoint(dir.path(), "llama", &recorded_llama());
    let renamed = dir.path().join("llama3");
    std::fs::rename(&ckpt, &renamed).unwrap();
    let config_path = renamed.join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["rope_theta"] = serde_json::json!(500000.0);
    config["rope_scaling"] = serde_json::json!({
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
    });
    std::fs::write(&config_path, config.to_string()).unwrap();
    let out = dir.path().join("out.gguf");
    let options = options(OutType::F16, None);
    convert(&renamed, &out, &options, &Silent).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len() as u64, want["bytes"].as_u64().unwrap());
    assert_eq!(sha(&bytes), want["sha256"].as_str().unwrap());
}

fn recorded_llama() -> Value {
    recorded()["archs"]["llama"].clone()
}

#[test]
fn post_processor_templates_with_bos_equal_llama_cpp() {
    use memwall_convert::job::convert;
    use memwall_format::progress::Silent;
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("synth/template-bos.json")).unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth_checkpoint(dir.path(), "qwen3", &recorded()["archs"]["qwen3"]);
    // The same edit as fixtures/synth/template_bos_tokenizer.py.
    let path = ckpt.join("tokenizer.json");
    let mut t: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let bos = serde_json::json!({"SpecialToken": {"id": "<|im_start|>", "type_id": 0}});
    t["post_processor"] = serde_json::json!({"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        {"type": "TemplateProcessing",
         "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|im_start|>", "type_id": 1}},
                  {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}
    ]});
    std::fs::write(&path, t.to_string()).unwrap();
    let out = dir.path().join("out.gguf");
    let options = options(OutType::F16, Some("smollm"));
    convert(&ckpt, &out, &options, &Silent).unwrap();
    let file = GgufFile::open(&out).unwrap();
    assert_eq!(
        file.metadata()
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap(),
        Some(true)
    );
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len() as u64, want["bytes"].as_u64().unwrap());
    assert_eq!(sha(&bytes), want["sha256"].as_str().unwrap());
    // memwall export writes the BOS template back; converting that gives the same file.
    use memwall_convert::export::{ExportDtype, ExportOptions, export};
    let back = dir.path().join("back").join(ckpt.file_name().unwrap());
    let o = ExportOptions {
        dtype: ExportDtype::F32,
        ..ExportOptions::default()
    };
    export(&out, &back, &o, &Silent).unwrap();
    let again = dir.path().join("again.gguf");
    convert(&back, &again, &options, &Silent).unwrap();
    assert_eq!(sha(&std::fs::read(&again).unwrap()), sha(&bytes));
}

/// Keys recorded as `{key: [type, value]}`, as (key, type, value text).
fn recorded_pairs(keys: &Value) -> Vec<(String, String, String)> {
    keys.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let ty = v[0].as_str().unwrap().to_owned();
            let text = match ty.as_str() {
                "FLOAT32" => (v[1].as_f64().unwrap() as f32).to_string(),
                "STRING" => v[1].as_str().unwrap().to_owned(),
                _ => v[1].to_string(),
            };
            (k.clone(), ty, text)
        })
        .collect()
}

/// The `<arch>.*` keys memwall writes for the tiny synthetic `arch` whose
/// config.json `edit` changed (then filled with transformers' defaults).
fn arch_keys(arch: &str, edit: impl FnOnce(&mut Value)) -> Vec<(String, String, String)> {
    use memwall_convert::hf_config::with_defaults;
    use memwall_convert::metadata::hparams;
    let mut p = preset(&format!("tiny-{arch}")).unwrap();
    p.shape.vocab = 49152;
    let mut config = memwall_fixtures::synth::config_json(p.arch, &p.shape);
    edit(&mut config);
    with_defaults(&mut config);
    let class = Arch::for_class(config["architectures"][0].as_str().unwrap()).unwrap();
    let mut meta = memwall_format::gguf::Metadata::new();
    hparams(&mut meta, &config, class, OutType::F16).unwrap();
    let prefix = format!("{}.", class.gguf);
    model_keys(&meta)
        .into_iter()
        .filter(|(k, _, _)| k.starts_with(&prefix))
        .collect()
}

#[test]
fn missing_config_keys_take_transformers_defaults_like_llama_cpp() {
    let text = std::fs::read_to_string(fixtures().join("synth/config-defaults.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    for (arch, expected) in reference["archs"].as_object().unwrap() {
        let ours = arch_keys(arch, |config| {
            for k in expected["stripped"].as_array().unwrap() {
                config.as_object_mut().unwrap().remove(k.as_str().unwrap());
            }
        });
        let theirs = recorded_pairs(&expected["keys"]);
        assert_eq!(ours, theirs, "{arch}");
    }
}

/// The metadata `memwall convert --outtype f16` plans for the checkpoint in `dir`.
fn prepared_f16(dir: &Path) -> memwall_format::gguf::Metadata {
    use memwall_convert::job::prepare;
    let ckpt = Checkpoint::open(dir).unwrap();
    let o = options(OutType::F16, None);
    prepare(&ckpt, &o).unwrap().metadata
}

#[test]
fn model_card_keys_equal_llama_cpp() {
    use memwall_format::gguf::{Array as A, Value as V};
    let text = std::fs::read_to_string(fixtures().join("synth/model-cards.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        tokenizer_dir: Some(fixtures().join("smollm2")),
        ..Options::default()
    };
    for (card, want) in reference.as_object().unwrap() {
        let mut p = preset("tiny-llama").unwrap();
        p.shape.vocab = 49152;
        let out = dir.path().join(card);
        write_checkpoint(&out, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
        std::fs::copy(
            fixtures().join(format!("synth/model-cards/{card}.md")),
            out.join("README.md"),
        )
        .unwrap();
        let meta = prepared_f16(&out);
        let ours: Vec<Value> = meta
            .iter()
            .filter(|(k, _)| k.starts_with("general."))
            .map(|(k, v)| {
                let (types, value) = match v {
                    V::String(s) => (serde_json::json!(["STRING"]), serde_json::json!(s)),
                    V::U32(n) => (serde_json::json!(["UINT32"]), serde_json::json!(n)),
                    V::Array(A::String(a)) => {
                        (serde_json::json!(["ARRAY", "STRING"]), serde_json::json!(a))
                    }
                    other => panic!("{k}: unexpected {other:?}"),
                };
                serde_json::json!([k, types, value])
            })
            .collect();
        assert_eq!(&ours, want.as_array().unwrap(), "{card}");
    }
}

#[test]
fn named_chat_templates_equal_llama_cpp() {
    use memwall_format::gguf::{Array as A, Value as V};
    let text = std::fs::read_to_string(fixtures().join("synth/chat-templates.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        tokenizer_dir: Some(fixtures().join("smollm2")),
        ..Options::default()
    };
    for case in ["list", "jinja"] {
        let mut p = preset("tiny-llama").unwrap();
        p.shape.vocab = 49152;
        let out = dir.path().join(case);
        write_checkpoint(&out, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
        // The same edits as fixtures/synth/chat_templates_reference.sh.
        let tc_path = out.join("tokenizer_config.json");
        let mut tc: Value = serde_json::from_slice(&std::fs::read(&tc_path).unwrap()).unwrap();
        if case == "list" {
            tc["chat_template"] = serde_json::json!([
                {"name": "default", "template": "{{ messages[0]['content'] }}"},
                {"name": "tool use", "template": "{{ tools }}{{ messages[0]['content'] }}"}
            ]);
        } else {
            tc.as_object_mut().unwrap().remove("chat_template");
            std::fs::write(
                out.join("chat_template.jinja"),
                "{% for m in messages %}{{ m['content'] }}{% endfor %}",
            )
            .unwrap();
            std::fs::create_dir(out.join("additional_chat_templates")).unwrap();
            std::fs::write(
                out.join("additional_chat_templates/rag.jinja"),
                "{{ documents }}",
            )
            .unwrap();
        }
        std::fs::write(&tc_path, serde_json::to_vec(&tc).unwrap()).unwrap();
        let meta = prepared_f16(&out);
        let ours: Vec<Value> = meta
            .iter()
            .filter(|(k, _)| k.starts_with("tokenizer.chat_template"))
            .map(|(k, v)| match v {
                V::String(s) => serde_json::json!([k, s]),
                V::Array(A::String(a)) => serde_json::json!([k, a]),
                other => panic!("{k}: {other:?}"),
            })
            .collect();
        assert_eq!(&ours, reference[case].as_array().unwrap(), "{case}");
    }
}

#[test]
fn rope_scaling_keys_equal_llama_cpp() {
    let text = std::fs::read_to_string(fixtures().join("synth/rope-scaling.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    for (case, expected) in reference["cases"].as_object().unwrap() {
        let ours = arch_keys(expected["arch"].as_str().unwrap(), |config| {
            for (k, v) in expected["config"].as_object().unwrap() {
                config[k.as_str()] = v.clone();
            }
        });
        let theirs = recorded_pairs(&expected["keys"]);
        assert_eq!(ours, theirs, "{case}");
    }
}
