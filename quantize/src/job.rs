//! Quantizing a whole model: plan every tensor's type (llama.cpp's mixes,
//! overrides, recipes), then stream the tensors from the memory-mapped input
//! through the encoders in parallel, row chunks at a time, into the output in
//! order. Output bytes do not depend on the thread count: each row is encoded
//! on its own.
//!
//! The output is what `llama-quantize` writes for the same options: tensors
//! in llama.cpp's order (by layer, then name), the input's metadata with
//! `general.quantization_version` and `general.file_type` moved to the end,
//! split keys dropped, and the `quantize.imatrix.*` keys when an importance
//! matrix is used. Recipes add `memwall.recipe.name` and `memwall.recipe`.

use std::io;
use std::path::{Path, PathBuf};

use memwall_format::GgmlType;
use memwall_format::atomic::AtomicFile;
use memwall_format::blocks::{dequantize_row, validate_row};
use memwall_format::ggml_type::FileTypeInfo;
use memwall_format::gguf::{
    GgufError, GgufModel, GgufWriter, Metadata, TensorSpec, keys, split_path,
};
use memwall_format::kv_override::KvOverride;
use memwall_format::progress::{Progress, Unit};
use rayon::prelude::*;

use crate::imatrix::Imatrix;
use crate::recipe::Recipe;
use crate::rules::{
    Category, FactsError, MixError, MixOptions, Mixer, ModelFacts, Override, Reason, llama_order,
};
use crate::{ENCODABLE, quantize_row_imatrix};

/// `general.quantization_version` written by current ggml (`GGML_QNT_VERSION`).
pub const QUANTIZATION_VERSION: u32 = 2;

/// Why quantization failed. Every variant names the file, tensor or key.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The input (or writing the output) failed at the container level.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The input's metadata lacks what the type rules need.
    #[error("{path}: {error}")]
    Facts {
        /// The input.
        path: PathBuf,
        /// What is missing or wrong.
        error: FactsError,
    },
    /// The input's metadata is invalid for writing the output.
    #[error("{path}: {message}")]
    Metadata {
        /// The input.
        path: PathBuf,
        /// What is missing or wrong.
        message: String,
    },
    /// The options cannot be applied to this model.
    #[error("{0}")]
    Options(String),
    /// `--prune-layers` cannot be applied to this model.
    #[error(transparent)]
    Prune(#[from] PruneError),
    /// The type rules cannot choose a tensor's type.
    #[error("tensor {tensor}: {error}")]
    Mix {
        /// Tensor name.
        tensor: String,
        /// Why.
        error: MixError,
    },
    /// A tensor cannot be quantized as planned.
    #[error("tensor {tensor}: {message}")]
    Tensor {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// A weight is NaN or infinite.
    #[error("tensor {tensor}, row {row}: {what} (ggml refuses non-finite weights)")]
    NonFinite {
        /// Tensor name.
        tensor: String,
        /// Row index (across experts).
        row: u64,
        /// Which value and what it is.
        what: String,
    },
    /// Writing the output failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The output file.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
}

/// An importance matrix together with the path the user gave, which
/// llama-quantize records in `quantize.imatrix.file`.
#[derive(Clone, Debug)]
pub struct ImatrixInput {
    /// The path as given on the command line.
    pub label: String,
    /// The data (after `--include-weights`/`--exclude-weights`).
    pub data: Imatrix,
}

/// Everything that decides the output, as `llama-quantize`'s options do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Target file type.
    pub ftype: &'static FileTypeInfo,
    /// `--pure`.
    pub pure: bool,
    /// `--leave-output-tensor`.
    pub leave_output: bool,
    /// `--allow-requantize`.
    pub allow_requantize: bool,
    /// `--keep-split`: one output file per input file.
    pub keep_split: bool,
    /// `--output-tensor-type`.
    pub output_type: Option<GgmlType>,
    /// `--token-embedding-type`.
    pub token_embedding_type: Option<GgmlType>,
    /// `--tensor-type` rules, before any recipe rules.
    pub tensor_types: Vec<Override>,
    /// A recipe: its rules follow `tensor_types`, its output and embedding
    /// types apply unless the options above set them.
    pub recipe: Option<Recipe>,
    /// `--imatrix`.
    pub imatrix: Option<ImatrixInput>,
    /// `--override-kv`: metadata of the output (and of the type rules, which
    /// read the model's hyper-parameters), as llama-quantize applies them.
    pub kv_overrides: Vec<KvOverride>,
    /// `--prune-layers`: blocks left out of the output; the others are
    /// renumbered from 0 and `{arch}.block_count` says how many remain.
    pub prune_layers: Vec<u32>,
}

