//! The tokenizer stored in a GGUF file's `tokenizer.ggml.*` keys, producing
//! the same token ids as llama.cpp (`llama-tokenize`, llama.cpp 0c1e570).
//!
//! Three models: byte-level BPE (`gpt2`, with the pre-tokenizers listed in
//! [`PRE_TOKENIZERS`]), SentencePiece (`llama`: scores, byte fallback,
//! `add_space_prefix`) and Gemma 4's BPE over SentencePiece-style text
//! (`gemma4`: spaces written `▁`, merges over raw UTF-8, `<0xXX>` byte tokens). Special tokens written in the text are split out
//! first (control tokens only with `parse_special`), as llama.cpp does.
//!
//! ```no_run
//! use memwall_format::gguf::GgufFile;
//! use memwall_runtime::tokenizer::Tokenizer;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = GgufFile::open("model.gguf".as_ref())?;
//! let tok = Tokenizer::from_gguf(file.metadata())?;
//! let ids = tok.encode("Hello, 世界", true, true);
//! assert_eq!(tok.decode(&ids[usize::from(tok.add_bos())..]), "Hello, 世界");
//! # Ok(()) }
//! ```
//!
//! Everything read from the file is checked when the tokenizer is built;
//! encoding and decoding never fail and never panic.

mod bpe;
mod pretok;
mod spm;
mod stream;
mod unicode;
mod unicode_table;

use std::collections::{BTreeSet, HashMap};

use memwall_format::gguf::{Array, Metadata, MetadataError, describe_type};
use memwall_format::model_info::tokenizer_keys as keys;
use pretok::Step;
pub use stream::StreamDecoder;
use unicode::Flags;

/// Metadata keys read here besides those in [`memwall_format::model_info::tokenizer_keys`].
pub mod extra_keys {
    /// Whether SentencePiece text gets a leading space (bool).
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
    /// End-of-message token id.
    pub const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
    /// Separator token id (llama.cpp's spelling).
    pub const SEP_ID: &str = "tokenizer.ggml.seperator_token_id";
    /// Mask token id.
    pub const MASK_ID: &str = "tokenizer.ggml.mask_token_id";
    /// Fill-in-the-middle prefix token id.
    pub const FIM_PRE_ID: &str = "tokenizer.ggml.fim_pre_token_id";
    /// Fill-in-the-middle suffix token id.
    pub const FIM_SUF_ID: &str = "tokenizer.ggml.fim_suf_token_id";
    /// Fill-in-the-middle middle token id.
    pub const FIM_MID_ID: &str = "tokenizer.ggml.fim_mid_token_id";
    /// Fill-in-the-middle padding token id.
    pub const FIM_PAD_ID: &str = "tokenizer.ggml.fim_pad_token_id";
    /// Fill-in-the-middle repository token id.
    pub const FIM_REP_ID: &str = "tokenizer.ggml.fim_rep_token_id";
    /// Fill-in-the-middle file separator token id.
    pub const FIM_SEP_ID: &str = "tokenizer.ggml.fim_sep_token_id";
    /// Deprecated name of the FIM prefix id.
    pub const PREFIX_ID: &str = "tokenizer.ggml.prefix_token_id";
    /// Deprecated name of the FIM suffix id.
    pub const SUFFIX_ID: &str = "tokenizer.ggml.suffix_token_id";
    /// Deprecated name of the FIM middle id.
    pub const MIDDLE_ID: &str = "tokenizer.ggml.middle_token_id";
}

/// The `tokenizer.ggml.pre` values of byte-level BPE that memwall supports
/// (a missing key means `default`, as in llama.cpp).
pub const PRE_TOKENIZERS: &[&str] = &[
    "default",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "mpt",
    "olmo",
    "jais",
    "exaone4",
    "trillion",
    "granite-docling",
    "starcoder",
    "refact",
    "command-r",
    "smollm",
    "codeshell",
    "exaone",
    "minerva-7b",
    "mellum2",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "dbrx",
    "smaug-bpe",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "stablelm2",
    "megrez",
    "hunyuan",
    "solar-open",
    "grok-2",
    "deepseek-llm",
];

