//! The lattice i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S): 256-weight super-blocks whose weights come in groups of 8 (or 4)
//! that are one point of a fixed codebook (the E8-lattice-like grids of
//! [`iq_grids`](super::iq_grids)), with signs kept apart, and a scale per 32
//! (or 16) weights under one f16 super-block scale.
//!
//! Each block offers `groups`: its 256 weights as signed integers in grid
//! units together with the integer scale of every 32 weights, which is what
//! both the decoder here and the dot-product kernels take; the decoders
//! apply the float scales in ggml's order (`dequantize_row_iq*`).

use bytemuck::{Pod, Zeroable};

use super::iq_grids::{
    IQ1S_LEVELS, IQ2S_LEVELS, IQ2XS_LEVELS, IQ2XXS_LEVELS, IQ3S_LEVELS, IQ3XXS_LEVELS,
};
use super::{Block, F16};
use crate::ggml_type::GgmlType;

/// Expands packed level indices (`bits` bits each, `K` a point) into values
/// through `map`.
const fn expand<const N: usize, const K: usize>(
    levels: &[u16; N],
    bits: u32,
    map: &[i8],
) -> [[i8; K]; N] {
    let mut out = [[0i8; K]; N];
    let mut p = 0;
    while p < N {
        let mut i = 0;
        while i < K {
            let l = (levels[p] >> (bits * i as u32)) & ((1 << bits) - 1);
            out[p][i] = map[l as usize];
            i += 1;
        }
        p += 1;
    }
    out
}

/// The value levels of the IQ2 grids (`0x08, 0x19, 0x2b`).
pub const IQ2_VALUES: [i8; 3] = [8, 25, 43];
/// The value levels of the IQ3_XXS grid.
pub const IQ3XXS_VALUES: [i8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];
/// The value levels of the IQ3_S grid.
pub const IQ3S_VALUES: [i8; 8] = [1, 3, 5, 7, 9, 11, 13, 15];
/// The value levels of the IQ1 grid.
pub const IQ1_VALUES: [i8; 3] = [-1, 0, 1];

/// `iq2xxs_grid`: 256 points of 8 values.
pub static IQ2XXS_GRID: [[i8; 8]; 256] = expand(&IQ2XXS_LEVELS, 2, &IQ2_VALUES);
/// `iq2xs_grid`: 512 points of 8 values.
pub static IQ2XS_GRID: [[i8; 8]; 512] = expand(&IQ2XS_LEVELS, 2, &IQ2_VALUES);
/// `iq2s_grid`: 1024 points of 8 values.
pub static IQ2S_GRID: [[i8; 8]; 1024] = expand(&IQ2S_LEVELS, 2, &IQ2_VALUES);
/// `iq3xxs_grid`: 256 points of 4 values.
pub static IQ3XXS_GRID: [[i8; 4]; 256] = expand(&IQ3XXS_LEVELS, 3, &IQ3XXS_VALUES);
/// `iq3s_grid`: 512 points of 4 values.
pub static IQ3S_GRID: [[i8; 4]; 512] = expand(&IQ3S_LEVELS, 3, &IQ3S_VALUES);
/// `iq1s_grid`: 2048 points of 8 values in {−1, 0, 1}.
pub static IQ1S_GRID: [[i8; 8]; 2048] = expand(&IQ1S_LEVELS, 2, &IQ1_VALUES);

/// The level indices of a codebook, for encoders: `levels(ty)[p]` packs
/// point `p`'s levels, `bits` bits each (2 for IQ1/IQ2, 3 for IQ3).
pub fn grid_levels(ty: GgmlType) -> Option<(&'static [u16], u32)> {
    Some(match ty {
        GgmlType::IQ2_XXS => (&IQ2XXS_LEVELS, 2),
        GgmlType::IQ2_XS => (&IQ2XS_LEVELS, 2),
        GgmlType::IQ2_S => (&IQ2S_LEVELS, 2),
        GgmlType::IQ3_XXS => (&IQ3XXS_LEVELS, 3),
        GgmlType::IQ3_S => (&IQ3S_LEVELS, 3),
        GgmlType::IQ1_S | GgmlType::IQ1_M => (&IQ1S_LEVELS, 2),
        _ => return None,
    })
}