impl Options {
    /// Options for a plain `llama-quantize IN OUT TYPE`.
    pub fn new(ftype: &'static FileTypeInfo) -> Options {
        Options {
            ftype,
            pure: false,
            leave_output: false,
            allow_requantize: false,
            keep_split: false,
            output_type: None,
            token_embedding_type: None,
            tensor_types: Vec::new(),
            recipe: None,
            imatrix: None,
            kv_overrides: Vec::new(),
            prune_layers: Vec::new(),
        }
    }
}

/// How a tensor uses the importance matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImatrixUse {
    /// No imatrix given, or the tensor is not quantized.
    None,
    /// The entry for this tensor weights its encoding.
    Used,
    /// The imatrix has no entry for this tensor.
    Missing,
    /// The entry has the wrong size and is ignored (token embeddings only, as llama.cpp does).
    Ignored,
}

/// One tensor of the plan.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    /// Name in the output.
    pub name: String,
    /// Name in the input (differs from `name` when `--prune-layers`
    /// renumbers the blocks); the importance matrix is looked up by it.
    pub source_name: String,
    /// Shape, GGUF order.
    pub dims: Vec<u64>,
    /// Type in the input.
    pub source: GgmlType,
    /// Type in the output.
    pub target: GgmlType,
    /// Why.
    pub reason: Reason,
    /// Bytes in the input.
    pub source_bytes: u64,
    /// Bytes in the output.
    pub target_bytes: u64,
    /// Number of weights.
    pub elements: u64,
    /// Output file index (0 unless `--keep-split`).
    pub file: usize,
    /// Importance matrix use.
    pub imatrix: ImatrixUse,
    /// The file type needs an importance matrix for this tensor and none is used.
    pub requires_imatrix: bool,
}

impl TensorPlan {
    /// Whether the data is re-encoded (rather than copied).
    pub fn converts(&self) -> bool {
        self.source != self.target
    }
}

/// The dimensions llama-quantize writes for a tensor: ggml's `n_dims`, so
/// trailing dimensions of 1 are dropped (a converter's `[2048, 1]`, Qwen3.5's
/// `ffn_gate_inp_shexp`, comes out as `[2048]`); at least one stays.
pub fn stored_dims(dims: &[u64]) -> Vec<u64> {
    let n = dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    dims[..n.min(dims.len())].to_vec()
}

/// The whole plan: what `--dry-run` shows and what [`run`] executes.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Tensors in output order.
    pub tensors: Vec<TensorPlan>,
    /// Metadata of each output file.
    pub metadata: Vec<Metadata>,
    /// The file type written to `general.file_type`.
    pub ftype: &'static FileTypeInfo,
    /// Non-fatal findings (unused rules, missing imatrix entries, fallbacks).
    pub warnings: Vec<String>,
    /// Tensors whose type fell back because of their row length.
    pub fallbacks: u32,
    /// Data alignment of the output.
    pub alignment: u64,
}

