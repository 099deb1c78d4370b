//! The calibration-set file: JSON Lines, a header object then one object per
//! sample.
//!
//! ```text
//! {"memwall_calibration":1,"model":"tiny-zh","tokenizer":{"model":"gpt2","pre":"gpt-2",
//!   "n_vocab":6144,"bos":0,"eos":2,"add_bos":false,"sha256":"…"},"seq_len":512,"samples":512,
//!   "seed":42,"chat":false,"sources":[{"name":"qa","paths":["qa.jsonl"],"share":0.7,
//!   "samples":358,"tokens":183296}]}
//! {"text":"…","tokens":[…],"provenance":[{"source":"qa","file":"qa.jsonl","line":12,"tokens":40}]}
//! ```
//!
//! `tokenizer.sha256` is the SHA-256 over every token's stored text in id
//! order, each followed by a 0 byte: two vocabularies with the same hash give
//! the same ids to the same strings, so a set is only used with the tokenizer
//! it was built for. `text` is the sample's tokens detokenised (special tokens
//! written out) and is for people; `tokens` is what calibration uses.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use memwall_format::gguf::Metadata;
use memwall_runtime::tokenizer::Tokenizer;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::pack::Sample;
use super::read::{Line, read_line};
use super::{Dataset, DatasetError};

/// The format version written in `memwall_calibration`.
pub const VERSION: u64 = 1;

/// Identifies a tokenizer (and the model it came from) in a set's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerInfo {
    /// The model's `general.name` (or what the caller names it).
    pub model_name: String,
    /// `tokenizer.ggml.model` (`gpt2`, `llama`).
    pub model: String,
    /// `tokenizer.ggml.pre`, when present.
    pub pre: Option<String>,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// BOS id.
    pub bos: Option<u32>,
    /// EOS id.
    pub eos: Option<u32>,
    /// Whether samples start with BOS.
    pub add_bos: bool,
    /// See [`vocab_sha256`].
    pub sha256: String,
}

impl TokenizerInfo {
    /// The tokenizer of a GGUF model; `fallback_name` when it has no `general.name`.
    pub fn new(meta: &Metadata, tokenizer: &Tokenizer, fallback_name: &str) -> TokenizerInfo {
        let get = |key: &str| meta.get_str(key).ok().flatten().map(str::to_owned);
        TokenizerInfo {
            model_name: get("general.name").unwrap_or_else(|| fallback_name.to_owned()),
            model: get("tokenizer.ggml.model").unwrap_or_default(),
            pre: get("tokenizer.ggml.pre"),
            n_vocab: tokenizer.n_vocab(),
            bos: tokenizer.bos(),
            eos: tokenizer.eos(),
            add_bos: tokenizer.add_bos(),
            sha256: vocab_sha256(tokenizer),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "model": self.model, "pre": self.pre, "n_vocab": self.n_vocab,
            "bos": self.bos, "eos": self.eos, "add_bos": self.add_bos, "sha256": self.sha256,
        })
    }
}

/// SHA-256 over all token strings in id order, each followed by a 0 byte, hex.
pub fn vocab_sha256(tokenizer: &Tokenizer) -> String {
    let mut h = Sha256::new();
    for id in 0..tokenizer.n_vocab() {
        let text = u32::try_from(id)
            .ok()
            .and_then(|id| tokenizer.token_text(id))
            .unwrap_or("");
        h.update(text.as_bytes());
        h.update([0u8]);
    }
    hex(&h.finalize())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One source in the header.
pub(crate) struct HeaderSource<'a> {
    pub name: &'a str,
    pub paths: &'a [String],
    pub share: f64,
    pub samples: usize,
    pub seq_len: usize,
}