/// `ksigns_iq2xs`: 7 sign bits completed with an eighth that makes the number
/// of negative signs even.
pub const KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | (((i as u8).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
};

/// The IQ1 grids' offset: each group's values are `grid ± IQ1_DELTA`.
pub const IQ1_DELTA: f32 = 0.125;

/// Byte `j` of `SIGN_MASKS[s]` is `0xff` where bit `j` of `s` is set.
const SIGN_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            if s >> j & 1 != 0 {
                t[s] |= 0xff << (8 * j);
            }
            j += 1;
        }
        s += 1;
    }
    t
};

/// `v` with the sign bits of `s` (bit `j` set: element `j` negated), eight
/// bytes in one word: `(v ^ m) + (m & 1)` bytewise, `m` from [`SIGN_MASKS`]
/// (`−v = !v + 1`; the additions kept within their bytes).
fn signed(v: &[i8; 8], s: u8) -> [i8; 8] {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    let m = SIGN_MASKS[usize::from(s)];
    let x = u64::from_le_bytes(v.map(|b| b as u8)) ^ m;
    let y = m & ONES;
    let sum = ((x & LOW7) + y) ^ (x & !LOW7);
    sum.to_le_bytes().map(|b| b as i8)
}

#[inline]
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A super-block of a lattice type as integers: `q[i]` the signed grid value
/// of weight `i`, and `ls[g]` the integer scale of weights `32g..32g+32`
/// (`16h..16h+16` where [`Lattice::HALVES`] is set, indexed `2g + h`).
#[derive(Clone, Copy, Debug)]
pub struct Groups {
    /// Signed grid values, in weight order.
    pub q: [i8; 256],
    /// Integer scales: 8 (one per 32 weights) or 16 (one per 16).
    pub ls: [u16; 16],
}

/// A super-block of the IQ2 and IQ3 types before its signs: the grid
/// values (all positive) and one sign bit per weight; [`Groups`] is
/// `q[i] = ±v[i]`. Kernels that apply signs in vector registers read this
/// (eight values a word) instead of the signed bytes.
#[derive(Clone, Copy, Debug)]
pub struct Codes {
    /// Grid values in weight order, eight a row (IQ3: two 4-value points).
    pub v: [[i8; 8]; 32],
    /// Bit `j` of byte `k` set: weight `8k + j` is negative.
    pub signs: [u8; 32],
    /// As [`Groups::ls`].
    pub ls: [u16; 16],
}

/// One group of 32 weights of [`Codes`]: rows `4ib..4ib + 4` of `v` as
/// little-endian words, the group's four sign bytes as one word, and its
/// scale (`ls[ib]`, or `ls[2ib]` and `ls[2ib + 1]` with
/// [`Lattice::HALVES`]): what [`Codes`] is built from, group by group.
#[derive(Clone, Copy, Debug)]
struct Unit {
    /// Four rows of eight grid values (the first value in the low byte).
    rows: [u64; 4],
    /// Bit `j` set: weight `j` of the group is negative.
    signs: u32,
    /// The group's scale, or its two halves' (the second equals the first
    /// for the types with one scale per 32 weights).
    ls: [u16; 2],
}

/// Eight values as a little-endian word.
#[inline]
fn row64(v: &[i8; 8]) -> u64 {
    u64::from_le_bytes(v.map(|b| b as u8))
}

/// Two 4-value points as one word (the first in the low half).
#[inline]
fn pair64(a: &[i8; 4], b: &[i8; 4]) -> u64 {
    u64::from(u32::from_le_bytes(a.map(|v| v as u8)))
        | u64::from(u32::from_le_bytes(b.map(|v| v as u8))) << 32
}

/// Four sign indices (7 bits each, from bit 0 of `sas`) as four sign bytes.
#[inline]
fn ksigns4(sas: u32) -> u32 {
    (0..4).fold(0, |acc, l| {
        acc | u32::from(KSIGNS[((sas >> (7 * l)) & 127) as usize]) << (8 * l)
    })
}

