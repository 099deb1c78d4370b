//! memwall's execution runtime: the forward pass and its kernels, the
//! tokenizer, sampling and evaluation, and memory residency. It reads models
//! through `memwall-format` (the GGUF container, type registry and block
//! layouts). This crate is what ships to the phone, so its dependencies stay
//! few (`memwall-format`, `libc`, `thiserror`).
//!
//! - [`forward`]: the forward pass of every architecture memwall converts.
//! - [`kernels`]: activation quantization and dot products (scalar, AVX2,
//!   AVX-512, NEON), and the threaded matrix product.
//! - [`tokenizer`]: byte-level BPE and SentencePiece from GGUF metadata, as
//!   llama.cpp tokenizes.
//! - [`generate`]: text generation with prefix reuse and stop strings.
//! - [`sampling`]: greedy and temperature / top-k / top-p / min-p sampling.
//! - [`eval`]: perplexity and KL divergence, as llama-perplexity computes them.
//! - [`residency`]: available memory, pinning a model's pages in RAM, bytes
//!   read from storage.

// Input-derived values never reach `unwrap`/`expect` in the libraries: every
// remaining one states the invariant it relies on (`#[expect(.., reason)]`),
// and tests may unwrap (clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod eval;
pub mod forward;
pub mod generate;
pub mod kernels;
pub mod residency;
pub mod sampling;
pub mod tokenizer;
