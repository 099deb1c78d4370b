//! AVX2 (+ FMA, F16C) kernels for every type.
//!
//! The integer work follows one pattern: weights as unsigned (or signed)
//! bytes, `vpmaddubsw` against the signed activation bytes into 16-bit pairs
//! (never saturating: |w| ≤ 128 and |a| ≤ 127 for signed weights go through
//! `vpsignb`, unsigned weights stay ≤ 63), `vpmaddwd` against 1 or the
//! sub-block scale into 32-bit sums. Offsets (Q3_K's −4, Q6_K's −32) are
//! taken out afterwards through the activations' `bsums`.
//!
//! The float work follows the canonical order of the `kernels` module docs:
//! rows of 32-weight blocks go eight blocks at a time, their integer sums
//! transposed into one vector whose lane `k` is partial `k`; the K-quants
//! reduce each super-block to one `i32` and use the scalar term code; the
//! float types keep 32 partials in four vectors. No fused multiply-add except
//! on exact products (f16 × f16).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::super::scalar::{
    Blocks, FLOAT_PARTIALS, FloatSum, f16_tail_step, k4_scales, term, term_kmin,
};
use crate::forward::math::{
    EXP_FAST_C, EXP_FAST_MAX, EXP_FAST_MIN, LN2_HI_F32, LN2_LO_F32, LOG2E_F32, ROUND_F32, exp_fast,
};
use crate::kernels::attn::{self, KEY_TILE, by_heads, by_product_rows};
use crate::kernels::{
    BlockQ8_0, BlockQ8_1, BlockQ8K, ColumnsTable, DotTable, OpsTable, Q8_GROUP_BYTES, Q8KRows,
    Q8Rows, QK8_0, RowsTable, Scaled, TiledProduct, block_entries, block_table, tiled,
};
use memwall_format::blocks::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockQ2K, BlockQ3K,
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockTq1_0,
    BlockTq2_0, Codes, F16, Groups, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID,
    IQ3XXS_GRID, IQ4NL_GRID, Lattice, MXFP4_GRID, e8m0_half, f16_to_f32, f32_to_f16, tq1_trit,
    ue4m3_half,
};

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
entry!(e_dot_f32, dot_f32, &[f32], &[f32]);
entry!(e_dot_f16_f32, dot_f16_f32, &[u16], &[f32]);
entry!(e_dot_f16_f16, dot_f16_f16, &[u16], &[u16]);
memwall_format::block_types!([block_entries]);

/// Declares a safe entry point for a several-row kernel: [`rows_grouped`]
/// for blocks of `$b` unpacked by `$unpack`, `$shift` as there.
macro_rules! rows_entry {
    ($name:ident, $b:ty, $unpack:ident, $shift:literal) => {
        fn $name(w: &[$b], rows: usize, a: Q8Rows<'_>, out: &mut [f32], stride: usize) {
            // SAFETY: as for `entry!`.
            let row = |w: &[$b], out: &mut [f32]| unsafe {
                rows_grouped::<_, $shift>(w, |b| $unpack(b), a.groups, out)
            };
            super::each_row(w, rows, out, stride, a.tokens, row);
        }
    };
}

rows_entry!(r_q4_0, BlockQ4_0, unpack_q4_0, 3);
rows_entry!(r_q5_0, BlockQ5_0, unpack_q5_0, 4);
rows_entry!(r_q8_0, BlockQ8_0, unpack_q8_0, 0);
rows_entry!(r_iq4_nl, BlockIq4Nl, unpack_iq4_nl, 0);

pub(super) fn r_q4_k(w: &[BlockQ4K], a: Q8KRows<'_>, out: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { q4_k_rows(w, a.blocks, out) }
}

pub(super) fn r_tq1_0(w: &[BlockTq1_0], a: Q8KRows<'_>, out: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { tq1_0_rows(w, a.blocks, out) }
}

pub(super) fn r_tq2_0(w: &[BlockTq2_0], a: Q8KRows<'_>, out: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { tq2_0_rows(w, a.blocks, out) }
}

fn r_lattice<B: Lattice>(w: &[B], a: Q8KRows<'_>, out: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { lattice_rows(w, a.blocks, out) }
}

pub(super) fn r_q6_k(w: &[BlockQ6K], a: Q8KRows<'_>, out: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { q6_k_rows(w, a.blocks, out) }
}

/// Rows of fewer super-blocks than this gain from the eight-row product
/// ([`column256`]) on every type; a row of this many or more has vector
/// terms of its own, and the `narrow` entries hand it to their one-row
/// product instead.
const NARROW_BLOCKS: usize = 8;

/// `out[r]` = `row(row r of w, a)`: a one-token product of several rows one
/// row at a time.
#[inline]
fn each_row<B>(w: &[B], a: &[BlockQ8K], out: &mut [f32], row: impl Fn(&[B], &[BlockQ8K]) -> f32) {
    for (o, w) in out.iter_mut().zip(w.chunks_exact(a.len())) {
        *o = row(w, a);
    }
}

/// Declares a safe entry point `$name` for a one-token product of several
/// K-quant rows ([`column256`]) from a block type's sums and scales,
/// compiled with the target features `$features` (with AVX-512's, its
/// sixteen more vector registers hold the eight rows' sums).
///
/// With `narrow` and the type's one-row kernel first, rows of
/// [`NARROW_BLOCKS`] or more go one at a time through it (the same bits):
/// on AVX2 the eight rows' sums and minimums spill its sixteen registers.
macro_rules! column_entry {
    ($features:literal, $name:ident, $b:ty, $min:literal, $sums:path, $scales:expr) => {
        pub(super) fn $name(w: &[$b], a: &[BlockQ8K], out: &mut [f32]) {
            #[target_feature(enable = $features)]
            fn kernel(w: &[$b], a: &[BlockQ8K], out: &mut [f32]) {
                super::avx2::column256::<_, $min>(w, a, out, |b, y| $sums(b, y), $scales)
            }
            // SAFETY: reachable only through a table that `Kernels::new`
            // hands out after probing `$features`.
            unsafe { kernel(w, a, out) }
        }
    };
    (narrow $row:ident, $features:literal, $name:ident, $b:ty, $min:literal, $sums:path, $scales:expr) => {
        pub(super) fn $name(w: &[$b], a: &[BlockQ8K], out: &mut [f32]) {
            #[target_feature(enable = $features)]
            fn kernel(w: &[$b], a: &[BlockQ8K], out: &mut [f32]) {
                if a.len() < NARROW_BLOCKS {
                    column256::<_, $min>(w, a, out, |b, y| $sums(b, y), $scales);
                } else {
                    each_row(w, a, out, |w, a| $row(w, a));
                }
            }
            // SAFETY: reachable only through a table that `Kernels::new`
            // hands out after probing `$features`.
            unsafe { kernel(w, a, out) }
        }
    };
}
pub(super) use column_entry;

column_entry!(
    narrow q4_k,
    "avx2,fma,f16c",
    c_q4_k,
    BlockQ4K,
    true,
    q4_k_sums,
    |b: &BlockQ4K| [b.d.bits(), b.dmin.bits()]
);
column_entry!(
    narrow q5_k,
    "avx2,fma,f16c",
    c_q5_k,
    BlockQ5K,
    true,
    q5_k_sums,
    |b: &BlockQ5K| [b.d.bits(), b.dmin.bits()]
);
column_entry!(
    "avx2,fma,f16c",
    c_q6_k,
    BlockQ6K,
    false,
    q6_k_sums,
    |b: &BlockQ6K| [b.d.bits(), 0]
);
pub(super) fn r_f16w_f32(w: &[u8], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    let tokens = a.len() / cols;
    if tokens >= 2 {
        // SAFETY: as for `entry!`.
        unsafe { f16_rows(w, cols, a, out, stride) };
        return;
    }
    for (r, w) in w.chunks_exact(2 * cols).enumerate() {
        // SAFETY: as for `entry!`.
        unsafe { f16w_rows_f32(w, a, &mut out[r * stride..][..tokens]) }
    }
}

/// [`RowF16F16`](crate::kernels::RowF16F16), for AMD's cores (see
/// [`TABLE_AMD`]).
pub(super) fn r_f16w_f16(w: &[u8], cols: usize, a: &[u16], out: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { f16w_rows_f16(w, cols, a, out) }
}

fn r_f16_wide(w: &[f32], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    // SAFETY: as for `entry!`.
    unsafe { f16_rows_any::<true>(&[], w, cols, a, out, stride) };
}

/// The AVX2 table for AMD's cores ([`super::amd_cores`]): they convert f16
/// to f32 beside their multiply-adds, so the F16 tiles convert their weight
/// rows in the loop (a widened copy only doubles the bytes they read), and a
/// decoded token's F16 rows meet its f16 activations converted in the loop
/// too (`f16_f16`: half the bytes of the widened ones, so a wide row's stay
/// in L1), without software prefetches (their hardware prefetchers stream
/// the rows faster alone). The same bits either way.
pub(crate) static TABLE_AMD: DotTable = DotTable {
    rows: RowsTable {
        f16_f16: Some(r_f16w_f16),
        f16_wide: None,
        ..TABLE.rows
    },
    ..TABLE
};

/// The AVX2 table: every type.
pub(crate) static TABLE: DotTable = memwall_format::block_types!([block_table] entry {
    f32: e_f32w,
    f16: e_f16w,
    bf16: e_bf16w,
    dot_f32: e_dot_f32,
    dot_f16_f32: e_dot_f16_f32,
    dot_f16_f16: e_dot_f16_f16,
    rows: RowsTable {
        f16_f32: Some(r_f16w_f32),
        f16_f16: None,
        f16_wide: Some(r_f16_wide),
        q4_k: Some(r_q4_k),
        q6_k: Some(r_q6_k),
        tq1_0: Some(r_tq1_0),
        tq2_0: Some(r_tq2_0),
        iq2_xxs: Some(r_lattice::<BlockIq2Xxs>),
        iq2_xs: Some(r_lattice::<BlockIq2Xs>),
        iq2_s: Some(r_lattice::<BlockIq2S>),
        iq3_xxs: Some(r_lattice::<BlockIq3Xxs>),
        iq3_s: Some(r_lattice::<BlockIq3S>),
        iq1_s: Some(r_lattice::<BlockIq1S>),
        iq1_m: Some(r_lattice::<BlockIq1M>),
        q4_0: Some(r_q4_0),
        q5_0: Some(r_q5_0),
        q8_0: Some(r_q8_0),
        iq4_nl: Some(r_iq4_nl),
        columns: ColumnsTable {
            q4_k: Some(c_q4_k),
            q5_k: Some(c_q5_k),
            q6_k: Some(c_q6_k),
            tq1_0: Some(c_tq1_0),
            tq2_0: Some(c_tq2_0),
            iq2_xxs: Some(c_iq2_xxs),
            iq2_xs: Some(c_iq2_xs),
            iq2_s: Some(c_iq2_s),
            iq3_xxs: Some(c_iq3_xxs),
            iq3_s: Some(c_iq3_s),
            iq1_s: Some(c_iq1_s),
            iq1_m: Some(c_iq1_m),
        },
        tiled: Some(TiledProduct {
            product: t_tiled,
            max_value: 64,
        }),
        q8k_groups: false,
    },
    ops: OPS,
});

/// The AVX2 float loops: attention's tiles compiled for 256-bit vectors,
/// F16C conversions, `exp` on eight lanes, the Q8_0 quantizer and 8 × 8
/// transposes.
pub(super) const OPS: OpsTable = OpsTable {
    key_tiles: o_key_tiles,
    product_tiles: o_product_tiles,
    weighted_rows: o_weighted_rows,
    axpy: o_axpy,
    widen_f16: o_widen_f16,
    widen_f16_le: o_widen_f16_le,
    narrow_f16: o_narrow_f16,
    exp_fast: o_exp_fast,
    quantize_q8_0: o_quantize_q8_0,
    transpose: o_transpose,
};

fn o_key_tiles(q: &[f32], hd: usize, kt: &[f32], stride: usize, out: &mut [[f32; KEY_TILE]]) {
    // SAFETY: as for `entry!`.
    unsafe { by_heads!(key_tiles, 16, out.len(), q, hd, kt, stride, out) }
}

fn o_product_tiles(q: &[f32], hd: usize, kt: &[f32], stride: usize, out: &mut [[f32; KEY_TILE]]) {
    // SAFETY: as for `entry!`.
    unsafe { by_product_rows!(product_tiles, 16, out.len(), q, hd, kt, stride, out) }
}

fn o_weighted_rows(out: &mut [f32], probs: &[f32], v: &[f32], heads: usize) {
    // SAFETY: as for `entry!`.
    unsafe { by_heads!(weighted_rows, 16, heads, out, probs, v) }
}

fn o_axpy(out: &mut [f32], p: f32, x: &[f32]) {
    // SAFETY: as for `entry!`.
    unsafe { axpy(out, p, x) }
}

fn o_widen_f16(src: &[u16], dst: &mut [f32]) {
    // SAFETY: the bytes of `src` (any bytes are `u8`s; x86-64 is
    // little-endian, so they are the values' little-endian bytes).
    let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), 2 * src.len()) };
    // SAFETY: as for `entry!` (the table's probe covers F16C).
    unsafe { widen_f16_le(bytes, dst) }
}

fn o_widen_f16_le(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as for `entry!` (the table's probe covers F16C).
    unsafe { widen_f16_le(src, dst) }
}

fn o_narrow_f16(src: &[f32], dst: &mut [u16]) {
    // SAFETY: as for `entry!` (the table's probe covers F16C).
    unsafe { narrow_f16(src, dst) }
}

fn o_exp_fast(xs: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { exp_fast_in_place(xs) }
}

fn o_quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (x, b) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        // SAFETY: as for `entry!`.
        unsafe { q8_0_block(x, b) };
    }
}

fn o_transpose(src: &[f32], stride: usize, rows: usize, cols: usize, dst: &mut [f32]) {
    // SAFETY: as for `entry!`.
    unsafe { transpose(src, stride, rows, cols, dst) }
}

// ---- the float loops (`OPS`) ----

#[target_feature(enable = "avx2")]
fn key_tiles<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    attn::key_tiles_generic::<N, P>(q, hd, kt, stride, out)
}

#[target_feature(enable = "avx2,fma")]
fn product_tiles<const N: usize, const P: usize>(
    q: &[f32],
    hd: usize,
    kt: &[f32],
    stride: usize,
    out: &mut [[f32; KEY_TILE]],
) {
    attn::product_tiles_generic::<N, P>(q, hd, kt, stride, out)
}

#[target_feature(enable = "avx2")]
fn weighted_rows<const N: usize, const W: usize>(out: &mut [f32], probs: &[f32], v: &[f32]) {
    attn::weighted_rows_generic::<N, W>(out, probs, v)
}

#[target_feature(enable = "avx2")]
fn axpy(out: &mut [f32], p: f32, x: &[f32]) {
    attn::axpy(out, p, x)
}

/// f16 (little-endian bytes) to `f32`, eight at a time with F16C (exact).
#[target_feature(enable = "avx2,f16c")]
pub(super) fn widen_f16_le(src: &[u8], dst: &mut [f32]) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(16);
    for (d, s) in (&mut d).zip(&mut s) {
        // SAFETY: `s` has 16 readable bytes and `d` 32 writable ones.
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr().cast());
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for (d, h) in d
        .into_remainder()
        .iter_mut()
        .zip(s.remainder().chunks_exact(2))
    {
        *d = f16_to_f32(u16::from_le_bytes([h[0], h[1]]));
    }
}

/// `f32` to f16, eight at a time with F16C (round to nearest even, as
/// `f32_to_f16`).
#[target_feature(enable = "avx2,f16c")]
fn narrow_f16(src: &[f32], dst: &mut [u16]) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        // SAFETY: `s` has 32 readable bytes and `d` 16 writable ones.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr().cast(), h);
        }
    }
    for (d, &v) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = f32_to_f16(v);
    }
}

