//! What `memwall compare` measures on each file: the evaluation windows, the
//! base's perplexity and saved log-probabilities, every other file's
//! perplexity, KL divergence and top-1 agreement against them (all through
//! `memwall_runtime::eval`, llama-perplexity's arithmetic), and the estimated
//! decode speed on a device profile (`memwall_quantize::fit`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memwall_calibrate::dataset::Dataset;
use memwall_format::cleanup::ScratchFile;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::{Progress, Unit};
use memwall_quantize::fit::{Device, KvType, Shape, Weights, decode_speed, gguf_tensors};
use memwall_runtime::eval::{self, Baseline, KldStats, Layout};
use memwall_runtime::forward::Model;
use memwall_runtime::kernels::Kernels;
use memwall_runtime::tokenizer::Tokenizer;

use super::{Input, Options};

/// The token windows every file is evaluated on.
pub(super) struct Windows {
    /// The tokens, cut by the evaluation into windows of `n_ctx`.
    pub tokens: Vec<u32>,
    /// Tokens per window.
    pub n_ctx: usize,
    /// What the tokens are, for the report (file names or the set).
    pub source: String,
    /// Samples of the set left out because they are shorter than its `seq_len`.
    pub short_samples: usize,
}

/// Tokenizes the texts (joined with a blank line) or loads the calibration set.
pub(super) fn windows(opts: &Options, base: &GgufModel) -> Result<(Windows, Tokenizer)> {
    if opts.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    let tokenizer = Tokenizer::from_gguf(base.metadata())
        .with_context(|| format!("{}: tokenizer", opts.base.display()))?;
    if tokenizer.add_eos() {
        bail!(
            "{}: the vocabulary appends EOS to every text, which windowed evaluation does not support (neither does llama-perplexity)",
            opts.base.display()
        );
    }
    let windows = match &opts.input {
        Input::Text(files) => {
            if files.is_empty() {
                bail!(
                    "give the text to evaluate on with -f TEXT (or a calibration set with --dataset SET)"
                );
            }
            let mut texts = Vec::with_capacity(files.len());
            for f in files {
                texts.push(std::fs::read_to_string(f).with_context(|| {
                    format!("{}: cannot read the text (UTF-8 expected)", f.display())
                })?);
            }
            Windows {
                tokens: tokenizer.encode(&texts.join("\n\n"), true, false),
                n_ctx: opts.ctx,
                source: names(files),
                short_samples: 0,
            }
        }
        Input::Dataset(path) => {
            let set = Dataset::load(path, &tokenizer)
                .with_context(|| format!("{}: calibration set", path.display()))?;
            // One window per sample: only samples of the full length fit the
            // fixed windows of the evaluation (and of the log-probability file).
            let total = set.samples.len();
            let mut samples: Vec<Vec<u32>> = set
                .samples
                .into_iter()
                .filter(|s| s.len() == set.seq_len)
                .collect();
            let short_samples = total - samples.len();
            if let Some(n) = opts.chunks {
                samples.truncate(n);
            }
            if samples.len() < 2 {
                bail!(
                    "{}: {} sample(s) of {} tokens; the evaluation needs at least 2",
                    path.display(),
                    samples.len(),
                    set.seq_len
                );
            }
            Windows {
                tokens: samples.concat(),
                n_ctx: set.seq_len,
                source: path.display().to_string(),
                short_samples,
            }
        }
    };
    // What the evaluation would refuse, refused before any quantization runs.
    if windows.n_ctx < 4 {
        bail!("-c {}: a window needs at least 4 tokens", windows.n_ctx);
    }
    if windows.tokens.len() < 2 * windows.n_ctx {
        bail!(
            "{}: {} tokens; windows of {} need at least {} (use a longer text or a smaller -c)",
            windows.source,
            windows.tokens.len(),
            windows.n_ctx,
            2 * windows.n_ctx
        );
    }
    Ok((windows, tokenizer))
}

fn names(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Evaluation settings shared by every file.
pub(super) struct Eval {
    pub options: eval::Options,
    pub threads: usize,
    pub kernels: Kernels,
}

impl Eval {
    pub(super) fn new(opts: &Options, windows: &Windows, tokenizer: &Tokenizer) -> Result<Eval> {
        let threads = opts
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        Ok(Eval {
            options: eval::Options {
                n_ctx: windows.n_ctx,
                n_batch: windows.n_ctx,
                max_chunks: opts.chunks,
                bos: tokenizer.add_bos().then(|| tokenizer.bos()).flatten(),
                all_outputs: false,
            },
            threads,
            kernels: Kernels::from_env()?,
        })
    }

    fn model<'a>(&self, gguf: &'a GgufModel, path: &Path) -> Result<Model<'a>> {
        let mut model = Model::new(gguf, self.options.n_ctx)
            .with_context(|| format!("{}: cannot run this model", path.display()))?;
        model.set_compute(self.kernels, self.threads);
        Ok(model)
    }

    /// The base's perplexity, its log-probabilities saved to `scratch`.
    pub(super) fn base(
        &self,
        gguf: &GgufModel,
        path: &Path,
        tokens: &[u32],
        scratch: ScratchFile,
        layout: Layout,
        progress: &dyn Progress,
    ) -> Result<Baseline> {
        let model = self.model(gguf, path)?;
        let tagged = Tagged::new(progress, path);
        Baseline::with_layout(&model, tokens, &self.options, scratch, layout, &tagged)
            .with_context(|| format!("{}: evaluating", path.display()))
    }

    /// Perplexity, KL divergence and top-1 agreement of a file against the base.
    pub(super) fn file(
        &self,
        gguf: &GgufModel,
        path: &Path,
        base: &Baseline,
        progress: &dyn Progress,
    ) -> Result<KldStats> {
        let model = self.model(gguf, path)?;
        let tagged = Tagged::new(progress, path);
        base.compare(&model, &self.options, &tagged)
            .with_context(|| format!("{}: evaluating", path.display()))
    }
}

