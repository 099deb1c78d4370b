//! The scalar kernels: activation quantizers bit-identical to ggml's
//! reference C, and the dot product of every weight type with its vec_dot
//! type. These are the specification the SIMD kernels are tested against.
//!
//! Each quantized dot product works like ggml's generic `ggml_vec_dot_*`:
//! exact integer sums within a block (super-block for the K-quants, where the
//! sub-block scales multiply in integers too), then one float term per block
//! ([`term`], [`term_min`], [`term_kmin`]), accumulated in the canonical order
//! of the module docs of [`crate::kernels`] ([`Blocks`], [`tree8`]); the float
//! types use [`FloatSum`]. The SIMD kernels call the same helpers for their
//! scalar parts. Block layouts: [`memwall_format::blocks`].

use super::{
    BlockQ8_0, BlockQ8_1, BlockQ8K, DotTable, OpsTable, QK_K, QK8_0, RowsTable, attn, block_table,
};
use memwall_format::blocks::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockIq4Nl,
    BlockIq4Xs, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockQ2K, BlockQ3K, BlockQ4_0,
    BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockTq1_0, BlockTq2_0, F16,
    Groups, IQ4NL_GRID, Lattice, MXFP4_GRID, bf16_to_f32, e8m0_half, f16_to_f32, ue4m3_half,
};

/// Quantizes `x` to Q8_0 blocks: `d = max|x| / 127`, `q = round(x / d)`
/// (half away from zero, like C's `roundf`), as `quantize_row_q8_0_ref`.
/// Panics unless `x.len() == 32 · y.len()`.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0, "quantize_row_q8_0 lengths");
    for (x, b) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = F16::from_f32(d);
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
    }
}

/// Quantizes `x` to Q8_1 blocks: Q8_0's quants plus `s = f16(Σq · d)`, as
/// `quantize_row_q8_1_ref`. Panics unless `x.len() == 32 · y.len()`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), y.len() * QK8_0, "quantize_row_q8_1 lengths");
    for (x, b) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = F16::from_f32(d);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
            sum += i32::from(*q);
        }
        b.s = F16::from_f32(sum as f32 * d);
    }
}

/// ggml's `nearest_int`: round to nearest, ties to even, through the float
/// adder (valid for `|v| < 2²²`).
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits();
    (bits & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Quantizes `x` to Q8_K super-blocks as `quantize_row_q8_K_ref`: the value
/// of largest magnitude `max` maps to −127 (`iscale = −127 / max`,
/// `q = min(127, nearest_int(iscale · x))`, `d = 1 / iscale`), plus the sums
/// of each 16 quants. An all-zero block gets `d = 0`, zero quants and zero
/// sums (ggml leaves its sums unwritten). Panics unless
/// `x.len() == 256 · y.len()`.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(x.len(), y.len() * QK_K, "quantize_row_q8_k lengths");
    for (x, b) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        // ggml keeps the first value of largest magnitude (NaNs never
        // compare larger): the largest magnitude first, then where it is.
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let Some(&max) = x.iter().find(|v| v.abs() == amax).filter(|_| amax > 0.0) else {
            *b = BlockQ8K::default();
            continue;
        };
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| i16::from(v)).sum();
        }
        b.d = 1.0 / iscale;
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The scalar table: the specification.
pub(crate) static TABLE: DotTable = memwall_format::block_types!([block_table] dot {
    f32: dot_f32w,
    f16: dot_f16w,
    bf16: dot_bf16w,
    dot_f32: dot_f32,
    dot_f16_f32: dot_f16_f32,
    dot_f16_f16: dot_f16_f16,
    rows: RowsTable::NONE,
    ops: OPS,
});

/// The scalar float loops: the specification of every backend's [`OpsTable`].
pub(crate) const OPS: OpsTable = OpsTable {
    key_tiles: attn::key_tiles,
    product_tiles: attn::product_tiles,
    weighted_rows: attn::weighted_rows,
    axpy: attn::axpy,
    widen_f16: attn::widen_f16,
    widen_f16_le: attn::widen_f16_le,
    narrow_f16: attn::narrow_f16,
    exp_fast: crate::forward::math::exp_fast_slice,
    quantize_q8_0: quantize_row_q8_0,
    transpose: super::arch::transpose_scalar,
};

