//! Errors of the GGUF reader and writer. Every message names the file, key or
//! tensor at fault, and parse errors carry the byte offset.

use std::io;
use std::path::PathBuf;

use super::value::ValueType;
use crate::ggml_type::{GgmlType, ShapeError, TypeIdError};

/// A defect in the bytes of a GGUF file, found at `offset`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("at byte {offset}: {kind}")]
pub struct FormatError {
    /// Byte offset in the file where the defect starts.
    pub offset: u64,
    /// What is wrong.
    pub kind: FormatErrorKind,
}

/// What is wrong with a GGUF file.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FormatErrorKind {
    /// The file ends inside a value.
    #[error("file ends inside {what}: {needed} bytes needed, {available} left")]
    Truncated {
        /// What was being read.
        what: String,
        /// Bytes it needs.
        needed: u64,
        /// Bytes the file has left.
        available: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {}, expected \"GGUF\" (is this a GGUF file?)", show_magic(.0))]
    BadMagic([u8; 4]),
    /// A version other than 2 or 3.
    #[error("unsupported GGUF version {version}{hint}")]
    UnsupportedVersion {
        /// The version field.
        version: u32,
        /// Why it is not supported, for the message.
        hint: &'static str,
    },
    /// A count larger than the rest of the file could hold.
    #[error("{what} count {count} is larger than the file could hold (at most {max})")]
    CountTooLarge {
        /// `tensor` or `metadata key`.
        what: &'static str,
        /// The count in the file.
        count: u64,
        /// The most that fit in the bytes left.
        max: u64,
    },
    /// A string length past the end of the file.
    #[error("{what} has length {len}, but only {available} bytes are left")]
    StringTooLong {
        /// Which string.
        what: String,
        /// Its length field.
        len: u64,
        /// Bytes left.
        available: u64,
    },
    /// An array count larger than the rest of the file could hold.
    #[error(
        "metadata key '{key}': array of {count} {element_type} elements needs at least \
         {needed} bytes, only {available} are left"
    )]
    ArrayTooLong {
        /// The key.
        key: String,
        /// The count field.
        count: u64,
        /// The element type.
        element_type: ValueType,
        /// Minimum bytes the elements need.
        needed: u128,
        /// Bytes left.
        available: u64,
    },
    /// A value type tag outside 0..=12.
    #[error("metadata key '{key}': unknown value type {type_id}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The tag.
        type_id: u32,
    },
    /// Arrays nested deeper than memwall accepts.
    #[error("metadata key '{key}': arrays nested deeper than {max} levels")]
    NestingTooDeep {
        /// The key.
        key: String,
        /// The limit.
        max: usize,
    },
    /// A string that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string.
        what: String,
    },
    /// A bool byte other than 0 or 1.
    #[error("metadata key '{key}': bool value {byte} is neither 0 nor 1")]
    InvalidBool {
        /// The key.
        key: String,
        /// The byte.
        byte: u8,
    },
    /// A metadata key of length 0.
    #[error("metadata key #{index} is empty")]
    EmptyKey {
        /// Position of the pair.
        index: u64,
    },
    /// A key that appears twice.
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    /// `general.alignment` of the wrong type, not a power of two, or above
    /// memwall's limit of 1 MiB.
    #[error("general.alignment must be a uint32 power of two up to 1048576, found {found}")]
    BadAlignment {
        /// What the file holds.
        found: String,
    },
    /// A tensor name of 64 bytes or more (ggml's `GGML_MAX_NAME` is 64 with the NUL).
    #[error("tensor #{index} has a name of {len} bytes; ggml allows at most 63")]
    TensorNameTooLong {
        /// Position of the tensor.
        index: u64,
        /// Name length.
        len: u64,
    },
    /// More than four dimensions.
    #[error("tensor '{tensor}' has {n_dims} dimensions; ggml allows at most 4")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// Its dimension count.
        n_dims: u32,
    },
    /// An unknown or removed ggml type id.
    #[error("tensor '{tensor}': {error}")]
    TensorType {
        /// The tensor.
        tensor: String,
        /// Why the id is not usable.
        error: TypeIdError,
    },
    /// A shape ggml cannot hold.
    #[error("tensor '{tensor}': {error}")]
    TensorShape {
        /// The tensor.
        tensor: String,
        /// What is wrong with it.
        error: ShapeError,
    },
    /// A tensor name that appears twice.
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor '{tensor}' has offset {offset}, not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Its offset in the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose data ends past the end of the file.
    #[error(
        "tensor '{tensor}' ({ty}, {size} bytes at data offset {offset}) ends past the end of \
         the file (data section is {data_size} bytes)"
    )]
    TensorPastEof {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// Its offset in the data section.
        offset: u64,
        /// Its size.
        size: u64,
        /// Size of the data section.
        data_size: u64,
    },
    /// Two tensors whose data overlap.
    #[error("tensors '{first}' and '{second}' overlap in the data section")]
    OverlappingTensors {
        /// The one with the lower offset.
        first: String,
        /// The other one.
        second: String,
    },
}

/// An error of the GGUF reader or writer.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Reading or writing a file failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The file is not valid GGUF.
    #[error("{}: not a valid GGUF file: {error}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The defect.
        error: FormatError,
    },
    /// A set of split files does not fit together.
    #[error("{}: {message}", path.display())]
    Split {
        /// The file at fault.
        path: PathBuf,
        /// What does not fit.
        message: String,
    },
    /// The writer was given something it cannot write.
    #[error("{}: {message}", path.display())]
    Write {
        /// The output file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
}

impl GgufError {
    /// The parse error, if this is one.
    pub fn format_error(&self) -> Option<&FormatError> {
        match self {
            GgufError::Format { error, .. } => Some(error),
            _ => None,
        }
    }
}

fn show_magic(bytes: &[u8; 4]) -> String {
    let text: String = bytes
        .iter()
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    format!("\"{text}\"")
}
