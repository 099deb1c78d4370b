//! A whole conversion: the GGUF file llama.cpp's converter writes for a
//! checkpoint — `general.*` keys, hyper-parameters, tokenizer, tensors — written
//! atomically (`<out>.partial`, fsync, rename) in bounded memory.

use std::path::{Path, PathBuf};

use memwall_runtime::gguf::{GgufWriter, Metadata, TensorSpec, Value};
use memwall_runtime::progress::{Progress, Unit};

use crate::arch::Arch;
use crate::checkpoint::Checkpoint;
use crate::metadata::hparams;
use crate::naming::{naming, parameter_counts};
use crate::tensors::{OutType, Planned, RowEncoder, encode, plan, rows};
use crate::vocab::{detect_pre, load_bpe, write_bpe};

/// Why a conversion failed.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// Reading the checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Writing the output failed.
    #[error(transparent)]
    Gguf(#[from] memwall_runtime::gguf::GgufError),
    /// The checkpoint cannot be converted as it is.
    #[error("{}: {message}", dir.display())]
    Model {
        /// The checkpoint folder.
        dir: PathBuf,
        /// What is wrong.
        message: String,
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
}

/// The planned output: metadata and tensors.
pub struct Conversion {
    /// Metadata in llama.cpp's order.
    pub metadata: Metadata,
    /// Tensors in llama.cpp's order.
    pub tensors: Vec<Planned>,
}

/// Plans the conversion of the checkpoint in `dir`.
pub fn prepare(ckpt: &Checkpoint, options: &Options) -> Result<Conversion, ConvertError> {
    let model_err = |message: String| ConvertError::Model {
        dir: ckpt.dir().to_owned(),
        message,
    };
    let class = ckpt.config()["architectures"][0]
        .as_str()
        .ok_or_else(|| model_err("config.json has no architectures list".into()))?;
    let arch: &Arch = Arch::for_class(class).map_err(model_err)?;
    let tensors = plan(ckpt, arch, options.outtype).map_err(model_err)?;
    let counts = parameter_counts(tensors.iter().map(|p| (p.name.as_str(), p.dims.as_slice())));
    let names = naming(ckpt.dir(), ckpt.config(), counts);
    let mut meta = Metadata::new();
    meta.set("general.architecture", arch.gguf);
    meta.set("general.type", "model");
    let fields = [
        ("general.name", &names.name),
        ("general.version", &names.version),
        ("general.organization", &names.organization),
        ("general.finetune", &names.finetune),
        ("general.basename", &names.basename),
        ("general.size_label", &names.size_label),
    ];
    for (key, value) in fields {
        if let Some(v) = value {
            meta.set(key, Value::String(v.clone()));
        }
    }
    hparams(&mut meta, ckpt.config(), arch, options.outtype).map_err(model_err)?;
    let vocab = load_bpe(ckpt.dir(), ckpt.config(), arch.gguf).map_err(model_err)?;
    let pre = match &options.pre {
        Some(p) => p.clone(),
        None => detect_pre(ckpt.dir()).map_err(model_err)?,
    };
    write_bpe(&mut meta, &vocab, &pre);
    Ok(Conversion {
        metadata: meta,
        tensors,
    })
}

/// Rows converted at a time: bounds memory to a few MiB per tensor piece.
const CHUNK_WEIGHTS: u64 = 4 << 20;

/// Converts the checkpoint in `dir` to `out`. Nothing is left at `out` on failure.
pub fn convert(
    dir: &Path,
    out: &Path,
    options: &Options,
    progress: &dyn Progress,
) -> Result<(), ConvertError> {
    let ckpt = Checkpoint::open(dir)?;
    let c = prepare(&ckpt, options)?;
    let specs: Vec<TensorSpec> = c
        .tensors
        .iter()
        .map(|p| TensorSpec {
            name: p.name.clone(),
            dims: p.dims.clone(),
            ty: p.ty,
        })
        .collect();
    let total: u64 = c
        .tensors
        .iter()
        .map(|p| p.dims.iter().product::<u64>())
        .sum();
    let mut w = GgufWriter::create(out, 3, c.metadata, specs)?;
    progress.start("converting", total, Unit::Items);
    for p in &c.tensors {
        progress.item(&p.name);
        let chunk_rows = (CHUNK_WEIGHTS / p.dims[0].max(1)).max(1);
        let mut r = 0;
        while r < p.rows() {
            let n = chunk_rows.min(p.rows() - r);
            let x = rows(&ckpt, p, r, n).map_err(|message| ConvertError::Model {
                dir: dir.to_owned(),
                message,
            })?;
            if !options.allow_nonfinite {
                if let Some(i) = x.iter().position(|v| !v.is_finite()) {
                    let index = r * p.dims[0] + i as u64;
                    return Err(ConvertError::Model {
                        dir: dir.to_owned(),
                        message: format!(
                            "tensor {} has a non-finite value ({}) at element {index} (--allow-nonfinite writes it anyway)",
                            p.name, x[i]
                        ),
                    });
                }
            }
            let piece = Planned {
                dims: vec![p.dims[0], n],
                ..p.clone()
            };
            let bytes =
                encode(&piece, &x, options.encode).map_err(|message| ConvertError::Model {
                    dir: dir.to_owned(),
                    message,
                })?;
            w.write_tensor_data(&p.name, &bytes)?;
            progress.advance(n * p.dims[0]);
            r += n;
        }
    }
    progress.finish();
    w.commit()?;
    Ok(())
}
