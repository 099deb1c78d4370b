//! The tokenizer against llama.cpp: ids recorded from `llama-tokenize`
//! (fixtures/tokenizer/record.sh) for every text of texts.json on tiny-zh,
//! SmolLM2 and a SentencePiece vocabulary, several with another
//! `tokenizer.ggml.pre`; pieces and detokenized bytes from libllama; then
//! round trips, the streaming decoder, and hostile metadata. Also llama.cpp's
//! own tokenizer tests (`models/ggml-vocab-*.gguf` with `.inp`/`.out`, as its
//! `tests/test-tokenizer-0` reads them) for every vocabulary memwall reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use memwall_format::gguf::{Array, GgufFile, Metadata, MetadataError, Value};
use memwall_runtime::tokenizer::{Tokenizer, TokenizerError};
use proptest::prelude::*;
use serde_json::Value as Json;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn json(name: &str) -> Json {
    let path = root().join("fixtures/tokenizer").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn recorded() -> &'static Json {
    static R: OnceLock<Json> = OnceLock::new();
    R.get_or_init(|| json("llama-tokenize.json"))
}

fn texts() -> &'static BTreeMap<String, String> {
    static T: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    T.get_or_init(|| {
        json("texts.json")["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let s = |k: &str| t[k].as_str().unwrap().to_owned();
                (s("name"), s("text"))
            })
            .collect()
    })
}

fn source_metadata(source: &str) -> Metadata {
    let path = root().join(source);
    assert!(
        path.exists(),
        "{} is missing: run fixtures/fetch.sh",
        path.display()
    );
    GgufFile::open(&path).unwrap().metadata().clone()
}

/// The metadata of a recorded model: its source's, with the recorded overrides.
fn model_metadata(name: &str) -> Metadata {
    let m = &recorded()["models"][name];
    let mut meta = source_metadata(m["source"].as_str().unwrap());
    for key in m["remove"].as_array().unwrap() {
        meta.remove(key.as_str().unwrap());
    }
    for (key, value) in m["set"].as_object().unwrap() {
        let value = match value {
            Json::Bool(b) => Value::Bool(*b),
            Json::String(s) => Value::from(s.as_str()),
            other => panic!("override {key} = {other}"),
        };
        meta.set(key.as_str(), value);
    }
    meta
}

fn tokenizer(name: &str) -> &'static Tokenizer {
    static CACHE: OnceLock<std::sync::Mutex<BTreeMap<String, &'static Tokenizer>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap();
    cache.entry(name.to_owned()).or_insert_with(|| {
        let tok =
            Tokenizer::from_gguf(&model_metadata(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        Box::leak(Box::new(tok))
    })
}

fn cases() -> impl Iterator<Item = &'static Json> {
    recorded()["cases"].as_array().unwrap().iter()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| u32::try_from(i.as_u64().unwrap()).unwrap())
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn ids_match_llama_tokenize() {
    let mut failures = Vec::new();
    let mut n = 0;
    for case in cases() {
        let model = case["model"].as_str().unwrap();
        let name = case["text"].as_str().unwrap();
        let add = case["add_special"].as_bool().unwrap();
        let parse = case["parse_special"].as_bool().unwrap();
        let got = tokenizer(model).encode(&texts()[name], add, parse);
        let want = ids(&case["ids"]);
        if got != want {
            failures.push(format!(
                "{model} / {name} (add_special {add}, parse_special {parse}):\n  llama.cpp {want:?}\n  memwall   {got:?}"
            ));
        }
        n += 1;
    }
    assert!(n > 2000, "only {n} recorded cases");
    assert!(
        failures.is_empty(),
        "{} of {n} cases differ from llama-tokenize ({}):\n{}",
        failures.len(),
        recorded()["llama_cpp"],
        failures[..failures.len().min(10)].join("\n")
    );
}

