//! AVX2 (+ FMA, F16C) kernels for every type.
//!
//! The integer work follows one pattern: weights as unsigned (or signed)
//! bytes, `vpmaddubsw` against the signed activation bytes into 16-bit pairs
//! (never saturating: |w| ≤ 128 and |a| ≤ 127 for signed weights go through
//! `vpsignb`, unsigned weights stay ≤ 63), `vpmaddwd` against 1 or the
//! sub-block scale into 32-bit sums. Offsets (Q3_K's −4, Q6_K's −32) are
//! taken out afterwards through the activations' `bsums`. Each block's
//! integer sum is converted to `f32` once and accumulated with FMA.

use std::arch::x86_64::*;

use super::super::scalar::{iq4xs_scales, k4_scales, q3k_scales};
use crate::blocks::IQ4NL_GRID;
use crate::kernels::{BlockQ8_0, BlockQ8_1, BlockQ8K, DotTable};

/// Declares a safe entry point for a `#[target_feature]` kernel.
macro_rules! entry {
    ($name:ident, $kernel:ident, $w:ty, $a:ty) => {
        fn $name(w: $w, a: $a) -> f32 {
            // SAFETY: this function is only reachable through `TABLE`, which
            // `Kernels::new` hands out after probing AVX2, FMA and F16C.
            unsafe { $kernel(w, a) }
        }
    };
}

entry!(e_f32w, f32w, &[u8], &[f32]);
entry!(e_f16w, f16w, &[u8], &[u16]);
entry!(e_bf16w, bf16w, &[u8], &[u16]);
entry!(e_q4_0, q4_0, &[u8], &[BlockQ8_0]);
entry!(e_q5_0, q5_0, &[u8], &[BlockQ8_0]);
entry!(e_q8_0, q8_0, &[u8], &[BlockQ8_0]);
entry!(e_iq4_nl, iq4_nl, &[u8], &[BlockQ8_0]);
entry!(e_q4_1, q4_1, &[u8], &[BlockQ8_1]);
entry!(e_q5_1, q5_1, &[u8], &[BlockQ8_1]);
entry!(e_q2_k, q2_k, &[u8], &[BlockQ8K]);
entry!(e_q3_k, q3_k, &[u8], &[BlockQ8K]);
entry!(e_q4_k, q4_k, &[u8], &[BlockQ8K]);
entry!(e_q5_k, q5_k, &[u8], &[BlockQ8K]);
entry!(e_q6_k, q6_k, &[u8], &[BlockQ8K]);
entry!(e_iq4_xs, iq4_xs, &[u8], &[BlockQ8K]);
entry!(e_dot_f32, dot_f32, &[f32], &[f32]);
entry!(e_dot_f16_f32, dot_f16_f32, &[u16], &[f32]);
entry!(e_dot_f16_f16, dot_f16_f16, &[u16], &[u16]);

/// The AVX2 table: every type.
pub(crate) static TABLE: DotTable = DotTable {
    f32: e_f32w,
    f16: e_f16w,
    bf16: e_bf16w,
    q4_0: e_q4_0,
    q5_0: e_q5_0,
    q8_0: e_q8_0,
    iq4_nl: e_iq4_nl,
    q4_1: e_q4_1,
    q5_1: e_q5_1,
    q2_k: e_q2_k,
    q3_k: e_q3_k,
    q4_k: e_q4_k,
    q5_k: e_q5_k,
    q6_k: e_q6_k,
    iq4_xs: e_iq4_xs,
    dot_f32: e_dot_f32,
    dot_f16_f32: e_dot_f16_f32,
    dot_f16_f16: e_dot_f16_f16,
};

// ---- loads (the only pointer use; each checks its length) ----

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ld256<T: Copy>(s: &[T]) -> __m256i {
    assert!(size_of_val(s) >= 32);
    // SAFETY: at least 32 readable bytes (checked); unaligned load.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ld128<T: Copy>(s: &[T]) -> __m128i {
    assert!(size_of_val(s) >= 16);
    // SAFETY: at least 16 readable bytes (checked); unaligned load.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ldps<T: Copy>(s: &[T]) -> __m256 {
    assert!(size_of_val(s) >= 32);
    // SAFETY: at least 32 readable bytes (checked); unaligned load.
    unsafe { _mm256_loadu_ps(s.as_ptr().cast()) }
}

