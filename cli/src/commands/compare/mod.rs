//! `memwall compare BASE.gguf [FILES…] -f TEXT`: which quantization to use, and
//! what it costs.
//!
//! Makes the missing quantizations of BASE (cached, see [`cache`]), evaluates
//! BASE and every file on the same windows of text (or of a calibration set),
//! and reports per file: size, bits per weight, perplexity, KL divergence and
//! top-1 agreement against BASE, and the estimated decode speed on a device
//! profile. Output: a table, `compare.md`, `compare.json` and a
//! quality-vs-size chart (SVG, and PNG when a font is found).
//!
//! BASE is evaluated once; its log-probabilities (llama.cpp's
//! `--kl-divergence-base` format: about `n_vocab × 2` bytes per scored
//! position) go to a scratch file in the cache folder, removed at the end.
//!
//! Other commands call [`compare`], [`write_outputs`] and [`render_table`]
//! with [`Options`] built in code.

mod cache;
mod measure;
mod report;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memwall_format::cleanup::ScratchFile;
use memwall_format::ggml_type::file_type;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Progress;
use memwall_quantize::fit::{Choice, Device};
use memwall_quantize::recipe::PRESETS;
use memwall_runtime::eval::Layout;

pub use cache::Made;
pub use report::{Outputs, render_table, write_outputs};

use crate::progress::Bar;

/// Quantizations made when `--types` is not given.
pub const DEFAULT_TYPES: [&str; 4] = ["Q4_K_M", "Q5_K_M", "Q6_K", "attn-f16-ffn-q4"];
/// Device profile of the decode estimate when `--device` is not given.
pub const DEFAULT_DEVICE: &str = crate::args::DEFAULT_DEVICE;
/// Tokens per window when `-c` is not given.
pub const DEFAULT_CTX: usize = 512;

/// Arguments of `memwall compare`.
#[derive(clap::Args)]
#[command(mut_arg("model", |a| a.help("The reference model (F16/BF16/F32, or any file of a split \
    model); the quantizations are made from it and KL divergence is measured against it. Or give \
    it with -m").value_name("BASE.gguf")))]
#[command(mut_arg("ctx", |a| a.help("Tokens per window; the second half of each window is scored")))]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// More GGUF files to compare as they are (quantizations of the same model).
    #[arg(value_name = "FILES", index = 2)]
    pub files: Vec<PathBuf>,
    /// Quantizations of BASE to make and compare: llama.cpp file types,
    /// built-in recipes or recipe TOML files, comma-separated; `none` for only
    /// FILES.
    #[arg(
        long,
        value_name = "TYPE,…",
        value_delimiter = ',',
        default_value = "Q4_K_M,Q5_K_M,Q6_K,attn-f16-ffn-q4"
    )]
    pub types: Vec<String>,
    /// Text to evaluate on (UTF-8; repeat -f for several, joined with a blank
    /// line). Either this or --dataset.
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    pub texts: Vec<PathBuf>,
    /// A calibration set from `memwall calibrate dataset` instead of text: each
    /// sample is one window (of the set's length; -c does not apply).
    #[arg(long, value_name = "SET", conflicts_with = "texts")]
    pub dataset: Option<PathBuf>,
    #[command(flatten)]
    pub ctx: crate::args::Ctx512,
    /// Evaluate at most this many windows.
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    /// Keep only the base's K most likely tokens per position (and K draws
    /// from the rest) for the KL divergence: a few KiB a position instead of
    /// two bytes per vocabulary entry (docs/RUNTIME.md).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub kld_top_k: Option<u32>,
    #[command(flatten)]
    pub threads: crate::args::Threads,
    #[command(flatten)]
    pub device: crate::args::DeviceArg,
    /// Folder for compare.md, compare.json and the charts (default:
    /// compare-<BASE stem> in the current folder); created if missing, the
    /// folder it goes in must exist.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Folder of the quantizations made from BASE, reused while BASE is
    /// unchanged (default: memwall-cache next to BASE).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// TrueType/OpenType font for the PNG chart (default: the first of the
    /// usual system fonts found; without one only the SVG is written).
    #[arg(long, value_name = "FILE")]
    pub font: Option<PathBuf>,
    /// Print the report as JSON (the same as compare.json), and no progress bar.
    #[arg(long)]
    pub json: bool,
}

