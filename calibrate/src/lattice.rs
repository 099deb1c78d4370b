//! GPTQ's choices for the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S): a weight cannot be rounded on its own there, because eight weights
//! (IQ2) or four (IQ3) are one point of a fixed codebook, with their signs
//! kept apart. So GPTQ chooses eight columns at a time: once the super-block's
//! scales are fixed by llama.cpp's encoder (as for every other type; GPTQ then
//! tries multiples of its `d`, `gptq.rs`), the
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

use std::sync::OnceLock;

use memwall_format::GgmlType;
use memwall_format::blocks::{
    BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, F16, IQ2S_GRID, IQ2XS_GRID,
    IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, Lattice, as_blocks, as_blocks_mut,
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

/// The indices of the `N` smallest scores (`None` past the end; NaN and
/// infinite scores are never taken), the first of equals first. Each score
/// is an integer key, its bits (made to order as the scores do) above its
/// index, so that equal scores keep index order. Up to eight places (IQ3's
/// halves) the smallest keys are kept in order as the scores go by; for
/// more (IQ2's 32) every key is written and the `N` smallest selected, then
/// sorted, which costs less than the shifts of keeping 32 in order.
fn shortlist<const N: usize>(scores: &[f32]) -> [Option<usize>; N] {
    let scores = &scores[..scores.len().min(MAX_POINTS)];
    let keys = scores
        .iter()
        .enumerate()
        .filter(|(_, c)| **c < f32::INFINITY);
    let keys = keys.map(|(i, c)| {
        let bits = c.to_bits();
        let ordered = if bits >> 31 == 0 {
            bits | 1 << 31
        } else {
            !bits
        };
        u64::from(ordered) << 32 | i as u64
    });
    let index = |key: u64| (key & 0xffff_ffff) as usize;
    if N > 8 {
        let mut all = [0u64; MAX_POINTS];
        let mut n = 0;
        for key in keys {
            all[n] = key;
            n += 1;
        }
        let all = &mut all[..n];
        if n > N {
            all.select_nth_unstable(N - 1);
        }
        let least = &mut all[..n.min(N)];
        least.sort_unstable();
        return std::array::from_fn(|k| least.get(k).map(|&key| index(key)));
    }
    const NONE: u64 = u64::MAX;
    let mut kept = [NONE; N];
    for key in keys {
        if key < kept[N - 1] {
            let mut j = N - 1;
            while j > 0 && kept[j - 1] > key {
                kept[j] = kept[j - 1];
                j -= 1;
            }
            kept[j] = key;
        }
    }
    kept.map(|key| (key != NONE).then(|| index(key)))
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

/// Points in the largest codebook (IQ2_S).
const MAX_POINTS: usize = 1024;

/// A codebook's magnitudes as `f32`, eight points a chunk and value by value:
/// `[chunk][j][lane]` is value `j` of point `8 · chunk + lane`, so that one
/// vector holds one value of eight points.
type Lanes<const K: usize> = Vec<[[f32; 8]; K]>;

fn lanes_of<const K: usize>(points: &[[i8; K]]) -> Lanes<K> {
    points
        .chunks_exact(8)
        .map(|c| std::array::from_fn(|j| std::array::from_fn(|l| f32::from(c[l][j]))))
        .collect()
}

/// The 8-value codebook of `ty` as [`Lanes`] (empty for IQ3's 4-value ones).
fn lanes8(ty: GgmlType) -> &'static [[[f32; 8]; 8]] {
    static IQ2XXS: OnceLock<Lanes<8>> = OnceLock::new();
    static IQ2XS: OnceLock<Lanes<8>> = OnceLock::new();
    static IQ2S: OnceLock<Lanes<8>> = OnceLock::new();
    match ty {
        GgmlType::IQ2_XXS => IQ2XXS.get_or_init(|| lanes_of(&IQ2XXS_GRID)),
        GgmlType::IQ2_XS => IQ2XS.get_or_init(|| lanes_of(&IQ2XS_GRID)),
        GgmlType::IQ2_S => IQ2S.get_or_init(|| lanes_of(&IQ2S_GRID)),
        _ => &[],
    }
}

/// The 4-value codebook of `ty` as [`Lanes`] (empty for IQ2's).
fn lanes4(ty: GgmlType) -> &'static [[[f32; 8]; 4]] {
    static IQ3XXS: OnceLock<Lanes<4>> = OnceLock::new();
    static IQ3S: OnceLock<Lanes<4>> = OnceLock::new();
    match ty {
        GgmlType::IQ3_XXS => IQ3XXS.get_or_init(|| lanes_of(&IQ3XXS_GRID)),
        GgmlType::IQ3_S => IQ3S.get_or_init(|| lanes_of(&IQ3S_GRID)),
        _ => &[],
    }
}