// ---- helpers ----

#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn h2f(h: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    h2f(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Σ x·y in 32-bit lanes for signed bytes, |y| ≤ 127 (x may be −128).
#[inline]
#[target_feature(enable = "avx2")]
fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Σ x·y in 32-bit lanes for unsigned x ≤ 127, signed y.
#[inline]
#[target_feature(enable = "avx2")]
fn mul_sum_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// 32 weights from 16 nibble bytes: low nibbles (weights 0..16) in the low
/// half, high nibbles (16..32) in the high half.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(q: &[u8]) -> __m256i {
    let q = ld128(q);
    let v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    _mm256_and_si256(v, _mm256_set1_epi8(0xf))
}

/// Byte `j` = 0xff where bit `j` of `bits` is set.
#[inline]
#[target_feature(enable = "avx2")]
fn bit_bytes(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let v = _mm256_shuffle_epi8(v, shuf);
    let m = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m)
}

/// For 16 sixteen-bit scales `s` (one per 16 weights of a super-block) and
/// sub-block pair `p`: `s[2p]` in the low eight lanes, `s[2p+1]` in the high.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pair(s: __m256i, p: i32) -> __m256i {
    let v = _mm256_permutevar8x32_epi32(s, _mm256_set1_epi32(p));
    let shuf = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
        2, 3,
    );
    _mm256_shuffle_epi8(v, shuf)
}

/// Shifts each 16-bit lane right by `n` (a run-time count).
#[inline]
#[target_feature(enable = "avx2")]
fn srl16(v: __m256i, n: i32) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(n))
}

/// Folds blocks into two FMA accumulators (alternating, for latency), then sums them.
macro_rules! fold_blocks {
    ($w:expr, $a:expr, $ts:expr, |$b:ident, $y:ident, $acc:ident| $body:expr) => {{
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut it = $w.chunks_exact($ts).zip($a.iter());
        loop {
            let Some(($b, $y)) = it.next() else { break };
            let $acc = acc0;
            acc0 = $body;
            let Some(($b, $y)) = it.next() else { break };
            let $acc = acc1;
            acc1 = $body;
        }
        hsum_ps(_mm256_add_ps(acc0, acc1))
    }};
}

// ---- Q8_0 family ----

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    fold_blocks!(w, a, 18, |b, y, acc| {
        let q = _mm256_sub_epi8(nibbles(&b[2..18]), _mm256_set1_epi8(8));
        let p = mul_sum_i8(q, ld256(&y.qs));
        let d = _mm256_set1_ps(f16_at(b, 0) * h2f(y.d));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    fold_blocks!(w, a, 22, |b, y, acc| {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        // A clear fifth bit means q − 16 < 0: set the byte's high nibble (−16 in two's complement).
        let hi = _mm256_andnot_si256(bit_bytes(qh), _mm256_set1_epi8(0xf0u8 as i8));
        let q = _mm256_or_si256(nibbles(&b[6..22]), hi);
        let p = mul_sum_i8(q, ld256(&y.qs));
        let d = _mm256_set1_ps(f16_at(b, 0) * h2f(y.d));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    fold_blocks!(w, a, 34, |b, y, acc| {
        let p = mul_sum_i8(ld256(&b[2..34]), ld256(&y.qs));
        let d = _mm256_set1_ps(f16_at(b, 0) * h2f(y.d));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc)
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let grid = ld128(&IQ4NL_GRID);
    fold_blocks!(w, a, 18, |b, y, acc| {
        let q = ld128(&b[2..18]);
        let m = _mm_set1_epi8(0xf);
        let lo = _mm_shuffle_epi8(grid, _mm_and_si128(q, m));
        let hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(q, 4), m));
        let p = mul_sum_i8(_mm256_set_m128i(hi, lo), ld256(&y.qs));
        let d = _mm256_set1_ps(h2f(y.d) * f16_at(b, 0));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc)
    })
}

// ---- Q8_1 family ----

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let mut mins = 0f32;
    let s = fold_blocks!(w, a, 20, |b, y, acc| {
        let p = mul_sum_u8_i8(nibbles(&b[4..20]), ld256(&y.qs));
        mins += f16_at(b, 2) * h2f(y.s);
        let d = _mm256_set1_ps(f16_at(b, 0) * h2f(y.d));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc)
    });
    s + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let mut mins = 0f32;
    let s = fold_blocks!(w, a, 24, |b, y, acc| {
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let hi = _mm256_and_si256(bit_bytes(qh), _mm256_set1_epi8(0x10));
        let q = _mm256_or_si256(nibbles(&b[8..24]), hi);
        let p = mul_sum_u8_i8(q, ld256(&y.qs));
        mins += f16_at(b, 2) * h2f(y.s);
        let d = _mm256_set1_ps(f16_at(b, 0) * h2f(y.d));
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc)
    });
    s + mins
}