/// One block of [`quantize_row_q8_0`] with AVX2, the same bytes: the
/// maximum ignores NaN as `f32::max` does, `x · id` is the same product,
/// rounding is truncation plus a step away from zero when the (exact)
/// remainder is at least one half, and NaN products become 0 as `as i8`
/// makes them (no product reaches ±128: |x · id| ≤ 127 + a rounding).
#[target_feature(enable = "avx2")]
fn q8_0_block(x: &[f32], b: &mut BlockQ8_0) {
    use std::arch::x86_64::*;
    assert_eq!(x.len(), QK8_0);
    // SAFETY: each load reads 8 of the 32 floats of `x`.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x[8 * i..].as_ptr()) });
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for v in v {
        // `max(|v|, m)` returns `m` when `|v|` is NaN.
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` has 32 writable bytes.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let amax = lanes.iter().fold(0f32, |a, &l| a.max(l));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b.d = F16::from_f32(d);
    let q: [__m256i; 4] = v.map(|v| {
        let p = _mm256_mul_ps(v, _mm256_set1_ps(id));
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
        let rem = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
        let away = _mm256_cmp_ps::<_CMP_GE_OQ>(rem, _mm256_set1_ps(0.5));
        let step = _mm256_or_ps(_mm256_and_ps(p, sign), _mm256_set1_ps(1.0));
        let r = _mm256_add_ps(t, _mm256_and_ps(away, step));
        let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
        _mm256_cvttps_epi32(r)
    });
    // i32 → i8 with saturation; the packs interleave 128-bit halves, the
    // permutation restores element order.
    let w01 = _mm256_packs_epi32(q[0], q[1]);
    let w23 = _mm256_packs_epi32(q[2], q[3]);
    let bytes = _mm256_packs_epi16(w01, w23);
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `qs` has 32 writable bytes.
    unsafe { _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), bytes) };
}

/// `x ← exp_fast(x)` for every element, eight lanes at a time: the same
/// operations in the same order as [`exp_fast`], so the same bits. Four
/// vectors go through each step together ([`exp8s`]).
#[target_feature(enable = "avx2")]
pub(super) fn exp_fast_in_place(xs: &mut [f32]) {
    let mut fours = xs.chunks_exact_mut(32);
    for x in &mut fours {
        // SAFETY: `x` is a chunk of exactly 32 floats: four loads of eight.
        let v = exp8s::<4>(std::array::from_fn(|i| unsafe {
            _mm256_loadu_ps(x[8 * i..].as_ptr())
        }));
        for (i, v) in v.into_iter().enumerate() {
            // SAFETY: the same 32 floats, writable.
            unsafe { _mm256_storeu_ps(x[8 * i..].as_mut_ptr(), v) };
        }
    }
    let mut chunks = fours.into_remainder().chunks_exact_mut(8);
    for x in &mut chunks {
        // SAFETY: `x` is a chunk of exactly eight floats (32 readable bytes).
        let [v] = exp8s::<1>([unsafe { _mm256_loadu_ps(x.as_ptr()) }]);
        // SAFETY: the same 32 bytes, writable.
        unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) };
    }
    for x in chunks.into_remainder() {
        *x = exp_fast(*x);
    }
}

/// [`exp_fast`] of `N` vectors, each step applied to all of them before the
/// next: one vector's steps form a chain of some thirty dependent operations,
/// and the chains of vectors in a row, one after the other, filled the
/// scheduler with operations waiting on their predecessors.
#[inline]
#[target_feature(enable = "avx2")]
fn exp8s<const N: usize>(x: [__m256; N]) -> [__m256; N] {
    let set = _mm256_set1_ps;
    macro_rules! each {
        (|$i:ident| $e:expr) => {
            std::array::from_fn::<__m256, N, _>(|$i| $e)
        };
    }
    // Clamped into range first (the lanes outside are replaced below).
    let xc = each!(|i| _mm256_min_ps(_mm256_max_ps(x[i], set(EXP_FAST_MIN)), set(EXP_FAST_MAX)));
    let round = set(ROUND_F32);
    let k = each!(|i| _mm256_add_ps(_mm256_mul_ps(xc[i], set(LOG2E_F32)), round));
    let k = each!(|i| _mm256_sub_ps(k[i], round));
    let r = each!(|i| _mm256_sub_ps(xc[i], _mm256_mul_ps(k[i], set(LN2_HI_F32))));
    let r = each!(|i| _mm256_sub_ps(r[i], _mm256_mul_ps(k[i], set(LN2_LO_F32))));
    let mut p = [set(EXP_FAST_C[0]); N];
    for &c in &EXP_FAST_C[1..] {
        p = each!(|i| _mm256_add_ps(_mm256_mul_ps(p[i], r[i]), set(c)));
    }
    let p = each!(|i| _mm256_add_ps(_mm256_mul_ps(p[i], r[i]), set(1.0)));
    let p = each!(|i| _mm256_add_ps(_mm256_mul_ps(p[i], r[i]), set(1.0)));
    let pow2 = |n: __m256i| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            n,
            _mm256_set1_epi32(127),
        )))
    };
    let v = each!(|i| {
        let ki = _mm256_cvtps_epi32(k[i]);
        let half = _mm256_srai_epi32::<1>(_mm256_add_epi32(ki, _mm256_srli_epi32::<31>(ki)));
        _mm256_mul_ps(
            _mm256_mul_ps(p[i], pow2(half)),
            pow2(_mm256_sub_epi32(ki, half)),
        )
    });
    each!(|i| {
        let v = _mm256_blendv_ps(
            v[i],
            set(f32::INFINITY),
            _mm256_cmp_ps::<_CMP_GT_OQ>(x[i], set(EXP_FAST_MAX)),
        );
        let v = _mm256_blendv_ps(
            v,
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LT_OQ>(x[i], set(EXP_FAST_MIN)),
        );
        _mm256_blendv_ps(v, x[i], _mm256_cmp_ps::<_CMP_UNORD_Q>(x[i], x[i]))
    })
}

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

/// [`tree8`](super::super::scalar::tree8) lane by lane: lane `l` of the
/// result is the tree of lane `l` of the eight partial vectors `p`.
#[inline]
#[target_feature(enable = "avx")]
fn tree8_lanes(p: &[__m256; 8]) -> __m256 {
    _mm256_add_ps(
        _mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3])),
        _mm256_add_ps(_mm256_add_ps(p[4], p[5]), _mm256_add_ps(p[6], p[7])),
    )
}

/// [`tree8`](super::super::scalar::tree8) of the eight lanes of `v`:
/// `((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))`, the same additions.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn tree8_ps(v: __m256) -> f32 {
    let h = _mm_hadd_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h = _mm_hadd_ps(h, h);
    _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
}

/// The 32 float partials of four accumulators folded to eight,
/// `q[k] = (p[k] + p[k+8]) + (p[k+16] + p[k+24])`, then [`tree8_ps`].
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn fold32_ps(acc: [__m256; 4]) -> f32 {
    tree8_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// [`tree8_ps`] of eight vectors at once, lane `i` of the result from
/// `v[i]`: the same additions, paired across vectors by `hadd` (which adds
/// neighbouring lanes, as `tree8` pairs them) and the two halves added last.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn tree8x8_ps(v: [__m256; 8]) -> __m256 {
    // Per half: `[a01, a23, b01, b23]` → `[a0123, b0123, c0123, d0123]`.
    let quads = |a, b, c, d| _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    let (lo, hi) = (quads(v[0], v[1], v[2], v[3]), quads(v[4], v[5], v[6], v[7]));
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(lo, hi),
        _mm256_permute2f128_ps::<0x31>(lo, hi),
    )
}

/// Lanes `0..n` all ones, the rest zero (`n` ≤ 8).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn first_lanes(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n.min(8) as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// The first `s.len()` (at most 8) lanes from `s`, zeros after them.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ldps_first(s: &[f32]) -> __m256 {
    // SAFETY: lanes whose mask is clear are not read (and cannot fault); the
    // others are the first `min(s.len(), 8)` elements of `s`.
    unsafe { _mm256_maskload_ps(s.as_ptr(), first_lanes(s.len())) }
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

/// The eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn lanes_ps(v: __m256) -> [f32; 8] {
    let mut p = [0f32; 8];
    // SAFETY: `p` has 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_ps(p.as_mut_ptr(), v) };
    p
}

/// The sum of the eight `i32` lanes of `v` (exact: callers stay in range).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Lane `k` of the result = the sum of the eight `i32` lanes of `v[k]` (exact).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn transpose_sum(v: &[__m256i; 8]) -> __m256i {
    let (lo, hi) = transpose_halves(v);
    _mm256_add_epi32(lo, hi)
}

/// [`transpose_sum`] of each 128-bit half apart: lane `k` of the first
/// result sums the four low lanes of `v[k]`, of the second the four high.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose_halves(v: &[__m256i; 8]) -> (__m256i, __m256i) {
    let h01 = zip_add32(v[0], v[1]);
    let h23 = zip_add32(v[2], v[3]);
    let h45 = zip_add32(v[4], v[5]);
    let h67 = zip_add32(v[6], v[7]);
    // Per 128-bit half: [v0, v1, v2, v3] (and [v4, …, v7]) summed over that half.
    let h0123 = zip_add64(h01, h23);
    let h4567 = zip_add64(h45, h67);
    (
        _mm256_permute2x128_si256::<0x20>(h0123, h4567),
        _mm256_permute2x128_si256::<0x31>(h0123, h4567),
    )
}

/// The first step of [`transpose_sum`] for `x`, `y`: in each 128-bit half,
/// `[x0+x2, y0+y2, x1+x3, y1+y3]`. Integer sums are exact in any order; two
/// unpacks and an add are three single-µop instructions in place of
/// `vphaddd`, which is several µops and bound the Q8_0 family's one-token
/// products on Zen 3 (docs/BENCHMARKS.md).
#[inline]
#[target_feature(enable = "avx2")]
fn zip_add32(x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi32(x, y), _mm256_unpackhi_epi32(x, y))
}

/// The second step, of two [`zip_add32`] results `x` (from `a`, `b`) and `y`
/// (from `c`, `d`): in each 128-bit half, `[a, b, c, d]` each summed over
/// that half.
#[inline]
#[target_feature(enable = "avx2")]
fn zip_add64(x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y))
}

/// Eight f16 values to `f32` (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn halves(h: [u16; 8]) -> __m256 {
    // Packed into two 64-bit words in general registers first: eight
    // `vpinsrw` (two µops each, one on the shuffle port) were a large share
    // of the one-token Q4_0/Q5_0 products.
    let word = |h: &[u16]| {
        let w = h.iter().rev().fold(0u64, |w, &v| w << 16 | u64::from(v));
        w as i64
    };
    _mm256_cvtph_ps(_mm_set_epi64x(word(&h[4..]), word(&h[..4])))
}

/// Eight f16 values given four to a 64-bit word (the first in the low bits
/// of `w[0]`) to `f32` (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn half_words(w: [u64; 2]) -> __m256 {
    _mm256_cvtph_ps(_mm_set_epi64x(w[1] as i64, w[0] as i64))
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

/// A row of 32-weight blocks in the canonical order: eight
/// blocks per step, `isum(b, y)` giving a block's integer sum in eight `i32`
/// lanes and `scales(b, y)` the f16 bits of `[d_w, d_a, m_w, s_a]` (the last
/// two only read with `MIN`); the last `nb % 8` blocks are a short group.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn blocks32<B: Block, Y, const MIN: bool>(
    w: &[B],
    a: &[Y],
    isum: impl Fn(&B, &Y) -> __m256i,
    scales: impl Fn(&B, &Y) -> [u16; 4],
) -> f32 {
    let nb = a.len().min(w.len());
    let (wg, ag) = (w[..nb].as_chunks::<8>().0, a[..nb].as_chunks::<8>().0);
    let full = 8 * wg.len();
    let mut acc = _mm256_setzero_ps();
    // Whole groups as arrays of eight: the compiler then keeps the packed
    // scales in general registers and needs no test after each block.
    for (wg, ag) in wg.iter().zip(ag) {
        prefetch_ahead(wg, 8 * size_of::<B>());
        acc = _mm256_add_ps(acc, group32::<B, Y, MIN>(wg, ag, &isum, &scales));
    }
    // The short group: its missing blocks get zero sums and zero scales, so
    // their terms are +0, which leaves a partial unchanged (a partial is
    // never −0: it starts at +0).
    if full < nb {
        let t = group32::<B, Y, MIN>(&w[full..nb], &a[full..nb], &isum, &scales);
        acc = _mm256_add_ps(acc, t);
    }
    tree8_ps(acc)
}

/// One step of [`blocks32`]: the eight partials' terms of up to eight blocks.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn group32<B, Y, const MIN: bool>(
    wg: &[B],
    ag: &[Y],
    isum: &impl Fn(&B, &Y) -> __m256i,
    scales: &impl Fn(&B, &Y) -> [u16; 4],
) -> __m256 {
    let mut v = [_mm256_setzero_si256(); 8];
    // The f16 bits of each scale, four blocks to a 64-bit word.
    let mut sc = [[0u64; 2]; 4];
    for (k, (b, y)) in wg.iter().zip(ag).enumerate().take(8) {
        v[k] = isum(b, y);
        let s = scales(b, y);
        for j in 0..4 {
            sc[j][k / 4] |= u64::from(s[j]) << (16 * (k % 4));
        }
    }
    let d = _mm256_mul_ps(half_words(sc[0]), half_words(sc[1]));
    let t = _mm256_mul_ps(d, _mm256_cvtepi32_ps(transpose_sum(&v)));
    if MIN {
        _mm256_add_ps(t, _mm256_mul_ps(half_words(sc[2]), half_words(sc[3])))
    } else {
        t
    }
}

/// Bytes ahead of the weights being read that [`prefetch_ahead`] asks for.
/// Decoding reads every weight once per token, from memory, and the
/// single-row products stalled on those loads; 4–8 KiB ahead was the best
/// distance measured (docs/BENCHMARKS.md, 2026-11-30).
const PREFETCH_DISTANCE: usize = 8192;

/// Asks for the cache lines `PREFETCH_DISTANCE` bytes past the start of `w`
/// (`len` bytes of them); past the end of the weights this is a hint for
/// memory never read, which cannot fault.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn prefetch_ahead<T>(w: &[T], len: usize) {
    prefetch::<_MM_HINT_T0>(w.as_ptr().cast::<u8>().wrapping_add(PREFETCH_DISTANCE), len);
}

/// Asks for the cache lines of the `len` bytes at `p` (a hint `HINT` of
/// `_mm_prefetch`); for memory that is not the program's it cannot fault.
#[inline]
#[target_feature(enable = "avx2")]
fn prefetch<const HINT: i32>(p: *const u8, len: usize) {
    for off in (0..len).step_by(64) {
        _mm_prefetch::<HINT>(p.wrapping_add(off).cast());
    }
}

/// [`super::transpose`]: 8 × 8 blocks (rows interleaved by pairs of lanes,
/// then by pairs of pairs, then the 128-bit halves exchanged), the edges one
/// value at a time.
#[target_feature(enable = "avx2")]
pub(super) fn transpose(src: &[f32], stride: usize, rows: usize, cols: usize, dst: &mut [f32]) {
    assert!(
        rows == 0
            || cols == 0
            || (src.len() >= (rows - 1) * stride + cols && dst.len() >= rows * cols),
        "transpose lengths"
    );
    let (rows8, cols8) = (rows / 8 * 8, cols / 8 * 8);
    for r0 in (0..rows8).step_by(8) {
        for c0 in (0..cols8).step_by(8) {
            // SAFETY: rows `r0..r0 + 8` of `src`, columns `c0..c0 + 8`, are
            // in bounds (`r0 + 8 ≤ rows`, `c0 + 8 ≤ cols`, checked lengths).
            let r: [__m256; 8] = std::array::from_fn(|i| unsafe {
                _mm256_loadu_ps(src.as_ptr().add((r0 + i) * stride + c0))
            });
            for (j, v) in transpose8(r).into_iter().enumerate() {
                // SAFETY: row `c0 + j` of `dst`, columns `r0..r0 + 8`, likewise.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add((c0 + j) * rows + r0), v) };
            }
        }
    }
    super::transpose_edges(src, stride, rows, cols, dst, rows8, cols8);
}

/// Eight rows of eight floats transposed: lane `i` of result `j` is lane `j`
/// of `r[i]`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // t[2k], t[2k + 1]: rows 2k and 2k + 1 interleaved (low, high lanes of each half).
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // u[4h + k]: columns k and k + 4 (one per 128-bit half) of rows 4h..4h + 4.
    let u: [__m256; 8] = std::array::from_fn(|i| {
        let (h, k) = (i / 4 * 4, i % 4);
        let (a, b) = (t[h + k / 2], t[h + k / 2 + 2]);
        if k % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xee>(a, b)
        }
    });
    [
        _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
        _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
    ]
}

pub(super) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

// ---- Q8_0 family ----

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    blocks32::<_, _, false>(
        w,
        a,
        |b, y| mul_sum_i8(unpack_q4_0(b), ld256(&y.qs)),
        |b, y| [b.d.bits(), y.d.bits(), 0, 0],
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    blocks32::<_, _, false>(
        w,
        a,
        |b, y| mul_sum_i8(unpack_q5_0(b), ld256(&y.qs)),
        |b, y| [b.d.bits(), y.d.bits(), 0, 0],
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    blocks32::<_, _, false>(
        w,
        a,
        |b, y| mul_sum_i8(ld256(&b.qs), ld256(&y.qs)),
        |b, y| [b.d.bits(), y.d.bits(), 0, 0],
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl(w: &[BlockIq4Nl], a: &[BlockQ8_0]) -> f32 {
    blocks32::<_, _, false>(
        w,
        a,
        |b, y| mul_sum_i8(unpack_iq4_nl(b), ld256(&y.qs)),
        |b, y| [b.d.bits(), y.d.bits(), 0, 0],
    )
}

/// MXFP4: [`blocks32`]'s order with the block scale `2^(e − 128) · d_a`
/// formed in `f32` (the exponent is no f16).
#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4(w: &[BlockMxfp4], a: &[BlockQ8_0]) -> f32 {
    let nb = a.len().min(w.len());
    let mut acc = _mm256_setzero_ps();
    for (wg, ag) in w[..nb].chunks(8).zip(a[..nb].chunks(8)) {
        prefetch_ahead(wg, 8 * size_of::<BlockMxfp4>());
        let mut v = [_mm256_setzero_si256(); 8];
        let mut d = [0f32; 8];
        for (k, (b, y)) in wg.iter().zip(ag).enumerate() {
            v[k] = mul_sum_i8(unpack_grid(&MXFP4_GRID, &b.qs), ld256(&y.qs));
            d[k] = e8m0_half(b.e) * y.d.to_f32();
        }
        let t = _mm256_mul_ps(ldps(&d), _mm256_cvtepi32_ps(transpose_sum(&v)));
        acc = _mm256_add_ps(acc, t);
    }
    tree8_ps(acc)
}

// ---- blocks that span several Q8_0 activation blocks ----

/// The canonical order for the types whose blocks span several activation
/// blocks (Q1_0, Q2_0): each activation block `k < n` is a term, eight per
/// step as in [`blocks32`], `isum(k)` giving its integer sum in eight `i32`
/// lanes and `scales(k)` the f16 bits of `[d_w, d_a]`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn pieces32(n: usize, isum: impl Fn(usize) -> __m256i, scales: impl Fn(usize) -> [u16; 2]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for g in (0..n).step_by(8) {
        let mut v = [_mm256_setzero_si256(); 8];
        let mut sc = [[0u64; 2]; 2];
        for (k, v) in v.iter_mut().enumerate().take(n - g) {
            *v = isum(g + k);
            for (sc, s) in sc.iter_mut().zip(scales(g + k)) {
                sc[k / 4] |= u64::from(s) << (16 * (k % 4));
            }
        }
        let d = _mm256_mul_ps(half_words(sc[0]), half_words(sc[1]));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(transpose_sum(&v))));
    }
    tree8_ps(acc)
}

/// Q1_0: each bit as the byte +1 (set) or −1.
#[target_feature(enable = "avx2,fma,f16c")]
fn q1_0(w: &[BlockQ1_0], a: &[BlockQ8_0]) -> f32 {
    let n = a.len().min(4 * w.len());
    pieces32(
        n,
        |k| {
            let bits = &w[k / 4].qs[4 * (k % 4)..][..4];
            let clear = _mm256_xor_si256(
                bit_bytes(u32::from_le_bytes([bits[0], bits[1], bits[2], bits[3]])),
                _mm256_set1_epi8(-1),
            );
            let signs = _mm256_or_si256(clear, _mm256_set1_epi8(1));
            mul_sum_i8(signs, ld256(&a[k].qs))
        },
        |k| [w[k / 4].d.bits(), a[k].d.bits()],
    )
}

/// Q2_0: 32 values `q − 1` from eight bytes, byte `j` from bits
/// `2(j % 4)..` of byte `j / 4`.
#[inline]
#[target_feature(enable = "avx2")]
fn unpack_q2_0(qs: &[u8; 8]) -> __m256i {
    // Byte i of the eight in 32-bit lane i, then its four 2-bit fields
    // moved to the bottom of the lane's four bytes (the shifted copies
    // overlap only in bits that the mask drops).
    let bytes = u64::from_le_bytes(*qs);
    let x = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes as i64));
    let x = _mm256_or_si256(
        _mm256_or_si256(x, _mm256_slli_epi32::<6>(x)),
        _mm256_or_si256(_mm256_slli_epi32::<12>(x), _mm256_slli_epi32::<18>(x)),
    );
    let q = _mm256_and_si256(x, _mm256_set1_epi8(3));
    _mm256_sub_epi8(q, _mm256_set1_epi8(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q2_0(w: &[BlockQ2_0], a: &[BlockQ8_0]) -> f32 {
    let n = a.len().min(2 * w.len());
    pieces32(
        n,
        |k| {
            let halves = w[k / 2].qs.as_chunks::<8>().0;
            mul_sum_i8(unpack_q2_0(&halves[k % 2]), ld256(&a[k].qs))
        },
        |k| [w[k / 2].d.bits(), a[k].d.bits()],
    )
}

/// NVFP4: each activation block is a term over two sub-blocks (the two
/// 128-bit halves of its products), `(d₀·d_a)·i₀ + (d₁·d_a)·i₁`.
#[target_feature(enable = "avx2,fma,f16c")]
fn nvfp4(w: &[BlockNvfp4], a: &[BlockQ8_0]) -> f32 {
    let n = a.len().min(2 * w.len());
    let mut acc = _mm256_setzero_ps();
    for g in (0..n).step_by(8) {
        let mut v = [_mm256_setzero_si256(); 8];
        let (mut d0, mut d1, mut da) = ([0f32; 8], [0f32; 8], [0f32; 8]);
        for (k, v) in v.iter_mut().enumerate().take(n - g) {
            let (b, y, h) = (&w[(g + k) / 2], &a[g + k], (g + k) % 2);
            let qs = &b.qs.as_chunks::<16>().0[h];
            // unpack_grid gives weights 0..8, 16..24, 8..16, 24..32 (low
            // nibbles, then high): the middle 64-bit quarters swap.
            let x = _mm256_permute4x64_epi64::<0b11_01_10_00>(unpack_grid(&MXFP4_GRID, qs));
            *v = mul_sum_i8(x, ld256(&y.qs));
            (d0[k], d1[k]) = (ue4m3_half(b.d[2 * h]), ue4m3_half(b.d[2 * h + 1]));
            da[k] = y.d.to_f32();
        }
        let (i0, i1) = transpose_halves(&v);
        let da = ldps(&da);
        let t0 = _mm256_mul_ps(_mm256_mul_ps(ldps(&d0), da), _mm256_cvtepi32_ps(i0));
        let t1 = _mm256_mul_ps(_mm256_mul_ps(ldps(&d1), da), _mm256_cvtepi32_ps(i1));
        acc = _mm256_add_ps(acc, _mm256_add_ps(t0, t1));
    }
    tree8_ps(acc)
}

// ---- several activation rows per weight row (Q8_0 family) ----
//
// The activations come regrouped (`Q8_GROUP_BYTES`): per eight blocks, eight
// registers whose 32-bit lane `l` holds four quants of block `l`, then the
// blocks' quant sums and scales. Each group of eight weight blocks is
// transposed the same way (`transpose_dwords`) once per pass of
// `GROUP_TOKENS` tokens, so `vpmaddubsw` and `vpmaddwd` leave each block's
// integer sum in its own lane: lane `l` is block `8g + l`, scaled and added
// to partial `l` as in the single product, with no horizontal additions (one
// block per register, these took more µops than the products on Zen 3).
// `vpmaddubsw` wants unsigned weights: the narrow types (Q4_0, Q5_0) are
// offset by `2^SHIFT` (8, 16) and `2^SHIFT · Σy` taken off through the stored
// sums; Q8_0 and IQ4_NL multiply `|w|` by `y` with `w`'s sign (`vpsignb`).

/// Activation rows per pass (each weight group is transposed once per pass).
const GROUP_TOKENS: usize = 16;

/// One weight row of 32-weight blocks (`unpack` gives a
/// block's weights as signed bytes; with `SHIFT > 0` they must lie in
/// `-2^SHIFT..2^SHIFT`) against `out.len()` regrouped Q8_0 activation rows
/// `groups`, each in the canonical order of the single product. A row's
/// last group is padded with zero blocks on both sides: their terms are
/// `+0`, which leaves a partial unchanged.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn rows_grouped<B: Scaled, const SHIFT: i32>(
    w: &[B],
    unpack: impl Fn(&B) -> __m256i,
    groups: &[u8],
    out: &mut [f32],
) {
    let nb = w.len();
    let ng = nb.div_ceil(8);
    let (records, _) = groups.as_chunks::<Q8_GROUP_BYTES>();
    assert!(records.len() == out.len() * ng, "grouped rows lengths");
    for (out, records) in out
        .chunks_mut(GROUP_TOKENS)
        .zip(records.chunks(GROUP_TOKENS * ng))
    {
        let n = out.len();
        let mut acc = [_mm256_setzero_ps(); GROUP_TOKENS];
        for (g, b0) in (0..nb).step_by(8).enumerate() {
            let (q, dw) = weight_group(w, b0, &unpack);
            // Unsigned weights for `vpmaddubsw`: offset, or magnitudes.
            let u = q.map(|q| {
                if SHIFT > 0 {
                    _mm256_add_epi8(q, _mm256_set1_epi8(1 << SHIFT))
                } else {
                    _mm256_sign_epi8(q, q)
                }
            });
            if nb - b0 <= 4 {
                short_group::<SHIFT>(&u, &q, dw, &records[g..], ng, &mut acc[..n]);
                continue;
            }
            for (acc, r) in acc.iter_mut().zip(records[g..].iter().step_by(ng)) {
                let terms = group_terms::<SHIFT>(&u, &q, dw, |at| ld256(&r[at..]));
                *acc = _mm256_add_ps(*acc, terms);
            }
        }
        // Eight tokens' partials folded at once (`tree8_ps`'s additions).
        const { assert!(GROUP_TOKENS % 8 == 0) };
        let (eights, _) = acc.as_chunks::<8>();
        for (out, &v) in out.chunks_mut(8).zip(eights) {
            let mut sums = [0f32; 8];
            // SAFETY: `sums` holds eight floats.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), tree8x8_ps(v)) };
            out.copy_from_slice(&sums[..out.len()]);
        }
    }
}

/// A row's last group when it holds at most four blocks (576 columns are
/// two groups and two blocks): only the first 128 bits of each register are
/// not padding, so two tokens share every product, token `2i` in the low
/// half and `2i + 1` in the high half, the weights in both. Each lane takes
/// the operations of [`group_terms`], so a block's term is the same; each
/// token's partials take the other's lanes as `+0`. Token `t`'s record is
/// `records[t·ng]`; an odd last token takes the whole registers. Not
/// inlined: beside the other groups' loop it left their weights on the
/// stack.
#[inline(never)]
#[target_feature(enable = "avx2,f16c")]
fn short_group<const SHIFT: i32>(
    u: &[__m256i; 8],
    q: &[__m256i; 8],
    dw: __m256,
    records: &[[u8; Q8_GROUP_BYTES]],
    ng: usize,
    acc: &mut [__m256],
) {
    let both = |v: __m256i| _mm256_permute2x128_si256::<0x00>(v, v);
    let (u2, q2) = (u.map(both), q.map(both));
    let dw2 = _mm256_permute2f128_ps::<0x00>(dw, dw);
    let n = acc.len();
    let mut pairs = acc.chunks_exact_mut(2);
    for (i, acc) in (&mut pairs).enumerate() {
        let (lo, hi) = (&records[2 * i * ng], &records[(2 * i + 1) * ng]);
        let pair = |at: usize| {
            let lo = _mm256_castsi128_si256(ld128(&lo[at..]));
            _mm256_inserti128_si256::<1>(lo, ld128(&hi[at..]))
        };
        let terms = group_terms::<SHIFT>(&u2, &q2, dw2, pair);
        let low = _mm256_permute2f128_ps::<0x80>(terms, terms);
        let high = _mm256_permute2f128_ps::<0x81>(terms, terms);
        acc[0] = _mm256_add_ps(acc[0], low);
        acc[1] = _mm256_add_ps(acc[1], high);
    }
    if let [acc] = pairs.into_remainder() {
        let r = &records[(n - 1) * ng];
        let terms = group_terms::<SHIFT>(u, q, dw, |at| ld256(&r[at..]));
        *acc = _mm256_add_ps(*acc, terms);
    }
}

/// One group's terms for one activation record, lane `l` the term of
/// block `8g + l`: `(d_w·d_a)·isum`. `y(at)` gives the record's 32 bytes at
/// offset `at` (its eight registers, the blocks' sums at 256 and scales at
/// 288); `u` and `q` are the transposed weights as unsigned bytes and with
/// their signs ([`rows_grouped`]).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn group_terms<const SHIFT: i32>(
    u: &[__m256i; 8],
    q: &[__m256i; 8],
    dw: __m256,
    y: impl Fn(usize) -> __m256i,
) -> __m256 {
    let ones = _mm256_set1_epi16(1);
    // Byte-pair sums `vpmaddubsw` leaves in one i16 before widening: a pair
    // is at most 2 · (2^(SHIFT+1) − 1) · 127 in magnitude (|w| ≤ 128 when
    // SHIFT is 0), so Q4_0 sums all eight registers of a group in 16 bits,
    // Q5_0 four, Q8_0 and IQ4_NL one (`vpmaddwd` after every product).
    const { assert!(SHIFT == 0 || SHIFT == 3 || SHIFT == 4) };
    let terms16: usize = const {
        match SHIFT {
            3 => 8,
            4 => 4,
            _ => 1,
        }
    };
    let mut s = [_mm256_setzero_si256(); 2];
    for k0 in (0..8).step_by(terms16) {
        // Pairs of products: |2 · 128 · 127| and 2 · 31 · 127 fit an i16
        // (no saturation), and so do `terms16` of the narrow types' pairs.
        let mut p16 = _mm256_setzero_si256();
        for k in k0..k0 + terms16 {
            let mut y = y(32 * k);
            if SHIFT == 0 {
                y = _mm256_sign_epi8(y, q[k]);
            }
            let p = _mm256_maddubs_epi16(u[k], y);
            p16 = if k == k0 { p } else { _mm256_add_epi16(p16, p) };
        }
        let p = _mm256_madd_epi16(p16, ones);
        s[k0 / terms16 % 2] = _mm256_add_epi32(s[k0 / terms16 % 2], p);
    }
    let mut isum = _mm256_add_epi32(s[0], s[1]);
    if SHIFT > 0 {
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32::<SHIFT>(y(256)));
    }
    let da = _mm256_castsi256_ps(y(288));
    _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum))
}

/// Blocks `b0..b0 + 8` of a weight row (zero blocks past its end) as signed
/// bytes, transposed as the regrouped activations are, and their scales.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn weight_group<B: Scaled>(
    w: &[B],
    b0: usize,
    unpack: &impl Fn(&B) -> __m256i,
) -> ([__m256i; 8], __m256) {
    let mut q = [_mm256_setzero_si256(); 8];
    let mut dws = [0u16; 8];
    prefetch_ahead(&w[b0..], 8 * size_of::<B>());
    for (l, b) in w[b0..].iter().take(8).enumerate() {
        q[l] = unpack(b);
        dws[l] = b.scale().bits();
    }
    (transpose_dwords(q), halves(dws))
}

/// Eight registers of eight 32-bit lanes transposed: lane `l` of result `k`
/// is lane `k` of `v[l]`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn transpose_dwords(v: [__m256i; 8]) -> [__m256i; 8] {
    // Within each 128-bit half: neighbours interleaved by 32 bits, then by 64.
    let t: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (v[i / 2 * 2], v[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // u[j] (j < 4): lanes j and j + 4 of v[0..4]; u[4 + j]: the same of v[4..8].
    let u: [__m256i; 8] = std::array::from_fn(|i| {
        let (h, j) = (i / 4 * 4, i % 4);
        let (a, b) = (t[h + j / 2], t[h + j / 2 + 2]);
        if j % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|k| {
        if k < 4 {
            _mm256_permute2x128_si256::<0x20>(u[k], u[k + 4])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[k - 4], u[k])
        }
    })
}

/// A Q4_0 block's weights as signed bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_q4_0(b: &BlockQ4_0) -> __m256i {
    _mm256_sub_epi8(nibbles(&b.qs), _mm256_set1_epi8(8))
}

/// A Q5_0 block's weights as signed bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_q5_0(b: &BlockQ5_0) -> __m256i {
    let qh = u32::from_le_bytes(b.qh);
    // A clear fifth bit means q − 16 < 0: set the byte's high nibble (−16 in two's complement).
    let hi = _mm256_andnot_si256(bit_bytes(qh), _mm256_set1_epi8(0xf0u8 as i8));
    _mm256_or_si256(nibbles(&b.qs), hi)
}

/// A Q8_0 block's weights.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_q8_0(b: &BlockQ8_0) -> __m256i {
    ld256(&b.qs)
}

/// An IQ4_NL block's weights (grid values) as signed bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn unpack_iq4_nl(b: &BlockIq4Nl) -> __m256i {
    unpack_grid(&IQ4NL_GRID, &b.qs)
}

/// The values of a 16-entry grid that 32 nibbles index (low nibbles first).
#[inline]
#[target_feature(enable = "avx2")]
fn unpack_grid(grid: &[i8; 16], qs: &[u8; 16]) -> __m256i {
    let (grid, m) = (ld128(grid), _mm_set1_epi8(0xf));
    let q = ld128(qs);
    let lo = _mm_shuffle_epi8(grid, _mm_and_si128(q, m));
    let hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(q, 4), m));
    _mm256_set_m128i(hi, lo)
}

// ---- Q8_1 family ----

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    blocks32::<_, _, true>(
        w,
        a,
        |b, y| mul_sum_u8_i8(nibbles(&b.qs), ld256(&y.qs)),
        |b, y| [b.d.bits(), y.d.bits(), b.m.bits(), y.s.bits()],
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    blocks32::<_, _, true>(
        w,
        a,
        |b, y| {
            let hi = _mm256_and_si256(bit_bytes(u32::from_le_bytes(b.qh)), _mm256_set1_epi8(0x10));
            let q = _mm256_or_si256(nibbles(&b.qs), hi);
            mul_sum_u8_i8(q, ld256(&y.qs))
        },
        |b, y| [b.d.bits(), y.d.bits(), b.m.bits(), y.s.bits()],
    )
}

// ---- K-quants (Q8_K activations) ----

/// A row of K-quant super-blocks in the canonical order, like
/// [`blocks32`]: `sums(b, y)` gives the super-block's integer sum `isum` and
/// (read with `MIN`) its minimum sum `summs`, each in eight `i32` lanes, and
/// `scales(b)` the f16 bits of `[d_w, m_w]`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn blocks256<B: Block, const MIN: bool>(
    w: &[B],
    a: &[BlockQ8K],
    sums: impl Fn(&B, &BlockQ8K) -> (__m256i, __m256i),
    scales: impl Fn(&B) -> [u16; 2],
) -> f32 {
    let nb = a.len().min(w.len());
    let mut acc = _mm256_setzero_ps();
    let (wg, ag) = (w[..nb].chunks_exact(8), a[..nb].chunks_exact(8));
    let done = 8 * wg.len();
    for (wg, ag) in wg.zip(ag) {
        let mut v = [_mm256_setzero_si256(); 8];
        let mut m = [_mm256_setzero_si256(); 8];
        let mut sc = [[0u16; 8]; 2];
        let mut da = [0f32; 8];
        for (k, (b, y)) in wg.iter().zip(ag).enumerate() {
            prefetch_ahead(std::slice::from_ref(b), size_of::<B>());
            (v[k], m[k]) = sums(b, y);
            [sc[0][k], sc[1][k]] = scales(b);
            da[k] = y.d;
        }
        acc = _mm256_add_ps(acc, k_terms::<MIN>(&v, &m, sc, ldps(&da)));
    }
    let mut sum = Blocks::new(lanes_ps(acc));
    for i in done..nb {
        let (b, y) = (&w[i], &a[i]);
        prefetch_ahead(std::slice::from_ref(b), size_of::<B>());
        let [dw, mw] = scales(b).map(|h| h2f(h));
        let (isum, summs) = sums(b, y);
        let (isum, summs) = (hsum_epi32(isum), hsum_epi32(summs));
        let t = if MIN {
            term_kmin(dw, mw, y.d, isum, summs)
        } else {
            term(dw, y.d, isum)
        };
        sum.add(i, t);
    }
    sum.sum()
}

/// Eight K-quant terms at once, lane `l` from the integer sums `v[l]` and
/// minimum sums `m[l]` (each reduced over its lanes), the f16 bits of the
/// weights' scales `sc[0][l]` and minimums `sc[1][l]`, and the activations'
/// scales `da`: the scalar term's operations in order, `(d_w·d_a)·isum`
/// (minus `(m_w·d_a)·summs` with minimums).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn k_terms<const MIN: bool>(
    v: &[__m256i; 8],
    m: &[__m256i; 8],
    sc: [[u16; 8]; 2],
    da: __m256,
) -> __m256 {
    let d = _mm256_mul_ps(halves(sc[0]), da);
    let t = _mm256_mul_ps(d, _mm256_cvtepi32_ps(transpose_sum(v)));
    if !MIN {
        return t;
    }
    let dm = _mm256_mul_ps(halves(sc[1]), da);
    _mm256_sub_ps(t, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(transpose_sum(m))))
}

/// Weight rows of K-quant super-blocks against one activation row (`w`:
/// `out.len()` whole rows of `a.len()` blocks; a decoded token's product):
/// eight rows at a time, lane `r` of a step is row `r`'s super-block `i` (the
/// eight rows' integer sums transposed into one vector), whose term goes to
/// row `r`'s partial `i % 8` with the operations [`blocks256`] vectorises
/// over blocks, and the partials' tree runs lane by lane, so `out[r]` has the
/// bits of the single product. The rows after the last whole eight go
/// through [`blocks256`]. Compared with one [`blocks256`] per row, a row's
/// sums are never reduced alone and its terms are never scalar.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn column256<B: Block, const MIN: bool>(
    w: &[B],
    a: &[BlockQ8K],
    out: &mut [f32],
    sums: impl Fn(&B, &BlockQ8K) -> (__m256i, __m256i) + Copy,
    scales: impl Fn(&B) -> [u16; 2] + Copy,
) {
    let nb = a.len();
    assert!(w.len() == out.len() * nb, "column256 lengths");
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    let (whole, rest) = out.as_chunks_mut::<8>();
    let (ws, w_rest) = w.split_at(whole.len() * 8 * nb);
    for (out, w) in whole.iter_mut().zip(ws.chunks_exact(8 * nb)) {
        let mut p = [_mm256_setzero_ps(); 8];
        for (i0, ys) in (0..nb).step_by(8).zip(a.chunks(8)) {
            for (k, y) in ys.iter().enumerate() {
                let i = i0 + k;
                let mut v = [_mm256_setzero_si256(); 8];
                let mut m = [_mm256_setzero_si256(); 8];
                let mut sc = [[0u16; 8]; 2];
                for r in 0..8 {
                    let b = &w[r * nb + i];
                    // The same block of the next eight rows, into L2: the
                    // eight rows read side by side are too short a stream
                    // each for the hardware's prefetchers.
                    let next = std::ptr::from_ref(b).cast::<u8>();
                    prefetch::<_MM_HINT_T1>(
                        next.wrapping_add(8 * nb * size_of::<B>()),
                        size_of::<B>(),
                    );
                    (v[r], m[r]) = sums(b, y);
                    [sc[0][r], sc[1][r]] = scales(b);
                }
                let t = k_terms::<MIN>(&v, &m, sc, _mm256_set1_ps(y.d));
                p[k] = _mm256_add_ps(p[k], t);
            }
        }
        *out = lanes_ps(tree8_lanes(&p));
    }
    for (o, w) in rest.iter_mut().zip(w_rest.chunks_exact(nb)) {
        *o = blocks256::<B, MIN>(w, a, sums, scales);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q2_k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
    blocks256::<_, true>(
        w,
        a,
        |b, y| q2_k_sums(b, y),
        |b| [b.d.bits(), b.dmin.bits()],
    )
}

/// A Q2_K super-block's integer sum and minimum sum.
#[inline]
#[target_feature(enable = "avx2")]
fn q2_k_sums(b: &BlockQ2K, y: &BlockQ8K) -> (__m256i, __m256i) {
    let sc = ld128(&b.scales);
    let s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, _mm_set1_epi8(0xf)));
    let m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0xf)));
    let mins = _mm256_madd_epi16(m16, ld256(&y.bsums));
    let mut isum = _mm256_setzero_si256();
    for k in 0..2 {
        let q2 = ld256(&b.qs[32 * k..][..32]);
        for j in 0..4 {
            let v = _mm256_and_si256(srl16(q2, 2 * j as i32), _mm256_set1_epi8(3));
            let p = _mm256_maddubs_epi16(v, ld256(&y.qs[128 * k + 32 * j..]));
            let s = scale_pair(s16, (4 * k + j) as i32);
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, s));
        }
    }
    (isum, mins)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q3_k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    blocks256::<_, false>(w, a, |b, y| q3_k_sums(b, y), |b| [b.d.bits(), 0])
}

/// A Q3_K super-block's integer sum.
#[inline]
#[target_feature(enable = "avx2")]
fn q3_k_sums(b: &BlockQ3K, y: &BlockQ8K) -> (__m256i, __m256i) {
    let sc = b.sub_scales();
    let s16 = _mm256_cvtepi8_epi16(ld128(&sc));
    let hm = ld256(&b.hmask);
    // Σ (u − 4)·y·s = Σ u·y·s − 4·Σ s·bsums, with u = q₂ + 4·hbit in 0..8.
    let corr = _mm256_slli_epi32(_mm256_madd_epi16(s16, ld256(&y.bsums)), 2);
    let mut isum = _mm256_sub_epi32(_mm256_setzero_si256(), corr);
    for k in 0..2 {
        let q2 = ld256(&b.qs[32 * k..][..32]);
        for j in 0..4 {
            let v = _mm256_and_si256(srl16(q2, 2 * j as i32), _mm256_set1_epi8(3));
            let h = _mm256_and_si256(srl16(hm, (4 * k + j) as i32), _mm256_set1_epi8(1));
            let u = _mm256_or_si256(v, _mm256_slli_epi16(h, 2));
            let p = _mm256_maddubs_epi16(u, ld256(&y.qs[128 * k + 32 * j..]));
            let s = scale_pair(s16, (4 * k + j) as i32);
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, s));
        }
    }
    (isum, _mm256_setzero_si256())
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
fn q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    blocks256::<_, true>(
        w,
        a,
        |b, y| q4_k_sums(b, y),
        |b| [b.d.bits(), b.dmin.bits()],
    )
}

/// A Q4_K super-block's integer sum and minimum sum.
#[inline]
#[target_feature(enable = "avx2")]
fn q4_k_sums(b: &BlockQ4K, y: &BlockQ8K) -> (__m256i, __m256i) {
    q4_k_sums_of(&q4_k_prep(b), y)
}

/// A Q4_K super-block unpacked: its 6-bit scales and minimums, and its 256
/// weights as bytes (chunk `c`'s low nibbles in `q[2c]`, high in `q[2c+1]`).
struct Q4kBlock {
    sc: [u8; 8],
    m: [u8; 8],
    q: [__m256i; 8],
}

#[inline]
#[target_feature(enable = "avx2")]
fn q4_k_prep(b: &BlockQ4K) -> Q4kBlock {
    let (sc, m) = k4_scales(&b.scales);
    let m4 = _mm256_set1_epi8(0xf);
    let q = std::array::from_fn(|i| {
        let q = ld256(&b.qs[32 * (i / 2)..][..32]);
        if i % 2 == 0 {
            _mm256_and_si256(q, m4)
        } else {
            _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)
        }
    });
    Q4kBlock { sc, m, q }
}

#[inline]
#[target_feature(enable = "avx2")]
fn q4_k_sums_of(p: &Q4kBlock, y: &BlockQ8K) -> (__m256i, __m256i) {
    let mut isum = _mm256_setzero_si256();
    for c in 0..4 {
        let p_lo = _mm256_maddubs_epi16(p.q[2 * c], ld256(&y.qs[64 * c..]));
        let p_hi = _mm256_maddubs_epi16(p.q[2 * c + 1], ld256(&y.qs[64 * c + 32..]));
        let s_lo = _mm256_madd_epi16(p_lo, _mm256_set1_epi16(i16::from(p.sc[2 * c])));
        let s_hi = _mm256_madd_epi16(p_hi, _mm256_set1_epi16(i16::from(p.sc[2 * c + 1])));
        isum = _mm256_add_epi32(isum, _mm256_add_epi32(s_lo, s_hi));
    }
    (isum, k4_mins(&p.m, y))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    blocks256::<_, true>(
        w,
        a,
        |b, y| q5_k_sums(b, y),
        |b| [b.d.bits(), b.dmin.bits()],
    )
}

/// A Q5_K super-block's integer sum and minimum sum.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q5_k_sums(b: &BlockQ5K, y: &BlockQ8K) -> (__m256i, __m256i) {
    let (sc, m) = k4_scales(&b.scales);
    let mins = k4_mins(&m, y);
    let qh = ld256(&b.qh);
    let one = _mm256_set1_epi8(1);
    let mut isum = _mm256_setzero_si256();
    for c in 0..4 {
        let q = ld256(&b.qs[32 * c..][..32]);
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
    (isum, mins)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    blocks256::<_, false>(w, a, |b, y| q6_k_sums(b, y), |b| [b.d.bits(), 0])
}

/// A Q6_K super-block's integer sum.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn q6_k_sums(b: &BlockQ6K, y: &BlockQ8K) -> (__m256i, __m256i) {
    q6_k_sums_of(&q6_k_prep(b), y)
}

/// A Q6_K super-block unpacked: its sixteen scales as `i16` and its 256
/// unsigned 6-bit weights as bytes, 32 per vector in activation order.
struct Q6kBlock {
    s16: __m256i,
    u: [__m256i; 8],
}

#[inline]
#[target_feature(enable = "avx2")]
fn q6_k_prep(b: &BlockQ6K) -> Q6kBlock {
    let s16 = _mm256_cvtepi8_epi16(ld128(&b.scales));
    let m4 = _mm256_set1_epi8(0xf);
    let mut u = [_mm256_setzero_si256(); 8];
    for n in 0..2 {
        let ql0 = ld256(&b.ql[64 * n..][..32]);
        let ql1 = ld256(&b.ql[64 * n + 32..][..32]);
        let qh = ld256(&b.qh[32 * n..][..32]);
        let h = |mask: i8| _mm256_and_si256(qh, _mm256_set1_epi8(mask));
        u[4 * n] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(h(0x03), 4));
        u[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(h(0x0c), 2));
        u[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), h(0x30));
        u[4 * n + 3] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
            _mm256_srli_epi16(h(0xc0u8 as i8), 2),
        );
    }
    Q6kBlock { s16, u }
}

#[inline]
#[target_feature(enable = "avx2")]
fn q6_k_sums_of(p: &Q6kBlock, y: &BlockQ8K) -> (__m256i, __m256i) {
    // Σ (u − 32)·y·s = Σ u·y·s − 32·Σ s·bsums, with u the unsigned 6-bit value.
    let corr = _mm256_slli_epi32(_mm256_madd_epi16(p.s16, ld256(&y.bsums)), 5);
    let mut isum = _mm256_sub_epi32(_mm256_setzero_si256(), corr);
    for (i, u) in p.u.iter().enumerate() {
        let q = _mm256_maddubs_epi16(*u, ld256(&y.qs[32 * i..]));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(q, scale_pair(p.s16, i as i32)));
    }
    (isum, _mm256_setzero_si256())
}

/// Several activation rows against one row of K-quant
/// super-blocks: `prep` unpacks a super-block once for [`K_GROUP`] rows,
/// `sums` gives its integer sums against one activation block. Each row's
/// blocks go through the scalar term into their partial (`b % 8`), the
/// operations [`blocks256`] vectorises, so the bits are the single product's.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn rows256<B: Block, const MIN: bool, P>(
    w: &[B],
    a: &[BlockQ8K],
    prep: impl Fn(&B) -> P,
    sums: impl Fn(&P, &BlockQ8K) -> (__m256i, __m256i),
    scales: impl Fn(&B) -> [u16; 2],
    out: &mut [f32],
) {
    let (n, nb) = (out.len(), w.len());
    assert_eq!(a.len(), n * nb, "rows256 lengths");
    for t0 in (0..n).step_by(K_GROUP) {
        let m = K_GROUP.min(n - t0);
        let mut acc = [Blocks::default(); K_GROUP];
        for i in 0..nb {
            let b = &w[i];
            prefetch_ahead(std::slice::from_ref(b), size_of::<B>());
            let p = prep(b);
            let [dw, mw] = scales(b).map(|h| h2f(h));
            for (j, acc) in acc.iter_mut().enumerate().take(m) {
                let y = &a[(t0 + j) * nb + i];
                let (isum, summs) = sums(&p, y);
                let t = if MIN {
                    term_kmin(dw, mw, y.d, hsum_epi32(isum), hsum_epi32(summs))
                } else {
                    term(dw, y.d, hsum_epi32(isum))
                };
                acc.add(i, t);
            }
        }
        for (o, acc) in out[t0..t0 + m].iter_mut().zip(&acc) {
            *o = acc.sum();
        }
    }
}

/// Activation rows per unpacked K-quant super-block in [`rows256`].
const K_GROUP: usize = 4;

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_rows(w: &[BlockQ4K], a: &[BlockQ8K], out: &mut [f32]) {
    let prep = |b: &BlockQ4K| q4_k_prep(b);
    let sums = |p: &Q4kBlock, y: &BlockQ8K| q4_k_sums_of(p, y);
    let scales = |b: &BlockQ4K| [b.d.bits(), b.dmin.bits()];
    rows256::<_, true, _>(w, a, prep, sums, scales, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_rows(w: &[BlockQ6K], a: &[BlockQ8K], out: &mut [f32]) {
    let prep = |b: &BlockQ6K| q6_k_prep(b);
    let sums = |p: &Q6kBlock, y: &BlockQ8K| q6_k_sums_of(p, y);
    rows256::<_, false, _>(w, a, prep, sums, |b| [b.d.bits(), 0], out)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_xs(w: &[BlockIq4Xs], a: &[BlockQ8K]) -> f32 {
    blocks256::<_, false>(w, a, |b, y| iq4_xs_sums(b, y), |b| [b.d.bits(), 0])
}

/// An IQ4_XS super-block's integer sum.
#[inline]
#[target_feature(enable = "avx2")]
fn iq4_xs_sums(b: &BlockIq4Xs, y: &BlockQ8K) -> (__m256i, __m256i) {
    let grid = ld128(&IQ4NL_GRID);
    let m = _mm_set1_epi8(0xf);
    let sc = b.sub_scales();
    let mut isum = _mm256_setzero_si256();
    for (ib, &s) in sc.iter().enumerate() {
        let q = ld128(&b.qs[16 * ib..][..16]);
        let lo = _mm_shuffle_epi8(grid, _mm_and_si128(q, m));
        let hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(q, 4), m));
        let v = _mm256_set_m128i(hi, lo);
        let yv = ld256(&y.qs[32 * ib..]);
        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(yv, v));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(s as i16)));
    }
    (isum, _mm256_setzero_si256())
}

// ---- tiled K-quant products (kernels/tiled.rs) ----
//
// Lanes are eight weight rows, half a panel at a time; each token's four
// biased quants (`a + 128`, unsigned) are broadcast against four signed
// values of each row. `vpmaddubsw` adds two products into 16 bits, exactly
// for the types whose values are at most 64 in magnitude (`2 · 255 · 64` is
// below 2^15); where they are at most 32 (`2 · 255 · 32`, twice, is too),
// two groups of four add in 16 bits before `vpmaddwd` against the sub-block
// scale (an `i16` pair) adds them into the row's 32-bit sum, which starts at
// the row's bias (the 128 taken back out); up to 64 each group goes to
// `vpmaddwd` alone.
// The minimums' `summs` are `vpmaddwd` of `i16` pairs against the token's
// stored quant sums; each (row, token) term goes to its partial `b % 8`
// with the scalar operations.

/// Declares the safe entry point of a backend's tiled product: each of the
/// activations' groups of [`tiled::TOKENS`] tokens against the panels, two
/// panels at a time through `$pair::<NSUB, MINS>` where the backend has one
/// (each token's quads then serve both), the rest one at a time through
/// `$kernel::<NSUB, MINS>` (`#[target_feature]` functions the backend's table
/// is only handed out for), or `$kernel::<NSUB, MINS, $flag>` after `; $flag`.
macro_rules! tiled_entry {
    ($name:ident, $kernel:ident $(, $pair:ident)? $(; $flag:tt)?) => {
        fn $name(
            layout: tiled::Layout,
            nb: usize,
            panels: &[u8],
            acts: &[u8],
            out: &mut [f32],
            stride: usize,
        ) {
            let (panel, group) = (nb * tiled::record_bytes(layout.nsub), nb * tiled::ACT_BYTES);
            assert!(
                group > 0 && acts.len() % group == 0 && panels.len() % panel == 0,
                "tiled lengths"
            );
            // `$k::<NSUB, MINS>($p, a, &mut out[..], stride, factor)` for the
            // layout's sub-blocks and minimums.
            macro_rules! call {
                ($k:ident, $p:expr, $a:expr, $o:expr) => {
                    // SAFETY: as for `entry!`.
                    unsafe {
                        match (layout.nsub, layout.mins) {
                            (8, true) => $k::<8, true $(, $flag)?>($p, $a, $o, stride, layout.factor),
                            (8, false) => $k::<8, false $(, $flag)?>($p, $a, $o, stride, layout.factor),
                            (16, true) => $k::<16, true $(, $flag)?>($p, $a, $o, stride, layout.factor),
                            (16, false) => $k::<16, false $(, $flag)?>($p, $a, $o, stride, layout.factor),
                            _ => panic!("tiled layout {layout:?}"),
                        }
                    }
                };
            }
            for (g, a) in acts.chunks_exact(group).enumerate() {
                let (rest, mut row) = (panels, 0);
                $(
                    let mut rest = rest;
                    while let Some((two, next)) = rest.split_at_checked(2 * panel) {
                        let o = &mut out[g * tiled::TOKENS * stride + row..];
                        call!($pair, two.split_at(panel), a, o);
                        (rest, row) = (next, row + 2 * tiled::ROWS);
                    }
                )?
                for p in rest.chunks_exact(panel) {
                    call!($kernel, p, a, &mut out[g * tiled::TOKENS * stride + row..]);
                    row += tiled::ROWS;
                }
            }
        }
    };
}
pub(super) use tiled_entry;

tiled_entry!(t_tiled32, tiled_k; true);
tiled_entry!(t_tiled64, tiled_k; false);

/// The AVX2 tiled product: values of at most 32 in magnitude add two byte
/// pairs in 16 bits, values of at most 64 (the IQ2 types, IQ3_XXS) widen
/// each pair ([`tiled_k`]'s `PAIRED`).
fn t_tiled(
    layout: tiled::Layout,
    nb: usize,
    panels: &[u8],
    acts: &[u8],
    out: &mut [f32],
    stride: usize,
) {
    if layout.max_value <= 32 {
        t_tiled32(layout, nb, panels, acts, out, stride);
    } else {
        t_tiled64(layout, nb, panels, acts, out, stride);
    }
}

/// Word `i` of `bytes` (little-endian).
#[inline]
pub(super) fn word(bytes: &[u8], i: usize) -> i32 {
    let w = &bytes[4 * i..4 * i + 4];
    i32::from_le_bytes([w[0], w[1], w[2], w[3]])
}

/// One panel (`nb` records of [`tiled::record_bytes`]`(NSUB)`) against a
/// group of eight tokens (`nb` records of [`tiled::ACT_BYTES`]):
/// `out[t·stride + r]` for the eight tokens `t` and sixteen rows `r`, each
/// the single product's bits. With `PAIRED`, values of at most 32 in
/// magnitude (two byte-pair sums added in 16 bits); without, at most 64
/// (each pair sum, at most `2 · 255 · 64`, goes to `vpmaddwd` alone).
#[target_feature(enable = "avx2,fma,f16c")]
fn tiled_k<const NSUB: usize, const MINS: bool, const PAIRED: bool>(
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
    // Groups of four values per sub-block (4 or 8: pairs of groups).
    let per_sub = 64 / NSUB;
    let at_c = 4096 + 64 * NSUB;
    let low16 = _mm256_set1_epi32(0xffff);
    for half in 0..2 {
        let h = 32 * half;
        // Partial `k` of token `t`, first written by super-block `k`.
        let mut p = [[MaybeUninit::<__m256>::uninit(); 8]; T];
        let recs = panel
            .chunks_exact(rec)
            .zip(acts.chunks_exact(tiled::ACT_BYTES));
        for (b, (r, a)) in recs.enumerate() {
            let mut s1 = [ld256(&r[at_c + 512 + h..][..32]); T];
            for s in 0..NSUB {
                let sc = ld256(&r[4096 + 64 * s + h..][..32]);
                let sc = _mm256_or_si256(_mm256_slli_epi32::<16>(sc), _mm256_and_si256(sc, low16));
                for k in (s * per_sub..(s + 1) * per_sub).step_by(2) {
                    let w0 = ld256(&r[64 * k + h..][..32]);
                    let w1 = ld256(&r[64 * (k + 1) + h..][..32]);
                    let a = &a[32 * k..][..64];
                    for (t, s1) in s1.iter_mut().enumerate() {
                        let q0 = _mm256_set1_epi32(word(a, t));
                        let q1 = _mm256_set1_epi32(word(a, T + t));
                        let (x0, x1) = (_mm256_maddubs_epi16(q0, w0), _mm256_maddubs_epi16(q1, w1));
                        *s1 = if PAIRED {
                            let x = _mm256_add_epi16(x0, x1);
                            _mm256_add_epi32(*s1, _mm256_madd_epi16(x, sc))
                        } else {
                            let x = _mm256_add_epi32(
                                _mm256_madd_epi16(x0, sc),
                                _mm256_madd_epi16(x1, sc),
                            );
                            _mm256_add_epi32(*s1, x)
                        };
                    }
                }
            }
            let dw = _mm256_castsi256_ps(ld256(&r[at_c + 576 + h..][..32]));
            let mw = _mm256_castsi256_ps(ld256(&r[at_c + 640 + h..][..32]));
            for (t, (p, &s1)) in p.iter_mut().zip(&s1).enumerate() {
                let da = _mm256_set1_ps(f32::from_bits(word(a, 576 + t) as u32));
                let term = if MINS {
                    let mut s2 = _mm256_setzero_si256();
                    for i in 0..8 {
                        let m = ld256(&r[at_c + 64 * i + h..][..32]);
                        let bs = _mm256_set1_epi32(word(a, 512 + T * i + t));
                        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(m, bs));
                    }
                    _mm256_sub_ps(
                        _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(s1)),
                        _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(s2)),
                    )
                } else {
                    _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(s1))
                };
                let before = if b < 8 {
                    _mm256_setzero_ps()
                } else {
                    // SAFETY: written by super-block `b - 8`.
                    unsafe { p[b % 8].assume_init() }
                };
                p[b % 8] = MaybeUninit::new(_mm256_add_ps(before, term));
            }
        }
        for (t, p) in p.iter().enumerate() {
            let p: [__m256; 8] = std::array::from_fn(|k| {
                if k < nb {
                    // SAFETY: written by super-block `k`.
                    unsafe { p[k].assume_init() }
                } else {
                    _mm256_setzero_ps()
                }
            });
            let v = _mm256_mul_ps(tree8_lanes(&p), _mm256_set1_ps(factor));
            let o = &mut out[t * stride + 8 * half..][..8];
            // SAFETY: `o` holds eight floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
        }
    }
}

