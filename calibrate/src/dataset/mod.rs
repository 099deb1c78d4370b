//! Calibration sets: text close to a model's real use, cut into samples of
//! its own tokens.
//!
//! [`build`] reads sources (text files, folders, JSON, JSONL, Parquet),
//! renders each row as a document ([`shape`] recognises SQuAD/CMRC,
//! DuReader/WebQA, Alpaca, chat and plain-text rows), drops bad rows when
//! asked, filters by script and removes exact and near duplicates
//! ([`clean`]), mixes the sources by ratio, tokenizes and packs documents
//! into samples of exactly `seq_len` tokens ([`pack`]), and writes the set
//! atomically as JSON Lines ([`format`]). [`Dataset::load`] reads a set back
//! for calibration and refuses one built for another tokenizer.
//!
//! **Invariant:** the same inputs, options and seed give a byte-identical
//! file; nothing depends on the clock, thread scheduling or hash-map order.
//!
//! ```no_run
//! use memwall_calibrate::dataset::{self, Options, SourceSpec, TokenizerInfo};
//! use memwall_format::{gguf::GgufModel, progress::Silent};
//! use memwall_runtime::tokenizer::Tokenizer;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = GgufModel::open("model.gguf".as_ref())?;
//! let tokenizer = Tokenizer::from_gguf(model.metadata())?;
//! let info = TokenizerInfo::new(model.metadata(), &tokenizer, "model");
//! let options = Options {
//!     sources: vec![SourceSpec { name: "qa".into(), paths: vec!["qa.jsonl".into()] }],
//!     samples: 128,
//!     ..Options::default()
//! };
//! let report = dataset::build(&options, &tokenizer, &info, None, "calib.jsonl".as_ref(), &Silent)?;
//! let set = dataset::Dataset::load("calib.jsonl".as_ref(), &tokenizer)?;
//! assert_eq!(set.samples.len(), report.samples);
//! # Ok(()) }
//! ```

pub mod clean;
pub mod format;
pub mod pack;
mod parquet;
mod read;
pub mod shape;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use memwall_format::atomic::AtomicFile;
use memwall_format::progress::{Progress, Unit};
use memwall_runtime::tokenizer::Tokenizer;
use rayon::prelude::*;
use serde_json::{Value, json};

use clean::{Deduper, Dup, Script};
pub use format::{TokenizerInfo, vocab_sha256};
use pack::{Packer, Sample, SplitMix64};
pub use read::MAX_LINE;
pub use shape::{ChatMessage, ChatRenderer, Render};
use shape::{Doc, Piece};

/// A calibration set as `memwall calibrate dataset` writes it.
#[derive(Clone, Debug, Default)]
pub struct Dataset {
    /// Token ids of each sample, BOS first when the vocabulary adds one.
    pub samples: Vec<Vec<u32>>,
    /// Tokens per sample the set was built for.
    pub seq_len: usize,
    /// SHA-256 of the file, hex.
    pub sha256: String,
}

impl Dataset {
    /// Reads a set written by [`build`], for `tokenizer`. Refuses a set built
    /// for another vocabulary, token ids outside it, samples longer than the
    /// set's `seq_len`, an empty set, and lines over [`MAX_LINE`] bytes.
    pub fn load(path: &Path, tokenizer: &Tokenizer) -> Result<Dataset, DatasetError> {
        format::load(path, tokenizer, MAX_LINE)
    }
}

/// Why a row of an input cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadKind {
    /// The bytes are not UTF-8.
    NotUtf8,
    /// A field the shape or template needs is absent (or null).
    MissingField(String),
    /// A field is present but holds nothing usable.
    Empty(String),
    /// The line or file is not valid JSON.
    Json(String),
    /// A JSON value where an object was expected (its kind).
    NotObject(String),
    /// An object whose fields match no known shape (its field names).
    UnknownShape(Vec<String>),
    /// A line longer than the limit (bytes).
    TooLong(usize),
    /// The Parquet reader failed.
    Parquet(String),
    /// The chat template failed on the row.
    Template(String),
}

