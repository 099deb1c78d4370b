//! The ggml type registry and the `llama_ftype` (file type) registry.
//!
//! Every tensor in a GGUF file carries a `ggml_type` id. Each id maps to a block
//! layout: `block_size` elements are stored in `type_size` bytes. Everything in
//! memwall that needs a block size, a byte size or a name looks it up here, so
//! adding a type touches this file only.
//!
//! Source of the numbers: `ggml/include/ggml.h` (`enum ggml_type`),
//! `ggml/src/ggml.c` (`type_traits`) and `ggml/src/ggml-common.h` (block structs)
//! of llama.cpp as vendored by llama-cpp-python 0.3.36; `include/llama.h`
//! (`enum llama_ftype`) for file types.

use std::fmt;

/// Number of ids in ggml's type space (`GGML_TYPE_COUNT`).
pub const GGML_TYPE_COUNT: u32 = 43;

/// Elements in a K-quant (and i-quant) super-block (`QK_K`).
pub const QK_K: usize = 256;
/// Elements in a Q8_0 / Q8_1 block (`QK8_0`), the block of the legacy types.
pub const QK8_0: usize = 32;

/// A live ggml tensor type: one that may appear in a GGUF file.
///
/// The discriminant is the on-disk id.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// What the registry knows about one ggml type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeEntry {
    /// A type that GGUF files may contain.
    Live(TypeInfo),
    /// An id that ggml once used and has removed from GGUF files.
    Removed {
        /// The id.
        id: u32,
        /// The name it had.
        name: &'static str,
    },
}

/// Block layout of a live ggml type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    /// The type.
    pub ty: GgmlType,
    /// ggml's name (`ggml_type_name`), e.g. `q4_K`.
    pub name: &'static str,
    /// Elements per block.
    pub block_size: u64,
    /// Bytes per block.
    pub type_size: u64,
}

impl TypeInfo {
    /// Bits per weight of this block layout.
    pub fn bits_per_weight(&self) -> f64 {
        (self.type_size * 8) as f64 / self.block_size as f64
    }
}

const fn live(ty: GgmlType, name: &'static str, block_size: usize, type_size: u64) -> TypeEntry {
    TypeEntry::Live(TypeInfo {
        ty,
        name,
        block_size: block_size as u64,
        type_size,
    })
}

const fn removed(id: u32, name: &'static str) -> TypeEntry {
    TypeEntry::Removed { id, name }
}

/// The registry: entry `i` describes ggml type id `i`.
pub static GGML_TYPES: [TypeEntry; GGML_TYPE_COUNT as usize] = {
    use GgmlType::*;
    [
        live(F32, "f32", 1, 4),
        live(F16, "f16", 1, 2),
        live(Q4_0, "q4_0", QK8_0, 18),
        live(Q4_1, "q4_1", QK8_0, 20),
        removed(4, "q4_2"),
        removed(5, "q4_3"),
        live(Q5_0, "q5_0", QK8_0, 22),
        live(Q5_1, "q5_1", QK8_0, 24),
        live(Q8_0, "q8_0", QK8_0, 34),
        live(Q8_1, "q8_1", QK8_0, 36),
        live(Q2_K, "q2_K", QK_K, 84),
        live(Q3_K, "q3_K", QK_K, 110),
        live(Q4_K, "q4_K", QK_K, 144),
        live(Q5_K, "q5_K", QK_K, 176),
        live(Q6_K, "q6_K", QK_K, 210),
        live(Q8_K, "q8_K", QK_K, 292),
        live(IQ2_XXS, "iq2_xxs", QK_K, 66),
        live(IQ2_XS, "iq2_xs", QK_K, 74),
        live(IQ3_XXS, "iq3_xxs", QK_K, 98),
        live(IQ1_S, "iq1_s", QK_K, 50),
        live(IQ4_NL, "iq4_nl", QK8_0, 18),
        live(IQ3_S, "iq3_s", QK_K, 110),
        live(IQ2_S, "iq2_s", QK_K, 82),
        live(IQ4_XS, "iq4_xs", QK_K, 136),
        live(I8, "i8", 1, 1),
        live(I16, "i16", 1, 2),
        live(I32, "i32", 1, 4),
        live(I64, "i64", 1, 8),
        live(F64, "f64", 1, 8),
        live(IQ1_M, "iq1_m", QK_K, 56),
        live(BF16, "bf16", 1, 2),
        removed(31, "q4_0_4_4"),
        removed(32, "q4_0_4_8"),
        removed(33, "q4_0_8_8"),
        live(TQ1_0, "tq1_0", QK_K, 54),
        live(TQ2_0, "tq2_0", QK_K, 66),
        removed(36, "iq4_nl_4_4"),
        removed(37, "iq4_nl_4_8"),
        removed(38, "iq4_nl_8_8"),
        live(MXFP4, "mxfp4", QK8_0, 17),
        live(NVFP4, "nvfp4", 64, 36),
        live(Q1_0, "q1_0", 128, 18),
        live(Q2_0, "q2_0", 64, 18),
    ]
};

