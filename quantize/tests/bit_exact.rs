//! Encoders against ggml: identical bytes to what llama-quantize --pure wrote for
//! the same rows of tiny-zh (fixtures/tiny-zh/reference/dequant.safetensors), and
//! round-trip error within each type's bound on random rows.

use std::path::Path;

use memwall_format::GgmlType;
use memwall_format::blocks::{dequantize_row, f16_to_f32};
use memwall_quantize::{
    ENCODABLE, IMATRIX_REQUIRED, quantize_row, quantize_row_imatrix, quantize_rows_imatrix,
};
use proptest::prelude::*;
use safetensors::SafeTensors;

#[test]
fn encoders_match_llama_quantize_byte_for_byte() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/tiny-zh/reference/dequant.safetensors");
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    // llama-quantize turns the F16 source into f32 before quantizing; so do we.
    let src: Vec<f32> = st
        .tensor("F16.raw")
        .unwrap()
        .data()
        .chunks_exact(2)
        .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    assert_eq!(src.len(), 4 * 256);
    for ty in ENCODABLE.into_iter().filter(|&t| !pure_needs_imatrix(t)) {
        // llama-quantize --pure names K types by a mix (Q3_K_S); the tensors are of the base type.
        let name = ty.name().to_uppercase();
        let name = match name.as_str() {
            "Q3_K" | "Q4_K" | "Q5_K" => format!("{name}_S"),
            "MXFP4" => "MXFP4_MOE".into(),
            _ => name,
        };
        let expected = st.tensor(&format!("{name}.raw")).unwrap();
        let mut out = vec![0u8; expected.data().len()];
        quantize_row(ty, &src, &mut out).unwrap();
        let row = out.len() / 4;
        for (i, (a, b)) in out.chunks(row).zip(expected.data().chunks(row)).enumerate() {
            assert!(a == b, "{ty}: row {i} differs from llama-quantize");
        }
    }
}

#[test]
fn unsupported_types_and_bad_lengths_are_errors() {
    let x = [0f32; 256];
    let mut y = [0u8; 66];
    assert_eq!(
        quantize_row(GgmlType::Q8_K, &x, &mut y)
            .unwrap_err()
            .to_string(),
        "quantization to q8_K is not supported yet"
    );
    assert_eq!(
        quantize_row(GgmlType::IQ2_XXS, &x, &mut y).unwrap_err(),
        memwall_quantize::QuantizeError::ImatrixRequired(GgmlType::IQ2_XXS)
    );
    let mut y = [0u8; 18];
    assert!(quantize_row(GgmlType::Q4_0, &x[..31], &mut y).is_err());
    assert!(quantize_row(GgmlType::Q4_0, &x[..32], &mut y[..17]).is_err());
}

/// `quantize_rows_imatrix` (GPTQ's one block of many rows at a time) writes
/// each row as `quantize_row_imatrix` alone would, every encodable type,
/// with and without importance weights, rows of one block and of several.
#[test]
fn rows_encoded_together_equal_rows_encoded_one_by_one() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    for ty in ENCODABLE {
        let bs = ty.block_size() as usize;
        for blocks_per_row in [1, 3] {
            let row_len = bs.max(32) / bs * bs * blocks_per_row;
            let rows = 11;
            let mut x: Vec<f32> = (0..rows * row_len).map(|_| next()).collect();
            // A row of zeros and a row of negligible values among them.
            x[row_len..2 * row_len].fill(0.0);
            x[3 * row_len..4 * row_len]
                .iter_mut()
                .for_each(|v| *v *= 1e-20);
            let qw: Vec<f32> = (0..row_len).map(|_| next() + 0.6).collect();
            let rb = ty.tensor_size(&[row_len as u64]).unwrap().bytes as usize;
            for imatrix in [None, Some(&qw[..])] {
                if imatrix.is_none() && IMATRIX_REQUIRED.contains(&ty) {
                    continue;
                }
                let mut together = vec![0u8; rows * rb];
                quantize_rows_imatrix(ty, &x, row_len, &mut together, imatrix).unwrap();
                for (r, got) in together.chunks_exact(rb).enumerate() {
                    let mut alone = vec![0u8; rb];
                    let src = &x[r * row_len..(r + 1) * row_len];
                    quantize_row_imatrix(ty, src, &mut alone, imatrix).unwrap();
                    assert!(
                        got == &alone[..],
                        "{ty}: row {r} of {rows} rows of {row_len}, imatrix {}",
                        imatrix.is_some()
                    );
                }
            }
        }
    }
    // Rows that are no whole number of blocks, or an importance matrix of
    // another length, are errors.
    let x = [0.5f32; 64];
    let mut y = [0u8; 36];
    assert!(quantize_rows_imatrix(GgmlType::Q4_0, &x, 31, &mut y, None).is_err());
    assert!(quantize_rows_imatrix(GgmlType::Q4_0, &x, 0, &mut y, None).is_err());
    assert!(quantize_rows_imatrix(GgmlType::Q4_0, &x[..48], 32, &mut y, None).is_err());
    assert!(quantize_rows_imatrix(GgmlType::Q4_0, &x, 32, &mut y, Some(&x)).is_err());
    assert!(quantize_rows_imatrix(GgmlType::Q4_0, &x, 32, &mut y[..35], None).is_err());
    assert!(quantize_rows_imatrix(GgmlType::Q4_0, &x, 32, &mut y, Some(&x[..32])).is_ok());
}