impl Codes {
    /// The block of the eight groups `unit(ib)`.
    fn of_units(halves: bool, unit: impl Fn(usize) -> Unit) -> Self {
        let mut c = Codes {
            v: [[0; 8]; 32],
            signs: [0; 32],
            ls: [0; 16],
        };
        for ib in 0..8 {
            let u = unit(ib);
            for (v, &r) in c.v[4 * ib..4 * ib + 4].iter_mut().zip(&u.rows) {
                *v = r.to_le_bytes().map(|b| b as i8);
            }
            c.signs[4 * ib..4 * ib + 4].copy_from_slice(&u.signs.to_le_bytes());
            if halves {
                c.ls[2 * ib..2 * ib + 2].copy_from_slice(&u.ls);
            } else {
                c.ls[ib] = u.ls[0];
            }
        }
        c
    }

    /// The signed values.
    pub fn groups(&self) -> Groups {
        let mut g = Groups::zeroed();
        g.ls = self.ls;
        for (k, (v, &s)) in self.v.iter().zip(&self.signs).enumerate() {
            g.q[8 * k..][..8].copy_from_slice(&signed(v, s));
        }
        g
    }
}

/// What the lattice types share: a block is integers ([`Groups`]) under
/// `d · ls · FACTOR` (plus, for IQ1, an offset of ±[`IQ1_DELTA`] per group of
/// 8 (IQ1_M) or 32 (IQ1_S) weights).
pub trait Lattice: Block {
    /// Whether there is a scale per 16 weights rather than per 32.
    const HALVES: bool;
    /// The float factor of the integer scale: `x = d · (ls · FACTOR) · q`
    /// is how ggml evaluates it, with `ls · FACTOR` exact.
    const FACTOR: f32;
    /// The f16 super-block scale.
    fn d(&self) -> F16;
    /// The integer values and scales.
    fn groups(&self) -> Groups;
    /// The values before their signs, for the types without an offset
    /// (all but IQ1); `groups()` is then `codes().groups()`.
    fn codes(&self) -> Option<Codes> {
        None
    }
}

impl Groups {
    fn zeroed() -> Self {
        Groups {
            q: [0; 256],
            ls: [0; 16],
        }
    }
}

/// `impl Lattice` for a type without an offset, from its `unit_of()`
/// (and its `d`), with [`Lattice::HALVES`] and [`Lattice::FACTOR`] given.
macro_rules! coded {
    ($b:ident, $halves:expr, $factor:expr) => {
        impl Lattice for $b {
            const HALVES: bool = $halves;
            const FACTOR: f32 = $factor;
            fn d(&self) -> F16 {
                self.d
            }
            fn groups(&self) -> Groups {
                Codes::of_units($halves, |ib| self.unit_of(ib)).groups()
            }
            fn codes(&self) -> Option<Codes> {
                Some(Codes::of_units($halves, |ib| self.unit_of(ib)))
            }
        }
    };
}

/// IQ2_XXS: 256 weights, 2.0625 bpw. Per 32 weights, two little-endian words:
/// the first holds four 8-bit indices into [`IQ2XXS_GRID`], the second four
/// 7-bit sign indices ([`KSIGNS`]) and, in its top 4 bits, the scale `s`:
/// `x = d · (0.5 + s) · 0.25 · ±grid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq2Xxs {
    /// Super-block scale.
    pub d: F16,
    /// Eight pairs of words (grid indices; signs and scale).
    pub qs: [u8; 64],
}
const _: () = assert!(size_of::<BlockIq2Xxs>() == 66);

coded!(BlockIq2Xxs, false, 0.125);

impl BlockIq2Xxs {
    #[inline]
    fn unit_of(&self, ib: usize) -> Unit {
        let (idx, sas) = (le32(&self.qs, 8 * ib), le32(&self.qs, 8 * ib + 4));
        let ls = 2 * (sas >> 28) as u16 + 1;
        Unit {
            rows: std::array::from_fn(|l| row64(&IQ2XXS_GRID[((idx >> (8 * l)) & 0xff) as usize])),
            signs: ksigns4(sas),
            ls: [ls, ls],
        }
    }
}