/// llama.cpp's vocabulary tests, as fixtures/fetch.sh extracts them from its tree.
const LLAMA_CPP_VOCABULARIES: &[&str] = &[
    "command-r",
    "deepseek-llm",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// The tests of `ggml-vocab-NAME.gguf.inp/.out`: texts separated by
/// `\n__ggml_vocab_test__\n`, one line of ids per text; a repeated text
/// counts once (test-tokenizer-0 keeps them in a map).
fn vocab_tests(models: &Path, name: &str) -> BTreeMap<String, Vec<u32>> {
    let read = |ext: &str| {
        let path = models.join(format!("ggml-vocab-{name}.gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.split_once("\n__ggml_vocab_test__\n") {
            Some((text, next)) => {
                texts.push(text);
                rest = next;
            }
            None => {
                texts.push(rest);
                rest = "";
            }
        }
    }
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        texts.len(),
        lines.len(),
        "{name}: .inp and .out differ in length"
    );
    texts
        .into_iter()
        .zip(lines)
        .map(|(text, line)| {
            let ids = line
                .split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect();
            (text.to_owned(), ids)
        })
        .collect()
}

#[test]
fn llama_cpp_vocabulary_tests_pass_for_every_vocabulary_memwall_reads() {
    let models = root().join("fixtures/cache/llama.cpp-0c1e570/models");
    let mut report = Vec::new();
    for name in LLAMA_CPP_VOCABULARIES {
        let meta = source_metadata(&format!(
            "fixtures/cache/llama.cpp-0c1e570/models/ggml-vocab-{name}.gguf"
        ));
        let tok = Tokenizer::from_gguf(&meta).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tests = vocab_tests(&models, name);
        assert!(tests.len() >= 40, "{name}: only {} tests", tests.len());
        let failed: Vec<String> = tests
            .iter()
            .filter_map(|(text, want)| {
                // test-tokenizer-0: add_special = false, parse_special = false.
                let got = tok.encode(text, false, false);
                (&got != want)
                    .then(|| format!("  {text:?}\n    llama.cpp {want:?}\n    memwall   {got:?}"))
            })
            .collect();
        if !failed.is_empty() {
            report.push(format!(
                "{name}: {} of {} differ\n{}",
                failed.len(),
                tests.len(),
                failed[..failed.len().min(3)].join("\n")
            ));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

#[test]
fn special_tokens_match_llama_cpp() {
    for (name, m) in recorded()["models"].as_object().unwrap() {
        let tok = tokenizer(name);
        let info = &m["llama_cpp"];
        let id = |k: &str| u32::try_from(info[k].as_i64().unwrap()).ok();
        assert_eq!(
            tok.n_vocab() as u64,
            info["n_vocab"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(tok.bos(), id("bos"), "{name} bos");
        assert_eq!(tok.eos(), id("eos"), "{name} eos");
        // With several end-of-turn texts in the vocabulary llama.cpp takes the
        // first in its hash map's order, memwall the lowest id: both must be one.
        if tok.eot() != id("eot") {
            let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i));
            for eot in [tok.eot(), id("eot")] {
                assert!(
                    ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"]
                        .contains(&text(eot).unwrap_or("")),
                    "{name} eot: memwall {:?}, llama.cpp {:?}",
                    text(tok.eot()),
                    text(id("eot"))
                );
            }
        }
        assert_eq!(tok.add_bos(), info["add_bos"].as_bool().unwrap(), "{name}");
        assert_eq!(tok.add_eos(), info["add_eos"].as_bool().unwrap(), "{name}");
        let eog: Vec<u32> = tok.eog_tokens().collect();
        assert_eq!(eog, ids(&info["eog"]), "{name} end-of-generation tokens");
        for &id in &eog {
            assert!(tok.is_eog(id));
        }
        assert!(!tok.is_eog(u32::MAX));
    }
}

#[test]
fn pieces_match_llama_token_to_piece() {
    let pieces = json("pieces.json");
    for (name, list) in pieces["pieces"].as_object().unwrap() {
        let tok = tokenizer(name);
        let list = list.as_array().unwrap();
        assert_eq!(list.len(), tok.n_vocab());
        for (id, pair) in (0u32..).zip(list) {
            assert_eq!(
                tok.token_to_piece(id, false),
                unhex(pair[0].as_str().unwrap()),
                "{name} token {id} {:?}",
                tok.token_text(id)
            );
            assert_eq!(
                tok.token_to_piece(id, true),
                unhex(pair[1].as_str().unwrap()),
                "{name} token {id} (special)"
            );
        }
        assert!(tok.token_to_piece(u32::MAX, true).is_empty());
    }
}

#[test]
fn detokenize_matches_llama_detokenize() {
    for case in cases() {
        let model = case["model"].as_str().unwrap();
        let got = tokenizer(model).detokenize(&ids(&case["ids"]), false, false);
        assert_eq!(
            got,
            unhex(case["detokenize"].as_str().unwrap()),
            "{model} / {}",
            case["text"]
        );
    }
}

#[test]
fn bpe_decode_inverts_encode() {
    // Models without llama.cpp's space clean-up give back every text.
    for model in [
        "smollm2",
        "tiny-zh+qwen2",
        "tiny-zh+deepseek-llm",
        "smollm2+qwen2",
    ] {
        let tok = tokenizer(model);
        for (name, text) in texts() {
            let ids = tok.encode(text, false, false);
            assert_eq!(&tok.decode(&ids), text, "{model} / {name}");
        }
    }
    // With the clean-up, every text that has nothing for it to clean.
    let tok = tokenizer("tiny-zh");
    for (name, text) in texts() {
        if name != "clean_spaces" && name != "contractions" && name != "emoji" {
            let ids = tok.encode(text, false, false);
            assert_eq!(&tok.decode(&ids), text, "tiny-zh / {name}");
        }
    }
}

#[test]
fn spm_decode_drops_the_added_space_prefix() {
    let tok = tokenizer("spm");
    let ids = tok.encode("Hello world", true, false);
    assert_eq!(ids[0], tok.bos().unwrap());
    assert_eq!(tok.decode(&ids[1..]), "Hello world");
    // llama.cpp keeps the space when it removes the BOS itself.
    assert_eq!(tok.detokenize(&ids, true, false), b" Hello world");
}

fn stream(tok: &Tokenizer, ids: &[u32]) -> (String, usize) {
    let mut decoder = tok.stream_decoder(false);
    let mut out = String::new();
    let mut held = 0;
    for &id in ids {
        let text = decoder.push(id);
        assert!(
            !text.contains('\u{FFFD}'),
            "broken character after token {id}"
        );
        held += usize::from(decoder.has_pending());
        out.push_str(&text);
    }
    out.push_str(&decoder.finish());
    (out, held)
}

#[test]
fn stream_decoder_holds_back_split_characters() {
    let tok = tokenizer("tiny-zh");
    // tiny-zh has no token for these, so their bytes arrive one token each.
    let text = "😀👨‍👩‍👧 🇺🇸 ẞ";
    let ids = tok.encode(text, false, false);
    let (out, held) = stream(tok, &ids);
    assert_eq!(out, text);
    assert!(held > 0, "no character was split across tokens");

    let lone = tok.token_id("ð").unwrap(); // 0xF0: the first byte of a 4-byte character
    let mut decoder = tok.stream_decoder(false);
    assert_eq!(decoder.push(lone), "");
    assert_eq!(decoder.push(tok.token_id("a").unwrap()), "\u{FFFD}a");
    assert_eq!(decoder.push(lone), "");
    assert_eq!(decoder.finish(), "\u{FFFD}");
}

fn zh_emoji_text() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        4 => prop::char::range('\u{4E00}', '\u{9FFF}'),
        2 => prop::char::range('\u{1F300}', '\u{1FAFF}'),
        1 => prop::sample::select(vec!['\u{200D}', '\u{FE0F}', ' ', '\n', 'a', 'Z', '1', '，', '。', '\u{1F1FA}', '\u{1F1F8}']),
        // Planes 0-2: lead bytes SmolLM2 has tokens for. It has none for six
        // control characters, which encoding drops (as llama.cpp does).
        1 => prop::char::range('\0', '\u{2FFFF}')
            .prop_filter("U+FFFD marks broken text", |&c| c != '\u{FFFD}')
            .prop_filter("no SmolLM2 token", |c| !['\u{4}', '\u{6}', '\u{13}', '\u{14}', '\u{16}', '\u{1d}'].contains(c)),
    ];
    prop::collection::vec(ch, 0..40).prop_map(|v| v.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn stream_decoding_never_breaks_characters(text in zh_emoji_text()) {
        // SmolLM2 has a token for every byte, so every text comes back whole.
        let tok = tokenizer("smollm2");
        let ids = tok.encode(&text, false, false);
        let (out, _) = stream(tok, &ids);
        prop_assert_eq!(&out, &text);
        // tiny-zh lacks some bytes (llama.cpp drops them): the stream still
        // equals the whole decode, so no character was cut early.
        let tok = tokenizer("tiny-zh+qwen2");
        let ids = tok.encode(&text, false, false);
        let mut decoder = tok.stream_decoder(false);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&decoder.push(id));
        }
        out.push_str(&decoder.finish());
        prop_assert_eq!(out, tok.decode(&ids));
    }

    #[test]
    fn spm_round_trips_through_byte_fallback(text in zh_emoji_text()) {
        let tok = tokenizer("spm+no-prefix");
        let ids = tok.encode(&text, false, false);
        prop_assert_eq!(tok.decode(&ids), text);
    }

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>(), add in any::<bool>(), parse in any::<bool>()) {
        for model in ["tiny-zh+default", "tiny-zh+deepseek-llm", "tiny-zh+llama-bpe", "spm"] {
            let tok = tokenizer(model);
            let ids = tok.encode(&text, add, parse);
            prop_assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
            let _ = tok.decode(&ids);
        }
    }
}