impl Plan {
    /// Total weights.
    pub fn elements(&self) -> u64 {
        self.tensors.iter().map(|t| t.elements).sum()
    }
    /// Tensor bytes in the input.
    pub fn source_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.source_bytes).sum()
    }
    /// Tensor bytes in the output.
    pub fn target_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.target_bytes).sum()
    }
    /// Bits per weight of the output tensor data.
    pub fn bits_per_weight(&self) -> f64 {
        self.target_bytes() as f64 * 8.0 / self.elements().max(1) as f64
    }

    /// The exact size of each output file (header, padding, data).
    pub fn file_sizes(&self) -> Result<Vec<u64>, JobError> {
        (0..self.metadata.len())
            .map(|f| {
                let w = GgufWriter::new(
                    io::sink(),
                    Path::new("<plan>"),
                    3,
                    self.metadata[f].clone(),
                    self.specs(f),
                )?;
                let h = w.header();
                Ok(h.tensors.last().map_or(h.data_offset, |t| {
                    h.data_offset + t.offset + t.size.div_ceil(h.alignment) * h.alignment
                }))
            })
            .collect()
    }

    /// Output paths: `out`, or `<out without .gguf>-0000i-of-0000n.gguf` per split.
    pub fn output_paths(&self, out: &Path) -> Vec<PathBuf> {
        let n = self.metadata.len();
        if n == 1 {
            return vec![out.to_owned()];
        }
        let s = out.to_string_lossy();
        let prefix = s.strip_suffix(".gguf").unwrap_or(&s);
        (0..n)
            .map(|i| split_path(prefix, i as u32, n as u32))
            .collect()
    }

    fn specs(&self, file: usize) -> Vec<TensorSpec> {
        self.tensors
            .iter()
            .filter(|t| t.file == file)
            .map(|t| TensorSpec {
                name: t.name.clone(),
                dims: stored_dims(&t.dims),
                ty: t.target,
            })
            .collect()
    }
}

