//! Encoders of the legacy 32-weight blocks, following ggml's
//! `quantize_row_q{4,5}_{0,1}_ref` and `quantize_row_q8_0_ref`
//! (`ggml/src/ggml-quants.c`). Float operations are done in `f32` in ggml's
//! order, and float-to-integer conversions truncate as C's casts do, so the
//! output bytes are identical. Layouts: `memwall_format::blocks`.

use memwall_format::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, F16};

use crate::kquants::{make_qkx2_quants, make_qx_quants};
use crate::lanes;

/// The value with the largest magnitude (the first one on ties), as ggml picks it.
pub(crate) fn signed_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| {
        (if v < lo { v } else { lo }, if v > hi { v } else { hi })
    })
}

pub(crate) fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// C's `(int8_t)x` for the in-range values these encoders produce: truncation.
fn trunc_i32(x: f32) -> i32 {
    x as i32
}

/// Q4_0: `d = max / −8` (max is the signed value of largest magnitude), `q = min(15, ⌊x/d + 8.5⌋)`.
#[inline(always)]
pub(crate) fn q4_0(x: &[f32], y: &mut BlockQ4_0) {
    let d = signed_max(x) / -8.0;
    let id = inverse(d);
    y.d = F16::from_f32(d);
    for j in 0..16 {
        let lo = trunc_i32(x[j] * id + 8.5).min(15) as u8;
        let hi = trunc_i32(x[j + 16] * id + 8.5).min(15) as u8;
        y.qs[j] = lo | (hi << 4);
    }
}

/// Q4_1: `d = (max − min) / 15`, `m = min`, `q = min(15, ⌊(x − m)/d + 0.5⌋)`.
#[inline(always)]
pub(crate) fn q4_1(x: &[f32], y: &mut BlockQ4_1) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    y.d = F16::from_f32(d);
    y.m = F16::from_f32(min);
    for j in 0..16 {
        let lo = trunc_i32((x[j] - min) * id + 0.5).min(15) as u8;
        let hi = trunc_i32((x[j + 16] - min) * id + 0.5).min(15) as u8;
        y.qs[j] = lo | (hi << 4);
    }
}

/// Q5_0: `d = max / −16`, `q = min(31, ⌊x/d + 16.5⌋)`, fifth bits in `qh`.
#[inline(always)]
pub(crate) fn q5_0(x: &[f32], y: &mut BlockQ5_0) {
    let d = signed_max(x) / -16.0;
    let id = inverse(d);
    y.d = F16::from_f32(d);
    let l: [u32; 32] = std::array::from_fn(|j| trunc_i32(x[j] * id + 16.5).min(31) as u32);
    (y.qs, y.qh) = pack_5bit(&l);
}

/// The nibbles and the fifth bits (`qh`, little-endian) of a 32-weight block
/// of 5-bit values `l`.
fn pack_5bit(l: &[u32; 32]) -> ([u8; 16], [u8; 4]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        let (lo, hi) = (l[j], l[j + 16]);
        qs[j] = ((lo & 0xf) | ((hi & 0xf) << 4)) as u8;
        qh |= ((lo & 0x10) >> 4) << j;
        qh |= ((hi & 0x10) >> 4) << (j + 16);
    }
    (qs, qh.to_le_bytes())
}

/// Q5_1: `d = (max − min) / 31`, `m = min`, `q = ⌊(x − m)/d + 0.5⌋` (ggml does not clamp).
#[inline(always)]
pub(crate) fn q5_1(x: &[f32], y: &mut BlockQ5_1) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    y.d = F16::from_f32(d);
    y.m = F16::from_f32(min);
    // ggml casts to uint8_t; the value is at most 31.5 here.
    let l: [u32; 32] = std::array::from_fn(|j| ((x[j] - min) * id + 0.5) as u8 as u32);
    (y.qs, y.qh) = pack_5bit(&l);
}

/// Q8_0: `d = max|x| / 127`, `q = round(x/d)` (half away from zero).
#[inline(always)]
pub(crate) fn q8_0(x: &[f32], y: &mut BlockQ8_0) {
    // ggml's running MAX(amax, |v|). A maximum does not depend on the order it
    // is taken in, so take 8 at a time (vectorizes); no NaN reaches here.
    let mut lanes = [0f32; 8];
    for chunk in x.chunks_exact(8) {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = if *m > v.abs() { *m } else { v.abs() };
        }
    }
    let amax = lanes.iter().fold(0f32, |a, &m| if a > m { a } else { m });
    let d = amax / 127.0;
    let id = inverse(d);
    y.d = F16::from_f32(d);
    let mut q = [0i32; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = round_small(v * id);
    }
    for (out, q) in y.qs.iter_mut().zip(q) {
        *out = q as i8;
    }
}

/// C's `(int)roundf(x)` (ties away from zero) for |x| < 2^23 (Q8_0's |x/d| ≤ 127),
/// inline and branch-free: `f32::round` is a libm call on baseline x86-64.
#[inline(always)]
pub(crate) fn round_small(x: f32) -> i32 {
    let t = x as i32;
    let frac = x - t as f32;
    t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)
}

