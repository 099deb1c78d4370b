//! The little linear algebra calibration needs: the Hessian `XᵀX` of a
//! layer's inputs, accumulated sample by sample, and the Cholesky factors
//! GPTQ works with. Dense, row-major, `f64` where precision matters
//! (factorisations) and `f32` where size does (the accumulated products are
//! summed per sample in `f32`, across samples in `f64`).

use rayon::prelude::*;

/// `Σ xᵀx` over the rows `x` of every input seen, and `Σ |x|` per column.
#[derive(Clone, Debug)]
pub struct Hessian {
    /// Columns.
    pub n: usize,
    /// Row-major `n × n` (only the lower triangle is accumulated until
    /// [`Hessian::full`]).
    pub h: Vec<f64>,
    /// Per column, the sum of absolute values.
    pub abs_sum: Vec<f64>,
    /// Rows (tokens) added.
    pub tokens: u64,
}

impl Hessian {
    /// An empty accumulator for inputs of `n` columns.
    pub fn new(n: usize) -> Self {
        Hessian {
            n,
            h: vec![0.0; n * n],
            abs_sum: vec![0.0; n],
            tokens: 0,
        }
    }

    /// Adds `rows` rows of `n` values.
    pub fn add(&mut self, x: &[f32], rows: usize) {
        let n = self.n;
        if rows == 0 || x.len() != rows * n {
            return;
        }
        // Columns contiguous, so each entry is one dot product of two slices.
        let mut t = vec![0f32; n * rows];
        for (r, row) in x.chunks_exact(n).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                t[c * rows + r] = v;
            }
        }
        let t = &t;
        self.h.par_chunks_mut(n).enumerate().for_each(|(i, out)| {
            let ci = &t[i * rows..(i + 1) * rows];
            for (j, o) in out.iter_mut().enumerate().take(i + 1) {
                *o += f64::from(dot(ci, &t[j * rows..(j + 1) * rows]));
            }
        });
        for (c, s) in self.abs_sum.iter_mut().enumerate() {
            *s += t[c * rows..(c + 1) * rows]
                .iter()
                .map(|v| f64::from(v.abs()))
                .sum::<f64>();
        }
        self.tokens += rows as u64;
    }

    /// The symmetric matrix (upper triangle filled from the lower).
    pub fn full(&self) -> Vec<f64> {
        let n = self.n;
        let mut h = self.h.clone();
        for i in 0..n {
            for j in i + 1..n {
                h[i * n + j] = h[j * n + i];
            }
        }
        h
    }

    /// Mean squared activation per column (the imatrix values).
    pub fn mean_square(&self) -> Vec<f32> {
        let t = self.tokens.max(1) as f64;
        (0..self.n)
            .map(|i| (self.h[i * self.n + i] / t) as f32)
            .collect()
    }

    /// Mean absolute activation per column (AWQ's activation statistic).
    pub fn mean_abs(&self) -> Vec<f32> {
        let t = self.tokens.max(1) as f64;
        self.abs_sum.iter().map(|&s| (s / t) as f32).collect()
    }
}

/// A dot product in `f32` with eight partial sums (vectorises well).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Lower Cholesky factor `L` of the symmetric positive definite `a`
/// (`a = L·Lᵀ`), or the column where it fails.
pub fn cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, usize> {
    let mut l = a.to_vec();
    cholesky_in_place(&mut l, n)?;
    for i in 0..n {
        l[i * n + i + 1..(i + 1) * n].fill(0.0);
    }
    Ok(l)
}

/// Overwrites the lower triangle (diagonal included) of `a` with its
/// Cholesky factor; the strict upper triangle keeps `a`'s values. Each entry
/// of `a` is read before it is overwritten, so this computes exactly what a
/// separate output would hold.
fn cholesky_in_place(a: &mut [f64], n: usize) -> Result<(), usize> {
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if d <= 0.0 || !d.is_finite() {
            return Err(j);
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        let (done, rest) = a.split_at_mut((j + 1) * n);
        let lj = &done[j * n..j * n + j];
        rest.par_chunks_mut(n).for_each(|row| {
            let s: f64 = row[..j].iter().zip(lj).map(|(x, y)| x * y).sum();
            row[j] = (row[j] - s) / d;
        });
    }
    Ok(())
}