// Hostile metadata: each refused with an error naming what is wrong.

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| (*s).to_owned()).collect()))
}

fn small_bpe() -> Metadata {
    let mut m = Metadata::new();
    m.set("tokenizer.ggml.model", "gpt2");
    m.set("tokenizer.ggml.pre", "gpt-2");
    m.set(
        "tokenizer.ggml.tokens",
        strings(&["a", "b", "ab", "<|end|>"]),
    );
    m.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1, 1, 1, 3])),
    );
    m.set("tokenizer.ggml.merges", strings(&["a b"]));
    m
}

fn small_spm() -> Metadata {
    let mut m = Metadata::new();
    m.set("tokenizer.ggml.model", "llama");
    m.set(
        "tokenizer.ggml.tokens",
        strings(&["<unk>", "<s>", "</s>", "▁a", "b"]),
    );
    m.set(
        "tokenizer.ggml.scores",
        Value::Array(Array::F32(vec![0.0, 0.0, 0.0, -1.0, -2.0])),
    );
    m.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![2, 3, 3, 1, 1])),
    );
    m
}

fn error(meta: &Metadata) -> TokenizerError {
    Tokenizer::from_gguf(meta).expect_err("hostile metadata was accepted")
}

#[test]
fn small_vocabularies_load() {
    let tok = Tokenizer::from_gguf(&small_bpe()).unwrap();
    assert_eq!(tok.encode("abab<|end|>", false, true), [2, 2, 3]);
    assert_eq!(tok.eot(), Some(3));
    assert!(tok.is_eog(3));
    let tok = Tokenizer::from_gguf(&small_spm()).unwrap();
    // No byte tokens: characters outside the vocabulary become <unk>.
    assert_eq!(tok.encode("ab c", true, false), [1, 3, 4, 0, 0, 0, 0]);
}

