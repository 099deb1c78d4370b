//! Tiled prompt products of the K-quants, IQ4_XS, the lattice i-quants and the ternary types: a work item's weight
//! rows are unpacked once into *panels* of signed byte values and integer
//! sub-block scales, which every tile of tokens then reads with byte dot
//! products: AVX-512 `vpdpbusd` on sixteen weight rows to a register, AVX2
//! `vpmaddubsw` on eight (for the types whose values are at most 64 in
//! magnitude, [`Layout::max_value`], as its 16-bit pair sums must not
//! saturate: all but IQ4_XS).
//!
//! The arithmetic is the canonical order's (kernels/mod.rs): a super-block's
//! integer sums are exact in any order. The byte products take unsigned
//! activations, `a + 128` (the Q8_K quants with their top bit flipped), and
//! the 128 comes back out through the weights alone:
//!
//! `Σ_s sc[s] · Σ_i v_i · a_i = Σ_s sc[s] · Σ_i v_i · (a_i + 128) − 128 · Σ_s sc[s] · Σ_i v_i`
//!
//! where the last sum, the row's *bias*, is unpacked with its values. The
//! types with minimums (Q2_K, Q4_K, Q5_K) add the term's
//! `summs = Σ_g m[g] · bsums[g]` over the sixteen 16-weight groups `g` of the
//! activation super-block (`bsums`, stored by Q8_K). Then each (row, token)
//! gets the scalar term, added to partial `b % 8`, and the tree of eight: the
//! single product's bits.
//!
//! A panel holds sixteen rows ([`ROWS`]); per super-block it is one record
//! ([`record_bytes`]):
//!
//! | bytes                  | content                                                |
//! |------------------------|--------------------------------------------------------|
//! | `64k + 4r + i`         | value of weight `4k + i` of row `r` (`i8`, `k < 64`)   |
//! | `4096 + 64s + 4r`      | sub-block `s`'s scale of row `r` (`i32`, `s < nsub`)   |
//! | `C + 64p + 4r`         | `m[2p]`, `m[2p + 1]` of row `r` (`i16` pair, `p < 8`)  |
//! | `C + 512 + 4r`         | row `r`'s bias (`i32`)                                 |
//! | `C + 576 + 4r`         | row `r`'s `d` (`f32`); then its `dmin` at `+64`        |
//!
//! with `C = 4096 + 64·nsub`; little-endian. Rows past the matrix are zero.

use memwall_format::GgmlType;
use memwall_format::blocks::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Xs, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockTq1_0, BlockTq2_0,
    IQ4NL_GRID, Lattice, as_blocks,
};

use super::scalar::k4_scales;
use super::{BlockQ8K, QMatrix};

/// Weight rows per panel: one 512-bit register of 32-bit lanes.
pub(crate) const ROWS: usize = 16;

/// Weights per super-block.
const QK: usize = 256;

/// How a type's super-block sums are formed from its panel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Layout {
    /// Sub-blocks per super-block, each with its own scale: 8 (of 32
    /// weights) or 16 (of 16).
    pub(crate) nsub: usize,
    /// Whether the type has minimums (term `(d·d_a)·isum −
    /// (dmin·d_a)·summs`; without, `(d·d_a)·isum`).
    pub(crate) mins: bool,
    /// The largest magnitude of the type's values: products with 16-bit
    /// intermediate sums (AVX2's `vpmaddubsw`) take only small values.
    pub(crate) max_value: u8,
    /// The power of two the sum of the terms is multiplied by at the end
    /// (the lattice types' [`Lattice::FACTOR`]; 1 for the others).
    pub(crate) factor: f32,
}

impl Layout {
    /// A type whose sum of terms is the product (no final factor).
    const fn scaled(nsub: usize, mins: bool, max_value: u8) -> Layout {
        Layout {
            nsub,
            mins,
            max_value,
            factor: 1.0,
        }
    }
}

/// Bytes of one super-block's record of a panel.
pub(crate) const fn record_bytes(nsub: usize) -> usize {
    4096 + 64 * nsub + 512 + 64 + 128
}

