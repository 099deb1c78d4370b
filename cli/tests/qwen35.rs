//! Qwen3.5 through the binary, as a user runs it: memwall-synth's tiny dense
//! and MoE checkpoints converted, quantized with llama-quantize's mixes — the
//! same files, byte for byte, with and without an importance matrix — and
//! measured with the perplexity llama-perplexity gives; planned, chatted with
//! and calibrated. Expectations: fixtures/synth/family_quant_reference.sh qwen35.

mod common;

use std::path::Path;

use common::family::{Family, s};
use common::repo;
use serde_json::Value;

/// Qwen3.5 at a 49152-token vocabulary with SmolLM2's tokenizer.
const QWEN35: Family = Family {
    name: "qwen35",
    checkpoint,
    convert_flags: &["--pre", "smollm"],
};

fn checkpoint(hf: &Path, preset_name: &str, weight_scale: f32) {
    use memwall_fixtures::synth::{Options, preset, write_checkpoint};
    let options = Options {
        tokenizer_dir: Some(repo().join("fixtures/smollm2")),
        weight_scale,
        ..Options::default()
    };
    let mut p = preset(preset_name).unwrap();
    p.shape.vocab = 49152;
    write_checkpoint(hf, p.arch, &p.shape, &options, &mut |_| {}).unwrap();
}

/// The mixes are llama-quantize's files. The types that need an entry for
/// every tensor are refused, as llama-quantize refuses them: the imatrix has
/// none for the multi-token-prediction block, which the forward pass does not run.
#[test]
fn qwen35_mixes_are_the_files_llama_quantize_writes() {
    QWEN35.check_mixes();
}

#[test]
fn qwen35_perplexity_equals_llama_perplexity() {
    QWEN35.check_perplexity();
}

/// The planner's tensor list and llama.cpp's mixing rules, from config.json
/// alone, give each tensor the type llama-quantize gave it (the
/// multi-token-prediction block included), so the planned sizes are the
/// files' sizes; the linear layers have no KV cache but a fixed state.
#[test]
fn the_plan_of_a_qwen35_config_has_llama_quantizes_types_and_a_fixed_state() {
    use memwall_fixtures::synth::{config_json, preset};
    use memwall_quantize::fit::KvType;
    let shapes = QWEN35.check_plan_types(|preset_name| {
        let mut p = preset(preset_name).unwrap();
        p.shape.vocab = 49152;
        config_json(p.arch, &p.shape)
    });
    for (name, shape) in shapes {
        // One linear layer and one attention layer; the state of the linear
        // one: (4 − 1) taps × 512 channels + 4 value heads × 64 × 64, in f32.
        assert_eq!(shape.attention_layers(), 1, "{name}");
        assert_eq!(
            shape.recurrent_state_bytes(),
            4 * (3 * 512 + 4 * 64 * 64),
            "{name}"
        );
        assert_eq!(
            shape.kv_bytes_per_token(KvType::F16),
            2 * 2 * 64 * 2,
            "{name}: K and V of 2 heads × 64 in f16, one layer"
        );
    }
}

/// `memwall run --chat` over a hybrid model: the second turn continues the
/// first one's state (its prompt starts with the whole first turn), and a
/// greedy reply is what the same prompt gives in a fresh process.
#[test]
fn a_qwen35_chat_continues_its_recurrent_state_between_turns() {
    use common::memwall_with_stdin;
    let reference = QWEN35.recorded();
    let dir = tempfile::tempdir().unwrap();
    let v = &reference["variants"]["qwen3.5"];
    let model = QWEN35.f16(dir.path(), "qwen3.5", v);
    let chat = |input: &str| -> Value {
        let out = memwall_with_stdin(
            &[
                "run",
                "-m",
                s(&model),
                "--chat",
                "-n",
                "6",
                "--temp",
                "0",
                "--json",
            ],
            input.as_bytes(),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let two = chat("Say hello.\nAnd again.\n");
    let turns = two["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{two}");
    let ids = |t: &Value| -> Vec<u64> {
        t["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    assert!(ids(&turns[1]).starts_with(&ids(&turns[0])), "history kept");
    for t in turns {
        assert!(t["generated_tokens"].as_u64().unwrap() > 0, "{t}");
    }
    // The same first turn alone: the same greedy reply.
    let one = chat("Say hello.\n");
    assert_eq!(one["turns"][0]["reply"], turns[0]["reply"]);
}

/// `memwall calibrate imatrix` collects what llama-imatrix collects from a
/// hybrid model: an entry for every matrix the forward pass multiplies (the
/// linear layers' and the shared expert's included, none for the
/// multi-token-prediction block).
#[test]
fn qwen35_importance_matrices_equal_llama_imatrixs() {
    for (name, keys) in QWEN35.check_imatrix() {
        assert!(
            keys.iter().any(|k| k.contains(".attn_qkv.")),
            "{name}: linear layers"
        );
        assert!(
            !keys.iter().any(|k| k.starts_with("blk.2.")),
            "{name}: no MTP block"
        );
    }
}

/// AWQ + GPTQ over every layer kind: the delta-net layers' four input projections scaled
/// together through the attention norm, the shared expert: the plain
/// Q4_K_M layout, and a lower KL divergence from F16.
#[test]
fn qwen35_calibrates_every_layer_kind() {
    QWEN35.check_calibrate();
}

#[test]
fn qwen35_exports_back_to_a_checkpoint_that_converts_to_the_same_file() {
    QWEN35.check_export_round_trips();
}
