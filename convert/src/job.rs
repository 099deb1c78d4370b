//! A whole conversion: the GGUF file llama.cpp's converter writes for a
//! checkpoint — `general.*` keys, hyper-parameters, tokenizer, tensors — written
//! atomically (`<out>.partial`, fsync, rename) in bounded memory.

use std::path::{Path, PathBuf};

use memwall_format::gguf::{GgufWriter, Metadata, TensorSpec, Value, split_path};
use memwall_format::progress::{Progress, Unit};

use crate::arch::{Arch, UnsupportedArch};
use crate::checkpoint::Checkpoint;
use crate::metadata::{ConfigValueError, hparams_with};
use crate::model_card::CardError;
use crate::naming::{naming, parameter_counts};
use crate::tensors::{
    EncodeError, OutType, PlanError, Planned, RowEncoder, encode_into, float_rows, is_float_copy,
    nextn_blocks, plan_with, rows,
};
use crate::validate::MismatchError;
use crate::vocab::{
    VocabError, detect_pre, load_bpe, load_gemma4, load_sentencepiece, write_gemma4_vocab,
    write_vocab,
};

/// Why a conversion failed.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// Reading the checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Writing the output failed.
    #[error(transparent)]
    Gguf(#[from] memwall_format::gguf::GgufError),
    /// The checkpoint cannot be converted as it is.
    #[error("{}: {problem}", dir.display())]
    Model {
        /// The checkpoint folder.
        dir: PathBuf,
        /// What is wrong (boxed: the vocabulary's errors are large).
        problem: Box<ModelError>,
    },
}

