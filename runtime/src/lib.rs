//! memwall's runtime: the GGUF container, the ggml type registry and typed
//! model metadata. This crate is what ships to the phone, so its dependencies
//! stay few (`memmap2`, `libc`, `thiserror`).
//!
//! - [`ggml_type`]: every ggml type id and `llama_ftype` value, in one table each.
//! - [`gguf`]: reading GGUF over mmap (zero-copy tensor slices, split models)
//!   and streaming, atomic writing.
//! - [`model_info`]: hyper-parameters and tokenizer summary from metadata.
//! - [`atomic`]: `<out>.partial` → fsync → rename, used by every writer.
//! - [`direct`]: large outputs written around the page cache.
//! - [`blocks`]: ggml block formats and scalar dequantization (the reference).
//! - [`progress`]: the trait through which libraries report long work.
//! - [`forward`]: the forward pass of every architecture memwall converts.
//! - [`eval`]: perplexity and KL divergence, as llama-perplexity computes them.

pub mod atomic;
pub mod blocks;
pub mod direct;
pub mod eval;
pub mod forward;
pub mod ggml_type;
pub mod gguf;
pub mod kernels;
pub mod model_info;
pub mod progress;
pub mod tokenizer;

pub use ggml_type::GgmlType;