// ---- lattice i-quants (Q8_K activations) ----
//
// One token: each type's super-block straight from its bytes. The grid rows
// are looked up by scalar index (four 8-value or eight 4-value points per
// group of 32 weights); the sign bytes and the scales of all eight groups
// are built in vector registers where the format packs them (the `KSIGNS`
// indices of IQ2_XXS, IQ2_XS and IQ3_XXS, the scale nibbles); then per group
// `vpsignb` puts the signs on the activations, one `vpmaddubsw` takes the
// unsigned grid values, and `vpmaddwd` the scales of its two 16-weight
// halves. Rows go eight at a time ([`column256`]). Several tokens read the
// blocks unpacked once ([`lattice_rows`]).

/// Declares, for each lattice type, its one-token product of one row
/// (`$f`, [`blocks256`]) and of several rows (`$c`, [`column256`]) from the
/// type's super-block sums `$sums`, each output times `B::FACTOR` as the
/// scalar specification multiplies its sum. With `$narrow` true, rows of
/// [`NARROW_BLOCKS`] or more go one at a time through `$f` (the same bits):
/// the types so marked measured faster that way on wide rows
/// (docs/BENCHMARKS.md).
macro_rules! lattice_entries {
    ($($f:ident $c:ident $b:ident $sums:ident $narrow:literal),* $(,)?) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $f(w: &[$b], a: &[BlockQ8K]) -> f32 {
            blocks256::<_, false>(w, a, |b, y| $sums(b, y), |b| [b.d().bits(), 0])
                * <$b as Lattice>::FACTOR
        }

        fn $c(w: &[$b], a: &[BlockQ8K], out: &mut [f32]) {
            #[target_feature(enable = "avx2,fma,f16c")]
            fn kernel(w: &[$b], a: &[BlockQ8K], out: &mut [f32]) {
                if $narrow && a.len() >= NARROW_BLOCKS {
                    each_row(w, a, out, |w, a| $f(w, a));
                    return;
                }
                column256::<_, false>(w, a, out, |b, y| $sums(b, y), |b| [b.d().bits(), 0]);
                for o in out.iter_mut() {
                    *o *= <$b as Lattice>::FACTOR;
                }
            }
            // SAFETY: reachable only through `TABLE`, which `Kernels::new`
            // hands out after probing AVX2, FMA and F16C.
            unsafe { kernel(w, a, out) }
        }
    )*};
}

