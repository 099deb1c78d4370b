//! IQ4_NL and IQ4_XS encoders, with or without an importance matrix, following ggml's
//! `quantize_row_iq4_nl_impl` as `llama-quantize` calls it (`quantize_iq4_nl` /
//! `quantize_iq4_xs`, 7 scale trials each way), in `f32` in ggml's order.

use memwall_runtime::blocks::{IQ4NL_GRID, f32_to_f16};

use crate::kquants::{GROUP_MAX_EPS, nearest_int};
use crate::legacy::signed_max;
use crate::weights::{importance, sum_squares};

const NTRY: i32 = 7;

/// Index of the grid value nearest to `x` (ties to the lower one), as ggml's
/// `best_index_int8` finds it.
fn best_index(x: f32) -> u8 {
    let v = |i: usize| f32::from(IQ4NL_GRID[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
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

/// Best scale of one 32-weight group under `weight`; `None` for an all-zero group.
fn group_scale(xb: &[f32], weight: &[f32]) -> Option<f32> {
    let max = signed_max(xb);
    if max.abs() < GROUP_MAX_EPS {
        return None;
    }
    let v0 = f32::from(IQ4NL_GRID[0]);
    let fit = |id: f32| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for (&x, &w) in xb.iter().zip(weight) {
            let q = f32::from(IQ4NL_GRID[usize::from(best_index(id * x))]);
            sumqx += w * q * x;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d0 = -max / v0;
    let (sumqx, sumq2) = fit(1.0 / d0);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let (sumqx, sumq2) = fit((itry as f32 + v0) / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    Some(d)
}

fn pack(l: &[u8], qs: &mut [u8]) {
    for (i, q) in qs.chunks_exact_mut(16).enumerate() {
        for j in 0..16 {
            q[j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

/// IQ4_NL: one 32-weight block, f16 scale, grid indices.
pub(crate) fn iq4_nl(x: &[f32], y: &mut [u8], qw: Option<&[f32]>) {
    let scale = group_scale(x, &weights(x, qw)).unwrap_or(0.0);
    y[..2].copy_from_slice(&f32_to_f16(scale).to_le_bytes());
    let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let l: Vec<u8> = x.iter().map(|&v| best_index(id * v)).collect();
    pack(&l, &mut y[2..18]);
}

/// IQ4_XS: 8 groups of 32 with 6-bit scales against an f16 super-scale.
pub(crate) fn iq4_xs(x: &[f32], y: &mut [u8], qw: Option<&[f32]>) {
    let w = weights(x, qw);
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for (ib, xb) in x.chunks_exact(32).enumerate() {
        let d = group_scale(xb, &w[32 * ib..32 * ib + 32]).unwrap_or(0.0);
        scales[ib] = d;
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
    y[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    y[2..4].copy_from_slice(&scales_h.to_le_bytes());
    y[4..8].copy_from_slice(&scales_l);
    pack(&l, &mut y[8..136]);
}
