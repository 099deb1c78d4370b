//! The architectures memwall converts, as data: which Hugging Face classes map
//! to which GGUF architecture, how tensor names map, where llama.cpp permutes
//! Q/K rows, and how experts are stacked. Names and rules follow llama.cpp's
//! converter (`conversion/llama.py`, `qwen.py`, `command_r.py` and gguf-py's
//! `tensor_mapping.py`, commit 0c1e570).

/// How one MoE layout names its per-expert weights.
#[derive(Debug)]
pub struct Experts {
    /// The module holding expert `X` under `model.layers.N.`: `{}` stands for `X`.
    pub module: &'static str,
    /// The router (`ffn_gate_inp`) under `model.layers.N.`.
    pub router: &'static str,
    /// Config keys giving the expert count (first present wins).
    pub count_keys: &'static [&'static str],
    /// (HF projection, GGUF name), in the order llama.cpp emits the stacked tensors.
    pub stacked: &'static [(&'static str, &'static str)],
    /// The experts may also come stacked as transformers 5 holds them:
    /// `<module without .{}>.gate_up_proj` and `.down_proj`
    /// (llama.cpp's `Qwen2MoeModel`).
    pub fused: bool,
}

/// One supported architecture.
#[derive(Debug)]
pub struct Arch {
    /// `architectures[0]` values of `config.json` that select it.
    pub hf_classes: &'static [&'static str],
    /// `general.architecture`.
    pub gguf: &'static str,
    /// `model_type` of its `config.json` (what `memwall export` writes).
    pub model_type: &'static str,
    /// llama.cpp reorders Q and K rows for its rope layout (`LlamaModel.permute`).
    pub permute_qk: bool,
    /// Expert layout of MoE models.
    pub experts: Option<&'static Experts>,
    /// Qwen3.5's hybrid stack: linear-attention tensors, zero-centred norms
    /// stored as `1 + w`, value heads reordered, a norm before the FFN named
    /// `post_attention_norm` and multi-token-prediction blocks (`mtp.*`).
    pub hybrid: bool,
    /// Gemma 4: norms stored as they are, sandwich norms, `layer_scalar`,
    /// a router with scales and fused experts beside the dense MLP, and the
    /// generated `rope_freqs` of its proportional rotary embedding.
    pub gemma: bool,
}

/// Tensors outside the blocks: (HF module, GGUF name).
pub const GLOBAL_NAMES: &[(&str, &str)] = &[
    ("model.embed_tokens", "token_embd"),
    ("model.norm", "output_norm"),
    ("lm_head", "output"),
];

/// Tensors of block `N`, below `model.layers.N.`: (HF module, GGUF name without `blk.N.`).
pub const BLOCK_NAMES: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("mlp.gate", "ffn_gate_inp"),
    ("block_sparse_moe.gate", "ffn_gate_inp"),
];

/// Tensors of block `N` of a hybrid (Qwen3.5) stack, looked up before
/// [`BLOCK_NAMES`]: (HF module, GGUF name without `blk.N.`). The
/// multi-token-prediction block's own tensors are renamed to these modules
/// first ([`mtp_name`]).
pub const HYBRID_BLOCK_NAMES: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_attention_norm"),
    ("linear_attn.in_proj_qkv", "attn_qkv"),
    ("linear_attn.in_proj_z", "attn_gate"),
    ("linear_attn.in_proj_b", "ssm_beta"),
    ("linear_attn.in_proj_a", "ssm_alpha"),
    ("linear_attn.conv1d", "ssm_conv1d"),
    ("linear_attn.dt_proj", "ssm_dt"),
    ("linear_attn.norm", "ssm_norm"),
    ("linear_attn.out_proj", "ssm_out"),
    ("mlp.shared_expert.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_expert.up_proj", "ffn_up_shexp"),
    ("mlp.shared_expert.down_proj", "ffn_down_shexp"),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
    ("eh_proj", "nextn.eh_proj"),
    ("enorm", "nextn.enorm"),
    ("hnorm", "nextn.hnorm"),
    ("shared_head.norm", "nextn.shared_head_norm"),
];

