//! GPTQ's choices for the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S): a weight cannot be rounded on its own there, because eight weights
//! (IQ2) or four (IQ3) are one point of a fixed codebook, with their signs
//! kept apart. So GPTQ chooses eight columns at a time: once the super-block's
//! scales are fixed by llama.cpp's encoder (as for every other type), the
//! eight current, error-corrected values of a row take the codebook point(s)
//! and signs of least error weighted by GPTQ's own cost of each column
//! (`1 / U[i][i]²`), and the rounding error of the eight columns is then
//! spread column by column as for a scalar grid. IQ2_XXS, IQ2_XS and IQ3_XXS
//! store seven sign bits per eight weights (the eighth makes the number of
//! negative signs even): an odd number of negative values flips the sign whose
//! flip costs least. IQ1_S and IQ1_M are left to the encoder: their points
//! carry a shared offset whose sign is chosen per group of weights, which
//! this choice does not model.
//!
//! [`LatticeGrid::pack`] writes the chosen points and signs into the block's
//! own bytes, its scales untouched, so the result is an ordinary block.

// Indices say which bits of which byte each point takes, as ggml-common.h does.
#![allow(clippy::needless_range_loop)]

use memwall_format::GgmlType;
use memwall_format::blocks::{
    BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID,
    IQ3S_GRID, IQ3XXS_GRID, Lattice, as_blocks, as_blocks_mut,
};

/// The lattice types whose points GPTQ chooses.
pub const LATTICE_TYPES: [GgmlType; 5] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
];

/// Weights per unit of choice: one sign byte (one IQ2 point, two IQ3 points).
pub const UNIT: usize = 8;

/// Candidates per 8-value point (IQ2) whose GPTQ loss is computed in full.
pub const SHORTLIST: usize = 32;

/// Candidates per 4-value point (IQ3; the two halves of a unit are tried in
/// every pair, so this many squared).
pub const SHORTLIST_HALF: usize = 8;

/// The indices of the `N` smallest scores (`None` past the end; NaN scores
/// are never taken), the first of equals first.
fn shortlist<const N: usize>(scores: impl Iterator<Item = f32>) -> [Option<usize>; N] {
    let mut top: [(f32, Option<usize>); N] = [(f32::INFINITY, None); N];
    for (i, c) in scores.enumerate() {
        if c.is_nan() || c >= top[N - 1].0 {
            continue;
        }
        let mut k = N - 1;
        while k > 0 && c < top[k - 1].0 {
            top[k] = top[k - 1];
            k -= 1;
        }
        top[k] = (c, Some(i));
    }
    top.map(|(_, i)| i)
}

/// The choices of one super-block of 256 weights.
#[derive(Clone, Debug, PartialEq)]
pub struct LatticeGrid {
    ty: GgmlType,
    /// Per weight: `d · ls · FACTOR` of its sub-block.
    scale: [f32; 256],
    /// Per point (32 of 8 values, or 64 of 4): its index in the codebook.
    points: [u16; 64],
    /// Per unit of 8 weights: bit `j` set where weight `j` is negative.
    signs: [u8; 32],
}

