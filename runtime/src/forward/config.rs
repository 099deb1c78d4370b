//! The hyper-parameters the forward pass runs with (the architectures and
//! what differs between them are data of `memwall_format::arch`).

use super::*;
use memwall_format::arch::Arch;

/// The hyper-parameters the forward pass uses.
#[derive(Clone, Debug)]
pub struct Config {
    /// Architecture.
    pub arch: Arch,
    /// Hidden size.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Head size.
    pub head_dim: usize,
    /// Rotary embedding.
    pub rope: Rope,
    /// Norm epsilon (RMSNorm or LayerNorm, by architecture).
    pub eps: f32,
    /// Vocabulary size (rows of the output matrix).
    pub n_vocab: usize,
    /// Context length the session allows.
    pub n_ctx: usize,
    /// Experts per MoE layer (0: dense).
    pub n_expert: usize,
    /// Experts used per token.
    pub n_expert_used: usize,
    /// Factor on the routing weights (`expert_weights_scale`; 0 and 1 leave them).
    pub expert_weights_scale: f32,
    /// Factor on the logits (`logit_scale`, Command-R; else 1).
    pub logit_scale: f32,
    /// What the KV cache stores (set before opening sessions).
    pub kv_type: KvType,
    /// The gated delta-net layers' dimensions (hybrid architectures).
    pub linear: Option<Linear>,
}

/// The dimensions of a gated delta-net layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linear {
    /// Taps of the causal convolution.
    pub conv_kernel: usize,
    /// Key (and query) heads.
    pub n_k_heads: usize,
    /// Size of a key head.
    pub head_k_dim: usize,
    /// Value heads (a multiple of the key heads).
    pub n_v_heads: usize,
    /// Size of a value head.
    pub head_v_dim: usize,
}

impl Linear {
    /// Width of the queries and of the keys.
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_k_dim
    }

    /// Width of the values.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_v_dim
    }

    /// Channels of the convolution: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// `f32` values of one sequence's state of one layer: the last
    /// `conv_kernel - 1` convolution inputs and every value head's
    /// `head_k_dim × head_v_dim` matrix.
    pub fn state_values(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
            + self.n_v_heads * self.head_k_dim * self.head_v_dim
    }
}
