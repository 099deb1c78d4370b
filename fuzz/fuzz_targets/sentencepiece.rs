//! SentencePiece `tokenizer.model` files: `parse` either fails or gives at
//! least one piece, every type in 1..=6; `write` then `parse` gives the same
//! pieces (scores bit for bit; NaN and infinities are kept, the runtime's
//! segmenter orders NaN as equal) and the same `add_dummy_prefix`. The file,
//! converted by `load_sentencepiece` (next to a `config.json` of `{}`), gives a
//! runtime tokenizer when it has no duplicate pieces; encoding a fixed set of
//! strings then gives ids inside the vocabulary, and when all 256 `<0xXX>`
//! byte pieces and `▁` are present and every id produced is an ordinary piece
//! or a byte piece, decoding gives the string back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memwall_convert::sentencepiece::{parse, write};
use memwall_convert::vocab::{load_sentencepiece, token_type, write_vocab};
use memwall_format::gguf::Metadata;
use memwall_runtime::tokenizer::Tokenizer;

const TEXTS: &[&str] = &[
    "Hello world",
    "  leading spaces, tabs\tand\nnew lines\r\n",
    "北京欢迎你。中文和English混合",
    "emoji 🦀👍🏽 and ZWJ 👩‍👩‍👧",
    "<0x41> <s> </s> <unk> \u{0} \u{7f} \u{80} \u{ffff} \u{10ffff}",
    "12345678901234567890",
];

fn is_byte_piece(text: &str) -> bool {
    let t = text.as_bytes();
    t.len() == 6
        && t.starts_with(b"<0x")
        && t[5] == b'>'
        && t[3..5]
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'A'..=b'F'))
}

fuzz_target!(|data: &[u8]| {
    let Ok(model) = parse(data) else { return };
    assert!(!model.pieces.is_empty());
    for p in &model.pieces {
        assert!(
            (1..=6).contains(&p.kind),
            "piece {:?} has type {}",
            p.piece,
            p.kind
        );
    }
    let again = parse(&write(&model, 0, None, None, true)).expect("a written model parses");
    assert_eq!(again.add_dummy_prefix, model.add_dummy_prefix);
    assert_eq!(again.pieces.len(), model.pieces.len());
    for (a, b) in again.pieces.iter().zip(&model.pieces) {
        assert_eq!(
            (&a.piece, a.score.to_bits(), a.kind),
            (&b.piece, b.score.to_bits(), b.kind)
        );
    }

    let dir = std::path::Path::new("/dev/shm")
        .join(format!("memwall-fuzz-sentencepiece-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("tokenizer.model"), data).expect("write model");
    let loaded = load_sentencepiece(&dir, &serde_json::json!({}), "llama");
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
    let v = loaded.expect("a parsed model converts");
    let n = model.pieces.len();
    assert_eq!((v.tokens.len(), v.types.len()), (n, n));
    assert_eq!(v.scores.as_ref().map(Vec::len), Some(n));

    let mut meta = Metadata::new();
    write_vocab(&mut meta, &v, "default");
    let Ok(tok) = Tokenizer::from_gguf(&meta) else {
        return;
    };
    let ordinary = |id: u32| {
        let (ty, text) = (v.types[id as usize], &v.tokens[id as usize]);
        (ty == token_type::NORMAL && !tok.is_control(id))
            || (ty == token_type::BYTE && is_byte_piece(text))
    };
    let complete = (0..=255u8).all(|b| {
        tok.token_id(&format!("<0x{b:02X}>"))
            .is_some_and(|id| v.types[id as usize] == token_type::BYTE)
    }) && tok.token_id("\u{2581}").is_some_and(ordinary);
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
