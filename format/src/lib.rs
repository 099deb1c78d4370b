//! memwall's file-format layer: the ggml type registry, the block layouts and
//! their scalar decoders, the GGUF container (reader over mmap, split models,
//! streaming atomic writer), typed model metadata, and the output safety every
//! writer shares (atomic files, direct I/O, cleanup on signals, progress).
//!
//! Everything that reads or writes a model file needs this crate and nothing
//! more; the execution runtime (`memwall-runtime`: kernels, forward pass,
//! tokenizer, evaluation) builds on it.
//!
//! - [`ggml_type`]: every ggml type id and `llama_ftype` value, in one table each.
//! - [`arch`]: the architectures, their differences and their tensor tables.
//! - [`gguf`]: reading GGUF over mmap (zero-copy tensor slices, split models)
//!   and streaming, atomic writing.
//! - [`model_info`]: hyper-parameters and tokenizer summary from metadata.
//! - [`blocks`]: ggml block formats and scalar dequantization (the reference).
//! - [`validate`]: NaN/Inf scans of tensor data.
//! - [`atomic`]: `<out>.partial` → fsync → rename, used by every writer.
//! - [`direct`]: large outputs written around the page cache.
//! - [`cleanup`]: unfinished outputs that signal handlers remove before exiting.
//! - [`progress`]: the trait through which libraries report long work.
//! - [`kv_override`]: `KEY=TYPE:VALUE` metadata overrides (llama.cpp's `--override-kv`).
//! - [`suggest`]: "did you mean …?" for names users type.

// Input-derived values never reach `unwrap`/`expect` in the libraries: every
// remaining one states the invariant it relies on (`#[expect(.., reason)]`),
// and tests may unwrap (clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod arch;
pub mod atomic;
pub mod blocks;
pub mod cleanup;
pub mod direct;
pub mod ggml_type;
pub mod gguf;
pub mod kv_override;
pub mod model_info;
pub mod progress;
pub mod suggest;
pub mod validate;

pub use ggml_type::GgmlType;
