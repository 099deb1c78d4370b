//! The elementary functions of the forward pass, computed the same way on every
//! CPU. Platform libms differ in the last bit (glibc on x86-64 picks FMA
//! variants at run time, aarch64 glibc and Android's bionic have their own),
//! and with quantized activations one last-bit difference can flip a later Q8
//! rounding and move a perplexity by a visible amount. These work in `f64` with
//! plain multiplies and adds (Rust never fuses them), so every IEEE machine
//! computes the same bits; rounded once to `f32`, they are correctly rounded
//! except within ~1e-16 of a rounding boundary.

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
        p = p * r + 1.0 / factorial(n);
    }
    let e = p * r + 1.0;
    // Scale by 2^k in two steps so that subnormal results stay exact.
    let k = k as i64;
    let half = k / 2;
    e * pow2(half) * pow2(k - half)
}

pub(crate) fn factorial(n: u32) -> f64 {
    (1..=n).map(f64::from).product()
}

/// `2^k` for |k| ≤ 1022.
fn pow2(k: i64) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `e^x`, the same bits on every CPU.
pub fn exp(x: f32) -> f32 {
    exp64(x as f64) as f32
}

/// `x ← e^x` for every element: [`exp`]'s bits, eight at a time with
/// AVX-512, four with AVX2.
pub fn exp_in_place(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::has_avx512() {
        // SAFETY: AVX-512 F was probed just above.
        unsafe { exp_avx512::exp_in_place(xs) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::has_avx2() {
        // SAFETY: AVX2 was probed just above.
        unsafe { exp_avx2::exp_in_place(xs) };
        return;
    }
    for x in xs {
        *x = exp(*x);
    }
}

/// [`exp64`] on four lanes: the same operations in the same order (the
/// rounding of `x·log2 e` half away from zero, as `f64::round`), so the
/// same bits.
#[cfg(target_arch = "x86_64")]
mod exp_avx2 {
    use std::arch::x86_64::*;

    use super::{LN2_HI, LN2_LO, exp, factorial};

    #[target_feature(enable = "avx2")]
    pub(super) fn exp_in_place(xs: &mut [f32]) {
        let c: [f64; 14] = std::array::from_fn(|n| 1.0 / factorial(n as u32));
        let mut chunks = xs.chunks_exact_mut(4);
        for x in &mut chunks {
            // SAFETY: `x` is a chunk of exactly four floats (16 readable bytes).
            let r = exp4(unsafe { _mm_loadu_ps(x.as_ptr()) }, &c);
            // SAFETY: the same 16 bytes, writable.
            unsafe { _mm_storeu_ps(x.as_mut_ptr(), r) };
        }
        for x in chunks.into_remainder() {
            *x = exp(*x);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn exp4(x: __m128, c: &[f64; 14]) -> __m128 {
        let x = _mm256_cvtps_pd(x);
        let xc = _mm256_min_pd(
            _mm256_max_pd(x, _mm256_set1_pd(-745.0)),
            _mm256_set1_pd(709.0),
        );
        let y = _mm256_mul_pd(xc, _mm256_set1_pd(std::f64::consts::LOG2_E));
        // Round half away from zero: truncate, then step away from zero when
        // the (exact) remainder is at least one half.
        let t = _mm256_round_pd::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let sign = _mm256_set1_pd(-0.0);
        let rem = _mm256_andnot_pd(sign, _mm256_sub_pd(y, t));
        let away = _mm256_cmp_pd::<_CMP_GE_OQ>(rem, _mm256_set1_pd(0.5));
        let step = _mm256_or_pd(_mm256_and_pd(y, sign), _mm256_set1_pd(1.0));
        let k = _mm256_add_pd(t, _mm256_and_pd(away, step));
        let r = _mm256_sub_pd(
            _mm256_sub_pd(xc, _mm256_mul_pd(k, _mm256_set1_pd(LN2_HI))),
            _mm256_mul_pd(k, _mm256_set1_pd(LN2_LO)),
        );
        let mut p = _mm256_set1_pd(1.0 / 87_178_291_200.0);
        for n in (1..14).rev() {
            p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(c[n]));
        }
        let e = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(1.0));
        // 2^k in two steps, k / 2 rounded toward zero first.
        let ki = _mm256_cvtpd_epi32(k);
        let half = _mm_srai_epi32::<1>(_mm_add_epi32(ki, _mm_srli_epi32::<31>(ki)));
        let pow2 = |n: __m128i| {
            let n = _mm256_cvtepi32_epi64(_mm_add_epi32(n, _mm_set1_epi32(1023)));
            _mm256_castsi256_pd(_mm256_slli_epi64::<52>(n))
        };
        let v = _mm256_mul_pd(_mm256_mul_pd(e, pow2(half)), pow2(_mm_sub_epi32(ki, half)));
        // Outside the range: ∞ above 709, 0 below −745, NaN stays NaN.
        let v = _mm256_blendv_pd(
            v,
            _mm256_set1_pd(f64::INFINITY),
            _mm256_cmp_pd::<_CMP_GT_OQ>(x, _mm256_set1_pd(709.0)),
        );
        let v = _mm256_blendv_pd(
            v,
            _mm256_setzero_pd(),
            _mm256_cmp_pd::<_CMP_LT_OQ>(x, _mm256_set1_pd(-745.0)),
        );
        let v = _mm256_blendv_pd(v, x, _mm256_cmp_pd::<_CMP_UNORD_Q>(x, x));
        _mm256_cvtpd_ps(v)
    }
}

/// [`exp64`] on eight lanes: the operations of `exp_avx2`, in 512-bit
/// registers.
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod exp_avx512 {
    use std::arch::x86_64::*;

    use super::{LN2_HI, LN2_LO, exp, factorial};

    #[target_feature(enable = "avx2,avx512f")]
    pub(super) fn exp_in_place(xs: &mut [f32]) {
        let c: [f64; 14] = std::array::from_fn(|n| 1.0 / factorial(n as u32));
        let mut chunks = xs.chunks_exact_mut(8);
        for x in &mut chunks {
            // SAFETY: `x` is a chunk of exactly eight floats (32 readable bytes).
            let r = exp8(unsafe { _mm256_loadu_ps(x.as_ptr()) }, &c);
            // SAFETY: the same 32 bytes, writable.
            unsafe { _mm256_storeu_ps(x.as_mut_ptr(), r) };
        }
        for x in chunks.into_remainder() {
            *x = exp(*x);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,avx512f")]
    fn exp8(x: __m256, c: &[f64; 14]) -> __m256 {
        let x = _mm512_cvtps_pd(x);
        let xc = _mm512_min_pd(
            _mm512_max_pd(x, _mm512_set1_pd(-745.0)),
            _mm512_set1_pd(709.0),
        );
        let y = _mm512_mul_pd(xc, _mm512_set1_pd(std::f64::consts::LOG2_E));
        // Round half away from zero: truncate, then step away from zero when
        // the (exact) remainder is at least one half (`+0` elsewhere, as
        // AVX2 adds).
        let t = _mm512_roundscale_pd::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let away = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(
            _mm512_abs_pd(_mm512_sub_pd(y, t)),
            _mm512_set1_pd(0.5),
        );
        let sign = _mm512_and_epi64(_mm512_castpd_si512(y), _mm512_set1_epi64(i64::MIN));
        let step = _mm512_castsi512_pd(_mm512_or_epi64(
            sign,
            _mm512_castpd_si512(_mm512_set1_pd(1.0)),
        ));
        let k = _mm512_add_pd(t, _mm512_maskz_mov_pd(away, step));
        let r = _mm512_sub_pd(
            _mm512_sub_pd(xc, _mm512_mul_pd(k, _mm512_set1_pd(LN2_HI))),
            _mm512_mul_pd(k, _mm512_set1_pd(LN2_LO)),
        );
        let mut p = _mm512_set1_pd(1.0 / 87_178_291_200.0);
        for n in (1..14).rev() {
            p = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(c[n]));
        }
        let e = _mm512_add_pd(_mm512_mul_pd(p, r), _mm512_set1_pd(1.0));
        // 2^k in two steps, k / 2 rounded toward zero first.
        let ki = _mm512_cvtpd_epi32(k);
        let half = _mm256_srai_epi32::<1>(_mm256_add_epi32(ki, _mm256_srli_epi32::<31>(ki)));
        let pow2 = |n: __m256i| {
            let n = _mm512_cvtepi32_epi64(_mm256_add_epi32(n, _mm256_set1_epi32(1023)));
            _mm512_castsi512_pd(_mm512_slli_epi64::<52>(n))
        };
        let v = _mm512_mul_pd(
            _mm512_mul_pd(e, pow2(half)),
            pow2(_mm256_sub_epi32(ki, half)),
        );
        // Outside the range: ∞ above 709, 0 below −745, NaN stays NaN.
        let v = _mm512_mask_mov_pd(
            v,
            _mm512_cmp_pd_mask::<_CMP_GT_OQ>(x, _mm512_set1_pd(709.0)),
            _mm512_set1_pd(f64::INFINITY),
        );
        let v = _mm512_mask_mov_pd(
            v,
            _mm512_cmp_pd_mask::<_CMP_LT_OQ>(x, _mm512_set1_pd(-745.0)),
            _mm512_setzero_pd(),
        );
        let v = _mm512_mask_mov_pd(v, _mm512_cmp_pd_mask::<_CMP_UNORD_Q>(x, x), x);
        _mm512_cvtpd_ps(v)
    }
}

/// Natural logarithm of a positive finite `f64`.
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
        s = s * r2 + sign / factorial(2 * n + 1);
    }
    let s = s * r;
    let mut c = 0.0;
    for n in (0..10).rev() {
        let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
        c = c * r2 + sign / factorial(2 * n);
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
    fn exp_in_place_has_the_bits_of_exp() {
        let mut xs: Vec<f32> = (0..=u32::MAX / 4099)
            .map(|i| f32::from_bits(i * 4099))
            .collect();
        xs.extend((-20000..20000).map(|i| i as f32 * 0.0043));
        for edge in [709.0f32, -745.0, 88.72, -103.97, 0.0] {
            let b = edge.to_bits();
            xs.extend(
                (0..64).flat_map(|d| [f32::from_bits(b + d), f32::from_bits(b.wrapping_sub(d))]),
            );
        }
        for k in -150..130 {
            let x = ((k as f64 + 0.5) * std::f64::consts::LN_2) as f32;
            let b = x.to_bits();
            xs.extend((0..8).flat_map(|d| [f32::from_bits(b + d), f32::from_bits(b - d)]));
        }
        xs.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -0.0,
            f32::MIN_POSITIVE,
        ]);
        // Every build this CPU runs, not only the one `exp_in_place` picks.
        type Build = fn(&mut [f32]);
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut builds: Vec<(&str, Build)> = vec![("dispatched", exp_in_place)];
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::has_avx2() {
            // SAFETY: AVX2 probed.
            builds.push(("avx2", |x| unsafe { exp_avx2::exp_in_place(x) }));
        }
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::has_avx512() {
            // SAFETY: AVX-512 probed.
            builds.push(("avx512", |x| unsafe { exp_avx512::exp_in_place(x) }));
        }
        for (name, build) in builds {
            let mut got = xs.clone();
            build(&mut got);
            for (x, g) in xs.iter().zip(&got) {
                let want = exp(*x);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "exp({x:e}) = {want:e}, {name} slice version {g:e}"
                );
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
