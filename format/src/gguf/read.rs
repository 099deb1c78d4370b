//! Parsing a GGUF header from bytes. The parser never trusts the file: every
//! count and length is checked against the bytes that remain before anything
//! is allocated for it.

use std::collections::HashSet;

use super::error::{FormatError, FormatErrorKind};
use super::metadata::{Metadata, keys};
use super::value::{Array, Value, ValueType};
use super::{GGUF_MAGIC, Header, MAX_ARRAY_DEPTH, MAX_TENSOR_NAME, TensorInfo};
use crate::ggml_type::{GgmlType, MAX_DIMS};

/// Bytes a metadata pair needs at least: key length, a one-byte key, the type
/// tag and a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Bytes a tensor info needs at least: name length, dimension count, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// Largest capacity reserved up front for string and nested arrays, whose
/// in-memory elements are larger than their smallest encoding. Beyond this the
/// vectors grow only as elements are actually parsed.
const MAX_PREALLOCATED_ELEMENTS: usize = 1 << 16;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn error(&self, kind: FormatErrorKind) -> FormatError {
        FormatError {
            offset: self.pos as u64,
            kind,
        }
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(self.error(FormatErrorKind::Truncated {
                what: what(),
                needed: n,
                available: self.remaining(),
            }));
        }
        let start = self.pos;
        // n ≤ remaining ≤ usize::MAX, so the cast and the sum cannot overflow.
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], FormatError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, FormatError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, FormatError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a length-prefixed string; `what` names it in messages.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        self.string_max(u64::MAX, what)
    }

    /// Reads a length-prefixed string of at most `max` bytes; a longer one is
    /// reported as `StringTooLong` before anything is read.
    fn string_max(&mut self, max: u64, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let at = self.pos as u64;
        let len = self.u64(|| format!("the length of {}", what()))?;
        if len > self.remaining() || len > max {
            return Err(FormatError {
                offset: at,
                kind: FormatErrorKind::StringTooLong {
                    what: what(),
                    len,
                    available: self.remaining(),
                },
            });
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| FormatError {
            offset: at,
            kind: FormatErrorKind::InvalidUtf8 { what: what() },
        })
    }
}

