//! `memwall validate MODEL.gguf [--reference REF.gguf -f TEXT]`: is this file
//! fit to ship? Structure, finite numbers, a forward pass, and with a
//! reference, perplexity and KL divergence against it with a threshold. The
//! exit status is non-zero when any check fails, so that it can gate a pipeline.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use memwall_format::cleanup::ScratchFile;
use memwall_format::gguf::GgufModel;
use memwall_format::validate::scan_tensors;
use memwall_runtime::eval::{Baseline, Options};
use memwall_runtime::forward::Model;
use memwall_runtime::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::progress::Bar;

/// A sentence in English and Chinese for the smoke forward pass.
const PROBE: &str = "The capital of France is Paris. 北京是中国的首都。";

/// Arguments of `memwall validate`.
#[derive(clap::Args)]
#[command(mut_arg("ctx", |a| a.help("Tokens per window for perplexity and KL divergence")))]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// A reference model (usually the F16 the file was quantized from) to
    /// compare with on the text of -f.
    #[arg(long, value_name = "REF.gguf", requires = "file")]
    pub reference: Option<PathBuf>,
    /// The text for perplexity and KL divergence against --reference.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "TEXT",
        requires = "reference"
    )]
    pub file: Option<PathBuf>,
    /// Fail when the mean KL divergence from the reference exceeds this (nats).
    #[arg(long, default_value_t = 0.1, value_name = "X")]
    pub max_kld: f64,
    /// Fail when PPL / PPL(reference) exceeds this.
    #[arg(long, value_name = "X", requires = "reference")]
    pub max_ppl_ratio: Option<f64>,
    #[command(flatten)]
    pub ctx: crate::args::Ctx512,
    /// Score at most this many windows.
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    #[command(flatten)]
    pub threads: crate::args::Threads,
    /// Print JSON instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// One check and its outcome.
struct Check {
    name: &'static str,
    passed: bool,
    detail: String,
}

fn open(path: &Path) -> Result<(GgufModel, Tokenizer)> {
    let gguf = super::open_model(path)?;
    let tokenizer = Tokenizer::from_gguf(gguf.metadata())
        .with_context(|| format!("{}: tokenizer", path.display()))?;
    Ok((gguf, tokenizer))
}

