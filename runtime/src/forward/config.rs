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
    /// The sliding-window layers' window and rotation (Gemma 4).
    pub swa: Option<Swa>,
    /// Factor on the attention scores (default `1/√head_dim`; Gemma 4's
    /// normalised queries and keys take 1).
    pub attn_scale: Option<f32>,
    /// Factor on the token embeddings (Gemma: `√n_embd`).
    pub embd_scale: Option<f32>,
    /// `c·tanh(logit/c)` on the final logits (Gemma 4: 30).
    pub final_softcap: Option<f32>,
    /// The gated feed-forward activation.
    pub act: Act,
}

/// The attention heads of a layer (Gemma 4's global layers have wider heads,
/// and fewer of them for keys and values, than its sliding-window layers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (`n_head` is a multiple).
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl Heads {
    /// Width of the queries.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the keys, and of the values.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}

/// The sliding-window attention of some layers: each token sees itself and
/// the `window − 1` tokens before it, rotated with a rotation of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct Swa {
    /// Tokens a query sees.
    pub window: usize,
    /// The rotation of the sliding-window layers.
    pub rope: Rope,
    /// Keep every position in their caches (llama.cpp's `--swa-full`)
    /// instead of a ring of the window and one micro-batch: memory grows
    /// with the context, and a session can step back anywhere.
    pub full_cache: bool,
}

/// The activation of a gated feed-forward part: `act(gate) ⊙ up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU), through ggml's `f16` table as
    /// llama.cpp's CPU backend computes it (exact in exact mode).
    GeluTanh,
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