/// Why a type id could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TypeIdError {
    /// The id is outside ggml's type space.
    #[error("unknown ggml type id {0} (known ids are 0..{GGML_TYPE_COUNT})")]
    Unknown(u32),
    /// The id belonged to a type that ggml has removed from GGUF files.
    #[error("ggml type id {id} ({name}) has been removed from GGUF files")]
    Removed {
        /// The id.
        id: u32,
        /// The name it had.
        name: &'static str,
    },
}

/// A tensor shape that no type or file can hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// More than four dimensions.
    #[error("{0} dimensions (ggml allows at most 4)")]
    TooManyDims(usize),
    /// A dimension larger than `i64::MAX`, which ggml stores as `int64_t`.
    #[error("dimension {index} is {value}, larger than i64::MAX")]
    DimTooLarge {
        /// Which dimension.
        index: usize,
        /// Its value.
        value: u64,
    },
    /// The element count does not fit ggml's `int64_t`.
    #[error("the element count of shape {0:?} overflows i64")]
    Overflow(Vec<u64>),
    /// `ne[0]` is not a whole number of blocks.
    #[error("row length {ne0} is not a multiple of the {ty} block size {block_size}")]
    NotBlockMultiple {
        /// Row length (`ne[0]`).
        ne0: u64,
        /// The type.
        ty: GgmlType,
        /// Its block size.
        block_size: u64,
    },
}

/// Maximum number of dimensions of a ggml tensor (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

impl GgmlType {
    /// Looks up a live type by its on-disk id.
    pub fn from_id(id: u32) -> Result<Self, TypeIdError> {
        match GGML_TYPES.get(id as usize) {
            Some(TypeEntry::Live(info)) => Ok(info.ty),
            Some(TypeEntry::Removed { id, name }) => Err(TypeIdError::Removed { id: *id, name }),
            None => Err(TypeIdError::Unknown(id)),
        }
    }

    /// Looks up a live type by ggml's name, case-insensitively (`q4_K`, `Q4_K`, `bf16`).
    pub fn from_name(name: &str) -> Option<Self> {
        GGML_TYPES.iter().find_map(|entry| match entry {
            TypeEntry::Live(info) if info.name.eq_ignore_ascii_case(name) => Some(info.ty),
            _ => None,
        })
    }

    /// Every live type, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        GGML_TYPES.iter().filter_map(|entry| match entry {
            TypeEntry::Live(info) => Some(info.ty),
            TypeEntry::Removed { .. } => None,
        })
    }

    /// The on-disk id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The registry entry of this type.
    pub fn info(self) -> &'static TypeInfo {
        match &GGML_TYPES[self as usize] {
            TypeEntry::Live(info) => info,
            // The table is indexed by id and every variant's id names a live entry;
            // `registry_is_indexed_by_id` checks this for every variant.
            TypeEntry::Removed { .. } => unreachable!("variant {self:?} maps to a removed id"),
        }
    }

    /// ggml's name, e.g. `q4_K`.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Elements per block.
    pub fn block_size(self) -> u64 {
        self.info().block_size
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.info().type_size
    }

    /// Whether the type is a block-quantized one (block size above 1).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Checks a shape (GGUF order, `ne[0]` first) for this type and returns its
    /// element count and byte size.
    ///
    /// The checks are ggml's: at most four dimensions, each at most `i64::MAX`,
    /// an element count that fits `i64`, and `ne[0]` a multiple of the block size.
    pub fn tensor_size(self, dims: &[u64]) -> Result<TensorSize, ShapeError> {
        if dims.len() > MAX_DIMS {
            return Err(ShapeError::TooManyDims(dims.len()));
        }
        let mut elements: u64 = 1;
        for (index, &value) in dims.iter().enumerate() {
            if value > i64::MAX as u64 {
                return Err(ShapeError::DimTooLarge { index, value });
            }
            elements = elements
                .checked_mul(value)
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or_else(|| ShapeError::Overflow(dims.to_vec()))?;
        }
        let ne0 = dims.first().copied().unwrap_or(1);
        let info = self.info();
        if ne0 % info.block_size != 0 {
            return Err(ShapeError::NotBlockMultiple {
                ne0,
                ty: self,
                block_size: info.block_size,
            });
        }
        // elements / block_size ≤ i64::MAX and type_size ≤ 292, so the product fits u64
        // only after a check: u64::MAX / 292 is below i64::MAX.
        let bytes = (elements / info.block_size)
            .checked_mul(info.type_size)
            .ok_or_else(|| ShapeError::Overflow(dims.to_vec()))?;
        Ok(TensorSize { elements, bytes })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element count and byte size of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorSize {
    /// Number of elements.
    pub elements: u64,
    /// Number of bytes.
    pub bytes: u64,
}

/// A `llama_ftype` value, stored as `general.file_type`: what a file is
/// "mostly" quantized to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileTypeInfo {
    /// The value of `general.file_type`.
    pub id: u32,
    /// The name `llama-quantize` accepts, e.g. `Q4_K_M`.
    pub name: &'static str,
    /// The ggml type most tensors get; `None` for removed file types.
    pub base: Option<GgmlType>,
}

