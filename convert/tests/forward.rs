//! Converted checkpoints run as transformers runs them: memwall-synth's tiny
//! checkpoint of every architecture (and the rope scalings the converter maps),
//! converted to F32 GGUF by memwall and run by the runtime's forward pass, against
//! transformers' float32 logits recorded by fixtures/synth/forward_reference.sh.
//! This covers the converter and the runtime together: a tensor written wrongly
//! or a layout run wrongly both move the logits.

mod common;

use common::{fixtures, options, sha};

use memwall_convert::job::convert;
use memwall_convert::tensors::OutType;
use memwall_fixtures::synth::{Options, preset, write_checkpoint};
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;
use memwall_runtime::forward::Model;
use serde_json::Value;

#[test]
fn every_architecture_runs_like_transformers() {
    let text = std::fs::read_to_string(fixtures().join("synth/forward.json")).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<u32> = reference["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let synth = Options {
        tokenizer_dir: Some(fixtures().join("smollm2")),
        weight_scale: reference["weight_scale"].as_f64().unwrap() as f32,
        ..Options::default()
    };
    for (name, v) in reference["variants"].as_object().unwrap() {
        let mut p = preset(v["preset"].as_str().unwrap()).unwrap();
        p.shape.vocab = 49152;
        let hf = dir.path().join(name);
        write_checkpoint(&hf, p.arch, &p.shape, &synth, &mut |_| {}).unwrap();
        let st = std::fs::read(hf.join("model.safetensors")).unwrap();
        assert_eq!(
            sha(&st),
            v["safetensors_sha256"].as_str().unwrap(),
            "{name}: synth input"
        );
        let config_path = hf.join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
        for (k, value) in v["config_patch"].as_object().unwrap() {
            config[k] = value.clone();
        }
        std::fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();
        let out = dir.path().join(format!("{name}.gguf"));
        let convert_options = options(OutType::F32, Some("smollm"));
        convert(&hf, &out, &convert_options, &Silent).unwrap();
        let gguf = GgufModel::open(&out).unwrap();
        let mut model = Model::new(&gguf, 64).unwrap_or_else(|e| panic!("{name}: {e}"));
        model.set_exact(true);
        let logits = model.forward(&mut model.session(), &ids).unwrap();
        let worst = top_k_difference(name, &logits, model.config.n_vocab, &v["top_k"]);
        // Measured 2026-11-29: 4.2e-7 (cohere, logits scaled by 1/16) to 3.3e-5 (mixtral).
        assert!(worst < 2e-4, "{name}: largest logit difference {worst}");
        std::fs::remove_dir_all(&hf).unwrap();
        std::fs::remove_file(&out).unwrap();
    }
}

/// Where a family's tiny checkpoint gets its tokenizer.
enum Tokenizer {
    /// SmolLM2's files, with the pre-tokenizer named for llama.cpp.
    Smollm2,
    /// Gemma 4's, written from llama.cpp's `models/ggml-vocab-gemma-4.gguf`.
    Gemma4,
}

/// A tiny checkpoint of a 2026 family (`preset`, weights drawn 5× wider)
/// converted to `outtype`.
fn family_model(
    dir: &std::path::Path,
    preset_name: &str,
    outtype: OutType,
    tokenizer: Tokenizer,
) -> std::path::PathBuf {
    let mut p = preset(preset_name).unwrap();
    let hf = dir.join(preset_name);
    let mut synth = Options {
        weight_scale: 5.0,
        ..Options::default()
    };
    if let Tokenizer::Smollm2 = tokenizer {
        p.shape.vocab = 49152;
        synth.tokenizer_dir = Some(fixtures().join("smollm2"));
    }
    write_checkpoint(&hf, p.arch, &p.shape, &synth, &mut |_| {}).unwrap();
    if let Tokenizer::Gemma4 = tokenizer {
        let vocab = fixtures().join("cache/llama.cpp-0c1e570/models/ggml-vocab-gemma-4.gguf");
        assert!(vocab.exists(), "{}: run fixtures/fetch.sh", vocab.display());
        memwall_fixtures::gemma4_tokenizer::write_gemma4_tokenizer(&vocab, None, &hf).unwrap();
    }
    let out = dir.join(format!("{preset_name}-{outtype:?}.gguf"));
    let convert_options = options(
        outtype,
        matches!(tokenizer, Tokenizer::Smollm2).then_some("smollm"),
    );
    convert(&hf, &out, &convert_options, &Silent).unwrap();
    out
}

/// memwall-synth's tiny Qwen3.5 checkpoint `preset` converted to `outtype`.
fn qwen35_model(dir: &std::path::Path, preset_name: &str, outtype: OutType) -> std::path::PathBuf {
    family_model(dir, preset_name, outtype, Tokenizer::Smollm2)
}