/// Parses the header (metadata and tensor infos) of a GGUF file held in
/// `bytes`, and checks that every tensor's data lies inside `bytes`.
pub fn parse(bytes: &[u8]) -> Result<Header, FormatError> {
    let mut c = Cursor { buf: bytes, pos: 0 };

    let magic = c.array::<4>(|| "the magic number".into())?;
    if magic != GGUF_MAGIC {
        return Err(FormatError {
            offset: 0,
            kind: FormatErrorKind::BadMagic(magic),
        });
    }
    let version = c.u32(|| "the version".into())?;
    check_version(version).map_err(|kind| FormatError { offset: 4, kind })?;

    let counts_at = c.pos as u64;
    let n_tensors = c.u64(|| "the tensor count".into())?;
    let n_kv = c.u64(|| "the metadata key count".into())?;
    let room = c.remaining();
    let max_kv = room / MIN_KV_BYTES;
    if n_kv > max_kv {
        let kind = FormatErrorKind::CountTooLarge {
            what: "metadata key",
            count: n_kv,
            max: max_kv,
        };
        return Err(FormatError {
            offset: counts_at + 8,
            kind,
        });
    }
    let max_tensors = (room - n_kv * MIN_KV_BYTES) / MIN_TENSOR_INFO_BYTES;
    if n_tensors > max_tensors {
        let kind = FormatErrorKind::CountTooLarge {
            what: "tensor",
            count: n_tensors,
            max: max_tensors,
        };
        return Err(FormatError {
            offset: counts_at,
            kind,
        });
    }

    let mut metadata = Metadata::new();
    let mut alignment_at = None;
    for index in 0..n_kv {
        let at = c.pos as u64;
        let key = c.string(&|| format!("metadata key #{index}"))?;
        if key.is_empty() {
            return Err(FormatError {
                offset: at,
                kind: FormatErrorKind::EmptyKey { index },
            });
        }
        let tag = c.u32(|| format!("the type of metadata key '{key}'"))?;
        let value = read_value(&mut c, tag, &key, 0)?;
        if key == keys::ALIGNMENT {
            alignment_at = Some(at);
        }
        if !metadata.push_new(key.clone(), value) {
            return Err(FormatError {
                offset: at,
                kind: FormatErrorKind::DuplicateKey(key),
            });
        }
    }

    let alignment = metadata.alignment().map_err(|found| FormatError {
        offset: alignment_at.unwrap_or(0),
        kind: FormatErrorKind::BadAlignment {
            found: found.to_string(),
        },
    })?;

    // A tensor info takes 24 bytes on disk but more in memory; reserve a bounded
    // amount and let the vectors grow with what is actually parsed.
    let reserve = (n_tensors as usize).min(MAX_PREALLOCATED_ELEMENTS);
    let mut tensors = Vec::with_capacity(reserve);
    let mut names = HashSet::with_capacity(reserve);
    for index in 0..n_tensors {
        let info_at = c.pos as u64;
        let what = || format!("the name of tensor #{index}");
        let name = c
            .string_max(MAX_TENSOR_NAME - 1, &what)
            .map_err(|e| match e.kind {
                FormatErrorKind::StringTooLong { len, .. } if len >= MAX_TENSOR_NAME => {
                    let kind = FormatErrorKind::TensorNameTooLong { index, len };
                    FormatError {
                        offset: info_at,
                        kind,
                    }
                }
                _ => e,
            })?;
        let n_dims = c.u32(|| format!("the dimension count of tensor '{name}'"))?;
        if n_dims as usize > MAX_DIMS {
            let kind = FormatErrorKind::TooManyDims {
                tensor: name,
                n_dims,
            };
            return Err(FormatError {
                offset: c.pos as u64 - 4,
                kind,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(|| format!("dimension {d} of tensor '{name}'"))?);
        }
        let type_at = c.pos as u64;
        let type_id = c.u32(|| format!("the type of tensor '{name}'"))?;
        let ty = GgmlType::from_id(type_id).map_err(|error| FormatError {
            offset: type_at,
            kind: FormatErrorKind::TensorType {
                tensor: name.clone(),
                error,
            },
        })?;
        let size = ty.tensor_size(&dims).map_err(|error| FormatError {
            offset: info_at,
            kind: FormatErrorKind::TensorShape {
                tensor: name.clone(),
                error,
            },
        })?;
        let offset = c.u64(|| format!("the data offset of tensor '{name}'"))?;
        if !names.insert(name.clone()) {
            return Err(FormatError {
                offset: info_at,
                kind: FormatErrorKind::DuplicateTensor(name),
            });
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size: size.bytes,
            elements: size.elements,
        });
    }

    let data_offset = align_up(c.pos as u64, alignment);
    let file_len = bytes.len() as u64;
    if !tensors.is_empty() && data_offset > file_len {
        let kind = FormatErrorKind::Truncated {
            what: "the padding before the tensor data".into(),
            needed: data_offset - c.pos as u64,
            available: c.remaining(),
        };
        return Err(c.error(kind));
    }
    let data_size = file_len.saturating_sub(data_offset);
    check_tensor_layout(&tensors, alignment, data_offset, data_size)?;

    Ok(Header {
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
    })
}

fn check_version(version: u32) -> Result<(), FormatErrorKind> {
    let hint = match version {
        2 | 3 => return Ok(()),
        1 => " (GGUF v1 used 32-bit counts and is no longer supported; re-convert the model)",
        v if v & 0xFFFF == 0 => " (the file looks big-endian, which memwall does not read)",
        _ => " (memwall reads versions 2 and 3)",
    };
    Err(FormatErrorKind::UnsupportedVersion { version, hint })
}

/// Rounds `n` up to a multiple of `alignment` (a power of two), saturating.
pub(crate) fn align_up(n: u64, alignment: u64) -> u64 {
    n.checked_next_multiple_of(alignment).unwrap_or(u64::MAX)
}

