//! aarch64 Advanced SIMD kernels, compiled twice from one source: with plain
//! NEON (`smull` + `sadalp` for the 8-bit products) and with the dot-product
//! extension (`sdot`, through inline assembly since `vdotq_s32` is not yet a
//! stable intrinsic). NEON multiplies signed bytes directly, so the offsets
//! of Q4_0, Q5_0, Q3_K and Q6_K are applied to the weights before the dot.
//!
//! Integer sums are exact; the float work follows the canonical order of the
//! `kernels` module docs: rows of 32-weight blocks go four blocks at a time
//! (their sums folded into one vector by pairwise adds), alternating between
//! the two vectors that hold partials 0–3 and 4–7; the K-quants reduce each
//! super-block to one `i32` and use the scalar term code; the float types
//! keep 32 partials in eight vectors. No fused multiply-add except on exact
//! products (f16 × f16).

use std::arch::aarch64::*;
use std::arch::asm;

use super::super::scalar::{
    Blocks, FLOAT_PARTIALS, FloatSum, f16_tail_step, f32_tail_step, k4_scales, term, term_kmin,
    term_min,
};
use crate::forward::math::{
    EXP_FAST_C, EXP_FAST_MAX, EXP_FAST_MIN, LN2_HI_F32, LN2_LO_F32, LOG2E_F32, ROUND_F32, exp_fast,
};
use crate::kernels::{
    BlockQ8_0, BlockQ8_1, BlockQ8K, DotTable, OpsTable, Q8_GROUP_BYTES, Q8Rows, RowsTable, Scaled,
    block_entries, block_table,
};
use memwall_format::blocks::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockQ2K, BlockQ3K,
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockTq1_0,
    BlockTq2_0, Codes, F16, Groups, IQ4NL_GRID, Lattice, MXFP4_GRID, e8m0_half, tq1_trit,
    ue4m3_half,
};

/// The NEON float loops: `exp` on four lanes; the others are the scalar
/// table's, which aarch64 (where NEON is always present) already compiles to
/// NEON vectors.
const OPS: OpsTable = OpsTable {
    exp_fast: o_exp_fast,
    ..super::super::scalar::OPS
};

fn o_exp_fast(xs: &mut [f32]) {
    // SAFETY: reachable only through this backend's tables, which
    // `Kernels::new` hands out after probing NEON.
    unsafe { exp_fast_in_place(xs) }
}

