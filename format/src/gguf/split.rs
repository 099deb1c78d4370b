//! Models split over several GGUF files by `llama-gguf-split` (or
//! `convert_hf_to_gguf.py --split-max-size`), opened as one model.
//!
//! Files are named `<prefix>-00001-of-00003.gguf`. Each carries `split.no`
//! (0-based, u16) and `split.count` (u16); the first also carries all model
//! metadata and `split.tensors.count`, the total number of tensors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::TensorInfo;
use super::error::GgufError;
use super::file::{GgufFile, LoadMode};
use super::metadata::{Metadata, keys};

/// The path of split file `index` (0-based) of `count`, as llama.cpp names it.
pub fn split_path(prefix: &str, index: u32, count: u32) -> PathBuf {
    PathBuf::from(format!("{prefix}-{:05}-of-{:05}.gguf", index + 1, count))
}

/// A model in one or more GGUF files.
pub struct GgufModel {
    files: Vec<GgufFile>,
    /// (file index, tensor index in that file), in file then tensor order.
    tensors: Vec<(usize, usize)>,
    by_name: HashMap<String, usize>,
}

impl GgufModel {
    /// Opens `path`, memory-mapped; if it is one file of a split model, opens
    /// all the others too.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        Self::open_with(path, LoadMode::Mmap)
    }

    /// Like [`GgufModel::open`] with a load mode.
    pub fn open_with(path: &Path, mode: LoadMode) -> Result<Self, GgufError> {
        let first = GgufFile::open_with(path, mode)?;
        let split_err = |path: &Path, message: String| GgufError::Split {
            path: path.into(),
            message,
        };
        let split = |file: &GgufFile| -> Result<Option<(u64, u64)>, GgufError> {
            let m = file.metadata();
            let count = m
                .get_u64(keys::SPLIT_COUNT)
                .map_err(|e| split_err(file.path(), e.to_string()))?;
            let no = m
                .get_u64(keys::SPLIT_NO)
                .map_err(|e| split_err(file.path(), e.to_string()))?;
            Ok(match (count, no) {
                (None | Some(0 | 1), _) => None,
                (Some(count), Some(no)) => Some((no, count)),
                (Some(count), None) => {
                    return Err(split_err(
                        file.path(),
                        format!("has split.count = {count} but no split.no"),
                    ));
                }
            })
        };
        let Some((no, count)) = split(&first)? else {
            return Self::from_files(vec![first]).map_err(|m| split_err(path, m));
        };
        if no >= count || count > u64::from(u16::MAX) {
            return Err(split_err(
                path,
                format!("split.no = {no} does not fit split.count = {count}"),
            ));
        }
        let (no, count) = (no as u32, count as u32);
        let text = path.to_string_lossy();
        let suffix = format!("-{:05}-of-{:05}.gguf", no + 1, count);
        let Some(prefix) = text.strip_suffix(&suffix) else {
            return Err(split_err(
                path,
                format!(
                    "is split {} of {count}, but its name does not end in '{suffix}', so the \
                     other files cannot be found; rename it as llama-gguf-split does",
                    no + 1
                ),
            ));
        };
        let mut files = Vec::with_capacity(count as usize);
        let mut first = Some(first);
        for i in 0..count {
            let file = if i == no
                && let Some(first) = first.take()
            {
                first
            } else {
                let p = split_path(prefix, i, count);
                if !p.exists() {
                    return Err(split_err(
                        &p,
                        format!(
                            "split file {} of {count} is missing (opened {})",
                            i + 1,
                            text
                        ),
                    ));
                }
                GgufFile::open_with(&p, mode)?
            };
            match split(&file)? {
                Some((n, c)) if n == u64::from(i) && c == u64::from(count) => {}
                found => {
                    return Err(split_err(
                        file.path(),
                        format!(
                            "expected split.no = {i} and split.count = {count}, found {}",
                            found.map_or("no split keys".into(), |(n, c)| format!("{n} and {c}"))
                        ),
                    ));
                }
            }
            files.push(file);
        }
        let first_path = files[0].path().to_owned();
        let expected = files[0]
            .metadata()
            .get_u64(keys::SPLIT_TENSORS_COUNT)
            .map_err(|e| split_err(&first_path, e.to_string()))?;
        let model = Self::from_files(files).map_err(|m| split_err(&first_path, m))?;
        if let Some(expected) = expected {
            if expected != model.tensors.len() as u64 {
                return Err(split_err(
                    &first_path,
                    format!(
                        "split.tensors.count is {expected}, but the {count} files hold {} tensors",
                        model.tensors.len()
                    ),
                ));
            }
        }
        Ok(model)
    }

    fn from_files(files: Vec<GgufFile>) -> Result<Self, String> {
        let mut tensors = Vec::new();
        let mut by_name = HashMap::new();
        for (f, file) in files.iter().enumerate() {
            for (t, info) in file.tensors().iter().enumerate() {
                if by_name.insert(info.name.clone(), tensors.len()).is_some() {
                    return Err(format!(
                        "tensor '{}' appears in more than one split file (again in {})",
                        info.name,
                        file.path().display()
                    ));
                }
                tensors.push((f, t));
            }
        }
        Ok(GgufModel {
            files,
            tensors,
            by_name,
        })
    }

    /// The files, in split order (one for an unsplit model).
    pub fn files(&self) -> &[GgufFile] {
        &self.files
    }

    /// The model metadata (that of the first file).
    pub fn metadata(&self) -> &Metadata {
        self.files[0].metadata()
    }

    /// The model metadata, to change what readers of the model see (llama.cpp's
    /// `--override-kv`); the files are not changed.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        self.files[0].metadata_mut()
    }

    /// Number of tensors in all files.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// All tensors with the index of the file that holds them, in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = (usize, &TensorInfo)> {
        self.tensors
            .iter()
            .map(|&(f, t)| (f, &self.files[f].tensors()[t]))
    }

    /// Tensor `name`: its info and its data.
    pub fn tensor(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        let &(f, t) = self.tensors.get(*self.by_name.get(name)?)?;
        let file = &self.files[f];
        let info = &file.tensors()[t];
        Some((info, file.tensor_data(info)))
    }

    /// Releases the pages of a byte range of tensor `name`'s data (see
    /// [`GgufFile::release`]).
    pub fn release(&self, name: &str, range: std::ops::Range<u64>) {
        if let Some(&(f, t)) = self.by_name.get(name).and_then(|&i| self.tensors.get(i)) {
            let file = &self.files[f];
            file.release(&file.tensors()[t], range);
        }
    }

    /// Sum of the file sizes.
    pub fn total_file_size(&self) -> u64 {
        self.files.iter().map(GgufFile::file_size).sum()
    }

    /// Whether every file is memory-mapped (not read into memory).
    pub fn is_mapped(&self) -> bool {
        self.files.iter().all(GgufFile::is_mapped)
    }

    /// Where `data` (a slice of this model's bytes) lies: the index of its
    /// file in [`GgufModel::files`] and its offset in that file.
    pub fn locate(&self, data: &[u8]) -> Option<(usize, u64)> {
        self.files.iter().enumerate().find_map(|(i, f)| {
            let b = f.bytes();
            let (base, start) = (b.as_ptr() as usize, data.as_ptr() as usize);
            (start >= base && start + data.len() <= base + b.len())
                .then_some((i, (start - base) as u64))
        })
    }
}
