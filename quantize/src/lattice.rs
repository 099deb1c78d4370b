//! Encoders of the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), as
//! ggml's `quantize_row_iq2_xxs_impl`, `quantize_row_iq2_xs_impl`, `quantize_row_iq2_s_impl`,
//! `quantize_row_iq3_xxs_impl` and `quantize_row_iq3_s_impl`
//! (`ggml/src/ggml-quants.c`), float for float in ggml's order.
//!
//! A group of 8 (IQ2) or 4 (IQ3) magnitudes is fitted with levels
//! `2l + 1`; when the rounded levels are no point of the codebook, the
//! closest points by weighted error among the codebook's precomputed
//! neighbours of that level vector are tried ([`Codebook`], built as ggml's
//! `iq2xs_init_impl`/`iq3xs_init_impl` build theirs).

// The loops index several parallel arrays (values, weights, levels, signs) as
// ggml's do, which keeps the order of every float operation visible.
#![allow(clippy::needless_range_loop)]

use std::sync::OnceLock;

use memwall_format::GgmlType;
use memwall_format::blocks::{
    BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, F16, grid_levels,
};

use crate::kquants::{GROUP_MAX_EPS, make_qp_quants, nearest_int};

/// A codebook of `K`-value points with its search tables: `map[u]` for a
/// packed level vector `u` (`bits` bits a level) is the point with exactly
/// those levels, or where `u`'s neighbour list is in `neighbours` (the
/// points at the `nwant` smallest squared distances from `u`, by distance
/// then index) and in `lanes`.
pub(crate) struct Codebook<const K: usize> {
    /// The points as odd integers `2l + 1`.
    points: Vec<[i8; K]>,
    /// Each neighbour list's points, [`NEAREST_LANES`] at a time, value by
    /// value: `lanes[c][i][j]` is value `i` of the list's point
    /// `NEAREST_LANES·c + j` (the last point repeated past the list's end).
    lanes: Vec<[[i8; NEAREST_LANES]; K]>,
    bits: u32,
    map: Vec<Entry>,
    neighbours: Vec<u16>,
}

/// Neighbours whose errors [`Codebook::nearest`] computes together.
const NEAREST_LANES: usize = 8;

#[derive(Clone, Copy)]
enum Entry {
    Point(u16),
    Neighbours(List),
}

/// Where a neighbour list is: its start in `neighbours`, its first chunk in
/// `lanes` and its length (0: no list).
#[derive(Clone, Copy)]
struct List {
    at: u32,
    lanes: u32,
    n: u16,
}

impl<const K: usize> Codebook<K> {
    /// Builds the tables for the codebook of `ty`, searching `nwant`
    /// distances deep, for the level vectors with every level below `nlevels`.
    fn new(ty: GgmlType, nwant: usize, nlevels: u16) -> Self {
        let (levels, bits) = grid_levels(ty).unwrap_or((&[], 2));
        let mask = (1u16 << bits) - 1;
        let unpack = |u: u32| -> [i8; K] {
            std::array::from_fn(|i| 2 * ((u >> (bits * i as u32)) as u16 & mask) as i8 + 1)
        };
        let points: Vec<[i8; K]> = levels.iter().map(|&v| unpack(u32::from(v))).collect();
        let size = 1usize << (bits as usize * K);
        let mut map = vec![
            Entry::Neighbours(List {
                at: 0,
                lanes: 0,
                n: 0
            });
            size
        ];
        for (p, &v) in levels.iter().enumerate() {
            map[usize::from(v)] = Entry::Point(p as u16);
        }
        let mut neighbours = Vec::new();
        let mut lanes = Vec::new();
        let mut d2 = vec![0u32; points.len()];
        for u in 0..size {
            let pos = unpack(u as u32);
            let reachable = pos.iter().all(|&p| ((p - 1) / 2) < nlevels as i8);
            if matches!(map[u], Entry::Point(_)) || !reachable {
                continue;
            }
            for (d, p) in d2.iter_mut().zip(&points) {
                *d = p
                    .iter()
                    .zip(&pos)
                    .map(|(&a, &b)| (i32::from(a) - i32::from(b)).pow(2) as u32)
                    .sum();
            }
            // The `nwant` smallest distinct distances, ascending.
            let mut dists: Vec<u32> = Vec::with_capacity(nwant);
            for _ in 0..nwant {
                let floor = dists.last().copied();
                let next = d2
                    .iter()
                    .copied()
                    .filter(|&d| floor.is_none_or(|f| d > f))
                    .min();
                match next {
                    Some(d) => dists.push(d),
                    None => break,
                }
            }
            let start = neighbours.len();
            for &dist in &dists {
                neighbours.extend(
                    (0..points.len())
                        .filter(|&j| d2[j] == dist)
                        .map(|j| j as u16),
                );
            }
            map[u] = Entry::Neighbours(List {
                at: start as u32,
                lanes: lanes.len() as u32,
                n: (neighbours.len() - start) as u16,
            });
            for list in neighbours[start..].chunks(NEAREST_LANES) {
                let last = list[list.len() - 1];
                lanes.push(std::array::from_fn(|i| {
                    std::array::from_fn(|j| points[usize::from(*list.get(j).unwrap_or(&last))][i])
                }));
            }
        }
        Codebook {
            lanes,
            points,
            bits,
            map,
            neighbours,
        }
    }

