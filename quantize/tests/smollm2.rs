//! SmolLM2-135M against llama-quantize: the F16 GGUF llama.cpp's converter
//! made of SmolLM2 (rebuilt from the published Q4_1 GGUF) is rebuilt here from
//! its recorded header and memwall's dequantization of the Q4_1 file — and
//! must hash to what the converter wrote — then quantized with six of
//! llama.cpp's mixes; each output must be byte-identical to llama-quantize's.
//! The rows of 576 weights exercise the fallbacks (Q4_K → Q5_0, Q6_K → Q8_0,
//! IQ4_XS → IQ4_NL) and the tied embeddings rule.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memwall_format::GgmlType;
use memwall_format::blocks::{dequantize_row, f32_to_f16};
use memwall_format::ggml_type::file_type_by_name;
use memwall_format::gguf::{GgufFile, GgufModel};
use memwall_format::progress::Silent;
use memwall_quantize::job::{self, Options};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn sha_file(path: &Path) -> String {
    let mut h = Sha256::new();
    std::io::copy(&mut File::open(path).unwrap(), &mut h).unwrap();
    format!("{:x}", h.finalize())
}

/// Rebuilds llama.cpp's F16 conversion of SmolLM2 at `out`.
fn rebuild_f16(reference: &Value, out: &Path) {
    let q4 = fixtures().join("cache/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        q4.exists(),
        "missing {}: run fixtures/fetch.sh",
        q4.display()
    );
    let source = GgufModel::open(&q4).unwrap();
    let header = std::fs::read(fixtures().join("smollm2/reference/f16-header.gguf")).unwrap();
    let mut f = File::create(out).unwrap();
    f.write_all(&header).unwrap();
    f.set_len(reference["input"]["bytes"].as_u64().unwrap())
        .unwrap();
    drop(f);
    // Parse the header through the (sparse) full-length file, then fill in the data.
    let layout = GgufFile::open(out).unwrap().header().clone();
    let f = File::options().write(true).open(out).unwrap();
    for t in &layout.tensors {
        let (info, data) = source.tensor(&t.name).unwrap();
        let mut x = vec![0f32; info.elements as usize];
        dequantize_row(info.ty, data, &mut x).unwrap();
        let bytes: Vec<u8> = match t.ty {
            GgmlType::F16 => x
                .iter()
                .flat_map(|&v| f32_to_f16(v).to_le_bytes())
                .collect(),
            GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            other => panic!("unexpected {other} in the F16 conversion"),
        };
        f.write_all_at(&bytes, layout.data_offset + t.offset)
            .unwrap();
    }
    f.sync_all().unwrap();
}

#[test]
fn mixes_with_fallbacks_are_the_files_llama_quantize_writes() {
    let text =
        std::fs::read_to_string(fixtures().join("smollm2/reference/llama-quantize.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("smollm2-f16.gguf");
    rebuild_f16(&reference, &input);
    assert_eq!(
        sha_file(&input),
        reference["input"]["sha256"].as_str().unwrap(),
        "the rebuilt F16 input differs from llama.cpp's conversion"
    );
    let model = GgufModel::open(&input).unwrap();
    let out = dir.path().join("out.gguf");
    for (name, expected) in reference["mix"].as_object().unwrap() {
        let options = Options::new(file_type_by_name(name).unwrap());
        let plan = job::plan(&model, &input, &options).unwrap();
        // Every tensor's type first, for a readable failure.
        let tensors = expected["tensors"].as_object().unwrap();
        for t in &plan.tensors {
            let want = tensors[&t.name][0].as_str().unwrap();
            assert!(
                t.target.name().eq_ignore_ascii_case(want),
                "{name}: {} planned as {} (llama.cpp: {want})",
                t.name,
                t.target
            );
        }
        job::run(&model, &plan, None, false, &out, &Silent).unwrap();
        assert_eq!(
            sha_file(&out),
            expected["sha256"].as_str().unwrap(),
            "{name}: output differs from llama-quantize"
        );
    }
}
