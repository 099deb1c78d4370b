//! Encoders of the types without a scale search: the ternary TQ1_0 and TQ2_0
//! (`quantize_row_tq1_0_ref`, `quantize_row_tq2_0_ref`: the scale is the
//! block's largest magnitude, every weight rounds to −1, 0 or 1) and MXFP4
//! (`quantize_row_mxfp4_ref`: a power-of-two scale from the largest magnitude,
//! every weight to the nearest FP4 value), NVFP4 (`quantize_row_nvfp4_ref`:
//! the same per 16 weights under an E4M3 scale of `amax / 6`), Q1_0
//! (`quantize_row_q1_0_ref`: each weight's sign under the block's mean
//! magnitude) and Q2_0 (`quantize_row_q2_0_ref`: `round(x / amax)` offset by
//! one). ggml ignores importance weights for all of them, and so do these.

use memwall_format::blocks::{
    BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockTq1_0, BlockTq2_0, F16, MXFP4_GRID,
    e8m0_half, ue4m3_from_f32, ue4m3_half,
};

use crate::legacy::{inverse, round_small};

/// ggml's running `MAX(amax, |v|)` (no NaN reaches an encoder).
fn abs_max(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |m, &v| if m > v.abs() { m } else { v.abs() })
}

/// The ternary values `round(x / amax) + 1` of a super-block, and its scale.
fn ternary(x: &[f32]) -> (F16, [u8; 256]) {
    let d = abs_max(x);
    let id = inverse(d);
    // |x · id| ≤ 1 (up to rounding), so the values are 0, 1 or 2.
    let t = std::array::from_fn(|i| (round_small(x[i] * id) + 1) as u8);
    (F16::from_f32(d), t)
}

/// TQ1_0: five trits a byte.
pub(crate) fn tq1_0(x: &[f32], y: &mut BlockTq1_0) {
    let (d, t) = ternary(x);
    y.d = d;
    y.set_trits(&t);
}

/// TQ2_0: four 2-bit values a byte.
pub(crate) fn tq2_0(x: &[f32], y: &mut BlockTq2_0) {
    let (d, t) = ternary(x);
    y.d = d;
    y.set_values(&t);
}

/// MXFP4's shared exponent: `⌊log₂ amax⌋ − 2 + 127` (the largest FP4 value
/// is 6 = 1.5 · 2²), 0 for an all-zero block. ggml converts the float to
/// `uint8_t` directly, which for the exponents of blocks below 2⁻¹²⁵ is a
/// negative value and on x86-64 wraps (through a 32-bit integer); this does
/// the same. `log2` is the platform's `log2f`, as in ggml.
fn mxfp4_exponent(amax: f32) -> u8 {
    if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
    } else {
        0
    }
}

/// The FP4 code whose value times `d` is nearest `x` (the first on ties).
fn nearest_fp4(x: f32, d: f32) -> u8 {
    let mut best = (f32::from(MXFP4_GRID[0]) * d - x).abs();
    let mut code = 0;
    for (i, &g) in MXFP4_GRID.iter().enumerate().skip(1) {
        let err = (f32::from(g) * d - x).abs();
        if err < best {
            best = err;
            code = i as u8;
        }
    }
    code
}

/// MXFP4: a 32-weight block.
pub(crate) fn mxfp4(x: &[f32], y: &mut BlockMxfp4) {
    let amax = x
        .iter()
        .fold(0f32, |m, &v| if m < v.abs() { v.abs() } else { m });
    y.e = mxfp4_exponent(amax);
    let d = e8m0_half(y.e);
    for (j, q) in y.qs.iter_mut().enumerate() {
        *q = nearest_fp4(x[j], d) | nearest_fp4(x[j + 16], d) << 4;
    }
}