    /// The packed level vector of `l`.
    fn pack(&self, l: &[i8]) -> usize {
        l.iter()
            .enumerate()
            .fold(0, |u, (i, &l)| u | (l as usize) << (self.bits as usize * i))
    }

    /// The point with levels `l`, if there is one.
    pub(crate) fn point(&self, l: &[i8]) -> Option<u16> {
        match self.map[self.pack(l)] {
            Entry::Point(p) => Some(p),
            Entry::Neighbours(_) => None,
        }
    }

    /// The point for levels `l`: itself if on the grid, else the neighbour of
    /// least weighted error `Σ w·(scale·q − x)²` (the first of equals), whose
    /// levels are written to `l`. ggml's `iq{2,3}_find_best_neighbour`.
    fn nearest(&self, l: &mut [i8], x: &[f32], w: &[f32], scale: f32) -> u16 {
        let p = match self.map[self.pack(l)] {
            Entry::Point(p) => return p,
            Entry::Neighbours(list) => self.best_of(list, x, w, scale, Values::Odd),
        };
        // Every level vector the scans reach has a list (ggml aborts otherwise).
        let p = p.unwrap_or(0);
        self.levels_of(p, l);
        p
    }

    /// Among the neighbours of the level vector `l` (`None` for a point, or
    /// without a list), the one of least `Σ w·(scale·v(q) − x)²` over its
    /// values `q` (`v` as `values` says): [`Codebook::best_of`].
    pub(crate) fn best_neighbour(
        &self,
        l: &[i8],
        x: &[f32],
        w: &[f32],
        scale: f32,
        values: Values,
    ) -> Option<u16> {
        match self.map[self.pack(l)] {
            Entry::Point(_) => None,
            Entry::Neighbours(list) => self.best_of(list, x, w, scale, values),
        }
    }

    /// The point of least error in the neighbour list `list`, the first of
    /// equals; the first of the list when no error is below `f32::MAX`;
    /// `None` for no list.
    ///
    /// The errors are computed [`NEAREST_LANES`] neighbours at a time, one
    /// per lane, each lane's sum in the scalar order over the `K` values
    /// ([`least`]).
    fn best_of(&self, list: List, x: &[f32], w: &[f32], scale: f32, values: Values) -> Option<u16> {
        let (at, lanes, n) = (list.at as usize, list.lanes as usize, usize::from(list.n));
        let list = self.neighbours.get(at..at + n)?;
        let first = *list.first()?;
        // A group is `K` values and weights, as `l` holds `K` levels.
        let (x, w) = (x.first_chunk::<K>()?, w.first_chunk::<K>()?);
        let chunks = self.lanes.get(lanes..lanes + n.div_ceil(NEAREST_LANES))?;
        Some(least(chunks, n, x, w, scale, values).map_or(first, |i| list[i]))
    }

    /// The levels of point `p`.
    pub(crate) fn levels(&self, p: u16) -> [i8; K] {
        self.points[usize::from(p)].map(|q| (q - 1) / 2)
    }

    /// Writes the levels of point `p` to `l`.
    fn levels_of(&self, p: u16, l: &mut [i8]) {
        for (l, &q) in l.iter_mut().zip(&self.points[usize::from(p)]) {
            *l = (q - 1) / 2;
        }
    }
}

/// What a point's odd value `q = 2l + 1` counts as in an error: itself,
/// or the value of its level `l` from a table (IQ1's grid values).
#[derive(Clone, Copy)]
pub(crate) enum Values<'a> {
    Odd,
    Levels(&'a [f32; 3]),
}

/// Of `n` points given [`NEAREST_LANES`] a chunk (lanes past `n` repeat
/// the last point), the position of the one of least
/// `Σ w·(scale·v(q) − x)²` (summed in the order of the values, ggml's order),
/// the first of equals; `None` when no error is below `f32::MAX`. With AVX2
/// when the CPU has it: each lane keeps its own least error and where it
/// was first met, and the lanes are compared at the end, which finds the
/// same position as comparing the errors one at a time in order.
#[inline]
fn least<const K: usize>(
    chunks: &[[[i8; NEAREST_LANES]; K]],
    n: usize,
    x: &[f32; K],
    w: &[f32; K],
    scale: f32,
    values: Values,
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if crate::wide_vectors() {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { least_avx2(chunks, n, x, w, scale, values) };
    }
    least_portable(chunks, n, x, w, scale, values)
}