/// `x ← exp_fast(x)` for every element, four lanes at a time: the same
/// operations in the same order as [`exp_fast`] (separate multiplies and
/// adds), so the same bits.
#[target_feature(enable = "neon")]
fn exp_fast_in_place(xs: &mut [f32]) {
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

// ---- loads (the only pointer use; each checks its length) ----

#[inline]
#[target_feature(enable = "neon")]
fn ld_u8(s: &[u8]) -> uint8x16_t {
    assert!(s.len() >= 16);
    // SAFETY: 16 readable bytes (checked); NEON loads have no alignment requirement.
    unsafe { vld1q_u8(s.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn ld_s8(s: &[i8]) -> int8x16_t {
    assert!(s.len() >= 16);
    // SAFETY: 16 readable bytes (checked).
    unsafe { vld1q_s8(s.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn ld_s16(s: &[i16]) -> int16x8_t {
    assert!(s.len() >= 8);
    // SAFETY: 8 readable values (checked).
    unsafe { vld1q_s16(s.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn ld_f32(s: &[f32]) -> float32x4_t {
    assert!(s.len() >= 4);
    // SAFETY: 4 readable values (checked).
    unsafe { vld1q_f32(s.as_ptr()) }
}

/// Four `f32` from 16 little-endian bytes.
#[inline]
#[target_feature(enable = "neon")]
fn ld_f32_bytes(s: &[u8]) -> float32x4_t {
    vreinterpretq_f32_u8(ld_u8(s))
}

/// Four half-precision values (8 bytes) to `f32`, exactly (`fcvtl`).
#[inline]
#[target_feature(enable = "neon")]
fn cvt_f16(s: &[u8]) -> float32x4_t {
    assert!(s.len() >= 8);
    // SAFETY: 8 readable bytes (checked).
    let h = unsafe { vld1_u16(s.as_ptr().cast()) };
    let r: float32x4_t;
    // SAFETY: `fcvtl` (half to single precision) is base Advanced SIMD; it only reads
    // and writes the named registers.
    unsafe {
        asm!("fcvtl {0:v}.4s, {1:v}.4h", out(vreg) r, in(vreg) h, options(pure, nomem, nostack));
    }
    r
}

/// Four bfloat16 values (8 bytes) to `f32`.
#[inline]
#[target_feature(enable = "neon")]
fn cvt_bf16(s: &[u8]) -> float32x4_t {
    assert!(s.len() >= 8);
    // SAFETY: 8 readable bytes (checked).
    let h = unsafe { vld1_u16(s.as_ptr().cast()) };
    vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
}

fn u16s(s: &[u16]) -> &[u8] {
    // Little-endian target: the u16 slice's bytes in memory order.
    let n = size_of_val(s);
    // SAFETY: any initialised memory may be viewed as bytes; same length, lifetime, u8 alignment 1.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), n) }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    memwall_format::blocks::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn h2f(h: u16) -> f32 {
    memwall_format::blocks::f16_to_f32(h)
}

/// Σ a·b of 16 signed bytes into four 32-bit lanes, with `smull`/`sadalp`.
#[inline]
#[target_feature(enable = "neon")]
fn dot_mull(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let p1 = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, p0), p1)
}

/// Σ a·b of 16 signed bytes into four 32-bit lanes, with `sdot`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn dot_sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `sdot` exists under the `dotprod` feature this function is compiled
    // (and, through the table, only called) with; it touches only the named registers.
    unsafe {
        asm!(
            "sdot {0:v}.4s, {1:v}.16b, {2:v}.16b",
            inout(vreg) acc,
            in(vreg) a,
            in(vreg) b,
            options(pure, nomem, nostack)
        );
    }
    acc
}

/// The minimum correction `Σ_j bsums[j]·m[j/2]` of a Q4_K/Q5_K block.
#[inline]
#[target_feature(enable = "neon")]
fn k4_mins(m: &[u8; 8], y: &BlockQ8K) -> i32 {
    let pairs = vpaddq_s16(ld_s16(&y.bsums[..8]), ld_s16(&y.bsums[8..]));
    let m16 = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(u64::from_le_bytes(*m))));
    let p = vmull_s16(vget_low_s16(pairs), vget_low_s16(m16));
    let p = vmlal_high_s16(p, pairs, m16);
    vaddvq_s32(p)
}

/// The four lanes of `v`.
#[inline]
#[target_feature(enable = "neon")]
fn lanes(v: float32x4_t) -> [f32; 4] {
    [
        vgetq_lane_f32::<0>(v),
        vgetq_lane_f32::<1>(v),
        vgetq_lane_f32::<2>(v),
        vgetq_lane_f32::<3>(v),
    ]
}

/// `acc + x·y`, rounding the product and the sum.
#[inline]
#[target_feature(enable = "neon")]
fn madd(acc: float32x4_t, x: float32x4_t, y: float32x4_t) -> float32x4_t {
    vaddq_f32(acc, vmulq_f32(x, y))
}

/// [`madd`] fused: the same bits when every product `x·y` is exact in `f32`
/// (f16 × f16), one instruction fewer.
#[inline]
#[target_feature(enable = "neon")]
fn madd_exact(acc: float32x4_t, x: float32x4_t, y: float32x4_t) -> float32x4_t {
    vfmaq_f32(acc, x, y)
}

/// A row of 32-weight blocks in the canonical order: four
/// blocks per step, `isum(b, y)` giving a block's integer sum in four `i32`
/// lanes and `scales(b, y)` the block's `[d_w, d_a, m_w, s_a]` (the last two
/// only read with `MIN`); steps alternate between the vectors of partials 0–3
/// and 4–7, and the last `nb % 4` blocks go through the scalar term.
#[inline]
#[target_feature(enable = "neon")]
fn blocks32<B: Block, Y, const MIN: bool>(
    w: &[B],
    a: &[Y],
    isum: impl Fn(&B, &Y) -> int32x4_t,
    scales: impl Fn(&B, &Y) -> [f32; 4],
) -> f32 {
    let nb = a.len().min(w.len());
    let mut acc = [vdupq_n_f32(0.0); 2];
    let (wg, ag) = (w[..nb].chunks_exact(4), a[..nb].chunks_exact(4));
    let done = 4 * wg.len();
    for (g, (wg, ag)) in wg.zip(ag).enumerate() {
        let mut v = [vdupq_n_s32(0); 4];
        let (mut d, mut ms) = ([0f32; 4], [0f32; 4]);
        for (k, (b, y)) in wg.iter().zip(ag).enumerate() {
            v[k] = isum(b, y);
            let [dw, da, mw, sa] = scales(b, y);
            d[k] = dw * da;
            ms[k] = mw * sa;
        }
        let s = vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));
        let mut t = vmulq_f32(ld_f32(&d), vcvtq_f32_s32(s));
        if MIN {
            t = vaddq_f32(t, ld_f32(&ms));
        }
        acc[g % 2] = vaddq_f32(acc[g % 2], t);
    }
    let [p0, p1, p2, p3] = lanes(acc[0]);
    let [p4, p5, p6, p7] = lanes(acc[1]);
    let mut sum = Blocks::new([p0, p1, p2, p3, p4, p5, p6, p7]);
    for i in done..nb {
        let (b, y) = (&w[i], &a[i]);
        let [dw, da, mw, sa] = scales(b, y);
        let isum = vaddvq_s32(isum(b, y));
        let t = if MIN {
            term_min(dw, da, isum, mw, sa)
        } else {
            term(dw, da, isum)
        };
        sum.add(i, t);
    }
    sum.sum()
}

/// A row whose blocks span `N` activation blocks (Q1_0, Q2_0): each
/// activation block `k` of a block is a term in the canonical order (through
/// [`Blocks`]), with the block's scale `d` and `isum(block, k, y)` its
/// integer sum.
#[inline]
#[target_feature(enable = "neon")]
fn spanning<B, const N: usize>(
    w: &[B],
    a: &[BlockQ8_0],
    d: impl Fn(&B) -> F16,
    isum: impl Fn(&B, usize, &[i8; 32]) -> i32,
) -> f32 {
    let mut sum = Blocks::default();
    for (i, (b, ys)) in w.iter().zip(a.as_chunks::<N>().0).enumerate() {
        let d = h2f(d(b).bits());
        for (k, y) in ys.iter().enumerate() {
            sum.add(N * i + k, term(d, h2f(y.d.bits()), isum(b, k, &y.qs)));
        }
    }
    sum.sum()
}

/// Byte `j` of the result = 0xff where bit `j` (of 16) of `bits` is set.
#[inline]
#[target_feature(enable = "neon")]
fn bit_bytes(bits: u16) -> uint8x16_t {
    let [b0, b1] = bits.to_le_bytes();
    let v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    let m = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    vtstq_u8(v, m)
}

/// Low and high nibbles of 16 bytes.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(q: &[u8]) -> (uint8x16_t, uint8x16_t) {
    let q = ld_u8(q);
    (vandq_u8(q, vdupq_n_u8(0xf)), vshrq_n_u8::<4>(q))
}

// ---- the Q8_0 family's weights as signed bytes (weights 0..16, 16..32) ----

#[inline]
#[target_feature(enable = "neon")]
fn unpack_q4_0(b: &BlockQ4_0) -> (int8x16_t, int8x16_t) {
    let eight = vdupq_n_s8(8);
    let (lo, hi) = nibbles(&b.qs);
    (
        vsubq_s8(vreinterpretq_s8_u8(lo), eight),
        vsubq_s8(vreinterpretq_s8_u8(hi), eight),
    )
}

#[inline]
#[target_feature(enable = "neon")]
fn unpack_q5_0(b: &BlockQ5_0) -> (int8x16_t, int8x16_t) {
    let (sixteen, h) = (vdupq_n_s8(16), vdupq_n_u8(0x10));
    let (lo, hi) = nibbles(&b.qs);
    let lo = vorrq_u8(
        lo,
        vandq_u8(bit_bytes(u16::from_le_bytes([b.qh[0], b.qh[1]])), h),
    );
    let hi = vorrq_u8(
        hi,
        vandq_u8(bit_bytes(u16::from_le_bytes([b.qh[2], b.qh[3]])), h),
    );
    (
        vsubq_s8(vreinterpretq_s8_u8(lo), sixteen),
        vsubq_s8(vreinterpretq_s8_u8(hi), sixteen),
    )
}

#[inline]
#[target_feature(enable = "neon")]
fn unpack_q8_0(b: &BlockQ8_0) -> (int8x16_t, int8x16_t) {
    (ld_s8(&b.qs[..16]), ld_s8(&b.qs[16..]))
}

#[inline]
#[target_feature(enable = "neon")]
fn unpack_iq4_nl(b: &BlockIq4Nl) -> (int8x16_t, int8x16_t) {
    let grid = ld_s8(&IQ4NL_GRID);
    let (lo, hi) = nibbles(&b.qs);
    (vqtbl1q_s8(grid, lo), vqtbl1q_s8(grid, hi))
}

/// The trits of bytes `q` (scaled by `3ⁿ` mod 256 for trit `n`):
/// `⌊3q / 256⌋` is `[q > 85] + [q > 170]`.
#[inline]
#[target_feature(enable = "neon")]
fn trits(q: uint8x16_t) -> int8x16_t {
    let (over85, over170) = (vcgtq_u8(q, vdupq_n_u8(85)), vcgtq_u8(q, vdupq_n_u8(170)));
    vreinterpretq_s8_u8(vsubq_u8(vsubq_u8(vdupq_n_u8(0), over85), over170))
}

/// Bytes times 3, modulo 256.
#[inline]
#[target_feature(enable = "neon")]
fn times3(q: uint8x16_t) -> uint8x16_t {
    vaddq_u8(vaddq_u8(q, q), q)
}

/// `Σ y` of a Q8_K super-block.
#[inline]
fn act_sum(y: &BlockQ8K) -> i32 {
    y.bsums.iter().map(|&s| i32::from(s)).sum()
}

// ---- F16 weight rows against widened activations ----
//
// One weight row against three tokens per pass: each token's 32 canonical
// partials are eight vectors (24 of the 32 registers), and the weights of
// each four columns are widened once (`fcvtl`) for the three tokens, or
// read already widened when `Matmul` widened the rows for all their tiles
// of tokens (`f16_wide`). The products of f16 values are exact in f32, so
// the fused multiply-add has the bits of the scalar multiply then add.

/// Tokens per pass of the F16 several-row product.
const F16_TOKENS: usize = 3;

/// [`RowsF16F32`](crate::kernels::RowsF16F32) for both NEON tables.
fn r_f16w_f32(w: &[u8], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    // SAFETY: reachable only through a NEON table, which `Kernels::new` hands
    // out after probing NEON.
    unsafe { f16_rows::<false>(w, &[], cols, a, out, stride) }
}

/// [`RowsWideF16`](crate::kernels::RowsWideF16) for both NEON tables: the
/// weight rows already widened, so no `fcvtl` in the loop.
fn r_f16_wide(w: &[f32], cols: usize, a: &[f32], out: &mut [f32], stride: usize) {
    // SAFETY: as for `r_f16w_f32`.
    unsafe { f16_rows::<true>(&[], w, cols, a, out, stride) }
}

/// The weight rows of `w` (f16) or, when `WIDE`, of `wide` (widened to
/// `f32`), against every activation row of `a`, [`F16_TOKENS`] at a time.
#[target_feature(enable = "neon")]
fn f16_rows<const WIDE: bool>(
    w: &[u8],
    wide: &[f32],
    cols: usize,
    a: &[f32],
    out: &mut [f32],
    stride: usize,
) {
    let tokens = a.len() / cols;
    let rows = super::f16_weights::<WIDE>(w, wide) / cols;
    for r in 0..rows {
        let (w, wide) = super::f16_row_span::<WIDE>(w, wide, cols, r..r + 1);
        let out = &mut out[r * stride..][..tokens];
        for (t0, out) in (0..tokens)
            .step_by(F16_TOKENS)
            .zip(out.chunks_mut(F16_TOKENS))
        {
            let a = &a[t0 * cols..(t0 + out.len()) * cols];
            match out.len() {
                3 => f16_group::<3, WIDE>(w, wide, a, cols, out),
                2 => f16_group::<2, WIDE>(w, wide, a, cols, out),
                _ => f16_group::<1, WIDE>(w, wide, a, cols, out),
            }
        }
    }
}

/// One F16 weight row (`w`, `cols` weights; or `wide`, the same widened,
/// when `WIDE`) against `M` activation rows (`a`, `M × cols` floats), into
/// `out[..M]`.
#[inline]
#[target_feature(enable = "neon")]
fn f16_group<const M: usize, const WIDE: bool>(
    w: &[u8],
    wide: &[f32],
    a: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let mut acc = [[vdupq_n_f32(0.0); 8]; M];
    // Thirty-two columns: vector `k` of each token takes columns `4k..4k + 4`.
    let step = |acc: &mut [[float32x4_t; 8]; M], x: [float32x4_t; 8], rows: [&[f32; 32]; M]| {
        for (k, &x) in x.iter().enumerate() {
            for (acc, row) in acc.iter_mut().zip(rows) {
                acc[k] = madd_exact(acc[k], x, ld_f32(&row[4 * k..]));
            }
        }
    };
    let full = cols / 32 * 32;
    let rows: [&[[f32; 32]]; M] = std::array::from_fn(|j| a[j * cols..][..cols].as_chunks().0);
    let (halves, floats) = (w.as_chunks::<64>().0, wide.as_chunks::<32>().0);
    for c in 0..full / 32 {
        let x = if WIDE {
            let ws = &floats[c];
            std::array::from_fn(|k| ld_f32(&ws[4 * k..]))
        } else {
            let ws = &halves[c];
            std::array::from_fn(|k| cvt_f16(&ws[8 * k..]))
        };
        step(&mut acc, x, std::array::from_fn(|j| &rows[j][c]));
    }
    // The last `cols mod 32` columns: one more step, padded with zeros.
    if full < cols {
        let (ws, tail) = if WIDE {
            let [ws] = f32_tail_step::<1>(wide, cols, full);
            let tail = f32_tail_step::<M>(a, cols, full);
            (std::array::from_fn(|k| ld_f32(&ws[4 * k..])), tail)
        } else {
            let (ws, tail) = f16_tail_step::<M>(w, a, cols, full);
            (std::array::from_fn(|k| cvt_f16(&ws[8 * k..])), tail)
        };
        step(&mut acc, ws, std::array::from_fn(|j| &tail[j]));
    }
    for (o, acc) in out.iter_mut().zip(acc.iter().copied()) {
        let mut p = [0f32; FLOAT_PARTIALS];
        for (p, acc) in p.chunks_exact_mut(4).zip(acc.iter().copied()) {
            p.copy_from_slice(&lanes(acc));
        }
        *o = FloatSum::new(p).sum();
    }
}

macro_rules! kernels {
    ($feat:literal, $dot:ident, $table:ident, $rows:expr, $doc:literal) => {
        /// Declares a safe entry point for a `#[target_feature]` kernel.
        macro_rules! entry {
            ($name:ident, $kernel:ident, $w:ty, $a:ty) => {
                fn $name(w: $w, a: $a) -> f32 {
                    // SAFETY: reachable only through this backend's table, which
                    // `Kernels::new` hands out after probing the features.
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

        #[doc = $doc]
        pub(crate) static $table: DotTable = memwall_format::block_types!([block_table] entry {
            f32: e_f32w,
            f16: e_f16w,
            bf16: e_bf16w,
            dot_f32: e_dot_f32,
            dot_f16_f32: e_dot_f16_f32,
            dot_f16_f16: e_dot_f16_f16,
            rows: $rows,
            ops: OPS,
        });

        /// Σ over the two 16-byte halves of a 32-weight block.
        #[inline]
        #[target_feature(enable = $feat)]
        fn dot32(lo: int8x16_t, hi: int8x16_t, y: &[i8]) -> int32x4_t {
            $dot($dot(vdupq_n_s32(0), lo, ld_s8(&y[..16])), hi, ld_s8(&y[16..32]))
        }

        /// A row of the Q8_0 family (`unpack` gives a block's signed weights).
        macro_rules! q8_family {
            ($name:ident, $b:ty, $unpack:ident) => {
                #[target_feature(enable = $feat)]
                fn $name(w: &[$b], a: &[BlockQ8_0]) -> f32 {
                    blocks32::<_, _, false>(
                        w,
                        a,
                        |b, y| {
                            let (lo, hi) = $unpack(b);
                            dot32(lo, hi, &y.qs)
                        },
                        |b, y| [h2f(b.d.bits()), h2f(y.d.bits()), 0.0, 0.0],
                    )
                }
            };
        }

        q8_family!(q4_0, BlockQ4_0, unpack_q4_0);
        q8_family!(q5_0, BlockQ5_0, unpack_q5_0);
        q8_family!(q8_0, BlockQ8_0, unpack_q8_0);
        q8_family!(iq4_nl, BlockIq4Nl, unpack_iq4_nl);

        #[target_feature(enable = $feat)]
        fn q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
            blocks32::<_, _, true>(
                w,
                a,
                |b, y| {
                    let (lo, hi) = nibbles(&b.qs);
                    dot32(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), &y.qs)
                },
                |b, y| [h2f(b.d.bits()), h2f(y.d.bits()), h2f(b.m.bits()), h2f(y.s.bits())],
            )
        }

        #[target_feature(enable = $feat)]
        fn q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
            let h = vdupq_n_u8(0x10);
            blocks32::<_, _, true>(
                w,
                a,
                |b, y| {
                    let (lo, hi) = nibbles(&b.qs);
                    let qh = b.qh;
                    let lo = vorrq_u8(lo, vandq_u8(bit_bytes(u16::from_le_bytes([qh[0], qh[1]])), h));
                    let hi = vorrq_u8(hi, vandq_u8(bit_bytes(u16::from_le_bytes([qh[2], qh[3]])), h));
                    dot32(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), &y.qs)
                },
                |b, y| [h2f(b.d.bits()), h2f(y.d.bits()), h2f(b.m.bits()), h2f(y.s.bits())],
            )
        }

        #[target_feature(enable = $feat)]
        fn q2_k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
            let mut sum = Blocks::default();
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let sc = &b.scales;
                let summs: i32 =
                    y.bsums.iter().zip(sc).map(|(&s, &c)| i32::from(s) * i32::from(c >> 4)).sum();
                let mut isum = 0i32;
                let three = vdupq_n_u8(3);
                for k in 0..2 {
                    let q0 = ld_u8(&b.qs[32 * k..]);
                    let q1 = ld_u8(&b.qs[16 + 32 * k..]);
                    for j in 0..4 {
                        let sh = vdupq_n_s8(-2 * j as i8);
                        let v0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, sh), three));
                        let v1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, sh), three));
                        let yq = &y.qs[128 * k + 32 * j..];
                        let g = 8 * k + 2 * j;
                        let s0 = vaddvq_s32($dot(vdupq_n_s32(0), v0, ld_s8(&yq[..16])));
                        let s1 = vaddvq_s32($dot(vdupq_n_s32(0), v1, ld_s8(&yq[16..32])));
                        isum += i32::from(sc[g] & 0xf) * s0 + i32::from(sc[g + 1] & 0xf) * s1;
                    }
                }
                sum.add(i, term_kmin(h2f(b.d.bits()), h2f(b.dmin.bits()), y.d, isum, summs));
            }
            sum.sum()
        }

        #[target_feature(enable = $feat)]
        fn q3_k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
            let mut sum = Blocks::default();
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let sc = b.sub_scales();
                let (hm0, hm1) = (ld_u8(&b.hmask[..16]), ld_u8(&b.hmask[16..]));
                let (three, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
                let mut isum = 0i32;
                for k in 0..2 {
                    let q0 = ld_u8(&b.qs[32 * k..]);
                    let q1 = ld_u8(&b.qs[16 + 32 * k..]);
                    for j in 0..4 {
                        let sh = vdupq_n_s8(-2 * j as i8);
                        let m = vdupq_n_u8(1 << (4 * k + j));
                        // q₂ + 4·hbit − 4: the weight in −4..3.
                        let v = |q: uint8x16_t, hm: uint8x16_t| {
                            let u = vandq_u8(vshlq_u8(q, sh), three);
                            let u = vorrq_u8(u, vandq_u8(vtstq_u8(hm, m), four));
                            vsubq_s8(vreinterpretq_s8_u8(u), vreinterpretq_s8_u8(four))
                        };
                        let (v0, v1) = (v(q0, hm0), v(q1, hm1));
                        let yq = &y.qs[128 * k + 32 * j..];
                        let g = 8 * k + 2 * j;
                        let s0 = vaddvq_s32($dot(vdupq_n_s32(0), v0, ld_s8(&yq[..16])));
                        let s1 = vaddvq_s32($dot(vdupq_n_s32(0), v1, ld_s8(&yq[16..32])));
                        isum += i32::from(sc[g]) * s0 + i32::from(sc[g + 1]) * s1;
                    }
                }
                sum.add(i, term(h2f(b.d.bits()), y.d, isum));
            }
            sum.sum()
        }

        #[target_feature(enable = $feat)]
        fn q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
            let mut sum = Blocks::default();
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let (sc, m) = k4_scales(&b.scales);
                let summs = k4_mins(&m, y);
                let mut isum = 0i32;
                for c in 0..4 {
                    let (lo0, hi0) = nibbles(&b.qs[32 * c..]);
                    let (lo1, hi1) = nibbles(&b.qs[16 + 32 * c..]);
                    let yq = &y.qs[64 * c..];
                    let s_lo = dot32(vreinterpretq_s8_u8(lo0), vreinterpretq_s8_u8(lo1), yq);
                    let s_hi = dot32(vreinterpretq_s8_u8(hi0), vreinterpretq_s8_u8(hi1), &yq[32..]);
                    isum += i32::from(sc[2 * c]) * vaddvq_s32(s_lo);
                    isum += i32::from(sc[2 * c + 1]) * vaddvq_s32(s_hi);
                }
                sum.add(i, term_kmin(h2f(b.d.bits()), h2f(b.dmin.bits()), y.d, isum, summs));
            }
            sum.sum()
        }

        #[target_feature(enable = $feat)]
        fn q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
            let mut sum = Blocks::default();
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let (sc, m) = k4_scales(&b.scales);
                let summs = k4_mins(&m, y);
                let (qh0, qh1) = (ld_u8(&b.qh[..16]), ld_u8(&b.qh[16..]));
                let h = vdupq_n_u8(0x10);
                let mut isum = 0i32;
                for c in 0..4 {
                    let (lo0, hi0) = nibbles(&b.qs[32 * c..]);
                    let (lo1, hi1) = nibbles(&b.qs[16 + 32 * c..]);
                    let (m_lo, m_hi) = (vdupq_n_u8(1 << (2 * c)), vdupq_n_u8(2 << (2 * c)));
                    let fifth = |q: uint8x16_t, qh: uint8x16_t, m: uint8x16_t| {
                        vreinterpretq_s8_u8(vorrq_u8(q, vandq_u8(vtstq_u8(qh, m), h)))
                    };
                    let yq = &y.qs[64 * c..];
                    let s_lo = dot32(fifth(lo0, qh0, m_lo), fifth(lo1, qh1, m_lo), yq);
                    let s_hi = dot32(fifth(hi0, qh0, m_hi), fifth(hi1, qh1, m_hi), &yq[32..]);
                    isum += i32::from(sc[2 * c]) * vaddvq_s32(s_lo);
                    isum += i32::from(sc[2 * c + 1]) * vaddvq_s32(s_hi);
                }
                sum.add(i, term_kmin(h2f(b.d.bits()), h2f(b.dmin.bits()), y.d, isum, summs));
            }
            sum.sum()
        }

        #[target_feature(enable = $feat)]
        fn q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
            let mut sum = Blocks::default();
            let m4 = vdupq_n_u8(0xf);
            let m3 = vdupq_n_u8(3);
            let off = vdupq_n_s8(32);
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let sc = &b.scales;
                let mut isum = 0i32;
                for n in 0..2 {
                    for r in 0..2 {
                        let ql0 = ld_u8(&b.ql[64 * n + 16 * r..]);
                        let ql1 = ld_u8(&b.ql[64 * n + 32 + 16 * r..]);
                        let qh = ld_u8(&b.qh[32 * n + 16 * r..]);
                        let u = [
                            vorrq_u8(vandq_u8(ql0, m4), vshlq_n_u8::<4>(vandq_u8(qh, m3))),
                            vorrq_u8(
                                vandq_u8(ql1, m4),
                                vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m3)),
                            ),
                            vorrq_u8(
                                vshrq_n_u8::<4>(ql0),
                                vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m3)),
                            ),
                            vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
                        ];
                        for (quarter, u) in u.into_iter().enumerate() {
                            let g = 8 * n + 2 * quarter + r;
                            let v = vsubq_s8(vreinterpretq_s8_u8(u), off);
                            let s = vaddvq_s32($dot(vdupq_n_s32(0), v, ld_s8(&y.qs[16 * g..])));
                            isum += i32::from(sc[g]) * s;
                        }
                    }
                }
                sum.add(i, term(h2f(b.d.bits()), y.d, isum));
            }
            sum.sum()
        }

        #[target_feature(enable = $feat)]
        fn iq4_xs(w: &[BlockIq4Xs], a: &[BlockQ8K]) -> f32 {
            let grid = ld_s8(&IQ4NL_GRID);
            let mut sum = Blocks::default();
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let sc = b.sub_scales();
                let mut isum = 0i32;
                for (ib, &s) in sc.iter().enumerate() {
                    let (lo, hi) = nibbles(&b.qs[16 * ib..]);
                    let p = dot32(vqtbl1q_s8(grid, lo), vqtbl1q_s8(grid, hi), &y.qs[32 * ib..]);
                    isum += s * vaddvq_s32(p);
                }
                sum.add(i, term(h2f(b.d.bits()), y.d, isum));
            }
            sum.sum()
        }

        /// The lattice i-quants: each block's integer sum from its
        /// [`Codes`] (the IQ2 and IQ3 types) or its signed values (IQ1),
        /// 16 weights at a time, each group's sum times its scale.
        #[inline]
        #[target_feature(enable = $feat)]
        fn lattice<B: Lattice>(w: &[B], a: &[BlockQ8K]) -> f32 {
            let mut sum = Blocks::default();
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let isum = match b.codes() {
                    Some(c) => codes_isum(&c, y, B::HALVES),
                    None => groups_isum(&b.groups(), y, B::HALVES),
                };
                sum.add(i, term(h2f(b.d().bits()), y.d, isum));
            }
            sum.sum() * B::FACTOR
        }

        /// `Σ ls · Σ q·y` over a block's groups of 32 (16 with `halves`),
        /// `sixteen(k)` giving the sum of weights `16k..16k + 16`.
        #[inline]
        #[target_feature(enable = $feat)]
        fn scaled_isum(ls: &[u16; 16], halves: bool, sixteen: impl Fn(usize) -> i32) -> i32 {
            let mut isum = 0i32;
            for ib in 0..8 {
                let (lo, hi) = (sixteen(2 * ib), sixteen(2 * ib + 1));
                if halves {
                    isum += i32::from(ls[2 * ib]) * lo + i32::from(ls[2 * ib + 1]) * hi;
                } else {
                    isum += i32::from(ls[ib]) * (lo + hi);
                }
            }
            isum
        }

        /// A block's integer sum from its signed values.
        #[inline]
        #[target_feature(enable = $feat)]
        fn groups_isum(g: &Groups, y: &BlockQ8K, halves: bool) -> i32 {
            scaled_isum(&g.ls, halves, |k| {
                let (q, yq) = (&g.q[16 * k..], &y.qs[16 * k..]);
                vaddvq_s32($dot(vdupq_n_s32(0), ld_s8(q), ld_s8(yq)))
            })
        }

        /// A block's integer sum from its [`Codes`]: the signs put on the
        /// activations (`(y ^ m) − m` negates where `m` is all ones).
        #[inline]
        #[target_feature(enable = $feat)]
        fn codes_isum(c: &Codes, y: &BlockQ8K, halves: bool) -> i32 {
            let v = c.v.as_flattened();
            scaled_isum(&c.ls, halves, |k| {
                let neg = bit_bytes(u16::from_le_bytes([c.signs[2 * k], c.signs[2 * k + 1]]));
                let m = vreinterpretq_s8_u8(neg);
                let ys = vsubq_s8(veorq_s8(ld_s8(&y.qs[16 * k..]), m), m);
                vaddvq_s32($dot(vdupq_n_s32(0), ld_s8(&v[16 * k..]), ys))
            })
        }

        crate::kernels::lattice_kernels!([#[target_feature(enable = $feat)]]);



        /// MXFP4: the block scale is `2^(e − 128)`, no f16.
        #[target_feature(enable = $feat)]
        fn mxfp4(w: &[BlockMxfp4], a: &[BlockQ8_0]) -> f32 {
            let grid = ld_s8(&MXFP4_GRID);
            blocks32::<_, _, false>(
                w,
                a,
                |b, y| {
                    let (lo, hi) = nibbles(&b.qs);
                    dot32(vqtbl1q_s8(grid, lo), vqtbl1q_s8(grid, hi), &y.qs)
                },
                |b, y| [e8m0_half(b.e), h2f(y.d.bits()), 0.0, 0.0],
            )
        }

        /// Q1_0: the sign bits as bytes ±1.
        #[target_feature(enable = $feat)]
        fn q1_0(w: &[BlockQ1_0], a: &[BlockQ8_0]) -> f32 {
            let one = vdupq_n_u8(1);
            let signs = |bits: &[u8]| {
                let set = bit_bytes(u16::from_le_bytes([bits[0], bits[1]]));
                vreinterpretq_s8_u8(vorrq_u8(vmvnq_u8(set), one))
            };
            spanning::<_, 4>(w, a, |b| b.d, |b, k, y| {
                let bits = &b.qs[4 * k..];
                vaddvq_s32(dot32(signs(bits), signs(&bits[2..]), y))
            })
        }

        /// Q2_0: byte `j` of the values is byte `j / 4` shifted right by `2(j % 4)`.
        #[target_feature(enable = $feat)]
        fn q2_0(w: &[BlockQ2_0], a: &[BlockQ8_0]) -> f32 {
            let spread = ld_u8(&[0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
            let shifts = vreinterpretq_s8_u32(vdupq_n_u32(0xfafc_fe00));
            let (three, one) = (vdupq_n_u8(3), vdupq_n_s8(1));
            let values = |qs: &[u8]| {
                let four = u32::from_le_bytes([qs[0], qs[1], qs[2], qs[3]]);
                let q = vqtbl1q_u8(vcombine_u8(vcreate_u8(u64::from(four)), vdup_n_u8(0)), spread);
                vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q, shifts), three)), one)
            };
            spanning::<_, 2>(w, a, |b| b.d, |b, k, y| {
                let qs = &b.qs[8 * k..];
                vaddvq_s32(dot32(values(qs), values(&qs[4..]), y))
            })
        }

        /// NVFP4: each activation block a term over its two sub-blocks,
        /// `(d₀·d_a)·i₀ + (d₁·d_a)·i₁`.
        #[target_feature(enable = $feat)]
        fn nvfp4(w: &[BlockNvfp4], a: &[BlockQ8_0]) -> f32 {
            let grid = ld_s8(&MXFP4_GRID);
            let mut sum = Blocks::default();
            for (i, (b, ys)) in w.iter().zip(a.chunks_exact(2)).enumerate() {
                for (k, y) in ys.iter().enumerate() {
                    // Low nibbles are weights 0..8 and 16..24, high 8..16 and 24..32.
                    let (lo, hi) = nibbles(&b.qs[16 * k..]);
                    let first = vcombine_u8(vget_low_u8(lo), vget_low_u8(hi));
                    let second = vcombine_u8(vget_high_u8(lo), vget_high_u8(hi));
                    let zero = vdupq_n_s32(0);
                    let i0 = $dot(zero, vqtbl1q_s8(grid, first), ld_s8(&y.qs[..16]));
                    let i1 = $dot(zero, vqtbl1q_s8(grid, second), ld_s8(&y.qs[16..]));
                    let da = h2f(y.d.bits());
                    let t = term(ue4m3_half(b.d[2 * k]), da, vaddvq_s32(i0))
                        + term(ue4m3_half(b.d[2 * k + 1]), da, vaddvq_s32(i1));
                    sum.add(2 * i + k, t);
                }
            }
            sum.sum()
        }

        /// TQ2_0: `Σ (q − 1)·y` as `Σ q·y − Σ y`.
        #[target_feature(enable = $feat)]
        fn tq2_0(w: &[BlockTq2_0], a: &[BlockQ8K]) -> f32 {
            let three = vdupq_n_u8(3);
            let mut sum = Blocks::default();
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let mut isum = 0i32;
                for h in 0..2 {
                    let (q0, q1) = (ld_u8(&b.qs[32 * h..]), ld_u8(&b.qs[32 * h + 16..]));
                    for l in 0..4 {
                        let shift = vdupq_n_s8(-2 * l as i8);
                        let t0 = vandq_u8(vshlq_u8(q0, shift), three);
                        let t1 = vandq_u8(vshlq_u8(q1, shift), three);
                        let (t0, t1) = (vreinterpretq_s8_u8(t0), vreinterpretq_s8_u8(t1));
                        isum += vaddvq_s32(dot32(t0, t1, &y.qs[128 * h + 32 * l..]));
                    }
                }
                sum.add(i, term(h2f(b.d.bits()), y.d, isum - act_sum(y)));
            }
            sum.sum()
        }

        /// TQ1_0: the five-trit bytes sixteen at a time, the `qh` bytes one by one.
        #[target_feature(enable = $feat)]
        fn tq1_0(w: &[BlockTq1_0], a: &[BlockQ8K]) -> f32 {
            let zero = vdupq_n_s8(0);
            let mut sum = Blocks::default();
            for (i, (b, y)) in w.iter().zip(a).enumerate() {
                let mut isum = 0i32;
                let (mut q0, mut q1) = (ld_u8(&b.qs[..16]), ld_u8(&b.qs[16..32]));
                let mut q2 = ld_u8(&b.qs[32..]);
                for n in 0..5 {
                    isum += vaddvq_s32(dot32(trits(q0), trits(q1), &y.qs[32 * n..]));
                    isum += vaddvq_s32(dot32(trits(q2), zero, &y.qs[160 + 16 * n..]));
                    (q0, q1, q2) = (times3(q0), times3(q1), times3(q2));
                }
                for n in 0..4 {
                    for (j, &q) in b.qh.iter().enumerate() {
                        isum += i32::from(tq1_trit(q, n)) * i32::from(y.qs[240 + 4 * n + j]);
                    }
                }
                sum.add(i, term(h2f(b.d.bits()), y.d, isum - act_sum(y)));
            }
            sum.sum()
        }

        /// Σ x·y over `n` elements in the canonical float order: partials
        /// `4k..4k+4` in `acc[k]`, 32 elements per step, then whole vectors of
        /// four into the next accumulators, then the last `n % 4` elements
        /// through the scalar [`FloatSum`]. `$x`/`$y` give four `f32` from
        /// element `i`, `$madd` is [`madd`] or (exact products only)
        /// [`madd_exact`], `$tail` one product.
        macro_rules! float_dot {
            ($n:expr, $madd:ident, |$i:ident| $x:expr, $y:expr, |$t:ident| $tail:expr) => {{
                let n = $n;
                let mut acc = [vdupq_n_f32(0.0); 8];
                let mut $i = 0;
                while $i + 32 <= n {
                    let base = $i;
                    for (k, acc) in acc.iter_mut().enumerate() {
                        $i = base + 4 * k;
                        *acc = $madd(*acc, $x, $y);
                    }
                    $i = base + 32;
                }
                let mut k = 0;
                while $i + 4 <= n {
                    acc[k] = $madd(acc[k], $x, $y);
                    $i += 4;
                    k += 1;
                }
                let mut p = [0f32; FLOAT_PARTIALS];
                for (p, acc) in p.chunks_exact_mut(4).zip(acc.iter().copied()) {
                    p.copy_from_slice(&lanes(acc));
                }
                let mut s = FloatSum::new(p);
                for $t in $i..n {
                    s.add($t, $tail);
                }
                s.sum()
            }};
        }

        #[target_feature(enable = $feat)]
        fn f32w(w: &[u8], a: &[f32]) -> f32 {
            let n = a.len().min(w.len() / 4);
            let f = |t: usize| f32::from_le_bytes([w[4 * t], w[4 * t + 1], w[4 * t + 2], w[4 * t + 3]]);
            float_dot!(n, madd, |i| ld_f32_bytes(&w[4 * i..]), ld_f32(&a[i..]), |t| f(t) * a[t])
        }

        #[target_feature(enable = $feat)]
        fn f16w(w: &[u8], a: &[u16]) -> f32 {
            let n = a.len().min(w.len() / 2);
            let ab = u16s(a);
            float_dot!(n, madd_exact, |i| cvt_f16(&w[2 * i..]), cvt_f16(&ab[2 * i..]), |t| f16_at(w, 2 * t)
                * h2f(a[t]))
        }

        #[target_feature(enable = $feat)]
        fn bf16w(w: &[u8], a: &[u16]) -> f32 {
            let n = a.len().min(w.len() / 2);
            let ab = u16s(a);
            let bf = |h: u16| f32::from_bits(u32::from(h) << 16);
            float_dot!(n, madd, |i| cvt_bf16(&w[2 * i..]), cvt_bf16(&ab[2 * i..]), |t| bf(
                u16::from_le_bytes([w[2 * t], w[2 * t + 1]])
            ) * bf(a[t]))
        }

        #[target_feature(enable = $feat)]
        fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
            let n = x.len().min(y.len());
            float_dot!(n, madd, |i| ld_f32(&x[i..]), ld_f32(&y[i..]), |t| x[t] * y[t])
        }

        #[target_feature(enable = $feat)]
        fn dot_f16_f32(x: &[u16], y: &[f32]) -> f32 {
            let n = x.len().min(y.len());
            let xb = u16s(x);
            float_dot!(n, madd, |i| cvt_f16(&xb[2 * i..]), ld_f32(&y[i..]), |t| h2f(x[t]) * y[t])
        }

        #[target_feature(enable = $feat)]
        fn dot_f16_f16(x: &[u16], y: &[u16]) -> f32 {
            let n = x.len().min(y.len());
            let (xb, yb) = (u16s(x), u16s(y));
            float_dot!(n, madd_exact, |i| cvt_f16(&xb[2 * i..]), cvt_f16(&yb[2 * i..]), |t| h2f(x[t])
                * h2f(y[t]))
        }
    };
}