fn check_tensor_layout(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    data_size: u64,
) -> Result<(), FormatError> {
    for t in tensors {
        let at = data_offset.saturating_add(t.offset);
        if t.offset % alignment != 0 {
            let kind = FormatErrorKind::MisalignedTensor {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            };
            return Err(FormatError { offset: at, kind });
        }
        if t.offset
            .checked_add(t.size)
            .is_none_or(|end| end > data_size)
        {
            let kind = FormatErrorKind::TensorPastEof {
                tensor: t.name.clone(),
                ty: t.ty,
                offset: t.offset,
                size: t.size,
                data_size,
            };
            return Err(FormatError { offset: at, kind });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.size > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // Both ends are inside the data section, checked above.
        if a.offset + a.size > b.offset {
            let kind = FormatErrorKind::OverlappingTensors {
                first: a.name.clone(),
                second: b.name.clone(),
            };
            return Err(FormatError {
                offset: data_offset + b.offset,
                kind,
            });
        }
    }
    Ok(())
}

fn read_value(c: &mut Cursor<'_>, tag: u32, key: &str, depth: usize) -> Result<Value, FormatError> {
    let at = c.pos as u64;
    let ty = ValueType::from_id(tag).ok_or_else(|| FormatError {
        offset: at.saturating_sub(4),
        kind: FormatErrorKind::UnknownValueType {
            key: key.to_owned(),
            type_id: tag,
        },
    })?;
    let what = || format!("the value of metadata key '{key}'");
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(c.array(what)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(what)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(what)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(what)?)),
        ValueType::Bool => {
            let [byte] = c.array(what)?;
            Value::Bool(to_bool(byte, key, at)?)
        }
        ValueType::String => Value::String(c.string(&what)?),
        ValueType::Array => Value::Array(read_array(c, key, depth + 1)?),
    })
}

fn to_bool(byte: u8, key: &str, at: u64) -> Result<bool, FormatError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        byte => Err(FormatError {
            offset: at,
            kind: FormatErrorKind::InvalidBool {
                key: key.to_owned(),
                byte,
            },
        }),
    }
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array, FormatError> {
    let at = c.pos as u64;
    if depth > MAX_ARRAY_DEPTH {
        let kind = FormatErrorKind::NestingTooDeep {
            key: key.to_owned(),
            max: MAX_ARRAY_DEPTH,
        };
        return Err(FormatError { offset: at, kind });
    }
    let tag = c.u32(|| format!("the element type of metadata key '{key}'"))?;
    let element_type = ValueType::from_id(tag).ok_or_else(|| FormatError {
        offset: at,
        kind: FormatErrorKind::UnknownValueType {
            key: key.to_owned(),
            type_id: tag,
        },
    })?;
    let count = c.u64(|| format!("the element count of metadata key '{key}'"))?;
    let needed = u128::from(count) * u128::from(element_type.min_encoded_size());
    if needed > u128::from(c.remaining()) {
        let kind = FormatErrorKind::ArrayTooLong {
            key: key.to_owned(),
            count,
            element_type,
            needed,
            available: c.remaining(),
        };
        return Err(FormatError { offset: at, kind });
    }
    // From here `count` elements of the fixed-size types fit in the bytes left,
    // so `count as usize` and the slices below are in range.
    let n = count as usize;
    let what = || format!("the elements of metadata key '{key}'");
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            let bytes = c.take(count * element_type.min_encoded_size(), what)?;
            Array::$variant(
                bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|chunk| <$t>::from_le_bytes(chunk.try_into().expect("exact chunk")))
                    .collect(),
            )
        }};
    }
    Ok(match element_type {
        ValueType::U8 => Array::U8(c.take(count, what)?.to_vec()),
        ValueType::I8 => fixed!(I8, i8),
        ValueType::U16 => fixed!(U16, u16),
        ValueType::I16 => fixed!(I16, i16),
        ValueType::U32 => fixed!(U32, u32),
        ValueType::I32 => fixed!(I32, i32),
        ValueType::F32 => fixed!(F32, f32),
        ValueType::U64 => fixed!(U64, u64),
        ValueType::I64 => fixed!(I64, i64),
        ValueType::F64 => fixed!(F64, f64),
        ValueType::Bool => {
            let start = c.pos as u64;
            let bytes = c.take(count, what)?;
            let mut out = Vec::with_capacity(n);
            for (i, &b) in bytes.iter().enumerate() {
                out.push(to_bool(b, key, start + i as u64)?);
            }
            Array::Bool(out)
        }
        ValueType::String => {
            let mut out = Vec::with_capacity(n.min(MAX_PREALLOCATED_ELEMENTS));
            for i in 0..count {
                out.push(c.string(&|| format!("element {i} of metadata key '{key}'"))?);
            }
            Array::String(out)
        }
        ValueType::Array => {
            let mut out = Vec::with_capacity(n.min(MAX_PREALLOCATED_ELEMENTS));
            for _ in 0..count {
                out.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(out)
        }
    })
}
