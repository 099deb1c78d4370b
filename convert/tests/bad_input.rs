//! Damaged checkpoints: each is a clear error naming the file or tensor.

use std::path::Path;

use memwall_convert::arch::Arch;
use memwall_convert::checkpoint::Checkpoint;
use memwall_convert::tensors::{OutType, plan};
use memwall_fixtures::synth::{Options, preset, write_checkpoint};

fn synth(dir: &Path, name: &str, max_shard_bytes: u64) -> std::path::PathBuf {
    let p = preset(name).unwrap();
    let out = dir.join(name);
    let options = Options {
        max_shard_bytes,
        ..Options::default()
    };
    write_checkpoint(&out, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    out
}

fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn shards_must_agree_with_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth(dir.path(), "tiny-llama", 400_000);
    let shards: Vec<_> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert!(shards.len() > 1, "needs a sharded checkpoint");
    assert!(Checkpoint::open(&ckpt).is_ok());
    // A missing shard names the file.
    let gone = &shards[1];
    let saved = std::fs::read(gone).unwrap();
    std::fs::remove_file(gone).unwrap();
    let err = open_err(&ckpt);
    assert!(
        err.contains(&gone.file_name().unwrap().to_string_lossy().into_owned()),
        "{err}"
    );
    std::fs::write(gone, &saved).unwrap();
    // An index entry no shard holds.
    let index_path = ckpt.join("model.safetensors.index.json");
    let index = std::fs::read_to_string(&index_path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&index).unwrap();
    v["weight_map"]["model.layers.9.mlp.up_proj.weight"] =
        v["weight_map"]["model.norm.weight"].clone();
    std::fs::write(&index_path, v.to_string()).unwrap();
    let err = open_err(&ckpt);
    assert!(
        err.contains("lists tensors no shard holds: model.layers.9.mlp.up_proj.weight"),
        "{err}"
    );
    // A tensor the index does not list.
    v["weight_map"]
        .as_object_mut()
        .unwrap()
        .remove("model.layers.9.mlp.up_proj.weight");
    v["weight_map"]
        .as_object_mut()
        .unwrap()
        .remove("model.norm.weight");
    std::fs::write(&index_path, v.to_string()).unwrap();
    let err = open_err(&ckpt);
    assert!(
        err.contains("does not list") && err.contains("model.norm.weight"),
        "{err}"
    );
}

#[test]
fn corrupt_and_truncated_safetensors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth(dir.path(), "tiny-qwen3", u64::MAX);
    let file = ckpt.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    // Truncated data.
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let err = open_err(&ckpt);
    assert!(
        err.contains("model.safetensors: not a valid safetensors file"),
        "{err}"
    );
    // A header length larger than the file.
    let mut hostile = bytes.clone();
    hostile[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&file, &hostile).unwrap();
    assert!(open_err(&ckpt).contains("not a valid safetensors file"));
    // An unsupported dtype.
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let first = header.find("\"BF16\"").unwrap();
    let mut changed = bytes.clone();
    changed[8 + first..8 + first + 6].copy_from_slice(b"\"I16\" ");
    std::fs::write(&file, &changed).unwrap();
    let err = open_err(&ckpt);
    assert!(
        err.contains("dtype I16") || err.contains("not a valid safetensors"),
        "{err}"
    );
    // Missing config.
    std::fs::write(&file, &bytes).unwrap();
    std::fs::remove_file(ckpt.join("config.json")).unwrap();
    assert!(open_err(&ckpt).contains("config.json"));
}

