//! `memwall calibrate dataset`: a calibration set from text, QA data and chats.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use memwall_calibrate::dataset::{
    self, ChatMessage, ChatRenderer, Options, Render, Report, SourceSpec, TokenizerInfo,
};
use memwall_runtime::tokenizer::Tokenizer;

use crate::chat::{ChatTemplate, Message};
use crate::progress::Bar;

/// Build a calibration set: documents from text files, folders, JSON, JSONL
/// and Parquet (SQuAD/CMRC, DuReader/WebQA, Alpaca, chat and plain-text rows
/// are recognised), cleaned (bad rows, duplicates, script filter), mixed by
/// ratio and packed into samples of exactly --seq-len tokens of the model's
/// own tokenizer.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  memwall calibrate dataset -m model-f16.gguf qa.jsonl docs/ -o calib.jsonl
  memwall calibrate dataset -m model-f16.gguf --source qa=cmrc.jsonl --source long=manpages/ \\
      --mix qa=0.7,long=0.3 -n 256 --seq-len 512 --min-cjk 0.5 -o calib.jsonl
  memwall calibrate dataset -m model-f16.gguf train.parquet \\
      --template '问：{question}\\n答：{answer}' -o calib.jsonl
  memwall calibrate dataset -m model-f16.gguf chats.jsonl --chat --skip-bad -o calib.jsonl --json

