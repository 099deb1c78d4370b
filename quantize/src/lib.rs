//! memwall's quantizer: block encoders that produce the same bytes as ggml's
//! reference quantizers (`quantize_row_*_ref`), llama.cpp's quantization
//! mixes ([`rules`]), importance matrices ([`imatrix`]), memwall's
//! mixed-precision recipes ([`recipe`]) and the whole-model driver ([`job`]).
//!
//! Implemented so far: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS; with an importance matrix, all of
//! them (F32, F16, BF16 and Q8_0 ignore it, as ggml does).
//!
//! ```
//! use memwall_quantize::quantize_row;
//! use memwall_format::{GgmlType, blocks::dequantize_row};
//!
//! let x: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
//! let mut q = vec![0u8; 2 * 34];
//! quantize_row(GgmlType::Q8_0, &x, &mut q)?;
//! let mut y = vec![0f32; 64];
//! dequantize_row(GgmlType::Q8_0, &q, &mut y)?;
//! assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 0.02));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Input-derived values never reach `unwrap`/`expect` in the libraries: every
// remaining one states the invariant it relies on (`#[expect(.., reason)]`),
// and tests may unwrap (clippy.toml).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod budget;
pub mod fit;
pub mod imatrix;
mod iq1;
mod iq4;
pub mod job;
mod kquants;
mod lanes;
mod lattice;
mod legacy;
mod lowbit;
pub mod names;
pub mod recipe;
pub mod rules;
mod weights;

use memwall_format::GgmlType;
use memwall_format::blocks::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockQ2K, BlockQ3K,
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0,
    BlockTq1_0, BlockTq2_0, as_blocks_mut, f32_to_bf16, f32_to_f16,
};

/// Why a row could not be quantized.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantizeError {
    /// memwall has no encoder for the type yet.
    #[error("quantization to {0} is not supported yet")]
    Unsupported(GgmlType),
    /// The type cannot be encoded without an importance matrix (ggml asserts).
    #[error(
        "{0} needs an importance matrix: make one with `memwall calibrate imatrix` (or llama-imatrix) and pass it with --imatrix"
    )]
    ImatrixRequired(GgmlType),
    /// The importance matrix does not have one value per weight of the row.
    #[error("importance matrix has {got} values for a row of {want} weights")]
    ImatrixLength {
        /// Values given.
        got: usize,
        /// Weights in the row.
        want: usize,
    },
    /// The input is not a whole number of blocks, or the output does not fit it.
    #[error("{ty}: {src} weights do not fill {dst} bytes of blocks")]
    Length {
        /// Target type.
        ty: GgmlType,
        /// Input weights.
        src: usize,
        /// Output bytes.
        dst: usize,
    },
}

/// Types [`quantize_row`] encodes: every type the runtime decodes.
pub const ENCODABLE: [GgmlType; memwall_format::blocks::DEQUANTIZABLE.len()] =
    memwall_format::blocks::DEQUANTIZABLE;

/// Encodes `src` as blocks of `ty` into `dst`, byte for byte as ggml's
/// reference quantizer does.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantizeError> {
    quantize_row_imatrix(ty, src, dst, None)
}