// ---- the canonical order (module docs of `kernels`) ----

/// The final reduction of eight partial sums: `((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7))`.
#[inline]
pub(crate) fn tree8(p: &[f32; 8]) -> f32 {
    ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
}

/// The block term `(d_w · d_a) · f32(isum)`.
#[inline]
pub(crate) fn term(dw: f32, da: f32, isum: i32) -> f32 {
    (dw * da) * isum as f32
}

/// The block term of Q4_1/Q5_1: `(d_w · d_a) · f32(isum) + m_w · s_a`.
#[inline]
pub(crate) fn term_min(dw: f32, da: f32, isum: i32, mw: f32, sa: f32) -> f32 {
    (dw * da) * isum as f32 + mw * sa
}

/// The block term of Q2_K/Q4_K/Q5_K: `(d_w · d_a) · f32(isum) − (m_w · d_a) · f32(summs)`.
#[inline]
pub(crate) fn term_kmin(dw: f32, mw: f32, da: f32, isum: i32, summs: i32) -> f32 {
    (dw * da) * isum as f32 - (mw * da) * summs as f32
}

/// The eight partial sums of a quantized row: block `b` goes to `b % 8`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Blocks {
    /// The partials.
    pub(crate) p: [f32; 8],
}

impl Blocks {
    /// Partials that already hold the terms of a row's first blocks (SIMD
    /// kernels store their vector accumulators here to finish the row).
    #[inline]
    pub(crate) fn new(p: [f32; 8]) -> Blocks {
        Blocks { p }
    }

    /// Adds the term of block `b`.
    #[inline]
    pub(crate) fn add(&mut self, b: usize, t: f32) {
        self.p[b % 8] += t;
    }

    /// The row's sum.
    #[inline]
    pub(crate) fn sum(&self) -> f32 {
        tree8(&self.p)
    }
}

/// Partial sums of the float dot products: element `i` to partial `i % 32`.
pub(crate) const FLOAT_PARTIALS: usize = 32;

/// The 32 partial sums of a float dot product.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FloatSum {
    /// The partials.
    pub(crate) p: [f32; FLOAT_PARTIALS],
}

impl FloatSum {
    /// Partials holding the vector part of a row (elements `0..i`).
    #[inline]
    pub(crate) fn new(p: [f32; FLOAT_PARTIALS]) -> FloatSum {
        FloatSum { p }
    }

    /// Adds the product of element `i`.
    #[inline]
    pub(crate) fn add(&mut self, i: usize, prod: f32) {
        self.p[i % FLOAT_PARTIALS] += prod;
    }

    /// Folds to eight partials, `q[k] = (p[k] + p[k+8]) + (p[k+16] + p[k+24])`,
    /// then [`tree8`].
    #[inline]
    pub(crate) fn sum(&self) -> f32 {
        let p = &self.p;
        tree8(&std::array::from_fn(|k| {
            (p[k] + p[k + 8]) + (p[k + 16] + p[k + 24])
        }))
    }
}

/// Columns `full..cols` (`full` a multiple of 32, `cols - full < 32`) of an
/// F16 weight row `w` and of the `M` activation rows of `a` (`M × cols`
/// floats), padded with zeros to one 32-column step of the SIMD F16 products.
/// A padded term is `+0`, which leaves a partial unchanged (a partial starts
/// at `+0`, so is never `-0`), and each real term goes to its partial
/// `i mod 32`, as in the canonical order.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn f16_tail_step<const M: usize>(
    w: &[u8],
    a: &[f32],
    cols: usize,
    full: usize,
) -> ([u8; 64], [[f32; 32]; M]) {
    let mut ws = [0u8; 64];
    ws[..2 * (cols - full)].copy_from_slice(&w[2 * full..2 * cols]);
    (ws, f32_tail_step(a, cols, full))
}

