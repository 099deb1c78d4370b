//! AVX-512 (F, BW, VL, VNNI) kernels: Q4_K (a 64-weight chunk per register,
//! `vpdpbusd`); the single-row Q4_0/Q5_0/Q8_0/IQ4_NL dots (AVX2's row loop
//! with each block's sum as one 256-bit `vpdpbusd`); the several-row
//! products of that family over activations regrouped eight blocks at a time
//! (`rows_grouped`); the several-row Q4_K product over Q8_K activations
//! regrouped the same way (`q4_k_rows_grouped`); and F16 weights against
//! widened activations in tiles of three rows × four tokens (`f16_rows`,
//! 512-bit; one token goes row by row through AVX2's product). The several-row Q8_0-family products take two weight rows at a
//! time, one per 256-bit half of a 512-bit register (`rows_grouped_pair`).
//! Every other entry is the AVX2 kernel, which these CPUs run too (what was
//! tried and measured slower is in docs/BENCHMARKS.md).
//!
//! Q4_K's float accumulation: AVX2's canonical-order row loop (`blocks256`), fed
//! with the 512-bit integer sums folded (exactly) to 256 bits, so the results
//! are the scalar kernel's bits.
//!
//! The AVX-512 intrinsics are stable since Rust 1.89 (the workspace still
//! declares 1.85; the SIMD kernels as a whole need 1.89).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::avx2::{
    self, halves, ld256, ldps, transpose_dwords, tree8_ps, unpack_iq4_nl, unpack_q4_0, unpack_q5_0,
    unpack_q8_0, word,
};
use crate::forward::math::{
    EXP_FAST_C, EXP_FAST_MAX, EXP_FAST_MIN, LN2_HI_F32, LN2_LO_F32, LOG2E_F32, ROUND_F32,
};
use crate::kernels::attn::{self, KEY_TILE, by_heads, by_product_rows};
use crate::kernels::scalar::{Blocks, k4_scales, term};
use crate::kernels::tiled;
use crate::kernels::{
    BlockQ8_0, BlockQ8K, ColumnsTable, DotTable, OpsTable, Q8_GROUP_BYTES, Q8K_GROUP_BYTES,
    Q8KRows, Q8Rows, RowsTable, Scaled, TiledProduct,
};
use memwall_format::blocks::{
    Block, BlockIq4Nl, BlockQ4_0, BlockQ4K, BlockQ5_0, BlockQ5K, BlockQ6K, BlockTq1_0, BlockTq2_0,
};

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

entry!(e_q4_k, q4_k, &[BlockQ4K], &[BlockQ8K]);
entry!(e_q4_0, q4_0, &[BlockQ4_0], &[BlockQ8_0]);
entry!(e_q5_0, q5_0, &[BlockQ5_0], &[BlockQ8_0]);
entry!(e_q8_0, q8_0, &[BlockQ8_0], &[BlockQ8_0]);
entry!(e_iq4_nl, iq4_nl, &[BlockIq4Nl], &[BlockQ8_0]);
entry!(e_tq1_0, tq1_0, &[BlockTq1_0], &[BlockQ8K]);
entry!(e_tq2_0, tq2_0, &[BlockTq2_0], &[BlockQ8K]);

fn r_tq1_0(w: &[BlockTq1_0], a: Q8KRows<'_>, out: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { tq1_0_rows(w, a.blocks, out) }
}

fn r_tq2_0(w: &[BlockTq2_0], a: Q8KRows<'_>, out: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { tq2_0_rows(w, a.blocks, out) }
}

/// Declares a safe entry point for a several-row kernel.
macro_rules! rows_entry {
    ($name:ident, $b:ty, $unpack:ident) => {
        fn $name(w: &[$b], rows: usize, a: Q8Rows<'_>, out: &mut [f32], stride: usize) {
            let n = a.tokens;
            let row_len = (w.len() / rows.max(1)).max(1);
            let mut pairs = w.chunks_exact(2 * row_len).take(rows / 2);
            for (p, w) in (&mut pairs).enumerate() {
                let (out_a, out_b) = out[2 * p * stride..].split_at_mut(stride);
                let (wa, wb) = w.split_at(row_len);
                // SAFETY: as for `entry!`.
                unsafe {
                    rows_grouped_pair(
                        [wa, wb],
                        |b| $unpack(b),
                        a.groups,
                        [&mut out_a[..n], &mut out_b[..n]],
                    )
                }
            }
            if rows % 2 == 1 {
                let r = rows - 1;
                let out = &mut out[r * stride..r * stride + n];
                // SAFETY: as for `entry!`.
                unsafe {
                    rows_grouped(
                        &w[r * row_len..(r + 1) * row_len],
                        |b| $unpack(b),
                        a.groups,
                        out,
                    )
                }
            }
        }
    };
}

rows_entry!(r_q4_0, BlockQ4_0, unpack_q4_0);
rows_entry!(r_q5_0, BlockQ5_0, unpack_q5_0);
rows_entry!(r_q8_0, BlockQ8_0, unpack_q8_0);
rows_entry!(r_iq4_nl, BlockIq4Nl, unpack_iq4_nl);

fn r_q4_k(w: &[BlockQ4K], a: Q8KRows<'_>, out: &mut [f32]) {
    if a.groups.is_empty() {
        return avx2::r_q4_k(w, a, out);
    }
    // SAFETY: as for `entry!`.
    unsafe { q4_k_rows_grouped(w, a.groups, out) }
}

fn r_f16w_f32(w: &[u8], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    f16w_f32::<true>(w, cols, a, out, stride);
}

/// [`r_f16w_f32`] whose tiles convert their f16 rows in the loop, never
/// widening them (see [`TABLE_AMD`]).
fn r_f16w_f32_converting(w: &[u8], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    f16w_f32::<false>(w, cols, a, out, stride);
}

fn f16w_f32<const MAY_WIDEN: bool>(
    w: &[u8],
    cols: usize,
    a: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    if a.len() == cols {
        // One token: AVX2's row by row (see `F16_ROWS`).
        return avx2::r_f16w_f32(w, cols, a, out, stride);
    }
    // SAFETY: as for `entry!`.
    unsafe { f16_rows(w, cols, a, out, stride, MAY_WIDEN) }
}

fn r_f16_wide(w: &[f32], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    // SAFETY: as for `entry!`.
    unsafe { f16_rows_wide(w, cols, a, out, stride) }
}

/// The AVX-512 table for AMD's cores, as [`avx2::TABLE_AMD`]: the F16 tiles
/// convert their rows in the loop (no widened copies: neither `f16_wide`
/// nor the tiles' own), and one token's F16 rows meet its f16 activations.
pub(crate) static TABLE_AMD: DotTable = DotTable {
    rows: RowsTable {
        f16_f32: Some(r_f16w_f32_converting),
        f16_f16: Some(avx2::r_f16w_f16),
        f16_wide: None,
        ..TABLE.rows
    },
    ..TABLE
};