fn least_portable<const K: usize>(
    chunks: &[[[i8; NEAREST_LANES]; K]],
    n: usize,
    x: &[f32; K],
    w: &[f32; K],
    scale: f32,
    values: Values,
) -> Option<usize> {
    let v = |q: i8| match values {
        Values::Odd => f32::from(q),
        Values::Levels(t) => t[((q - 1) / 2) as usize],
    };
    let mut best = (f32::MAX, None);
    for (c, lanes) in chunks.iter().enumerate() {
        let mut d2 = [0f32; NEAREST_LANES];
        for i in 0..K {
            for (d2, &q) in d2.iter_mut().zip(&lanes[i]) {
                let diff = scale * v(q) - x[i];
                *d2 += w[i] * diff * diff;
            }
        }
        for (j, &d2) in d2.iter().enumerate().take(n - NEAREST_LANES * c) {
            if d2 < best.0 {
                best = (d2, Some(NEAREST_LANES * c + j));
            }
        }
    }
    best.1
}

/// [`least`] on vectors of eight lanes (a table's values taken by a lane
/// permutation).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn least_avx2<const K: usize>(
    chunks: &[[[i8; NEAREST_LANES]; K]],
    n: usize,
    x: &[f32; K],
    w: &[f32; K],
    scale: f32,
    values: Values,
) -> Option<usize> {
    use std::arch::x86_64::*;
    const { assert!(NEAREST_LANES == 8) };
    let table = match values {
        Values::Odd => None,
        Values::Levels(t) => Some(_mm256_setr_ps(t[0], t[1], t[2], 0.0, 0.0, 0.0, 0.0, 0.0)),
    };
    let vscale = _mm256_set1_ps(scale);
    let mut best = _mm256_set1_ps(f32::MAX);
    let mut at = _mm256_set1_epi32(-1);
    let mut position = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for lanes in chunks {
        let mut d2 = _mm256_setzero_ps();
        for i in 0..K {
            // SAFETY: eight bytes.
            let q = _mm256_cvtepi8_epi32(unsafe { _mm_loadl_epi64(lanes[i].as_ptr().cast()) });
            let q = match table {
                None => _mm256_cvtepi32_ps(q),
                // Level `(q − 1) / 2` (q is odd and positive): lanes 0..3.
                Some(t) => _mm256_permutevar8x32_ps(t, _mm256_srli_epi32::<1>(q)),
            };
            let diff = _mm256_sub_ps(_mm256_mul_ps(vscale, q), _mm256_set1_ps(x[i]));
            let e = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(w[i]), diff), diff);
            d2 = _mm256_add_ps(d2, e);
        }
        let below = _mm256_cmp_ps::<_CMP_LT_OQ>(d2, best);
        best = _mm256_blendv_ps(best, d2, below);
        at = _mm256_castps_si256(_mm256_blendv_ps(
            _mm256_castsi256_ps(at),
            _mm256_castsi256_ps(position),
            below,
        ));
        position = _mm256_add_epi32(position, _mm256_set1_epi32(8));
    }
    // The least error over the lanes, then the first position holding it
    // (lanes never below `f32::MAX` stay there; a repeat of the last point
    // past `n` never wins, the point itself having its error earlier).
    let least = {
        let m = _mm256_min_ps(best, _mm256_permute2f128_ps::<1>(best, best));
        let m = _mm256_min_ps(m, _mm256_shuffle_ps::<0b01_00_11_10>(m, m));
        _mm256_min_ps(m, _mm256_shuffle_ps::<0b10_11_00_01>(m, m))
    };
    if _mm256_cvtss_f32(least) >= f32::MAX {
        return None;
    }
    let holding = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_EQ_OQ>(best, least));
    let at = _mm256_blendv_epi8(_mm256_set1_epi32(i32::MAX), at, holding);
    let first = _mm256_min_epi32(at, _mm256_permute2x128_si256::<1>(at, at));
    let first = _mm256_min_epi32(first, _mm256_shuffle_epi32::<0b01_00_11_10>(first));
    let first = _mm256_min_epi32(first, _mm256_shuffle_epi32::<0b10_11_00_01>(first));
    let first = usize::try_from(_mm256_cvtsi256_si32(first)).ok();
    debug_assert!(first.is_some_and(|f| f < n));
    first
}