#[test]
fn missing_or_unknown_model_is_refused() {
    let mut m = small_bpe();
    m.remove("tokenizer.ggml.model");
    assert_eq!(
        error(&m),
        TokenizerError::Metadata(MetadataError::Missing("tokenizer.ggml.model".into()))
    );
    m.set("tokenizer.ggml.model", "t5");
    assert_eq!(error(&m), TokenizerError::UnknownModel("t5".into()));
    m.set("tokenizer.ggml.model", Value::U32(7));
    assert!(matches!(
        error(&m),
        TokenizerError::Metadata(MetadataError::WrongType { key, .. }) if key == "tokenizer.ggml.model"
    ));
}

#[test]
fn unknown_pre_tokenizer_is_refused() {
    let mut m = small_bpe();
    m.set("tokenizer.ggml.pre", "no-such-pre");
    assert_eq!(
        error(&m),
        TokenizerError::UnknownPreTokenizer("no-such-pre".into())
    );
}

#[test]
fn vocabulary_of_the_wrong_shape_is_refused() {
    let mut m = small_bpe();
    m.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::U32(vec![1, 2])),
    );
    assert!(matches!(
        error(&m),
        TokenizerError::Metadata(MetadataError::WrongType { key, .. }) if key == "tokenizer.ggml.tokens"
    ));
    m.set("tokenizer.ggml.tokens", strings(&[]));
    assert_eq!(error(&m), TokenizerError::VocabularySize(0));
    m.set("tokenizer.ggml.tokens", strings(&["a", "b", "a", "x"]));
    assert_eq!(
        error(&m),
        TokenizerError::DuplicateToken {
            first: 0,
            second: 2,
            text: "a".into()
        }
    );
}