impl fmt::Display for BadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadKind::NotUtf8 => write!(f, "not valid UTF-8"),
            BadKind::MissingField(name) => write!(f, "missing field `{name}`"),
            BadKind::Empty(name) => write!(f, "field `{name}` is empty"),
            BadKind::Json(e) => write!(f, "not valid JSON: {e}"),
            BadKind::NotObject(kind) => write!(f, "expected a JSON object, found {kind}"),
            BadKind::UnknownShape(fields) => write!(
                f,
                "no known shape for fields [{}]: give a --template or --fields",
                fields.join(", ")
            ),
            BadKind::TooLong(max) => write!(f, "line longer than {max} bytes"),
            BadKind::Parquet(e) => write!(f, "Parquet: {e}"),
            BadKind::Template(e) => write!(f, "chat template: {e}"),
        }
    }
}

/// A bad row: where it is and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRow {
    /// The input file.
    pub file: PathBuf,
    /// 1-based line (JSONL, text), element (JSON) or record (Parquet).
    pub line: usize,
    /// What is wrong.
    pub kind: BadKind,
}

impl fmt::Display for BadRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.kind)
    }
}

/// Why building or loading a calibration set failed.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// A file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// A bad input row, without `skip_bad`.
    #[error("{0} (skip such rows with --skip-bad)")]
    Bad(BadRow),
    /// The options do not make sense.
    #[error("{0}")]
    Options(String),
    /// Not enough text for one sample.
    #[error("{0}")]
    TooFew(String),
    /// A calibration set that cannot be used.
    #[error("{path}:{line}: {reason}")]
    Set {
        /// The set.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A calibration set built for another tokenizer.
    #[error("{path}: {reason}")]
    WrongTokenizer {
        /// The set.
        path: PathBuf,
        /// Which model it was built for, and what to do.
        reason: String,
    },
}

impl From<DatasetError> for crate::CalibrateError {
    fn from(e: DatasetError) -> Self {
        match e {
            DatasetError::Io { path, error } => crate::CalibrateError::Io { path, error },
            other => crate::CalibrateError::Input(other.to_string()),
        }
    }
}

/// A named source: files and folders whose documents share a mixing ratio.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceSpec {
    /// The name `mix` refers to.
    pub name: String,
    /// Files and folders (folders are read recursively, files sorted by path).
    pub paths: Vec<PathBuf>,
}

/// What [`build`] does.
#[derive(Clone, Debug)]
pub struct Options {
    /// The sources, in order.
    pub sources: Vec<SourceSpec>,
    /// Ratios by source name (normalised); unlisted sources get none. Empty:
    /// equal shares.
    pub mix: Vec<(String, f64)>,
    /// Samples wanted.
    pub samples: usize,
    /// Tokens per sample (at least 2).
    pub seq_len: usize,
    /// How JSON rows become text.
    pub render: Render,
    /// Render QA, Alpaca and chat rows as conversations through the chat
    /// renderer passed to [`build`] (ignored without one).
    pub chat: bool,
    /// Keep documents whose CJK share of letters is at least this.
    pub min_cjk: Option<f64>,
    /// Remove exact and near duplicates.
    pub dedup: bool,
    /// Jaccard similarity from which documents are near duplicates.
    pub near_dup: f64,
    /// Seed of every shuffle.
    pub seed: u64,
    /// Skip and count bad rows instead of failing on the first.
    pub skip_bad: bool,
    /// Reuse a source's documents from the start when it runs out.
    pub repeat: bool,
    /// The longest JSONL line accepted.
    pub max_line: usize,
    /// The model's path as the user gave it (for the report's next step).
    pub model_path: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sources: Vec::new(),
            mix: Vec::new(),
            samples: 512,
            seq_len: 512,
            render: Render::Detect,
            chat: false,
            min_cjk: None,
            dedup: true,
            near_dup: 0.8,
            seed: 42,
            skip_bad: false,
            repeat: false,
            max_line: MAX_LINE,
            model_path: "MODEL.gguf".to_owned(),
        }
    }
}