/// A codebook: its points' values (all positive), `K` values a point.
fn book(ty: GgmlType) -> (&'static [[i8; 8]], &'static [[i8; 4]]) {
    match ty {
        GgmlType::IQ2_XXS => (&IQ2XXS_GRID, &[]),
        GgmlType::IQ2_XS => (&IQ2XS_GRID, &[]),
        GgmlType::IQ2_S => (&IQ2S_GRID, &[]),
        GgmlType::IQ3_XXS => (&[], &IQ3XXS_GRID),
        GgmlType::IQ3_S => (&[], &IQ3S_GRID),
        _ => (&[], &[]),
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The per-weight float scales of a lattice block.
fn scales<B: Lattice>(b: &B) -> Option<[f32; 256]> {
    let codes = b.codes()?;
    let d = b.d().to_f32();
    let per = if B::HALVES { 16 } else { 32 };
    Some(std::array::from_fn(|i| {
        d * (f32::from(codes.ls[i / per]) * B::FACTOR)
    }))
}

impl LatticeGrid {
    /// Reads the choices of one block of `ty` (`bytes` is exactly one
    /// block); `None` for other types.
    pub fn read(ty: GgmlType, bytes: &[u8]) -> Option<LatticeGrid> {
        let mut points = [0u16; 64];
        let (scale, signs) = match ty {
            GgmlType::IQ2_XXS => {
                let b = &as_blocks::<BlockIq2Xxs>(bytes)[0];
                for k in 0..32 {
                    points[k] = u16::from(b.qs[8 * (k / 4) + k % 4]);
                }
                (scales(b)?, b.codes()?.signs)
            }
            GgmlType::IQ2_XS => {
                let b = &as_blocks::<BlockIq2Xs>(bytes)[0];
                for k in 0..32 {
                    points[k] = u16::from_le_bytes([b.qs[2 * k], b.qs[2 * k + 1]]) & 511;
                }
                (scales(b)?, b.codes()?.signs)
            }
            GgmlType::IQ2_S => {
                let b = &as_blocks::<BlockIq2S>(bytes)[0];
                for k in 0..32 {
                    let hi = (u16::from(b.qh[k / 4]) >> (2 * (k % 4))) & 3;
                    points[k] = u16::from(b.qs[k]) | hi << 8;
                }
                (scales(b)?, b.signs)
            }
            GgmlType::IQ3_XXS => {
                let b = &as_blocks::<BlockIq3Xxs>(bytes)[0];
                for (p, &q) in points.iter_mut().zip(&b.qs) {
                    *p = u16::from(q);
                }
                (scales(b)?, b.codes()?.signs)
            }
            GgmlType::IQ3_S => {
                let b = &as_blocks::<BlockIq3S>(bytes)[0];
                for (p, point) in points.iter_mut().enumerate() {
                    let hi = (u16::from(b.qh[p / 8]) >> (p % 8)) & 1;
                    *point = u16::from(b.qs[p]) | hi << 8;
                }
                (scales(b)?, b.signs)
            }
            _ => return None,
        };
        Some(LatticeGrid {
            ty,
            scale,
            points,
            signs,
        })
    }

    /// Whether the signs are stored as seven bits and a parity.
    fn parity(&self) -> bool {
        matches!(
            self.ty,
            GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ3_XXS
        )
    }

    /// The value weight `i` decodes to.
    pub fn value(&self, i: usize) -> f32 {
        let (b8, b4) = book(self.ty);
        let magnitude = if b8.is_empty() {
            b4[usize::from(self.points[i / 4])][i % 4]
        } else {
            b8[usize::from(self.points[i / 8])][i % 8]
        };
        let v = self.scale[i] * f32::from(magnitude);
        if self.signs[i / 8] >> (i % 8) & 1 != 0 {
            -v
        } else {
            v
        }
    }

    /// Chooses unit `u`'s point(s) and signs for the current values `x` of
    /// weights `8u..8u + 8`, given `ug`, the unit's 8 × 8 block of GPTQ's
    /// factor `U` (upper triangular). The loss of a choice is what GPTQ adds
    /// for the unit's columns: `Σ errᵢ²` with `errᵢ = (xᵢ − qᵢ − Σ_{k<i} U[k][i]·errₖ) / U[i][i]`
    /// (the errors of earlier columns of the unit move the later ones). The
    /// candidates are the [`SHORTLIST`] points ([`SHORTLIST_HALF`] per half
    /// for IQ3, every pair of them) of least
    /// `Σ (scale·point − |x|)² / U[i][i]²`, with the signs of `x` and, where the
    /// signs keep a parity and an odd number of `x` is negative, the flip that
    /// adds least to that sum (`4·scale·point·|x| / U[i][i]²`).
    pub fn choose(&mut self, u: usize, x: &[f32], ug: &[[f32; UNIT]; UNIT]) {
        let s: [f32; UNIT] = std::array::from_fn(|j| self.scale[UNIT * u + j]);
        let cost: [f32; UNIT] = std::array::from_fn(|j| 1.0 / (ug[j][j] * ug[j][j]));
        let a: [f32; UNIT] = std::array::from_fn(|j| x[j].abs());
        let fit = |p: &[i8], j0: usize| -> f32 {
            p.iter()
                .enumerate()
                .map(|(j, &m)| {
                    let e = s[j0 + j] * f32::from(m) - a[j0 + j];
                    cost[j0 + j] * e * e
                })
                .sum()
        };
        let negative: u8 = (0..UNIT).filter(|&j| x[j] < 0.0).fold(0, |m, j| m | 1 << j);
        let odd = self.parity() && negative.count_ones() % 2 == 1;
        // What flipping the sign of weight `j` (magnitude `m`) adds to the fit.
        let flip_cost = |j: usize, m: i8| 4.0 * cost[j] * s[j] * f32::from(m) * a[j];
        // The cheapest flip among the magnitudes `p` of weights `j0..`.
        let cheapest_flip = |p: &[i8], j0: usize| -> f32 {
            p.iter()
                .enumerate()
                .map(|(j, &m)| flip_cost(j0 + j, m))
                .fold(f32::INFINITY, f32::min)
        };
        // The signs for magnitudes `m`: those of `x`, with the cheapest flip
        // when the parity needs one.
        let signs_for = |m: &[i8; UNIT]| -> u8 {
            if !odd {
                return negative;
            }
            let delta = |j: usize| flip_cost(j, m[j]);
            let j = (0..UNIT).fold(0, |b, j| if delta(j) < delta(b) { j } else { b });
            negative ^ 1 << j
        };
        // GPTQ's loss for the unit's values `m` with `signs`.
        let loss = |m: &[i8; UNIT], signs: u8| -> f32 {
            let mut err = [0f32; UNIT];
            let mut total = 0f32;
            for i in 0..UNIT {
                let q = s[i] * f32::from(m[i]);
                let q = if signs >> i & 1 != 0 { -q } else { q };
                let moved: f32 = (0..i).map(|k| ug[k][i] * err[k]).sum();
                err[i] = (x[i] - q - moved) / ug[i][i];
                total += err[i] * err[i];
            }
            total
        };
        let (b8, b4) = book(self.ty);
        let mut best = (f32::INFINITY, [0u16; 2], negative);
        if b4.is_empty() {
            let short = shortlist::<SHORTLIST>(
                b8.iter()
                    .map(|p| fit(p, 0) + if odd { cheapest_flip(p, 0) } else { 0.0 }),
            );
            for &p in short.iter().flatten() {
                let m = b8[p];
                let signs = signs_for(&m);
                let l = loss(&m, signs);
                if l < best.0 {
                    best = (l, [p as u16, 0], signs);
                }
            }
            if best.0.is_finite() {
                self.points[u] = best.1[0];
            }
        } else {
            // Per half, the points of least fit, and with an odd count also
            // those of least fit plus a flip inside the half.
            let halves = [0, 1].map(|h| {
                let mut list: Vec<usize> =
                    shortlist::<SHORTLIST_HALF>(b4.iter().map(|p| fit(p, 4 * h)))
                        .into_iter()
                        .flatten()
                        .collect();
                if odd {
                    let flipped = shortlist::<SHORTLIST_HALF>(
                        b4.iter().map(|p| fit(p, 4 * h) + cheapest_flip(p, 4 * h)),
                    );
                    for p in flipped.into_iter().flatten() {
                        if !list.contains(&p) {
                            list.push(p);
                        }
                    }
                }
                list
            });
            for &p0 in &halves[0] {
                for &p1 in &halves[1] {
                    let (q0, q1) = (&b4[p0], &b4[p1]);
                    let m = [q0[0], q0[1], q0[2], q0[3], q1[0], q1[1], q1[2], q1[3]];
                    let signs = signs_for(&m);
                    let l = loss(&m, signs);
                    if l < best.0 {
                        best = (l, [p0 as u16, p1 as u16], signs);
                    }
                }
            }
            if best.0.is_finite() {
                self.points[2 * u] = best.1[0];
                self.points[2 * u + 1] = best.1[1];
            }
        }
        if best.0.is_finite() {
            self.signs[u] = best.2;
        }
    }

    /// Writes the points and signs into `bytes` (the block they were read
    /// from), every scale as it was.
    pub fn pack(&self, bytes: &mut [u8]) {
        let sign7 = |k: usize| u32::from(self.signs[k] & 127);
        match self.ty {
            GgmlType::IQ2_XXS => {
                let b = &mut as_blocks_mut::<BlockIq2Xxs>(bytes)[0];
                for ib in 0..8 {
                    let mut sas = le32(&b.qs, 8 * ib + 4) & 0xf000_0000;
                    for l in 0..4 {
                        b.qs[8 * ib + l] = self.points[4 * ib + l] as u8;
                        sas |= sign7(4 * ib + l) << (7 * l);
                    }
                    put32(&mut b.qs, 8 * ib + 4, sas);
                }
            }
            GgmlType::IQ2_XS => {
                let b = &mut as_blocks_mut::<BlockIq2Xs>(bytes)[0];
                for k in 0..32 {
                    let v = (self.points[k] & 511) | (sign7(k) as u16) << 9;
                    b.qs[2 * k..2 * k + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            GgmlType::IQ2_S => {
                let b = &mut as_blocks_mut::<BlockIq2S>(bytes)[0];
                b.qh = [0; 8];
                for k in 0..32 {
                    b.qs[k] = self.points[k] as u8;
                    b.qh[k / 4] |= ((self.points[k] >> 8) as u8 & 3) << (2 * (k % 4));
                }
                b.signs = self.signs;
            }
            GgmlType::IQ3_XXS => {
                let b = &mut as_blocks_mut::<BlockIq3Xxs>(bytes)[0];
                for (q, &p) in b.qs.iter_mut().zip(&self.points) {
                    *q = p as u8;
                }
                for ib in 0..8 {
                    let mut sas = le32(&b.sas, 4 * ib) & 0xf000_0000;
                    for l in 0..4 {
                        sas |= sign7(4 * ib + l) << (7 * l);
                    }
                    put32(&mut b.sas, 4 * ib, sas);
                }
            }
            GgmlType::IQ3_S => {
                let b = &mut as_blocks_mut::<BlockIq3S>(bytes)[0];
                b.qh = [0; 8];
                for (p, &point) in self.points.iter().enumerate() {
                    b.qs[p] = point as u8;
                    b.qh[p / 8] |= ((point >> 8) as u8 & 1) << (p % 8);
                }
                b.signs = self.signs;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memwall_format::blocks::dequantize_row;
    use memwall_quantize::quantize_row_imatrix;

    use crate::test_values as lcg;

    fn encoded(ty: GgmlType, seed: u32) -> (Vec<f32>, Vec<u8>) {
        let x = lcg(256, seed);
        let w: Vec<f32> = (0..256).map(|i| 1.0 + (i % 7) as f32).collect();
        let mut bytes = vec![0u8; ty.type_size() as usize];
        quantize_row_imatrix(ty, &x, &mut bytes, Some(&w)).unwrap();
        (x, bytes)
    }

    #[test]
    fn reading_and_packing_a_block_gives_its_bytes_and_values_back() {
        for ty in LATTICE_TYPES {
            for seed in 1..6 {
                let (_, bytes) = encoded(ty, seed);
                let g = LatticeGrid::read(ty, &bytes).unwrap();
                let mut packed = bytes.clone();
                g.pack(&mut packed);
                assert_eq!(packed, bytes, "{ty} seed {seed}");
                let mut v = vec![0f32; 256];
                dequantize_row(ty, &bytes, &mut v).unwrap();
                for (i, &want) in v.iter().enumerate() {
                    let got = g.value(i);
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                        "{ty} weight {i}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_chosen_unit_is_no_worse_than_the_encoders_and_keeps_the_parity() {
        // The identity factor: every column alone, the loss the squared error.
        let ug: [[f32; UNIT]; UNIT] =
            std::array::from_fn(|i| std::array::from_fn(|j| if i == j { 1.0 } else { 0.0 }));
        for ty in LATTICE_TYPES {
            for seed in 1..6 {
                let (x, bytes) = encoded(ty, seed);
                let encoder = LatticeGrid::read(ty, &bytes).unwrap();
                let mut g = encoder.clone();
                for u in 0..32 {
                    let xs = &x[UNIT * u..UNIT * (u + 1)];
                    g.choose(u, xs, &ug);
                    let err = |g: &LatticeGrid| -> f32 {
                        (0..UNIT)
                            .map(|j| (g.value(UNIT * u + j) - xs[j]).powi(2))
                            .sum()
                    };
                    assert!(
                        err(&g) <= err(&encoder) * (1.0 + 1e-5) + 1e-12,
                        "{ty} unit {u}: {} vs {}",
                        err(&g),
                        err(&encoder)
                    );
                    if g.parity() {
                        assert_eq!(g.signs[u].count_ones() % 2, 0, "{ty} unit {u}");
                    }
                }
                // What is packed decodes to the chosen values.
                let mut packed = bytes.clone();
                g.pack(&mut packed);
                let mut v = vec![0f32; 256];
                dequantize_row(ty, &packed, &mut v).unwrap();
                for (i, &want) in v.iter().enumerate() {
                    assert!((g.value(i) - want).abs() <= 1e-6 * want.abs().max(1e-3));
                }
            }
        }
    }
}