/// The AVX-512 table: its own Q4_K, ternary and several-row Q8_0-family products,
/// AVX2 for the rest.
pub(crate) static TABLE: DotTable = DotTable {
    q4_k: e_q4_k,
    q4_0: e_q4_0,
    q5_0: e_q5_0,
    q8_0: e_q8_0,
    iq4_nl: e_iq4_nl,
    tq1_0: e_tq1_0,
    tq2_0: e_tq2_0,
    rows: RowsTable {
        f16_f32: Some(r_f16w_f32),
        f16_wide: Some(r_f16_wide),
        q4_k: Some(r_q4_k),
        q4_0: Some(r_q4_0),
        q5_0: Some(r_q5_0),
        q8_0: Some(r_q8_0),
        iq4_nl: Some(r_iq4_nl),
        tq1_0: Some(r_tq1_0),
        tq2_0: Some(r_tq2_0),
        columns: ColumnsTable {
            q4_k: Some(c_q4_k),
            q5_k: Some(c_q5_k),
            q6_k: Some(c_q6_k),
            // The ternary types' own AVX-512 one-row products instead.
            tq1_0: None,
            tq2_0: None,
            ..avx2::TABLE.rows.columns
        },
        tiled: Some(TiledProduct {
            product: t_tiled,
            max_value: 127,
        }),
        q8k_groups: true,
        ..avx2::TABLE.rows
    },
    ops: OpsTable {
        key_tiles: o_key_tiles,
        product_tiles: o_product_tiles,
        weighted_rows: o_weighted_rows,
        exp_fast: o_exp_fast,
        ..avx2::OPS
    },
    ..avx2::TABLE
};

fn o_key_tiles(q: &[f32], hd: usize, kt: &[f32], stride: usize, out: &mut [[f32; KEY_TILE]]) {
    // SAFETY: as for `entry!`.
    unsafe { by_heads!(key_tiles, 32, out.len(), q, hd, kt, stride, out) }
}

fn o_product_tiles(q: &[f32], hd: usize, kt: &[f32], stride: usize, out: &mut [[f32; KEY_TILE]]) {
    // SAFETY: as for `entry!`.
    unsafe { by_product_rows!(product_tiles, 32, out.len(), q, hd, kt, stride, out) }
}

fn o_weighted_rows(out: &mut [f32], probs: &[f32], v: &[f32], heads: usize) {
    // SAFETY: as for `entry!`.
    unsafe { by_heads!(weighted_rows, 64, heads, out, probs, v) }
}

fn o_exp_fast(xs: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { exp_fast_in_place(xs) }
}

// ---- the float loops: attention's tiles for 512-bit vectors, `exp` on sixteen lanes ----

#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx512f")]
fn key_tiles<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    attn::key_tiles_generic::<N, P>(q, hd, kt, stride, out)
}

#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx512f,fma")]
fn product_tiles<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    attn::product_tiles_generic::<N, P>(q, hd, kt, stride, out)
}

#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx512f")]
fn weighted_rows<const N: usize, const W: usize>(out: &mut [f32], probs: &[f32], v: &[f32]) {
    attn::weighted_rows_generic::<N, W>(out, probs, v)
}

/// `x ← exp_fast(x)` for every element, sixteen lanes at a time (the same
/// bits as [`exp_fast`]), four vectors through each step together as AVX2's
/// `exp8s` takes them.
#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx2,avx512f")]
fn exp_fast_in_place(xs: &mut [f32]) {
    let mut fours = xs.chunks_exact_mut(64);
    for x in &mut fours {
        // SAFETY: `x` is a chunk of exactly 64 floats: four loads of sixteen.
        let v = exp16s::<4>(std::array::from_fn(|i| unsafe {
            _mm512_loadu_ps(x[16 * i..].as_ptr())
        }));
        for (i, v) in v.into_iter().enumerate() {
            // SAFETY: the same 64 floats, writable.
            unsafe { _mm512_storeu_ps(x[16 * i..].as_mut_ptr(), v) };
        }
    }
    let mut chunks = fours.into_remainder().chunks_exact_mut(16);
    for x in &mut chunks {
        // SAFETY: `x` is a chunk of exactly sixteen floats (64 readable bytes).
        let [v] = exp16s::<1>([unsafe { _mm512_loadu_ps(x.as_ptr()) }]);
        // SAFETY: the same 64 bytes, writable.
        unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) };
    }
    // Eight or more left: AVX2's vectors, then exp_fast for the rest.
    super::avx2::exp_fast_in_place(chunks.into_remainder());
}

/// [`exp_fast`] of `N` vectors of sixteen, each step applied to all of them
/// before the next (AVX2's `exp8s`).
#[inline]
#[clippy::msrv = "1.89"]
#[target_feature(enable = "avx2,avx512f")]
fn exp16s<const N: usize>(x: [__m512; N]) -> [__m512; N] {
    let set = _mm512_set1_ps;
    macro_rules! each {
        (|$i:ident| $e:expr) => {
            std::array::from_fn::<__m512, N, _>(|$i| $e)
        };
    }
    let xc = each!(|i| _mm512_min_ps(_mm512_max_ps(x[i], set(EXP_FAST_MIN)), set(EXP_FAST_MAX)));
    let round = set(ROUND_F32);
    let k = each!(|i| _mm512_add_ps(_mm512_mul_ps(xc[i], set(LOG2E_F32)), round));
    let k = each!(|i| _mm512_sub_ps(k[i], round));
    let r = each!(|i| _mm512_sub_ps(xc[i], _mm512_mul_ps(k[i], set(LN2_HI_F32))));
    let r = each!(|i| _mm512_sub_ps(r[i], _mm512_mul_ps(k[i], set(LN2_LO_F32))));
    let mut p = [set(EXP_FAST_C[0]); N];
    for &c in &EXP_FAST_C[1..] {
        p = each!(|i| _mm512_add_ps(_mm512_mul_ps(p[i], r[i]), set(c)));
    }
    let p = each!(|i| _mm512_add_ps(_mm512_mul_ps(p[i], r[i]), set(1.0)));
    let p = each!(|i| _mm512_add_ps(_mm512_mul_ps(p[i], r[i]), set(1.0)));
    let pow2 = |n: __m512i| {
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            n,
            _mm512_set1_epi32(127),
        )))
    };
    let v = each!(|i| {
        let ki = _mm512_cvtps_epi32(k[i]);
        let half = _mm512_srai_epi32::<1>(_mm512_add_epi32(ki, _mm512_srli_epi32::<31>(ki)));
        _mm512_mul_ps(
            _mm512_mul_ps(p[i], pow2(half)),
            pow2(_mm512_sub_epi32(ki, half)),
        )
    });
    each!(|i| {
        let v = _mm512_mask_mov_ps(
            v[i],
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x[i], set(EXP_FAST_MAX)),
            set(f32::INFINITY),
        );
        let v = _mm512_mask_mov_ps(
            v,
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[i], set(EXP_FAST_MIN)),
            _mm512_setzero_ps(),
        );
        _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x[i], x[i]), x[i])
    })
}

// ---- one activation row (Q8_0 family) ----
//
// AVX2's row loop (`blocks32`: the same partials and bits) with each block's
// sum as `vpdpbusd(|w|, sign(y, w))`: one instruction where AVX2 needs
// `vpmaddubsw` and `vpmaddwd`.

/// `Σ w·y` over each four bytes of a block (signed weights, |y| ≤ 127).
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn sign_dot(w: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        _mm256_sign_epi8(w, w),
        _mm256_sign_epi8(y, w),
    )
}

macro_rules! q8_family_dot {
    ($name:ident, $b:ty, $unpack:ident) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn $name(w: &[$b], a: &[BlockQ8_0]) -> f32 {
            avx2::blocks32::<_, _, false>(
                w,
                a,
                |b, y| sign_dot($unpack(b), ld256(&y.qs)),
                |b, y| [b.d.bits(), y.d.bits(), 0, 0],
            )
        }
    };
}

