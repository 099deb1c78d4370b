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

/// `log2 e`, `ln 2` split so that `k · LN2_HI_F32` is exact for |k| < 2^15,
/// and the constant whose addition rounds an `f32` below 2^22 to an integer
/// (ties to even).
const LOG2E_F32: f32 = std::f32::consts::LOG2_E;
const LN2_HI_F32: f32 = 0.693_359_4; // 0x3f31_8000
const LN2_LO_F32: f32 = -2.121_944_4e-4;
const ROUND_F32: f32 = 12_582_912.0; // 1.5 · 2^23
/// Above this `e^x` overflows `f32`; below the other bound it is under the
/// smallest normal, and `exp_fast` returns 0.
const EXP_FAST_MAX: f32 = 88.722_83;
const EXP_FAST_MIN: f32 = -87.336_54;
/// `1/n!` for the Taylor terms of `e^r`, highest first (n = 7..=2).
const EXP_FAST_C: [f32; 6] = [
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

/// `x ← exp_fast(x)` for every element: [`exp_fast`]'s bits, sixteen at a
/// time with AVX-512, eight with AVX2.
pub fn exp_fast_in_place(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::has_avx512() {
        // SAFETY: AVX-512 F was probed just above.
        unsafe { exp_fast_x86::in_place_avx512(xs) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::has_avx2() {
        // SAFETY: AVX2 was probed just above.
        unsafe { exp_fast_x86::in_place_avx2(xs) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if crate::kernels::has_neon() {
        // SAFETY: NEON was probed just above.
        unsafe { exp_fast_neon::in_place(xs) };
        return;
    }
    for x in xs {
        *x = exp_fast(*x);
    }
}

/// [`exp_fast`] on four lanes of NEON: the same operations in the same order
/// (separate multiplies and adds), so the same bits.
#[cfg(target_arch = "aarch64")]
mod exp_fast_neon {
    use std::arch::aarch64::*;

    use super::{
        EXP_FAST_C, EXP_FAST_MAX, EXP_FAST_MIN, LN2_HI_F32, LN2_LO_F32, LOG2E_F32, ROUND_F32,
        exp_fast,
    };

    #[target_feature(enable = "neon")]
    pub(super) fn in_place(xs: &mut [f32]) {
        let mut chunks = xs.chunks_exact_mut(4);
        for x in &mut chunks {
            // SAFETY: `x` is a chunk of exactly four floats (16 readable bytes).
            let v = exp4(unsafe { vld1q_f32(x.as_ptr()) });
            // SAFETY: the same 16 bytes, writable.
            unsafe { vst1q_f32(x.as_mut_ptr(), v) };
        }
        for x in chunks.into_remainder() {
            *x = exp_fast(*x);
        }
    }

    #[inline]
    #[target_feature(enable = "neon")]
    fn exp4(x: float32x4_t) -> float32x4_t {
        let set = vdupq_n_f32;
        let xc = vminq_f32(vmaxq_f32(x, set(EXP_FAST_MIN)), set(EXP_FAST_MAX));
        let round = set(ROUND_F32);
        let k = vsubq_f32(vaddq_f32(vmulq_f32(xc, set(LOG2E_F32)), round), round);
        let r = vsubq_f32(
            vsubq_f32(xc, vmulq_f32(k, set(LN2_HI_F32))),
            vmulq_f32(k, set(LN2_LO_F32)),
        );
        let mut p = set(EXP_FAST_C[0]);
        for &c in &EXP_FAST_C[1..] {
            p = vaddq_f32(vmulq_f32(p, r), set(c));
        }
        let p = vaddq_f32(vmulq_f32(vaddq_f32(vmulq_f32(p, r), set(1.0)), r), set(1.0));
        // `k` is a whole number: the conversion is exact.
        let ki = vcvtq_s32_f32(k);
        let half = vshrq_n_s32::<1>(vaddq_s32(
            ki,
            vreinterpretq_s32_u32(vshrq_n_u32::<31>(vreinterpretq_u32_s32(ki))),
        ));
        let pow2 =
            |n: int32x4_t| vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n, vdupq_n_s32(127))));
        let v = vmulq_f32(vmulq_f32(p, pow2(half)), pow2(vsubq_s32(ki, half)));
        let v = vbslq_f32(vcgtq_f32(x, set(EXP_FAST_MAX)), set(f32::INFINITY), v);
        let v = vbslq_f32(vcltq_f32(x, set(EXP_FAST_MIN)), vdupq_n_f32(0.0), v);
        // NaN lanes (not equal to themselves) stay NaN.
        vbslq_f32(vceqq_f32(x, x), v, x)
    }
}

/// [`exp_fast`] on eight and sixteen lanes: the same operations in the same
/// order, so the same bits.
#[cfg(target_arch = "x86_64")]
mod exp_fast_x86 {
    use std::arch::x86_64::*;

    use super::{
        EXP_FAST_C, EXP_FAST_MAX, EXP_FAST_MIN, LN2_HI_F32, LN2_LO_F32, LOG2E_F32, ROUND_F32,
        exp_fast,
    };

    #[target_feature(enable = "avx2")]
    pub(super) fn in_place_avx2(xs: &mut [f32]) {
        let mut chunks = xs.chunks_exact_mut(8);
        for x in &mut chunks {
            // SAFETY: `x` is a chunk of exactly eight floats (32 readable bytes).
            let v = exp8(unsafe { _mm256_loadu_ps(x.as_ptr()) });
            // SAFETY: the same 32 bytes, writable.
            unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) };
        }
        for x in chunks.into_remainder() {
            *x = exp_fast(*x);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn exp8(x: __m256) -> __m256 {
        let set = _mm256_set1_ps;
        // Clamped into range first (the lanes outside are replaced below).
        let xc = _mm256_min_ps(_mm256_max_ps(x, set(EXP_FAST_MIN)), set(EXP_FAST_MAX));
        let round = set(ROUND_F32);
        let k = _mm256_sub_ps(
            _mm256_add_ps(_mm256_mul_ps(xc, set(LOG2E_F32)), round),
            round,
        );
        let r = _mm256_sub_ps(
            _mm256_sub_ps(xc, _mm256_mul_ps(k, set(LN2_HI_F32))),
            _mm256_mul_ps(k, set(LN2_LO_F32)),
        );
        let mut p = set(EXP_FAST_C[0]);
        for &c in &EXP_FAST_C[1..] {
            p = _mm256_add_ps(_mm256_mul_ps(p, r), set(c));
        }
        let p = _mm256_add_ps(
            _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(p, r), set(1.0)), r),
            set(1.0),
        );
        let ki = _mm256_cvtps_epi32(k);
        let half = _mm256_srai_epi32::<1>(_mm256_add_epi32(ki, _mm256_srli_epi32::<31>(ki)));
        let pow2 = |n: __m256i| {
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                n,
                _mm256_set1_epi32(127),
            )))
        };
        let v = _mm256_mul_ps(
            _mm256_mul_ps(p, pow2(half)),
            pow2(_mm256_sub_epi32(ki, half)),
        );
        let v = _mm256_blendv_ps(
            v,
            set(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x, set(EXP_FAST_MAX)),
        );
        let v = _mm256_blendv_ps(
            v,
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LT_OQ>(x, set(EXP_FAST_MIN)),
        );
        _mm256_blendv_ps(v, x, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
    }

    #[clippy::msrv = "1.89"]
    #[target_feature(enable = "avx2,avx512f")]
    pub(super) fn in_place_avx512(xs: &mut [f32]) {
        let mut chunks = xs.chunks_exact_mut(16);
        for x in &mut chunks {
            // SAFETY: `x` is a chunk of exactly sixteen floats (64 readable bytes).
            let v = exp16(unsafe { _mm512_loadu_ps(x.as_ptr()) });
            // SAFETY: the same 64 bytes, writable.
            unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) };
        }
        let rest = chunks.into_remainder();
        if rest.len() >= 8 {
            let (eight, rest) = rest.split_at_mut(8);
            in_place_avx2(eight);
            for x in rest {
                *x = exp_fast(*x);
            }
        } else {
            for x in rest {
                *x = exp_fast(*x);
            }
        }
    }

    #[inline]
    #[clippy::msrv = "1.89"]
    #[target_feature(enable = "avx2,avx512f")]
    fn exp16(x: __m512) -> __m512 {
        let set = _mm512_set1_ps;
        let xc = _mm512_min_ps(_mm512_max_ps(x, set(EXP_FAST_MIN)), set(EXP_FAST_MAX));
        let round = set(ROUND_F32);
        let k = _mm512_sub_ps(
            _mm512_add_ps(_mm512_mul_ps(xc, set(LOG2E_F32)), round),
            round,
        );
        let r = _mm512_sub_ps(
            _mm512_sub_ps(xc, _mm512_mul_ps(k, set(LN2_HI_F32))),
            _mm512_mul_ps(k, set(LN2_LO_F32)),
        );
        let mut p = set(EXP_FAST_C[0]);
        for &c in &EXP_FAST_C[1..] {
            p = _mm512_add_ps(_mm512_mul_ps(p, r), set(c));
        }
        let p = _mm512_add_ps(
            _mm512_mul_ps(_mm512_add_ps(_mm512_mul_ps(p, r), set(1.0)), r),
            set(1.0),
        );
        let ki = _mm512_cvtps_epi32(k);
        let half = _mm512_srai_epi32::<1>(_mm512_add_epi32(ki, _mm512_srli_epi32::<31>(ki)));
        let pow2 = |n: __m512i| {
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                n,
                _mm512_set1_epi32(127),
            )))
        };
        let v = _mm512_mul_ps(
            _mm512_mul_ps(p, pow2(half)),
            pow2(_mm512_sub_epi32(ki, half)),
        );
        let v = _mm512_mask_mov_ps(
            v,
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, set(EXP_FAST_MAX)),
            set(f32::INFINITY),
        );
        let v = _mm512_mask_mov_ps(
            v,
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, set(EXP_FAST_MIN)),
            _mm512_setzero_ps(),
        );
        _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x)
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
        // Every build this CPU runs, at every remainder length.
        type Build = fn(&mut [f32]);
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut builds: Vec<(&str, Build)> = vec![("dispatched", exp_fast_in_place)];
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::has_avx2() {
            // SAFETY: AVX2 probed.
            builds.push(("avx2", |x| unsafe { exp_fast_x86::in_place_avx2(x) }));
        }
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::has_avx512() {
            // SAFETY: AVX-512 probed.
            builds.push(("avx512", |x| unsafe { exp_fast_x86::in_place_avx512(x) }));
        }
        #[cfg(target_arch = "aarch64")]
        if crate::kernels::has_neon() {
            // SAFETY: NEON probed.
            builds.push(("neon", |x| unsafe { exp_fast_neon::in_place(x) }));
        }
        for (name, build) in builds {
            for cut in [0, 1, 7, 9, 15] {
                let xs = &xs[cut..];
                let mut got = xs.to_vec();
                build(&mut got);
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