/// memwall-synth's tiny Gemma 4 checkpoint `preset` (text model) converted
/// to `outtype`.
fn gemma4_model(dir: &std::path::Path, preset_name: &str, outtype: OutType) -> std::path::PathBuf {
    family_model(dir, preset_name, outtype, Tokenizer::Gemma4)
}

/// Every variant recorded in `fixtures/synth/<json>` against transformers'
/// float32 logits: the prompt at once, then each later token alone, as
/// transformers ran them; every position's top-1, and the largest
/// difference over the recorded top-10 logits below 2e-4.
fn runs_like_transformers(
    json: &str,
    model_of: fn(&std::path::Path, &str, OutType) -> std::path::PathBuf,
) {
    let text = std::fs::read_to_string(fixtures().join("synth").join(json)).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<u32> = reference["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let prompt = reference["prompt_tokens"].as_u64().unwrap() as usize;
    let dir = tempfile::tempdir().unwrap();
    let variants = reference["variants"].as_object().unwrap();
    assert_eq!(variants.len(), 2);
    for (name, v) in variants {
        let preset_name = v["preset"].as_str().unwrap();
        let out = model_of(dir.path(), preset_name, OutType::F32);
        let st = std::fs::read(dir.path().join(preset_name).join("model.safetensors")).unwrap();
        assert_eq!(
            sha(&st),
            v["safetensors_sha256"].as_str().unwrap(),
            "{name}: synth input"
        );
        let gguf = GgufModel::open(&out).unwrap();
        let mut model = Model::new(&gguf, 64).unwrap_or_else(|e| panic!("{name}: {e}"));
        model.set_exact(true);
        let mut session = model.session();
        let mut logits = model.forward(&mut session, &ids[..prompt]).unwrap();
        for &t in &ids[prompt..] {
            logits.extend(model.forward(&mut session, &[t]).unwrap());
        }
        let worst = top_k_difference(name, &logits, model.config.n_vocab, &v["top_k"]);
        assert!(worst < 2e-4, "{name}: largest logit difference {worst}");
    }
}

/// `ids` at once and token by token through `model` (a Q8_0 file: the
/// default path, quantized activations and an f16 cache) give the same bits;
/// returns the session of the batch and its logits.
fn batch_equals_tokens(
    model: &Model,
    ids: &[u32],
    what: &str,
) -> (memwall_runtime::forward::Session, Vec<f32>) {
    let mut whole = model.session();
    let batch = model.forward(&mut whole, ids).unwrap();
    let mut single = model.session();
    let mut one = Vec::new();
    for &t in ids {
        one.extend(model.forward(&mut single, &[t]).unwrap());
    }
    assert!(
        batch
            .iter()
            .zip(&one)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: batch and token-by-token differ"
    );
    (whole, batch)
}

/// Qwen3.5's gated delta-net and gated attention layers (dense and MoE with a
/// shared expert): the prompt through transformers' chunked delta rule, the
/// decoded tokens through its recurrent one, recorded by
/// fixtures/synth/forward_family_reference.sh qwen35. Measured 2026-12-05:
/// 1.9e-5 (dense).
#[test]
fn qwen35_runs_like_transformers() {
    runs_like_transformers("forward-qwen35.json", qwen35_model);
}

/// The same bits at once and token by token, for Qwen3.5's recurrent state
/// as for the KV cache; and rewinding a session with linear layers starts it
/// over.
#[test]
fn qwen35_batches_and_single_tokens_give_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..19).map(|i| (i * 7919 + 13) % 49152).collect();
    for preset_name in ["tiny-qwen3.5", "tiny-qwen3.5-moe"] {
        let out = qwen35_model(dir.path(), preset_name, OutType::Q8_0);
        let gguf = GgufModel::open(&out).unwrap();
        let model = Model::new(&gguf, 64).unwrap();
        let (mut whole, batch) = batch_equals_tokens(&model, &ids, preset_name);
        // A rewind cannot step the recurrent state back: everything goes.
        whole.truncate(5);
        assert_eq!(whole.len(), 0, "{preset_name}");
        let again = model.forward(&mut whole, &ids).unwrap();
        assert_eq!(again, batch, "{preset_name}: after starting over");
    }
}

/// Gemma 4, dense and with experts beside the dense MLP: sliding-window
/// layers (the prompt runs past the window) and global ones with wider heads,
/// values that are their keys and partially rotated dimensions, recorded by
/// fixtures/synth/forward_family_reference.sh gemma4. Measured 2026-12-05:
/// 8.1e-6 (dense), 1.4e-5 (MoE).
#[test]
fn gemma4_runs_like_transformers() {
    runs_like_transformers("forward-gemma4.json", gemma4_model);
}