/// Writes the header line.
pub(crate) fn write_header(
    out: &mut dyn Write,
    info: &TokenizerInfo,
    seq_len: usize,
    samples: usize,
    seed: u64,
    chat: bool,
    sources: &[HeaderSource<'_>],
) -> io::Result<()> {
    let sources: Vec<Value> = sources
        .iter()
        .map(|s| {
            json!({"name": s.name, "paths": s.paths, "share": s.share,
                   "samples": s.samples, "tokens": s.samples * s.seq_len})
        })
        .collect();
    let header = json!({
        "memwall_calibration": VERSION,
        "model": info.model_name,
        "tokenizer": info.to_json(),
        "seq_len": seq_len,
        "samples": samples,
        "seed": seed,
        "chat": chat,
        "sources": sources,
    });
    serde_json::to_writer(&mut *out, &header)?;
    out.write_all(b"\n")
}

/// Writes one sample line.
pub(crate) fn write_sample(out: &mut dyn Write, sample: &Sample, text: &str) -> io::Result<()> {
    let provenance: Vec<Value> = sample
        .provenance
        .iter()
        .map(|p| json!({"source": p.source, "file": p.file, "line": p.line, "tokens": p.tokens}))
        .collect();
    let line = json!({"text": text, "tokens": sample.tokens, "provenance": provenance});
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")
}

/// Hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Reads a set; see [`Dataset::load`].
pub(crate) fn load(
    path: &Path,
    tokenizer: &Tokenizer,
    max_line: usize,
) -> Result<Dataset, DatasetError> {
    let bad = |line: usize, reason: String| DatasetError::Set {
        path: path.to_owned(),
        line,
        reason,
    };
    let file = File::open(path).map_err(|error| DatasetError::Io {
        path: path.to_owned(),
        error,
    })?;
    let mut r = BufReader::with_capacity(
        1 << 16,
        Hashing {
            inner: file,
            hash: Sha256::new(),
        },
    );
    let mut buf = Vec::new();
    let next = |r: &mut BufReader<Hashing<File>>, buf: &mut Vec<u8>, line: usize| match read_line(
        r, buf, max_line,
    ) {
        Ok(Line::Some) => Ok(true),
        Ok(Line::Eof) => Ok(false),
        Ok(Line::TooLong) => Err(bad(
            line,
            format!("line longer than {max_line} bytes; not a calibration set memwall wrote"),
        )),
        Err(error) => Err(DatasetError::Io {
            path: path.to_owned(),
            error,
        }),
    };
    if !next(&mut r, &mut buf, 1)? {
        return Err(bad(1, "empty file, not a calibration set".to_owned()));
    }
    let header: Value = serde_json::from_slice(&buf).map_err(|e| {
        bad(
            1,
            format!("the header is not JSON ({e}); build the set with `memwall calibrate dataset`"),
        )
    })?;
    let version = header.get("memwall_calibration").and_then(Value::as_u64);
    if version != Some(VERSION) {
        return Err(bad(
            1,
            match version {
                None => "no `memwall_calibration` header: not a calibration set memwall wrote (build one with `memwall calibrate dataset`)".to_owned(),
                Some(v) => format!("calibration set format {v}, this memwall reads format {VERSION}"),
            },
        ));
    }
    let field = |name: &str| {
        header
            .get(name)
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| bad(1, format!("header field `{name}` missing or not a count")))
    };
    let seq_len = field("seq_len")?;
    let declared = field("samples")?;
    if seq_len == 0 {
        return Err(bad(1, "header field `seq_len` is 0".to_owned()));
    }
    let tok = header.get("tokenizer");
    let their_sha = tok.and_then(|t| t.get("sha256")).and_then(Value::as_str);
    let their_n = tok.and_then(|t| t.get("n_vocab")).and_then(Value::as_u64);
    let (Some(their_sha), Some(their_n)) = (their_sha, their_n) else {
        return Err(bad(
            1,
            "header field `tokenizer.sha256` or `tokenizer.n_vocab` missing".to_owned(),
        ));
    };
    let ours = vocab_sha256(tokenizer);
    let n_vocab = tokenizer.n_vocab();
    if their_sha != ours || usize::try_from(their_n).ok() != Some(n_vocab) {
        let model = header
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("an unnamed model");
        return Err(DatasetError::WrongTokenizer {
            path: path.to_owned(),
            reason: format!(
                "this calibration set was built for `{model}` (a vocabulary of {their_n} tokens, \
                 sha256 {}…), but this model's vocabulary differs ({n_vocab} tokens, sha256 {}…); \
                 its token ids would mean other text. Build a set for this model: \
                 memwall calibrate dataset -m THIS-MODEL.gguf SOURCES… -o calib.jsonl",
                short(their_sha),
                short(&ours),
            ),
        });
    }
    let mut samples = Vec::new();
    let mut line = 1usize;
    loop {
        line += 1;
        if !next(&mut r, &mut buf, line)? {
            break;
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let value: Value = serde_json::from_slice(&buf)
            .map_err(|e| bad(line, format!("not JSON ({e}); the file is damaged")))?;
        let Some(tokens) = value.get("tokens").and_then(Value::as_array) else {
            return Err(bad(line, "sample without a `tokens` array".to_owned()));
        };
        if tokens.is_empty() {
            return Err(bad(line, "a sample with no tokens".to_owned()));
        }
        if tokens.len() > seq_len {
            return Err(bad(
                line,
                format!("{} tokens, more than seq_len {seq_len}", tokens.len()),
            ));
        }
        let mut ids = Vec::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            match t.as_u64().and_then(|v| u32::try_from(v).ok()) {
                Some(id) if (id as usize) < n_vocab => ids.push(id),
                _ => {
                    return Err(bad(
                        line,
                        format!("token {i} is {t}, not an id below the vocabulary size {n_vocab}"),
                    ));
                }
            }
        }
        samples.push(ids);
    }
    if samples.is_empty() {
        return Err(bad(
            line,
            "the set has no samples; rebuild it with more text".to_owned(),
        ));
    }
    if samples.len() != declared {
        return Err(bad(
            line,
            format!(
                "the header announces {declared} samples, the file has {} (truncated?)",
                samples.len()
            ),
        ));
    }
    let sha256 = hex(&r.into_inner().hash.finalize());
    Ok(Dataset {
        samples,
        seq_len,
        sha256,
    })
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}
