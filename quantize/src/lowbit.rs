//! Encoders of the types without a scale search: the ternary TQ1_0 and TQ2_0
//! (`quantize_row_tq1_0_ref`, `quantize_row_tq2_0_ref`: the scale is the
//! block's largest magnitude, every weight rounds to −1, 0 or 1) and MXFP4
//! (`quantize_row_mxfp4_ref`: a power-of-two scale from the largest magnitude,
//! every weight to the nearest FP4 value). ggml ignores importance weights
//! for all three, and so do these.

use memwall_format::blocks::{BlockMxfp4, BlockTq1_0, BlockTq2_0, F16, MXFP4_GRID, e8m0_half};

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
