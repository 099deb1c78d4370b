//! GPTQ (Frantar et al., arXiv 2210.17323) onto ggml block grids.
//!
//! Each row is quantized column by column; the rounding error of a column is
//! spread over the row's later columns in proportion to the inverse Hessian
//! of the layer's inputs, so that later roundings compensate it. The rows are
//! independent given the shared factor `U` (`H⁻¹ = UᵀU`), so they run in
//! parallel.
//!
//! What makes the result an ordinary ggml block: when the column index enters
//! a new block, that block's scales (and mins) are fixed by llama.cpp's own
//! importance-weighted encoder applied to the row's current, error-corrected
//! values — the "static groups" of GPTQ, one block at a time — and every
//! weight of the block is then rounded onto that block's grid ([`Grid`]) in
//! column order. Column order is never permuted (no act-order), so the layout
//! is unchanged. A lattice block's super-block scale is chosen by GPTQ itself
//! among multiples of the encoder's ([`SCALE_STEPS`]): the one under which
//! the block's choices lose least.
//!
//! Dampening is `damp · mean(diag H)` (default 0.01, as the GPTQ reference);
//! if the Cholesky factorisation fails it is retried with 0.01 more each
//! time (GPTQModel's `damp_auto_increment`), up to ten times. Columns no
//! calibration token reached (`H[i][i] = 0`) are set to 1 on the diagonal,
//! as in the reference.

use memwall_format::GgmlType;
use memwall_format::blocks::F16;
use memwall_quantize::{IMATRIX_ENCODABLE, quantize_row_imatrix, quantize_rows_imatrix};
use rayon::prelude::*;

use crate::CalibrateError;
use crate::grid::{GPTQ_TYPES, Grid};
use crate::lattice::{LATTICE_TYPES, LatticeGrid, UNIT, lattice_d, set_lattice_d};
use crate::linalg::{Hessian, inverse_cholesky_upper};

/// GPTQ settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// Dampening as a fraction of the mean Hessian diagonal.
    pub damp: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { damp: 0.01 }
    }
}

/// The factor GPTQ needs, prepared once per input (shared by every matrix
/// that reads the same input).
pub struct Prepared {
    /// Upper Cholesky factor of the dampened inverse Hessian.
    u: Vec<f32>,
    /// Columns no token reached.
    dead: Vec<bool>,
    /// The dampening that worked (fraction of the mean diagonal).
    pub damp: f64,
    /// How many larger dampenings were needed.
    pub retries: usize,
}

/// Prepares `h` for GPTQ; `what` names the input in errors. The factor is
/// made inside `h`'s matrix, which holds the same Hessian afterwards (its
/// strict upper triangle then mirrors the lower one).
pub fn prepare(
    h: &mut Hessian,
    settings: Settings,
    what: &str,
) -> Result<Prepared, CalibrateError> {
    let n = h.n;
    let mut dead = vec![false; n];
    let mut diag_sum = 0f64;
    for (i, d) in dead.iter_mut().enumerate() {
        let v = h.h[i * n + i];
        *d = v <= 0.0;
        diag_sum += if *d { 1.0 } else { v };
    }
    let mean = diag_sum / n.max(1) as f64;
    let mut damp = settings.damp;
    for retries in 0..=10 {
        match inverse_cholesky_upper(&mut h.h, n, damp * mean, &dead) {
            Ok(u) => {
                return Ok(Prepared {
                    u,
                    dead,
                    damp,
                    retries,
                });
            }
            Err(_) => damp += 0.01,
        }
    }
    Err(CalibrateError::Input(format!(
        "{what}: the Hessian stays singular up to dampening {damp:.2} (too few or degenerate calibration tokens; use more samples)"
    )))
}

/// Rows quantized together (see [`quantize`]).
const ROWS: usize = 32;

/// `x[i] -= e · f[i]`: a multiply then a subtraction per value (no fused
/// operation), so every vector width gives the same bits.
fn subtract_scaled(x: &mut [f32], e: f32, f: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { subtract_scaled_avx2(x, e, f) };
    }
    subtract_scaled_portable(x, e, f)
}

