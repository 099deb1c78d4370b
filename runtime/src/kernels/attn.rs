//! The float loops of attention over a batch, vectorised across keys (scores)
//! and across dimensions (weighted values). Every lane does the same scalar
//! operations in the same order as the one-query code path, so these give
//! the same bits at any vector width; the AVX2 versions are the same code
//! compiled for 256-bit vectors.

#[cfg(target_arch = "x86_64")]
use super::{arch::has_avx512, has_avx2};

/// Keys scored together: one independent sequential sum per key.
pub(crate) const KEY_TILE: usize = 32;

/// `out[l] = Σ_d q[d] · kt[d·stride + l]` for the [`KEY_TILE`] keys `l`, each
/// summed in increasing `d` from `-0.0` (as `Iterator::sum`), with separate
/// multiplies and adds. `kt` holds the keys transposed (`q.len()` dims of
/// `stride` positions, starting at the first key of the tile).
pub(crate) fn key_tile(q: &[f32], kt: &[f32], stride: usize) -> [f32; KEY_TILE] {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512 was probed just above.
        return unsafe { key_tile_avx512(q, kt, stride) };
    } else if has_avx2() {
        // SAFETY: AVX2 was probed just above.
        return unsafe { key_tile_avx2(q, kt, stride) };
    }
    key_tile_generic(q, kt, stride)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn key_tile_avx2(q: &[f32], kt: &[f32], stride: usize) -> [f32; KEY_TILE] {
    key_tile_generic(q, kt, stride)
}

#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx512f")]
fn key_tile_avx512(q: &[f32], kt: &[f32], stride: usize) -> [f32; KEY_TILE] {
    key_tile_generic(q, kt, stride)
}

#[inline(always)]
fn key_tile_generic(q: &[f32], kt: &[f32], stride: usize) -> [f32; KEY_TILE] {
    let mut acc = [-0.0f32; KEY_TILE];
    for (d, &qd) in q.iter().enumerate() {
        let keys = &kt[d * stride..][..KEY_TILE];
        for (a, &k) in acc.iter_mut().zip(keys) {
            *a += qd * k;
        }
    }
    acc
}

/// `out[i] = out[i] + p · x[i]` for every `i`.
pub(crate) fn axpy(out: &mut [f32], p: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was probed just above.
        return unsafe { axpy_avx2(out, p, x) };
    }
    axpy_generic(out, p, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn axpy_avx2(out: &mut [f32], p: f32, x: &[f32]) {
    axpy_generic(out, p, x)
}

#[inline(always)]
fn axpy_generic(out: &mut [f32], p: f32, x: &[f32]) {
    for (o, x) in out.iter_mut().zip(x) {
        *o += p * x;
    }
}

/// For each score `s` and row of `out.len()` values of `v` in turn,
/// `out ← out + (s / sum) · row`: [`axpy`] per position, in one call.
pub(crate) fn weighted_rows(out: &mut [f32], scores: &[f32], sum: f32, v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512 was probed just above.
        return unsafe { weighted_rows_avx512(out, scores, sum, v) };
    } else if has_avx2() {
        // SAFETY: AVX2 was probed just above.
        return unsafe { weighted_rows_avx2(out, scores, sum, v) };
    }
    weighted_rows_generic(out, scores, sum, v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn weighted_rows_avx2(out: &mut [f32], scores: &[f32], sum: f32, v: &[f32]) {
    weighted_rows_generic(out, scores, sum, v)
}

#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx512f")]
fn weighted_rows_avx512(out: &mut [f32], scores: &[f32], sum: f32, v: &[f32]) {
    weighted_rows_generic(out, scores, sum, v)
}

#[inline(always)]
fn weighted_rows_generic(out: &mut [f32], scores: &[f32], sum: f32, v: &[f32]) {
    let hd = out.len();
    if hd == 0 {
        return;
    }
    // Sixty-four dimensions at a time in a fixed-size accumulator, which the
    // compiler keeps in registers over all positions (each element still
    // sums the positions in order).
    let mut c = 0;
    for oc in out.chunks_mut(64) {
        if let Ok(oc) = <&mut [f32; 64]>::try_from(&mut *oc) {
            let mut acc = *oc;
            for (s, row) in scores.iter().zip(v.chunks_exact(hd)) {
                let p = s / sum;
                // (Always 64 values: `c + 64 <= hd`.)
                let Some(row) = row[c..].first_chunk::<64>() else {
                    continue;
                };
                for (a, x) in acc.iter_mut().zip(row) {
                    *a += p * x;
                }
            }
            *oc = acc;
        } else {
            for (s, row) in scores.iter().zip(v.chunks_exact(hd)) {
                axpy_generic(oc, s / sum, &row[c..]);
            }
        }
        c += 64;
    }
}

/// `dst[i] = f16_to_f32(src[i])` (exact), eight at a time with F16C; the
/// KV cache is read this way. Panics if the lengths differ.
pub(crate) fn widen_f16(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen_f16 lengths");
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and F16C were probed just above (`has_avx2`).
        return unsafe { widen_f16_f16c(src, dst) };
    }
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = crate::blocks::f16_to_f32(h);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn widen_f16_f16c(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        // SAFETY: `s` has 16 readable bytes and `d` 32 writable ones.
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr().cast());
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for (d, &h) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = crate::blocks::f16_to_f32(h);
    }
}