/// IQ2_XS: 256 weights, 2.3125 bpw. Per 8 weights a little-endian u16: a
/// 9-bit index into [`IQ2XS_GRID`] and a 7-bit sign index above it; a 4-bit
/// scale per 16 weights: `x = d · (0.5 + s) · 0.25 · ±grid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq2Xs {
    /// Super-block scale.
    pub d: F16,
    /// 32 little-endian u16 (grid index, sign index).
    pub qs: [u8; 64],
    /// Scales, two nibbles per 32 weights.
    pub scales: [u8; 8],
}
const _: () = assert!(size_of::<BlockIq2Xs>() == 74);

/// The two 4-bit scales of group `ib` of IQ2_XS/IQ2_S as `2s + 1`.
#[inline]
fn nibble_scales(scales: &[u8; 8], ib: usize) -> [u16; 2] {
    [0, 4].map(|shift| 2 * u16::from((scales[ib] >> shift) & 0xf) + 1)
}

coded!(BlockIq2Xs, true, 0.125);

impl BlockIq2Xs {
    #[inline]
    fn unit_of(&self, ib: usize) -> Unit {
        let v = |l: usize| le16(&self.qs, 2 * (4 * ib + l));
        Unit {
            rows: std::array::from_fn(|l| row64(&IQ2XS_GRID[usize::from(v(l) & 511)])),
            signs: (0..4).fold(0, |acc, l| {
                acc | u32::from(KSIGNS[usize::from(v(l) >> 9)]) << (8 * l)
            }),
            ls: nibble_scales(&self.scales, ib),
        }
    }
}

/// IQ2_S: 256 weights, 2.5625 bpw. Per 8 weights a 10-bit index into
/// [`IQ2S_GRID`] (low 8 bits in `qs`, high 2 in `qh`) and 8 explicit sign
/// bits; a 4-bit scale per 16 weights: `x = d · (0.5 + s) · 0.25 · ±grid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq2S {
    /// Super-block scale.
    pub d: F16,
    /// Low 8 bits of the grid indices.
    pub qs: [u8; 32],
    /// Sign bits, a byte per 8 weights.
    pub signs: [u8; 32],
    /// High 2 bits of the grid indices, four a byte.
    pub qh: [u8; 8],
    /// Scales, two nibbles per 32 weights.
    pub scales: [u8; 8],
}
const _: () = assert!(size_of::<BlockIq2S>() == 82);

coded!(BlockIq2S, true, 0.125);

impl BlockIq2S {
    #[inline]
    fn unit_of(&self, ib: usize) -> Unit {
        Unit {
            rows: std::array::from_fn(|l| {
                let hi = (usize::from(self.qh[ib]) >> (2 * l)) & 3;
                row64(&IQ2S_GRID[usize::from(self.qs[4 * ib + l]) | (hi << 8)])
            }),
            signs: le32(&self.signs, 4 * ib),
            ls: nibble_scales(&self.scales, ib),
        }
    }
}

/// IQ3_XXS: 256 weights, 3.0625 bpw. 64 indices into [`IQ3XXS_GRID`] (4
/// weights each), then per 32 weights a little-endian word of four 7-bit sign
/// indices ([`KSIGNS`]) and a 4-bit scale on top: `x = d · (0.5 + s) · 0.5 · ±grid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq3Xxs {
    /// Super-block scale.
    pub d: F16,
    /// Grid indices.
    pub qs: [u8; 64],
    /// Eight words of signs and scale.
    pub sas: [u8; 32],
}
const _: () = assert!(size_of::<BlockIq3Xxs>() == 98);

coded!(BlockIq3Xxs, false, 0.25);

impl BlockIq3Xxs {
    #[inline]
    fn unit_of(&self, ib: usize) -> Unit {
        let sas = le32(&self.sas, 4 * ib);
        let ls = 2 * (sas >> 28) as u16 + 1;
        let point = |i: usize| &IQ3XXS_GRID[usize::from(self.qs[i])];
        Unit {
            rows: std::array::from_fn(|l| {
                let k = 4 * ib + l;
                pair64(point(2 * k), point(2 * k + 1))
            }),
            signs: ksigns4(sas),
            ls: [ls, ls],
        }
    }
}