/// Gemma 4's sliding-window and global layers give the same bits at once
/// and token by token (ggml's f16 GELU included), past the window, and after
/// a rewind.
#[test]
fn gemma4_batches_and_single_tokens_give_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..40).map(|i| (i * 7919 + 13) % 262144).collect();
    for preset_name in ["tiny-gemma4", "tiny-gemma4-moe"] {
        let out = gemma4_model(dir.path(), preset_name, OutType::Q8_0);
        let gguf = GgufModel::open(&out).unwrap();
        let model = Model::new(&gguf, 64).unwrap();
        let (mut whole, batch) = batch_equals_tokens(&model, &ids, preset_name);
        let n = model.config.n_vocab;
        whole.truncate(25);
        let again = model.forward(&mut whole, &ids[25..]).unwrap();
        assert_eq!(again, batch[25 * n..], "{preset_name}: after a rewind");
    }
}

/// A sliding-window layer's ring (its window and one micro-batch of
/// positions) gives the bits a cache of every position gives, over a
/// sequence that wraps the ring twice: at once (in micro-batches) and token
/// by token; and a rewind within the ring continues, one past it starts over.
#[test]
fn gemma4_rings_give_the_bits_of_a_full_cache() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..1300).map(|i| (i * 7919 + 13) % 262144).collect();
    let out = gemma4_model(dir.path(), "tiny-gemma4", OutType::Q8_0);
    let gguf = GgufModel::open(&out).unwrap();
    let ring = Model::new(&gguf, 2048).unwrap();
    let mut full = Model::new(&gguf, 2048).unwrap();
    full.config.swa.as_mut().unwrap().full_cache = true;
    let n = ring.config.n_vocab;
    let mut s = full.session();
    let want = full.forward(&mut s, &ids).unwrap();
    let mut s = ring.session();
    let batch = ring.forward(&mut s, &ids).unwrap();
    assert!(batch == want, "ring at once");
    // The ring stops growing at its window and a micro-batch of positions
    // (8 + 512) where the full cache holds all 1300; keys and values of 2
    // heads × 64 in f16 per position; the global layer (1 head × 128) keeps
    // every position in both.
    let mut f = full.session();
    full.forward(&mut f, &ids).unwrap();
    let (sliding, global) = (2 * 2 * 64 * 2, 2 * 128 * 2);
    assert_eq!(f.kv_bytes(), 1300 * (sliding + global));
    assert_eq!(s.kv_bytes(), 520 * sliding + 1300 * global);
    // Token by token over the last 700 positions, after the first 600 at once.
    let mut s = ring.session();
    let mut one = ring.forward(&mut s, &ids[..600]).unwrap();
    for &t in &ids[600..] {
        one.extend(ring.forward(&mut s, &[t]).unwrap());
    }
    assert!(one == want, "ring token by token");
    // Back 100 tokens: the ring still holds their window.
    s.truncate(1200);
    assert_eq!(s.len(), 1200);
    let again = ring.forward(&mut s, &ids[1200..]).unwrap();
    assert!(again == want[1200 * n..], "after a short rewind");
    // Back 1000: the ring no longer holds it, so the session starts over.
    s.truncate(300);
    assert_eq!(s.len(), 0);
}