lattice_entries!(
    iq2_xxs c_iq2_xxs BlockIq2Xxs iq2_xxs_sums false,
    iq2_xs c_iq2_xs BlockIq2Xs iq2_xs_sums true,
    iq2_s c_iq2_s BlockIq2S iq2_s_sums true,
    iq3_xxs c_iq3_xxs BlockIq3Xxs iq3_xxs_sums true,
    iq3_s c_iq3_s BlockIq3S iq3_s_sums true,
    iq1_s c_iq1_s BlockIq1S iq1_s_sums false,
    iq1_m c_iq1_m BlockIq1M iq1_m_sums false,
);

/// A group of 32 weights: its grid values `v` (unsigned, at most 62), `neg`
/// (`0xff` in the bytes of the negative weights), the scales of its two
/// 16-weight halves `ls` (`i16` lanes 0–7 and 8–15), against the
/// activations `ys`: the signs put on the activations (`vpsignb` by ±1), one
/// `vpmaddubsw` (the byte pairs of the signed values), one `vpmaddwd`.
#[inline]
#[target_feature(enable = "avx2")]
fn signed_group_sum(v: __m256i, neg: __m256i, ls: __m256i, ys: &[i8]) -> __m256i {
    let ys = _mm256_sign_epi8(ld256(ys), _mm256_or_si256(neg, _mm256_set1_epi8(1)));
    _mm256_madd_epi16(_mm256_maddubs_epi16(v, ys), ls)
}

