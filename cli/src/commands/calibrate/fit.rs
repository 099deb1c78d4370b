//! `memwall calibrate fit`: the recipe that fits a byte budget with the least
//! predicted KL divergence, from measured matrix errors and probe files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use memwall_calibrate::fit::{self, Fitted, Probing, Target};
use memwall_format::GgmlType;
use memwall_format::atomic::AtomicFile;
use memwall_format::gguf::GgufModel;
use memwall_quantize::fit::Device;
use memwall_quantize::fit::plan::file_budget;
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::names::parse_tensor_type;
use memwall_runtime::eval::Options;
use memwall_runtime::kernels::Kernels;
use memwall_runtime::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::progress::Bar;

/// Arguments of `memwall calibrate fit`.
#[derive(clap::Args)]
pub struct Args {
    /// The model (F16, BF16 or F32).
    #[arg(short = 'm', long = "model", value_name = "MODEL.gguf")]
    pub model: PathBuf,
    /// The importance matrix the file will be quantized with (`memwall
    /// calibrate imatrix`); it weighs the errors and the encoders.
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// Text for the probes (UTF-8; held out from the text you will judge the file on).
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    pub file: PathBuf,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Where to write the recipe.
    #[arg(
        short = 'o',
        long = "output",
        default_value = "fit.toml",
        value_name = "FILE"
    )]
    pub output: PathBuf,
    /// The types a matrix may take (default: Q2_K to Q6_K and Q8_0; where a
    /// type's block does not divide a matrix's rows, llama.cpp's fallback for
    /// it: Q4_K → Q5_0, Q6_K → Q8_0, …).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub types: Vec<String>,
    /// The type each group's probe puts its matrices at (default: Q3_K).
    #[arg(long, value_name = "TYPE")]
    pub probe_type: Option<String>,
    /// Tokens per probe window (the second half of each is scored).
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub probe_ctx: usize,
    /// Probe windows.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub chunks: usize,
    #[command(flatten)]
    pub threads: crate::args::Threads,
    /// Print a JSON report instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// The size to fit: given, or what a device leaves for the file.
#[derive(clap::Args, Clone, Debug)]
pub struct BudgetArgs {
    /// The largest file to make: bytes, or a number with KiB, MiB, GiB (KB, MB, GB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, conflicts_with = "device")]
    pub budget: Option<u64>,
    /// Instead of --budget: the largest file `memwall run -c N` holds in this
    /// device's RAM beside its KV cache and buffers (a built-in name, see
    /// `memwall plan --list-devices`, or a TOML profile).
    #[arg(short = 'd', long, value_name = "PROFILE")]
    pub device: Option<String>,
    /// With --device: the context length the file must run at (2048 by default).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", requires = "device")]
    pub ctx: Option<u64>,
}

impl BudgetArgs {
    /// Whether a budget or a device was given.
    pub fn given(&self) -> bool {
        self.budget.is_some() || self.device.is_some()
    }

    /// The budget in bytes for `gguf` (opened from `path`).
    pub fn bytes(&self, gguf: &GgufModel, path: &Path) -> Result<u64> {
        let spec = match (self.budget, &self.device) {
            (Some(_), _) if self.ctx.is_some() => bail!(
                "-c is the context a --device budget leaves room for; with --budget leave it out (probe windows are --probe-ctx)"
            ),
            (Some(b), _) => return Ok(b),
            (None, Some(spec)) => spec,
            (None, None) => bail!("give the size with --budget SIZE or a --device PROFILE"),
        };
        let device = Device::resolve(spec).map_err(|e| anyhow::anyhow!("--device: {e}"))?;
        let ctx = self.ctx.unwrap_or(2048);
        let (room, rest) = file_budget(&device, gguf, ctx)
            .with_context(|| format!("{}: planning the footprint", path.display()))?;
        if room == 0 {
            bail!(
                "{}: at -c {} the KV cache, buffers and process alone need {:.2} MiB of the {:.2} MiB {} leaves an app; lower -c",
                path.display(),
                ctx,
                mib(rest.total()),
                mib(device.usable_bytes()),
                device.name
            );
        }
        Ok(room)
    }
}

