//! Byte-level BPE tokenizers (`tokenizer.json`) to GGUF's `tokenizer.*` keys,
//! as llama.cpp's converter writes them (`TextModel.get_vocab_base`,
//! `_set_vocab_gpt2` and gguf-py's `SpecialVocab`): the token list padded to
//! the model's vocabulary size, token types, merges, special token ids,
//! whether BOS/EOS are added, the chat template.
//!
//! The pre-tokenizer name (`tokenizer.ggml.pre`) is recognised as llama.cpp
//! recognises it ([`detect_pre`]): the tokenizer (run by the `tokenizers`
//! crate) encodes llama.cpp's probe text, and the SHA-256 of the id list is
//! looked up in llama.cpp's table. SentencePiece (`tokenizer.model`) is not
//! read yet.

use std::path::{Path, PathBuf};

use memwall_format::gguf::{Array, Metadata, Value};
use serde_json::Value as Json;

use crate::sentencepiece::SentencePieceError;

/// Why a vocabulary could not be read or its pre-tokenizer recognised. Every
/// variant about a file names it.
#[derive(Debug, thiserror::Error)]
pub enum VocabError {
    /// A file could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// A file is not JSON.
    #[error("{}: not valid JSON: {error}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        error: serde_json::Error,
    },
    /// No `tokenizer.json`.
    #[error(
        "{}: missing (memwall reads byte-level BPE tokenizers from tokenizer.json)",
        path.display()
    )]
    NoTokenizerJson {
        /// The missing `tokenizer.json`.
        path: PathBuf,
    },
    /// `tokenizer.json`'s model is not BPE.
    #[error("{}: model type {found} is not BPE", path.display())]
    NotBpe {
        /// `tokenizer.json`.
        path: PathBuf,
        /// `model.type` (JSON).
        found: Json,
    },
    /// A `tokenizer.model` that llama.cpp reads instead of `tokenizer.json`.
    #[error("{}: a SentencePiece model is read with load_sentencepiece", path.display())]
    SentencePieceModel {
        /// `tokenizer.model`.
        path: PathBuf,
    },
    /// A BPE vocabulary with byte fallback (for llama).
    #[error(
        "{}: BPE with byte fallback (a SentencePiece-style vocabulary) is not supported yet",
        path.display()
    )]
    ByteFallback {
        /// `tokenizer.json`.
        path: PathBuf,
    },
    /// `model.vocab` is not an object.
    #[error("{}: model.vocab is not an object", path.display())]
    VocabNotObject {
        /// `tokenizer.json`.
        path: PathBuf,
    },
    /// A token of `model.vocab` without an id.
    #[error("{}: token {token:?} has no id", path.display())]
    TokenWithoutId {
        /// `tokenizer.json`.
        path: PathBuf,
        /// The token.
        token: String,
    },
    /// A token id at or past `vocab_size`.
    #[error("token id {id} is not below the model's vocab_size {vocab_size}")]
    IdPastVocabSize {
        /// The largest token id.
        id: u64,
        /// `vocab_size`.
        vocab_size: u64,
    },
    /// A `vocab_size` larger than any real vocabulary.
    #[error("config.json: vocab_size {0} is implausibly large")]
    ImplausibleVocabSize(u64),
    /// A `vocab_size` that does not fit the address space.
    #[error("vocab_size {0} is too large")]
    VocabSizeOverflow(u64),
    /// A merge string that is not two tokens.
    #[error(
        "{}: model.merges[{index}] {merge:?} is not two tokens separated by a space",
        path.display()
    )]
    MergeNotTwoTokens {
        /// `tokenizer.json`.
        path: PathBuf,
        /// The merge's index.
        index: usize,
        /// The merge.
        merge: String,
    },
    /// A merge pair that is not two strings.
    #[error("{}: model.merges[{index}] is a pair of non-strings", path.display())]
    MergeNotStrings {
        /// `tokenizer.json`.
        path: PathBuf,
        /// The merge's index.
        index: usize,
    },
    /// A merge that is neither a string nor a pair.
    #[error("{}: unknown merges format", path.display())]
    MergesFormat {
        /// `tokenizer.json`.
        path: PathBuf,
    },
    /// A merge whose parts or result `model.vocab` lacks.
    #[error(
        "{}: model.merges[{index}] ({left:?}, {right:?}) needs the token {token:?}, which model.vocab does not have",
        path.display()
    )]
    MergeWithoutToken {
        /// `tokenizer.json`.
        path: PathBuf,
        /// The merge's index.
        index: usize,
        /// Its left part.
        left: String,
        /// Its right part.
        right: String,
        /// The token missing.
        token: String,
    },
    /// `tokenizer.model` is not a SentencePiece model memwall reads.
    #[error("{}: {error}", path.display())]
    SentencePiece {
        /// `tokenizer.model`.
        path: PathBuf,
        /// What is wrong.
        error: SentencePieceError,
    },
    /// `added_tokens.json` is not an object.
    #[error("{}: not an object", path.display())]
    AddedNotObject {
        /// `added_tokens.json`.
        path: PathBuf,
    },
    /// A token of `added_tokens.json` without an id.
    #[error("{}: {token:?} has no id", path.display())]
    AddedWithoutId {
        /// `added_tokens.json`.
        path: PathBuf,
        /// The token.
        token: String,
    },
    /// A key of `added_tokens_decoder` that is not an id.
    #[error("{}: added token id {id:?}", path.display())]
    AddedBadId {
        /// `tokenizer_config.json`.
        path: PathBuf,
        /// The key.
        id: String,
    },
    /// An entry of `added_tokens_decoder` without content.
    #[error("{}: added token {id} has no content", path.display())]
    AddedWithoutContent {
        /// `tokenizer_config.json`.
        path: PathBuf,
        /// The token id.
        id: usize,
    },
    /// A negative special token id.
    #[error("invalid value for special token type {kind}: {id}")]
    SpecialId {
        /// The special token kind (`bos`, `eos`, ...).
        kind: &'static str,
        /// The id.
        id: i64,
    },
    /// The `tokenizers` library cannot load `tokenizer.json`.
    #[error("{}: cannot load the tokenizer: {error}", path.display())]
    LoadTokenizer {
        /// `tokenizer.json`.
        path: PathBuf,
        /// The library's error.
        error: tokenizers::Error,
    },
    /// The `tokenizers` library cannot tokenize the probe text.
    #[error("{}: cannot tokenize: {error}", path.display())]
    Tokenize {
        /// `tokenizer.json`.
        path: PathBuf,
        /// The library's error.
        error: tokenizers::Error,
    },
    /// A pre-tokenizer llama.cpp's table does not have.
    #[error(
        "the BPE pre-tokenizer of {} is not one llama.cpp recognises (probe hash {hash}); \
         if you know which it is, name it with --pre (e.g. llama-bpe, qwen2, smollm, \
         command-r, gpt-2)",
        path.display()
    )]
    UnknownPreTokenizer {
        /// `tokenizer.json`.
        path: PathBuf,
        /// The probe hash.
        hash: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> VocabError + '_ {
    move |error| VocabError::Io {
        path: path.to_owned(),
        error,
    }
}