/// Columns `full..cols` of the `M` rows of `a` (`M × cols` floats), padded
/// with zeros to 32 columns each: [`f16_tail_step`]'s activations, or the
/// weights of rows already widened to `f32`.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn f32_tail_step<const M: usize>(a: &[f32], cols: usize, full: usize) -> [[f32; 32]; M] {
    std::array::from_fn(|j| {
        let mut t = [0f32; 32];
        t[..cols - full].copy_from_slice(&a[j * cols + full..(j + 1) * cols]);
        t
    })
}

/// `Σ prod(i)` for `i < n` in the canonical float order.
#[inline]
fn float_dot(n: usize, prod: impl Fn(usize) -> f32) -> f32 {
    let mut s = FloatSum::new([0.0; FLOAT_PARTIALS]);
    for i in 0..n {
        s.add(i, prod(i));
    }
    s.sum()
}

/// `Σ_b term(b)` over the blocks of a row in the canonical order.
#[inline]
fn block_dot(terms: impl Iterator<Item = f32>) -> f32 {
    let mut s = Blocks::default();
    for (b, t) in terms.enumerate() {
        s.add(b, t);
    }
    s.sum()
}

fn f32_le(w: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]])
}

/// F32 weights (little-endian bytes) · f32.
pub(crate) fn dot_f32w(w: &[u8], a: &[f32]) -> f32 {
    float_dot(a.len().min(w.len() / 4), |i| f32_le(w, i) * a[i])
}

/// F16 weights · f16 activations.
pub(crate) fn dot_f16w(w: &[u8], a: &[u16]) -> f32 {
    float_dot(a.len().min(w.len() / 2), |i| {
        f16_to_f32(le16(w, 2 * i)) * f16_to_f32(a[i])
    })
}

/// BF16 weights · bf16 activations.
pub(crate) fn dot_bf16w(w: &[u8], a: &[u16]) -> f32 {
    float_dot(a.len().min(w.len() / 2), |i| {
        bf16_to_f32(le16(w, 2 * i)) * bf16_to_f32(a[i])
    })
}

/// f32 · f32.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    float_dot(a.len().min(b.len()), |i| a[i] * b[i])
}

/// f16 · f32.
pub(crate) fn dot_f16_f32(a: &[u16], b: &[f32]) -> f32 {
    float_dot(a.len().min(b.len()), |i| f16_to_f32(a[i]) * b[i])
}

/// f16 · f16.
pub(crate) fn dot_f16_f16(a: &[u16], b: &[u16]) -> f32 {
    float_dot(a.len().min(b.len()), |i| {
        f16_to_f32(a[i]) * f16_to_f32(b[i])
    })
}

/// The dot products of the block types, one per line of
/// [`memwall_format::block_types!`] (the names the scalar `TABLE` takes).
pub(crate) mod dot {
    use super::*;

    /// Σ over 16 nibble pairs of a 32-weight block: `(lo − off)·y[j] + (hi − off)·y[j+16]`.
    fn nibble_sum(qs: &[u8; 16], y: &[i8; 32], off: i32) -> i32 {
        let mut s = 0;
        for (j, &q) in qs.iter().enumerate() {
            s += (i32::from(q & 0xf) - off) * i32::from(y[j]);
            s += (i32::from(q >> 4) - off) * i32::from(y[j + 16]);
        }
        s
    }

