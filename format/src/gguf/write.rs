//! Streaming GGUF writer.
//!
//! The caller declares metadata and tensor infos up front; the writer computes
//! aligned offsets, writes the header, then takes each tensor's bytes in
//! declaration order, in chunks of any size, padding after each tensor exactly
//! as ggml's `gguf_write_to_buf` does. It never holds tensor data itself.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::GgufError;
use super::metadata::Metadata;
use super::read::align_up;
use super::value::{Array, Value};
use super::{GGUF_MAGIC, Header, MAX_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_TENSOR_NAME, TensorInfo};
use crate::atomic::AtomicFile;
use crate::ggml_type::GgmlType;

/// A tensor to be written: name, shape in GGUF order (`ne[0]` first), type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Tensor name (at most 63 bytes).
    pub name: String,
    /// Shape in GGUF order.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
}

impl From<&TensorInfo> for TensorSpec {
    fn from(t: &TensorInfo) -> Self {
        TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        }
    }
}

/// Writes one GGUF file to `W`. See the module docs.
pub struct GgufWriter<W: Write> {
    out: W,
    path: PathBuf,
    header: Header,
    /// Index of the tensor whose data comes next.
    current: usize,
    /// Bytes of the current tensor received so far.
    received: u64,
}

impl GgufWriter<AtomicFile> {
    /// Creates `path` atomically: data goes to `<path>.partial`, which
    /// [`GgufWriter::commit`] fsyncs and renames, and which is removed if the
    /// writer is dropped without committing or an error occurs.
    pub fn create(
        path: &Path,
        version: u32,
        metadata: Metadata,
        tensors: Vec<TensorSpec>,
    ) -> Result<Self, GgufError> {
        let header = plan(path, version, metadata, tensors)?;
        let out = AtomicFile::create_large(path).map_err(|error| GgufError::Io {
            path: AtomicFile::partial_path_for(path),
            error,
        })?;
        Self::start(out, path.to_owned(), header)
    }

    /// Checks that all tensor data was written, then makes the file durable
    /// and moves it to its final path.
    pub fn commit(self) -> Result<(), GgufError> {
        let path = self.path.clone();
        let out = self.finish()?;
        out.commit().map_err(|error| GgufError::Io { path, error })
    }
}

impl<W: Write> GgufWriter<W> {
    /// Starts writing to any byte sink; `label` names it in error messages.
    pub fn new(
        out: W,
        label: &Path,
        version: u32,
        metadata: Metadata,
        tensors: Vec<TensorSpec>,
    ) -> Result<Self, GgufError> {
        let header = plan(label, version, metadata, tensors)?;
        Self::start(out, label.to_owned(), header)
    }

    fn start(mut out: W, path: PathBuf, header: Header) -> Result<Self, GgufError> {
        let bytes = encode_header(&header);
        out.write_all(&bytes).map_err(|error| GgufError::Io {
            path: path.clone(),
            error,
        })?;
        let mut writer = GgufWriter {
            out,
            path,
            header,
            current: 0,
            received: 0,
        };
        writer.write_zeros(writer.header.data_offset - bytes.len() as u64)?;
        writer.skip_empty_tensors();
        Ok(writer)
    }

    /// The header being written, with the computed offsets.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The tensor whose data is expected next, if any.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.header.tensors.get(self.current)
    }

    /// Appends `chunk` to the data of tensor `name`, which must be the next
    /// tensor not yet complete. Chunks may have any size up to what the tensor
    /// still needs.
    pub fn write_tensor_data(&mut self, name: &str, chunk: &[u8]) -> Result<(), GgufError> {
        let Some(t) = self.header.tensors.get(self.current) else {
            return Err(self.error(format!(
                "got data for tensor '{name}', but all tensors are complete"
            )));
        };
        if t.name != name {
            return Err(self.error(format!(
                "got data for tensor '{name}', but tensor #{} '{}' comes next",
                self.current, t.name
            )));
        }
        let left = t.size - self.received;
        if chunk.len() as u64 > left {
            return Err(self.error(format!(
                "tensor '{}' is {} bytes; got {} bytes more than that",
                t.name,
                t.size,
                chunk.len() as u64 - left
            )));
        }
        self.out.write_all(chunk).map_err(|error| GgufError::Io {
            path: self.path.clone(),
            error,
        })?;
        self.received += chunk.len() as u64;
        if self.received == t.size {
            let padding = align_up(t.size, self.header.alignment) - t.size;
            self.write_zeros(padding)?;
            self.current += 1;
            self.received = 0;
            self.skip_empty_tensors();
        }
        Ok(())
    }

    /// Writes the whole data of tensor `name` at once.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<(), GgufError> {
        if let Some(t) = self.header.tensors.get(self.current) {
            if t.name == name && (self.received > 0 || data.len() as u64 != t.size) {
                return Err(self.error(format!(
                    "tensor '{}' is {} bytes, got {}",
                    t.name,
                    t.size,
                    self.received + data.len() as u64
                )));
            }
        }
        self.write_tensor_data(name, data)
    }

    /// Checks that every tensor is complete, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some(t) = self.header.tensors.get(self.current) {
            return Err(self.error(format!(
                "tensor '{}' is incomplete: {} of {} bytes written ({} tensors missing)",
                t.name,
                self.received,
                t.size,
                self.header.tensors.len() - self.current
            )));
        }
        self.out.flush().map_err(|error| GgufError::Io {
            path: self.path.clone(),
            error,
        })?;
        Ok(self.out)
    }

    fn skip_empty_tensors(&mut self) {
        while self
            .header
            .tensors
            .get(self.current)
            .is_some_and(|t| t.size == 0)
        {
            self.current += 1;
        }
    }

    fn write_zeros(&mut self, n: u64) -> Result<(), GgufError> {
        const ZEROS: [u8; 256] = [0; 256];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len() as u64) as usize;
            self.out
                .write_all(&ZEROS[..k])
                .map_err(|error| GgufError::Io {
                    path: self.path.clone(),
                    error,
                })?;
            left -= k as u64;
        }
        Ok(())
    }

    fn error(&self, message: String) -> GgufError {
        GgufError::Write {
            path: self.path.clone(),
            message,
        }
    }
}