/// What the points of one unit (or half unit) are fitted to: the scales
/// `s`, the magnitudes `a` and the costs `cost` of its weights.
struct Fit<'a> {
    s: &'a [f32],
    cost: &'a [f32],
    a: &'a [f32],
}

/// For every point `m` of a codebook (as [`Lanes`]), its fit,
/// `plain = Σ_j cost_j · (s_j · m_j − a_j)²`, and that fit plus the cheapest
/// sign flip, `flipped = plain + min_j 4 · cost_j · s_j · m_j · a_j`: each
/// point's operations in the order of one point at a time, eight points a
/// step.
fn point_scores<const K: usize>(
    lanes: &[[[f32; 8]; K]],
    fit: &Fit,
    plain: &mut [f32],
    flipped: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { point_scores_avx2(lanes, fit, plain, flipped) };
    }
    point_scores_portable(lanes, fit, plain, flipped)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn point_scores_avx2<const K: usize>(
    lanes: &[[[f32; 8]; K]],
    fit: &Fit,
    plain: &mut [f32],
    flipped: &mut [f32],
) {
    point_scores_portable(lanes, fit, plain, flipped)
}

#[inline(always)]
fn point_scores_portable<const K: usize>(
    lanes: &[[[f32; 8]; K]],
    fit: &Fit,
    plain: &mut [f32],
    flipped: &mut [f32],
) {
    let (s, cost, a) = (&fit.s[..K], &fit.cost[..K], &fit.a[..K]);
    let k: [f32; K] = std::array::from_fn(|j| 4.0 * cost[j] * s[j]);
    let outs = plain.chunks_exact_mut(8).zip(flipped.chunks_exact_mut(8));
    for (chunk, (p, f)) in lanes.iter().zip(outs) {
        let mut sum = [0f32; 8];
        let mut flip = [f32::INFINITY; 8];
        for j in 0..K {
            for l in 0..8 {
                let e = s[j] * chunk[j][l] - a[j];
                sum[l] += cost[j] * e * e;
                flip[l] = flip[l].min(k[j] * chunk[j][l] * a[j]);
            }
        }
        for l in 0..8 {
            p[l] = sum[l];
            f[l] = sum[l] + flip[l];
        }
    }
}

/// What GPTQ's loss of a unit's candidates depends on: the unit's scales
/// `s`, its current values `x` and its 8 × 8 block `ug` of the factor `U`.
struct UnitLoss<'a> {
    s: [f32; UNIT],
    x: &'a [f32],
    ug: &'a [[f32; UNIT]; UNIT],
}

/// The candidate of least loss so far (the first of equals).
struct Best {
    loss: f32,
    points: [u16; 2],
    signs: u8,
}

/// Up to eight candidates of one unit, their signed values `q[i][c]`
/// (`±s_i · m_i` of candidate `c`) column by column, so that their losses are
/// taken eight at a time.
#[derive(Default)]
struct Batch {
    q: [[f32; 8]; UNIT],
    signs: [u8; 8],
    points: [[u16; 2]; 8],
    n: usize,
}