/// GGUF token types (`llama_token_type`).
pub mod token_type {
    /// An ordinary token.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A control token (`<|im_start|>`).
    pub const CONTROL: i32 = 3;
    /// An added token that is not special.
    pub const USER_DEFINED: i32 = 4;
    /// A filler id with no token (`[PAD123]`).
    pub const UNUSED: i32 = 5;
    /// A byte-fallback token (`<0x41>`).
    pub const BYTE: i32 = 6;
}

/// The special token kinds gguf-py looks for, in its order, with their GGUF keys.
pub(crate) const SPECIAL: [(&str, &str); 9] = [
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("cls", "tokenizer.ggml.cls_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
];

/// A vocabulary ready for GGUF: byte-level BPE (`gpt2`) or SentencePiece (`llama`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Vocab {
    /// `tokenizer.ggml.model`: `gpt2` or `llama`.
    pub model: &'static str,
    /// Tokens, one per id up to the model's vocabulary size.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece only).
    pub scores: Option<Vec<f32>>,
    /// `token_type` per token.
    pub types: Vec<i32>,
    /// Merges as `"left right"`.
    pub merges: Vec<String>,
    /// Special token ids, in the order gguf-py finds them.
    pub special: Vec<(&'static str, u32)>,
    /// `add_{bos,eos,sep}_token` flags, in the order gguf-py sets them.
    pub add: Vec<(&'static str, bool)>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.chat_template.<name>` for named templates (listed in
    /// `tokenizer.chat_templates`), in the checkpoint's order.
    pub named_templates: Vec<(String, String)>,
    /// `tokenizer.ggml.add_space_prefix` (llama only, from `add_prefix_space`).
    pub add_space_prefix: Option<bool>,
}

fn read_json(path: &Path) -> Result<Option<Json>, VocabError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(io_error(path))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|error| VocabError::Json {
            path: path.to_owned(),
            error,
        })
}

fn looks_special(token: &str) -> bool {
    ["<pad>", "<mask>", "<2mass>", "[@BOS@]"].contains(&token)
        || (token.starts_with("<|") && token.ends_with("|>"))
        || (token.starts_with("<｜") && token.ends_with("｜>"))
        || (token.starts_with("<unused") && token.ends_with('>'))
}

