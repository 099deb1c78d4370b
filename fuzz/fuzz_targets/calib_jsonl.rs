//! Calibration inputs: any JSONL or JSON file, read with the first byte's
//! options (line cap, skip-bad, chat, template or field list), either builds a
//! set that loads back (exact sample lengths, ids inside tiny-zh's
//! vocabulary), or fails on a bad row whose `file:line` points at a real line
//! of the input that really has the fault (too long, not UTF-8, not JSON) or
//! names the missing field. The same bytes read as a finished calibration set
//! either load or fail naming `file:line`. Nothing panics.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use memwall_calibrate::dataset::{
    self, BadKind, ChatMessage, ChatRenderer, Dataset, DatasetError, Options, Render, SourceSpec,
    TokenizerInfo,
};
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;
use memwall_runtime::tokenizer::Tokenizer;

fn tiny_zh() -> &'static (Tokenizer, TokenizerInfo) {
    static TOK: OnceLock<(Tokenizer, TokenizerInfo)> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/tiny-zh/reference/tiny-zh-f16.gguf");
        let model = GgufModel::open(&path).unwrap();
        let tok = Tokenizer::from_gguf(model.metadata()).unwrap();
        let info = TokenizerInfo::new(model.metadata(), &tok, "tiny-zh");
        (tok, info)
    })
}

/// tiny-zh's ChatML, refusing a turn without a role so that renderer errors are exercised.
struct ChatMl;

impl ChatRenderer for ChatMl {
    fn render(&self, messages: &[ChatMessage]) -> Result<String, String> {
        let mut out = String::new();
        for m in messages {
            if m.role.is_empty() {
                return Err("a message has an empty role".into());
            }
            out.push_str(&format!(
                "<|im_start|>{}\n{}<|im_end|>\n",
                m.role, m.content
            ));
        }
        Ok(out)
    }
}

/// A scratch folder in /dev/shm, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let (tok, info) = tiny_zh();
    let dir = Scratch(PathBuf::from(format!(
        "/dev/shm/memwall-fuzz-calib-{}",
        std::process::id()
    )));
    std::fs::create_dir_all(&dir.0).unwrap();
    let json = flags & 0x40 != 0;
    let input = dir.0.join(if json { "rows.json" } else { "rows.jsonl" });
    std::fs::write(&input, body).unwrap();
    let output = dir.0.join("set.jsonl");

    let render = match flags >> 4 & 3 {
        0 | 1 => Render::Detect,
        2 => Render::Template(r"{question}\n{answer}".into()),
        _ => Render::Fields(vec!["instruction".into(), "output".into()]),
    };
    let max_line = if flags & 1 != 0 {
        200
    } else {
        dataset::MAX_LINE
    };
    let options = Options {
        sources: vec![SourceSpec {
            name: "fuzz".into(),
            paths: vec![input.clone()],
        }],
        samples: 2,
        seq_len: 8,
        render,
        chat: flags & 2 != 0,
        dedup: flags & 4 != 0,
        skip_bad: flags & 8 != 0,
        repeat: flags & 0x80 != 0,
        max_line,
        ..Options::default()
    };
    // One thread: the machine's cores are shared between fuzzers.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let result =
        pool.install(|| dataset::build(&options, tok, info, Some(&ChatMl), &output, &Silent));
    match result {
        Ok(report) => {
            let set = Dataset::load(&output, tok).expect("a built set loads");
            assert_eq!(set.samples.len(), report.samples);
            let n_vocab = tok.n_vocab() as u32;
            for s in &set.samples {
                assert_eq!(s.len(), 8);
                assert!(s.iter().all(|&t| t < n_vocab));
            }
            if !options.skip_bad {
                assert_eq!(report.sources[0].bad, 0);
            }
        }
        Err(DatasetError::Bad(bad)) => {
            assert!(!options.skip_bad, "--skip-bad skips every bad row: {bad}");
            assert_eq!(bad.file, input);
            let shown = bad.to_string();
            assert!(
                shown.starts_with(&format!("{}:{}: ", input.display(), bad.line)),
                "{shown}"
            );
            check_bad_row(body, json, max_line, bad.line, &bad.kind);
        }
        Err(DatasetError::TooFew(_)) => {}
        Err(e) => panic!("unexpected error: {e}"),
    }

    // The same bytes as a finished set: loads, or names the line.
    let as_set = dir.0.join("as-set.jsonl");
    std::fs::write(&as_set, body).unwrap();
    match Dataset::load(&as_set, tok) {
        Ok(set) => assert!(!set.samples.is_empty()),
        Err(DatasetError::Set { path, line, .. }) => {
            assert_eq!(path, as_set);
            // Past the last line for a set that ends early.
            assert!(line >= 1 && line <= body.split(|&b| b == b'\n').count() + 1);
        }
        Err(DatasetError::WrongTokenizer { .. }) => {}
        Err(e) => panic!("unexpected error loading a set: {e}"),
    }
});

/// The bad row really is at `line` and has the fault named.
fn check_bad_row(body: &[u8], json: bool, max_line: usize, line: usize, kind: &BadKind) {
    assert!(line >= 1, "line 0");
    match kind {
        BadKind::MissingField(f) | BadKind::Empty(f) => assert!(!f.is_empty()),
        BadKind::UnknownShape(_) | BadKind::NotObject(_) | BadKind::Template(_) => {}
        _ if json => match kind {
            BadKind::NotUtf8 => assert!(std::str::from_utf8(body).is_err()),
            BadKind::Json(_) => assert!(serde_json::from_slice::<serde_json::Value>(body).is_err()),
            other => panic!("{other:?} in a JSON file"),
        },
        _ => {
            let lines: Vec<&[u8]> = body.split(|&b| b == b'\n').collect();
            let raw = lines
                .get(line - 1)
                .unwrap_or_else(|| panic!("no line {line}"));
            let text = raw.strip_suffix(b"\r").unwrap_or(raw);
            match kind {
                // The cap counts a CR before the newline.
                BadKind::TooLong(max) => {
                    assert_eq!(*max, max_line);
                    assert!(raw.len() > max_line, "line {line} is {} bytes", raw.len());
                }
                BadKind::NotUtf8 => assert!(std::str::from_utf8(text).is_err()),
                BadKind::Json(_) => {
                    assert!(text.len() <= max_line);
                    assert!(serde_json::from_slice::<serde_json::Value>(text).is_err());
                }
                other => panic!("{other:?} in a JSONL file"),
            }
        }
    }
}