/// `3.5GiB`, `800MB`, `1048576`.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => {
            return Err(format!(
                "unknown unit {other:?}: use bytes, KiB, MiB or GiB"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 3.5GiB, 800MiB)"))?;
    let bytes = value * scale;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{text:?} is not a size (e.g. 3.5GiB, 800MiB)"));
    }
    Ok(bytes as u64)
}

/// The name a fitted recipe takes: its output's file name without extension.
pub fn recipe_name(output: &Path) -> String {
    output
        .file_stem()
        .map_or("fit".into(), |s| s.to_string_lossy().into_owned())
}

/// A type as users write it (`Q4_K`).
fn type_name(ty: GgmlType) -> String {
    ty.name().to_ascii_uppercase()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    crate::commands::check_output_file(&args.output, "the recipe")?;
    let mut candidates: Vec<GgmlType> = args
        .types
        .iter()
        .map(|t| parse_tensor_type(t).map_err(|e| anyhow::anyhow!("--types: {e}")))
        .collect::<Result<_>>()?;
    if candidates.is_empty() {
        candidates = fit::DEFAULT_CANDIDATES.to_vec();
    }
    let probe = match &args.probe_type {
        Some(t) => parse_tensor_type(t).map_err(|e| anyhow::anyhow!("--probe-type: {e}"))?,
        None => fit::DEFAULT_PROBE,
    };
    if !candidates.contains(&probe) {
        bail!(
            "--probe-type {} is not among --types; probe with one of them",
            type_name(probe)
        );
    }
    let imatrix = args
        .imatrix
        .as_deref()
        .map(Imatrix::load)
        .transpose()
        .context("--imatrix")?;
    let gguf = GgufModel::open(&args.model)
        .with_context(|| format!("{}: cannot open", args.model.display()))?;
    let limit = args.budget.bytes(&gguf, &args.model)?;
    let tokenizer = Tokenizer::from_gguf(gguf.metadata())
        .with_context(|| format!("{}: tokenizer", args.model.display()))?;
    let text = std::fs::read_to_string(&args.file).with_context(|| {
        format!(
            "{}: cannot read the text (UTF-8 expected)",
            args.file.display()
        )
    })?;
    let tokens = tokenizer.encode(&text, true, false);
    let bar = Bar::new(!args.json);
    let started = Instant::now();
    let options = Options {
        n_ctx: args.probe_ctx,
        n_batch: args.probe_ctx,
        max_chunks: Some(args.chunks.max(1)),
        bos: tokenizer.add_bos().then(|| tokenizer.bos()).flatten(),
        all_outputs: false,
    };
    let probing = Probing {
        tokens: &tokens,
        options: &options,
        compute: (Kernels::from_env()?, args.threads.count()),
        scratch: &std::env::temp_dir(),
    };
    let target = Target {
        candidates,
        probe,
        budget: limit,
    };
    let fitted = fit::fit(
        &gguf,
        &args.model,
        imatrix.as_ref(),
        &probing,
        &target,
        &bar,
    )
    .with_context(|| format!("{}: fitting {:.2} MiB", args.model.display(), mib(limit)))?;
    let name = recipe_name(&args.output);
    let description = format!(
        "fitted to {:.2} MiB by memwall calibrate fit (predicted KLD {:.5} on {})",
        mib(limit),
        fitted.predicted_kld(),
        args.file.display()
    );
    let recipe = fitted.recipe(&name, &description);
    let write = || -> std::io::Result<()> {
        let mut f = AtomicFile::create(&args.output)?;
        f.write_all(recipe.to_toml().as_bytes())?;
        f.commit()
    };
    write().with_context(|| format!("{}: writing the recipe", args.output.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let report = report(&args, limit, &fitted, seconds);
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&args, limit, target.candidates.len(), &fitted, seconds);
    }
    Ok(())
}

