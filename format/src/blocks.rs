//! ggml block formats and their scalar dequantization: the specification every
//! faster kernel is tested against.
//!
//! Each block struct *is* ggml's on-disk layout (`ggml-common.h`):
//! `#[repr(C)]`, a compile-time size check, no padding, and (but for the
//! activation-only Q8_K) alignment 1, with `f16` fields as [`F16`] (two
//! little-endian bytes). A row of bytes is viewed as a slice of blocks with
//! [`as_blocks`] (a `bytemuck` cast, no copy, no `unsafe`), and the same
//! structs are the input of the decoders here, of every dot-product kernel
//! (scalar and SIMD), of the encoders and of calibration's grids: the layout
//! is written down once, here. [`block_types!`](crate::block_types) lists the
//! block types once for every `match` over them.
//!
//! Sources: `ggml/src/ggml-common.h` (layouts) and `ggml/src/ggml-quants.c`
//! (`dequantize_row_*`) of llama.cpp 0c1e570; the arithmetic is done in `f32` in
//! the same order as ggml, so results are bit-identical to ggml's reference.

use bytemuck::{Pod, Zeroable};

use crate::ggml_type::GgmlType;

mod iq;
mod iq_grids;
pub use iq::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, Codes,
    Groups, IQ1_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
    KSIGNS, Lattice, grid_levels,
};

/// IEEE half-precision bits to `f32` (exact).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise the mantissa.
            let shift = m.leading_zeros() - 21;
            let m = (m << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// All 65536 half-precision values as `f32` (256 KiB, built on first use):
/// converting a row by lookup is several times faster than bit manipulation,
/// and it is what ggml's scalar path does too.
fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Box<[f32]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(f16_to_f32).collect())
}

/// `f32` to IEEE half-precision bits, rounding to nearest even (as F16C's
/// `vcvtps2ph` and ggml's scalar fallback do); overflow gives infinity.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let mant = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if mant != 0 {
            0x200 | (mant >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    let round = |m: u32, shift: u32| {
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r + 1
        } else {
            r
        }
    };
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal: the unit is 2^-24; a carry into the exponent field is correct.
        return sign | round(mant | 0x80_0000, (14 - e) as u32) as u16;
    }
    // A carry out of the mantissa moves into the exponent (up to infinity), as it should.
    sign | round(((e as u32) << 23) | mant, 13) as u16
}

/// `f32` to bfloat16 bits, rounding to nearest even, NaN kept quiet (ggml's
/// `ggml_compute_fp32_to_bf16`).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 64) as u16;
    }
    ((b + (0x7fff + ((b >> 16) & 1))) >> 16) as u16
}

/// bfloat16 bits to `f32` (exact).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// An IEEE half-precision value as ggml stores it: two little-endian bytes
/// (alignment 1, so blocks laid over a file's bytes need no alignment).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct F16([u8; 2]);

impl F16 {
    /// The value with these IEEE half-precision bits.
    #[inline]
    pub const fn from_bits(bits: u16) -> F16 {
        F16(bits.to_le_bytes())
    }

    /// Its IEEE half-precision bits.
    #[inline]
    pub const fn bits(self) -> u16 {
        u16::from_le_bytes(self.0)
    }

    /// Its value (exact).
    #[inline]
    pub fn to_f32(self) -> f32 {
        f16_to_f32(self.bits())
    }

    /// `x` rounded to half precision ([`f32_to_f16`]).
    #[inline]
    pub fn from_f32(x: f32) -> F16 {
        F16::from_bits(f32_to_f16(x))
    }

    /// Whether it is neither NaN nor infinite (its exponent bits not all ones).
    #[inline]
    pub fn is_finite(self) -> bool {
        self.bits() & 0x7c00 != 0x7c00
    }
}

/// A ggml block type: the struct is the on-disk layout of one block.
pub trait Block: Pod {
    /// The ggml type whose blocks these are.
    const TYPE: GgmlType;
    /// Weights per block.
    const WEIGHTS: usize;
    /// Decodes the block's [`Block::WEIGHTS`] weights into `y`, in ggml's order.
    fn dequantize(&self, y: &mut [f32]);
    /// Byte offsets of the block's f16 scales (and minimums) within it.
    const F16_SCALES: &'static [usize];
    /// Whether the block's f16 scales (and minimums) are finite: what
    /// `ggml_validate_row_data` checks of a quantized block.
    fn scales_finite(&self) -> bool;
    /// The block of all-zero bytes (zero weights, zero scales).
    fn zero() -> Self {
        Zeroable::zeroed()
    }
}

/// `bytes` viewed as blocks of `B`, without copying. Panics if the length is
/// not a whole number of blocks (or, for the one type with alignment above 1,
/// [`BlockQ8K`], if the bytes are misaligned): callers check lengths first.
#[inline]
pub fn as_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    bytemuck::cast_slice(bytes)
}

/// [`as_blocks`] for writing.
#[inline]
pub fn as_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    bytemuck::cast_slice_mut(bytes)
}

