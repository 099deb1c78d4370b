//! Encoders of the 1-bit lattice i-quants IQ1_S and IQ1_M, as ggml's
//! `quantize_row_iq1_s_impl` and `quantize_row_iq1_m_impl`
//! (`ggml/src/ggml-quants.c`), float for float in ggml's order.
//!
//! With three values `−1, 0, 1` (each shifted by ±0.125), the best split of
//! a group's sorted weights into three runs is found exhaustively from prefix
//! sums; the resulting level vectors are then moved onto the codebook
//! ([`iq1_book`]) through their neighbours where they are not points of it.

// The loops index several parallel arrays (values, weights, levels, signs) as
// ggml's do, which keeps the order of every float operation visible.
#![allow(clippy::needless_range_loop)]

use memwall_format::blocks::{BlockIq1M, BlockIq1S, F16, IQ1_DELTA};

use crate::kquants::nearest_int;
use crate::lattice::{Codebook, Values, cmax, iq1_book, sum_x2};

/// The grid values with the positive offset, by level.
const X_P: [f32; 3] = [-1.0 + IQ1_DELTA, IQ1_DELTA, 1.0 + IQ1_DELTA];
/// The grid values with the negative offset, by level.
const X_M: [f32; 3] = [-1.0 - IQ1_DELTA, -IQ1_DELTA, 1.0 - IQ1_DELTA];

/// The positions of `x` in ascending order of value, equal values in
/// position order (glibc's `qsort` merge-sorts arrays this small, stably).
fn ascending<const N: usize>(x: &[f32]) -> [usize; N] {
    let mut idx: [usize; N] = std::array::from_fn(|i| i);
    idx.sort_by(|&a, &b| x[a].partial_cmp(&x[b]).unwrap_or(std::cmp::Ordering::Equal));
    idx
}

