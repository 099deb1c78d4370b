//! Checks a planned conversion against `config.json` before anything is
//! written: every tensor llama.cpp needs for the architecture is present, and
//! every weight has the shape the configuration implies. All problems are
//! reported at once.

use crate::arch::Arch;
use crate::checkpoint::Checkpoint;
use crate::tensors::Planned;
use memwall_format::arch::{Arch as GgufArch, Dims, LinearDims, Slot, recurrent_every};

fn get(config: &serde_json::Value, keys: &[&str]) -> Option<u64> {
    keys.iter()
        .find_map(|k| config.get(*k).and_then(|v| v.as_u64()))
}

/// Why a planned conversion does not match `config.json`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MismatchError {
    /// Keys the shapes follow from are missing (the first name of each).
    #[error("config.json lacks {}", .0.join(", "))]
    MissingKeys(Vec<String>),
    /// Tensors missing, of the wrong shape, or in blocks past the last.
    #[error("the weights do not match config.json: {}", .0.join("; "))]
    Tensors(Vec<String>),
    /// The architecture has no tensor table (a bug: every converted
    /// architecture has one).
    #[error("internal: no tensor table for {0}")]
    NoTable(&'static str),
}

/// Checks presence and shapes; the error lists every problem found.
pub fn validate(ckpt: &Checkpoint, arch: &Arch, planned: &[Planned]) -> Result<(), MismatchError> {
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
    // A mixture without dense layers may state no dense FFN width.
    let ffn = match arch.experts.filter(|_| !arch.gemma) {
        Some(_) => get(c, &["intermediate_size"]).unwrap_or(0),
        None => need(&["intermediate_size"]),
    };
    let kv_heads = get(c, &["num_key_value_heads", "n_kv_heads"]).unwrap_or(heads);
    let head_dim = get(c, &["head_dim"]).unwrap_or(hidden.checked_div(heads).unwrap_or(0));
    let experts = if arch.gemma {
        get(c, &["num_experts"]).unwrap_or(0)
    } else {
        arch.experts.and_then(|e| get(c, e.count_keys)).unwrap_or(0)
    };
    let moe_ffn = get(c, &["moe_intermediate_size"]).unwrap_or(ffn);
    let tied = c
        .get("tie_word_embeddings")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);

    // A hybrid stack's linear layers and the multi-token-prediction blocks
    // planned after the model's own.
    let nextn = if arch.hybrid {
        planned
            .iter()
            .filter(|p| p.name.ends_with(".nextn.eh_proj.weight"))
            .count() as u64
    } else {
        0
    };
    let linear = if arch.hybrid {
        let lin = LinearDims {
            conv_kernel: need(&["linear_conv_kernel_dim"]),
            n_k_heads: need(&["linear_num_key_heads"]),
            head_k_dim: need(&["linear_key_head_dim"]),
            n_v_heads: need(&["linear_num_value_heads"]),
            head_v_dim: need(&["linear_value_head_dim"]),
        };
        let recurrent = match c.get("layer_types").and_then(|t| t.as_array()) {
            Some(types) => types
                .iter()
                .map(|t| t.as_str() == Some("linear_attention"))
                .collect(),
            None => recurrent_every(layers, get(c, &["full_attention_interval"]).unwrap_or(4)),
        };
        Some((lin, recurrent))
    } else {
        None
    };
    if !missing_keys.is_empty() {
        return Err(MismatchError::MissingKeys(missing_keys));
    }
    let (linear, recurrent) = match linear {
        Some((l, r)) => (Some(l), r),
        None => (None, Vec::new()),
    };
    // Expected GGUF dims (ne[0] first) of each tensor, from the architecture's table.
    let gguf_arch = GgufArch::from_name(arch.gguf).ok_or(MismatchError::NoTable(arch.gguf))?;
    let expected = gguf_arch.tensors(&Dims {
        n_layer: layers,
        n_embd: hidden,
        n_head: heads,
        n_head_kv: kv_heads,
        head_dim,
        n_ff: ffn,
        n_expert: experts,
        n_ff_expert: moe_ffn,
        n_vocab: vocab,
        tied_embeddings: tied,
        n_ff_shared: get(c, &["shared_expert_intermediate_size"]).unwrap_or(0),
        linear,
        recurrent,
        n_nextn: nextn,
        gemma: crate::hf_config::gemma_dims(c),
    });
    let mut problems = Vec::new();
    for Slot { name, dims } in &expected {
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
            if l >= layers + nextn {
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
        Err(MismatchError::Tensors(problems))
    }
}

/// GGUF dims back to PyTorch order, for messages.
fn rev(dims: &[u64]) -> Vec<u64> {
    dims.iter().rev().copied().collect()
}