    pub(crate) fn q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
        block_dot(
            w.iter()
                .zip(a)
                .map(|(b, y)| term(b.d.to_f32(), y.d.to_f32(), nibble_sum(&b.qs, &y.qs, 8))),
        )
    }

    pub(crate) fn q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let isum = nibble_sum(&b.qs, &y.qs, 0);
            term_min(b.d.to_f32(), y.d.to_f32(), isum, b.m.to_f32(), y.s.to_f32())
        }))
    }

    /// Σ over a Q5 block: 5-bit values (nibble + fifth bit from `qh`) minus `off`, times `y`.
    fn q5_sum(qh: [u8; 4], qs: &[u8; 16], y: &[i8; 32], off: i32) -> i32 {
        let qh = u32::from_le_bytes(qh);
        let mut s = 0;
        for (j, &q) in qs.iter().enumerate() {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            s += ((u32::from(q & 0xf) | h0) as i32 - off) * i32::from(y[j]);
            s += ((u32::from(q >> 4) | h1) as i32 - off) * i32::from(y[j + 16]);
        }
        s
    }

    pub(crate) fn q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
        block_dot(
            w.iter()
                .zip(a)
                .map(|(b, y)| term(b.d.to_f32(), y.d.to_f32(), q5_sum(b.qh, &b.qs, &y.qs, 16))),
        )
    }

    pub(crate) fn q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let isum = q5_sum(b.qh, &b.qs, &y.qs, 0);
            term_min(b.d.to_f32(), y.d.to_f32(), isum, b.m.to_f32(), y.s.to_f32())
        }))
    }

    pub(crate) fn q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let isum: i32 =
                b.qs.iter()
                    .zip(&y.qs)
                    .map(|(&q, &v)| i32::from(q) * i32::from(v))
                    .sum();
            term(b.d.to_f32(), y.d.to_f32(), isum)
        }))
    }

    pub(crate) fn iq4_nl(w: &[BlockIq4Nl], a: &[BlockQ8_0]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let mut isum = 0i32;
            for (j, &q) in b.qs.iter().enumerate() {
                isum += i32::from(IQ4NL_GRID[usize::from(q & 0xf)]) * i32::from(y.qs[j]);
                isum += i32::from(IQ4NL_GRID[usize::from(q >> 4)]) * i32::from(y.qs[j + 16]);
            }
            term(b.d.to_f32(), y.d.to_f32(), isum)
        }))
    }

    /// MXFP4: the scale is the exponent's `2^(e − 128)`, not an f16.
    pub(crate) fn mxfp4(w: &[BlockMxfp4], a: &[BlockQ8_0]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let mut isum = 0i32;
            for (j, &q) in b.qs.iter().enumerate() {
                isum += i32::from(MXFP4_GRID[usize::from(q & 0xf)]) * i32::from(y.qs[j]);
                isum += i32::from(MXFP4_GRID[usize::from(q >> 4)]) * i32::from(y.qs[j + 16]);
            }
            term(e8m0_half(b.e), y.d.to_f32(), isum)
        }))
    }

    /// `Σ ±y` over 32 weights of Q1_0 (`bits`: their four bytes of signs).
    pub(crate) fn q1_sum(bits: &[u8], y: &[i8; 32]) -> i32 {
        (0..32)
            .map(|j| {
                let v = i32::from(y[j]);
                if bits[j / 8] >> (j % 8) & 1 != 0 {
                    v
                } else {
                    -v
                }
            })
            .sum()
    }

    /// A row whose blocks span `N` activation blocks (Q1_0, Q2_0): each
    /// activation block `k` of a block is a term, with the block's scale `d`
    /// and `isum(block, k, y)` its integer sum.
    fn spanning<B, const N: usize>(
        w: &[B],
        a: &[BlockQ8_0],
        d: impl Fn(&B) -> F16,
        isum: impl Fn(&B, usize, &[i8; 32]) -> i32,
    ) -> f32 {
        let terms = w.iter().zip(a.as_chunks::<N>().0).flat_map(|(b, ys)| {
            let (d, isum) = (&d, &isum);
            ys.iter()
                .enumerate()
                .map(move |(k, y)| term(d(b).to_f32(), y.d.to_f32(), isum(b, k, &y.qs)))
        });
        block_dot(terms)
    }

    /// Q1_0: a block spans four activation blocks.
    pub(crate) fn q1_0(w: &[BlockQ1_0], a: &[BlockQ8_0]) -> f32 {
        spanning::<_, 4>(w, a, |b| b.d, |b, k, y| q1_sum(&b.qs[4 * k..][..4], y))
    }

    /// `Σ (q − 1)·y` over 32 weights of Q2_0 (`qs`: their eight bytes).
    pub(crate) fn q2_sum(qs: &[u8], y: &[i8; 32]) -> i32 {
        (0..32)
            .map(|j| (i32::from(qs[j / 4] >> (2 * (j % 4)) & 3) - 1) * i32::from(y[j]))
            .sum()
    }

    /// Q2_0: a block spans two activation blocks.
    pub(crate) fn q2_0(w: &[BlockQ2_0], a: &[BlockQ8_0]) -> f32 {
        spanning::<_, 2>(w, a, |b| b.d, |b, k, y| q2_sum(&b.qs[8 * k..][..8], y))
    }

    /// The integer sums of NVFP4's sub-blocks `2k` and `2k + 1` against the
    /// activation block `y` they share.
    pub(crate) fn nvfp4_sums(b: &BlockNvfp4, k: usize, y: &[i8; 32]) -> [i32; 2] {
        std::array::from_fn(|h| {
            let (qs, y) = (&b.qs[8 * (2 * k + h)..][..8], &y[16 * h..][..16]);
            qs.iter()
                .enumerate()
                .map(|(j, &q)| {
                    i32::from(MXFP4_GRID[usize::from(q & 0xf)]) * i32::from(y[j])
                        + i32::from(MXFP4_GRID[usize::from(q >> 4)]) * i32::from(y[j + 8])
                })
                .sum()
        })
    }

    /// NVFP4: a block spans two activation blocks; each 32 weights a term
    /// `(d₀·d_a)·i₀ + (d₁·d_a)·i₁` over its two 16-weight sub-blocks.
    pub(crate) fn nvfp4(w: &[BlockNvfp4], a: &[BlockQ8_0]) -> f32 {
        block_dot(w.iter().zip(a.chunks_exact(2)).flat_map(|(b, ys)| {
            ys.iter().enumerate().map(move |(k, y)| {
                let [i0, i1] = nvfp4_sums(b, k, &y.qs);
                let da = y.d.to_f32();
                term(ue4m3_half(b.d[2 * k]), da, i0) + term(ue4m3_half(b.d[2 * k + 1]), da, i1)
            })
        }))
    }

    /// `Σ (t − 1)·y` over a ternary super-block's values `t ∈ {0, 1, 2}`.
    fn ternary_sum(t: impl Iterator<Item = u8>, y: &[i8; QK_K]) -> i32 {
        t.zip(y)
            .map(|(t, &v)| (i32::from(t) - 1) * i32::from(v))
            .sum()
    }

    pub(crate) fn tq1_0(w: &[BlockTq1_0], a: &[BlockQ8K]) -> f32 {
        block_dot(
            w.iter()
                .zip(a)
                .map(|(b, y)| term(b.d.to_f32(), y.d, ternary_sum(b.trits().into_iter(), &y.qs))),
        )
    }

    pub(crate) fn tq2_0(w: &[BlockTq2_0], a: &[BlockQ8K]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            term(
                b.d.to_f32(),
                y.d,
                ternary_sum((0..QK_K).map(|i| b.value(i)), &y.qs),
            )
        }))
    }

    /// `Σ_j bsums[j] · m[j / per]`: the minimum correction of a K-quant super-block.
    fn bsum_dot(y: &BlockQ8K, m: impl Fn(usize) -> i32) -> i32 {
        y.bsums
            .iter()
            .enumerate()
            .map(|(j, &s)| i32::from(s) * m(j))
            .sum()
    }

    fn dot16(q: impl Iterator<Item = i32>, y: &[i8]) -> i32 {
        q.zip(y).map(|(q, &v)| q * i32::from(v)).sum()
    }

    pub(crate) fn q2_k(w: &[BlockQ2K], a: &[BlockQ8K]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let sc = &b.scales;
            let summs = bsum_dot(y, |j| i32::from(sc[j] >> 4));
            let mut isum = 0i32;
            for (k, q) in b.qs.chunks_exact(32).enumerate() {
                for j in 0..4 {
                    let y = &y.qs[128 * k + 32 * j..][..32];
                    let g = 8 * k + 2 * j;
                    let v = |l: usize| i32::from((q[l] >> (2 * j)) & 3);
                    isum += i32::from(sc[g] & 0xf) * dot16((0..16).map(v), &y[..16]);
                    isum += i32::from(sc[g + 1] & 0xf) * dot16((16..32).map(v), &y[16..]);
                }
            }
            term_kmin(b.d.to_f32(), b.dmin.to_f32(), y.d, isum, summs)
        }))
    }

    pub(crate) fn q3_k(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let hmask = &b.hmask;
            let sc = b.sub_scales();
            let mut isum = 0i32;
            for (k, q) in b.qs.chunks_exact(32).enumerate() {
                for j in 0..4 {
                    let y = &y.qs[128 * k + 32 * j..][..32];
                    let m = 1u8 << (4 * k + j);
                    let v = |l: usize| {
                        i32::from((q[l] >> (2 * j)) & 3) - if hmask[l] & m != 0 { 0 } else { 4 }
                    };
                    let g = 8 * k + 2 * j;
                    isum += i32::from(sc[g]) * dot16((0..16).map(v), &y[..16]);
                    isum += i32::from(sc[g + 1]) * dot16((16..32).map(v), &y[16..]);
                }
            }
            term(b.d.to_f32(), y.d, isum)
        }))
    }

    pub(crate) fn q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let (sc, m) = k4_scales(&b.scales);
            let summs = bsum_dot(y, |j| i32::from(m[j / 2]));
            let mut isum = 0i32;
            for (c, q) in b.qs.chunks_exact(32).enumerate() {
                let y = &y.qs[64 * c..][..64];
                isum +=
                    i32::from(sc[2 * c]) * dot16(q.iter().map(|&q| i32::from(q & 0xf)), &y[..32]);
                isum += i32::from(sc[2 * c + 1])
                    * dot16(q.iter().map(|&q| i32::from(q >> 4)), &y[32..]);
            }
            term_kmin(b.d.to_f32(), b.dmin.to_f32(), y.d, isum, summs)
        }))
    }

    pub(crate) fn q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let (sc, m) = k4_scales(&b.scales);
            let qh = &b.qh;
            let summs = bsum_dot(y, |j| i32::from(m[j / 2]));
            let mut isum = 0i32;
            for (c, q) in b.qs.chunks_exact(32).enumerate() {
                let y = &y.qs[64 * c..][..64];
                let hi = |l: usize, bit: usize| i32::from((qh[l] >> bit) & 1) << 4;
                let lo = (0..32).map(|l| i32::from(q[l] & 0xf) + hi(l, 2 * c));
                let up = (0..32).map(|l| i32::from(q[l] >> 4) + hi(l, 2 * c + 1));
                isum += i32::from(sc[2 * c]) * dot16(lo, &y[..32]);
                isum += i32::from(sc[2 * c + 1]) * dot16(up, &y[32..]);
            }
            term_kmin(b.d.to_f32(), b.dmin.to_f32(), y.d, isum, summs)
        }))
    }

    pub(crate) fn q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let mut isum = 0i32;
            for (g, &s) in b.scales.iter().enumerate() {
                let v = (16 * g..16 * g + 16).map(|i| q6k_value(b, i));
                isum += i32::from(s) * dot16(v, &y.qs[16 * g..][..16]);
            }
            term(b.d.to_f32(), y.d, isum)
        }))
    }

    pub(crate) fn iq4_xs(w: &[BlockIq4Xs], a: &[BlockQ8K]) -> f32 {
        block_dot(w.iter().zip(a).map(|(b, y)| {
            let sc = b.sub_scales();
            let mut isum = 0i32;
            for (ib, q) in b.qs.chunks_exact(16).enumerate() {
                let y = &y.qs[32 * ib..][..32];
                let mut s = 0i32;
                for (j, &q) in q.iter().enumerate() {
                    s += i32::from(IQ4NL_GRID[usize::from(q & 0xf)]) * i32::from(y[j]);
                    s += i32::from(IQ4NL_GRID[usize::from(q >> 4)]) * i32::from(y[j + 16]);
                }
                isum += sc[ib] * s;
            }
            term(b.d.to_f32(), y.d, isum)
        }))
    }

    /// The lattice i-quants: one [`term`] per super-block of its
    /// [`lattice_isum`](super::lattice_isum), the sum times `B::FACTOR`
    /// (exact: a power of two).
    fn lattice<B: Lattice>(w: &[B], a: &[BlockQ8K]) -> f32 {
        let terms = w.iter().zip(a).map(|(b, y)| {
            term(
                b.d().to_f32(),
                y.d,
                super::lattice_isum(&b.groups(), y, B::HALVES),
            )
        });
        block_dot(terms) * B::FACTOR
    }

    crate::kernels::lattice_kernels!([pub(crate)]);
}

