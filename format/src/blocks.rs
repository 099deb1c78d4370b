//! ggml block formats and their scalar dequantization: the specification every
//! faster kernel is tested against.
//!
//! Each block struct mirrors ggml's on-disk layout (`ggml-common.h`), is
//! `#[repr(C)]` with a compile-time size check, and is read from bytes by
//! copying fields (no casts, no `unsafe`). `f16` fields are kept as raw bits.
//! Sources: `ggml/src/ggml-common.h` (layouts) and `ggml/src/ggml-quants.c`
//! (`dequantize_row_*`) of llama.cpp 0c1e570; the arithmetic is done in `f32` in
//! the same order as ggml, so results are bit-identical to ggml's reference.

use crate::ggml_type::GgmlType;

/// IEEE half-precision bits to `f32` (exact).
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
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 64) as u16;
    }
    ((b + (0x7fff + ((b >> 16) & 1))) >> 16) as u16
}

/// bfloat16 bits to `f32` (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// The non-linear 4-bit grid of IQ4_NL and IQ4_XS (`kvalues_iq4nl`).
pub const IQ4NL_GRID: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Q4_0: 32 weights, 4.5 bpw. `x = d · (q − 8)`; low nibbles hold x[0..16], high x[16..32].
#[repr(C)]
pub struct BlockQ4_0 {
    /// Scale (f16 bits).
    pub d: u16,
    /// Nibbles.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// Q4_1: 32 weights, 5 bpw. `x = d · q + m`.
#[repr(C)]
pub struct BlockQ4_1 {
    /// Scale (f16 bits).
    pub d: u16,
    /// Minimum (f16 bits).
    pub m: u16,
    /// Nibbles.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// Q5_0: 32 weights, 5.5 bpw. `x = d · (q − 16)`, the fifth bits in `qh`.
#[repr(C)]
pub struct BlockQ5_0 {
    /// Scale (f16 bits).
    pub d: u16,
    /// Fifth bits, little-endian u32.
    pub qh: [u8; 4],
    /// Nibbles.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// Q5_1: 32 weights, 6 bpw. `x = d · q + m`.
#[repr(C)]
pub struct BlockQ5_1 {
    /// Scale (f16 bits).
    pub d: u16,
    /// Minimum (f16 bits).
    pub m: u16,
    /// Fifth bits.
    pub qh: [u8; 4],
    /// Nibbles.
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// Q8_0: 32 weights, 8.5 bpw. `x = d · q`.
#[repr(C)]
pub struct BlockQ8_0 {
    /// Scale (f16 bits).
    pub d: u16,
    /// Signed quants.
    pub qs: [i8; 32],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// Q2_K: 256 weights, 2.625 bpw. 16 groups of 16 with 4-bit scale and 4-bit min:
/// `x = d · sc · q − dmin · m`.
#[repr(C)]
pub struct BlockQ2K {
    /// Low nibble scale, high nibble min, per 16 weights.
    pub scales: [u8; 16],
    /// 2-bit quants.
    pub qs: [u8; 64],
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Super-block min scale (f16 bits).
    pub dmin: u16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// Q3_K: 256 weights, 3.4375 bpw. 16 six-bit scales biased by 32:
/// `x = d · (sc − 32) · (q₂ − (hbit ? 0 : 4))`.
#[repr(C)]
pub struct BlockQ3K {
    /// High bits.
    pub hmask: [u8; 32],
    /// Low 2 bits.
    pub qs: [u8; 64],
    /// Packed 6-bit scales.
    pub scales: [u8; 12],
    /// Super-block scale (f16 bits).
    pub d: u16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// Q4_K: 256 weights, 4.5 bpw. 8 groups of 32 with 6-bit scale and min:
/// `x = d · sc · q − dmin · m`.
#[repr(C)]
pub struct BlockQ4K {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Super-block min scale (f16 bits).
    pub dmin: u16,
    /// Packed 6-bit scales and mins.
    pub scales: [u8; 12],
    /// Nibbles: each 64-weight chunk has 0..32 low, 32..64 high.
    pub qs: [u8; 128],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// Q5_K: 256 weights, 5.5 bpw. Q4_K plus a fifth bit per weight.
#[repr(C)]
pub struct BlockQ5K {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Super-block min scale (f16 bits).
    pub dmin: u16,
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
#[repr(C)]
pub struct BlockQ6K {
    /// Low 4 bits.
    pub ql: [u8; 128],
    /// High 2 bits.
    pub qh: [u8; 64],
    /// Signed scales.
    pub scales: [i8; 16],
    /// Super-block scale (f16 bits).
    pub d: u16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// IQ4_NL: 32 weights, 4.5 bpw. `x = d · IQ4NL_GRID[q]`.
#[repr(C)]
pub struct BlockIq4Nl {
    /// Scale (f16 bits).
    pub d: u16,
    /// Grid indices (nibbles).
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockIq4Nl>() == 18);

/// IQ4_XS: 256 weights, 4.25 bpw. 8 groups of 32 with 6-bit scales biased by 32:
/// `x = d · (ls − 32) · IQ4NL_GRID[q]`.
#[repr(C)]
pub struct BlockIq4Xs {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// High 2 bits of the 8 scales.
    pub scales_h: u16,
    /// Low 4 bits of the 8 scales.
    pub scales_l: [u8; 4],
    /// Grid indices (nibbles).
    pub qs: [u8; 128],
}
const _: () = assert!(size_of::<BlockIq4Xs>() == 136);

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

/// Types [`dequantize_row`] decodes.
pub const DEQUANTIZABLE: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// Byte offsets, within one block, of the f16 scale fields of each quantized
/// type that [`validate_row`] checks (ggml's `ggml_validate_row_data`).
pub fn scale_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// Checks a row of `ty` for NaN and infinity where ggml's
/// `ggml_validate_row_data` looks: every value of F32, F16 and BF16 data, the
/// f16 scales (and mins) of each block of the quantized types. Returns the
/// index of the first bad value (float types) or block (quantized types).
/// Types without a decoder are not checked.
pub fn validate_row(ty: GgmlType, bytes: &[u8]) -> Result<(), usize> {
    let bad = |i: usize| Err(i);
    match ty {
        GgmlType::F32 => {
            for (i, b) in bytes.chunks_exact(4).enumerate() {
                if !f32::from_le_bytes(arr(b, 0)).is_finite() {
                    return bad(i);
                }
            }
        }
        // An f16 or bf16 is NaN or infinite when its exponent bits are all ones.
        GgmlType::F16 => {
            for (i, b) in bytes.chunks_exact(2).enumerate() {
                if le16(b, 0) & 0x7c00 == 0x7c00 {
                    return bad(i);
                }
            }
        }
        GgmlType::BF16 => {
            for (i, b) in bytes.chunks_exact(2).enumerate() {
                if le16(b, 0) & 0x7f80 == 0x7f80 {
                    return bad(i);
                }
            }
        }
        _ => {
            let fields = scale_fields(ty);
            let ts = ty.type_size() as usize;
            for (i, block) in bytes.chunks_exact(ts).enumerate() {
                if fields.iter().any(|&o| le16(block, o) & 0x7c00 == 0x7c00) {
                    return bad(i);
                }
            }
        }
    }
    Ok(())
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
    // The float types convert element by element; keep the type dispatch out of their loop.
    match ty {
        GgmlType::F32 => {
            for (b, y) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *y = f32::from_le_bytes(arr(b, 0));
            }
            return Ok(());
        }
        GgmlType::F16 => {
            let table = f16_table();
            for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *y = table[usize::from(le16(b, 0))];
            }
            return Ok(());
        }
        GgmlType::BF16 => {
            for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *y = bf16_to_f32(le16(b, 0));
            }
            return Ok(());
        }
        _ => {}
    }
    for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
        match ty {
            GgmlType::F32 => y[0] = f32::from_le_bytes(arr(b, 0)),
            GgmlType::F16 => y[0] = f16_to_f32(le16(b, 0)),
            GgmlType::BF16 => y[0] = bf16_to_f32(le16(b, 0)),
            GgmlType::Q4_0 => BlockQ4_0::read(b).dequantize(y),
            GgmlType::Q4_1 => BlockQ4_1::read(b).dequantize(y),
            GgmlType::Q5_0 => BlockQ5_0::read(b).dequantize(y),
            GgmlType::Q5_1 => BlockQ5_1::read(b).dequantize(y),
            GgmlType::Q8_0 => BlockQ8_0::read(b).dequantize(y),
            GgmlType::Q2_K => BlockQ2K::read(b).dequantize(y),
            GgmlType::Q3_K => BlockQ3K::read(b).dequantize(y),
            GgmlType::Q4_K => BlockQ4K::read(b).dequantize(y),
            GgmlType::Q5_K => BlockQ5K::read(b).dequantize(y),
            GgmlType::Q6_K => BlockQ6K::read(b).dequantize(y),
            GgmlType::IQ4_NL => BlockIq4Nl::read(b).dequantize(y),
            GgmlType::IQ4_XS => BlockIq4Xs::read(b).dequantize(y),
            _ => unreachable!("checked against DEQUANTIZABLE"),
        }
    }
    Ok(())
}

impl BlockQ4_0 {
    fn read(b: &[u8]) -> Self {
        BlockQ4_0 {
            d: le16(b, 0),
            qs: arr(b, 2),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = (i32::from(q & 0xf) - 8) as f32 * d;
            y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }
}

impl BlockQ4_1 {
    fn read(b: &[u8]) -> Self {
        BlockQ4_1 {
            d: le16(b, 0),
            m: le16(b, 2),
            qs: arr(b, 4),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let (d, m) = (f16_to_f32(self.d), f16_to_f32(self.m));
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
    fn read(b: &[u8]) -> Self {
        BlockQ5_0 {
            d: le16(b, 0),
            qh: arr(b, 2),
            qs: arr(b, 6),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (out, q) in y.iter_mut().zip(q5_values(self.qh, &self.qs)) {
            *out = (q - 16) as f32 * d;
        }
    }
}

impl BlockQ5_1 {
    fn read(b: &[u8]) -> Self {
        BlockQ5_1 {
            d: le16(b, 0),
            m: le16(b, 2),
            qh: arr(b, 4),
            qs: arr(b, 8),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let (d, m) = (f16_to_f32(self.d), f16_to_f32(self.m));
        for (out, q) in y.iter_mut().zip(q5_values(self.qh, &self.qs)) {
            *out = q as f32 * d + m;
        }
    }
}

impl BlockQ8_0 {
    fn read(b: &[u8]) -> Self {
        BlockQ8_0 {
            d: le16(b, 0),
            qs: arr::<32>(b, 2).map(|x| x as i8),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (out, &q) in y.iter_mut().zip(&self.qs) {
            *out = f32::from(q) * d;
        }
    }
}

impl BlockQ2K {
    fn read(b: &[u8]) -> Self {
        BlockQ2K {
            scales: arr(b, 0),
            qs: arr(b, 16),
            d: le16(b, 80),
            dmin: le16(b, 82),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let (d, min) = (f16_to_f32(self.d), f16_to_f32(self.dmin));
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

/// Unpacks 16 six-bit Q3_K scales from 12 bytes.
fn q3k_scales(packed: &[u8; 12]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let w = |i: usize| u32::from_le_bytes(arr(packed, 4 * i));
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut s = [0i8; 16];
    for (i, word) in aux.iter().enumerate() {
        for (k, byte) in word.to_le_bytes().into_iter().enumerate() {
            s[4 * i + k] = byte as i8;
        }
    }
    s
}

impl BlockQ3K {
    fn read(b: &[u8]) -> Self {
        BlockQ3K {
            hmask: arr(b, 0),
            qs: arr(b, 32),
            scales: arr(b, 96),
            d: le16(b, 108),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let scales = q3k_scales(&self.scales);
        let mut m = 1u8;
        let mut out = 0;
        let mut is = 0;
        for q in self.qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for (half, hm) in [(&q[..16], &self.hmask[..16]), (&q[16..], &self.hmask[16..])] {
                    let dl = d * f32::from(scales[is] as i16 - 32);
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
    fn read(b: &[u8]) -> Self {
        BlockQ4K {
            d: le16(b, 0),
            dmin: le16(b, 2),
            scales: arr(b, 4),
            qs: arr(b, 16),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let (d, min) = (f16_to_f32(self.d), f16_to_f32(self.dmin));
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
    fn read(b: &[u8]) -> Self {
        BlockQ5K {
            d: le16(b, 0),
            dmin: le16(b, 2),
            scales: arr(b, 4),
            qh: arr(b, 16),
            qs: arr(b, 48),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let (d, min) = (f16_to_f32(self.d), f16_to_f32(self.dmin));
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
    fn read(b: &[u8]) -> Self {
        BlockQ6K {
            ql: arr(b, 0),
            qh: arr(b, 128),
            scales: arr::<16>(b, 192).map(|x| x as i8),
            d: le16(b, 208),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
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
    fn read(b: &[u8]) -> Self {
        BlockIq4Nl {
            d: le16(b, 0),
            qs: arr(b, 2),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (j, &q) in self.qs.iter().enumerate() {
            y[j] = d * f32::from(IQ4NL_GRID[usize::from(q & 0xf)]);
            y[j + 16] = d * f32::from(IQ4NL_GRID[usize::from(q >> 4)]);
        }
    }
}

impl BlockIq4Xs {
    fn read(b: &[u8]) -> Self {
        BlockIq4Xs {
            d: le16(b, 0),
            scales_h: le16(b, 2),
            scales_l: arr(b, 4),
            qs: arr(b, 8),
        }
    }

    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (ib, qs) in self.qs.chunks_exact(16).enumerate() {
            let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
            let high = ((self.scales_h >> (2 * ib)) & 3) as u8;
            let ls = i16::from(low | (high << 4));
            let dl = d * f32::from(ls - 32);
            let y = &mut y[32 * ib..32 * ib + 32];
            for (j, &q) in qs.iter().enumerate() {
                y[j] = dl * f32::from(IQ4NL_GRID[usize::from(q & 0xf)]);
                y[j + 16] = dl * f32::from(IQ4NL_GRID[usize::from(q >> 4)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            dequantize_row(GgmlType::IQ2_XXS, &[], &mut []),
            Err(DequantError::Unsupported(GgmlType::IQ2_XXS))
        );
    }
}