/// What the files are evaluated on.
#[derive(Clone, Debug)]
pub enum Input {
    /// Text files, joined with `"\n\n"`, cut into windows of [`Options::ctx`] tokens.
    Text(Vec<PathBuf>),
    /// A calibration set: one window per sample of its full length.
    Dataset(PathBuf),
}

/// Everything [`compare`] needs; built by the command line or by other commands.
#[derive(Clone, Debug)]
pub struct Options {
    /// The reference model.
    pub base: PathBuf,
    /// Files compared as they are.
    pub files: Vec<PathBuf>,
    /// Quantizations of the base to make (file types, recipe names or recipe files).
    pub types: Vec<String>,
    /// The evaluation text or set.
    pub input: Input,
    /// Tokens per window (text only).
    pub ctx: usize,
    /// At most this many windows.
    pub chunks: Option<usize>,
    /// The base's reference keeps its top K tokens per position (None: all).
    pub kld_top_k: Option<usize>,
    /// Threads (default: every core).
    pub threads: Option<usize>,
    /// Device profile name or TOML file.
    pub device: String,
    /// Cache folder (default: [`default_cache_dir`]).
    pub cache: Option<PathBuf>,
    /// Font for the PNG chart (default: searched).
    pub font: Option<PathBuf>,
}

impl Options {
    /// The defaults of the command line for `base` evaluated on `input`.
    pub fn new(base: impl Into<PathBuf>, input: Input) -> Options {
        Options {
            base: base.into(),
            files: Vec::new(),
            types: DEFAULT_TYPES.iter().map(|t| t.to_string()).collect(),
            input,
            ctx: DEFAULT_CTX,
            chunks: None,
            kld_top_k: None,
            threads: None,
            device: DEFAULT_DEVICE.into(),
            cache: None,
            font: None,
        }
    }
}

/// `memwall-cache` next to the base model.
pub fn default_cache_dir(base: &Path) -> PathBuf {
    base.parent()
        .unwrap_or_else(|| Path::new(""))
        .join("memwall-cache")
}

/// `compare-<base stem>` in the current folder.
pub fn default_output_dir(base: &Path) -> PathBuf {
    PathBuf::from(format!("compare-{}", stem(base)))
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
}

/// Where a row's file came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Origin {
    /// The reference model.
    Base,
    /// A quantization of the base made by this comparison (now or cached earlier).
    Quantized(Made),
    /// A file given on the command line.
    Given,
}

/// The measurements of one file.
#[derive(Clone, Debug)]
pub struct Row {
    /// The file (the first file of a split model).
    pub path: PathBuf,
    /// Its quantization: file type or recipe name.
    pub label: String,
    /// Where it came from.
    pub origin: Origin,
    /// Bytes on disk (all files of a split model).
    pub bytes: u64,
    /// Bytes of tensor data.
    pub tensor_bytes: u64,
    /// Weights (elements of all tensors).
    pub weights: u64,
    /// Tensor bytes × 8 / weights.
    pub bits_per_weight: f64,
    /// Perplexity and its standard error.
    pub ppl: (f64, f64),
    /// Mean KL divergence from the base and its standard error (0 for the base).
    pub kld: (f64, f64),
    /// Median, 99th percentile and maximum KL divergence (0 for the base).
    pub kld_spread: (f64, f64, f64),
    /// Share of positions whose most likely token is the base's, and its error.
    pub top1: (f64, f64),
    /// Mean ln(PPL / PPL(base)) and its error.
    pub log_ppl_ratio: (f64, f64),
    /// RMS of the change in the probability of the right token, and its error.
    pub delta_p_rms: (f64, f64),
    /// Estimated decode tokens per second on the device.
    pub tokens_per_s: f64,
    /// What limits that speed ("memory bandwidth", "compute").
    pub limit: &'static str,
    /// Seconds the evaluation took.
    pub eval_seconds: f64,
}

impl Row {
    /// The file name.
    pub fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    /// Whether this is the reference model.
    pub fn is_base(&self) -> bool {
        self.origin == Origin::Base
    }