/// The bytes of `blocks` (weight or activation blocks), as stored.
#[inline]
pub fn block_bytes<B: Pod>(blocks: &[B]) -> &[u8] {
    bytemuck::cast_slice(blocks)
}

/// Calls `$callback!` with the quantized block types memwall implements, as
/// `GgmlType variant => block struct as snake_case name` entries, after the
/// tokens given in front of the list: `block_types!([my_macro] extra tokens)`
/// expands to `my_macro!(extra tokens [Q4_0 => BlockQ4_0 as q4_0, …])` (the
/// callback in brackets may be a path). This is the one list of
/// block types; the decoders below, the encoders (`memwall-quantize`) and the
/// kernel tables (`memwall-runtime`) generate their dispatch from it, so a new
/// type is added here and nowhere else in a `match`.
#[macro_export]
macro_rules! block_types {
    ([$($callback:tt)+] $($front:tt)*) => {
        $($callback)+! { $($front)* [
            Q4_0 => BlockQ4_0 as q4_0,
            Q4_1 => BlockQ4_1 as q4_1,
            Q5_0 => BlockQ5_0 as q5_0,
            Q5_1 => BlockQ5_1 as q5_1,
            Q8_0 => BlockQ8_0 as q8_0,
            Q2_K => BlockQ2K as q2_k,
            Q3_K => BlockQ3K as q3_k,
            Q4_K => BlockQ4K as q4_k,
            Q5_K => BlockQ5K as q5_k,
            Q6_K => BlockQ6K as q6_k,
            IQ4_NL => BlockIq4Nl as iq4_nl,
            IQ4_XS => BlockIq4Xs as iq4_xs,
            TQ1_0 => BlockTq1_0 as tq1_0,
            TQ2_0 => BlockTq2_0 as tq2_0,
            MXFP4 => BlockMxfp4 as mxfp4,
            IQ2_XXS => BlockIq2Xxs as iq2_xxs,
            IQ2_XS => BlockIq2Xs as iq2_xs,
            IQ2_S => BlockIq2S as iq2_s,
            IQ3_XXS => BlockIq3Xxs as iq3_xxs,
            IQ3_S => BlockIq3S as iq3_s,
            IQ1_S => BlockIq1S as iq1_s,
            IQ1_M => BlockIq1M as iq1_m,
            NVFP4 => BlockNvfp4 as nvfp4,
            Q1_0 => BlockQ1_0 as q1_0,
            Q2_0 => BlockQ2_0 as q2_0,
        ] }
    };
}

/// `match $ty { each block type => { type $B = its struct; $body } _ => $other }`:
/// runs `$body` with `$B` naming the block struct of the (runtime) type `$ty`,
/// or `$other` for the float types and the types memwall does not implement.
#[macro_export]
macro_rules! with_block {
    ($ty:expr, $B:ident => $body:expr, _ => $other:expr) => {
        $crate::block_types!([$crate::__with_block_arms] ($ty) $B ($body) ($other))
    };
}

/// The arms of [`with_block!`] (an implementation detail of it).
#[doc(hidden)]
#[macro_export]
macro_rules! __with_block_arms {
    (($ty:expr) $B:ident ($body:expr) ($other:expr) [$($t:ident => $b:ident as $f:ident,)*]) => {
        match $ty {
            $($crate::GgmlType::$t => {
                #[allow(unused)]
                type $B = $crate::blocks::$b;
                $body
            })*
            _ => $other,
        }
    };
}

/// The non-linear 4-bit grid of IQ4_NL and IQ4_XS (`kvalues_iq4nl`).
pub const IQ4NL_GRID: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Q4_0: 32 weights, 4.5 bpw. `x = d · (q − 8)`; low nibbles hold x[0..16], high x[16..32].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: F16,
    /// Nibbles.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// Q4_1: 32 weights, 5 bpw. `x = d · q + m`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: F16,
    /// Minimum.
    pub m: F16,
    /// Nibbles.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// Q5_0: 32 weights, 5.5 bpw. `x = d · (q − 16)`, the fifth bits in `qh`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: F16,
    /// Fifth bits, little-endian u32 (bit `j` for weight `j`).
    pub qh: [u8; 4],
    /// Nibbles.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// Q5_1: 32 weights, 6 bpw. `x = d · q + m`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: F16,
    /// Minimum.
    pub m: F16,
    /// Fifth bits.
    pub qh: [u8; 4],
    /// Nibbles.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// Q8_0: 32 weights, 8.5 bpw. `x = d · q`. Also the activation block of
/// Q4_0, Q5_0, Q8_0 and IQ4_NL dot products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: F16,
    /// Signed quants.
    pub qs: [i8; 32],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// Q8_1: 32 values, 9 bpw, the activation block of Q4_1 and Q5_1 dot
/// products: `x = d · q`, with `s = d · Σq`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: F16,
    /// `d · Σ qs`.
    pub s: F16,
    /// Signed quants.
    pub qs: [i8; 32],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