/// Validates what is to be written and computes the layout.
fn plan(
    path: &Path,
    version: u32,
    metadata: Metadata,
    specs: Vec<TensorSpec>,
) -> Result<Header, GgufError> {
    let fail = |message: String| GgufError::Write {
        path: path.to_owned(),
        message,
    };
    if !matches!(version, 2 | 3) {
        return Err(fail(format!(
            "cannot write GGUF version {version}; use 2 or 3"
        )));
    }
    for (key, value) in metadata.iter() {
        if key.is_empty() {
            return Err(fail("metadata key is empty".into()));
        }
        if let Value::Array(a) = value {
            if array_depth(a) > MAX_ARRAY_DEPTH {
                return Err(fail(format!(
                    "metadata key '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
                )));
            }
        }
    }
    let alignment = metadata.alignment().map_err(|found| {
        fail(format!(
            "general.alignment must be a uint32 power of two up to {MAX_ALIGNMENT}, found {found}"
        ))
    })?;
    let mut names = HashSet::with_capacity(specs.len());
    let mut tensors = Vec::with_capacity(specs.len());
    let mut offset = 0u64;
    for spec in specs {
        if spec.name.len() as u64 >= MAX_TENSOR_NAME {
            return Err(fail(format!(
                "tensor name '{}' is {} bytes; ggml allows at most 63",
                spec.name,
                spec.name.len()
            )));
        }
        if !names.insert(spec.name.clone()) {
            return Err(fail(format!("duplicate tensor name '{}'", spec.name)));
        }
        let size = spec
            .ty
            .tensor_size(&spec.dims)
            .map_err(|e| fail(format!("tensor '{}': {e}", spec.name)))?;
        tensors.push(TensorInfo {
            name: spec.name,
            dims: spec.dims,
            ty: spec.ty,
            offset,
            size: size.bytes,
            elements: size.elements,
        });
        offset = offset
            .checked_add(align_up(size.bytes, alignment))
            .ok_or_else(|| fail("tensor data exceeds 2^64 bytes".into()))?;
    }
    let mut header = Header {
        version,
        alignment,
        metadata,
        tensors,
        data_offset: 0,
    };
    header.data_offset = align_up(encoded_header_len(&header), alignment);
    Ok(header)
}

fn array_depth(a: &Array) -> usize {
    match a {
        Array::Array(inner) => 1 + inner.iter().map(array_depth).max().unwrap_or(0),
        _ => 1,
    }
}

fn encoded_header_len(header: &Header) -> u64 {
    let mut n = 4 + 4 + 8 + 8;
    for (key, value) in header.metadata.iter() {
        n += 8 + key.len() as u64 + 4 + value_len(value);
    }
    for t in &header.tensors {
        n += 8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4 + 8;
    }
    n
}

fn value_len(value: &Value) -> u64 {
    match value {
        Value::String(s) => 8 + s.len() as u64,
        Value::Array(a) => array_len(a),
        v => v.value_type().min_encoded_size(),
    }
}

fn array_len(a: &Array) -> u64 {
    4 + 8
        + match a {
            Array::String(v) => v.iter().map(|s| 8 + s.len() as u64).sum(),
            Array::Array(v) => v.iter().map(array_len).sum(),
            other => other.len() as u64 * other.element_type().min_encoded_size(),
        }
}

/// Encodes the header: magic, version, counts, metadata and tensor infos, without
/// the padding up to `header.data_offset` (which the writer streams as zeros).
pub(crate) fn encode_header(header: &Header) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&GGUF_MAGIC);
    b.extend_from_slice(&header.version.to_le_bytes());
    b.extend_from_slice(&(header.tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(header.metadata.len() as u64).to_le_bytes());
    for (key, value) in header.metadata.iter() {
        put_str(&mut b, key);
        b.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
        put_value(&mut b, value);
    }
    for t in &header.tensors {
        put_str(&mut b, &t.name);
        b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&t.ty.id().to_le_bytes());
        b.extend_from_slice(&t.offset.to_le_bytes());
    }
    b
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => b.push(*v),
        Value::I8(v) => b.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => b.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => b.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => b.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => b.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => b.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => b.push(u8::from(*v)),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
        Value::U64(v) => b.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => b.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => b.extend_from_slice(&v.to_le_bytes()),
    }
}

fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                b.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => b.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => b.extend(v.iter().map(|&x| u8::from(x))),
        Array::String(v) => v.iter().for_each(|s| put_str(b, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(b, inner)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}

/// Writes a copy of `src` to `out`: the same version, metadata, tensor infos
/// and data, streamed from the source mapping in chunks of at most `chunk`
/// bytes. For any file whose tensors are laid out contiguously in info order
/// (every file written by ggml, gguf-py or memwall) the copy is byte-identical.
pub fn copy_gguf<W: Write>(
    src: &super::GgufFile,
    out: W,
    label: &Path,
    chunk: usize,
) -> Result<W, GgufError> {
    let header = src.header();
    let specs = header.tensors.iter().map(TensorSpec::from).collect();
    let mut w = GgufWriter::new(out, label, header.version, header.metadata.clone(), specs)?;
    for t in &header.tensors {
        for piece in src.tensor_data(t).chunks(chunk.max(1)) {
            w.write_tensor_data(&t.name, piece)?;
        }
    }
    w.finish()
}