/// Plain Advanced SIMD.
mod plain {
    use super::*;
    kernels!(
        "neon",
        dot_mull,
        TABLE,
        crate::kernels::RowsTable {
            f16_f32: Some(r_f16w_f32),
            f16_wide: Some(r_f16_wide),
            ..crate::kernels::RowsTable::NONE
        },
        "The NEON table: every type; several-row products of F16."
    );
}

/// Advanced SIMD with `sdot`.
mod dot {
    use super::*;
    kernels!(
        "neon,dotprod",
        dot_sdot,
        TABLE_DOT,
        ROWS,
        "The NEON + dotprod table: every type; several-row products of F16 and the Q8_0 family."
    );

    /// The several-row products: F16, and the Q8_0 family over regrouped
    /// activations.
    const ROWS: RowsTable = RowsTable {
        f16_f32: Some(r_f16w_f32),
        f16_wide: Some(r_f16_wide),
        q4_0: Some(r_q4_0),
        q5_0: Some(r_q5_0),
        q8_0: Some(r_q8_0),
        iq4_nl: Some(r_iq4_nl),
        ..RowsTable::NONE
    };

    /// Declares a safe entry point for a several-row kernel.
    macro_rules! rows_entry {
        ($name:ident, $b:ty, $unpack:ident) => {
            fn $name(w: &[$b], rows: usize, a: Q8Rows<'_>, out: &mut [f32], stride: usize) {
                // SAFETY: reachable only through `TABLE_DOT`, which `Kernels::new`
                // hands out after probing NEON and the dot-product extension.
                let row = |w: &[$b], out: &mut [f32]| unsafe {
                    rows_grouped(w, |b| $unpack(b), a.groups, out)
                };
                super::super::each_row(w, rows, out, stride, a.tokens, row);
            }
        };
    }

