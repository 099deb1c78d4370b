//! Importance matrices as `llama-imatrix` writes them: the GGUF format (one
//! `<tensor>.in_sum2` and one `<tensor>.counts` F32 tensor per weight, plus
//! `imatrix.*` metadata) and the legacy `.dat` format. Both become, per
//! weight tensor, the mean squared activation of each input column (per
//! expert for 3-D tensors), which is what the weighted encoders take.
//!
//! Source: `common/imatrix-loader.cpp` and `tools/quantize/quantize.cpp`
//! (`load_imatrix`) of llama.cpp 0c1e570.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memwall_format::GgmlType;
use memwall_format::gguf::{FormatError, GGUF_MAGIC, MetadataError, parse};

/// Why an importance matrix could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ImatrixError {
    /// Reading the file failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The file is not a valid imatrix.
    #[error("{path}: {error}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: ImatrixFormatError,
    },
}

/// What is wrong with the bytes of an importance matrix.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ImatrixFormatError {
    /// The GGUF container is invalid.
    #[error(transparent)]
    Gguf(#[from] FormatError),
    /// A metadata key has a value of the wrong type.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// A GGUF file without the `imatrix.*` keys.
    #[error(
        "missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, \
         imatrix.chunk_size): is this an imatrix from llama-imatrix?"
    )]
    NotAnImatrix,
    /// A required `imatrix.*` key is absent.
    #[error("{key} missing")]
    MissingKey {
        /// The key.
        key: &'static str,
    },
    /// A GGUF imatrix without tensors.
    #[error("no data: the file has no tensors")]
    NoTensors,
    /// A tensor that is not F32.
    #[error("tensor {tensor} is {ty}; imatrix tensors must be F32")]
    NotF32 {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
    },
    /// A tensor whose data is not in the file.
    #[error("tensor {tensor} lies beyond the end of the file")]
    BeyondEnd {
        /// The tensor.
        tensor: String,
    },
    /// A weight with sums but no counts, or counts but no sums.
    #[error("mismatched sums and counts for {name}")]
    Unpaired {
        /// The weight tensor.
        name: String,
    },
    /// An `in_sum2` tensor without values.
    #[error("{name}: the in_sum2 tensor has no values")]
    NoSums {
        /// The weight tensor.
        name: String,
    },
    /// The sums are not a whole number per expert.
    #[error("{name}: {sums} sums do not split into {experts} experts")]
    ExpertSplit {
        /// The weight tensor.
        name: String,
        /// Values of its `in_sum2` tensor.
        sums: usize,
        /// Values of its `counts` tensor.
        experts: usize,
    },
    /// A GGUF file with tensors, none of them imatrix data.
    #[error("no data: no tensor is named <weight>.in_sum2 or <weight>.counts")]
    NoEntries,
    /// A legacy file with no entries.
    #[error("no data in file (not an imatrix, or an empty one)")]
    Empty,
    /// A legacy entry with fewer than one value.
    #[error("entry {name} has {count} values")]
    ValueCount {
        /// The entry.
        name: String,
        /// Its value count.
        count: i32,
    },
    /// A legacy file that ends early.
    #[error("file ends while reading the {what} (at byte {at}, {needed} bytes needed)")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where.
        at: usize,
        /// Bytes it needs.
        needed: usize,
    },
    /// A negative length in a legacy file.
    #[error("negative {what}: {value}")]
    NegativeLength {
        /// What the length is of.
        what: String,
        /// The length.
        value: i32,
    },
    /// A NaN or infinite value.
    #[error("entry {name} has a non-finite value at index {index}")]
    NonFinite {
        /// The entry.
        name: String,
        /// The value's index.
        index: usize,
    },
    /// A negative value.
    #[error(
        "entry {name} has a negative value ({value}) at index {index}; \
         importance values are means of squared activations"
    )]
    Negative {
        /// The entry.
        name: String,
        /// The value's index.
        index: usize,
        /// The value.
        value: f32,
    },
}

/// One file's importance data, normalised as `llama-quantize` normalises it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imatrix {
    /// Per weight tensor: mean squared activation per input column, `ne[0]`
    /// values per expert.
    pub entries: BTreeMap<String, Vec<f32>>,
    /// Names of the calibration texts (`imatrix.datasets`).
    pub datasets: Vec<String>,
    /// Chunks of calibration text the sums cover (`imatrix.chunk_count`).
    pub chunk_count: u32,
    /// Tokens per chunk (`imatrix.chunk_size`, 0 for legacy files).
    pub chunk_size: u32,
    /// Read from the legacy `.dat` format.
    pub legacy: bool,
}