impl Batch {
    /// Adds the candidate of magnitudes `m` and `signs`; once eight are
    /// held, settles them.
    fn push(
        &mut self,
        unit: &UnitLoss,
        m: &[i8; UNIT],
        signs: u8,
        points: [u16; 2],
        best: &mut Best,
    ) {
        let c = self.n;
        for i in 0..UNIT {
            let q = unit.s[i] * f32::from(m[i]);
            self.q[i][c] = if signs >> i & 1 != 0 { -q } else { q };
        }
        self.signs[c] = signs;
        self.points[c] = points;
        self.n += 1;
        if self.n == 8 {
            self.settle(unit, best);
        }
    }

    /// Takes the held candidates' losses and keeps in `best` the first one
    /// below it, in the order they were added; empties the batch.
    fn settle(&mut self, unit: &UnitLoss, best: &mut Best) {
        if self.n == 0 {
            return;
        }
        let losses = unit_losses(unit, &self.q);
        for c in 0..self.n {
            if losses[c] < best.loss {
                *best = Best {
                    loss: losses[c],
                    points: self.points[c],
                    signs: self.signs[c],
                };
            }
        }
        self.n = 0;
    }
}

/// GPTQ's loss of eight candidates of one unit with signed values `q`
/// (`q[i][c]`: column `i` of candidate `c`): per candidate
/// `Σ errᵢ²`, `errᵢ = (xᵢ − qᵢ − Σ_{k<i} U[k][i]·errₖ) / U[i][i]`, the
/// sum over `k` taken from −0 in order of `k`, each candidate's operations
/// those of one candidate alone.
fn unit_losses(unit: &UnitLoss, q: &[[f32; 8]; UNIT]) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { unit_losses_avx2(unit, q) };
    }
    unit_losses_portable(unit, q)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn unit_losses_avx2(unit: &UnitLoss, q: &[[f32; 8]; UNIT]) -> [f32; 8] {
    unit_losses_portable(unit, q)
}

#[inline(always)]
fn unit_losses_portable(unit: &UnitLoss, q: &[[f32; 8]; UNIT]) -> [f32; 8] {
    let (x, ug) = (unit.x, unit.ug);
    let mut err = [[0f32; 8]; UNIT];
    let mut total = [0f32; 8];
    for i in 0..UNIT {
        let mut moved = [-0.0f32; 8];
        for k in 0..i {
            for c in 0..8 {
                moved[c] += ug[k][i] * err[k][c];
            }
        }
        for c in 0..8 {
            err[i][c] = (x[i] - q[i][c] - moved[c]) / ug[i][i];
            total[c] += err[i][c] * err[i][c];
        }
    }
    total
}

/// The super-block scale `d` of one block of lattice type `ty` (`bytes` is
/// exactly one block); `None` for other types.
pub fn lattice_d(ty: GgmlType, bytes: &[u8]) -> Option<F16> {
    Some(match ty {
        GgmlType::IQ2_XXS => as_blocks::<BlockIq2Xxs>(bytes)[0].d,
        GgmlType::IQ2_XS => as_blocks::<BlockIq2Xs>(bytes)[0].d,
        GgmlType::IQ2_S => as_blocks::<BlockIq2S>(bytes)[0].d,
        GgmlType::IQ3_XXS => as_blocks::<BlockIq3Xxs>(bytes)[0].d,
        GgmlType::IQ3_S => as_blocks::<BlockIq3S>(bytes)[0].d,
        _ => return None,
    })
}