/// The integer sum of a lattice super-block ([`Lattice::groups`]) against
/// its activations: `Σ_g ls_g · Σ_{i∈g} q_i · y_i` over the groups of 32
/// weights (16 where `halves`).
pub(crate) fn lattice_isum(g: &Groups, y: &BlockQ8K, halves: bool) -> i32 {
    let per = if halves { 16 } else { 32 };
    let groups = g.q.chunks_exact(per).zip(y.qs.chunks_exact(per)).zip(&g.ls);
    groups
        .map(|((q, y), &ls)| {
            let s: i32 = q
                .iter()
                .zip(y)
                .map(|(&q, &y)| i32::from(q) * i32::from(y))
                .sum();
            i32::from(ls) * s
        })
        .sum()
}

/// The 8 scales and 8 minimums of a Q4_K/Q5_K block: [`scale_min_k4`](memwall_format::blocks::scale_min_k4) for
/// `j = 0..8`, four bytes at a time on the three little-endian words of the
/// twelve scale bytes (a per-byte loop was a third of the single-row Q4_K
/// product's instructions).
pub(crate) fn k4_scales(p: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    // j < 4: the low six bits of bytes j (scales) and 4 + j (minimums);
    // j ≥ 4: four bits of byte 4 + j (low nibble: scale, high: minimum) under
    // the top two bits of byte j - 4 (scale) or j (minimum).
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let m_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    let join = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (join(w0 & LOW6, sc_hi), join(w1 & LOW6, m_hi))
}