/// The 32-weight types, whose error has a simple per-element bound.
const LEGACY: [GgmlType; 7] = [
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// ggml's own acceptance test (`tests/test-quantize-fns.cpp`): on
/// `x[i] = 0.1 + 2·cos(i)` for 4096 weights, the error of dequantize(quantize(x)),
/// measured as ggml measures it (√Σd² / n), must stay below 0.002, or 0.0075 for
/// 2-bit (Q2_K, IQ2_S), 0.0040 for 3-bit (Q3_K, IQ3_S), 0.0050 for IQ3_XXS, 0.01
/// for the ternary types and Q2_0, 0.025 for Q1_0 and 0.0030 for NVFP4
/// (`MAX_QUANTIZATION_TOTAL_ERROR*`). ggml's test leaves out
/// the types without a reference quantizer (IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M: they
/// need an importance matrix or have no budget); so does this one.
#[test]
fn total_error_is_within_ggmls_budgets() {
    let x: Vec<f32> = (0..4096).map(|i| 0.1 + 2.0 * (i as f32).cos()).collect();
    // The budgets are for block-quantized types; BF16's 8-bit mantissa alone gives 0.0023 here.
    let no_reference = [
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
    ];
    for ty in ENCODABLE
        .into_iter()
        .filter(|t| t.is_quantized() && !no_reference.contains(t))
    {
        let mut q = vec![0u8; (4096 / ty.block_size() * ty.type_size()) as usize];
        quantize_row(ty, &x, &mut q).unwrap();
        let mut y = vec![0f32; 4096];
        dequantize_row(ty, &q, &mut y).unwrap();
        // ggml's `array_rmse`: the square root of the summed squares (in f64), over n.
        let sum: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        let rmse = sum.sqrt() as f32 / 4096.0;
        let budget = match ty {
            GgmlType::Q2_K | GgmlType::IQ2_S => 0.0075,
            GgmlType::Q3_K | GgmlType::IQ3_S => 0.0040,
            GgmlType::IQ3_XXS => 0.0050,
            GgmlType::TQ1_0 | GgmlType::TQ2_0 | GgmlType::Q2_0 => 0.01,
            GgmlType::Q1_0 => 0.025,
            GgmlType::NVFP4 => 0.0030,
            _ => 0.002,
        };
        assert!(rmse < budget, "{ty}: error {rmse} exceeds ggml's {budget}");
    }
}

/// Largest |x − dequantize(quantize(x))| allowed in a 32-weight block, from the
/// block's largest magnitude and range: half a step, plus the f16 rounding of the
/// scale (times the largest quant) and of the minimum, plus the clamp of the
/// one-sided types (Q4_0 maps the extreme of the other sign to 7/8 of it, Q5_0 to
/// 15/16). f16 rounding is relative (2^-11) for normal values and absolute (2^-25)
/// in the subnormal range.
fn bound(ty: GgmlType, amax: f32, range: f32) -> f32 {
    let f16 = |v: f32| v.abs() * 2f32.powi(-11) + 2f32.powi(-25);
    match ty {
        GgmlType::Q8_0 => 0.5 * amax / 127.0 + 127.0 * f16(amax / 127.0),
        GgmlType::Q4_0 => amax / 8.0 + 8.0 * f16(amax / 8.0),
        GgmlType::Q5_0 => amax / 16.0 + 16.0 * f16(amax / 16.0),
        GgmlType::Q4_1 => 0.5 * range / 15.0 + 15.0 * f16(range / 15.0) + f16(amax),
        GgmlType::Q5_1 => 0.5 * range / 31.0 + 31.0 * f16(range / 31.0) + f16(amax),
        GgmlType::F16 => f16(amax),
        GgmlType::BF16 => amax * 2f32.powi(-8),
        _ => 0.0,
    }
}

proptest! {
    #[test]
    fn round_trip_error_is_within_each_types_bound(
        x in prop::collection::vec(-100f32..100f32, 64),
        scale in prop::sample::select(vec![1e-3f32, 1.0, 30.0]),
    ) {
        let x: Vec<f32> = x.iter().map(|v| v * scale / 100.0).collect();
        for ty in LEGACY {
            let bytes = (x.len() as u64 / ty.block_size() * ty.type_size()) as usize;
            let mut q = vec![0u8; bytes];
            quantize_row(ty, &x, &mut q).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y).unwrap();
            for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                let (lo, hi) = xb.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
                let limit = bound(ty, amax, hi - lo);
                for (a, b) in xb.iter().zip(yb) {
                    prop_assert!((a - b).abs() <= limit, "{}: {} -> {} (bound {})", ty, a, b, limit);
                }
            }
        }
    }
}

