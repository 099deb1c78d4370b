//! The K-quant group fits, run on all groups of a super-block at once.
//!
//! ggml fits each group of 16 or 32 weights on its own, in loops whose sums
//! are serial chains of `f32` additions: fast code may not reorder them, or
//! the bytes change. But the groups are independent, so memwall runs the same
//! chain for `K` groups side by side: data is transposed so that `x[i][g]` is
//! weight `i` of group `g`, and every statement is a loop over `g` that the
//! compiler turns into vector instructions. Each lane performs exactly the
//! scalar operations, in the scalar order, so results are bit-identical to
//! the one-group functions in `kquants` (which remain the readable reference;
//! the tests compare both). Branches become per-lane selections.

use crate::kquants::nearest_int;

/// Transposes `K` consecutive groups of `N` weights: `out[i][g] = x[g·N + i]`.
#[inline(always)]
pub(crate) fn transpose<const N: usize, const K: usize>(x: &[f32]) -> [[f32; K]; N] {
    let mut out = [[0f32; K]; N];
    for (g, group) in x.chunks_exact(N).take(K).enumerate() {
        for (i, &v) in group.iter().enumerate() {
            out[i][g] = v;
        }
    }
    out
}

/// Per group: the largest magnitude and the signed value that has it (the
/// first on ties), as ggml's scans find them.
#[inline(always)]
pub(crate) fn signed_max<const N: usize, const K: usize>(
    x: &[[f32; K]; N],
) -> ([f32; K], [f32; K]) {
    let (mut amax, mut max) = ([0f32; K], [0f32; K]);
    for row in x {
        for g in 0..K {
            let a = row[g].abs();
            let bigger = amax[g] < a;
            amax[g] = if bigger { a } else { amax[g] };
            max[g] = if bigger { row[g] } else { max[g] };
        }
    }
    (amax, max)
}

/// [`crate::kquants::make_qkx2_quants`] for `K` groups of `N` weights:
/// returns each group's `(scale, −min)` and writes its quants to `l[i][g]`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn make_qkx2_quants<const N: usize, const K: usize>(
    nmax: i32,
    x: &[[f32; K]; N],
    w: &[[f32; K]; N],
    l: &mut [[u8; K]; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; K], [f32; K]) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = [0f32; K];
    for g in 0..K {
        sum_x[g] = sum_w[g] * x[0][g];
    }
    for i in 1..N {
        for g in 0..K {
            let v = x[i][g];
            min[g] = if v < min[g] { v } else { min[g] };
            max[g] = if v > max[g] { v } else { max[g] };
            sum_w[g] += w[i][g];
            sum_x[g] += w[i][g] * v;
        }
    }
    let mut flat = [false; K];
    let mut range = [0f32; K];
    for g in 0..K {
        min[g] = if min[g] > 0.0 { 0.0 } else { min[g] };
        flat[g] = max[g] == min[g];
        range[g] = max[g] - min[g];
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let nmaxf = nmax as f32;
    let mut iscale = [0f32; K];
    let mut scale = [0f32; K];
    for g in 0..K {
        iscale[g] = nmaxf / range[g];
        scale[g] = 1.0 / iscale[g];
    }
    let mut best_error = [0f32; K];
    for i in 0..N {
        for g in 0..K {
            let q = nearest_int(iscale[g] * (x[i][g] - min[g])).clamp(0, nmax);
            l[i][g] = q as u8;
            let diff = scale[g] * q as f32 + min[g] - x[i][g];
            best_error[g] += w[i][g] * err(diff);
        }
    }
    let mut aux = [[0u8; K]; N];
    for is in 0..=nstep {
        // As in ggml, a better fit's min takes part in the following candidates.
        for g in 0..K {
            iscale[g] = (rmin + rdelta * is as f32 + nmaxf) / (max[g] - min[g]);
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; K], [0f32; K], [0f32; K]);
        for i in 0..N {
            for g in 0..K {
                let q = nearest_int(iscale[g] * (x[i][g] - min[g])).clamp(0, nmax);
                aux[i][g] = q as u8;
                let (wi, lf) = (w[i][g], q as f32);
                sum_l[g] += wi * lf;
                sum_l2[g] += wi * lf * lf;
                sum_xl[g] += wi * lf * x[i][g];
            }
        }
        let mut this_scale = [0f32; K];
        let mut this_min = [0f32; K];
        let mut ok = [false; K];
        for g in 0..K {
            let det = sum_w[g] * sum_l2[g] - sum_l[g] * sum_l[g];
            ok[g] = det > 0.0;
            let s = (sum_w[g] * sum_xl[g] - sum_x[g] * sum_l[g]) / det;
            let m = (sum_l2[g] * sum_x[g] - sum_l[g] * sum_xl[g]) / det;
            let positive = m > 0.0;
            this_min[g] = if positive { 0.0 } else { m };
            this_scale[g] = if positive { sum_xl[g] / sum_l2[g] } else { s };
        }
        let mut cur_error = [0f32; K];
        for i in 0..N {
            for g in 0..K {
                let diff = this_scale[g] * f32::from(aux[i][g]) + this_min[g] - x[i][g];
                cur_error[g] += w[i][g] * err(diff);
            }
        }
        let mut better = [false; K];
        for g in 0..K {
            better[g] = ok[g] && cur_error[g] < best_error[g];
            if better[g] {
                best_error[g] = cur_error[g];
                scale[g] = this_scale[g];
                min[g] = this_min[g];
            }
        }
        for i in 0..N {
            for g in 0..K {
                l[i][g] = if better[g] { aux[i][g] } else { l[i][g] };
            }
        }
    }
    let mut neg_min = [0f32; K];
    for g in 0..K {
        if flat[g] {
            scale[g] = 0.0;
            neg_min[g] = -min_of_flat(x, g);
        } else {
            neg_min[g] = -min[g];
        }
    }
    for row in l.iter_mut() {
        for g in 0..K {
            row[g] = if flat[g] { 0 } else { row[g] };
        }
    }
    (scale, neg_min)
}

