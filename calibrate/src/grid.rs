//! The quantization grid of an encoded ggml block: for every weight, the
//! values it may take once the block's scales are fixed, and the level it
//! holds. GPTQ fixes each block's scales with llama.cpp's own (importance
//! weighted) encoder, then chooses the levels itself, one column at a time;
//! [`Grid::pack`] writes those levels back into the same bytes, so the result
//! is an ordinary block of the same type.
//!
//! Every block decodes as `value = scale · level + offset` (or
//! `scale · IQ4NL_GRID[level]` for the IQ4 types), with `scale` and `offset`
//! shared by a sub-block. The layouts are ggml's (`ggml-common.h`), and the
//! tests check every type against the runtime's decoder.

// Indices say which bits of which byte each weight takes, as ggml-common.h does.
#![allow(clippy::needless_range_loop)]

use memwall_format::GgmlType;
use memwall_format::blocks::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockQ2K, BlockQ3K,
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0,
    BlockTq1_0, BlockTq2_0, IQ4NL_GRID, as_blocks, as_blocks_mut, scale_min_k4,
};

/// The types whose levels GPTQ can choose. Others are encoded without error
/// feedback (importance-weighted rounding, as llama-quantize does).
pub const GPTQ_TYPES: [GgmlType; 15] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::Q3_K,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];

/// The grid of one block: per weight its level and the affine map of its
/// sub-block.
#[derive(Clone, Debug, PartialEq)]
pub struct Grid {
    ty: GgmlType,
    /// Per weight: the level stored.
    pub levels: Vec<i32>,
    /// Per weight: the scale of its sub-block.
    pub scale: Vec<f32>,
    /// Per weight: the offset of its sub-block.
    pub offset: Vec<f32>,
    /// Smallest and largest level.
    pub range: (i32, i32),
}

impl Grid {
    /// Whether the levels index [`IQ4NL_GRID`] rather than counting steps.
    fn table(&self) -> bool {
        matches!(self.ty, GgmlType::IQ4_NL | GgmlType::IQ4_XS)
    }

    /// The value level `q` of weight `i` decodes to.
    pub fn value(&self, i: usize, q: i32) -> f32 {
        let step = if self.table() {
            f32::from(IQ4NL_GRID[q as usize])
        } else {
            q as f32
        };
        self.scale[i] * step + self.offset[i]
    }

    /// The level of weight `i` nearest to `w` (ties to the lower level).
    pub fn nearest(&self, i: usize, w: f32) -> i32 {
        let (lo, hi) = self.range;
        let s = self.scale[i];
        if s == 0.0 || !s.is_finite() {
            return self.levels[i];
        }
        if self.table() {
            let mut best = (f32::INFINITY, lo);
            for q in lo..=hi {
                let d = (self.value(i, q) - w).abs();
                if d < best.0 {
                    best = (d, q);
                }
            }
            return best.1;
        }
        let q = ((w - self.offset[i]) / s).round();
        if q.is_nan() {
            return self.levels[i];
        }
        (q as i64).clamp(i64::from(lo), i64::from(hi)) as i32
    }

    /// A grid of `n` weights of `ty`, with levels `range`, to fill.
    fn new(ty: GgmlType, n: usize, range: (i32, i32)) -> Grid {
        Grid {
            ty,
            levels: vec![0; n],
            scale: vec![0.0; n],
            offset: vec![0.0; n],
            range,
        }
    }

    /// Reads the grid of one block of `ty` (`bytes` is exactly one block).
    /// `None` for types GPTQ does not handle.
    pub fn read(ty: GgmlType, bytes: &[u8]) -> Option<Grid> {
        memwall_format::with_block!(ty, B => B::grid(&as_blocks::<B>(bytes)[0]), _ => None)
    }

    /// Writes `self.levels` into `bytes` (the block it was read from),
    /// leaving every scale as it was.
    pub fn pack(&self, bytes: &mut [u8]) {
        memwall_format::with_block!(self.ty, B => B::pack(self, &mut as_blocks_mut::<B>(bytes)[0]), _ => {})
    }
}