struct Special {
    ids: Vec<(&'static str, u32)>,
    types: Vec<&'static str>,
    n_vocab: usize,
}

impl Special {
    /// `_set_special_token`: the first id found for a kind wins; ids past the vocabulary are skipped.
    fn set(&mut self, typ: &'static str, id: Option<&Json>) -> Result<(), VocabError> {
        let Some(id) = id.and_then(Json::as_i64) else {
            return Ok(());
        };
        if id < 0 {
            return Err(VocabError::SpecialId { kind: typ, id });
        }
        if (id as usize) < self.n_vocab && !self.ids.iter().any(|(t, _)| *t == typ) {
            self.ids.push((typ, id as u32));
        }
        Ok(())
    }
}

/// `tokenizer.ggml.add_space_prefix`: LlamaModel.set_vocab writes tokenizer_config's
/// `add_prefix_space` when it is there; other architectures do not.
fn add_space_prefix(tc: Option<&Json>, gguf_arch: &str) -> Option<bool> {
    if gguf_arch != "llama" {
        return None;
    }
    tc?.get("add_prefix_space").and_then(Json::as_bool)
}

/// Reads the BPE vocabulary of the checkpoint in `dir` (`tokenizer.json`,
/// `tokenizer_config.json`, `config.json`). `gguf_arch` selects the
/// architecture-specific keys.
pub fn load_bpe(dir: &Path, config: &Json, gguf_arch: &str) -> Result<Vocab, VocabError> {
    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer = read_json(&tokenizer_path)?.ok_or_else(|| VocabError::NoTokenizerJson {
        path: tokenizer_path.clone(),
    })?;
    let model = &tokenizer["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(VocabError::NotBpe {
            path: tokenizer_path,
            found: model["type"].clone(),
        });
    }
    // llama.cpp reads tokenizer.model (not this file) for llama, qwen2 and qwen3; the
    // other architectures ignore it.
    if dir.join("tokenizer.model").is_file() && matches!(gguf_arch, "llama" | "qwen2" | "qwen3") {
        return Err(VocabError::SentencePieceModel {
            path: dir.join("tokenizer.model"),
        });
    }
    if gguf_arch == "llama" && model["byte_fallback"].as_bool() == Some(true) {
        return Err(VocabError::ByteFallback {
            path: tokenizer_path,
        });
    }
    let tc_path = dir.join("tokenizer_config.json");
    // gguf-py treats an empty tokenizer_config.json like a missing one.
    let tc = read_json(&tc_path)?.filter(|t| t.as_object().is_some_and(|o| !o.is_empty()));
    let mut v = Vocab {
        model: "gpt2",
        add_space_prefix: add_space_prefix(tc.as_ref(), gguf_arch),
        ..Vocab::default()
    };

    // Tokens: the model's vocabulary plus added tokens, padded to vocab_size.
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| VocabError::VocabNotObject {
            path: tokenizer_path.clone(),
        })?;
    let added = tokenizer["added_tokens"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut by_id: std::collections::BTreeMap<u64, String> = std::collections::BTreeMap::new();
    for (token, id) in vocab {
        let id = id.as_u64().ok_or_else(|| VocabError::TokenWithoutId {
            path: tokenizer_path.clone(),
            token: token.clone(),
        })?;
        by_id.insert(id, token.clone());
    }
    for a in &added {
        if let (Some(id), Some(content)) = (a["id"].as_u64(), a["content"].as_str()) {
            by_id.insert(id, content.to_owned());
        }
    }
    let max_id = by_id.keys().next_back().copied().unwrap_or(0);
    let vocab_size = match config.get("vocab_size").and_then(Json::as_u64) {
        Some(n) => n,
        None => by_id.len() as u64,
    };
    if max_id >= vocab_size {
        return Err(VocabError::IdPastVocabSize {
            id: max_id,
            vocab_size,
        });
    }
    // Every id up to vocab_size gets a token string: bound it before allocating
    // (as load_sentencepiece does; the embedding has vocab_size rows).
    if vocab_size > 1 << 24 {
        return Err(VocabError::ImplausibleVocabSize(vocab_size));
    }
    for i in 0..vocab_size {
        let Some(token) = by_id.get(&i) else {
            v.tokens.push(format!("[PAD{i}]"));
            v.types.push(token_type::UNUSED);
            continue;
        };
        let entry = added
            .iter()
            .rev()
            .find(|a| a["content"].as_str() == Some(token.as_str()));
        let ty = match entry {
            None => token_type::NORMAL,
            Some(a) if a["special"].as_bool() == Some(true) || looks_special(token) => {
                token_type::CONTROL
            }
            Some(_) => token_type::USER_DEFINED,
        };
        let token = if ty == token_type::USER_DEFINED {
            token.replace('▁', " ")
        } else {
            token.clone()
        };
        v.tokens.push(token);
        v.types.push(ty);
    }

    v.merges = read_merges(model, vocab, &tokenizer_path)?;

    // gguf-py reads BPE special ids without a vocabulary size and writes an id
    // past the vocabulary, which llama.cpp ignores when loading (memwall's
    // runtime refuses it); skip such ids here, as for SentencePiece.
    let n_vocab = v.tokens.len();
    let sv = special_vocab(dir, config, Some(&tokenizer), tc, n_vocab)?;
    v.special = sv.special;
    v.add = sv.add;
    v.chat_template = sv.chat_template;
    v.named_templates = sv.named_templates;
    Ok(v)
}

/// `tokenizer.json`'s merges as gguf-py writes them: strings, or pairs
/// (spaces inside a pair encoded as U+0120). Both parts and their join must
/// be tokens of `model.vocab`, as the tokenizers library (and so llama.cpp's
/// converter) requires: a merge into a missing token would make the runtime
/// drop the bytes of that piece.
fn read_merges(
    model: &Json,
    vocab: &serde_json::Map<String, Json>,
    tokenizer_path: &Path,
) -> Result<Vec<String>, VocabError> {
    let tokenizer_path = tokenizer_path.to_owned();
    let mut out = Vec::new();
    if let Some(merges) = model["merges"].as_array() {
        for (i, m) in merges.iter().enumerate() {
            // The tokenizers library skips a "#version" header line; gguf-py copies it.
            if let Json::String(s) = m
                && s.starts_with("#version")
            {
                out.push(s.clone());
                continue;
            }
            let (left, right) = match m {
                Json::String(s) => match s.split(' ').collect::<Vec<_>>()[..] {
                    [left, right] => (left, right),
                    _ => {
                        return Err(VocabError::MergeNotTwoTokens {
                            path: tokenizer_path,
                            index: i,
                            merge: s.clone(),
                        });
                    }
                },
                Json::Array(pair) if pair.len() == 2 => {
                    match (pair[0].as_str(), pair[1].as_str()) {
                        (Some(left), Some(right)) => (left, right),
                        _ => {
                            return Err(VocabError::MergeNotStrings {
                                path: tokenizer_path,
                                index: i,
                            });
                        }
                    }
                }
                _ => {
                    return Err(VocabError::MergesFormat {
                        path: tokenizer_path,
                    });
                }
            };
            let joined = format!("{left}{right}");
            if let Some(t) = [left, right, joined.as_str()]
                .into_iter()
                .find(|t| !vocab.contains_key(*t))
            {
                return Err(VocabError::MergeWithoutToken {
                    path: tokenizer_path,
                    index: i,
                    left: left.to_owned(),
                    right: right.to_owned(),
                    token: t.to_owned(),
                });
            }
            let part = |s: &str| -> String {
                s.chars()
                    .map(|c| if c == ' ' { '\u{120}' } else { c })
                    .collect()
            };
            out.push(format!("{} {}", part(left), part(right)));
        }
    }

    Ok(out)
}