/// Why a checkpoint cannot be converted as it is ([`ConvertError::Model`],
/// which names the folder).
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `config.json` does not name the architecture.
    #[error("config.json has no architectures list")]
    NoArchitectures,
    /// An architecture memwall does not convert.
    #[error(transparent)]
    Arch(#[from] UnsupportedArch),
    /// The tensors cannot be mapped to GGUF.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The tensors do not match `config.json`.
    #[error(transparent)]
    Mismatch(#[from] MismatchError),
    /// The model card cannot be read.
    #[error(transparent)]
    Card(#[from] CardError),
    /// `generation_config.json` has a sampling value of the wrong type.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// A hyper-parameter of `config.json` is missing or unusable.
    #[error(transparent)]
    Config(#[from] ConfigValueError),
    /// The vocabulary cannot be read, or its pre-tokenizer recognised.
    #[error(transparent)]
    Vocab(#[from] VocabError),
    /// A tensor's rows cannot be read or encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The thread writing the output panicked.
    #[error("the writer thread panicked")]
    WriterPanicked,
    /// A variant of a supported architecture whose extra parts are not
    /// converted yet.
    #[error("{0}")]
    Variant(String),
}

/// A `generation_config.json` sampling value of the wrong type.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A value that must be a (32-bit) integer.
    #[error("{}: {key} must be an integer, got {value}", path.display())]
    NotInteger {
        /// `generation_config.json`.
        path: PathBuf,
        /// The key.
        key: &'static str,
        /// Its value.
        value: serde_json::Value,
    },
    /// A value that must be a number.
    #[error("{}: {key} must be a number, got {value}", path.display())]
    NotNumber {
        /// `generation_config.json`.
        path: PathBuf,
        /// The key.
        key: &'static str,
        /// Its value.
        value: serde_json::Value,
    },
}

/// What to convert to.
pub struct Options<'a> {
    /// Type of the 2-D weights.
    pub outtype: OutType,
    /// `tokenizer.ggml.pre`, the pre-tokenizer llama.cpp should use; `None`
    /// recognises it from the tokenizer as llama.cpp does.
    pub pre: Option<String>,
    /// Encoder for quantized output types (Q8_0).
    pub encode: &'a RowEncoder,
    /// Write NaN/Inf weights instead of refusing them.
    pub allow_nonfinite: bool,
    /// Largest output file in bytes (tensor data), as `--split-max-size`; `None` for one file.
    pub split_max_size: Option<u64>,
    /// Leave out a hybrid checkpoint's multi-token-prediction blocks
    /// (llama.cpp's `--no-mtp`).
    pub no_mtp: bool,
}

/// The planned output: metadata and tensors.
pub struct Conversion {
    /// Metadata in llama.cpp's order.
    pub metadata: Metadata,
    /// Tensors in llama.cpp's order.
    pub tensors: Vec<Planned>,
}

/// Gemma 4's E2B and E4B add per-layer token embeddings and layers that
/// read another layer's KV cache: refused by name until they are converted.
fn gemma4_variant(config: &serde_json::Value) -> Result<(), ModelError> {
    let num = |key: &str| {
        config
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let (ple, shared) = (
        num("hidden_size_per_layer_input"),
        num("num_kv_shared_layers"),
    );
    if ple > 0 || shared > 0 {
        return Err(ModelError::Variant(format!(
            "Gemma 4 with per-layer token embeddings (hidden_size_per_layer_input = {ple}) or \
             layers sharing a KV cache (num_kv_shared_layers = {shared}) — the E2B and E4B \
             models — is not converted yet; the 31B and the 26B-A4B are"
        )));
    }
    Ok(())
}

/// Plans the conversion of the checkpoint in `dir`.
pub fn prepare(ckpt: &Checkpoint, options: &Options) -> Result<Conversion, ConvertError> {
    let model_err = |problem: ModelError| ConvertError::Model {
        dir: ckpt.dir().to_owned(),
        problem: Box::new(problem),
    };
    let class = ckpt.config()["architectures"][0]
        .as_str()
        .ok_or_else(|| model_err(ModelError::NoArchitectures))?;
    let arch: &Arch = Arch::for_class(class).map_err(|e| model_err(e.into()))?;
    if arch.gemma {
        gemma4_variant(ckpt.config()).map_err(model_err)?;
    }
    let tensors =
        plan_with(ckpt, arch, options.outtype, !options.no_mtp).map_err(|e| model_err(e.into()))?;
    crate::validate::validate(ckpt, arch, &tensors).map_err(|e| model_err(e.into()))?;
    let counts = parameter_counts(tensors.iter().map(|p| (p.name.as_str(), p.dims.as_slice())));
    let card =
        crate::model_card::load(ckpt.dir(), counts.0 as i64).map_err(|e| model_err(e.into()))?;
    let names = naming(ckpt.dir(), ckpt.config(), counts, &card);
    let mut meta = Metadata::new();
    meta.set("general.architecture", arch.gguf);
    meta.set("general.type", "model");
    sampling(&mut meta, ckpt.dir()).map_err(|e| model_err(e.into()))?;
    general_keys(&mut meta, &names, &card);
    let nextn = if options.no_mtp {
        0
    } else {
        nextn_blocks(ckpt, arch)
    };
    hparams_with(
        &mut meta,
        ckpt.config(),
        arch,
        options.outtype,
        nextn as u32,
    )
    .map_err(|e| model_err(e.into()))?;
    // llama.cpp's LlamaModel and Qwen2Model (Qwen3Model) try tokenizer.model first.
    let sentencepiece = matches!(arch.gguf, "llama" | "qwen2" | "qwen3")
        && ckpt.dir().join("tokenizer.model").is_file();
    let vocab_err = |e: VocabError| model_err(e.into());
    if arch.gemma {
        let v = load_gemma4(ckpt.dir(), ckpt.config()).map_err(vocab_err)?;
        write_gemma4_vocab(&mut meta, &v);
        return Ok(Conversion {
            metadata: meta,
            tensors,
        });
    }
    let (vocab, pre) = if sentencepiece {
        let v = load_sentencepiece(ckpt.dir(), ckpt.config(), arch.gguf).map_err(vocab_err)?;
        (v, "default".to_owned())
    } else {
        let v = load_bpe(ckpt.dir(), ckpt.config(), arch.gguf).map_err(vocab_err)?;
        let pre = match &options.pre {
            Some(p) => p.clone(),
            None => detect_pre(ckpt.dir()).map_err(vocab_err)?,
        };
        (v, pre)
    };
    write_vocab(&mut meta, &vocab, &pre);
    if arch.gguf == "llama" {
        llama_vocab_quirks(&mut meta, ckpt.config());
    }
    Ok(Conversion {
        metadata: meta,
        tensors,
    })
}

/// The `general.*` keys of the model's identity, in gguf-py's
/// `set_gguf_meta_model` order: naming, description, license, source, base
/// models, datasets, tags, languages.
fn general_keys(
    meta: &mut Metadata,
    names: &crate::naming::Naming,
    card: &crate::model_card::Card,
) {
    let put = |meta: &mut Metadata, key: &str, value: &Option<String>| {
        if let Some(v) = value {
            meta.set(key, Value::String(v.clone()));
        }
    };
    put(meta, "general.name", &names.name);
    put(meta, "general.author", &card.author);
    put(meta, "general.version", &names.version);
    put(meta, "general.organization", &names.organization);
    put(meta, "general.finetune", &names.finetune);
    put(meta, "general.basename", &names.basename);
    put(meta, "general.description", &card.description);
    put(meta, "general.size_label", &names.size_label);
    put(meta, "general.license", &card.license);
    put(meta, "general.license.name", &card.license_name);
    put(meta, "general.license.link", &card.license_link);
    for (suffix, value) in ["url", "doi", "uuid", "repo_url"].iter().zip(&card.source) {
        put(meta, &format!("general.source.{suffix}"), value);
    }
    for (group, list) in [
        ("base_model", &card.base_models),
        ("dataset", &card.datasets),
    ] {
        let Some(list) = list else { continue };
        meta.set(
            format!("general.{group}.count"),
            Value::U32(list.len() as u32),
        );
        for (i, s) in list.iter().enumerate() {
            let fields = [
                ("name", &s.name),
                ("author", &s.author),
                ("version", &s.version),
                ("organization", &s.organization),
                ("description", &s.description),
                ("url", &s.url),
                ("doi", &s.doi),
                ("uuid", &s.uuid),
                ("repo_url", &s.repo_url),
            ];
            for (field, value) in fields {
                put(meta, &format!("general.{group}.{i}.{field}"), value);
            }
        }
    }
    for (key, list) in [
        ("general.tags", &card.tags),
        ("general.languages", &card.languages),
    ] {
        if let Some(list) = list {
            meta.set(
                key,
                Value::Array(memwall_format::gguf::Array::String(list.clone())),
            );
        }
    }
}

/// What llama.cpp's `LlamaModel.set_vocab` adds after the vocabulary: CodeLlama's
/// infill tokens (vocabulary 32016) and, for vocabulary 49152 (Granite's small
/// models), `add_bos_token` forced to false (overwriting the value in place).
fn llama_vocab_quirks(meta: &mut Metadata, config: &serde_json::Value) {
    match config.get("vocab_size").and_then(|v| v.as_u64()) {
        Some(32016) => {
            for (key, id) in [
                ("prefix", 32007u32),
                ("suffix", 32008),
                ("middle", 32009),
                ("eot", 32010),
            ] {
                meta.set(format!("tokenizer.ggml.{key}_token_id"), Value::U32(id));
            }
        }
        Some(49152) => {
            meta.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
        }
        _ => {}
    }
}

/// The `general.sampling.*` keys gguf-py takes from `generation_config.json`, in its order.
fn sampling(meta: &mut Metadata, dir: &Path) -> Result<(), SamplingError> {
    let path = dir.join("generation_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    // gguf-py ignores a generation config that is not valid JSON.
    let Ok(serde_json::Value::Object(g)) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Ok(());
    };
    let get = |k: &str| g.get(k).filter(|v| !v.is_null());
    let int = |k: &'static str| -> Result<Option<Value>, SamplingError> {
        get(k)
            .map(|v| {
                v.as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .map(Value::I32)
                    .ok_or_else(|| SamplingError::NotInteger {
                        path: path.clone(),
                        key: k,
                        value: v.clone(),
                    })
            })
            .transpose()
    };
    let float =
        |v: Option<&serde_json::Value>, k: &'static str| -> Result<Option<Value>, SamplingError> {
            v.map(|v| {
                v.as_f64()
                    .map(|f| Value::F32(f as f32))
                    .ok_or_else(|| SamplingError::NotNumber {
                        path: path.clone(),
                        key: k,
                        value: v.clone(),
                    })
            })
            .transpose()
        };
    let entries = [
        (
            "sequence",
            get("sequence")
                .and_then(|v| v.as_str())
                .map(|s| Value::String(s.to_owned())),
        ),
        ("top_k", int("top_k")?),
        ("top_p", float(get("top_p"), "top_p")?),
        ("min_p", float(get("min_p"), "min_p")?),
        (
            "xtc_probability",
            float(get("xtc_probability"), "xtc_probability")?,
        ),
        (
            "xtc_threshold",
            float(get("xtc_threshold"), "xtc_threshold")?,
        ),
        ("temp", float(get("temperature"), "temperature")?),
        ("penalty_last_n", int("penalty_last_n")?),
        (
            "penalty_repeat",
            float(
                get("penalty_repeat").or_else(|| get("repetition_penalty")),
                "repetition_penalty",
            )?,
        ),
        ("mirostat", int("mirostat")?),
        ("mirostat_tau", float(get("mirostat_tau"), "mirostat_tau")?),
        ("mirostat_eta", float(get("mirostat_eta"), "mirostat_eta")?),
    ];
    for (name, value) in entries {
        if let Some(v) = value {
            meta.set(format!("general.sampling.{name}"), v);
        }
    }
    Ok(())
}

/// Output rows `[r, r + n)` of `p`, checked and encoded, split over the rayon pool.
fn encode_rows(
    ckpt: &Checkpoint,
    p: &Planned,
    r: u64,
    n: u64,
    options: &Options,
) -> Result<Vec<u8>, EncodeError> {
    use rayon::prelude::*;
    let row_len = p.dims[0].max(1);
    let row_bytes =
        p.ty.tensor_size(&[row_len])
            .map_err(|error| EncodeError::Shape {
                tensor: p.name.clone(),
                error,
            })?
            .bytes as usize;
    let sub = (SUB_WEIGHTS / row_len).max(1) as usize;
    // One buffer for the chunk; each work item fills its rows in place.
    let mut out = vec![0u8; n as usize * row_bytes];
    out.par_chunks_mut(sub * row_bytes)
        .enumerate()
        .try_for_each(|(k, piece)| {
            let start = r + (k * sub) as u64;
            let count = (piece.len() / row_bytes) as u64;
            if is_float_copy(p) {
                return float_rows(ckpt, p, start, count, piece, options.allow_nonfinite);
            }
            let x = rows(ckpt, p, start, count)?;
            if !options.allow_nonfinite {
                if let Some(i) = x.iter().position(|v| !v.is_finite()) {
                    return Err(EncodeError::NonFinite {
                        tensor: p.name.clone(),
                        value: x[i],
                        index: start * p.dims[0] + i as u64,
                    });
                }
            }
            encode_into(p, &x, piece, options.encode)
        })?;
    Ok(out)
}

/// Weights per parallel work item.
const SUB_WEIGHTS: u64 = 256 << 10;

/// Rows converted at a time: bounds memory to a few MiB per tensor piece.
const CHUNK_WEIGHTS: u64 = 4 << 20;

/// A `--split-max-size` that is not a size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid split size {0:?}: a number, optionally followed by K, M or G")]
pub struct SplitSizeError(pub String);

/// Parses llama.cpp's `--split-max-size` (`300M`, `2G`, `500K`, or bytes; powers of 1000).
pub fn parse_split_size(text: &str) -> Result<u64, SplitSizeError> {
    let (digits, unit) = match text.char_indices().last() {
        Some((i, 'K')) => (&text[..i], 1_000),
        Some((i, 'M')) => (&text[..i], 1_000_000),
        Some((i, 'G')) => (&text[..i], 1_000_000_000),
        _ => (text, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| SplitSizeError(text.to_owned()))
}

/// Groups tensors into files as gguf-py does: a new file starts when the
/// current one has a tensor and the next would take it over `max` bytes.
fn shards(tensors: &[Planned], max: Option<u64>) -> Vec<usize> {
    let mut file = 0;
    let mut size = 0u64;
    let mut count = 0;
    tensors
        .iter()
        .map(|p| {
            let bytes = p.ty.tensor_size(&p.dims).map(|s| s.bytes).unwrap_or(0);
            if let Some(max) = max.filter(|&m| m > 0) {
                if count > 0 && size + bytes > max {
                    file += 1;
                    size = 0;
                    count = 0;
                }
            }
            size += bytes;
            count += 1;
            file
        })
        .collect()
}

/// The output paths: `out`, or `<out without extension>-0000i-of-0000n.gguf`.
pub fn output_paths(out: &Path, n: usize) -> Vec<PathBuf> {
    if n <= 1 {
        return vec![out.to_owned()];
    }
    let prefix = out.with_extension("");
    let prefix = prefix.to_string_lossy();
    (0..n)
        .map(|i| split_path(&prefix, i as u32, n as u32))
        .collect()
}

/// Converts the checkpoint in `dir` to `out` (split into several files when
/// `split_max_size` says so). Nothing is left at the output paths on failure.
pub fn convert(
    dir: &Path,
    out: &Path,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Vec<PathBuf>, ConvertError> {
    let ckpt = Checkpoint::open(dir)?;
    let c = prepare(&ckpt, options)?;
    let file_of = shards(&c.tensors, options.split_max_size);
    let n_files = file_of.last().map_or(1, |&f| f + 1);
    let paths = output_paths(out, n_files);
    let mut writers = Vec::with_capacity(n_files);
    for (f, path) in paths.iter().enumerate() {
        let specs: Vec<TensorSpec> = c
            .tensors
            .iter()
            .zip(&file_of)
            .filter(|&(_, &file)| file == f)
            .map(|(p, _)| TensorSpec {
                name: p.name.clone(),
                dims: p.dims.clone(),
                ty: p.ty,
            })
            .collect();
        // gguf-py keeps all keys in the first file; every file gets the split keys.
        let mut meta = if f == 0 {
            c.metadata.clone()
        } else {
            Metadata::new()
        };
        if n_files > 1 {
            meta.set("split.no", Value::U16(f as u16));
            meta.set("split.count", Value::U16(n_files as u16));
            meta.set("split.tensors.count", Value::I32(c.tensors.len() as i32));
        }
        writers.push(GgufWriter::create(path, 3, meta, specs)?);
    }
    let total: u64 = c
        .tensors
        .iter()
        .map(|p| p.dims.iter().product::<u64>())
        .sum();
    progress.start("converting", total, Unit::Items);
    let model_err = |problem: ModelError| ConvertError::Model {
        dir: dir.to_owned(),
        problem: Box::new(problem),
    };
    // Encoding runs on the rayon pool, a writer thread appends finished pieces
    // (two in flight), and input pages are released once converted: memory
    // stays at a few pieces whatever the model's size.
    let writers = std::thread::scope(|scope| -> Result<Vec<GgufWriter<_>>, ConvertError> {
        let (send, receive) = std::sync::mpsc::sync_channel::<(usize, Vec<u8>)>(8);
        let names: Vec<&str> = c.tensors.iter().map(|p| p.name.as_str()).collect();
        let file_of = &file_of;
        let mut writers = writers;
        let writer = scope.spawn(move || -> Result<Vec<GgufWriter<_>>, ConvertError> {
            for (i, bytes) in receive {
                writers[file_of[i]].write_tensor_data(names[i], &bytes)?;
            }
            Ok(writers)
        });
        let mut produced = Ok(());
        'tensors: for (i, p) in c.tensors.iter().enumerate() {
            progress.item(&p.name);
            let chunk_rows = (CHUNK_WEIGHTS / p.dims[0].max(1)).max(1);
            let mut r = 0;
            while r < p.rows() {
                let n = chunk_rows.min(p.rows() - r);
                match encode_rows(&ckpt, p, r, n, options) {
                    Ok(bytes) => {
                        if send.send((i, bytes)).is_err() {
                            break 'tensors;
                        }
                    }
                    Err(e) => {
                        produced = Err(model_err(e.into()));
                        break 'tensors;
                    }
                }
                progress.advance(n * p.dims[0]);
                // Rows of an unpermuted single tensor map one to one onto its input.
                if p.parts.len() == 1 && p.permute_heads.is_none() && p.slice.is_none() {
                    let t = &ckpt.tensors()[p.parts[0]];
                    let row = t.ty.size() * p.dims[0] as usize;
                    ckpt.release_range(t, r as usize * row..(r + n) as usize * row);
                }
                r += n;
            }
            for &part in &p.parts {
                ckpt.release(&ckpt.tensors()[part]);
            }
        }
        drop(send);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(model_err(ModelError::WriterPanicked)));
        produced?;
        written
    })?;
    progress.finish();
    // Every file complete before any is moved into place.
    let mut files = Vec::with_capacity(writers.len());
    for w in writers {
        files.push(w.finish()?);
    }
    for (file, path) in files.into_iter().zip(&paths) {
        file.commit().map_err(|error| {
            ConvertError::Gguf(memwall_format::gguf::GgufError::Io {
                path: path.clone(),
                error,
            })
        })?;
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_keys_follow_gguf_py() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.05, "bos_token_id": 1}"#,
        )
        .unwrap();
        let mut meta = Metadata::new();
        sampling(&mut meta, dir.path()).unwrap();
        let keys: Vec<(&str, &Value)> = meta.iter().collect();
        assert_eq!(
            keys,
            [
                ("general.sampling.top_k", &Value::I32(20)),
                ("general.sampling.top_p", &Value::F32(0.95)),
                ("general.sampling.temp", &Value::F32(0.6)),
                ("general.sampling.penalty_repeat", &Value::F32(1.05)),
            ]
        );
        // Not JSON: ignored, as gguf-py ignores it.
        std::fs::write(dir.path().join("generation_config.json"), "{").unwrap();
        let mut meta = Metadata::new();
        sampling(&mut meta, dir.path()).unwrap();
        assert!(meta.is_empty());
    }
}
