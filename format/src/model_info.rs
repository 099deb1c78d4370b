//! Typed views of the metadata a model file carries: architecture
//! hyper-parameters and the tokenizer. Read once, with every missing or
//! ill-typed key reported together.

use std::fmt;

use crate::gguf::{Array, Metadata, MetadataError, keys};

/// All problems found while reading a typed view of the metadata.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct MetadataProblems(pub Vec<MetadataError>);

impl fmt::Display for MetadataProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("; "))
    }
}

/// Collects problems while reading keys, so that all are reported at once.
struct Reader<'a> {
    m: &'a Metadata,
    problems: Vec<MetadataError>,
}

impl<'a> Reader<'a> {
    fn opt<T>(&mut self, r: Result<Option<T>, MetadataError>) -> Option<T> {
        r.unwrap_or_else(|e| {
            self.problems.push(e);
            None
        })
    }

    fn req<T>(&mut self, key: &str, r: Result<Option<T>, MetadataError>) -> Option<T> {
        let v = self.opt(r);
        if v.is_none()
            && !self
                .problems
                .iter()
                .any(|p| matches!(p, MetadataError::WrongType { key: k, .. } if k == key))
        {
            self.problems.push(MetadataError::Missing(key.to_owned()));
        }
        v
    }

    fn u64(&mut self, key: &str) -> Option<u64> {
        let r = self.m.get_u64(key);
        self.opt(r)
    }

    fn req_u64(&mut self, key: &str) -> Option<u64> {
        let r = self.m.get_u64(key);
        self.req(key, r)
    }

    fn f64(&mut self, key: &str) -> Option<f64> {
        let r = self.m.get_f64(key);
        self.opt(r)
    }

