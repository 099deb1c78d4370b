//! The float loops of attention over a batch, vectorised across keys (scores)
//! and across dimensions (weighted values), and the f16 conversions of the KV
//! cache. Every lane does the same scalar operations in the same order as the
//! one-query code path, so these give the same bits at any vector width.
//!
//! The bodies here are generic over their tile sizes and `#[inline(always)]`:
//! the scalar table ([`super::scalar::OPS`]) runs them as plain Rust, and the
//! AVX2 and AVX-512 tables (`arch/`) compile the same bodies inside
//! `#[target_feature]` functions for 256- and 512-bit vectors. Callers reach
//! them through [`super::Kernels`].

use memwall_format::blocks::{f16_to_f32, f32_to_f16};

/// Keys scored together: one independent sequential sum per key.
pub(crate) const KEY_TILE: usize = 32;

/// Query heads handled together by [`super::Kernels::key_tiles`] and
/// [`super::Kernels::weighted_rows`]: the heads of one group share their keys
/// and values (grouped-query attention), so each key or value is loaded once
/// for all of them, and their sums are independent chains the CPU overlaps.
pub(crate) const HEADS: usize = 4;

/// Rows of `a` taken together by [`super::Kernels::product_f32`] (calibration's
/// Hessians and error scores): with 16 columns at a time, twelve AVX2
/// accumulators, each column vector loaded once for six rows.
pub(crate) const PRODUCT_ROWS: usize = 6;

/// `$f::<N, $tile> $args` for the `N = $n` of the call, one of the literals
/// `$k`; panics (naming `$what` and its largest, `$max`) on others.
macro_rules! by_count {
    ($f:ident, $tile:literal, $n:expr, $what:literal, $max:expr, [$($k:literal)*], $args:tt) => {
        match $n {
            $($k => $f::<$k, $tile> $args,)*
            n => panic!("{}: {n} {} (at most {})", stringify!($f), $what, $max),
        }
    };
}
pub(crate) use by_count;

/// `$f::<N, $tile>($args…)` for the `N = $rows` of the call (1 to
/// [`PRODUCT_ROWS`]); panics on more.
macro_rules! by_product_rows {
    ($f:ident, $tile:literal, $rows:expr, $($arg:expr),*) => {
        $crate::kernels::attn::by_count!(
            $f, $tile, $rows, "rows", $crate::kernels::attn::PRODUCT_ROWS, [1 2 3 4 5 6], ($($arg),*)
        )
    };
}
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
pub(crate) use by_product_rows;

/// `$f::<N, $tile>($args…)` for the `N = $heads` of the call (1 to
/// [`HEADS`]); panics on more.
macro_rules! by_heads {
    ($f:ident, $tile:literal, $heads:expr, $($arg:expr),*) => {
        $crate::kernels::attn::by_count!(
            $f, $tile, $heads, "heads", $crate::kernels::attn::HEADS, [1 2 3 4], ($($arg),*)
        )
    };
}
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
pub(crate) use by_heads;

/// The scalar table's key tiles (16 keys of a tile at a time).
pub(crate) fn key_tiles(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    by_heads!(key_tiles_generic, 16, out.len(), q, hd, kt, stride, out)
}

/// [`super::Kernels::key_tiles`] for `N` heads, `P` keys of the tile at a
/// time: the `N × P` sums stay in registers over all dimensions (32 keys × 3
/// heads are twelve AVX2 registers, which with the keys and the query spilled
/// to the stack).
#[inline(always)]
pub(crate) fn key_tiles_generic<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    tiles_generic::<N, P, false>(q, hd, kt, stride, out)
}

/// The tiles' loop: a multiply and an add per step, or with `FUSED` one
/// fused multiply-add (`f32::mul_add`: one rounding).
#[inline(always)]
fn tiles_generic<const N: usize, const P: usize, const FUSED: bool>(
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
                    *a = if FUSED {
                        qd.mul_add(k, *a)
                    } else {
                        *a + qd * k
                    };
                }
            }
        }
        for (out, acc) in out.iter_mut().zip(&acc) {
            out[l0..l0 + P].copy_from_slice(acc);
        }
    }
}