/// The grid of a block type: how [`Grid::read`] reads its levels, scales and
/// offsets, and how [`Grid::pack`] writes levels back. The types GPTQ does
/// not handle keep the defaults (no grid).
trait GridBlock: Block {
    /// The block's grid.
    fn grid(&self) -> Option<Grid> {
        None
    }
    /// Writes `g.levels` into the block, scales untouched.
    fn pack(_g: &Grid, _b: &mut Self) {}
}

impl GridBlock for BlockQ2K {}

/// MXFP4 and NVFP4 keep no grid yet: their FP4 table would need
/// [`Grid::value`]'s table lookup for a second table.
impl GridBlock for BlockMxfp4 {}
impl GridBlock for BlockNvfp4 {}

/// The lattice i-quants keep no grid: a weight's value is one coordinate of a
/// codebook point of 8 (or 4) weights, so GPTQ's one-weight-at-a-time choice
/// of a level does not apply; they get AWQ scaling and importance-weighted
/// encoding.
impl GridBlock for BlockIq2Xxs {}
impl GridBlock for BlockIq2Xs {}
impl GridBlock for BlockIq2S {}
impl GridBlock for BlockIq3Xxs {}
impl GridBlock for BlockIq3S {}
impl GridBlock for BlockIq1S {}
impl GridBlock for BlockIq1M {}

/// The grid of a ternary super-block of `ty`: levels `t` 0..2 of `d · (t − 1)`.
fn ternary_grid(ty: GgmlType, values: [u8; 256], d: f32) -> Grid {
    let mut g = Grid::new(ty, 256, (0, 2));
    for (l, t) in g.levels.iter_mut().zip(values) {
        *l = i32::from(t);
    }
    g.scale.fill(d);
    g.offset.fill(-d);
    g
}

/// A ternary grid's levels as bytes, for packing.
fn ternary_levels(g: &Grid) -> [u8; 256] {
    std::array::from_fn(|i| g.levels[i] as u8)
}

impl GridBlock for BlockTq1_0 {
    fn grid(&self) -> Option<Grid> {
        Some(ternary_grid(GgmlType::TQ1_0, self.trits(), self.d.to_f32()))
    }
    fn pack(g: &Grid, b: &mut Self) {
        b.set_trits(&ternary_levels(g));
    }
}

impl GridBlock for BlockTq2_0 {
    fn grid(&self) -> Option<Grid> {
        let values = std::array::from_fn(|i| self.value(i));
        Some(ternary_grid(GgmlType::TQ2_0, values, self.d.to_f32()))
    }
    fn pack(g: &Grid, b: &mut Self) {
        b.set_values(&ternary_levels(g));
    }
}

/// Q1_0: levels 0 (`−d`) and 1 (`+d`), a step of `2d` from `−d`.
impl GridBlock for BlockQ1_0 {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q1_0, 128, (0, 1));
        for (j, l) in g.levels.iter_mut().enumerate() {
            *l = i32::from(self.positive(j));
        }
        let d = self.d.to_f32();
        g.scale.fill(2.0 * d);
        g.offset.fill(-d);
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        for (q, l) in b.qs.iter_mut().zip(g.levels.chunks_exact(8)) {
            *q = l
                .iter()
                .enumerate()
                .fold(0, |q, (k, &l)| q | u8::from(l != 0) << k);
        }
    }
}

/// Q2_0: levels 0..=3 of `d · (q − 1)`.
impl GridBlock for BlockQ2_0 {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q2_0, 64, (0, 3));
        for (j, l) in g.levels.iter_mut().enumerate() {
            *l = i32::from(self.value(j));
        }
        let d = self.d.to_f32();
        g.scale.fill(d);
        g.offset.fill(-d);
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        for (q, l) in b.qs.iter_mut().zip(g.levels.chunks_exact(4)) {
            *q = l
                .iter()
                .enumerate()
                .fold(0, |q, (k, &l)| q | (l as u8 & 3) << (2 * k));
        }
    }
}

/// Levels `0..16` of 32 weights from 16 nibble bytes (ggml's order: low
/// nibbles are weights 0..16).
fn nibble_levels(qs: &[u8; 16], levels: &mut [i32]) {
    for j in 0..16 {
        levels[j] = i32::from(qs[j] & 0xF);
        levels[j + 16] = i32::from(qs[j] >> 4);
    }
}