const fn ft(id: u32, name: &'static str, base: Option<GgmlType>) -> FileTypeInfo {
    FileTypeInfo { id, name, base }
}

/// The file type registry, in id order (ids 0..=41, then 1024).
pub static FILE_TYPES: &[FileTypeInfo] = {
    use GgmlType::*;
    &[
        ft(0, "F32", Some(F32)),
        ft(1, "F16", Some(F16)),
        ft(2, "Q4_0", Some(Q4_0)),
        ft(3, "Q4_1", Some(Q4_1)),
        ft(4, "Q4_1_SOME_F16 (removed)", None),
        ft(5, "Q4_2 (removed)", None),
        ft(6, "Q4_3 (removed)", None),
        ft(7, "Q8_0", Some(Q8_0)),
        ft(8, "Q5_0", Some(Q5_0)),
        ft(9, "Q5_1", Some(Q5_1)),
        ft(10, "Q2_K", Some(Q2_K)),
        ft(11, "Q3_K_S", Some(Q3_K)),
        ft(12, "Q3_K_M", Some(Q3_K)),
        ft(13, "Q3_K_L", Some(Q3_K)),
        ft(14, "Q4_K_S", Some(Q4_K)),
        ft(15, "Q4_K_M", Some(Q4_K)),
        ft(16, "Q5_K_S", Some(Q5_K)),
        ft(17, "Q5_K_M", Some(Q5_K)),
        ft(18, "Q6_K", Some(Q6_K)),
        ft(19, "IQ2_XXS", Some(IQ2_XXS)),
        ft(20, "IQ2_XS", Some(IQ2_XS)),
        ft(21, "Q2_K_S", Some(Q2_K)),
        ft(22, "IQ3_XS", Some(IQ3_S)),
        ft(23, "IQ3_XXS", Some(IQ3_XXS)),
        ft(24, "IQ1_S", Some(IQ1_S)),
        ft(25, "IQ4_NL", Some(IQ4_NL)),
        ft(26, "IQ3_S", Some(IQ3_S)),
        ft(27, "IQ3_M", Some(IQ3_S)),
        // As llama-quant.cpp: the IQ2_S file type is made of IQ2_XS blocks, IQ2_M of IQ2_S.
        ft(28, "IQ2_S", Some(IQ2_XS)),
        ft(29, "IQ2_M", Some(IQ2_S)),
        ft(30, "IQ4_XS", Some(IQ4_XS)),
        ft(31, "IQ1_M", Some(IQ1_M)),
        ft(32, "BF16", Some(BF16)),
        ft(33, "Q4_0_4_4 (removed)", None),
        ft(34, "Q4_0_4_8 (removed)", None),
        ft(35, "Q4_0_8_8 (removed)", None),
        ft(36, "TQ1_0", Some(TQ1_0)),
        ft(37, "TQ2_0", Some(TQ2_0)),
        ft(38, "MXFP4_MOE", Some(MXFP4)),
        ft(39, "NVFP4", Some(NVFP4)),
        ft(40, "Q1_0", Some(Q1_0)),
        ft(41, "Q2_0", Some(Q2_0)),
        ft(1024, "GUESSED", None),
    ]
};

/// Looks up a `general.file_type` value.
pub fn file_type(id: u32) -> Option<&'static FileTypeInfo> {
    FILE_TYPES.iter().find(|info| info.id == id)
}

