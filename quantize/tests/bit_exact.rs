//! Encoders against ggml: identical bytes to what llama-quantize --pure wrote for
//! the same rows of tiny-zh (fixtures/tiny-zh/reference/dequant.safetensors), and
//! round-trip error within each type's bound on random rows.

use std::path::Path;

use memwall_quantize::{ENCODABLE, quantize_row};
use memwall_runtime::GgmlType;
use memwall_runtime::blocks::{dequantize_row, f16_to_f32};
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
    for ty in ENCODABLE {
        let name = ty.name().to_uppercase();
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
    let mut y = [0u8; 144];
    assert_eq!(
        quantize_row(GgmlType::Q4_K, &x, &mut y)
            .unwrap_err()
            .to_string(),
        "quantization to q4_K is not supported yet"
    );
    let mut y = [0u8; 18];
    assert!(quantize_row(GgmlType::Q4_0, &x[..31], &mut y).is_err());
    assert!(quantize_row(GgmlType::Q4_0, &x[..32], &mut y[..17]).is_err());
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
        for ty in ENCODABLE {
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