/// The largest `seq_len` accepted.
pub const MAX_SEQ_LEN: usize = 1 << 20;
/// The largest number of tokens (samples × seq_len) a set may hold.
pub const MAX_TOKENS: u64 = 1 << 32;

/// What happened to one source.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceReport {
    /// Its name.
    pub name: String,
    /// The paths given.
    pub paths: Vec<String>,
    /// Files read.
    pub files: usize,
    /// Its share of the samples (normalised ratio).
    pub share: f64,
    /// Documents read (rows rendered).
    pub documents: usize,
    /// Documents by recognised shape.
    pub shapes: BTreeMap<String, usize>,
    /// Bad rows skipped.
    pub bad: usize,
    /// Documents with no text.
    pub empty: usize,
    /// Exact duplicates removed.
    pub exact_duplicates: usize,
    /// Near duplicates removed.
    pub near_duplicates: usize,
    /// Documents below the CJK share.
    pub language_filtered: usize,
    /// Documents left after cleaning.
    pub kept: usize,
    /// Documents whose tokens went into samples.
    pub used: usize,
    /// Document tokens placed in samples.
    pub tokens: usize,
    /// Samples wanted from it.
    pub wanted: usize,
    /// Samples made.
    pub samples: usize,
}

/// The script mix of the kept documents.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LanguageMix {
    /// Documents whose dominant script is CJK.
    pub zh: usize,
    /// Documents whose dominant script is Latin.
    pub en: usize,
    /// The others (other scripts, or no letters).
    pub other: usize,
    /// Letters by script.
    pub characters: Script,
}

/// The result of [`build`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Per source, in order.
    pub sources: Vec<SourceReport>,
    /// Script mix of the documents kept.
    pub language: LanguageMix,
    /// Tokenized documents by length: `(lower bound, count)` for buckets
    /// `[2^k, 2^(k+1))` (and `[0, 1)`).
    pub histogram: Vec<(usize, usize)>,
    /// Samples requested.
    pub requested: usize,
    /// Samples written.
    pub samples: usize,
    /// Tokens per sample.
    pub seq_len: usize,
    /// Tokens written (samples × seq_len).
    pub total_tokens: usize,
    /// The output file.
    pub output: PathBuf,
    /// Bad rows skipped, the first few described.
    pub bad_examples: Vec<String>,
    /// Warnings (also sent to the progress reporter).
    pub warnings: Vec<String>,
    /// What to run next.
    pub next: String,
}

impl Report {
    /// The report as JSON.
    pub fn to_json(&self) -> Value {
        let sources: Vec<Value> = self
            .sources
            .iter()
            .map(|s| {
                json!({
                    "name": s.name, "paths": s.paths, "files": s.files, "share": s.share,
                    "documents": s.documents, "shapes": s.shapes, "bad": s.bad, "empty": s.empty,
                    "exact_duplicates": s.exact_duplicates, "near_duplicates": s.near_duplicates,
                    "language_filtered": s.language_filtered, "kept": s.kept, "used": s.used,
                    "tokens": s.tokens, "wanted": s.wanted, "samples": s.samples,
                })
            })
            .collect();
        let c = &self.language.characters;
        let letters = c.letters().max(1) as f64;
        json!({
            "output": self.output,
            "samples": self.samples,
            "requested": self.requested,
            "seq_len": self.seq_len,
            "total_tokens": self.total_tokens,
            "sources": sources,
            "language": {
                "documents": {"zh": self.language.zh, "en": self.language.en, "other": self.language.other},
                "characters": {"cjk": c.cjk, "latin": c.latin, "other": c.other},
                "shares": {"cjk": c.cjk as f64 / letters, "latin": c.latin as f64 / letters,
                           "other": c.other as f64 / letters},
            },
            "histogram": self.histogram.iter().map(|&(lo, n)| json!({"min_tokens": lo, "documents": n})).collect::<Vec<_>>(),
            "bad_examples": self.bad_examples,
            "warnings": self.warnings,
            "next": self.next,
        })
    }
}

