//! `memwall quantize IN [OUT] TYPE [THREADS]`: llama-quantize's command, byte
//! for byte, plus recipes, `--dry-run` and `--json`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use memwall_format::ggml_type::FileTypeInfo;
use memwall_format::suggest::did_you_mean;
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::job::{self, ImatrixInput, ImatrixUse, Options, Plan};
use memwall_quantize::names;
use memwall_quantize::recipe::{self, PRESETS, Recipe};
use memwall_quantize::rules::Reason;
use serde_json::json;

use crate::progress::Bar;
use crate::render::human_bytes;

/// Arguments of `memwall quantize`.
#[derive(clap::Args)]
#[command(mut_arg("model", |a| a.help("Input GGUF (F32, F16 or BF16; any file of a split model); \
    or give it with -m").value_name("IN")))]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// `OUT TYPE`, or just `TYPE` (the output is then the input's name without
    /// its -f16/-bf16/-f32 ending, plus -TYPE.gguf, next to it:
    /// model-f16.gguf → model-Q4_K_M.gguf), or just `OUT` with --recipe; then,
    /// as llama-quantize takes it, a thread count.
    #[arg(value_name = "[OUT] TYPE [THREADS]", num_args = 0..=3, index = 2)]
    pub rest: Vec<String>,
    /// A recipe: a TOML file or a built-in name (attn-f16-ffn-q4,
    /// attn-q8-ffn-q4, attn-q8-ffn-q4-down-q6). TYPE, if given, replaces its base.
    #[arg(long, value_name = "FILE|NAME")]
    pub recipe: Option<String>,
    /// Importance matrix from llama-imatrix (GGUF or legacy .dat).
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// Use imatrix entries only for tensors whose name contains NAME (repeatable).
    #[arg(long, value_name = "NAME", conflicts_with = "exclude_weights")]
    pub include_weights: Vec<String>,
    /// Ignore imatrix entries for tensors whose name contains NAME (repeatable).
    #[arg(long, value_name = "NAME")]
    pub exclude_weights: Vec<String>,
    /// Type of output.weight (and of tied token embeddings).
    #[arg(long, value_name = "TYPE")]
    pub output_tensor_type: Option<String>,
    /// Type of token_embd.weight.
    #[arg(long, value_name = "TYPE")]
    pub token_embedding_type: Option<String>,
    /// REGEX=TYPE: tensors whose name matches get TYPE; first match wins (repeatable).
    #[arg(long, value_name = "REGEX=TYPE")]
    pub tensor_type: Vec<String>,
    /// A file of --tensor-type rules (REGEX=TYPE), separated by spaces or
    /// newlines; they take its place among the --tensor-type rules.
    #[arg(long, value_name = "FILE")]
    pub tensor_type_file: Vec<PathBuf>,
    /// Leave these blocks out (comma-separated numbers); the others are
    /// renumbered and the block count follows. Advanced: the model loses those layers.
    #[arg(long, value_name = "L0,L1,…", value_delimiter = ',')]
    pub prune_layers: Vec<u32>,
    /// KEY=TYPE:VALUE: set this metadata value in the output (TYPE int,
    /// float, bool or str; repeatable), as llama-quantize's --override-kv.
    #[arg(long, value_name = "KEY=TYPE:VALUE")]
    pub override_kv: Vec<String>,
    /// Give every quantizable tensor the base type (no mix rules).
    #[arg(long)]
    pub pure: bool,
    /// Leave output.weight as it is.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// Allow already-quantized input (quality suffers; prefer the F16 model).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Write one output file per input split file.
    #[arg(long)]
    pub keep_split: bool,
    #[command(flatten)]
    pub threads: crate::args::Threads,
    /// llama-quantize's row buffer limit; accepted and not needed: memwall
    /// holds at most a few 16 MiB slabs of rows whatever the tensor.
    #[arg(long, value_name = "MiB")]
    pub max_buffer_size: Option<u64>,
    /// Print the plan (each tensor's type and size, totals, file size); write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Valid TYPE names, for messages: what memwall writes (and what it only plans, if any).
pub(crate) fn ftype_names() -> String {
    names::file_type_list()
}