/// Types whose encoding [`quantize_row_imatrix`] weights by an importance
/// matrix; Q8_0 and the float types accept one and ignore it, as ggml does.
pub const IMATRIX_ENCODABLE: [GgmlType; 18] = [
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// Types ggml cannot encode without an importance matrix (its encoders
/// assert one). llama.cpp's file-level rule is wider: see
/// [`rules::requires_imatrix`].
pub const IMATRIX_REQUIRED: [GgmlType; 3] = [GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ1_S];

/// Like [`quantize_row`], optionally weighted by an importance matrix: one
/// value per weight of the row (the mean of the squared activations that
/// column sees, as `llama-quantize` derives it from an imatrix file). The
/// output is byte for byte what `llama-quantize --imatrix` writes.
pub fn quantize_row_imatrix(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
) -> Result<(), QuantizeError> {
    check(ty, src, src.len(), dst, imatrix)?;
    encode(ty, src, src.len(), dst, imatrix);
    Ok(())
}

/// [`quantize_row_imatrix`] of each `row_len` values of `src` (a whole
/// number of blocks) into the next `row_len / block size` blocks of `dst`,
/// every row weighted by the same `imatrix` (`row_len` values). The same
/// bytes as row by row; the legacy 32-weight types fit the blocks of all the
/// rows side by side (GPTQ encodes one block of many rows at a time).
pub fn quantize_rows_imatrix(
    ty: GgmlType,
    src: &[f32],
    row_len: usize,
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
) -> Result<(), QuantizeError> {
    let bs = ty.block_size() as usize;
    if row_len == 0 || row_len % bs != 0 || src.len() % row_len != 0 {
        return Err(QuantizeError::Length {
            ty,
            src: src.len(),
            dst: dst.len(),
        });
    }
    check(ty, src, row_len, dst, imatrix)?;
    encode(ty, src, row_len, dst, imatrix);
    Ok(())
}

/// The checks [`quantize_row_imatrix`] and [`quantize_rows_imatrix`] share:
/// an importance matrix of one value per column of a row (`row_len`), the
/// type, an importance matrix where the type needs one, the lengths.
fn check(
    ty: GgmlType,
    src: &[f32],
    row_len: usize,
    dst: &[u8],
    imatrix: Option<&[f32]>,
) -> Result<(), QuantizeError> {
    if let Some(qw) = imatrix {
        if qw.len() != row_len {
            return Err(QuantizeError::ImatrixLength {
                got: qw.len(),
                want: row_len,
            });
        }
    }
    if !ENCODABLE.contains(&ty) {
        return Err(QuantizeError::Unsupported(ty));
    }
    if imatrix.is_none() && IMATRIX_REQUIRED.contains(&ty) {
        return Err(QuantizeError::ImatrixRequired(ty));
    }
    let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
    if src.len() % bs != 0 || dst.len() != src.len() / bs * ts {
        return Err(QuantizeError::Length {
            ty,
            src: src.len(),
            dst: dst.len(),
        });
    }
    Ok(())
}

static PORTABLE_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Use only the portable build of the encoders, even where the CPU offers
/// wider vectors (for tests: both builds must give the same bytes).
pub fn force_portable(yes: bool) {
    PORTABLE_ONLY.store(yes, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the encoders may use AVX2 (the CPU has it and no test asked for
/// the portable build).
#[cfg(target_arch = "x86_64")]
pub(crate) fn wide_vectors() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && !PORTABLE_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Encodes validated arguments, with the encoders compiled for AVX2 when the
/// CPU has it. The arithmetic is the same in both builds (Rust never fuses or
/// reorders float operations); wider vectors only run more groups at once.
fn encode(ty: GgmlType, src: &[f32], row_len: usize, dst: &mut [u8], imatrix: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if wide_vectors() {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { encode_avx2(ty, src, row_len, dst, imatrix) };
        return;
    }
    encode_portable(ty, src, row_len, dst, imatrix);
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn encode_avx2(
    ty: GgmlType,
    src: &[f32],
    row_len: usize,
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
) {
    encode_portable(ty, src, row_len, dst, imatrix);
}

/// Encodes the rows of `row_len` values of `src` (validated arguments).
#[inline(always)]
fn encode_portable(
    ty: GgmlType,
    src: &[f32],
    row_len: usize,
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
) {
    match ty {
        GgmlType::F32 => {
            for (x, y) in src.iter().zip(dst.chunks_exact_mut(4)) {
                y.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (&x, y) in src.iter().zip(dst.chunks_exact_mut(2)) {
                y.copy_from_slice(&f32_to_f16(x).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (&x, y) in src.iter().zip(dst.chunks_exact_mut(2)) {
                y.copy_from_slice(&f32_to_bf16(x).to_le_bytes());
            }
        }
        _ => memwall_format::with_block!(ty, B => {
            B::encode_rows(src, row_len, as_blocks_mut::<B>(dst), imatrix)
        }, _ => unreachable!("checked against ENCODABLE")),
    }
}

/// A block type's encoder: ggml's `quantize_row_*_ref` (and, with importance
/// weights, `quantize_row_*_impl`) for one block. Giving a block type an
/// encoder is this impl.
trait Encode: Block {
    /// Whether an importance matrix weights this type's fits as
    /// `qw · √(σ² + x²)` with σ² the row's mean square (the legacy 32-weight
    /// types) rather than by its values directly.
    const ROW_WEIGHTS: bool = false;

    /// Encodes [`Block::WEIGHTS`] values `x` into `y`, weighted by `w` (the
    /// block's importance weights) when given.
    fn encode(x: &[f32], w: Option<&[f32]>, y: &mut Self);

    /// Encodes the rows of `row_len` values of `src`, each weighted by
    /// `imatrix` (`row_len` values) when given.
    #[inline(always)]
    fn encode_rows(src: &[f32], row_len: usize, dst: &mut [Self], imatrix: Option<&[f32]>) {
        let blocks = row_len / Self::WEIGHTS;
        match imatrix {
            // Each row's own weights; then all the blocks at once.
            Some(qw) if Self::ROW_WEIGHTS => {
                let mut w = Vec::with_capacity(src.len());
                for row in src.chunks_exact(row_len) {
                    let sigma2 = weights::sum_squares(row) / row_len as f32;
                    w.extend(weights::importance(row, qw, sigma2));
                }
                Self::encode_weighted(src, &w, dst);
            }
            Some(qw) => {
                for (row, y) in src.chunks_exact(row_len).zip(dst.chunks_exact_mut(blocks)) {
                    Self::encode_weighted(row, qw, y);
                }
            }
            None => {
                for (x, y) in src.chunks_exact(Self::WEIGHTS).zip(dst) {
                    Self::encode(x, None, y);
                }
            }
        }
    }

    /// Encodes a row's blocks weighted by `w` (one weight per value), block
    /// by block unless the type fits several blocks side by side.
    #[inline(always)]
    fn encode_weighted(src: &[f32], w: &[f32], dst: &mut [Self]) {
        let n = Self::WEIGHTS;
        for ((x, w), y) in src.chunks_exact(n).zip(w.chunks_exact(n)).zip(dst) {
            Self::encode(x, Some(w), y);
        }
    }
}

/// `impl Encode` for a legacy type: its plain encoder, and its weighted one
/// for a block and for a row (eight fits side by side).
macro_rules! legacy {
    ($b:ident, $plain:path, $weighted:path, $weighted_row:path) => {
        impl Encode for $b {
            const ROW_WEIGHTS: bool = true;
            #[inline(always)]
            fn encode(x: &[f32], w: Option<&[f32]>, y: &mut Self) {
                match w {
                    Some(w) => $weighted(x, y, w),
                    None => $plain(x, y),
                }
            }
            #[inline(always)]
            fn encode_weighted(src: &[f32], w: &[f32], dst: &mut [Self]) {
                $weighted_row(src, w, dst)
            }
        }
    };
}

legacy!(
    BlockQ4_0,
    legacy::q4_0,
    legacy::q4_0_weighted,
    legacy::q4_0_weighted_row
);
legacy!(
    BlockQ4_1,
    legacy::q4_1,
    legacy::q4_1_weighted,
    legacy::q4_1_weighted_row
);
legacy!(
    BlockQ5_0,
    legacy::q5_0,
    legacy::q5_0_weighted,
    legacy::q5_0_weighted_row
);
legacy!(
    BlockQ5_1,
    legacy::q5_1,
    legacy::q5_1_weighted,
    legacy::q5_1_weighted_row
);

/// `impl Encode` for a type whose encoder takes the block's importance weights.
macro_rules! weighted {
    ($($b:ident: $encode:path),*) => {$(
        impl Encode for $b {
            #[inline(always)]
            fn encode(x: &[f32], w: Option<&[f32]>, y: &mut Self) {
                $encode(x, y, w)
            }
        }
    )*};
}

weighted!(
    BlockQ2K: kquants::q2_k,
    BlockQ3K: kquants::q3_k,
    BlockQ4K: kquants::q4_k,
    BlockQ5K: kquants::q5_k,
    BlockQ6K: kquants::q6_k,
    BlockIq4Xs: iq4::iq4_xs,
    BlockIq2S: lattice::iq2_s,
    BlockIq3Xxs: lattice::iq3_xxs,
    BlockIq3S: lattice::iq3_s,
    BlockIq1M: iq1::iq1_m
);

/// `impl Encode` for a type that needs importance weights
/// ([`IMATRIX_REQUIRED`]; [`quantize_row_imatrix`] refuses it without).
macro_rules! needs_weights {
    ($($b:ident: $encode:path),*) => {$(
        impl Encode for $b {
            #[inline(always)]
            fn encode(x: &[f32], w: Option<&[f32]>, y: &mut Self) {
                if let Some(w) = w {
                    $encode(x, y, w)
                }
            }
        }
    )*};
}

needs_weights!(
    BlockIq2Xxs: lattice::iq2_xxs,
    BlockIq2Xs: lattice::iq2_xs,
    BlockIq1S: iq1::iq1_s
);

/// `impl Encode` for a type whose encoder ignores importance weights, as ggml's does.
macro_rules! unweighted {
    ($($b:ident: $encode:path),*) => {$(
        impl Encode for $b {
            #[inline(always)]
            fn encode(x: &[f32], _: Option<&[f32]>, y: &mut Self) {
                $encode(x, y)
            }
        }
    )*};
}

unweighted!(
    BlockQ8_0: legacy::q8_0,
    BlockTq1_0: lowbit::tq1_0,
    BlockTq2_0: lowbit::tq2_0,
    BlockMxfp4: lowbit::mxfp4,
    BlockNvfp4: lowbit::nvfp4,
    BlockQ1_0: lowbit::q1_0,
    BlockQ2_0: lowbit::q2_0
);

impl Encode for BlockIq4Nl {
    #[inline(always)]
    fn encode(x: &[f32], w: Option<&[f32]>, y: &mut Self) {
        iq4::iq4_nl_row(x, std::slice::from_mut(y), w)
    }

    /// Whole rows: eight blocks' scale searches side by side.
    #[inline(always)]
    fn encode_rows(src: &[f32], row_len: usize, dst: &mut [Self], imatrix: Option<&[f32]>) {
        let blocks = row_len / Self::WEIGHTS;
        for (row, y) in src.chunks_exact(row_len).zip(dst.chunks_exact_mut(blocks)) {
            iq4::iq4_nl_row(row, y, imatrix);
        }
    }
}
