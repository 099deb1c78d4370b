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
}
