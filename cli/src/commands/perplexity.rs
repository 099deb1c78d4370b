//! `memwall perplexity -m MODEL.gguf -f TEXT`: perplexity as llama-perplexity
//! computes it, and KL divergence against a reference model's saved
//! log-probabilities.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use memwall_runtime::eval::{
    self, KldStats, Layout, LogitsReader, LogitsWriter, Options, Perplexity, Summary,
};
use memwall_runtime::forward::Model;
use memwall_runtime::kernels::Kernels;
use memwall_runtime::tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::progress::Bar;

/// Arguments of `memwall perplexity`.
#[derive(clap::Args)]
#[command(mut_arg("ctx", |a| a.help("Tokens per window; the second half of each window is scored")))]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// The text to score (UTF-8). Not needed with --kl-divergence, whose file
    /// holds the tokens.
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub ctx: crate::args::Ctx512,
    #[command(flatten)]
    pub batch: crate::args::Batch2048,
    #[command(flatten)]
    pub threads: crate::args::Threads,
    /// Score at most this many windows.
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    /// Save the log-probabilities of every scored token to FILE (the reference
    /// of a later --kl-divergence; llama-perplexity's --kl-divergence-base format).
    #[arg(long, value_name = "FILE")]
    pub save_logits: Option<PathBuf>,
    /// llama-perplexity's spelling: the file of base log-probabilities, written
    /// (as --save-logits), or read when --kl-divergence is given without a FILE.
    #[arg(long, value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare with the reference log-probabilities in FILE (or in
    /// --kl-divergence-base FILE): KL divergence, top-token agreement and Δp statistics.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    pub kl_divergence: Option<Option<PathBuf>>,
    /// With --save-logits: keep only the K most likely tokens of each position
    /// and the mass of the rest (memwall's compact reference: 8 + 8·K bytes a
    /// position instead of 2 per vocabulary entry; llama.cpp cannot read it).
    /// KL divergence against it counts the rest as one token, a slight underestimate.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
    #[command(flatten)]
    pub load: super::LoadArgs,
    /// Print JSON instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// What happens to log-probabilities: saved for later, or compared with saved ones.
#[derive(Debug, PartialEq)]
enum Logits {
    None,
    Save(PathBuf),
    Compare(PathBuf),
}