Inputs: .jsonl (one object a line), .json (an array, an object with a `data`
array, or SQuAD's nested data/paragraphs/qas), .parquet (one record a row),
anything else is one text document per file; folders are read recursively.
QA rows become `问：…\\n答：…` text (context first), or user/assistant turns
through the model's chat template with --chat.

The output is JSON Lines: a header naming the tokenizer (its vocabulary's
SHA-256), then one sample a line with its tokens and where they came from.
Same inputs and --seed give the same file. Then:
  memwall calibrate imatrix -m model-f16.gguf --dataset calib.jsonl -o imatrix.gguf")]
pub struct Args {
    /// The model whose tokenizer (and chat template) the set is built for.
    #[arg(short = 'm', long = "model", value_name = "MODEL.gguf")]
    pub model: PathBuf,
    /// Files or folders, each a source named after its file or folder stem.
    #[arg(value_name = "SOURCES")]
    pub inputs: Vec<PathBuf>,
    /// A named source (repeatable; the same name twice adds paths to it).
    #[arg(long = "source", value_name = "NAME=PATH")]
    pub sources: Vec<String>,
    /// Ratios of the sources' samples, such as qa=0.7,long=0.3 (normalised;
    /// unlisted sources get none). Default: equal shares.
    #[arg(long, value_name = "NAME=RATIO,…")]
    pub mix: Option<String>,
    /// Samples to write.
    #[arg(short = 'n', long = "samples", default_value_t = 512, value_name = "N")]
    pub samples: usize,
    /// Tokens per sample.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub seq_len: usize,
    /// Render JSON rows with this template of {field} placeholders instead of
    /// recognising their shape (\n is a newline; an array gives its first element).
    #[arg(long, value_name = "TEMPLATE", conflicts_with = "fields")]
    pub template: Option<String>,
    /// Render JSON rows as these fields joined by newlines.
    #[arg(long, value_name = "A,B,…", value_delimiter = ',')]
    pub fields: Vec<String>,
    /// Render QA, Alpaca and chat rows as conversations through the model's
    /// chat template.
    #[arg(long)]
    pub chat: bool,
    /// Keep documents whose share of CJK ideographs among letters is at least F.
    #[arg(long, value_name = "F")]
    pub min_cjk: Option<f64>,
    /// Keep exact and near duplicates.
    #[arg(long)]
    pub no_dedup: bool,
    /// Jaccard similarity (of character 5-grams) from which documents are near duplicates.
    #[arg(long, default_value_t = 0.8, value_name = "J")]
    pub near_dup: f64,
    /// Seed of every shuffle.
    #[arg(long, default_value_t = 42, value_name = "N")]
    pub seed: u64,
    /// Skip and count bad rows (non-UTF-8, invalid JSON, missing fields)
    /// instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
    /// Reuse a source's documents from its start when it runs out before its share.
    #[arg(long)]
    pub repeat: bool,
    /// Where to write the set.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Print the report as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// A chat template as the library's renderer.
struct Template {
    template: ChatTemplate,
    bos: String,
    eos: String,
}

impl ChatRenderer for Template {
    fn render(&self, messages: &[ChatMessage]) -> Result<String, String> {
        let messages: Vec<Message> = messages
            .iter()
            .map(|m| Message::new(&m.role, &m.content))
            .collect();
        self.template
            .render(&messages, false, &self.bos, &self.eos)
            .map_err(|e| e.to_string())
    }
}

fn stem(path: &std::path::Path) -> String {
    path.file_stem()
        .or_else(|| path.file_name())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

fn sources(args: &Args) -> Result<Vec<SourceSpec>> {
    let mut out: Vec<SourceSpec> = Vec::new();
    let mut add = |name: String, path: PathBuf| match out.iter_mut().find(|s| s.name == name) {
        Some(s) => s.paths.push(path),
        None => out.push(SourceSpec {
            name,
            paths: vec![path],
        }),
    };
    for spec in &args.sources {
        let Some((name, path)) = spec.split_once('=') else {
            bail!("--source {spec}: expected NAME=PATH");
        };
        if name.is_empty() || path.is_empty() {
            bail!("--source {spec}: expected NAME=PATH");
        }
        add(name.to_owned(), PathBuf::from(path));
    }
    for path in &args.inputs {
        add(stem(path), path.clone());
    }
    Ok(out)
}

fn mix(spec: &str) -> Result<Vec<(String, f64)>> {
    spec.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|part| {
            let (name, ratio) = part
                .split_once('=')
                .with_context(|| format!("--mix {part}: expected NAME=RATIO"))?;
            let ratio: f64 = ratio
                .trim()
                .parse()
                .with_context(|| format!("--mix {part}: the ratio is not a number"))?;
            Ok((name.trim().to_owned(), ratio))
        })
        .collect()
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    crate::commands::check_output_file(&args.output, "the calibration set")?;
    let gguf = crate::commands::open_model(&args.model)?;
    let meta = gguf.metadata();
    let tokenizer = Tokenizer::from_gguf(meta)
        .with_context(|| format!("{}: tokenizer", args.model.display()))?;
    let info = TokenizerInfo::new(meta, &tokenizer, &stem(&args.model));
    let bar = Bar::new(!args.json);
    let mut chat = None;
    if args.chat {
        match meta.get_str("tokenizer.chat_template").ok().flatten() {
            Some(src) => {
                let token = |id: Option<u32>| {
                    id.and_then(|id| tokenizer.token_text(id))
                        .unwrap_or("")
                        .to_owned()
                };
                chat = Some(Template {
                    template: ChatTemplate::new(src)
                        .with_context(|| format!("{}: chat template", args.model.display()))?,
                    bos: token(tokenizer.bos()),
                    eos: token(tokenizer.eos()),
                });
            }
            None => eprintln!(
                "warning: {} has no chat template (tokenizer.chat_template): --chat is ignored and rows are rendered as text",
                args.model.display()
            ),
        }
    }
    let render = match (&args.template, args.fields.is_empty()) {
        (Some(t), _) => Render::Template(t.clone()),
        (None, false) => Render::Fields(args.fields.clone()),
        (None, true) => Render::Detect,
    };
    let options = Options {
        sources: sources(&args)?,
        mix: args
            .mix
            .as_deref()
            .map(mix)
            .transpose()?
            .unwrap_or_default(),
        samples: args.samples,
        seq_len: args.seq_len,
        render,
        chat: chat.is_some(),
        min_cjk: args.min_cjk,
        dedup: !args.no_dedup,
        near_dup: args.near_dup,
        seed: args.seed,
        skip_bad: args.skip_bad,
        repeat: args.repeat,
        max_line: dataset::MAX_LINE,
        model_path: args.model.display().to_string(),
    };
    let renderer = chat.as_ref().map(|c| c as &dyn ChatRenderer);
    let report = dataset::build(&options, &tokenizer, &info, renderer, &args.output, &bar)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(r: &Report) {
    println!(
        "{:<12} {:>5} {:>6} {:>5} {:>6} {:>6} {:>6} {:>6} {:>9} {:>8}",
        "source", "share", "docs", "bad", "exact", "near", "lang", "kept", "tokens", "samples"
    );
    for s in &r.sources {
        println!(
            "{:<12} {:>5.2} {:>6} {:>5} {:>6} {:>6} {:>6} {:>6} {:>9} {:>4}/{:<3}",
            s.name,
            s.share,
            s.documents,
            s.bad,
            s.exact_duplicates,
            s.near_duplicates,
            s.language_filtered,
            s.kept,
            s.tokens,
            s.samples,
            s.wanted
        );
    }
    let c = &r.language.characters;
    let letters = c.letters().max(1) as f64;
    println!(
        "language: documents zh {} / en {} / other {}; letters CJK {:.1}% / Latin {:.1}% / other {:.1}%",
        r.language.zh,
        r.language.en,
        r.language.other,
        100.0 * c.cjk as f64 / letters,
        100.0 * c.latin as f64 / letters,
        100.0 * c.other as f64 / letters
    );
    let buckets: Vec<String> = r
        .histogram
        .iter()
        .map(|&(lo, n)| {
            let hi = if lo == 0 { 0 } else { 2 * lo - 1 };
            format!("{lo}–{hi}: {n}")
        })
        .collect();
    println!("document tokens: {}", buckets.join(", "));
    for bad in &r.bad_examples {
        println!("skipped: {bad}");
    }
    println!(
        "{} samples of {} tokens ({} tokens) → {}",
        r.samples,
        r.seq_len,
        r.total_tokens,
        r.output.display()
    );
    println!("next: {}", r.next);
}
