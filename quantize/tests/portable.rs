//! The portable build of the encoders (what runs on CPUs without AVX2, and
//! the code the aarch64 build compiles) gives the same bytes as llama-quantize:
//! every `--pure` type and two mixes of tiny-zh, with and without an imatrix.
//! (The other tests run the AVX2 build on machines that have it.)

use std::path::{Path, PathBuf};

use memwall_format::ggml_type::file_type_by_name;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::job::{self, ImatrixInput, Options};
use sha2::{Digest, Sha256};

fn tiny_zh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-zh")
}

#[test]
fn portable_encoders_match_llama_quantize() {
    memwall_quantize::force_portable(true);
    let text = std::fs::read_to_string(tiny_zh().join("reference/llama-quantize.json")).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let input = tiny_zh().join("reference/tiny-zh-f16.gguf");
    let model = GgufModel::open(&input).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let imatrix = Imatrix::load(&tiny_zh().join("reference/imatrix.gguf")).unwrap();
    let mut cases = Vec::new();
    for (group, pure, with_imatrix) in [
        ("pure", true, false),
        ("imatrix_pure", true, true),
        ("mix", false, false),
    ] {
        for (name, expected) in reference[group].as_object().unwrap() {
            if group == "mix" && !["Q4_K_M", "Q3_K_M"].contains(&name.as_str()) {
                continue;
            }
            cases.push((group, name.clone(), pure, with_imatrix, expected.clone()));
        }
    }
    for (group, name, pure, with_imatrix, expected) in cases {
        let mut options = Options::new(file_type_by_name(&name).unwrap());
        options.pure = pure;
        if with_imatrix {
            options.imatrix = Some(ImatrixInput {
                label: "/work/main/fixtures/tiny-zh/reference/imatrix.gguf".into(),
                data: imatrix.clone(),
            });
        }
        let plan = job::plan(&model, &input, &options).unwrap();
        job::run(
            &model,
            &plan,
            options.imatrix.as_ref().map(|i| &i.data),
            false,
            &out,
            &Silent,
        )
        .unwrap();
        let sha = format!("{:x}", Sha256::digest(std::fs::read(&out).unwrap()));
        assert_eq!(sha, expected["sha256"].as_str().unwrap(), "{group} {name}");
    }
}