/// Plans the quantization of `model` (opened from `input`).
pub fn plan(model: &GgufModel, input: &Path, options: &Options) -> Result<Plan, JobError> {
    let meta_err = |message: String| JobError::Metadata {
        path: input.to_owned(),
        message,
    };
    // llama-quantize loads the model with the overrides: the type rules see them.
    let facts = if options.kv_overrides.is_empty() {
        ModelFacts::from_metadata(model.metadata())
    } else {
        let mut meta = model.metadata().clone();
        for o in &options.kv_overrides {
            meta.set(o.key.clone(), o.loaded());
        }
        ModelFacts::from_metadata(&meta)
    }
    .map_err(|error| JobError::Facts {
        path: input.to_owned(),
        error,
    })?;
    let mut pruned = Pruning::new(&options.prune_layers, facts.n_layer)?;
    let recipe = options.recipe.as_ref();
    let mut overrides = options.tensor_types.clone();
    if let Some(r) = recipe {
        overrides.extend(r.rules.iter().cloned());
    }
    let mix = MixOptions {
        ftype: options.ftype,
        pure: options.pure,
        has_imatrix: options.imatrix.is_some(),
        output_type: options.output_type.or(recipe.and_then(|r| r.output)),
        token_embedding_type: options
            .token_embedding_type
            .or(recipe.and_then(|r| r.token_embedding)),
        leave_output: options.leave_output,
        overrides,
    };

    // llama.cpp's order: by layer then name; with --keep-split, by file then offset.
    let mut order: Vec<(usize, &memwall_format::gguf::TensorInfo)> = model.tensors().collect();
    order.sort_by(|a, b| llama_order(&a.1.name, &b.1.name));
    // Output names, in llama.cpp's order (its renumbering walks that order).
    let renamed = pruned.rename(order.iter().map(|(_, t)| t.name.as_str()));
    let mut order: Vec<(usize, &memwall_format::gguf::TensorInfo, String)> = order
        .into_iter()
        .zip(renamed)
        .filter_map(|((f, t), name)| Some((f, t, name?)))
        .collect();
    if options.keep_split {
        order.sort_by_key(|&(f, t, _)| (f, t.offset));
    }
    let n_files = if options.keep_split {
        model.files().len()
    } else {
        1
    };

    let mut mixer = Mixer::new(facts, mix, order.iter().map(|(_, _, name)| name.as_str()));
    let mut warnings = Vec::new();
    let mut tensors = Vec::with_capacity(order.len());
    let imatrix = options.imatrix.as_ref().map(|i| &i.data);
    let mut imatrix_hits = 0;
    for (file, t, name) in &order {
        let (file, name) = (*file, name.as_str());
        let choice = mixer
            .choose(name, &t.dims, t.ty)
            .map_err(|error| JobError::Mix {
                tensor: name.to_owned(),
                error,
            })?;
        let target = choice.ty;
        let size = target.tensor_size(&t.dims).map_err(|e| JobError::Tensor {
            tensor: name.to_owned(),
            message: format!(
                "cannot be stored as {target}: {e} (choose a type whose block divides {})",
                t.dims.first().copied().unwrap_or(0)
            ),
        })?;
        if let Reason::Fallback(from) = choice.reason {
            warnings.push(format!(
                "{name}: rows of {} weights do not fit {from} blocks; using {target}",
                t.dims[0]
            ));
        }
        let converts = target != t.ty;
        let mut use_ = ImatrixUse::None;
        if let (Some(m), true) = (imatrix, converts) {
            // llama.cpp looks the entry up under the input's name.
            use_ = match m.entries.get(&t.name) {
                None => ImatrixUse::Missing,
                Some(v) => {
                    let experts = t.dims.get(2).copied().unwrap_or(1);
                    if v.len() as u64 == t.dims[0] * experts {
                        imatrix_hits += 1;
                        ImatrixUse::Used
                    } else if Category::of(name) == Category::TokenEmbd {
                        ImatrixUse::Ignored
                    } else {
                        return Err(JobError::Tensor {
                            tensor: name.to_owned(),
                            message: format!(
                                "the importance matrix has {} values for it, the tensor needs {} \
                                 ({} per row × {experts} experts): is the imatrix for another model?",
                                v.len(),
                                t.dims[0] * experts,
                                t.dims[0]
                            ),
                        });
                    }
                }
            };
            if use_ == ImatrixUse::Missing {
                warnings.push(format!(
                    "{name}: no importance matrix entry; quantized without one"
                ));
            }
        }
        let needs_imatrix = crate::rules::requires_imatrix(name, target, options.ftype.name);
        // ggml cannot encode these at all without weights (llama-quantize aborts on a
        // tensor the imatrix has no entry for, such as token_embd under --pure).
        let cannot_encode = crate::IMATRIX_REQUIRED.contains(&target);
        // As llama-quantize: a plan (--dry-run) warns, a run refuses (see `run`).
        let requires_imatrix = (needs_imatrix || cannot_encode) && use_ != ImatrixUse::Used;
        if requires_imatrix {
            let fix = if imatrix.is_some() {
                "the importance matrix has no entry for it; give it another type (--tensor-type, --token-embedding-type, --output-tensor-type)"
            } else {
                "quantizing will fail without --imatrix"
            };
            warnings.push(format!(
                "{name}: {} needs an importance matrix for this tensor (its {target} blocks); {fix}",
                options.ftype.name
            ));
        }
        tensors.push(TensorPlan {
            name: name.to_owned(),
            source_name: t.name.clone(),
            dims: t.dims.clone(),
            source: t.ty,
            target,
            reason: choice.reason,
            source_bytes: t.size,
            target_bytes: size.bytes,
            elements: t.elements,
            file: if options.keep_split { file } else { 0 },
            imatrix: use_,
            requires_imatrix,
        });
    }
    if let Some(m) = imatrix {
        let converted = tensors.iter().filter(|t| t.converts()).count();
        if imatrix_hits == 0 && converted > 0 {
            let example = m.entries.keys().next().map_or("none".into(), |k| k.clone());
            return Err(JobError::Options(format!(
                "the importance matrix has no entry for any tensor of this model \
                 ({} entries, e.g. {example}): is it for another model?",
                m.entries.len()
            )));
        }
    }
    for o in &mixer.options().overrides {
        if !order.iter().any(|(_, _, name)| o.matches(name)) {
            warnings.push(format!("rule '{}' = {} matches no tensor", o.text, o.ty));
        }
    }

    let metadata = output_metadata(model, options, n_files, &pruned, tensors.len())?;
    let alignment = metadata[0]
        .alignment()
        .map_err(|found| meta_err(format!("general.alignment is not a power of two: {found}")))?;
    Ok(Plan {
        tensors,
        metadata,
        ftype: options.ftype,
        warnings,
        fallbacks: mixer.fallbacks,
        alignment,
    })
}

/// Why `--prune-layers` cannot be applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PruneError {
    /// A block the model does not have (llama-quantize ignores it).
    #[error("--prune-layers {layer}: the model has blocks 0 to {}", .n_layer.saturating_sub(1))]
    NoSuchBlock {
        /// The block given.
        layer: u32,
        /// The model's blocks.
        n_layer: u32,
    },
    /// Every block would go.
    #[error("--prune-layers would remove every block")]
    Everything,
}

/// `--prune-layers`: which blocks go, and the new number of those that stay.
struct Pruning {
    /// Sorted, without duplicates.
    layers: Vec<u32>,
    /// The blocks the renumbering reached (set by [`Pruning::rename`]).
    count: Option<u32>,
}