/// The tokens Gemma 4's converter makes user-defined whatever their type
/// (`Gemma4Model.set_vocab`), so that llama.cpp renders them.
const GEMMA4_VISIBLE: [&str; 7] = [
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    "<|\"|>",
];

/// Reads Gemma 4's vocabulary as llama.cpp's `Gemma4Model.set_vocab` does
/// (gguf-py's `LlamaHfVocab` over `tokenizer.json`, a byte-fallback BPE):
/// the model's tokens by id, then added tokens past them; every score
/// -1000; `<0xXX>` tokens `BYTE`, transformers' special tokens `CONTROL`
/// (the named ones, every `*_token` of `tokenizer_config.json` and its
/// `extra_special_tokens`), seven chat-format tokens `USER_DEFINED`, the rest
/// `NORMAL`; merges, special ids and the chat template as for BPE.
pub fn load_gemma4(dir: &Path, config: &Json) -> Result<Vocab, VocabError> {
    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer = read_json(&tokenizer_path)?.ok_or_else(|| VocabError::NoTokenizerJson {
        path: tokenizer_path.clone(),
    })?;
    let model = &tokenizer["model"];
    if model["type"].as_str() != Some("BPE") || model["byte_fallback"].as_bool() != Some(true) {
        return Err(VocabError::NotBpe {
            path: tokenizer_path,
            found: model["type"].clone(),
        });
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| VocabError::VocabNotObject {
            path: tokenizer_path.clone(),
        })?;
    if vocab.len() > 1 << 24 {
        return Err(VocabError::ImplausibleVocabSize(vocab.len() as u64));
    }
    let mut by_id: Vec<Option<&str>> = vec![None; vocab.len()];
    let mut ids: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for (token, id) in vocab {
        let n = id.as_u64().ok_or_else(|| VocabError::TokenWithoutId {
            path: tokenizer_path.clone(),
            token: token.clone(),
        })?;
        match by_id.get_mut(n as usize) {
            Some(slot) => *slot = Some(token.as_str()),
            None => {
                return Err(VocabError::IdPastVocabSize {
                    id: n,
                    vocab_size: vocab.len() as u64,
                });
            }
        }
        ids.insert(token.as_str(), n);
    }
    let mut tokens: Vec<String> = Vec::with_capacity(by_id.len());
    for (i, t) in by_id.iter().enumerate() {
        let t = t.ok_or(VocabError::IdPastVocabSize {
            id: i as u64,
            vocab_size: vocab.len() as u64,
        })?;
        tokens.push(t.to_owned());
    }
    // Added tokens past the model's vocabulary, in id order.
    let mut added: Vec<(u64, String)> = tokenizer["added_tokens"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| Some((t["id"].as_u64()?, t["content"].as_str()?.to_owned())))
                .filter(|(id, _)| *id >= vocab.len() as u64)
                .collect()
        })
        .unwrap_or_default();
    added.sort();
    for (id, content) in &added {
        if *id != tokens.len() as u64 {
            return Err(VocabError::IdPastVocabSize {
                id: *id,
                vocab_size: tokens.len() as u64,
            });
        }
        tokens.push(content.clone());
    }
    let added_ids: std::collections::HashMap<&str, u64> =
        added.iter().map(|(id, c)| (c.as_str(), *id)).collect();
    // transformers' special tokens.
    let tc_path = dir.join("tokenizer_config.json");
    let tc = read_json(&tc_path)?.filter(|t| t.as_object().is_some_and(|o| !o.is_empty()));
    let mut special_ids = std::collections::HashSet::new();
    if let Some(map) = tc.as_ref().and_then(Json::as_object) {
        let content = |v: &Json| -> Option<String> {
            v.as_str()
                .map(str::to_owned)
                .or_else(|| v.get("content")?.as_str().map(str::to_owned))
        };
        let mut texts: Vec<String> = map
            .iter()
            .filter(|(k, _)| k.ends_with("_token"))
            .filter_map(|(_, v)| content(v))
            .collect();
        for list in ["extra_special_tokens", "additional_special_tokens"] {
            if let Some(a) = map.get(list).and_then(Json::as_array) {
                texts.extend(a.iter().filter_map(content));
            }
        }
        for t in texts {
            if let Some(&id) = ids.get(t.as_str()).or(added_ids.get(t.as_str())) {
                special_ids.insert(id);
            }
        }
    }
    let is_byte = |t: &str| {
        let b = t.as_bytes();
        b.len() == 6
            && t.starts_with("<0x")
            && t.ends_with('>')
            && b[3].is_ascii_hexdigit()
            && b[4].is_ascii_hexdigit()
    };
    let types = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if GEMMA4_VISIBLE.contains(&t.as_str()) {
                token_type::USER_DEFINED
            } else if is_byte(t) {
                token_type::BYTE
            } else if special_ids.contains(&(i as u64)) {
                token_type::CONTROL
            } else if i >= vocab.len() {
                token_type::USER_DEFINED
            } else {
                token_type::NORMAL
            }
        })
        .collect();
    let n_vocab = tokens.len();
    let merges = read_merges(model, vocab, &tokenizer_path)?;
    let sv = special_vocab(dir, config, Some(&tokenizer), tc, n_vocab)?;
    Ok(Vocab {
        model: "gemma4",
        scores: Some(vec![-1000.0; n_vocab]),
        tokens,
        types,
        merges,
        special: sv.special,
        add: sv.add,
        chat_template: sv.chat_template,
        named_templates: sv.named_templates,
        add_space_prefix: Some(false),
    })
}