q8_family_dot!(q4_0, BlockQ4_0, unpack_q4_0);
q8_family_dot!(q5_0, BlockQ5_0, unpack_q5_0);
q8_family_dot!(q8_0, BlockQ8_0, unpack_q8_0);
q8_family_dot!(iq4_nl, BlockIq4Nl, unpack_iq4_nl);

// ---- ternary types ----
//
// AVX2's unpacking and order, with `vpdpbusd(t, y)` for each 32 weights
// where AVX2 needs `vpmaddubsw`, `vpmaddwd` and an addition.

/// `Σ (t − 1)·y` of a ternary super-block unpacked by AVX2's `tq*_prep`.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn ternary_sums(t: &[__m256i; 8], y: &BlockQ8K) -> (__m256i, __m256i) {
    let mut isum = _mm256_setzero_si256();
    for (k, &t) in t.iter().enumerate() {
        isum = _mm256_dpbusd_epi32(isum, t, ld256(&y.qs[32 * k..]));
    }
    (
        _mm256_sub_epi32(isum, avx2::act_sum(y)),
        _mm256_setzero_si256(),
    )
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tq2_0(w: &[BlockTq2_0], a: &[BlockQ8K]) -> f32 {
    let sums = |b: &BlockTq2_0, y: &BlockQ8K| ternary_sums(&avx2::tq2_0_prep(b), y);
    avx2::blocks256::<_, false>(w, a, sums, |b| [b.d.bits(), 0])
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tq1_0(w: &[BlockTq1_0], a: &[BlockQ8K]) -> f32 {
    let sums = |b: &BlockTq1_0, y: &BlockQ8K| ternary_sums(&avx2::tq1_0_prep(b), y);
    avx2::blocks256::<_, false>(w, a, sums, |b| [b.d.bits(), 0])
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tq2_0_rows(w: &[BlockTq2_0], a: &[BlockQ8K], out: &mut [f32]) {
    ternary_rows(w, a, |b| avx2::tq2_0_prep(b), |b| b.d.bits(), out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tq1_0_rows(w: &[BlockTq1_0], a: &[BlockQ8K], out: &mut [f32]) {
    ternary_rows(w, a, |b| avx2::tq1_0_prep(b), |b| b.d.bits(), out)
}

/// Activation rows per pass of [`ternary_rows`].
const TERNARY_TOKENS: usize = 8;

/// Several activation rows against one row of ternary super-blocks, in
/// [`avx2::blocks256`]'s order. Each super-block is unpacked once for a pass
/// of [`TERNARY_TOKENS`] rows and held as four 512-bit registers, so each
/// row costs four 512-bit `vpdpbusd`; the rows' sums of eight super-blocks
/// are transposed into one register whose lane `k` is block `8g + k`, scaled
/// and added to partial `k` (no horizontal sum per block). The last
/// `nb % 8` blocks go through the scalar term, as there.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn ternary_rows<B: Block>(
    w: &[B],
    a: &[BlockQ8K],
    prep: impl Fn(&B) -> [__m256i; 8],
    scale: impl Fn(&B) -> u16,
    out: &mut [f32],
) {
    let (n, nb) = (out.len(), w.len());
    assert_eq!(a.len(), n * nb, "ternary_rows lengths");
    let full = nb / 8 * 8;
    for t0 in (0..n).step_by(TERNARY_TOKENS) {
        let m = TERNARY_TOKENS.min(n - t0);
        let mut acc = [_mm256_setzero_ps(); TERNARY_TOKENS];
        for g in (0..full).step_by(8) {
            let wg = &w[g..g + 8];
            let mut v = [[_mm256_setzero_si256(); 8]; TERNARY_TOKENS];
            for (k, b) in wg.iter().enumerate() {
                let t = prep(b);
                let tz: [__m512i; 4] = std::array::from_fn(|q| {
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(t[2 * q]), t[2 * q + 1])
                });
                for (j, v) in v.iter_mut().enumerate().take(m) {
                    let y = &a[(t0 + j) * nb + g + k];
                    let mut s = _mm512_setzero_si512();
                    for (q, &t) in tz.iter().enumerate() {
                        s = _mm512_dpbusd_epi32(s, t, ld512(&y.qs[64 * q..]));
                    }
                    let s = _mm256_add_epi32(
                        _mm512_castsi512_si256(s),
                        _mm512_extracti64x4_epi64::<1>(s),
                    );
                    v[k] = _mm256_sub_epi32(s, avx2::act_sum(y));
                }
            }
            let dw = halves(std::array::from_fn(|k| scale(&wg[k])));
            for (j, acc) in acc.iter_mut().enumerate().take(m) {
                let ys = &a[(t0 + j) * nb + g..][..8];
                let da: [f32; 8] = std::array::from_fn(|k| ys[k].d);
                let d = _mm256_mul_ps(dw, ldps(&da));
                let s = _mm256_cvtepi32_ps(avx2::transpose_sum(&v[j]));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(d, s));
            }
        }
        for (j, acc) in acc.iter().enumerate().take(m) {
            let mut sum = Blocks::new(avx2::lanes_ps(*acc));
            for i in full..nb {
                let y = &a[(t0 + j) * nb + i];
                let isum = avx2::hsum_epi32(ternary_sums(&prep(&w[i]), y).0);
                sum.add(i, term(avx2::h2f(scale(&w[i])), y.d, isum));
            }
            out[t0 + j] = sum.sum();
        }
    }
}

// ---- several activation rows per weight row (Q8_0 family) ----
//
// The activations come regrouped (`Q8_GROUP_BYTES`): per eight blocks, eight
// registers whose lane `l` holds four quants of block `l`. The weights of
// eight blocks are transposed the same way once per group and shifted to
// unsigned bytes (w + 128), so eight 256-bit `vpdpbusd` leave each block's
// `Σ (w + 128)·y` in its own lane; `128·Σy` (stored with the activations)
// comes off exactly. No horizontal additions: lane `l` is then block
// `8g + l`'s integer sum, scaled and added to partial `l` as in the single
// product. (`avx2::rows_grouped` walks the same records with `vpmaddubsw`
// in place of `vpdpbusd`.)

/// Activation rows whose partials are kept together.
const TOKENS: usize = 16;

/// One weight row of 32-weight blocks (`unpack` gives a
/// block's weights as signed bytes) against `out.len()` regrouped Q8_0
/// activation rows `groups`, each in the canonical order of the single
/// product. A row's last group is padded with zero blocks on both sides:
/// their terms are `+0`, which leaves a partial unchanged.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn rows_grouped<B: Scaled>(
    w: &[B],
    unpack: impl Fn(&B) -> __m256i,
    groups: &[u8],
    out: &mut [f32],
) {
    let nb = w.len();
    let ng = nb.div_ceil(8);
    let (records, _) = groups.as_chunks::<Q8_GROUP_BYTES>();
    assert!(records.len() == out.len() * ng, "grouped rows lengths");
    for (out, records) in out.chunks_mut(TOKENS).zip(records.chunks(TOKENS * ng)) {
        let mut acc = [_mm256_setzero_ps(); TOKENS];
        for (g, b0) in (0..nb).step_by(8).enumerate() {
            let (wt, dw) = weight_group(w, b0, &unpack);
            for (acc, r) in acc.iter_mut().zip(records[g..].iter().step_by(ng)) {
                let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for k in (0..8).step_by(2) {
                    s0 = _mm256_dpbusd_epi32(s0, wt[k], ld256(&r[32 * k..]));
                    s1 = _mm256_dpbusd_epi32(s1, wt[k + 1], ld256(&r[32 * k + 32..]));
                }
                let ysum = _mm256_slli_epi32::<7>(ld256(&r[256..]));
                let isum = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), ysum);
                let da = ldps(&r[288..]);
                let t = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum));
                *acc = _mm256_add_ps(*acc, t);
            }
        }
        for (o, acc) in out.iter_mut().zip(acc.iter().copied()) {
            *o = tree8_ps(acc);
        }
    }
}