    rows_entry!(r_q4_0, BlockQ4_0, unpack_q4_0);
    rows_entry!(r_q5_0, BlockQ5_0, unpack_q5_0);
    rows_entry!(r_q8_0, BlockQ8_0, unpack_q8_0);
    rows_entry!(r_iq4_nl, BlockIq4Nl, unpack_iq4_nl);

    // The activations come regrouped (`Q8_GROUP_BYTES`): per eight blocks,
    // eight 32-byte registers whose four-byte lane `l` holds four quants of
    // block `l`, so the first sixteen bytes of each are blocks 0–3 and the
    // last sixteen blocks 4–7. The weights of four blocks are transposed the
    // same way once per group, and eight `sdot` (signed × signed, no offset)
    // leave each block's exact integer sum in its own lane: lane `l` of the
    // first half is block `8g + l`, scaled and added to partial `l`, and of
    // the second half partial `4 + l`, as in the single product.

    /// Activation rows whose partials are kept together.
    const TOKENS: usize = 8;

    /// Four registers of four 32-bit lanes transposed: lane `l` of result
    /// `k` is lane `k` of `v[l]`.
    #[inline]
    #[target_feature(enable = "neon")]
    fn transpose4(v: [int8x16_t; 4]) -> [int8x16_t; 4] {
        let [a, b, c, d] = v.map(|x| vreinterpretq_s32_s8(x));
        let (ab0, ab1) = (vtrn1q_s32(a, b), vtrn2q_s32(a, b));
        let (cd0, cd1) = (vtrn1q_s32(c, d), vtrn2q_s32(c, d));
        let q = |x: int32x4_t| vreinterpretq_s64_s32(x);
        [
            vtrn1q_s64(q(ab0), q(cd0)),
            vtrn1q_s64(q(ab1), q(cd1)),
            vtrn2q_s64(q(ab0), q(cd0)),
            vtrn2q_s64(q(ab1), q(cd1)),
        ]
        .map(|x| vreinterpretq_s8_s64(x))
    }