    /// Size in MiB.
    pub fn mib(&self) -> f64 {
        self.bytes as f64 / (1u64 << 20) as f64
    }
}

/// The result of a comparison.
#[derive(Clone, Debug)]
pub struct Report {
    /// The reference model.
    pub base: PathBuf,
    /// What was evaluated: text file names or the calibration set.
    pub source: String,
    /// Whether the source is a calibration set.
    pub dataset: bool,
    /// Tokens of the text (or of the full-length samples of the set).
    pub tokens: usize,
    /// Samples of the set left out for being shorter than its length.
    pub short_samples: usize,
    /// Windows evaluated.
    pub windows: usize,
    /// Tokens per window.
    pub n_ctx: usize,
    /// Positions scored per file.
    pub scored: usize,
    /// The base's reference keeps its top K tokens per position (None: all).
    pub kld_top_k: Option<usize>,
    /// The device profile of the decode estimate.
    pub device: Device,
    /// Tokens in the (F16) KV cache of the decode estimate: half a window.
    pub kv_tokens: u64,
    /// The cache folder.
    pub cache: PathBuf,
    /// Threads used.
    pub threads: usize,
    /// Kernel backend used.
    pub kernels: String,
    /// Every file, smallest first, the base last.
    pub rows: Vec<Row>,
    /// Things the user should know (quantize warnings, skipped files).
    pub warnings: Vec<String>,
    /// Font for the PNG chart, as given in the options.
    pub font: Option<PathBuf>,
}

fn choice(spec: &str) -> Result<Choice> {
    let c = match Choice::by_name(spec) {
        Some(c) => c,
        None if Path::new(spec).is_file() => Choice::recipe(super::quantize::load_recipe(spec)?),
        None => {
            let recipes: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            let names = memwall_format::ggml_type::FILE_TYPES
                .iter()
                .filter(|f| f.base.is_some())
                .map(|f| f.name)
                .chain(recipes.iter().copied());
            bail!(
                "--types: unknown type or recipe '{spec}'{}. Types: {}; recipes: {} (or a \
                 recipe TOML file)",
                memwall_format::suggest::did_you_mean(spec, names),
                super::quantize::ftype_names(),
                recipes.join(", ")
            )
        }
    };
    // compare makes these files: refuse what cannot be written before any work.
    memwall_quantize::names::check_writable(c.ftype)
        .map_err(|e| anyhow::anyhow!("--types {spec}: {e}"))?;
    Ok(c)
}

/// The quantization of a file as its metadata records it.
fn label_of(model: &GgufModel) -> String {
    let meta = model.metadata();
    if let Ok(Some(name)) = meta.get_str("memwall.recipe.name") {
        return name.to_owned();
    }
    if let Ok(Some(id)) = meta.get_u64("general.file_type") {
        if let Some(ft) = u32::try_from(id).ok().and_then(file_type) {
            return ft.name.to_owned();
        }
    }
    "?".into()
}