/// Resolves --save-logits, --kl-divergence and llama-perplexity's
/// --kl-divergence-base into one meaning (llama.cpp's where it spells it).
fn logits(args: &Args) -> Result<Logits> {
    let same = |a: &PathBuf, b: &PathBuf| a == b;
    match (
        &args.save_logits,
        &args.kl_divergence_base,
        &args.kl_divergence,
    ) {
        (Some(_), _, Some(_)) => bail!(
            "--save-logits writes a reference and --kl-divergence reads one; give one of them"
        ),
        (None, base, Some(Some(file))) => match base {
            Some(b) if !same(b, file) => bail!(
                "--kl-divergence {} and --kl-divergence-base {}: two references; give one",
                file.display(),
                b.display()
            ),
            _ => Ok(Logits::Compare(file.clone())),
        },
        (None, Some(base), Some(None)) => Ok(Logits::Compare(base.clone())),
        (None, None, Some(None)) => bail!(
            "--kl-divergence needs the reference: --kl-divergence FILE (or llama-perplexity's \
             --kl-divergence-base FILE --kl-divergence)"
        ),
        (Some(save), Some(base), None) if !same(save, base) => bail!(
            "--save-logits {} and --kl-divergence-base {}: give one file",
            save.display(),
            base.display()
        ),
        (Some(save), _, None) | (None, Some(save), None) => Ok(Logits::Save(save.clone())),
        (None, None, None) => Ok(Logits::None),
    }
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let path = args.model.path()?.to_owned();
    let logits = logits(&args)?;
    if let Logits::Save(out) = &logits {
        super::check_output_file(out, "the log-probabilities")?;
    } else if let Some(k) = args.top_k {
        bail!(
            "--top-k {k} shapes the reference --save-logits writes; a top-k reference is read as it was saved"
        );
    }
    let gguf = args.load.open(&path)?;
    let tokenizer = Tokenizer::from_gguf(gguf.metadata())
        .with_context(|| format!("{}: tokenizer", path.display()))?;
    if tokenizer.add_eos() {
        bail!(
            "{}: the vocabulary appends EOS to every text, which perplexity does not support (neither does llama-perplexity)",
            path.display()
        );
    }
    let n_ctx = match &logits {
        Logits::Compare(file) => LogitsReader::open(file)?.n_ctx(),
        _ => args.ctx.ctx,
    };
    let mut model = Model::new(&gguf, n_ctx.max(1))
        .with_context(|| format!("{}: cannot run this model", path.display()))?;
    args.load.stream(&mut model)?;
    model.set_compute(Kernels::from_env()?, args.threads.count());
    let options = Options {
        n_ctx,
        n_batch: args.batch.batch,
        max_chunks: args.chunks,
        bos: tokenizer.add_bos().then(|| tokenizer.bos()).flatten(),
        all_outputs: false,
    };
    let bar = Bar::new(!args.json);
    let started = Instant::now();
    let (kernels, threads) = model.compute();
    let setup = json!({
        "model": path, "n_ctx": n_ctx, "n_batch": args.batch.batch.min(n_ctx),
        "threads": threads, "kernels": kernels.backend().name(),
    });
    if let Logits::Compare(file) = &logits {
        let base = LogitsReader::open(file)?;
        let stats = eval::kl_divergence(&model, &base, &options, &bar)?;
        let seconds = started.elapsed().as_secs_f64();
        if args.json {
            let mut report = kld_json(&stats);
            report["reference"] = layout_json(base.layout(), base.n_vocab());
            report["setup"] = setup;
            report["seconds"] = json!(seconds);
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print_kld(&stats);
            if let Layout::TopK(k) = base.layout() {
                println!(
                    "\nthe reference keeps the {k} most likely of {} tokens per position: KLD counts the rest as one token (a lower bound)",
                    base.n_vocab()
                );
            }
            println!(
                "\n{} positions in {seconds:.1} s ({} threads, {} kernels)",
                stats.count,
                threads,
                kernels.backend().name()
            );
        }
        return Ok(());
    }
    let Some(file) = &args.file else {
        bail!("give the text to score with -f FILE (or a reference with --kl-divergence FILE)");
    };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("{}: cannot read the text (UTF-8 expected)", file.display()))?;
    let tokens = tokenizer.encode(&text, true, false);
    let save = match &logits {
        Logits::Save(p) => Some(p.clone()),
        _ => None,
    };
    let layout = args
        .top_k
        .map_or(Layout::Full, |k| Layout::TopK(k as usize));
    let mut writer = save
        .as_deref()
        .map(|p| LogitsWriter::with_layout(p, layout));
    let result = eval::perplexity(&model, &tokens, &options, writer.as_mut(), &bar)?;
    let seconds = started.elapsed().as_secs_f64();
    let evaluated = result.chunks * n_ctx;
    if args.json {
        let report = json!({
            "setup": setup, "tokens": result.tokens, "chunks": result.chunks,
            "scored": result.scored, "ppl": result.ppl, "plus_minus": result.plus_minus,
            "chunk_ppl": result.chunk_ppl, "seconds": seconds,
            "tokens_per_second": evaluated as f64 / seconds,
            "saved_logits": save,
            "saved_layout": save.as_ref().map(|_| layout_json(layout, model.config.n_vocab)),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_ppl(&result);
        println!(
            "{} tokens, {} chunks of {n_ctx}, {} scored; {:.1} s ({:.0} tokens/s, {} threads, {} kernels)",
            result.tokens,
            result.chunks,
            result.scored,
            seconds,
            evaluated as f64 / seconds,
            threads,
            kernels.backend().name()
        );
        if let Some(path) = &save {
            if let Layout::TopK(k) = layout {
                println!(
                    "kept the {} most likely of {} tokens per position",
                    k.min(model.config.n_vocab),
                    model.config.n_vocab
                );
            }
            println!(
                "saved log-probabilities to {}; next: memwall perplexity -m QUANTIZED.gguf --kl-divergence {}",
                path.display(),
                path.display()
            );
        }
    }
    Ok(())
}

fn layout_json(layout: Layout, n_vocab: usize) -> Value {
    match layout {
        Layout::Full => json!({ "layout": "full", "n_vocab": n_vocab }),
        Layout::TopK(k) => json!({ "layout": "top-k", "k": k.min(n_vocab), "n_vocab": n_vocab }),
    }
}

fn print_ppl(r: &Perplexity) {
    let chunks: Vec<String> = r
        .chunk_ppl
        .iter()
        .enumerate()
        .map(|(i, p)| format!("[{}]{p:.4}", i + 1))
        .collect();
    println!("{}", chunks.join(","));
    println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.plus_minus);
}