/// A file type by llama-quantize's name or number.
pub(crate) fn parse_ftype(name: &str) -> Option<&'static FileTypeInfo> {
    names::parse_file_type(name)
}

/// A file type, or the error that names the nearest one and the valid list.
pub(crate) fn ftype_or_error(name: &str) -> Result<&'static FileTypeInfo> {
    parse_ftype(name).ok_or_else(|| anyhow::anyhow!(names::unknown_file_type(name)))
}

/// A tensor type given with `flag`; a plan (`--dry-run`) may name types
/// memwall cannot encode yet.
fn parse_type(name: &str, flag: &str, dry_run: bool) -> Result<memwall_format::GgmlType> {
    let planned = memwall_format::GgmlType::all().find(|t| t.name().eq_ignore_ascii_case(name));
    match (dry_run, planned) {
        (true, Some(t)) => Ok(t),
        _ => names::parse_tensor_type(name).map_err(|e| anyhow::anyhow!("{flag}: {e}")),
    }
}

/// The input's name without .gguf and without the -f16/-bf16/-f32 (or
/// .f16…) its converter gave it: what quantized files made from it are named after.
pub(crate) fn output_stem(input: &Path) -> String {
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let lower = stem.to_ascii_lowercase();
    ["-f16", "-bf16", "-f32", ".f16", ".bf16", ".f32"]
        .iter()
        .find(|s| lower.ends_with(*s))
        .map_or(stem.clone(), |s| stem[..stem.len() - s.len()].to_owned())
}

/// `<output_stem>-<suffix>.gguf` next to the input: the short form's output.
pub(crate) fn default_output(input: &Path, suffix: &str) -> PathBuf {
    input.with_file_name(format!("{}-{suffix}.gguf", output_stem(input)))
}

/// What the positional arguments say: the output, the file type and
/// llama-quantize's trailing thread count.
struct Positional {
    out: PathBuf,
    ftype: &'static FileTypeInfo,
    threads: Option<usize>,
}

fn thread_count(text: &str, usage: &str) -> Result<usize> {
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("'{text}' is not a thread count (a number above 0): {usage}"),
    }
}

/// Resolves `[OUT] TYPE [THREADS]` as llama-quantize reads them: a first
/// argument that names a type is the type (short form), else it is the output.
fn positional(input: &Path, rest: &[String], recipe: Option<&Recipe>) -> Result<Positional> {
    const USAGE: &str = "memwall quantize IN [OUT] TYPE [THREADS]";
    let is_type = |s: &str| parse_ftype(s).is_some();
    let looks_like_path = |s: &str| s.ends_with(".gguf") || s.contains('/');
    let short = |ftype: &'static FileTypeInfo, threads: Option<usize>| Positional {
        out: default_output(input, ftype.name),
        ftype,
        threads,
    };
    match (rest, recipe) {
        ([], Some(r)) => Ok(Positional {
            out: default_output(input, &r.name),
            ftype: r.base,
            threads: None,
        }),
        ([], None) => bail!("missing TYPE (or --recipe): {USAGE}. {}", ftype_names()),
        ([one], _) if is_type(one) => {
            let ftype = ftype_or_error(one)?;
            Ok(match recipe {
                Some(r) => Positional {
                    out: default_output(input, &r.name),
                    ftype,
                    threads: None,
                },
                None => short(ftype, None),
            })
        }
        ([one], Some(r)) => Ok(Positional {
            out: PathBuf::from(one),
            ftype: r.base,
            threads: None,
        }),
        ([one], None) if looks_like_path(one) => bail!(
            "missing TYPE after the output {one}: {USAGE} (e.g. memwall quantize {} {one} \
             Q4_K_M). {}",
            input.display(),
            ftype_names()
        ),
        ([one], None) => Err(ftype_or_error(one).unwrap_err()),
        ([ty, second], _) if is_type(ty) => {
            if looks_like_path(second) || second.parse::<usize>().is_err() {
                bail!(
                    "{second} after the type {ty}: the output comes before the type: memwall \
                     quantize {} {second} {ty}",
                    input.display()
                );
            }
            let ftype = ftype_or_error(ty)?;
            let threads = Some(thread_count(second, USAGE)?);
            Ok(match recipe {
                Some(r) => Positional {
                    out: default_output(input, &r.name),
                    ftype,
                    threads,
                },
                None => short(ftype, threads),
            })
        }
        ([out, ty], _) => Ok(Positional {
            out: PathBuf::from(out),
            ftype: ftype_or_error(ty)?,
            threads: None,
        }),
        ([ty, _, _], _) if is_type(ty) => bail!(
            "too many arguments after the type {ty}: {USAGE} (the output comes before the type)"
        ),
        ([out, ty, threads], _) => Ok(Positional {
            out: PathBuf::from(out),
            ftype: ftype_or_error(ty)?,
            threads: Some(thread_count(threads, USAGE)?),
        }),
        _ => bail!("too many arguments: {USAGE}"),
    }
}

