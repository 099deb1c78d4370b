//! The SIMD kernels, one module per instruction set, and CPU feature probes.
//!
//! Every kernel here is an `unsafe fn` compiled with `#[target_feature]`,
//! wrapped in a safe function that is only reachable through the backend's
//! [`DotTable`], which [`super::Kernels::new`] hands out only after the probe
//! for that backend succeeded.

use super::{Backend, DotTable};

#[cfg(target_arch = "x86_64")]
mod avx2;
// AVX-512 intrinsics are stable since 1.89 (the workspace declares 1.85).
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

/// `f(row, out)` for each of the `rows` whole weight rows in `w`, with that
/// row's outputs `out[r·stride..r·stride + tokens]` (a several-row product of
/// one weight row at a time).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
fn each_row(
    w: &[u8],
    rows: usize,
    out: &mut [f32],
    stride: usize,
    tokens: usize,
    mut f: impl FnMut(&[u8], &mut [f32]),
) {
    let row_bytes = (w.len() / rows.max(1)).max(1);
    for (r, w) in w.chunks_exact(row_bytes).take(rows).enumerate() {
        f(w, &mut out[r * stride..r * stride + tokens]);
    }
}

/// `dst[c·rows + r] = src[r·stride + c]` for `r < rows`, `c < cols`: a
/// `rows × cols` block of a matrix with rows `stride` apart, transposed into
/// `dst` (8 × 8 blocks in registers with AVX2). Panics if a slice is short.
pub(crate) fn transpose(src: &[f32], stride: usize, rows: usize, cols: usize, dst: &mut [f32]) {
    assert!(
        rows == 0
            || cols == 0
            || (src.len() >= (rows - 1) * stride + cols && dst.len() >= rows * cols),
        "transpose lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was probed just above.
        return unsafe { avx2::transpose(src, stride, rows, cols, dst) };
    }
    transpose_edges(src, stride, rows, cols, dst, 0, 0);
}

/// [`transpose`] of the values outside the first `rows8` rows × `cols8`
/// columns (the part done in 8 × 8 blocks).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn transpose_edges(
    src: &[f32],
    stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    rows8: usize,
    cols8: usize,
) {
    for r in 0..rows {
        let from = if r < rows8 { cols8 } else { 0 };
        for c in from..cols {
            dst[c * rows + r] = src[r * stride + c];
        }
    }
}

/// Whether `MEMWALL_KERNELS` names a backend below `level` (0 scalar, 1
/// AVX2 or NEON, 2 AVX-512 or NEON with `sdot`): then the probes report
/// no more than that backend's features, so attention, `exp` and the
/// activation quantizers run as on a CPU that has only those, and
/// `MEMWALL_KERNELS=avx2` on an AVX-512 machine measures an AVX2-only CPU
/// (every path gives the same bits; only speed changes). A name that is no
/// backend caps nothing ([`super::Kernels::from_env`] refuses it).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
fn capped_below(level: u8) -> bool {
    static CAP: std::sync::OnceLock<Option<u8>> = std::sync::OnceLock::new();
    let cap = CAP.get_or_init(|| {
        let name = std::env::var("MEMWALL_KERNELS").ok()?;
        Some(match Backend::parse(&name).ok()? {
            Backend::Scalar => 0,
            Backend::Avx2 | Backend::Neon => 1,
            Backend::Avx512 | Backend::NeonDot => 2,
        })
    });
    cap.is_some_and(|cap| cap < level)
}

/// AVX2 with FMA and F16C (probed once; attention and `exp` ask per call),
/// unless `MEMWALL_KERNELS=scalar` ([`capped_below`]).
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static PROBE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *PROBE.get_or_init(|| {
            !capped_below(1)
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX-512 F, BW, VL and VNNI, on top of [`has_avx2`] (probed once),
/// unless `MEMWALL_KERNELS` names a narrower backend.
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static PROBE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *PROBE.get_or_init(|| {
            has_avx2()
                && !capped_below(2)
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Advanced SIMD (always present on aarch64), unless
/// `MEMWALL_KERNELS=scalar`.
pub(crate) fn has_neon() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        !capped_below(1) && std::arch::is_aarch64_feature_detected!("neon")
    }
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// Advanced SIMD with the dot-product extension.
pub(crate) fn has_neon_dot() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        has_neon() && !capped_below(2) && std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// The table of a SIMD backend; `None` for one not compiled for this target.
/// The caller has checked that the CPU supports it.
pub(crate) fn table(backend: Backend) -> Option<&'static DotTable> {
    match backend {
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => Some(&avx2::TABLE),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => Some(&avx512::TABLE),
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => Some(&neon::TABLE),
        #[cfg(target_arch = "aarch64")]
        Backend::NeonDot => Some(&neon::TABLE_DOT),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_moves_every_value_of_a_strided_block() {
        for rows in [0, 1, 7, 8, 9, 16, 23, 64] {
            for cols in [0, 1, 5, 8, 13, 16, 17] {
                let stride = cols + 3;
                let src: Vec<f32> = (0..rows * stride).map(|i| i as f32).collect();
                let mut dst = vec![f32::NAN; rows * cols + 2];
                super::transpose(&src, stride, rows, cols, &mut dst);
                for r in 0..rows {
                    for c in 0..cols {
                        assert_eq!(
                            dst[c * rows + r],
                            src[r * stride + c],
                            "{rows}×{cols} at {r},{c}"
                        );
                    }
                }
                // Nothing written past the block.
                assert!(dst[rows * cols..].iter().all(|v| v.is_nan()));
            }
        }
    }
}
