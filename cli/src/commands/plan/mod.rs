//! `memwall plan`: will the model fit on the device, with which quantization,
//! and how fast will it decode? The arithmetic is `memwall_quantize::fit`'s;
//! this module gathers the model (GGUF, Hugging Face checkpoint or bare
//! numbers), renders the table and the recommended commands.

mod measure;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memwall_format::GgmlType;
use memwall_format::ggml_type::{FileTypeInfo, file_type};
use memwall_format::gguf::keys;
use memwall_quantize::fit::plan::{self, AsStored, Fit, Row, Run};
use memwall_quantize::fit::{self, Choice, Device, Footprint, KvType, Shape, Speed};
use memwall_quantize::recipe::Recipe;
use serde_json::json;

use crate::render::human_bytes;

/// Arguments of `memwall plan`.
#[derive(clap::Args)]
#[command(mut_arg("ctx", |a| a.help("Context length to plan for")))]
#[command(mut_arg("batch", |a| a.help("Prompt batch size (-b of memwall run and llama-cli)")))]
pub struct Args {
    /// A GGUF file, a Hugging Face checkpoint folder, or a repo id (its
    /// config.json is enough); or give it with -m. Leave out to plan from
    /// --params and friends.
    #[arg(value_name = "MODEL", required_unless_present_any = ["params", "measure_host", "list_devices", "model_flag"])]
    pub model: Option<String>,
    /// The model, as llama.cpp's tools take it (instead of the first argument).
    #[arg(
        short = 'm',
        long = "model",
        value_name = "MODEL",
        id = "model_flag",
        conflicts_with = "model"
    )]
    pub model_flag: Option<String>,
    #[command(flatten)]
    pub device: crate::args::DeviceArg,
    #[command(flatten)]
    pub ctx: crate::args::Ctx2048,
    /// KV cache type (memwall's runtime keeps f16; q8_0 is for llama.cpp).
    #[arg(long = "kv-type", default_value = "f16", value_name = "f16|q8_0|f32")]
    pub kv_type: String,
    #[command(flatten)]
    pub batch: crate::args::Batch512,
    /// Quantizations to plan: file types and recipe names or files
    /// (default: F16 Q8_0 Q6_K Q5_K_M Q5_K_S Q4_K_M Q4_K_S IQ4_XS Q3_K_M Q3_K_S Q2_K and the built-in recipes).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub types: Vec<String>,
    /// Pick the best choice whose memory (memwall, in RAM) fits in this many MiB.
    #[arg(long, value_name = "MiB")]
    pub budget: Option<u64>,
    /// With --budget: write the chosen type or recipe as a recipe file for `memwall quantize --recipe`.
    #[arg(long, value_name = "FILE", requires = "budget")]
    pub write_recipe: Option<PathBuf>,
    /// Bare numbers: total parameters (e.g. 35e9).
    #[arg(long, value_parser = parse_count, conflicts_with_all = ["model", "model_flag"],
          requires_all = ["layers", "kv_heads", "head_dim", "vocab"])]
    pub params: Option<u64>,
    /// Bare numbers: transformer blocks.
    #[arg(long, requires = "params")]
    pub layers: Option<u32>,
    /// Bare numbers: key/value heads.
    #[arg(long, requires = "params")]
    pub kv_heads: Option<u32>,
    /// Bare numbers: head size.
    #[arg(long, requires = "params")]
    pub head_dim: Option<u64>,
    /// Bare numbers: vocabulary size.
    #[arg(long, requires = "params")]
    pub vocab: Option<u64>,
    /// Bare numbers: hidden size (estimated from the parameters when left out).
    #[arg(long, requires = "params")]
    pub embd: Option<u64>,
    /// Bare numbers: experts per MoE layer.
    #[arg(long, requires_all = ["params", "active_experts"])]
    pub experts: Option<u32>,
    /// Bare numbers: experts each token uses.
    #[arg(long, requires = "experts")]
    pub active_experts: Option<u32>,
    /// Bare numbers: parameters one token uses (MoE; e.g. 3.3e9).
    #[arg(long, value_parser = parse_count, requires = "experts")]
    pub active_params: Option<u64>,
    /// Measure this machine (RAM, memory bandwidth, decode kernels, storage)
    /// and print its device profile (or save it with --save).
    #[arg(long, conflicts_with_all = ["model", "model_flag", "params"])]
    pub measure_host: bool,
    /// With --measure-host: write the profile to FILE.
    #[arg(long, value_name = "FILE", requires = "measure_host")]
    pub save: Option<PathBuf>,
    /// With --measure-host: threads to measure with (default: every core).
    #[arg(short = 't', long, value_name = "N", requires = "measure_host")]
    pub threads: Option<usize>,
    /// List the built-in device profiles.
    #[arg(long)]
    pub list_devices: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The model named, by its first argument or -m.
    fn model_spec(&self) -> Option<&String> {
        self.model_flag.as_ref().or(self.model.as_ref())
    }

    fn ctx(&self) -> u64 {
        self.ctx.ctx as u64
    }

    fn batch(&self) -> u64 {
        self.batch.batch as u64
    }
}