/// NVFP4: four 16-weight sub-blocks, each scaled so that its largest
/// magnitude is the largest FP4 value, 6.
pub(crate) fn nvfp4(x: &[f32], y: &mut BlockNvfp4) {
    for (s, (xb, qs)) in x.chunks_exact(16).zip(y.qs.chunks_exact_mut(8)).enumerate() {
        let amax = xb
            .iter()
            .fold(0f32, |m, &v| if m < v.abs() { v.abs() } else { m });
        y.d[s] = ue4m3_from_f32(amax / 6.0);
        let d = ue4m3_half(y.d[s]);
        for (j, q) in qs.iter_mut().enumerate() {
            *q = nearest_fp4(xb[j], d) | nearest_fp4(xb[j + 8], d) << 4;
        }
    }
}

/// Q1_0: the signs of 128 weights (`x ≥ 0` is `+`), under the mean magnitude
/// (summed in order, as ggml does).
pub(crate) fn q1_0(x: &[f32], y: &mut BlockQ1_0) {
    let sum = x.iter().fold(0f32, |s, &v| s + v.abs());
    y.d = F16::from_f32(sum / x.len() as f32);
    for (q, xs) in y.qs.iter_mut().zip(x.chunks_exact(8)) {
        *q = xs
            .iter()
            .enumerate()
            .fold(0, |q, (k, &v)| q | u8::from(v >= 0.0) << k);
    }
}

/// Q2_0: `round(x / amax) + 1`, clamped to 0..=3 (so the value 2·d is never
/// chosen: ggml's scale is the largest magnitude itself).
pub(crate) fn q2_0(x: &[f32], y: &mut BlockQ2_0) {
    let d = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m { v.abs() } else { m });
    let id = inverse(d);
    y.d = F16::from_f32(d);
    for (q, xs) in y.qs.iter_mut().zip(x.chunks_exact(4)) {
        *q = xs.iter().enumerate().fold(0, |q, (k, &v)| {
            q | ((round_small(v * id) + 1).clamp(0, 3) as u8) << (2 * k)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mxfp4_exponents_follow_ggml() {
        assert_eq!(mxfp4_exponent(0.0), 0);
        assert_eq!(mxfp4_exponent(6.0), 127);
        assert_eq!(mxfp4_exponent(8.0), 128);
        assert_eq!(mxfp4_exponent(1.0), 125);
        // Below 2⁻¹²⁵ the value is negative and wraps as it does in C on x86-64.
        assert_eq!(mxfp4_exponent(2f32.powi(-126)), 255);
    }

    #[test]
    fn q1_0_keeps_signs_under_the_mean_magnitude() {
        let x: Vec<f32> = (0..128)
            .map(|i| if i % 3 == 0 { -2.0 } else { 0.5 })
            .collect();
        let mut y = BlockQ1_0 {
            d: F16::from_f32(0.0),
            qs: [0; 16],
        };
        q1_0(&x, &mut y);
        let mean = (43.0 * 2.0 + 85.0 * 0.5) / 128.0;
        assert_eq!(y.d, F16::from_f32(mean));
        assert_eq!(y.qs[0], 0b1011_0110); // weights 0, 3, 6 negative
    }

    #[test]
    fn q2_0_rounds_against_the_largest_magnitude() {
        let mut x = [0f32; 64];
        x[..4].copy_from_slice(&[-4.0, -2.0, 1.9, 4.0]);
        let mut y = BlockQ2_0 {
            d: F16::from_f32(0.0),
            qs: [0; 16],
        };
        q2_0(&x, &mut y);
        assert_eq!(y.d.to_f32(), 4.0);
        // −1 → 0, −0.5 → −1 (away from zero) → 0, 0.475 → 0 → 1, 1 → 2.
        assert_eq!(y.qs[0], 0b10_01_00_00);
        assert_eq!(y.qs[1], 0b01_01_01_01);
    }

    #[test]
    fn ternary_values_round_half_away_from_zero() {
        let mut x = [0f32; 256];
        x[0] = 2.0;
        x[1] = 1.0;
        x[2] = -1.0;
        x[3] = -0.5;
        let (d, t) = ternary(&x);
        assert_eq!(d.to_f32(), 2.0);
        assert_eq!(&t[..5], &[2, 2, 0, 1, 1]);
    }
}