    /// One weight row of 32-weight blocks against
    /// `out.len()` regrouped Q8_0 activation rows `groups`, each in the
    /// canonical order of the single product. A row's last group is padded
    /// with zero blocks on both sides: their terms are `+0`, which leaves a
    /// partial unchanged.
    #[inline]
    #[target_feature(enable = "neon,dotprod")]
    fn rows_grouped<B: Scaled>(
        w: &[B],
        unpack: impl Fn(&B) -> (int8x16_t, int8x16_t),
        groups: &[u8],
        out: &mut [f32],
    ) {
        let nb = w.len();
        let ng = nb.div_ceil(8);
        let (records, _) = groups.as_chunks::<Q8_GROUP_BYTES>();
        assert!(records.len() == out.len() * ng, "grouped rows lengths");
        let zero = vdupq_n_s8(0);
        for (out, records) in out.chunks_mut(TOKENS).zip(records.chunks(TOKENS * ng)) {
            let mut acc = [[vdupq_n_f32(0.0); 2]; TOKENS];
            for (g, b0) in (0..nb).step_by(8).enumerate() {
                let mut q = [(zero, zero); 8];
                let mut dws = [0f32; 8];
                for (l, b) in w[b0..].iter().take(8).enumerate() {
                    q[l] = unpack(b);
                    dws[l] = h2f(b.scale().bits());
                }
                // A last group of at most four blocks (576 columns are two
                // groups and two blocks) is padding in its second half: its
                // terms would be `+0`, so that half is not computed.
                let halves = if nb - b0 <= 4 { 1 } else { 2 };
                // wt[h][k]: lane `l` = weights 4k..4k+4 of block 4h + l.
                let wt: [[int8x16_t; 8]; 2] = std::array::from_fn(|h| {
                    if h >= halves {
                        return [zero; 8];
                    }
                    let lo = transpose4(std::array::from_fn(|l| q[4 * h + l].0));
                    let hi = transpose4(std::array::from_fn(|l| q[4 * h + l].1));
                    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
                });
                let dw = [ld_f32(&dws[..4]), ld_f32(&dws[4..])];
                for (acc, r) in acc.iter_mut().zip(records[g..].iter().step_by(ng)) {
                    for (h, acc) in acc.iter_mut().enumerate().take(halves) {
                        let mut s = vdupq_n_s32(0);
                        for (k, &wk) in wt[h].iter().enumerate() {
                            let y = vreinterpretq_s8_u8(ld_u8(&r[32 * k + 16 * h..]));
                            s = dot_sdot(s, wk, y);
                        }
                        let da = ld_f32_bytes(&r[288 + 16 * h..]);
                        let t = vmulq_f32(vmulq_f32(dw[h], da), vcvtq_f32_s32(s));
                        *acc = vaddq_f32(*acc, t);
                    }
                }
            }
            for (o, [a0, a1]) in out.iter_mut().zip(acc.iter().copied()) {
                let [p0, p1, p2, p3] = lanes(a0);
                let [p4, p5, p6, p7] = lanes(a1);
                *o = Blocks::new([p0, p1, p2, p3, p4, p5, p6, p7]).sum();
            }
        }
    }
}

pub(crate) use dot::TABLE_DOT;
pub(crate) use plain::TABLE;