/// Blocks `b0..b0 + 8` of a weight row (zero blocks past its end), transposed
/// as the regrouped activations are and shifted to unsigned bytes (w + 128),
/// and their scales.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn weight_group<B: Scaled>(
    w: &[B],
    b0: usize,
    unpack: &impl Fn(&B) -> __m256i,
) -> ([__m256i; 8], __m256) {
    let (q, dw) = avx2::weight_group(w, b0, unpack);
    let shift = _mm256_set1_epi8(0x80u8 as i8);
    (q.map(|v| _mm256_xor_si256(v, shift)), dw)
}

/// [`rows_grouped`] for two weight rows at once, in the two 256-bit halves
/// of 512-bit registers: each activation register is loaded once (broadcast
/// to both halves) for both rows, and one 512-bit `vpdpbusd` does the work of
/// two 256-bit ones (on the reference machine the two have the same
/// throughput). Each half's lanes do the one-row kernel's operations, so the
/// bits are the same.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn rows_grouped_pair<B: Scaled>(
    w: [&[B]; 2],
    unpack: impl Fn(&B) -> __m256i,
    groups: &[u8],
    out: [&mut [f32]; 2],
) {
    let nb = w[0].len();
    let ng = nb.div_ceil(8);
    let (records, _) = groups.as_chunks::<Q8_GROUP_BYTES>();
    let [out_a, out_b] = out;
    assert!(
        w[1].len() == w[0].len() && out_b.len() == out_a.len() && records.len() == out_a.len() * ng,
        "grouped row pair lengths"
    );
    let bcast = |s: &[u8]| _mm512_broadcast_i64x4(ld256(s));
    let chunks = out_a.chunks_mut(TOKENS).zip(out_b.chunks_mut(TOKENS));
    for ((out_a, out_b), records) in chunks.zip(records.chunks(TOKENS * ng)) {
        let mut acc = [_mm512_setzero_ps(); TOKENS];
        for (g, b0) in (0..nb).step_by(8).enumerate() {
            let (qa, da) = weight_group(w[0], b0, &unpack);
            let (qb, db) = weight_group(w[1], b0, &unpack);
            let wt: [__m512i; 8] = std::array::from_fn(|k| join(qa[k], qb[k]));
            let dw = _mm512_castsi512_ps(join(_mm256_castps_si256(da), _mm256_castps_si256(db)));
            if nb - b0 <= 4 {
                short_group_pair(&wt, dw, &records[g..], ng, &mut acc[..out_a.len()]);
                continue;
            }
            for (acc, r) in acc.iter_mut().zip(records[g..].iter().step_by(ng)) {
                *acc = _mm512_add_ps(*acc, pair_terms(&wt, dw, |at| bcast(&r[at..])));
            }
        }
        for ((oa, ob), acc) in out_a
            .iter_mut()
            .zip(out_b.iter_mut())
            .zip(acc.iter().copied())
        {
            *oa = tree8_ps(_mm512_castps512_ps256(acc));
            *ob = tree8_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(acc),
            )));
        }
    }
}

/// [`rows_grouped_pair`]'s last group when it holds at most four blocks
/// (576 columns are two groups and two blocks): only the first 128 bits of
/// each row's half are not padding, so two tokens share every product,
/// token `2i` in the first quarter of a half and `2i + 1` in the second, the
/// row's weights in both. Each lane takes the operations of [`pair_terms`],
/// so a block's term is the same; each token's partials take the other's
/// lanes as `+0`. Token `t`'s record is `records[t·ng]`; an odd last token
/// takes the whole halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn short_group_pair(
    wt: &[__m512i; 8],
    dw: __m512,
    records: &[[u8; Q8_GROUP_BYTES]],
    ng: usize,
    acc: &mut [__m512],
) {
    let both = |v: __m512i| _mm512_shuffle_i64x2::<0b10_10_00_00>(v, v);
    let wt2 = wt.map(both);
    let dw2 = _mm512_castsi512_ps(both(_mm512_castps_si512(dw)));
    let n = acc.len();
    let mut pairs = acc.chunks_exact_mut(2);
    for (i, acc) in (&mut pairs).enumerate() {
        let (lo, hi) = (&records[2 * i * ng], &records[(2 * i + 1) * ng]);
        let pair = |at: usize| {
            let lo = _mm256_castsi128_si256(avx2::ld128(&lo[at..]));
            _mm512_broadcast_i64x4(_mm256_inserti128_si256::<1>(lo, avx2::ld128(&hi[at..])))
        };
        let terms = pair_terms(&wt2, dw2, pair);
        let first = _mm512_maskz_mov_ps(0x0f0f, terms);
        let second = _mm512_maskz_shuffle_f32x4::<0b11_11_01_01>(0x0f0f, terms, terms);
        acc[0] = _mm512_add_ps(acc[0], first);
        acc[1] = _mm512_add_ps(acc[1], second);
    }
    if let [acc] = pairs.into_remainder() {
        let r = &records[(n - 1) * ng];
        let bcast = |at: usize| _mm512_broadcast_i64x4(ld256(&r[at..]));
        *acc = _mm512_add_ps(*acc, pair_terms(wt, dw, bcast));
    }
}

/// One group's terms for two weight rows (the halves of `wt` and `dw`) and
/// one activation record: lane `l` of each half the term of block `8g + l`,
/// `(d_w·d_a)·isum`. `y(at)` gives the record's 32 bytes at offset `at` in
/// both halves (its eight registers, the blocks' sums at 256 and scales at
/// 288).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pair_terms(wt: &[__m512i; 8], dw: __m512, y: impl Fn(usize) -> __m512i) -> __m512 {
    let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    for k in (0..8).step_by(2) {
        s0 = _mm512_dpbusd_epi32(s0, wt[k], y(32 * k));
        s1 = _mm512_dpbusd_epi32(s1, wt[k + 1], y(32 * k + 32));
    }
    let ysum = _mm512_slli_epi32::<7>(y(256));
    let isum = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), ysum);
    let da = _mm512_castsi512_ps(y(288));
    _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum))
}

// ---- several activation rows per weight row (Q4_K) ----
//
// The Q8_K activations come regrouped (`Q8K_GROUP_BYTES`): per eight
// super-blocks, 64 registers whose lane `l` holds four quants of block `l`.
// Each 32-byte chunk of eight weight super-blocks is transposed the same way
// once per pass (one `transpose_dwords`: its low nibbles are quants
// `64c + 4k'..` and its high nibbles quants `64c + 32 + 4k'..`), so
// `vpdpbusd` (unsigned weights, signed activations) leaves each super-block's
// sub-block sums in its own lane; the scales multiply lane by lane and the
// minimums come from the stored sub-block sums (`vpdpwssd`). Lane `l` is then
// super-block `8g + l`'s exact integer sums, and its float term goes to
// partial `l` with the scalar operations, so the bits are the single
// product's (the AVX2 kernels reduce lanes for every super-block and token).