/// Levels from a split of the sorted positions at `i1 ≤ i2`: 0 before `i1`,
/// 1 before `i2`, 2 after.
fn split_levels<const N: usize>(idx: &[usize; N], i1: usize, i2: usize) -> [i8; N] {
    let mut l = [0i8; N];
    for (j, &i) in idx.iter().enumerate() {
        l[i] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
    l
}

/// ggml's `iq1_find_best_neighbour2`: among the neighbours of `l`, the point
/// of least `Σ w·(scale·xg[level] − x)²` (the first of equals); its levels
/// go to `l`.
fn nearest(
    book: &Codebook<8>,
    l: &mut [i8],
    x: &[f32],
    w: &[f32],
    scale: f32,
    xg: &[f32; 3],
) -> u16 {
    // Every level vector the scans leave off the grid has neighbours
    // (ggml aborts otherwise).
    let p = book
        .best_neighbour(l, x, w, scale, Values::Levels(xg))
        .unwrap_or(0);
    l.copy_from_slice(&book.levels(p));
    p
}

/// The point of each 8 levels of `l` (neighbours searched with `xg(k)`),
/// and whether all were points already.
fn place<const G: usize>(
    book: &Codebook<8>,
    l: &mut [i8],
    x: &[f32],
    w: &[f32],
    scale: f32,
    xg: impl Fn(usize) -> &'static [f32; 3],
) -> ([u16; G], bool) {
    let mut index = [0u16; G];
    let mut all = true;
    for k in 0..G {
        let r = 8 * k..8 * k + 8;
        index[k] = match book.point(&l[r.clone()]) {
            Some(p) => p,
            None => {
                all = false;
                nearest(book, &mut l[r.clone()], &x[r.clone()], &w[r], scale, xg(k))
            }
        };
    }
    (index, all)
}

/// The scale refitted to the placed points: `Σ w·q·x / Σ w·q²` if both are
/// positive, else `scale`.
fn refit(
    book: &Codebook<8>,
    index: &[u16],
    x: &[f32],
    w: &[f32],
    scale: f32,
    xg: impl Fn(usize) -> &'static [f32; 3],
) -> f32 {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (k, &p) in index.iter().enumerate() {
        let lv = book.levels(p);
        for j in 0..8 {
            let (w, q) = (w[8 * k + j], xg(k)[lv[j] as usize]);
            sumqx += w * q * x[8 * k + j];
            sumq2 += w * q * q;
        }
    }
    if sumqx > 0.0 && sumq2 > 0.0 {
        sumqx / sumq2
    } else {
        scale
    }
}

fn max_abs(x: &[f32]) -> f32 {
    x.iter().skip(1).fold(x[0].abs(), |m, &v| cmax(m, v.abs()))
}

/// IQ1_S (needs importance weights): groups of 32, one offset sign each.
pub(crate) fn iq1_s(x: &[f32], y: &mut BlockIq1S, qw: &[f32]) {
    let book = iq1_book();
    let sigma2 = 2.0 * sum_x2(x) / 256.0;
    *y = BlockIq1S {
        d: F16::from_f32(0.0),
        qs: [0; 32],
        qh: [0; 16],
    };
    let mut qh = [0u16; 8];
    let mut scales = [0f32; 8];
    let mut shifts = [1i8; 8];
    let mut max_scale = 0f32;
    for ib in 0..8 {
        let xb = &x[32 * ib..][..32];
        let w: [f32; 32] =
            std::array::from_fn(|i| qw[32 * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt());
        if max_abs(xb) < 1e-12 {
            continue;
        }
        let idx = ascending::<32>(xb);
        let (mut sumx, mut sumw) = ([0f32; 33], [0f32; 33]);
        for (j, &i) in idx.iter().enumerate() {
            sumx[j + 1] = sumx[j] + w[i] * xb[i];
            sumw[j + 1] = sumw[j] + w[i];
        }
        let mut best_score = f32::MIN;
        let mut scale = max_abs(xb);
        let mut best: Option<(usize, usize, i8)> = None;
        for i1 in 0..=32 {
            for i2 in i1..=32 {
                for (xv, shift) in [(&X_P, 1i8), (&X_M, -1)] {
                    let sumqx = (sumx[i1] - sumx[0]) * xv[0]
                        + (sumx[i2] - sumx[i1]) * xv[1]
                        + (sumx[32] - sumx[i2]) * xv[2];
                    let sumq2 = (sumw[i1] - sumw[0]) * xv[0] * xv[0]
                        + (sumw[i2] - sumw[i1]) * xv[1] * xv[1]
                        + (sumw[32] - sumw[i2]) * xv[2] * xv[2];
                    if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        best = Some((i1, i2, shift));
                    }
                }
            }
        }
        let Some((i1, i2, mut shift)) = best else {
            continue;
        };
        let mut l = split_levels(&idx, i1, i2);
        if scale < 0.0 {
            l = l.map(|v| 2 - v);
            scale = -scale;
            shift = -shift;
        }
        let xx: &'static [f32; 3] = if shift == 1 { &X_P } else { &X_M };
        let (index, all) = place::<4>(book, &mut l, xb, &w, scale, |_| xx);
        if !all {
            scale = refit(book, &index, xb, &w, scale, |_| xx);
        }
        let mut h = 0u16;
        for k in 0..4 {
            y.qs[4 * ib + k] = index[k] as u8;
            h |= (index[k] >> 8) << (3 * k);
        }
        qh[ib] = h;
        scales[ib] = scale;
        shifts[ib] = shift;
        max_scale = cmax(max_scale, scale);
    }
    if max_scale != 0.0 {
        let d = max_scale / 15.0;
        y.d = F16::from_f32(d * 1.125);
        let id = 1.0 / d;
        for ib in 0..8 {
            let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7) as u16;
            if shifts[ib] == -1 {
                l |= 8;
            }
            qh[ib] |= l << 12;
        }
    }
    for (o, v) in y.qh.chunks_exact_mut(2).zip(qh) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// The offset signs of IQ1_M's two halves by `k` (0: +,+; 1: +,−; 2: −,+;
/// 3: −,−) as the grid values of half `h`.
fn half_values(k: u8, h: usize) -> &'static [f32; 3] {
    let negative = if h == 0 { k >= 2 } else { k % 2 == 1 };
    if negative { &X_M } else { &X_P }
}

