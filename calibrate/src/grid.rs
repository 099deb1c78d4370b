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

use memwall_format::GgmlType;
use memwall_format::blocks::{IQ4NL_GRID, f16_to_f32, scale_min_k4};

/// The types whose levels GPTQ can choose. Others are encoded without error
/// feedback (importance-weighted rounding, as llama-quantize does).
pub const GPTQ_TYPES: [GgmlType; 11] = [
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

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
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

    /// Reads the grid of one block of `ty` (`bytes` is exactly one block).
    /// `None` for types GPTQ does not handle.
    // Indices say which bits of which byte each weight takes, as ggml-common.h does.
    #[allow(clippy::needless_range_loop)]
    pub fn read(ty: GgmlType, b: &[u8]) -> Option<Grid> {
        let n = ty.block_size() as usize;
        let mut g = Grid {
            ty,
            levels: vec![0; n],
            scale: vec![0.0; n],
            offset: vec![0.0; n],
            range: (0, 0),
        };
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::IQ4_NL => {
                let d = f16_at(b, 0);
                let (m, qs) = match ty {
                    GgmlType::Q4_1 => (f16_at(b, 2), &b[4..20]),
                    _ => (0.0, &b[2..18]),
                };
                for j in 0..16 {
                    g.levels[j] = i32::from(qs[j] & 0xF);
                    g.levels[j + 16] = i32::from(qs[j] >> 4);
                }
                let offset = match ty {
                    GgmlType::Q4_0 => -8.0 * d,
                    GgmlType::Q4_1 => m,
                    _ => 0.0,
                };
                g.scale.fill(d);
                g.offset.fill(offset);
                g.range = (0, 15);
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let d = f16_at(b, 0);
                let (m, at) = if ty == GgmlType::Q5_1 {
                    (f16_at(b, 2), 4)
                } else {
                    (-16.0 * d, 2)
                };
                let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                let qs = &b[at + 4..at + 20];
                for j in 0..16 {
                    g.levels[j] = i32::from(qs[j] & 0xF) | (((qh >> j) & 1) << 4) as i32;
                    g.levels[j + 16] = i32::from(qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as i32;
                }
                g.scale.fill(d);
                g.offset.fill(m);
                g.range = (0, 31);
            }
            GgmlType::Q8_0 => {
                let d = f16_at(b, 0);
                for j in 0..32 {
                    g.levels[j] = i32::from(b[2 + j] as i8);
                }
                g.scale.fill(d);
                g.range = (-128, 127);
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let mut sc = [0u8; 12];
                sc.copy_from_slice(&b[4..16]);
                let five = ty == GgmlType::Q5_K;
                let (qh, qs) = if five {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for c in 0..4 {
                    for l in 0..32 {
                        let byte = qs[c * 32 + l];
                        let (mut lo, mut hi) = (i32::from(byte & 0xF), i32::from(byte >> 4));
                        if five {
                            lo |= i32::from((qh[l] >> (2 * c)) & 1) << 4;
                            hi |= i32::from((qh[l] >> (2 * c + 1)) & 1) << 4;
                        }
                        g.levels[c * 64 + l] = lo;
                        g.levels[c * 64 + 32 + l] = hi;
                    }
                }
                for sub in 0..8 {
                    let (s, m) = scale_min_k4(sub, &sc);
                    for i in sub * 32..(sub + 1) * 32 {
                        g.scale[i] = d * f32::from(s);
                        g.offset[i] = -dmin * f32::from(m);
                    }
                }
                g.range = (0, if five { 31 } else { 15 });
            }
            GgmlType::Q6_K => {
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    for l in 0..32 {
                        let base = 128 * half + l;
                        g.levels[base] =
                            (i32::from(ql[l] & 0xF) | (i32::from(qh[l] & 3) << 4)) - 32;
                        g.levels[base + 32] =
                            (i32::from(ql[l + 32] & 0xF) | (i32::from((qh[l] >> 2) & 3) << 4)) - 32;
                        g.levels[base + 64] =
                            (i32::from(ql[l] >> 4) | (i32::from((qh[l] >> 4) & 3) << 4)) - 32;
                        g.levels[base + 96] =
                            (i32::from(ql[l + 32] >> 4) | (i32::from((qh[l] >> 6) & 3) << 4)) - 32;
                    }
                }
                for (sub, &s) in sc.iter().enumerate() {
                    for i in sub * 16..(sub + 1) * 16 {
                        g.scale[i] = d * f32::from(s as i8);
                    }
                }
                g.range = (-32, 31);
            }
            GgmlType::Q3_K => {
                // hmask[32], qs[64], scales[12], d.
                let (hm, qs) = (&b[0..32], &b[32..96]);
                let d = f16_at(b, 108);
                let scales = q3k_scales(&b[96..108]);
                for half in 0..2 {
                    let q = &qs[32 * half..];
                    for shift in 0..4 {
                        let m = 1u8 << (4 * half + shift);
                        for l in 0..32 {
                            let low = i32::from((q[l] >> (2 * shift)) & 3);
                            let high = if hm[l] & m != 0 { 0 } else { 4 };
                            g.levels[128 * half + 32 * shift + l] = low - high;
                        }
                    }
                }
                for (sub, &s) in scales.iter().enumerate() {
                    for i in sub * 16..(sub + 1) * 16 {
                        g.scale[i] = d * f32::from(s);
                    }
                }
                g.range = (-4, 3);
            }
            GgmlType::IQ4_XS => {
                let d = f16_at(b, 0);
                let sh = u16::from_le_bytes([b[2], b[3]]);
                let (sl, qs) = (&b[4..8], &b[8..136]);
                for ib in 0..8 {
                    let low = (sl[ib / 2] >> (4 * (ib % 2))) & 0xF;
                    let ls = i32::from(low) | (i32::from((sh >> (2 * ib)) & 3) << 4);
                    let dl = d * (ls - 32) as f32;
                    for j in 0..16 {
                        let byte = qs[16 * ib + j];
                        g.levels[32 * ib + j] = i32::from(byte & 0xF);
                        g.levels[32 * ib + 16 + j] = i32::from(byte >> 4);
                    }
                    g.scale[32 * ib..32 * (ib + 1)].fill(dl);
                }
                g.range = (0, 15);
            }
            _ => return None,
        }
        Some(g)
    }

    /// Writes `self.levels` into `b` (the block it was read from), leaving
    /// every scale as it was.
    #[allow(clippy::needless_range_loop)]
    pub fn pack(&self, b: &mut [u8]) {
        let lv = |i: usize| self.levels[i];
        match self.ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::IQ4_NL => {
                let at = if self.ty == GgmlType::Q4_1 { 4 } else { 2 };
                for j in 0..16 {
                    b[at + j] = (lv(j) as u8 & 0xF) | ((lv(j + 16) as u8 & 0xF) << 4);
                }
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let at = if self.ty == GgmlType::Q5_1 { 4 } else { 2 };
                let mut qh = 0u32;
                for j in 0..16 {
                    let (a, c) = (lv(j) as u32, lv(j + 16) as u32);
                    b[at + 4 + j] = (a as u8 & 0xF) | ((c as u8 & 0xF) << 4);
                    qh |= ((a >> 4) & 1) << j | ((c >> 4) & 1) << (j + 16);
                }
                b[at..at + 4].copy_from_slice(&qh.to_le_bytes());
            }
            GgmlType::Q8_0 => {
                for j in 0..32 {
                    b[2 + j] = lv(j) as i8 as u8;
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let five = self.ty == GgmlType::Q5_K;
                let qs_at = if five { 48 } else { 16 };
                if five {
                    b[16..48].fill(0);
                }
                for c in 0..4 {
                    for l in 0..32 {
                        let (lo, hi) = (lv(c * 64 + l) as u8, lv(c * 64 + 32 + l) as u8);
                        b[qs_at + c * 32 + l] = (lo & 0xF) | ((hi & 0xF) << 4);
                        if five {
                            b[16 + l] |=
                                ((lo >> 4) & 1) << (2 * c) | ((hi >> 4) & 1) << (2 * c + 1);
                        }
                    }
                }
            }
            GgmlType::Q6_K => {
                b[0..192].fill(0);
                for half in 0..2 {
                    for l in 0..32 {
                        let base = 128 * half + l;
                        let q = |k: usize| (lv(base + 32 * k) + 32) as u8;
                        let (q1, q2, q3, q4) = (q(0), q(1), q(2), q(3));
                        b[64 * half + l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                        b[64 * half + l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                        b[128 + 32 * half + l] =
                            (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
                    }
                }
            }
            GgmlType::Q3_K => {
                b[0..96].fill(0);
                for half in 0..2 {
                    for shift in 0..4 {
                        for l in 0..32 {
                            let q = lv(128 * half + 32 * shift + l) + 4;
                            b[32 + 32 * half + l] |= ((q & 3) as u8) << (2 * shift);
                            if q >= 4 {
                                b[l] |= 1 << (4 * half + shift);
                            }
                        }
                    }
                }
            }
            GgmlType::IQ4_XS => {
                for ib in 0..8 {
                    for j in 0..16 {
                        b[8 + 16 * ib + j] = (lv(32 * ib + j) as u8 & 0xF)
                            | ((lv(32 * ib + 16 + j) as u8 & 0xF) << 4);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The sixteen 6-bit scales of a Q3_K block, minus 32.
fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 { s[i] & 0xF } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = ((low | (high << 4)) as i32 - 32) as i8;
    }
    out
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