/// Refuses a file that is not a model of the base's architecture, shape and vocabulary.
pub(super) fn check_compatible(
    base: &GgufModel,
    base_path: &Path,
    file: &GgufModel,
    path: &Path,
) -> Result<()> {
    let shape = |m: &GgufModel, p: &Path| {
        Shape::from_gguf(m).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
    };
    let (a, b) = (shape(base, base_path)?, shape(file, path)?);
    let refuse = |what: String| {
        anyhow::anyhow!(
            "{}: cannot be compared with {}: {what}",
            path.display(),
            base_path.display()
        )
    };
    if a.arch != b.arch {
        return Err(refuse(format!(
            "its architecture is {}, the base's is {}",
            b.arch, a.arch
        )));
    }
    if a.n_vocab != b.n_vocab {
        return Err(refuse(format!(
            "its vocabulary has {} tokens, the base's {} (another model's vocabulary)",
            b.n_vocab, a.n_vocab
        )));
    }
    fn tokens(m: &GgufModel) -> (Option<&str>, Option<&[String]>) {
        let meta = m.metadata();
        (
            meta.get_str("tokenizer.ggml.model").ok().flatten(),
            meta.get_str_array("tokenizer.ggml.tokens").ok().flatten(),
        )
    }
    if tokens(base) != tokens(file) {
        return Err(refuse(
            "its vocabulary differs from the base's (same size, other tokens)".into(),
        ));
    }
    let dims = |s: &Shape| {
        format!(
            "{} layers, width {}, FFN {}, {}/{} heads, {} experts",
            s.n_layer, s.n_embd, s.n_ff, s.n_head, s.n_head_kv, s.n_expert
        )
    };
    // The training context does not change the weights' shapes.
    let same = Shape {
        ctx_train: a.ctx_train,
        ..b.clone()
    };
    if same != a {
        return Err(refuse(format!(
            "another architecture shape ({}; the base has {})",
            dims(&b),
            dims(&a)
        )));
    }
    Ok(())
}

/// Size, bits per weight and estimated decode speed of a file.
#[derive(Clone, Debug)]
pub(super) struct Footprint {
    pub bytes: u64,
    pub tensor_bytes: u64,
    pub weights: u64,
    pub bits_per_weight: f64,
    pub tokens_per_s: f64,
    pub limit: &'static str,
}

/// Sizes and the decode estimate with an F16 KV cache holding `kv_tokens`.
pub(super) fn footprint(
    gguf: &GgufModel,
    path: &Path,
    device: &Device,
    kv_tokens: u64,
) -> Result<Footprint> {
    let shape = Shape::from_gguf(gguf).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let weights = Weights::as_stored(&gguf_tensors(gguf))
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let speed = decode_speed(device, &shape, &weights, KvType::F16, kv_tokens, u64::MAX);
    Ok(Footprint {
        bytes: gguf.total_file_size(),
        tensor_bytes: weights.bytes(),
        weights: weights.elements(),
        bits_per_weight: weights.bits_per_weight(),
        tokens_per_s: speed.tokens_per_s,
        limit: speed.limit(),
    })
}

/// Passes progress on, naming the file being worked on in each stage.
pub(super) struct Tagged<'a> {
    inner: &'a dyn Progress,
    name: String,
}

impl<'a> Tagged<'a> {
    pub(super) fn new(inner: &'a dyn Progress, path: &Path) -> Tagged<'a> {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Tagged { inner, name }
    }
}

impl Progress for Tagged<'_> {
    fn start(&self, label: &str, total: u64, unit: Unit) {
        self.inner.start(label, total, unit);
        self.inner.item(&self.name);
    }
    fn advance(&self, n: u64) {
        self.inner.advance(n);
    }
    fn item(&self, name: &str) {
        self.inner.item(&format!("{}: {name}", self.name));
    }
    fn warn(&self, message: &str) {
        self.inner.warn(&format!("{}: {message}", self.name));
    }
    fn finish(&self) {
        self.inner.finish();
    }
}