/// Calibration's later passes over a layer take what is final from the
/// earlier ones (the heads' outputs; the attention output; a dense FFN's
/// middle) instead of
/// computing it again, and get the bits of the whole layer: for a plain,
/// a parallel-block, a mixture-of-experts, both Qwen3.5 and both Gemma 4
/// models (past one micro-batch, where sliding-window layers run in
/// pieces). The kept results are what the second pass reads: with the
/// matrices behind them zeroed, the layer's output does not move.
#[test]
fn calibration_passes_with_kept_results_give_the_bits_of_whole_layers() {
    use memwall_format::GgmlType;
    use memwall_runtime::forward::Kept;
    let dir = tempfile::tempdir().unwrap();
    for (preset_name, tokenizer) in [
        ("tiny-llama", Tokenizer::Smollm2),
        ("tiny-cohere", Tokenizer::Smollm2),
        ("tiny-qwen3-moe", Tokenizer::Smollm2),
        ("tiny-qwen3.5", Tokenizer::Smollm2),
        ("tiny-qwen3.5-moe", Tokenizer::Smollm2),
        ("tiny-gemma4", Tokenizer::Gemma4),
        ("tiny-gemma4-moe", Tokenizer::Gemma4),
    ] {
        let out = family_model(dir.path(), preset_name, OutType::F16, tokenizer);
        let gguf = GgufModel::open(&out).unwrap();
        let mut model = Model::new(&gguf, 1024).unwrap();
        let (e, vocab) = (model.config.n_embd, model.config.n_vocab as u32);
        let ids: Vec<u32> = (0..600).map(|i| (i * 7919 + 13) % vocab).collect();
        let mut x = model.embed(&ids).unwrap();
        for l in 0..model.config.n_layer {
            let what = format!("{preset_name}, layer {l}");
            let mut want = x.clone();
            model
                .forward_layer(l, &mut want, &mut Kept::default())
                .unwrap();
            let mut kept = Kept::default();
            kept.attention_final = true;
            kept.ffn_middle_final = true;
            let mut first = x.clone();
            model.forward_layer(l, &mut first, &mut kept).unwrap();
            assert!(first == want, "{what}: the pass that keeps");
            let dense_middle = (gguf.tensor(&format!("blk.{l}.ffn_gate_inp.weight")))
                .is_none()
                .then(|| gguf.tensor(&format!("blk.{l}.ffn_down.weight")))
                .flatten()
                .map_or(0, |(info, _)| info.dims[0] as usize);
            assert_eq!(kept.bytes(), ids.len() * (e + dense_middle) * 4, "{what}");
            // Zero what the kept results came from.
            let mut zeroed = vec!["attn_q.weight", "attn_qkv.weight", "attn_output.weight"];
            if dense_middle > 0 {
                zeroed.extend(["ffn_gate.weight", "ffn_up.weight"]);
            }
            for name in zeroed.iter().map(|s| format!("blk.{l}.{s}")) {
                if let Some((info, _)) = gguf.tensor(&name) {
                    let bytes = vec![0u8; info.elements as usize * 4];
                    model
                        .replace_matrix(&name, GgmlType::F32, bytes.into())
                        .unwrap();
                }
            }
            let mut second = x.clone();
            model.forward_layer(l, &mut second, &mut kept).unwrap();
            assert!(
                second == want,
                "{what}: the pass that reads the kept results"
            );
            model.drop_replacements(&format!("blk.{l}."));
            // The heads' outputs: a pass with Q/K/V final keeps them, and
            // the next computes only the output projection from them
            // (delta-net layers keep nothing here).
            let heads = (gguf.tensor(&format!("blk.{l}.attn_q.weight")).is_some())
                .then(|| gguf.tensor(&format!("blk.{l}.attn_output.weight")))
                .flatten()
                .map_or(0, |(info, _)| info.dims[0] as usize);
            let mut kept = Kept::default();
            kept.heads_final = true;
            let mut first = x.clone();
            model.forward_layer(l, &mut first, &mut kept).unwrap();
            assert!(first == want, "{what}: the pass that keeps the heads");
            assert_eq!(kept.bytes(), ids.len() * heads * 4, "{what}");
            for s in ["attn_q.weight", "attn_k.weight", "attn_v.weight"] {
                let name = format!("blk.{l}.{s}");
                if let Some((info, _)) = gguf.tensor(&name).filter(|_| heads > 0) {
                    let bytes = vec![0u8; info.elements as usize * 4];
                    model
                        .replace_matrix(&name, GgmlType::F32, bytes.into())
                        .unwrap();
                }
            }
            kept.attention_final = true;
            let mut second = x.clone();
            model.forward_layer(l, &mut second, &mut kept).unwrap();
            assert!(second == want, "{what}: the pass that reads the heads");
            // The attention output is kept now, and the heads are let go.
            assert_eq!(kept.bytes(), ids.len() * e * 4, "{what}");
            model.drop_replacements(&format!("blk.{l}."));
            x = want;
        }
    }
}

/// Checks every position's top-1 of `logits` (rows of `n`) against
/// transformers' recorded `top_k` (`[[id, logit], …]` per position, best
/// first) and returns the largest difference over the recorded logits.
fn top_k_difference(name: &str, logits: &[f32], n: usize, top_k: &Value) -> f32 {
    let mut worst = 0f32;
    for (pos, top) in top_k.as_array().unwrap().iter().enumerate() {
        let row = &logits[pos * n..(pos + 1) * n];
        let argmax = (0..n).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        let top = top.as_array().unwrap();
        assert_eq!(
            argmax as u64,
            top[0][0].as_u64().unwrap(),
            "{name} position {pos}: top-1"
        );
        for entry in top {
            let id = entry[0].as_u64().unwrap() as usize;
            let value = entry[1].as_f64().unwrap() as f32;
            worst = worst.max((row[id] - value).abs());
        }
    }
    worst
}