    fn string(&mut self, key: &str) -> Option<&'a str> {
        let r = self.m.get_str(key);
        self.opt(r)
    }

    fn bool(&mut self, key: &str) -> Option<bool> {
        let r = self.m.get_bool(key);
        self.opt(r)
    }

    /// An array of booleans.
    fn bools(&mut self, key: &str) -> Option<Vec<bool>> {
        let r = self.m.get_array(key);
        match self.opt(r)? {
            Array::Bool(v) => Some(v.clone()),
            _ => {
                self.problems.push(MetadataError::WrongType {
                    key: key.to_owned(),
                    expected: "array of bool",
                    found: "another array".to_owned(),
                });
                None
            }
        }
    }

    /// A count stated once or per layer (an array of integers): the first
    /// value, and the whole list when it is one.
    fn u64_or_ints(&mut self, key: &str) -> Option<(u64, Option<Vec<u64>>)> {
        if !matches!(self.m.get(key), Some(crate::gguf::Value::Array(_))) {
            return self.u64(key).map(|n| (n, None));
        }
        let v = self.ints(key)?;
        if v.iter().any(|&n| n < 0) || v.is_empty() {
            self.problems.push(MetadataError::WrongType {
                key: key.to_owned(),
                expected: "non-negative integers",
                found: "a negative value or an empty array".to_owned(),
            });
            return None;
        }
        let v: Vec<u64> = v.into_iter().map(|n| n as u64).collect();
        Some((v[0], Some(v)))
    }

    /// An array of integers of any width.
    fn ints(&mut self, key: &str) -> Option<Vec<i64>> {
        let r = self.m.get_array(key);
        let v = match self.opt(r)? {
            Array::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Array::U32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Array::I64(v) => v.clone(),
            Array::I16(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Array::U16(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Array::I8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Array::U8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            _ => {
                self.problems.push(MetadataError::WrongType {
                    key: key.to_owned(),
                    expected: "array of integers",
                    found: "another array".to_owned(),
                });
                return None;
            }
        };
        Some(v)
    }
}

/// Architecture hyper-parameters, read from `<arch>.*` keys.
#[derive(Clone, Debug, PartialEq)]
pub struct HyperParams {
    /// `general.architecture`.
    pub architecture: String,
    /// Training context length.
    pub context_length: u64,
    /// Hidden size (`n_embd`).
    pub embedding_length: u64,
    /// Number of transformer blocks.
    pub block_count: u64,
    /// FFN width (for MoE models, of the dense layers if any).
    pub feed_forward_length: Option<u64>,
    /// Query heads.
    pub head_count: u64,
    /// Key/value heads; equals `head_count` when the key is absent (the
    /// first layer's when the file states them per layer).
    pub head_count_kv: u64,
    /// Key/value heads per layer, when the file states them so (Gemma 4:
    /// `attention.head_count_kv` as an array).
    pub head_count_kv_layers: Option<Vec<u64>>,
    /// Key head size, when stored (else `embedding_length / head_count`).
    pub key_length: Option<u64>,
    /// Value head size, when stored.
    pub value_length: Option<u64>,
    /// Rotary dimensions.
    pub rope_dimension_count: Option<u64>,
    /// RoPE base frequency.
    pub rope_freq_base: Option<f64>,
    /// RoPE scaling type (`linear`, `yarn`, …).
    pub rope_scaling_type: Option<String>,
    /// RoPE scaling factor.
    pub rope_scaling_factor: Option<f64>,
    /// Training context of the unscaled model (YaRN).
    pub rope_scaling_original_context_length: Option<u64>,
    /// Factor on the rotary embedding's magnitude (`rope.scaling.attn_factor`).
    pub rope_scaling_attn_factor: Option<f64>,
    /// YaRN's extrapolation mix (`rope.scaling.yarn_ext_factor`).
    pub yarn_ext_factor: Option<f64>,
    /// YaRN's stated magnitude (`rope.scaling.yarn_attn_factor`, transformers'
    /// `attention_factor`), which replaces the computed one.
    pub yarn_attn_factor: Option<f64>,
    /// YaRN's `beta_fast`.
    pub yarn_beta_fast: Option<f64>,
    /// YaRN's `beta_slow`.
    pub yarn_beta_slow: Option<f64>,
    /// YaRN's magnitude log multiplier (`rope.scaling.yarn_log_multiplier`).
    pub yarn_log_multiplier: Option<f64>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: Option<f64>,
    /// LayerNorm epsilon.
    pub layer_norm_eps: Option<f64>,
    /// Number of experts (MoE).
    pub expert_count: Option<u64>,
    /// Experts used per token (MoE).
    pub expert_used_count: Option<u64>,
    /// FFN width of each expert (MoE).
    pub expert_feed_forward_length: Option<u64>,
    /// Factor on the routing weights (`expert_weights_scale`).
    pub expert_weights_scale: Option<f64>,
    /// Factor on the logits (`logit_scale`, Command-R).
    pub logit_scale: Option<f64>,
    /// Vocabulary size: `<arch>.vocab_size`, else the token list length.
    pub vocab_size: Option<u64>,
    /// FFN width of the shared expert (`expert_shared_feed_forward_length`).
    pub expert_shared_feed_forward_length: Option<u64>,
    /// Multi-token-prediction blocks stored after the model's own
    /// (`nextn_predict_layers`; they count in `block_count`).
    pub nextn_predict_layers: Option<u64>,
    /// Width of a linear-attention layer's convolution (`ssm.conv_kernel`).
    pub ssm_conv_kernel: Option<u64>,
    /// Value width of a linear-attention layer (`ssm.inner_size`).
    pub ssm_inner_size: Option<u64>,
    /// Key head size of a linear-attention layer (`ssm.state_size`).
    pub ssm_state_size: Option<u64>,
    /// Value heads of a linear-attention layer (`ssm.time_step_rank`).
    pub ssm_time_step_rank: Option<u64>,
    /// Key heads of a linear-attention layer (`ssm.group_count`).
    pub ssm_group_count: Option<u64>,
    /// Which blocks are linear-attention layers (`attention.recurrent_layers`).
    pub recurrent_layers: Option<Vec<bool>>,
    /// Every how many blocks a full attention layer comes, when the file
    /// states no `recurrent_layers` (`full_attention_interval`).
    pub full_attention_interval: Option<u64>,
    /// Multi-axis rotary sections (`rope.dimension_sections`).
    pub rope_dimension_sections: Option<Vec<i64>>,
    /// Which layers are sliding-window layers (`attention.sliding_window_pattern`).
    pub sliding_window_pattern: Option<Vec<bool>>,
    /// Tokens a sliding-window layer sees (`attention.sliding_window`).
    pub sliding_window: Option<u64>,
    /// Key head size of the sliding-window layers (`attention.key_length_swa`).
    pub key_length_swa: Option<u64>,
    /// Value head size of the sliding-window layers (`attention.value_length_swa`).
    pub value_length_swa: Option<u64>,
    /// RoPE base of the sliding-window layers (`rope.freq_base_swa`).
    pub rope_freq_base_swa: Option<f64>,
    /// Rotary dimensions of the sliding-window layers (`rope.dimension_count_swa`).
    pub rope_dimension_count_swa: Option<u64>,
    /// `tanh` cap of the final logits (`final_logit_softcapping`).
    pub final_logit_softcapping: Option<f64>,
    /// Layers that reuse an earlier layer's KV cache (`attention.shared_kv_layers`).
    pub shared_kv_layers: Option<u64>,
    /// Width of the per-layer token embeddings (`embedding_length_per_layer_input`).
    pub embedding_length_per_layer_input: Option<u64>,
}

impl HyperParams {
    /// Head size of keys: `key_length` or `embedding_length / head_count`.
    pub fn head_dim(&self) -> u64 {
        self.key_length
            .unwrap_or(self.embedding_length / self.head_count.max(1))
    }

    /// Blocks the model runs: `block_count` without the
    /// multi-token-prediction blocks stored after them (0 when the count is
    /// not smaller than `block_count`).
    pub fn n_layer(&self) -> u64 {
        self.block_count
            .saturating_sub(self.nextn_predict_layers.unwrap_or(0))
    }

    /// Whether block `l` is a linear-attention layer: as
    /// `recurrent_layers` says, else every block but each
    /// `full_attention_interval`-th (llama.cpp's default interval is 4) when
    /// the file has linear-attention keys. Multi-token-prediction blocks
    /// never are.
    pub fn is_recurrent(&self, l: u64) -> bool {
        if l >= self.n_layer() {
            return false;
        }
        if let Some(r) = &self.recurrent_layers {
            return r.get(l as usize).copied().unwrap_or(false);
        }
        if self.ssm_inner_size.is_none() {
            return false;
        }
        let interval = self.full_attention_interval.unwrap_or(4);
        interval == 0 || (l + 1) % interval != 0
    }
}

impl TryFrom<&Metadata> for HyperParams {
    type Error = MetadataProblems;

    fn try_from(m: &Metadata) -> Result<Self, MetadataProblems> {
        let mut r = Reader {
            m,
            problems: Vec::new(),
        };
        let arch = r
            .req(keys::ARCHITECTURE, m.get_str(keys::ARCHITECTURE))
            .unwrap_or("");
        let k = |name: &str| format!("{arch}.{name}");
        let context_length = r.req_u64(&k("context_length"));
        let embedding_length = r.req_u64(&k("embedding_length"));
        let block_count = r.req_u64(&k("block_count"));
        let head_count = r.req_u64(&k("attention.head_count"));
        let kv_heads = r.u64_or_ints(&k("attention.head_count_kv"));
        let hp = HyperParams {
            architecture: arch.to_owned(),
            context_length: context_length.unwrap_or(0),
            embedding_length: embedding_length.unwrap_or(0),
            block_count: block_count.unwrap_or(0),
            feed_forward_length: r.u64_or_ints(&k("feed_forward_length")).map(|v| v.0),
            head_count: head_count.unwrap_or(0),
            head_count_kv: match &kv_heads {
                Some((n, _)) => *n,
                None => head_count.unwrap_or(0),
            },
            head_count_kv_layers: kv_heads.and_then(|v| v.1),
            key_length: r.u64(&k("attention.key_length")),
            value_length: r.u64(&k("attention.value_length")),
            rope_dimension_count: r.u64(&k("rope.dimension_count")),
            rope_freq_base: r.f64(&k("rope.freq_base")),
            rope_scaling_type: r.string(&k("rope.scaling.type")).map(str::to_owned),
            rope_scaling_factor: r.f64(&k("rope.scaling.factor")),
            rope_scaling_original_context_length: r.u64(&k("rope.scaling.original_context_length")),
            rope_scaling_attn_factor: r.f64(&k("rope.scaling.attn_factor")),
            yarn_ext_factor: r.f64(&k("rope.scaling.yarn_ext_factor")),
            yarn_attn_factor: r.f64(&k("rope.scaling.yarn_attn_factor")),
            yarn_beta_fast: r.f64(&k("rope.scaling.yarn_beta_fast")),
            yarn_beta_slow: r.f64(&k("rope.scaling.yarn_beta_slow")),
            yarn_log_multiplier: r.f64(&k("rope.scaling.yarn_log_multiplier")),
            rms_norm_eps: r.f64(&k("attention.layer_norm_rms_epsilon")),
            layer_norm_eps: r.f64(&k("attention.layer_norm_epsilon")),
            expert_count: r.u64(&k("expert_count")),
            expert_used_count: r.u64(&k("expert_used_count")),
            expert_feed_forward_length: r.u64(&k("expert_feed_forward_length")),
            expert_weights_scale: r.f64(&k("expert_weights_scale")),
            logit_scale: r.f64(&k("logit_scale")),
            vocab_size: r.u64(&k("vocab_size")).or_else(|| {
                let tokens = r.opt(m.get_array(tokenizer_keys::TOKENS));
                tokens.map(|a| a.len() as u64)
            }),
            expert_shared_feed_forward_length: r.u64(&k("expert_shared_feed_forward_length")),
            nextn_predict_layers: r.u64(&k("nextn_predict_layers")),
            ssm_conv_kernel: r.u64(&k("ssm.conv_kernel")),
            ssm_inner_size: r.u64(&k("ssm.inner_size")),
            ssm_state_size: r.u64(&k("ssm.state_size")),
            ssm_time_step_rank: r.u64(&k("ssm.time_step_rank")),
            ssm_group_count: r.u64(&k("ssm.group_count")),
            recurrent_layers: r.bools(&k("attention.recurrent_layers")),
            full_attention_interval: r.u64(&k("full_attention_interval")),
            rope_dimension_sections: r.ints(&k("rope.dimension_sections")),
            sliding_window_pattern: r.bools(&k("attention.sliding_window_pattern")),
            sliding_window: r.u64(&k("attention.sliding_window")),
            key_length_swa: r.u64(&k("attention.key_length_swa")),
            value_length_swa: r.u64(&k("attention.value_length_swa")),
            rope_freq_base_swa: r.f64(&k("rope.freq_base_swa")),
            rope_dimension_count_swa: r.u64(&k("rope.dimension_count_swa")),
            final_logit_softcapping: r.f64(&k("final_logit_softcapping")),
            shared_kv_layers: r.u64(&k("attention.shared_kv_layers")),
            embedding_length_per_layer_input: r.u64(&k("embedding_length_per_layer_input")),
        };
        if r.problems.is_empty() {
            Ok(hp)
        } else {
            Err(MetadataProblems(r.problems))
        }
    }
}

/// Tokenizer metadata keys.
pub mod tokenizer_keys {
    /// Tokenizer model (`gpt2`, `llama`, …).
    pub const MODEL: &str = "tokenizer.ggml.model";
    /// Pre-tokenizer name.
    pub const PRE: &str = "tokenizer.ggml.pre";
    /// Token strings.
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    /// Token types.
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    /// Token scores (SentencePiece).
    pub const SCORES: &str = "tokenizer.ggml.scores";
    /// BPE merges.
    pub const MERGES: &str = "tokenizer.ggml.merges";
    /// Beginning-of-sequence token id.
    pub const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
    /// End-of-sequence token id.
    pub const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
    /// End-of-turn token id.
    pub const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
    /// Unknown token id.
    pub const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
    /// Padding token id.
    pub const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
    /// Whether to add BOS.
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    /// Whether to add EOS.
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    /// Jinja chat template.
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
}

/// A special token: its id and, when the id is in range, its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    /// What it is for (`bos`, `eos`, …).
    pub role: &'static str,
    /// Token id.
    pub id: u64,
    /// Token text, if the id is inside the vocabulary.
    pub text: Option<String>,
}