/// Why a GGUF file's tokenizer cannot be used. Every message names the key.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TokenizerError {
    /// A key is missing or has the wrong type.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// `tokenizer.ggml.model` names a model memwall does not implement.
    #[error(
        "tokenizer.ggml.model '{0}' is not supported (memwall supports 'gpt2', 'llama' and 'gemma4')"
    )]
    UnknownModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer memwall does not implement.
    #[error("tokenizer.ggml.pre '{0}' is not a supported pre-tokenizer")]
    UnknownPreTokenizer(String),
    /// The vocabulary is empty or has more entries than token ids can hold.
    #[error("tokenizer.ggml.tokens has {0} entries (must be 1 to 2^31 - 1)")]
    VocabularySize(usize),
    /// A per-token array is shorter than the vocabulary.
    #[error("{key} has {len} entries but the vocabulary has {n_vocab} tokens")]
    ArrayTooShort {
        /// The array's key.
        key: &'static str,
        /// Its length.
        len: usize,
        /// `tokenizer.ggml.tokens`' length.
        n_vocab: usize,
    },
    /// Two tokens have the same text (llama.cpp aborts on this).
    #[error("tokenizer.ggml.tokens: token {second} repeats the text of token {first}: {text:?}")]
    DuplicateToken {
        /// The earlier id.
        first: u32,
        /// The later id.
        second: u32,
        /// The text.
        text: String,
    },
    /// A merge is not two parts separated by a space.
    #[error("tokenizer.ggml.merges[{index}] is not 'left right': {merge:?}")]
    BadMerge {
        /// Position in the array.
        index: usize,
        /// The entry.
        merge: String,
    },
    /// A special token id is not in the vocabulary.
    #[error("{key} = {id} is outside the vocabulary of {n_vocab} tokens")]
    IdOutOfRange {
        /// The key.
        key: &'static str,
        /// The id found.
        id: u64,
        /// Vocabulary size.
        n_vocab: usize,
    },
}

/// Token attributes (llama.cpp's `llama_token_attr`), from
/// `tokenizer.ggml.token_type` and llama.cpp's name-based fixes.
mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;

    /// `tokenizer.ggml.token_type` value → attribute (unknown values: none).
    pub fn from_type(t: i32) -> u16 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0,
        }
    }
}

/// How a BPE model writes text in its vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BpeText {
    /// GPT-2's byte-to-character map (`gpt2`); a piece with no token falls
    /// back to its one-byte ASCII tokens.
    ByteLevel,
    /// Raw UTF-8 with spaces escaped as `▁` (`gemma4`); a piece with no token
    /// falls back to `<0xXX>` byte tokens.
    Escaped,
}

#[derive(Debug)]
enum Model {
    /// BPE.
    Bpe {
        merges: bpe::Merges,
        steps: &'static [Step],
        ignore_merges: bool,
        text: BpeText,
    },
    /// SentencePiece, with the byte-fallback token of each byte.
    Spm {
        scores: Vec<f32>,
        byte_tokens: Box<[Option<u32>; 256]>,
    },
}

/// A tokenizer read from GGUF metadata. See the [module docs](self).
#[derive(Debug)]
pub struct Tokenizer {
    model: Model,
    tokens: Vec<String>,
    token_to_id: HashMap<String, u32>,
    attrs: Vec<u16>,
    /// Control, user-defined and unknown tokens, longest text first.
    special: Vec<u32>,
    eog: BTreeSet<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
}

/// A pre-tokenizer: its regex steps and the flags llama.cpp ties to the name.
struct Pre {
    steps: &'static [Step],
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
}

const GPT2: &[Step] = &[Step::Gpt2];
const DIGIT_GPT2: &[Step] = &[Step::Digit, Step::Gpt2];
const LLAMA3: &[Step] = &[Step::Llama3];
const QWEN2: &[Step] = &[Step::Qwen2];
const QWEN35: &[Step] = &[Step::Qwen35];
const NEWLINES: &[Step] = &[Step::Newlines];
const DEFAULT: &[Step] = &[
    Step::PunctuationRun,
    Step::Gpt2,
    Step::Digits,
    Step::AsciiDigits3,
];
const DEEPSEEK_LLM: &[Step] = &[
    Step::Newline,
    Step::DeepseekLetters,
    Step::DeepseekPunctuation,
    Step::TrailingSpace,
    Step::DeepseekCjk,
    Step::Digits,
];

