//! The SIMD kernels, one module per instruction set, and CPU feature probes.
//!
//! Every kernel here is an `unsafe fn` compiled with `#[target_feature]`,
//! wrapped in a safe function that is only reachable through the backend's
//! [`DotTable`], which [`super::Kernels::new`] hands out only after the probe
//! for that backend succeeded. This is the only dispatch: nothing outside
//! these tables asks the CPU what it has, so the backend a [`super::Kernels`]
//! names (`MEMWALL_KERNELS`) is the one that runs, for the dot products and
//! for attention, `exp`, the conversions and the quantizers alike.

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
fn each_row<T>(
    w: &[T],
    rows: usize,
    out: &mut [f32],
    stride: usize,
    tokens: usize,
    mut f: impl FnMut(&[T], &mut [f32]),
) {
    let row_len = (w.len() / rows.max(1)).max(1);
    for (r, w) in w.chunks_exact(row_len).take(rows).enumerate() {
        f(w, &mut out[r * stride..r * stride + tokens]);
    }
}

/// The weights of F16 rows as the several-row F16 kernels take them: `w`
/// (f16 bytes) or, when `WIDE`, `wide` (the same widened to `f32`; the other
/// slice empty).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
#[inline]
fn f16_weights<const WIDE: bool>(w: &[u8], wide: &[f32]) -> usize {
    if WIDE { wide.len() } else { w.len() / 2 }
}

/// Rows `rows` (of `cols` weights each) of F16 rows given as for
/// [`f16_weights`]: the same pair of slices, narrowed.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
#[inline]
fn f16_row_span<'a, const WIDE: bool>(
    w: &'a [u8],
    wide: &'a [f32],
    cols: usize,
    rows: std::ops::Range<usize>,
) -> (&'a [u8], &'a [f32]) {
    if WIDE {
        (&w[..0], &wide[cols * rows.start..cols * rows.end])
    } else {
        (&w[2 * cols * rows.start..2 * cols * rows.end], &wide[..0])
    }
}

/// The scalar table's transpose (see [`super::Kernels::transpose`]).
pub(crate) fn transpose_scalar(
    src: &[f32],
    stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
) {
    transpose_edges(src, stride, rows, cols, dst, 0, 0);
}

/// A transpose of the values outside the first `rows8` rows × `cols8`
/// columns (the part the SIMD versions do in 8 × 8 blocks).
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

/// AVX2 with FMA and F16C (probed once).
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static PROBE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *PROBE.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX-512 F, BW, VL and VNNI, on top of [`has_avx2`] (probed once).
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static PROBE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *PROBE.get_or_init(|| {
            has_avx2()
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Advanced SIMD (always present on aarch64).
pub(crate) fn has_neon() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("neon")
    }
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// Advanced SIMD with the dot-product extension.
pub(crate) fn has_neon_dot() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        has_neon() && std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// Whether this is one of AMD's (or Hygon's) Zen cores, whose tables differ
/// from Intel's in two measured ways (docs/BENCHMARKS.md): f16 → f32
/// conversions (`vcvtph2ps`) run beside the multiply-adds rather than on
/// their ports, so they are free inside a multiply-add loop (a decoded
/// token's F16 rows meet its f16 activations converted there too); and
/// software prefetches slow those rows, which the hardware prefetchers
/// stream faster alone.
#[cfg(target_arch = "x86_64")]
fn amd_cores() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(|| {
        let id = std::arch::x86_64::__cpuid(0);
        let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat();
        matches!(&vendor[..], b"AuthenticAMD" | b"HygonGenuine")
    })
}

/// The table of a SIMD backend; `None` for one not compiled for this target.
/// The caller has checked that the CPU supports it.
pub(crate) fn table(backend: Backend) -> Option<&'static DotTable> {
    match backend {
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 if amd_cores() => Some(&avx2::TABLE_AMD),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => Some(&avx2::TABLE),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 if amd_cores() => Some(&avx512::TABLE_AMD),
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => Some(&avx512::TABLE),
        #[cfg(target_arch = "aarch64")]
        Backend::Neon => Some(&neon::TABLE),
        #[cfg(target_arch = "aarch64")]
        Backend::NeonDot => Some(&neon::TABLE_DOT),
        _ => None,
    }
}

/// Values in `[-1, 1)` from a xorshift of `seed`, for the x86 backends'
/// tests.
#[cfg(all(test, target_arch = "x86_64"))]
fn test_values(mut seed: u64) -> impl FnMut() -> f32 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
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
                for k in crate::kernels::Backend::supported()
                    .into_iter()
                    .map(|b| crate::kernels::Kernels::new(b).unwrap())
                {
                    let mut dst = vec![f32::NAN; rows * cols + 2];
                    k.transpose(&src, stride, rows, cols, &mut dst);
                    for r in 0..rows {
                        for c in 0..cols {
                            assert_eq!(
                                dst[c * rows + r],
                                src[r * stride + c],
                                "{:?}: {rows}×{cols} at {r},{c}",
                                k.backend()
                            );
                        }
                    }
                    // Nothing written past the block.
                    assert!(dst[rows * cols..].iter().all(|v| v.is_nan()));
                }
            }
        }
    }
}