/// Activation rows per pass of the several-row Q4_K product (each weight
/// group is unpacked once per pass).
const K_TOKENS: usize = 16;

/// Little-endian 32-bit word `i` of a Q4_K block's twelve scale bytes.
#[inline]
fn scale_word(b: &BlockQ4K, i: usize) -> i32 {
    let s = &b.scales[4 * i..][..4];
    i32::from_le_bytes([s[0], s[1], s[2], s[3]])
}

/// Bits `shift..shift + width` of each lane.
#[inline]
#[target_feature(enable = "avx2")]
fn bits(v: __m256i, shift: i32, width: u32) -> __m256i {
    let v = _mm256_srl_epi32(v, _mm_cvtsi32_si128(shift));
    _mm256_and_si256(v, _mm256_set1_epi32((1 << width) - 1))
}

/// One Q4_K weight row against `out.len()` regrouped Q8_K activation rows
/// `groups`, each in the canonical order of the single product.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_k_rows_grouped(w: &[BlockQ4K], groups: &[u8], out: &mut [f32]) {
    // Zero weights for the padding lanes of a row's last group.
    let zero = BlockQ4K::zero();
    let nb = w.len();
    let ng = nb.div_ceil(8);
    let (records, _) = groups.as_chunks::<Q8K_GROUP_BYTES>();
    assert!(records.len() == out.len() * ng, "grouped K rows lengths");
    let m4 = _mm256_set1_epi8(0xf);
    for (out, records) in out.chunks_mut(K_TOKENS).zip(records.chunks(K_TOKENS * ng)) {
        let mut acc = [_mm256_setzero_ps(); K_TOKENS];
        for (g, b0) in (0..nb).step_by(8).enumerate() {
            avx2::prefetch_ahead(&w[b0..], 8 * size_of::<BlockQ4K>());
            let blk: [&BlockQ4K; 8] = std::array::from_fn(|l| w.get(b0 + l).unwrap_or(&zero));
            // Scales and minimums, lane `l` from block `l` (ggml's
            // `get_scale_min_k4` on three words of twelve bytes).
            let [q0, q1, q2] = [0, 1, 2].map(|i| {
                let v = blk.map(|b| scale_word(b, i));
                _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
            });
            // Entry `j` of the scales (`q = q0`, `low = 0`) or minimums (`q1`, `4`):
            // six bits of byte `j` for `j < 4`, else four bits of byte `4 + j`
            // under the top two of byte `j - 4` of `q`.
            let six = |j: usize, q: __m256i, low: i32| {
                let i = 8 * (j as i32 % 4);
                if j < 4 {
                    bits(q, i, 6)
                } else {
                    _mm256_or_si256(
                        bits(q2, i + low, 4),
                        _mm256_slli_epi32::<4>(bits(q, i + 6, 2)),
                    )
                }
            };
            let sc: [__m256i; 8] = std::array::from_fn(|j| six(j, q0, 0));
            let mins: [__m256i; 8] = std::array::from_fn(|j| six(j, q1, 4));
            // Minimums paired as the stored 32-quant sums are: (m[2i], m[2i + 1]).
            let mp: [__m256i; 4] = std::array::from_fn(|i| {
                _mm256_or_si256(mins[2 * i], _mm256_slli_epi32::<16>(mins[2 * i + 1]))
            });
            let dw = halves(blk.map(|b| b.d.bits()));
            let mw = halves(blk.map(|b| b.dmin.bits()));
            let mut isum = [_mm256_setzero_si256(); K_TOKENS];
            for c in 0..4 {
                let t = transpose_dwords(blk.map(|b| ld256(&b.qs[32 * c..])));
                let lo = t.map(|v| _mm256_and_si256(v, m4));
                let hi = t.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
                for (isum, r) in isum.iter_mut().zip(records[g..].iter().step_by(ng)) {
                    let y = &r[512 * c..512 * c + 512];
                    let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for k in 0..8 {
                        s0 = _mm256_dpbusd_epi32(s0, lo[k], ld256(&y[32 * k..]));
                        s1 = _mm256_dpbusd_epi32(s1, hi[k], ld256(&y[256 + 32 * k..]));
                    }
                    let s = _mm256_add_epi32(
                        _mm256_mullo_epi32(s0, sc[2 * c]),
                        _mm256_mullo_epi32(s1, sc[2 * c + 1]),
                    );
                    *isum = _mm256_add_epi32(*isum, s);
                }
            }
            let rows = acc.iter_mut().zip(&isum);
            for ((acc, &isum), r) in rows.zip(records[g..].iter().step_by(ng)) {
                let mut summs = _mm256_setzero_si256();
                for (i, &mp) in mp.iter().enumerate() {
                    summs = _mm256_dpwssd_epi32(summs, mp, ld256(&r[2048 + 32 * i..]));
                }
                let da = ldps(&r[2176..]);
                let t = _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum)),
                    _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(summs)),
                );
                *acc = _mm256_add_ps(*acc, t);
            }
        }
        for (o, acc) in out.iter_mut().zip(acc.iter().copied()) {
            *o = tree8_ps(acc);
        }
    }
}

// ---- F16 weight rows against widened activations ----
//
// A tile of `F16_ROWS` weight rows × `F16_TOKENS` tokens in registers: per
// sixteen columns, each row's weights are widened once (`vcvtph2ps`) and each
// token's activations loaded once, for twelve multiply-adds. Every (row,
// token) pair keeps the canonical 32 partials in two 512-bit accumulators
// (columns `32s..32s+16` and `32s+16..32s+32`). The products of f16 values
// are exact in f32, so the fused multiply-add has the bits of the scalar
// multiply then add. (AVX2's 16 registers hold one row × three tokens.)
// A tile of four tokens ends with its sums in vector registers, eight at a
// time (`fold_rows4`): one at a time, the horizontal additions took a
// quarter of the kernel at SmolLM2's 576 columns. Rows of at most
// `F16_WIDEN_COLS` are widened once per block of three rows when more than
// one tile of tokens reads them (a third of the µops of a step were
// conversions); wider rows convert per use, as the widened rows would push
// the activations out of L1 (slower at 1536 columns and more).

/// Weight rows per tile. One token's products are not tiled here: against
/// rows streamed from memory (a decoded token), AVX2's row-by-row product
/// reads them faster than these tiles do.
const F16_ROWS: usize = 3;
/// Tokens per tile.
const F16_TOKENS: usize = 4;

/// Widest rows whose block of three is widened to `f32` once (12 KiB on
/// the stack).
const F16_WIDEN_COLS: usize = 1024;

/// A 64-byte aligned block of widened weight rows.
#[repr(C, align(64))]
struct WideRows([f32; F16_ROWS * F16_WIDEN_COLS]);

