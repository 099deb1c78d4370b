//! `memwall tokenize -m MODEL -p TEXT`: llama-tokenize's command — the ids
//! and pieces of a text, with its options and output forms, the same bytes
//! it prints.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use memwall_runtime::tokenizer::Tokenizer;

/// Arguments of `memwall tokenize`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// The text to tokenize.
    #[arg(short = 'p', long = "prompt", value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Read the text from FILE, byte for byte (a trailing newline is a token
    /// too); takes precedence over -p.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Read the text from standard input (takes precedence over -f and -p).
    #[arg(long)]
    pub stdin: bool,
    /// Print only the ids, as a list: [1, 2, 3].
    #[arg(long)]
    pub ids: bool,
    /// Do not add the BOS token, even if the model adds one.
    #[arg(long)]
    pub no_bos: bool,
    /// Do not parse special tokens: `<|im_start|>` in the text is plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Print the number of tokens at the end.
    #[arg(long)]
    pub show_count: bool,
    /// Process escapes (\n, \r, \t, \', \", \\, \xHH) in the text (the default).
    #[arg(short = 'e', long = "escape", overrides_with = "no_escape")]
    pub escape: bool,
    /// Take the text as it is, backslashes included.
    #[arg(long = "no-escape", overrides_with = "escape")]
    pub no_escape: bool,
    /// KEY=TYPE:VALUE,…: read the vocabulary with these metadata values
    /// instead of the file's (e.g. tokenizer.ggml.add_bos_token=bool:false).
    #[arg(long, value_name = "KEY=TYPE:VALUE,…")]
    pub override_kv: Vec<String>,
    /// llama.cpp's log switch; memwall prints no logs.
    #[arg(long, hide = true)]
    pub log_disable: bool,
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let path = args.model.path()?.to_owned();
    let escape = !args.no_escape;
    // As llama-tokenize: --stdin, else -f, else -p; the text is read after
    // the model so that a bad model path fails first.
    if !args.stdin && args.file.is_none() && args.prompt.is_none() {
        bail!("give the text: -p TEXT, -f FILE or --stdin");
    }
    let file = match (&args.file, args.stdin) {
        (Some(f), false) => {
            Some(std::fs::read(f).with_context(|| format!("{}: cannot read", f.display()))?)
        }
        _ => None,
    };
    let overrides = super::parse_override_lists(&args.override_kv)?;
    let mut gguf = super::open_model(&path)?;
    super::apply_overrides(&mut gguf, &overrides);
    let tokenizer = Tokenizer::from_gguf(gguf.metadata())
        .with_context(|| format!("{}: tokenizer", path.display()))?;
    let raw = if args.stdin {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("reading standard input")?;
        bytes
    } else if let Some(bytes) = file {
        bytes
    } else {
        args.prompt.clone().unwrap_or_default().into_bytes()
    };
    let bytes = if escape {
        super::process_escapes(&raw)
    } else {
        raw
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "the text is not UTF-8 (byte {} of it{}); memwall tokenizes UTF-8 text",
            e.utf8_error().valid_up_to(),
            if escape { ", after \\xHH escapes" } else { "" }
        )
    })?;
    let add_special = tokenizer.add_bos() && !args.no_bos;
    let tokens = tokenizer.encode(&text, add_special, !args.no_parse_special);

    let mut out = std::io::stdout().lock();
    if args.ids {
        let ids: Vec<String> = tokens.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", ids.join(", "))?;
    } else {
        for &id in &tokens {
            let piece = tokenizer.token_to_piece(id, true);
            // llama-tokenize prints the piece with printf's %s: it ends at a NUL byte.
            let end = piece.iter().position(|&b| b == 0).unwrap_or(piece.len());
            write!(out, "{id:6} -> '")?;
            out.write_all(&piece[..end])?;
            writeln!(out, "'")?;
        }
    }
    if args.show_count {
        writeln!(out, "Total number of tokens: {}", tokens.len())?;
    }
    out.flush()?;
    Ok(())
}
