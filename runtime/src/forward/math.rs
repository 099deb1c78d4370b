//! The elementary functions of the forward pass, computed the same way on every
//! CPU. Platform libms differ in the last bit (glibc on x86-64 picks FMA
//! variants at run time, aarch64 glibc and Android's bionic have their own),
//! and with quantized activations one last-bit difference can flip a later Q8
//! rounding and move a perplexity by a visible amount. These use plain
//! multiplies and adds (Rust never fuses them), so every IEEE machine computes
//! the same bits. Most work in `f64` and, rounded once to `f32`, are correctly
//! rounded except within ~1e-16 of a rounding boundary; [`exp_fast`], the
//! batch's hot loop (softmax and SiLU), works in `f32` vectors within 2 ulp.

/// `ln 2` split so that `k · LN2_HI` is exact for |k| < 2^20.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// `e^x` for `f64` arguments whose result is a normal `f64`, or 0/∞ outside.
fn exp64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x > 709.0 {
        return f64::INFINITY;
    }
    if x < -745.0 {
        return 0.0;
    }
    let k = (x * std::f64::consts::LOG2_E).round();
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // Taylor series of e^r for |r| ≤ 0.35: the 15th term is below 1e-19.
    let mut p = 1.0 / 87_178_291_200.0; // 1/14!
    for n in (1..14).rev() {
        p = p * r + INV_FACTORIAL[n];
    }
    let e = p * r + 1.0;
    // Scale by 2^k in two steps so that subnormal results stay exact.
    let k = k as i64;
    let half = k / 2;
    e * pow2(half) * pow2(k - half)
}

/// `1/n!` for `n` < 20: `1 / (1·2·…·n)`, the product in `f64` steps.
const INV_FACTORIAL: [f64; 20] = {
    let mut t = [1.0; 20];
    let mut f = 1.0;
    let mut n = 1;
    while n < 20 {
        f *= n as f64;
        t[n] = 1.0 / f;
        n += 1;
    }
    t
};

/// `2^k` for |k| ≤ 1022.
fn pow2(k: i64) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `e^x`, the same bits on every CPU.
pub fn exp(x: f32) -> f32 {
    exp64(x as f64) as f32
}

/// `log2 e`, `ln 2` split so that `k · LN2_HI_F32` is exact for |k| < 2^15,
/// and the constant whose addition rounds an `f32` below 2^22 to an integer
/// (ties to even).
pub(crate) const LOG2E_F32: f32 = std::f32::consts::LOG2_E;
pub(crate) const LN2_HI_F32: f32 = 0.693_359_4; // 0x3f31_8000
pub(crate) const LN2_LO_F32: f32 = -2.121_944_4e-4;
pub(crate) const ROUND_F32: f32 = 12_582_912.0; // 1.5 · 2^23
/// Above this `e^x` overflows `f32`; below the other bound it is under the
/// smallest normal, and `exp_fast` returns 0.
pub(crate) const EXP_FAST_MAX: f32 = 88.722_83;
pub(crate) const EXP_FAST_MIN: f32 = -87.336_54;
/// `1/n!` for the Taylor terms of `e^r`, highest first (n = 7..=2).
pub(crate) const EXP_FAST_C: [f32; 6] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];

/// `e^x` in `f32` arithmetic alone, within 2 ulp above the smallest normal
/// (0 below it), the same bits on every CPU: plain multiplies and adds (no
/// fused ones), rounding by adding and subtracting [`ROUND_F32`]. About six
/// times as fast as [`exp`] in vectors (sixteen lanes per AVX-512 register
/// instead of eight `f64`); softmax numerators and SiLU use it, where 2 ulp
/// are far below what the surrounding `f16`/Q8 roundings change.
pub fn exp_fast(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > EXP_FAST_MAX {
        return f32::INFINITY;
    }
    if x < EXP_FAST_MIN {
        return 0.0;
    }
    let k = (x * LOG2E_F32 + ROUND_F32) - ROUND_F32;
    let r = (x - k * LN2_HI_F32) - k * LN2_LO_F32;
    let mut p = EXP_FAST_C[0];
    for c in &EXP_FAST_C[1..] {
        p = p * r + c;
    }
    let p = (p * r + 1.0) * r + 1.0;
    // 2^k in two steps (k / 2 rounded toward zero first): k reaches 128.
    let k = k as i32;
    let half = k / 2;
    p * pow2_f32(half) * pow2_f32(k - half)
}