impl Pruning {
    /// Refuses a block the model does not have (llama-quantize ignores it).
    fn new(layers: &[u32], n_layer: u32) -> Result<Pruning, PruneError> {
        let mut layers = layers.to_vec();
        layers.sort_unstable();
        layers.dedup();
        if let Some(&layer) = layers.iter().find(|&&l| l >= n_layer) {
            return Err(PruneError::NoSuchBlock { layer, n_layer });
        }
        if !layers.is_empty() && layers.len() as u32 >= n_layer {
            return Err(PruneError::Everything);
        }
        Ok(Pruning {
            layers,
            count: None,
        })
    }

    /// The block number in a tensor name (`blk.N.`), where llama.cpp's
    /// `blk\.(\d+)\.` finds it first, and the byte range of N.
    fn block(name: &str) -> Option<(u32, std::ops::Range<usize>)> {
        let mut from = 0;
        while let Some(at) = name[from..].find("blk.") {
            let start = from + at + 4;
            let digits = name[start..].bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 && name[start + digits..].starts_with('.') {
                let n = name[start..start + digits].parse().ok()?;
                return Some((n, start..start + digits));
            }
            from = start;
        }
        None
    }

    /// The output name of each input name (in llama.cpp's order), `None` for
    /// a pruned tensor: kept blocks are renumbered in the order met, as
    /// llama-quantize's `remap_layer` does.
    fn rename<'a>(&mut self, names: impl Iterator<Item = &'a str>) -> Vec<Option<String>> {
        let Some(&first) = self.layers.first() else {
            return names.map(|n| Some(n.to_owned())).collect();
        };
        let mut mapped: std::collections::HashMap<u32, Option<u32>> = Default::default();
        let mut next = 0;
        let renamed = names
            .map(|name| {
                let Some((blk, digits)) = Self::block(name) else {
                    return Some(name.to_owned());
                };
                let to = *mapped.entry(blk).or_insert_with(|| {
                    if self.layers.contains(&blk) {
                        None
                    } else if blk < first {
                        next = blk + 1;
                        Some(blk)
                    } else {
                        next += 1;
                        Some(next - 1)
                    }
                });
                to.map(|n| format!("{}{n}{}", &name[..digits.start], &name[digits.end..]))
            })
            .collect();
        self.count = Some(next);
        renamed
    }

    /// The `{arch}.block_count` to write, when blocks were pruned: the number
    /// llama-quantize's renumbering reached.
    fn block_count(&self) -> Option<u32> {
        self.count
    }
}

/// The metadata llama-quantize writes (see the module docs).
fn output_metadata(
    model: &GgufModel,
    options: &Options,
    n_files: usize,
    pruned: &Pruning,
    n_tensors: usize,
) -> Result<Vec<Metadata>, JobError> {
    let mut meta = model.metadata().clone();
    let put = |meta: &mut Metadata, key: &str, value: memwall_format::gguf::Value| {
        meta.remove(key);
        meta.set(key, value);
    };
    put(
        &mut meta,
        keys::QUANTIZATION_VERSION,
        QUANTIZATION_VERSION.into(),
    );
    put(&mut meta, keys::FILE_TYPE, options.ftype.id.into());
    for k in [keys::SPLIT_NO, keys::SPLIT_COUNT, keys::SPLIT_TENSORS_COUNT] {
        meta.remove(k);
    }
    for o in &options.kv_overrides {
        put(&mut meta, &o.key, o.written());
    }
    if let Some(im) = &options.imatrix {
        // llama-quantize copies strings into 128-byte buffers.
        let clip = |s: &str| -> String {
            let mut end = s.len().min(127);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_owned()
        };
        put(&mut meta, "quantize.imatrix.file", clip(&im.label).into());
        if let Some(d) = im.data.datasets.first() {
            put(&mut meta, "quantize.imatrix.dataset", clip(d).into());
        }
        put(
            &mut meta,
            "quantize.imatrix.entries_count",
            (im.data.entries.len() as u32).into(),
        );
        if im.data.chunk_count > 0 {
            put(
                &mut meta,
                "quantize.imatrix.chunks_count",
                im.data.chunk_count.into(),
            );
        }
    }
    if let Some(blocks) = pruned.block_count() {
        let arch = model
            .metadata()
            .get_str(keys::ARCHITECTURE)
            .ok()
            .flatten()
            .unwrap_or("llama")
            .to_owned();
        put(&mut meta, &format!("{arch}.block_count"), blocks.into());
    }
    if let Some(r) = &options.recipe {
        put(&mut meta, "memwall.recipe.name", r.name.clone().into());
        put(&mut meta, "memwall.recipe", r.to_toml().into());
    }
    if n_files == 1 {
        return Ok(vec![meta]);
    }
    let total = n_tensors as i32;
    let mut files = vec![meta];
    files.extend((1..n_files).map(|_| Metadata::new()));
    for (i, m) in files.iter_mut().enumerate() {
        m.set(keys::SPLIT_NO, memwall_format::gguf::Value::U16(i as u16));
        m.set(
            keys::SPLIT_COUNT,
            memwall_format::gguf::Value::U16(n_files as u16),
        );
        m.set(
            keys::SPLIT_TENSORS_COUNT,
            memwall_format::gguf::Value::I32(total),
        );
    }
    Ok(files)
}

