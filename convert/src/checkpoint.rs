//! A Hugging Face checkpoint on disk: `config.json` and the safetensors
//! weights, one file or shards listed by `model.safetensors.index.json`.
//! Shards are memory-mapped; their headers are validated by the `safetensors`
//! crate (offsets inside the file, no overlaps, known dtypes).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

/// Why a checkpoint could not be read. Every variant names the file or tensor.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be opened or read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// A file is not what it should be.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Element types memwall reads from checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceType {
    /// IEEE single.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
}

impl SourceType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            SourceType::F32 => 4,
            SourceType::F16 | SourceType::BF16 => 2,
        }
    }
}

/// One tensor of the checkpoint.
#[derive(Clone, Debug)]
pub struct SourceTensor {
    /// Hugging Face name.
    pub name: String,
    /// Element type.
    pub ty: SourceType,
    /// PyTorch shape (outermost first).
    pub shape: Vec<usize>,
    /// Index of the shard that holds it.
    pub shard: usize,
    /// Byte range in the shard file.
    pub range: std::ops::Range<usize>,
}

impl SourceTensor {
    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// An opened checkpoint.
pub struct Checkpoint {
    dir: PathBuf,
    config: serde_json::Value,
    shards: Vec<(PathBuf, Mmap)>,
    /// Tensors in llama.cpp's reading order: shards by file name, names sorted within each.
    tensors: Vec<SourceTensor>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |error| CheckpointError::Io {
        path: path.to_owned(),
        error,
    }
}

fn invalid(path: &Path, message: impl Into<String>) -> CheckpointError {
    CheckpointError::Invalid {
        path: path.to_owned(),
        message: message.into(),
    }
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
        let mut config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| invalid(&config_path, format!("not valid JSON: {e}")))?;
        if !config.is_object() {
            return Err(invalid(&config_path, "must hold a JSON object"));
        }
        crate::hf_config::with_defaults(&mut config);
        crate::hf_config::flatten_text_config(&mut config);
        let index_path = dir.join("model.safetensors.index.json");
        let (shard_names, index) = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(io(&index_path))?;
            let index: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| invalid(&index_path, format!("not valid JSON: {e}")))?;
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| invalid(&index_path, "has no weight_map object"))?;
            let mut by_tensor = BTreeMap::new();
            for (tensor, file) in map {
                let file = file
                    .as_str()
                    .filter(|f| {
                        !f.contains('/') && !f.contains('\\') && f.ends_with(".safetensors")
                    })
                    .ok_or_else(|| {
                        invalid(
                            &index_path,
                            format!("weight_map[{tensor}] is not a .safetensors file name"),
                        )
                    })?;
                by_tensor.insert(tensor.clone(), file.to_owned());
            }
            let names: BTreeSet<String> = by_tensor.values().cloned().collect();
            (names.into_iter().collect::<Vec<_>>(), Some(by_tensor))
        } else if dir.join("model.safetensors").exists() {
            (vec!["model.safetensors".to_owned()], None)
        } else {
            return Err(invalid(
                dir,
                "no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are supported)",
            ));
        };
        let mut shards = Vec::new();
        let mut tensors = Vec::new();
        for (i, name) in shard_names.iter().enumerate() {
            let path = dir.join(name);
            let file = File::open(&path).map_err(io(&path))?;
            // SAFETY: read-only mapping of a checkpoint memwall never writes; a
            // concurrent truncation by another process is outside the contract,
            // as for every mmap-based model loader.
            let map = unsafe { Mmap::map(&file) }.map_err(io(&path))?;
            let st = SafeTensors::deserialize(&map)
                .map_err(|e| invalid(&path, format!("not a valid safetensors file: {e}")))?;
            let base = map.as_ptr() as usize;
            let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
            names.sort();
            for tname in names {
                let view = st
                    .tensor(&tname)
                    .map_err(|e| invalid(&path, e.to_string()))?;
                let ty = match view.dtype() {
                    Dtype::F32 => SourceType::F32,
                    Dtype::F16 => SourceType::F16,
                    Dtype::BF16 => SourceType::BF16,
                    other => {
                        return Err(invalid(
                            &path,
                            format!(
                                "tensor {tname} has dtype {other:?}; memwall reads F32, F16 and BF16"
                            ),
                        ));
                    }
                };
                let start = view.data().as_ptr() as usize - base;
                tensors.push(SourceTensor {
                    name: tname,
                    ty,
                    shape: view.shape().to_vec(),
                    shard: i,
                    range: start..start + view.data().len(),
                });
            }
            shards.push((path, map));
        }
        // A name in two shards would make the checkpoint ambiguous (and the
        // index check below blind to it: it sees one shard per name).
        // llama.cpp's converter stops there too ("Duplicated tensor name").
        let mut first_shard: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &tensors {
            if let Some(&first) = first_shard.get(t.name.as_str()) {
                return Err(invalid(
                    &dir.join(&shard_names[t.shard]),
                    format!("tensor {} is also in {}", t.name, shard_names[first]),
                ));
            }
            first_shard.insert(&t.name, t.shard);
        }
        if let Some(index) = index {
            let found: BTreeMap<&str, &str> = tensors
                .iter()
                .map(|t| (t.name.as_str(), shard_names[t.shard].as_str()))
                .collect();
            let missing: Vec<&str> = index
                .keys()
                .filter(|k| !found.contains_key(k.as_str()))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                return Err(invalid(
                    &index_path,
                    format!("lists tensors no shard holds: {}", missing.join(", ")),
                ));
            }
            let extra: Vec<&str> = found
                .iter()
                .filter(|(t, f)| index.get(**t).map(String::as_str) != Some(**f))
                .map(|(t, _)| *t)
                .collect();
            if !extra.is_empty() {
                return Err(invalid(
                    &index_path,
                    format!(
                        "does not list (or lists in another shard) tensors: {}",
                        extra.join(", ")
                    ),
                ));
            }
        }
        Ok(Checkpoint {
            dir: dir.to_owned(),
            config,
            shards,
            tensors,
        })
    }

    /// The checkpoint folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json`, with the keys it leaves out filled as transformers fills
    /// them ([`crate::hf_config`]).
    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// All tensors, in the order llama.cpp's converter reads them.
    pub fn tensors(&self) -> &[SourceTensor] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&SourceTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor.
    pub fn data(&self, t: &SourceTensor) -> &[u8] {
        &self.shards[t.shard].1[t.range.clone()]
    }

    /// Tells the OS a tensor's input pages are done with (`MADV_DONTNEED`), so
    /// that a pass over a large checkpoint does not keep it all resident. The
    /// data stays valid: a later access reads it again. No-op off Unix.
    pub fn release(&self, t: &SourceTensor) {
        self.release_range(t, 0..t.range.len());
    }

    /// [`Checkpoint::release`] for a byte range of the tensor's data (clipped to it).
    pub fn release_range(&self, t: &SourceTensor, range: std::ops::Range<usize>) {
        let end = range.end.min(t.range.len());
        let start = range.start.min(end);
        #[cfg(unix)]
        {
            let map = &self.shards[t.shard].1;
            // SAFETY: a read-only mapping of a file memwall does not modify: dropped
            // pages are read back unchanged on the next access, so every slice
            // handed out keeps its contents. The range lies inside the mapping.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    t.range.start + start,
                    end - start,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = (t, start);
    }

    /// The file holding a tensor.
    pub fn shard_path(&self, t: &SourceTensor) -> &Path {
        &self.shards[t.shard].0
    }
}