/// The scalar table's float products ([`super::Kernels::product_f32`]).
pub(crate) fn product_tiles(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    by_product_rows!(product_tiles_generic, 16, out.len(), q, hd, kt, stride, out)
}

/// [`key_tiles_generic`] with a fused multiply-add per step, the float
/// products' arithmetic.
#[inline(always)]
pub(crate) fn product_tiles_generic<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    tiles_generic::<N, P, true>(q, hd, kt, stride, out)
}

/// `out[i] = out[i] + p · x[i]` for every `i`.
#[inline(always)]
pub(crate) fn axpy(out: &mut [f32], p: f32, x: &[f32]) {
    for (o, x) in out.iter_mut().zip(x) {
        *o += p * x;
    }
}

/// Divides each of the `sums.len()` rows of `scores` by its sum (the weights
/// of [`super::Kernels::weighted_rows`]).
pub(crate) fn divide_rows(scores: &mut [f32], sums: &[f32]) {
    if let Some(n) = scores.len().checked_div(sums.len()) {
        for (row, &sum) in scores.chunks_exact_mut(n.max(1)).zip(sums) {
            for s in row {
                *s /= sum;
            }
        }
    }
}

/// The scalar table's weighted rows (32 dimensions at a time).
pub(crate) fn weighted_rows(out: &mut [f32], probs: &[f32], v: &[f32], heads: usize) {
    by_heads!(weighted_rows_generic, 32, heads, out, probs, v)
}

/// [`super::Kernels::weighted_rows`] for `N` heads (`probs`: the scores
/// divided by their sums), `W` dimensions at a time.
#[inline(always)]
pub(crate) fn weighted_rows_generic<const N: usize, const W: usize>(
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
                    axpy(&mut out[h * hd + c..(h + 1) * hd], probs[h][j], &row[c..]);
                }
            }
        }
    }
}

/// `dst[i] = f16_to_f32(src[i])` (exact), value by value.
pub(crate) fn widen_f16(src: &[u16], dst: &mut [f32]) {
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(h);
    }
}

/// [`widen_f16`] of little-endian f16 bytes.
pub(crate) fn widen_f16_le(src: &[u8], dst: &mut [f32]) {
    for (d, h) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([h[0], h[1]]));
    }
}