/// [`RowsF16F32`](crate::kernels::RowsF16F32): every weight row of `w`
/// against every activation row of `a`, tile by tile; with `may_widen`,
/// narrow rows read by more than one tile of tokens are widened once per
/// block of rows.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn f16_rows(w: &[u8], cols: usize, a: &[f32], out: &mut [f32], stride: usize, may_widen: bool) {
    let (rows, tokens) = (w.len() / (2 * cols), a.len() / cols);
    assert!(
        rows == 0 || tokens == 0 || out.len() >= (rows - 1) * stride + tokens,
        "f16 rows lengths"
    );
    let widen = may_widen && tokens > F16_TOKENS && cols <= F16_WIDEN_COLS;
    // Not zeroed: stores that decoding, which never widens, would pay.
    let mut wide = std::mem::MaybeUninit::<WideRows>::uninit();
    for r0 in (0..rows).step_by(F16_ROWS) {
        let nr = (rows - r0).min(F16_ROWS);
        let w = &w[2 * cols * r0..2 * cols * (r0 + nr)];
        let src = if widen {
            // SAFETY: `WideRows` is an array of floats, which any bytes are
            // (read only after `widen_f16` wrote them).
            let buf = unsafe {
                &mut *wide
                    .as_mut_ptr()
                    .cast::<[MaybeUninit<f32>; F16_ROWS * F16_WIDEN_COLS]>()
            };
            Rows::F32(widen_f16(w, &mut buf[..nr * cols]))
        } else {
            Rows::F16(w)
        };
        f16_block(src, nr, cols, a, &mut out[r0 * stride..], stride);
    }
}

/// [`RowsWideF16`](crate::kernels::RowsWideF16): [`f16_rows`] over weight
/// rows the caller widened.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn f16_rows_wide(w: &[f32], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    let (rows, tokens) = (w.len() / cols, a.len() / cols);
    assert!(
        rows == 0 || tokens == 0 || out.len() >= (rows - 1) * stride + tokens,
        "f16 rows lengths"
    );
    for r0 in (0..rows).step_by(F16_ROWS) {
        let nr = (rows - r0).min(F16_ROWS);
        let src = Rows::F32(&w[cols * r0..cols * (r0 + nr)]);
        f16_block(src, nr, cols, a, &mut out[r0 * stride..], stride);
    }
}

/// The `nr` weight rows of `src` against every activation row of `a`, tile
/// by tile of tokens: `out[r·stride + t]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn f16_block(src: Rows<'_>, nr: usize, cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    let tokens = a.len() / cols;
    for t0 in (0..tokens).step_by(F16_TOKENS) {
        let nt = (tokens - t0).min(F16_TOKENS);
        let a = &a[cols * t0..cols * (t0 + nt)];
        let out = &mut out[t0..];
        macro_rules! tiles {
            ($(($r:literal, $t:literal)),*) => {
                match (nr, nt, src) {
                    $(
                        ($r, $t, Rows::F16(w)) => f16_tile::<$r, $t, false>(w, &[], cols, a, out, stride),
                        ($r, $t, Rows::F32(w)) => f16_tile::<$r, $t, true>(&[], w, cols, a, out, stride),
                    )*
                    _ => unreachable!("tile sizes are bounded by F16_ROWS and F16_TOKENS"),
                }
            };
        }
        tiles!(
            (3, 4),
            (3, 3),
            (3, 2),
            (3, 1),
            (2, 4),
            (2, 3),
            (2, 2),
            (2, 1),
            (1, 4),
            (1, 3),
            (1, 2),
            (1, 1)
        );
    }
}

/// `w`'s f16 values widened into `out` (exact), which is then all written.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn widen_f16<'o>(w: &[u8], out: &'o mut [MaybeUninit<f32>]) -> &'o [f32] {
    assert_eq!(w.len(), 2 * out.len(), "f16 widening lengths");
    let n = out.len();
    let p = out.as_mut_ptr().cast::<f32>();
    for i in 0..n / 16 {
        let h = ld256(&w[32 * i..]);
        // SAFETY: floats `16i..16i + 16 ≤ n` of `out`; unaligned store.
        unsafe { _mm512_storeu_ps(p.add(16 * i), _mm512_cvtph_ps(h)) };
    }
    for i in n / 16 * 16..n {
        // SAFETY: float `i < n` of `out`.
        unsafe { p.add(i).write(avx2::f16_at(w, 2 * i)) };
    }
    // SAFETY: all `n` floats were written above.
    unsafe { std::slice::from_raw_parts(p, n) }
}

/// The weight rows of a tile: f16 (converted per use) or already widened.
#[derive(Clone, Copy)]
enum Rows<'a> {
    F16(&'a [u8]),
    F32(&'a [f32]),
}

/// `R` weight rows (`w`, `R × cols` f16; `wide` the same widened when
/// `WIDE`) against `T` activation rows (`a`, `T × cols` floats):
/// `out[r·stride + t]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn f16_tile<const R: usize, const T: usize, const WIDE: bool>(
    w: &[u8],
    wide: &[f32],
    cols: usize,
    a: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let w_len = super::f16_weights::<WIDE>(w, wide);
    assert!(
        w_len == cols * R && a.len() == cols * T && out.len() > (R - 1) * stride + T - 1,
        "f16 tile lengths"
    );
    let (wp, widep) = (w.as_ptr(), wide.as_ptr());
    let ap = a.as_ptr();
    // acc[t][r][h]: token t, row r, columns 16h..16h+16 of each 32 (`h` is
    // a constant at every use, so the accumulators stay in registers).
    let mut acc = [[[_mm512_setzero_ps(); 2]; R]; T];
    // Columns `c..c + 16`, lanes outside `m` as 0: a masked lane adds `+0`,
    // which leaves a partial unchanged (a partial starts at `+0`, so is
    // never `-0`).
    let step = |acc: &mut [[[__m512; 2]; R]; T], h: usize, c: usize, m: __mmask16| {
        // SAFETY: lanes whose mask bit is clear are not read (and cannot
        // fault); callers pass `c < cols` and clear the lanes of columns
        // `cols..`, so the others are in row `r` (values from `r·cols + c`),
        // in bounds (lengths checked above); unaligned loads.
        let x: [__m512; R] = std::array::from_fn(|r| unsafe {
            if WIDE {
                _mm512_maskz_loadu_ps(m, widep.add(r * cols + c))
            } else {
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                    m,
                    wp.add(2 * (r * cols + c)).cast(),
                ))
            }
        });
        for (t, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above, for token `t` (floats from `t·cols + c`).
            let y = unsafe { _mm512_maskz_loadu_ps(m, ap.add(t * cols + c)) };
            for (acc, &x) in acc.iter_mut().zip(&x) {
                acc[h] = _mm512_fmadd_ps(x, y, acc[h]);
            }
        }
    };
    let full = cols / 32 * 32;
    for c in (0..full).step_by(32) {
        if !WIDE {
            for r in 0..R {
                avx2::prefetch_ahead(&w[2 * (r * cols + c)..], 64);
            }
        }
        step(&mut acc, 0, c, !0);
        step(&mut acc, 1, c + 16, !0);
    }
    let lanes = |c: usize| ((1u32 << (cols - c).min(16)) - 1) as __mmask16;
    if full < cols {
        step(&mut acc, 0, full, lanes(full));
    }
    if full + 16 < cols {
        step(&mut acc, 1, full + 16, lanes(full + 16));
    }
    if T % 4 == 0 {
        // Four tokens of a row are a group; two groups at a time (the last
        // with itself when their number is odd), in vector registers.
        let groups = R * T / 4;
        let group = |g: usize| -> [[__m512; 2]; 4] {
            let (r, t0) = (g / (T / 4), g % (T / 4) * 4);
            std::array::from_fn(|i| acc[t0 + i][r])
        };
        for g in (0..groups).step_by(2) {
            let h = (g + 1).min(groups - 1);
            let sums = fold_rows4(group(g), group(h));
            let halves = [
                _mm512_castps512_ps128(sums),
                _mm512_extractf32x4_ps::<2>(sums),
            ];
            for (g, v) in [g, h].into_iter().zip(halves) {
                let at = g / (T / 4) * stride + g % (T / 4) * 4;
                let o = &mut out[at..at + 4];
                // SAFETY: four writable floats; unaligned store.
                unsafe { _mm_storeu_ps(o.as_mut_ptr(), v) };
            }
        }
        return;
    }
    for (t, acc) in acc.iter().enumerate() {
        for (r, acc) in acc.iter().enumerate() {
            // Partials 0..8, 8..16, 16..24, 24..32.
            let [p0, p1] = acc.map(|v| {
                let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
                [_mm512_castps512_ps256(v), _mm256_castpd_ps(hi)]
            });
            out[r * stride + t] = avx2::fold32_ps([p0[0], p0[1], p1[0], p1[1]]);
        }
    }
}