fn pre_tokenizer(name: &str) -> Option<Pre> {
    let pre = |steps, clean_spaces| Pre {
        steps,
        clean_spaces,
        ignore_merges: false,
        add_bos: false,
    };
    Some(match name {
        "default" => pre(DEFAULT, true),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "exaone4" => {
            pre(GPT2, true)
        }
        "trillion" | "granite-docling" => pre(GPT2, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            pre(DIGIT_GPT2, true)
        }
        "command-r" | "smollm" => pre(DIGIT_GPT2, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => Pre {
            ignore_merges: true,
            add_bos: true,
            ..pre(LLAMA3, true)
        },
        "dbrx" | "smaug-bpe" => pre(LLAMA3, true),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => pre(QWEN2, false),
        "qwen35" => pre(QWEN35, false),
        "stablelm2" | "megrez" => pre(QWEN2, true),
        "deepseek-llm" => pre(DEEPSEEK_LLM, false),
        _ => return None,
    })
}

/// What [`Tokenizer::encode_bpe`] needs of a [`Model::Bpe`].
struct Bpe<'a> {
    merges: &'a bpe::Merges,
    steps: &'a [Step],
    ignore_merges: bool,
    text: BpeText,
}

/// A piece of the input: text still to tokenize (byte range) or a special token.
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// The largest vocabulary llama.cpp's `int32_t` token ids allow.
const MAX_VOCAB: usize = i32::MAX as usize;