/// Bad rows described in the report.
const BAD_EXAMPLES: usize = 10;

/// A cleaned document waiting to be tokenized.
struct Document {
    text: String,
    /// Rendered by the chat template: its special tokens are parsed.
    special: bool,
    file: usize,
    line: usize,
}

/// Everything read from one source.
struct Read {
    docs: Vec<Document>,
    files: Vec<String>,
}

fn push_warning(report: &mut Report, progress: &dyn Progress, message: String) {
    progress.warn(&message);
    report.warnings.push(message);
}

fn check_options(options: &Options) -> Result<Vec<f64>, DatasetError> {
    let err = |m: String| Err(DatasetError::Options(m));
    if options.sources.is_empty() {
        return err("no sources: give files or folders, or --source NAME=PATH".to_owned());
    }
    for (i, s) in options.sources.iter().enumerate() {
        if s.name.is_empty() {
            return err("a source has an empty name".to_owned());
        }
        if options.sources[..i].iter().any(|o| o.name == s.name) {
            return err(format!(
                "two sources are named `{}`: name them with --source NAME=PATH",
                s.name
            ));
        }
    }
    if options.seq_len < 2 || options.seq_len > MAX_SEQ_LEN {
        return err(format!(
            "--seq-len {} is out of range 2..={MAX_SEQ_LEN}",
            options.seq_len
        ));
    }
    if options.samples == 0 {
        return err("-n 0: ask for at least one sample".to_owned());
    }
    if (options.samples as u64).saturating_mul(options.seq_len as u64) > MAX_TOKENS {
        return err(format!(
            "{} samples of {} tokens exceed the limit of {MAX_TOKENS} tokens",
            options.samples, options.seq_len
        ));
    }
    if !(options.near_dup > 0.0 && options.near_dup <= 1.0) {
        return err(format!("--near-dup {} must be in (0, 1]", options.near_dup));
    }
    if let Some(f) = options.min_cjk {
        if !(0.0..=1.0).contains(&f) {
            return err(format!("--min-cjk {f} must be in [0, 1]"));
        }
    }
    if options.mix.is_empty() {
        let n = options.sources.len() as f64;
        return Ok(vec![1.0 / n; options.sources.len()]);
    }
    let mut ratios = vec![0.0; options.sources.len()];
    for (name, r) in &options.mix {
        let Some(i) = options.sources.iter().position(|s| &s.name == name) else {
            let names: Vec<&str> = options.sources.iter().map(|s| s.name.as_str()).collect();
            return err(format!(
                "--mix names `{name}`, which is not a source (sources: {})",
                names.join(", ")
            ));
        };
        if !r.is_finite() || *r < 0.0 {
            return err(format!("--mix {name}={r}: a ratio must be ≥ 0"));
        }
        ratios[i] += r;
    }
    let sum: f64 = ratios.iter().sum();
    if sum <= 0.0 {
        return err("--mix gives every source a ratio of 0".to_owned());
    }
    Ok(ratios.iter().map(|r| r / sum).collect())
}