/// Q8_K: 256 values, the activation block of the K-quant and IQ4_XS dot
/// products: `x = d · q`, with the sums of each 16 quants in `bsums` (the
/// K-quants subtract their minimums through them). Its scale is an `f32`, so
/// unlike the others it has alignment 4.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Signed quants.
    pub qs: [i8; 256],
    /// Sums of quants `16j..16j+16`.
    pub bsums: [i16; 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

impl Default for BlockQ8K {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}

/// Q2_K: 256 weights, 2.625 bpw. 16 groups of 16 with 4-bit scale and 4-bit min:
/// `x = d · sc · q − dmin · m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    /// Low nibble scale, high nibble min, per 16 weights.
    pub scales: [u8; 16],
    /// 2-bit quants.
    pub qs: [u8; 64],
    /// Super-block scale.
    pub d: F16,
    /// Super-block min scale.
    pub dmin: F16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// Q3_K: 256 weights, 3.4375 bpw. 16 six-bit scales biased by 32:
/// `x = d · (sc − 32) · (q₂ − (hbit ? 0 : 4))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    /// High bits.
    pub hmask: [u8; 32],
    /// Low 2 bits.
    pub qs: [u8; 64],
    /// Packed 6-bit scales.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: F16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// Q4_K: 256 weights, 4.5 bpw. 8 groups of 32 with 6-bit scale and min:
/// `x = d · sc · q − dmin · m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    /// Super-block scale.
    pub d: F16,
    /// Super-block min scale.
    pub dmin: F16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; 12],
    /// Nibbles: each 64-weight chunk has 0..32 low, 32..64 high.
    pub qs: [u8; 128],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// Q5_K: 256 weights, 5.5 bpw. Q4_K plus a fifth bit per weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    /// Super-block scale.
    pub d: F16,
    /// Super-block min scale.
    pub dmin: F16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; 12],
    /// Fifth bits.
    pub qh: [u8; 32],
    /// Nibbles.
    pub qs: [u8; 128],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

/// Q6_K: 256 weights, 6.5625 bpw. 16 groups of 16 with 8-bit scales:
/// `x = d · sc · (q − 32)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    /// Low 4 bits.
    pub ql: [u8; 128],
    /// High 2 bits.
    pub qh: [u8; 64],
    /// Signed scales.
    pub scales: [i8; 16],
    /// Super-block scale.
    pub d: F16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// IQ4_NL: 32 weights, 4.5 bpw. `x = d · IQ4NL_GRID[q]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq4Nl {
    /// Scale.
    pub d: F16,
    /// Grid indices (nibbles).
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockIq4Nl>() == 18);

/// IQ4_XS: 256 weights, 4.25 bpw. 8 groups of 32 with 6-bit scales biased by 32:
/// `x = d · (ls − 32) · IQ4NL_GRID[q]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIq4Xs {
    /// Super-block scale.
    pub d: F16,
    /// High 2 bits of the 8 scales (little-endian u16).
    pub scales_h: [u8; 2],
    /// Low 4 bits of the 8 scales.
    pub scales_l: [u8; 4],
    /// Grid indices (nibbles).
    pub qs: [u8; 128],
}
const _: () = assert!(size_of::<BlockIq4Xs>() == 136);

/// TQ1_0: 256 ternary weights, 1.6875 bpw (BitNet b1.58, TriLM). `x = d · (t − 1)`
/// with trits `t ∈ {0, 1, 2}` packed five to a byte as `⌈256 · Σ t_n 3^(4−n) / 243⌉`
/// (the first trit most significant): `qs[0..32]` hold weights 0..160 (byte `m`
/// has weights `m + 32n`), `qs[32..48]` weights 160..240 (`160 + m + 16n`), and
/// the four `qh` bytes the last 16 (`240 + j + 4n`, four trits each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockTq1_0 {
    /// Five trits a byte.
    pub qs: [u8; 48],
    /// Four trits a byte.
    pub qh: [u8; 4],
    /// Scale.
    pub d: F16,
}
const _: () = assert!(size_of::<BlockTq1_0>() == 54);

/// TQ2_0: 256 ternary weights in 2 bits, 2.0625 bpw. `x = d · (q − 1)`, `q ∈ {0, 1, 2}`;
/// in each 32-byte half, bits `2l..2l+2` of byte `m` are weight `128h + 32l + m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockTq2_0 {
    /// Four 2-bit values a byte.
    pub qs: [u8; 64],
    /// Scale.
    pub d: F16,
}
const _: () = assert!(size_of::<BlockTq2_0>() == 66);

/// MXFP4 (OCP microscaling FP4, gpt-oss): 32 weights, 4.25 bpw.
/// `x = 2^(e − 128) · MXFP4_GRID[q]` (the grid holds twice the E2M1 values);
/// low nibbles are weights 0..16, high nibbles 16..32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockMxfp4 {
    /// Shared exponent (E8M0; 0xff is not a number).
    pub e: u8,
    /// Grid indices (nibbles).
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockMxfp4>() == 17);