/// `dst[i] = f32_to_f16(src[i])` (round to nearest even; NaNs keep their
/// sign and top payload bits, quieted), eight at a time with F16C. Panics if
/// the lengths differ.
pub(crate) fn narrow_f16(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "narrow_f16 lengths");
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and F16C were probed just above (`has_avx2`).
        return unsafe { narrow_f16_f16c(src, dst) };
    }
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = crate::blocks::f32_to_f16(v);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn narrow_f16_f16c(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        // SAFETY: `s` has 32 readable bytes and `d` 16 writable ones.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr().cast(), h);
        }
    }
    for (d, &v) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = crate::blocks::f32_to_f16(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_f16_matches_the_scalar_conversion() {
        use crate::blocks::{f16_to_f32, f32_to_f16};
        // Every f16 value, the midpoints between neighbours (ties round to
        // even), one f32 either side of them, a sweep of all bit patterns
        // (NaN payloads, subnormals, overflow) and the edges.
        let mut src: Vec<f32> = Vec::new();
        for h in 0..0x7bffu16 {
            let (a, b) = (f16_to_f32(h) as f64, f16_to_f32(h + 1) as f64);
            let mid = ((a + b) / 2.0) as f32;
            for v in [
                a as f32,
                mid,
                f32::from_bits(mid.to_bits() - 1),
                f32::from_bits(mid.to_bits() + 1),
            ] {
                src.extend([v, -v]);
            }
        }
        src.extend((0..=u32::MAX).step_by(4099).map(f32::from_bits));
        src.extend([
            65504.0,
            65519.99,
            65520.0,
            1e6,
            f32::INFINITY,
            f32::NAN,
            5.96e-8,
            2.98e-8,
        ]);
        src.extend((0..5).map(|i| i as f32));
        let mut got = vec![0u16; src.len()];
        narrow_f16(&src, &mut got);
        for (&v, &g) in src.iter().zip(&got) {
            assert_eq!(g, f32_to_f16(v), "{v:e} ({:#010x})", v.to_bits());
        }
    }

    #[test]
    fn widen_f16_is_exact_on_every_half() {
        // Every f16 bit pattern, at every offset from the vector width.
        let src: Vec<u16> = (0..=u16::MAX).chain(0..5).collect();
        let mut dst = vec![0f32; src.len()];
        widen_f16(&src, &mut dst);
        for (&h, &f) in src.iter().zip(&dst) {
            let want = crate::blocks::f16_to_f32(h);
            assert!(
                f.to_bits() == want.to_bits() || (f.is_nan() && want.is_nan()),
                "{h:#06x}: {f:e} vs {want:e}"
            );
        }
    }
}