/// Runs the comparison: makes the missing quantizations, evaluates every file.
pub fn compare(opts: &Options, progress: &dyn Progress) -> Result<Report> {
    let device = Device::resolve(&opts.device).map_err(|e| anyhow::anyhow!("--device: {e}"))?;
    let mut choices: Vec<Choice> = Vec::new();
    for spec in &opts.types {
        let spec = spec.trim();
        if spec.is_empty() || spec.eq_ignore_ascii_case("none") {
            continue;
        }
        let c = choice(spec)?;
        if !choices.iter().any(|d| d.label == c.label) {
            choices.push(c);
        }
    }
    let base = GgufModel::open(&opts.base)
        .with_context(|| format!("{}: opening the base model", opts.base.display()))?;
    let (windows, tokenizer) = measure::windows(opts, &base)?;
    let mut warnings = Vec::new();
    if windows.short_samples > 0 {
        warnings.push(format!(
            "{} sample(s) of the set are shorter than its length and were left out",
            windows.short_samples
        ));
    }

    // Refuse what cannot be compared before any long work.
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let base_canonical = canonical(&opts.base);
    let mut given: Vec<PathBuf> = Vec::new();
    for path in &opts.files {
        if canonical(path) == base_canonical {
            warnings.push(format!(
                "{}: is the base model; listed once",
                path.display()
            ));
            continue;
        }
        if given.iter().any(|g| canonical(g) == canonical(path)) {
            continue;
        }
        let model =
            GgufModel::open(path).with_context(|| format!("{}: opening", path.display()))?;
        measure::check_compatible(&base, &opts.base, &model, path)?;
        given.push(path.clone());
    }
    if choices.is_empty() && given.is_empty() {
        bail!("nothing to compare with the base: give --types or FILES");
    }
    if !choices.is_empty() && base.tensors().any(|(_, t)| t.ty.is_quantized()) {
        bail!(
            "{}: already quantized ({}); compare makes its quantizations from an F16, BF16 or \
             F32 model: give that as BASE, or list the files to compare with --types none",
            opts.base.display(),
            label_of(&base)
        );
    }

    let cache_dir = opts
        .cache
        .clone()
        .unwrap_or_else(|| default_cache_dir(&opts.base));
    if !cache_dir.is_dir() {
        super::check_output_dir(&cache_dir, "the cache folder")?;
        std::fs::create_dir(&cache_dir).with_context(|| {
            format!(
                "{}: cannot create the cache folder (choose another with --cache)",
                cache_dir.display()
            )
        })?;
    }
    let eval = measure::Eval::new(opts, &windows, &tokenizer)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(eval.threads)
        .build()
        .context("starting worker threads")?;

    let base_stem = stem(&opts.base);
    let mut files: Vec<(PathBuf, Origin, Option<String>)> = Vec::new();
    if !choices.is_empty() {
        let key = cache::base_key(&base)?;
        for c in &choices {
            // Named as `memwall quantize BASE TYPE` names its output.
            let out = cache_dir.join(format!(
                "{}-{}.gguf",
                super::quantize::output_stem(&opts.base),
                c.label
            ));
            let tagged = measure::Tagged::new(progress, &out);
            let (made, plan_warnings) =
                cache::ensure(&base, &opts.base, &key, c, &out, &pool, &tagged)?;
            let name = out.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            warnings.extend(plan_warnings.into_iter().map(|w| format!("{name}: {w}")));
            files.push((out, Origin::Quantized(made), Some(c.label.clone())));
        }
    }
    for path in given {
        // A file of the cache given by hand is already in the list.
        if !files
            .iter()
            .any(|(p, _, _)| canonical(p) == canonical(&path))
        {
            files.push((path, Origin::Given, None));
        }
    }

    // The base once: its perplexity and the log-probabilities every file is compared with.
    let scratch = ScratchFile::new(&cache_dir, &format!(".{base_stem}-base-"), ".logits");
    let started = std::time::Instant::now();
    let layout = opts.kld_top_k.map_or(Layout::Full, Layout::TopK);
    let reference = eval.base(
        &base,
        &opts.base,
        &windows.tokens,
        scratch,
        layout,
        progress,
    )?;
    let base_seconds = started.elapsed().as_secs_f64();
    let ppl = reference.perplexity.clone();
    let kv_tokens = (windows.n_ctx / 2) as u64;
    let fp = measure::footprint(&base, &opts.base, &device, kv_tokens)?;
    let mut rows = vec![Row {
        path: opts.base.clone(),
        label: label_of(&base),
        origin: Origin::Base,
        bytes: fp.bytes,
        tensor_bytes: fp.tensor_bytes,
        weights: fp.weights,
        bits_per_weight: fp.bits_per_weight,
        ppl: (ppl.ppl, ppl.plus_minus),
        kld: (0.0, 0.0),
        kld_spread: (0.0, 0.0, 0.0),
        top1: (1.0, 0.0),
        log_ppl_ratio: (0.0, 0.0),
        delta_p_rms: (0.0, 0.0),
        tokens_per_s: fp.tokens_per_s,
        limit: fp.limit,
        eval_seconds: base_seconds,
    }];
    drop(base);

    for (path, origin, label) in files {
        let model =
            GgufModel::open(&path).with_context(|| format!("{}: opening", path.display()))?;
        let fp = measure::footprint(&model, &path, &device, kv_tokens)?;
        let started = std::time::Instant::now();
        let s = eval.file(&model, &path, &reference, progress)?;
        let p99 = s
            .kld_percentiles
            .iter()
            .find(|(f, _)| (*f - 0.99).abs() < 1e-6)
            .map_or(s.kld_max, |(_, v)| *v);
        rows.push(Row {
            label: label.unwrap_or_else(|| label_of(&model)),
            path,
            origin,
            bytes: fp.bytes,
            tensor_bytes: fp.tensor_bytes,
            weights: fp.weights,
            bits_per_weight: fp.bits_per_weight,
            ppl: (s.ppl.mean, s.ppl.plus_minus),
            kld: (s.kld.mean, s.kld.plus_minus),
            kld_spread: (s.kld_median, p99, s.kld_max),
            top1: (s.same_top.mean, s.same_top.plus_minus),
            log_ppl_ratio: (s.log_ppl_ratio.mean, s.log_ppl_ratio.plus_minus),
            delta_p_rms: (s.p_diff_rms.mean, s.p_diff_rms.plus_minus),
            tokens_per_s: fp.tokens_per_s,
            limit: fp.limit,
            eval_seconds: started.elapsed().as_secs_f64(),
        });
    }
    drop(reference);
    // Smallest first; the base last, as the reference.
    rows.sort_by_key(|r| (r.is_base(), r.bytes, r.name()));

    Ok(Report {
        base: opts.base.clone(),
        source: windows.source,
        dataset: matches!(opts.input, Input::Dataset(_)),
        tokens: ppl.tokens,
        short_samples: windows.short_samples,
        windows: ppl.chunks,
        n_ctx: windows.n_ctx,
        scored: ppl.scored,
        kld_top_k: opts.kld_top_k,
        device,
        kv_tokens,
        cache: cache_dir,
        threads: eval.threads,
        kernels: eval.kernels.backend().name().to_owned(),
        rows,
        warnings,
        font: opts.font.clone(),
    })
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let (base, shifted) = args.model.split()?;
    let mut files = args.files.clone();
    if let Some(first) = shifted {
        // With -m, clap put the first of FILES in the base's place.
        files.insert(0, first);
    }
    super::check_model_path(&base)?;
    // A font given by hand must work before minutes of evaluation, not after.
    if let Some(font) = &args.font {
        crate::chart::use_font(Some(font))?;
    }
    let input = match (&args.dataset, args.texts.is_empty()) {
        (Some(set), _) => Input::Dataset(set.clone()),
        (None, false) => Input::Text(args.texts.clone()),
        (None, true) => bail!(
            "give the text to evaluate on with -f TEXT, or a calibration set with --dataset SET"
        ),
    };
    let dir = args
        .output
        .clone()
        .unwrap_or_else(|| default_output_dir(&base));
    super::check_output_dir(&dir, "the report folder")?;
    if let Some(cache) = &args.cache {
        super::check_output_dir(cache, "the cache folder")?;
    }
    let options = Options {
        files,
        types: args.types.clone(),
        ctx: args.ctx.ctx,
        chunks: args.chunks,
        kld_top_k: args.kld_top_k.map(|k| k as usize),
        threads: args.threads.given(),
        device: args.device.device.clone(),
        cache: args.cache.clone(),
        font: args.font.clone(),
        ..Options::new(base.clone(), input)
    };
    let bar = Bar::new(!args.json);
    let report = compare(&options, &bar)?;
    // The files first: they are the lasting result, whatever becomes of stdout.
    let outputs: Outputs = write_outputs(&report, &dir)?;
    for w in report.warnings.iter().chain(&outputs.warnings) {
        eprintln!("memwall: warning: {w}");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report::json(&report))?);
    } else {
        print!("{}", render_table(&report));
        let cache = report::cache_line(&report);
        if !cache.is_empty() {
            println!("{cache}");
        }
        let mut written = vec![&outputs.markdown, &outputs.json, &outputs.svg];
        written.extend(outputs.png.as_ref());
        let names: Vec<String> = written
            .iter()
            .map(|p| {
                p.file_name()
                    .map_or(p.display(), |n| Path::new(n).display())
                    .to_string()
            })
            .collect();
        println!("wrote {} in {}", names.join(", "), outputs.dir.display());
    }
    Ok(())
}