/// NVFP4 (NVIDIA's FP4 with E4M3 scales): 64 weights, 4.5 bpw, in four
/// 16-weight sub-blocks `s`, each `x = ue4m3_half(d[s]) · MXFP4_GRID[q]`; in
/// sub-block `s`, byte `qs[8s + j]` holds weight `16s + j` (low nibble) and
/// `16s + 8 + j` (high nibble).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockNvfp4 {
    /// The sub-blocks' scales (unsigned E4M3).
    pub d: [u8; 4],
    /// Grid indices (nibbles).
    pub qs: [u8; 32],
}
const _: () = assert!(size_of::<BlockNvfp4>() == 36);

/// Q1_0: 128 weights, 1.125 bpw. `x = ±d`: bit `j % 8` of byte `j / 8` set
/// for `+d` (the encoder's scale is the block's mean magnitude).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ1_0 {
    /// Scale.
    pub d: F16,
    /// Sign bits, weight `j` in bit `j % 8` of byte `j / 8`.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ1_0>() == 18);

/// Q2_0: 64 weights, 2.25 bpw. `x = d · (q − 1)`, `q ∈ 0..4`; weight `j` in
/// bits `2(j % 4)..2(j % 4) + 2` of byte `j / 4`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2_0 {
    /// Scale.
    pub d: F16,
    /// Four 2-bit values a byte.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ2_0>() == 18);

/// Half the value of an unsigned E4M3 scale (NVFP4's `d`), exactly, as
/// ggml's `ggml_ue4m3_to_fp32`: 4 exponent bits (bias 7; 0 is subnormal) and
/// 3 mantissa bits, the top bit ignored; `0` and `0x7f` (NaN) give 0.
#[inline]
pub const fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let (exp, man) = (((x >> 3) & 0xf) as u32, (x & 7) as u32);
    /// `2^(k − 11)`, from its bits (`k ≤ 15`).
    const fn pow2(k: u32) -> f32 {
        f32::from_bits((127 - 11 + k) << 23)
    }
    // Half of `man · 2⁻⁹` or `(1 + man/8) · 2^(exp − 7)`: at most four
    // significant bits times a power of two, exact.
    if exp == 0 {
        man as f32 * pow2(1)
    } else {
        (8 + man) as f32 * pow2(exp)
    }
}

/// The unsigned E4M3 code of `x` as ggml's `ggml_fp32_to_ue4m3` rounds it:
/// clamped to 448, the mantissa rounded half up on its fourth bit (carrying
/// into the exponent), subnormals to `⌊512·x + 0.5⌋`, 0 for `x ≤ 0` or below
/// the smallest subnormal, and `0x7e` (448) above the range.
#[inline]
pub fn ue4m3_from_f32(x: f32) -> u8 {
    // NaN, zero and negative values: no scale.
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = x.min(448.0);
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 7;
    if exp <= 0 {
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7e;
    }
    let mut man = ((bits >> 20) & 7) as i32 + ((bits >> 19) & 1) as i32;
    let mut exp = exp;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7e;
        }
    }
    ((exp << 3) | man) as u8
}

/// The E2M1 values of FP4 doubled, by their 4-bit code (`kvalues_mxfp4`).
pub const MXFP4_GRID: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the value of an E8M0 exponent, `2^(e − 128)`, exactly (subnormal for
/// `e < 2`), as ggml's `ggml_e8m0_to_fp32_half` (`e = 0xff` gives `2^127`).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// The trit `n` (0 = most significant) of a TQ1_0 byte: `⌊3 · (q·3ⁿ mod 256) / 256⌋`.
#[inline]
pub fn tq1_trit(q: u8, n: usize) -> u8 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    ((u16::from(q.wrapping_mul(POW3[n])) * 3) >> 8) as u8
}

/// A TQ1_0 byte of up to five trits (the first most significant; fewer than
/// five are followed by zeros), as ggml packs them: `⌈256 · v / 243⌉` for
/// the base-3 value `v`, so that [`tq1_trit`] reads them back.
#[inline]
pub fn tq1_pack(trits: &[u8]) -> u8 {
    let v = trits.iter().fold(0u16, |v, &t| v * 3 + u16::from(t));
    let v = (trits.len()..5).fold(v, |v, _| v * 3);
    (v * 256).div_ceil(243) as u8
}

/// Why a row could not be dequantized.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    /// memwall has no decoder for the type yet.
    #[error("dequantization of {0} is not supported")]
    Unsupported(GgmlType),
    /// The output length is not a whole number of blocks, or the input does not match it.
    #[error("{ty}: {src} bytes do not hold {dst} weights")]
    Length {
        /// The type.
        ty: GgmlType,
        /// Input bytes.
        src: usize,
        /// Output weights.
        dst: usize,
    },
}

/// `[F32, F16, BF16, each type of block_types!]`.
macro_rules! decodable {
    ([$($t:ident => $b:ident as $f:ident,)*]) => {
        [GgmlType::F32, GgmlType::F16, GgmlType::BF16, $(GgmlType::$t,)*]
    };
}