/// [`signed_group_sum`] of a group of signed values `q` (no zeros; IQ1's
/// `8·grid ± 1`).
#[inline]
#[target_feature(enable = "avx2")]
fn offset_group_sum(q: __m256i, ls: __m256i, ys: &[i8]) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(ld256(ys), q));
    _mm256_madd_epi16(p, ls)
}

/// Scales `lo` in `i16` lanes 0–7 and `hi` in lanes 8–15.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_halves(lo: u16, hi: u16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// A group's scale pair as one word (`lo | hi << 16`, see
/// [`scale_pairs`]) spread as [`scale_halves`] does.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_word(word: u32) -> __m256i {
    let spread = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
        2, 3,
    );
    _mm256_shuffle_epi8(_mm256_set1_epi32(word as i32), spread)
}

/// Eight groups' scale pairs from their nibble-pair bytes `b` (IQ2_XS,
/// IQ2_S): word `g` is `(2·lo + 1) | (2·hi + 1) << 16` of byte `g`.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pairs(b: &[u8; 8]) -> [u32; 8] {
    let v = _mm256_cvtepu8_epi32(_mm_set_epi64x(0, i64::from_le_bytes(*b)));
    let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xf));
    let hi = _mm256_slli_epi32(_mm256_srli_epi32(v, 4), 16);
    odd_scale_words(lo, hi)
}