/// Tensors of block `N` of Gemma 4, looked up before [`BLOCK_NAMES`].
pub const GEMMA4_BLOCK_NAMES: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
    ("pre_feedforward_layernorm_2", "pre_ffw_norm_2"),
    ("post_feedforward_layernorm_1", "post_ffw_norm_1"),
    ("post_feedforward_layernorm_2", "post_ffw_norm_2"),
    ("layer_scalar", "layer_output_scale"),
    ("router.proj", "ffn_gate_inp"),
    ("router", "ffn_gate_inp"),
    ("experts.gate_up_proj", "ffn_gate_up_exps"),
    ("experts.down_proj", "ffn_down_exps"),
    ("per_layer_input_gate", "inp_gate"),
    ("per_layer_projection", "proj"),
    ("post_per_layer_input_norm", "post_norm"),
];

/// Gemma 4's tensors outside the blocks, looked up before [`GLOBAL_NAMES`].
const GEMMA4_GLOBAL_NAMES: &[(&str, &str)] = &[
    ("model.embed_tokens_per_layer", "per_layer_token_embd"),
    ("model.per_layer_model_projection", "per_layer_model_proj"),
    ("model.per_layer_projection_norm", "per_layer_proj_norm"),
];

/// A Gemma 4 tensor's name as llama.cpp's converter gives it before mapping
/// (`Gemma4Model.filter_tensors`): `layer_scalar`, `per_dim_scale` and the
/// stacked experts (`experts.gate_up_proj`, `experts.down_proj`) get
/// `.weight`.
pub fn gemma4_name(name: &str) -> String {
    if name.ends_with("per_dim_scale") || name.ends_with("layer_scalar") {
        return format!("{name}.weight");
    }
    let weighted = [
        ".weight",
        ".weight_scale",
        ".weight_scale_2",
        ".input_scale",
    ];
    if name.contains(".experts.") && !weighted.iter().any(|w| name.ends_with(w)) {
        return format!("{name}.weight");
    }
    name.to_owned()
}

/// Prefixes of multimodal checkpoints' tensors that the text model's
/// conversion drops (llama.cpp's `TextModel.filter_tensors`): name starts…
const MULTIMODAL_PREFIXES: &[&str] = &[
    "mlp",
    "vit.",
    "vpm.",
    "siglip2.",
    "conformer.",
    "merger.",
    "resampler.",
    "sound_encoder.",
    "sound_projection.",
    "speech_embeddings.",
];

/// …and name parts.
const MULTIMODAL_PARTS: &[&str] = &[
    "visual.",
    "vision.",
    "audio.",
    "talker.",
    "vision_",
    "audio_",
    "token2wav.",
    "code2wav.",
    "projector.",
    "pre_mm_projector_norm",
    "image_newline",
    "view_seperator",
    "patch_embed",
    "patch_embedding",
    "patch_merger.",
    "patch_merge_mlp.",
    "model.connector.",
];

/// The name llama.cpp's converter gives a checkpoint tensor before mapping
/// it, or `None` for tensors of a multimodal model's other towers, which the
/// text model's conversion drops: `language_model.` is removed from the name
/// (`model.language_model.layers.0…` → `model.layers.0…`).
pub fn text_model_name(name: &str) -> Option<String> {
    if MULTIMODAL_PREFIXES.iter().any(|p| name.starts_with(p))
        || MULTIMODAL_PARTS.iter().any(|p| name.contains(p))
    {
        return None;
    }
    Some(name.replace("language_model.", ""))
}

/// A multi-token-prediction tensor (`mtp.*`) of a checkpoint with
/// `n_layer` layers, renamed as the block after them: `mtp.layers.M.x` →
/// `model.layers.{n_layer + M}.x`, `mtp.fc` → `eh_proj`,
/// `mtp.pre_fc_norm_embedding` → `enorm`, `mtp.pre_fc_norm_hidden` →
/// `hnorm`, `mtp.norm` → `shared_head.norm` (llama.cpp's `_QwenMtpMixin`).
/// Returns the new name and the index `M` of the block it belongs to.
pub fn mtp_name(name: &str, n_layer: usize) -> Option<(String, usize)> {
    let name = name.strip_prefix("model.").unwrap_or(name);
    let rest = name.strip_prefix("mtp.")?;
    let parts: Vec<&str> = rest.splitn(3, '.').collect();
    match parts.as_slice() {
        ["layers", m, tail] => {
            let m: usize = m.parse().ok()?;
            Some((format!("model.layers.{}.{tail}", n_layer + m), m))
        }
        [module, tail] => {
            let renamed = match *module {
                "fc" => "eh_proj",
                "pre_fc_norm_embedding" => "enorm",
                "pre_fc_norm_hidden" => "hnorm",
                "norm" => "shared_head.norm",
                _ => return None,
            };
            Some((format!("model.layers.{n_layer}.{renamed}.{tail}"), 0))
        }
        _ => None,
    }
}