fn iq2xxs_book() -> &'static Codebook<8> {
    static BOOK: OnceLock<Codebook<8>> = OnceLock::new();
    BOOK.get_or_init(|| Codebook::new(GgmlType::IQ2_XXS, 2, 3))
}

fn iq2xs_book() -> &'static Codebook<8> {
    static BOOK: OnceLock<Codebook<8>> = OnceLock::new();
    BOOK.get_or_init(|| Codebook::new(GgmlType::IQ2_XS, 2, 3))
}

fn iq2s_book() -> &'static Codebook<8> {
    static BOOK: OnceLock<Codebook<8>> = OnceLock::new();
    BOOK.get_or_init(|| Codebook::new(GgmlType::IQ2_S, 1, 3))
}

/// The IQ1_S/IQ1_M codebook (three distances deep, as ggml's).
pub(crate) fn iq1_book() -> &'static Codebook<8> {
    static BOOK: OnceLock<Codebook<8>> = OnceLock::new();
    BOOK.get_or_init(|| Codebook::new(GgmlType::IQ1_S, 3, 3))
}

fn iq3xxs_book() -> &'static Codebook<4> {
    static BOOK: OnceLock<Codebook<4>> = OnceLock::new();
    BOOK.get_or_init(|| Codebook::new(GgmlType::IQ3_XXS, 2, 8))
}

fn iq3s_book() -> &'static Codebook<4> {
    static BOOK: OnceLock<Codebook<4>> = OnceLock::new();
    BOOK.get_or_init(|| Codebook::new(GgmlType::IQ3_S, 3, 8))
}

/// `Σ x²` in order.
pub(crate) fn sum_x2(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |s, &v| s + v * v)
}

/// The weights of one group: `qw · √(σ² + x²)` with an importance matrix,
/// else `x²`.
fn group_weights(x: &[f32], qw: Option<&[f32]>, sigma2: f32, w: &mut [f32]) {
    for (i, w) in w.iter_mut().enumerate() {
        *w = match qw {
            Some(qw) => qw[i] * (sigma2 + x[i] * x[i]).sqrt(),
            None => x[i] * x[i],
        };
    }
}