pub(crate) fn load_recipe(spec: &str) -> Result<Recipe> {
    if let Some(r) = Recipe::preset(spec) {
        return Ok(r);
    }
    let path = Path::new(spec);
    if !path.exists() {
        let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
        bail!(
            "no recipe file {spec} and no built-in recipe of that name{} (built-in: {})",
            did_you_mean(spec, names.iter().copied()),
            names.join(", ")
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading recipe {spec}"))?;
    Recipe::parse(&text).map_err(|e| anyhow::anyhow!("recipe {spec}: {e}"))
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let (input, shifted) = args.model.split()?;
    let mut rest = args.rest.clone();
    if let Some(first) = shifted {
        // With -m, clap put the first of [OUT] TYPE [THREADS] in the input's place.
        rest.insert(0, first.to_string_lossy().into_owned());
    }
    let recipe = args.recipe.as_deref().map(load_recipe).transpose()?;
    let Positional {
        out,
        ftype,
        threads: trailing,
    } = positional(&input, &rest, recipe.as_ref())?;
    if let (Some(t), Some(given)) = (trailing, args.threads.given()) {
        if t != given {
            bail!("two thread counts: -t {given} and {t} after the type; give one");
        }
    }
    names::check_offered(ftype)?;
    if !args.dry_run {
        // Before any work: what memwall cannot write, and where it cannot write.
        names::check_writable(ftype)?;
        let needs_imatrix = ftype.base.is_some_and(|base| {
            memwall_quantize::rules::requires_imatrix("blk.0.ffn_down.weight", base, ftype.name)
        });
        if needs_imatrix && args.imatrix.is_none() {
            bail!(
                "{} needs an importance matrix: pass --imatrix FILE (make one with \
                 `memwall calibrate imatrix -m {} -f TEXT`), or choose {}",
                ftype.name,
                input.display(),
                if ftype.name == "Q2_K_S" {
                    "Q2_K"
                } else {
                    "Q3_K_S or IQ3_S"
                }
            );
        }
        super::check_output_file(&out, "the quantized model")?;
    }
    let mut options = Options::new(ftype);
    options.pure = args.pure;
    options.leave_output = args.leave_output_tensor;
    options.allow_requantize = args.allow_requantize;
    options.keep_split = args.keep_split;
    options.kv_overrides = super::parse_overrides(&args.override_kv)?;
    options.prune_layers = args.prune_layers.clone();
    options.output_type = args
        .output_tensor_type
        .as_deref()
        .map(|t| parse_type(t, "--output-tensor-type", args.dry_run))
        .transpose()?;
    options.token_embedding_type = args
        .token_embedding_type
        .as_deref()
        .map(|t| parse_type(t, "--token-embedding-type", args.dry_run))
        .transpose()?;
    if !args.tensor_type_file.is_empty() {
        // The command line's translation (crate::spellings) puts each file's
        // rules in its place among --tensor-type; one left here was not read.
        bail!("--tensor-type-file must be given on the command line");
    }
    for spec in &args.tensor_type {
        let Some((pattern, ty)) = spec.split_once('=') else {
            bail!("--tensor-type {spec}: expected REGEX=TYPE, e.g. attn_v=q8_0");
        };
        if pattern.is_empty() || ty.is_empty() {
            bail!("--tensor-type {spec}: both the pattern and the type are needed");
        }
        // llama-quantize lower-cases the pattern.
        let ty = parse_type(ty, "--tensor-type", args.dry_run)?;
        let rule = recipe::make_override(&pattern.to_lowercase(), ty, Vec::new(), false)
            .map_err(|e| anyhow::anyhow!("--tensor-type {spec}: {e}"))?;
        options.tensor_types.push(rule);
    }
    options.recipe = recipe;
    if let Some(path) = &args.imatrix {
        let mut data = Imatrix::load(path)?;
        data.filter(&args.include_weights, &args.exclude_weights);
        if data.entries.is_empty() {
            bail!("--include-weights/--exclude-weights left no imatrix entries");
        }
        options.imatrix = Some(ImatrixInput {
            label: path.to_string_lossy().into_owned(),
            data,
        });
    } else if !args.include_weights.is_empty() || !args.exclude_weights.is_empty() {
        bail!("--include-weights and --exclude-weights select imatrix entries; pass --imatrix too");
    }

    let model = super::open_model(&input)?;
    let plan = job::plan(&model, &input, &options)?;
    let paths = plan.output_paths(&out);
    let sizes = plan.file_sizes()?;
    if args.dry_run {
        let text = if args.json {
            serde_json::to_string_pretty(&plan_json(&input, &plan, &options, &paths, &sizes))?
                + "\n"
        } else {
            plan_text(&input, &plan, &options, &paths, &sizes)
        };
        print!("{text}");
        return Ok(());
    }
    if !args.json {
        for w in summarized(&plan.warnings) {
            eprintln!("warning: {w}");
        }
    }

    let threads = trailing.unwrap_or_else(|| args.threads.count());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .context("starting worker threads")?;
    let bar = Bar::new(!args.json);
    let started = Instant::now();
    let imatrix = options.imatrix.as_ref().map(|i| &i.data);
    let written =
        pool.install(|| job::run(&model, &plan, imatrix, options.allow_requantize, &out, &bar))?;
    let seconds = started.elapsed().as_secs_f64();
    let total: u64 = sizes.iter().sum();
    if args.json {
        let mut report = plan_json(&input, &plan, &options, &written, &sizes);
        report["seconds"] = json!(seconds);
        report["threads"] = json!(threads);
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let converted = plan.tensors.iter().filter(|t| t.converts()).count();
        let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        println!(
            "wrote {}: {} ({:.2} bits per weight), {} tensors ({converted} re-encoded) in {seconds:.1} s",
            names.join(", "),
            human_bytes(total),
            plan.bits_per_weight(),
            plan.tensors.len(),
        );
        println!(
            "next: memwall inspect {}   (or run it with llama.cpp: llama-cli -m {})",
            names[0], names[0]
        );
    }
    Ok(())
}

/// At most 8 warnings, then a count.
fn summarized(warnings: &[String]) -> Vec<String> {
    let mut shown: Vec<String> = warnings.iter().take(8).cloned().collect();
    if warnings.len() > 8 {
        shown.push(format!(
            "… and {} more (see --dry-run for every tensor)",
            warnings.len() - 8
        ));
    }
    shown
}

fn reason_text(reason: &Reason) -> String {
    match reason {
        Reason::Kept => "kept (not quantized)".into(),
        Reason::Base => "base type".into(),
        Reason::Mix => "mix rule".into(),
        Reason::Pattern(p) => format!("rule '{p}'"),
        Reason::OutputType => "output type".into(),
        Reason::EmbeddingType => "token embedding type".into(),
        Reason::Fallback(from) => format!("fallback from {from}"),
    }
}

fn reason_json(reason: &Reason) -> serde_json::Value {
    match reason {
        Reason::Kept => json!({"kind": "kept"}),
        Reason::Base => json!({"kind": "base"}),
        Reason::Mix => json!({"kind": "mix"}),
        Reason::Pattern(p) => json!({"kind": "rule", "pattern": p}),
        Reason::OutputType => json!({"kind": "output_type"}),
        Reason::EmbeddingType => json!({"kind": "token_embedding_type"}),
        Reason::Fallback(from) => json!({"kind": "fallback", "from": from.name()}),
    }
}

fn imatrix_text(u: ImatrixUse) -> &'static str {
    match u {
        ImatrixUse::None => "",
        ImatrixUse::Used => "imatrix",
        ImatrixUse::Missing => "no imatrix entry",
        ImatrixUse::Ignored => "imatrix ignored (size)",
    }
}

fn shape(dims: &[u64]) -> String {
    dims.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join("×")
}

fn plan_text(
    input: &Path,
    plan: &Plan,
    options: &Options,
    paths: &[PathBuf],
    sizes: &[u64],
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "input:  {}", input.display());
    let recipe = options
        .recipe
        .as_ref()
        .map_or(String::new(), |r| format!(", recipe {}", r.name));
    let _ = writeln!(s, "type:   {} ({}){recipe}", plan.ftype.name, plan.ftype.id);
    let name_w = plan
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(6);
    let _ = writeln!(
        s,
        "\n{:<name_w$}  {:<16} {:>7}    {:<7} {:>10}  why",
        "tensor", "shape", "from", "to", "size"
    );
    for t in &plan.tensors {
        let extra = imatrix_text(t.imatrix);
        let extra = if extra.is_empty() {
            String::new()
        } else {
            format!(", {extra}")
        };
        let _ = writeln!(
            s,
            "{:<name_w$}  {:<16} {:>7} -> {:<7} {:>10}  {}{extra}",
            t.name,
            shape(&t.dims),
            t.source.name(),
            t.target.name(),
            human_bytes(t.target_bytes),
            reason_text(&t.reason),
        );
    }
    let mut by_type: std::collections::BTreeMap<_, (usize, u64, u64)> = Default::default();
    for t in &plan.tensors {
        let e = by_type.entry(t.target).or_default();
        e.0 += 1;
        e.1 += t.elements;
        e.2 += t.target_bytes;
    }
    let _ = writeln!(s, "\nby type:");
    for (ty, (n, elements, bytes)) in by_type {
        let _ = writeln!(
            s,
            "  {:<7} {n:>5} tensors {:>12} weights {:>10}  {:.2} bpw",
            ty.name(),
            elements,
            human_bytes(bytes),
            bytes as f64 * 8.0 / elements.max(1) as f64
        );
    }
    let total: u64 = sizes.iter().sum();
    let _ = writeln!(
        s,
        "\ntotal:  {} tensors, {} weights: {} -> {} of tensor data ({:.2} bits per weight)",
        plan.tensors.len(),
        plan.elements(),
        human_bytes(plan.source_bytes()),
        human_bytes(plan.target_bytes()),
        plan.bits_per_weight()
    );
    for (p, size) in paths.iter().zip(sizes) {
        let _ = writeln!(
            s,
            "file:   {} would be {} ({size} bytes)",
            p.display(),
            human_bytes(*size)
        );
    }
    if paths.len() > 1 {
        let _ = writeln!(s, "        {} in all", human_bytes(total));
    }
    for w in &plan.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    s
}