fn model<'a>(
    gguf: &'a GgufModel,
    path: &Path,
    n_ctx: usize,
    threads: Option<usize>,
) -> Result<Model<'a>, String> {
    let mut m = Model::new(gguf, n_ctx).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(t) = threads {
        let (kernels, _) = m.compute();
        m.set_compute(kernels, t);
    }
    Ok(m)
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let bar = Bar::new(!args.json);
    let path = args.model.path()?.to_owned();
    let (gguf, tokenizer) = open(&path)?;
    let mut checks = Vec::new();
    let (findings, unchecked) = scan_tensors(&gguf, &bar);
    checks.push(Check {
        name: "finite",
        passed: findings.is_empty(),
        detail: if findings.is_empty() {
            let skipped = if unchecked.is_empty() {
                String::new()
            } else {
                format!(
                    " ({} tensors of types memwall does not decode were not checked)",
                    unchecked.len()
                )
            };
            format!(
                "{} tensors have finite values and scales{skipped}",
                gguf.tensor_count()
            )
        } else {
            findings
                .iter()
                .map(|f| format!("{}: {}", f.tensor, f.message))
                .collect::<Vec<_>>()
                .join("; ")
        },
    });
    let n_ctx = args.ctx.ctx.max(64);
    let built = model(&gguf, &path, n_ctx, args.threads.given());
    checks.push(Check {
        name: "structure",
        passed: built.is_ok(),
        detail: match &built {
            Ok(m) => format!(
                "every tensor {} needs is present with the right shape and type",
                m.config.arch.name()
            ),
            Err(e) => e.clone(),
        },
    });
    let mut report = json!({});
    if let Ok(m) = &built {
        let ids = tokenizer.encode(PROBE, true, false);
        let ids = &ids[..ids.len().min(n_ctx)];
        let logits = m.forward(&mut m.session(), ids)?;
        let bad = logits.iter().filter(|v| !v.is_finite()).count();
        checks.push(Check {
            name: "forward",
            passed: bad == 0,
            detail: if bad == 0 {
                format!("{} tokens evaluated, all logits finite", ids.len())
            } else {
                format!("{bad} of {} logits are NaN or infinite", logits.len())
            },
        });
        if let (Some(reference), Some(file)) = (&args.reference, &args.file) {
            let text = std::fs::read_to_string(file).with_context(|| {
                format!("{}: cannot read the text (UTF-8 expected)", file.display())
            })?;
            let compared = compare(&args, &path, m, &tokenizer, reference, &text, &bar)?;
            report["comparison"] = compared.0;
            checks.extend(compared.1);
        }
    }
    let passed = checks.iter().all(|c| c.passed);
    if args.json {
        report["model"] = json!(path);
        report["passed"] = json!(passed);
        report["checks"] = checks
            .iter()
            .map(|c| json!({"name": c.name, "passed": c.passed, "detail": c.detail}))
            .collect();
        report["seconds"] = json!(started.elapsed().as_secs_f64());
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for c in &checks {
            println!(
                "{} {:<10} {}",
                if c.passed { "ok  " } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        if args.reference.is_none() {
            println!("(add --reference F16.gguf -f TEXT to compare perplexity and KL divergence)");
        }
    }
    if !passed {
        bail!("{} failed validation", path.display());
    }
    Ok(())
}

/// Perplexity of both models and the KL divergence of `model` from the reference.
fn compare(
    args: &Args,
    path: &Path,
    model: &Model,
    tokenizer: &Tokenizer,
    reference: &Path,
    text: &str,
    bar: &Bar,
) -> Result<(Value, Vec<Check>)> {
    let (ref_gguf, ref_tokenizer) = open(reference)?;
    let tokens = tokenizer.encode(text, true, false);
    if ref_tokenizer.encode(text, true, false) != tokens {
        bail!(
            "{} and {} tokenize the text differently; compare models of one vocabulary",
            path.display(),
            reference.display()
        );
    }
    let ref_model = model_or_bail(&ref_gguf, reference, args.ctx.ctx, args.threads.given())?;
    let options = Options {
        n_ctx: args.ctx.ctx,
        n_batch: args.ctx.ctx,
        max_chunks: args.chunks,
        bos: tokenizer.add_bos().then(|| tokenizer.bos()).flatten(),
        all_outputs: false,
    };
    // The reference's log-probabilities, in a scratch file removed on every
    // way out (an error, Ctrl-C, or at the next run after a SIGKILL).
    let scratch = ScratchFile::new(&std::env::temp_dir(), "memwall-validate-", ".kld");
    let baseline = Baseline::new(&ref_model, &tokens, &options, scratch, bar)?;
    let stats = baseline.compare(model, &options, bar)?;
    drop(baseline);
    let ratio = stats.ppl.mean / stats.ppl_base.mean;
    let mut checks = vec![Check {
        name: "kld",
        passed: stats.kld.mean <= args.max_kld,
        detail: format!(
            "mean KLD {:.6} (limit {}), same top token {:.2} %, PPL {:.4} vs {:.4} ({:+.2} %)",
            stats.kld.mean,
            args.max_kld,
            100.0 * stats.same_top.mean,
            stats.ppl.mean,
            stats.ppl_base.mean,
            100.0 * (ratio - 1.0)
        ),
    }];
    if let Some(max) = args.max_ppl_ratio {
        checks.push(Check {
            name: "ppl-ratio",
            passed: ratio <= max,
            detail: format!("PPL / PPL(reference) = {ratio:.4} (limit {max})"),
        });
    }
    let value = json!({
        "reference": reference, "positions": stats.count,
        "ppl": stats.ppl.mean, "ppl_reference": stats.ppl_base.mean, "ppl_ratio": ratio,
        "kld_mean": stats.kld.mean, "kld_median": stats.kld_median, "kld_max": stats.kld_max,
        "same_top": stats.same_top.mean, "delta_p_rms": stats.p_diff_rms.mean,
    });
    Ok((value, checks))
}

fn model_or_bail<'a>(
    gguf: &'a GgufModel,
    path: &Path,
    n_ctx: usize,
    threads: Option<usize>,
) -> Result<Model<'a>> {
    model(gguf, path, n_ctx, threads).map_err(anyhow::Error::msg)
}
