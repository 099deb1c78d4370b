//! Compute kernels: ggml-compatible activation quantization, quantized dot
//! products and the multi-threaded matrix multiply of the forward pass.
//!
//! llama.cpp never dequantizes a weight matrix to multiply it: it quantizes the
//! activations once to the weight type's *vec_dot type* (Q8_0, Q8_1 or Q8_K for
//! the quantized types, F16/BF16/F32 for the float ones) and takes integer dot
//! products block by block, scaling each block's integer sum by the two block
//! scales. This module does the same:
//!
//! - [`quantize_row_q8_0`], [`quantize_row_q8_1`], [`quantize_row_q8_k`]: the
//!   activation quantizers, bit-identical to ggml's `quantize_row_q8_*_ref`.
//! - [`Kernels`]: the dot products of one [`Backend`] (scalar, AVX2, AVX-512,
//!   NEON, NEON with `sdot`), chosen once at run time ([`Kernels::detect`],
//!   overridable with `MEMWALL_KERNELS`). The scalar kernels (`scalar.rs`) are
//!   the specification; every SIMD kernel returns their bits (see below).
//! - [`Matmul`]: `y = W·x` for a batch of tokens on a persistent thread pool,
//!   with reusable scratch buffers (no allocation per call once warm).
//!
//! **Invariant:** every backend returns the same bits as the scalar kernels,
//! for every dot product and therefore every [`Matmul::matmul`] output, on
//! every thread count. Results do not depend on the CPU, its vector width or
//! the thread pool, so a model's perplexity is the same on x86-64 and on
//! aarch64. The scalar kernels fix one floating-point evaluation order (below)
//! and every SIMD kernel reproduces it operation for operation.
//!
//! # The canonical evaluation order
//!
//! All float arithmetic is IEEE-754 binary32, round to nearest even, with
//! separate multiplies and adds (Rust never contracts `a * b + c`; SIMD kernels
//! use no fused multiply-add except where the product is exact, below).
//! Conversions f16/bf16 → f32 are exact; `i32 → f32` rounds to nearest even.
//!
//! **Quantized types.** A row is a sequence of blocks `b = 0, 1, …` (32
//! weights; 256 for the K-quants and IQ4_XS, whose super-block is the block).
//! 1. The block's integer sums are exact (`i32`, in any order): `isum`, the
//!    scaled sum over the block (the K-quants multiply their sub-block scales
//!    in, and take the offsets of Q3_K/Q6_K out, in integers), and for the
//!    K-quants with minimums `summs = Σ_j m[j]·bsums[j]`.
//! 2. The block's term `t_b` is, with `d_w`, `m_w` the weight block's scale
//!    and minimum, `d_a` the activation block's scale and `s_a` its `s`:
//!    - Q4_0, Q5_0, Q8_0, IQ4_NL, Q3_K, Q6_K, IQ4_XS: `t = (d_w·d_a) · f32(isum)`
//!    - Q4_1, Q5_1: `t = (d_w·d_a) · f32(isum) + m_w·s_a`
//!    - Q2_K, Q4_K, Q5_K: `t = (d_w·d_a) · f32(isum) − (m_w·d_a) · f32(summs)`
//!
//!    each operation rounded, left to right as written. The blocks of Q1_0
//!    (128 weights), Q2_0 and NVFP4 (64) span several Q8_0 activation
//!    blocks: there each activation block is a block `b` of its own (its 32
//!    weights, the weight block's scale), with the Q4_0 term for Q1_0 and
//!    Q2_0, and for NVFP4, whose 16-weight sub-blocks have scales `d₀`, `d₁`,
//!    `t = (d₀·d_a) · f32(isum₀) + (d₁·d_a) · f32(isum₁)`.
//! 3. Eight partial sums, all starting at `+0.0`: block `b` is added to
//!    partial `b mod 8`, in increasing `b` (`p[b % 8] = p[b % 8] + t_b`).
//! 4. The result is `((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))`.
//!
//! AVX2 keeps the eight partials in one `__m256` and takes eight blocks per
//! step (their integer sums transposed into one vector); NEON keeps them in
//! two `float32x4_t`, four blocks per step. The K-quants (a handful of
//! super-blocks per row) reduce each super-block's sums to one `i32` and share
//! the scalar term and accumulation code.
//!
//! **Float types** (F32, F16, BF16 weights and [`Kernels::dot_f32`],
//! [`Kernels::dot_f16_f32`], [`Kernels::dot_f16_f16`]): the term of element
//! `i` is the product `x_i·y_i` (one rounding), added to partial `i mod 32`
//! (32 partials, so that AVX2 has four and NEON eight independent addition
//! chains). The 32 partials fold to eight, `q[k] = (p[k] + p[k+8]) +
//! (p[k+16] + p[k+24])`, which are reduced by the tree of step 4. Where the
//! product of two values is exact in f32 — f16 × f16, as in F16 weights
//! against f16 activations and `dot_f16_f16` — a fused multiply-add gives the
//! same bits as the multiply then add, and the SIMD kernels use it; everywhere
//! else (f32 × f32, f16 × f32, bf16 × bf16, which may round below f32's normal
//! range) they multiply, then add.
//!
//! The activation quantizers are scalar and shared by every backend, so the
//! blocks a dot product sees are the same everywhere too. Inputs with NaN or
//! infinities give NaN or infinities in every backend, but a NaN's payload
//! and sign may differ between CPUs.
//!
//! ```
//! use memwall_format::GgmlType;
//! use memwall_runtime::kernels::{Kernels, Matmul, QMatrix};
//!
//! // A 2×32 Q8_0 matrix: each row is one block (f16 scale 1.0, quants 0..32).
//! let mut data = Vec::new();
//! for _ in 0..2 {
//!     data.extend_from_slice(&0x3c00u16.to_le_bytes());
//!     data.extend((0..32).map(|q| q as u8));
//! }
//! let w = QMatrix::new(GgmlType::Q8_0, &data, 2, 32).unwrap();
//! // Activations of 127 quantize exactly (Q8_0 scale 1.0).
//! let x = vec![127.0f32; 32];
//! let mut y = vec![0f32; 2];
//! let mut mm = Matmul::new(Kernels::detect(), 1);
//! mm.matmul(&w, &x, &mut y).unwrap();
//! assert_eq!(y, [62992.0, 62992.0]); // 127 · (0 + 1 + … + 31)
//! ```

mod arch;
pub(crate) mod attn;

mod matmul;
mod pool;
mod scalar;
mod tiled;

use std::cell::RefCell;
use std::sync::OnceLock;

use memwall_format::GgmlType;
use memwall_format::blocks::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0, BlockQ2K, BlockQ3K,
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockTq1_0,
    BlockTq2_0, as_blocks,
};

use matmul::TILED_MIN_TOKENS;

pub use matmul::{Matmul, QMatrix, matmul};
pub use pool::{Pool, for_each_chunk};
pub use scalar::{quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k};

pub use memwall_format::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};
pub use memwall_format::ggml_type::{QK_K, QK8_0};

thread_local! {
    /// A thread's copy of the tile of `b` that [`Kernels::product_f32`]'s
    /// groups of rows read (kept: at `k` = 22 528 it is 2.9 MB).
    static PRODUCT_TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A matrix `b` (`k × n`, row-major) as [`Kernels::product_f32_packed`]
/// reads it: tile `j` (columns `32j..32j + 32`) is `k` rows of its 32
/// columns, one after the other, the first at a 64-byte boundary (at 16
/// bytes, half the vector loads of a tile's rows would cross a cache line);
/// the last `n mod 32` columns are not packed. Kept and packed again for
/// each matrix, so its buffer is allocated once.
#[derive(Debug, Default)]
pub struct ProductTiles {
    buf: Vec<f32>,
    /// The tiles: `buf[at..at + len]`.
    at: usize,
    len: usize,
}

impl ProductTiles {
    /// Columns per tile.
    pub const TILE: usize = attn::KEY_TILE;

    /// Packs `b` (`k × n`).
    pub fn pack(&mut self, b: &[f32], k: usize, n: usize) {
        const TILE: usize = ProductTiles::TILE;
        assert_eq!(b.len(), k * n, "ProductTiles::pack lengths");
        let tiles = self.tiles_mut(k, n);
        for (d, row) in b.chunks_exact(n.max(1)).enumerate() {
            for (j, cols) in row.as_chunks::<TILE>().0.iter().enumerate() {
                let at = (j * k + d) * TILE;
                tiles[at..at + TILE].copy_from_slice(cols);
            }
        }
    }

    /// Room for the tiles of a `k × n` matrix, for the caller to fill
    /// without a row-major copy: tile `j` (columns `32j..32j + 32`) is
    /// `k` rows of 32 values from `32·k·j`.
    pub fn tiles_mut(&mut self, k: usize, n: usize) -> &mut [f32] {
        self.len = n / Self::TILE * Self::TILE * k;
        self.at = aligned_at(&mut self.buf, self.len);
        &mut self.buf[self.at..self.at + self.len]
    }

    /// The packed tiles.
    pub fn tiles(&self) -> &[f32] {
        &self.buf[self.at..self.at + self.len]
    }
}

/// The first `n` values of `buf`, which grows to hold them and never
/// shrinks: a layer's products alternate between input widths, and a
/// resize to each filled the part a narrower call had cut off again (a
/// prompt's `memset` of several per cent). Callers overwrite all `n`.
fn grown<T: Clone>(buf: &mut Vec<T>, n: usize, fill: T) -> &mut [T] {
    if buf.len() < n {
        buf.resize(n, fill);
    }
    &mut buf[..n]
}

/// Where `n` floats of `buf` start at a 64-byte boundary, `buf` grown to
/// hold them (a thread's buffers of f32 rows that vector loads read).
fn aligned_at(buf: &mut Vec<f32>, n: usize) -> usize {
    if buf.len() < n + 15 {
        buf.resize(n + 15, 0.0);
    }
    buf.as_ptr().align_offset(64).min(15)
}

/// `n` floats of `buf` from a 64-byte boundary ([`aligned_at`]).
fn aligned(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    let at = aligned_at(buf, n);
    &mut buf[at..at + n]
}

/// Columns `j0..j0 + 32` of `b`'s `k` rows (`n` columns each) into `pack`.
fn pack_tile<'a>(b: &[f32], k: usize, n: usize, j0: usize, pack: &'a mut Vec<f32>) -> &'a [f32] {
    const TILE: usize = attn::KEY_TILE;
    let tile = aligned(pack, k * TILE);
    for (d, row) in tile.as_chunks_mut::<TILE>().0.iter_mut().enumerate() {
        row.copy_from_slice(&b[d * n + j0..d * n + j0 + TILE]);
    }
    tile
}

