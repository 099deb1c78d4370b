//! AWQ (Lin et al., arXiv 2306.00978): per-input-channel scales that move
//! quantization precision to the channels large activations hit.
//!
//! For a group of matrices that read the same input (the attention norm's
//! output for Q/K/V, the FFN norm's for gate/up, `ffn_up`'s rows for
//! `ffn_down`, V's rows for the attention output when shapes allow), the
//! weights' input columns are multiplied by `s` and the input divided by `s`
//! — folded into the operation that produces it — which leaves the float
//! model unchanged but changes what rounding loses. `s` is searched over
//! AutoAWQ's grid: `s = x̄^α / (w̄^(1−α) + 1e-4)` for α = 0, 1/n, …, (n−1)/n
//! (n = 20), normalised by `√(max·min)`, where `x̄` is the mean |activation|
//! per channel and `w̄` the mean of |w| / max |w| over 32-weight groups of
//! each row (AutoAWQ's `duo_scaling`). Unlike AutoAWQ, every candidate is
//! scored after encoding with the *actual ggml target type* (and its
//! importance weighting), and the error is the exact output error over all
//! calibration tokens, `Σ_rows Δwᵀ H Δw` with `H = XᵀX`; no scaling at all is
//! also a candidate, so AWQ never makes a group worse on the calibration set.
//!
//! With GPTQ, the caller leaves out the groups GPTQ puts on a codebook (the
//! lattice i-quants): the search scores the plain encoder, not GPTQ's own
//! choice of those points and scales.
//!
//! AutoAWQ's separate clipping search is not repeated: ggml's K-quant and
//! IQ4 encoders already search each block's scale (and min) for the lowest
//! importance-weighted error, which is what the clipping search does for
//! AutoAWQ's plain min/max groups.

use memwall_format::GgmlType;
use memwall_format::blocks::dequantize_row;
use memwall_quantize::{IMATRIX_ENCODABLE, quantize_row_imatrix};
use rayon::prelude::*;

use crate::CalibrateError;
use memwall_runtime::kernels::Kernels;

/// One matrix of a group: `rows × cols` weights (row-major) and its target type.
pub struct Linear<'a> {
    /// Tensor name (for errors).
    pub name: &'a str,
    /// Weights.
    pub w: &'a [f32],
    /// Rows.
    pub rows: usize,
    /// Target type.
    pub ty: GgmlType,
}

/// The chosen scales of a group.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// Per input channel (all 1 when no scaling won).
    pub scales: Vec<f32>,
    /// The exponent chosen, `None` for no scaling.
    pub alpha: Option<f32>,
    /// Output error with the chosen scales.
    pub error: f64,
    /// Output error without scaling.
    pub base_error: f64,
}

