//! Hugging Face checkpoints to GGUF, tensor for tensor as llama.cpp's
//! `convert_hf_to_gguf.py` writes them.
//!
//! This first part reads checkpoints ([`checkpoint`]: safetensors, sharded or
//! not, validated), maps architectures as data ([`arch`]) and produces every
//! output tensor's name, shape, type and bytes ([`tensors`]) and the
//! hyper-parameter keys ([`metadata`]). The naming keys, tokenizer export and
//! the `memwall convert` command build on it.

// Input-derived values never reach `unwrap`/`expect` in the libraries: every
// remaining one states the invariant it relies on (`#[expect(.., reason)]`),
// and tests may unwrap (clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod arch;
pub mod checkpoint;
pub mod export;
pub mod hf_config;
pub mod hub;
pub mod job;
pub mod metadata;
pub mod model_card;
pub mod naming;
pub mod sentencepiece;
pub mod tensors;
pub mod validate;
pub mod vocab;