/// The clamped minimum of a flat group (all weights equal), recomputed for
/// the rare lanes that take the early exit of the scalar function.
fn min_of_flat<const N: usize, const K: usize>(x: &[[f32; K]; N], g: usize) -> f32 {
    let v = x[0][g];
    if v > 0.0 { 0.0 } else { v }
}

/// [`crate::kquants::make_qx_quants`] (`rmse_type` 1) for `K` groups of `N`
/// weights, weighted by `w` (the importance, or `x²`): returns each group's
/// scale and writes its quants (offset by `nmax`) to `l[i][g]`.
#[inline(always)]
pub(crate) fn make_qx_quants<const N: usize, const K: usize>(
    nmax: i32,
    x: &[[f32; K]; N],
    w: &[[f32; K]; N],
    l: &mut [[i8; K]; N],
) -> [f32; K] {
    let (amax, max) = signed_max(x);
    let nmaxf = nmax as f32;
    let mut iscale = [0f32; K];
    for g in 0..K {
        iscale[g] = -nmaxf / max[g];
    }
    let (sumlx, suml2) = qx_fit(nmax, x, w, &iscale, l);
    let mut scale = [0f32; K];
    let mut best = [0f32; K];
    for g in 0..K {
        scale[g] = if suml2[g] != 0.0 {
            sumlx[g] / suml2[g]
        } else {
            0.0
        };
        best[g] = scale[g] * sumlx[g];
    }
    let mut aux = [[0i8; K]; N];
    for is in (-9..=9).filter(|&s| s != 0) {
        for g in 0..K {
            iscale[g] = -(nmaxf + 0.1 * is as f32) / max[g];
        }
        let (sumlx, suml2) = qx_fit(nmax, x, w, &iscale, &mut aux);
        let mut better = [false; K];
        for g in 0..K {
            better[g] = suml2[g] > 0.0 && sumlx[g] * sumlx[g] > best[g] * suml2[g];
            if better[g] {
                scale[g] = sumlx[g] / suml2[g];
                best[g] = scale[g] * sumlx[g];
            }
        }
        for i in 0..N {
            for g in 0..K {
                l[i][g] = if better[g] { aux[i][g] } else { l[i][g] };
            }
        }
    }
    // Groups whose largest magnitude is negligible are all zeros.
    for g in 0..K {
        if amax[g] < crate::kquants::GROUP_MAX_EPS {
            scale[g] = 0.0;
            for row in l.iter_mut() {
                row[g] = 0;
            }
        }
    }
    scale
}

