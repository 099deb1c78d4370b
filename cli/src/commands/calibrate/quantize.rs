//! `memwall calibrate quantize`: AWQ and/or GPTQ into ordinary GGUF blocks.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memwall_calibrate::dataset::Dataset;
use memwall_calibrate::fit::{self, Fitted, Probing, Target};
use memwall_calibrate::gptq;
use memwall_calibrate::quantize::{self, Method, Settings};
use memwall_format::ggml_type::FileTypeInfo;
use memwall_format::gguf::GgufModel;
use memwall_quantize::job::Options;
use memwall_quantize::recipe::Recipe;
use memwall_runtime::eval;
use memwall_runtime::forward::Model;
use memwall_runtime::kernels::Kernels;
use memwall_runtime::tokenizer::Tokenizer;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::commands::quantize::{ftype_or_error, load_recipe};
use crate::progress::Bar;

/// The calibration methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MethodArg {
    /// Activation-aware scales folded into the norms and preceding matrices.
    Awq,
    /// Error-feedback rounding onto the target blocks' grids.
    Gptq,
    /// Both: AWQ's scales, then GPTQ's rounding.
    #[value(name = "awq+gptq")]
    AwqGptq,
}

/// Arguments of `memwall calibrate quantize`.
#[derive(clap::Args)]
pub struct Args {
    /// The float model (F16, BF16 or F32 GGUF).
    #[arg(short = 'm', long = "model", value_name = "MODEL.gguf")]
    pub model: PathBuf,
    /// The calibration set (`memwall calibrate dataset`).
    #[arg(long, value_name = "SET.jsonl", conflicts_with = "file")]
    pub dataset: Option<PathBuf>,
    /// A plain text instead of a set: cut into --samples windows of
    /// --seq-len tokens, each starting with BOS (as llama-imatrix cuts it).
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    pub file: Option<PathBuf>,
    /// Windows of the text to use.
    #[arg(long, default_value_t = 128, value_name = "N", requires = "file")]
    pub samples: usize,
    /// Tokens per window of the text.
    #[arg(long, default_value_t = 512, value_name = "N", requires = "file")]
    pub seq_len: usize,
    /// The calibration method.
    #[arg(long, value_enum, default_value = "awq+gptq")]
    pub method: MethodArg,
    /// The quantization type (as for `memwall quantize`), e.g. Q4_K_M.
    #[arg(long = "type", value_name = "TYPE")]
    pub ty: Option<String>,
    /// A recipe (built-in name or TOML file) instead of --type.
    #[arg(long, value_name = "RECIPE", conflicts_with = "ty")]
    pub recipe: Option<String>,
    /// Instead of --type or --recipe: fit a mix of types to this size (or to
    /// --device's RAM) as `memwall calibrate fit` does, with an importance
    /// matrix and probes from the calibration samples, then calibrate onto it.
    #[command(flatten)]
    pub fit: super::fit::BudgetArgs,
    /// Where to write the calibrated GGUF.
    #[arg(short = 'o', long = "output", value_name = "OUT.gguf")]
    pub output: PathBuf,
    /// GPTQ dampening, as a fraction of the mean Hessian diagonal.
    #[arg(long, default_value_t = 0.01, value_name = "F")]
    pub damp: f64,
    /// AWQ exponents tried (α = 0, 1/N, …, (N−1)/N).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub awq_grid: usize,
    /// Continue an interrupted run from its last finished layer (kept in
    /// OUT.gguf.calibrating/), refusing if the model, data or options differ.
    /// (Running the same command again also continues it; the file is the
    /// same as an uninterrupted run's.)
    #[arg(long)]
    pub resume: bool,
    /// Refuse to start when the estimated peak memory is more than this
    /// many MiB (default: the memory available now).
    #[arg(long, value_name = "MiB")]
    pub memory_limit: Option<u64>,
    #[command(flatten)]
    pub threads: crate::args::Threads,
    /// Print a JSON report instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// The calibration samples a budget is fitted on.
struct Probe<'a, 'm> {
    model: &'a mut Model<'m>,
    tokenizer: &'a Tokenizer,
    samples: &'a [Vec<u32>],
    seq_len: usize,
}

/// Fits `budget` as `memwall calibrate fit` does, with the samples' importance
/// matrix and their first windows as the probe text; the fit and its recipe.
fn fit_samples(
    args: &Args,
    gguf: &GgufModel,
    probe: Probe<'_, '_>,
    budget: u64,
    bar: &Bar,
) -> Result<(Fitted, Recipe)> {
    // With the statistics of an output head of its own: the calibration
    // rounds it on its input, so the fit weighs its errors by them (a head
    // tied to the embeddings is left plain, and every position's logits
    // would be computed for nothing).
    let own_head = gguf.tensor("output.weight").is_some();
    let stats = memwall_calibrate::imatrix::from_samples(
        probe.model,
        probe.samples,
        probe.seq_len,
        own_head,
        "calibration samples",
        bar,
    )
    .with_context(|| format!("{}: importance matrix", args.model.display()))?;
    let imatrix = stats.to_imatrix()?;
    let tokens: Vec<u32> = probe.samples.iter().flatten().copied().collect();
    let n_ctx = probe.seq_len.max(4);
    let options = eval::Options {
        n_ctx,
        n_batch: n_ctx,
        max_chunks: Some(PROBE_WINDOWS),
        bos: probe
            .tokenizer
            .add_bos()
            .then(|| probe.tokenizer.bos())
            .flatten(),
        all_outputs: false,
    };
    let probing = Probing {
        tokens: &tokens,
        options: &options,
        compute: probe.model.compute(),
        scratch: &std::env::temp_dir(),
    };
    let target = Target {
        candidates: fit::DEFAULT_CANDIDATES.to_vec(),
        probe: fit::DEFAULT_PROBE,
        budget,
    };
    let fitted = fit::fit(gguf, &args.model, Some(&imatrix), &probing, &target, bar)
        .with_context(|| format!("{}: fitting {budget} bytes", args.model.display()))?;
    let name = super::fit::recipe_name(&args.output);
    let description = format!(
        "{} (predicted KLD {:.5})",
        fitted_to(budget),
        fitted.predicted_kld()
    );
    let recipe = fitted.recipe(&name, &description);
    Ok((fitted, recipe))
}

/// How a recipe fitted by this command to `budget` bytes describes itself.
fn fitted_to(budget: u64) -> String {
    format!("fitted to {budget} bytes by memwall calibrate quantize")
}

/// The recipe an interrupted run of this command fitted to `budget` bytes,
/// if its work folder holds one: continuing uses it rather than fitting
/// again (the fit is the slow part of a short run, and the folder's layers
/// were calibrated onto exactly these types).
fn interrupted_fit(output: &Path, budget: u64) -> Option<Recipe> {
    let text = memwall_calibrate::interrupted_recipe(output)?;
    let recipe = Recipe::parse(&text).ok()?;
    recipe
        .description
        .starts_with(&format!("{} (", fitted_to(budget)))
        .then_some(recipe)
}

/// Options for `ftype` with `recipe`.
fn with_recipe(ftype: &'static FileTypeInfo, recipe: Option<Recipe>) -> Options {
    let mut options = Options::new(ftype);
    options.recipe = recipe;
    options
}

/// Probe windows of a fit made from the calibration samples.
const PROBE_WINDOWS: usize = 8;

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let threads = args.threads.count();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("starting the worker threads")?;
    pool.install(|| calibrate(&args, threads))
}