/// The 6-bit value `i` (0..256) of a Q6_K block, minus 32.
pub(crate) fn q6k_value(b: &BlockQ6K, i: usize) -> i32 {
    let (n, r) = (i / 128, i % 128);
    let (quarter, l) = (r / 32, r % 32);
    let lowb = b.ql[64 * n + l + 32 * (quarter & 1)];
    let low = if quarter < 2 { lowb & 0xf } else { lowb >> 4 };
    let high = (b.qh[32 * n + l] >> (2 * quarter)) & 3;
    i32::from(low | (high << 4)) - 32
}

#[cfg(test)]
mod k4_tests {
    use super::*;
    use memwall_format::blocks::scale_min_k4;

    #[test]
    fn k4_scales_unpack_like_get_scale_min_k4() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut inputs = vec![[0u8; 12], [0xff; 12], [0x55; 12], [0xaa; 12]];
        for _ in 0..10_000 {
            inputs.push(std::array::from_fn(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            }));
        }
        // Every byte value in every position.
        for at in 0..12 {
            for v in 0..=255u8 {
                let mut p = [0u8; 12];
                p[at] = v;
                inputs.push(p);
            }
        }
        for p in inputs {
            let want: [(u8, u8); 8] = std::array::from_fn(|j| scale_min_k4(j, &p));
            let (sc, m) = k4_scales(&p);
            let got: [(u8, u8); 8] = std::array::from_fn(|j| (sc[j], m[j]));
            assert_eq!(got, want, "scale bytes {p:02x?}");
        }
    }
}