/// Q4_0 with importance weights (ggml's `quantize_row_q4_0_impl`): the scale
/// comes from the weighted fit of `make_qx_quants` instead of the extreme value.
#[inline(always)]
pub(crate) fn q4_0_weighted(x: &[f32], y: &mut BlockQ4_0, weights: &[f32]) {
    let mut l = [0i8; 32];
    let d = make_qx_quants(8, x, &mut l, Some(weights));
    put_q4_0(y, d, &l);
}

/// Q5_0 with importance weights (ggml's `quantize_row_q5_0_impl`).
#[inline(always)]
pub(crate) fn q5_0_weighted(x: &[f32], y: &mut BlockQ5_0, weights: &[f32]) {
    let mut l = [0i8; 32];
    let d = make_qx_quants(16, x, &mut l, Some(weights));
    put_q5_0(y, d, &l);
}

/// Q4_1 with importance weights (ggml's `quantize_row_q4_1_impl`): scale and
/// minimum from the weighted sweep of `make_qkx3_quants`.
#[inline(always)]
pub(crate) fn q4_1_weighted(x: &[f32], y: &mut BlockQ4_1, weights: &[f32]) {
    let mut l = [0u8; 32];
    let (d, min) = make_qkx2_quants(15, x, weights, &mut l, -0.9, 0.05, 36, false);
    put_q4_1(y, (d, min), &l);
}

/// Q5_1 with importance weights (ggml's `quantize_row_q5_1_impl`).
#[inline(always)]
pub(crate) fn q5_1_weighted(x: &[f32], y: &mut BlockQ5_1, weights: &[f32]) {
    let mut l = [0u8; 32];
    let (d, min) = make_qkx2_quants(31, x, weights, &mut l, -0.9, 0.05, 36, false);
    put_q5_1(y, (d, min), &l);
}

#[inline(always)]
fn put_q4_0(y: &mut BlockQ4_0, d: f32, l: &[i8; 32]) {
    y.d = F16::from_f32(d);
    for j in 0..16 {
        y.qs[j] = l[j] as u8 | ((l[j + 16] as u8) << 4);
    }
}

#[inline(always)]
fn put_q5_0(y: &mut BlockQ5_0, d: f32, l: &[i8; 32]) {
    y.d = F16::from_f32(d);
    (y.qs, y.qh) = pack_5bit(&l.map(|l| l as u32));
}

#[inline(always)]
fn put_q4_1(y: &mut BlockQ4_1, (d, min): (f32, f32), l: &[u8; 32]) {
    y.d = F16::from_f32(d);
    y.m = F16::from_f32(-min);
    for j in 0..16 {
        y.qs[j] = l[j] | (l[j + 16] << 4);
    }
}

#[inline(always)]
fn put_q5_1(y: &mut BlockQ5_1, (d, min): (f32, f32), l: &[u8; 32]) {
    y.d = F16::from_f32(d);
    y.m = F16::from_f32(-min);
    (y.qs, y.qh) = pack_5bit(&l.map(u32::from));
}

/// Blocks whose weighted fits the row encoders below run side by side.
const LANES: usize = 8;