/// The checkpoint name of a tensor that [`mtp_name`] renamed into block
/// `n_layer + M` (`memwall export` gives it back): `model.layers.{n_layer + M}.x`
/// → `mtp.layers.M.x`, `eh_proj` → `mtp.fc`, `enorm` →
/// `mtp.pre_fc_norm_embedding`, `hnorm` → `mtp.pre_fc_norm_hidden`,
/// `shared_head.norm` → `mtp.norm`. Names of the model's own blocks are
/// returned as they are.
pub fn mtp_source_name(name: &str, n_layer: usize) -> String {
    let Some((n, rest)) = block_of(name).filter(|&(n, _)| n >= n_layer) else {
        return name.to_owned();
    };
    for (module, original) in [
        ("eh_proj.", "fc."),
        ("enorm.", "pre_fc_norm_embedding."),
        ("hnorm.", "pre_fc_norm_hidden."),
        ("shared_head.norm.", "norm."),
    ] {
        if let Some(tail) = rest.strip_prefix(module) {
            return format!("mtp.{original}{tail}");
        }
    }
    format!("mtp.layers.{}.{rest}", n - n_layer)
}

/// Tensors llama.cpp's converter drops.
pub const SKIPPED_SUFFIXES: &[&str] = &[
    ".attention.masked_bias",
    ".attention.bias",
    ".rotary_emb.inv_freq",
];

const MIXTRAL_EXPERTS: Experts = Experts {
    module: "block_sparse_moe.experts.{}",
    router: "block_sparse_moe.gate",
    count_keys: &["num_local_experts"],
    stacked: &[
        ("w1", "ffn_gate_exps"),
        ("w2", "ffn_down_exps"),
        ("w3", "ffn_up_exps"),
    ],
    fused: false,
};

const QWEN_EXPERTS: Experts = Experts {
    module: "mlp.experts.{}",
    router: "mlp.gate",
    count_keys: &["num_local_experts", "num_experts"],
    stacked: &[
        ("down_proj", "ffn_down_exps"),
        ("gate_proj", "ffn_gate_exps"),
        ("up_proj", "ffn_up_exps"),
    ],
    fused: true,
};

/// Every supported architecture.
pub const ARCHS: &[Arch] = &[
    Arch {
        hf_classes: &["LlamaForCausalLM", "MistralForCausalLM"],
        gguf: "llama",
        model_type: "llama",
        permute_qk: true,
        experts: None,
        hybrid: false,
        gemma: false,
    },
    Arch {
        hf_classes: &["MixtralForCausalLM"],
        gguf: "llama",
        model_type: "mixtral",
        permute_qk: true,
        experts: Some(&MIXTRAL_EXPERTS),
        hybrid: false,
        gemma: false,
    },
    Arch {
        hf_classes: &["Qwen2ForCausalLM"],
        gguf: "qwen2",
        model_type: "qwen2",
        permute_qk: false,
        experts: None,
        hybrid: false,
        gemma: false,
    },
    Arch {
        hf_classes: &["Qwen3ForCausalLM"],
        gguf: "qwen3",
        model_type: "qwen3",
        permute_qk: false,
        experts: None,
        hybrid: false,
        gemma: false,
    },
    Arch {
        hf_classes: &["Qwen3MoeForCausalLM"],
        gguf: "qwen3moe",
        model_type: "qwen3_moe",
        permute_qk: false,
        experts: Some(&QWEN_EXPERTS),
        hybrid: false,
        gemma: false,
    },
    Arch {
        hf_classes: &["CohereForCausalLM"],
        gguf: "command-r",
        model_type: "cohere",
        permute_qk: false,
        experts: None,
        hybrid: false,
        gemma: false,
    },
    Arch {
        hf_classes: &["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"],
        gguf: "qwen35",
        model_type: "qwen3_5_text",
        permute_qk: false,
        experts: None,
        hybrid: true,
        gemma: false,
    },
    Arch {
        hf_classes: &[
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5MoeForConditionalGeneration",
        ],
        gguf: "qwen35moe",
        model_type: "qwen3_5_moe_text",
        permute_qk: false,
        experts: Some(&QWEN_EXPERTS),
        hybrid: true,
        gemma: false,
    },
    Arch {
        hf_classes: &["Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"],
        gguf: "gemma4",
        model_type: "gemma4_text",
        permute_qk: false,
        experts: None,
        hybrid: false,
        gemma: true,
    },
];