/// Summary of the tokenizer stored in a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizerInfo {
    /// `tokenizer.ggml.model`.
    pub model: Option<String>,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    /// Number of tokens.
    pub tokens: usize,
    /// Number of merges.
    pub merges: usize,
    /// Whether scores are present.
    pub has_scores: bool,
    /// Count of each token type (1 normal … 6 byte), as (type name, count).
    pub token_types: Vec<(&'static str, usize)>,
    /// Special tokens that are set.
    pub special: Vec<SpecialToken>,
    /// `add_bos_token`.
    pub add_bos: Option<bool>,
    /// `add_eos_token`.
    pub add_eos: Option<bool>,
    /// Length of the chat template in bytes, if there is one.
    pub chat_template_len: Option<usize>,
}

/// Names of `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub const TOKEN_TYPE_NAMES: [&str; 7] = [
    "undefined",
    "normal",
    "unknown",
    "control",
    "user-defined",
    "unused",
    "byte",
];

impl TokenizerInfo {
    /// Reads the tokenizer summary; `None` if the file has no tokenizer keys.
    pub fn from_metadata(m: &Metadata) -> Result<Option<Self>, MetadataProblems> {
        use tokenizer_keys as tk;
        if !m.iter().any(|(k, _)| k.starts_with("tokenizer.")) {
            return Ok(None);
        }
        let mut r = Reader {
            m,
            problems: Vec::new(),
        };
        let tokens = r.opt(m.get_str_array(tk::TOKENS)).unwrap_or(&[]);
        let mut token_types = Vec::new();
        match r.opt(m.get_array(tk::TOKEN_TYPE)) {
            Some(Array::I32(types)) => {
                let mut counts = [0usize; TOKEN_TYPE_NAMES.len()];
                let mut other = 0;
                for &t in types {
                    match usize::try_from(t).ok().and_then(|i| counts.get_mut(i)) {
                        Some(c) => *c += 1,
                        None => other += 1,
                    }
                }
                token_types = TOKEN_TYPE_NAMES
                    .iter()
                    .zip(counts)
                    .filter(|(_, c)| *c > 0)
                    .map(|(n, c)| (*n, c))
                    .collect();
                if other > 0 {
                    token_types.push(("invalid", other));
                }
            }
            Some(other) => r.problems.push(MetadataError::WrongType {
                key: tk::TOKEN_TYPE.into(),
                expected: "array[int32]",
                found: format!("array[{}]", other.element_type()),
            }),
            None => {}
        }
        let mut special = Vec::new();
        for (role, key) in [
            ("bos", tk::BOS_ID),
            ("eos", tk::EOS_ID),
            ("eot", tk::EOT_ID),
            ("unk", tk::UNK_ID),
            ("pad", tk::PAD_ID),
        ] {
            if let Some(id) = r.u64(key) {
                let text = usize::try_from(id)
                    .ok()
                    .and_then(|i| tokens.get(i))
                    .cloned();
                special.push(SpecialToken { role, id, text });
            }
        }
        let info = TokenizerInfo {
            model: r.string(tk::MODEL).map(str::to_owned),
            pre: r.string(tk::PRE).map(str::to_owned),
            tokens: tokens.len(),
            merges: r.opt(m.get_array(tk::MERGES)).map_or(0, Array::len),
            has_scores: m.contains(tk::SCORES),
            token_types,
            special,
            add_bos: r.bool(tk::ADD_BOS),
            add_eos: r.bool(tk::ADD_EOS),
            chat_template_len: r.string(tk::CHAT_TEMPLATE).map(str::len),
        };
        if r.problems.is_empty() {
            Ok(Some(info))
        } else {
            Err(MetadataProblems(r.problems))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_missing_key_at_once() {
        let mut m = Metadata::new();
        m.set(keys::ARCHITECTURE, "llama");
        m.set("llama.block_count", "thirty");
        let err = HyperParams::try_from(&m).unwrap_err();
        let text = err.to_string();
        for key in [
            "llama.context_length",
            "llama.embedding_length",
            "llama.attention.head_count",
        ] {
            assert!(text.contains(&format!("'{key}' is missing")), "{text}");
        }
        assert!(
            text.contains("'llama.block_count' has type string"),
            "{text}"
        );
        assert_eq!(err.0.len(), 4, "{text}");
    }

    #[test]
    fn integer_widths_and_defaults() {
        let mut m = Metadata::new();
        m.set(keys::ARCHITECTURE, "qwen2");
        m.set("qwen2.context_length", 32768u64);
        m.set("qwen2.embedding_length", 896u32);
        m.set("qwen2.block_count", 24i32);
        m.set("qwen2.attention.head_count", 14u32);
        m.set(
            "tokenizer.ggml.tokens",
            Array::String(vec!["a".into(), "b".into()]),
        );
        let hp = HyperParams::try_from(&m).unwrap();
        assert_eq!(hp.context_length, 32768);
        assert_eq!(hp.block_count, 24);
        assert_eq!(hp.head_count_kv, 14);
        assert_eq!(hp.head_dim(), 64);
        assert_eq!(hp.vocab_size, Some(2));
    }
}
