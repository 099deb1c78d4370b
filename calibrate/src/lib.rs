//! Calibration: what a model's activations look like on text close to its
//! real use, and quantization that takes it into account while still writing
//! the ordinary GGUF block formats stock llama.cpp runs.
//!
//! - [`imatrix`]: per-column sums of squared activations of every matrix
//!   product (per expert for MoE), as `llama-imatrix` collects them, written
//!   in its GGUF format or the legacy `.dat` format.
//! - [`dataset`]: calibration sets built from text, JSON/JSONL/Parquet QA
//!   data and chats, mixed, chunked, deduplicated and tokenized.
//! - [`awq`], [`gptq`]: activation-aware scales and error-feedback rounding
//!   onto ggml's block grids; [`quantize`] runs them layer by layer into an
//!   ordinary GGUF.
//! - [`fit`], [`influence`]: a type per matrix that fits a byte budget, from
//!   each matrix's measured error and how much it moves the residual stream.
//! - [`grid`]: the quantization grid of an encoded ggml block, which GPTQ
//!   rounds onto.

// Input-derived values never reach `unwrap`/`expect` in the libraries: every
// remaining one states the invariant it relies on (`#[expect(.., reason)]`),
// and tests may unwrap (clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod awq;
pub mod dataset;
pub mod fit;
pub mod gptq;
pub mod grid;
pub mod imatrix;
pub mod influence;
pub mod lattice;
pub mod linalg;
pub mod quantize;
mod work;
pub use work::{finished_layers, interrupted_recipe};

/// Deterministic pseudo-random values for the unit tests.
#[cfg(test)]
pub(crate) fn test_values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Why calibration failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// The model could not be run.
    #[error(transparent)]
    Forward(#[from] memwall_runtime::forward::ForwardError),
    /// Evaluating the text failed.
    #[error(transparent)]
    Eval(#[from] memwall_runtime::eval::EvalError),
    /// Writing an output failed.
    #[error(transparent)]
    Gguf(#[from] memwall_format::gguf::GgufError),
    /// A file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// Activations became NaN or infinite.
    #[error(
        "non-finite activations entering {tensor}: the model's weights or the text make it overflow (check the model with `memwall validate`)"
    )]
    NonFinite {
        /// The tensor whose input was not finite.
        tensor: String,
    },
    /// An importance matrix that cannot be read back.
    #[error(transparent)]
    Imatrix(#[from] memwall_quantize::imatrix::ImatrixFormatError),
    /// Input that cannot be used, with the reason.
    #[error("{0}")]
    Input(String),
    /// The estimated peak memory is more than the limit.
    #[error(
        "calibration needs about {:.1} GiB at its peak (hidden states {:.1}, a layer's weights {:.1}, Hessians {:.1}, GPTQ's factor or AWQ's copy of a Hessian {:.1} GiB), more than the {:.1} GiB available; use fewer --samples or a shorter --seq-len (the hidden states scale with them), or pass --memory-limit to allow more",
        gib(need.total), gib(need.hidden), gib(need.weights), gib(need.hessians), gib(need.factor), gib(*limit)
    )]
    Memory {
        /// The estimate.
        need: quantize::Memory,
        /// The limit.
        limit: u64,
    },
}