fn pm(s: &Summary) -> Value {
    json!({ "value": s.mean, "plus_minus": s.plus_minus })
}

fn percentiles(p: &[(f64, f64)]) -> Value {
    Value::Object(
        p.iter()
            .map(|(f, v)| (format!("{:.1}", f * 100.0), json!(v)))
            .collect(),
    )
}

fn kld_json(s: &KldStats) -> Value {
    json!({
        "positions": s.count,
        "ppl": pm(&s.ppl), "ppl_base": pm(&s.ppl_base),
        "log_ppl_correlation": s.log_ppl_correlation,
        "log_ppl_ratio": pm(&s.log_ppl_ratio),
        "kld": {
            "mean": s.kld.mean, "plus_minus": s.kld.plus_minus, "max": s.kld_max,
            "median": s.kld_median, "min": s.kld_min,
            "percentiles": percentiles(&s.kld_percentiles),
        },
        "delta_p": {
            "mean": s.p_diff.mean, "plus_minus": s.p_diff.plus_minus, "max": s.p_diff_max,
            "median": s.p_diff_median, "min": s.p_diff_min,
            "rms": pm(&s.p_diff_rms),
            "percentiles": percentiles(&s.p_diff_percentiles),
        },
        "same_top": pm(&s.same_top),
    })
}

fn print_kld(s: &KldStats) {
    let ratio = s.log_ppl_ratio;
    println!("====== Perplexity statistics ======");
    println!(
        "Mean PPL(Q)                   : {:10.6} ± {:10.6}",
        s.ppl.mean, s.ppl.plus_minus
    );
    println!(
        "Mean PPL(base)                : {:10.6} ± {:10.6}",
        s.ppl_base.mean, s.ppl_base.plus_minus
    );
    println!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
        100.0 * s.log_ppl_correlation
    );
    println!(
        "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}",
        ratio.mean, ratio.plus_minus
    );
    let r = ratio.mean.exp();
    println!(
        "Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}",
        r,
        r * ratio.plus_minus
    );
    println!("\n====== KL divergence statistics ======");
    println!(
        "Mean    KLD: {:10.6} ± {:10.6}",
        s.kld.mean, s.kld.plus_minus
    );
    println!("Maximum KLD: {:10.6}", s.kld_max);
    for &(f, v) in s.kld_percentiles.iter().filter(|(f, _)| *f > 0.5) {
        println!("{:<8}KLD: {v:10.6}", format!("{:.1}%", f * 100.0));
    }
    println!("Median  KLD: {:10.6}", s.kld_median);
    for &(f, v) in s.kld_percentiles.iter().filter(|(f, _)| *f < 0.5) {
        println!("{:<8}KLD: {v:10.6}", format!("{:.1}%", f * 100.0));
    }
    println!("Minimum KLD: {:10.6}", s.kld_min);
    println!("\n====== Token probability statistics ======");
    println!(
        "Mean    Δp: {:6.3} ± {:5.3} %",
        100.0 * s.p_diff.mean,
        100.0 * s.p_diff.plus_minus
    );
    println!("Maximum Δp: {:6.3}%", 100.0 * s.p_diff_max);
    for &(f, v) in s.p_diff_percentiles.iter().filter(|(f, _)| *f > 0.5) {
        println!("{:<8}Δp: {:6.3}%", format!("{:.1}%", f * 100.0), 100.0 * v);
    }
    println!("Median  Δp: {:6.3}%", 100.0 * s.p_diff_median);
    for &(f, v) in s.p_diff_percentiles.iter().filter(|(f, _)| *f < 0.5) {
        println!("{:<8}Δp: {:6.3}%", format!("{:.1}%", f * 100.0), 100.0 * v);
    }
    println!("Minimum Δp: {:6.3}%", 100.0 * s.p_diff_min);
    println!(
        "RMS Δp    : {:6.3} ± {:5.3} %",
        100.0 * s.p_diff_rms.mean,
        100.0 * s.p_diff_rms.plus_minus
    );
    println!(
        "Same top p: {:6.3} ± {:5.3} %",
        100.0 * s.same_top.mean,
        100.0 * s.same_top.plus_minus
    );
}
