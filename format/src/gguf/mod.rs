//! The GGUF container: reader, streaming writer, split models.
//!
//! Layout (ggml's `docs/gguf.md`, `src/gguf.cpp`): magic `GGUF`, u32 version,
//! u64 tensor count, u64 metadata count, the metadata pairs, the tensor infos
//! (name, dims in `ne` order, ggml type, data offset), zero padding to the
//! alignment, then the tensor data, each tensor padded to the alignment.
//!
//! ```no_run
//! use memwall_format::gguf::GgufFile;
//!
//! let file = GgufFile::open("model.gguf".as_ref())?;
//! println!("{} tensors", file.header().tensors.len());
//! for t in &file.header().tensors {
//!     let bytes: &[u8] = file.tensor_data(t); // zero-copy slice of the mapping
//!     assert_eq!(bytes.len() as u64, t.size);
//! }
//! # Ok::<(), memwall_format::gguf::GgufError>(())
//! ```

mod error;
mod file;
mod metadata;
mod read;
mod split;
mod value;
mod write;

pub use error::{FormatError, FormatErrorKind, GgufError};
pub use file::{GgufFile, LoadMode};
pub use metadata::{AlignmentError, Metadata, MetadataError, describe_type, keys};
pub use read::parse;
pub use split::{GgufModel, split_path};
pub use value::{Array, Value, ValueType};
pub use write::{GgufWriter, TensorSpec, copy_gguf};

use crate::ggml_type::GgmlType;

/// The four magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The version memwall writes by default.
pub const GGUF_VERSION: u32 = 3;
/// Alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest `general.alignment` memwall reads or writes (1 MiB). ggml accepts
/// any power of two up to 2^31; no real file uses more than a page, and each
/// file carries up to `alignment` bytes of padding per tensor.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Tensor names must be shorter than this (`GGML_MAX_NAME`, which counts the NUL).
pub const MAX_TENSOR_NAME: u64 = 64;
/// Deepest array nesting memwall reads or writes. ggml itself reads no nested
/// arrays; gguf-py writes them.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// Everything in a GGUF file but the tensor data.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// Format version (2 or 3).
    pub version: u32,
    /// Data alignment in bytes.
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Metadata,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset of the tensor data section.
    pub data_offset: u64,
}

impl Header {
    /// Sum of the tensors' data sizes, without padding.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size).sum()
    }
}

/// One tensor's entry in the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in GGUF order: `dims[0]` (`ne[0]`) is the row length, the reverse
    /// of the PyTorch shape.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes (without padding).
    pub size: u64,
    /// Number of elements.
    pub elements: u64,
}
