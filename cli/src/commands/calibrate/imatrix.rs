//! `memwall calibrate imatrix`: an importance matrix over a text.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use memwall_calibrate::dataset::Dataset;
use memwall_calibrate::imatrix::{self, TextOptions};
use memwall_runtime::forward::Model;
use memwall_runtime::kernels::Kernels;
use memwall_runtime::tokenizer::Tokenizer;
use serde_json::json;

use crate::progress::Bar;

/// The file formats of an importance matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// llama-imatrix's GGUF format (sums and counts).
    Gguf,
    /// The legacy .dat format (means × chunks).
    Dat,
}

/// Arguments of `memwall calibrate imatrix`.
#[derive(clap::Args)]
#[command(mut_arg("ctx", |a| a.help("Tokens per window")))]
pub struct Args {
    /// The model (F16, BF16 or F32 is best: the sums describe its activations).
    #[arg(short = 'm', long = "model", value_name = "MODEL.gguf")]
    pub model: PathBuf,
    /// The calibration text (UTF-8).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "TEXT",
        required_unless_present = "dataset"
    )]
    pub file: Option<PathBuf>,
    /// A calibration set (`memwall calibrate dataset`) instead of a text:
    /// each sample is one chunk.
    #[arg(long, value_name = "SET.jsonl", conflicts_with = "file")]
    pub dataset: Option<PathBuf>,
    /// Where to write the importance matrix.
    #[arg(
        short = 'o',
        long = "output",
        default_value = "imatrix.gguf",
        value_name = "FILE"
    )]
    pub output: PathBuf,
    /// Output format (default: GGUF, or .dat when FILE ends in .dat).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub output_format: Option<Format>,
    #[command(flatten)]
    pub ctx: crate::args::Ctx512,
    #[command(flatten)]
    pub batch: crate::args::Batch2048,
    /// Use at most this many windows.
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    /// Also collect the output head's input (output.weight).
    #[arg(long)]
    pub process_output: bool,
    #[command(flatten)]
    pub threads: crate::args::Threads,
    #[command(flatten)]
    pub load: crate::commands::LoadArgs,
    /// Print a JSON report instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let format =
        args.output_format
            .unwrap_or(if args.output.extension().is_some_and(|e| e == "dat") {
                Format::Dat
            } else {
                Format::Gguf
            });
    crate::commands::check_output_file(&args.output, "the importance matrix")?;
    let gguf = args.load.open(&args.model)?;
    let tokenizer = Tokenizer::from_gguf(gguf.metadata())
        .with_context(|| format!("{}: tokenizer", args.model.display()))?;
    if tokenizer.add_eos() {
        bail!(
            "{}: the vocabulary appends EOS to every text, which windowed evaluation does not support (neither does llama-imatrix)",
            args.model.display()
        );
    }
    let mut model = Model::new(&gguf, args.ctx.ctx.max(1))
        .with_context(|| format!("{}: cannot run this model", args.model.display()))?;
    args.load.stream(&mut model)?;
    model.set_compute(Kernels::from_env()?, args.threads.count());
    let bar = Bar::new(!args.json);
    let started = Instant::now();
    let (stats, ppl, tokens) = match (&args.file, &args.dataset) {
        (Some(file), _) => {
            let text = std::fs::read_to_string(file).with_context(|| {
                format!("{}: cannot read the text (UTF-8 expected)", file.display())
            })?;
            let tokens = tokenizer.encode(&text, true, false);
            let options = TextOptions {
                n_ctx: args.ctx.ctx,
                n_batch: args.batch.batch,
                max_chunks: args.chunks,
                bos: tokenizer.add_bos().then(|| tokenizer.bos()).flatten(),
                process_output: args.process_output,
                dataset: file.display().to_string(),
            };
            let (stats, ppl) = imatrix::from_text(&mut model, &tokens, &options, &bar)
                .with_context(|| format!("{}: collecting activations", args.model.display()))?;
            (stats, Some(ppl), tokens.len())
        }
        (None, Some(path)) => {
            let set = Dataset::load(path, &tokenizer)
                .with_context(|| format!("{}: calibration set", path.display()))?;
            let mut samples = set.samples;
            if let Some(n) = args.chunks {
                samples.truncate(n);
            }
            let longest = samples.iter().map(Vec::len).max().unwrap_or(0);
            if longest > args.ctx.ctx {
                model = Model::new(&gguf, longest)
                    .with_context(|| format!("{}: cannot run this model", args.model.display()))?;
                model.set_compute(Kernels::from_env()?, args.threads.count());
            }
            let stats = imatrix::from_samples(
                &mut model,
                &samples,
                set.seq_len,
                args.process_output,
                &path.display().to_string(),
                &bar,
            )
            .with_context(|| format!("{}: collecting activations", args.model.display()))?;
            let tokens = samples.iter().map(Vec::len).sum();
            (stats, None, tokens)
        }
        (None, None) => {
            bail!("give the calibration text with -f TEXT or a set with --dataset SET.jsonl")
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    match format {
        Format::Gguf => stats.write_gguf(&args.output)?,
        Format::Dat => stats.write_legacy(&args.output)?,
    }
    if args.json {
        let report = json!({
            "model": args.model, "text": args.file, "dataset": args.dataset, "output": args.output,
            "format": match format { Format::Gguf => "gguf", Format::Dat => "dat" },
            "tokens": tokens, "chunks": stats.chunk_count, "chunk_size": stats.chunk_size,
            "entries": stats.entries.len(), "ppl": ppl.as_ref().map(|p| p.ppl),
            "plus_minus": ppl.as_ref().map(|p| p.plus_minus),
            "seconds": seconds,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        if let Some(ppl) = &ppl {
            println!(
                "Final estimate: PPL = {:.4} +/- {:.5}",
                ppl.ppl, ppl.plus_minus
            );
        }
        println!(
            "{} entries over {} chunks of {} tokens in {seconds:.1} s → {}",
            stats.entries.len(),
            stats.chunk_count,
            stats.chunk_size,
            args.output.display()
        );
        println!(
            "next: memwall quantize {} Q4_K_M --imatrix {}",
            args.model.display(),
            args.output.display()
        );
    }
    Ok(())
}