/// Builds a calibration set and writes it to `output` (atomically: on error
/// nothing is left). `chat` renders conversations with the model's template
/// (used when `options.chat`, and for chat rows). Tokenizing is reported to
/// `progress`, as are warnings.
pub fn build(
    options: &Options,
    tokenizer: &Tokenizer,
    info: &TokenizerInfo,
    chat: Option<&dyn ChatRenderer>,
    output: &Path,
    progress: &dyn Progress,
) -> Result<Report, DatasetError> {
    let shares = check_options(options)?;
    let template = match &options.render {
        Render::Template(src) => Some(
            shape::parse_template(src)
                .map_err(|e| DatasetError::Options(format!("--template: {e}")))?,
        ),
        _ => None,
    };
    if let Render::Fields(fields) = &options.render {
        if fields.is_empty() || fields.iter().any(|f| f.trim().is_empty()) {
            return Err(DatasetError::Options(
                "--fields needs field names, such as --fields question,answer".to_owned(),
            ));
        }
    }
    let mut report = Report {
        requested: options.samples,
        seq_len: options.seq_len,
        output: output.to_owned(),
        ..Report::default()
    };
    for (s, share) in options.sources.iter().zip(&shares) {
        if !options.mix.is_empty() && *share == 0.0 {
            push_warning(
                &mut report,
                progress,
                format!("source `{}` is not in --mix: it gets no samples", s.name),
            );
        }
    }
    let chat_renderer = if options.chat { chat } else { None };
    let mut deduper = options.dedup.then(|| Deduper::new(Some(options.near_dup)));
    let mut warned_chat = false;

    // Read, render and clean every source.
    let mut reads = Vec::with_capacity(options.sources.len());
    for (spec, &share) in options.sources.iter().zip(&shares) {
        let mut sr = SourceReport {
            name: spec.name.clone(),
            paths: spec.paths.iter().map(|p| p.display().to_string()).collect(),
            share,
            ..SourceReport::default()
        };
        let mut read_out = Read {
            docs: Vec::new(),
            files: Vec::new(),
        };
        for path in &spec.paths {
            for file in read::list_files(path)? {
                let file_index = read_out.files.len();
                read_out.files.push(file.display().to_string());
                sr.files += 1;
                let mut sink = |row: Result<read::Row, BadRow>| -> Result<(), DatasetError> {
                    let rendered = row.and_then(|row| {
                        let line = row.line;
                        render_row(
                            row,
                            template.as_deref(),
                            &options.render,
                            options.chat && chat_renderer.is_some(),
                        )
                        .map(|r| (line, r))
                        .map_err(|kind| BadRow {
                            file: file.clone(),
                            line,
                            kind,
                        })
                    });
                    let (line, (shape, doc)) = match rendered {
                        Ok(r) => r,
                        Err(bad) => {
                            if !options.skip_bad {
                                return Err(DatasetError::Bad(bad));
                            }
                            sr.bad += 1;
                            if report.bad_examples.len() < BAD_EXAMPLES {
                                report.bad_examples.push(bad.to_string());
                            }
                            return Ok(());
                        }
                    };
                    let (text, special) = match doc {
                        Doc::Text(t) => (t, false),
                        Doc::Chat { messages, native } => match chat_renderer {
                            Some(r) => match r.render(&messages) {
                                Ok(t) => (t, true),
                                Err(e) => {
                                    let bad = BadRow {
                                        file: file.clone(),
                                        line,
                                        kind: BadKind::Template(e),
                                    };
                                    if !options.skip_bad {
                                        return Err(DatasetError::Bad(bad));
                                    }
                                    sr.bad += 1;
                                    if report.bad_examples.len() < BAD_EXAMPLES {
                                        report.bad_examples.push(bad.to_string());
                                    }
                                    return Ok(());
                                }
                            },
                            None => {
                                if native && !warned_chat {
                                    warned_chat = true;
                                    let m = format!(
                                        "{}:{line}: chat rows are joined as `role: content` lines; pass --chat (with a model that has a chat template) to render them as the model sees chats",
                                        file.display()
                                    );
                                    progress.warn(&m);
                                    report.warnings.push(m);
                                }
                                (shape::join_messages(&messages), false)
                            }
                        },
                    };
                    sr.documents += 1;
                    *sr.shapes.entry(shape.name().to_owned()).or_default() += 1;
                    if text.trim().is_empty() {
                        sr.empty += 1;
                        return Ok(());
                    }
                    let script = Script::of(&text);
                    if let Some(min) = options.min_cjk {
                        if script.cjk_share() < min {
                            sr.language_filtered += 1;
                            return Ok(());
                        }
                    }
                    if let Some(d) = deduper.as_mut() {
                        match d.check(&text) {
                            Some(Dup::Exact) => {
                                sr.exact_duplicates += 1;
                                return Ok(());
                            }
                            Some(Dup::Near) => {
                                sr.near_duplicates += 1;
                                return Ok(());
                            }
                            None => {}
                        }
                    }
                    match script.dominant() {
                        "zh" => report.language.zh += 1,
                        "en" => report.language.en += 1,
                        _ => report.language.other += 1,
                    }
                    report.language.characters.add(&script);
                    sr.kept += 1;
                    read_out.docs.push(Document {
                        text,
                        special,
                        file: file_index,
                        line,
                    });
                    Ok(())
                };
                read::read_file(&file, options.max_line, &mut sink)?;
            }
        }
        report.sources.push(sr);
        reads.push(read_out);
    }

    // Pack each source's share.
    let wanted = pack::allocate(options.samples, &shares);
    let bos = if tokenizer.add_bos() {
        tokenizer.bos()
    } else {
        None
    };
    let separator = tokenizer.eos().or_else(|| {
        let nl = tokenizer.encode("\n", false, false);
        (nl.len() == 1).then(|| nl[0])
    });
    let total: usize = wanted.iter().sum::<usize>() * options.seq_len;
    progress.start("tokenizing", total as u64, Unit::Items);
    let mut histogram = BTreeMap::<usize, usize>::new();
    let mut all: Vec<Sample> = Vec::new();
    for (i, read_out) in reads.iter().enumerate() {
        let sr = &mut report.sources[i];
        sr.wanted = wanted[i];
        if wanted[i] == 0 {
            continue;
        }
        progress.item(&sr.name);
        let mut rng =
            SplitMix64::new(options.seed ^ clean::mix64(clean::fnv1a(sr.name.as_bytes())));
        let mut order: Vec<usize> = (0..read_out.docs.len()).collect();
        rng.shuffle(&mut order);
        let mut packer = Packer::new(options.seq_len, bos, separator);
        let mut cache: Vec<Vec<u32>> = Vec::new();
        let mut tokenized = 0usize;
        const BATCH: usize = 64;
        'first: for chunk in order.chunks(BATCH) {
            let tokens: Vec<Vec<u32>> = chunk
                .par_iter()
                .map(|&d| {
                    let doc = &read_out.docs[d];
                    tokenizer.encode(&doc.text, false, doc.special)
                })
                .collect();
            for (&d, toks) in chunk.iter().zip(tokens) {
                let doc = &read_out.docs[d];
                *histogram.entry(bucket(toks.len())).or_default() += 1;
                tokenized += toks.len();
                let placed = packer.push(
                    &toks,
                    &sr.name,
                    &read_out.files[doc.file],
                    doc.line,
                    wanted[i],
                );
                progress.advance(placed as u64);
                if placed > 0 {
                    sr.used += 1;
                }
                if options.repeat {
                    cache.push(toks);
                }
                if packer.done.len() >= wanted[i] {
                    break 'first;
                }
            }
        }
        if options.repeat && packer.done.len() < wanted[i] && cache.iter().any(|t| !t.is_empty()) {
            'again: loop {
                for (k, toks) in cache.iter().enumerate() {
                    let doc = &read_out.docs[order[k]];
                    let placed = packer.push(
                        toks,
                        &sr.name,
                        &read_out.files[doc.file],
                        doc.line,
                        wanted[i],
                    );
                    progress.advance(placed as u64);
                    if packer.done.len() >= wanted[i] {
                        break 'again;
                    }
                }
            }
        }
        sr.samples = packer.done.len();
        // Tokens in finished samples only: the unfinished last one is dropped.
        sr.tokens = packer
            .done
            .iter()
            .flat_map(|s| &s.provenance)
            .map(|p| p.tokens)
            .sum();
        if sr.samples < wanted[i] {
            let m = format!(
                "source `{}` has text for {} of its {} samples ({tokenized} tokens of text after cleaning): add text, lower -n, or pass --repeat",
                sr.name, sr.samples, wanted[i]
            );
            progress.warn(&m);
            report.warnings.push(m);
        }
        all.extend(packer.done);
    }
    progress.finish();
    report.histogram = histogram.into_iter().collect();

    if all.is_empty() {
        let tokens: usize = report.sources.iter().map(|s| s.tokens).sum();
        let bad: usize = report.sources.iter().map(|s| s.bad).sum();
        let filtered: usize = report.sources.iter().map(|s| s.language_filtered).sum();
        let mut hint = String::new();
        if filtered > 0 {
            hint.push_str(&format!(
                ", lower --min-cjk ({filtered} documents filtered)"
            ));
        }
        if bad > 0 {
            hint.push_str(&format!(", fix the {bad} bad rows"));
        }
        return Err(DatasetError::TooFew(format!(
            "not enough text for one sample: the sources give {tokens} tokens after cleaning, a sample needs {}: add text, lower --seq-len{hint}, or pass --repeat",
            options.seq_len
        )));
    }
    let mut rng = SplitMix64::new(options.seed ^ 0x5341_4d50_4c45_5321);
    rng.shuffle(&mut all);

    // Write.
    let io = |error| DatasetError::Io {
        path: output.to_owned(),
        error,
    };
    let mut out = AtomicFile::create(output).map_err(io)?;
    let header_sources: Vec<format::HeaderSource<'_>> = report
        .sources
        .iter()
        .map(|s| format::HeaderSource {
            name: &s.name,
            paths: &s.paths,
            share: s.share,
            samples: s.samples,
            seq_len: options.seq_len,
        })
        .collect();
    format::write_header(
        &mut out,
        info,
        options.seq_len,
        all.len(),
        options.seed,
        chat_renderer.is_some(),
        &header_sources,
    )
    .map_err(io)?;
    for sample in &all {
        let text = String::from_utf8_lossy(&tokenizer.detokenize(&sample.tokens, false, true))
            .into_owned();
        format::write_sample(&mut out, sample, &text).map_err(io)?;
    }
    out.commit().map_err(io)?;

    report.samples = all.len();
    report.total_tokens = all.len() * options.seq_len;
    report.next = format!(
        "memwall calibrate imatrix -m {} --dataset {} -o imatrix.gguf",
        options.model_path,
        output.display()
    );
    Ok(report)
}

