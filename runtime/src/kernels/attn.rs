//! The float loops of attention over a batch, vectorised across keys (scores)
//! and across dimensions (weighted values). Every lane does the same scalar
//! operations in the same order as the one-query code path, so these give
//! the same bits at any vector width; the AVX2 versions are the same code
//! compiled for 256-bit vectors.

#[cfg(target_arch = "x86_64")]
use super::{arch::has_avx512, has_avx2};

/// Keys scored together: one independent sequential sum per key.
pub(crate) const KEY_TILE: usize = 32;

/// Query heads handled together by [`key_tiles`] and [`weighted_rows`]: the
/// heads of one group share their keys and values (grouped-query attention),
/// so each key or value is loaded once for all of them, and their sums are
/// independent chains the CPU overlaps.
pub(crate) const HEADS: usize = 4;

/// For each of the `n = q.len() / hd ≤ HEADS` queries `h` (rows of `q`) and
/// the [`KEY_TILE`] keys `l`: `out[h][l] = Σ_d q[h][d] · kt[d·stride + l]`,
/// each summed in increasing `d` from `-0.0` (as `Iterator::sum`), with
/// separate multiplies and adds. `kt` holds the keys transposed (`hd` dims of
/// `stride` positions, starting at the first key of the tile). Panics if
/// `n > HEADS` or `kt` is short.
pub(crate) fn key_tiles(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    macro_rules! by_heads {
        ($f:ident, $keys:literal) => {
            match out.len() {
                1 => $f::<1, $keys>(q, hd, kt, stride, out),
                2 => $f::<2, $keys>(q, hd, kt, stride, out),
                3 => $f::<3, $keys>(q, hd, kt, stride, out),
                4 => $f::<4, $keys>(q, hd, kt, stride, out),
                n => panic!("key_tiles: {n} heads (at most {HEADS})"),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512 was probed just above.
        return unsafe { by_heads!(key_tiles_avx512, 32) };
    } else if has_avx2() {
        // SAFETY: AVX2 was probed just above.
        return unsafe { by_heads!(key_tiles_avx2, 16) };
    }
    by_heads!(key_tiles_generic, 16)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn key_tiles_avx2<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    key_tiles_generic::<N, P>(q, hd, kt, stride, out)
}

#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx512f")]
fn key_tiles_avx512<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    key_tiles_generic::<N, P>(q, hd, kt, stride, out)
}

/// [`key_tiles`] for `N` heads, `P` keys of the tile at a time: the `N × P`
/// sums stay in registers over all dimensions (32 keys × 3 heads are twelve
/// AVX2 registers, which with the keys and the query spilled to the stack).
#[inline(always)]
fn key_tiles_generic<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    const { assert!(KEY_TILE % P == 0) };
    let q: [&[f32]; N] = std::array::from_fn(|h| &q[h * hd..][..hd]);
    for l0 in (0..KEY_TILE).step_by(P) {
        let mut acc = [[-0.0f32; P]; N];
        for d in 0..hd {
            let keys = &kt[d * stride + l0..][..P];
            for (acc, q) in acc.iter_mut().zip(&q) {
                let qd = q[d];
                for (a, &k) in acc.iter_mut().zip(keys) {
                    *a += qd * k;
                }
            }
        }
        for (out, acc) in out.iter_mut().zip(&acc) {
            out[l0..l0 + P].copy_from_slice(acc);
        }
    }
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

/// For each of the `sums.len() ≤ HEADS` heads `h` (rows of `hd = v.len() /
/// positions` values in `out`, rows of `positions = scores.len() /
/// sums.len()` in `scores`) and each position `j` in turn: `out[h] ← out[h] +
/// (scores[h][j] / sums[h]) · v[j]`, [`axpy`]'s arithmetic position by
/// position; `scores` is left divided by the sums (each quotient computed
/// once, not once per pass over the dimensions). Panics if there are more
/// than `HEADS` heads or the lengths disagree.
pub(crate) fn weighted_rows(out: &mut [f32], scores: &mut [f32], sums: &[f32], v: &[f32]) {
    if let Some(n) = scores.len().checked_div(sums.len()) {
        for (row, &sum) in scores.chunks_exact_mut(n.max(1)).zip(sums) {
            for s in row {
                *s /= sum;
            }
        }
    }
    macro_rules! by_heads {
        ($f:ident, $dims:literal) => {
            match sums.len() {
                1 => $f::<1, $dims>(out, scores, v),
                2 => $f::<2, $dims>(out, scores, v),
                3 => $f::<3, $dims>(out, scores, v),
                4 => $f::<4, $dims>(out, scores, v),
                n => panic!("weighted_rows: {n} heads (at most {HEADS})"),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512 was probed just above.
        return unsafe { by_heads!(weighted_rows_avx512, 64) };
    } else if has_avx2() {
        // SAFETY: AVX2 was probed just above.
        return unsafe { by_heads!(weighted_rows_avx2, 16) };
    }
    by_heads!(weighted_rows_generic, 32)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn weighted_rows_avx2<const N: usize, const W: usize>(out: &mut [f32], probs: &[f32], v: &[f32]) {
    weighted_rows_generic::<N, W>(out, probs, v)
}

#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx512f")]
fn weighted_rows_avx512<const N: usize, const W: usize>(out: &mut [f32], probs: &[f32], v: &[f32]) {
    weighted_rows_generic::<N, W>(out, probs, v)
}

/// [`weighted_rows`] for `N` heads (`probs`: the scores divided by their
/// sums), `W` dimensions at a time.
#[inline(always)]
fn weighted_rows_generic<const N: usize, const W: usize>(
    out: &mut [f32],
    probs: &[f32],
    v: &[f32],
) {
    let (hd, n) = (out.len() / N, probs.len() / N);
    assert!(
        out.len() == N * hd && probs.len() == N * n && v.len() >= n * hd,
        "weighted_rows lengths"
    );
    if hd == 0 {
        return;
    }
    let probs: [&[f32]; N] = std::array::from_fn(|h| &probs[h * n..][..n]);
    // `W` dimensions of every head at a time in fixed-size accumulators,
    // which the compiler keeps in registers over all positions (each element
    // still sums the positions in order): 64 for AVX-512's 32 registers, 16
    // for AVX2's 16 (64 × 3 heads spilled every sum to the stack, and so did
    // 32 with the value rows and the weights in registers).
    for c in (0..hd).step_by(W) {
        if c + W <= hd {
            let mut acc: [[f32; W]; N] = std::array::from_fn(|h| {
                let mut a = [0f32; W];
                a.copy_from_slice(&out[h * hd + c..][..W]);
                a
            });
            for (j, row) in v.chunks_exact(hd).take(n).enumerate() {
                let Some(row) = row[c..].first_chunk::<W>() else {
                    continue;
                };
                for h in 0..N {
                    let p = probs[h][j];
                    for (a, x) in acc[h].iter_mut().zip(row) {
                        *a += p * x;
                    }
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                out[h * hd + c..][..W].copy_from_slice(acc);
            }
        } else {
            for h in 0..N {
                for (j, row) in v.chunks_exact(hd).take(n).enumerate() {
                    axpy_generic(&mut out[h * hd + c..(h + 1) * hd], probs[h][j], &row[c..]);
                }
            }
        }
    }
}

/// `dst[i] = f16_to_f32(src[i])` (exact), eight at a time with F16C; the
/// KV cache is read this way. Panics if the lengths differ.
pub(crate) fn widen_f16(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen_f16 lengths");
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the bytes of `src` (any bytes are `u8`s; x86-64 is
        // little-endian, so they are the values' little-endian bytes).
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), 2 * src.len()) };
        // SAFETY: AVX2 and F16C were probed just above (`has_avx2`).
        return unsafe { widen_f16_le_f16c(bytes, dst) };
    }
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = memwall_format::blocks::f16_to_f32(h);
    }
}

/// [`widen_f16`] of little-endian f16 bytes (F16 weights as stored): `dst[i]`
/// = value `i` of `src`, exactly.
pub(crate) fn widen_f16_le(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), 2 * dst.len(), "widen_f16_le lengths");
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and F16C were probed just above (`has_avx2`).
        return unsafe { widen_f16_le_f16c(src, dst) };
    }
    for (d, h) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = memwall_format::blocks::f16_to_f32(u16::from_le_bytes([h[0], h[1]]));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn widen_f16_le_f16c(src: &[u8], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(16);
    for (d, s) in (&mut d).zip(&mut s) {
        // SAFETY: `s` has 16 readable bytes and `d` 32 writable ones.
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr().cast());
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for (d, h) in d
        .into_remainder()
        .iter_mut()
        .zip(s.remainder().chunks_exact(2))
    {
        *d = memwall_format::blocks::f16_to_f32(u16::from_le_bytes([h[0], h[1]]));
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
        *d = memwall_format::blocks::f32_to_f16(v);
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
        *d = memwall_format::blocks::f32_to_f16(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values of mixed sign and magnitude (with exact zeros).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                if x % 11 == 0 {
                    0.0
                } else {
                    (x % 20_001) as f32 / 1000.0 - 10.0
                }
            })
            .collect()
    }

    #[test]
    fn key_tiles_sum_each_head_and_key_in_order() {
        for hd in [1, 7, 64, 80, 128] {
            let stride = 3 * KEY_TILE;
            let kt = values(hd * stride, hd as u32);
            let q = values(HEADS * hd, 7 + hd as u32);
            for heads in 1..=HEADS {
                for j0 in [0, KEY_TILE, 2 * KEY_TILE] {
                    let mut got = [[f32::NAN; KEY_TILE]; HEADS];
                    key_tiles(&q[..heads * hd], hd, &kt[j0..], stride, &mut got[..heads]);
                    for (h, got) in got[..heads].iter().enumerate() {
                        for (l, &g) in got.iter().enumerate() {
                            let want: f32 = (0..hd)
                                .map(|d| q[h * hd + d] * kt[d * stride + j0 + l])
                                .sum();
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "hd {hd} heads {heads} h {h} key {}",
                                j0 + l
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn weighted_rows_sum_each_head_over_positions_in_order() {
        for hd in [1, 7, 64, 80, 128] {
            for n in [1, 5, 33] {
                // Extra rows past `n` in `v` are not read.
                let v = values((n + 2) * hd, n as u32);
                for heads in 1..=HEADS {
                    let scores = values(heads * n, 3 + hd as u32)
                        .iter()
                        .map(|s| s.abs())
                        .collect::<Vec<_>>();
                    let sums: Vec<f32> = (0..heads).map(|h| 1.5 + h as f32).collect();
                    let start = values(heads * hd, 5);
                    let mut got = start.clone();
                    let mut divided = scores.clone();
                    weighted_rows(&mut got, &mut divided, &sums, &v);
                    for h in 0..heads {
                        let mut want = start[h * hd..(h + 1) * hd].to_vec();
                        for j in 0..n {
                            let p = scores[h * n + j] / sums[h];
                            for (w, x) in want.iter_mut().zip(&v[j * hd..]) {
                                *w += p * x;
                            }
                        }
                        let got = &got[h * hd..(h + 1) * hd];
                        let differ = got
                            .iter()
                            .zip(&want)
                            .position(|(a, b)| a.to_bits() != b.to_bits());
                        assert_eq!(differ, None, "hd {hd} n {n} heads {heads} h {h}");
                    }
                }
            }
        }
    }

    #[test]
    fn narrow_f16_matches_the_scalar_conversion() {
        use memwall_format::blocks::{f16_to_f32, f32_to_f16};
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
        let bytes: Vec<u8> = src.iter().flat_map(|h| h.to_le_bytes()).collect();
        for from_bytes in [false, true] {
            let mut dst = vec![0f32; src.len()];
            if from_bytes {
                widen_f16_le(&bytes, &mut dst);
            } else {
                widen_f16(&src, &mut dst);
            }
            for (&h, &f) in src.iter().zip(&dst) {
                let want = memwall_format::blocks::f16_to_f32(h);
                assert!(
                    f.to_bits() == want.to_bits() || (f.is_nan() && want.is_nan()),
                    "{h:#06x} (bytes: {from_bytes}): {f:e} vs {want:e}"
                );
            }
        }
    }
}