/// A row encoder of a legacy type with importance weights `w` (one per
/// value): the weighted fits of the row's blocks [`LANES`] at a time, the
/// values and weights of eight blocks transposed for `$fit` (a `lanes` fit,
/// which gives each block the one-block fit's bits), then each block packed
/// by `$put`; the last `blocks mod LANES` blocks one by one through `$one`.
/// A macro, so that every call in it is direct and inlined into the
/// encoders' wider target features (a function passed as `impl Fn` is
/// called through a shim compiled without them).
macro_rules! weighted_row {
    ($(#[$doc:meta])* $name:ident, $block:ty, $l:ty, $fit:path, $put:path, $one:path) => {
        $(#[$doc])*
        #[inline(always)]
        pub(crate) fn $name(x: &[f32], w: &[f32], y: &mut [$block]) {
            let full = y.len() / LANES * LANES;
            let (by_lanes, rest) = y.split_at_mut(full);
            for (k, ys) in by_lanes.chunks_exact_mut(LANES).enumerate() {
                let span = 32 * LANES * k..32 * LANES * (k + 1);
                let xt = lanes::transpose::<32, LANES>(&x[span.clone()]);
                let wt = lanes::transpose::<32, LANES>(&w[span]);
                let mut lt = [[<$l>::default(); LANES]; 32];
                let fitted = $fit(&xt, &wt, &mut lt);
                for (g, (y, r)) in ys.iter_mut().zip(fitted).enumerate() {
                    let mut l = [<$l>::default(); 32];
                    for (l, row) in l.iter_mut().zip(&lt) {
                        *l = row[g];
                    }
                    $put(y, r, &l);
                }
            }
            let (x, w) = (&x[32 * full..], &w[32 * full..]);
            for ((y, x), w) in rest.iter_mut().zip(x.chunks_exact(32)).zip(w.chunks_exact(32)) {
                $one(x, y, w);
            }
        }
    };
}

weighted_row!(
    /// [`q4_0_weighted`] over a row's blocks.
    q4_0_weighted_row, BlockQ4_0, i8, fit_qx::<8>, put_q4_0, q4_0_weighted
);
weighted_row!(
    /// [`q5_0_weighted`] over a row's blocks.
    q5_0_weighted_row, BlockQ5_0, i8, fit_qx::<16>, put_q5_0, q5_0_weighted
);
weighted_row!(
    /// [`q4_1_weighted`] over a row's blocks.
    q4_1_weighted_row, BlockQ4_1, u8, fit_qkx2::<15>, put_q4_1, q4_1_weighted
);
weighted_row!(
    /// [`q5_1_weighted`] over a row's blocks.
    q5_1_weighted_row, BlockQ5_1, u8, fit_qkx2::<31>, put_q5_1, q5_1_weighted
);

/// The symmetric fit of [`q4_0_weighted`] and [`q5_0_weighted`] for
/// [`LANES`] blocks. (Functions rather than closures: inlined into the
/// encoders' wider target features.)
#[inline(always)]
fn fit_qx<const NMAX: i32>(
    xt: &[[f32; LANES]; 32],
    wt: &[[f32; LANES]; 32],
    lt: &mut [[i8; LANES]; 32],
) -> [f32; LANES] {
    lanes::make_qx_quants::<32, LANES>(NMAX, xt, wt, lt)
}

/// The fit of a scale and a minimum of [`q4_1_weighted`] and
/// [`q5_1_weighted`] for [`LANES`] blocks, as `(scale, min)` pairs.
#[inline(always)]
fn fit_qkx2<const NMAX: i32>(
    xt: &[[f32; LANES]; 32],
    wt: &[[f32; LANES]; 32],
    lt: &mut [[u8; LANES]; 32],
) -> [(f32, f32); LANES] {
    let (d, min) = lanes::make_qkx2_quants::<32, LANES>(NMAX, xt, wt, lt, -0.9, 0.05, 36, false);
    std::array::from_fn(|g| (d[g], min[g]))
}

#[cfg(test)]
mod tests {
    use memwall_format::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1};

    /// `blocks` blocks of varied values: random, one all zeros, one of
    /// negligible magnitude, one all positive, one with a repeated extreme.
    fn row(blocks: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let mut x: Vec<f32> = (0..32 * blocks).map(|_| next()).collect();
        let w: Vec<f32> = (0..32 * blocks).map(|_| next() + 0.6).collect();
        for (b, block) in x.chunks_exact_mut(32).enumerate() {
            match b % 6 {
                1 => block.fill(0.0),
                2 => block.iter_mut().for_each(|v| *v *= 1e-20),
                3 => block.iter_mut().for_each(|v| *v = v.abs() + 0.05),
                4 => block[3..9].fill(-0.75),
                _ => {}
            }
        }
        (x, w)
    }

    #[test]
    fn weighted_rows_equal_their_blocks_encoded_one_by_one() {
        fn check<B: Copy + Default + PartialEq + std::fmt::Debug>(
            name: &str,
            row_fn: fn(&[f32], &[f32], &mut [B]),
            block_fn: fn(&[f32], &mut B, &[f32]),
        ) {
            for blocks in [1, 3, 7, 8, 9, 16, 18, 23] {
                let (x, w) = row(blocks, 0x9e37_79b9 + blocks as u64);
                let mut by_row = vec![B::default(); blocks];
                row_fn(&x, &w, &mut by_row);
                for (b, got) in by_row.iter().enumerate() {
                    let mut want = B::default();
                    block_fn(&x[32 * b..32 * b + 32], &mut want, &w[32 * b..32 * b + 32]);
                    assert_eq!(*got, want, "{name}: block {b} of a row of {blocks}");
                }
            }
        }
        check::<BlockQ4_0>("Q4_0", super::q4_0_weighted_row, super::q4_0_weighted);
        check::<BlockQ5_0>("Q5_0", super::q5_0_weighted_row, super::q5_0_weighted);
        check::<BlockQ4_1>("Q4_1", super::q4_1_weighted_row, super::q4_1_weighted);
        check::<BlockQ5_1>("Q5_1", super::q5_1_weighted_row, super::q5_1_weighted);
    }

    #[test]
    fn rounding_matches_roundf() {
        let mut x = -300.0f32;
        while x < 300.0 {
            assert_eq!(super::round_small(x), x.round() as i32, "{x}");
            x += 0.03125 / 3.0;
        }
        for x in [
            0.49999997f32,
            -0.49999997,
            0.5,
            -0.5,
            2.5,
            -2.5,
            4194303.5,
            -8388607.0,
        ] {
            assert_eq!(super::round_small(x), x.round() as i32, "{x}");
        }
    }
}