// ---- K-quants (Q8_K activations) ----

#[target_feature(enable = "avx2,fma,f16c")]
fn q2_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for (b, y) in w.chunks_exact(84).zip(a) {
        let sc = ld128(&b[..16]);
        let s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, _mm_set1_epi8(0xf)));
        let m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0xf)));
        let mins = _mm256_madd_epi16(m16, ld256(&y.bsums));
        let mut isum = _mm256_setzero_si256();
        for k in 0..2 {
            let q2 = ld256(&b[16 + 32 * k..48 + 32 * k]);
            for j in 0..4 {
                let v = _mm256_and_si256(srl16(q2, 2 * j as i32), _mm256_set1_epi8(3));
                let p = _mm256_maddubs_epi16(v, ld256(&y.qs[128 * k + 32 * j..]));
                let s = scale_pair(s16, (4 * k + j) as i32);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, s));
            }
        }
        let dy = y.d;
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(dy * f16_at(b, 80)),
            _mm256_cvtepi32_ps(isum),
            acc,
        );
        accm = _mm256_fmadd_ps(
            _mm256_set1_ps(dy * f16_at(b, 82)),
            _mm256_cvtepi32_ps(mins),
            accm,
        );
    }
    hsum_ps(acc) - hsum_ps(accm)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q3_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, y) in w.chunks_exact(110).zip(a) {
        let sc = q3k_scales(&b[96..108]);
        let s16 = _mm256_cvtepi8_epi16(ld128(&sc));
        let hm = ld256(&b[..32]);
        // Σ (u − 4)·y·s = Σ u·y·s − 4·Σ s·bsums, with u = q₂ + 4·hbit in 0..8.
        let corr = _mm256_slli_epi32(_mm256_madd_epi16(s16, ld256(&y.bsums)), 2);
        let mut isum = _mm256_sub_epi32(_mm256_setzero_si256(), corr);
        for k in 0..2 {
            let q2 = ld256(&b[32 + 32 * k..64 + 32 * k]);
            for j in 0..4 {
                let v = _mm256_and_si256(srl16(q2, 2 * j as i32), _mm256_set1_epi8(3));
                let h = _mm256_and_si256(srl16(hm, (4 * k + j) as i32), _mm256_set1_epi8(1));
                let u = _mm256_or_si256(v, _mm256_slli_epi16(h, 2));
                let p = _mm256_maddubs_epi16(u, ld256(&y.qs[128 * k + 32 * j..]));
                let s = scale_pair(s16, (4 * k + j) as i32);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, s));
            }
        }
        let d = _mm256_set1_ps(f16_at(b, 108) * y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
    }
    hsum_ps(acc)
}