/// Bytes of decoded `f32` rows per slab: with [`IN_FLIGHT`] slabs queued,
/// bounds memory to well under 100 MB whatever the model.
const SLAB_BYTES: u64 = 16 << 20;
/// Weights per parallel work item (llama.cpp uses at least 32 × 512).
const CHUNK_WEIGHTS: u64 = 32 * 512;

/// Executes `plan`, writing to `out` (or its split names). Nothing is left at
/// the output paths on failure. Runs on the current rayon pool: wrap the call
/// in `ThreadPool::install` to choose the thread count.
pub fn run(
    model: &GgufModel,
    plan: &Plan,
    imatrix: Option<&Imatrix>,
    allow_requantize: bool,
    out: &Path,
    progress: &dyn Progress,
) -> Result<Vec<PathBuf>, JobError> {
    // Refuse up front what cannot be done, before creating any file.
    for t in plan.tensors.iter().filter(|t| t.converts()) {
        if t.requires_imatrix {
            let fix = if t.imatrix == ImatrixUse::Missing {
                "the importance matrix has no entry for it: give it another type with \
                 --tensor-type, --token-embedding-type or --output-tensor-type"
            } else {
                "pass --imatrix"
            };
            return Err(JobError::Tensor {
                tensor: t.name.clone(),
                message: format!(
                    "{} needs an importance matrix for this tensor (its {} blocks; {fix})",
                    plan.ftype.name, t.target
                ),
            });
        }
        if !ENCODABLE.contains(&t.target) {
            return Err(JobError::Tensor {
                tensor: t.name.clone(),
                message: format!(
                    "memwall cannot encode {} yet (it encodes {})",
                    t.target,
                    ENCODABLE.map(|t| t.name().to_ascii_uppercase()).join(", ")
                ),
            });
        }
        if !memwall_format::blocks::DEQUANTIZABLE.contains(&t.source) {
            return Err(JobError::Tensor {
                tensor: t.name.clone(),
                message: format!("memwall cannot decode {} input yet", t.source),
            });
        }
        if t.source.is_quantized() && !allow_requantize {
            return Err(JobError::Tensor {
                tensor: t.name.clone(),
                message: format!(
                    "is already quantized ({}); requantizing loses quality, so it needs \
                     --allow-requantize (better: start from the F16/BF16 model)",
                    t.source
                ),
            });
        }
    }
    let paths = plan.output_paths(out);
    for p in &paths {
        if model.files().iter().any(|f| same_file(f.path(), p)) {
            return Err(JobError::Options(format!(
                "the output {} is the input; choose another output path",
                p.display()
            )));
        }
    }
    progress.start("quantizing", plan.source_bytes(), Unit::Bytes);
    let mut finished = Vec::new();
    for (f, path) in paths.iter().enumerate() {
        let w = GgufWriter::create(path, 3, plan.metadata[f].clone(), plan.specs(f))?;
        let tensors: Vec<&TensorPlan> = plan.tensors.iter().filter(|t| t.file == f).collect();
        let file = write_file(model, &tensors, imatrix, w, progress)?;
        finished.push((path.clone(), file));
    }
    progress.finish();
    let mut written = Vec::new();
    for (path, file) in finished {
        commit(file, &path)?;
        written.push(path);
    }
    Ok(written)
}

