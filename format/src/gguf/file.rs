//! A GGUF file opened for reading, memory-mapped or read into memory.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::GgufError;
use super::metadata::Metadata;
use super::read::parse;
use super::{Header, TensorInfo};

/// How a file's bytes are brought into memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadMode {
    /// Memory-map the file (default): tensor data is paged in on first use.
    #[default]
    Mmap,
    /// Read the whole file into memory (`--no-mmap`).
    Read,
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file whose tensor data is available as zero-copy slices.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    header: Header,
    by_name: HashMap<String, usize>,
}

impl GgufFile {
    /// Opens and memory-maps `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        Self::open_with(path, LoadMode::Mmap)
    }

    /// Opens `path` with the given load mode.
    pub fn open_with(path: &Path, mode: LoadMode) -> Result<Self, GgufError> {
        let io = |error| GgufError::Io {
            path: path.to_owned(),
            error,
        };
        let mut file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let bytes = if mode == LoadMode::Read || len == 0 {
            let mut v = Vec::new();
            file.read_to_end(&mut v).map_err(io)?;
            Bytes::Owned(v)
        } else {
            // SAFETY: the mapping is read-only and memwall never writes to its
            // inputs. Another process truncating or rewriting the file while it is
            // mapped would change or invalidate the bytes under us (SIGBUS on
            // access past a truncation); that is the documented contract of
            // opening a model with mmap, as in llama.cpp.
            Bytes::Mapped(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        Self::from_bytes(path, bytes)
    }

    /// Parses a file image held in memory; `label` names it in messages.
    pub fn from_vec(label: &Path, bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_bytes(label, Bytes::Owned(bytes))
    }

    fn from_bytes(path: &Path, bytes: Bytes) -> Result<Self, GgufError> {
        let header = parse(bytes.as_slice()).map_err(|error| GgufError::Format {
            path: path.to_owned(),
            error,
        })?;
        let by_name = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path: path.to_owned(),
            bytes,
            header,
            by_name,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// Whether the data is memory-mapped.
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(_))
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// The metadata, to change what readers of this file see (llama.cpp's
    /// `--override-kv`); the file itself is not changed.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.header.metadata
    }

    /// The tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The info of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.header.tensors[i])
    }

    /// The data of a tensor of this file, as a slice of the mapping.
    ///
    /// # Panics
    /// If `info` is not one of this file's tensor infos (its range was checked
    /// against the file when it was parsed).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + info.offset) as usize;
        &self.bytes.as_slice()[start..start + info.size as usize]
    }

    /// Tells the OS that the pages of a tensor's data will not be needed again
    /// soon, so that a pass over a large model does not keep all of it
    /// resident. The data stays valid: a later access reads it in again. No-op
    /// for files read into memory and on non-Unix systems.
    /// `range` is a byte range within the tensor's data (clipped to it).
    pub fn release(&self, info: &TensorInfo, range: std::ops::Range<u64>) {
        let end = range.end.min(info.size);
        let begin = range.start.min(end);
        #[cfg(unix)]
        if let Bytes::Mapped(m) = &self.bytes {
            let start = (self.header.data_offset + info.offset + begin) as usize;
            // SAFETY: the mapping is a read-only view of a file memwall does not
            // modify; MADV_DONTNEED drops its pages, which are read back from the
            // file (unchanged) on the next access, so every slice handed out
            // keeps its contents. The range lies inside the mapping (checked
            // when the header was parsed). Failure only means the pages stay.
            let _ = unsafe {
                m.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    (end - begin) as usize,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = (info, begin);
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }
}