/// The number of types in [`block_types!`](crate::block_types).
macro_rules! count {
    ([$($t:ident => $b:ident as $f:ident,)*]) => {
        [$(stringify!($t)),*].len()
    };
}

/// Types [`dequantize_row`] decodes: the float types and every block type.
pub const DEQUANTIZABLE: [GgmlType; 3 + crate::block_types!([count])] =
    crate::block_types!([decodable]);

/// Byte offsets, within one block, of the f16 scale fields of each quantized
/// type that [`validate_row`] checks (ggml's `ggml_validate_row_data`), for
/// tests that build blocks with chosen scales.
pub fn scale_fields(ty: GgmlType) -> &'static [usize] {
    crate::with_block!(ty, B => B::F16_SCALES, _ => &[])
}

/// Checks a row of `ty` for NaN and infinity where ggml's
/// `ggml_validate_row_data` looks: every value of F32, F16 and BF16 data, the
/// f16 scales (and mins) of each block of the quantized types. Returns the
/// index of the first bad value (float types) or block (quantized types).
/// Types without a decoder are not checked. `bytes` must be whole values or
/// blocks.
pub fn validate_row(ty: GgmlType, bytes: &[u8]) -> Result<(), usize> {
    let first_bad = |bad: Option<usize>| bad.map_or(Ok(()), Err);
    match ty {
        GgmlType::F32 => first_bad(
            bytes
                .chunks_exact(4)
                .position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
        ),
        // An f16 or bf16 is NaN or infinite when its exponent bits are all ones.
        GgmlType::F16 => first_bad(
            bytes
                .chunks_exact(2)
                .position(|b| !F16([b[0], b[1]]).is_finite()),
        ),
        GgmlType::BF16 => first_bad(
            bytes
                .chunks_exact(2)
                .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80),
        ),
        _ => crate::with_block!(ty, B => first_bad(
            as_blocks::<B>(bytes).iter().position(|b| !b.scales_finite())
        ), _ => Ok(())),
    }
}

/// Decodes `dst.len()` weights of type `ty` from `src`, which must hold exactly
/// that many weights.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), DequantError> {
    let (bs, ts) = (ty.block_size() as usize, ty.type_size() as usize);
    if !DEQUANTIZABLE.contains(&ty) {
        return Err(DequantError::Unsupported(ty));
    }
    if dst.len() % bs != 0 || src.len() != dst.len() / bs * ts {
        return Err(DequantError::Length {
            ty,
            src: src.len(),
            dst: dst.len(),
        });
    }
    match ty {
        GgmlType::F32 => {
            for (b, y) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            let table = f16_table();
            for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *y = table[usize::from(u16::from_le_bytes([b[0], b[1]]))];
            }
        }
        GgmlType::BF16 => {
            for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        _ => crate::with_block!(ty, B => {
            for (b, y) in as_blocks::<B>(src).iter().zip(dst.chunks_exact_mut(B::WEIGHTS)) {
                b.dequantize(y);
            }
        }, _ => unreachable!("checked against DEQUANTIZABLE")),
    }
    Ok(())
}

/// `impl Block` with the type, weights per block and scale fields given.
macro_rules! block {
    ($b:ident, $t:ident, $weights:expr, [$($scale:ident),*]) => {
        impl Block for $b {
            const TYPE: GgmlType = GgmlType::$t;
            const WEIGHTS: usize = $weights;
            #[inline]
            fn dequantize(&self, y: &mut [f32]) {
                self.decode(y)
            }
            const F16_SCALES: &'static [usize] = &[$(std::mem::offset_of!($b, $scale)),*];
            #[inline]
            fn scales_finite(&self) -> bool {
                true $(&& self.$scale.is_finite())*
            }
        }
    };
}

block!(BlockQ4_0, Q4_0, 32, [d]);
block!(BlockQ4_1, Q4_1, 32, [d, m]);
block!(BlockQ5_0, Q5_0, 32, [d]);
block!(BlockQ5_1, Q5_1, 32, [d, m]);
block!(BlockQ8_0, Q8_0, 32, [d]);
block!(BlockQ2K, Q2_K, 256, [d, dmin]);
block!(BlockQ3K, Q3_K, 256, [d]);
block!(BlockQ4K, Q4_K, 256, [d, dmin]);
block!(BlockQ5K, Q5_K, 256, [d, dmin]);
block!(BlockQ6K, Q6_K, 256, [d]);
block!(BlockIq4Nl, IQ4_NL, 32, [d]);
block!(BlockIq4Xs, IQ4_XS, 256, [d]);
block!(BlockTq1_0, TQ1_0, 256, [d]);
block!(BlockTq2_0, TQ2_0, 256, [d]);
block!(BlockQ1_0, Q1_0, 128, [d]);
block!(BlockQ2_0, Q2_0, 64, [d]);

