//! Gemma 4 against llama.cpp's converter: memwall-synth's tiny dense
//! (31B-style) and MoE (26B-A4B-style) checkpoints as published
//! (`Gemma4ForConditionalGeneration`) at four output types, and the dense text
//! model alone (`Gemma4ForCausalLM`), each carrying Gemma 4's real tokenizer
//! (made from llama.cpp's `models/ggml-vocab-gemma-4.gguf`, fetched by
//! fixtures/fetch.sh). Expectations: fixtures/synth/family_convert_reference.sh gemma4.

mod common;

use common::{
    assert_converts_to, assert_exported_vocabulary_passes, assert_tensors, fixtures, model_keys,
    options, planned_tensors, recorded_keys, recorded_tensors, sha,
};

use std::path::{Path, PathBuf};

use memwall_convert::arch::Arch;
use memwall_convert::checkpoint::Checkpoint;
use memwall_convert::job::convert;
use memwall_convert::metadata::hparams;
use memwall_convert::tensors::{OutType, plan};
use memwall_fixtures::gemma4_tokenizer::write_gemma4_tokenizer;
use memwall_fixtures::synth::{Options, preset, write_checkpoint};
use memwall_format::gguf::{GgufFile, Metadata};
use memwall_format::progress::Silent;
use serde_json::Value;