/// Eight scale words `(2·lo + 1) | (2·hi + 1) << 16` from the fields `lo`
/// (bits 0..15 of each lane) and `hi` (already at bit 16).
#[inline]
#[target_feature(enable = "avx2")]
fn odd_scale_words(lo: __m256i, hi: __m256i) -> [u32; 8] {
    let twice = _mm256_slli_epi32(_mm256_or_si256(lo, hi), 1);
    words8(_mm256_or_si256(twice, _mm256_set1_epi32(0x1_0001)))
}

/// The eight `u32` lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
fn words8(v: __m256i) -> [u32; 8] {
    let mut w = [0u32; 8];
    // SAFETY: `w` has 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(w.as_mut_ptr().cast(), v) };
    w
}

/// `KSIGNS` of the bytes of `v` (each at most 127): the byte with an eighth
/// bit that makes its number of set bits even.
#[inline]
#[target_feature(enable = "avx2")]
fn ksigns_bytes(v: __m256i) -> __m256i {
    // The parity of seven bits is that of the nibble `(b ^ b >> 4) & 15`.
    let odd = _mm256_setr_epi8(
        0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0, 0, -128, -128, 0,
        -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
    );
    let nib = _mm256_and_si256(
        _mm256_xor_si256(v, _mm256_srli_epi32(v, 4)),
        _mm256_set1_epi8(0xf),
    );
    _mm256_or_si256(v, _mm256_shuffle_epi8(odd, nib))
}

/// Eight groups' sign words and scales from their words `sas` (IQ2_XXS,
/// IQ3_XXS): four 7-bit `KSIGNS` indices in bits 0..28, the scale `s` in
/// bits 28..32. Returns the sign words (four sign bytes each) and
/// `2s + 1` in both halves of a scale word ([`scale_word`]).
#[inline]
#[target_feature(enable = "avx2")]
fn sas_words(sas: __m256i) -> ([u32; 8], [u32; 8]) {
    let field = |shift: i32, mask: i32| {
        _mm256_and_si256(
            _mm256_sllv_epi32(sas, _mm256_set1_epi32(shift)),
            _mm256_set1_epi32(mask),
        )
    };
    let idx = _mm256_or_si256(
        _mm256_or_si256(field(0, 0x7f), field(1, 0x7f00)),
        _mm256_or_si256(field(2, 0x7f_0000), field(3, 0x7f00_0000)),
    );
    let s = _mm256_or_si256(
        _mm256_slli_epi32(_mm256_srli_epi32(sas, 28), 1),
        _mm256_set1_epi32(1),
    );
    let ls = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
    (words8(ksigns_bytes(idx)), words8(ls))
}

/// Four 8-value grid rows as one register, the first in the low lane.
#[inline]
#[target_feature(enable = "avx2")]
fn rows4(r: [&[i8; 8]; 4]) -> __m256i {
    // Byte by byte: `array::map` stayed a call in this feature context.
    let word = |r: &[i8; 8]| {
        let b = |i: usize| r[i] as u8;
        i64::from_le_bytes([b(0), b(1), b(2), b(3), b(4), b(5), b(6), b(7)])
    };
    let [r0, r1, r2, r3] = [word(r[0]), word(r[1]), word(r[2]), word(r[3])];
    _mm256_set_epi64x(r3, r2, r1, r0)
}

/// Eight 4-value grid points as one register, the first in the low lane.
#[inline]
#[target_feature(enable = "avx2")]
fn points8(p: [&[i8; 4]; 8]) -> __m256i {
    let word = |p: &[i8; 4]| i32::from_le_bytes([p[0] as u8, p[1] as u8, p[2] as u8, p[3] as u8]);
    let [p0, p1, p2, p3, p4, p5, p6, p7] = [
        word(p[0]),
        word(p[1]),
        word(p[2]),
        word(p[3]),
        word(p[4]),
        word(p[5]),
        word(p[6]),
        word(p[7]),
    ];
    _mm256_setr_epi32(p0, p1, p2, p3, p4, p5, p6, p7)
}

/// A super-block's integer sum in eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn iq2_xxs_sums(b: &BlockIq2Xxs, y: &BlockQ8K) -> (__m256i, __m256i) {
    // Words 2g + 1 of the block are the groups' sign-and-scale words.
    let (lo, hi) = (ld256(&b.qs[..32]), ld256(&b.qs[32..]));
    let odd = _mm256_castps_si256(_mm256_shuffle_ps::<0b11_01_11_01>(
        _mm256_castsi256_ps(lo),
        _mm256_castsi256_ps(hi),
    ));
    // `vshufps` leaves groups 0 1 4 5 | 2 3 6 7.
    let (signs, ls) = sas_words(_mm256_permute4x64_epi64::<0b11_01_10_00>(odd));
    let mut isum = _mm256_setzero_si256();
    for g in 0..8 {
        let idx = &b.qs[8 * g..8 * g + 4];
        let v = rows4(std::array::from_fn(|l| &IQ2XXS_GRID[usize::from(idx[l])]));
        let sum = signed_group_sum(v, bit_bytes(signs[g]), scale_word(ls[g]), &y.qs[32 * g..]);
        isum = _mm256_add_epi32(isum, sum);
    }
    (isum, _mm256_setzero_si256())
}

/// A super-block's integer sum in eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn iq2_xs_sums(b: &BlockIq2Xs, y: &BlockQ8K) -> (__m256i, __m256i) {
    // The sign indices (bits 9..16 of each u16) of groups 0–3 and 4–7 packed
    // to bytes: groups 0 1 4 5 | 2 3 6 7, put in order.
    let (lo, hi) = (ld256(&b.qs[..32]), ld256(&b.qs[32..]));
    let idx = _mm256_packus_epi16(_mm256_srli_epi16(lo, 9), _mm256_srli_epi16(hi, 9));
    let signs = words8(_mm256_permute4x64_epi64::<0b11_01_10_00>(ksigns_bytes(idx)));
    let ls = scale_pairs(&b.scales);
    let mut isum = _mm256_setzero_si256();
    for g in 0..8 {
        // The group's four indices in one load (two byte loads each were
        // slower: the loads bound this loop).
        let q = u64::from_le_bytes(b.qs.as_chunks::<8>().0[g]);
        let v = rows4(std::array::from_fn(|l| {
            &IQ2XS_GRID[(q >> (16 * l)) as usize & 511]
        }));
        let sum = signed_group_sum(v, bit_bytes(signs[g]), scale_word(ls[g]), &y.qs[32 * g..]);
        isum = _mm256_add_epi32(isum, sum);
    }
    (isum, _mm256_setzero_si256())
}

/// A super-block's integer sum in eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn iq2_s_sums(b: &BlockIq2S, y: &BlockQ8K) -> (__m256i, __m256i) {
    let ls = scale_pairs(&b.scales);
    let mut isum = _mm256_setzero_si256();
    for g in 0..8 {
        let qh = usize::from(b.qh[g]);
        let v = rows4(std::array::from_fn(|l| {
            &IQ2S_GRID[usize::from(b.qs[4 * g + l]) | ((qh >> (2 * l)) & 3) << 8]
        }));
        let neg = bit_bytes(u32::from_le_bytes(b.signs.as_chunks::<4>().0[g]));
        let sum = signed_group_sum(v, neg, scale_word(ls[g]), &y.qs[32 * g..]);
        isum = _mm256_add_epi32(isum, sum);
    }
    (isum, _mm256_setzero_si256())
}

/// A super-block's integer sum in eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn iq3_xxs_sums(b: &BlockIq3Xxs, y: &BlockQ8K) -> (__m256i, __m256i) {
    let (signs, ls) = sas_words(ld256(&b.sas));
    let mut isum = _mm256_setzero_si256();
    for g in 0..8 {
        let idx = &b.qs[8 * g..8 * g + 8];
        let v = points8(std::array::from_fn(|k| &IQ3XXS_GRID[usize::from(idx[k])]));
        let sum = signed_group_sum(v, bit_bytes(signs[g]), scale_word(ls[g]), &y.qs[32 * g..]);
        isum = _mm256_add_epi32(isum, sum);
    }
    (isum, _mm256_setzero_si256())
}

/// A super-block's integer sum in eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn iq3_s_sums(b: &BlockIq3S, y: &BlockQ8K) -> (__m256i, __m256i) {
    let mut isum = _mm256_setzero_si256();
    for g in 0..8 {
        let qh = usize::from(b.qh[g]);
        let idx = &b.qs[8 * g..8 * g + 8];
        let v = points8(std::array::from_fn(|k| {
            &IQ3S_GRID[usize::from(idx[k]) | ((qh >> k) & 1) << 8]
        }));
        let ls = 1 + 2 * i16::from((b.scales[g / 2] >> (4 * (g % 2))) & 0xf);
        let neg = bit_bytes(u32::from_le_bytes(b.signs.as_chunks::<4>().0[g]));
        let sum = signed_group_sum(v, neg, _mm256_set1_epi16(ls), &y.qs[32 * g..]);
        isum = _mm256_add_epi32(isum, sum);
    }
    (isum, _mm256_setzero_si256())
}

/// IQ1's values `8·grid + delta` (`delta` ±1 bytewise) from four grid rows
/// of −1, 0 and 1.
#[inline]
#[target_feature(enable = "avx2")]
fn iq1_values(rows: __m256i, delta: __m256i) -> __m256i {
    _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), rows), delta)
}

/// A super-block's integer sum in eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn iq1_s_sums(b: &BlockIq1S, y: &BlockQ8K) -> (__m256i, __m256i) {
    let mut isum = _mm256_setzero_si256();
    for g in 0..8 {
        let qh = usize::from(u16::from_le_bytes([b.qh[2 * g], b.qh[2 * g + 1]]));
        let rows = rows4(std::array::from_fn(|l| {
            &IQ1S_GRID[usize::from(b.qs[4 * g + l]) | ((qh >> (3 * l)) & 7) << 8]
        }));
        let delta = _mm256_set1_epi8(if qh & 0x8000 != 0 { -1 } else { 1 });
        let ls = 2 * ((qh >> 12) & 7) as i16 + 1;
        let sum = offset_group_sum(
            iq1_values(rows, delta),
            _mm256_set1_epi16(ls),
            &y.qs[32 * g..],
        );
        isum = _mm256_add_epi32(isum, sum);
    }
    (isum, _mm256_setzero_si256())
}

/// A super-block's integer sum in eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn iq1_m_sums(b: &BlockIq1M, y: &BlockQ8K) -> (__m256i, __m256i) {
    // Byte `j` of a group takes the offset sign of its row `j / 8`: bit 3 or 7
    // of the group's first or second `qh` byte.
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        1, 1,
    );
    let bit = _mm256_setr_epi8(
        8, 8, 8, 8, 8, 8, 8, 8, -128, -128, -128, -128, -128, -128, -128, -128, 8, 8, 8, 8, 8, 8,
        8, 8, -128, -128, -128, -128, -128, -128, -128, -128,
    );
    // Group `g`'s two 3-bit scales are fields `2(g % 2)` and `2(g % 2) + 1`
    // of scale word `g / 2`: the words doubled, shifted by 0 or 6 bits.
    let words = _mm_set_epi64x(0, i64::from_le_bytes(b.scales));
    let v = _mm256_cvtepu16_epi32(_mm_unpacklo_epi16(words, words));
    let v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 6, 0, 6, 0, 6, 0, 6));
    let (lo, hi) = (
        _mm256_and_si256(v, _mm256_set1_epi32(7)),
        _mm256_and_si256(_mm256_slli_epi32(v, 13), _mm256_set1_epi32(7 << 16)),
    );
    let ls = odd_scale_words(lo, hi);
    let mut isum = _mm256_setzero_si256();
    for g in 0..8 {
        let qh = u16::from_le_bytes([b.qh[2 * g], b.qh[2 * g + 1]]);
        let rows = rows4(std::array::from_fn(|l| {
            let nib = usize::from(qh >> (4 * l)) & 7;
            &IQ1S_GRID[usize::from(b.qs[4 * g + l]) | nib << 8]
        }));
        let sel = _mm256_and_si256(
            _mm256_shuffle_epi8(_mm256_set1_epi16(qh as i16), spread),
            bit,
        );
        let delta = _mm256_or_si256(_mm256_cmpeq_epi8(sel, bit), _mm256_set1_epi8(1));
        let sum = offset_group_sum(iq1_values(rows, delta), scale_word(ls[g]), &y.qs[32 * g..]);
        isum = _mm256_add_epi32(isum, sum);
    }
    (isum, _mm256_setzero_si256())
}

/// A lattice super-block ready for several activation rows: its grid values
/// and signs ([`Codes`], the IQ2 and IQ3 types) or its signed values (IQ1).
enum Unpacked {
    Codes(Codes),
    Groups(Groups),
}