/// IQ3_S: 256 weights, 3.4375 bpw. Per 4 weights a 9-bit index into
/// [`IQ3S_GRID`] (low 8 bits in `qs`, the ninth in `qh`), explicit sign bits,
/// and a 4-bit scale per 32 weights: `x = d · (1 + 2s) · ±grid`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq3S {
    /// Super-block scale.
    pub d: F16,
    /// Low 8 bits of the grid indices.
    pub qs: [u8; 64],
    /// Ninth bits of the grid indices, eight a byte.
    pub qh: [u8; 8],
    /// Sign bits, a byte per 8 weights.
    pub signs: [u8; 32],
    /// Scales, two nibbles (one per 32 weights) a byte.
    pub scales: [u8; 4],
}
const _: () = assert!(size_of::<BlockIq3S>() == 110);

coded!(BlockIq3S, false, 1.0);

impl BlockIq3S {
    #[inline]
    fn unit_of(&self, ib: usize) -> Unit {
        let ls = 1 + 2 * u16::from((self.scales[ib / 2] >> (4 * (ib % 2))) & 0xf);
        let point = |k: usize| {
            let hi = (usize::from(self.qh[ib]) >> k) & 1;
            &IQ3S_GRID[usize::from(self.qs[8 * ib + k]) | (hi << 8)]
        };
        Unit {
            rows: std::array::from_fn(|l| pair64(point(2 * l), point(2 * l + 1))),
            signs: le32(&self.signs, 4 * ib),
            ls: [ls, ls],
        }
    }
}

/// IQ1_S: 256 weights, 1.5625 bpw. Per 8 weights an 11-bit index into
/// [`IQ1S_GRID`] (low 8 bits in `qs`, high 3 in `qh`); per 32 weights a
/// little-endian u16 `qh` with the four high parts, a 3-bit scale `s` (bits
/// 12..15) and the sign of the offset (bit 15):
/// `x = d · (2s + 1) · (grid ± 0.125)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq1S {
    /// Super-block scale.
    pub d: F16,
    /// Low 8 bits of the grid indices.
    pub qs: [u8; 32],
    /// Eight little-endian u16: high index bits, scale, offset sign.
    pub qh: [u8; 16],
}
const _: () = assert!(size_of::<BlockIq1S>() == 50);

impl Lattice for BlockIq1S {
    const HALVES: bool = false;
    const FACTOR: f32 = 0.125;
    fn d(&self) -> F16 {
        self.d
    }
    fn groups(&self) -> Groups {
        let mut g = Groups::zeroed();
        for ib in 0..8 {
            let qh = le16(&self.qh, 2 * ib);
            g.ls[ib] = 2 * ((qh >> 12) & 7) + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            for l in 0..4 {
                let i = usize::from(self.qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
                g.q[32 * ib + 8 * l..][..8].copy_from_slice(&offset(&IQ1S_GRID[i], delta));
            }
        }
        g
    }
}

/// An IQ1 grid point with its offset, in eighths: `8 · grid + delta`
/// (`delta = ±1`, the offset ±0.125).
#[inline]
fn offset(p: &[i8; 8], delta: i8) -> [i8; 8] {
    p.map(|v| 8 * v + delta)
}

/// IQ1_M: 256 weights, 1.75 bpw. Per 8 weights an 11-bit index into
/// [`IQ1S_GRID`] (low 8 bits in `qs`, high 3 in a nibble of `qh` whose fourth
/// bit is the sign of that group's offset); a 3-bit scale `s` per 16 weights
/// in the four little-endian u16 of `scales`, whose top nibbles together are
/// the f16 super-block scale: `x = d · (2s + 1) · (grid ± 0.125)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq1M {
    /// Low 8 bits of the grid indices.
    pub qs: [u8; 32],
    /// High index bits and offset signs, a nibble per 8 weights.
    pub qh: [u8; 16],
    /// Sixteen 3-bit scales and, in the top nibbles, the f16 scale.
    pub scales: [u8; 8],
}
const _: () = assert!(size_of::<BlockIq1M>() == 56);

impl BlockIq1M {
    /// The f16 super-block scale, gathered from the top nibbles of the scale words.
    pub fn scale(&self) -> F16 {
        let s: [u16; 4] = std::array::from_fn(|i| le16(&self.scales, 2 * i));
        let bits = (s[0] >> 12) | ((s[1] >> 8) & 0x00f0) | ((s[2] >> 4) & 0x0f00) | (s[3] & 0xf000);
        F16(bits.to_le_bytes())
    }