fn parse_count(s: &str) -> Result<u64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number (e.g. 35e9 or 35000000000)"))?;
    if !(1.0..1e15).contains(&v) {
        return Err(format!("{s}: expected 1 to 1e15"));
    }
    Ok(v.round() as u64)
}

/// Where the model's description came from.
enum Source {
    Gguf {
        path: PathBuf,
        /// Its `general.file_type`.
        ftype: Option<&'static FileTypeInfo>,
        /// Whether any tensor is quantized (quantizing it again loses quality).
        quantized: bool,
    },
    /// A checkpoint folder, named by `spec` (the folder or a repo id).
    Checkpoint {
        dir: PathBuf,
        spec: String,
        /// Its BPE tokenizer is one llama.cpp does not recognise: `convert`
        /// will need `--pre` (SentencePiece, or no tokenizer.json: false).
        unknown_pre: bool,
    },
    Numbers,
}

/// The model as the planner sees it, and where it came from.
struct Subject {
    model: plan::Subject,
    source: Source,
}

/// Runs `memwall plan`.
pub fn run(args: Args) -> Result<()> {
    if args.list_devices {
        return list_devices(args.json);
    }
    if args.measure_host {
        return measure::run(&args);
    }
    if args.ctx() > 1 << 24 || args.batch() > 65536 {
        bail!(
            "-c {} -b {}: plan for at most 16777216 tokens of context and batches of 65536",
            args.ctx(),
            args.batch()
        );
    }
    if let Some(path) = &args.write_recipe {
        super::check_output_file(path, "the recipe")?;
    }
    let device = Device::resolve(&args.device.device)?;
    let kv = KvType::parse(&args.kv_type)
        .with_context(|| format!("--kv-type {}: expected f16, q8_0 or f32", args.kv_type))?;
    let subject = subject(&args)?;
    let choices = choices(&args.types)?;
    let run = Run {
        ctx: args.ctx(),
        batch: args.batch(),
        kv,
    };
    let rows = plan::rows(&subject.model, &choices, &device, run)?;
    let ok = plan::eligible(&subject.model, &rows);
    let budget_pick = match args.budget {
        Some(mib) => Some(
            plan::pick_for_budget(&rows, &ok, mib << 20).with_context(|| {
                format!(
                    "nothing fits in {mib} MiB at -c {}: the smallest choice needs {}; lower -c or \
                 raise --budget",
                    args.ctx(),
                    rows.iter()
                        .map(|r| r.memwall.total())
                        .min()
                        .map_or("?".into(), human_bytes)
                )
            })?,
        ),
        None => None,
    };
    if let (Some(i), Some(path)) = (budget_pick, &args.write_recipe) {
        write_recipe(&rows[i], path)?;
    }
    let recommended = budget_pick.or_else(|| plan::recommend(&rows, &ok, device.usable_bytes()));
    // A budget is the user's own choice of size: no second-guessing it.
    let alternatives = match recommended {
        Some(i) if budget_pick.is_none() => {
            plan::alternatives(&subject.model, &choices, &device, run, &rows, i)?
        }
        _ => None,
    };
    if args.json {
        let mut value = to_json(
            &subject,
            &device,
            &args,
            kv,
            &rows,
            recommended,
            budget_pick,
        );
        if let Some(i) = recommended {
            value["quality"] = quality_json(&subject, &rows[i], alternatives.as_ref());
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print_plan(
            &subject,
            &device,
            &args,
            kv,
            &rows,
            recommended,
            budget_pick,
        );
        if let (Some(i), Some(alt)) = (recommended, &alternatives) {
            print_quality(&subject, &rows[i], alt);
        }
    }
    Ok(())
}

/// The file type of a row (its label when it is a file as it is).
fn type_name(row: &Row) -> &str {
    row.choice
        .as_ref()
        .map_or(row.label.as_str(), |c| c.ftype.name)
}

/// How a row's type ranks on quality: llama-quantize's number, or its bits.
fn quality_text(row: &Row) -> String {
    let name = type_name(row);
    match plan::ppl_increase_llama3_8b(name) {
        Some(ppl) => format!(
            "{name} adds {ppl:.2} to Llama-3-8B's perplexity in llama-quantize's own table \
             (Q4_K_M: 0.18, Q3_K_M: 0.66)"
        ),
        None => format!(
            "{} has {:.2} bits per weight and no published loss: expect a visible one",
            row.label, row.bits_per_weight
        ),
    }
}

/// The F16 model a calibrated file of `subject` is made from.
fn f16_input(subject: &Subject) -> String {
    match &subject.source {
        Source::Gguf { path, .. } => crate::render::shell_word(&path.display().to_string()),
        Source::Checkpoint { dir, .. } => format!("{}-f16.gguf", stem(dir)),
        Source::Numbers => "MODEL-f16.gguf".to_owned(),
    }
}

/// `memwall calibrate quantize` making `row`'s type from `subject`'s F16 model.
fn calibrate_line(subject: &Subject, row: &Row) -> String {
    let ty = row.choice.as_ref().map_or("Q4_K_M", |c| c.ftype.name);
    let input = f16_input(subject);
    let out = format!(
        "{}-{ty}-calibrated.gguf",
        input.trim_end_matches(".gguf").trim_end_matches("-f16")
    );
    format!("memwall calibrate quantize -m {input} --dataset calib.jsonl --type {ty} -o {out}")
}

/// `memwall calibrate fit` making a mix of types the size of `row`'s file.
fn fit_line(subject: &Subject, row: &Row) -> String {
    format!(
        "memwall calibrate fit -m {} --imatrix imatrix.gguf -f calib.txt --budget {}MiB -o fit.toml",
        f16_input(subject),
        row.file_bytes >> 20
    )
}

/// The warning under a risky recommendation and what to weigh instead.
fn print_quality(subject: &Subject, row: &Row, alt: &plan::Alternatives) {
    println!(
        "Quality: {}; a smaller model loses more, a larger one less. Before settling on it:",
        quality_text(row)
    );
    println!(
        "  - calibrate it on your own text (the same size, less loss; docs/CALIBRATE.md):\n      {}",
        calibrate_line(subject, row)
    );
    println!(
        "  - or fit a mix of types to the same size, then calibrate with --recipe fit.toml (docs/RECIPES.md):\n      {}",
        fit_line(subject, row)
    );
    match &alt.shorter_context {
        Some((ctx, r)) => println!(
            "  - a shorter context: at -c {ctx}, {} fits in RAM ({} in memory, ~{:.1} tokens/s)",
            r.label,
            human_bytes(r.memwall.total()),
            r.speed.tokens_per_s
        ),
        None => println!(
            "  - a shorter context does not help: even at -c 256 nothing with less loss fits in RAM"
        ),
    }
    if let Some(r) = &alt.streaming {
        println!(
            "  - stream a better type from flash: {} at ~{:.1} tokens/s ({} in memory)",
            r.label,
            r.speed.tokens_per_s,
            human_bytes(r.memwall.total())
        );
    }
    println!(
        "  - measure the loss on your text before choosing: memwall compare {} -f YOUR_TEXT.txt",
        f16_input(subject)
    );
}

fn quality_json(
    subject: &Subject,
    row: &Row,
    alt: Option<&plan::Alternatives>,
) -> serde_json::Value {
    json!({
        "choice": row.label,
        "llama3_8b_ppl_increase": plan::ppl_increase_llama3_8b(type_name(row)),
        "risky": alt.is_some(),
        "warning": alt.map(|_| quality_text(row)),
        "alternatives": alt.map(|a| json!({
            "calibrate": calibrate_line(subject, row),
            "fit": fit_line(subject, row),
            "shorter_context": a.shorter_context.as_ref().map(|(ctx, r)| json!({
                "ctx": ctx,
                "choice": r.label,
                "total_bytes": r.memwall.total(),
                "tokens_per_s": r.speed.tokens_per_s,
            })),
            "streaming": a.streaming.as_ref().map(|r| json!({
                "choice": r.label,
                "total_bytes": r.memwall.total(),
                "tokens_per_s": r.speed.tokens_per_s,
            })),
        })),
    })
}

fn list_devices(json: bool) -> Result<()> {
    let all = Device::builtins();
    if json {
        let v: Vec<_> = all.iter().map(device_json).collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<12} {:>5} {:>7} {:>9} {:>7} {:>4}  description",
        "name", "RAM", "usable", "RAM GB/s", "flash", "thr"
    );
    for d in &all {
        println!(
            "{:<12} {:>5} {:>7} {:>9.1} {:>7.1} {:>4}  {}",
            d.name,
            human_gib(d.ram_bytes),
            human_gib(d.usable_bytes()),
            d.ram_bandwidth / 1e9,
            d.storage_read / 1e9,
            d.threads,
            d.description
        );
    }
    println!(
        "\nYour own: a TOML file with the same fields (docs/PLAN.md), or `memwall plan --measure-host --save me.toml`."
    );
    Ok(())
}