/// A `config.json` architecture class memwall does not convert; the message
/// suggests a close supported class and lists them all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "architecture {class} is not supported{}; memwall converts {}",
    memwall_format::suggest::did_you_mean(class, supported_classes()),
    supported_classes().collect::<Vec<_>>().join(", ")
)]
pub struct UnsupportedArch {
    /// The `architectures[0]` value.
    pub class: String,
}

/// Every Hugging Face class memwall converts, in [`ARCHS`] order.
fn supported_classes() -> impl Iterator<Item = &'static str> {
    ARCHS.iter().flat_map(|a| a.hf_classes.iter().copied())
}

impl Arch {
    /// The architecture for a `config.json`'s `architectures[0]`, or the list of
    /// supported classes.
    pub fn for_class(class: &str) -> Result<&'static Arch, UnsupportedArch> {
        ARCHS
            .iter()
            .find(|a| a.hf_classes.contains(&class))
            .ok_or_else(|| UnsupportedArch {
                class: class.to_owned(),
            })
    }
}

/// Splits `model.layers.N.rest` into `(N, rest)`.
pub fn block_of(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (n, rest) = rest.split_once('.')?;
    Some((n.parse().ok()?, rest))
}

/// The GGUF name of a (non-expert) HF tensor, e.g. `model.layers.3.self_attn.q_proj.weight`
/// → `blk.3.attn_q.weight`.
pub fn gguf_name(name: &str) -> Option<String> {
    gguf_name_in(name, &[])
}

/// [`gguf_name`] for `arch`: a hybrid stack's own tensors too, including
/// `linear_attn.A_log` (→ `ssm_a`, no suffix) and `linear_attn.dt_bias` (→
/// `ssm_dt.bias`).
pub fn gguf_name_for(arch: &Arch, name: &str) -> Option<String> {
    if arch.gemma {
        // The router's per-expert scale goes with the experts' down projection.
        if let Some(module) = name.strip_suffix(".router.per_expert_scale") {
            let n: usize = module.strip_prefix("model.layers.")?.parse().ok()?;
            return Some(format!("blk.{n}.ffn_down_exps.scale"));
        }
        let (module, suffix) = name.rsplit_once('.')?;
        if let Some((_, g)) = GEMMA4_GLOBAL_NAMES.iter().find(|(h, _)| *h == module) {
            return Some(format!("{g}.{suffix}"));
        }
        return gguf_name_in(name, GEMMA4_BLOCK_NAMES);
    }
    if !arch.hybrid {
        return gguf_name(name);
    }
    if let Some(module) = name.strip_suffix(".A_log") {
        let (n, rest) = block_of(module)?;
        return (rest == "linear_attn").then(|| format!("blk.{n}.ssm_a"));
    }
    match name.strip_suffix(".dt_bias") {
        Some(module) => gguf_name_in(&format!("{module}.dt_proj.bias"), HYBRID_BLOCK_NAMES),
        None => gguf_name_in(name, HYBRID_BLOCK_NAMES),
    }
}

fn gguf_name_in(name: &str, first: &[(&str, &str)]) -> Option<String> {
    let (module, suffix) = name.rsplit_once('.')?;
    if let Some((n, rest)) = block_of(module).map(|(n, r)| (n, r.to_owned())) {
        let (_, g) = first.iter().chain(BLOCK_NAMES).find(|(h, _)| *h == rest)?;
        return Some(format!("blk.{n}.{g}.{suffix}"));
    }
    let (_, g) = GLOBAL_NAMES.iter().find(|(h, _)| *h == module)?;
    Some(format!("{g}.{suffix}"))
}