#[inline(always)]
fn subtract_scaled_portable(x: &mut [f32], e: f32, f: &[f32]) {
    for (x, f) in x.iter_mut().zip(f) {
        *x -= e * f;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn subtract_scaled_avx2(x: &mut [f32], e: f32, f: &[f32]) {
    subtract_scaled_portable(x, e, f)
}

/// Quantizes `w` (`rows × cols`, row-major) to `ty` with GPTQ, given the
/// prepared Hessian of its input and the per-column importance `imatrix`
/// (mean squared activation) for the block encoder. Types GPTQ cannot place
/// levels for are encoded by the importance-weighted encoder alone.
pub fn quantize(
    w: &[f32],
    rows: usize,
    cols: usize,
    ty: GgmlType,
    prepared: &Prepared,
    imatrix: &[f32],
) -> Result<Vec<u8>, CalibrateError> {
    let row_bytes = ty
        .tensor_size(&[cols as u64])
        .map_err(|e| CalibrateError::Input(e.to_string()))?
        .bytes as usize;
    let weights = IMATRIX_ENCODABLE.contains(&ty).then_some(imatrix);
    let mut out = vec![0u8; rows * row_bytes];
    let lattice = LATTICE_TYPES.contains(&ty);
    if !GPTQ_TYPES.contains(&ty) && !lattice {
        out.par_chunks_mut(row_bytes)
            .zip(w.par_chunks(cols))
            .try_for_each(|(o, r)| quantize_row_imatrix(ty, r, o, weights))
            .map_err(|e| CalibrateError::Input(e.to_string()))?;
        return Ok(out);
    }
    let bs = ty.block_size() as usize;
    let block_bytes = ty.type_size() as usize;
    let u = &prepared.u;
    // Rows in groups, column by column within a group, so that each row of
    // `U` is read once per group (it is too large for the caches of wide
    // inputs). Every row still sees its own operations in the same order.
    out.par_chunks_mut(row_bytes * ROWS)
        .zip(w.par_chunks(cols * ROWS))
        .try_for_each(|(o, src)| -> Result<(), CalibrateError> {
            let n = src.len() / cols;
            let mut wr: Vec<f32> = src
                .chunks_exact(cols)
                .flat_map(|r| r.iter().zip(&prepared.dead))
                .map(|(&v, &d)| if d { 0.0 } else { v })
                .collect();
            let mut grids = Vec::with_capacity(n);
            let no_grid = || CalibrateError::Input(format!("no grid for {ty}"));
            // Block `k` of every row of the group, encoded together (each
            // as its own row of one block) through these two buffers.
            let (mut block_in, mut block_out) = (vec![0f32; n * bs], vec![0u8; n * block_bytes]);
            for k in 0..cols / bs {
                let cols_k = k * bs..(k + 1) * bs;
                grids.clear();
                for (r, x) in block_in.chunks_exact_mut(bs).enumerate() {
                    x.copy_from_slice(&wr[r * cols + cols_k.start..r * cols + cols_k.end]);
                }
                quantize_rows_imatrix(
                    ty,
                    &block_in,
                    bs,
                    &mut block_out,
                    weights.map(|m| &m[cols_k.clone()]),
                )
                .map_err(|e| CalibrateError::Input(e.to_string()))?;
                for (r, encoded) in block_out.chunks_exact(block_bytes).enumerate() {
                    let bytes = &mut o[r * row_bytes + k * block_bytes..][..block_bytes];
                    bytes.copy_from_slice(encoded);
                    if !lattice {
                        grids.push(Grid::read(ty, bytes).ok_or_else(no_grid)?);
                    }
                }
                if lattice {
                    for r in 0..n {
                        let row = &mut wr[r * cols..(r + 1) * cols];
                        let bytes = &mut o[r * row_bytes + k * block_bytes..][..block_bytes];
                        lattice_block(ty, bytes, row, cols_k.start, u, cols, &SCALE_STEPS)
                            .ok_or_else(no_grid)?;
                    }
                    continue;
                }
                for i in cols_k.clone() {
                    let j = i - k * bs;
                    let urow = &u[i * cols + i + 1..(i + 1) * cols];
                    let d = u[i * cols + i];
                    for (r, grid) in grids.iter_mut().enumerate() {
                        let row = &mut wr[r * cols..(r + 1) * cols];
                        let q = grid.nearest(j, row[i]);
                        grid.levels[j] = q;
                        let err = (row[i] - grid.value(j, q)) / d;
                        if err != 0.0 && err.is_finite() {
                            subtract_scaled(&mut row[i + 1..], err, urow);
                        }
                    }
                }
                for (r, grid) in grids.iter().enumerate() {
                    grid.pack(&mut o[r * row_bytes + k * block_bytes..][..block_bytes]);
                }
            }
            Ok(())
        })?;
    Ok(out)
}

/// The multiples of the encoder's super-block scale `d` that GPTQ tries for
/// each lattice block (the encoder's own first, so that it wins ties).
pub const SCALE_STEPS: [f32; 7] = [1.0, 0.8, 0.85, 0.9, 0.95, 1.05, 1.1];

/// One lattice super-block's choices under GPTQ with the grid `g`: the
/// block's 256 current values `seg` (changed in place as GPTQ changes them)
/// go eight columns at a time to their point(s) and signs
/// ([`LatticeGrid::choose`]), each column's error spread over the block's
/// later columns. Returns GPTQ's loss `Σ errᵢ²` and the errors
/// `errᵢ = (xᵢ − qᵢ) / U[i][i]`.
fn lattice_choices(
    g: &mut LatticeGrid,
    seg: &mut [f32; 256],
    c0: usize,
    u: &[f32],
    cols: usize,
) -> (f32, [f32; 256]) {
    let mut ug = [[0f32; UNIT]; UNIT];
    let mut errs = [0f32; 256];
    let mut loss = 0f32;
    for unit in 0..256 / UNIT {
        let l0 = UNIT * unit;
        let i0 = c0 + l0;
        for (j, r) in ug.iter_mut().enumerate() {
            r.copy_from_slice(&u[(i0 + j) * cols + i0..][..UNIT]);
        }
        g.choose(unit, &seg[l0..l0 + UNIT], &ug);
        for j in l0..l0 + UNIT {
            let i = c0 + j;
            let err = (seg[j] - g.value(j)) / u[i * cols + i];
            if err != 0.0 && err.is_finite() {
                errs[j] = err;
                loss += err * err;
                subtract_scaled(
                    &mut seg[j + 1..],
                    err,
                    &u[i * cols + i + 1..i * cols + c0 + 256],
                );
            }
        }
    }
    (loss, errs)
}

/// GPTQ over one lattice super-block of `row` (columns `c0..c0 + 256`),
/// whose block of type `ty` the encoder made in `bytes`: the block's choices
/// are made under each of `steps` times the encoder's `d` (the same `d`
/// once), the one of least GPTQ loss kept (its `d` written into `bytes`, its
/// points and signs packed, its sub-block scales as the encoder chose them),
/// and its columns' errors spread over the row's later columns in column
/// order. `None` if the block cannot be read back.
fn lattice_block(
    ty: GgmlType,
    bytes: &mut [u8],
    row: &mut [f32],
    c0: usize,
    u: &[f32],
    cols: usize,
    steps: &[f32],
) -> Option<f32> {
    let d = lattice_d(ty, bytes)?;
    let d_times = |f: f32| F16::from_f32(d.to_f32() * f);
    let mut best: Option<(f32, F16, LatticeGrid, [f32; 256])> = None;
    for (k, &f) in steps.iter().enumerate() {
        let df = d_times(f);
        if !df.is_finite() || steps[..k].iter().any(|&e| d_times(e) == df) {
            continue;
        }
        set_lattice_d(ty, bytes, df)?;
        let mut c = LatticeGrid::read(ty, bytes)?;
        let mut seg = [0f32; 256];
        seg.copy_from_slice(&row[c0..c0 + 256]);
        let (loss, errs) = lattice_choices(&mut c, &mut seg, c0, u, cols);
        if best.as_ref().is_none_or(|b| loss < b.0) {
            best = Some((loss, df, c, errs));
        }
    }
    let (loss, df, chosen, errs) = best?;
    set_lattice_d(ty, bytes, df)?;
    chosen.pack(bytes);
    let tail = c0 + 256;
    for (j, &err) in errs.iter().enumerate() {
        let i = c0 + j;
        if err != 0.0 {
            subtract_scaled(&mut row[tail..], err, &u[i * cols + tail..(i + 1) * cols]);
        }
    }
    Some(loss)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memwall_format::blocks::dequantize_row;

    use crate::test_values as lcg;

    /// Σ_t ‖(W − Ŵ)·x_t‖² over the calibration rows.
    fn output_error(w: &[f32], q: &[f32], x: &[f32], rows: usize, cols: usize) -> f64 {
        let mut e = 0f64;
        for xt in x.chunks_exact(cols) {
            for r in 0..rows {
                let d: f32 = (0..cols)
                    .map(|c| (w[r * cols + c] - q[r * cols + c]) * xt[c])
                    .sum();
                e += f64::from(d * d);
            }
        }
        e
    }

    /// `tokens` inputs of `cols` channels, correlated in groups of eight
    /// with a few large channels, as real activations are; their Hessian
    /// prepared for GPTQ, and their mean squares.
    fn correlated_inputs(cols: usize, tokens: usize) -> (Vec<f32>, Prepared, Vec<f32>) {
        let base = lcg(tokens * cols, 9);
        let mut x = vec![0f32; tokens * cols];
        for t in 0..tokens {
            for c in 0..cols {
                let shared = base[t * cols + (c / 8) * 8];
                let big = if c % 37 == 0 { 8.0 } else { 1.0 };
                x[t * cols + c] = (0.6 * shared + 0.4 * base[t * cols + c]) * big;
            }
        }
        let mut h = Hessian::new(cols);
        h.add(
            &memwall_runtime::kernels::Kernels::detect(),
            None,
            &x,
            tokens,
        );
        let imatrix = h.mean_square();
        let prepared = prepare(&mut h, Settings::default(), "test").unwrap();
        (x, prepared, imatrix)
    }

    #[test]
    fn gptq_lowers_output_error_below_weighted_rounding_for_k_legacy_low_bit_and_lattice_types() {
        let (rows, cols, tokens) = (16, 256, 512);
        let w = lcg(rows * cols, 3);
        let (x, prepared, imatrix) = correlated_inputs(cols, tokens);
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::IQ4_XS,
            GgmlType::Q2_0,
            GgmlType::Q1_0,
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_XS,
            GgmlType::IQ2_S,
            GgmlType::IQ3_XXS,
            GgmlType::IQ3_S,
        ] {
            let rb = ty.tensor_size(&[cols as u64]).unwrap().bytes as usize;
            let decode = |bytes: &[u8]| {
                let mut v = vec![0f32; rows * cols];
                for (r, out) in v.chunks_exact_mut(cols).enumerate() {
                    dequantize_row(ty, &bytes[r * rb..(r + 1) * rb], out).unwrap();
                }
                v
            };
            let mut rtn = vec![0u8; rows * rb];
            for r in 0..rows {
                let weights = IMATRIX_ENCODABLE.contains(&ty).then_some(&imatrix[..]);
                quantize_row_imatrix(
                    ty,
                    &w[r * cols..(r + 1) * cols],
                    &mut rtn[r * rb..(r + 1) * rb],
                    weights,
                )
                .unwrap();
            }
            let g = quantize(&w, rows, cols, ty, &prepared, &imatrix).unwrap();
            let e_rtn = output_error(&w, &decode(&rtn), &x, rows, cols);
            let e_gptq = output_error(&w, &decode(&g), &x, rows, cols);
            assert!(
                e_gptq < 0.8 * e_rtn,
                "{ty}: GPTQ {e_gptq} vs weighted rounding {e_rtn}"
            );
        }
    }

    #[test]
    fn a_lattice_block_takes_the_multiple_of_the_encoders_scale_of_least_gptq_loss() {
        let (rows, cols, tokens) = (32, 512, 512);
        let w = lcg(rows * cols, 4);
        let (_, prepared, imatrix) = correlated_inputs(cols, tokens);
        for ty in LATTICE_TYPES {
            let rb = ty.tensor_size(&[cols as u64]).unwrap().bytes as usize;
            let bb = ty.type_size() as usize;
            let mut moved = 0;
            for r in 0..rows {
                let src = &w[r * cols..(r + 1) * cols];
                let mut encoded = vec![0u8; rb];
                quantize_row_imatrix(ty, src, &mut encoded, Some(&imatrix)).unwrap();
                let block = &encoded[..bb];
                let d = lattice_d(ty, block).unwrap();
                let run = |steps: &[f32]| {
                    let (mut bytes, mut row) = (block.to_vec(), src.to_vec());
                    let loss = lattice_block(ty, &mut bytes, &mut row, 0, &prepared.u, cols, steps);
                    (loss.unwrap(), bytes, row)
                };
                let (own_loss, own_bytes, own_row) = run(&[1.0]);
                let (loss, bytes, row) = run(&SCALE_STEPS);
                // Only `d` is chosen: the sub-block scales stay the encoder's.
                assert_eq!(own_bytes[..2], block[..2], "{ty}");
                let chosen = lattice_d(ty, &bytes).unwrap();
                assert!(
                    SCALE_STEPS
                        .iter()
                        .any(|&f| F16::from_f32(d.to_f32() * f) == chosen),
                    "{ty}: d {chosen:?} is no multiple of {d:?}"
                );
                assert!(loss <= own_loss, "{ty}: {loss} > {own_loss}");
                // The values the row's later columns were moved by are the
                // chosen block's: the same as its own run's when d stays.
                if chosen == d {
                    assert_eq!(bytes, own_bytes, "{ty}");
                    assert_eq!(row, own_row, "{ty}");
                } else {
                    moved += 1;
                    assert!(loss < own_loss, "{ty}");
                    assert_ne!(row[256..], own_row[256..], "{ty}");
                }
            }
            assert!(moved > 0, "{ty}: the encoder's d won every block");
        }
    }

    #[test]
    fn dead_columns_are_zeroed_and_the_factorisation_survives() {
        let cols = 32;
        let mut x = lcg(64 * cols, 5);
        for row in x.chunks_exact_mut(cols) {
            row[3] = 0.0;
        }
        let mut h = Hessian::new(cols);
        h.add(&memwall_runtime::kernels::Kernels::detect(), None, &x, 64);
        let p = prepare(&mut h, Settings::default(), "test").unwrap();
        assert!(p.dead[3]);
        let w = vec![1.0f32; cols];
        let q = quantize(&w, 1, cols, GgmlType::Q8_0, &p, &h.mean_square()).unwrap();
        let mut v = vec![0f32; cols];
        dequantize_row(GgmlType::Q8_0, &q, &mut v).unwrap();
        assert_eq!(v[3], 0.0);
    }
}