fn human_gib(n: u64) -> String {
    format!("{:.1}G", n as f64 / (1u64 << 30) as f64)
}

fn device_json(d: &Device) -> serde_json::Value {
    json!({
        "name": d.name,
        "description": d.description,
        "ram_bytes": d.ram_bytes,
        "usable_bytes": d.usable_bytes(),
        "os_reserve_bytes": d.os_reserve_bytes,
        "ram_bandwidth_bytes_per_s": d.ram_bandwidth,
        "bandwidth_efficiency": d.bandwidth_efficiency,
        "storage_read_bytes_per_s": d.storage_read,
        "threads": d.threads,
        "compute_weights_per_s": d.compute,
        "compute_by_type": rates_json(&d.compute_by_type),
        "streaming_by_type": rates_json(&d.streaming_by_type),
        "cache_bytes": d.cache_bytes,
        "dispatch_s": d.dispatch,
        "overlap_loss": d.overlap_loss,
    })
}

fn rates_json(rates: &[(GgmlType, f64)]) -> serde_json::Value {
    rates
        .iter()
        .map(|(t, r)| (t.name().to_owned(), json!(r)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Reads the model from whatever the user named.
fn subject(args: &Args) -> Result<Subject> {
    let Some(spec) = args.model_spec() else {
        return numbers_subject(args);
    };
    let path = Path::new(spec);
    if path.is_file() {
        let model = super::open_model(path)?;
        let ftype = model
            .metadata()
            .get_u64(keys::FILE_TYPE)
            .ok()
            .flatten()
            .and_then(|id| u32::try_from(id).ok())
            .and_then(file_type);
        let quantized = model.tensors().any(|(_, t)| t.ty.is_quantized());
        let shape = Shape::from_gguf(&model)
            .with_context(|| format!("{}: cannot plan this model", path.display()))?;
        let tensors = fit::gguf_tensors(&model);
        let header_bytes = plan::header_bytes(&model);
        let name = model
            .metadata()
            .get_str("general.name")
            .ok()
            .flatten()
            .map(str::to_owned)
            .unwrap_or_else(|| stem(path));
        let params = tensors.iter().map(fit::TensorShape::elements).sum();
        return Ok(Subject {
            model: plan::Subject {
                name,
                shape,
                tensors,
                params,
                active_params: params,
                header_bytes,
                as_stored: Some(AsStored {
                    label: format!("as is ({})", stem(path)),
                    quantized,
                }),
            },
            source: Source::Gguf {
                path: path.to_owned(),
                ftype,
                quantized,
            },
        });
    }
    let dir = if path.is_dir() {
        if !path.join("config.json").is_file() {
            bail!(
                "{}: a folder without config.json; give a GGUF file, a Hugging Face checkpoint \
                 folder or a repo id",
                path.display()
            );
        }
        path.to_owned()
    } else if memwall_convert::hub::is_repo_id(spec) {
        memwall_convert::hub::resolve(spec)
            .or_else(|_| memwall_convert::hub::fetch_config(spec))
            .map_err(anyhow::Error::msg)?
    } else {
        bail!("{spec}: no such file or folder, and not a Hugging Face repo id (owner/name)");
    };
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .with_context(|| format!("{}: cannot read", config_path.display()))?;
    let mut config: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not JSON", config_path.display()))?;
    memwall_convert::hf_config::with_defaults(&mut config);
    let shape =
        Shape::from_hf_config(&config).with_context(|| format!("{}", config_path.display()))?;
    let tensors = shape.tensors();
    let params = tensors.iter().map(fit::TensorShape::elements).sum();
    Ok(Subject {
        model: plan::Subject {
            name: stem(&dir),
            header_bytes: estimated_header(shape.n_vocab),
            shape,
            tensors,
            params,
            active_params: params,
            as_stored: None,
        },
        source: Source::Checkpoint {
            unknown_pre: dir.join("tokenizer.json").is_file()
                && !dir.join("tokenizer.model").is_file()
                && memwall_convert::vocab::detect_pre(&dir).is_err(),
            dir,
            spec: spec.clone(),
        },
    })
}

/// GGUF header of a model without a file: the vocabulary dominates (token
/// strings, types, merges): about 36 bytes per entry with its merge (SmolLM2's
/// 49 152 entries take 1.79 MB, tiny-zh's 6 144 take 0.22 MB).
fn estimated_header(n_vocab: u64) -> u64 {
    n_vocab * 36 + (64 << 10)
}

/// A file's name without `.gguf`; a folder's whole name (`Qwen2.5-32B` keeps its dot).
fn stem(path: &Path) -> String {
    let name = if path.is_dir() {
        path.canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_owned()))
    } else {
        path.file_stem().map(|n| n.to_owned())
    };
    name.or_else(|| path.file_name().map(|n| n.to_owned()))
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

fn numbers_subject(args: &Args) -> Result<Subject> {
    let (Some(params), Some(layers), Some(kv_heads), Some(head_dim), Some(vocab)) = (
        args.params,
        args.layers,
        args.kv_heads,
        args.head_dim,
        args.vocab,
    ) else {
        bail!("give a MODEL, or --params with --layers, --kv-heads, --head-dim and --vocab");
    };
    // The hidden size only sizes the working buffers; a dense transformer has
    // about 12·layers·e² parameters.
    let embd = args.embd.unwrap_or_else(|| {
        ((params as f64 / (12.0 * f64::from(layers.max(1)))).sqrt() as u64).max(64)
    });
    let n_head = (embd / head_dim.max(1)).clamp(1, 4096) as u32;
    let experts = args.experts.unwrap_or(0);
    let active = args.active_params.unwrap_or(params);
    if active > params {
        bail!("--active-params ({active}) is more than --params ({params})");
    }
    let shape = Shape {
        n_expert: experts,
        n_expert_used: args.active_experts.unwrap_or(0),
        n_ff_expert: if experts > 0 { embd / 2 } else { 0 },
        ..Shape::dense(
            "llama",
            layers,
            embd,
            embd * 3,
            n_head.max(kv_heads),
            kv_heads,
            head_dim,
            vocab,
            false,
        )
    };
    shape.check()?;
    Ok(Subject {
        model: plan::Subject {
            name: "bare numbers".into(),
            shape,
            tensors: Vec::new(),
            params,
            active_params: active,
            header_bytes: estimated_header(vocab),
            as_stored: None,
        },
        source: Source::Numbers,
    })
}

fn count_label(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else {
        format!("{:.0}M", n / 1e6)
    }
}

fn choices(types: &[String]) -> Result<Vec<Choice>> {
    if types.is_empty() {
        return Ok(Choice::defaults());
    }
    types
        .iter()
        .map(|t| {
            if let Some(c) = Choice::by_name(t) {
                return Ok(c);
            }
            let path = Path::new(t);
            if path.is_file() {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("{}: cannot read", path.display()))?;
                let recipe = Recipe::parse(&text)
                    .map_err(anyhow::Error::msg)
                    .with_context(|| format!("{}", path.display()))?;
                return Ok(Choice::recipe(recipe));
            }
            let names = memwall_format::ggml_type::FILE_TYPES
                .iter()
                .filter(|f| f.base.is_some())
                .map(|f| f.name)
                .chain(memwall_quantize::recipe::PRESETS.iter().map(|(n, _)| *n));
            bail!(
                "--types {t}: not a llama.cpp file type (Q4_K_M, Q8_0, …), a built-in recipe \
                 (attn-f16-ffn-q4, attn-q8-ffn-q4, attn-q8-ffn-q4-down-q6) or a recipe file{}",
                memwall_format::suggest::did_you_mean(t, names)
            )
        })
        .collect()
}

/// The recipe `--write-recipe` writes for a choice.
fn written_recipe(choice: &Choice) -> Recipe {
    match &choice.recipe {
        Some(r) => r.clone(),
        None => Recipe {
            name: format!("plan-{}", choice.ftype.name.to_ascii_lowercase()),
            description: format!(
                "llama.cpp's {} mix, chosen by memwall plan",
                choice.ftype.name
            ),
            base: choice.ftype,
            output: None,
            token_embedding: None,
            rules: Vec::new(),
        },
    }
}

/// The GGUF's file name, for "as it is".
fn subject_file_name(subject: &Subject) -> String {
    match &subject.source {
        Source::Gguf { path, .. } => path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        _ => subject.model.name.clone(),
    }
}

fn write_recipe(row: &Row, path: &Path) -> Result<()> {
    let Some(choice) = &row.choice else {
        bail!("{}: not a quantization choice", row.label);
    };
    let recipe = written_recipe(choice);
    use std::io::Write as _;
    let write = || -> std::io::Result<()> {
        let mut f = memwall_format::atomic::AtomicFile::create(path)?;
        f.write_all(recipe.to_toml().as_bytes())?;
        f.commit()
    };
    write().with_context(|| format!("{}: cannot write the recipe", path.display()))
}

struct Commands {
    /// What makes the file when it does not exist yet (convert, quantize).
    make: Vec<String>,
    memwall: String,
    llama: String,
    /// Something to know about `make` (requantizing, a placeholder name).
    note: Option<String>,
}

/// A path as a shell word (quoted when it has spaces or shell characters).
fn word(path: &Path) -> String {
    crate::render::shell_word(&path.display().to_string())
}

/// `memwall quantize IN OUT TYPE` (or `--recipe R`) for a choice.
fn quantize_line(
    input: &Path,
    out: &Path,
    choice: &Choice,
    requantize: bool,
    types: &[String],
) -> String {
    let what = match &choice.recipe {
        Some(r) => format!(
            "--recipe {}",
            crate::render::shell_word(&recipe_arg(r, types))
        ),
        None => choice.ftype.name.to_owned(),
    };
    let flag = if requantize {
        " --allow-requantize"
    } else {
        ""
    };
    format!(
        "memwall quantize {} {} {what}{flag}",
        word(input),
        word(out)
    )
}

/// How `--recipe` names a recipe: a built-in's name, else the file of
/// `--types` it came from.
fn recipe_arg(recipe: &Recipe, types: &[String]) -> String {
    if Recipe::preset(&recipe.name).is_some() {
        return recipe.name.clone();
    }
    types
        .iter()
        .find(|t| {
            std::fs::read_to_string(t)
                .ok()
                .and_then(|text| Recipe::parse(&text).ok())
                .is_some_and(|r| r.name == recipe.name)
        })
        .cloned()
        .unwrap_or_else(|| format!("{}.toml", recipe.name))
}

/// The file a row's commands run, and the commands that make it when it is
/// not there yet: for a GGUF, `memwall quantize` next to it (the name the short
/// form gives); for a checkpoint, `memwall convert` and then `quantize` in the
/// current folder (convert's and quantize's own default names).
fn file_and_make(
    subject: &Subject,
    row: &Row,
    types: &[String],
) -> (PathBuf, Vec<String>, Option<String>) {
    let Some(choice) = &row.choice else {
        return match &subject.source {
            Source::Gguf { path, .. } => (path.clone(), Vec::new(), None),
            _ => (PathBuf::from("MODEL.gguf"), Vec::new(), None),
        };
    };
    let float = choice.recipe.is_none() && matches!(choice.ftype.name, "F16" | "BF16" | "F32");
    let label = choice.label.trim_end_matches(" (≈)");
    match &subject.source {
        Source::Gguf {
            path,
            ftype,
            quantized,
        } => {
            if choice.recipe.is_none() && ftype.is_some_and(|f| f.id == choice.ftype.id) {
                return (path.clone(), Vec::new(), None);
            }
            let out = super::quantize::default_output(path, label);
            let note = quantized.then(|| {
                format!(
                    "{} is already quantized: quantizing it again loses quality; better, \
                     quantize the F16 model",
                    path.display()
                )
            });
            let make = vec![quantize_line(path, &out, choice, *quantized, types)];
            (out, make, note)
        }
        Source::Checkpoint {
            dir,
            spec,
            unknown_pre,
        } => {
            let name = stem(dir);
            let note = unknown_pre.then(|| {
                "llama.cpp does not recognise this checkpoint's tokenizer: convert asks for \
                 --pre NAME (e.g. gpt-2, llama-bpe, qwen2)"
                    .to_owned()
            });
            let outtype = if float {
                choice.ftype.name.to_ascii_lowercase()
            } else {
                "f16".to_owned()
            };
            let converted = PathBuf::from(format!("{name}-{outtype}.gguf"));
            let mut make = Vec::new();
            make.push(if outtype == "f16" {
                format!("memwall convert {}", crate::render::shell_word(spec))
            } else {
                format!(
                    "memwall convert {} --outtype {outtype}",
                    crate::render::shell_word(spec)
                )
            });
            if float {
                return (converted, make, note);
            }
            let out = super::quantize::default_output(&converted, label);
            make.push(quantize_line(&converted, &out, choice, false, types));
            (out, make, note)
        }
        Source::Numbers => (
            PathBuf::from(format!("MODEL-{label}.gguf")),
            Vec::new(),
            Some(format!(
                "MODEL-{label}.gguf stands for your model: make it with memwall convert and \
                 memwall quantize"
            )),
        ),
    }
}

fn commands(subject: &Subject, row: &Row, device: &Device, args: &Args, kv: KvType) -> Commands {
    commands_for(subject, row, &args.types, device, args, kv)
}

/// [`commands`] with the recipe files `--recipe` may name (`types`).
fn commands_for(
    subject: &Subject,
    row: &Row,
    types: &[String],
    device: &Device,
    args: &Args,
    kv: KvType,
) -> Commands {
    let (file, make, note) = file_and_make(subject, row, types);
    // Only what is missing: a file that exists needs no making.
    let make = if file.exists() { Vec::new() } else { make };
    let file = word(&file);
    let t = device.threads;
    let (c, b) = (args.ctx(), args.batch());
    // --chat: like llama-cli, a conversation when no prompt is given.
    let mut memwall = format!("memwall run -m {file} --chat -c {c} -t {t} -b {b}");
    let mut llama = format!("llama-cli -m {file} -c {c} -t {t} -b {b}");
    if kv == KvType::Q8_0 {
        llama.push_str(" -ctk q8_0 -ctv q8_0 -fa on");
    }
    match row.fits {
        Fit::Ram => {
            memwall.push_str(" --no-mmap");
            llama.push_str(" --no-mmap");
        }
        Fit::Streaming | Fit::No => {
            let rest = row.memwall.total() - row.memwall.weights;
            let resident = device.usable_bytes().saturating_sub(rest) >> 20;
            memwall.push_str(&format!(" --resident {resident}"));
            // llama.cpp maps the file and lets the page cache stream it.
        }
    }
    Commands {
        make,
        memwall,
        llama,
        note,
    }
}

fn speed_text(s: &Speed) -> String {
    format!("{:.1} ({})", s.tokens_per_s, s.limit())
}

fn print_plan(
    subject: &Subject,
    device: &Device,
    args: &Args,
    kv: KvType,
    rows: &[Row],
    recommended: Option<usize>,
    budget_pick: Option<usize>,
) {
    let s = &subject.model.shape;
    let kind = if s.n_expert > 0 {
        format!(
            "MoE, {} of {} experts per token",
            s.n_expert_used, s.n_expert
        )
    } else {
        "dense".into()
    };
    println!(
        "Model: {} ({}, {} layers, {} parameters, {kind}; {} KV heads × {})",
        subject.model.name,
        s.arch,
        s.n_layer,
        count_label(subject.model.params),
        s.n_head_kv,
        s.head_dim
    );
    if subject.model.active_params != subject.model.params {
        println!(
            "       {} parameters per token",
            count_label(subject.model.active_params)
        );
    }
    let held = if s.window > 0 {
        "positions held"
    } else {
        "context"
    };
    println!(
        "KV cache at -c {} ({}): {}  [layers × KV heads × head size × {held} × 2 × bytes]",
        args.ctx(),
        kv.name(),
        human_bytes(s.kv_bytes(kv, args.ctx()))
    );
    if let Some(g) = &s.gemma {
        let sliding = g.sliding.iter().filter(|&&x| x).count();
        println!(
            "          {sliding} of the {} layers see {} tokens: their caches stop at {} positions \
             (window + one micro-batch); the {} global layers have {} KV heads × {}",
            s.n_layer,
            s.window,
            s.window + memwall_quantize::fit::SWA_UBATCH,
            s.n_layer as usize - sliding,
            if g.k_eq_v {
                g.global_kv_heads
            } else {
                u64::from(s.n_head_kv)
            },
            g.global_head_dim
        );
    }
    if s.linear.is_some() {
        let linear = s.n_layer - s.attention_layers();
        println!(
            "          {} of the {} layers are linear attention: no KV cache, a state of {} \
             in all, the same at any context",
            linear,
            s.n_layer,
            human_bytes(s.recurrent_state_bytes())
        );
    }
    println!(
        "Device: {} — {}: {} RAM, {} usable, {:.1} GB/s RAM (× {:.2}), {:.1} GB/s flash, {} threads",
        device.name,
        device.description,
        human_bytes(device.ram_bytes),
        human_bytes(device.usable_bytes()),
        device.ram_bandwidth / 1e9,
        device.bandwidth_efficiency,
        device.storage_read / 1e9,
        device.threads
    );
    println!();
    println!(
        "{:<28} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}  {:<9} decode tok/s (limit)",
        "choice", "bpw", "weights", "KV", "buffers", "memwall", "llama.cpp", "fits"
    );
    for (i, r) in rows.iter().enumerate() {
        let mark = if Some(i) == recommended { " *" } else { "" };
        println!(
            "{:<28} {:>6.2} {:>10} {:>10} {:>10} {:>10} {:>10}  {:<9} {}{mark}",
            r.label,
            r.bits_per_weight,
            human_bytes(r.weight_bytes),
            human_bytes(r.memwall.kv),
            human_bytes(r.memwall.compute + r.memwall.overhead),
            human_bytes(r.memwall.total()),
            human_bytes(r.llama.total()),
            r.fits.name(),
            speed_text(&r.speed)
        );
    }
    println!();
    if rows.iter().any(|r| !r.exact) {
        println!(
            "Rows marked (nominal) and (≈) are params × bits ÷ 8 before overheads (decimal: \
             FP16 {:.1} GB, INT8 {:.1} GB, INT4 {:.1} GB); give a GGUF or a checkpoint for exact bytes.",
            subject.model.params as f64 * 2.0 / 1e9,
            subject.model.params as f64 / 1e9,
            subject.model.params as f64 * 0.5 / 1e9
        );
    }
    println!(
        "memwall = weights + KV + buffers (memwall run --no-mmap); decode speed at {} cached tokens.",
        args.ctx() / 2
    );
    if let Some(i) = budget_pick {
        println!(
            "Budget {} MiB: {} ({} in memory)",
            args.budget.unwrap_or(0),
            rows[i].label,
            human_bytes(rows[i].memwall.total())
        );
        if let Some(p) = &args.write_recipe {
            println!(
                "Recipe written to {} (the commands below make the file with it)",
                p.display()
            );
        }
    }
    match recommended {
        Some(i) => {
            let r = &rows[i];
            let c = match (&args.write_recipe, &r.choice) {
                // The recommendation is the budget's pick: make it with the recipe written.
                (Some(p), Some(choice)) if budget_pick == Some(i) => {
                    let written = Row {
                        choice: Some(Choice::recipe(written_recipe(choice))),
                        ..r.clone()
                    };
                    commands_for(
                        subject,
                        &written,
                        &[p.display().to_string()],
                        device,
                        args,
                        kv,
                    )
                }
                _ => commands(subject, r, device, args, kv),
            };
            let label = if r.as_is {
                format!("{} as it is", subject_file_name(subject))
            } else {
                r.label.clone()
            };
            println!(
                "Recommended: {} — {} in memory, ~{:.1} tokens/s on {}{}",
                label,
                human_bytes(r.memwall.total()),
                r.speed.tokens_per_s,
                device.name,
                if r.fits == Fit::Streaming {
                    " (streams weights from flash)"
                } else {
                    ""
                }
            );
            for line in &c.make {
                println!("  {line}");
            }
            println!("  {}", c.memwall);
            println!("  {}", c.llama);
            if let Some(note) = &c.note {
                println!("  ({note})");
            }
            if kv == KvType::Q8_0 {
                println!(
                    "  (memwall's runtime keeps its KV cache in f16: plan with --kv-type f16 for it)"
                );
            }
        }
        None => println!(
            "Nothing fits on {}: lower -c, pick a larger device, or a smaller model.",
            device.name
        ),
    }
}

fn footprint_json(f: &Footprint) -> serde_json::Value {
    json!({
        "weights_bytes": f.weights,
        "kv_bytes": f.kv,
        "state_bytes": f.state,
        "compute_bytes": f.compute,
        "overhead_bytes": f.overhead,
        "code_bytes": f.code,
        "total_bytes": f.total(),
    })
}

fn to_json(
    subject: &Subject,
    device: &Device,
    args: &Args,
    kv: KvType,
    rows: &[Row],
    recommended: Option<usize>,
    budget_pick: Option<usize>,
) -> serde_json::Value {
    let s = &subject.model.shape;
    let rows_json: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let c = commands(subject, r, device, args, kv);
            json!({
                "choice": r.label,
                "exact": r.exact,
                "bits_per_weight": r.bits_per_weight,
                "weights_bytes": r.weight_bytes,
                "file_bytes": r.file_bytes,
                "memwall": footprint_json(&r.memwall),
                "llama_cpp": footprint_json(&r.llama),
                "fits": r.fits.name(),
                "decode": {
                    "tokens_per_s": r.speed.tokens_per_s,
                    "ram_bound": r.speed.ram_bound,
                    "compute_bound": r.speed.compute_bound,
                    "flash_bound": r.speed.flash_bound,
                    "limit": r.speed.limit(),
                    "bytes_per_token": r.speed.bytes_per_token,
                    "flash_bytes_per_token": r.speed.flash_bytes_per_token,
                },
                "recommended": Some(i) == recommended,
                "commands": {"make": c.make, "memwall": c.memwall, "llama_cli": c.llama},
            })
        })
        .collect();
    json!({
        "model": {
            "name": subject.model.name,
            "source": match &subject.source {
                Source::Gguf { path, .. } => json!({"gguf": path}),
                Source::Checkpoint { dir, .. } => json!({"checkpoint": dir}),
                Source::Numbers => json!("numbers"),
            },
            "architecture": s.arch,
            "layers": s.n_layer,
            "embedding": s.n_embd,
            "heads": s.n_head,
            "kv_heads": s.n_head_kv,
            "head_dim": s.head_dim,
            "vocab": s.n_vocab,
            "experts": s.n_expert,
            "experts_used": s.n_expert_used,
            "params": subject.model.params,
            "active_params": subject.model.active_params,
            "nominal_bytes": {
                "fp16": subject.model.params * 2,
                "int8": subject.model.params,
                "int4": subject.model.params / 2,
            },
        },
        "ctx": args.ctx(),
        "kv_type": kv.name(),
        "kv_bytes": s.kv_bytes(kv, args.ctx()),
        "sliding_window": s.window,
        "recurrent_state_bytes": s.recurrent_state_bytes(),
        "attention_layers": s.attention_layers(),
        "batch": args.batch(),
        "device": device_json(device),
        "rows": rows_json,
        "recommended": recommended.map(|i| rows[i].label.clone()),
        "budget_choice": budget_pick.map(|i| rows[i].label.clone()),
    })
}