    /// Writes the f16 super-block scale into the top nibbles of the scale
    /// words (the inverse of [`BlockIq1M::scale`]), the 3-bit scales untouched.
    pub fn set_scale(&mut self, d: F16) {
        let bits = d.bits();
        for i in 0..4 {
            let word = (le16(&self.scales, 2 * i) & 0x0fff) | (((bits >> (4 * i)) & 0xf) << 12);
            self.scales[2 * i..2 * i + 2].copy_from_slice(&word.to_le_bytes());
        }
    }
}

impl Lattice for BlockIq1M {
    const HALVES: bool = true;
    const FACTOR: f32 = 0.125;
    fn d(&self) -> F16 {
        self.scale()
    }
    fn groups(&self) -> Groups {
        let mut g = Groups::zeroed();
        for h in 0..16 {
            let word = le16(&self.scales, 2 * (h / 4));
            g.ls[h] = 2 * ((word >> (3 * (h % 4))) & 7) + 1;
        }
        for k in 0..32 {
            let nib = (self.qh[k / 2] >> (4 * (k % 2))) & 0xf;
            let i = usize::from(self.qs[k]) | (usize::from(nib & 7) << 8);
            let delta = if nib & 8 != 0 { -1 } else { 1 };
            g.q[8 * k..][..8].copy_from_slice(&offset(&IQ1S_GRID[i], delta));
        }
        g
    }
}

/// `impl Block` for a lattice type, its f16 scale fields given (IQ1_M has
/// none: its scale is spread over four nibbles).
macro_rules! lattice_block {
    ($($b:ident: $t:ident [$($scale:ident)?]),*) => {$(
        impl Block for $b {
            const TYPE: GgmlType = GgmlType::$t;
            const WEIGHTS: usize = 256;
            /// ggml's `db = d · (0.5 + s) · 0.25` (IQ2), `· 0.5` (IQ3_XXS),
            /// `d · (1 + 2s)` (IQ3_S), `d · (2s + 1) · (grid ± 0.125)` (IQ1):
            /// every product but the last is exact, so `d · (ls · FACTOR) · q`
            /// rounds the same.
            #[inline]
            fn dequantize(&self, y: &mut [f32]) {
                let g = self.groups();
                let d = self.d().to_f32();
                let per = if Self::HALVES { 16 } else { 32 };
                for (i, (y, &q)) in y.iter_mut().zip(&g.q).enumerate() {
                    *y = d * (f32::from(g.ls[i / per]) * Self::FACTOR) * f32::from(q);
                }
            }
            const F16_SCALES: &'static [usize] = &[$(std::mem::offset_of!($b, $scale))?];
            #[inline]
            fn scales_finite(&self) -> bool {
                self.d().is_finite()
            }
        }
    )*};
}

lattice_block!(
    BlockIq2Xxs: IQ2_XXS [d],
    BlockIq2Xs: IQ2_XS [d],
    BlockIq2S: IQ2_S [d],
    BlockIq3Xxs: IQ3_XXS [d],
    BlockIq3S: IQ3_S [d],
    BlockIq1S: IQ1_S [d],
    BlockIq1M: IQ1_M []
);

#[cfg(test)]
mod tests {
    use super::signed;

    /// The word-at-a-time negation is element-wise `wrapping_neg` where the
    /// sign bit is set, for every sign byte and values at both ends.
    #[test]
    fn signed_negates_exactly_the_elements_whose_sign_bit_is_set() {
        let rows: [[i8; 8]; 3] = [
            [0, 1, -1, 127, -128, 43, 62, 8],
            [-128, 0, 127, -127, 15, 1, 0, 64],
            [1, 3, 5, 7, 9, 11, 13, 15],
        ];
        for v in rows {
            for s in 0..=255u8 {
                let want: [i8; 8] = std::array::from_fn(|j| {
                    if s >> j & 1 != 0 {
                        v[j].wrapping_neg()
                    } else {
                        v[j]
                    }
                });
                assert_eq!(signed(&v, s), want, "{v:?} signs {s:#04x}");
            }
        }
    }
}