impl Tokenizer {
    /// Reads the tokenizer from GGUF metadata, checking every key it uses.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let model_name = meta.require_str(keys::MODEL)?;
        let bpe_text = match model_name {
            "gpt2" => Some(BpeText::ByteLevel),
            "gemma4" => Some(BpeText::Escaped),
            "llama" => None,
            other => return Err(TokenizerError::UnknownModel(other.to_owned())),
        };
        let is_bpe = bpe_text.is_some();
        let tokens = meta
            .get_str_array(keys::TOKENS)?
            .ok_or_else(|| MetadataError::Missing(keys::TOKENS.to_owned()))?;
        let n = tokens.len();
        if n == 0 || n > MAX_VOCAB {
            return Err(TokenizerError::VocabularySize(n));
        }
        let too_short = |key: &'static str, len: usize| {
            (len < n).then_some(TokenizerError::ArrayTooShort {
                key,
                len,
                n_vocab: n,
            })
        };

        let mut attrs = vec![attr::NORMAL; n];
        if let Some(types) = meta.get_array(keys::TOKEN_TYPE)? {
            let Array::I32(types) = types else {
                return Err(wrong_type(meta, keys::TOKEN_TYPE, "array of int32"));
            };
            if let Some(e) = too_short(keys::TOKEN_TYPE, types.len()) {
                return Err(e);
            }
            for (a, &t) in attrs.iter_mut().zip(types) {
                *a = attr::from_type(t);
            }
        }

        let mut texts = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (id, text) in (0u32..).zip(tokens) {
            // llama.cpp renames empty tokens so that they cannot match text.
            let text = if text.is_empty() {
                format!("[EMPTY_{id}]")
            } else {
                text.clone()
            };
            if let Some(&first) = token_to_id.get(&text) {
                return Err(TokenizerError::DuplicateToken {
                    first,
                    second: id,
                    text,
                });
            }
            token_to_id.insert(text.clone(), id);
            texts.push(text);
        }

        // llama.cpp ignores `tokenizer.ggml.pre` for `gemma4`.
        let pre_name = match bpe_text {
            Some(BpeText::ByteLevel) => meta.get_str(keys::PRE)?.unwrap_or("default"),
            Some(BpeText::Escaped) => "gemma4",
            None => "default",
        };
        // llama.cpp's defaults per model: (model, add_bos, clean_spaces, [bos, eos, unk]).
        let (model, mut add_bos, clean_spaces, [default_bos, default_eos, default_unk]) =
            if let Some(text) = bpe_text {
                let pre = match text {
                    BpeText::ByteLevel => pre_tokenizer(pre_name)
                        .ok_or_else(|| TokenizerError::UnknownPreTokenizer(pre_name.to_owned()))?,
                    // Merges run over whole lines: only newlines split words.
                    BpeText::Escaped => Pre {
                        steps: NEWLINES,
                        clean_spaces: true,
                        ignore_merges: false,
                        add_bos: true,
                    },
                };
                let merges = read_merges(meta)?;
                let model = Model::Bpe {
                    merges,
                    steps: pre.steps,
                    ignore_merges: pre.ignore_merges,
                    text,
                };
                // `gemma4` has no default special ids: they come from the keys.
                let ids = match text {
                    BpeText::ByteLevel => [Some(11), Some(11), None],
                    BpeText::Escaped => [None; 3],
                };
                (model, pre.add_bos, pre.clean_spaces, ids)
            } else {
                let mut scores = vec![0.0f32; n];
                if let Some(array) = meta.get_array(keys::SCORES)? {
                    let len = array.len();
                    if let Some(e) = too_short(keys::SCORES, len) {
                        return Err(e);
                    }
                    match array {
                        Array::F32(v) => scores.copy_from_slice(&v[..n]),
                        // Whole-number scores are converted as llama.cpp does.
                        Array::I32(v) => {
                            for (s, &i) in scores.iter_mut().zip(v) {
                                *s = i as f32;
                            }
                        }
                        _ => {
                            return Err(wrong_type(
                                meta,
                                keys::SCORES,
                                "array of float32 or int32",
                            ));
                        }
                    }
                }
                let mut byte_tokens = Box::new([None; 256]);
                for (b, slot) in (0u8..=255).zip(byte_tokens.iter_mut()) {
                    *slot = token_to_id
                        .get(&format!("<0x{b:02X}>"))
                        .or_else(|| {
                            b.is_ascii()
                                .then(|| token_to_id.get(&char::from(b).to_string()))
                                .flatten()
                        })
                        .copied();
                }
                let model = Model::Spm {
                    scores,
                    byte_tokens,
                };
                (model, true, false, [Some(1), Some(2), Some(0)])
            };
        let add_space_prefix = meta
            .get_bool(extra_keys::ADD_SPACE_PREFIX)?
            .unwrap_or(!is_bpe);

        // Special ids: the model's defaults (dropped if outside the
        // vocabulary), then the keys, which must be inside it.
        let in_vocab = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let read_id = |key: &'static str, default: Option<u32>| -> Result<_, TokenizerError> {
            match meta.get_u64(key)? {
                None => Ok(in_vocab(default)),
                Some(id) if id < n as u64 => Ok(u32::try_from(id).ok()),
                Some(id) => Err(TokenizerError::IdOutOfRange {
                    key,
                    id,
                    n_vocab: n,
                }),
            }
        };
        let bos = read_id(keys::BOS_ID, default_bos)?;
        let eos = read_id(keys::EOS_ID, default_eos)?;
        let mut eot = read_id(keys::EOT_ID, None)?;
        let mut eom = read_id(extra_keys::EOM_ID, None)?;
        let unk = read_id(keys::UNK_ID, default_unk)?;
        // Not used by these models, but checked like the others.
        read_id(extra_keys::SEP_ID, None)?;
        let pad = read_id(keys::PAD_ID, None)?;
        read_id(extra_keys::MASK_ID, None)?;
        let mut fim = [None; 6];
        for (slot, key, old) in [
            (0, extra_keys::FIM_PRE_ID, Some(extra_keys::PREFIX_ID)),
            (1, extra_keys::FIM_SUF_ID, Some(extra_keys::SUFFIX_ID)),
            (2, extra_keys::FIM_MID_ID, Some(extra_keys::MIDDLE_ID)),
            (3, extra_keys::FIM_PAD_ID, None),
            (4, extra_keys::FIM_REP_ID, None),
            (5, extra_keys::FIM_SEP_ID, None),
        ] {
            fim[slot] = read_id(key, None)?;
            if let Some(old) = old {
                // The deprecated key is read after the new one and wins.
                fim[slot] = read_id(old, fim[slot])?;
            }
        }

        if let Some(b) = meta.get_bool(keys::ADD_BOS)? {
            add_bos = b;
        }
        // llama.cpp turns BOS on for Gemma 4 whatever the key says.
        add_bos |= bpe_text == Some(BpeText::Escaped);
        let add_eos = meta.get_bool(keys::ADD_EOS)?.unwrap_or(false);

        // llama.cpp recognises some special tokens by their text and makes
        // them control tokens. When several texts of one role are present it
        // takes the first in its hash map's order (libstdc++'s, so Qwen3.5's
        // `<|im_end|>` but tiny-zh's `<|endoftext|>`); memwall takes the
        // lowest id. Only the reported id differs: all of them end generation.
        let make_control = |id: u32, attrs: &mut [u16]| attrs[id as usize] |= attr::CONTROL;
        let find = |names: &[&str]| {
            names
                .iter()
                .filter_map(|name| token_to_id.get(*name).copied())
                .min()
        };
        let detect = |slot: &mut Option<u32>, names: &[&str], attrs: &mut [u16]| {
            if slot.is_none() {
                *slot = find(names);
                if let Some(id) = *slot {
                    make_control(id, attrs);
                }
            }
        };
        detect(&mut eot, EOT_TEXTS, &mut attrs);
        detect(&mut eom, &["<|eom_id|>"], &mut attrs);
        for (slot, names) in fim.iter_mut().zip(FIM_TEXTS) {
            detect(slot, names, &mut attrs);
        }
        for (a, text) in attrs.iter_mut().zip(&texts) {
            if *a & attr::CONTROL != 0 && text.contains("unused") {
                *a |= attr::UNUSED;
            }
        }
        let mut eog: BTreeSet<u32> = fim[3..].iter().flatten().copied().collect();
        for name in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*name) {
                eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        // gpt-oss: rendered as text, never end of generation.
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = token_to_id.get(name) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        let eog_with = |text: &str| eog.iter().copied().find(|&id| texts[id as usize] == text);
        let has = |text: &str| eog_with(text).is_some();
        // o200k_harmony / solar-open: <|end|> ends a message, not generation.
        let end = eog_with("<|end|>").filter(|_| {
            let call = has("<|call|>") || has("<|calls|>");
            call && (has("<|return|>") || has("<|flush|>"))
        });
        // gemma4 / plamo2: </s> is an ordinary token.
        let s_token = eog_with("</s>").filter(|_| has("<|tool_response>") || has("<|plamo:eos|>"));
        if let Some(end) = end {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
        if let Some(s) = s_token {
            eog.remove(&s);
            attrs[s as usize] = attr::NORMAL;
        }

        let mut special: Vec<u32> = (0u32..)
            .zip(&attrs)
            .filter(|(_, a)| **a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .map(|(id, _)| id)
            .collect();
        special.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));

        Ok(Tokenizer {
            model,
            tokens: texts,
            token_to_id,
            attrs,
            special,
            eog,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (from the key, else recognised by its text).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token.
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether `id` ends generation (EOS, EOT, EOM and the tokens llama.cpp
    /// recognises by text, such as `<|im_end|>`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    /// Whether `encode` with `add_special` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Whether `encode` with `add_special` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }

    /// The stored text of a token (`Ġ`-encoded for byte-level BPE, `▁` for
    /// SentencePiece); `None` outside the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a token by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// Whether `id` is a control token (printed only on request).
    pub fn is_control(&self, id: u32) -> bool {
        self.attr(id) & attr::CONTROL != 0
    }

    fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// Token ids of `text`, as llama.cpp's `llama_tokenize`. With
    /// `add_special`, BOS and EOS are added where the model asks for them
    /// (`tokenizer.ggml.add_bos_token` / `add_eos_token`, else the model's
    /// default); with `parse_special`, control tokens written in the text
    /// (`<|im_start|>`) become their ids. User-defined tokens are always
    /// split out.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Spm {
                scores,
                byte_tokens,
            } => {
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(s, e) => {
                            let mut t = String::with_capacity(e - s + 3);
                            if self.add_space_prefix && after_special {
                                t.push(' ');
                            }
                            t.push_str(&text[s..e]);
                            let t = t.replace(' ', "\u{2581}");
                            self.encode_spm(&t, scores, byte_tokens, &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
            Model::Bpe {
                merges,
                steps,
                ignore_merges,
                text: kind,
            } => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(s, e) => {
                            let bpe = Bpe {
                                merges,
                                steps,
                                ignore_merges: *ignore_merges,
                                text: *kind,
                            };
                            self.encode_bpe(&text[s..e], &bpe, &mut out);
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits special tokens out of `text`, longest first
    /// (llama.cpp's `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut fragments = if text.is_empty() {
            Vec::new()
        } else {
            vec![Fragment::Text(0, text.len())]
        };
        for &id in &self.special {
            if !parse_special && self.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = &self.tokens[id as usize];
            if !fragments
                .iter()
                .any(|f| matches!(*f, Fragment::Text(s, e) if text[s..e].contains(needle.as_str())))
            {
                continue;
            }
            let mut out = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(s, e) = fragment else {
                    out.push(fragment);
                    continue;
                };
                let mut from = s;
                while let Some(i) = text[from..e].find(needle.as_str()) {
                    if i > 0 {
                        out.push(Fragment::Text(from, from + i));
                    }
                    out.push(Fragment::Token(id));
                    from += i + needle.len();
                }
                if from < e {
                    out.push(Fragment::Text(from, e));
                }
            }
            fragments = out;
        }
        fragments
    }

    fn encode_bpe(&self, text: &str, bpe: &Bpe<'_>, out: &mut Vec<u32>) {
        let escaped;
        let text = match bpe.text {
            BpeText::ByteLevel => text,
            BpeText::Escaped => {
                escaped = text.replace(' ', "\u{2581}");
                escaped.as_str()
            }
        };
        let mut cpts = Vec::with_capacity(text.len());
        let mut offsets = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cpts.push(u32::from(c));
            offsets.push(i);
        }
        offsets.push(text.len());
        let flags: Vec<Flags> = cpts.iter().map(|&c| Flags::of(c)).collect();
        let mut word = String::new();
        for (s, e) in pretok::split(&cpts, &flags, bpe.steps) {
            let raw = &text[offsets[s]..offsets[e]];
            word.clear();
            match bpe.text {
                BpeText::ByteLevel => bpe::byte_encode(raw.as_bytes(), &mut word),
                BpeText::Escaped => word.push_str(raw),
            }
            let whole = bpe.ignore_merges
                || (bpe.text == BpeText::Escaped && word.bytes().all(|b| b == b'\n'));
            if whole && let Some(&id) = self.token_to_id.get(&word) {
                out.push(id);
                continue;
            }
            for (a, b) in bpe.merges.apply(&word) {
                let piece = &word[a..b];
                if let Some(&id) = self.token_to_id.get(piece) {
                    out.push(id);
                    continue;
                }
                match bpe.text {
                    // llama.cpp then looks up each byte of the piece as a
                    // one-byte token; only ASCII bytes can be one.
                    BpeText::ByteLevel => {
                        for c in piece.chars().filter(char::is_ascii) {
                            let mut buf = [0u8; 4];
                            if let Some(&id) = self.token_to_id.get(&*c.encode_utf8(&mut buf)) {
                                out.push(id);
                            }
                        }
                    }
                    BpeText::Escaped => {
                        for b in piece.bytes() {
                            if let Some(&id) = self.token_to_id.get(&format!("<0x{b:02X}>")) {
                                out.push(id);
                            }
                        }
                    }
                }
            }
        }
    }

    fn encode_spm(
        &self,
        text: &str,
        scores: &[f32],
        byte_tokens: &[Option<u32>; 256],
        out: &mut Vec<u32>,
    ) {
        for piece in spm::segment(text, &self.token_to_id, scores) {
            match piece {
                Ok(id) => out.push(id),
                Err((s, e)) => {
                    for &b in &text.as_bytes()[s..e] {
                        // llama.cpp throws when a byte has no token; memwall
                        // falls back to the unknown token.
                        out.extend(byte_tokens[usize::from(b)].or(self.unk));
                    }
                }
            }
        }
    }

    /// The bytes a token stands for, as llama.cpp's `llama_token_to_piece`
    /// (no leading-space strip): byte-level BPE characters decoded to bytes,
    /// SentencePiece `▁` as a space and `<0xXX>` as the byte. Control and
    /// unknown tokens give their text only with `special`, else nothing; ids
    /// outside the vocabulary give nothing.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        let Some(text) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let a = self.attr(id);
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Vec::new();
        }
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.model {
                Model::Spm { .. }
                | Model::Bpe {
                    text: BpeText::Escaped,
                    ..
                } => text.replace('\u{2581}', " ").into_bytes(),
                Model::Bpe {
                    text: BpeText::ByteLevel,
                    ..
                } => decode_byte_level(text),
            };
        }
        if a & attr::BYTE != 0 {
            return vec![byte_token_value(text)];
        }
        Vec::new()
    }

    /// The text of `ids`, as llama.cpp's `common_detokenize(…, special =
    /// false)`: control tokens omitted, the model's space clean-up applied,
    /// and invalid UTF-8 (a character cut off by the end of `ids`) replaced
    /// by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, false)).into_owned()
    }

    /// llama.cpp's `llama_detokenize` as bytes: `remove_special` drops a
    /// leading BOS and a trailing EOS where the model adds them;
    /// `unparse_special` prints control tokens' text. With
    /// `add_space_prefix`, the first token's leading space is removed.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && ids.first().is_some_and(|&id| Some(id) == self.bos) {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && self.add_eos && ids.last().is_some_and(|&id| Some(id) == self.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let piece = self.token_to_piece(id, unparse_special);
            let skip = usize::from(remove_space && piece.first() == Some(&b' '));
            text.extend_from_slice(&piece[skip..]);
            remove_space = false;
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }

    /// A [`StreamDecoder`] over this tokenizer.
    pub fn stream_decoder(&self, special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, special)
    }
}

