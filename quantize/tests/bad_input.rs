//! Bad input to the whole-model quantizer: each failure is an error naming
//! the tensor, row, key or file, and leaves nothing at the output path.

use std::path::{Path, PathBuf};

use memwall_format::GgmlType;
use memwall_format::ggml_type::file_type_by_name;
use memwall_format::gguf::{GgufModel, GgufWriter, Metadata, TensorSpec};
use memwall_format::progress::Silent;
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::job::{self, ImatrixInput, JobError, Options};
use memwall_quantize::rules::Reason;

/// A one-layer llama-like model with one 256×4 F32 weight `blk.0.ffn_up.weight`
/// holding `values` (1024 of them) and a norm.
fn model(dir: &Path, name: &str, values: &[f32], ty: GgmlType) -> PathBuf {
    let path = dir.join(name);
    let mut meta = Metadata::new();
    meta.set("general.architecture", "llama");
    meta.set("llama.block_count", 1u32);
    meta.set("llama.attention.head_count", 4u32);
    let tensors = vec![
        TensorSpec {
            name: "blk.0.attn_norm.weight".into(),
            dims: vec![256],
            ty: GgmlType::F32,
        },
        TensorSpec {
            name: "blk.0.ffn_up.weight".into(),
            dims: vec![256, 4],
            ty,
        },
    ];
    let mut w = GgufWriter::create(&path, 3, meta, tensors).unwrap();
    w.write_tensor("blk.0.attn_norm.weight", &[0u8; 1024])
        .unwrap();
    let data: Vec<u8> = match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => {
            let mut q = vec![0u8; ty.tensor_size(&[256, 4]).unwrap().bytes as usize];
            memwall_quantize::quantize_row(ty, values, &mut q).unwrap();
            q
        }
    };
    w.write_tensor("blk.0.ffn_up.weight", &data).unwrap();
    w.commit().unwrap();
    path
}

fn weights() -> Vec<f32> {
    (0..1024)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0)
        .collect()
}

fn quantize(input: &Path, options: &Options, out: &Path) -> Result<(), JobError> {
    let model = GgufModel::open(input).unwrap();
    let plan = job::plan(&model, input, options)?;
    let imatrix = options.imatrix.as_ref().map(|i| &i.data);
    job::run(
        &model,
        &plan,
        imatrix,
        options.allow_requantize,
        out,
        &Silent,
    )
    .map(|_| ())
}

fn nothing_at(out: &Path) {
    assert!(!out.exists(), "{} exists", out.display());
    let partial = out.with_file_name(format!(
        "{}.partial",
        out.file_name().unwrap().to_string_lossy()
    ));
    assert!(!partial.exists(), "{} exists", partial.display());
}

fn q4km() -> Options {
    Options::new(file_type_by_name("Q4_K_M").unwrap())
}

#[test]
fn nan_and_inf_weights_name_the_tensor_and_row() {
    let dir = tempfile::tempdir().unwrap();
    for (bad, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf")] {
        let mut w = weights();
        w[2 * 256 + 17] = bad;
        let input = model(dir.path(), "nan.gguf", &w, GgmlType::F32);
        let out = dir.path().join("out.gguf");
        let err = quantize(&input, &q4km(), &out).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "tensor blk.0.ffn_up.weight, row 2: weight 17 is {shown} (ggml refuses non-finite weights)"
            )
        );
        nothing_at(&out);
    }
}

#[test]
fn values_too_large_for_the_target_are_caught_by_validation() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = weights();
    w[300] = 1e6; // finite in f32, infinite in f16
    let input = model(dir.path(), "big.gguf", &w, GgmlType::F32);
    let out = dir.path().join("out.gguf");
    let err = quantize(
        &input,
        &Options::new(file_type_by_name("F16").unwrap()),
        &out,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("blk.0.ffn_up.weight, row 1: f16 value 44 is NaN or infinite"),
        "{err}"
    );
    nothing_at(&out);
}

#[test]
fn quantized_input_needs_allow_requantize() {
    let dir = tempfile::tempdir().unwrap();
    let input = model(dir.path(), "q8.gguf", &weights(), GgmlType::Q8_0);
    let out = dir.path().join("out.gguf");
    let err = quantize(&input, &q4km(), &out).unwrap_err().to_string();
    assert!(
        err.contains("blk.0.ffn_up.weight") && err.contains("--allow-requantize"),
        "{err}"
    );
    nothing_at(&out);
    let mut options = q4km();
    options.allow_requantize = true;
    quantize(&input, &options, &out).unwrap();
    assert!(out.exists());
}

