//! Mixture-of-experts models against llama-quantize: the generated Mixtral-like
//! (llama, 8 experts: llama.cpp's 8-expert rules) and Qwen3-MoE-like (16 experts)
//! fixtures, quantized with six mixes with and without a per-expert importance
//! matrix (one expert never routed). Expert tensors are 3-D; the mixes pick their
//! layer from the name; the imatrix is sliced per expert. Expectations:
//! fixtures/moe/llama-quantize.json (fixtures/moe/quant_reference.sh).

use std::path::Path;

use memwall_fixtures::moe_gguf::{SHAPES, write_imatrix, write_model};
use memwall_format::ggml_type::file_type_by_name;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::job::{self, ImatrixInput, Options};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn check_tensors(label: &str, bytes: &[u8], expected: &Value) {
    let file = memwall_format::gguf::parse(bytes).unwrap();
    let expected = expected.as_object().unwrap();
    assert_eq!(file.tensors.len(), expected.len(), "{label}");
    for t in &file.tensors {
        let want = &expected[&t.name];
        let data = &bytes[(file.data_offset + t.offset) as usize..][..t.size as usize];
        assert!(
            t.ty.name().eq_ignore_ascii_case(want[0].as_str().unwrap()),
            "{label}: {} is {} (llama.cpp: {})",
            t.name,
            t.ty,
            want[0]
        );
        assert_eq!(
            sha(data),
            want[1].as_str().unwrap(),
            "{label}: {} data",
            t.name
        );
    }
}

#[test]
fn moe_mixes_are_the_files_llama_quantize_writes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/moe/llama-quantize.json");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    for (name, shape) in SHAPES {
        let expected = &reference["models"][name];
        let input = dir.path().join(format!("{name}-f16.gguf"));
        let imatrix_path = dir.path().join(format!("{name}-imatrix.gguf"));
        write_model(&input, &shape).unwrap();
        write_imatrix(&imatrix_path, &shape).unwrap();
        assert_eq!(
            sha(&std::fs::read(&input).unwrap()),
            expected["input_sha256"].as_str().unwrap()
        );
        assert_eq!(
            sha(&std::fs::read(&imatrix_path).unwrap()),
            expected["imatrix_sha256"].as_str().unwrap()
        );
        let model = GgufModel::open(&input).unwrap();
        let imatrix = Imatrix::load(&imatrix_path).unwrap();
        for (mix, want) in expected["mix"].as_object().unwrap() {
            let options = Options::new(file_type_by_name(mix).unwrap());
            let plan = job::plan(&model, &input, &options).unwrap();
            job::run(&model, &plan, None, false, &out, &Silent).unwrap();
            let bytes = std::fs::read(&out).unwrap();
            check_tensors(&format!("{name} {mix}"), &bytes, &want["tensors"]);
            assert_eq!(
                sha(&bytes),
                want["sha256"].as_str().unwrap(),
                "{name} {mix}: file"
            );
        }
        for (mix, want) in expected["imatrix_mix"].as_object().unwrap() {
            let mut options = Options::new(file_type_by_name(mix).unwrap());
            options.imatrix = Some(ImatrixInput {
                label: "imatrix.gguf".into(),
                data: imatrix.clone(),
            });
            let plan = job::plan(&model, &input, &options).unwrap();
            job::run(&model, &plan, Some(&imatrix), false, &out, &Silent).unwrap();
            check_tensors(
                &format!("{name} {mix} --imatrix"),
                &std::fs::read(&out).unwrap(),
                want,
            );
        }
    }
}
