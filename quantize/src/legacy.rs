//! Encoders of the legacy 32-weight blocks, following ggml's
//! `quantize_row_q{4,5}_{0,1}_ref` and `quantize_row_q8_0_ref`
//! (`ggml/src/ggml-quants.c`). Float operations are done in `f32` in ggml's
//! order, and float-to-integer conversions truncate as C's casts do, so the
//! output bytes are identical. Layouts: `memwall_format::blocks`.

use memwall_format::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, F16};

use crate::kquants::{make_qkx2_quants, make_qx_quants};

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
pub(crate) fn q4_0_weighted(x: &[f32], y: &mut BlockQ4_0, weights: &[f32]) {
    let mut l = [0i8; 32];
    let d = make_qx_quants(8, x, &mut l, Some(weights));
    y.d = F16::from_f32(d);
    for j in 0..16 {
        y.qs[j] = l[j] as u8 | ((l[j + 16] as u8) << 4);
    }
}

/// Q5_0 with importance weights (ggml's `quantize_row_q5_0_impl`).
pub(crate) fn q5_0_weighted(x: &[f32], y: &mut BlockQ5_0, weights: &[f32]) {
    let mut l = [0i8; 32];
    let d = make_qx_quants(16, x, &mut l, Some(weights));
    y.d = F16::from_f32(d);
    (y.qs, y.qh) = pack_5bit(&l.map(|l| l as u32));
}

/// Q4_1 with importance weights (ggml's `quantize_row_q4_1_impl`): scale and
/// minimum from the weighted sweep of `make_qkx3_quants`.
pub(crate) fn q4_1_weighted(x: &[f32], y: &mut BlockQ4_1, weights: &[f32]) {
    let mut l = [0u8; 32];
    let (d, min) = make_qkx2_quants(15, x, weights, &mut l, -0.9, 0.05, 36, false);
    y.d = F16::from_f32(d);
    y.m = F16::from_f32(-min);
    for j in 0..16 {
        y.qs[j] = l[j] | (l[j + 16] << 4);
    }
}

/// Q5_1 with importance weights (ggml's `quantize_row_q5_1_impl`).
pub(crate) fn q5_1_weighted(x: &[f32], y: &mut BlockQ5_1, weights: &[f32]) {
    let mut l = [0u8; 32];
    let (d, min) = make_qkx2_quants(31, x, weights, &mut l, -0.9, 0.05, 36, false);
    y.d = F16::from_f32(d);
    y.m = F16::from_f32(-min);
    (y.qs, y.qh) = pack_5bit(&l.map(u32::from));
}

#[cfg(test)]
mod tests {
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