/// A group's Hessian in `f32` as the error scores read it.
#[derive(Clone, Copy, Debug)]
pub enum HessianF32<'a> {
    /// Row-major, `cols × cols`.
    Rows(&'a [f32]),
    /// As the product's tiles
    /// ([`ProductTiles`](memwall_runtime::kernels::ProductTiles); `cols` a
    /// multiple of 32):
    /// the products read it from consecutive memory, where a column tile of
    /// the row-major matrix would be copied for every block of rows.
    Tiles(&'a [f32]),
}

/// The output error `Σ_rows Δwᵀ H Δw` of quantizing the group with input
/// scales `s` (weights × s, encoded, decoded, ÷ s).
fn group_error(
    kernels: &Kernels,
    linears: &[Linear],
    cols: usize,
    h: HessianF32<'_>,
    imatrix: &[f32],
    s: &[f32],
) -> Result<f64, CalibrateError> {
    let scaled_imatrix: Vec<f32> = imatrix.iter().zip(s).map(|(m, s)| m / (s * s)).collect();
    let mut total = 0f64;
    for lin in linears {
        let ty = lin.ty;
        let rb = ty
            .tensor_size(&[cols as u64])
            .map_err(|e| CalibrateError::Input(format!("{}: {e}", lin.name)))?
            .bytes as usize;
        let weights = IMATRIX_ENCODABLE
            .contains(&ty)
            .then_some(&scaled_imatrix[..]);
        // Rows in blocks, so that H is read once per block (it is too large
        // for the caches of wide layers).
        const BLOCK: usize = 32;
        let e = lin
            .w
            .par_chunks(cols * BLOCK)
            .map(|rows| -> Result<f64, CalibrateError> {
                let mut deltas = Vec::with_capacity(rows.len());
                let mut ws = vec![0f32; cols];
                let mut back = vec![0f32; cols];
                let mut bytes = vec![0u8; rb];
                for row in rows.chunks_exact(cols) {
                    ws.iter_mut()
                        .zip(row.iter().zip(s))
                        .for_each(|(o, (w, s))| *o = w * s);
                    quantize_row_imatrix(ty, &ws, &mut bytes, weights)
                        .map_err(|e| CalibrateError::Input(format!("{}: {e}", lin.name)))?;
                    dequantize_row(ty, &bytes, &mut back)
                        .map_err(|e| CalibrateError::Input(format!("{}: {e}", lin.name)))?;
                    deltas.extend(back.iter().zip(s).zip(row).map(|((q, s), w)| q / s - w));
                }
                let m = deltas.len() / cols;
                // (Δw·H)[r][i], then Σ_i Δw[r][i]·(Δw·H)[r][i] per row.
                let mut dh = vec![0f32; m * cols];
                match h {
                    HessianF32::Rows(h) => {
                        kernels.product_f32(&deltas, m, cols, h, cols, 0..cols, &mut dh);
                    }
                    HessianF32::Tiles(t) => {
                        kernels.product_f32_packed(
                            &deltas,
                            m,
                            cols,
                            &[],
                            t,
                            cols,
                            0..cols,
                            &mut dh,
                        );
                    }
                }
                let sum: f64 = deltas
                    .iter()
                    .zip(&dh)
                    .map(|(&d, &p)| f64::from(d) * f64::from(p))
                    .sum();
                Ok(sum)
            })
            .collect::<Result<Vec<f64>, _>>()?
            // Summed in row order, so the choice does not depend on threads.
            .iter()
            .sum::<f64>();
        total += e;
    }
    Ok(total)
}

/// Searches the scales of a group whose input has `cols` channels, Hessian
/// `h` (`cols × cols`, f32), mean |activation| `x_abs` and mean squared
/// activation `imatrix` per channel, over `n_grid` exponents.
pub fn search(
    kernels: &Kernels,
    linears: &[Linear],
    cols: usize,
    h: HessianF32<'_>,
    x_abs: &[f32],
    imatrix: &[f32],
    n_grid: usize,
) -> Result<Choice, CalibrateError> {
    // Mean over rows of |w| / max |w| of its 32-weight group, per column.
    let mut w_mean = vec![0f64; cols];
    let mut rows = 0usize;
    for lin in linears {
        for row in lin.w.chunks_exact(cols) {
            for (g, chunk) in row.chunks(32).enumerate() {
                let max = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (j, v) in chunk.iter().enumerate() {
                    let r = if max > 0.0 { v.abs() / max } else { 0.0 };
                    w_mean[g * 32 + j] += f64::from(r);
                }
            }
            rows += 1;
        }
    }
    let w_mean: Vec<f32> = w_mean
        .iter()
        .map(|&v| (v / rows.max(1) as f64) as f32)
        .collect();
    // The candidates are scored on a sample of the group's rows: every
    // `stride`-th row of each matrix, at most SCORED_ROWS in all.
    let total: usize = linears.iter().map(|l| l.w.len() / cols).sum();
    let stride = total.div_ceil(SCORED_ROWS).max(1);
    let sampled: Vec<Vec<f32>> = linears
        .iter()
        .map(|l| {
            l.w.chunks_exact(cols)
                .step_by(stride)
                .flatten()
                .copied()
                .collect()
        })
        .collect();
    let sample: Vec<Linear> = linears
        .iter()
        .zip(&sampled)
        .map(|(l, w)| Linear {
            name: l.name,
            w,
            rows: w.len() / cols,
            ty: l.ty,
        })
        .collect();
    let scales = |alpha: f32| -> Option<Vec<f32>> {
        let mut s: Vec<f32> = x_abs
            .iter()
            .zip(&w_mean)
            .map(|(&x, &w)| (x.powf(alpha) / (w.powf(1.0 - alpha) + 1e-4)).max(1e-4))
            .collect();
        let (max, min) = s
            .iter()
            .fold((0f32, f32::INFINITY), |(a, b), &v| (a.max(v), b.min(v)));
        let norm = (max * min).sqrt();
        if !(norm > 0.0 && norm.is_finite()) {
            return None;
        }
        s.iter_mut().for_each(|v| *v /= norm);
        s.iter().all(|v| v.is_finite() && *v > 0.0).then_some(s)
    };
    let ones = vec![1f32; cols];
    let base = group_error(kernels, &sample, cols, h, imatrix, &ones)?;
    let mut best = Choice {
        scales: ones,
        alpha: None,
        error: base,
        base_error: base,
    };
    // Coarse to fine: every `step`-th exponent of the grid, then the ones
    // between the best of those and its coarse neighbours (the whole grid's
    // best when the error is unimodal in α, as it is in practice).
    let step = (n_grid / 5).max(1);
    let mut tried = vec![false; n_grid];
    let mut try_i = |i: usize, best: &mut Choice| -> Result<Option<f64>, CalibrateError> {
        if std::mem::replace(&mut tried[i], true) {
            return Ok(None);
        }
        let alpha = i as f32 / n_grid as f32;
        let Some(s) = scales(alpha) else {
            return Ok(None);
        };
        let e = group_error(kernels, &sample, cols, h, imatrix, &s)?;
        if e < best.error {
            *best = Choice {
                scales: s,
                alpha: Some(alpha),
                error: e,
                base_error: base,
            };
        }
        Ok(Some(e))
    };
    let mut coarse: Option<(usize, f64)> = None;
    for i in (0..n_grid).step_by(step) {
        if let Some(e) = try_i(i, &mut best)? {
            if coarse.is_none_or(|(_, b)| e < b) {
                coarse = Some((i, e));
            }
        }
    }
    if let Some((c, _)) = coarse {
        for i in c.saturating_sub(step - 1)..(c + step).min(n_grid) {
            try_i(i, &mut best)?;
        }
    }
    Ok(best)
}

/// Most rows of a group that score AWQ's candidates.
const SCORED_ROWS: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::Hessian;

    #[test]
    fn scales_help_when_a_few_channels_carry_large_activations() {
        let (rows, cols, tokens) = (32, 256, 256);
        let mut s = 1u32;
        let mut next = || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let w: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
        let x: Vec<f32> = (0..tokens * cols)
            .map(|i| next() * if i % cols % 50 == 0 { 30.0 } else { 1.0 })
            .collect();
        let mut h = Hessian::new(cols);
        let k = Kernels::detect();
        h.add(&k, None, &x, tokens);
        let hf: Vec<f32> = h.full().iter().map(|&v| v as f32).collect();
        let lin = [Linear {
            name: "w",
            w: &w,
            rows,
            ty: GgmlType::Q4_0,
        }];
        // Plain rounding (no importance weights) is where AWQ helps most.
        let flat = vec![1f32; cols];
        let c = search(
            &k,
            &lin,
            cols,
            HessianF32::Rows(&hf),
            &h.mean_abs(),
            &flat,
            20,
        )
        .unwrap();
        // The same choice, to the bit, from the Hessian's tiles alone.
        let mut tiles = memwall_runtime::kernels::ProductTiles::default();
        tiles.pack(&hf, cols, cols);
        let from_tiles = HessianF32::Tiles(tiles.tiles());
        assert_eq!(
            search(&k, &lin, cols, from_tiles, &h.mean_abs(), &flat, 20).unwrap(),
            c
        );
        assert!(c.alpha.is_some());
        assert!(
            c.error < 0.9 * c.base_error,
            "{} vs {}",
            c.error,
            c.base_error
        );
        // The big channels get larger scales.
        assert!(c.scales[0] > c.scales[1]);
    }
}