/// [`nibble_levels`] written back.
fn pack_nibbles(levels: &[i32], qs: &mut [u8; 16]) {
    for j in 0..16 {
        qs[j] = (levels[j] as u8 & 0xF) | ((levels[j + 16] as u8 & 0xF) << 4);
    }
}

/// Levels `0..32` of 32 weights from nibbles and fifth bits.
fn five_bit_levels(qh: [u8; 4], qs: &[u8; 16], levels: &mut [i32]) {
    let qh = u32::from_le_bytes(qh);
    for j in 0..16 {
        levels[j] = i32::from(qs[j] & 0xF) | (((qh >> j) & 1) << 4) as i32;
        levels[j + 16] = i32::from(qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as i32;
    }
}

/// [`five_bit_levels`] written back.
fn pack_five_bits(levels: &[i32], qh: &mut [u8; 4], qs: &mut [u8; 16]) {
    let mut h = 0u32;
    for j in 0..16 {
        let (a, c) = (levels[j] as u32, levels[j + 16] as u32);
        qs[j] = (a as u8 & 0xF) | ((c as u8 & 0xF) << 4);
        h |= ((a >> 4) & 1) << j | ((c >> 4) & 1) << (j + 16);
    }
    *qh = h.to_le_bytes();
}

impl GridBlock for BlockQ4_0 {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q4_0, 32, (0, 15));
        let d = self.d.to_f32();
        nibble_levels(&self.qs, &mut g.levels);
        g.scale.fill(d);
        g.offset.fill(-8.0 * d);
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        pack_nibbles(&g.levels, &mut b.qs);
    }
}

impl GridBlock for BlockQ4_1 {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q4_1, 32, (0, 15));
        nibble_levels(&self.qs, &mut g.levels);
        g.scale.fill(self.d.to_f32());
        g.offset.fill(self.m.to_f32());
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        pack_nibbles(&g.levels, &mut b.qs);
    }
}

impl GridBlock for BlockIq4Nl {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::IQ4_NL, 32, (0, 15));
        nibble_levels(&self.qs, &mut g.levels);
        g.scale.fill(self.d.to_f32());
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        pack_nibbles(&g.levels, &mut b.qs);
    }
}

impl GridBlock for BlockQ5_0 {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q5_0, 32, (0, 31));
        let d = self.d.to_f32();
        five_bit_levels(self.qh, &self.qs, &mut g.levels);
        g.scale.fill(d);
        g.offset.fill(-16.0 * d);
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        pack_five_bits(&g.levels, &mut b.qh, &mut b.qs);
    }
}

impl GridBlock for BlockQ5_1 {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q5_1, 32, (0, 31));
        five_bit_levels(self.qh, &self.qs, &mut g.levels);
        g.scale.fill(self.d.to_f32());
        g.offset.fill(self.m.to_f32());
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        pack_five_bits(&g.levels, &mut b.qh, &mut b.qs);
    }
}

impl GridBlock for BlockQ8_0 {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q8_0, 32, (-128, 127));
        for (l, &q) in g.levels.iter_mut().zip(&self.qs) {
            *l = i32::from(q);
        }
        g.scale.fill(self.d.to_f32());
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        for (q, &l) in b.qs.iter_mut().zip(&g.levels) {
            *q = l as i8;
        }
    }
}