/// `2^k` for |k| ≤ 126.
fn pow2_f32(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// `x ← exp_fast(x)` for every element: the scalar table's loop (the
/// backends' vector versions, in `kernels/arch/`, give the same bits).
pub(crate) fn exp_fast_slice(xs: &mut [f32]) {
    for x in xs {
        *x = exp_fast(*x);
    }
}

fn ln64(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    if x.is_infinite() {
        return x;
    }
    // x = m · 2^e with m in [√½, √2).
    let (mut m, mut e) = if x < f64::MIN_POSITIVE {
        let bits = (x * pow2(54)).to_bits();
        (bits, -54i64)
    } else {
        (x.to_bits(), 0)
    };
    e += ((m >> 52) & 0x7ff) as i64 - 1023;
    m = (m & ((1 << 52) - 1)) | (1023 << 52);
    let mut m = f64::from_bits(m);
    if m > std::f64::consts::SQRT_2 {
        m /= 2.0;
        e += 1;
    }
    // ln m = 2·atanh(s), s = (m−1)/(m+1), |s| < 0.172: terms to s^23.
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = 1.0 / 23.0;
    for n in (0..11).rev() {
        p = p * s2 + 1.0 / f64::from(2 * n + 1);
    }
    let e = e as f64;
    (e * LN2_HI + 2.0 * s * p) + e * LN2_LO
}

/// Natural logarithm, the same bits on every CPU.
pub fn ln(x: f32) -> f32 {
    ln64(x as f64) as f32
}

/// `base^e`, the same bits on every CPU (for `base > 0`).
pub fn powf(base: f32, e: f32) -> f32 {
    exp64(e as f64 * ln64(base as f64)) as f32
}

/// `tanh x` for `f64` arguments: `e/(e + 2)` with `e = e^{2|x|} − 1`, the
/// series below 1e-4 (where that difference would cancel), ±1 past 22.
fn tanh64(x: f64) -> f64 {
    let a = x.abs();
    let t = if a.is_nan() {
        return x;
    } else if a > 22.0 {
        1.0
    } else if a < 1e-4 {
        let a2 = a * a;
        a - a * a2 * (1.0 / 3.0 - a2 * (2.0 / 15.0))
    } else {
        let e = exp64(2.0 * a) - 1.0;
        e / (e + 2.0)
    };
    t.copysign(x)
}

/// `tanh x`, the same bits on every CPU.
pub fn tanh(x: f32) -> f32 {
    tanh64(x as f64) as f32
}

/// `√(2/π)` and the cubic coefficient of the tanh approximation of GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044_715;

/// GELU, tanh approximation, in `f32` steps as ggml writes it:
/// `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))`.
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))
}

/// ggml's GELU on the CPU: [`gelu`] of the input rounded to `f16`, rounded to
/// `f16` (its 65536-entry table), 0 at or below −10 and `x` at or above 10.
pub fn gelu_f16(x: f32) -> f32 {
    use memwall_format::blocks::{f16_to_f32, f32_to_f16};
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let table = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| f32_to_f16(gelu(f16_to_f32(h))))
            .collect()
    });
    f16_to_f32(table[f32_to_f16(x) as usize])
}

