//! `memwall export IN.gguf OUT_DIR`: a GGUF model back to a Hugging Face
//! checkpoint folder that `transformers` loads and `memwall convert` reads.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use memwall_convert::export::{ExportDtype, ExportOptions, export};
use serde_json::json;

use crate::progress::Bar;
use crate::render::human_bytes;

/// Arguments of `memwall export`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// The checkpoint folder to write; it must not exist or be empty.
    #[arg(value_name = "OUT_DIR", index = 2)]
    pub out_dir: Option<PathBuf>,
    /// Element type of the safetensors: bf16, f16 or f32 (f32 keeps every
    /// dequantized value exactly).
    #[arg(long, default_value = "bf16", value_name = "TYPE")]
    pub dtype: String,
    /// Largest safetensors file (e.g. 5G, 500M); more is sharded with an index,
    /// as transformers shards.
    #[arg(long, default_value = "5G", value_name = "SIZE")]
    pub max_shard_size: String,
    /// Print a JSON summary instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    // With -m, clap puts OUT_DIR in the model's place.
    let (input, shifted) = args.model.split()?;
    let out_dir = match (shifted, &args.out_dir) {
        (Some(out), None) => out,
        (None, Some(out)) => out.clone(),
        (None, None) => bail!("give the checkpoint folder to write: memwall export MODEL OUT_DIR"),
        (Some(_), Some(extra)) => bail!(
            "unexpected argument {}: memwall export MODEL OUT_DIR (or -m MODEL OUT_DIR)",
            extra.display()
        ),
    };
    super::check_model_path(&input)?;
    super::check_output_dir(&out_dir, "the checkpoint folder")?;
    let Some(dtype) = ExportDtype::parse(&args.dtype) else {
        bail!("unknown --dtype '{}'; use bf16, f16 or f32", args.dtype);
    };
    let max_shard_size = memwall_convert::job::parse_split_size(&args.max_shard_size)
        .map_err(|e| anyhow::anyhow!("--max-shard-size: {e}"))?;
    let options = ExportOptions {
        dtype,
        max_shard_size,
    };
    let bar = Bar::new(!args.json);
    let started = Instant::now();
    let summary = export(&input, &out_dir, &options, &bar)?;
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let report = json!({
            "out_dir": out_dir, "architecture": summary.hf_class, "tensors": summary.tensors,
            "bytes": summary.bytes, "dtype": args.dtype.to_ascii_lowercase(),
            "files": summary.files, "seconds": seconds,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "wrote {} ({}, {} tensors, {} of weights) in {seconds:.1} s: {}",
            out_dir.display(),
            summary.hf_class,
            summary.tensors,
            human_bytes(summary.bytes),
            summary.files.join(", ")
        );
        println!(
            "next: memwall convert {} (or load it with transformers)",
            out_dir.display()
        );
    }
    Ok(())
}