/// A weight block type's dot product: the block type of its activations
/// (ggml's `vec_dot_type`) and where an [`ActRow`] holds them. Giving a block
/// type a dot product is this impl, its kernels and its line in
/// [`memwall_format::block_types!`].
pub(crate) trait VecDot: Block {
    /// The activation block.
    type Act: Copy;
    /// Its [`VecDotType`].
    const KIND: VecDotType;
    /// The activations of `a`, if they are of kind [`VecDot::KIND`].
    fn acts(a: ActRow<'_>) -> Option<&[Self::Act]>;
}

/// `impl VecDot` for block types whose activations are the `$act` variant.
macro_rules! vec_dot {
    ($act:ident, $kind:ident: $($b:ident),*) => {$(
        impl VecDot for $b {
            type Act = $act;
            const KIND: VecDotType = VecDotType::$kind;
            #[inline]
            fn acts(a: ActRow<'_>) -> Option<&[$act]> {
                match a {
                    ActRow::$kind(a) => Some(a),
                    _ => None,
                }
            }
        }
    )*};
}

vec_dot!(BlockQ8_0, Q8_0: BlockQ4_0, BlockQ5_0, BlockQ8_0, BlockIq4Nl, BlockMxfp4, BlockNvfp4, BlockQ1_0, BlockQ2_0);
vec_dot!(BlockQ8_1, Q8_1: BlockQ4_1, BlockQ5_1);
vec_dot!(BlockQ8K, Q8K: BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockIq4Xs, BlockTq1_0, BlockTq2_0);
vec_dot!(BlockQ8K, Q8K: BlockIq2Xxs, BlockIq2Xs, BlockIq2S, BlockIq3Xxs, BlockIq3S, BlockIq1S, BlockIq1M);

/// The 32-weight blocks of the Q8_0 family, whose several-row products
/// transpose eight blocks' weights and gather their scales.
pub(crate) trait Scaled: Block {
    /// The block's scale.
    fn scale(&self) -> memwall_format::blocks::F16;
}

macro_rules! scaled {
    ($($b:ident),*) => {$(
        impl Scaled for $b {
            #[inline]
            fn scale(&self) -> memwall_format::blocks::F16 {
                self.d
            }
        }
    )*};
}

scaled!(BlockQ4_0, BlockQ5_0, BlockQ8_0, BlockIq4Nl);

/// `mod entry`: safe entry points `entry::q4_0 …` for the `#[target_feature]`
/// block dot products of the same names in the calling backend module (one
/// per line of [`memwall_format::block_types!`]), for [`block_table!`].
macro_rules! block_entries {
    ([$($t:ident => $b:ident as $f:ident,)*]) => {
        /// Safe entry points of the block dot products.
        mod entry {
            use super::*;
            $(
                pub(super) fn $f(
                    w: &[$b],
                    a: &[<$b as crate::kernels::VecDot>::Act],
                ) -> f32 {
                    // SAFETY: reachable only through this backend's tables,
                    // which `Kernels::new` hands out after probing the
                    // backend's CPU features.
                    unsafe { super::$f(w, a) }
                }
            )*
        }
    };
}
pub(crate) use block_entries;

/// The dot products of the lattice i-quants in the calling backend module,
/// each its `lattice` kernel for one block type, after the tokens given in
/// brackets (the backend's `#[target_feature]`, or a visibility).
macro_rules! lattice_kernels {
    ($prefix:tt) => {
        $crate::kernels::lattice_kernels!(@each $prefix
            iq2_xxs BlockIq2Xxs, iq2_xs BlockIq2Xs, iq2_s BlockIq2S, iq3_xxs BlockIq3Xxs,
            iq3_s BlockIq3S, iq1_s BlockIq1S, iq1_m BlockIq1M);
    };
    (@each $prefix:tt $($f:ident $b:ident),*) => {$(
        $crate::kernels::lattice_kernels!(@one $prefix $f $b);
    )*};
    (@one [$($prefix:tt)*] $f:ident $b:ident) => {
        $($prefix)* fn $f(w: &[$b], a: &[BlockQ8K]) -> f32 {
            lattice(w, a)
        }
    };
}
pub(crate) use lattice_kernels;

/// The form a weight type's activations take for its dot product
/// (ggml's `type_traits_cpu[ty].vec_dot_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VecDotType {
    /// `f32` as is (F32 weights).
    F32,
    /// Half precision, rounded to nearest even (F16 weights).
    F16,
    /// bfloat16, rounded to nearest even (BF16 weights).
    BF16,
    /// [`BlockQ8_0`] (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4, NVFP4, Q1_0, Q2_0).
    Q8_0,
    /// [`BlockQ8_1`] (Q4_1, Q5_1).
    Q8_1,
    /// [`BlockQ8K`] (Q2_K…Q6_K, IQ4_XS, TQ1_0, TQ2_0, the IQ1–IQ3 types).
    Q8K,
}

impl VecDotType {
    /// The vec_dot type of weight type `ty`, or `None` if memwall has no dot
    /// product for it (the types outside [`memwall_format::blocks::DEQUANTIZABLE`]).
    pub fn of(ty: GgmlType) -> Option<VecDotType> {
        Some(match ty {
            GgmlType::F32 => VecDotType::F32,
            GgmlType::F16 => VecDotType::F16,
            GgmlType::BF16 => VecDotType::BF16,
            _ => memwall_format::with_block!(ty, B => <B as VecDot>::KIND, _ => return None),
        })
    }

    /// Elements per block (1 for the float forms).
    pub fn block_size(self) -> usize {
        match self {
            VecDotType::F32 | VecDotType::F16 | VecDotType::BF16 => 1,
            VecDotType::Q8_0 | VecDotType::Q8_1 => QK8_0,
            VecDotType::Q8K => QK_K,
        }
    }
}