/// Writes a Gemma 4 vocabulary in `Gemma4Model.set_vocab`'s order: the model,
/// tokens, scores and types, then what gguf-py's `SpecialVocab` adds (merges,
/// special ids, flags, chat templates), then `add_space_prefix` false and
/// `add_bos_token` true. No `tokenizer.ggml.pre`: llama.cpp names it itself.
pub fn write_gemma4_vocab(meta: &mut Metadata, v: &Vocab) {
    meta.set("tokenizer.ggml.model", v.model);
    write_tokens(meta, v);
    meta.set("tokenizer.ggml.add_space_prefix", Value::Bool(false));
    meta.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
}

/// Reads the SentencePiece vocabulary of the llama-family checkpoint in `dir`
/// as llama.cpp's `_create_vocab_sentencepiece` does: the pieces of
/// `tokenizer.model` (text, score, type) up to the model's `vocab_size`, then
/// `added_tokens.json`, then `tokenizer_config.json`'s `added_tokens_decoder`
/// (score -1000; special or special-looking tokens are control tokens, the
/// others user-defined with `▁` turned into spaces); ids without a token are
/// `[PADi]` (score -10000, unused). Special ids and flags as gguf-py finds them.
pub fn load_sentencepiece(dir: &Path, config: &Json, gguf_arch: &str) -> Result<Vocab, VocabError> {
    use crate::sentencepiece::{parse, piece_type};
    let path = dir.join("tokenizer.model");
    let bytes = std::fs::read(&path).map_err(io_error(&path))?;
    let model = parse(&bytes).map_err(|error| VocabError::SentencePiece { path, error })?;
    let tc_path = dir.join("tokenizer_config.json");
    let tc = read_json(&tc_path)?;
    let mut v = Vocab {
        model: "llama",
        add_space_prefix: add_space_prefix(tc.as_ref(), gguf_arch),
        ..Vocab::default()
    };
    let n = match config.get("vocab_size").and_then(Json::as_u64) {
        Some(n) => usize::try_from(n).map_err(|_| VocabError::VocabSizeOverflow(n))?,
        None => model.pieces.len(),
    };
    // Bounded by the checkpoint: the embedding has vocab_size rows.
    if n > 1 << 24 {
        return Err(VocabError::ImplausibleVocabSize(n as u64));
    }
    v.tokens = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; n];
    v.types = vec![token_type::UNUSED; n];
    for (id, p) in model.pieces.iter().enumerate().take(n) {
        v.tokens[id] = p.piece.clone();
        scores[id] = p.score;
        // sentencepiece's IsUnknown / IsControl / IsUnused / IsByte; anything else,
        // user-defined pieces included, is normal.
        v.types[id] = match p.kind {
            piece_type::UNKNOWN | piece_type::CONTROL | piece_type::UNUSED | piece_type::BYTE => {
                p.kind
            }
            _ => token_type::NORMAL,
        };
    }
    let added_path = dir.join("added_tokens.json");
    if let Some(added) = read_json(&added_path)? {
        let added = added
            .as_object()
            .ok_or_else(|| VocabError::AddedNotObject {
                path: added_path.clone(),
            })?;
        for (token, id) in added {
            let id = id.as_u64().ok_or_else(|| VocabError::AddedWithoutId {
                path: added_path.clone(),
                token: token.clone(),
            })? as usize;
            if id < n {
                v.tokens[id] = token.clone();
                scores[id] = -1000.0;
                v.types[id] = token_type::USER_DEFINED;
            }
        }
    }
    if let Some(decoder) = tc
        .as_ref()
        .and_then(|t| t.get("added_tokens_decoder"))
        .and_then(Json::as_object)
    {
        for (id, data) in decoder {
            let id: usize = id.parse().map_err(|_| VocabError::AddedBadId {
                path: tc_path.clone(),
                id: id.clone(),
            })?;
            let content =
                data["content"]
                    .as_str()
                    .ok_or_else(|| VocabError::AddedWithoutContent {
                        path: tc_path.clone(),
                        id,
                    })?;
            if id >= n {
                continue;
            }
            if data["special"].as_bool() == Some(true) || looks_special(content) {
                v.types[id] = token_type::CONTROL;
                v.tokens[id] = content.to_owned();
            } else {
                v.types[id] = token_type::USER_DEFINED;
                v.tokens[id] = content.replace('▁', " ");
            }
            scores[id] = -1000.0;
        }
    }
    v.scores = Some(scores);
    let tokenizer = read_json(&dir.join("tokenizer.json"))?;
    let tc = tc.filter(|t| t.as_object().is_some_and(|o| !o.is_empty()));
    let sv = special_vocab(dir, config, tokenizer.as_ref(), tc, n)?;
    v.special = sv.special;
    v.add = sv.add;
    v.chat_template = sv.chat_template;
    v.named_templates = sv.named_templates;
    Ok(v)
}

