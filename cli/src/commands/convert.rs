//! `memwall convert MODEL`: a Hugging Face checkpoint folder to GGUF, the
//! file llama.cpp's `convert_hf_to_gguf.py` writes.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use memwall_convert::job::{Options, convert};
use memwall_convert::tensors::OutType;
use serde_json::json;

use crate::progress::Bar;
use crate::render::human_bytes;

/// Arguments of `memwall convert`.
#[derive(clap::Args)]
#[command(mut_arg("model", |a| a.help("A local checkpoint folder (config.json, *.safetensors, \
    tokenizer.json), or a Hugging Face repo id `org/name[@revision]`: taken from the local Hugging \
    Face cache, else downloaded into it (HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE are honoured); \
    or give it with -m").value_name("CHECKPOINT")))]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// Output file (default: `<folder name>-<outtype>.gguf` in the current folder).
    #[arg(long, short = 'o', value_name = "OUT.gguf")]
    pub outfile: Option<PathBuf>,
    /// Type of the weight matrices: f32, f16, bf16 or q8_0 (norms stay f32).
    #[arg(long, default_value = "f16", value_name = "TYPE")]
    pub outtype: String,
    /// The BPE pre-tokenizer llama.cpp should use (tokenizer.ggml.pre), e.g. llama-bpe,
    /// qwen2, smollm, command-r, gpt-2 (default: recognised from tokenizer.json as
    /// llama.cpp recognises it).
    #[arg(long, value_name = "NAME")]
    pub pre: Option<String>,
    /// Write NaN/Inf weights instead of refusing them.
    #[arg(long)]
    pub allow_nonfinite: bool,
    /// Split the output into files of at most this much tensor data (e.g. 2G, 500M),
    /// named OUT-00001-of-0000N.gguf, as llama.cpp's converter and llama-gguf-split do.
    #[arg(long, value_name = "SIZE")]
    pub split_max_size: Option<String>,
    /// Leave out the multi-token-prediction (MTP) block a Qwen3.5 checkpoint carries
    /// for speculative decoding (as llama.cpp's --no-mtp; --no-nextn works too).
    #[arg(long, alias = "no-nextn")]
    pub no_mtp: bool,
    /// Print a JSON summary instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

fn quantize(
    ty: memwall_format::GgmlType,
    x: &[f32],
    y: &mut [u8],
) -> Result<(), memwall_convert::tensors::RowEncodeError> {
    Ok(memwall_quantize::quantize_row(ty, x, y)?)
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let given = args.model.path()?.to_owned();
    let Some(outtype) = OutType::parse(&args.outtype) else {
        bail!(
            "unknown --outtype '{}'; use f32, f16, bf16 or q8_0",
            args.outtype
        );
    };
    if let Some(pre) = &args.pre {
        let known = memwall_convert::vocab::known_pre_tokenizers();
        if !known.contains(&pre.as_str()) {
            bail!(
                "--pre {pre}: llama.cpp knows no pre-tokenizer of that name{}; it knows {}",
                memwall_format::suggest::did_you_mean(pre, known.iter().copied()),
                known.join(", ")
            );
        }
    }
    // A folder, or a repo id found in the local Hugging Face cache (else downloaded).
    let text = given.to_string_lossy().into_owned();
    let repo = !given.is_dir() && memwall_convert::hub::is_repo_id(&text);
    let name = if given.is_dir() {
        given
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
    } else if repo {
        text.split('@')
            .next()
            .and_then(|id| id.split('/').nth(1))
            .map(str::to_owned)
    } else if given.is_file() {
        bail!(
            "{}: a file, not a checkpoint folder; convert reads a Hugging Face checkpoint \
             folder (config.json, *.safetensors, tokenizer files){}",
            given.display(),
            if text.ends_with(".gguf") {
                " — this is already GGUF: quantize it with memwall quantize"
            } else {
                ""
            }
        );
    } else {
        bail!(
            "{}: not a checkpoint folder (there is no such folder) nor a Hugging Face repo id \
             (org/name)",
            given.display()
        );
    };
    let out = args.outfile.clone().unwrap_or_else(|| {
        let name = name.clone().unwrap_or_else(|| "model".into());
        PathBuf::from(format!("{name}-{}.gguf", args.outtype.to_ascii_lowercase()))
    });
    // Before any download or conversion.
    super::check_output_file(&out, "the GGUF file")?;
    let model = if repo {
        let bar = Bar::new(!args.json);
        memwall_convert::hub::resolve_or_download(&text, &bar).map_err(|e| anyhow::anyhow!(e))?
    } else {
        given.clone()
    };
    let pre = args.pre.clone();
    let options = Options {
        outtype,
        pre,
        encode: &quantize,
        allow_nonfinite: args.allow_nonfinite,
        split_max_size: args
            .split_max_size
            .as_deref()
            .map(memwall_convert::job::parse_split_size)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--split-max-size: {e}"))?,
        no_mtp: args.no_mtp,
    };
    let bar = Bar::new(!args.json);
    let started = Instant::now();
    let written = convert(&model, &out, &options, &bar)?;
    let seconds = started.elapsed().as_secs_f64();
    let bytes: u64 = written
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    if args.json {
        let report = json!({"outputs": written, "bytes": bytes, "outtype": args.outtype.to_ascii_lowercase(), "seconds": seconds});
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "wrote {}: {} in {seconds:.1} s",
            names.join(", "),
            human_bytes(bytes)
        );
        println!("next: memwall quantize {} Q4_K_M", names[0]);
    }
    Ok(())
}