/// The sums of two rows × four tokens from their accumulators (`a[t]`,
/// `b[t]`: columns `16h..16h + 16` of each 32 in `[h]`) by the additions of
/// [`avx2::fold32_ps`], eight outputs at a time: `a`'s tokens in lanes
/// 0..4, `b`'s in lanes 8..12.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_rows4(a: [[__m512; 2]; 4], b: [[__m512; 2]; 4]) -> __m512 {
    // Low 256 bits a's, high b's: (p[k] + p[k+8]) + (p[k+16] + p[k+24]).
    let mut q = [_mm512_setzero_ps(); 4];
    for t in 0..4 {
        let (x, y) = (a[t], b[t]);
        let s0 = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x[0], y[0]),
            _mm512_shuffle_f32x4::<0xEE>(x[0], y[0]),
        );
        let s1 = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x[1], y[1]),
            _mm512_shuffle_f32x4::<0xEE>(x[1], y[1]),
        );
        q[t] = _mm512_add_ps(s0, s1);
    }
    // Block 0: a's (q0+q1)+(q2+q3) for tokens 0..4; block 1 its
    // (q4+q5)+(q6+q7); blocks 2 and 3 the same of b.
    let u = hadd(hadd(q[0], q[1]), hadd(q[2], q[3]));
    // Block 0: block 0 + block 1 (a), block 2: block 2 + block 3 (b).
    _mm512_add_ps(u, _mm512_shuffle_f32x4::<0x31>(u, u))
}

/// Neighbouring lanes added within 128-bit blocks: `[x0+x1, x2+x3, y0+y1, y2+y3]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn hadd(x: __m512, y: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(x, y),
        _mm512_shuffle_ps::<0xDD>(x, y),
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
fn q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    avx2::blocks256::<_, true>(
        w,
        a,
        |b, y| q4_k_sums(b, y),
        |b| [b.d.bits(), b.dmin.bits()],
    )
}

avx2::column_entry!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    c_q4_k,
    BlockQ4K,
    true,
    q4_k_sums,
    |b: &BlockQ4K| [b.d.bits(), b.dmin.bits()]
);
avx2::column_entry!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
    c_q5_k,
    BlockQ5K,
    true,
    avx2::q5_k_sums,
    |b: &BlockQ5K| [b.d.bits(), b.dmin.bits()]
);
avx2::column_entry!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
    c_q6_k,
    BlockQ6K,
    false,
    avx2::q6_k_sums,
    |b: &BlockQ6K| [b.d.bits(), 0]
);

/// A Q4_K super-block's integer sum (its sixteen lanes folded to eight, exact)
/// and minimum sum.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_k_sums(b: &BlockQ4K, y: &BlockQ8K) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0xf);
    let (sc, m) = k4_scales(&b.scales);
    let sc32 = _mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
        sc,
    ))));
    let mut isum = _mm512_setzero_si512();
    for c in 0..4 {
        let q = ld256(&b.qs[32 * c..][..32]);
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

// ---- tiled K-quant products (kernels/tiled.rs) ----
//
// Lanes are the sixteen weight rows of a panel; each token's four biased
// quants (`a + 128`, unsigned) are broadcast against four signed values of
// each row (`vpdpbusd`), `T` tokens at a time, so one load of the panel
// serves `T` byte products, and panels go in pairs, so one broadcast serves
// two. A sub-block's sums are scaled lane by lane (`vpmulld`) onto the row's
// bias (which takes the 128 back out), the minimums' `summs` come from the
// token's stored quant sums (`vpdpwssd` of `i16` pairs), and each (row,
// token) term goes to its partial `b % 8` with the scalar operations. A
// token's sixteen outputs are one store: nothing is transposed.

avx2::tiled_entry!(t_tiled, tiled, tiled_pair);

/// One panel (`nb` records of [`tiled::record_bytes`]`(NSUB)`) against a
/// group of eight tokens (`nb` records of [`tiled::ACT_BYTES`]):
/// `out[t·stride + r]` for the eight tokens `t` and sixteen rows `r`, each
/// the single product's bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tiled<const NSUB: usize, const MINS: bool>(
    panel: &[u8],
    acts: &[u8],
    out: &mut [f32],
    stride: usize,
    factor: f32,
) {
    const T: usize = tiled::TOKENS;
    let rec = tiled::record_bytes(NSUB);
    let nb = tiled::records(NSUB, panel, acts);
    assert!(out.len() >= (T - 1) * stride + 16, "tiled output");
    // Groups of four values per sub-block.
    let per_sub = 64 / NSUB;
    let mut p = [[[MaybeUninit::<__m512>::uninit(); 8]; T]];
    let recs = panel
        .chunks_exact(rec)
        .zip(acts.chunks_exact(tiled::ACT_BYTES));
    for (b, (r, a)) in recs.enumerate() {
        let mut s1 = [[tiled_bias::<NSUB>(r); T]];
        for s in 0..NSUB {
            let mut acc = [_mm512_setzero_si512(); T];
            for k in s * per_sub..(s + 1) * per_sub {
                let w = ld512(&r[64 * k..][..64]);
                for (t, acc) in acc.iter_mut().enumerate() {
                    let q = _mm512_set1_epi32(word(a, T * k + t));
                    *acc = _mm512_dpbusd_epi32(*acc, q, w);
                }
            }
            tiled_scale(r, s, &acc, &mut s1[0]);
        }
        tiled_terms::<NSUB, MINS, 1>([r], a, &s1, b, &mut p);
    }
    tiled_store(&p[0], nb, factor, out, stride);
}