impl Imatrix {
    /// Reads a GGUF or legacy imatrix file.
    pub fn load(path: &Path) -> Result<Imatrix, ImatrixError> {
        let bytes = std::fs::read(path).map_err(|error| ImatrixError::Io {
            path: path.to_owned(),
            error,
        })?;
        let result = if bytes.starts_with(&GGUF_MAGIC) {
            Self::from_gguf(&bytes)
        } else {
            Self::from_legacy(&bytes)
        };
        let format = |error| ImatrixError::Format {
            path: path.to_owned(),
            error,
        };
        let imatrix = result.map_err(format)?;
        for (name, values) in &imatrix.entries {
            if let Some(index) = values.iter().position(|v| !v.is_finite()) {
                return Err(format(ImatrixFormatError::NonFinite {
                    name: name.clone(),
                    index,
                }));
            }
            // Means of squares cannot be negative; a negative weight would
            // turn the encoders' weighted least squares into nonsense.
            if let Some(index) = values.iter().position(|v| *v < 0.0) {
                return Err(format(ImatrixFormatError::Negative {
                    name: name.clone(),
                    index,
                    value: values[index],
                }));
            }
        }
        Ok(imatrix)
    }

    /// Parses the GGUF format: sums divided by each expert's token count (1
    /// where the count is 0).
    pub fn from_gguf(bytes: &[u8]) -> Result<Imatrix, ImatrixFormatError> {
        let header = parse(bytes)?;
        let meta = &header.metadata;
        let has = |k: &str| meta.contains(k);
        if !(has("imatrix.datasets") && has("imatrix.chunk_count") && has("imatrix.chunk_size")) {
            return Err(ImatrixFormatError::NotAnImatrix);
        }
        let u32_key = |key: &'static str| -> Result<u32, ImatrixFormatError> {
            meta.get_u32(key)?
                .ok_or(ImatrixFormatError::MissingKey { key })
        };
        let datasets = meta
            .get_str_array("imatrix.datasets")?
            .map(<[String]>::to_vec)
            .unwrap_or_default();
        let chunk_count = u32_key("imatrix.chunk_count")?;
        let chunk_size = u32_key("imatrix.chunk_size")?;
        if header.tensors.is_empty() {
            return Err(ImatrixFormatError::NoTensors);
        }
        let data_at =
            |t: &memwall_format::gguf::TensorInfo| -> Result<Vec<f32>, ImatrixFormatError> {
                if t.ty != GgmlType::F32 {
                    return Err(ImatrixFormatError::NotF32 {
                        tensor: t.name.clone(),
                        ty: t.ty,
                    });
                }
                let start = header.data_offset + t.offset;
                let end = start + t.size;
                let slice = bytes.get(start as usize..end as usize).ok_or_else(|| {
                    ImatrixFormatError::BeyondEnd {
                        tensor: t.name.clone(),
                    }
                })?;
                Ok(slice
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect())
            };
        let mut pairs: BTreeMap<&str, (Option<&_>, Option<&_>)> = BTreeMap::new();
        for t in &header.tensors {
            if let Some(name) = t.name.strip_suffix(".in_sum2") {
                pairs.entry(name).or_default().0 = Some(t);
            } else if let Some(name) = t.name.strip_suffix(".counts") {
                pairs.entry(name).or_default().1 = Some(t);
            }
        }
        let mut entries = BTreeMap::new();
        for (name, pair) in pairs {
            let (Some(sums), Some(counts)) = pair else {
                return Err(ImatrixFormatError::Unpaired {
                    name: name.to_owned(),
                });
            };
            let sums = data_at(sums)?;
            let counts = data_at(counts)?;
            // A tensor may have a zero dimension; there is nothing to split then.
            if sums.is_empty() {
                return Err(ImatrixFormatError::NoSums {
                    name: name.to_owned(),
                });
            }
            if counts.is_empty() || sums.len() % counts.len() != 0 {
                return Err(ImatrixFormatError::ExpertSplit {
                    name: name.to_owned(),
                    sums: sums.len(),
                    experts: counts.len(),
                });
            }
            let per_expert = sums.len() / counts.len();
            let mut values = Vec::with_capacity(sums.len());
            for (chunk, &count) in sums.chunks_exact(per_expert).zip(&counts) {
                // ggml rounds the stored count to an integer (lround), then divides in f32.
                let count = count.round() as i64 as f32;
                if count > 0.0 {
                    values.extend(chunk.iter().map(|s| s / count));
                } else {
                    values.extend(std::iter::repeat_n(1.0, per_expert));
                }
            }
            entries.insert(name.to_owned(), values);
        }
        // As for a legacy file: an imatrix without entries is not one.
        if entries.is_empty() {
            return Err(ImatrixFormatError::NoEntries);
        }
        Ok(Imatrix {
            entries,
            datasets,
            chunk_count,
            chunk_size,
            legacy: false,
        })
    }

    /// Parses the legacy `.dat` format: for each entry a name, the number of
    /// calls and the values, which are divided by the number of calls.
    pub fn from_legacy(bytes: &[u8]) -> Result<Imatrix, ImatrixFormatError> {
        let mut r = Cursor { bytes, at: 0 };
        let n_entries = r.i32("entry count")?;
        if n_entries < 1 {
            return Err(ImatrixFormatError::Empty);
        }
        let mut entries = BTreeMap::new();
        for i in 0..n_entries {
            let len = r.len(&format!("name length of entry {}", i + 1))?;
            let name = r.take(len, "name")?;
            let name = String::from_utf8_lossy(name)
                .split('\0')
                .next()
                .unwrap_or_default()
                .to_owned();
            let ncall = r.i32("call count")?;
            let nval = r.i32("value count")?;
            if nval < 1 {
                return Err(ImatrixFormatError::ValueCount { name, count: nval });
            }
            let raw = r.take(nval as usize * 4, &format!("values of entry {name}"))?;
            let values = raw.chunks_exact(4).map(|b| {
                let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if ncall > 0 { v / ncall as f32 } else { v }
            });
            entries.insert(name, values.collect());
        }
        let mut imatrix = Imatrix {
            entries,
            legacy: true,
            ..Imatrix::default()
        };
        // Optional trailer: chunk count, then the dataset name.
        if r.at < bytes.len() {
            if let Ok(n) = r.i32("chunk count") {
                imatrix.chunk_count = n.max(0) as u32;
                if let Ok(len) = r.len("dataset name length") {
                    if let Ok(name) = r.take(len, "dataset name") {
                        if len > 0 {
                            imatrix
                                .datasets
                                .push(String::from_utf8_lossy(name).into_owned());
                        }
                    }
                }
            }
        }
        Ok(imatrix)
    }

    /// Keeps only entries whose name contains one of `include` (when not
    /// empty) and drops those containing one of `exclude`, as
    /// `--include-weights` / `--exclude-weights` do.
    pub fn filter(&mut self, include: &[String], exclude: &[String]) {
        self.entries.retain(|name, _| {
            (include.is_empty() || include.iter().any(|p| name.contains(p.as_str())))
                && !exclude.iter().any(|p| name.contains(p.as_str()))
        });
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ImatrixFormatError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| ImatrixFormatError::Truncated {
                what: what.to_owned(),
                at: self.at,
                needed: n,
            })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn i32(&mut self, what: &str) -> Result<i32, ImatrixFormatError> {
        let b = self.take(4, what)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn len(&mut self, what: &str) -> Result<usize, ImatrixFormatError> {
        let n = self.i32(what)?;
        usize::try_from(n).map_err(|_| ImatrixFormatError::NegativeLength {
            what: what.to_owned(),
            value: n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy_file(entries: &[(&str, i32, &[f32])], trailer: Option<(i32, &str)>) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((entries.len() as i32).to_le_bytes());
        for (name, ncall, values) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((values.len() as i32).to_le_bytes());
            for v in *values {
                b.extend(v.to_le_bytes());
            }
        }
        if let Some((chunks, dataset)) = trailer {
            b.extend(chunks.to_le_bytes());
            b.extend((dataset.len() as i32).to_le_bytes());
            b.extend(dataset.as_bytes());
        }
        b
    }

    #[test]
    fn legacy_values_are_divided_by_calls() {
        let file = legacy_file(
            &[("blk.0.attn_q.weight", 4, &[4.0, 8.0]), ("x", 0, &[3.0])],
            Some((10, "wiki.txt")),
        );
        let m = Imatrix::from_legacy(&file).unwrap();
        assert_eq!(m.entries["blk.0.attn_q.weight"], [1.0, 2.0]);
        assert_eq!(m.entries["x"], [3.0]);
        assert_eq!(m.chunk_count, 10);
        assert_eq!(m.datasets, ["wiki.txt"]);
        assert!(m.legacy);
    }

    #[test]
    fn legacy_truncation_is_an_error_not_a_panic() {
        let file = legacy_file(&[("blk.0.attn_q.weight", 4, &[4.0, 8.0])], None);
        for cut in 0..file.len() {
            assert!(Imatrix::from_legacy(&file[..cut]).is_err(), "cut at {cut}");
        }
        // A huge value count must not allocate.
        let mut hostile = legacy_file(&[("a", 1, &[1.0])], None);
        hostile[13..17].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(
            Imatrix::from_legacy(&hostile)
                .unwrap_err()
                .to_string()
                .contains("file ends")
        );
    }

    #[test]
    fn filters_work_like_llama_quantize() {
        let mut m = Imatrix::default();
        for n in [
            "blk.0.attn_q.weight",
            "blk.0.ffn_down.weight",
            "output.weight",
        ] {
            m.entries.insert(n.into(), vec![1.0]);
        }
        let mut inc = m.clone();
        inc.filter(&["attn".into()], &[]);
        assert_eq!(
            inc.entries.keys().collect::<Vec<_>>(),
            ["blk.0.attn_q.weight"]
        );
        m.filter(&[], &["ffn".into(), "output".into()]);
        assert_eq!(
            m.entries.keys().collect::<Vec<_>>(),
            ["blk.0.attn_q.weight"]
        );
    }
}