impl Block for BlockMxfp4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const WEIGHTS: usize = 32;
    #[inline]
    fn dequantize(&self, y: &mut [f32]) {
        let d = e8m0_half(self.e);
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = f32::from(MXFP4_GRID[usize::from(q & 0xf)]) * d;
            y[j + 16] = f32::from(MXFP4_GRID[usize::from(q >> 4)]) * d;
        }
    }
    /// The scale is an exponent, no f16.
    const F16_SCALES: &'static [usize] = &[];
    /// ggml refuses the exponent 0xff (NaN in E8M0).
    #[inline]
    fn scales_finite(&self) -> bool {
        self.e != 0xff
    }
}

impl BlockQ4_0 {
    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = (i32::from(q & 0xf) - 8) as f32 * d;
            y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }
}

impl BlockQ4_1 {
    fn decode(&self, y: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = f32::from(q & 0xf) * d + m;
            y[j + 16] = f32::from(q >> 4) * d + m;
        }
    }
}

/// The 5-bit values of a Q5_0/Q5_1 block, before offset and scale.
fn q5_values(qh: [u8; 4], qs: &[u8; 16]) -> [i32; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut v = [0i32; 32];
    for (j, &q) in qs.iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        v[j] = (u32::from(q & 0xf) | h0) as i32;
        v[j + 16] = (u32::from(q >> 4) | h1) as i32;
    }
    v
}

impl BlockQ5_0 {
    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (out, q) in y.iter_mut().zip(q5_values(self.qh, &self.qs)) {
            *out = (q - 16) as f32 * d;
        }
    }
}

impl BlockQ5_1 {
    fn decode(&self, y: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (out, q) in y.iter_mut().zip(q5_values(self.qh, &self.qs)) {
            *out = q as f32 * d + m;
        }
    }
}

impl BlockQ8_0 {
    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (out, &q) in y.iter_mut().zip(&self.qs) {
            *out = f32::from(q) * d;
        }
    }
}

impl BlockQ2K {
    fn decode(&self, y: &mut [f32]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        let mut out = 0;
        let mut is = 0;
        for q in self.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for half in [&q[..16], &q[16..]] {
                    let sc = self.scales[is];
                    is += 1;
                    let (dl, ml) = (d * f32::from(sc & 0xf), min * f32::from(sc >> 4));
                    for &x in half {
                        y[out] = dl * f32::from((x >> shift) & 3) - ml;
                        out += 1;
                    }
                }
            }
        }
    }
}

impl BlockQ3K {
    /// The sixteen 6-bit sub-block scales, unbiased (−32..31).
    #[inline]
    pub fn sub_scales(&self) -> [i8; 16] {
        let p = &self.scales;
        std::array::from_fn(|j| {
            let low = if j < 8 { p[j] & 0xf } else { p[j - 8] >> 4 };
            let high = (p[8 + j % 4] >> (2 * (j / 4))) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }

    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        let scales = self.sub_scales();
        let mut m = 1u8;
        let mut out = 0;
        let mut is = 0;
        for q in self.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for (half, hm) in [(&q[..16], &self.hmask[..16]), (&q[16..], &self.hmask[16..])] {
                    let dl = d * f32::from(scales[is]);
                    is += 1;
                    for (&x, &h) in half.iter().zip(hm) {
                        let v = ((x >> shift) & 3) as i8 - if h & m != 0 { 0 } else { 4 };
                        y[out] = dl * f32::from(v);
                        out += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// Scale and min `j` (0..8) of a Q4_K/Q5_K block (`get_scale_min_k4`).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl BlockQ4K {
    fn decode(&self, y: &mut [f32]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (c, q) in self.qs.chunks_exact(32).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * c, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &self.scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let y = &mut y[64 * c..64 * c + 64];
            for (l, &x) in q.iter().enumerate() {
                y[l] = d1 * f32::from(x & 0xf) - m1;
                y[l + 32] = d2 * f32::from(x >> 4) - m2;
            }
        }
    }
}

impl BlockQ5K {
    fn decode(&self, y: &mut [f32]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (c, q) in self.qs.chunks_exact(32).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * c, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &self.scales);
            let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            let y = &mut y[64 * c..64 * c + 64];
            for (l, (&x, &h)) in q.iter().zip(&self.qh).enumerate() {
                let hi1 = if h & u1 != 0 { 16 } else { 0 };
                let hi2 = if h & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * f32::from((x & 0xf) + hi1) - m1;
                y[l + 32] = d2 * f32::from((x >> 4) + hi2) - m2;
            }
        }
    }
}

impl BlockQ6K {
    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for n in 0..2 {
            let (ql, qh) = (&self.ql[64 * n..64 * n + 64], &self.qh[32 * n..32 * n + 32]);
            let sc = &self.scales[8 * n..8 * n + 8];
            let y = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
                let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                y[l] = d * f32::from(sc[is]) * f32::from(q1);
                y[l + 32] = d * f32::from(sc[is + 2]) * f32::from(q2);
                y[l + 64] = d * f32::from(sc[is + 4]) * f32::from(q3);
                y[l + 96] = d * f32::from(sc[is + 6]) * f32::from(q4);
            }
        }
    }
}