/// The transpose of the inverse of the lower triangular `L` (stored in the
/// lower triangle of `l`): row `j` is the solution of `L·x = e_j`.
fn inverse_lower_transposed(l: &[f64], n: usize) -> Vec<f64> {
    let mut out = vec![0f64; n * n];
    out.par_chunks_mut(n).enumerate().for_each(|(j, x)| {
        x[j] = 1.0 / l[j * n + j];
        for i in j + 1..n {
            let s: f64 = (j..i).map(|k| l[i * n + k] * x[k]).sum();
            x[i] = -s / l[i * n + i];
        }
    });
    out
}

/// What GPTQ needs from the Hessian `h` (`n × n`, symmetric): the upper
/// Cholesky factor `U` of `(h + damp·I)⁻¹` (`(h + damp·I)⁻¹ = UᵀU`), in
/// `f32`, row-major. Fails with the column where `h + damp·I` is not
/// positive definite. Holds at most two `n × n` `f64` matrices at a time.
pub fn inverse_cholesky_upper(h: &[f64], n: usize, damp: f64) -> Result<Vec<f32>, usize> {
    let mut l = h.to_vec();
    for i in 0..n {
        l[i * n + i] += damp;
    }
    cholesky_in_place(&mut l, n)?;
    // (L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹: entry (i, j) is the dot product of columns i and j
    // of L⁻¹, which are rows of its transpose (contiguous).
    let lt = inverse_lower_transposed(&l, n);
    drop(l);
    let mut hinv = vec![0f64; n * n];
    hinv.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let ci = &lt[i * n..(i + 1) * n];
        for (j, out) in row.iter_mut().enumerate() {
            let k0 = i.max(j);
            let cj = &lt[j * n..(j + 1) * n];
            *out = ci[k0..].iter().zip(&cj[k0..]).map(|(a, b)| a * b).sum();
        }
    });
    drop(lt);
    // Upper factor of hinv = the transpose of its lower factor.
    cholesky_in_place(&mut hinv, n)?;
    let mut u = vec![0f32; n * n];
    for i in 0..n {
        for j in i..n {
            u[i * n + j] = hinv[j * n + i] as f32;
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spd(n: usize) -> Vec<f64> {
        let mut h = Hessian::new(n);
        let x = crate::test_values(n * 3 * n, 7);
        h.add(&x, 3 * n);
        h.full()
    }

    #[test]
    fn hessian_is_x_transpose_x() {
        let mut h = Hessian::new(2);
        h.add(&[1.0, 2.0, -3.0, 4.0], 2);
        assert_eq!(h.full(), vec![10.0, -10.0, -10.0, 20.0]);
        assert_eq!(h.mean_square(), vec![5.0, 10.0]);
        assert_eq!(h.mean_abs(), vec![2.0, 3.0]);
    }

    #[test]
    fn upper_factor_reconstructs_the_inverse() {
        let n = 20;
        let a = spd(n);
        let u = inverse_cholesky_upper(&a, n, 0.0).unwrap();
        // (UᵀU)·A = I.
        for i in 0..n {
            for j in 0..n {
                let mut v = 0f64;
                for k in 0..n {
                    let uu: f64 = (0..n)
                        .map(|m| f64::from(u[m * n + i]) * f64::from(u[m * n + k]))
                        .sum();
                    v += uu * a[k * n + j];
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((v - want).abs() < 1e-4, "{i},{j}: {v}");
            }
        }
    }

    #[test]
    fn a_singular_matrix_fails_with_its_column() {
        let a = vec![1.0, 1.0, 1.0, 1.0];
        assert_eq!(cholesky(&a, 2), Err(1));
        assert!(inverse_cholesky_upper(&a, 2, 0.1).is_ok());
    }
}