/// One row of activations in a vec_dot type, borrowed.
#[derive(Clone, Copy, Debug)]
pub enum ActRow<'a> {
    /// `f32` values.
    F32(&'a [f32]),
    /// f16 bits.
    F16(&'a [u16]),
    /// bf16 bits.
    BF16(&'a [u16]),
    /// Q8_0 blocks.
    Q8_0(&'a [BlockQ8_0]),
    /// Q8_1 blocks.
    Q8_1(&'a [BlockQ8_1]),
    /// Q8_K blocks.
    Q8K(&'a [BlockQ8K]),
}

impl ActRow<'_> {
    /// The vec_dot type of the row.
    pub fn kind(&self) -> VecDotType {
        match self {
            ActRow::F32(_) => VecDotType::F32,
            ActRow::F16(_) => VecDotType::F16,
            ActRow::BF16(_) => VecDotType::BF16,
            ActRow::Q8_0(_) => VecDotType::Q8_0,
            ActRow::Q8_1(_) => VecDotType::Q8_1,
            ActRow::Q8K(_) => VecDotType::Q8K,
        }
    }

    /// Number of values the row holds.
    pub fn len(&self) -> usize {
        match self {
            ActRow::F32(a) => a.len(),
            ActRow::F16(a) | ActRow::BF16(a) => a.len(),
            ActRow::Q8_0(a) => a.len() * QK8_0,
            ActRow::Q8_1(a) => a.len() * QK8_0,
            ActRow::Q8K(a) => a.len() * QK_K,
        }
    }

    /// Whether the row is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bytes starting at a 64-byte boundary (a `Vec<u8>` is aligned to 16 at
/// best), so that the regrouped activations' vector loads never straddle
/// two cache lines.
#[derive(Clone, Debug, Default)]
pub(crate) struct AlignedBytes {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl AlignedBytes {
    fn clear(&mut self) {
        self.len = 0;
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` zero bytes at a 64-byte boundary, to fill.
    fn zeroed(&mut self, len: usize) -> &mut [u8] {
        let out = self.reuse(len);
        out.fill(0);
        out
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }

    /// `len` bytes at a 64-byte boundary, to overwrite (the buffer grows
    /// once to the largest length asked and is kept).
    pub(crate) fn reuse(&mut self, len: usize) -> &mut [u8] {
        if self.buf.len() < len + 63 {
            self.buf.resize(len + 63, 0);
        }
        self.at = self.buf.as_ptr().align_offset(64).min(63);
        self.len = len;
        &mut self.buf[self.at..self.at + len]
    }
}

/// Activation rows quantized to one vec_dot type, stored contiguously; the
/// buffers are kept between calls of [`Activations::quantize`].
#[derive(Clone, Debug, Default)]
pub struct Activations {
    kind: Option<VecDotType>,
    cols: usize,
    rows: usize,
    /// Kind F32: the values. Kind F16 (x86-64, aarch64): `halves` widened back to
    /// `f32` (exact), for the several-row F16 products, from `f32s_at`.
    f32s: Vec<f32>,
    /// Where the widened values start in `f32s`: the first 64-byte boundary,
    /// so that rows of a multiple of 16 values keep every vector load within
    /// one cache line (split loads slowed the F16 tiles).
    f32s_at: usize,
    halves: Vec<u16>,
    q8_0: Vec<BlockQ8_0>,
    /// The scales of `q8_0` as `f32`, for the several-row products.
    q8_0_d: Vec<f32>,
    /// `q8_0` regrouped for the several-row products (batches only; see
    /// [`Q8_GROUP_BYTES`]).
    q8_0_groups: AlignedBytes,
    q8_1: Vec<BlockQ8_1>,
    q8k: Vec<BlockQ8K>,
    /// `q8k` regrouped for the AVX-512 several-row Q4_K product (batches
    /// on CPUs with AVX-512 only; see [`Q8K_GROUP_BYTES`]).
    q8k_groups: AlignedBytes,
    /// `q8k` in the tiled products' layout ([`tiled::ACT_BYTES`]; batches
    /// they take only).
    q8k_tiles: AlignedBytes,
}

impl Activations {
    /// An empty set of activations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `x` (`x.len() / cols` rows of `cols` values) to `kind`
    /// with `kernels`, replacing what was held, in the layouts `kernels`'
    /// several-row products read (the bytes of every block are the same on
    /// every backend). `cols` must be a multiple of the block size of `kind`
    /// and divide `x.len()`.
    pub fn quantize(
        &mut self,
        kernels: &Kernels,
        kind: VecDotType,
        x: &[f32],
        cols: usize,
    ) -> Result<(), KernelError> {
        self.quantize_on(None, kernels, kind, x, cols)
    }

    /// [`Activations::quantize`] with the blocks split over `pool`'s threads
    /// (each block is quantized on its own, so the bytes are the same).
    pub fn quantize_on(
        &mut self,
        pool: Option<&Pool>,
        kernels: &Kernels,
        kind: VecDotType,
        x: &[f32],
        cols: usize,
    ) -> Result<(), KernelError> {
        /// Blocks per task.
        const CHUNK: usize = 256;
        let bs = kind.block_size();
        if cols == 0 || cols % bs != 0 || x.len() % cols != 0 {
            return Err(KernelError::Shape(format!(
                "{} activations of {cols} columns in {kind:?} blocks of {bs}",
                x.len()
            )));
        }
        self.kind = Some(kind);
        self.cols = cols;
        self.rows = x.len() / cols;
        let nb = x.len() / bs;
        match kind {
            VecDotType::F32 => {
                self.f32s.clear();
                self.f32s.extend_from_slice(x);
                self.f32s_at = 0;
            }
            VecDotType::F16 => {
                // Value by value over the pool (every value is written: the
                // buffers are grown and sliced, not cleared).
                const VALUES: usize = 8192;
                let halves = grown(&mut self.halves, x.len(), 0);
                for_each_chunk(pool, halves, VALUES, |c, h| {
                    kernels.narrow_f16(&x[c * VALUES..][..h.len()], h);
                });
                // Only the x86 and aarch64 F16 row products read the widened
                // values.
                if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
                    self.f32s_at = aligned_at(&mut self.f32s, x.len());
                    let halves = &self.halves[..x.len()];
                    let wide = &mut self.f32s[self.f32s_at..][..x.len()];
                    for_each_chunk(pool, wide, VALUES, |c, f| {
                        kernels.widen_f16(&halves[c * VALUES..][..f.len()], f);
                    });
                } else {
                    self.f32s.clear();
                }
            }
            VecDotType::BF16 => {
                self.halves.clear();
                self.halves
                    .extend(x.iter().map(|&v| memwall_format::blocks::f32_to_bf16(v)));
            }
            VecDotType::Q8_0 => {
                let q8_0 = grown(&mut self.q8_0, nb, BlockQ8_0::default());
                for_each_chunk(pool, q8_0, CHUNK, |c, y| {
                    kernels.quantize_row_q8_0(&x[c * CHUNK * bs..][..y.len() * bs], y);
                });
                self.q8_0_d.clear();
                self.q8_0_d
                    .extend(self.q8_0[..nb].iter().map(|b| b.d.to_f32()));
                self.q8_0_groups.clear();
                // Only the x86 and aarch64 several-row kernels read the
                // regrouped rows.
                if self.rows > 1 && cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
                    let nbr = cols / QK8_0;
                    let record = nbr.div_ceil(8) * Q8_GROUP_BYTES;
                    let groups = self.q8_0_groups.zeroed(self.rows * record);
                    let (blocks, d) = (&self.q8_0[..nb], &self.q8_0_d);
                    // Eight tokens per task.
                    for_each_chunk(pool, groups, 8 * record, |c, g| {
                        for (i, g) in g.chunks_exact_mut(record).enumerate() {
                            let row = (8 * c + i) * nbr..(8 * c + i + 1) * nbr;
                            group_q8_0(&blocks[row.clone()], &d[row], g);
                        }
                    });
                }
            }
            VecDotType::Q8_1 => {
                let q8_1 = grown(&mut self.q8_1, nb, BlockQ8_1::default());
                for_each_chunk(pool, q8_1, CHUNK, |c, y| {
                    quantize_row_q8_1(&x[c * CHUNK * bs..][..y.len() * bs], y);
                });
            }
            VecDotType::Q8K => {
                let q8k = grown(&mut self.q8k, nb, BlockQ8K::default());
                for_each_chunk(pool, q8k, CHUNK / 8, |c, y| {
                    quantize_row_q8_k(&x[c * (CHUNK / 8) * bs..][..y.len() * bs], y);
                });
                self.q8k_groups.clear();
                // Only the AVX-512 several-row Q4_K product reads the regrouped
                // rows, and not in batches that the tiled products take.
                let tiled = kernels.table.rows.tiled.is_some() && self.rows >= TILED_MIN_TOKENS;
                self.q8k_tiles.clear();
                if tiled {
                    let nbr = cols / QK_K;
                    let group = nbr * tiled::ACT_BYTES;
                    let out = self
                        .q8k_tiles
                        .reuse(self.rows.div_ceil(tiled::TOKENS) * group);
                    let blocks = &self.q8k[..nb];
                    for_each_chunk(pool, out, group, |g, out| {
                        let rows = g * tiled::TOKENS..(self.rows).min((g + 1) * tiled::TOKENS);
                        tiled::pack_acts(&blocks[rows.start * nbr..rows.end * nbr], nbr, out);
                    });
                }
                if self.rows > 1 && kernels.table.rows.q8k_groups && !tiled {
                    let nbr = cols / QK_K;
                    let record = nbr.div_ceil(8) * Q8K_GROUP_BYTES;
                    let groups = self.q8k_groups.zeroed(self.rows * record);
                    let blocks = &self.q8k[..nb];
                    // Four tokens per task.
                    for_each_chunk(pool, groups, 4 * record, |c, g| {
                        for (i, g) in g.chunks_exact_mut(record).enumerate() {
                            let row = (4 * c + i) * nbr..(4 * c + i + 1) * nbr;
                            group_q8_k(&blocks[row], g);
                        }
                    });
                }
            }
        }
        Ok(())
    }

    /// The f16 values held, widened to `f32` (kind F16 on x86-64 and
    /// aarch64; empty otherwise).
    pub(crate) fn widened(&self) -> &[f32] {
        if self.kind == Some(VecDotType::F16) && !self.f32s.is_empty() {
            &self.f32s[self.f32s_at..][..self.rows * self.cols]
        } else {
            &[]
        }
    }

    /// The vec_dot type held (`None` before the first [`Activations::quantize`]).
    pub fn kind(&self) -> Option<VecDotType> {
        self.kind
    }

    /// Number of rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `t` (panics if `t >= self.rows()`).
    pub fn row(&self, t: usize) -> ActRow<'_> {
        assert!(t < self.rows, "activation row {t} of {}", self.rows);
        let (c, bs) = (self.cols, self.kind.map_or(1, VecDotType::block_size));
        let (a, b) = (t * c / bs, (t + 1) * c / bs);
        match self.kind {
            Some(VecDotType::F32) | None => ActRow::F32(&self.f32s[t * c..(t + 1) * c]),
            Some(VecDotType::F16) => ActRow::F16(&self.halves[a..b]),
            Some(VecDotType::BF16) => ActRow::BF16(&self.halves[a..b]),
            Some(VecDotType::Q8_0) => ActRow::Q8_0(&self.q8_0[a..b]),
            Some(VecDotType::Q8_1) => ActRow::Q8_1(&self.q8_1[a..b]),
            Some(VecDotType::Q8K) => ActRow::Q8K(&self.q8k[a..b]),
        }
    }
}

/// [`Kernels::dot_rows`] through a K-quant several-row product `f`.
fn rows_k<B: Block>(
    f: RowsK<B>,
    w: &QMatrix<'_>,
    rows: std::ops::Range<usize>,
    acts: &Activations,
    tokens: std::ops::Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    let nb = acts.cols / QK_K;
    let record = nb.div_ceil(8) * Q8K_GROUP_BYTES;
    let per_call = rows_k_tokens(B::TYPE, tokens.len());
    for t0 in tokens.clone().step_by(per_call) {
        let t1 = (t0 + per_call).min(tokens.end);
        let groups = if acts.q8k_groups.is_empty() {
            &[][..]
        } else {
            &acts.q8k_groups.bytes()[t0 * record..t1 * record]
        };
        let a = Q8KRows {
            blocks: &acts.q8k[t0 * nb..t1 * nb],
            groups,
        };
        let first = t0 - tokens.start;
        for (i, r) in rows.clone().enumerate() {
            let out = &mut out[i * stride + first..i * stride + first + (t1 - t0)];
            f(as_blocks(w.row(r)), a, out);
        }
    }
}

/// Activation rows [`rows_k`] passes to a several-row product of `ty` at a
/// time, of a tile of `tile`. The ternary types: four, against all the rows,
/// then the next four, so that those rows' activations (292 bytes a
/// super-block against 54 or 66 of weights) stay in L1 while the weight rows
/// stream. Q4_K and Q6_K: the whole tile (AVX-512's Q4_K regroups it, and
/// is slower four rows at a time; docs/BENCHMARKS.md, 2026-12-02).
fn rows_k_tokens(ty: GgmlType, tile: usize) -> usize {
    match ty {
        GgmlType::TQ1_0 | GgmlType::TQ2_0 => 8,
        _ => tile.max(1),
    }
}

/// [`Kernels::dot_rows`] through a several-row product `f` of the Q8_0
/// family over the regrouped activations.
fn rows_q8<B: Block>(
    f: RowsQ8<B>,
    w: &QMatrix<'_>,
    rows: std::ops::Range<usize>,
    acts: &Activations,
    tokens: std::ops::Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    let nb = acts.cols / QK8_0;
    let record = nb.div_ceil(8) * Q8_GROUP_BYTES;
    let a = Q8Rows {
        groups: &acts.q8_0_groups.bytes()[tokens.start * record..tokens.end * record],
        tokens: tokens.len(),
    };
    let w = as_blocks(w.row_span(rows.start, rows.len()));
    f(w, rows.len(), a, out, stride);
}

/// Why a kernel call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// `MEMWALL_KERNELS` (or a parsed name) names no backend.
    #[error("unknown kernel backend {0:?} (expected scalar, avx2, avx512, neon or neon-dot)")]
    UnknownBackend(String),
    /// The backend exists but this CPU cannot run it.
    #[error("kernel backend {0} is not supported by this CPU")]
    UnsupportedBackend(&'static str),
    /// memwall has no dot product for this weight type.
    #[error("no dot product for weight type {0}")]
    UnsupportedType(GgmlType),
    /// Activations in the wrong vec_dot type for the weights.
    #[error("{ty} weights take {want:?} activations, not {got:?}")]
    ActivationType {
        /// The weight type.
        ty: GgmlType,
        /// Its vec_dot type.
        want: VecDotType,
        /// What was passed.
        got: VecDotType,
    },
    /// Lengths or shapes that do not fit together.
    #[error("shape mismatch: {0}")]
    Shape(String),
}

/// A family of kernel implementations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Portable Rust: the specification.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// x86-64 with AVX-512 F/BW/VL/VNNI on top of [`Backend::Avx2`]'s features.
    Avx512,
    /// aarch64 Advanced SIMD.
    Neon,
    /// aarch64 Advanced SIMD with the dot-product instructions (`sdot`).
    NeonDot,
}

impl Backend {
    /// Every backend, slowest first.
    pub const ALL: [Backend; 5] = [
        Backend::Scalar,
        Backend::Avx2,
        Backend::Avx512,
        Backend::Neon,
        Backend::NeonDot,
    ];

    /// The name `MEMWALL_KERNELS` takes.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Scalar => "scalar",
            Backend::Avx2 => "avx2",
            Backend::Avx512 => "avx512",
            Backend::Neon => "neon",
            Backend::NeonDot => "neon-dot",
        }
    }

    /// The backend called `name` (see [`Backend::name`]).
    pub fn parse(name: &str) -> Result<Backend, KernelError> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == name.trim().to_ascii_lowercase())
            .ok_or_else(|| KernelError::UnknownBackend(name.to_string()))
    }

    /// Whether this CPU can run the backend.
    pub fn is_supported(self) -> bool {
        match self {
            Backend::Scalar => true,
            Backend::Avx2 => arch::has_avx2(),
            Backend::Avx512 => arch::has_avx512(),
            Backend::Neon => arch::has_neon(),
            Backend::NeonDot => arch::has_neon_dot(),
        }
    }

    /// Backends this CPU can run, slowest first.
    pub fn supported() -> Vec<Backend> {
        Backend::ALL
            .into_iter()
            .filter(|b| b.is_supported())
            .collect()
    }
}

/// Signature of the weight-row × activation-row dot products.
type Dot<A> = fn(&[u8], &[A]) -> f32;

/// Signature of a block type's dot product: a weight row's blocks against
/// its activation blocks.
pub(crate) type BlockDot<B> = fn(&[B], &[<B as VecDot>::Act]) -> f32;

/// Bytes per group of eight Q8_0 blocks of one activation row in the
/// regrouped layout of the several-row products: in 32-byte register `k`
/// (`k < 8`), bytes `4l..4l + 4` are quants `4k..4k + 4` of block `l`; then
/// the eight blocks' quant sums (`i32`) and scales (`f32`), little-endian. A
/// row's last group is padded with zero blocks. One 32-bit lane then holds
/// one block, so a SIMD product of eight weight blocks (transposed the same
/// way) sums each block in its own lane with no horizontal additions (AVX-512
/// VNNI: one 256-bit register per `k`; NEON `sdot`: its two 128-bit halves,
/// blocks 0–3 and 4–7).
pub(crate) const Q8_GROUP_BYTES: usize = 320;

/// Regroups one activation row (`blocks`, their scales `d`) into `out`
/// (`blocks.len().div_ceil(8)` groups of [`Q8_GROUP_BYTES`]).
fn group_q8_0(blocks: &[BlockQ8_0], d: &[f32], out: &mut [u8]) {
    for ((g, bs), ds) in out
        .chunks_exact_mut(Q8_GROUP_BYTES)
        .zip(blocks.chunks(8))
        .zip(d.chunks(8))
    {
        g.fill(0);
        for (l, (b, &d)) in bs.iter().zip(ds).enumerate() {
            for (k, q) in b.qs.chunks_exact(4).enumerate() {
                for (o, &q) in g[32 * k + 4 * l..][..4].iter_mut().zip(q) {
                    *o = q as u8;
                }
            }
            let sum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
            g[256 + 4 * l..][..4].copy_from_slice(&sum.to_le_bytes());
            g[288 + 4 * l..][..4].copy_from_slice(&d.to_le_bytes());
        }
    }
}

/// Bytes per group of eight Q8_K blocks of one activation row in the
/// regrouped layout of the AVX-512 several-row Q4_K product: 64 registers of
/// 32 bytes, register `k` holding quants `4k..4k + 4` of block `l` in bytes
/// `4l..4l + 4`; then four registers whose lane `l` holds block `l`'s sums of
/// quants `64i..64i + 32` and `64i + 32..64i + 64` (`i16` each, for the eight
/// sub-block minimums); then the eight scales (`f32`). Little-endian; a row's last group is
/// padded with zero blocks. As in [`Q8_GROUP_BYTES`], a 32-bit lane holds one
/// block, so the integer sums of eight super-blocks come out in eight lanes and
/// their float terms in the canonical order (block `b` to partial `b % 8`)
/// need no horizontal additions.
pub(crate) const Q8K_GROUP_BYTES: usize = 2208;

/// Regroups one Q8_K activation row into `out` (`blocks.len().div_ceil(8)`
/// groups of [`Q8K_GROUP_BYTES`]).
fn group_q8_k(blocks: &[BlockQ8K], out: &mut [u8]) {
    for (g, bs) in out.chunks_exact_mut(Q8K_GROUP_BYTES).zip(blocks.chunks(8)) {
        g.fill(0);
        for (l, b) in bs.iter().enumerate() {
            for (k, q) in b.qs.chunks_exact(4).enumerate() {
                for (o, &q) in g[32 * k + 4 * l..][..4].iter_mut().zip(q) {
                    *o = q as u8;
                }
            }
            let put = |g: &mut [u8], at: usize, pair: [i16; 2]| {
                g[at..at + 2].copy_from_slice(&pair[0].to_le_bytes());
                g[at + 2..at + 4].copy_from_slice(&pair[1].to_le_bytes());
            };
            // Sums of 32 quants of at most 128 in magnitude fit an i16.
            for (i, s) in b.bsums.chunks_exact(4).enumerate() {
                put(g, 2048 + 32 * i + 4 * l, [s[0] + s[1], s[2] + s[3]]);
            }
            g[2176 + 4 * l..][..4].copy_from_slice(&b.d.to_le_bytes());
        }
    }
}

/// Consecutive Q8_K activation rows for a several-row product: `blocks` (a
/// multiple of the weight row's block count) and `groups`, the same rows
/// regrouped (see [`Q8K_GROUP_BYTES`]; empty unless the CPU has AVX-512).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Q8KRows<'a> {
    pub(crate) blocks: &'a [BlockQ8K],
    pub(crate) groups: &'a [u8],
}

/// Consecutive Q8_0 activation rows for a several-row product, regrouped
/// (see [`Q8_GROUP_BYTES`]).
#[derive(Clone, Copy)]
pub(crate) struct Q8Rows<'a> {
    pub(crate) groups: &'a [u8],
    /// The number of activation rows.
    pub(crate) tokens: usize,
}

/// Weight rows against several consecutive Q8_0 activation rows at once:
/// `(w, rows, a, out, stride)` with `w` holding `rows` whole weight rows and
/// `a` `a.tokens` activation rows. `out[r·stride + t]` gets the bits of the
/// single dot product of weight row `r` with activation row `t`: the rows
/// share the weights' unpacking and the activations' loads, not their
/// arithmetic.
pub(crate) type RowsQ8<B> = fn(&[B], usize, Q8Rows<'_>, &mut [f32], usize);

/// F16 weight rows against several consecutive activation rows widened from
/// f16 to `f32` ([`attn::widen_f16`], exact): `(w, cols, a, out, stride)`
/// with `w` holding whole rows of `cols` weights and `a` whole rows of `cols`
/// floats; `out[r·stride + t]` gets the bits of the single product of weight
/// row `r` and activation row `t` (matmul widens a tile of tokens once for
/// all the rows of a task). `cols` is not 0.
pub(crate) type RowsF16F32 = fn(&[u8], usize, &[f32], &mut [f32], usize);

/// F16 weight rows against one token's f16 activations (its
/// [`ActRow::F16`]), both converted in the loop: `(w, cols, a, out)` with
/// `w` holding `out.len()` whole rows of `cols` weights; `out[r]` gets the
/// bits of [`RowsF16F32`] over the widened activations. For decoding on
/// CPUs whose conversions run beside the multiply-adds: a wide row's
/// activations then take half the bytes in L1.
pub(crate) type RowF16F16 = fn(&[u8], usize, &[u16], &mut [f32]);

/// [`RowsF16F32`] with the weight rows already widened to `f32` (each value
/// exactly an f16, [`attn::widen_f16_le`]): `(w, cols, a, out, stride)` with
/// `w` holding whole rows of `cols` floats; the same bits. Matmul widens a
/// task's rows once when more than one tile of tokens reads them.
pub(crate) type RowsWideF16 = fn(&[f32], usize, &[f32], &mut [f32], usize);

/// One K-quant weight row against several consecutive Q8_K activation rows:
/// `(w, a, out)` with `a` holding `out.len()` rows of `w`'s block count.
pub(crate) type RowsK<B> = fn(&[B], Q8KRows<'_>, &mut [f32]);

/// K-quant weight rows against one Q8_K activation row (a decoded token):
/// `(w, a, out)` with `w` holding `out.len()` whole rows of `a.len()`
/// blocks; `out[r]` gets the bits of the single product of row `r` with `a`.
pub(crate) type ColumnK<B> = fn(&[B], &[BlockQ8K], &mut [f32]);

/// Weight panels against tokens ([`tiled`]): `(layout, nb, panels, acts,
/// out, stride)` with `panels` whole panels of `nb` records and `acts` whole
/// groups of [`tiled::TOKENS`] tokens in the tiled layout; `out[t·stride + r]`
/// gets the bits of the single product of token `t` and row `r` (sixteen to
/// a panel, in order).
pub(crate) type TiledFn = fn(tiled::Layout, usize, &[u8], &[u8], &mut [f32], usize);

/// A backend's tiled product and the types it takes: those whose values
/// have magnitudes of at most `max_value` ([`tiled::Layout::max_value`]).
#[derive(Clone, Copy)]
pub(crate) struct TiledProduct {
    pub(crate) product: TiledFn,
    pub(crate) max_value: u8,
}

/// The one-token products of several rows a backend has, by weight type
/// (`None`: one dot product per row).
#[derive(Clone, Copy)]
pub(crate) struct ColumnsTable {
    pub(crate) q4_k: Option<ColumnK<BlockQ4K>>,
    pub(crate) q5_k: Option<ColumnK<BlockQ5K>>,
    pub(crate) q6_k: Option<ColumnK<BlockQ6K>>,
    pub(crate) tq1_0: Option<ColumnK<BlockTq1_0>>,
    pub(crate) tq2_0: Option<ColumnK<BlockTq2_0>>,
    pub(crate) iq2_xxs: Option<ColumnK<BlockIq2Xxs>>,
    pub(crate) iq2_xs: Option<ColumnK<BlockIq2Xs>>,
    pub(crate) iq2_s: Option<ColumnK<BlockIq2S>>,
    pub(crate) iq3_xxs: Option<ColumnK<BlockIq3Xxs>>,
    pub(crate) iq3_s: Option<ColumnK<BlockIq3S>>,
    pub(crate) iq1_s: Option<ColumnK<BlockIq1S>>,
    pub(crate) iq1_m: Option<ColumnK<BlockIq1M>>,
}

impl ColumnsTable {
    /// No one-token products of several rows.
    pub(crate) const NONE: ColumnsTable = ColumnsTable {
        q4_k: None,
        q5_k: None,
        q6_k: None,
        tq1_0: None,
        tq2_0: None,
        iq2_xxs: None,
        iq2_xs: None,
        iq2_s: None,
        iq3_xxs: None,
        iq3_s: None,
        iq1_s: None,
        iq1_m: None,
    };
}

/// The several-row products a backend has (`None`: one dot product per row).
#[derive(Clone, Copy)]
pub(crate) struct RowsTable {
    pub(crate) f16_f32: Option<RowsF16F32>,
    pub(crate) f16_f16: Option<RowF16F16>,
    pub(crate) f16_wide: Option<RowsWideF16>,
    pub(crate) q4_k: Option<RowsK<BlockQ4K>>,
    pub(crate) q6_k: Option<RowsK<BlockQ6K>>,
    pub(crate) tq1_0: Option<RowsK<BlockTq1_0>>,
    pub(crate) tq2_0: Option<RowsK<BlockTq2_0>>,
    pub(crate) iq2_xxs: Option<RowsK<BlockIq2Xxs>>,
    pub(crate) iq2_xs: Option<RowsK<BlockIq2Xs>>,
    pub(crate) iq2_s: Option<RowsK<BlockIq2S>>,
    pub(crate) iq3_xxs: Option<RowsK<BlockIq3Xxs>>,
    pub(crate) iq3_s: Option<RowsK<BlockIq3S>>,
    pub(crate) iq1_s: Option<RowsK<BlockIq1S>>,
    pub(crate) iq1_m: Option<RowsK<BlockIq1M>>,
    pub(crate) q4_0: Option<RowsQ8<BlockQ4_0>>,
    pub(crate) q5_0: Option<RowsQ8<BlockQ5_0>>,
    pub(crate) q8_0: Option<RowsQ8<BlockQ8_0>>,
    pub(crate) iq4_nl: Option<RowsQ8<BlockIq4Nl>>,
    /// One token's products of several rows at once.
    pub(crate) columns: ColumnsTable,
    /// The tiled product of the types [`tiled::layout`] knows.
    pub(crate) tiled: Option<TiledProduct>,
    /// Whether `q4_k` reads the regrouped Q8_K activations
    /// ([`Q8K_GROUP_BYTES`]), which batches then build.
    pub(crate) q8k_groups: bool,
}

impl RowsTable {
    /// No several-row products.
    pub(crate) const NONE: RowsTable = RowsTable {
        f16_f32: None,
        f16_f16: None,
        f16_wide: None,
        q4_k: None,
        q6_k: None,
        tq1_0: None,
        tq2_0: None,
        iq2_xxs: None,
        iq2_xs: None,
        iq2_s: None,
        iq3_xxs: None,
        iq3_s: None,
        iq1_s: None,
        iq1_m: None,
        q4_0: None,
        q5_0: None,
        q8_0: None,
        iq4_nl: None,
        columns: ColumnsTable::NONE,
        tiled: None,
        q8k_groups: false,
    };
}

/// `pub(crate) struct DotTable` with a field per block type of
/// [`memwall_format::block_types!`].
macro_rules! dot_table {
    ([$($t:ident => $b:ident as $f:ident,)*]) => {
        /// The dot products of one backend: one function per weight type plus
        /// the float helpers of attention, the several-row products and the
        /// float loops. Backends start from another table and replace what
        /// they implement.
        #[derive(Clone, Copy)]
        pub(crate) struct DotTable {
            pub(crate) f32: Dot<f32>,
            pub(crate) f16: Dot<u16>,
            pub(crate) bf16: Dot<u16>,
            $(pub(crate) $f: BlockDot<$b>,)*
            pub(crate) dot_f32: fn(&[f32], &[f32]) -> f32,
            pub(crate) dot_f16_f32: fn(&[u16], &[f32]) -> f32,
            pub(crate) dot_f16_f16: fn(&[u16], &[u16]) -> f32,
            pub(crate) rows: RowsTable,
            pub(crate) ops: OpsTable,
        }

        /// [`Kernels::dot_grid`] of a block type.
        fn dot_blocks_grid<'a>(
            t: &DotTable,
            ty: GgmlType,
            w: &[u8],
            rows: usize,
            tokens: std::ops::Range<usize>,
            act: impl Fn(usize) -> ActRow<'a>,
            out: GridOut<'_>,
        ) -> Option<()> {
            match ty {
                $(GgmlType::$t => grid(
                    t.$f,
                    as_blocks::<$b>(w),
                    rows,
                    tokens,
                    |k| <$b as VecDot>::acts(act(k)),
                    out,
                ),)*
                _ => None,
            }
        }
    };
}
memwall_format::block_types!([dot_table]);

/// Where a grid of products goes: weight row `i` with token `j` to
/// `out[i·stride + j]`.
pub(crate) struct GridOut<'o> {
    /// The values.
    pub(crate) out: &'o mut [f32],
    /// Distance between weight rows.
    pub(crate) stride: usize,
}

/// `dot(row i of w, act(tokens.start + j))` for the `rows` equal rows of `w`
/// into `dst`; `None` if an activation row is not of the kind `dot` takes.
#[inline]
fn grid<'a, W, A: 'a>(
    dot: fn(&[W], &[A]) -> f32,
    w: &[W],
    rows: usize,
    tokens: std::ops::Range<usize>,
    act: impl Fn(usize) -> Option<&'a [A]>,
    dst: GridOut<'_>,
) -> Option<()> {
    /// Tokens whose activation rows are looked up once for all the weight
    /// rows (the matrix products pass tiles of at most this many).
    const LOOKED_UP: usize = 16;
    let per_row = (w.len() / rows.max(1)).max(1);
    for t0 in tokens.clone().step_by(LOOKED_UP) {
        let mut acts: [&[A]; LOOKED_UP] = [&[]; LOOKED_UP];
        let n = (tokens.end - t0).min(LOOKED_UP);
        for (a, k) in acts.iter_mut().zip(t0..t0 + n) {
            *a = act(k)?;
        }
        let j0 = t0 - tokens.start;
        for (i, row) in w.chunks_exact(per_row).take(rows).enumerate() {
            for (j, a) in acts[..n].iter().enumerate() {
                dst.out[i * dst.stride + j0 + j] = dot(row, a);
            }
        }
    }
    Some(())
}

/// A backend's `DotTable` from the block dot products of module `$m`
/// (`$m::q4_0` …, named as in [`memwall_format::block_types!`]) and the
/// other fields given.
macro_rules! block_table {
    ($m:ident { $($field:ident: $value:expr,)* } [$($t:ident => $b:ident as $f:ident,)*]) => {
        DotTable {
            $($f: $m::$f,)*
            $($field: $value,)*
        }
    };
}
pub(crate) use block_table;

/// `(q, hd, kt, stride, out)` of [`Kernels::key_tiles`].
pub(crate) type KeyTiles = fn(&[f32], usize, &[f32], usize, &mut [[f32; attn::KEY_TILE]]);

/// The float loops of one backend besides its dot products: attention's
/// batch loops, the f16 conversions, `exp`, the Q8_0 activation quantizer and
/// tile transposes. Every entry gives the bits of the scalar one
/// ([`scalar::OPS`]); the backends differ only in speed.
#[derive(Clone, Copy)]
pub(crate) struct OpsTable {
    /// [`Kernels::key_tiles`] for `out.len() ≤ attn::HEADS` heads.
    pub(crate) key_tiles: KeyTiles,
    /// The tiles of [`Kernels::product_f32`]: [`Kernels::key_tiles`]' shape
    /// for `out.len() ≤ attn::PRODUCT_ROWS` rows, with a fused multiply-add
    /// per step.
    pub(crate) product_tiles: KeyTiles,
    /// [`Kernels::weighted_rows`]: the accumulation over scores already
    /// divided by their sums: `(out, probs, v, heads)`.
    pub(crate) weighted_rows: fn(&mut [f32], &[f32], &[f32], usize),
    /// [`Kernels::axpy`].
    pub(crate) axpy: fn(&mut [f32], f32, &[f32]),
    /// [`Kernels::widen_f16`] (lengths checked by the caller).
    pub(crate) widen_f16: fn(&[u16], &mut [f32]),
    /// [`Kernels::widen_f16_le`] (lengths checked by the caller).
    pub(crate) widen_f16_le: fn(&[u8], &mut [f32]),
    /// [`Kernels::narrow_f16`] (lengths checked by the caller).
    pub(crate) narrow_f16: fn(&[f32], &mut [u16]),
    /// [`Kernels::exp_fast_in_place`].
    pub(crate) exp_fast: fn(&mut [f32]),
    /// [`quantize_row_q8_0`] (lengths checked by the caller).
    pub(crate) quantize_q8_0: fn(&[f32], &mut [BlockQ8_0]),
    /// [`Kernels::transpose`] (lengths checked by the caller).
    pub(crate) transpose: fn(&[f32], usize, usize, usize, &mut [f32]),
}

/// The kernels of one backend, ready to call. Cheap to copy.
#[derive(Clone, Copy)]
pub struct Kernels {
    backend: Backend,
    table: &'static DotTable,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("backend", &self.backend)
            .finish()
    }
}

impl Kernels {
    /// The kernels of `backend`, refused if this CPU cannot run them.
    pub fn new(backend: Backend) -> Result<Kernels, KernelError> {
        if !backend.is_supported() {
            return Err(KernelError::UnsupportedBackend(backend.name()));
        }
        let table = match backend {
            Backend::Scalar => &scalar::TABLE,
            _ => arch::table(backend).ok_or(KernelError::UnsupportedBackend(backend.name()))?,
        };
        Ok(Kernels { backend, table })
    }

    /// The fastest backend this CPU runs (probed once).
    pub fn detect() -> Kernels {
        static BEST: OnceLock<Kernels> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = Backend::supported()
                .into_iter()
                .next_back()
                .unwrap_or(Backend::Scalar);
            Kernels::new(best).unwrap_or(Kernels {
                backend: Backend::Scalar,
                table: &scalar::TABLE,
            })
        })
    }

    /// The backend named by `MEMWALL_KERNELS` if set (refused if unknown or
    /// unsupported), else [`Kernels::detect`]. Read once per process.
    pub fn from_env() -> Result<Kernels, KernelError> {
        static FROM_ENV: OnceLock<Result<Kernels, KernelError>> = OnceLock::new();
        FROM_ENV
            .get_or_init(|| match std::env::var("MEMWALL_KERNELS") {
                Ok(name) if !name.trim().is_empty() => Kernels::new(Backend::parse(&name)?),
                _ => Ok(Kernels::detect()),
            })
            .clone()
    }

    /// The backend these kernels belong to.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Dot product of one weight row of type `ty` (`w`: its bytes as stored)
    /// with one activation row in `ty`'s vec_dot type.
    pub fn vec_dot(&self, ty: GgmlType, w: &[u8], a: ActRow<'_>) -> Result<f32, KernelError> {
        let want = VecDotType::of(ty).ok_or(KernelError::UnsupportedType(ty))?;
        if a.kind() != want {
            return Err(KernelError::ActivationType {
                ty,
                want,
                got: a.kind(),
            });
        }
        let n = a.len();
        if n % ty.block_size() as usize != 0
            || w.len() != n / ty.block_size() as usize * ty.type_size() as usize
        {
            return Err(KernelError::Shape(format!(
                "{} bytes of {ty} against {n} activations",
                w.len()
            )));
        }
        let mut out = [0f32];
        self.dot_grid(
            ty,
            w,
            1,
            0..1,
            |_| a,
            GridOut {
                out: &mut out,
                stride: 1,
            },
        );
        Ok(out[0])
    }

    /// `dst.out[i·dst.stride + j]` = the dot product of weight row `i` of `w`
    /// (the bytes of `rows` rows of `ty`) with activation row
    /// `act(tokens.start + j)`, through the backend's one-row kernel of `ty`
    /// (the type is looked up once for all the pairs). Panics (never
    /// misbehaves) if the type, activation kind or lengths do not fit.
    pub(crate) fn dot_grid<'a>(
        &self,
        ty: GgmlType,
        w: &[u8],
        rows: usize,
        tokens: std::ops::Range<usize>,
        act: impl Fn(usize) -> ActRow<'a> + Copy,
        dst: GridOut<'_>,
    ) {
        let t = self.table;
        let tk = tokens.clone();
        let done = match ty {
            GgmlType::F32 => grid(
                t.f32,
                w,
                rows,
                tk,
                |k| match act(k) {
                    ActRow::F32(a) => Some(a),
                    _ => None,
                },
                dst,
            ),
            GgmlType::F16 => grid(
                t.f16,
                w,
                rows,
                tk,
                |k| match act(k) {
                    ActRow::F16(a) => Some(a),
                    _ => None,
                },
                dst,
            ),
            GgmlType::BF16 => grid(
                t.bf16,
                w,
                rows,
                tk,
                |k| match act(k) {
                    ActRow::BF16(a) => Some(a),
                    _ => None,
                },
                dst,
            ),
            _ => dot_blocks_grid(t, ty, w, rows, tk, act, dst),
        };
        done.unwrap_or_else(|| {
            let kind = act(tokens.start).kind();
            panic!("no dot product of {ty} with {kind:?} activations")
        })
    }

    /// `out[i]` = the dot product of weight row `i` of `w` (the bytes of
    /// `out.len()` rows of `ty`) with the activation row `a`, through the
    /// backend's one-token product of several rows ([`ColumnK`]); `false`
    /// (nothing written) where it has none for `ty` and `a`'s kind. Panics
    /// (never misbehaves) if the lengths do not fit.
    pub(crate) fn dot_column(
        &self,
        ty: GgmlType,
        w: &[u8],
        a: ActRow<'_>,
        out: &mut [f32],
    ) -> bool {
        fn call<B: Block>(
            f: Option<ColumnK<B>>,
            w: &[u8],
            a: &[BlockQ8K],
            out: &mut [f32],
        ) -> bool {
            f.map(|f| f(as_blocks(w), a, out)).is_some()
        }
        let c = &self.table.rows.columns;
        let ActRow::Q8K(a) = a else {
            return false;
        };
        match ty {
            GgmlType::Q4_K => call(c.q4_k, w, a, out),
            GgmlType::Q5_K => call(c.q5_k, w, a, out),
            GgmlType::Q6_K => call(c.q6_k, w, a, out),
            GgmlType::TQ1_0 => call(c.tq1_0, w, a, out),
            GgmlType::TQ2_0 => call(c.tq2_0, w, a, out),
            GgmlType::IQ2_XXS => call(c.iq2_xxs, w, a, out),
            GgmlType::IQ2_XS => call(c.iq2_xs, w, a, out),
            GgmlType::IQ2_S => call(c.iq2_s, w, a, out),
            GgmlType::IQ3_XXS => call(c.iq3_xxs, w, a, out),
            GgmlType::IQ3_S => call(c.iq3_s, w, a, out),
            GgmlType::IQ1_S => call(c.iq1_s, w, a, out),
            GgmlType::IQ1_M => call(c.iq1_m, w, a, out),
            _ => false,
        }
    }

    /// The backend's F16 several-row product over activations widened to
    /// `f32` (see [`RowsF16F32`]).
    pub(crate) fn f16_rows_f32(&self) -> Option<RowsF16F32> {
        self.table.rows.f16_f32
    }

    /// The backend's [`RowF16F16`], if it has one.
    pub(crate) fn f16_row_f16(&self) -> Option<RowF16F16> {
        self.table.rows.f16_f16
    }

    /// The backend's tiled product for `ty`, with the type's panel layout.
    pub(crate) fn tiled(&self, ty: GgmlType) -> Option<(TiledFn, tiled::Layout)> {
        let entry = self.table.rows.tiled?;
        let layout = tiled::layout(ty)?;
        (layout.max_value <= entry.max_value).then_some((entry.product, layout))
    }

    /// The backend's F16 several-row product over weights and activations
    /// both widened to `f32` (see [`RowsWideF16`]).
    pub(crate) fn f16_wide_rows(&self) -> Option<RowsWideF16> {
        self.table.rows.f16_wide
    }

    /// `out[i·stride + j]` = the dot product of weight row `rows.start + i`
    /// of `w` with activation row `tokens.start + j` of `acts`: the same bits
    /// as [`Kernels::vec_dot`] one by one, through the backend's
    /// several-row product where it has one. Panics (never misbehaves) if the
    /// type, activation kind or lengths do not fit.
    pub(crate) fn dot_rows(
        &self,
        w: &QMatrix<'_>,
        rows: std::ops::Range<usize>,
        acts: &Activations,
        tokens: std::ops::Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        use GgmlType as T;
        use VecDotType as V;
        let r = &self.table.rows;
        // (A single row of Q8_0 activations is not regrouped.)
        let grouped = !acts.q8_0_groups.is_empty();
        // A several-row product of Q8_K activations, if the backend has one.
        macro_rules! k {
            ($field:ident) => {
                r.$field
                    .map(|f| rows_k(f, w, rows.clone(), acts, tokens.clone(), out, stride))
            };
        }
        let done = match (w.ty(), acts.kind) {
            (T::Q4_K, Some(V::Q8K)) => r
                .q4_k
                .map(|f| rows_k(f, w, rows.clone(), acts, tokens.clone(), out, stride)),
            (T::Q6_K, Some(V::Q8K)) => r
                .q6_k
                .map(|f| rows_k(f, w, rows.clone(), acts, tokens.clone(), out, stride)),
            (T::TQ1_0, Some(V::Q8K)) => r
                .tq1_0
                .map(|f| rows_k(f, w, rows.clone(), acts, tokens.clone(), out, stride)),
            (T::TQ2_0, Some(V::Q8K)) => r
                .tq2_0
                .map(|f| rows_k(f, w, rows.clone(), acts, tokens.clone(), out, stride)),
            (T::IQ2_XXS, Some(V::Q8K)) => k!(iq2_xxs),
            (T::IQ2_XS, Some(V::Q8K)) => k!(iq2_xs),
            (T::IQ2_S, Some(V::Q8K)) => k!(iq2_s),
            (T::IQ3_XXS, Some(V::Q8K)) => k!(iq3_xxs),
            (T::IQ3_S, Some(V::Q8K)) => k!(iq3_s),
            (T::IQ1_S, Some(V::Q8K)) => k!(iq1_s),
            (T::IQ1_M, Some(V::Q8K)) => k!(iq1_m),
            (T::Q4_0, Some(V::Q8_0)) if grouped => r
                .q4_0
                .map(|f| rows_q8(f, w, rows.clone(), acts, tokens.clone(), out, stride)),
            (T::Q5_0, Some(V::Q8_0)) if grouped => r
                .q5_0
                .map(|f| rows_q8(f, w, rows.clone(), acts, tokens.clone(), out, stride)),
            (T::Q8_0, Some(V::Q8_0)) if grouped => r
                .q8_0
                .map(|f| rows_q8(f, w, rows.clone(), acts, tokens.clone(), out, stride)),
            (T::IQ4_NL, Some(V::Q8_0)) if grouped => r
                .iq4_nl
                .map(|f| rows_q8(f, w, rows.clone(), acts, tokens.clone(), out, stride)),
            _ => None,
        };
        if done.is_none() {
            let span = w.row_span(rows.start, rows.len());
            let dst = GridOut { out, stride };
            self.dot_grid(w.ty(), span, rows.len(), tokens, |t| acts.row(t), dst);
        }
    }

    /// `Σ a[i]·b[i]` in `f32` (attention scores over an `f32` cache). Panics
    /// if the lengths differ.
    pub fn dot_f32(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot_f32 lengths");
        (self.table.dot_f32)(a, b)
    }

    /// `out[i·n + j] = Σ_d a[i·k + d] · b[d·n + j]`: the product of `a`
    /// (`m × k`) and `b` (`k × n`), both row-major, for the columns `cols` of
    /// `out` (`m × n`; the others are left as they are). Each value is summed
    /// in increasing `d` from `-0.0`, one fused multiply-add (`f32::mul_add`)
    /// per step, in tiles of the attention scores' shape where a whole tile
    /// fits — so every backend gives the same bits, and
    /// a caller may split rows and columns between threads at will
    /// (calibration's Hessians `XᵀX` and error scores `Δw·H` go through
    /// this). Panics if the lengths do not fit.
    #[allow(clippy::too_many_arguments)]
    pub fn product_f32(
        &self,
        a: &[f32],
        m: usize,
        k: usize,
        b: &[f32],
        n: usize,
        cols: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        self.product_f32_from(a, m, k, b, None, n, cols, out);
    }

    /// [`Kernels::product_f32`] with `b`'s whole tiles also given packed
    /// ([`ProductTiles::tiles`]), the same bits: for a `b` that many
    /// products read, packed once. `b` may be empty when `cols` starts and
    /// ends on tile boundaries (only the tiles are read then). Panics if the
    /// lengths do not fit.
    #[allow(clippy::too_many_arguments)]
    pub fn product_f32_packed(
        &self,
        a: &[f32],
        m: usize,
        k: usize,
        b: &[f32],
        tiles: &[f32],
        n: usize,
        cols: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        assert_eq!(
            tiles.len(),
            n / attn::KEY_TILE * attn::KEY_TILE * k,
            "product_f32 tiles"
        );
        self.product_f32_from(a, m, k, b, Some(tiles), n, cols, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn product_f32_from(
        &self,
        a: &[f32],
        m: usize,
        k: usize,
        b: &[f32],
        tiles: Option<&[f32]>,
        n: usize,
        cols: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        const TILE: usize = attn::KEY_TILE;
        // Without `b`, every column read must be in a whole tile.
        let tiles_only =
            tiles.is_some() && b.is_empty() && cols.start % TILE == 0 && cols.end % TILE == 0;
        assert!(
            a.len() == m * k
                && (b.len() == k * n || tiles_only)
                && out.len() == m * n
                && cols.end <= n,
            "product_f32 lengths"
        );
        if k == 0 {
            for row in out.chunks_exact_mut(n.max(1)) {
                row[cols.clone()].fill(-0.0);
            }
            return;
        }
        let mut sums = [[0f32; TILE]; attn::PRODUCT_ROWS];
        // Columns outer: a tile of `b` is read by every row of `a` while it
        // is in the cache. When more than one group of rows reads it, the
        // tile is read from consecutive memory (packed by the caller, or
        // here): its `k` rows lie `n` floats apart in `b`, and at widths
        // that are multiples of 1024 they share a few cache sets, so each
        // group would read them from memory again.
        let pack_here = tiles.is_none() && m > attn::PRODUCT_ROWS && n > TILE;
        let j0 = PRODUCT_TILE.with_borrow_mut(|pack| {
            let mut j0 = cols.start;
            while j0 + TILE <= cols.end {
                let (kt, stride): (&[f32], usize) = match tiles {
                    Some(t) if j0 % TILE == 0 => (&t[j0 * k..][..TILE * k], TILE),
                    _ if pack_here => (pack_tile(b, k, n, j0, pack), TILE),
                    _ => (&b[j0..], n),
                };
                for i0 in (0..m).step_by(attn::PRODUCT_ROWS) {
                    let nh = attn::PRODUCT_ROWS.min(m - i0);
                    let q = &a[i0 * k..(i0 + nh) * k];
                    (self.table.ops.product_tiles)(q, k, kt, stride, &mut sums[..nh]);
                    for (h, t) in sums[..nh].iter().enumerate() {
                        out[(i0 + h) * n + j0..(i0 + h) * n + j0 + TILE].copy_from_slice(t);
                    }
                }
                j0 += TILE;
            }
            j0
        });
        for j in j0..cols.end {
            for (i, row) in a.chunks_exact(k).enumerate() {
                out[i * n + j] = row
                    .iter()
                    .enumerate()
                    .fold(-0.0, |acc, (d, &v)| v.mul_add(b[d * n + j], acc));
            }
        }
    }

    /// `Σ f16(a[i])·b[i]`: an f16 KV-cache row against `f32` values. Panics if
    /// the lengths differ.
    pub fn dot_f16_f32(&self, a: &[u16], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot_f16_f32 lengths");
        (self.table.dot_f16_f32)(a, b)
    }

    /// `Σ f16(a[i])·f16(b[i])`: ggml's `ggml_vec_dot_f16` (query rounded to
    /// f16 against an f16 KV cache). Panics if the lengths differ.
    pub fn dot_f16_f16(&self, a: &[u16], b: &[u16]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot_f16_f16 lengths");
        (self.table.dot_f16_f16)(a, b)
    }

    /// For each of the `n = q.len() / hd ≤ attn::HEADS` queries `h` (rows of
    /// `q`) and the [`attn::KEY_TILE`] keys `l`: `out[h][l] = Σ_d q[h][d] ·
    /// kt[d·stride + l]`, each summed in increasing `d` from `-0.0` (as
    /// `Iterator::sum`), with separate multiplies and adds. `kt` holds the keys
    /// transposed (`hd` dims of `stride` positions, starting at the first key
    /// of the tile). Panics if `n > attn::HEADS` or `kt` is short.
    pub(crate) fn key_tiles(
        &self,
        q: &[f32],
        hd: usize,
        kt: &[f32],
        stride: usize,
        out: &mut [[f32; attn::KEY_TILE]],
    ) {
        (self.table.ops.key_tiles)(q, hd, kt, stride, out)
    }

    /// Divides each of the `sums.len()` rows of `scores` by its sum: the
    /// weights of [`Kernels::weighted_rows`], each quotient computed once.
    pub(crate) fn divide_rows(&self, scores: &mut [f32], sums: &[f32]) {
        attn::divide_rows(scores, sums);
    }

    /// For each of the `heads ≤ attn::HEADS` heads `h` (rows of `hd =
    /// out.len() / heads` values in `out`, rows of `positions = probs.len() /
    /// heads` in `probs`) and each position `j` in turn: `out[h] ← out[h] +
    /// probs[h][j] · v[j]`, [`Kernels::axpy`]'s arithmetic position by
    /// position. Positions taken in pieces, one call after another on the same
    /// `out`, give the bits of one call over all of them (each element sums
    /// its positions in order, from what `out` holds). Panics if there are
    /// more than `attn::HEADS` heads or the lengths disagree.
    pub(crate) fn weighted_rows(&self, out: &mut [f32], probs: &[f32], v: &[f32], heads: usize) {
        (self.table.ops.weighted_rows)(out, probs, v, heads)
    }

    /// `out[i] = out[i] + p · x[i]` for every `i`.
    pub(crate) fn axpy(&self, out: &mut [f32], p: f32, x: &[f32]) {
        (self.table.ops.axpy)(out, p, x)
    }

    /// `dst[i] = f16_to_f32(src[i])` (exact); the KV cache is read this way.
    /// Panics if the lengths differ.
    pub(crate) fn widen_f16(&self, src: &[u16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "widen_f16 lengths");
        (self.table.ops.widen_f16)(src, dst)
    }

    /// [`Kernels::widen_f16`] of little-endian f16 bytes (F16 weights as
    /// stored): `dst[i]` = value `i` of `src`, exactly. Panics if the lengths
    /// differ.
    pub(crate) fn widen_f16_le(&self, src: &[u8], dst: &mut [f32]) {
        assert_eq!(src.len(), 2 * dst.len(), "widen_f16_le lengths");
        (self.table.ops.widen_f16_le)(src, dst)
    }

    /// `dst[i] = f32_to_f16(src[i])` (round to nearest even; NaNs keep their
    /// sign and top payload bits, quieted). Panics if the lengths differ.
    pub(crate) fn narrow_f16(&self, src: &[f32], dst: &mut [u16]) {
        assert_eq!(src.len(), dst.len(), "narrow_f16 lengths");
        (self.table.ops.narrow_f16)(src, dst)
    }

    /// `x ← exp_fast(x)` for every element (`forward::math::exp_fast`'s bits).
    pub(crate) fn exp_fast_in_place(&self, xs: &mut [f32]) {
        (self.table.ops.exp_fast)(xs)
    }

    /// [`quantize_row_q8_0`]'s bytes through the backend. Panics unless
    /// `x.len() == 32 · y.len()`.
    pub(crate) fn quantize_row_q8_0(&self, x: &[f32], y: &mut [BlockQ8_0]) {
        assert_eq!(x.len(), y.len() * QK8_0, "quantize_row_q8_0 lengths");
        (self.table.ops.quantize_q8_0)(x, y)
    }

    /// `dst[c·rows + r] = src[r·stride + c]` for `r < rows`, `c < cols`: a
    /// `rows × cols` block of a matrix with rows `stride` apart, transposed
    /// into `dst`. Panics if a slice is short.
    pub(crate) fn transpose(
        &self,
        src: &[f32],
        stride: usize,
        rows: usize,
        cols: usize,
        dst: &mut [f32],
    ) {
        assert!(
            rows == 0
                || cols == 0
                || (src.len() >= (rows - 1) * stride + cols && dst.len() >= rows * cols),
            "transpose lengths"
        );
        (self.table.ops.transpose)(src, stride, rows, cols, dst)
    }
}
