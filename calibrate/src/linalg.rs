//! The little linear algebra calibration needs: the Hessian `XᵀX` of a
//! layer's inputs, accumulated sample by sample, and the Cholesky factors
//! GPTQ works with. Dense, row-major, `f64` where precision matters
//! (factorisations) and `f32` where size does (the accumulated products are
//! summed per sample in `f32`, across samples in `f64`).

use std::cell::RefCell;
use std::sync::Mutex;

use memwall_runtime::kernels::{Kernels, Pool, ProductTiles};
use rayon::prelude::*;

thread_local! {
    /// A thread's buffers for [`Hessian::add`]'s blocks: gathered columns, sums.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// The calling thread's copy of an input in the product's tiles, which
    /// every block of [`Hessian::add`] reads.
    static TILES: RefCell<ProductTiles> = RefCell::new(ProductTiles::default());
}

/// Rows of H per block of [`Hessian::add`] (six go through the product at
/// a time).
const BLOCK: usize = 36;

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
        // Zeros written, not only allocated: the first `add` reads each entry
        // before writing it, and a page of a fresh zeroed allocation that is
        // read first maps the shared zero page, so its first write faults a
        // second time and flushes the other cores' TLBs.
        let mut h = Vec::with_capacity(n * n);
        h.resize(n * n, 0.0);
        Hessian {
            n,
            h,
            abs_sum: vec![0.0; n],
            tokens: 0,
        }
    }

    /// Adds `rows` rows of `n` values: each entry's sum over the rows in
    /// `f32` ([`Kernels::product_f32`]: the same bits on every backend and
    /// thread count), added to the `f64` total. The blocks of rows go over
    /// `pool` (the forward pass's own threads, which calls this between its
    /// products: a second pool of threads would share the cores with its
    /// polling workers), or the calling thread alone.
    pub fn add(&mut self, kernels: &Kernels, pool: Option<&Pool>, x: &[f32], rows: usize) {
        let n = self.n;
        if rows == 0 || x.len() != rows * n {
            return;
        }
        // The input in the product's tiles, once for all blocks (each block
        // reads every tile up to its last row; in `x` a tile's rows lie a
        // whole row apart).
        TILES.with_borrow_mut(|tiles| {
            tiles.pack(x, rows, n);
            self.add_blocks(kernels, pool, x, tiles.tiles(), rows);
        });
        self.tokens += rows as u64;
    }

    /// [`Hessian::add`]'s blocks, `tiles` the input packed.
    fn add_blocks(
        &mut self,
        kernels: &Kernels,
        pool: Option<&Pool>,
        x: &[f32],
        tiles: &[f32],
        rows: usize,
    ) {
        let n = self.n;
        // Blocks of rows of H, each computing the columns up to its last row
        // (rounded up to whole tiles of the product: the upper triangle's
        // extra values are not kept), from its own columns of `x` gathered
        // as rows, whose absolute values it also sums ([`BLOCK`] rows).
        // Block `b`'s rows of H (`out`) and absolute sums (`abs`), through a
        // thread's buffers (kept: fresh ones of this size cost a page fault
        // per 4 KiB on every call).
        let block = |b: usize, (out, abs): (&mut [f64], &mut [f64])| {
            SCRATCH.with_borrow_mut(|(a, sums)| {
                let (i0, m) = (b * BLOCK, abs.len());
                a.resize(m * rows, 0.0);
                let a = &mut a[..m * rows];
                gather_columns(x, n, i0, a, abs);
                // Only the columns `..cols` are written, and only they are read.
                sums.resize(m * n, 0.0);
                let sums = &mut sums[..m * n];
                let cols = (i0 + m).next_multiple_of(32).min(n);
                kernels.product_f32_packed(a, m, rows, x, tiles, n, 0..cols, sums);
                accumulate(out, sums, n, i0);
            })
        };
        let blocks = self
            .h
            .chunks_mut(n * BLOCK)
            .zip(self.abs_sum.chunks_mut(BLOCK));
        match pool {
            Some(pool) => {
                // Each task takes its own block (the mutexes are never contended).
                let blocks: Vec<Mutex<_>> = blocks.map(Mutex::new).collect();
                pool.run(blocks.len(), &|b| {
                    let mut block_b = blocks[b].lock().unwrap_or_else(|e| e.into_inner());
                    let (out, abs) = &mut *block_b;
                    block(b, (out, abs));
                });
            }
            None => blocks.enumerate().for_each(|(b, o)| block(b, o)),
        }
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

/// Columns `i0..i0 + m` of `x` (rows of `n`) as the rows of `a` (`m` rows
/// of one value per row of `x`, every value written), and each column's
/// absolute values summed in row order, in `f64`, added to `abs` (`m` sums,
/// at most [`BLOCK`]). All the columns' sums go side by side (a loop the compiler
/// vectorizes), each the same chain of additions as alone.
fn gather_columns(x: &[f32], n: usize, i0: usize, a: &mut [f32], abs: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { gather_columns_avx2(x, n, i0, a, abs) };
    }
    gather_columns_portable(x, n, i0, a, abs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gather_columns_avx2(x: &[f32], n: usize, i0: usize, a: &mut [f32], abs: &mut [f64]) {
    gather_columns_portable(x, n, i0, a, abs)
}

#[inline(always)]
fn gather_columns_portable(x: &[f32], n: usize, i0: usize, a: &mut [f32], abs: &mut [f64]) {
    let m = abs.len();
    let rows = x.len() / n;
    let mut sums = [0f64; BLOCK];
    let sums = &mut sums[..m];
    for (r, row) in x.chunks_exact(n).enumerate() {
        let row = &row[i0..i0 + m];
        for (s, &v) in sums.iter_mut().zip(row) {
            *s += f64::from(v.abs());
        }
        for (j, &v) in row.iter().enumerate() {
            a[j * rows + r] = v;
        }
    }
    for (s, c) in abs.iter_mut().zip(sums.iter()) {
        *s += c;
    }
}

/// Adds the block's `f32` sums (`m` rows of `n`) to its rows of the `f64`
/// Hessian `out`, row `r` up to its diagonal (column `i0 + r`).
fn accumulate(out: &mut [f64], sums: &[f32], n: usize, i0: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { accumulate_avx2(out, sums, n, i0) };
    }
    accumulate_portable(out, sums, n, i0)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn accumulate_avx2(out: &mut [f64], sums: &[f32], n: usize, i0: usize) {
    accumulate_portable(out, sums, n, i0)
}

#[inline(always)]
fn accumulate_portable(out: &mut [f64], sums: &[f32], n: usize, i0: usize) {
    for (r, (o, s)) in out
        .chunks_exact_mut(n)
        .zip(sums.chunks_exact(n))
        .enumerate()
    {
        for (o, &s) in o[..=i0 + r].iter_mut().zip(&s[..=i0 + r]) {
            *o += f64::from(s);
        }
    }
}

/// `Σ a[i]·b[i]` in `f64`: sixteen partial sums (lane `k` takes the
/// products `16m + k`), added in a fixed tree, then the remainder in order.
/// Separate multiplies and adds, so the AVX2 build of the same loop gives
/// the same bits as the portable one.
fn dot64(a: &[f64], b: &[f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { dot64_avx2(a, b) };
    }
    dot64_portable(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot64_avx2(a: &[f64], b: &[f64]) -> f64 {
    dot64_portable(a, b)
}

#[inline(always)]
fn dot64_portable(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0f64; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..16 {
            acc[k] += x[k] * y[k];
        }
    }
    dot64_finish(&acc, ra, rb)
}

/// [`dot64`]'s end: the sixteen partial sums added in its tree, then the
/// products of the remainders `ra`, `rb` in order.
#[inline(always)]
fn dot64_finish(acc: &[f64; 16], ra: &[f64], rb: &[f64]) -> f64 {
    let mut half = [0f64; 8];
    for k in 0..8 {
        half[k] = acc[k] + acc[k + 8];
    }
    let q = [
        half[0] + half[4],
        half[1] + half[5],
        half[2] + half[6],
        half[3] + half[7],
    ];
    let mut s = (q[0] + q[2]) + (q[1] + q[3]);
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// [`dot64`] of each of `a` with `b` (each as long as `b`), with the bits
/// of [`dot64`] of each pair; with AVX-512, each chunk of `b` is loaded once
/// for all `M`, with AVX2 once for each two.
fn dot64_many<const M: usize>(a: [&[f64]; M], b: &[f64]) -> [f64; M] {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above).
        return unsafe { dot64_many_avx512(a, b) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        let mut out = [0f64; M];
        for (o, a) in out.chunks_mut(2).zip(a.chunks(2)) {
            match a {
                // SAFETY: AVX2 is present (checked above).
                [a0, a1] => o.copy_from_slice(&unsafe { dot64_two_avx2([a0, a1], b) }),
                [a0] => o[0] = dot64(a0, b),
                _ => unreachable!("chunks of at most two"),
            }
        }
        return out;
    }
    a.map(|a| dot64(a, b))
}

/// [`dot64`] of `a[0]` and of `a[1]` with `b`, the sixteen partial sums of
/// each pair in four registers (eight in all, the sixteen registers' most
/// with `b`'s and the products), each chunk of `b` loaded once for both: the
/// same multiplies and adds, lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot64_two_avx2(a: [&[f64]; 2], b: &[f64]) -> [f64; 2] {
    use std::arch::x86_64::*;
    let n = b.len();
    assert!(a.iter().all(|a| a.len() == n));
    let full = n / 16 * 16;
    let mut acc = [[_mm256_setzero_pd(); 4]; 2];
    for c in (0..full).step_by(16) {
        for q in 0..4 {
            // SAFETY: c + 4q + 4 <= full <= n, the length of every slice
            // (asserted).
            unsafe {
                let y = _mm256_loadu_pd(b.as_ptr().add(c + 4 * q));
                for (acc, a) in acc.iter_mut().zip(a) {
                    let x = _mm256_loadu_pd(a.as_ptr().add(c + 4 * q));
                    acc[q] = _mm256_add_pd(acc[q], _mm256_mul_pd(x, y));
                }
            }
        }
    }
    let mut out = [0f64; 2];
    for ((o, acc), a) in out.iter_mut().zip(&acc).zip(a) {
        let mut sums = [0f64; 16];
        for (q, &v) in acc.iter().enumerate() {
            // SAFETY: `sums` holds sixteen values, four from `4q`.
            unsafe { _mm256_storeu_pd(sums.as_mut_ptr().add(4 * q), v) };
        }
        *o = dot64_finish(&sums, &a[full..], &b[full..]);
    }
    out
}

/// [`dot64_many`] with the sixteen partial sums of each pair in two
/// registers: the same multiplies and adds, lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn dot64_many_avx512<const M: usize>(a: [&[f64]; M], b: &[f64]) -> [f64; M] {
    use std::arch::x86_64::*;
    let n = b.len();
    assert!(a.iter().all(|a| a.len() == n));
    let full = n / 16 * 16;
    let mut lo = [_mm512_setzero_pd(); M];
    let mut hi = [_mm512_setzero_pd(); M];
    for c in (0..full).step_by(16) {
        // SAFETY: c + 16 <= n, the length of every slice (asserted).
        unsafe {
            let y0 = _mm512_loadu_pd(b.as_ptr().add(c));
            let y1 = _mm512_loadu_pd(b.as_ptr().add(c + 8));
            for m in 0..M {
                let x0 = _mm512_loadu_pd(a[m].as_ptr().add(c));
                let x1 = _mm512_loadu_pd(a[m].as_ptr().add(c + 8));
                lo[m] = _mm512_add_pd(lo[m], _mm512_mul_pd(x0, y0));
                hi[m] = _mm512_add_pd(hi[m], _mm512_mul_pd(x1, y1));
            }
        }
    }
    let mut out = [0f64; M];
    for m in 0..M {
        let mut acc = [0f64; 16];
        // SAFETY: `acc` holds sixteen values.
        unsafe {
            _mm512_storeu_pd(acc.as_mut_ptr(), lo[m]);
            _mm512_storeu_pd(acc.as_mut_ptr().add(8), hi[m]);
        }
        out[m] = dot64_finish(&acc, &a[m][full..], &b[full..]);
    }
    out
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
/// Cholesky factor; the strict upper triangle keeps `a`'s values.
///
/// Blocked, right-looking: a block of columns is factored, the rows below
/// it are solved against its diagonal block, and their rank-`B` product is
/// taken from the rest, rows in groups that read each row of the block's
/// panel once (an unblocked factorisation reads the whole matrix once per
/// column, which at widths of 10⁴ is memory-bound). Independent of the
/// thread count.
fn cholesky_in_place(a: &mut [f64], n: usize) -> Result<(), usize> {
    const B: usize = 96;
    const GROUP: usize = 16;
    for k0 in (0..n).step_by(B) {
        let k1 = (k0 + B).min(n);
        // The diagonal block (its entries hold the earlier blocks' updates).
        for j in k0..k1 {
            let from_j = &mut a[j * n..];
            let lj = &from_j[k0..j];
            let d = from_j[j] - dot64(lj, lj);
            if d <= 0.0 || !d.is_finite() {
                return Err(j);
            }
            let d = d.sqrt();
            from_j[j] = d;
            let (row_j, below) = from_j.split_at_mut(n);
            let lj = &row_j[k0..j];
            for row in below.chunks_exact_mut(n).take(k1 - j - 1) {
                let s = dot64(&row[k0..j], lj);
                row[j] = (row[j] - s) / d;
            }
        }
        if k1 == n {
            break;
        }
        let w = k1 - k0;
        let (top, rest) = a.split_at_mut(k1 * n);
        let top = &*top;
        // The rows below, against the diagonal block.
        rest.par_chunks_mut(n).for_each(|row| {
            for j in k0..k1 {
                let s = dot64(&row[k0..j], &top[j * n + k0..j * n + j]);
                row[j] = (row[j] - s) / top[j * n + j];
            }
        });
        // Their product, taken from the trailing lower triangle.
        let panel: Vec<f64> = rest
            .chunks_exact(n)
            .flat_map(|r| r[k0..k1].iter().copied())
            .collect();
        rest.par_chunks_mut(n * GROUP)
            .enumerate()
            .for_each(|(g, rows)| {
                let i0 = g * GROUP;
                let nr = rows.len() / n;
                let pi = |r: usize| &panel[(i0 + r) * w..(i0 + r + 1) * w];
                for j in 0..i0 + nr {
                    let pj = &panel[j * w..(j + 1) * w];
                    let mut r = j.saturating_sub(i0);
                    while r + 4 <= nr {
                        let s = dot64_many([pi(r), pi(r + 1), pi(r + 2), pi(r + 3)], pj);
                        for (m, s) in s.into_iter().enumerate() {
                            rows[(r + m) * n + k1 + j] -= s;
                        }
                        r += 4;
                    }
                    for r in r..nr {
                        rows[r * n + k1 + j] -= dot64(pi(r), pj);
                    }
                }
            });
    }
    Ok(())
}

/// Columns of `L⁻¹` made together (each row of `L` is read once per group).
const INVERSE_GROUP: usize = 64;

/// Groups made at once by [`inverse_cholesky_upper`] before they are copied
/// into `U` (their buffers are `WAVE × INVERSE_GROUP × n` values).
const WAVE: usize = 32;

/// Columns `j0..j0 + xs.len() / n` of the inverse of the lower triangular
/// `L` (stored in the lower triangle of `l`), each as a row of `xs`: the
/// solution of `L·x = e_j`, by forward substitution,
/// `x[i] = −dot64(L[i][j..i], x[j..i]) / L[i][i]`; entries before `j` are
/// left as they are (zeros).
///
/// Columns `j`, `j + 16`, `j + 32` and `j + 48` make their dots together
/// over `j..i`: a later column's entries before its own start are zeros,
/// whose products add +0 to partial sums that are +0 there, and its chunks
/// of sixteen start on the same boundaries (sixteen apart), so each keeps
/// the bits of its own dot.
fn inverse_lower_columns(l: &[f64], n: usize, j0: usize, xs: &mut [f64]) {
    const STRIDE: usize = 16;
    let nc = xs.len() / n;
    for c in 0..nc {
        let j = j0 + c;
        xs[c * n + j] = 1.0 / l[j * n + j];
    }
    for i in j0 + 1..n {
        let li = &l[i * n..i * n + i + 1];
        for c in 0..STRIDE.min(nc) {
            let j = j0 + c;
            if i <= j {
                continue;
            }
            let set = [c, c + STRIDE, c + 2 * STRIDE, c + 3 * STRIDE];
            if set[3] < nc {
                let x = |m: usize| &xs[set[m] * n + j..set[m] * n + i];
                let s = dot64_many([x(0), x(1), x(2), x(3)], &li[j..i]);
                for (&c, s) in set.iter().zip(s) {
                    if i > j0 + c {
                        xs[c * n + i] = -s / li[i];
                    }
                }
            } else {
                for c in set.into_iter().filter(|&c| c < nc && i > j0 + c) {
                    let j = j0 + c;
                    let s = dot64(&li[j..i], &xs[c * n + j..c * n + i]);
                    xs[c * n + i] = -s / li[i];
                }
            }
        }
    }
}

/// The transpose of the inverse of the lower triangular `L` (stored in the
/// lower triangle of `l`): row `j` is column `j` of `L⁻¹`.
#[cfg(test)]
fn inverse_lower_transposed(l: &[f64], n: usize) -> Vec<f64> {
    let mut out = vec![0f64; n * n];
    out.par_chunks_mut(n * INVERSE_GROUP)
        .enumerate()
        .for_each(|(g, xs)| inverse_lower_columns(l, n, g * INVERSE_GROUP, xs));
    out
}

/// What GPTQ needs from the Hessian `h` (`n × n`, symmetric, its lower
/// triangle filled; the diagonal entries of the `dead` columns are taken as
/// 1): the upper Cholesky factor `U` of `(h + damp·I)⁻¹`
/// (`(h + damp·I)⁻¹ = UᵀU`), in `f32`, row-major. Fails with the column
/// where `h + damp·I` is not positive definite.
///
/// One factorisation and one triangular inverse: with `J` the reversal of
/// the indices, the lower factor `L` of `J(h + damp·I)J` gives
/// `h + damp·I = Ũ·Ũᵀ` with `Ũ = JLJ` upper triangular, so
/// `(h + damp·I)⁻¹ = Ũ⁻ᵀ·Ũ⁻¹` and `U = Ũ⁻¹ = J·L⁻¹·J` (the factor is
/// unique, so this is the `U` of factorising the inverse).
///
/// Memory: `L` is made in `h`'s own lower triangle, while its strict upper
/// triangle and a copy of its diagonal keep `h`; before returning (also on
/// failure) the lower triangle is `h`'s again, bit for bit, and the strict
/// upper triangle mirrors it. The columns of `L⁻¹` go into `U` a wave of
/// groups at a time: besides `h` and `U`, at most `WAVE × 64 × n` values
/// are held.
pub fn inverse_cholesky_upper(
    h: &mut [f64],
    n: usize,
    damp: f64,
    dead: &[bool],
) -> Result<Vec<f32>, usize> {
    let n1 = n.max(1);
    let diagonal: Vec<f64> = (0..n).map(|i| h[i * n + i]).collect();
    // The strict lower triangle, transposed into the strict upper one.
    mirror_lower(h, n);
    // Entry (i, j ≤ i) of J(h + damp·I)J is h(n−1−j, n−1−i), which the
    // strict upper triangle holds at (n−1−i, n−1−j).
    reverse_into_lower(h, n, &diagonal, dead, damp);
    let result = cholesky_in_place(h, n).map(|()| upper_factor(h, n, WAVE * INVERSE_GROUP));
    // h again: its lower triangle from the upper, its diagonal from the copy.
    h.par_chunks_mut(n1).enumerate().for_each(|(i, row)| {
        row[i] = diagonal[i];
    });
    restore_lower(h, n);
    result.map_err(|j| n - 1 - j)
}

/// Bytes [`inverse_cholesky_upper`] holds besides the Hessian of an input
/// `n` wide: `U` and one wave of the inverse's columns.
pub fn factor_bytes(n: usize) -> u64 {
    let n = n as u64;
    n * n * 4 + ((WAVE * INVERSE_GROUP) as u64).min(n) * n * 8
}

/// `U = J·L⁻¹·J` in `f32` from the lower factor `L` in `l`: the columns of
/// `L⁻¹` are made `span` at a time (a multiple of the group) and copied
/// into `U`, `U[n−1−m][n−1−r] = L⁻¹[m][r]` for `m ≥ r`.
fn upper_factor(l: &[f64], n: usize, span: usize) -> Vec<f32> {
    let n1 = n.max(1);
    let mut u = vec![0f32; n * n];
    let mut wave = vec![0f64; span.min(n) * n];
    for w0 in (0..n).step_by(span.max(1)) {
        let cols = span.min(n - w0);
        let xs = &mut wave[..cols * n];
        xs.fill(0.0);
        xs.par_chunks_mut(n1 * INVERSE_GROUP)
            .enumerate()
            .for_each(|(g, xs)| inverse_lower_columns(l, n, w0 + g * INVERSE_GROUP, xs));
        let xs = &*xs;
        u.par_chunks_mut(n1).enumerate().for_each(|(i, row)| {
            let m = n - 1 - i;
            for c in 0..cols.min((m + 1).saturating_sub(w0)) {
                row[n - 1 - (w0 + c)] = xs[c * n + m] as f32;
            }
        });
    }
    u
}

/// Tile edge of the triangle copies (a tile of each side stays in cache).
const TILE: usize = 64;

/// Copies the strict lower triangle of `a` into the strict upper one.
fn mirror_lower(a: &mut [f64], n: usize) {
    copy_triangle(a, n, true);
}

/// Copies the strict upper triangle of `a` into the strict lower one.
fn restore_lower(a: &mut [f64], n: usize) {
    copy_triangle(a, n, false);
}

/// `a[j][i] = a[i][j]` for every `i > j` (`up` false: the other way), tile
/// by tile.
fn copy_triangle(a: &mut [f64], n: usize, up: bool) {
    for i0 in (0..n).step_by(TILE) {
        for j0 in (0..=i0).step_by(TILE) {
            for i in i0..(i0 + TILE).min(n) {
                for j in j0..(j0 + TILE).min(i) {
                    if up {
                        a[j * n + i] = a[i * n + j];
                    } else {
                        a[i * n + j] = a[j * n + i];
                    }
                }
            }
        }
    }
}

/// Writes the lower triangle (diagonal included) of `J(h + damp·I)J` into
/// `a`, reading `h`'s off-diagonal entries from `a`'s strict upper triangle
/// and its diagonal from `diagonal`; `dead` columns have 1 on the diagonal.
fn reverse_into_lower(a: &mut [f64], n: usize, diagonal: &[f64], dead: &[bool], damp: f64) {
    for i in 0..n {
        for j in 0..i {
            // h(n−1−j, n−1−i), held at (n−1−i, n−1−j) in the upper triangle.
            a[i * n + j] = a[(n - 1 - i) * n + (n - 1 - j)];
        }
        let d = n - 1 - i;
        let v = if dead.get(d).copied().unwrap_or(false) {
            1.0
        } else {
            diagonal[d]
        };
        a[i * n + i] = v + damp;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spd(n: usize) -> Vec<f64> {
        let mut h = Hessian::new(n);
        let x = crate::test_values(n * 3 * n, 7);
        h.add(&Kernels::detect(), None, &x, 3 * n);
        h.full()
    }

    #[test]
    fn hessian_is_x_transpose_x() {
        let mut h = Hessian::new(2);
        h.add(&Kernels::detect(), None, &[1.0, 2.0, -3.0, 4.0], 2);
        assert_eq!(h.full(), vec![10.0, -10.0, -10.0, 20.0]);
        assert_eq!(h.mean_square(), vec![5.0, 10.0]);
        assert_eq!(h.mean_abs(), vec![2.0, 3.0]);
    }

    #[test]
    fn upper_factor_reconstructs_the_inverse() {
        let n = 20;
        let a = spd(n);
        let u = inverse_cholesky_upper(&mut a.clone(), n, 0.0, &[]).unwrap();
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
    fn blocked_factors_of_a_matrix_wider_than_a_block_are_exact() {
        // Wider than two blocks and not a multiple of the block or group sizes.
        let n = 211;
        let a = spd(n);
        let l = cholesky(&a, n).unwrap();
        for i in 0..n {
            for j in 0..=i {
                let v: f64 = (0..=j).map(|k| l[i * n + k] * l[j * n + k]).sum();
                assert!(
                    (v - a[i * n + j]).abs() < 1e-9 * a[i * n + i].abs().max(1.0),
                    "{i},{j}"
                );
            }
        }
        let lt = inverse_lower_transposed(&l, n);
        // L · L⁻¹ = I, with column j of L⁻¹ in row j of lt.
        for i in 0..n {
            for j in 0..n {
                let v: f64 = (0..n).map(|k| l[i * n + k] * lt[j * n + k]).sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((v - want).abs() < 1e-9, "{i},{j}: {v}");
            }
        }
    }

    #[test]
    fn several_dots_at_once_have_the_bits_of_each_dot_alone() {
        for n in (0..=70).chain([96, 200]) {
            let v: Vec<f64> = crate::test_values(5 * n, n as u32 + 3)
                .into_iter()
                .map(f64::from)
                .collect();
            let (a, b) = v.split_at(4 * n);
            let a: [&[f64]; 4] = std::array::from_fn(|m| &a[m * n..(m + 1) * n]);
            let many = dot64_many(a, b);
            for m in 0..4 {
                assert_eq!(many[m].to_bits(), dot64(a[m], b).to_bits(), "n {n}, {m}");
            }
        }
    }

    #[test]
    fn inverse_columns_made_together_have_the_bits_of_each_column_alone() {
        for n in [1, 15, 16, 17, 63, 64, 65, 130, 211] {
            let l = cholesky(&spd(n), n).unwrap();
            let lt = inverse_lower_transposed(&l, n);
            for j in 0..n {
                // Forward substitution of column j by itself.
                let mut x = vec![0f64; n];
                x[j] = 1.0 / l[j * n + j];
                for i in j + 1..n {
                    let li = &l[i * n..i * n + i + 1];
                    x[i] = -dot64(&li[j..i], &x[j..i]) / li[i];
                }
                let got = &lt[j * n..(j + 1) * n];
                assert!(
                    got.iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "n {n}, column {j}"
                );
            }
        }
    }

    #[test]
    fn a_singular_matrix_fails_with_its_column() {
        let a = vec![1.0, 1.0, 1.0, 1.0];
        assert_eq!(cholesky(&a, 2), Err(1));
        assert!(inverse_cholesky_upper(&mut a.clone(), 2, 0.1, &[]).is_ok());
    }

    /// `U` as the factor was made with separate matrices: the reversed,
    /// dampened copy, its factor, the whole inverse, then `U`.
    fn upper_factor_with_copies(h: &[f64], n: usize, damp: f64, dead: &[bool]) -> Vec<f32> {
        let mut l = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..=i {
                l[i * n + j] = h[(n - 1 - j) * n + (n - 1 - i)];
            }
            if dead[n - 1 - i] {
                l[i * n + i] = 1.0;
            }
            l[i * n + i] += damp;
        }
        cholesky_in_place(&mut l, n).unwrap();
        let lt = inverse_lower_transposed(&l, n);
        let mut u = vec![0f32; n * n];
        for i in 0..n {
            for j in i..n {
                u[i * n + j] = lt[(n - 1 - j) * n + (n - 1 - i)] as f32;
            }
        }
        u
    }

    #[test]
    fn the_factor_made_inside_the_hessian_has_the_bits_of_one_made_beside_it() {
        let n = 211;
        let mut h = spd(n);
        // Only the lower triangle is the Hessian's (as `Hessian::add` fills it).
        for i in 0..n {
            h[i * n + i + 1..(i + 1) * n].fill(0.0);
        }
        // Column 5 no token reached.
        let mut dead = vec![false; n];
        dead[5] = true;
        for j in 0..n {
            h[5 * n + j] = 0.0;
            h[j * n + 5] = 0.0;
        }
        let want = upper_factor_with_copies(&h, n, 0.25, &dead);
        let mut inside = h.clone();
        let u = inverse_cholesky_upper(&mut inside, n, 0.25, &dead).unwrap();
        assert!(u.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        // The lower triangle is the Hessian's again; the upper mirrors it.
        for i in 0..n {
            for j in 0..=i {
                assert_eq!(
                    inside[i * n + j].to_bits(),
                    h[i * n + j].to_bits(),
                    "{i},{j}"
                );
                assert_eq!(
                    inside[j * n + i].to_bits(),
                    h[i * n + j].to_bits(),
                    "{j},{i}"
                );
            }
        }
        // Columns of the inverse made a few groups at a time: the same bits.
        let mut l = inside.clone();
        reverse_into_lower(
            &mut l,
            n,
            &(0..n).map(|i| h[i * n + i]).collect::<Vec<_>>(),
            &dead,
            0.25,
        );
        cholesky_in_place(&mut l, n).unwrap();
        for span in [INVERSE_GROUP, 2 * INVERSE_GROUP, n] {
            assert_eq!(upper_factor(&l, n, span), u, "span {span}");
        }
    }

    #[test]
    fn a_failed_factorisation_gives_the_hessian_back() {
        let n = 70;
        let mut h = spd(n);
        // Row 40 a copy of row 39 with half its diagonal: not positive
        // definite without dampening.
        let d = h[39 * n + 39];
        for j in 0..n {
            h[40 * n + j] = h[39 * n + j];
            h[j * n + 40] = h[j * n + 39];
        }
        h[40 * n + 40] = d / 2.0;
        let before = h.clone();
        assert!(inverse_cholesky_upper(&mut h, n, 0.0, &[]).is_err());
        assert!(
            h.iter()
                .zip(&before)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        assert!(inverse_cholesky_upper(&mut h, n, 2.0 * d, &[]).is_ok());
    }
}
