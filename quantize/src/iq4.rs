//! IQ4_NL and IQ4_XS encoders, with or without an importance matrix, following ggml's
//! `quantize_row_iq4_nl_impl` as `llama-quantize` calls it (`quantize_iq4_nl` /
//! `quantize_iq4_xs`, 7 scale trials each way), in `f32` in ggml's order.

use memwall_format::blocks::{BlockIq4Nl, BlockIq4Xs, F16, IQ4NL_GRID};

use crate::kquants::{GROUP_MAX_EPS, nearest_int};
use crate::lanes;
use crate::weights::{importance, sum_squares};

const NTRY: i32 = 7;

/// Index of the grid value nearest to `x` (ties to the upper one), as ggml's
/// `best_index_int8` finds it by bisection. Branch-free, so that it
/// vectorizes: for sorted grid values, `x` is past the tie point between
/// neighbours `k−1` and `k` exactly for the `k` below its answer, and the
/// comparison is the one ggml makes between those two neighbours (for any
/// other `k` both sides have fixed signs, so rounding cannot flip it).
#[inline(always)]
pub(crate) fn best_index(x: f32) -> u8 {
    let mut index = 0u8;
    for k in 1..16 {
        let (lo, hi) = (f32::from(IQ4NL_GRID[k - 1]), f32::from(IQ4NL_GRID[k]));
        index += u8::from(x - lo >= hi - x);
    }
    index
}

/// The grid value [`best_index`] picks, as an `f32`.
#[inline(always)]
fn best_value(x: f32) -> f32 {
    let mut value = f32::from(IQ4NL_GRID[0]);
    for k in 1..16 {
        let (lo, hi) = (f32::from(IQ4NL_GRID[k - 1]), f32::from(IQ4NL_GRID[k]));
        value += if x - lo >= hi - x { hi - lo } else { 0.0 };
    }
    value
}

/// Weights of the fits: `x²`, or with an importance matrix `qw · √(σ² + x²)`
/// where σ² is twice the mean square of the (super-)block.
fn weights(x: &[f32], qw: Option<&[f32]>) -> Vec<f32> {
    match qw {
        None => x.iter().map(|v| v * v).collect(),
        Some(qw) => {
            let sigma2 = sum_squares(x) * (2.0 / x.len() as f32);
            importance(x, qw, sigma2)
        }
    }
}

/// Best scale of `K` groups of 32 weights at once (transposed: `x[i][g]`),
/// ggml's scale search run side by side as in `lanes`; 0 for all-zero groups.
#[inline(always)]
fn group_scales<const K: usize>(x: &[[f32; K]; 32], w: &[[f32; K]; 32]) -> [f32; K] {
    let (amax, max) = lanes::signed_max(x);
    let v0 = f32::from(IQ4NL_GRID[0]);
    let fit = |id: &[f32; K]| {
        let (mut sumqx, mut sumq2) = ([0f32; K], [0f32; K]);
        for (xs, ws) in x.iter().zip(w) {
            for g in 0..K {
                let q = best_value(id[g] * xs[g]);
                sumqx[g] += ws[g] * q * xs[g];
                sumq2[g] += ws[g] * q * q;
            }
        }
        (sumqx, sumq2)
    };
    let mut id = [0f32; K];
    for g in 0..K {
        id[g] = 1.0 / (-max[g] / v0);
    }
    let (sumqx, sumq2) = fit(&id);
    let (mut d, mut best) = ([0f32; K], [0f32; K]);
    for g in 0..K {
        d[g] = if sumq2[g] > 0.0 {
            sumqx[g] / sumq2[g]
        } else {
            0.0
        };
        best[g] = d[g] * sumqx[g];
    }
    for itry in -NTRY..=NTRY {
        for g in 0..K {
            id[g] = (itry as f32 + v0) / max[g];
        }
        let (sumqx, sumq2) = fit(&id);
        for g in 0..K {
            if sumq2[g] > 0.0 && sumqx[g] * sumqx[g] > best[g] * sumq2[g] {
                d[g] = sumqx[g] / sumq2[g];
                best[g] = d[g] * sumqx[g];
            }
        }
    }
    for g in 0..K {
        if amax[g] < GROUP_MAX_EPS {
            d[g] = 0.0;
        }
    }
    d
}

fn pack(l: &[u8], qs: &mut [u8]) {
    for (i, q) in qs.chunks_exact_mut(16).enumerate() {
        for j in 0..16 {
            q[j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

/// IQ4_NL for a whole row: 32-weight blocks, each with an f16 scale and grid
/// indices. Blocks are independent, so eight at a time go through the scale
/// search side by side (the rest one by one).
#[inline(always)]
pub(crate) fn iq4_nl_row(x: &[f32], y: &mut [BlockIq4Nl], qw: Option<&[f32]>) {
    let mut done = 0;
    for (xs, ys) in x.chunks_exact(256).zip(y.chunks_exact_mut(8)) {
        let mut w = [0f32; 256];
        for (b, wb) in w.chunks_exact_mut(32).enumerate() {
            wb.copy_from_slice(&weights(
                &xs[32 * b..32 * b + 32],
                qw.map(|q| &q[done + 32 * b..]),
            ));
        }
        let scales = group_scales::<8>(&lanes::transpose(xs), &lanes::transpose(&w));
        for (b, yb) in ys.iter_mut().enumerate() {
            write_nl_block(&xs[32 * b..32 * b + 32], scales[b], yb);
        }
        done += 256;
    }
    for (xb, yb) in x[done..].chunks_exact(32).zip(y[done / 32..].iter_mut()) {
        let w = weights(xb, qw.map(|q| &q[done..]));
        let scale = group_scales::<1>(&lanes::transpose(xb), &lanes::transpose(&w))[0];
        write_nl_block(xb, scale, yb);
        done += 32;
    }
}

fn write_nl_block(x: &[f32], scale: f32, y: &mut BlockIq4Nl) {
    y.d = F16::from_f32(scale);
    let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let mut l = [0u8; 32];
    for (l, &v) in l.iter_mut().zip(x) {
        *l = best_index(id * v);
    }
    pack(&l, &mut y.qs);
}

/// IQ4_XS: 8 groups of 32 with 6-bit scales against an f16 super-scale.
#[inline(always)]
pub(crate) fn iq4_xs(x: &[f32], y: &mut BlockIq4Xs, qw: Option<&[f32]>) {
    let w = weights(x, qw);
    let scales = group_scales::<8>(&lanes::transpose(x), &lanes::transpose(&w));
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for &d in &scales {
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let d = -max_scale / 32.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut l = [0u8; 256];
    let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
    for (ib, xb) in x.chunks_exact(32).enumerate() {
        let q = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * q as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for (j, &v) in xb.iter().enumerate() {
            l[32 * ib + j] = best_index(idl * v);
        }
        let q = (q + 32) as u8;
        scales_l[ib / 2] |= (q & 0xf) << (4 * (ib % 2));
        scales_h |= u16::from(q >> 4) << (2 * ib);
    }
    y.d = F16::from_f32(d);
    y.scales_h = scales_h.to_le_bytes();
    y.scales_l = scales_l;
    pack(&l, &mut y.qs);
}