/// Super-blocks per row of `panel` (records of [`record_bytes`]`(nsub)`),
/// checked against `acts` (as many records of [`ACT_BYTES`]): the x86-64
/// kernels' length check.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn records(nsub: usize, panel: &[u8], acts: &[u8]) -> usize {
    let rec = record_bytes(nsub);
    let nb = panel.len() / rec;
    assert!(
        panel.len() == nb * rec && acts.len() == nb * ACT_BYTES,
        "tiled lengths"
    );
    nb
}

/// A super-block unpacked: values in weight order, sub-block scales, the
/// sixteen groups' minimums and the two scales.
struct Unpacked {
    values: [i8; QK],
    scales: [i32; 16],
    mins: [i16; 16],
    d: f32,
    dmin: f32,
}

impl Unpacked {
    const ZERO: Unpacked = Unpacked {
        values: [0; QK],
        scales: [0; 16],
        mins: [0; 16],
        d: 0.0,
        dmin: 0.0,
    };
}

/// A block type with a tiled product.
trait Tiled: Block {
    const LAYOUT: Layout;
    fn unpack(&self, u: &mut Unpacked);
}

impl Tiled for BlockQ2K {
    const LAYOUT: Layout = Layout::scaled(16, true, 3);
    fn unpack(&self, u: &mut Unpacked) {
        for (k, q) in self.qs.chunks_exact(32).enumerate() {
            for j in 0..4 {
                for (l, &q) in q.iter().enumerate() {
                    u.values[128 * k + 32 * j + l] = ((q >> (2 * j)) & 3) as i8;
                }
            }
        }
        for (g, &s) in self.scales.iter().enumerate() {
            u.scales[g] = i32::from(s & 0xf);
            u.mins[g] = i16::from(s >> 4);
        }
        (u.d, u.dmin) = (self.d.to_f32(), self.dmin.to_f32());
    }
}

impl Tiled for BlockQ3K {
    const LAYOUT: Layout = Layout::scaled(16, false, 4);
    fn unpack(&self, u: &mut Unpacked) {
        for (k, q) in self.qs.chunks_exact(32).enumerate() {
            for j in 0..4 {
                let m = 1u8 << (4 * k + j);
                for (l, (&q, &h)) in q.iter().zip(&self.hmask).enumerate() {
                    let low = if h & m != 0 { 0 } else { 4 };
                    u.values[128 * k + 32 * j + l] = ((q >> (2 * j)) & 3) as i8 - low;
                }
            }
        }
        for (g, s) in self.sub_scales().into_iter().enumerate() {
            u.scales[g] = i32::from(s);
        }
        (u.d, u.dmin) = (self.d.to_f32(), 0.0);
    }
}

/// The sub-block scales and minimums of Q4_K and Q5_K.
fn k4_unpack(scales: &[u8; 12], u: &mut Unpacked) {
    let (sc, m) = k4_scales(scales);
    for j in 0..8 {
        u.scales[j] = i32::from(sc[j]);
        u.mins[2 * j] = i16::from(m[j]);
        u.mins[2 * j + 1] = i16::from(m[j]);
    }
}

impl Tiled for BlockQ4K {
    const LAYOUT: Layout = Layout::scaled(8, true, 15);
    fn unpack(&self, u: &mut Unpacked) {
        for (c, q) in self.qs.chunks_exact(32).enumerate() {
            for (l, &q) in q.iter().enumerate() {
                u.values[64 * c + l] = (q & 0xf) as i8;
                u.values[64 * c + 32 + l] = (q >> 4) as i8;
            }
        }
        k4_unpack(&self.scales, u);
        (u.d, u.dmin) = (self.d.to_f32(), self.dmin.to_f32());
    }
}

impl Tiled for BlockQ5K {
    const LAYOUT: Layout = Layout::scaled(8, true, 31);
    fn unpack(&self, u: &mut Unpacked) {
        for (c, q) in self.qs.chunks_exact(32).enumerate() {
            for (l, (&q, &h)) in q.iter().zip(&self.qh).enumerate() {
                u.values[64 * c + l] = ((q & 0xf) | (((h >> (2 * c)) & 1) << 4)) as i8;
                u.values[64 * c + 32 + l] = ((q >> 4) | (((h >> (2 * c + 1)) & 1) << 4)) as i8;
            }
        }
        k4_unpack(&self.scales, u);
        (u.d, u.dmin) = (self.d.to_f32(), self.dmin.to_f32());
    }
}