/// Looks up a file type by the name `llama-quantize` accepts (case-insensitive).
pub fn file_type_by_name(name: &str) -> Option<&'static FileTypeInfo> {
    FILE_TYPES
        .iter()
        .find(|info| info.base.is_some() && info.name.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_indexed_by_id() {
        for (index, entry) in GGML_TYPES.iter().enumerate() {
            match entry {
                TypeEntry::Live(info) => assert_eq!(info.ty as usize, index, "{}", info.name),
                TypeEntry::Removed { id, .. } => assert_eq!(*id as usize, index),
            }
        }
        for ty in GgmlType::all() {
            assert_eq!(GgmlType::from_id(ty.id()), Ok(ty));
            assert_eq!(GgmlType::from_name(ty.name()), Some(ty));
        }
        assert_eq!(GgmlType::all().count(), 35);
    }

    #[test]
    fn removed_and_unknown_ids_are_rejected() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38] {
            assert!(
                matches!(GgmlType::from_id(id), Err(TypeIdError::Removed { .. })),
                "{id}"
            );
        }
        assert_eq!(GgmlType::from_id(43), Err(TypeIdError::Unknown(43)));
        assert_eq!(
            GgmlType::from_id(u32::MAX),
            Err(TypeIdError::Unknown(u32::MAX))
        );
    }

    /// Bits per weight as documented in ggml-common.h and llama.cpp's quantize README.
    #[test]
    fn bits_per_weight_match_ggml() {
        let expected = [
            (GgmlType::Q4_0, 4.5),
            (GgmlType::Q4_1, 5.0),
            (GgmlType::Q5_0, 5.5),
            (GgmlType::Q5_1, 6.0),
            (GgmlType::Q8_0, 8.5),
            (GgmlType::Q2_K, 2.625),
            (GgmlType::Q3_K, 3.4375),
            (GgmlType::Q4_K, 4.5),
            (GgmlType::Q5_K, 5.5),
            (GgmlType::Q6_K, 6.5625),
            (GgmlType::Q8_K, 9.125),
            (GgmlType::IQ4_NL, 4.5),
            (GgmlType::IQ4_XS, 4.25),
            (GgmlType::IQ2_XXS, 2.0625),
            (GgmlType::IQ1_S, 1.5625),
            (GgmlType::TQ1_0, 1.6875),
            (GgmlType::MXFP4, 4.25),
            (GgmlType::F16, 16.0),
            (GgmlType::BF16, 16.0),
        ];
        for (ty, bpw) in expected {
            assert_eq!(ty.info().bits_per_weight(), bpw, "{ty}");
        }
    }

    #[test]
    fn tensor_size_applies_ggml_checks() {
        let q4k = GgmlType::Q4_K;
        assert_eq!(
            q4k.tensor_size(&[512, 3]),
            Ok(TensorSize {
                elements: 1536,
                bytes: 864
            })
        );
        assert_eq!(
            GgmlType::F32.tensor_size(&[]),
            Ok(TensorSize {
                elements: 1,
                bytes: 4
            })
        );
        assert_eq!(
            GgmlType::F32.tensor_size(&[0, 5]),
            Ok(TensorSize {
                elements: 0,
                bytes: 0
            })
        );
        assert!(matches!(
            q4k.tensor_size(&[576, 1]),
            Err(ShapeError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            GgmlType::F32.tensor_size(&[1, 1, 1, 1, 1]),
            Err(ShapeError::TooManyDims(5))
        ));
        assert!(matches!(
            GgmlType::F32.tensor_size(&[1 << 32, 1 << 32]),
            Err(ShapeError::Overflow(_))
        ));
        assert!(matches!(
            GgmlType::F32.tensor_size(&[u64::MAX]),
            Err(ShapeError::DimTooLarge { index: 0, .. })
        ));
        // i64::MAX elements of f32 is a valid count but overflows the byte size.
        assert!(matches!(
            GgmlType::F32.tensor_size(&[i64::MAX as u64]),
            Err(ShapeError::Overflow(_))
        ));
    }

    #[test]
    fn file_types() {
        assert_eq!(file_type(15).map(|t| t.name), Some("Q4_K_M"));
        assert_eq!(file_type_by_name("q4_k_m").map(|t| t.id), Some(15));
        assert_eq!(file_type(1024).map(|t| t.name), Some("GUESSED"));
        assert!(file_type(42).is_none());
        assert!(file_type_by_name("Q4_2 (removed)").is_none());
        let ids: Vec<u32> = FILE_TYPES.iter().map(|t| t.id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
    }
}