/// Sets the super-block scale `d` of one block of lattice type `ty`;
/// `None` for other types.
pub fn set_lattice_d(ty: GgmlType, bytes: &mut [u8], d: F16) -> Option<()> {
    match ty {
        GgmlType::IQ2_XXS => as_blocks_mut::<BlockIq2Xxs>(bytes)[0].d = d,
        GgmlType::IQ2_XS => as_blocks_mut::<BlockIq2Xs>(bytes)[0].d = d,
        GgmlType::IQ2_S => as_blocks_mut::<BlockIq2S>(bytes)[0].d = d,
        GgmlType::IQ3_XXS => as_blocks_mut::<BlockIq3Xxs>(bytes)[0].d = d,
        GgmlType::IQ3_S => as_blocks_mut::<BlockIq3S>(bytes)[0].d = d,
        _ => return None,
    }
    Some(())
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
        let negative: u8 = (0..UNIT).filter(|&j| x[j] < 0.0).fold(0, |m, j| m | 1 << j);
        let odd = self.parity() && negative.count_ones() % 2 == 1;
        // What flipping the sign of weight `j` (magnitude `m`) adds to the fit.
        let flip_cost = |j: usize, m: i8| 4.0 * cost[j] * s[j] * f32::from(m) * a[j];
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
        let unit = UnitLoss { s, x, ug };
        let mut batch = Batch::default();
        let (b8, b4) = book(self.ty);
        let mut best = Best {
            loss: f32::INFINITY,
            points: [0; 2],
            signs: negative,
        };
        let mut plain = [0f32; MAX_POINTS];
        let mut flipped = [0f32; MAX_POINTS];
        if b4.is_empty() {
            let n = b8.len();
            point_scores(
                lanes8(self.ty),
                &Fit {
                    s: &s,
                    cost: &cost,
                    a: &a,
                },
                &mut plain,
                &mut flipped,
            );
            let scores = if odd { &flipped[..n] } else { &plain[..n] };
            let short = shortlist::<SHORTLIST>(scores);
            for &p in short.iter().flatten() {
                let m = &b8[p];
                batch.push(&unit, m, signs_for(m), [p as u16, 0], &mut best);
            }
            batch.settle(&unit, &mut best);
            if best.loss.is_finite() {
                self.points[u] = best.points[0];
            }
        } else {
            // Per half, the points of least fit, and with an odd count also
            // those of least fit plus a flip inside the half.
            let n = b4.len();
            let halves = [0, 1].map(|h| {
                let half = 4 * h..4 * h + 4;
                let fit = Fit {
                    s: &s[half.clone()],
                    cost: &cost[half.clone()],
                    a: &a[half],
                };
                point_scores(lanes4(self.ty), &fit, &mut plain, &mut flipped);
                let mut list: Vec<usize> = shortlist::<SHORTLIST_HALF>(&plain[..n])
                    .into_iter()
                    .flatten()
                    .collect();
                if odd {
                    let flipped = shortlist::<SHORTLIST_HALF>(&flipped[..n]);
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
                    let points = [p0 as u16, p1 as u16];
                    batch.push(&unit, &m, signs_for(&m), points, &mut best);
                }
            }
            batch.settle(&unit, &mut best);
            if best.loss.is_finite() {
                self.points[2 * u] = best.points[0];
                self.points[2 * u + 1] = best.points[1];
            }
        }
        if best.loss.is_finite() {
            self.signs[u] = best.signs;
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
    fn a_shortlist_is_the_smallest_scores_in_order_with_equals_in_index_order() {
        let scores = [
            3.0,
            f32::NAN,
            1.0,
            f32::INFINITY,
            2.0,
            1.0,
            0.0,
            5.0,
            2.0,
            4.0,
        ];
        assert_eq!(
            shortlist::<4>(&scores),
            [Some(6), Some(2), Some(5), Some(4)]
        );
        // Fewer usable scores than places: the rest is None.
        assert_eq!(
            shortlist::<4>(&[f32::NAN, 7.0, f32::INFINITY]),
            [Some(1), None, None, None]
        );
        // Against a sort of every point, on a codebook's worth of scores.
        let many: Vec<f32> = lcg(1024, 11)
            .iter()
            .map(|v| (v * 8.0).round().abs())
            .collect();
        let mut order: Vec<usize> = (0..many.len()).collect();
        order.sort_by(|&a, &b| many[a].total_cmp(&many[b]).then(a.cmp(&b)));
        let want: [Option<usize>; SHORTLIST] = std::array::from_fn(|k| Some(order[k]));
        assert_eq!(shortlist::<SHORTLIST>(&many), want);
    }

    #[test]
    fn point_scores_eight_at_a_time_are_each_points_own() {
        let s = [0.5, 0.5, 0.5, 0.5, 0.7, 0.7, 0.7, 0.7];
        let cost = [1.0, 2.0, 0.5, 3.0, 1.5, 0.25, 2.5, 1.0];
        let a: Vec<f32> = lcg(8, 3).iter().map(|v| v.abs() * 4.0).collect();
        let mut plain = [0f32; MAX_POINTS];
        let mut flipped = [0f32; MAX_POINTS];
        let whole = Fit {
            s: &s,
            cost: &cost,
            a: &a,
        };
        point_scores(lanes8(GgmlType::IQ2_S), &whole, &mut plain, &mut flipped);
        for (p, m) in IQ2S_GRID.iter().enumerate() {
            let mut fit = 0f32;
            let mut flip = f32::INFINITY;
            for j in 0..8 {
                let e = s[j] * f32::from(m[j]) - a[j];
                fit += cost[j] * e * e;
                flip = flip.min(4.0 * cost[j] * s[j] * f32::from(m[j]) * a[j]);
            }
            assert_eq!(plain[p].to_bits(), fit.to_bits(), "point {p}");
            assert_eq!(flipped[p].to_bits(), (fit + flip).to_bits(), "point {p}");
        }
        let half = Fit {
            s: &s[4..],
            cost: &cost[4..],
            a: &a[4..],
        };
        point_scores(lanes4(GgmlType::IQ3_S), &half, &mut plain, &mut flipped);
        for (p, m) in IQ3S_GRID.iter().enumerate() {
            let fit: f32 = (0..4)
                .map(|j| {
                    let e = s[4 + j] * f32::from(m[j]) - a[4 + j];
                    cost[4 + j] * e * e
                })
                .sum();
            assert_eq!(plain[p].to_bits(), fit.to_bits(), "IQ3_S point {p}");
        }
    }

    #[test]
    fn unit_losses_eight_at_a_time_are_each_candidates_own() {
        let s = [0.5, 0.5, 0.5, 0.5, 0.7, 0.7, 0.7, 0.7];
        let x = lcg(8, 5);
        let r = lcg(64, 9);
        // An upper triangular factor with a positive diagonal.
        let ug: [[f32; UNIT]; UNIT] = std::array::from_fn(|k| {
            std::array::from_fn(|i| match k.cmp(&i) {
                std::cmp::Ordering::Less => r[8 * k + i],
                std::cmp::Ordering::Equal => 0.5 + r[8 * k + i].abs(),
                std::cmp::Ordering::Greater => 0.0,
            })
        });
        let unit = UnitLoss { s, x: &x, ug: &ug };
        for chunk in IQ2XS_GRID.chunks_exact(8).take(16) {
            let signs: [u8; 8] = std::array::from_fn(|c| (37 * c + chunk[c][0] as usize) as u8);
            let q: [[f32; 8]; UNIT] = std::array::from_fn(|i| {
                std::array::from_fn(|c| {
                    let v = s[i] * f32::from(chunk[c][i]);
                    if signs[c] >> i & 1 != 0 { -v } else { v }
                })
            });
            let losses = unit_losses(&unit, &q);
            for c in 0..8 {
                let mut err = [0f32; UNIT];
                let mut total = 0f32;
                for i in 0..UNIT {
                    let moved: f32 = (0..i).map(|k| ug[k][i] * err[k]).sum();
                    err[i] = (x[i] - q[i][c] - moved) / ug[i][i];
                    total += err[i] * err[i];
                }
                assert_eq!(losses[c].to_bits(), total.to_bits(), "candidate {c}");
                assert_eq!(
                    unit_losses_portable(&unit, &q)[c].to_bits(),
                    total.to_bits()
                );
            }
        }
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