impl Tiled for BlockQ6K {
    const LAYOUT: Layout = Layout::scaled(16, false, 32);
    fn unpack(&self, u: &mut Unpacked) {
        // Values −32..31, in halves of 128: four low nibbles of `ql` under
        // two bits of `qh` each, less 32.
        for n in 0..2 {
            let (ql, qh) = (&self.ql[64 * n..][..64], &self.qh[32 * n..][..32]);
            let v = &mut u.values[128 * n..][..128];
            for l in 0..32 {
                let (a, b, h) = (ql[l], ql[32 + l], qh[l]);
                v[l] = ((a & 0xf) | ((h & 3) << 4)) as i8 - 32;
                v[32 + l] = ((b & 0xf) | (((h >> 2) & 3) << 4)) as i8 - 32;
                v[64 + l] = ((a >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                v[96 + l] = ((b >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        for (g, &s) in self.scales.iter().enumerate() {
            u.scales[g] = i32::from(s);
        }
        (u.d, u.dmin) = (self.d.to_f32(), 0.0);
    }
}

impl Tiled for BlockIq4Xs {
    const LAYOUT: Layout = Layout::scaled(8, false, 127);
    fn unpack(&self, u: &mut Unpacked) {
        let value = |q: u8| IQ4NL_GRID[usize::from(q)];
        for (ib, q) in self.qs.chunks_exact(16).enumerate() {
            for (j, &q) in q.iter().enumerate() {
                u.values[32 * ib + j] = value(q & 0xf);
                u.values[32 * ib + 16 + j] = value(q >> 4);
            }
        }
        u.scales[..8].copy_from_slice(&self.sub_scales());
        (u.d, u.dmin) = (self.d.to_f32(), 0.0);
    }
}

/// The ternary types: values `t − 1` under one scale, as eight sub-blocks
/// of scale 1 (the super-block's integer sum is the single product's). TQ1_0's
/// trits give −1, 0 or 1; TQ2_0's two bits also hold 3 (never written by
/// llama.cpp, read as 2 like everywhere else).
impl Tiled for BlockTq1_0 {
    const LAYOUT: Layout = Layout::scaled(8, false, 1);
    fn unpack(&self, u: &mut Unpacked) {
        for (v, t) in u.values.iter_mut().zip(self.trits()) {
            *v = t as i8 - 1;
        }
        u.scales[..8].fill(1);
        (u.d, u.dmin) = (self.d.to_f32(), 0.0);
    }
}

impl Tiled for BlockTq2_0 {
    const LAYOUT: Layout = Layout::scaled(8, false, 2);
    fn unpack(&self, u: &mut Unpacked) {
        for (i, v) in u.values.iter_mut().enumerate() {
            *v = self.value(i) as i8 - 1;
        }
        u.scales[..8].fill(1);
        (u.d, u.dmin) = (self.d.to_f32(), 0.0);
    }
}

/// The lattice types: the signed values and integer scales of their
/// [`Groups`](memwall_format::blocks::Groups), under `d`; `max_value` is the largest
/// grid value (with the IQ1 offset, `8·1 + 1`).
macro_rules! lattice_tiled {
    ($($b:ident $max:literal),*) => {$(
        impl Tiled for $b {
            const LAYOUT: Layout = Layout {
                nsub: if <$b as Lattice>::HALVES { 16 } else { 8 },
                mins: false,
                max_value: $max,
                factor: <$b as Lattice>::FACTOR,
            };
            fn unpack(&self, u: &mut Unpacked) {
                let g = self.groups();
                u.values = g.q;
                for (s, &ls) in u.scales.iter_mut().zip(&g.ls) {
                    *s = i32::from(ls);
                }
                (u.d, u.dmin) = (self.d().to_f32(), 0.0);
            }
        }
    )*};
}

lattice_tiled!(
    BlockIq2Xxs 43, BlockIq2Xs 43, BlockIq2S 43, BlockIq3Xxs 62, BlockIq3S 15, BlockIq1S 9,
    BlockIq1M 9
);

/// `$body` with the type alias `$b` naming the block of `$ty`, for the
/// types with a tiled product; `$none` for the others.
macro_rules! with_block {
    ($ty:expr, $b:ident => $body:expr, _ => $none:expr) => {
        with_block!(@ $ty, $b, $body, $none;
            Q2_K BlockQ2K, Q3_K BlockQ3K, Q4_K BlockQ4K, Q5_K BlockQ5K, Q6_K BlockQ6K,
            IQ4_XS BlockIq4Xs, IQ2_XXS BlockIq2Xxs, IQ2_XS BlockIq2Xs, IQ2_S BlockIq2S,
            IQ3_XXS BlockIq3Xxs, IQ3_S BlockIq3S, IQ1_S BlockIq1S, IQ1_M BlockIq1M,
            TQ1_0 BlockTq1_0, TQ2_0 BlockTq2_0)
    };
    (@ $ty:expr, $b:ident, $body:expr, $none:expr; $($t:ident $blk:ident),*) => {
        match $ty {
            $(GgmlType::$t => {
                type $b = $blk;
                $body
            })*
            _ => $none,
        }
    };
}

/// The layout of `ty`'s tiled product, if it has one.
pub(crate) fn layout(ty: GgmlType) -> Option<Layout> {
    with_block!(ty, B => Some(B::LAYOUT), _ => None)
}

/// Writes the panels of rows `rows` of `w` (a type [`layout`] knows) into
/// `out`: `rows.len().div_ceil(ROWS)` panels of `nb` records, rows past the
/// range zero. Panics if `out` is not exactly that long.
pub(crate) fn unpack(w: &QMatrix<'_>, rows: std::ops::Range<usize>, out: &mut [u8]) {
    with_block!(w.ty(), B => unpack_as::<B>(w, rows, out), _ => panic!("no tiled product for {}", w.ty()))
}

fn unpack_as<B: Tiled>(w: &QMatrix<'_>, rows: std::ops::Range<usize>, out: &mut [u8]) {
    let nsub = B::LAYOUT.nsub;
    let (rec, nb) = (record_bytes(nsub), w.cols() / QK);
    let panels = rows.len().div_ceil(ROWS);
    assert_eq!(out.len(), panels * nb * rec, "tiled panel length");
    if rows.len() % ROWS != 0 {
        // The last panel's rows past the range.
        out[(panels - 1) * nb * rec..].fill(0);
    }
    let mut u = Unpacked::ZERO;
    // Record by record, each filled by its panel's rows while it is in the
    // first-level cache: row by row, every record of the panel would be
    // written once per row.
    for (panel, out) in out.chunks_exact_mut(nb * rec).enumerate() {
        let first = rows.start + panel * ROWS;
        let mut blocks: [&[B]; ROWS] = [&[]; ROWS];
        let n = (rows.end - first).min(ROWS);
        for (row, r) in blocks.iter_mut().zip(first..first + n) {
            *row = as_blocks(w.row(r));
        }
        for (b, o) in out.chunks_exact_mut(rec).enumerate() {
            for (i, row) in blocks[..n].iter().enumerate() {
                row[b].unpack(&mut u);
                write_row::<B>(&u, 4 * i, o);
            }
        }
    }
}

/// Writes super-block `u` as the row of byte offset `lane` (4 × its index
/// in the panel) of record `o`.
fn write_row<B: Tiled>(u: &Unpacked, lane: usize, o: &mut [u8]) {
    let nsub = B::LAYOUT.nsub;
    let at_c = 4096 + 64 * nsub;
    for (k, v) in u.values.chunks_exact(4).enumerate() {
        let v = [v[0] as u8, v[1] as u8, v[2] as u8, v[3] as u8];
        o[64 * k + lane..][..4].copy_from_slice(&v);
    }
    let mut bias = 0i32;
    for (s, (&sc, v)) in u
        .scales
        .iter()
        .zip(u.values.chunks_exact(QK / nsub))
        .enumerate()
    {
        o[4096 + 64 * s + lane..][..4].copy_from_slice(&sc.to_le_bytes());
        bias += sc * v.iter().map(|&v| i32::from(v)).sum::<i32>();
    }
    if B::LAYOUT.mins {
        for (p, m) in u.mins.chunks_exact(2).enumerate() {
            o[at_c + 64 * p + lane..][..2].copy_from_slice(&m[0].to_le_bytes());
            o[at_c + 64 * p + lane + 2..][..2].copy_from_slice(&m[1].to_le_bytes());
        }
    }
    o[at_c + 512 + lane..][..4].copy_from_slice(&(-128 * bias).to_le_bytes());
    o[at_c + 576 + lane..][..4].copy_from_slice(&u.d.to_le_bytes());
    o[at_c + 640 + lane..][..4].copy_from_slice(&u.dmin.to_le_bytes());
}

/// Tokens per group of the activations' tiled layout.
pub(crate) const TOKENS: usize = 8;

/// Bytes of one super-block of a group of [`TOKENS`] activation rows in the
/// tiled layout: byte `32k + 4t + i` is quant `4k + i` of token `t` plus
/// 128 (unsigned); then from 2048, word `8p + t` holds token `t`'s stored
/// sums `2p`, `2p + 1` (`i16` pair, `p < 8`); then from 2304 the eight
/// scales (`f32`). Little-endian; a group's tokens past the rows are zero.
pub(crate) const ACT_BYTES: usize = 2048 + 256 + 32;

/// Writes `blocks` (`rows` rows of `nb` Q8_K blocks) in the tiled layout:
/// `rows.div_ceil(TOKENS)` groups of `nb` records of [`ACT_BYTES`]. Panics if
/// `out` is not that long.
pub(crate) fn pack_acts(blocks: &[BlockQ8K], nb: usize, out: &mut [u8]) {
    let rows = blocks.len() / nb.max(1);
    assert_eq!(blocks.len(), rows * nb, "tiled activation rows");
    assert_eq!(
        out.len(),
        rows.div_ceil(TOKENS) * nb * ACT_BYTES,
        "tiled activations"
    );
    for (g, out) in out.chunks_exact_mut(nb * ACT_BYTES).enumerate() {
        let tokens = (rows - g * TOKENS).min(TOKENS);
        if tokens < TOKENS {
            out.fill(0);
        }
        for t in 0..tokens {
            let row = &blocks[(g * TOKENS + t) * nb..][..nb];
            for (o, y) in out.chunks_exact_mut(ACT_BYTES).zip(row) {
                for (k, q) in y.qs.chunks_exact(4).enumerate() {
                    for (o, &q) in o[32 * k + 4 * t..][..4].iter_mut().zip(q) {
                        *o = (q as u8) ^ 0x80;
                    }
                }
                for (p, s) in y.bsums.chunks_exact(2).enumerate() {
                    o[2048 + 32 * p + 4 * t..][..2].copy_from_slice(&s[0].to_le_bytes());
                    o[2048 + 32 * p + 4 * t + 2..][..2].copy_from_slice(&s[1].to_le_bytes());
                }
                o[2304 + 4 * t..][..4].copy_from_slice(&y.d.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest value magnitude among `n` blocks of seeded random bytes.
    fn largest_value<B: Tiled>(n: usize) -> u8 {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        // u64 words: aligned for every block type.
        let words: Vec<u64> = (0..n * size_of::<B>().div_ceil(8))
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            })
            .collect();
        let raw: &[u8] = memwall_format::blocks::block_bytes(&words);
        let blocks: &[B] = as_blocks(&raw[..n * size_of::<B>()]);
        let mut u = Unpacked::ZERO;
        let mut largest = 0;
        for b in blocks {
            b.unpack(&mut u);
            largest = u
                .values
                .iter()
                .fold(largest, |m, v| m.max(v.unsigned_abs()));
        }
        largest
    }

    /// AVX2 takes the types whose `max_value` is at most 64 (in two kernels,
    /// split at 32) on the promise that no value is larger; random blocks
    /// reach each type's bound.
    #[test]
    fn max_value_is_each_types_largest_value_magnitude() {
        let mut checked = 0;
        for ty in memwall_format::blocks::DEQUANTIZABLE {
            let largest = with_block!(ty, B => largest_value::<B>(4096), _ => continue);
            assert_eq!(Some(largest), layout(ty).map(|l| l.max_value), "{ty}");
            checked += 1;
        }
        assert_eq!(checked, 15, "the types with a tiled product");
    }
}