/// Splits 8 values into magnitudes `xval` and sign bits; with `even`, the
/// sign of the value of least `w·x²` (the first of equals) is flipped when
/// the count of negatives is odd, so that 7 bits hold the signs (the eighth
/// is their parity, [`KSIGNS`](memwall_format::blocks::KSIGNS)).
fn split_signs(x: &[f32], w: &[f32], xval: &mut [f32], even: bool) -> u8 {
    let mut s = 0u8;
    for i in 0..8 {
        if x[i] >= 0.0 {
            xval[i] = x[i];
        } else {
            xval[i] = -x[i];
            s |= 1 << i;
        }
    }
    if even && s.count_ones() % 2 == 1 {
        let mut imin = 0;
        let mut min = w[0] * x[0] * x[0];
        for i in 1..8 {
            let ax = w[i] * x[i] * x[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    if even { s & 127 } else { s }
}

/// C's `MAX(a, b)`: `a > b ? a : b`.
pub(crate) fn cmax(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// `Σ w·x·q` and `Σ w·q²` for levels `l` (`q = 2l + 1`).
fn fit_sums(x: &[f32], w: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for i in 0..x.len() {
        let q = f32::from(2 * l[i] + 1);
        sumqx += w[i] * x[i] * q;
        sumq2 += w[i] * q * q;
    }
    (sumqx, sumq2)
}

/// Levels of `x` under the inverse scale `id`: `nearest(½(id·x − 1))` in `0..nmax`.
fn round_levels(x: &[f32], id: f32, nmax: i32, l: &mut [i8]) {
    for (l, &x) in l.iter_mut().zip(x) {
        *l = nearest_int(0.5 * (id * x - 1.0)).clamp(0, nmax - 1) as i8;
    }
}

/// One group's scan: levels of `xval` in codebook points of `K` values each
/// (`xval.len() / K` points) at inverse scales `(2·nmax − 1 + is·step) / base`,
/// keeping the scale of the best weighted fit.
struct Search<'a, const K: usize> {
    book: &'a Codebook<K>,
    nmax: i32,
    steps: std::ops::RangeInclusive<i32>,
    step: f32,
    /// Re-round every point at the end, not only those that were off the grid.
    refine_all: bool,
}

/// One group's values and weights, for [`Fit::settle`].
struct Fit<'a> {
    xval: &'a [f32],
    w: &'a [f32],
    waux: &'a [f32],
    nmax: i32,
    /// Signs with even parity (7 bits kept) rather than explicit.
    even: bool,
    /// Round every point again, not only those off the grid (IQ3_S).
    reround_all: bool,
}

impl Fit<'_> {
    /// The end of a group's fit, as ggml ends it: if the scan's best left
    /// points off the grid (`off`), those (with `reround_all`, all) rounded
    /// again at the best scale and the scale refitted to them; a negative scale made
    /// positive with the signs flipped; the points of the levels to `points`.
    fn settle<const K: usize>(
        &self,
        book: &Codebook<K>,
        mut scale: f32,
        off: &[bool; 8],
        l: &mut [i8],
        signs: &mut [u8],
        points: &mut [u16],
    ) -> f32 {
        if off.iter().any(|&o| o) && scale > 0.0 {
            for (k, &o) in off.iter().enumerate().take(points.len()) {
                if o || self.reround_all {
                    reround(book, k, self.xval, self.waux, scale, self.nmax, l);
                }
            }
            let (sumqx, sumq2) = fit_sums(self.xval, self.w, l);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        if scale < 0.0 {
            scale = -scale;
            for s in signs.iter_mut() {
                *s = if self.even { !*s & 127 } else { !*s };
            }
        }
        for (k, p) in points.iter_mut().enumerate() {
            *p = on_grid(book, &l[K * k..K * k + K]);
        }
        scale
    }
}

/// Places the levels of point `k` after the final rounding at `scale`.
fn reround<const K: usize>(
    book: &Codebook<K>,
    k: usize,
    xval: &[f32],
    waux: &[f32],
    scale: f32,
    nmax: i32,
    l: &mut [i8],
) {
    let r = K * k..K * k + K;
    round_levels(&xval[r.clone()], 1.0 / scale, nmax, &mut l[r.clone()]);
    // `nearest` leaves levels that are a point as they are and writes the
    // chosen neighbour's otherwise: either way `l` holds the point's levels.
    book.nearest(&mut l[r.clone()], &xval[r.clone()], &waux[r], scale);
}

/// The point of levels that [`Search`] and [`reround`] left on the grid.
fn on_grid<const K: usize>(book: &Codebook<K>, l: &[i8]) -> u16 {
    // Every level vector the searches leave is a point (or was replaced by
    // one); ggml aborts otherwise.
    book.point(l).unwrap_or(0)
}

/// The 4-bit super-block scale index of a group scale: `nearest(½(id·s − 1))` in 0..16.
fn scale_index(id: f32, s: f32) -> u32 {
    nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15) as u32
}

/// IQ2_XXS: groups of 32 with `make_qp_quants` starting the scan.
pub(crate) fn iq2_xxs(x: &[f32], y: &mut BlockIq2Xxs, qw: &[f32]) {
    let book = iq2xxs_book();
    let sigma2 = sum_x2(x) / 256.0;
    let mut q2 = [0u32; 16];
    let mut scales = [0f32; 8];
    let mut max_scale = 0f32;
    let (mut w, mut waux, mut xval) = ([0f32; 32], [0f32; 32], [0f32; 32]);
    for ib in 0..8 {
        let xb = &x[32 * ib..][..32];
        group_weights(xb, Some(&qw[32 * ib..][..32]), sigma2, &mut w);
        for (a, &w) in waux.iter_mut().zip(&w) {
            *a = w.sqrt();
        }
        let mut signs = [0u8; 4];
        for k in 0..4 {
            let r = 8 * k..8 * k + 8;
            signs[k] = split_signs(&xb[r.clone()], &w[r.clone()], &mut xval[r], true);
        }
        let max = xval.iter().skip(1).fold(xval[0], |m, &v| cmax(m, v));
        if max < GROUP_MAX_EPS {
            continue;
        }
        let mut lu = [0u8; 32];
        let start = make_qp_quants(4, &xval, &mut lu, &w);
        let eff_max = start * 3.0;
        if eff_max <= 0.0 {
            continue;
        }
        let mut l = lu.map(|v| v as i8);
        let search = Search::<8> {
            book,
            nmax: 3,
            steps: -6..=6,
            step: 0.1,
            refine_all: true,
        };
        let (mut scale, _) = search.fit_tracked(&xval, &w, &waux, eff_max, start, &mut l);
        if scale > 0.0 {
            for k in 0..4 {
                reround(book, k, &xval, &waux, scale, 3, &mut l);
            }
            let (sumqx, sumq2) = fit_sums(&xval, &w, &l);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        if scale < 0.0 {
            scale = -scale;
            signs = signs.map(|s| !s & 127);
        }
        for k in 0..4 {
            let p = on_grid(book, &l[8 * k..8 * k + 8]);
            q2[2 * ib] |= u32::from(p) << (8 * k);
            q2[2 * ib + 1] |= u32::from(signs[k]) << (7 * k);
        }
        scales[ib] = scale;
        max_scale = cmax(max_scale, scale);
    }
    *y = BlockIq2Xxs {
        d: F16::from_f32(0.0),
        qs: [0; 64],
    };
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    y.d = F16::from_f32(d);
    let id = 1.0 / d;
    for ib in 0..8 {
        q2[2 * ib + 1] |= scale_index(id, scales[ib]) << 28;
    }
    for (o, v) in y.qs.chunks_exact_mut(4).zip(q2) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// The IQ2_XS and IQ2_S fits of one super-block, per group of 16: its scale,
/// two point indices and two sign bytes. `xs` selects IQ2_XS's even-parity
/// signs and `σ² = Σx²/256` (IQ2_S: explicit signs, `σ² = 2Σx²/256`, weights
/// `σ²/4 + x²` without an importance matrix).
struct Iq2Groups {
    scales: [f32; 16],
    points: [[u16; 2]; 16],
    signs: [[u8; 2]; 16],
    max_scale: f32,
}

fn iq2_groups(x: &[f32], qw: Option<&[f32]>, book: &Codebook<8>, xs: bool) -> Iq2Groups {
    let sigma2 = if xs {
        sum_x2(x) / 256.0
    } else {
        2.0 * sum_x2(x) / 256.0
    };
    let mut out = Iq2Groups {
        scales: [0.0; 16],
        points: [[0; 2]; 16],
        signs: [[0; 2]; 16],
        max_scale: 0.0,
    };
    let (mut w, mut waux, mut xval) = ([0f32; 16], [0f32; 16], [0f32; 16]);
    for ib in 0..16 {
        let xb = &x[16 * ib..][..16];
        match qw {
            Some(qw) => group_weights(xb, Some(&qw[16 * ib..][..16]), sigma2, &mut w),
            None => {
                for (w, &x) in w.iter_mut().zip(xb) {
                    *w = 0.25 * sigma2 + x * x;
                }
            }
        }
        for (a, &w) in waux.iter_mut().zip(&w) {
            *a = w.sqrt();
        }
        let mut signs = [0u8; 2];
        for k in 0..2 {
            let r = 8 * k..8 * k + 8;
            signs[k] = split_signs(&xb[r.clone()], &w[r.clone()], &mut xval[r], xs);
        }
        let max = xval.iter().skip(1).fold(xval[0], |m, &v| cmax(m, v));
        let mut l = [0i8; 16];
        if max < if xs { GROUP_MAX_EPS } else { 1e-8 } {
            continue;
        }
        let search = Search::<8> {
            book,
            nmax: 3,
            steps: -9..=9,
            step: 0.1,
            refine_all: false,
        };
        let (scale, off) = search.fit_tracked(&xval, &w, &waux, max, max / 5.0, &mut l);
        let fit = Fit {
            xval: &xval,
            w: &w,
            waux: &waux,
            nmax: 3,
            even: xs,
            reround_all: false,
        };
        let scale = fit.settle(book, scale, &off, &mut l, &mut signs, &mut out.points[ib]);
        out.signs[ib] = signs;
        out.scales[ib] = scale;
        out.max_scale = cmax(out.max_scale, scale);
    }
    out
}

/// The sixteen 4-bit scale indices of IQ2_XS/IQ2_S, two a byte.
fn pack_scales16(scales: &[f32; 16], id: f32) -> [u8; 8] {
    std::array::from_fn(|i| {
        scale_index(id, scales[2 * i]) as u8 | ((scale_index(id, scales[2 * i + 1]) as u8) << 4)
    })
}

/// IQ2_XS (needs importance weights).
pub(crate) fn iq2_xs(x: &[f32], y: &mut BlockIq2Xs, qw: &[f32]) {
    let g = iq2_groups(x, Some(qw), iq2xs_book(), true);
    *y = BlockIq2Xs {
        d: F16::from_f32(0.0),
        qs: [0; 64],
        scales: [0; 8],
    };
    if g.max_scale == 0.0 {
        return;
    }
    let d = g.max_scale / 31.0;
    y.d = F16::from_f32(d);
    y.scales = pack_scales16(&g.scales, 1.0 / d);
    for ib in 0..16 {
        for k in 0..2 {
            let v = g.points[ib][k] | (u16::from(g.signs[ib][k]) << 9);
            y.qs[2 * (2 * ib + k)..][..2].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// IQ2_S.
pub(crate) fn iq2_s(x: &[f32], y: &mut BlockIq2S, qw: Option<&[f32]>) {
    let g = iq2_groups(x, qw, iq2s_book(), false);
    *y = BlockIq2S {
        d: F16::from_f32(0.0),
        qs: [0; 32],
        signs: [0; 32],
        qh: [0; 8],
        scales: [0; 8],
    };
    for ib in 0..16 {
        for k in 0..2 {
            let (i8, p) = (2 * ib + k, g.points[ib][k]);
            y.qs[i8] = p as u8;
            y.qh[i8 / 4] |= ((p >> 8) as u8) << (2 * (i8 % 4));
            y.signs[i8] = g.signs[ib][k];
        }
    }
    if g.max_scale == 0.0 {
        return;
    }
    let d = g.max_scale / 31.0;
    y.d = F16::from_f32(d * 0.9875);
    y.scales = pack_scales16(&g.scales, 1.0 / d);
}

impl<const K: usize> Search<'_, K> {
    /// Scans from the scale `start`; returns the best scale and which points
    /// of the best scan were off the grid (none, or with `refine_all` all of
    /// them, if no scan improved on the start); the best levels go to `l`.
    fn fit_tracked(
        &self,
        xval: &[f32],
        w: &[f32],
        waux: &[f32],
        base: f32,
        start: f32,
        l: &mut [i8],
    ) -> (f32, [bool; 8]) {
        let n = xval.len();
        let groups = n / K;
        let mut laux = [0i8; 32];
        let laux = &mut laux[..n];
        let mut on = [!self.refine_all; 8];
        let mut on_aux = [true; 8];
        let mut scale = start;
        let mut best = 0f32;
        for is in self.steps.clone() {
            let id = ((2 * self.nmax - 1) as f32 + is as f32 * self.step) / base;
            let this_scale = 1.0 / id;
            for k in 0..groups {
                let r = K * k..K * k + K;
                round_levels(&xval[r.clone()], id, self.nmax, &mut laux[r.clone()]);
                on_aux[k] = self.book.point(&laux[r.clone()]).is_some();
                if !on_aux[k] {
                    self.book
                        .nearest(&mut laux[r.clone()], &xval[r.clone()], &waux[r], this_scale);
                }
            }
            let (sumqx, sumq2) = fit_sums(xval, w, laux);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                l.copy_from_slice(laux);
                on[..groups].copy_from_slice(&on_aux[..groups]);
            }
        }
        (scale, on.map(|o| !o))
    }
}

/// The IQ3 fits of one super-block: per group of 32, its scale, 8 point
/// indices and 4 sign bytes (`None` for a group ggml skips as all zero).
struct Iq3Groups {
    scales: [f32; 8],
    points: [[u16; 8]; 8],
    signs: [[u8; 4]; 8],
    skipped: [bool; 8],
    max_scale: f32,
}

/// The IQ3 fits: `xxs` selects IQ3_XXS's even-parity signs, its scan
/// (`is` in −15..=15) and its re-rounding of the off-grid points only;
/// IQ3_S has explicit signs, `is` in −9..=9 and re-rounds every point.
fn iq3_groups(x: &[f32], qw: Option<&[f32]>, book: &Codebook<4>, xxs: bool) -> Iq3Groups {
    let sigma2 = 2.0 * sum_x2(x) / 256.0;
    let mut out = Iq3Groups {
        scales: [0.0; 8],
        points: [[0; 8]; 8],
        signs: [[0; 4]; 8],
        skipped: [false; 8],
        max_scale: 0.0,
    };
    let (mut w, mut waux, mut xval) = ([0f32; 32], [0f32; 32], [0f32; 32]);
    for ib in 0..8 {
        let xb = &x[32 * ib..][..32];
        group_weights(xb, qw.map(|q| &q[32 * ib..][..32]), sigma2, &mut w);
        for (a, &w) in waux.iter_mut().zip(&w) {
            *a = w.sqrt();
        }
        let mut signs = [0u8; 4];
        for k in 0..4 {
            let r = 8 * k..8 * k + 8;
            signs[k] = split_signs(&xb[r.clone()], &w[r.clone()], &mut xval[r], xxs);
        }
        let max = xval.iter().skip(1).fold(xval[0], |m, &v| cmax(m, v));
        let mut l = [0i8; 32];
        let empty = if xxs { max < 1e-8 } else { max == 0.0 };
        if empty {
            out.skipped[ib] = true;
            continue;
        }
        let search = Search::<4> {
            book,
            nmax: 8,
            steps: if xxs { -15..=15 } else { -9..=9 },
            step: 0.2,
            refine_all: !xxs,
        };
        let (scale, off) = search.fit_tracked(&xval, &w, &waux, max, max / 15.0, &mut l);
        let fit = Fit {
            xval: &xval,
            w: &w,
            waux: &waux,
            nmax: 8,
            even: xxs,
            reround_all: !xxs,
        };
        let scale = fit.settle(book, scale, &off, &mut l, &mut signs, &mut out.points[ib]);
        out.signs[ib] = signs;
        out.scales[ib] = scale;
        out.max_scale = cmax(out.max_scale, scale);
    }
    out
}

/// IQ3_XXS.
pub(crate) fn iq3_xxs(x: &[f32], y: &mut BlockIq3Xxs, qw: Option<&[f32]>) {
    let g = iq3_groups(x, qw, iq3xxs_book(), true);
    *y = BlockIq3Xxs {
        d: F16::from_f32(0.0),
        qs: [0; 64],
        sas: [0; 32],
    };
    if g.max_scale == 0.0 {
        return;
    }
    let d = g.max_scale / 31.0;
    y.d = F16::from_f32(d * 1.0125);
    let id = 1.0 / d;
    for ib in 0..8 {
        if g.skipped[ib] {
            continue;
        }
        for k in 0..8 {
            y.qs[8 * ib + k] = g.points[ib][k] as u8;
        }
    }
    for ib in 0..8 {
        let s = &g.signs[ib];
        let mut sas = u32::from(s[0])
            | (u32::from(s[1]) << 7)
            | (u32::from(s[2]) << 14)
            | (u32::from(s[3]) << 21);
        sas |= scale_index(id, g.scales[ib]) << 28;
        y.sas[4 * ib..][..4].copy_from_slice(&sas.to_le_bytes());
    }
}

/// IQ3_S. As in ggml, a group skipped as all zero does not advance the
/// positions its points and signs are written at, so the following groups'
/// low index bytes and signs move up one group (their ninth bits do not).
pub(crate) fn iq3_s(x: &[f32], y: &mut BlockIq3S, qw: Option<&[f32]>) {
    let g = iq3_groups(x, qw, iq3s_book(), false);
    *y = BlockIq3S {
        d: F16::from_f32(0.0),
        qs: [0; 64],
        qh: [0; 8],
        signs: [0; 32],
        scales: [0; 4],
    };
    let mut at = 0;
    for ib in 0..8 {
        if g.skipped[ib] {
            continue;
        }
        for k in 0..8 {
            let p = g.points[ib][k];
            y.qs[8 * at + k] = p as u8;
            y.qh[ib] |= ((p >> 8) as u8) << k;
        }
        y.signs[4 * at..][..4].copy_from_slice(&g.signs[ib]);
        at += 1;
    }
    if g.max_scale == 0.0 {
        return;
    }
    let d = g.max_scale / 31.0;
    y.d = F16::from_f32(d * 1.033);
    let id = 1.0 / d;
    for ib in (0..8).step_by(2) {
        let l1 = scale_index(id, g.scales[ib]) as u8;
        let l2 = scale_index(id, g.scales[ib + 1]) as u8;
        y.scales[ib / 2] = l1 | (l2 << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_error_is_the_first_of_equals_in_list_order_on_every_path() {
        // Points of one value, so that errors repeat: ties within a lane,
        // across lanes and chunks, and repeats of the last point past `n`.
        let lists: [&[i8]; 6] = [
            &[5, 3, 3, 7, 1, 3, 9, 1, 3, 1, 5],
            &[9, 9, 9],
            &[7, 5, 3, 1, 1, 3, 5, 7, 1, 9, 1, 1, 3, 1, 5, 1, 1],
            &[3],
            &[1, 1, 1, 1, 1, 1, 1, 1, 1],
            &[9, 7, 5, 3, 1, 3, 5, 7, 9, 11, 13, 1],
        ];
        for (k, list) in lists.iter().enumerate() {
            let chunks: Vec<[[i8; NEAREST_LANES]; 1]> = list
                .chunks(NEAREST_LANES)
                .map(|c| {
                    let mut v = [c[c.len() - 1]; NEAREST_LANES];
                    v[..c.len()].copy_from_slice(c);
                    [v]
                })
                .collect();
            for (x, scale) in [(1.0, 1.0), (3.0, 1.0), (9.0, 1.0), (1.0, f32::MAX)] {
                let (x, w) = ([x], [1.0]);
                let want = list
                    .iter()
                    .map(|&q| {
                        let diff = scale * f32::from(q) - x[0];
                        w[0] * diff * diff
                    })
                    .enumerate()
                    .fold(
                        (f32::MAX, None),
                        |b, (i, e)| if e < b.0 { (e, Some(i)) } else { b },
                    )
                    .1;
                let n = list.len();
                let portable = least_portable(&chunks, n, &x, &w, scale, Values::Odd);
                assert_eq!(portable, want, "list {k}, x {}, scale {scale}", x[0]);
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 is present (checked above).
                    let wide = unsafe { least_avx2(&chunks, n, &x, &w, scale, Values::Odd) };
                    assert_eq!(wide, want, "AVX2: list {k}, x {}, scale {scale}", x[0]);
                }
            }
        }
    }
}