#[test]
fn unknown_architectures_and_tensors_are_listed() {
    let err = Arch::for_class("FalconForCausalLM")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("FalconForCausalLM") && err.contains("Qwen3MoeForCausalLM"),
        "{err}"
    );
    // A llama checkpoint with two tensors llama.cpp would not know what to do with.
    let dir = tempfile::tempdir().unwrap();
    let zeros = [0u8; 4 * 4 * 4];
    let view = |shape: Vec<usize>| {
        let n = shape.iter().product::<usize>() * 4;
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, &zeros[..n]).unwrap()
    };
    let tensors = vec![
        ("model.embed_tokens.weight", view(vec![4, 4])),
        ("model.layers.0.mlp.mystery.weight", view(vec![4, 4])),
        (
            "model.layers.0.self_attn.rotary_emb.inv_freq",
            view(vec![4]),
        ),
        ("model.extra_head.weight", view(vec![4, 4])),
        // A multimodal checkpoint's other towers are dropped, as llama.cpp drops them.
        ("vision_tower.proj.weight", view(vec![4, 4])),
    ];
    safetensors::serialize_to_file(tensors, None, &dir.path().join("model.safetensors")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"], "num_attention_heads": 2}"#,
    )
    .unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let err = plan(
        &ckpt,
        Arch::for_class("LlamaForCausalLM").unwrap(),
        OutType::F16,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "unexpected tensors for llama: model.extra_head.weight, model.layers.0.mlp.mystery.weight"
    );
    // An MoE architecture needs its expert count.
    let err = plan(
        &ckpt,
        Arch::for_class("Qwen3MoeForCausalLM").unwrap(),
        OutType::F16,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("num_experts"), "{err}");
}

#[test]
fn weights_that_do_not_match_the_config_are_listed() {
    use memwall_convert::job::{Options as Convert, convert};
    use memwall_format::progress::Silent;
    let dir = tempfile::tempdir().unwrap();
    let ckpt = synth(dir.path(), "tiny-qwen3", u64::MAX);
    let out = dir.path().join("out.gguf");
    let encode = |_: memwall_format::GgmlType,
                  _: &[f32],
                  _: &mut [u8]|
     -> Result<(), memwall_convert::tensors::RowEncodeError> { Ok(()) };
    let options = Convert {
        outtype: OutType::F16,
        pre: Some("gpt-2".into()),
        encode: &encode,
        allow_nonfinite: false,
        split_max_size: None,
        no_mtp: false,
    };
    let config_path = ckpt.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    // A config that claims more layers and another FFN width than the weights have.
    let mut v: serde_json::Value = serde_json::from_str(&config).unwrap();
    v["num_hidden_layers"] = serde_json::json!(3);
    v["intermediate_size"] = serde_json::json!(1024);
    std::fs::write(&config_path, v.to_string()).unwrap();
    let err = convert(&ckpt, &out, &options, &Silent)
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing blk.2.attn_q.weight"), "{err}");
    assert!(
        err.contains("model.layers.0.mlp.down_proj.weight (blk.0.ffn_down.weight) has shape [256, 512], config.json implies [256, 1024]"),
        "{err}"
    );
    assert!(!out.exists());
    // A config without the keys the shapes come from.
    v.as_object_mut().unwrap().remove("hidden_size");
    v.as_object_mut().unwrap().remove("vocab_size");
    std::fs::write(&config_path, v.to_string()).unwrap();
    let err = convert(&ckpt, &out, &options, &Silent)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.json lacks hidden_size, vocab_size"),
        "{err}"
    );
}

/// A safetensors file of F32 tensors of one element each.
fn safetensors(names: &[&str]) -> Vec<u8> {
    let entries: Vec<String> = (0..)
        .zip(names)
        .map(|(i, n)| {
            format!(
                r#""{n}":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}}"#,
                4 * i,
                4 * i + 4
            )
        })
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + 4 * names.len(), 0);
    out
}

/// Found by the `safetensors_index` fuzz target: a tensor held by two shards,
/// listed in the index under the second, was read twice (the index check only
/// saw one shard per name).
#[test]
fn fuzz_tensor_in_two_shards_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("config.json"), "{}").unwrap();
    let (first, second) = (
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    );
    let index = serde_json::json!({"weight_map": {"a": second, "b": first}});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::write(d.join(first), safetensors(&["a", "b"])).unwrap();
    std::fs::write(d.join(second), safetensors(&["a"])).unwrap();
    assert_eq!(
        open_err(d),
        format!("{}: tensor a is also in {first}", d.join(second).display())
    );
}

fn load_bpe_err(tokenizer: &serde_json::Value, config: &serde_json::Value) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let err = memwall_convert::vocab::load_bpe(dir.path(), config, "qwen2")
        .unwrap_err()
        .to_string();
    err.replace(&dir.path().display().to_string(), "DIR")
}

fn tiny_bpe(merges: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": merges}})
}

