//! Whole models against llama-quantize: memwall quantizes llama.cpp's F16
//! conversion of tiny-zh with every recorded file type, with and without
//! `--pure` and `--imatrix`, and the output must be the same file, byte for
//! byte, as llama-quantize 0c1e570 wrote (recorded as SHA-256 in
//! fixtures/tiny-zh/reference/llama-quantize.json by quant_reference.sh).

use std::path::{Path, PathBuf};

use memwall_format::ggml_type::file_type_by_name;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::job::{self, ImatrixInput, Options};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn tiny_zh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-zh")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(tiny_zh().join("reference/llama-quantize.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sha(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The path llama-quantize was given for the imatrix when the expectations
/// were recorded; it is stored in `quantize.imatrix.file`, so it is part of
/// the recorded file hashes.
const RECORDED_IMATRIX_PATH: &str = "/work/main/fixtures/tiny-zh/reference/imatrix.gguf";

fn quantize(model: &GgufModel, input: &Path, options: &Options, out: &Path) -> Vec<u8> {
    let plan = job::plan(model, input, options).unwrap();
    let imatrix = options.imatrix.as_ref().map(|i| &i.data);
    job::run(model, &plan, imatrix, false, out, &Silent).unwrap();
    std::fs::read(out).unwrap()
}

/// Compares with one recorded llama-quantize output: per tensor first (type
/// and hash, for a useful message), then the whole file.
fn check(label: &str, bytes: &[u8], expected: &Value) {
    let file = memwall_format::gguf::parse(bytes).unwrap();
    let tensors = expected["tensors"].as_object().unwrap();
    assert_eq!(file.tensors.len(), tensors.len(), "{label}: tensor count");
    let mut wrong = Vec::new();
    for t in &file.tensors {
        let want = &tensors[&t.name];
        let data = &bytes[(file.data_offset + t.offset) as usize..][..t.size as usize];
        let want_ty = want[0].as_str().unwrap();
        if !t.ty.name().eq_ignore_ascii_case(want_ty) {
            wrong.push(format!("{}: type {} (llama.cpp: {want_ty})", t.name, t.ty));
        } else if sha(data) != want[1].as_str().unwrap() {
            wrong.push(format!("{}: {} data differ", t.name, t.ty));
        }
    }
    assert!(wrong.is_empty(), "{label}:\n{}", wrong.join("\n"));
    assert_eq!(
        bytes.len() as u64,
        expected["bytes"].as_u64().unwrap(),
        "{label}: file size"
    );
    assert_eq!(
        sha(bytes),
        expected["sha256"].as_str().unwrap(),
        "{label}: file bytes (metadata?)"
    );
}

fn input() -> (PathBuf, GgufModel) {
    let path = tiny_zh().join("reference/tiny-zh-f16.gguf");
    let model = GgufModel::open(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        sha(&bytes),
        reference()["input"]["sha256"].as_str().unwrap()
    );
    (path, model)
}

#[test]
fn every_mix_is_the_file_llama_quantize_writes() {
    let (path, model) = input();
    let dir = tempfile::tempdir().unwrap();
    let reference = reference();
    for (name, expected) in reference["mix"].as_object().unwrap() {
        let options = Options::new(file_type_by_name(name).unwrap());
        let bytes = quantize(&model, &path, &options, &dir.path().join("out.gguf"));
        check(&format!("mix {name}"), &bytes, expected);
    }
}

#[test]
fn every_pure_type_is_the_file_llama_quantize_writes() {
    let (path, model) = input();
    let dir = tempfile::tempdir().unwrap();
    let reference = reference();
    for (name, expected) in reference["pure"].as_object().unwrap() {
        let mut options = Options::new(file_type_by_name(name).unwrap());
        options.pure = true;
        let bytes = quantize(&model, &path, &options, &dir.path().join("out.gguf"));
        check(&format!("--pure {name}"), &bytes, expected);
    }
}

fn imatrix() -> ImatrixInput {
    let data = Imatrix::load(&tiny_zh().join("reference/imatrix.gguf")).unwrap();
    ImatrixInput {
        label: RECORDED_IMATRIX_PATH.into(),
        data,
    }
}

#[test]
fn imatrix_mixes_are_the_files_llama_quantize_writes() {
    let (path, model) = input();
    let dir = tempfile::tempdir().unwrap();
    let reference = reference();
    for (group, pure) in [("imatrix_mix", false), ("imatrix_pure", true)] {
        for (name, expected) in reference[group].as_object().unwrap() {
            let mut options = Options::new(file_type_by_name(name).unwrap());
            options.pure = pure;
            options.imatrix = Some(imatrix());
            let bytes = quantize(&model, &path, &options, &dir.path().join("out.gguf"));
            check(&format!("{group} {name}"), &bytes, expected);
        }
    }
}

#[test]
fn tensor_types_that_are_no_file_type_are_the_files_llama_quantize_writes() {
    let (path, model) = input();
    let dir = tempfile::tempdir().unwrap();
    let reference = reference();
    for (name, expected) in reference["tensor_type"].as_object().unwrap() {
        // `--tensor-type attn=T --tensor-type ffn=T` over Q8_0.
        let ty = memwall_format::GgmlType::from_name(name).unwrap();
        let mut options = Options::new(file_type_by_name("Q8_0").unwrap());
        for pattern in ["attn", "ffn"] {
            let rule = memwall_quantize::recipe::make_override(pattern, ty, vec![], false);
            options.tensor_types.push(rule.unwrap());
        }
        let bytes = quantize(&model, &path, &options, &dir.path().join("out.gguf"));
        check(&format!("--tensor-type {name}"), &bytes, expected);
    }
}

#[test]
fn output_does_not_depend_on_the_thread_count() {
    let (path, model) = input();
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options::new(file_type_by_name("Q4_K_M").unwrap());
    options.imatrix = Some(imatrix());
    let mut outputs = Vec::new();
    for threads in [1, 2, 5] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let out = dir.path().join(format!("t{threads}.gguf"));
        outputs.push(pool.install(|| quantize(&model, &path, &options, &out)));
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn legacy_dat_imatrix_gives_llama_quantizes_tensors() {
    let (path, model) = input();
    let dir = tempfile::tempdir().unwrap();
    let text =
        std::fs::read_to_string(tiny_zh().join("reference/llama-quantize-dat.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let dat = tiny_zh().join("reference/imatrix.dat");
    let bytes = std::fs::read(&dat).unwrap();
    assert_eq!(
        sha(&bytes),
        reference["imatrix_dat_sha256"].as_str().unwrap()
    );
    let data = Imatrix::load(&dat).unwrap();
    assert!(data.legacy && data.entries.len() > 20);
    for (name, expected) in reference["mix"].as_object().unwrap() {
        let mut options = Options::new(file_type_by_name(name).unwrap());
        options.imatrix = Some(ImatrixInput {
            label: dat.to_string_lossy().into_owned(),
            data: data.clone(),
        });
        let bytes = quantize(&model, &path, &options, &dir.path().join("out.gguf"));
        let file = memwall_format::gguf::parse(&bytes).unwrap();
        for t in &file.tensors {
            let want = &expected[&t.name];
            let got = &bytes[(file.data_offset + t.offset) as usize..][..t.size as usize];
            assert!(
                t.ty.name().eq_ignore_ascii_case(want[0].as_str().unwrap()),
                "{name} {}",
                t.name
            );
            assert_eq!(
                sha(got),
                want[1].as_str().unwrap(),
                "{name} {}: data",
                t.name
            );
        }
    }
}

/// `--pure IQ2_XXS` (and IQ2_XS, IQ1_S) with an imatrix that has no entry for
/// the output head and the token embeddings: ggml cannot encode them and
/// llama-quantize aborts half-way; memwall refuses before writing, naming the
/// first such tensor and the way out.
#[test]
fn pure_low_bit_types_need_every_entry_and_say_which_is_missing() {
    let (path, model) = input();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    for name in ["IQ2_XXS", "IQ2_XS", "IQ1_S"] {
        let mut options = Options::new(file_type_by_name(name).unwrap());
        options.pure = true;
        options.imatrix = Some(imatrix());
        let plan = job::plan(&model, &path, &options).unwrap();
        for tensor in ["output.weight", "token_embd.weight"] {
            assert!(
                plan.warnings
                    .iter()
                    .any(|w| w.starts_with(&format!("{tensor}: "))
                        && w.contains("the importance matrix has no entry for it")),
                "{name}: {:?}",
                plan.warnings
            );
        }
        let imatrix = options.imatrix.as_ref().map(|i| &i.data);
        let err = job::run(&model, &plan, imatrix, false, &out, &Silent)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tensor output.weight: "), "{err}");
        assert!(err.contains("--output-tensor-type"), "{err}");
        assert!(!out.exists(), "{name}: nothing written");
    }
}