/// Texts llama.cpp takes as end of turn when no `eot_token_id` is given.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Texts of the fill-in-the-middle tokens (pre, suf, mid, pad, rep, sep).
const FIM_TEXTS: [&[&str]; 6] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// Texts llama.cpp treats as end of generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn wrong_type(meta: &Metadata, key: &str, expected: &'static str) -> TokenizerError {
    let found = meta.get(key).map_or_else(String::new, describe_type);
    MetadataError::WrongType {
        key: key.to_owned(),
        expected,
        found,
    }
    .into()
}

fn read_merges(meta: &Metadata) -> Result<bpe::Merges, TokenizerError> {
    let list = meta
        .get_str_array(keys::MERGES)?
        .ok_or_else(|| MetadataError::Missing(keys::MERGES.to_owned()))?;
    let mut merges = bpe::Merges::default();
    for (index, merge) in list.iter().enumerate() {
        // llama.cpp splits at the first space after the first byte.
        let split = merge
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(i, _)| i);
        let Some(i) = split.filter(|&i| i + 1 < merge.len()) else {
            return Err(TokenizerError::BadMerge {
                index,
                merge: merge.clone(),
            });
        };
        let rank = u32::try_from(index).map_err(|_| TokenizerError::BadMerge {
            index,
            merge: merge.clone(),
        })?;
        merges.insert(&merge[..i], &merge[i + 1..], rank);
    }
    Ok(merges)
}