#[inline]
fn unpack<B: Lattice>(b: &B) -> Unpacked {
    match b.codes() {
        Some(c) => Unpacked::Codes(c),
        None => Unpacked::Groups(b.groups()),
    }
}

/// A lattice type's several-row product: [`rows256`] over each block
/// unpacked once for several activation rows, each output times
/// `B::FACTOR` as [`lattice`] multiplies its sum.
#[target_feature(enable = "avx2,fma,f16c")]
fn lattice_rows<B: Lattice>(w: &[B], a: &[BlockQ8K], out: &mut [f32]) {
    let sums = |u: &Unpacked, y: &BlockQ8K| match u {
        Unpacked::Codes(c) => codes_sums(c, y, B::HALVES),
        Unpacked::Groups(g) => lattice_group_sums(g, y, B::HALVES),
    };
    rows256::<_, false, _>(w, a, unpack, sums, |b| [b.d().bits(), 0], out);
    for o in out.iter_mut() {
        *o *= B::FACTOR;
    }
}

/// One group of 32 weights of a block's [`Codes`]: its grid values `v`, its
/// sign bits and the scales of its halves, as [`signed_group_sum`] takes them.
#[inline]
#[target_feature(enable = "avx2")]
fn coded_group_sum(v: __m256i, signs: u32, ls: [u16; 2], ys: &[i8]) -> __m256i {
    signed_group_sum(v, bit_bytes(signs), scale_halves(ls[0], ls[1]), ys)
}

/// The integer scales of 32 weights against the byte-pair sums `p`: one
/// scale for all (`halves` false) or one per 16 weights.
#[inline]
#[target_feature(enable = "avx2")]
fn lattice_scaled(p: __m256i, ls: &[u16; 16], ib: usize, halves: bool) -> __m256i {
    let [lo, hi] = group_scales(ls, ib, halves).map(|s| _mm_set1_epi16(s as i16));
    _mm256_madd_epi16(p, _mm256_set_m128i(hi, lo))
}

/// The scales of group `ib`'s two 16-weight halves (the same one twice
/// without `halves`).
#[inline]
fn group_scales(ls: &[u16; 16], ib: usize, halves: bool) -> [u16; 2] {
    if halves {
        [ls[2 * ib], ls[2 * ib + 1]]
    } else {
        [ls[ib], ls[ib]]
    }
}

/// [`lattice_sums`] from a block's [`Codes`]: per 32 weights its four rows
/// of grid values in one register (unsigned, at most 62), the signs put on
/// the activations (`vpsignb` by ±1), one `vpmaddubsw`: the same byte
/// pairs as the signed values give.
#[inline]
#[target_feature(enable = "avx2")]
fn codes_sums(c: &Codes, y: &BlockQ8K, halves: bool) -> (__m256i, __m256i) {
    let mut isum = _mm256_setzero_si256();
    for (ib, (rows, signs)) in c.v.chunks_exact(4).zip(c.signs.chunks_exact(4)).enumerate() {
        let signs = u32::from_le_bytes([signs[0], signs[1], signs[2], signs[3]]);
        let ls = group_scales(&c.ls, ib, halves);
        let sum = coded_group_sum(ld256(rows), signs, ls, &y.qs[32 * ib..]);
        isum = _mm256_add_epi32(isum, sum);
    }
    (isum, _mm256_setzero_si256())
}

/// [`lattice_sums`] of an unpacked block.
#[inline]
#[target_feature(enable = "avx2")]
fn lattice_group_sums(g: &Groups, y: &BlockQ8K, halves: bool) -> (__m256i, __m256i) {
    let mut isum = _mm256_setzero_si256();
    for ib in 0..8 {
        let v = ld256(&g.q[32 * ib..]);
        let p = _mm256_maddubs_epi16(
            _mm256_sign_epi8(v, v),
            _mm256_sign_epi8(ld256(&y.qs[32 * ib..]), v),
        );
        isum = _mm256_add_epi32(isum, lattice_scaled(p, &g.ls, ib, halves));
    }
    (isum, _mm256_setzero_si256())
}

// ---- ternary types (Q8_K activations) ----
//
// `Σ (t − 1)·y` as `Σ t·y − Σ y`: the values `t ∈ {0, 1, 2}` are unsigned
// bytes for `vpmaddubsw`, and `Σ y` is the sum of the activations' `bsums`.

/// `Σ y` of a Q8_K super-block in eight `i32` lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn act_sum(y: &BlockQ8K) -> __m256i {
    _mm256_madd_epi16(ld256(&y.bsums), _mm256_set1_epi16(1))
}

column_entry!(
    "avx2,fma,f16c",
    c_tq1_0,
    BlockTq1_0,
    false,
    tq1_0_sums,
    |b: &BlockTq1_0| [b.d.bits(), 0]
);
column_entry!(
    narrow tq2_0,
    "avx2,fma,f16c",
    c_tq2_0,
    BlockTq2_0,
    false,
    tq2_0_sums,
    |b: &BlockTq2_0| [b.d.bits(), 0]
);

/// A TQ1_0 super-block's integer sum.
#[inline]
#[target_feature(enable = "avx2")]
fn tq1_0_sums(b: &BlockTq1_0, y: &BlockQ8K) -> (__m256i, __m256i) {
    ternary_sums(&tq1_0_prep(b), y)
}

/// A TQ2_0 super-block's integer sum.
#[inline]
#[target_feature(enable = "avx2")]
fn tq2_0_sums(b: &BlockTq2_0, y: &BlockQ8K) -> (__m256i, __m256i) {
    ternary_sums(&tq2_0_prep(b), y)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn tq2_0(w: &[BlockTq2_0], a: &[BlockQ8K]) -> f32 {
    blocks256::<_, false>(
        w,
        a,
        |b, y| ternary_sums(&tq2_0_prep(b), y),
        |b| [b.d.bits(), 0],
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn tq1_0(w: &[BlockTq1_0], a: &[BlockQ8K]) -> f32 {
    blocks256::<_, false>(
        w,
        a,
        |b, y| ternary_sums(&tq1_0_prep(b), y),
        |b| [b.d.bits(), 0],
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn tq2_0_rows(w: &[BlockTq2_0], a: &[BlockQ8K], out: &mut [f32]) {
    let prep = |b: &BlockTq2_0| tq2_0_prep(b);
    let sums = |t: &[__m256i; 8], y: &BlockQ8K| ternary_sums(t, y);
    rows256::<_, false, _>(w, a, prep, sums, |b| [b.d.bits(), 0], out)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn tq1_0_rows(w: &[BlockTq1_0], a: &[BlockQ8K], out: &mut [f32]) {
    let prep = |b: &BlockTq1_0| tq1_0_prep(b);
    let sums = |t: &[__m256i; 8], y: &BlockQ8K| ternary_sums(t, y);
    rows256::<_, false, _>(w, a, prep, sums, |b| [b.d.bits(), 0], out)
}

/// `Σ (t − 1)·y` of a ternary super-block unpacked by [`tq2_0_prep`] or
/// [`tq1_0_prep`] (register `k` against activations `32k..32k+32`).
#[inline]
#[target_feature(enable = "avx2")]
fn ternary_sums(t: &[__m256i; 8], y: &BlockQ8K) -> (__m256i, __m256i) {
    let ones = _mm256_set1_epi16(1);
    let mut isum = _mm256_setzero_si256();
    for (k, &t) in t.iter().enumerate() {
        let p = _mm256_maddubs_epi16(t, ld256(&y.qs[32 * k..]));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ones));
    }
    (_mm256_sub_epi32(isum, act_sum(y)), _mm256_setzero_si256())
}

/// A TQ2_0 super-block's values `t` as unsigned bytes, 32 weights a register
/// in weight order (bits `2l` of half `h` are weights `128h + 32l + m`).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn tq2_0_prep(b: &BlockTq2_0) -> [__m256i; 8] {
    let three = _mm256_set1_epi8(3);
    let (q0, q1) = (ld256(&b.qs[..32]), ld256(&b.qs[32..]));
    std::array::from_fn(|k| {
        let q = if k < 4 { q0 } else { q1 };
        let shift = _mm_cvtsi32_si128(2 * (k % 4) as i32);
        _mm256_and_si256(_mm256_srl_epi16(q, shift), three)
    })
}

/// The trits of bytes `q` (scaled by `3ⁿ` mod 256 for trit `n`):
/// `⌊3q / 256⌋` is `[q > 85] + [q > 170]`, compared unsigned through the sign bit.
#[inline]
#[target_feature(enable = "avx2")]
fn trits(q: __m256i) -> __m256i {
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let q = _mm256_xor_si256(q, flip);
    let over85 = _mm256_cmpgt_epi8(q, _mm256_set1_epi8((85 ^ 0x80) as i8));
    let over170 = _mm256_cmpgt_epi8(q, _mm256_set1_epi8((170 ^ 0x80) as i8));
    _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(over85, over170))
}

/// Bytes times 3, modulo 256.
#[inline]
#[target_feature(enable = "avx2")]
fn times3(q: __m256i) -> __m256i {
    _mm256_add_epi8(_mm256_add_epi8(q, q), q)
}

/// A TQ1_0 super-block's trits, 32 weights a register in weight order: the
/// 32 five-trit bytes give registers 0..5 (trit `n` of byte `m` is weight
/// `32n + m`); the 16 after them give registers 5 and 6 with both halves
/// (trit `n` low, `n + 1` high: weights 160..224) and the low half of
/// register 7 (trit 4: weights 224..240), whose high half holds the
/// four-trit `qh` bytes (weights 240..256, decoded one by one).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn tq1_0_prep(b: &BlockTq1_0) -> [__m256i; 8] {
    let mut t = [_mm256_setzero_si256(); 8];
    let mut q = ld256(&b.qs[..32]);
    for t in &mut t[..5] {
        *t = trits(q);
        q = times3(q);
    }
    let q16 = ld128(&b.qs[32..]);
    let mut q = _mm256_set_m128i(_mm_add_epi8(_mm_add_epi8(q16, q16), q16), q16);
    for t in &mut t[5..7] {
        *t = trits(q);
        q = times3(times3(q));
    }
    let tail: [u8; 16] = std::array::from_fn(|i| tq1_trit(b.qh[i % 4], i / 4));
    t[7] = _mm256_set_m128i(ld128(&tail), _mm256_castsi256_si128(trits(q)));
    t
}

// ---- float types ----

/// Σ x·y over `n` elements in the canonical float order: partials `8k..8k+8`
/// in `acc[k]`, 32 elements per step, then whole vectors of eight into the
/// next accumulators, then the last `n % 8` elements through the scalar
/// [`FloatSum`]. `$x`/`$y` give eight `f32` from element `i`, `$madd` is
/// [`madd`] or (exact products only) [`madd_exact`], `$tail` one product.
macro_rules! float_dot {
    ($n:expr, $madd:ident, |$i:ident| $x:expr, $y:expr, |$t:ident| $tail:expr) => {{
        let n = $n;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut $i = 0;
        while $i + 32 <= n {
            let base = $i;
            for (k, acc) in acc.iter_mut().enumerate() {
                $i = base + 8 * k;
                *acc = $madd(*acc, $x, $y);
            }
            $i = base + 32;
        }
        let mut k = 0;
        while $i + 8 <= n {
            acc[k] = $madd(acc[k], $x, $y);
            $i += 8;
            k += 1;
        }
        let mut p = [0f32; FLOAT_PARTIALS];
        for (p, acc) in p.chunks_exact_mut(8).zip(acc.iter().copied()) {
            p.copy_from_slice(&lanes_ps(acc));
        }
        let mut s = FloatSum::new(p);
        for $t in $i..n {
            s.add($t, $tail);
        }
        s.sum()
    }};
}

/// `acc + x·y`, rounding the product and the sum.
#[inline]
#[target_feature(enable = "avx")]
fn madd(acc: __m256, x: __m256, y: __m256) -> __m256 {
    _mm256_add_ps(acc, _mm256_mul_ps(x, y))
}

/// [`madd`] fused: the same bits when every product `x·y` is exact in `f32`
/// (f16 × f16), one instruction fewer.
#[inline]
#[target_feature(enable = "avx,fma")]
fn madd_exact(acc: __m256, x: __m256, y: __m256) -> __m256 {
    _mm256_fmadd_ps(x, y, acc)
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
        madd,
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
        madd_exact,
        |i| cvt_h(&w[2 * i..2 * i + 16]),
        _mm256_cvtph_ps(ld128(&a[i..i + 8])),
        |t| f16_at(w, 2 * t) * h2f(a[t])
    )
}

/// F16 weights against activation rows widened from f16 to `f32` (exactly,
/// so the products are f16 × f16 and exact), one row at a time (two tokens
/// or more go to [`f16_rows`]); each row keeps the 32 partials and order of
/// [`f16w`] (fused multiply-adds: the products are exact).
#[target_feature(enable = "avx2,fma,f16c")]
fn f16w_rows_f32(w: &[u8], a: &[f32], out: &mut [f32]) {
    let cols = w.len() / 2;
    assert_eq!(a.len(), out.len() * cols, "f16w_rows lengths");
    for (t, o) in out.chunks_exact_mut(1).enumerate() {
        f16w_group::<1>(w, &a[t * cols..], cols, o);
    }
}