/// Found by the `tokenizer_json` fuzz target: a merge whose result is not a
/// token was accepted (the tokenizers library, and so llama.cpp's converter,
/// refuses it); the runtime then dropped the bytes of that piece when encoding.
#[test]
fn fuzz_bpe_merge_into_missing_token_is_refused() {
    let config = serde_json::json!({});
    assert_eq!(
        load_bpe_err(&tiny_bpe(serde_json::json!(["a b", "ab b"])), &config),
        r#"DIR/tokenizer.json: model.merges[1] ("ab", "b") needs the token "abb", which model.vocab does not have"#
    );
    assert_eq!(
        load_bpe_err(&tiny_bpe(serde_json::json!([["a", "c"]])), &config),
        r#"DIR/tokenizer.json: model.merges[0] ("a", "c") needs the token "c", which model.vocab does not have"#
    );
    assert_eq!(
        load_bpe_err(&tiny_bpe(serde_json::json!(["a b c"])), &config),
        r#"DIR/tokenizer.json: model.merges[0] "a b c" is not two tokens separated by a space"#
    );
}

/// Found by the `tokenizer_json` fuzz target: `vocab_size` was not bounded
/// before one `[PADi]` string per id was made (1e11 ids: out of memory).
#[test]
fn fuzz_bpe_huge_vocab_size_is_refused() {
    let config = serde_json::json!({"vocab_size": 100_000_000_000u64});
    assert_eq!(
        load_bpe_err(&tiny_bpe(serde_json::json!(["a b"])), &config),
        "config.json: vocab_size 100000000000 is implausibly large"
    );
}

/// Found by the `tokenizer_json` fuzz target: a special id from config.json
/// past the vocabulary was kept (and truncated to u32 past 2^32); the runtime
/// refuses such a file. Ids past the vocabulary are skipped, as for SentencePiece.
#[test]
fn fuzz_bpe_special_id_past_the_vocabulary_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = tiny_bpe(serde_json::json!(["a b"]));
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config =
        serde_json::json!({"pad_token_id": 5000, "eos_token_id": 4294967298u64, "bos_token_id": 1});
    let v = memwall_convert::vocab::load_bpe(dir.path(), &config, "qwen2").unwrap();
    assert_eq!(v.special, vec![("bos", 1)]);
}

/// Found by the `hf_config` fuzz target: a float that overflows float32 was
/// written as infinity (gguf-py refuses to pack it).
#[test]
fn fuzz_f32_overflow_in_config_is_refused() {
    use memwall_convert::metadata::hparams;
    let arch = Arch::for_class("LlamaForCausalLM").unwrap();
    let base = serde_json::json!({"num_hidden_layers": 1, "vocab_size": 10, "hidden_size": 8,
        "num_attention_heads": 2});
    let err = |key: &str, value: serde_json::Value| {
        let mut config = base.clone();
        config[key] = value;
        let mut meta = memwall_format::gguf::Metadata::new();
        hparams(&mut meta, &config, arch, OutType::F16)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err("rms_norm_eps", serde_json::json!(1e39)),
        "config.json: rms_norm_eps = 1e+39 does not fit a 32-bit float"
    );
    assert_eq!(
        err(
            "rope_scaling",
            serde_json::json!({"type": "linear", "factor": -1e300})
        ),
        "config.json: factor = -1e+300 does not fit a 32-bit float"
    );
}

#[test]
fn stacked_experts_of_another_count_than_the_config_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let p = preset("tiny-qwen3-moe").unwrap();
    let ckpt = dir.path().join("m");
    let options = Options {
        fused_experts: true,
        ..Options::default()
    };
    write_checkpoint(&ckpt, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    let config_path = ckpt.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let experts = v["num_experts"].as_u64().unwrap();
    v["num_experts"] = serde_json::json!(experts * 2);
    std::fs::write(&config_path, v.to_string()).unwrap();
    let ckpt = Checkpoint::open(&ckpt).unwrap();
    let err = plan(
        &ckpt,
        Arch::for_class("Qwen3MoeForCausalLM").unwrap(),
        OutType::F16,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("model.layers.0.mlp.experts.down_proj has shape ["),
        "{err}"
    );
    assert!(err.contains(&format!("experts = {}", experts * 2)), "{err}");
}