fn calibrate(args: &Args, threads: usize) -> Result<()> {
    let recipe = args.recipe.as_deref().map(load_recipe).transpose()?;
    let fitting = args.fit.given();
    // The target as given; None when a budget is fitted first.
    let given = match (&args.ty, recipe, fitting) {
        (Some(_), _, true) | (_, Some(_), true) => bail!(
            "--budget and --device fit a mix of types themselves; leave out --type and --recipe"
        ),
        (Some(t), recipe, false) => Some(with_recipe(ftype_or_error(t)?, recipe)),
        (None, Some(r), false) => Some(with_recipe(r.base, Some(r))),
        (None, None, true) => None,
        (None, None, false) => bail!(
            "give the target with --type TYPE (e.g. Q4_K_M), --recipe RECIPE or --budget SIZE"
        ),
    };
    // Before any work: what memwall cannot write, and where it cannot write.
    if let Some(options) = &given {
        memwall_quantize::names::check_writable(options.ftype)?;
    }
    crate::commands::check_output_file(&args.output, "the calibrated model")?;
    let gguf = crate::commands::open_model(&args.model)?;
    let budget = fitting
        .then(|| args.fit.bytes(&gguf, &args.model))
        .transpose()?;
    let tokenizer = Tokenizer::from_gguf(gguf.metadata())
        .with_context(|| format!("{}: tokenizer", args.model.display()))?;
    let (samples, label, sha, seq_len) = match (&args.dataset, &args.file) {
        (Some(path), _) => {
            let set = Dataset::load(path, &tokenizer)
                .with_context(|| format!("{}: calibration set", path.display()))?;
            (
                set.samples,
                path.display().to_string(),
                set.sha256,
                set.seq_len,
            )
        }
        (None, Some(path)) => {
            let bytes = std::fs::read(path)
                .with_context(|| format!("{}: cannot read the text", path.display()))?;
            let text = String::from_utf8(bytes.clone())
                .with_context(|| format!("{}: not UTF-8", path.display()))?;
            let tokens = tokenizer.encode(&text, true, false);
            let bos = tokenizer.add_bos().then(|| tokenizer.bos()).flatten();
            let n = args.seq_len.max(2);
            let samples: Vec<Vec<u32>> = tokens
                .chunks_exact(n)
                .take(args.samples)
                .map(|c| {
                    let mut s = c.to_vec();
                    if let Some(b) = bos {
                        s[0] = b;
                    }
                    s
                })
                .collect();
            if samples.is_empty() {
                bail!(
                    "{}: {} tokens, fewer than one window of --seq-len {n}; use a longer text or a smaller --seq-len",
                    path.display(),
                    tokens.len()
                );
            }
            let sha = format!("{:x}", Sha256::digest(&bytes));
            (samples, path.display().to_string(), sha, n)
        }
        (None, None) => bail!(
            "give calibration data: --dataset SET.jsonl (from `memwall calibrate dataset`) or -f TEXT"
        ),
    };
    let mut model = Model::new(
        &gguf,
        seq_len.max(samples.iter().map(Vec::len).max().unwrap_or(1)),
    )
    .with_context(|| format!("{}: cannot run this model", args.model.display()))?;
    model.set_compute(Kernels::from_env()?, threads);
    let bar = Bar::new(!args.json);
    let (options, fitted) = match (given, budget) {
        (Some(options), _) => (options, None),
        (None, Some(bytes)) if let Some(recipe) = interrupted_fit(&args.output, bytes) => {
            if !args.json {
                eprintln!(
                    "continuing the interrupted run with the recipe it fitted ({})",
                    recipe.description
                );
            }
            (with_recipe(recipe.base, Some(recipe)), None)
        }
        (None, Some(bytes)) => {
            let probe = Probe {
                model: &mut model,
                tokenizer: &tokenizer,
                samples: &samples,
                seq_len,
            };
            let (fitted, recipe) = fit_samples(args, &gguf, probe, bytes, &bar)?;
            (with_recipe(recipe.base, Some(recipe)), Some(fitted))
        }
        (None, None) => bail!("give the target with --type, --recipe or --budget"),
    };
    let ftype = options.ftype;
    let settings = Settings {
        method: match args.method {
            MethodArg::Awq => Method::Awq,
            MethodArg::Gptq => Method::Gptq,
            MethodArg::AwqGptq => Method::AwqGptq,
        },
        awq_grid: args.awq_grid.max(1),
        gptq: gptq::Settings { damp: args.damp },
        dataset: label,
        dataset_sha256: sha,
        resume: args.resume,
        memory_limit: args
            .memory_limit
            .map(|m| m << 20)
            .or_else(memwall_runtime::residency::available_memory),
    };
    let report = quantize::run(
        &gguf,
        &args.model,
        &mut model,
        &samples,
        &options,
        &settings,
        &args.output,
        &bar,
    )
    .map_err(|e| {
        let kept = memwall_calibrate::finished_layers(&args.output);
        let what = if kept > 0 {
            format!(
                "{}: calibrated quantization ({kept} finished layers are kept in {}.calibrating; the same command continues from there)",
                args.model.display(),
                args.output.display()
            )
        } else {
            format!("{}: calibrated quantization", args.model.display())
        };
        anyhow::Error::from(e).context(what)
    })?;
    let tokens: usize = samples.iter().map(Vec::len).sum();
    if args.json {
        let groups: Vec<_> = report.groups.iter().map(|g| g.to_json()).collect();
        let out = json!({
            "model": args.model, "output": args.output, "method": settings.method.name(),
            "type": ftype.name, "recipe": options.recipe.as_ref().map(|r| r.name.clone()),
            "samples": samples.len(), "tokens": tokens, "calibrated": report.calibrated,
            "plain": report.plain, "unreached_experts": report.unreached_experts,
            "bytes": report.bytes, "seconds": report.seconds,
            "layer_seconds": report.layer_seconds, "groups": groups,
            "forward_seconds": report.forward_seconds, "hessian_seconds": report.hessian_seconds,
            "awq_seconds": report.awq_seconds, "quantize_seconds": report.quantize_seconds,
            "factor_seconds": report.factor_seconds,
            "resumed_layers": report.resumed_layers,
            "memory": {"total": report.memory.total, "hidden": report.memory.hidden,
                       "weights": report.memory.weights, "hessians": report.memory.hessians,
                       "factor": report.memory.factor, "kept": report.memory.kept},
            "fit": budget.map(|b| json!({
                "budget": b, "predicted_kld": fitted.as_ref().map(Fitted::predicted_kld),
                "recipe": options.recipe.as_ref().map(|r| r.to_toml()),
                "seconds": fitted.as_ref().map(|f| f.measure_seconds),
                // Continued with the recipe the interrupted run fitted.
                "reused": fitted.is_none(),
            })),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for g in &report.groups {
            let awq = match (g.alpha, g.awq_error_ratio) {
                (Some(a), Some(r)) => format!("AWQ α={a:.2} error ×{r:.3}"),
                (None, Some(_)) => "AWQ: no scaling better".into(),
                _ => String::new(),
            };
            let damp = g
                .damp
                .map_or(String::new(), |d| format!("GPTQ damp {d:.2}"));
            println!("{:<22} {:>8} tokens  {awq}  {damp}", g.input, g.tokens);
        }
        if let (Some(f), Some(budget), Some(recipe)) = (&fitted, budget, &options.recipe) {
            println!(
                "fitted to {:.2} MiB: {} rules over {} matrices, predicted KLD {:.6} before calibration (the recipe is in the output's memwall.recipe)",
                budget as f64 / (1 << 20) as f64,
                recipe.rules.len(),
                f.sensitivity.matrices.len(),
                f.predicted_kld()
            );
        }
        if report.unreached_experts > 0 {
            println!(
                "{} expert matrices saw no calibration token and were rounded without calibration",
                report.unreached_experts
            );
        }
        println!(
            "{} matrices calibrated ({}), {} tensors as plain quantization; {} samples, {tokens} tokens; {:.1} s → {} ({:.1} MiB)",
            report.calibrated,
            settings.method.name(),
            report.plain,
            samples.len(),
            report.seconds,
            args.output.display(),
            report.bytes as f64 / (1 << 20) as f64
        );
        if report.resumed_layers > 0 {
            println!(
                "resumed: {} layers were finished by the interrupted run",
                report.resumed_layers
            );
        }
        println!(
            "memory: about {:.0} MiB at the peak (estimated before starting)",
            report.memory.total as f64 / (1 << 20) as f64
        );
        println!(
            "time: {:.1} s running layers (of which {:.1} s Hessians), {:.1} s AWQ search, {:.1} s quantizing (of which {:.1} s factorising)",
            report.forward_seconds,
            report.hessian_seconds,
            report.awq_seconds,
            report.quantize_seconds,
            report.factor_seconds
        );
        println!(
            "next: memwall validate {} --reference {} -f TEXT",
            args.output.display(),
            args.model.display()
        );
    }
    Ok(())
}