/// The minimum correction `Σ_j bsums[j]·m[j/2]` of a Q4_K/Q5_K block, in eight lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn k4_mins(m: &[u8; 8], y: &BlockQ8K) -> __m256i {
    let pairs = _mm256_madd_epi16(ld256(&y.bsums), _mm256_set1_epi16(1));
    let m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(*m)));
    _mm256_mullo_epi32(pairs, m32)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for (b, y) in w.chunks_exact(144).zip(a) {
        let (sc, m) = k4_scales(&b[4..16]);
        let mins = k4_mins(&m, y);
        let mut isum = _mm256_setzero_si256();
        for c in 0..4 {
            let q = ld256(&b[16 + 32 * c..48 + 32 * c]);
            let lo = _mm256_and_si256(q, _mm256_set1_epi8(0xf));
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0xf));
            let p_lo = _mm256_maddubs_epi16(lo, ld256(&y.qs[64 * c..]));
            let p_hi = _mm256_maddubs_epi16(hi, ld256(&y.qs[64 * c + 32..]));
            let s_lo = _mm256_madd_epi16(p_lo, _mm256_set1_epi16(i16::from(sc[2 * c])));
            let s_hi = _mm256_madd_epi16(p_hi, _mm256_set1_epi16(i16::from(sc[2 * c + 1])));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(s_lo, s_hi));
        }
        let dy = y.d;
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(f16_at(b, 0) * dy),
            _mm256_cvtepi32_ps(isum),
            acc,
        );
        accm = _mm256_fmadd_ps(
            _mm256_set1_ps(f16_at(b, 2) * dy),
            _mm256_cvtepi32_ps(mins),
            accm,
        );
    }
    hsum_ps(acc) - hsum_ps(accm)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for (b, y) in w.chunks_exact(176).zip(a) {
        let (sc, m) = k4_scales(&b[4..16]);
        let mins = k4_mins(&m, y);
        let qh = ld256(&b[16..48]);
        let one = _mm256_set1_epi8(1);
        let mut isum = _mm256_setzero_si256();
        for c in 0..4 {
            let q = ld256(&b[48 + 32 * c..80 + 32 * c]);
            let h_lo = _mm256_and_si256(srl16(qh, 2 * c as i32), one);
            let h_hi = _mm256_and_si256(srl16(qh, 2 * c as i32 + 1), one);
            let lo = _mm256_and_si256(q, _mm256_set1_epi8(0xf));
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0xf));
            let lo = _mm256_or_si256(lo, _mm256_slli_epi16(h_lo, 4));
            let hi = _mm256_or_si256(hi, _mm256_slli_epi16(h_hi, 4));
            let p_lo = _mm256_maddubs_epi16(lo, ld256(&y.qs[64 * c..]));
            let p_hi = _mm256_maddubs_epi16(hi, ld256(&y.qs[64 * c + 32..]));
            let s_lo = _mm256_madd_epi16(p_lo, _mm256_set1_epi16(i16::from(sc[2 * c])));
            let s_hi = _mm256_madd_epi16(p_hi, _mm256_set1_epi16(i16::from(sc[2 * c + 1])));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(s_lo, s_hi));
        }
        let dy = y.d;
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(f16_at(b, 0) * dy),
            _mm256_cvtepi32_ps(isum),
            acc,
        );
        accm = _mm256_fmadd_ps(
            _mm256_set1_ps(f16_at(b, 2) * dy),
            _mm256_cvtepi32_ps(mins),
            accm,
        );
    }
    hsum_ps(acc) - hsum_ps(accm)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, y) in w.chunks_exact(210).zip(a) {
        let s16 = _mm256_cvtepi8_epi16(ld128(&b[192..208]));
        // Σ (u − 32)·y·s = Σ u·y·s − 32·Σ s·bsums, with u the unsigned 6-bit value.
        let corr = _mm256_slli_epi32(_mm256_madd_epi16(s16, ld256(&y.bsums)), 5);
        let mut isum = _mm256_sub_epi32(_mm256_setzero_si256(), corr);
        let m4 = _mm256_set1_epi8(0xf);
        for n in 0..2 {
            let ql0 = ld256(&b[64 * n..64 * n + 32]);
            let ql1 = ld256(&b[64 * n + 32..64 * n + 64]);
            let qh = ld256(&b[128 + 32 * n..160 + 32 * n]);
            let h = |mask: i8| _mm256_and_si256(qh, _mm256_set1_epi8(mask));
            let u = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(h(0x03), 4)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(h(0x0c), 2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), h(0x30)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_srli_epi16(h(0xc0u8 as i8), 2),
                ),
            ];
            for (quarter, u) in u.into_iter().enumerate() {
                let p = _mm256_maddubs_epi16(u, ld256(&y.qs[128 * n + 32 * quarter..]));
                let s = scale_pair(s16, (4 * n + quarter) as i32);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, s));
            }
        }
        let d = _mm256_set1_ps(f16_at(b, 208) * y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_xs(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let grid = ld128(&IQ4NL_GRID);
    let m = _mm_set1_epi8(0xf);
    let mut acc = _mm256_setzero_ps();
    for (b, y) in w.chunks_exact(136).zip(a) {
        let sc = iq4xs_scales(b);
        let mut isum = _mm256_setzero_si256();
        for (ib, &s) in sc.iter().enumerate() {
            let q = ld128(&b[8 + 16 * ib..24 + 16 * ib]);
            let lo = _mm_shuffle_epi8(grid, _mm_and_si128(q, m));
            let hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(q, 4), m));
            let v = _mm256_set_m128i(hi, lo);
            let yv = ld256(&y.qs[32 * ib..]);
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(yv, v));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(s as i16)));
        }
        let d = _mm256_set1_ps(f16_at(b, 0) * y.d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
    }
    hsum_ps(acc)
}