#[test]
fn short_per_token_arrays_are_refused() {
    let mut m = small_bpe();
    m.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1, 1])),
    );
    assert_eq!(
        error(&m),
        TokenizerError::ArrayTooShort {
            key: "tokenizer.ggml.token_type",
            len: 2,
            n_vocab: 4
        }
    );
    m.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I64(vec![1, 1, 1, 1])),
    );
    assert!(matches!(
        error(&m),
        TokenizerError::Metadata(MetadataError::WrongType { key, .. }) if key == "tokenizer.ggml.token_type"
    ));
    let mut m = small_spm();
    m.set(
        "tokenizer.ggml.scores",
        Value::Array(Array::F32(vec![0.0; 3])),
    );
    assert_eq!(
        error(&m),
        TokenizerError::ArrayTooShort {
            key: "tokenizer.ggml.scores",
            len: 3,
            n_vocab: 5
        }
    );
    m.set("tokenizer.ggml.scores", strings(&["1", "2", "3", "4", "5"]));
    assert!(matches!(
        error(&m),
        TokenizerError::Metadata(MetadataError::WrongType { key, .. }) if key == "tokenizer.ggml.scores"
    ));
}

#[test]
fn bad_merges_are_refused() {
    let mut m = small_bpe();
    m.remove("tokenizer.ggml.merges");
    assert_eq!(
        error(&m),
        TokenizerError::Metadata(MetadataError::Missing("tokenizer.ggml.merges".into()))
    );
    for bad in ["ab", " ab", "a ", ""] {
        m.set("tokenizer.ggml.merges", strings(&["a b", bad]));
        assert_eq!(
            error(&m),
            TokenizerError::BadMerge {
                index: 1,
                merge: bad.into()
            },
            "{bad:?}"
        );
    }
}

#[test]
fn special_ids_outside_the_vocabulary_are_refused() {
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.fim_pre_token_id",
    ] {
        let mut m = small_bpe();
        m.set(key, Value::U32(4));
        assert!(
            matches!(error(&m), TokenizerError::IdOutOfRange { key: k, id: 4, n_vocab: 4 } if k == key),
            "{key}"
        );
        m.set(key, Value::I32(-1));
        assert!(matches!(
            error(&m),
            TokenizerError::Metadata(MetadataError::WrongType { .. })
        ));
    }
    // Defaults outside a small vocabulary are dropped, as llama.cpp does.
    let tok = Tokenizer::from_gguf(&small_bpe()).unwrap();
    assert_eq!((tok.bos(), tok.eos()), (None, None));
}

#[test]
fn flags_of_the_wrong_type_are_refused() {
    let mut m = small_spm();
    m.set("tokenizer.ggml.add_bos_token", Value::U8(1));
    assert!(matches!(
        error(&m),
        TokenizerError::Metadata(MetadataError::WrongType { key, .. }) if key == "tokenizer.ggml.add_bos_token"
    ));
}

#[test]
fn errors_name_the_key() {
    let mut m = small_spm();
    m.set(
        "tokenizer.ggml.scores",
        Value::Array(Array::F32(vec![0.0; 3])),
    );
    let msg = error(&m).to_string();
    assert!(msg.contains("tokenizer.ggml.scores"), "{msg}");
}

#[test]
fn every_listed_pre_tokenizer_loads() {
    for &pre in memwall_runtime::tokenizer::PRE_TOKENIZERS {
        let mut m = small_bpe();
        m.set("tokenizer.ggml.pre", pre);
        let tok = Tokenizer::from_gguf(&m).unwrap_or_else(|e| panic!("{pre}: {e}"));
        assert_eq!(tok.encode("ab", false, false), [2], "{pre}");
    }
}

#[test]
fn user_defined_tokens_split_without_parse_special() {
    let mut m = small_bpe();
    m.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1, 1, 4, 3])),
    );
    m.remove("tokenizer.ggml.merges");
    m.set("tokenizer.ggml.merges", strings(&[]));
    let tok = Tokenizer::from_gguf(&m).unwrap();
    // "ab" cannot be merged (no merges) but is a user-defined token.
    assert_eq!(tok.encode("bab", false, false), [1, 2]);
    // A control token is text unless parse_special.
    assert_eq!(tok.encode("<|end|>", false, false), Vec::<u32>::new());
    assert_eq!(tok.encode("<|end|>", false, true), [3]);
    assert_eq!(tok.token_to_piece(3, false), b"");
    assert_eq!(tok.token_to_piece(3, true), b"<|end|>");
}