/// What gguf-py's `SpecialVocab` finds: special token ids, add_* flags, chat template.
struct SpecialVocab {
    special: Vec<(&'static str, u32)>,
    add: Vec<(&'static str, bool)>,
    chat_template: Option<String>,
    named_templates: Vec<(String, String)>,
}

/// gguf-py's `SpecialVocab` for the checkpoint in `dir`: from `tokenizer.json`'s
/// added tokens and post-processor (when there is one), `tokenizer_config.json`
/// (`tc`, already read; `None` when missing or empty), then `config.json`'s
/// `*_token_id`. Ids at or past `n_vocab` are skipped.
fn special_vocab(
    dir: &Path,
    config: &Json,
    tokenizer: Option<&Json>,
    mut tc: Option<Json>,
    n_vocab: usize,
) -> Result<SpecialVocab, VocabError> {
    let mut chat_template = None;
    let mut named = Vec::new();
    // Special tokens (SpecialVocab._try_load_from_tokenizer_json, then config.json).
    let mut special = Special {
        ids: Vec::new(),
        types: SPECIAL[..7].iter().map(|(t, _)| *t).collect(),
        n_vocab,
    };
    let tc_str = |tc: &Option<Json>, key: &str| -> Option<String> {
        let e = tc.as_ref()?.get(key)?;
        e.as_str()
            .map(str::to_owned)
            .or_else(|| e.get("content")?.as_str().map(str::to_owned))
    };
    let mut add: Vec<(&'static str, bool)> = Vec::new();
    let set_add =
        |add: &mut Vec<(&'static str, bool)>, typ: &'static str, value: bool, overwrite: bool| {
            match add.iter_mut().find(|(t, _)| *t == typ) {
                Some(slot) if overwrite => slot.1 = value,
                Some(_) => {}
                None => add.push((typ, value)),
            }
        };
    let mut special_bos = tc_str(&tc, "bos_token");
    let mut special_cls = tc_str(&tc, "cls_token");
    let mut special_eos = tc_str(&tc, "eos_token");
    let mut special_sep = tc_str(&tc, "sep_token");
    if special_bos.is_none() && special_cls.is_some() {
        if let Some(t) = tc.as_mut() {
            t["bos_token"] = Json::from(special_cls.clone());
            special_bos = special_cls.clone();
        }
    }
    if special_eos.is_none() && special_sep.is_some() {
        if let Some(t) = tc.as_mut() {
            t["eos_token"] = Json::from(special_sep.clone());
            special_eos = special_sep.clone();
        }
    }
    let added = tokenizer
        .and_then(|t| t["added_tokens"].as_array())
        .cloned()
        .unwrap_or_default();
    if let Some(pp) = tokenizer
        .and_then(|t| t.get("post_processor"))
        .filter(|p| !p.is_null())
    {
        let processors = pp
            .get("processors")
            .and_then(Json::as_array)
            .cloned()
            .unwrap_or_else(|| vec![pp.clone()]);
        for p in &processors {
            match p["type"].as_str() {
                Some("ByteLevel") => {
                    set_add(&mut add, "bos", false, false);
                    set_add(&mut add, "eos", false, false);
                }
                Some("RobertaProcessing") => {
                    for t in ["bos", "eos", "sep"] {
                        set_add(&mut add, t, true, true);
                    }
                    if let Some(t) = tc.as_mut() {
                        if special_cls.is_none() {
                            special_cls = p["cls"][0]
                                .as_str()
                                .map(str::to_owned)
                                .or(special_bos.clone());
                            t["cls_token"] = Json::from(special_cls.clone());
                        }
                        if special_sep.is_none() {
                            special_sep = p["sep"][0]
                                .as_str()
                                .map(str::to_owned)
                                .or(special_eos.clone());
                            t["sep_token"] = Json::from(special_sep.clone());
                        }
                    }
                }
                Some("TemplateProcessing") => {
                    // gguf-py's "crude parsing" of the template: a leading special token
                    // means BOS is added, a trailing one EOS, one between A and B a separator.
                    let id = |e: &Json| {
                        e.get("SpecialToken")
                            .and_then(|t| t["id"].as_str())
                            .map(str::to_owned)
                    };
                    let single = p["single"].as_array().cloned().unwrap_or_default();
                    let mut pair = p["pair"].as_array().cloned().unwrap_or_default();
                    let (mut special_first, mut special_last) = (None, None);
                    if single.len() > 1 {
                        special_first = id(&single[0]);
                        if let Some(first) = &special_first {
                            match tc.as_mut() {
                                None => special_bos = Some(first.clone()),
                                Some(t) => {
                                    if special_bos.as_ref() != Some(first)
                                        && special_cls.as_ref() != Some(first)
                                    {
                                        if special_bos.is_none() {
                                            t["bos_token"] = Json::from(first.clone());
                                            special_bos = Some(first.clone());
                                        }
                                        if special_cls.is_none() {
                                            t["cls_token"] = Json::from(first.clone());
                                            special_cls = Some(first.clone());
                                        }
                                    }
                                }
                            }
                            let known = special_bos.as_ref() == Some(first)
                                || special_cls.as_ref() == Some(first);
                            set_add(&mut add, "bos", known, true);
                        }
                        special_last = id(&single[single.len() - 1]);
                        if let Some(last) = &special_last {
                            match tc.as_mut() {
                                None => special_eos = Some(last.clone()),
                                Some(t) => {
                                    if special_eos.as_ref() != Some(last) {
                                        if !special.types.contains(&"eot") {
                                            special.types.push("eot");
                                            t["eot_token"] = Json::from(special_eos.clone());
                                        } else if !special.types.contains(&"eom") {
                                            special.types.push("eom");
                                            t["eom_token"] = Json::from(special_eos.clone());
                                        }
                                        t["eos_token"] = Json::from(last.clone());
                                        special_eos = Some(last.clone());
                                    }
                                }
                            }
                            set_add(&mut add, "eos", special_eos.as_ref() == Some(last), true);
                        }
                    }
                    if !pair.is_empty() {
                        let start =
                            usize::from(special_first.is_some() && id(&pair[0]) == special_first);
                        let stop = usize::from(
                            special_last.is_some() && id(&pair[pair.len() - 1]) == special_last,
                        );
                        pair = pair
                            .get(start..pair.len().saturating_sub(stop))
                            .map(<[Json]>::to_vec)
                            .unwrap_or_default();
                        if !pair.is_empty() {
                            let seq = |e: &Json| {
                                e.get("Sequence")
                                    .and_then(|s| s["id"].as_str())
                                    .map(str::to_owned)
                            };
                            let (a, b) = (seq(&pair[0]), seq(&pair[pair.len() - 1]));
                            if a.as_deref() == Some("A")
                                && b.as_deref() == Some("B")
                                && pair.len() > 2
                            {
                                let middle = &pair[1..pair.len() - 1];
                                let is_sep = |e: &Json| {
                                    let t = id(e);
                                    t.is_some() && (t == special_sep || t == special_eos)
                                };
                                let mut add_sep = is_sep(&middle[0]) && special_last.is_none();
                                if middle.len() == 2 && is_sep(&middle[1]) {
                                    add_sep = true;
                                }
                                set_add(&mut add, "sep", add_sep, true);
                                if add_sep && special_sep.is_none() {
                                    if let Some(t) = tc.as_mut() {
                                        t["sep_token"] = Json::from(special_eos.clone());
                                    }
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(tc) = &tc {
        // gguf-py: tokenizer_config's chat_template if the key is there (even null),
        // else chat_template.jinja (with additional_chat_templates/*.jinja as named
        // templates), else chat_template.json's.
        let alternative = || -> Result<Json, VocabError> {
            let jinja = dir.join("chat_template.jinja");
            if jinja.is_file() {
                let read = |p: &Path| std::fs::read_to_string(p).map_err(io_error(p));
                let default = read(&jinja)?;
                let mut extra: Vec<std::path::PathBuf> =
                    std::fs::read_dir(dir.join("additional_chat_templates"))
                        .map(|d| {
                            d.filter_map(|e| e.ok().map(|e| e.path()))
                                .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
                                .collect()
                        })
                        .unwrap_or_default();
                if extra.is_empty() {
                    return Ok(Json::String(default));
                }
                // Python's glob order is the directory's; memwall sorts by name.
                extra.sort();
                let mut list = vec![serde_json::json!({"name": "default", "template": default})];
                for p in extra {
                    let name = p.file_stem().map(|s| s.to_string_lossy().into_owned());
                    list.push(serde_json::json!({"name": name, "template": read(&p)?}));
                }
                return Ok(Json::Array(list));
            }
            Ok(read_json(&dir.join("chat_template.json"))?
                .and_then(|j| j.get("chat_template").cloned())
                .unwrap_or(Json::Null))
        };
        let value = match tc.get("chat_template") {
            Some(v) => v.clone(),
            None => alternative()?,
        };
        match value {
            Json::String(s) => chat_template = Some(s),
            Json::Array(list) => {
                // GGUFWriter.add_chat_template: names reduced to [A-Za-z0-9_], "default"
                // is tokenizer.chat_template, the others tokenizer.chat_template.<name>.
                for choice in &list {
                    let name: String = choice["name"]
                        .as_str()
                        .unwrap_or("")
                        .chars()
                        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                        .collect();
                    let Some(template) = choice["template"].as_str() else {
                        continue;
                    };
                    if name.is_empty() {
                        continue;
                    }
                    if name == "default" {
                        chat_template = Some(template.to_owned());
                    } else if let Some(slot) = named.iter_mut().find(|(n, _)| *n == name) {
                        slot.1 = template.to_owned();
                    } else {
                        named.push((name, template.to_owned()));
                    }
                }
            }
            // gguf-py ignores other values (with a warning).
            _ => {}
        }
        for typ in special.types.clone() {
            if let Some(flag) = tc.get(format!("add_{typ}_token")).and_then(Json::as_bool) {
                set_add(&mut add, typ, flag, false);
            }
            let Some(content) = tc_str(&Some(tc.clone()), &format!("{typ}_token")) else {
                continue;
            };
            let id = added
                .iter()
                .find(|a| a["content"].as_str() == Some(content.as_str()))
                .map(|a| &a["id"]);
            special.set(typ, id)?;
        }
    }
    for typ in special.types.clone() {
        special.set(typ, config.get(format!("{typ}_token_id")))?;
    }
    Ok(SpecialVocab {
        special: special.ids,
        add,
        chat_template,
        named_templates: named,
    })
}

/// Appends the tokenizer keys in llama.cpp's order. `add_space_prefix` goes
/// first (LlamaModel writes it before the vocabulary). `pre` is `default` for
/// SentencePiece vocabularies, as llama.cpp writes.
pub fn write_vocab(meta: &mut Metadata, v: &Vocab, pre: &str) {
    if let Some(b) = v.add_space_prefix {
        meta.set("tokenizer.ggml.add_space_prefix", Value::Bool(b));
    }
    meta.set("tokenizer.ggml.model", v.model);
    meta.set("tokenizer.ggml.pre", pre);
    write_tokens(meta, v);
}

/// The tokens, their scores and types, then the special-token keys.
fn write_tokens(meta: &mut Metadata, v: &Vocab) {
    meta.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(v.tokens.clone())),
    );
    if let Some(scores) = &v.scores {
        meta.set(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(scores.clone())),
        );
    }
    meta.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(v.types.clone())),
    );
    write_special(meta, v);
}

/// What gguf-py's `SpecialVocab.add_to_gguf` writes: merges, special ids,
/// `add_*_token` flags, named and default chat templates.
fn write_special(meta: &mut Metadata, v: &Vocab) {
    if !v.merges.is_empty() {
        meta.set(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(v.merges.clone())),
        );
    }
    for (typ, id) in &v.special {
        if let Some((_, key)) = SPECIAL.iter().find(|(t, _)| t == typ) {
            meta.set(*key, Value::U32(*id));
        }
    }
    for (typ, flag) in &v.add {
        meta.set(
            format!("tokenizer.ggml.add_{typ}_token"),
            Value::Bool(*flag),
        );
    }
    for (name, template) in &v.named_templates {
        meta.set(format!("tokenizer.chat_template.{name}"), template.as_str());
    }
    if !v.named_templates.is_empty() {
        let names = v.named_templates.iter().map(|(n, _)| n.clone()).collect();
        meta.set(
            "tokenizer.chat_templates",
            Value::Array(Array::String(names)),
        );
    }
    if let Some(t) = &v.chat_template {
        meta.set("tokenizer.chat_template", t.as_str());
    }
}

/// llama.cpp's probe text (`chktxt` in `get_vocab_base_pre`).
const PROBE: &str = include_str!("../data/chktxt.txt");
/// llama.cpp's table of probe hashes → pre-tokenizer names (see the file's header).
const PRE_TOKENIZERS: &str = include_str!("../data/pre_tokenizers.tsv");

/// Pre-tokenizer names llama.cpp's loader accepts that its converter's
/// table does not name (`llama-vocab.cpp` at 0c1e570).
const LOADER_ONLY_PRE_TOKENIZERS: [&str; 9] = [
    "default",
    "glm5",
    "jina-de",
    "jina-es",
    "llada-moe",
    "llama-v3",
    "llama3",
    "mpt",
    "whitespace",
];

/// Every `tokenizer.ggml.pre` name llama.cpp knows (its converter's table and
/// its loader), sorted: what `--pre` may name.
pub fn known_pre_tokenizers() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = PRE_TOKENIZERS
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split('\t').nth(1))
        .chain(LOADER_ONLY_PRE_TOKENIZERS)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The SHA-256 llama.cpp computes for a tokenizer: of Python's `str()` of the
/// ids the tokenizer gives the probe text (special tokens added, as
/// `tokenizer.encode` does).
pub fn probe_hash(dir: &Path) -> Result<String, VocabError> {
    use sha2::{Digest, Sha256};
    let path = dir.join("tokenizer.json");
    let tokenizer = match tokenizers::Tokenizer::from_file(&path) {
        Ok(t) => t,
        Err(error) => return Err(VocabError::LoadTokenizer { path, error }),
    };
    let encoding = match tokenizer.encode(PROBE, true) {
        Ok(e) => e,
        Err(error) => return Err(VocabError::Tokenize { path, error }),
    };
    let ids: Vec<String> = encoding.get_ids().iter().map(u32::to_string).collect();
    Ok(format!(
        "{:x}",
        Sha256::digest(format!("[{}]", ids.join(", ")).as_bytes())
    ))
}

/// Recognises the pre-tokenizer of the BPE tokenizer in `dir` the way llama.cpp
/// does; an unknown hash is an error that says how to name it by hand.
pub fn detect_pre(dir: &Path) -> Result<String, VocabError> {
    let hash = probe_hash(dir)?;
    PRE_TOKENIZERS
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split('\t');
            Some((f.next()?, f.next()?))
        })
        .find(|(h, _)| *h == hash)
        .map(|(_, name)| name.to_owned())
        .ok_or_else(|| VocabError::UnknownPreTokenizer {
            path: dir.join("tokenizer.json"),
            hash,
        })
}
