//! AVX-512 (F, BW, VL, VNNI) kernels. So far Q4_K (a 64-weight chunk per
//! register, `vpdpbusd`) and the several-row products of the Q8_0 family
//! (prompt batches: AVX2's code with 256-bit `vpdpbusd` for the block sums);
//! every other entry is the AVX2 kernel, which these CPUs run too. Q4_0 and Q8_0 with two blocks per 512-bit register
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

use super::avx2::{
    self, first_lanes, h2f, halves, hsum_epi32, lanes_ps, ld256, ldps, ldps_first, le16,
    rows32_kernels, tree8_ps, unpack_iq4_nl, unpack_q4_0, unpack_q5_0, unpack_q8_0,
};
use crate::kernels::scalar::{Blocks, k4_scales, term};
use crate::kernels::{BlockQ8_0, BlockQ8K, DotTable, RowsTable};

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

/// Declares a safe entry point for a several-row kernel.
macro_rules! rows_entry {
    ($name:ident, $kernel:ident) => {
        fn $name(w: &[u8], a: &[BlockQ8_0], ad: &[f32], out: &mut [f32]) {
            // SAFETY: as for `entry!`.
            unsafe { $kernel(w, a, ad, out) }
        }
    };
}

rows_entry!(r_q4_0, q4_0_rows);
rows_entry!(r_q5_0, q5_0_rows);
rows_entry!(r_q8_0, q8_0_rows);
rows_entry!(r_iq4_nl, iq4_nl_rows);

/// The AVX-512 table: its own Q4_K and several-row Q8_0-family products,
/// AVX2 for the rest.
pub(crate) static TABLE: DotTable = DotTable {
    q4_k: e_q4_k,
    rows: RowsTable {
        q4_0: Some(r_q4_0),
        q5_0: Some(r_q5_0),
        q8_0: Some(r_q8_0),
        iq4_nl: Some(r_iq4_nl),
        ..avx2::TABLE.rows
    },
    ..avx2::TABLE
};

// The several-row Q8_0-family products with `vpdpbusd` (256-bit, AVX-512 VL):
// activations shifted to unsigned bytes (y + 128) against the signed weights,
// the accumulator starting at −128·Σw, so each lane's sum is Σ y·w exactly,
// the same integers as AVX2's sign trick in fewer instructions (SmolLM2
// pp512 on the reference machine: Q8_0 244 → 271 t/s, Q4_K_M 207 → 212).
rows32_kernels!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    vnni_prep,
    vnni_dot
);

/// A block's weights and `−128·Σw` over each four bytes.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn vnni_prep(q: __m256i) -> (__m256i, __m256i) {
    let bias = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(0x80u8 as i8), q);
    (q, _mm256_sub_epi32(_mm256_setzero_si256(), bias))
}

/// `Σ w·y` over each four bytes: `Σ (y + 128)·w − 128·Σw` (no overflow:
/// |Σ| ≤ 4 · 255 · 128).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn vnni_dot((q, neg_bias): (__m256i, __m256i), y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(
        neg_bias,
        _mm256_xor_si256(y, _mm256_set1_epi8(0x80u8 as i8)),
        q,
    )
}

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