/// [`make_qx_quants`]' quantization of every group at its candidate scale:
/// the quants and the weighted sums Σwxq, Σwq². A function, not a closure,
/// so that it is inlined into the caller's wider target features.
#[inline(always)]
fn qx_fit<const N: usize, const K: usize>(
    nmax: i32,
    x: &[[f32; K]; N],
    w: &[[f32; K]; N],
    iscale: &[f32; K],
    l: &mut [[i8; K]; N],
) -> ([f32; K], [f32; K]) {
    let (mut sumlx, mut suml2) = ([0f32; K], [0f32; K]);
    for i in 0..N {
        for g in 0..K {
            let v = x[i][g];
            let q = nearest_int(iscale[g] * v).clamp(-nmax, nmax - 1);
            l[i][g] = (q + nmax) as i8;
            let (wi, qf) = (w[i][g], q as f32);
            sumlx[g] += wi * v * qf;
            suml2[g] += wi * qf * qf;
        }
    }
    (sumlx, suml2)
}

/// `make_q3_quants` (Q3_K without an importance matrix: a symmetric fit
/// weighted by `x²`, then up to 5 passes of coordinate descent) for `K`
/// groups of `N` weights. A pass that changes nothing leaves a group's state
/// as it was, so running more passes on groups that ggml would have stopped
/// early changes nothing; passes stop when no group changes.
#[inline(always)]
pub(crate) fn make_q3_quants<const N: usize, const K: usize>(
    nmax: i32,
    x: &[[f32; K]; N],
    l_out: &mut [[i8; K]; N],
) -> [f32; K] {
    let (amax, max) = signed_max(x);
    let mut iscale = [0f32; K];
    for g in 0..K {
        iscale[g] = -(nmax as f32) / max[g];
    }
    let mut l = [[0i32; K]; N];
    let (mut sumlx, mut suml2) = ([0f32; K], [0f32; K]);
    for i in 0..N {
        for g in 0..K {
            let v = x[i][g];
            let q = nearest_int(iscale[g] * v).clamp(-nmax, nmax - 1);
            l[i][g] = q;
            let w = v * v;
            sumlx[g] += w * v * q as f32;
            suml2[g] += w * q as f32 * q as f32;
        }
    }
    for _ in 0..5 {
        let mut changed = [false; K];
        for i in 0..N {
            for g in 0..K {
                let v = x[i][g];
                let w = v * v;
                let li = l[i][g] as f32;
                // The sums without weight i; ggml only goes on when the first is positive.
                let slx_without = sumlx[g] - w * v * li;
                let sl2_without = suml2[g] - w * li * li;
                let new_l = nearest_int(v * sl2_without / slx_without).clamp(-nmax, nmax - 1);
                let nl = new_l as f32;
                let slx = slx_without + w * v * nl;
                let sl2 = sl2_without + w * nl * nl;
                let accept = slx_without > 0.0
                    && new_l != l[i][g]
                    && sl2 > 0.0
                    && slx * slx * suml2[g] > sumlx[g] * sumlx[g] * sl2;
                if accept {
                    l[i][g] = new_l;
                    sumlx[g] = slx;
                    suml2[g] = sl2;
                }
                changed[g] |= accept;
            }
        }
        if !changed.iter().any(|&c| c) {
            break;
        }
    }
    let mut scale = [0f32; K];
    for g in 0..K {
        let zero = amax[g] < crate::kquants::GROUP_MAX_EPS;
        scale[g] = if zero || suml2[g] <= 0.0 {
            0.0
        } else {
            sumlx[g] / suml2[g]
        };
        for i in 0..N {
            l_out[i][g] = if zero { 0 } else { (l[i][g] + nmax) as i8 };
        }
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants;

    /// Deterministic pseudo-random rows with the awkward cases: zeros, flat
    /// groups, all-positive groups, tiny groups.
    fn rows() -> Vec<Vec<f32>> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let mut out = Vec::new();
        for kind in 0..8 {
            let mut r: Vec<f32> = (0..256).map(|_| next()).collect();
            match kind {
                1 => r[..32].fill(0.0),
                2 => r[32..64].fill(-0.25),
                3 => r.iter_mut().for_each(|v| *v = v.abs() + 0.1),
                4 => r[64..96].iter_mut().for_each(|v| *v *= 1e-20),
                5 => r.iter_mut().step_by(7).for_each(|v| *v = 0.0),
                _ => {}
            }
            out.push(r);
        }
        out
    }

    #[test]
    fn qkx2_lanes_equal_the_scalar_fits() {
        for (r, x) in rows().iter().enumerate() {
            for (nmax, rmin, rdelta, nstep, mad) in [
                (15, -1.0, 0.1, 20, false),
                (31, -0.5, 0.1, 15, false),
                (31, -0.9, 0.05, 36, false),
                (3, -0.5, 0.1, 15, true),
            ] {
                let w: Vec<f32> = x.iter().map(|v| v.abs() + 0.01).collect();
                let xt = transpose::<16, 16>(x);
                let wt = transpose::<16, 16>(&w);
                let mut lt = [[0u8; 16]; 16];
                let (s, m) =
                    make_qkx2_quants::<16, 16>(nmax, &xt, &wt, &mut lt, rmin, rdelta, nstep, mad);
                for g in 0..16 {
                    let mut l = [0u8; 16];
                    let xs = &x[16 * g..16 * g + 16];
                    let (s1, m1) = kquants::make_qkx2_quants(
                        nmax,
                        xs,
                        &w[16 * g..16 * g + 16],
                        &mut l,
                        rmin,
                        rdelta,
                        nstep,
                        mad,
                    );
                    assert_eq!(
                        (s[g].to_bits(), m[g].to_bits()),
                        (s1.to_bits(), m1.to_bits()),
                        "row {r} group {g} nmax {nmax}"
                    );
                    for i in 0..16 {
                        assert_eq!(lt[i][g], l[i], "row {r} group {g} weight {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn qx_lanes_equal_the_scalar_fits() {
        for (r, x) in rows().iter().enumerate() {
            for weighted in [false, true] {
                let qw: Vec<f32> = x.iter().map(|v| 0.5 + v * v * 3.0).collect();
                let xt = transpose::<16, 16>(x);
                let wt = if weighted {
                    transpose::<16, 16>(&qw)
                } else {
                    xt.map(|row| row.map(|v| v * v))
                };
                let mut lt = [[0i8; 16]; 16];
                let s = make_qx_quants::<16, 16>(32, &xt, &wt, &mut lt);
                for g in 0..16 {
                    let mut l = [0i8; 16];
                    let qwg = weighted.then(|| &qw[16 * g..16 * g + 16]);
                    let s1 = kquants::make_qx_quants(32, &x[16 * g..16 * g + 16], &mut l, qwg);
                    assert_eq!(s[g].to_bits(), s1.to_bits(), "row {r} group {g}");
                    for i in 0..16 {
                        assert_eq!(lt[i][g], l[i], "row {r} group {g} weight {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn q3_lanes_equal_the_scalar_fits() {
        for (r, x) in rows().iter().enumerate() {
            let xt = transpose::<16, 16>(x);
            let mut lt = [[0i8; 16]; 16];
            let s = make_q3_quants::<16, 16>(4, &xt, &mut lt);
            for g in 0..16 {
                let mut l = [0i8; 16];
                let s1 = kquants::make_q3_quants(4, &x[16 * g..16 * g + 16], &mut l);
                assert_eq!(s[g].to_bits(), s1.to_bits(), "row {r} group {g}");
                for i in 0..16 {
                    assert_eq!(lt[i][g], l[i], "row {r} group {g} weight {i}");
                }
            }
        }
    }
}