fn commit(file: AtomicFile, path: &Path) -> Result<(), JobError> {
    file.commit().map_err(|error| JobError::Io {
        path: path.to_owned(),
        error,
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A piece of the output: tensor index (into the file's tensor list) and bytes.
enum Chunk<'a> {
    /// Encoded data in a buffer the writer hands back for reuse.
    Encoded(usize, Vec<u8>),
    /// Data copied unchanged from the input mapping.
    Copied(usize, &'a [u8]),
}

/// Where [`encode_tensor`] sends its slabs.
struct Outlet<'s, 'a> {
    /// Hands a slab to the writer; false when the writer has stopped.
    emit: &'s mut dyn FnMut(Chunk<'a>) -> bool,
    /// A buffer for encoded bytes (recycled from the writer when possible).
    buffer: &'s mut dyn FnMut() -> Vec<u8>,
    /// Lets the OS drop input pages that are done with.
    release: &'s dyn Fn(std::ops::Range<u64>),
    progress: &'s dyn Progress,
}

/// Buffers in flight between the encoders and the writer: bounds memory to
/// a few slabs while the write of one slab overlaps the encoding of the next.
const IN_FLIGHT: usize = 2;

/// Writes one output file: the encoders (on the rayon pool) produce slabs in
/// order and a writer thread appends them, so disk writes overlap encoding.
fn write_file(
    model: &GgufModel,
    tensors: &[&TensorPlan],
    imatrix: Option<&Imatrix>,
    mut w: GgufWriter<AtomicFile>,
    progress: &dyn Progress,
) -> Result<AtomicFile, JobError> {
    std::thread::scope(|scope| {
        let (send, receive) = std::sync::mpsc::sync_channel::<Chunk>(IN_FLIGHT);
        let (recycle, reuse) = std::sync::mpsc::channel::<Vec<u8>>();
        let writer = scope.spawn(move || -> Result<GgufWriter<AtomicFile>, JobError> {
            for chunk in receive {
                let (i, bytes, owned) = match chunk {
                    Chunk::Encoded(i, v) => (i, None, Some(v)),
                    Chunk::Copied(i, b) => (i, Some(b), None),
                };
                let data = bytes.or(owned.as_deref()).unwrap_or_default();
                w.write_tensor_data(&tensors[i].name, data)?;
                if let Some(v) = owned {
                    let _ = recycle.send(v);
                }
            }
            Ok(w)
        });
        let mut produced = Ok(());
        for (i, t) in tensors.iter().enumerate() {
            progress.item(&format!("[{}/{}] {}", i + 1, tensors.len(), t.name));
            let Some((_, data)) = model.tensor(&t.source_name) else {
                produced = Err(JobError::Tensor {
                    tensor: t.name.clone(),
                    message: "vanished from the input".into(),
                });
                break;
            };
            let weights = match (t.imatrix, imatrix) {
                (ImatrixUse::Used, Some(m)) => m.entries.get(&t.source_name).map(Vec::as_slice),
                _ => None,
            };
            let mut outlet = Outlet {
                emit: &mut |chunk| send.send(chunk).is_ok(),
                buffer: &mut || reuse.try_recv().unwrap_or_default(),
                // Bounded memory: input pages already encoded need not stay resident.
                release: &|range| model.release(&t.source_name, range),
                progress,
            };
            produced = encode_tensor(i, t, data, weights, &mut outlet);
            if produced.is_err() {
                break;
            }
            model.release(&t.source_name, 0..t.source_bytes);
        }
        drop(send);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(JobError::Options("the writer thread panicked".into())));
        // An encoding error explains a writer that stopped early, not the reverse.
        produced?;
        Ok(written?.finish()?)
    })
}

/// Streams one tensor in slabs of rows: each slab is checked (copies) or
/// decoded, encoded and checked (conversions) with its rows spread over the
/// rayon pool, then handed to `emit`. Stops quietly when `emit` reports that
/// the writer has gone (its error is reported instead).
fn encode_tensor<'a>(
    index: usize,
    t: &TensorPlan,
    data: &'a [u8],
    imatrix: Option<&[f32]>,
    out: &mut Outlet<'_, 'a>,
) -> Result<(), JobError> {
    let ne0 = t.dims.first().copied().unwrap_or(1).max(1);
    let rows_per_expert = t.dims.get(1).copied().unwrap_or(1).max(1);
    let src_row = t.source.tensor_size(&[ne0]).map(|s| s.bytes).unwrap_or(0) as usize;
    let dst_row = t.target.tensor_size(&[ne0]).map(|s| s.bytes).unwrap_or(0) as usize;
    let slab_rows = (SLAB_BYTES / (ne0 * 4)).max(1) as usize;
    let chunk_rows = CHUNK_WEIGHTS.div_ceil(ne0).max(1) as usize;
    for (s, src) in data.chunks(slab_rows * src_row.max(1)).enumerate() {
        let first_row = (s * slab_rows) as u64;
        let n = src.len() / src_row.max(1);
        let (results, chunk): (Vec<Result<(), JobError>>, Chunk<'a>) = if !t.converts() {
            let results = src
                .par_chunks(chunk_rows * src_row)
                .enumerate()
                .map(|(c, rows)| {
                    for (r, row) in rows.chunks(src_row).enumerate() {
                        let index = first_row + (c * chunk_rows + r) as u64;
                        check_row(t, t.source, row, index)?;
                    }
                    Ok(())
                })
                .collect();
            (results, Chunk::Copied(index, src))
        } else {
            let mut buf = (out.buffer)();
            buf.resize(n * dst_row, 0u8);
            let results = buf
                .par_chunks_mut(chunk_rows * dst_row)
                .zip(src.par_chunks(chunk_rows * src_row))
                .enumerate()
                .map_init(
                    || vec![0f32; ne0 as usize],
                    |x, (c, (dst, src))| {
                        let rows = dst.chunks_mut(dst_row).zip(src.chunks(src_row));
                        for (r, (out, input)) in rows.enumerate() {
                            let index = first_row + (c * chunk_rows + r) as u64;
                            encode_row(t, input, out, x, index, rows_per_expert, imatrix)?;
                        }
                        Ok(())
                    },
                )
                .collect();
            (results, Chunk::Encoded(index, buf))
        };
        results.into_iter().collect::<Result<(), JobError>>()?;
        let encoded = matches!(chunk, Chunk::Encoded(..));
        if !(out.emit)(chunk) {
            return Ok(());
        }
        if encoded {
            let start = (s * slab_rows * src_row) as u64;
            (out.release)(start..start + src.len() as u64);
        }
        out.progress.advance(src.len() as u64);
    }
    Ok(())
}

fn encode_row(
    t: &TensorPlan,
    input: &[u8],
    out: &mut [u8],
    x: &mut [f32],
    index: u64,
    rows_per_expert: u64,
    imatrix: Option<&[f32]>,
) -> Result<(), JobError> {
    let tensor_err = |message: String| JobError::Tensor {
        tensor: t.name.clone(),
        message,
    };
    dequantize_row(t.source, input, x).map_err(|e| tensor_err(e.to_string()))?;
    // A full pass without early exit vectorizes; the position is looked up only on failure.
    let non_finite = x.iter().fold(false, |bad, v| bad | !v.is_finite());
    if let Some(i) = x.iter().position(|v| non_finite && !v.is_finite()) {
        return Err(JobError::NonFinite {
            tensor: t.name.clone(),
            row: index,
            what: format!("weight {i} is {}", x[i]),
        });
    }
    let ne0 = x.len();
    let weights = imatrix.map(|m| {
        let e = (index / rows_per_expert) as usize;
        &m[e * ne0..(e + 1) * ne0]
    });
    quantize_row_imatrix(t.target, x, out, weights).map_err(|e| tensor_err(e.to_string()))?;
    check_row(t, t.target, out, index)
}

fn check_row(t: &TensorPlan, ty: GgmlType, row: &[u8], index: u64) -> Result<(), JobError> {
    validate_row(ty, row).map_err(|i| JobError::NonFinite {
        tensor: t.name.clone(),
        row: index,
        what: if ty.is_quantized() {
            format!("block {i} of the {ty} encoding has a non-finite scale (weights too large?)")
        } else {
            format!("{ty} value {i} is NaN or infinite")
        },
    })
}