/// `dst[i] = f32_to_f16(src[i])`, value by value.
pub(crate) fn narrow_f16(src: &[f32], dst: &mut [u16]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{Backend, Kernels};

    /// The kernels of every backend this CPU runs.
    fn every_backend() -> Vec<Kernels> {
        Backend::supported()
            .into_iter()
            .map(|b| Kernels::new(b).unwrap())
            .collect()
    }

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
    fn float_products_sum_each_value_in_order_with_fused_steps_on_every_backend() {
        // Shapes with whole tiles, a ragged edge, fewer rows than a tile's
        // heads, and a column range that starts inside the matrix; `b` as
        // it is (its tiles copied inside when several groups of rows read
        // them), packed by the caller, and the caller's tiles alone (`b`
        // empty; whole tiles of columns).
        for (k, (m, kk, n)) in every_backend().into_iter().flat_map(|k| {
            [
                (1, 1, 1),
                (4, 64, 32),
                (7, 33, 70),
                (9, 256, 100),
                (3, 5, 31),
            ]
            .map(|s| (k, s))
        }) {
            let a = values(m * kk, (m + kk) as u32);
            let b = values(kk * n, (kk + n) as u32);
            let mut tiles = crate::kernels::ProductTiles::default();
            tiles.pack(&b, kk, n);
            let whole = n / 32 * 32;
            for (cols, packed) in [
                (0..n, None),
                (n / 3..n, None),
                (0..n, Some(&b[..])),
                (n / 3..n, Some(&b[..])),
                (0..whole, Some(&[][..])),
                (32.min(whole)..whole, Some(&[][..])),
            ] {
                let mut got = vec![f32::NAN; m * n];
                match packed {
                    Some(b) => {
                        k.product_f32_packed(&a, m, kk, b, tiles.tiles(), n, cols.clone(), &mut got)
                    }
                    None => k.product_f32(&a, m, kk, &b, n, cols.clone(), &mut got),
                }
                for i in 0..m {
                    for j in 0..n {
                        let g = got[i * n + j];
                        if !cols.contains(&j) {
                            assert!(g.is_nan(), "{:?}: ({i}, {j}) written outside", k.backend());
                            continue;
                        }
                        let want = (0..kk)
                            .fold(-0.0f32, |acc, d| a[i * kk + d].mul_add(b[d * n + j], acc));
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{:?}: {m}×{kk}·{kk}×{n} at ({i}, {j}), packed {:?}",
                            k.backend(),
                            packed.map(|b| b.len())
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn key_tiles_sum_each_head_and_key_in_order() {
        for (k, hd) in every_backend()
            .into_iter()
            .flat_map(|k| [1, 7, 64, 80, 128].map(|hd| (k, hd)))
        {
            let stride = 3 * KEY_TILE;
            let kt = values(hd * stride, hd as u32);
            let q = values(HEADS * hd, 7 + hd as u32);
            for heads in 1..=HEADS {
                for j0 in [0, KEY_TILE, 2 * KEY_TILE] {
                    let mut got = [[f32::NAN; KEY_TILE]; HEADS];
                    k.key_tiles(&q[..heads * hd], hd, &kt[j0..], stride, &mut got[..heads]);
                    for (h, got) in got[..heads].iter().enumerate() {
                        for (l, &g) in got.iter().enumerate() {
                            let want: f32 = (0..hd)
                                .map(|d| q[h * hd + d] * kt[d * stride + j0 + l])
                                .sum();
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{:?}: hd {hd} heads {heads} h {h} key {}",
                                k.backend(),
                                j0 + l
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn weighted_rows_add_each_head_over_positions_in_order_in_one_call_or_in_pieces() {
        for (k, hd) in every_backend()
            .into_iter()
            .flat_map(|k| [1, 7, 64, 80, 128].map(|hd| (k, hd)))
        {
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
                    let mut divided = scores.clone();
                    k.divide_rows(&mut divided, &sums);
                    let mut whole = start.clone();
                    k.weighted_rows(&mut whole, &divided, &v, heads);
                    // The positions in two pieces (the first may be empty).
                    let cut = n / 3;
                    let mut pieces = start.clone();
                    for (a, b) in [(0, cut), (cut, n)] {
                        let piece: Vec<f32> = (0..heads)
                            .flat_map(|h| divided[h * n + a..h * n + b].iter().copied())
                            .collect();
                        k.weighted_rows(&mut pieces, &piece, &v[a * hd..b * hd], heads);
                    }
                    for (h, got) in (0..heads).flat_map(|h| [(h, &whole), (h, &pieces)]) {
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
                        assert_eq!(
                            differ,
                            None,
                            "{:?}: hd {hd} n {n} heads {heads} h {h}",
                            k.backend()
                        );
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
        for k in every_backend() {
            let mut got = vec![0u16; src.len()];
            k.narrow_f16(&src, &mut got);
            for (&v, &g) in src.iter().zip(&got) {
                let backend = k.backend();
                assert_eq!(
                    g,
                    f32_to_f16(v),
                    "{backend:?}: {v:e} ({:#010x})",
                    v.to_bits()
                );
            }
        }
    }

    #[test]
    fn widen_f16_is_exact_on_every_half() {
        // Every f16 bit pattern, at every offset from the vector width.
        let src: Vec<u16> = (0..=u16::MAX).chain(0..5).collect();
        let bytes: Vec<u8> = src.iter().flat_map(|h| h.to_le_bytes()).collect();
        for (k, from_bytes) in every_backend()
            .into_iter()
            .flat_map(|k| [(k, false), (k, true)])
        {
            let mut dst = vec![0f32; src.len()];
            if from_bytes {
                k.widen_f16_le(&bytes, &mut dst);
            } else {
                k.widen_f16(&src, &mut dst);
            }
            for (&h, &f) in src.iter().zip(&dst) {
                let want = memwall_format::blocks::f16_to_f32(h);
                assert!(
                    f.to_bits() == want.to_bits() || (f.is_nan() && want.is_nan()),
                    "{:?}: {h:#06x} (bytes: {from_bytes}): {f:e} vs {want:e}",
                    k.backend()
                );
            }
        }
    }
}