#[test]
fn explicit_types_that_do_not_fit_the_rows_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let input = model(dir.path(), "m.gguf", &weights(), GgmlType::F32);
    let out = dir.path().join("out.gguf");
    // 256-wide rows: fine for Q4_K. A 256-block type on a 4-row tensor's rows is fine too,
    // but --token-embedding-type / --output-tensor-type bypass the fallbacks, as in llama.cpp;
    // a row length a block does not divide must be refused, not written.
    let mut w = GgufWriter::create(
        &dir.path().join("odd.gguf"),
        3,
        {
            let mut m = Metadata::new();
            m.set("general.architecture", "llama");
            m.set("llama.block_count", 1u32);
            m
        },
        vec![TensorSpec {
            name: "output.weight".into(),
            dims: vec![96, 2],
            ty: GgmlType::F32,
        }],
    )
    .unwrap();
    w.write_tensor("output.weight", &[0u8; 96 * 2 * 4]).unwrap();
    w.commit().unwrap();
    let mut options = q4km();
    options.output_type = Some(GgmlType::Q4_K);
    let err = quantize(&dir.path().join("odd.gguf"), &options, &out)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("tensor output.weight: cannot be stored as q4_K"),
        "{err}"
    );
    nothing_at(&out);
    // Under --pure the base type falls back as llama.cpp's does (Q4_K → Q5_0 for rows of
    // 96 = 3·32), with a warning: llama-quantize --pure gives the same file.
    let mut pure = q4km();
    pure.pure = true;
    let model = GgufModel::open(&dir.path().join("odd.gguf")).unwrap();
    let plan = job::plan(&model, &input, &pure).unwrap();
    assert_eq!(plan.tensors[0].target, GgmlType::Q5_0);
    assert_eq!(plan.tensors[0].reason, Reason::Fallback(GgmlType::Q4_K));
    assert_eq!(
        plan.warnings,
        ["output.weight: rows of 96 weights do not fit q4_K blocks; using q5_0"]
    );
}

#[test]
fn imatrix_for_another_model_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let input = model(dir.path(), "m.gguf", &weights(), GgmlType::F32);
    let out = dir.path().join("out.gguf");
    let mut wrong_size = Imatrix::default();
    wrong_size
        .entries
        .insert("blk.0.ffn_up.weight".into(), vec![1.0; 128]);
    let mut options = q4km();
    options.imatrix = Some(ImatrixInput {
        label: "x".into(),
        data: wrong_size,
    });
    let err = quantize(&input, &options, &out).unwrap_err().to_string();
    assert!(
        err.starts_with("tensor blk.0.ffn_up.weight: the importance matrix has 128 values for it, the tensor needs 256"),
        "{err}"
    );
    let mut other_names = Imatrix::default();
    other_names
        .entries
        .insert("blk.7.attn_q.weight".into(), vec![1.0; 256]);
    options.imatrix = Some(ImatrixInput {
        label: "x".into(),
        data: other_names,
    });
    let err = quantize(&input, &options, &out).unwrap_err().to_string();
    assert!(
        err.contains("no entry for any tensor of this model")
            && err.contains("blk.7.attn_q.weight"),
        "{err}"
    );
    nothing_at(&out);
}

#[test]
fn unmatched_rules_and_missing_entries_are_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let input = model(dir.path(), "m.gguf", &weights(), GgmlType::F32);
    let mut options = q4km();
    options.tensor_types.push(
        memwall_quantize::recipe::make_override("attn_v", GgmlType::Q8_0, vec![], false).unwrap(),
    );
    let model = GgufModel::open(&input).unwrap();
    let plan = job::plan(&model, &input, &options).unwrap();
    assert_eq!(plan.warnings, ["rule 'attn_v' = q8_0 matches no tensor"]);
}

#[test]
fn missing_metadata_and_same_output_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nometa.gguf");
    let w = GgufWriter::create(&path, 3, Metadata::new(), vec![]).unwrap();
    w.commit().unwrap();
    let model = GgufModel::open(&path).unwrap();
    let err = job::plan(&model, &path, &q4km()).unwrap_err().to_string();
    assert!(
        err.contains("nometa.gguf") && err.contains("general.architecture"),
        "{err}"
    );

    let input = model_file_same(dir.path());
    let err = quantize(&input, &q4km(), &input).unwrap_err().to_string();
    assert!(err.contains("is the input"), "{err}");
    assert!(
        GgufModel::open(&input).is_ok(),
        "the input must be untouched"
    );
}

fn model_file_same(dir: &Path) -> PathBuf {
    model(dir, "same.gguf", &weights(), GgmlType::F32)
}

#[test]
fn q2_k_s_needs_an_imatrix_to_run_but_not_to_plan() {
    let dir = tempfile::tempdir().unwrap();
    let input = model(dir.path(), "m.gguf", &weights(), GgmlType::F32);
    let out = dir.path().join("out.gguf");
    let options = Options::new(file_type_by_name("Q2_K_S").unwrap());
    let model_file = GgufModel::open(&input).unwrap();
    let plan = job::plan(&model_file, &input, &options).unwrap();
    assert!(plan.tensors.iter().any(|t| t.requires_imatrix));
    assert!(
        plan.warnings
            .iter()
            .any(|w| w.contains("Q2_K_S needs an importance matrix")),
        "{:?}",
        plan.warnings
    );
    let err = quantize(&input, &options, &out).unwrap_err().to_string();
    assert_eq!(
        err,
        "tensor blk.0.ffn_up.weight: Q2_K_S needs an importance matrix for this tensor (its q2_K blocks; pass --imatrix)"
    );
    nothing_at(&out);
}

