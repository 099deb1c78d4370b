//! Encoders of the K-quants (256-weight super-blocks) without an importance
//! matrix, following ggml's `quantize_row_q{2,3,4,5,6}_K_ref` and their helpers
//! `make_qkx2_quants`, `make_q3_quants` and `make_qx_quants`
//! (`ggml/src/ggml-quants.c`). Every float expression is evaluated in `f32` in
//! ggml's order (ggml-base is built without FMA contraction), integers convert
//! as C's casts do, so the bytes are identical.

use memwall_format::blocks::{
    Block, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, F16, f16_to_f32, f32_to_f16,
    scale_min_k4,
};

use crate::lanes;
use crate::legacy::signed_max;
use crate::weights::{importance, sum, sum_squares};

/// ggml treats a group whose largest magnitude is below this as all zeros.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, by ggml's float trick (valid for |x| < 2^22).
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Fits `x ≈ scale · L − min` with `L` in `0..=nmax`, minimising the weighted
/// error over a sweep of `nstep + 1` candidate scales; returns `(scale, min)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(aux[i]) + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Symmetric fit `x ≈ scale · (L − nmax)` for Q6_K (`rmse_type` 1): weighted by
/// the importance `qw` when given, else by `x²`.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let weight = |i: usize, v: f32| qw.map_or(v * v, |q| q[i]);
    let max = signed_max(x);
    if max.abs() < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -nmax as f32 / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = quant(iscale, v);
        l_out[i] = (l + nmax) as i8;
        let w = weight(i, v);
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &v) in x.iter().enumerate() {
            let l = quant(iscale, v) as f32;
            let w = weight(i, v);
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &v) in x.iter().enumerate() {
                l_out[i] = (quant(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric fit for Q3_K with coordinate-descent refinement; `L` in `0..2·nmax`.
/// The readable one-group reference of `lanes::make_q3_quants` (tests compare them).
#[cfg_attr(not(test), allow(dead_code))]
#[inline(always)]
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let max = signed_max(x);
    if max.abs() < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -nmax as f32 / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    let mut l = [0i32; 16];
    for (i, &v) in x.iter().enumerate() {
        l[i] = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * l[i] as f32;
        suml2 += w * l[i] as f32 * l[i] as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let mut slx = sumlx - w * v * l[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * l[i] as f32 * l[i] as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for (out, &li) in l_out.iter_mut().zip(&l) {
        *out = (li + nmax) as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Fits the non-negative group scales (or mins) of a K-quant block with integers
/// in `0..=nmax` under weights `qw` (the groups' weight sums); ggml's
/// `make_qp_quants`, used on the importance-matrix path.
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], l_out: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let max = x.iter().fold(0f32, |m, &v| if v > m { v } else { m });
    if max < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        // C assigns the unclamped value to a uint8_t.
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * f32::from(l_out[i]);
        best_mse += qw[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    // ggml keeps the levels in a `uint8_t` array: a negative level (the
    // lattice i-quants pass one negative magnitude) is summed as itself here
    // but read back as its byte, 256 − |l|, below; both as ggml does.
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        let w = qw[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for i in 0..n {
            let w = qw[i];
            let li = f32::from(l_out[i]);
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != i32::from(l_out[i]) {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Packs four 2-bit planes of 128 weights the way Q2_K and Q3_K store them.
fn pack_2bit(l: &[u8; 256], qs: &mut [u8]) {
    for j in (0..256).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// Q2_K: 16 groups of 16, 4-bit scales and mins against f16 super-scales.
#[inline(always)]
pub(crate) fn q2_k(x: &[f32], y: &mut BlockQ2K, qw: Option<&[f32]>) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; 256];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let mut sc = [0u8; 16];
    let (d, dmin) = match qw {
        None => {
            let (mut max_scale, mut max_min) = (0f32, 0f32);
            let xt = lanes::transpose::<16, 16>(x);
            let wt = xt.map(|row| row.map(f32::abs));
            let mut lt = [[0u8; 16]; 16];
            let (fs, fm) =
                lanes::make_qkx2_quants::<16, 16>(3, &xt, &wt, &mut lt, -0.5, 0.1, 15, true);
            untranspose(&lt, &mut l);
            for j in 0..16 {
                let (s, m) = (fs[j], fm[j]);
                scales[j] = s;
                mins[j] = m;
                max_scale = if s > max_scale { s } else { max_scale };
                max_min = if m > max_min { m } else { max_min };
            }
            let d = if max_scale > 0.0 {
                let iscale = Q4SCALE / max_scale;
                for j in 0..16 {
                    sc[j] = nearest_int(iscale * scales[j]) as u8;
                }
                f32_to_f16(max_scale / Q4SCALE)
            } else {
                f32_to_f16(0.0)
            };
            let dmin = if max_min > 0.0 {
                let iscale = Q4SCALE / max_min;
                for j in 0..16 {
                    sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
                }
                f32_to_f16(max_min / Q4SCALE)
            } else {
                f32_to_f16(0.0)
            };
            (d, dmin)
        }
        Some(qw) => {
            // ggml's quantize_row_q2_K_impl: σ² is the plain mean square here.
            let sum_x2 = sum_squares(x);
            let sigma2 = sum_x2 / 256.0;
            let mut sw = [0f32; 16];
            for j in 0..16 {
                let xs = &x[16 * j..16 * j + 16];
                let w = importance(xs, &qw[16 * j..], sigma2);
                sw[j] = sum(&w);
                let lj = &mut l[16 * j..16 * j + 16];
                (scales[j], mins[j]) = make_qkx2_quants(3, xs, &w, lj, -0.9, 0.05, 36, false);
            }
            let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
            let dm = make_qp_quants(15, &scales, &mut ls, &sw);
            let mm = make_qp_quants(15, &mins, &mut lm, &sw);
            for j in 0..16 {
                sc[j] = ls[j] | (lm[j] << 4);
            }
            (f32_to_f16(dm), f32_to_f16(mm))
        }
    };
    for j in 0..16 {
        let dj = f16_to_f32(d) * f32::from(sc[j] & 0xf);
        if dj == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * f32::from(sc[j] >> 4);
        for i in 0..16 {
            l[16 * j + i] = nearest_int((x[16 * j + i] + dm) / dj).clamp(0, 3) as u8;
        }
    }
    y.scales = sc;
    pack_2bit(&l, &mut y.qs);
    y.d = F16::from_bits(d);
    y.dmin = F16::from_bits(dmin);
}

/// Q3_K: 16 groups of 16, signed 6-bit scales, the third bit in `hmask`.
#[inline(always)]
pub(crate) fn q3_k(x: &[f32], y: &mut BlockQ3K, qw: Option<&[f32]>) {
    let mut l = [0i8; 256];
    let mut scales = [0f32; 16];
    let mut packed = [0u8; 12];
    // Packs a 6-bit scale (already offset by 32) of group `j`.
    let mut pack = |j: usize, q: u8| {
        if j < 8 {
            packed[j] = q & 0xf;
        } else {
            packed[j - 8] |= (q & 0xf) << 4;
        }
        packed[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
    };
    let d = match qw {
        None => {
            let (mut max_scale, mut amax) = (0f32, 0f32);
            // The 16 group fits run side by side (see `lanes`).
            let mut lt = [[0i8; 16]; 16];
            scales = lanes::make_q3_quants::<16, 16>(4, &lanes::transpose(x), &mut lt);
            untranspose(&lt, &mut l);
            for &s in &scales {
                if s.abs() > amax {
                    amax = s.abs();
                    max_scale = s;
                }
            }
            if max_scale != 0.0 {
                let iscale = -32.0 / max_scale;
                for (j, &scale) in scales.iter().enumerate() {
                    // C stores nearest_int's result in an int8_t before clamping.
                    let q = (nearest_int(iscale * scale) as i8).clamp(-32, 31) + 32;
                    pack(j, q as u8);
                }
                f32_to_f16(1.0 / iscale)
            } else {
                f32_to_f16(0.0)
            }
        }
        Some(qw) => {
            // ggml's quantize_row_q3_K_impl: weighted group fits, then the 16 group
            // scales fitted as 6-bit integers weighted by the groups' weight sums.
            let sum_x2 = sum_squares(x);
            let sigma2 = 2.0 * sum_x2 / 256.0;
            let mut sw = [0f32; 16];
            for j in 0..16 {
                let xs = &x[16 * j..16 * j + 16];
                let w = importance(xs, &qw[16 * j..], sigma2);
                sw[j] = sum(&w);
                scales[j] = make_qx_quants(4, xs, &mut l[16 * j..16 * j + 16], Some(&w));
            }
            let mut ls = [0i8; 16];
            let d_block = make_qx_quants(32, &scales, &mut ls, Some(&sw));
            for (j, &q) in ls.iter().enumerate() {
                pack(j, q as u8);
            }
            f32_to_f16(d_block)
        }
    };
    for j in 0..16 {
        let low = if j < 8 {
            packed[j] & 0xf
        } else {
            packed[j - 8] >> 4
        };
        let sc = (low | (((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32;
        let dj = f16_to_f32(d) * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / dj).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut hmask = [0u8; 32];
    let mut lu = [0u8; 256];
    for (j, &v) in l.iter().enumerate() {
        let mut v = v as u8;
        if v > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        lu[j] = v;
    }
    y.hmask = hmask;
    pack_2bit(&lu, &mut y.qs);
    y.scales = packed;
    y.d = F16::from_bits(d);
}

/// Writes transposed group quants back in weight order: `l[g·N + i] = lt[i][g]`.
fn untranspose<T: Copy, const N: usize, const K: usize>(lt: &[[T; K]; N], l: &mut [T]) {
    for (i, row) in lt.iter().enumerate() {
        for (g, &v) in row.iter().enumerate() {
            l[g * N + i] = v;
        }
    }
}

/// Scales and mins of the 8 groups of a Q4_K/Q5_K block, packed into 12 bytes,
/// with the f16 super-scales. Shared by [`q4_k`] and [`q5_k`].
#[inline(always)]
fn pack_k4_scales(scales: &[f32; 8], mins: &[f32; 8]) -> ([u8; 12], u16, u16) {
    let max_scale = scales.iter().fold(0f32, |a, &s| if s > a { s } else { a });
    let max_min = mins.iter().fold(0f32, |a, &m| if m > a { m } else { a });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    (
        pack_k4_ints(&ls, &lm),
        f32_to_f16(max_scale / 63.0),
        f32_to_f16(max_min / 63.0),
    )
}

/// Packs 8 six-bit scales and mins into the 12 bytes of a Q4_K/Q5_K block.
fn pack_k4_ints(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
    q
}

/// The Q4_K/Q5_K pipeline: per-group fits, packed scales, final quants in `0..=nmax`.
/// Without an importance matrix this is `quantize_row_q{4,5}_K_ref` (`rmin`, `nstep`
/// per type); with one, `quantize_row_q{4,5}_K_impl`: weights `qw · √(σ² + x²)`, a
/// finer scale sweep, and the group scales fitted by [`make_qp_quants`].
#[inline(always)]
fn k4_quants(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    qw: Option<&[f32]>,
) -> ([u8; 256], [u8; 12], u16, u16) {
    let mut l = [0u8; 256];
    let (scales, mins);
    // The 8 group fits run side by side (see `lanes`): xt[i][j] is weight i of group j.
    let xt = lanes::transpose::<32, 8>(x);
    let mut lt = [[0u8; 8]; 32];
    let (packed, d, dmin) = match qw {
        None => {
            let mut sum_x2 = [0f32; 8];
            for row in &xt {
                for j in 0..8 {
                    sum_x2[j] += row[j] * row[j];
                }
            }
            let mut wt = [[0f32; 8]; 32];
            for (w, row) in wt.iter_mut().zip(&xt) {
                for j in 0..8 {
                    w[j] = (sum_x2[j] / 32.0).sqrt() + row[j].abs();
                }
            }
            (scales, mins) =
                lanes::make_qkx2_quants::<32, 8>(nmax, &xt, &wt, &mut lt, rmin, 0.1, nstep, false);
            untranspose(&lt, &mut l);
            pack_k4_scales(&scales, &mins)
        }
        Some(qw) => {
            let sum_x2 = sum_squares(x);
            let sigma2 = 2.0 * sum_x2 / 256.0;
            let qwt = lanes::transpose::<32, 8>(qw);
            let mut wt = [[0f32; 8]; 32];
            let mut sw = [0f32; 8];
            for (i, w) in wt.iter_mut().enumerate() {
                for j in 0..8 {
                    w[j] = qwt[i][j] * (sigma2 + xt[i][j] * xt[i][j]).sqrt();
                    sw[j] += w[j];
                }
            }
            (scales, mins) =
                lanes::make_qkx2_quants::<32, 8>(nmax, &xt, &wt, &mut lt, -0.9, 0.05, 36, false);
            untranspose(&lt, &mut l);
            let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
            let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
            let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
            (
                pack_k4_ints(&ls, &lm),
                f32_to_f16(d_block),
                f32_to_f16(m_block),
            )
        }
    };
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = f16_to_f32(d) * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * f32::from(m);
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (l, packed, d, dmin)
}

/// Q4_K: 8 groups of 32, 6-bit scales and mins.
#[inline(always)]
pub(crate) fn q4_k(x: &[f32], y: &mut BlockQ4K, qw: Option<&[f32]>) {
    let (l, packed, d, dmin) = k4_quants(x, 15, -1.0, 20, qw);
    y.d = F16::from_bits(d);
    y.dmin = F16::from_bits(dmin);
    y.scales = packed;
    for (c, q) in y.qs.chunks_exact_mut(32).enumerate() {
        for i in 0..32 {
            q[i] = l[64 * c + i] | (l[64 * c + i + 32] << 4);
        }
    }
}

/// Q5_K: Q4_K with 5-bit quants, the fifth bit in `qh`.
#[inline(always)]
pub(crate) fn q5_k(x: &[f32], y: &mut BlockQ5K, qw: Option<&[f32]>) {
    let (l, packed, d, dmin) = k4_quants(x, 31, -0.5, 15, qw);
    y.d = F16::from_bits(d);
    y.dmin = F16::from_bits(dmin);
    y.scales = packed;
    let mut qh = [0u8; 32];
    let (mut m1, mut m2) = (1u8, 2u8);
    for (c, ql) in y.qs.chunks_exact_mut(32).enumerate() {
        for j in 0..32 {
            let mut l1 = l[64 * c + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[64 * c + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
    y.qh = qh;
}

/// Q6_K: 16 groups of 16, signed 8-bit scales, 6-bit quants; the importance
/// matrix, when given, replaces `x²` as the weights of the group fits.
#[inline(always)]
pub(crate) fn q6_k(x: &[f32], y: &mut BlockQ6K, qw: Option<&[f32]>) {
    let mut l = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    // The 16 group fits run side by side (see `lanes`).
    let xt = lanes::transpose::<16, 16>(x);
    let wt = match qw {
        Some(q) => lanes::transpose::<16, 16>(q),
        None => xt.map(|row| row.map(|v| v * v)),
    };
    let mut lt = [[0i8; 16]; 16];
    let fitted = lanes::make_qx_quants::<16, 16>(32, &xt, &wt, &mut lt);
    untranspose(&lt, &mut l);
    for (ib, &s) in fitted.iter().enumerate() {
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        *y = BlockQ6K::zero();
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = f32_to_f16(1.0 / iscale);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    for j in 0..16 {
        let dj = f16_to_f32(d) * f32::from(sc[j]);
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    for n in 0..2 {
        let (lo, hi) = (
            &mut y.ql[64 * n..64 * n + 64],
            &mut y.qh[32 * n..32 * n + 32],
        );
        let lv = |k: usize| l[128 * n + k] as u8;
        for i in 0..32 {
            lo[i] = (lv(i) & 0xf) | ((lv(i + 64) & 0xf) << 4);
            lo[i + 32] = (lv(i + 32) & 0xf) | ((lv(i + 96) & 0xf) << 4);
            hi[i] = (lv(i) >> 4)
                | ((lv(i + 32) >> 4) << 2)
                | ((lv(i + 64) >> 4) << 4)
                | ((lv(i + 96) >> 4) << 6);
        }
    }
    y.scales = sc;
    y.d = F16::from_bits(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(
            [0.5, 1.5, 2.5, -0.5, -1.5, 2.4999, -7.6].map(nearest_int),
            [0, 2, 2, 0, -2, 2, -8]
        );
    }
}