/// Whole tensors: quantizing three tiny-zh tensors (from llama.cpp's F16
/// conversion) to each type gives the SHA-256 that `llama-quantize --pure`
/// (or `--tensor-type`, for NVFP4) produced
/// (fixtures/tiny-zh/reference/llama-quantize.json).
#[test]
fn whole_tensors_match_llama_quantize_hashes() {
    use sha2::{Digest, Sha256};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-zh/reference");
    let bytes = std::fs::read(root.join("f16-tensors.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("llama-quantize.json")).unwrap()).unwrap();
    let mut checked = 0;
    for (name, view) in st.tensors() {
        let x: Vec<f32> = view
            .data()
            .chunks_exact(2)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect();
        for ty in ENCODABLE.into_iter().filter(|&t| !pure_needs_imatrix(t)) {
            let upper = ty.name().to_uppercase();
            let key = match upper.as_str() {
                "Q3_K" | "Q4_K" | "Q5_K" => format!("{upper}_S"),
                "MXFP4" => "MXFP4_MOE".into(),
                _ => upper,
            };
            // NVFP4 is no file type: its tensors come from `--tensor-type` over Q8_0.
            let group = if expected["pure"].get(&key).is_some() {
                "pure"
            } else {
                "tensor_type"
            };
            let want = &expected[group][&key]["tensors"][&name];
            assert_eq!(
                want[0].as_str().unwrap(),
                ty.name().to_uppercase(),
                "{key} {name}"
            );
            let mut q = vec![0u8; (x.len() as u64 / ty.block_size() * ty.type_size()) as usize];
            quantize_row(ty, &x, &mut q).unwrap();
            let got = format!("{:x}", Sha256::digest(&q));
            assert_eq!(got, want[1].as_str().unwrap(), "{ty} {name}");
            checked += 1;
        }
    }
    let without = ENCODABLE
        .iter()
        .filter(|&&t| !pure_needs_imatrix(t))
        .count();
    assert_eq!(checked, 3 * without);
}

/// Whether llama-quantize refuses a `--pure` file of `ty` without an importance
/// matrix (its rows are then checked against `--pure --imatrix` files only).
fn pure_needs_imatrix(ty: GgmlType) -> bool {
    memwall_quantize::rules::requires_imatrix("blk.0.attn_q.weight", ty, "")
}

/// ggml's own encoder (`ggml_quantize_chunk`, recorded by
/// runtime/tests/data/kernels_ggml.c on random rows, with importance weights for the
/// types that need them) and memwall's give the same bytes.
#[test]
fn encoders_match_ggml_quantize_chunk() {
    use memwall_quantize::quantize_row_imatrix;
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/tests/data/kernels_ggml.json");
    let fx: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    let floats = |s: &str| -> Vec<f32> {
        hex(s)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let qw = floats(fx["imatrix"].as_str().unwrap());
    let mut checked = Vec::new();
    for case in fx["vec_dot"].as_array().unwrap() {
        let ty = GgmlType::from_name(case["type"].as_str().unwrap()).unwrap();
        if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            continue;
        }
        let wf = floats(case["wf"].as_str().unwrap());
        let want = hex(case["w"].as_str().unwrap());
        let weights = case["imatrix"].as_bool().unwrap().then_some(&qw[..]);
        let mut got = vec![0u8; want.len()];
        quantize_row_imatrix(ty, &wf, &mut got, weights).unwrap();
        assert!(got == want, "{ty}: differs from ggml_quantize_chunk");
        checked.push(ty);
    }
    assert_eq!(
        checked.len(),
        ENCODABLE.len() - 3,
        "every block type is recorded"
    );
}

/// The importance-weighted path: with llama-imatrix's `imatrix.gguf` for tiny-zh,
/// quantizing the three tensors as the imatrix mixes do gives the SHA-256 that
/// `llama-quantize --imatrix` produced, for every type with a weighted encoder.
#[test]
fn imatrix_quantization_matches_llama_quantize_hashes() {
    use memwall_format::gguf::GgufFile;
    use memwall_quantize::{IMATRIX_ENCODABLE, quantize_row_imatrix};
    use sha2::{Digest, Sha256};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-zh/reference");
    let imatrix = GgufFile::open(&root.join("imatrix.gguf")).unwrap();
    let floats = |name: &str| -> Vec<f32> {
        let t = imatrix
            .tensor(name)
            .unwrap_or_else(|| panic!("imatrix has no {name}"));
        imatrix
            .tensor_data(t)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let bytes = std::fs::read(root.join("f16-tensors.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("llama-quantize.json")).unwrap()).unwrap();
    let mut checked = Vec::new();
    for (name, view) in st.tensors() {
        let ne0 = view.shape()[1];
        let x: Vec<f32> = view
            .data()
            .chunks_exact(2)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect();
        // llama-quantize's normalisation of a GGUF imatrix: the sum of squares over the count.
        let sums = floats(&format!("{name}.in_sum2"));
        let count = floats(&format!("{name}.counts"))[0];
        assert_eq!(sums.len(), ne0);
        let qw: Vec<f32> = sums
            .iter()
            .map(|s| if count > 0.0 { s / count } else { 1.0 })
            .collect();
        let mixes = expected["imatrix_mix"].as_object().unwrap();
        let pure = expected["imatrix_pure"].as_object().unwrap();
        for (mix, entry) in mixes.iter().chain(pure) {
            let want = &entry["tensors"][&name];
            let ty = GgmlType::from_name(want[0].as_str().unwrap()).unwrap();
            if !IMATRIX_ENCODABLE.contains(&ty) {
                continue;
            }
            let row_bytes = (ne0 as u64 / ty.block_size() * ty.type_size()) as usize;
            let mut q = vec![0u8; x.len() / ne0 * row_bytes];
            for (row, out) in x.chunks_exact(ne0).zip(q.chunks_exact_mut(row_bytes)) {
                quantize_row_imatrix(ty, row, out, Some(&qw)).unwrap();
            }
            let got = format!("{:x}", Sha256::digest(&q));
            assert_eq!(got, want[1].as_str().unwrap(), "{mix}: {ty} {name}");
            checked.push(ty);
        }
    }
    checked.sort();
    checked.dedup();
    let mut all = IMATRIX_ENCODABLE.to_vec();
    all.sort();
    assert_eq!(checked, all, "every weighted encoder is checked");
}

#[test]
fn imatrix_errors() {
    use memwall_quantize::quantize_row_imatrix;
    let x = [0.5f32; 256];
    let mut y = [0u8; 144];
    assert_eq!(
        quantize_row_imatrix(GgmlType::Q4_K, &x, &mut y, Some(&[1.0; 255]))
            .unwrap_err()
            .to_string(),
        "importance matrix has 255 values for a row of 256 weights"
    );
    let mut y = [0u8; 8 * 34];
    assert!(quantize_row_imatrix(GgmlType::Q8_0, &x, &mut y, Some(&[1.0; 256])).is_ok());
}
