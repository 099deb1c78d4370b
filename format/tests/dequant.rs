//! Scalar dequantization agrees bit for bit with ggml's reference as gguf-py
//! implements it, on rows that llama-quantize wrote from tiny-zh
//! (fixtures/tiny-zh/reference/dequant.safetensors, from quant_reference.sh).

mod common;

use std::collections::BTreeMap;

use memwall_format::GgmlType;
use memwall_format::blocks::{DEQUANTIZABLE, dequantize_row};

/// A minimal safetensors reader: name → (dtype, shape, bytes).
fn read_safetensors(bytes: &[u8]) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out = BTreeMap::new();
    for (name, v) in header.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        let o: Vec<usize> = v["data_offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        let shape = v["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        out.insert(
            name.clone(),
            (
                v["dtype"].as_str().unwrap().to_owned(),
                shape,
                data[o[0]..o[1]].to_vec(),
            ),
        );
    }
    out
}

/// Types gguf-py cannot decode at llama.cpp 0c1e570.
const NO_GGUF_PY: [GgmlType; 2] = [GgmlType::Q1_0, GgmlType::Q2_0];

#[test]
fn dequantization_matches_ggml_bit_for_bit() {
    let bytes = std::fs::read(common::fixture("tiny-zh/reference/dequant.safetensors")).unwrap();
    let tensors = read_safetensors(&bytes);
    let mut seen = Vec::new();
    for (name, (_, _, raw)) in tensors.iter().filter(|(n, _)| n.ends_with(".raw")) {
        let file_type = name.trim_end_matches(".raw");
        // llama-quantize's --pure K types name a mix (Q3_K_S, MXFP4_MOE); the tensors are of
        // the base type.
        let base = match file_type {
            "Q3_K_S" | "Q4_K_S" | "Q5_K_S" => &file_type[..4],
            "MXFP4_MOE" => "MXFP4",
            _ => file_type,
        };
        let ty = GgmlType::from_name(base).unwrap();
        seen.push(ty);
        let Some((dtype, shape, expected)) = tensors.get(&format!("{file_type}.f32")) else {
            // gguf-py 0c1e570 has no decoder for these; runtime/tests/kernels.rs
            // checks them against ggml's own (`to_float`).
            assert!(NO_GGUF_PY.contains(&ty), "{ty}: no gguf-py values recorded");
            continue;
        };
        assert_eq!(dtype, "F32");
        let expected: Vec<f32> = expected
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let mut got = vec![0f32; shape.iter().product()];
        dequantize_row(ty, raw, &mut got).unwrap();
        for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{ty} element {i}: {a} vs ggml {b}"
            );
        }
    }
    seen.sort();
    let mut all = DEQUANTIZABLE.to_vec();
    all.sort();
    assert_eq!(seen, all, "every decodable type is checked");
}
