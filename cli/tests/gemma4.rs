//! Gemma 4 through the binary, as a user runs it: memwall-synth's tiny dense
//! (31B-style) and MoE (26B-A4B-style) text models with Gemma 4's tokenizer,
//! converted, quantized with llama-quantize's mixes — the same files, byte
//! for byte, with and without an importance matrix, the 2-bit i-quants
//! included — measured with the perplexity llama-perplexity gives, and
//! calibrated. Expectations: fixtures/synth/family_quant_reference.sh gemma4.

mod common;

use std::path::Path;

use common::family::Family;
use common::repo;

/// Gemma 4 with its own 262144-token vocabulary (llama.cpp's
/// models/ggml-vocab-gemma-4.gguf, fetched by fixtures/fetch.sh).
const GEMMA4: Family = Family {
    name: "gemma4",
    checkpoint,
    convert_flags: &[],
};

fn checkpoint(hf: &Path, preset_name: &str, weight_scale: f32) {
    use memwall_fixtures::synth::{Options, preset, write_checkpoint};
    let options = Options {
        weight_scale,
        ..Options::default()
    };
    let p = preset(preset_name).unwrap();
    write_checkpoint(hf, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
    // As memwall-synth --gemma4-tokenizer writes it: the 31B's chat template.
    let models = repo().join("fixtures/cache/llama.cpp-0c1e570/models");
    let vocab = models.join("ggml-vocab-gemma-4.gguf");
    assert!(vocab.exists(), "{}: run fixtures/fetch.sh", vocab.display());
    let template = models.join("templates/google-gemma-4-31B-it.jinja");
    memwall_fixtures::gemma4_tokenizer::write_gemma4_tokenizer(&vocab, Some(&template), hf)
        .unwrap();
}

#[test]
fn gemma4_mixes_are_the_files_llama_quantize_writes() {
    GEMMA4.check_mixes();
}

#[test]
fn gemma4_perplexity_equals_llama_perplexity() {
    GEMMA4.check_perplexity();
}

/// An entry for every matrix the forward pass multiplies: the global
/// layers' keys-as-values have no `attn_v` entry, the fused experts one.
#[test]
fn gemma4_importance_matrices_equal_llama_imatrixs() {
    for (name, keys) in GEMMA4.check_imatrix() {
        assert!(!keys.iter().any(|k| k == "blk.1.attn_v.weight"), "{name}");
        if name.contains("moe") {
            assert!(
                keys.iter().any(|k| k.contains(".ffn_gate_up_exps.")),
                "{name}: fused experts"
            );
        }
    }
}

/// From config.json alone: each tensor's type as llama-quantize chose it
/// (the fused experts and the global layers without `attn_v` included), and
/// a KV cache whose sliding-window layers stop growing at their window and a
/// micro-batch while the global layers keep every token.
#[test]
fn the_plan_of_a_gemma4_config_has_llama_quantizes_types_and_bounded_windows() {
    use memwall_fixtures::synth::{config_json, preset};
    use memwall_quantize::fit::KvType;
    let shapes = GEMMA4.check_plan_types(|preset_name| {
        let p = preset(preset_name).unwrap();
        let mut config = config_json(p.arch, &p.shape);
        memwall_convert::hf_config::with_defaults(&mut config);
        config
    });
    for (name, shape) in shapes {
        // Layer 0 slides over 8 tokens with 2 KV heads × 64; layer 1 is
        // global, 1 KV head × 128 (its values are its keys, yet cached).
        let (sliding, global) = (2 * 2 * 64 * 2, 2 * 128 * 2);
        assert_eq!(shape.window, 8, "{name}");
        assert_eq!(shape.kv_bytes_per_token(KvType::F16), global, "{name}");
        assert_eq!(
            shape.kv_bytes(KvType::F16, 100),
            100 * (sliding + global),
            "{name}: within the ring"
        );
        assert_eq!(
            shape.kv_bytes(KvType::F16, 4096),
            (8 + 512) * sliding + 4096 * global,
            "{name}: past it"
        );
    }
}

/// AWQ + GPTQ over every layer kind: a global layer's queries and keys (its values
/// are its keys), the dense MLP beside the experts, the fused experts: the plain
/// Q4_K_M layout, and a lower KL divergence from F16.
#[test]
fn gemma4_calibrates_every_layer_kind() {
    GEMMA4.check_calibrate();
}

#[test]
fn gemma4_exports_back_to_a_checkpoint_that_converts_to_the_same_file() {
    GEMMA4.check_export_round_trips();
}