fn recorded() -> Value {
    let text = std::fs::read_to_string(fixtures().join("synth/gemma4-convert.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn llama_models() -> PathBuf {
    fixtures().join("cache/llama.cpp-0c1e570/models")
}

/// Writes the checkpoint of recorded variant `name` into `dir/name` with
/// Gemma 4's tokenizer files, checking that it is the input llama.cpp converted.
fn checkpoint(dir: &Path, name: &str, entry: &Value) -> PathBuf {
    let p = preset(entry["preset"].as_str().unwrap()).unwrap();
    let multimodal = entry["synth_flags"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "--multimodal");
    let options = Options {
        multimodal,
        ..Options::default()
    };
    let out = dir.join(name);
    write_checkpoint(&out, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    let vocab = llama_models().join("ggml-vocab-gemma-4.gguf");
    assert!(vocab.exists(), "{}: run fixtures/fetch.sh", vocab.display());
    let template = llama_models().join("templates/google-gemma-4-31B-it.jinja");
    write_gemma4_tokenizer(&vocab, Some(&template), &out).unwrap();
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

fn arch_of(ckpt: &Checkpoint) -> &'static Arch {
    Arch::for_class(ckpt.config()["architectures"][0].as_str().unwrap()).unwrap()
}

#[test]
fn every_gemma4_checkpoint_converts_tensor_for_tensor_as_llama_cpp() {
    let reference = recorded();
    let variants = reference["variants"].as_object().unwrap();
    assert_eq!(variants.len(), 3);
    let dir = tempfile::tempdir().unwrap();
    for (name, entry) in variants {
        let ckpt = Checkpoint::open(&checkpoint(dir.path(), name, entry)).unwrap();
        let arch = arch_of(&ckpt);
        for (outtype, want) in entry["outtypes"].as_object().unwrap() {
            let planned = plan(&ckpt, arch, OutType::parse(outtype).unwrap()).unwrap();
            assert_tensors(
                &planned_tensors(&ckpt, &planned),
                &recorded_tensors(want),
                &format!("{name} {outtype}"),
            );
            let mut meta = Metadata::new();
            hparams(
                &mut meta,
                ckpt.config(),
                arch,
                OutType::parse(outtype).unwrap(),
            )
            .unwrap();
            assert_eq!(
                model_keys(&meta),
                recorded_keys(&want["metadata"]),
                "{name} {outtype}: keys"
            );
        }
    }
}

/// Whole files, and the vocabulary they carry is llama.cpp's own Gemma 4
/// vocabulary file's, key for key (all but the chat template).
#[test]
fn whole_gemma4_files_equal_llama_cpps_and_carry_its_vocabulary() {
    let reference = recorded();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let vocab = GgufFile::open(&llama_models().join("ggml-vocab-gemma-4.gguf")).unwrap();
    for (name, entry) in reference["variants"].as_object().unwrap() {
        let path = checkpoint(dir.path(), name, entry);
        for (outtype, want) in entry["outtypes"].as_object().unwrap() {
            assert_converts_to(&path, &out, (outtype, None, false), want, name);
        }
        let ours = GgufFile::open(&out).unwrap();
        let tokenizer_keys = |m: &Metadata| -> Vec<(String, String)> {
            m.iter()
                .filter(|(k, _)| k.starts_with("tokenizer.") && *k != "tokenizer.chat_template")
                .map(|(k, v)| (k.to_owned(), format!("{v:?}")))
                .collect()
        };
        assert_eq!(
            tokenizer_keys(ours.metadata()),
            tokenizer_keys(vocab.metadata()),
            "{name}: vocabulary"
        );
    }
}

/// Gemma 4's E2B and E4B (per-layer token embeddings, layers reading
/// another layer's KV cache) are refused by name, before any tensor is
/// read, with nothing left at the output path.
#[test]
fn gemma4_variants_with_per_layer_embeddings_are_refused_by_name() {
    let reference = recorded();
    let entry = &reference["variants"]["gemma4-causal"];
    let dir = tempfile::tempdir().unwrap();
    let path = checkpoint(dir.path(), "gemma4-causal", entry);
    let config_path = path.join("config.json");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    for (key, value) in [
        ("hidden_size_per_layer_input", 256),
        ("num_kv_shared_layers", 1),
    ] {
        let mut c = config.clone();
        c[key] = value.into();
        std::fs::write(&config_path, c.to_string()).unwrap();
        let out = dir.path().join("out.gguf");
        let options = options(OutType::F16, None);
        let err = convert(&path, &out, &options, &Silent)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(key) && err.contains("E2B and E4B") && err.contains("not converted"),
            "{err}"
        );
        assert!(!out.exists());
    }
}

/// A Gemma 4 text checkpoint (`Gemma4ForCausalLM`) of `preset` with Gemma 4's
/// tokenizer files, in `dir/name`.
fn text_checkpoint(dir: &Path, preset_name: &str) -> PathBuf {
    let p = preset(preset_name).unwrap();
    let out = dir.join("hf").join(preset_name);
    write_checkpoint(&out, p.arch, &p.shape, &Options::default(), &mut |_| {}).unwrap();
    let template = llama_models().join("templates/google-gemma-4-31B-it.jinja");
    let vocab = llama_models().join("ggml-vocab-gemma-4.gguf");
    write_gemma4_tokenizer(&vocab, Some(&template), &out).unwrap();
    out
}

#[test]
fn gemma4_exports_back_to_the_checkpoints_tensors_and_converts_to_the_same_file() {
    use memwall_convert::export::{ExportDtype, ExportOptions, export};
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny-gemma4", "tiny-gemma4-moe"] {
        // One model's files at a time (a 262 144-token vocabulary makes them large).
        let work = dir.path().join(name);
        let hf = text_checkpoint(&work, name);
        // F32 there and back: the same file, metadata and vocabulary included.
        let first = work.join(format!("{name}.gguf"));
        convert(&hf, &first, &options(OutType::F32, None), &Silent).unwrap();
        let back = work.join("back").join(name);
        let f32 = ExportOptions {
            dtype: ExportDtype::F32,
            ..ExportOptions::default()
        };
        export(&first, &back, &f32, &Silent).unwrap();
        let again = work.join(format!("{name}-again.gguf"));
        convert(&back, &again, &options(OutType::F32, None), &Silent).unwrap();
        assert_eq!(
            sha(&std::fs::read(&again).unwrap()),
            sha(&std::fs::read(&first).unwrap()),
            "{name}: F32 export converted again"
        );
        // BF16 (the checkpoint's own type): every tensor as the checkpoint has it.
        let bf16 = work.join(format!("{name}-bf16.gguf"));
        convert(&hf, &bf16, &options(OutType::BF16, None), &Silent).unwrap();
        let back = work.join("back-bf16").join(name);
        export(&bf16, &back, &ExportOptions::default(), &Silent).unwrap();
        let original = std::fs::read(hf.join("model.safetensors")).unwrap();
        let original = safetensors::SafeTensors::deserialize(&original).unwrap();
        let ours = std::fs::read(back.join("model.safetensors")).unwrap();
        let ours = safetensors::SafeTensors::deserialize(&ours).unwrap();
        let (mut a, mut b) = (original.names(), ours.names());
        a.sort();
        b.sort();
        assert_eq!(b, a, "{name}: tensor names");
        for t in a {
            let (x, y) = (original.tensor(t).unwrap(), ours.tensor(t).unwrap());
            assert_eq!(y.shape(), x.shape(), "{name}: {t}");
            assert!(y.data() == x.data(), "{name}: {t} differs");
        }
        let read = |p: &Path| -> Value {
            serde_json::from_slice(&std::fs::read(p.join("config.json")).unwrap()).unwrap()
        };
        let (config, source) = (read(&back), read(&hf));
        for key in [
            "architectures",
            "model_type",
            "layer_types",
            "head_dim",
            "global_head_dim",
            "num_key_value_heads",
            "num_global_key_value_heads",
            "sliding_window",
            "final_logit_softcapping",
            "rope_parameters",
            "attention_k_eq_v",
            "enable_moe_block",
            "num_experts",
            "top_k_experts",
            "moe_intermediate_size",
            "tie_word_embeddings",
            "hidden_size_per_layer_input",
        ] {
            // A null is a key left to transformers' default, like a missing one.
            let get = |c: &Value| c.get(key).filter(|v| !v.is_null()).cloned();
            assert_eq!(get(&config), get(&source), "{name}: config.json {key}");
        }
        assert_eq!(
            std::fs::read(back.join("chat_template.jinja")).unwrap(),
            std::fs::read(hf.join("chat_template.jinja")).unwrap()
        );
        std::fs::remove_dir_all(&work).unwrap();
    }
}

#[test]
fn gemma4_vocabulary_exports_to_a_tokenizer_that_tokenizes_as_llama_cpp() {
    assert_exported_vocabulary_passes(&llama_models().join("ggml-vocab-gemma-4.gguf"), true);
}

#[test]
fn gemma4_with_per_layer_embeddings_is_not_exported() {
    // A file llama.cpp made of an E2B/E4B-style model (per-layer embeddings) is
    // refused by name, and nothing is left at the output path.
    use memwall_convert::export::{ExportOptions, export, partial_dir};
    use memwall_format::gguf::{GgufWriter, TensorSpec, Value as Kv};
    let dir = tempfile::tempdir().unwrap();
    let hf = text_checkpoint(dir.path(), "tiny-gemma4");
    let gguf = dir.path().join("g.gguf");
    convert(&hf, &gguf, &options(OutType::F16, None), &Silent).unwrap();
    let src = GgufFile::open(&gguf).unwrap();
    let mut meta = src.header().metadata.clone();
    meta.set("gemma4.embedding_length_per_layer_input", Kv::U32(64));
    let specs = src.header().tensors.iter().map(TensorSpec::from).collect();
    let edited = dir.path().join("e2b.gguf");
    let mut w = GgufWriter::new(Vec::new(), &edited, src.header().version, meta, specs).unwrap();
    for t in &src.header().tensors {
        w.write_tensor_data(&t.name, src.tensor_data(t)).unwrap();
    }
    std::fs::write(&edited, w.finish().unwrap()).unwrap();
    let out = dir.path().join("out");
    let err = export(&edited, &out, &ExportOptions::default(), &Silent)
        .unwrap_err()
        .to_string();
    assert!(err.contains("e2b.gguf") && err.contains("E2B/E4B"), "{err}");
    assert!(!out.exists() && !partial_dir(&out).exists());
}