impl BlockIq4Nl {
    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = d * f32::from(IQ4NL_GRID[usize::from(q & 0xf)]);
            y[j + 16] = d * f32::from(IQ4NL_GRID[usize::from(q >> 4)]);
        }
    }
}

impl BlockIq4Xs {
    /// The eight 6-bit sub-block scales, unbiased (−32..31).
    #[inline]
    pub fn sub_scales(&self) -> [i32; 8] {
        let h = u16::from_le_bytes(self.scales_h);
        std::array::from_fn(|ib| {
            let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
            let high = ((h >> (2 * ib)) & 3) as u8;
            i32::from(low | (high << 4)) - 32
        })
    }

    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        let scales = self.sub_scales();
        for (ib, qs) in self.qs.chunks_exact(16).enumerate() {
            let dl = d * scales[ib] as f32;
            let y = &mut y[32 * ib..32 * ib + 32];
            for (j, &q) in qs.iter().enumerate() {
                y[j] = dl * f32::from(IQ4NL_GRID[usize::from(q & 0xf)]);
                y[j + 16] = dl * f32::from(IQ4NL_GRID[usize::from(q >> 4)]);
            }
        }
    }
}

impl BlockTq1_0 {
    /// The block's 256 trits (0, 1, 2) in weight order.
    pub fn trits(&self) -> [u8; 256] {
        let mut t = [0u8; 256];
        for (n, out) in t[..160].chunks_exact_mut(32).enumerate() {
            for (o, &q) in out.iter_mut().zip(&self.qs[..32]) {
                *o = tq1_trit(q, n);
            }
        }
        for (n, out) in t[160..240].chunks_exact_mut(16).enumerate() {
            for (o, &q) in out.iter_mut().zip(&self.qs[32..]) {
                *o = tq1_trit(q, n);
            }
        }
        for (n, out) in t[240..].chunks_exact_mut(4).enumerate() {
            for (o, &q) in out.iter_mut().zip(&self.qh) {
                *o = tq1_trit(q, n);
            }
        }
        t
    }

    /// Packs 256 trits (0, 1, 2) in weight order: the inverse of [`BlockTq1_0::trits`].
    pub fn set_trits(&mut self, t: &[u8; 256]) {
        for (m, q) in self.qs[..32].iter_mut().enumerate() {
            *q = tq1_pack(&std::array::from_fn::<u8, 5, _>(|n| t[m + 32 * n]));
        }
        for (m, q) in self.qs[32..].iter_mut().enumerate() {
            *q = tq1_pack(&std::array::from_fn::<u8, 5, _>(|n| t[160 + m + 16 * n]));
        }
        for (j, q) in self.qh.iter_mut().enumerate() {
            *q = tq1_pack(&std::array::from_fn::<u8, 4, _>(|n| t[240 + j + 4 * n]));
        }
    }

    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (out, t) in y.iter_mut().zip(self.trits()) {
            *out = (f32::from(t) - 1.0) * d;
        }
    }
}

impl BlockTq2_0 {
    /// The 2-bit value of weight `i` (0, 1, 2; 3 decodes as 2 · d).
    #[inline]
    pub fn value(&self, i: usize) -> u8 {
        let (half, l, m) = (i / 128, (i % 128) / 32, i % 32);
        (self.qs[32 * half + m] >> (2 * l)) & 3
    }

    /// Packs 256 values (0..4) in weight order: the inverse of [`BlockTq2_0::value`].
    pub fn set_values(&mut self, v: &[u8; 256]) {
        for (k, q) in self.qs.iter_mut().enumerate() {
            let (half, m) = (k / 32, k % 32);
            *q = (0..4).fold(0, |q, l| q | (v[128 * half + 32 * l + m] & 3) << (2 * l));
        }
    }

    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (i, out) in y.iter_mut().enumerate() {
            *out = (f32::from(self.value(i)) - 1.0) * d;
        }
    }
}

impl Block for BlockNvfp4 {
    const TYPE: GgmlType = GgmlType::NVFP4;
    const WEIGHTS: usize = 64;
    #[inline]
    fn dequantize(&self, y: &mut [f32]) {
        for (s, (y, qs)) in y
            .chunks_exact_mut(16)
            .zip(self.qs.chunks_exact(8))
            .enumerate()
        {
            let d = ue4m3_half(self.d[s]);
            for (j, &q) in qs.iter().enumerate() {
                y[j] = f32::from(MXFP4_GRID[usize::from(q & 0xf)]) * d;
                y[j + 8] = f32::from(MXFP4_GRID[usize::from(q >> 4)]) * d;
            }
        }
    }
    /// The scales are E4M3 bytes, no f16.
    const F16_SCALES: &'static [usize] = &[];
    /// ggml accepts every scale byte (`ggml_validate_row_data`).
    #[inline]
    fn scales_finite(&self) -> bool {
        true
    }
}

impl BlockQ1_0 {
    /// The sign of weight `j`: `true` for `+d`.
    #[inline]
    pub fn positive(&self, j: usize) -> bool {
        self.qs[j / 8] >> (j % 8) & 1 != 0
    }

    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, out) in y.iter_mut().enumerate() {
            *out = if self.positive(j) { d } else { -d };
        }
    }
}