/// IQ1_M: groups of 16, an offset sign per 8 weights, the f16 scale refitted
/// to the whole super-block and spread over the scale words' top nibbles.
pub(crate) fn iq1_m(x: &[f32], y: &mut BlockIq1M, qw: Option<&[f32]>) {
    let book = iq1_book();
    let sigma2 = 2.0 * sum_x2(x) / 256.0;
    *y = BlockIq1M {
        qs: [0; 32],
        qh: [0; 16],
        scales: [0; 8],
    };
    let weights = |ib: usize| -> [f32; 16] {
        let xb = &x[16 * ib..][..16];
        std::array::from_fn(|i| match qw {
            Some(qw) => qw[16 * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
            None => xb[i] * xb[i],
        })
    };
    let mut scales = [0f32; 16];
    let mut shifts = [0u8; 16];
    let mut max_scale = 0f32;
    let (p2, m2) = (X_P[2], X_M[2]);
    let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
    let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
    let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
    let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
    for ib in 0..16 {
        let xb = &x[16 * ib..][..16];
        let w = weights(ib);
        if max_abs(xb) < 1e-7 {
            continue;
        }
        let idx = ascending::<16>(xb);
        // Prefix sums per half: each half has its own offset sign.
        let (mut px, mut pw) = ([[0f32; 17]; 2], [[0f32; 17]; 2]);
        for (j, &i) in idx.iter().enumerate() {
            let h = usize::from(i >= 8);
            px[h][j + 1] = px[h][j] + w[i] * xb[i];
            px[1 - h][j + 1] = px[1 - h][j];
            pw[h][j + 1] = pw[h][j] + w[i];
            pw[1 - h][j + 1] = pw[1 - h][j];
        }
        let (txs, tws) = ([px[0][16], px[1][16]], [pw[0][16], pw[1][16]]);
        let mut best_score = f32::MIN;
        let mut scale = max_abs(xb);
        let mut best: Option<(usize, usize, u8)> = None;
        for i1 in 0..=16 {
            for i2 in i1..=16 {
                let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) =
                    ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
                for h in 0..2 {
                    let sx = px[h][i1] + px[h][i2];
                    qx_p[h] = txs[h] * p2 - sx;
                    qx_m[h] = txs[h] * m2 - sx;
                    q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                    q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                }
                let sumqx = [
                    qx_p[0] + qx_p[1],
                    qx_p[0] + qx_m[1],
                    qx_m[0] + qx_p[1],
                    qx_m[0] + qx_m[1],
                ];
                let sumq2 = [
                    q2_p[0] + q2_p[1],
                    q2_p[0] + q2_m[1],
                    q2_m[0] + q2_p[1],
                    q2_m[0] + q2_m[1],
                ];
                for k in 0..4 {
                    if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        best = Some((i1, i2, k as u8));
                    }
                }
            }
        }
        let Some((i1, i2, mut k)) = best else {
            continue;
        };
        let mut l = split_levels(&idx, i1, i2);
        if scale < 0.0 {
            l = l.map(|v| 2 - v);
            scale = -scale;
            k = 3 - k;
        }
        let (index, all) = place::<2>(book, &mut l, xb, &w, scale, |h| half_values(k, h));
        if !all {
            scale = refit(book, &index, xb, &w, scale, |h| half_values(k, h));
        }
        y.qs[2 * ib] = index[0] as u8;
        y.qs[2 * ib + 1] = index[1] as u8;
        y.qh[ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
        scales[ib] = scale;
        shifts[ib] = k;
        max_scale = cmax(max_scale, scale);
    }
    if max_scale == 0.0 {
        return;
    }
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let mut sc = [0u16; 4];
    let mut d = max_scale / 15.0;
    let id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for ib in 0..16 {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
        sc[ib / 4] |= (l as u16) << (3 * (ib % 4));
        y.qh[ib] |= MASKS[usize::from(shifts[ib])];
        let (xb, w) = (&x[16 * ib..][..16], weights(ib));
        for k in 0..2 {
            let xx = half_values(shifts[ib], k);
            let hi = (u16::from(y.qh[ib]) << (8 - 4 * k)) & 0x700;
            let lv = book.levels(u16::from(y.qs[2 * ib + k]) + hi);
            for j in 0..8 {
                let wj = w[8 * k + j];
                let q = xx[lv[j] as usize] * (2 * l + 1) as f32;
                sumqx += wj * q * xb[8 * k + j];
                sumq2 += wj * q * q;
            }
        }
    }
    if sumq2 > 0.0 {
        d = sumqx / sumq2;
    }
    for (o, v) in y.scales.chunks_exact_mut(2).zip(sc) {
        o.copy_from_slice(&v.to_le_bytes());
    }
    y.set_scale(F16::from_f32(d * 1.1125));
}