/// A byte-level BPE token's bytes; a character outside GPT-2's byte map
/// becomes llama.cpp's `[UNK_BYTE_0x…]` marker.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match bpe::char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// The byte of a `<0xXX>` token: llama.cpp parses the hex digits at 3..5
/// (`strtol`, so a malformed token reads as far as it is hex, else 0).
fn byte_token_value(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or_default();
    digits
        .iter()
        .take(2)
        .map_while(|&d| char::from(d).to_digit(16))
        .fold(0u8, |acc, d| acc.wrapping_mul(16).wrapping_add(d as u8))
}

/// llama.cpp's `clean_spaces` passes over detokenized bytes, in place as it
/// does them: " ?" " !" " ." " ," lose the space, a lone " ' " loses both
/// spaces, and " 's" " 'm" " 're" " 've" lose the space.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // Pass 1: punctuation.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // Pass 2: a single apostrophe between spaces.
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // Pass 3: contractions.
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if matches!(x1, b's' | b'm')
                || (i + 2 < n && matches!((x1, text[i + 2]), (b'r', b'e') | (b'v', b'e')))
            {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_up_spaces_matches_llama_cpp() {
        let clean = |s: &str| {
            let mut v = s.as_bytes().to_vec();
            clean_up_spaces(&mut v);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(clean("it 's we 're I 'll"), "it's we're I 'll");
        assert_eq!(clean(""), "");
        assert_eq!(clean(" ."), ".");
    }

    #[test]
    fn byte_tokens_parse_like_strtol() {
        assert_eq!(byte_token_value("<0x0A>"), 10);
        assert_eq!(byte_token_value("<0xff>"), 255);
        assert_eq!(byte_token_value("<0xZ>"), 0);
        assert_eq!(byte_token_value("<"), 0);
    }
}
