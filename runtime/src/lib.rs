//! memwall's runtime: the GGUF container, the ggml type registry and typed
//! model metadata, the forward pass and its kernels, the tokenizer, and
//! evaluation. This crate is what ships to the phone, so its dependencies stay
//! few (`memmap2`, `libc`, `thiserror`, `rayon`).
//!
//! - [`ggml_type`]: every ggml type id and `llama_ftype` value, in one table each.
//! - [`gguf`]: reading GGUF over mmap (zero-copy tensor slices, split models)
//!   and streaming, atomic writing.
//! - [`model_info`]: hyper-parameters and tokenizer summary from metadata.
//! - [`atomic`]: `<out>.partial` → fsync → rename, used by every writer.
//! - [`cleanup`]: unfinished outputs that signal handlers remove before exiting.
//! - [`direct`]: large outputs written around the page cache.
//! - [`blocks`]: ggml block formats and scalar dequantization (the reference).
//! - [`progress`]: the trait through which libraries report long work.
//! - [`validate`]: NaN/Inf scans of tensor data.
//! - [`sampling`]: greedy and temperature / top-k / top-p / min-p sampling.
//! - [`forward`]: the forward pass of every architecture memwall converts.
//! - [`eval`]: perplexity and KL divergence, as llama-perplexity computes them.
//! - [`kernels`]: activation quantization and dot products (scalar, AVX2,
//!   AVX-512, NEON), and the threaded matrix product.
//! - [`tokenizer`]: byte-level BPE and SentencePiece from GGUF metadata, as
//!   llama.cpp tokenizes.

// Input-derived values never reach `unwrap`/`expect` in the libraries: every
// remaining one states the invariant it relies on (`#[expect(.., reason)]`),
// and tests may unwrap (clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod atomic;
pub mod blocks;
pub mod cleanup;
pub mod direct;
pub mod eval;
pub mod forward;
pub mod ggml_type;
pub mod gguf;
pub mod kernels;
pub mod model_info;
pub mod progress;
pub mod sampling;
pub mod tokenizer;
pub mod validate;

pub use ggml_type::GgmlType;