fn plan_json(
    input: &Path,
    plan: &Plan,
    options: &Options,
    paths: &[PathBuf],
    sizes: &[u64],
) -> serde_json::Value {
    let tensors: Vec<_> = plan
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "shape": t.dims,
                "source": t.source.name(),
                "target": t.target.name(),
                "source_bytes": t.source_bytes,
                "target_bytes": t.target_bytes,
                "reason": reason_json(&t.reason),
                "imatrix": imatrix_text(t.imatrix),
            })
        })
        .collect();
    let files: Vec<_> = paths
        .iter()
        .zip(sizes)
        .map(|(p, s)| json!({"path": p, "bytes": s}))
        .collect();
    json!({
        "input": input,
        "file_type": {"name": plan.ftype.name, "id": plan.ftype.id},
        "recipe": options.recipe.as_ref().map(|r| r.name.clone()),
        "tensors": tensors,
        "totals": {
            "tensors": plan.tensors.len(),
            "weights": plan.elements(),
            "source_bytes": plan.source_bytes(),
            "target_bytes": plan.target_bytes(),
            "bits_per_weight": plan.bits_per_weight(),
            "file_bytes": sizes.iter().sum::<u64>(),
            "fallbacks": plan.fallbacks,
        },
        "files": files,
        "warnings": plan.warnings,
    })
}