/// The levels of a Q4_K/Q5_K block: chunk `c`'s low nibbles are weights
/// `64c..64c + 32`, its high nibbles `64c + 32..64c + 64`; with `qh`, the
/// fifth bits (`2c` and `2c + 1` of byte `l`).
fn k4_levels(qs: &[u8; 128], qh: Option<&[u8; 32]>, levels: &mut [i32]) {
    for c in 0..4 {
        for l in 0..32 {
            let byte = qs[c * 32 + l];
            let (mut lo, mut hi) = (i32::from(byte & 0xF), i32::from(byte >> 4));
            if let Some(qh) = qh {
                lo |= i32::from((qh[l] >> (2 * c)) & 1) << 4;
                hi |= i32::from((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            levels[c * 64 + l] = lo;
            levels[c * 64 + 32 + l] = hi;
        }
    }
}

/// [`k4_levels`] written back.
fn pack_k4(levels: &[i32], qs: &mut [u8; 128], mut qh: Option<&mut [u8; 32]>) {
    if let Some(qh) = qh.as_deref_mut() {
        qh.fill(0);
    }
    for c in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (levels[c * 64 + l] as u8, levels[c * 64 + 32 + l] as u8);
            qs[c * 32 + l] = (lo & 0xF) | ((hi & 0xF) << 4);
            if let Some(qh) = qh.as_deref_mut() {
                qh[l] |= ((lo >> 4) & 1) << (2 * c) | ((hi >> 4) & 1) << (2 * c + 1);
            }
        }
    }
}

/// The per-weight scales and offsets of a Q4_K/Q5_K block.
fn k4_affine(g: &mut Grid, d: f32, dmin: f32, packed: &[u8; 12]) {
    for sub in 0..8 {
        let (s, m) = scale_min_k4(sub, packed);
        for i in sub * 32..(sub + 1) * 32 {
            g.scale[i] = d * f32::from(s);
            g.offset[i] = -dmin * f32::from(m);
        }
    }
}

impl GridBlock for BlockQ4K {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q4_K, 256, (0, 15));
        k4_levels(&self.qs, None, &mut g.levels);
        k4_affine(&mut g, self.d.to_f32(), self.dmin.to_f32(), &self.scales);
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        pack_k4(&g.levels, &mut b.qs, None);
    }
}

impl GridBlock for BlockQ5K {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q5_K, 256, (0, 31));
        k4_levels(&self.qs, Some(&self.qh), &mut g.levels);
        k4_affine(&mut g, self.d.to_f32(), self.dmin.to_f32(), &self.scales);
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        pack_k4(&g.levels, &mut b.qs, Some(&mut b.qh));
    }
}

