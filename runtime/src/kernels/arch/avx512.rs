//! AVX-512 (F, BW, VL, VNNI) kernels. So far only Q4_K (a 64-weight chunk
//! per register, `vpdpbusd`); every other entry is the AVX2 kernel, which
//! these CPUs run too. Q4_0 and Q8_0 with two blocks per 512-bit register
//! measured 2× slower than AVX2 on the reference machine (a virtualised
//! Xeon) and were dropped; at decode the float and 6-bit types are bound by
//! memory already.
//!
//! Float accumulation: AVX2's canonical-order row loop (`blocks256`), fed
//! with the 512-bit integer sums folded (exactly) to 256 bits, so the results
//! are the scalar kernel's bits.
//!
//! The AVX-512 intrinsics are stable since Rust 1.89 (the workspace still
//! declares 1.85; the SIMD kernels as a whole need 1.89).

use std::arch::x86_64::*;

use super::avx2::{self, ld256};
use crate::kernels::scalar::k4_scales;
use crate::kernels::{BlockQ8K, DotTable};

macro_rules! entry {
    ($name:ident, $kernel:ident, $w:ty, $a:ty) => {
        fn $name(w: $w, a: $a) -> f32 {
            // SAFETY: this function is only reachable through `TABLE`, which
            // `Kernels::new` hands out after probing AVX2, FMA, F16C and
            // AVX-512 F/BW/VL/VNNI.
            unsafe { $kernel(w, a) }
        }
    };
}

entry!(e_q4_k, q4_k, &[u8], &[BlockQ8K]);

/// The AVX-512 table: its own Q4_K, AVX2 for the rest.
pub(crate) static TABLE: DotTable = DotTable {
    q4_k: e_q4_k,
    ..avx2::TABLE
};

#[inline]
#[target_feature(enable = "avx512f")]
fn ld512<T: Copy>(s: &[T]) -> __m512i {
    assert!(size_of_val(s) >= 64);
    // SAFETY: at least 64 readable bytes (checked); unaligned load.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    avx2::blocks256::<true>(
        w,
        a,
        144,
        |b, y| q4_k_sums(b, y),
        |b| [avx2::le16(b, 0), avx2::le16(b, 2)],
    )
}

/// A Q4_K super-block's integer sum (its sixteen lanes folded to eight, exact)
/// and minimum sum.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_k_sums(b: &[u8], y: &BlockQ8K) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0xf);
    let (sc, m) = k4_scales(&b[4..16]);
    let sc32 = _mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
        sc,
    ))));
    let mut isum = _mm512_setzero_si512();
    for c in 0..4 {
        let q = ld256(&b[16 + 32 * c..48 + 32 * c]);
        let lo = _mm256_and_si256(q, m4);
        let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        let dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), join(lo, hi), ld512(&y.qs[64 * c..]));
        let (s0, s1) = (2 * c as i32, 2 * c as i32 + 1);
        let idx = _mm512_set_epi32(
            s1, s1, s1, s1, s1, s1, s1, s1, s0, s0, s0, s0, s0, s0, s0, s0,
        );
        let s = _mm512_permutexvar_epi32(idx, sc32);
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(dp, s));
    }
    let isum = _mm256_add_epi32(
        _mm512_castsi512_si256(isum),
        _mm512_extracti64x4_epi64::<1>(isum),
    );
    (isum, avx2::k4_mins(&m, y))
}