/// The histogram bucket of a length: 0, or the power of two at or below it.
fn bucket(n: usize) -> usize {
    if n == 0 { 0 } else { 1 << n.ilog2() }
}

/// Renders one row: text as is, JSON through the template, fields or shape detection.
fn render_row(
    row: read::Row,
    template: Option<&[Piece]>,
    render: &Render,
    chat: bool,
) -> Result<(shape::Shape, Doc), BadKind> {
    let map = match row.body {
        read::Body::Text(t) => return Ok((shape::Shape::Text, Doc::Text(t))),
        read::Body::Json(map) => map,
    };
    if let Some(pieces) = template {
        return shape::render_template(pieces, &map)
            .map(|t| (shape::Shape::Template, Doc::Text(t)));
    }
    if let Render::Fields(fields) = render {
        let pieces: Vec<Piece> = fields
            .iter()
            .enumerate()
            .flat_map(|(i, f)| {
                let sep = (i > 0).then(|| Piece::Literal("\n".to_owned()));
                sep.into_iter().chain([Piece::Field(f.trim().to_owned())])
            })
            .collect();
        return shape::render_template(&pieces, &map)
            .map(|t| (shape::Shape::Template, Doc::Text(t)));
    }
    shape::detect(&map, chat)
}

#[cfg(test)]
mod tests;