impl GridBlock for BlockQ6K {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q6_K, 256, (-32, 31));
        let d = self.d.to_f32();
        for half in 0..2 {
            let (ql, qh) = (&self.ql[64 * half..], &self.qh[32 * half..]);
            for l in 0..32 {
                let base = 128 * half + l;
                g.levels[base] = (i32::from(ql[l] & 0xF) | (i32::from(qh[l] & 3) << 4)) - 32;
                g.levels[base + 32] =
                    (i32::from(ql[l + 32] & 0xF) | (i32::from((qh[l] >> 2) & 3) << 4)) - 32;
                g.levels[base + 64] =
                    (i32::from(ql[l] >> 4) | (i32::from((qh[l] >> 4) & 3) << 4)) - 32;
                g.levels[base + 96] =
                    (i32::from(ql[l + 32] >> 4) | (i32::from((qh[l] >> 6) & 3) << 4)) - 32;
            }
        }
        for (sub, &s) in self.scales.iter().enumerate() {
            g.scale[sub * 16..(sub + 1) * 16].fill(d * f32::from(s));
        }
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        b.ql.fill(0);
        b.qh.fill(0);
        for half in 0..2 {
            for l in 0..32 {
                let base = 128 * half + l;
                let q = |k: usize| (g.levels[base + 32 * k] + 32) as u8;
                let (q1, q2, q3, q4) = (q(0), q(1), q(2), q(3));
                b.ql[64 * half + l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                b.ql[64 * half + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                b.qh[32 * half + l] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

impl GridBlock for BlockQ3K {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::Q3_K, 256, (-4, 3));
        let d = self.d.to_f32();
        for half in 0..2 {
            let q = &self.qs[32 * half..];
            for shift in 0..4 {
                let m = 1u8 << (4 * half + shift);
                for l in 0..32 {
                    let low = i32::from((q[l] >> (2 * shift)) & 3);
                    let high = if self.hmask[l] & m != 0 { 0 } else { 4 };
                    g.levels[128 * half + 32 * shift + l] = low - high;
                }
            }
        }
        for (sub, &s) in self.sub_scales().iter().enumerate() {
            g.scale[sub * 16..(sub + 1) * 16].fill(d * f32::from(s));
        }
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        b.hmask.fill(0);
        b.qs.fill(0);
        for half in 0..2 {
            for shift in 0..4 {
                for l in 0..32 {
                    let q = g.levels[128 * half + 32 * shift + l] + 4;
                    b.qs[32 * half + l] |= ((q & 3) as u8) << (2 * shift);
                    if q >= 4 {
                        b.hmask[l] |= 1 << (4 * half + shift);
                    }
                }
            }
        }
    }
}

impl GridBlock for BlockIq4Xs {
    fn grid(&self) -> Option<Grid> {
        let mut g = Grid::new(GgmlType::IQ4_XS, 256, (0, 15));
        let d = self.d.to_f32();
        for (ib, &ls) in self.sub_scales().iter().enumerate() {
            let qs: &[u8; 16] = self.qs[16 * ib..][..16].try_into().ok()?;
            nibble_levels(qs, &mut g.levels[32 * ib..]);
            g.scale[32 * ib..32 * (ib + 1)].fill(d * ls as f32);
        }
        Some(g)
    }
    fn pack(g: &Grid, b: &mut Self) {
        for (ib, qs) in b.qs.chunks_exact_mut(16).enumerate() {
            let mut q = [0u8; 16];
            pack_nibbles(&g.levels[32 * ib..], &mut q);
            qs.copy_from_slice(&q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memwall_format::blocks::dequantize_row;

    fn row(n: usize, seed: u32) -> Vec<f32> {
        crate::test_values(n, seed)
            .iter()
            .map(|v| 2.0 * v)
            .collect()
    }

    #[test]
    fn grid_values_and_packing_match_the_decoder_for_every_type() {
        for ty in GPTQ_TYPES {
            let n = 512;
            let x = row(n, ty as u32 + 7);
            let bytes_per = ty.tensor_size(&[n as u64]).unwrap().bytes as usize;
            let mut enc = vec![0u8; bytes_per];
            memwall_quantize::quantize_row(ty, &x, &mut enc).unwrap();
            let mut want = vec![0f32; n];
            dequantize_row(ty, &enc, &mut want).unwrap();
            let bs = ty.block_size() as usize;
            let block_bytes = bytes_per / (n / bs);
            for (k, block) in enc.chunks(block_bytes).enumerate() {
                let g = Grid::read(ty, block).unwrap();
                for i in 0..bs {
                    assert_eq!(
                        g.value(i, g.levels[i]),
                        want[k * bs + i],
                        "{ty} block {k} weight {i}"
                    );
                    assert!(g.levels[i] >= g.range.0 && g.levels[i] <= g.range.1);
                }
                let mut copy = block.to_vec();
                copy.iter_mut().enumerate().for_each(|(i, b)| {
                    // Scramble the level bits; packing must restore them.
                    if !memwall_format::blocks::scale_fields(ty).contains(&i) {
                        *b ^= 0x5A;
                    }
                });
                let mut g2 = Grid::read(ty, &copy).unwrap();
                g2.levels.clone_from(&g.levels);
                g2.pack(&mut copy);
                let g3 = Grid::read(ty, &copy).unwrap();
                assert_eq!(g3.levels, g.levels, "{ty} block {k}");
            }
        }
    }

    #[test]
    fn nearest_level_rounds_and_clamps() {
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&memwall_format::blocks::f32_to_f16(0.5).to_le_bytes());
        let g = Grid::read(GgmlType::Q8_0, &b).unwrap();
        assert_eq!(g.nearest(0, 1.26), 3);
        assert_eq!(g.nearest(0, -1000.0), -128);
        assert_eq!(g.nearest(0, 1000.0), 127);
        let mut b = vec![0u8; 18];
        b[0..2].copy_from_slice(&memwall_format::blocks::f32_to_f16(0.01).to_le_bytes());
        let g = Grid::read(GgmlType::IQ4_NL, &b).unwrap();
        // IQ4NL_GRID[10] = 25: 0.25 is nearest.
        assert_eq!(g.nearest(3, 0.26), 10);
    }
}