/// F16 weight rows against one token's f16 activations, both converted in
/// the loop: each row the 32 partials and order of [`f16w`] (the values
/// are those of the widened activations, so the bits are
/// [`f16w_rows_f32`]'s). No software prefetches: for AMD's cores.
#[target_feature(enable = "avx2,fma,f16c")]
fn f16w_rows_f16(w: &[u8], cols: usize, a: &[u16], out: &mut [f32]) {
    assert!(
        a.len() == cols && w.len() == 2 * cols * out.len(),
        "f16w_rows_f16 lengths"
    );
    let (steps, _) = a.as_chunks::<32>();
    let full = 32 * steps.len();
    // The last `cols mod 32` columns: one more step, padded with zeros (a
    // +0 product leaves a partial unchanged).
    let mut tail_a = [0u16; 32];
    tail_a[..cols - full].copy_from_slice(&a[full..]);
    for (row, o) in w.chunks_exact(2 * cols).zip(out) {
        let mut acc = [_mm256_setzero_ps(); 4];
        let step = |acc: &mut [__m256; 4], ws: &[u8; 64], xs: &[u16; 32]| {
            for k in 0..4 {
                let x = cvt_h(&ws[16 * k..16 * k + 16]);
                let y = _mm256_cvtph_ps(ld128(&xs[8 * k..8 * k + 8]));
                acc[k] = madd_exact(acc[k], x, y);
            }
        };
        let (ws, _) = row.as_chunks::<64>();
        for (ws, xs) in ws.iter().zip(steps) {
            step(&mut acc, ws, xs);
        }
        if full < cols {
            let mut tail_w = [0u8; 64];
            tail_w[..2 * (cols - full)].copy_from_slice(&row[2 * full..]);
            step(&mut acc, &tail_w, &tail_a);
        }
        *o = fold32_ps(acc);
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16w_group<const M: usize>(w: &[u8], a: &[f32], cols: usize, out: &mut [f32]) {
    let mut acc = [[_mm256_setzero_ps(); 4]; M];
    // Thirty-two columns: accumulator `k` of each token takes columns
    // `8k..8k + 8` (fixed-size chunks: no bounds checks inside).
    let step = |acc: &mut [[__m256; 4]; M], ws: &[u8; 64], rows: [&[f32; 32]; M]| {
        for k in 0..4 {
            let x = cvt_h(&ws[16 * k..16 * k + 16]);
            for (acc, row) in acc.iter_mut().zip(rows) {
                acc[k] = madd_exact(acc[k], x, ldps(&row[8 * k..8 * k + 8]));
            }
        }
    };
    let (steps, _) = w[..2 * cols].as_chunks::<64>();
    let rows: [&[[f32; 32]]; M] = std::array::from_fn(|j| a[j * cols..][..cols].as_chunks().0);
    for (c, ws) in steps.iter().enumerate() {
        prefetch_ahead(ws, 64);
        step(&mut acc, ws, std::array::from_fn(|j| &rows[j][c]));
    }
    // The last `cols mod 32` columns: one more step, padded with zeros.
    let full = steps.len() * 32;
    if full < cols {
        let (ws, tail) = f16_tail_step::<M>(w, a, cols, full);
        step(&mut acc, &ws, std::array::from_fn(|j| &tail[j]));
    }
    for (o, acc) in out[..M].iter_mut().zip(acc.iter().copied()) {
        *o = fold32_ps(acc);
    }
}

// F16 weights × several tokens in tiles of `F16_ROWS` rows × `F16_TOKENS`
// tokens. The canonical order keeps 32 partials per (row, token) pair, four
// vectors of eight, and sixteen registers hold only three pairs' worth
// (one conversion of the weights and three loads of activations per three
// multiply-adds). Partial vector `k` takes columns
// `32s + 8k..32s + 8k + 8` alone, so the columns are swept four times, once
// per `k`, with one accumulator per pair: each step converts `F16_ROWS`
// weight vectors (or loads them, when matmul widened the rows once for all
// its tiles of tokens) and loads `F16_TOKENS` activation vectors for eight
// multiply-adds, and the pairs' four vectors are folded as `fold32_ps`
// folds them, the tile's eight pairs at once ([`tree8x8_ps`]).
//
// The sweeps go block of columns by block of columns ([`f16_block`]), the
// partial vectors kept between blocks, and each block is swept for a group
// of `F16_GROUP` tiles of rows before the next: the block of the tile's
// activations (4 × 4 bytes a column) stays in L1 while the group's rows
// (2 × 2 bytes a column each) pass, so wide rows read each activation from
// L2 once per group rather than once per tile (the activations of four
// tokens are 16 bytes a column against eight multiply-adds, more than L2
// delivers at full speed). Tokens are the outer loop, so the tile of
// activations is reused by every group of rows.

/// Weight rows per tile.
const F16_ROWS: usize = 2;
/// Tokens per tile.
const F16_TOKENS: usize = 4;
/// Tiles of rows that sweep one block of columns in turn (their partial
/// vectors, up to 16 KiB, wait on the stack between blocks).
const F16_GROUP: usize = 16;
/// Most columns a tile sweeps four times before going on: a block of four
/// tokens' activations, 640 columns, is 10 KiB, in L1 beside the rows being
/// swept. Rows are cut into equal blocks ([`f16_block`]), so no block is a
/// short remainder (1536 columns are three blocks of 512, 4096 seven of
/// 608).
const F16_BLOCK: usize = 640;

/// The columns per block of a row of `cols`: the fewest blocks of at most
/// [`F16_BLOCK`], as equal as multiples of 32 allow.
fn f16_block(cols: usize) -> usize {
    let blocks = cols.div_ceil(F16_BLOCK).max(1);
    cols.div_ceil(blocks).next_multiple_of(32).max(32)
}

/// [`RowsF16F32`](crate::kernels::RowsF16F32) for two tokens or more.
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_rows(w: &[u8], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    f16_rows_any::<false>(w, &[], cols, a, out, stride);
}

/// The weight rows of `w` (f16) or, when `WIDE`, of `wide` (widened to
/// `f32`), against every activation row of `a`, group of tiles by group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_rows_any<const WIDE: bool>(
    w: &[u8],
    wide: &[f32],
    cols: usize,
    a: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let rows = super::f16_weights::<WIDE>(w, wide) / cols;
    let tokens = a.len() / cols;
    assert!(
        rows == 0 || tokens == 0 || out.len() >= (rows - 1) * stride + tokens,
        "f16 rows lengths"
    );
    // Rows in whole tiles; the last row of an odd count is a group of one
    // tile of one row.
    let paired = rows / F16_ROWS * F16_ROWS;
    for t0 in (0..tokens).step_by(F16_TOKENS) {
        let nt = (tokens - t0).min(F16_TOKENS);
        let a = &a[cols * t0..cols * (t0 + nt)];
        let groups = (0..paired)
            .step_by(F16_ROWS * F16_GROUP)
            .map(|r0| (r0, (paired - r0).min(F16_ROWS * F16_GROUP), F16_ROWS))
            .chain((paired < rows).then_some((paired, rows - paired, 1)));
        for (r0, nr, per) in groups {
            let (w, wide) = super::f16_row_span::<WIDE>(w, wide, cols, r0..r0 + nr);
            let out = &mut out[r0 * stride + t0..];
            macro_rules! groups {
                ($(($r:literal, $t:literal)),*) => {
                    match (per, nt) {
                        $(($r, $t) => f16_group::<$r, $t, WIDE>(w, wide, cols, a, out, stride),)*
                        _ => unreachable!("tile sizes are bounded by F16_ROWS and F16_TOKENS"),
                    }
                };
            }
            groups!(
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
}

/// A group of at most [`F16_GROUP`] tiles of `R` weight rows each (`w`,
/// `n·R × cols` f16; or `wide`, the same widened, when `WIDE`) against `T`
/// activation rows (`a`, `T × cols` floats): `out[r·stride + t]`. Not
/// inlined: inside its caller, beside every other tile size, the sweeps
/// were left as calls that passed the partial vectors through memory.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_group<const R: usize, const T: usize, const WIDE: bool>(
    w: &[u8],
    wide: &[f32],
    cols: usize,
    a: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    assert!(cols > 0, "f16 group without columns");
    let rows = super::f16_weights::<WIDE>(w, wide) / cols;
    let n = rows / R;
    assert!(
        n * R == rows
            && (1..=F16_GROUP).contains(&n)
            && a.len() == cols * T
            && out.len() > (rows - 1) * stride + T - 1,
        "f16 group lengths"
    );
    // acc[i][k][t][r]: tile i, partial vector k, token t, row r; only the
    // group's `n` tiles are ever set, by the first block's sweeps (a 1 KiB
    // zeroed tile was a `memset` call per tile and block).
    let mut acc = [[const { MaybeUninit::<[[__m256; R]; T]>::uninit() }; 4]; F16_GROUP];
    let block = f16_block(cols);
    for c0 in (0..cols).step_by(block) {
        let c1 = (c0 + block).min(cols);
        for (i, acc) in acc.iter_mut().enumerate().take(n) {
            let (w, wide) = super::f16_row_span::<WIDE>(w, wide, cols, i * R..(i + 1) * R);
            for (k, acc) in acc.iter_mut().enumerate() {
                let start = if c0 == 0 {
                    [[_mm256_setzero_ps(); R]; T]
                } else {
                    // SAFETY: the first block (`c0 == 0`) wrote it.
                    unsafe { acc.assume_init_read() }
                };
                let swept = f16_sweep::<R, T, WIDE>(w, wide, cols, a, c0..c1, 8 * k, start);
                acc.write(swept);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate().take(n) {
        // SAFETY: the first block wrote the four partial vectors of every
        // tile `i < n` (`cols > 0`, so there is one).
        let acc = std::array::from_fn(|k| unsafe { acc[k].assume_init_read() });
        f16_fold::<R, T>(&acc, &mut out[i * R * stride..], stride);
    }
}

/// A tile's partial vectors folded (`fold32_ps`'s additions) into
/// `out[r·stride + t]`, pair `r·T + t` in lane `r·T + t` of one
/// [`tree8x8_ps`] (a tile has at most eight pairs).
#[inline]
#[target_feature(enable = "avx2")]
fn f16_fold<const R: usize, const T: usize>(
    acc: &[[[__m256; R]; T]; 4],
    out: &mut [f32],
    stride: usize,
) {
    const { assert!(R * T <= 8) };
    let mut v = [_mm256_setzero_ps(); 8];
    for t in 0..T {
        for r in 0..R {
            let [p0, p1, p2, p3] = acc.map(|p| p[t][r]);
            v[r * T + t] = _mm256_add_ps(_mm256_add_ps(p0, p1), _mm256_add_ps(p2, p3));
        }
    }
    let mut sums = [0f32; 8];
    // SAFETY: `sums` holds eight floats.
    unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), tree8x8_ps(v)) };
    for r in 0..R {
        out[r * stride..][..T].copy_from_slice(&sums[r * T..][..T]);
    }
}

/// One partial vector of every pair of a tile, `acc`, carried on over the
/// columns `32s + first..32s + first + 8` inside `span` (`first` is 0, 8, 16
/// or 24; `span` starts at a multiple of 32), the columns past `cols` as
/// zeros (adding `+0` leaves a partial unchanged: it starts at `+0`, so is
/// never `-0`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_sweep<const R: usize, const T: usize, const WIDE: bool>(
    w: &[u8],
    wide: &[f32],
    cols: usize,
    a: &[f32],
    span: Range<usize>,
    first: usize,
    mut acc: [[__m256; R]; T],
) -> [[__m256; R]; T] {
    let (wp, widep, ap) = (w.as_ptr(), wide.as_ptr(), a.as_ptr());
    let full = cols / 32 * 32;
    let mut c = span.start + first;
    while c < full.min(span.end) {
        // SAFETY: columns `c..c + 8 ≤ full ≤ cols` of rows `r < R` and tokens
        // `t < T`, in bounds (lengths checked by the caller); unaligned loads.
        let x: [__m256; R] = std::array::from_fn(|r| unsafe {
            if WIDE {
                _mm256_loadu_ps(widep.add(r * cols + c))
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * (r * cols + c)).cast()))
            }
        });
        for (t, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let y = unsafe { _mm256_loadu_ps(ap.add(t * cols + c)) };
            for (acc, &x) in acc.iter_mut().zip(&x) {
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
        }
        c += 32;
    }
    if span.end == cols && c < cols {
        let n = cols - c;
        let x: [__m256; R] = std::array::from_fn(|r| {
            if WIDE {
                return ldps_first(&wide[r * cols + c..(r + 1) * cols]);
            }
            let mut h = [0u16; 8];
            for (i, h) in h.iter_mut().take(n).enumerate() {
                *h = le16(w, 2 * (r * cols + c + i));
            }
            halves(h)
        });
        for (t, acc) in acc.iter_mut().enumerate() {
            let y = ldps_first(&a[t * cols + c..(t + 1) * cols]);
            for (acc, &x) in acc.iter_mut().zip(&x) {
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
        }
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
fn bf16w(w: &[u8], a: &[u16]) -> f32 {
    let n = a.len().min(w.len() / 2);
    let bf = |h: u16| f32::from_bits(u32::from(h) << 16);
    float_dot!(
        n,
        madd,
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
    float_dot!(n, madd, |i| ldps(&x[i..i + 8]), ldps(&y[i..i + 8]), |t| x
        [t]
        * y[t])
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f16_f32(x: &[u16], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    float_dot!(
        n,
        madd,
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
        madd_exact,
        |i| _mm256_cvtph_ps(ld128(&x[i..i + 8])),
        _mm256_cvtph_ps(ld128(&y[i..i + 8])),
        |t| h2f(x[t]) * h2f(y[t])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 block quantizer gives the scalar bytes, on random blocks of
    /// every scale, exact halves, NaN and infinities.
    #[test]
    fn q8_0_quantizer_is_the_same_with_avx2() {
        if super::super::has_avx2() {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            for case in 0..20_000 {
                let scale = [1e-30, 1e-3, 1.0, 127.0, 3e4, 1e38][case % 6];
                let mut x: Vec<f32> = (0..32)
                    .map(|_| ((next() % 2_000_001) as f32 / 1e6 - 1.0) * scale)
                    .collect();
                match case % 7 {
                    0 => x[(next() % 32) as usize] = f32::NAN,
                    1 => x[(next() % 32) as usize] = f32::INFINITY,
                    2 => {
                        // Values whose quotient lands on an exact half: d = 1.
                        x[0] = 127.0;
                        for (i, v) in x.iter_mut().enumerate().skip(1) {
                            *v = (i as f32 - 16.0) + 0.5;
                        }
                    }
                    3 => x.iter_mut().for_each(|v| *v = -0.0),
                    _ => {}
                }
                let mut want = BlockQ8_0::default();
                let mut got = BlockQ8_0::default();
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                want.d = F16::from_f32(d);
                for (q, &v) in want.qs.iter_mut().zip(&x) {
                    *q = (v * id).round() as i8;
                }
                // SAFETY: AVX2 was probed above.
                unsafe { q8_0_block(&x, &mut got) };
                assert_eq!(got, want, "case {case}: {x:?}");
            }
        }
    }

    /// One token's F16 rows against its widened activations (Intel's
    /// table) and against its f16 activations converted in the loop (AMD's)
    /// give the same bits, at widths with and without a column tail, and
    /// both are the row's dot product.
    #[test]
    fn f16_rows_of_one_token_are_the_same_bits_against_f16_or_widened_activations() {
        if !super::super::has_avx2() {
            return;
        }
        let mut next = super::super::test_values(0x0f16_0001_7a11_5eedu64);
        let f16 = memwall_format::blocks::f32_to_f16;
        let f32_of = memwall_format::blocks::f16_to_f32;
        for cols in [1, 33, 576, 769, 1536, 2081, 9000] {
            for rows in [1, 2, 5] {
                let h: Vec<u16> = (0..rows * cols).map(|_| f16(next())).collect();
                let w: Vec<u8> = h.iter().flat_map(|h| h.to_le_bytes()).collect();
                let ah: Vec<u16> = (0..cols).map(|_| f16(next())).collect();
                let a: Vec<f32> = ah.iter().map(|&v| f32_of(v)).collect();
                let (mut wide, mut halves) = (vec![0f32; rows * 3], vec![1f32; rows]);
                r_f16w_f32(&w, cols, &a, &mut wide, 3);
                r_f16w_f16(&w, cols, &ah, &mut halves);
                for r in 0..rows {
                    let (x, y) = (wide[r * 3], halves[r]);
                    assert_eq!(x.to_bits(), y.to_bits(), "{rows}×{cols}: row {r}");
                    let exact: f64 = (0..cols)
                        .map(|c| f64::from(f32_of(h[r * cols + c])) * f64::from(a[c]))
                        .sum();
                    assert!(
                        (f64::from(x) - exact).abs() <= 1e-4 * (1.0 + exact.abs()),
                        "{rows}×{cols}: row {r}: {x} against {exact}"
                    );
                }
            }
        }
    }

    /// The F16 tiles over widened weight rows (one table) and over the f16
    /// rows converted in the loop (the other, AMD's) give the same bits, at
    /// widths of one and of several column blocks, with column tails and
    /// every remainder of rows and tokens.
    #[test]
    fn f16_tiles_widened_or_converted_are_the_same_bits() {
        if !super::super::has_avx2() {
            return;
        }
        let mut next = super::super::test_values(0x0f16_1de5_7a11_5eedu64);
        for cols in [1, 33, 576, 769, 1536, 2081] {
            for rows in [1, 2, 5] {
                for tokens in [2, 3, 4, 9] {
                    let h: Vec<u16> = (0..rows * cols)
                        .map(|_| memwall_format::blocks::f32_to_f16(next()))
                        .collect();
                    let w: Vec<u8> = h.iter().flat_map(|h| h.to_le_bytes()).collect();
                    let wide: Vec<f32> = h
                        .iter()
                        .map(|&h| memwall_format::blocks::f16_to_f32(h))
                        .collect();
                    let a: Vec<f32> = (0..tokens * cols).map(|_| next()).collect();
                    let (mut f16, mut widened) = (vec![0f32; rows * 9], vec![1f32; rows * 9]);
                    r_f16w_f32(&w, cols, &a, &mut f16, 9);
                    r_f16_wide(&wide, cols, &a, &mut widened, 9);
                    for r in 0..rows {
                        for t in 0..tokens {
                            let (x, y) = (f16[r * 9 + t], widened[r * 9 + t]);
                            assert_eq!(
                                x.to_bits(),
                                y.to_bits(),
                                "{rows}×{cols}, {tokens} tokens: row {r}, token {t}"
                            );
                        }
                    }
                }
            }
        }
    }
}