// ---- float types ----

/// Σ x·y over `n` elements, 32 at a time in four accumulators, `load_x`/`load_y`
/// giving eight `f32` from element `i`; the tail goes through `tail`.
macro_rules! float_dot {
    ($n:expr, |$i:ident| $x:expr, $y:expr, |$t:ident| $tail:expr) => {{
        let n = $n;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut $i = 0;
        while $i + 32 <= n {
            let base = $i;
            for (k, acc) in acc.iter_mut().enumerate() {
                $i = base + 8 * k;
                *acc = _mm256_fmadd_ps($x, $y, *acc);
            }
            $i = base + 32;
        }
        while $i + 8 <= n {
            acc[0] = _mm256_fmadd_ps($x, $y, acc[0]);
            $i += 8;
        }
        let mut s = hsum_ps(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        for $t in $i..n {
            s += $tail;
        }
        s
    }};
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn cvt_h(s: &[u8]) -> __m256 {
    _mm256_cvtph_ps(ld128(s))
}

#[inline]
#[target_feature(enable = "avx2")]
fn cvt_bf(s: &[u8]) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(ld128(s)), 16))
}

fn f32_le(w: &[u8], t: usize) -> f32 {
    f32::from_le_bytes([w[4 * t], w[4 * t + 1], w[4 * t + 2], w[4 * t + 3]])
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f32w(w: &[u8], a: &[f32]) -> f32 {
    let n = a.len().min(w.len() / 4);
    float_dot!(
        n,
        |i| ldps(&w[4 * i..4 * i + 32]),
        ldps(&a[i..i + 8]),
        |t| f32_le(w, t) * a[t]
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f16w(w: &[u8], a: &[u16]) -> f32 {
    let n = a.len().min(w.len() / 2);
    float_dot!(
        n,
        |i| cvt_h(&w[2 * i..2 * i + 16]),
        _mm256_cvtph_ps(ld128(&a[i..i + 8])),
        |t| f16_at(w, 2 * t) * h2f(a[t])
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn bf16w(w: &[u8], a: &[u16]) -> f32 {
    let n = a.len().min(w.len() / 2);
    let bf = |h: u16| f32::from_bits(u32::from(h) << 16);
    float_dot!(
        n,
        |i| cvt_bf(&w[2 * i..2 * i + 16]),
        _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(ld128(&a[i..i + 8])),
            16
        )),
        |t| bf(u16::from_le_bytes([w[2 * t], w[2 * t + 1]])) * bf(a[t])
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    float_dot!(n, |i| ldps(&x[i..i + 8]), ldps(&y[i..i + 8]), |t| x[t]
        * y[t])
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f16_f32(x: &[u16], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    float_dot!(
        n,
        |i| _mm256_cvtph_ps(ld128(&x[i..i + 8])),
        ldps(&y[i..i + 8]),
        |t| h2f(x[t]) * y[t]
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f16_f16(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    float_dot!(
        n,
        |i| _mm256_cvtph_ps(ld128(&x[i..i + 8])),
        _mm256_cvtph_ps(ld128(&y[i..i + 8])),
        |t| h2f(x[t]) * h2f(y[t])
    )
}