/// The Hugging Face name of a Gemma 4 text model's tensor: the inverse of
/// [`gguf_name_for`] and [`gemma4_name`] (the names that took `.weight` give
/// it back: `layer_scalar`, the stacked experts), with the router's two
/// scales told apart (`ffn_gate_inp.scale` → `router.scale`,
/// `ffn_down_exps.scale` → `router.per_expert_scale`).
pub fn gemma4_hf_name(name: &str) -> Option<String> {
    let (module, suffix) = name.rsplit_once('.')?;
    let Some(rest) = module.strip_prefix("blk.") else {
        let (h, _) = GEMMA4_GLOBAL_NAMES
            .iter()
            .chain(GLOBAL_NAMES)
            .find(|(_, g)| *g == module)?;
        return Some(format!("{h}.{suffix}"));
    };
    let (n, kind) = rest.split_once('.')?;
    let n: usize = n.parse().ok()?;
    let hf = match (kind, suffix) {
        ("ffn_gate_inp", "weight") => "router.proj.weight".to_owned(),
        ("ffn_gate_inp", "scale") => "router.scale".to_owned(),
        ("ffn_down_exps", "scale") => "router.per_expert_scale".to_owned(),
        ("ffn_gate_up_exps", "weight") => "experts.gate_up_proj".to_owned(),
        ("ffn_down_exps", "weight") => "experts.down_proj".to_owned(),
        ("layer_output_scale", "weight") => "layer_scalar".to_owned(),
        _ => {
            let (h, _) = GEMMA4_BLOCK_NAMES
                .iter()
                .chain(BLOCK_NAMES)
                .find(|(_, g)| *g == kind)?;
            format!("{h}.{suffix}")
        }
    };
    Some(format!("model.layers.{n}.{hf}"))
}

/// The Hugging Face name of a (non-expert) GGUF tensor of `arch`: the inverse
/// of [`gguf_name`], e.g. `blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`.
pub fn hf_name(arch: &Arch, name: &str) -> Option<String> {
    if arch.hybrid {
        if let Some(n) = name
            .strip_prefix("blk.")
            .and_then(|r| r.strip_suffix(".ssm_a"))
        {
            let n: usize = n.parse().ok()?;
            return Some(format!("model.layers.{n}.linear_attn.A_log"));
        }
    }
    let (module, suffix) = name.rsplit_once('.')?;
    if let Some(rest) = module.strip_prefix("blk.") {
        let (n, kind) = rest.split_once('.')?;
        let n: usize = n.parse().ok()?;
        let hybrid: &[(&str, &str)] = if arch.hybrid { HYBRID_BLOCK_NAMES } else { &[] };
        if arch.hybrid && (kind, suffix) == ("ssm_dt", "bias") {
            return Some(format!("model.layers.{n}.linear_attn.dt_bias"));
        }
        let hf = match (kind, arch.experts) {
            ("ffn_gate_inp", Some(e)) => e.router,
            ("ffn_gate_inp", None) => return None,
            _ => {
                hybrid
                    .iter()
                    .chain(BLOCK_NAMES)
                    .find(|(_, g)| *g == kind)?
                    .0
            }
        };
        return Some(format!("model.layers.{n}.{hf}.{suffix}"));
    }
    let (h, _) = GLOBAL_NAMES.iter().find(|(_, g)| *g == module)?;
    Some(format!("{h}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_like_llama_cpp() {
        assert_eq!(
            gguf_name("model.layers.12.self_attn.q_proj.weight").unwrap(),
            "blk.12.attn_q.weight"
        );
        assert_eq!(
            gguf_name("model.layers.0.self_attn.k_proj.bias").unwrap(),
            "blk.0.attn_k.bias"
        );
        assert_eq!(
            gguf_name("model.embed_tokens.weight").unwrap(),
            "token_embd.weight"
        );
        assert_eq!(gguf_name("lm_head.weight").unwrap(), "output.weight");
        assert_eq!(
            gguf_name("model.layers.1.mlp.gate.weight").unwrap(),
            "blk.1.ffn_gate_inp.weight"
        );
        assert_eq!(gguf_name("model.layers.1.mystery.weight"), None);
        for arch in ARCHS {
            for name in [
                "model.layers.7.self_attn.k_proj.bias",
                "model.layers.0.mlp.down_proj.weight",
                "model.norm.weight",
                "lm_head.weight",
            ] {
                assert_eq!(hf_name(arch, &gguf_name(name).unwrap()).unwrap(), name);
            }
            let router = hf_name(arch, "blk.2.ffn_gate_inp.weight");
            assert_eq!(
                router.map(|r| gguf_name(&r).unwrap()),
                arch.experts.map(|_| "blk.2.ffn_gate_inp.weight".to_owned())
            );
        }
        assert_eq!(hf_name(&ARCHS[0], "blk.1.mystery.weight"), None);
        assert!(
            Arch::for_class("GPT2LMHeadModel")
                .unwrap_err()
                .to_string()
                .contains("LlamaForCausalLM")
        );
    }
}