/// `(sin x, cos x)`, the same bits on every CPU (|x| up to ~1e9 radians).
pub fn sin_cos(x: f32) -> (f32, f32) {
    // π/2 in three parts with trailing zeros, so q·part is exact for |q| < 2^20
    // (fdlibm's constants).
    const P1: f64 = f64::from_bits(0x3ff9_21fb_5440_0000);
    const P2: f64 = f64::from_bits(0x3dd0_b461_1a60_0000);
    const P3: f64 = f64::from_bits(0x3ba3_198a_2e00_0000);
    let x = x as f64;
    if !x.is_finite() {
        return (f32::NAN, f32::NAN);
    }
    let q = (x * std::f64::consts::FRAC_2_PI).round();
    let r = ((x - q * P1) - q * P2) - q * P3;
    let r2 = r * r;
    // Taylor series for |r| ≤ π/4 + ε: terms to r^19 and r^18.
    let mut s = 0.0;
    for n in (0..10).rev() {
        let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
        s = s * r2 + sign * INV_FACTORIAL[2 * n + 1];
    }
    let s = s * r;
    let mut c = 0.0;
    for n in (0..10).rev() {
        let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
        c = c * r2 + sign * INV_FACTORIAL[2 * n];
    }
    let (sin, cos) = match (q as i64).rem_euclid(4) {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    };
    (sin as f32, cos as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between two f32.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_one_ulp_of_libm_and_handles_the_edges() {
        let mut worst = 0;
        for i in -20000..20000 {
            let x = i as f32 * 0.0043;
            worst = worst.max(ulps(exp(x), x.exp()));
        }
        assert!(worst <= 1, "{worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(-100.0), (-100f32).exp()); // subnormal
    }

    /// The slice version (AVX2 on x86-64) gives `exp`'s bits: on every f32
    /// bit pattern in a stride through the whole range, around the cut-offs,
    /// and next to the arguments where `x·log2 e` rounds half away from zero.
    #[test]
    fn exp_fast_is_within_two_ulp_and_handles_the_edges() {
        let mut worst = 0;
        let mut x = EXP_FAST_MIN;
        while x <= EXP_FAST_MAX {
            worst = worst.max(ulps(exp_fast(x), exp(x)));
            x = f32::from_bits(if x < 0.0 {
                x.to_bits() - 97
            } else {
                x.to_bits() + 97
            });
            if x > -1e-30 && x < 0.0 {
                x = 0.0;
            }
        }
        assert!(worst <= 2, "{worst}");
        assert_eq!(exp_fast(0.0), 1.0);
        assert_eq!(exp_fast(-0.0), 1.0);
        assert_eq!(exp_fast(-87.4), 0.0);
        assert_eq!(exp_fast(-1e30), 0.0);
        assert_eq!(exp_fast(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_fast(88.8), f32::INFINITY);
        assert_eq!(exp_fast(f32::INFINITY), f32::INFINITY);
        assert!(exp_fast(f32::NAN).is_nan());
        assert!(exp_fast(EXP_FAST_MAX).is_finite());
        assert!(exp_fast(EXP_FAST_MIN) >= f32::MIN_POSITIVE);
    }

    #[test]
    fn exp_fast_in_place_has_the_bits_of_exp_fast() {
        let mut xs: Vec<f32> = (0..=u32::MAX / 4099)
            .map(|i| f32::from_bits(i * 4099))
            .collect();
        xs.extend((-20000..20000).map(|i| i as f32 * 0.0043));
        for edge in [EXP_FAST_MAX, EXP_FAST_MIN, 0.0, -0.0] {
            let b = edge.to_bits();
            xs.extend((b.saturating_sub(40)..b + 40).map(f32::from_bits));
        }
        // Every backend this CPU runs, at every remainder length.
        for kernels in crate::kernels::Backend::supported()
            .into_iter()
            .map(|b| crate::kernels::Kernels::new(b).unwrap())
        {
            let name = kernels.backend().name();
            for cut in [0, 1, 7, 9, 15] {
                let xs = &xs[cut..];
                let mut got = xs.to_vec();
                kernels.exp_fast_in_place(&mut got);
                for (x, g) in xs.iter().zip(&got) {
                    let want = exp_fast(*x);
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "exp_fast({x:e}) = {want:e}, {name} slice version {g:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn ln_and_powf_are_within_one_ulp_of_libm() {
        let mut worst = 0;
        for i in 1..40000 {
            let x = i as f32 * 0.37;
            worst = worst.max(ulps(ln(x), x.ln()));
            worst = worst.max(ulps(powf(x, -0.03125), x.powf(-0.03125)));
        }
        assert!(worst <= 1, "{worst}");
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(powf(10000.0, 0.0), 1.0);
        assert!((ln(1e-40) - 1e-40f32.ln()).abs() < 1e-5);
    }

    #[test]
    fn sin_cos_are_within_one_ulp_of_libm() {
        let mut worst = 0;
        for i in -30000..30000 {
            let x = i as f32 * 0.731;
            let (s, c) = sin_cos(x);
            let (ls, lc) = x.sin_cos();
            // Compare away from zeros, where ulps of a tiny result mean little.
            if ls.abs() > 1e-3 {
                worst = worst.max(ulps(s, ls));
            }
            if lc.abs() > 1e-3 {
                worst = worst.max(ulps(c, lc));
            }
        }
        assert!(worst <= 1, "{worst}");
    }
}