fn report(args: &Args, budget: u64, f: &Fitted, seconds: f64) -> Value {
    let (s, gains, a) = (&f.sensitivity, &f.gains, &f.assignment);
    let groups: Vec<Value> = f
        .roles()
        .into_iter()
        .map(|r| {
            let probe = gains.probes.iter().find(|p| p.group == r.group);
            json!({
                "group": r.group,
                "types": r.types.iter().map(|(t, n)| json!({ "type": type_name(*t), "matrices": n })).collect::<Vec<_>>(),
                "bytes": r.bytes, "predicted_kld": r.predicted,
                "probe_kld": probe.map(|p| p.kld), "gain": probe.map(|p| p.gain),
                "gain_measured": probe.map(|p| p.measured),
            })
        })
        .collect();
    let elements: u64 = s.matrices.iter().map(|m| m.elements).sum();
    json!({
        "model": args.model, "text": args.file, "imatrix": args.imatrix, "recipe": args.output,
        "budget": budget, "device": args.budget.device, "bytes": f.bytes(), "matrix_bytes": a.bytes,
        "other_bytes": s.other_bytes,
        "matrix_bits_per_weight": a.bytes as f64 * 8.0 / elements.max(1) as f64,
        "predicted_kld": f.predicted_kld(), "additive_kld": a.predicted,
        "reference_kld": gains.reference_kld, "all_probe_kld": gains.all_kld,
        "all_probe_additive": gains.all_additive, "interaction": gains.interaction,
        "matrices": s.matrices.iter().zip(&a.chosen).map(|(m, &o)| json!({
            "name": m.name, "type": type_name(m.options[o].ty),
            "bytes": m.options[o].bytes, "error": m.options[o].error,
            "options": m.options.iter().map(|c| json!({
                "type": type_name(c.ty), "bytes": c.bytes, "error": c.error,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "groups": groups, "measure_seconds": f.measure_seconds, "seconds": seconds,
    })
}

fn print(args: &Args, budget: u64, types: usize, f: &Fitted, seconds: f64) {
    let (s, gains, a) = (&f.sensitivity, &f.gains, &f.assignment);
    let measured = f.measure_seconds;
    let elements: u64 = s.matrices.iter().map(|m| m.elements).sum();
    println!(
        "{} matrices measured at {} types in {measured:.1} s; {} probe files in {:.1} s (reference KLD {:.6})",
        s.matrices.len(),
        types,
        gains.probes.len() + 2,
        seconds - measured,
        gains.reference_kld
    );
    println!();
    println!(
        "{:<22} {:>10} {:>11} {:>10} {:>11}  types",
        "group", "probe KLD", "KLD/error", "MiB", "pred. KLD"
    );
    let mut rows = f.roles();
    rows.sort_by(|x, y| y.predicted.total_cmp(&x.predicted));
    for r in rows {
        let probe = gains.probes.iter().find(|p| p.group == r.group);
        let types: Vec<String> = r
            .types
            .iter()
            .map(|(t, n)| format!("{} ×{n}", type_name(*t)))
            .collect();
        println!(
            "{:<22} {:>10.6} {:>11.3e}{} {:>9.3} {:>11.6}  {}",
            r.group,
            probe.map_or(0.0, |p| p.kld),
            probe.map_or(0.0, |p| p.gain),
            if probe.is_some_and(|p| !p.measured) {
                "*"
            } else {
                " "
            },
            mib(r.bytes),
            r.predicted,
            types.join(", ")
        );
    }
    if gains.probes.iter().any(|p| !p.measured) {
        println!(
            "* the probe added no measurable divergence; the gain is a tenth of the smallest measured one"
        );
    }
    println!();
    println!(
        "budget {:.2} MiB: matrices {:.2} MiB ({:.2} bits per weight) + the rest {:.2} MiB; predicted KLD {:.6} ({:.6} added up, ×{:.2} for how errors compound: every role at the probe type measured {:.6}, added up {:.6})",
        mib(budget),
        mib(a.bytes),
        a.bytes as f64 * 8.0 / elements.max(1) as f64,
        mib(s.other_bytes),
        f.predicted_kld(),
        a.predicted,
        f.predicted_kld() / a.predicted.max(f64::MIN_POSITIVE),
        gains.all_kld,
        gains.all_additive
    );
    let imatrix = args
        .imatrix
        .as_ref()
        .map(|p| format!(" --imatrix {}", p.display()))
        .unwrap_or_default();
    println!(
        "wrote {} ({:.1} s); next: memwall quantize {} OUT.gguf --recipe {}{imatrix}",
        args.output.display(),
        seconds,
        args.model.display(),
        args.output.display()
    );
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("3.5MiB"), Ok(3_670_016));
        assert_eq!(parse_size("10.5 GiB"), Ok(11_274_289_152));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert!(parse_size("3.5 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("0").is_err());
    }
}
