//! `memwall bench -m MODEL.gguf`: prompt-processing and decode speed, measured
//! as llama-bench measures them (`pp N`: N tokens evaluated in batches from an
//! empty cache; `tg N`: N tokens decoded one at a time), repeated and averaged.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use memwall_runtime::forward::Model;
use memwall_runtime::kernels::Kernels;
use serde_json::json;

/// Arguments of `memwall bench`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// Prompt lengths to process (comma-separated; 0 skips).
    #[arg(
        short = 'p',
        long = "n-prompt",
        default_value = "512",
        value_delimiter = ','
    )]
    pub prompt: Vec<usize>,
    /// Tokens to generate (comma-separated; 0 skips).
    #[arg(
        short = 'n',
        long = "n-gen",
        default_value = "128",
        value_delimiter = ','
    )]
    pub generate: Vec<usize>,
    /// Batch sizes for prompt processing (comma-separated).
    #[arg(
        short = 'b',
        long = "batch-size",
        default_value = "2048",
        value_delimiter = ','
    )]
    pub batch: Vec<usize>,
    /// Thread counts (comma-separated; default: every core).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Repetitions of each test (the mean and standard deviation are reported).
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    #[command(flatten)]
    pub load: super::LoadArgs,
    /// Output format, as llama-bench's -o: a markdown table or JSON (= --json).
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value = "md",
        value_name = "FORMAT"
    )]
    pub output: Output,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// llama-bench's output formats that memwall writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A markdown table and the recommended settings.
    Md,
    /// One JSON object.
    Json,
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let path = args.model.path()?.to_owned();
    let json_out = args.json || args.output == Output::Json;
    let gguf = args.load.open(&path)?;
    let longest = args
        .prompt
        .iter()
        .chain(&args.generate)
        .copied()
        .max()
        .unwrap_or(0);
    if longest == 0 || args.repetitions == 0 {
        bail!("nothing to measure: give -p and/or -n above 0, and -r of at least 1");
    }
    let mut model = Model::new(&gguf, longest + 1)
        .with_context(|| format!("{}: cannot run this model", path.display()))?;
    let streaming = args.load.stream(&mut model)?;
    let kernels = Kernels::from_env()?;
    let threads = if args.threads.is_empty() {
        vec![crate::args::all_cores()]
    } else {
        args.threads.clone()
    };
    let size = gguf.total_file_size();
    let n_vocab = model.config.n_vocab as u32;
    // Token ids as llama-bench uses them: arbitrary, within the vocabulary, and
    // new for every run (a mixture of experts routes each token its own way:
    // repeating the same tokens would measure a cache that always hits), yet
    // the same from one bench to the next.
    let mut drawn = 0u64;
    let mut next_tokens = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                drawn += 1;
                ((drawn * 7919 + 13) % n_vocab as u64) as u32
            })
            .collect()
    };
    let mut rows = Vec::new();
    for &t in &threads {
        model.set_compute(kernels, t);
        let mut tests = Vec::new();
        for &n in args.prompt.iter().filter(|&&n| n > 0) {
            for &b in &args.batch {
                tests.push(("pp", n, b.max(1)));
            }
        }
        for &n in args.generate.iter().filter(|&&n| n > 0) {
            tests.push(("tg", n, 1));
        }
        for (kind, n, batch) in tests {
            // One warm-up run pages the weights in and sizes the buffers.
            let mut samples = Vec::new();
            let mut read = Vec::new();
            let mut experts = (0u64, 0u64, 0u64, 0u64);
            for rep in 0..=args.repetitions {
                let tokens = next_tokens(n);
                let mut session = model.session();
                let experts_start = model.expert_stats();
                let read_start = memwall_runtime::residency::storage_read_bytes();
                let started = Instant::now();
                if kind == "pp" {
                    for piece in tokens.chunks(batch) {
                        model.forward_from(&mut session, piece, piece.len() - 1)?;
                    }
                } else {
                    for &id in &tokens {
                        model.forward(&mut session, &[id])?;
                    }
                }
                let rate = n as f64 / started.elapsed().as_secs_f64();
                if rep > 0 {
                    samples.push(rate);
                    if let (Some(a), Some(b)) = (experts_start, model.expert_stats()) {
                        experts.0 += b.requests - a.requests;
                        experts.1 += b.hits - a.hits;
                        experts.2 += b.bytes_read - a.bytes_read;
                        experts.3 += b.bytes_guessed - a.bytes_guessed;
                    }
                    if let (Some(a), Some(b)) =
                        (read_start, memwall_runtime::residency::storage_read_bytes())
                    {
                        read.push(b.saturating_sub(a) / n as u64);
                    }
                }
            }
            let mean = samples.iter().sum::<f64>() / samples.len() as f64;
            let sd = if samples.len() > 1 {
                (samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>()
                    / (samples.len() - 1) as f64)
                    .sqrt()
            } else {
                0.0
            };
            let mut row = json!({
                "test": format!("{kind}{n}"), "threads": t, "n_batch": batch.min(n),
                "tokens_per_second": mean, "stddev": sd, "samples": samples,
                // The mean over the measured runs, as the experts' counts below.
                "storage_read_bytes_per_token":
                    (!read.is_empty()).then(|| read.iter().sum::<u64>() / read.len() as u64),
            });
            // Streamed experts: what the measured repetitions asked the cache for.
            if model.expert_stats().is_some() {
                let (requests, hits, bytes, guessed) = experts;
                let tokens = (n * args.repetitions) as u64;
                row["experts"] = json!({
                    "requests_per_token": requests as f64 / tokens as f64,
                    "hit_rate": if requests == 0 { 1.0 } else { hits as f64 / requests as f64 },
                    "bytes_read_per_token": bytes / tokens,
                    "bytes_guessed_per_token": guessed / tokens,
                });
            }
            rows.push(row);
        }
    }
    // The fastest setting of each kind of test.
    let best = |kind: &str| {
        rows.iter()
            .filter(|r| r["test"].as_str().is_some_and(|t| t.starts_with(kind)))
            .max_by(|a, b| {
                let rate = |r: &serde_json::Value| r["tokens_per_second"].as_f64().unwrap_or(0.0);
                rate(a).total_cmp(&rate(b))
            })
            .map(|r| json!({"threads": r["threads"], "n_batch": r["n_batch"], "tokens_per_second": r["tokens_per_second"]}))
    };
    let recommended = json!({"prompt": best("pp"), "decode": best("tg")});
    if json_out {
        let report = json!({
            "recommended": recommended,
            "model": path, "size_bytes": size,
            "architecture": model.config.arch.name(),
            "kernels": kernels.backend().name(), "results": rows,
            "streaming": streaming.as_ref().map(|r| json!({
                "pinned_bytes": r.pinned_bytes, "pinned_layers": r.pinned_layers,
                "output_pinned": r.output_pinned, "streamed_bytes": r.streamed_bytes,
                "ring_bytes": r.ring_bytes, "direct_reads": r.direct,
                "experts": r.experts.as_ref().map(|x| {
                    let stats = model.expert_stats();
                    let (cover, top) = stats.as_ref().map_or((0.0, 0.0), |s| s.concentration());
                    json!({
                        "slots": x.slots, "experts": x.experts, "bundle_bytes": x.bundle_bytes,
                        "prewarmed": x.prewarmed,
                        "hit_rate": stats.as_ref().map(|s| s.hit_rate()),
                        "routing": {
                            "experts_for_90_percent": cover, "top_expert_share": top,
                        },
                    })
                }),
            })),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "| model | size | backend | threads | n_batch | test | t/s |\n| --- | ---: | --- | ---: | ---: | ---: | ---: |"
    );
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    for r in &rows {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:.2} ± {:.2} |",
            crate::render::human_bytes(size),
            kernels.backend().name(),
            r["threads"],
            r["n_batch"],
            r["test"].as_str().unwrap_or(""),
            r["tokens_per_second"].as_f64().unwrap_or(0.0),
            r["stddev"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(p) = recommended["prompt"].as_object() {
        println!(
            "\nrecommended for prompts: -t {} -b {} ({:.1} t/s)",
            p["threads"],
            p["n_batch"],
            p["tokens_per_second"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(d) = recommended["decode"].as_object() {
        println!(
            "recommended for decoding: -t {} ({:.1} t/s)",
            d["threads"],
            d["tokens_per_second"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
