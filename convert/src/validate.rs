//! Checks a planned conversion against `config.json` before anything is
//! written: every tensor llama.cpp needs for the architecture is present, and
//! every weight has the shape the configuration implies. All problems are
//! reported at once.

use crate::arch::Arch;
use crate::checkpoint::Checkpoint;
use crate::tensors::Planned;

fn get(config: &serde_json::Value, keys: &[&str]) -> Option<u64> {
    keys.iter()
        .find_map(|k| config.get(*k).and_then(|v| v.as_u64()))
}

/// Checks presence and shapes; the error lists every problem found.
pub fn validate(ckpt: &Checkpoint, arch: &Arch, planned: &[Planned]) -> Result<(), String> {
    let c = ckpt.config();
    let mut missing_keys = Vec::new();
    let mut need = |keys: &[&str]| {
        let v = get(c, keys);
        if v.is_none() {
            missing_keys.push(keys[0].to_owned());
        }
        v.unwrap_or(0)
    };
    let layers = need(&["num_hidden_layers", "n_layers", "n_layer", "num_layers"]);
    let hidden = need(&["hidden_size", "n_embd", "dim"]);
    let heads = need(&["num_attention_heads", "n_head", "n_heads"]);
    let vocab = need(&["vocab_size"]);
    let ffn = need(&["intermediate_size"]);
    if !missing_keys.is_empty() {
        return Err(format!("config.json lacks {}", missing_keys.join(", ")));
    }
    let kv_heads = get(c, &["num_key_value_heads", "n_kv_heads"]).unwrap_or(heads);
    let head_dim = get(c, &["head_dim"]).unwrap_or(hidden.checked_div(heads).unwrap_or(0));
    let experts = arch.experts.and_then(|e| get(c, e.count_keys)).unwrap_or(0);
    let moe_ffn = get(c, &["moe_intermediate_size"]).unwrap_or(ffn);
    let tied = c
        .get("tie_word_embeddings")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);

    // Expected GGUF dims (ne[0] first) of each weight, by GGUF name.
    let (q, kv) = (heads * head_dim, kv_heads * head_dim);
    let mut expected: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![hidden, vocab]),
        ("output_norm.weight".into(), vec![hidden]),
    ];
    if !tied {
        expected.push(("output.weight".into(), vec![hidden, vocab]));
    }
    for l in 0..layers {
        let b = |n: &str| format!("blk.{l}.{n}.weight");
        expected.push((b("attn_norm"), vec![hidden]));
        expected.push((b("attn_q"), vec![hidden, q]));
        expected.push((b("attn_k"), vec![hidden, kv]));
        expected.push((b("attn_v"), vec![hidden, kv]));
        expected.push((b("attn_output"), vec![q, hidden]));
        if arch.gguf != "command-r" {
            expected.push((b("ffn_norm"), vec![hidden]));
        }
        if experts > 0 {
            expected.push((b("ffn_gate_inp"), vec![hidden, experts]));
            expected.push((b("ffn_gate_exps"), vec![hidden, moe_ffn, experts]));
            expected.push((b("ffn_up_exps"), vec![hidden, moe_ffn, experts]));
            expected.push((b("ffn_down_exps"), vec![moe_ffn, hidden, experts]));
        } else {
            expected.push((b("ffn_gate"), vec![hidden, ffn]));
            expected.push((b("ffn_up"), vec![hidden, ffn]));
            expected.push((b("ffn_down"), vec![ffn, hidden]));
        }
    }
    let mut problems = Vec::new();
    for (name, dims) in &expected {
        match planned.iter().find(|p| &p.name == name) {
            None => problems.push(format!("missing {name}")),
            Some(p) if &p.dims != dims => {
                let hf: Vec<String> = p
                    .parts
                    .iter()
                    .take(1)
                    .map(|&i| ckpt.tensors()[i].name.clone())
                    .collect();
                problems.push(format!(
                    "{} ({name}) has shape {:?}, config.json implies {:?}",
                    hf.join(""),
                    rev(&p.dims),
                    rev(dims)
                ));
            }
            Some(_) => {}
        }
    }
    // Blocks beyond num_hidden_layers.
    for p in planned {
        if let Some(l) = p
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse::<u64>().ok())
        {
            if l >= layers {
                problems.push(format!(
                    "{} is in block {l}; config.json has {layers} layers",
                    p.name
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the weights do not match config.json: {}",
            problems.join("; ")
        ))
    }
}

/// GGUF dims back to PyTorch order, for messages.
fn rev(dims: &[u64]) -> Vec<u64> {
    dims.iter().rev().copied().collect()
}
