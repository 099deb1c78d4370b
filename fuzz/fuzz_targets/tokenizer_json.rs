//! Byte-level BPE vocabularies: the input is `tokenizer.json`, then optionally
//! `tokenizer_config.json` and `config.json`, separated by NUL bytes (no JSON
//! text holds one). The architecture is `architectures[0]` of the config
//! (qwen2 when there is none). An accepted vocabulary has one token and one
//! type per id up to the vocabulary size (the config's `vocab_size` when
//! given), special ids inside it, and merges that each join two tokens of
//! `model.vocab` into a third. When the runtime accepts it too, encoding a
//! fixed set of strings gives ids inside the vocabulary; when every one of the
//! 256 byte characters is an ordinary token, every id produced is an ordinary
//! one and no space prefix is set, decoding gives the string back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memwall_convert::arch::Arch;
use memwall_convert::vocab::{load_bpe, token_type, write_vocab};
use memwall_format::gguf::Metadata;
use memwall_runtime::tokenizer::Tokenizer;

/// No " ," / " '" pairs: llama.cpp's space clean-up would rightly change them.
const TEXTS: &[&str] = &[
    "Hello world",
    "  leading spaces, tabs\tand\nnew lines\r\n",
    "北京欢迎你。中文和English混合",
    "emoji 🦀👍🏽 and ZWJ 👩‍👩‍👧",
    "<0x41> <|im_start|> [PAD3] \u{0} \u{7f} \u{80} \u{ffff} \u{10ffff}",
    "12345678901234567890",
];

/// GPT-2's byte-to-character map (`bytes_to_unicode`).
fn byte_char(b: u8) -> char {
    match b {
        b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff => char::from(b),
        _ => {
            let rank = (0..=b)
                .filter(|&x| !matches!(x, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff))
                .count();
            char::from_u32(255 + rank as u32).unwrap()
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let parts: Vec<&[u8]> = data.splitn(3, |&b| b == 0).collect();
    let config: serde_json::Value = match parts.get(2).map(|c| serde_json::from_slice(c)) {
        None => serde_json::json!({}),
        Some(Ok(c)) => c,
        Some(Err(_)) => return,
    };
    // Vocabularies padded past 2^20 ids are legal but too slow and large to
    // fuzz (tens of millions of strings under ASan); past 2^24 they must be
    // refused before anything is allocated, which the run below still checks.
    let size = config.get("vocab_size").and_then(serde_json::Value::as_u64);
    if size.is_some_and(|n| n > 1 << 20 && n <= 1 << 24) {
        return;
    }
    let arch = config["architectures"][0]
        .as_str()
        .and_then(|c| Arch::for_class(c).ok())
        .map_or("qwen2", |a| a.gguf);
    let dir = std::path::Path::new("/dev/shm").join(format!(
        "memwall-fuzz-tokenizer_json-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("tokenizer.json"), parts[0]).expect("write tokenizer");
    if let Some(tc) = parts.get(1) {
        std::fs::write(dir.join("tokenizer_config.json"), tc).expect("write tokenizer config");
    }
    let loaded = load_bpe(&dir, &config, arch);
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
    let Ok(v) = loaded else { return };

    let n = v.tokens.len();
    assert_eq!(v.types.len(), n);
    if let Some(size) = size {
        assert_eq!(n as u64, size, "padded to vocab_size");
    }
    for (kind, id) in &v.special {
        assert!((*id as usize) < n, "{kind} id {id} outside the {n} tokens");
    }
    // Every merge joins two tokens of model.vocab into a third.
    let tokenizer: serde_json::Value = serde_json::from_slice(parts[0]).expect("accepted JSON");
    let vocab = tokenizer["model"]["vocab"]
        .as_object()
        .expect("accepted vocab");
    let merges = tokenizer["model"]["merges"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    assert_eq!(merges.len(), v.merges.len());
    for m in merges {
        let (a, b) = match m {
            serde_json::Value::String(s) if s.starts_with("#version") => continue,
            serde_json::Value::String(s) => s.split_once(' ').expect("merge of two parts"),
            m => (
                m[0].as_str().expect("string"),
                m[1].as_str().expect("string"),
            ),
        };
        for t in [a, b, &format!("{a}{b}")] {
            assert!(
                vocab.contains_key(t),
                "merge {m} needs {t:?}, not in the vocabulary"
            );
        }
    }

    let pre = match arch {
        "llama" => "llama-bpe",
        "command-r" => "command-r",
        "qwen2" | "qwen3" | "qwen3moe" => "qwen2",
        _ => "gpt-2",
    };
    let mut meta = Metadata::new();
    write_vocab(&mut meta, &v, pre);
    // The runtime refuses what llama.cpp refuses (duplicate texts, merges
    // without a space); the converter writes such files as llama.cpp's does.
    let Ok(tok) = Tokenizer::from_gguf(&meta) else {
        return;
    };
    assert_eq!(tok.n_vocab(), n);
    let ordinary = |id: u32| v.types[id as usize] == token_type::NORMAL && !tok.is_control(id);
    // With add_space_prefix (llama, from tokenizer_config) llama.cpp drops the
    // first space when decoding but adds none when encoding byte-level BPE.
    let complete = v.add_space_prefix != Some(true)
        && (0..=255u8).all(|b| {
            tok.token_id(&byte_char(b).to_string())
                .is_some_and(ordinary)
        });
    for text in TEXTS {
        let ids = tok.encode(text, true, true);
        assert!(
            ids.iter().all(|&id| (id as usize) < n),
            "id outside the vocabulary"
        );
        let _ = tok.decode(&ids);
        let ids = tok.encode(text, false, false);
        assert!(
            ids.iter().all(|&id| (id as usize) < n),
            "id outside the vocabulary"
        );
        let decoded = tok.decode(&ids);
        if complete && ids.iter().all(|&id| ordinary(id)) {
            assert_eq!(
                &decoded, text,
                "encode → decode changed the text (ids {ids:?})"
            );
        }
    }
});