/// An imatrix in llama-imatrix's GGUF format with one entry
/// `blk.0.ffn_up.weight`: `sums` shaped `sums_dims`, one count of `count`.
fn gguf_imatrix(path: &Path, sums_dims: Vec<u64>, sums: &[f32], count: f32) {
    let mut meta = Metadata::new();
    meta.set("general.type", "imatrix");
    meta.set(
        "imatrix.datasets",
        memwall_format::gguf::Array::String(vec!["wiki.txt".into()]),
    );
    meta.set("imatrix.chunk_count", 1u32);
    meta.set("imatrix.chunk_size", 512u32);
    let spec = |name: &str, dims: Vec<u64>| TensorSpec {
        name: name.into(),
        dims,
        ty: GgmlType::F32,
    };
    let specs = vec![
        spec("blk.0.ffn_up.weight.in_sum2", sums_dims),
        spec("blk.0.ffn_up.weight.counts", vec![1]),
    ];
    let mut w = GgufWriter::create(path, 3, meta, specs).unwrap();
    // The writer takes no data for an empty tensor.
    if !sums.is_empty() {
        w.write_tensor("blk.0.ffn_up.weight.in_sum2", &f32_bytes(sums))
            .unwrap();
    }
    w.write_tensor("blk.0.ffn_up.weight.counts", &f32_bytes(&[count]))
        .unwrap();
    w.commit().unwrap();
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Found by the `imatrix` fuzz target: llama-imatrix's MoE file with some
/// sums overwritten by negative numbers loaded, and the negative weights went
/// on into the weighted encoders. Both formats now refuse them, naming the
/// entry and the index.
#[test]
fn fuzz_negative_imatrix_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("negative.gguf");
    gguf_imatrix(&gguf, vec![3], &[2.0, -0.0, -4.0], 2.0);
    let err = Imatrix::load(&gguf).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: entry blk.0.ffn_up.weight has a negative value (-2) at index 2; \
             importance values are means of squared activations",
            gguf.display()
        )
    );

    // Legacy: one entry of two values, one call.
    let name = b"blk.0.ffn_up.weight";
    let mut dat = Vec::new();
    dat.extend(1i32.to_le_bytes());
    dat.extend((name.len() as i32).to_le_bytes());
    dat.extend(name);
    dat.extend(1i32.to_le_bytes());
    dat.extend(2i32.to_le_bytes());
    dat.extend(f32_bytes(&[-1.5, 1.0]));
    let legacy = dir.path().join("negative.dat");
    std::fs::write(&legacy, dat).unwrap();
    let err = Imatrix::load(&legacy).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: entry blk.0.ffn_up.weight has a negative value (-1.5) at index 0; \
             importance values are means of squared activations",
            legacy.display()
        )
    );
}

/// Found by the `imatrix` fuzz target: an `in_sum2` tensor with a zero
/// dimension gave zero values per expert, and splitting the sums into
/// chunks of zero panicked.
#[test]
fn fuzz_empty_imatrix_sums_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("empty.gguf");
    gguf_imatrix(&gguf, vec![0], &[], 1.0);
    let err = Imatrix::load(&gguf).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: blk.0.ffn_up.weight: the in_sum2 tensor has no values",
            gguf.display()
        )
    );
}

/// Found by the `imatrix` fuzz target: a GGUF file with the imatrix metadata
/// and tensors, none named `<weight>.in_sum2` or `<weight>.counts`, loaded as
/// an importance matrix with no entries (a legacy file without entries is
/// refused).
#[test]
fn fuzz_gguf_imatrix_without_entries_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("no-entries.gguf");
    let mut meta = Metadata::new();
    meta.set(
        "imatrix.datasets",
        memwall_format::gguf::Array::String(vec![]),
    );
    meta.set("imatrix.chunk_count", 1u32);
    meta.set("imatrix.chunk_size", 512u32);
    let spec = TensorSpec {
        name: "blk.0.ffn_up.weight.in_sum".into(),
        dims: vec![1],
        ty: GgmlType::F32,
    };
    let mut w = GgufWriter::create(&gguf, 3, meta, vec![spec]).unwrap();
    w.write_tensor("blk.0.ffn_up.weight.in_sum", &f32_bytes(&[1.0]))
        .unwrap();
    w.commit().unwrap();
    let err = Imatrix::load(&gguf).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: no data: no tensor is named <weight>.in_sum2 or <weight>.counts",
            gguf.display()
        )
    );
}