impl BlockQ2_0 {
    /// The 2-bit value `q` of weight `j` (`x = d · (q − 1)`).
    #[inline]
    pub fn value(&self, j: usize) -> u8 {
        self.qs[j / 4] >> (2 * (j % 4)) & 3
    }

    fn decode(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, out) in y.iter_mut().enumerate() {
            *out = (f32::from(self.value(j)) - 1.0) * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[(type, block size, bytes per block, WEIGHTS, TYPE)]` of every block type.
    macro_rules! layouts {
        ([$($t:ident => $b:ident as $f:ident,)*]) => {
            [$((
                GgmlType::$t,
                size_of::<$b>(),
                <$b as Block>::WEIGHTS,
                <$b as Block>::TYPE,
            ),)*]
        };
    }

    #[test]
    fn ternary_blocks_read_back_the_values_they_pack() {
        let t: [u8; 256] = std::array::from_fn(|i| ((i * 7 + i / 5) % 3) as u8);
        let mut b1 = BlockTq1_0::zeroed();
        b1.set_trits(&t);
        assert_eq!(b1.trits(), t);
        let mut b2 = BlockTq2_0::zeroed();
        b2.set_values(&t);
        assert!((0..256).all(|i| b2.value(i) == t[i]));
        // Every byte value decodes to trits that pack back to it or to a
        // smaller byte with the same trits (243 values in 256 bytes).
        for q in 0..=255u8 {
            let t: [u8; 5] = std::array::from_fn(|n| tq1_trit(q, n));
            let p = tq1_pack(&t);
            assert!(t == std::array::from_fn(|n| tq1_trit(p, n)), "{q}");
        }
    }

    #[test]
    fn e8m0_halves_are_powers_of_two() {
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(254), 2f32.powi(126));
    }

    #[test]
    fn every_block_struct_is_its_registry_layout() {
        for (ty, bytes, weights, of) in crate::block_types!([layouts]) {
            assert_eq!(of, ty);
            assert_eq!(bytes as u64, ty.type_size(), "{ty}");
            assert_eq!(weights as u64, ty.block_size(), "{ty}");
        }
    }

    #[test]
    fn f16_conversion_is_exact() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert!(f16_to_f32(0x7c00).is_infinite() && f16_to_f32(0x7e00).is_nan());
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn f16_round_trips_and_rounds_to_nearest_even() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if !x.is_nan() {
                assert_eq!(f32_to_f16(x), h, "{h:#06x}");
            }
        }
        // Halfway between 1.0 and the next f16 (1 + 2^-10): ties to even, i.e. 1.0.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "rounds up to infinity");
        assert_eq!(
            f32_to_f16(2f32.powi(-25)),
            0x0000,
            "tie to even at the smallest subnormal"
        );
        assert_eq!(f32_to_f16(1.5 * 2f32.powi(-25)), 0x0001);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f80_8000)),
            0x3f80,
            "tie to even"
        );
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
    }

    #[test]
    fn lengths_are_checked() {
        let mut y = [0f32; 32];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0; 17], &mut y),
            Err(DequantError::Length { .. })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::Q4_K, &[0; 144], &mut y),
            Err(DequantError::Length { .. })
        ));
        assert_eq!(
            dequantize_row(GgmlType::Q8_K, &[], &mut []),
            Err(DequantError::Unsupported(GgmlType::Q8_K))
        );
    }

    #[test]
    fn ue4m3_scales_round_trip_as_ggml_rounds_them() {
        // Half the E4M3 value: 1.0 is exponent 7, mantissa 0.
        assert_eq!(ue4m3_half(0x38), 0.5);
        assert_eq!(ue4m3_half(0x7e), 224.0); // 448, the largest
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-10)); // the smallest subnormal
        assert_eq!(ue4m3_half(0x7f), 0.0); // NaN reads as zero
        assert_eq!(ue4m3_half(0xb8), 0.5); // the sign bit is ignored
        for x in 1..0x78u8 {
            assert_eq!(ue4m3_from_f32(2.0 * ue4m3_half(x)), x, "{x:#x}");
        }
        // ggml saturates the whole top exponent (256 and up) to 448.
        assert_eq!(ue4m3_from_f32(256.0), 0x7e);
        assert_eq!(ue4m3_from_f32(1.0 + 1.0 / 16.0), 0x39); // half up
        assert_eq!(ue4m3_from_f32(1.0 + 15.0 / 16.0), 0x40); // carries into the exponent
        assert_eq!(ue4m3_from_f32(1e6), 0x7e);
        assert_eq!(ue4m3_from_f32(2f32.powi(-10)), 1); // rounds up to the smallest subnormal, 2⁻⁹
        assert_eq!(ue4m3_from_f32(2f32.powi(-11)), 0);
        assert_eq!(ue4m3_from_f32(-1.0), 0);
        assert_eq!(ue4m3_from_f32(f32::NAN), 0);
    }
}