/// [`tiled`] for two panels (rows `16..32` of `out` the second's): each
/// token's broadcast quad serves both, which halves the broadcasts per
/// product (the loads, not the products, bound the one-panel pass).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tiled_pair<const NSUB: usize, const MINS: bool>(
    (panel0, panel1): (&[u8], &[u8]),
    acts: &[u8],
    out: &mut [f32],
    stride: usize,
    factor: f32,
) {
    const T: usize = tiled::TOKENS;
    let rec = tiled::record_bytes(NSUB);
    let nb = tiled::records(NSUB, panel0, acts);
    assert_eq!(panel1.len(), panel0.len(), "tiled panels");
    assert!(out.len() >= (T - 1) * stride + 32, "tiled output");
    let per_sub = 64 / NSUB;
    let mut p = [[[MaybeUninit::<__m512>::uninit(); 8]; T]; 2];
    let recs = panel0
        .chunks_exact(rec)
        .zip(panel1.chunks_exact(rec))
        .zip(acts.chunks_exact(tiled::ACT_BYTES));
    for (b, ((r0, r1), a)) in recs.enumerate() {
        let mut s1 = [[tiled_bias::<NSUB>(r0); T], [tiled_bias::<NSUB>(r1); T]];
        for s in 0..NSUB {
            let mut acc = [[_mm512_setzero_si512(); T]; 2];
            for k in s * per_sub..(s + 1) * per_sub {
                let w0 = ld512(&r0[64 * k..][..64]);
                let w1 = ld512(&r1[64 * k..][..64]);
                let [acc0, acc1] = &mut acc;
                for (t, (acc0, acc1)) in acc0.iter_mut().zip(acc1).enumerate() {
                    let q = _mm512_set1_epi32(word(a, T * k + t));
                    *acc0 = _mm512_dpbusd_epi32(*acc0, q, w0);
                    *acc1 = _mm512_dpbusd_epi32(*acc1, q, w1);
                }
            }
            let [s1_0, s1_1] = &mut s1;
            tiled_scale(r0, s, &acc[0], s1_0);
            tiled_scale(r1, s, &acc[1], s1_1);
        }
        tiled_terms::<NSUB, MINS, 2>([r0, r1], a, &s1, b, &mut p);
    }
    tiled_store(&p[0], nb, factor, out, stride);
    tiled_store(&p[1], nb, factor, &mut out[16..], stride);
}

/// Offset of the terms' fields (minimums, bias, `d`, `dmin`) in a record.
const fn tiled_at_c(nsub: usize) -> usize {
    4096 + 64 * nsub
}

/// The sixteen rows' biases of record `r`: where their sums start.
#[target_feature(enable = "avx512f")]
fn tiled_bias<const NSUB: usize>(r: &[u8]) -> __m512i {
    ld512(&r[tiled_at_c(NSUB) + 512..][..64])
}

/// `s1[t] += acc[t] · scale` with sub-block `s`'s scales of record `r`.
#[target_feature(enable = "avx512f")]
fn tiled_scale(r: &[u8], s: usize, acc: &[__m512i; 8], s1: &mut [__m512i; 8]) {
    let sc = ld512(&r[4096 + 64 * s..][..64]);
    for (s1, &acc) in s1.iter_mut().zip(acc) {
        *s1 = _mm512_add_epi32(*s1, _mm512_mullo_epi32(acc, sc));
    }
}

/// Each token's term of super-block `b` (records `r` of `R` panels,
/// activations `a`, exact sums `s1`) added to its partial `b % 8`, written
/// first by super-block `b` (as `+0.0 + term`, the canonical start) so that
/// nothing is zeroed. The minimums' sums take each token's stored quant sums
/// once for all `R` panels.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tiled_terms<const NSUB: usize, const MINS: bool, const R: usize>(
    r: [&[u8]; R],
    a: &[u8],
    s1: &[[__m512i; 8]; R],
    b: usize,
    p: &mut [[[MaybeUninit<__m512>; 8]; 8]; R],
) {
    const T: usize = tiled::TOKENS;
    let at_c = tiled_at_c(NSUB);
    let mut s2 = [[_mm512_setzero_si512(); T]; R];
    if MINS {
        for j in 0..8 {
            let m: [__m512i; R] = std::array::from_fn(|i| ld512(&r[i][at_c + 64 * j..][..64]));
            for t in 0..T {
                let q = _mm512_set1_epi32(word(a, 512 + T * j + t));
                for (s2, &m) in s2.iter_mut().zip(&m) {
                    s2[t] = _mm512_dpwssd_epi32(s2[t], m, q);
                }
            }
        }
    }
    for (i, p) in p.iter_mut().enumerate() {
        let dw = _mm512_castsi512_ps(ld512(&r[i][at_c + 576..][..64]));
        let mw = _mm512_castsi512_ps(ld512(&r[i][at_c + 640..][..64]));
        for (t, p) in p.iter_mut().enumerate() {
            let da = _mm512_set1_ps(f32::from_bits(word(a, 576 + t) as u32));
            let sums = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(s1[i][t]));
            let term = if MINS {
                let mins = _mm512_mul_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(s2[i][t]));
                _mm512_sub_ps(sums, mins)
            } else {
                sums
            };
            let before = if b < 8 {
                _mm512_setzero_ps()
            } else {
                // SAFETY: written by super-block `b - 8`.
                unsafe { p[b % 8].assume_init() }
            };
            p[b % 8] = MaybeUninit::new(_mm512_add_ps(before, term));
        }
    }
}

/// The tree of each token's eight partials (those of the `nb` super-blocks
/// written, zeros for the rest) times `factor`, into `out[t·stride + r]`.
#[target_feature(enable = "avx512f")]
fn tiled_store(
    p: &[[MaybeUninit<__m512>; 8]; 8],
    nb: usize,
    factor: f32,
    out: &mut [f32],
    stride: usize,
) {
    for (t, p) in p.iter().enumerate() {
        let p: [__m512; 8] = std::array::from_fn(|k| {
            if k < nb {
                // SAFETY: written by super-block `k`.
                unsafe { p[k].assume_init() }
            } else {
                _mm512_setzero_ps()
            }
        });
        let v = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3])),
            _mm512_add_ps(_mm512_add_ps(p[4], p[5]), _mm512_add_ps(p[6], p[7])),
        );
        let v = _mm512_mul_ps(v, _mm512_set1_ps(factor));
        let o = &mut out[t * stride..][..16];
        // SAFETY: `o` holds sixteen floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The F16 tiles with narrow rows widened once per block (Intel's table)
    /// and converted in the loop (AMD's) give the same bits, at widths below
    /// and above the widening bound, with column tails and every remainder
    /// of rows and tokens.
    #[test]
    fn f16_tiles_widened_or_converted_are_the_same_bits() {
        if !super::super::has_avx512() {
            return;
        }
        let mut next = super::super::test_values(0x0f16_0512_7a11_5eedu64);
        let (f16, f32_of) = (
            memwall_format::blocks::f32_to_f16,
            memwall_format::blocks::f16_to_f32,
        );
        for cols in [1, 33, 576, 1000, 1536] {
            for rows in [1, 2, 4, 7] {
                for tokens in [2, 5, 9] {
                    let h: Vec<u16> = (0..rows * cols).map(|_| f16(next())).collect();
                    let w: Vec<u8> = h.iter().flat_map(|h| h.to_le_bytes()).collect();
                    let a: Vec<f32> = (0..tokens * cols).map(|_| next()).collect();
                    let (mut widened, mut converted) = (vec![0f32; rows * 9], vec![1f32; rows * 9]);
                    r_f16w_f32(&w, cols, &a, &mut widened, 9);
                    r_f16w_f32_converting(&w, cols, &a, &mut converted, 9);
                    for r in 0..rows {
                        for t in 0..tokens {
                            let (x, y) = (widened[r * 9 + t], converted[r * 9 + t]);
                            assert_eq!(
                                x.to_bits(),
                                y.to_bits(),
                                "{rows}×{cols}, {tokens} tokens: row {r}, token {t}"
                            );
                            let exact: f64 = (0..cols)
                                .map(|c| {
                                    f64::from(f32_of(h[r * cols + c])) * f64::from(a[t * cols + c])
                                })
                                .sum();
                            assert!(
                                (f64::from(x) - exact).abs() <= 1e-4 * (1.0 + exact.abs()),
                                "{rows}×{cols}, {tokens} tokens: row {r}, token {t}: {x} vs {exact}"
                            );
                        }
                    }
                }
            }
        }
    }
}
