//! Building and loading whole sets with the tiny-zh model's tokenizer.

use std::fs;
use std::path::{Path, PathBuf};

use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;

use super::*;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(rel)
}

fn tiny_zh() -> (Tokenizer, TokenizerInfo) {
    let model = GgufModel::open(&fixture("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(model.metadata()).unwrap();
    let info = TokenizerInfo::new(model.metadata(), &tok, "test");
    (tok, info)
}

/// tiny-zh's tokenizer with one token's text changed: same size, other ids.
fn tiny_zh_altered() -> Tokenizer {
    use memwall_format::gguf::Array;
    let model = GgufModel::open(&fixture("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let mut meta = model.metadata().clone();
    let mut tokens = meta
        .get_str_array("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap()
        .to_vec();
    tokens[6143] = "memwall-altered".to_owned();
    meta.set("tokenizer.ggml.tokens", Array::String(tokens));
    Tokenizer::from_gguf(&meta).unwrap()
}

/// `n` distinct Chinese QA rows about numbered files.
fn qa_rows(n: usize, topic: &str) -> String {
    (0..n)
        .map(|i| {
            format!(
                "{{\"question\":\"{topic}第{i}题：如何查看文件{i}的内容？\",\"answer\":\"可以用 cat 命令查看第{i}号文件，也可以用 less 分页浏览，{topic}编号{}。\"}}\n",
                i * 7919 % 1000
            )
        })
        .collect()
}

fn options(sources: Vec<SourceSpec>) -> Options {
    Options {
        sources,
        samples: 4,
        seq_len: 32,
        ..Options::default()
    }
}

fn source(name: &str, path: &Path) -> SourceSpec {
    SourceSpec {
        name: name.to_owned(),
        paths: vec![path.to_owned()],
    }
}

fn header_and_samples(path: &Path) -> (Value, Vec<Value>) {
    let text = fs::read_to_string(path).unwrap();
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap());
    let header = lines.next().unwrap();
    (header, lines.collect())
}

#[test]
fn build_packs_exact_lengths_is_deterministic_and_loads_back() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let qa = dir.path().join("qa.jsonl");
    fs::write(&qa, qa_rows(40, "甲")).unwrap();
    let out = dir.path().join("a.jsonl");
    let opts = options(vec![source("qa", &qa)]);
    let report = build(&opts, &tok, &info, None, &out, &Silent).unwrap();
    assert_eq!(report.samples, 4);
    assert_eq!(report.total_tokens, 4 * 32);
    assert_eq!(report.sources[0].documents, 40);
    assert_eq!(report.sources[0].shapes["qa"], 40);
    let (header, samples) = header_and_samples(&out);
    assert_eq!(header["memwall_calibration"], 1);
    assert_eq!(header["seq_len"], 32);
    assert_eq!(header["samples"], 4);
    assert_eq!(header["tokenizer"]["n_vocab"], 6144);
    assert_eq!(header["tokenizer"]["sha256"], vocab_sha256(&tok));
    let eos = tok.eos().unwrap();
    for s in &samples {
        let ids: Vec<u32> = serde_json::from_value(s["tokens"].clone()).unwrap();
        assert_eq!(ids.len(), 32);
        let prov = s["provenance"].as_array().unwrap();
        let from_docs: u64 = prov.iter().map(|p| p["tokens"].as_u64().unwrap()).sum();
        // Every token is a document token or a separator (no BOS for tiny-zh).
        let seps = ids.iter().filter(|&&t| t == eos).count() as u64;
        assert_eq!(from_docs + seps, 32);
        assert!(
            prov.iter()
                .all(|p| p["source"] == "qa" && p["line"].as_u64().unwrap() >= 1)
        );
    }
    let again = dir.path().join("b.jsonl");
    build(&opts, &tok, &info, None, &again, &Silent).unwrap();
    assert_eq!(fs::read(&out).unwrap(), fs::read(&again).unwrap());
    let set = Dataset::load(&out, &tok).unwrap();
    assert_eq!(set.samples.len(), 4);
    assert_eq!(set.seq_len, 32);
    assert_eq!(set.sha256.len(), 64);
    // Another seed shuffles differently.
    let other = dir.path().join("c.jsonl");
    build(
        &Options { seed: 7, ..opts },
        &tok,
        &info,
        None,
        &other,
        &Silent,
    )
    .unwrap();
    assert_ne!(fs::read(&out).unwrap(), fs::read(&other).unwrap());
}

#[test]
fn long_documents_are_chunked_not_dropped() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("long.txt");
    let text: String = (0..60)
        .map(|i| format!("第{i}段：tar 命令把许多文件打包成一个归档文件。\n\n"))
        .collect();
    fs::write(&long, &text).unwrap();
    let n_tokens = tok.encode(&text, false, false).len();
    let out = dir.path().join("o.jsonl");
    let opts = Options {
        samples: 100,
        ..options(vec![source("long", &long)])
    };
    let report = build(&opts, &tok, &info, None, &out, &Silent).unwrap();
    // One document, spread over every full sample it fills.
    assert_eq!(report.samples, n_tokens / 32);
    assert_eq!(report.sources[0].tokens, n_tokens / 32 * 32);
    assert!(report.warnings.iter().any(|w| w.contains("--repeat")));
    let (_, samples) = header_and_samples(&out);
    assert!(samples.iter().all(|s| {
        s["provenance"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("long.txt")
    }));
    // With --repeat the source is reused until the share is met.
    let report = build(
        &Options {
            repeat: true,
            ..opts
        },
        &tok,
        &info,
        None,
        &out,
        &Silent,
    )
    .unwrap();
    assert_eq!(report.samples, 100);
}

#[test]
fn mixing_follows_ratios_and_unlisted_sources_get_nothing() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a.jsonl"),
        dir.path().join("b.jsonl"),
        dir.path().join("c.jsonl"),
    );
    fs::write(&a, qa_rows(60, "甲")).unwrap();
    fs::write(&b, qa_rows(60, "乙")).unwrap();
    fs::write(&c, qa_rows(60, "丙")).unwrap();
    let out = dir.path().join("o.jsonl");
    let opts = Options {
        samples: 8,
        mix: vec![("a".into(), 3.0), ("b".into(), 1.0)],
        ..options(vec![source("a", &a), source("b", &b), source("c", &c)])
    };
    let report = build(&opts, &tok, &info, None, &out, &Silent).unwrap();
    let got: Vec<usize> = report.sources.iter().map(|s| s.samples).collect();
    assert_eq!(got, vec![6, 2, 0]);
    assert!((report.sources[0].share - 0.75).abs() < 1e-12);
    assert!(report.warnings.iter().any(|w| w.contains("`c`")));
    let (header, _) = header_and_samples(&out);
    assert_eq!(header["sources"][0]["tokens"], 6 * 32);
    // Equal shares by default.
    let opts = Options {
        samples: 9,
        mix: vec![],
        ..opts
    };
    let report = build(&opts, &tok, &info, None, &out, &Silent).unwrap();
    let got: Vec<usize> = report.sources.iter().map(|s| s.samples).collect();
    assert_eq!(got, vec![3, 3, 3]);
    // A mix naming no source is refused.
    let bad = Options {
        mix: vec![("zzz".into(), 1.0)],
        ..opts
    };
    let e = build(&bad, &tok, &info, None, &out, &Silent).unwrap_err();
    assert!(e.to_string().contains("`zzz`"), "{e}");
}

#[test]
fn bad_rows_stop_the_build_or_are_skipped_and_counted() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let qa = dir.path().join("qa.jsonl");
    let mut rows = qa_rows(30, "甲");
    rows.push_str("{\"question\":\"没有答案的问题\"}\n");
    rows.push_str("{\"text\":\"截断的行\n");
    fs::write(&qa, rows).unwrap();
    let out = dir.path().join("o.jsonl");
    let opts = options(vec![source("qa", &qa)]);
    let e = build(&opts, &tok, &info, None, &out, &Silent).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("qa.jsonl:31: missing field `answer`"), "{m}");
    assert!(!out.exists());
    assert!(!AtomicFile::partial_path_for(&out).exists());
    let report = build(
        &Options {
            skip_bad: true,
            ..opts
        },
        &tok,
        &info,
        None,
        &out,
        &Silent,
    )
    .unwrap();
    assert_eq!(report.sources[0].bad, 2);
    assert!(report.bad_examples[1].contains("qa.jsonl:32: not valid JSON"));
    assert_eq!(report.sources[0].documents, 30);
}

#[test]
fn duplicates_are_removed_and_counted_unless_dedup_is_off() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.jsonl");
    let base = "ssh 命令用加密的连接登录远程主机，-p 选项指定端口，-i 选项指定私钥文件，-L 选项建立本地端口转发，\
                -R 选项建立远程端口转发，-N 选项只转发端口而不执行远程命令，-v 选项打印调试信息，\
                配置文件 ~/.ssh/config 可以为常用主机写好别名、用户名和端口，省去每次输入。";
    let rows = [
        base.to_owned(),
        format!("  {}\n", base.replace(' ', "\n\t ")),
        base.replace("私钥文件", "私钥文档"),
        "crontab -e 编辑当前用户的定时任务表，每行五个时间字段加一条命令。".to_owned(),
    ];
    let mut text = String::new();
    for r in &rows {
        text.push_str(&serde_json::to_string(&json!({ "text": r })).unwrap());
        text.push('\n');
    }
    fs::write(&f, text).unwrap();
    let out = dir.path().join("o.jsonl");
    let opts = Options {
        samples: 1,
        seq_len: 16,
        ..options(vec![source("d", &f)])
    };
    let r = build(&opts, &tok, &info, None, &out, &Silent).unwrap();
    let s = &r.sources[0];
    assert_eq!((s.exact_duplicates, s.near_duplicates, s.kept), (1, 1, 2));
    let r = build(
        &Options {
            dedup: false,
            ..opts
        },
        &tok,
        &info,
        None,
        &out,
        &Silent,
    )
    .unwrap();
    let s = &r.sources[0];
    assert_eq!((s.exact_duplicates, s.near_duplicates, s.kept), (0, 0, 4));
}

#[test]
fn language_filter_and_mix() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("l.jsonl");
    let text = [
        r#"{"text":"grep 在文件里查找匹配的文本行。"}"#,
        r#"{"text":"grep searches files for lines that match a pattern."}"#,
        r#"{"text":"chmod 改变文件的访问权限。"}"#,
    ]
    .join("\n");
    fs::write(&f, text).unwrap();
    let out = dir.path().join("o.jsonl");
    let opts = Options {
        samples: 1,
        seq_len: 8,
        min_cjk: Some(0.5),
        ..options(vec![source("l", &f)])
    };
    let r = build(&opts, &tok, &info, None, &out, &Silent).unwrap();
    assert_eq!(r.sources[0].language_filtered, 1);
    assert_eq!((r.language.zh, r.language.en), (2, 0));
    let r = build(
        &Options {
            min_cjk: None,
            ..opts
        },
        &tok,
        &info,
        None,
        &out,
        &Silent,
    )
    .unwrap();
    assert_eq!((r.language.zh, r.language.en), (2, 1));
    assert!(r.language.characters.latin > r.language.characters.cjk);
}

struct Angle;

impl ChatRenderer for Angle {
    fn render(&self, messages: &[ChatMessage]) -> Result<String, String> {
        Ok(messages
            .iter()
            .map(|m| format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content))
            .collect())
    }
}

#[test]
fn chat_rendering_goes_through_the_renderer_and_parses_special_tokens() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.jsonl");
    fs::write(&f, qa_rows(10, "甲")).unwrap();
    let out = dir.path().join("o.jsonl");
    let opts = Options {
        chat: true,
        samples: 2,
        ..options(vec![source("c", &f)])
    };
    build(&opts, &tok, &info, Some(&Angle), &out, &Silent).unwrap();
    let (header, samples) = header_and_samples(&out);
    assert_eq!(header["chat"], true);
    let start = tok.token_id("<|im_start|>").unwrap();
    let ids: Vec<u32> = serde_json::from_value(samples[0]["tokens"].clone()).unwrap();
    assert!(ids.contains(&start));
    assert!(
        samples[0]["text"]
            .as_str()
            .unwrap()
            .contains("<|im_start|>user\n")
    );
    // Without the flag, the same rows are plain 问/答 text.
    build(
        &Options {
            chat: false,
            ..opts
        },
        &tok,
        &info,
        Some(&Angle),
        &out,
        &Silent,
    )
    .unwrap();
    let (_, samples) = header_and_samples(&out);
    let ids: Vec<u32> = serde_json::from_value(samples[0]["tokens"].clone()).unwrap();
    assert!(!ids.contains(&start));
}

#[test]
fn too_little_text_is_a_clear_error() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.txt");
    fs::write(&f, "ls").unwrap();
    let out = dir.path().join("o.jsonl");
    let e = build(
        &options(vec![source("t", &f)]),
        &tok,
        &info,
        None,
        &out,
        &Silent,
    )
    .unwrap_err();
    assert!(
        matches!(&e, DatasetError::TooFew(m) if m.contains("add text") && m.contains("--seq-len")),
        "{e}"
    );
    assert!(!out.exists());
    let e = build(
        &Options {
            seq_len: 1,
            ..options(vec![source("t", &f)])
        },
        &tok,
        &info,
        None,
        &out,
        &Silent,
    )
    .unwrap_err();
    assert!(matches!(e, DatasetError::Options(_)));
}

fn small_set(dir: &Path) -> PathBuf {
    let (tok, info) = tiny_zh();
    let qa = dir.join("qa.jsonl");
    fs::write(&qa, qa_rows(20, "甲")).unwrap();
    let out = dir.join("set.jsonl");
    build(
        &options(vec![source("qa", &qa)]),
        &tok,
        &info,
        None,
        &out,
        &Silent,
    )
    .unwrap();
    out
}

#[test]
fn a_set_built_for_another_tokenizer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let set = small_set(dir.path());
    let other = tiny_zh_altered();
    assert_eq!(other.n_vocab(), 6144);
    let e = Dataset::load(&set, &other).unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, DatasetError::WrongTokenizer { .. }));
    assert!(m.contains("built for `Tiny Zh`"), "{m}");
    assert!(m.contains("memwall calibrate dataset -m"), "{m}");
}

#[test]
fn hostile_sets_are_refused_with_the_line() {
    let (tok, _) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let set = small_set(dir.path());
    let text = fs::read_to_string(&set).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let write = |body: String| {
        let p = dir.path().join("h.jsonl");
        fs::write(&p, body).unwrap();
        p
    };
    let err = |p: &Path| format::load(p, &tok, MAX_LINE).unwrap_err().to_string();
    // Truncated: fewer samples than the header announces, or a cut line.
    let p = write(lines[..3].join("\n"));
    assert!(err(&p).contains("announces 4 samples"), "{}", err(&p));
    let cut = format!("{}\n{}", lines[0], &lines[1][..lines[1].len() / 2]);
    assert!(err(&write(cut)).contains(":2: not JSON"));
    // An id outside the vocabulary; a sample longer than seq_len; none.
    let mut v: Value = serde_json::from_str(lines[1]).unwrap();
    v["tokens"][3] = json!(99999);
    let big = v.to_string();
    let e = err(&write(format!("{}\n{big}", lines[0])));
    assert!(
        e.contains(":2: token 3 is 99999, not an id below the vocabulary size 6144"),
        "{e}"
    );
    let long = lines[1].replacen("\"tokens\":[", "\"tokens\":[5,", 1);
    assert!(err(&write(format!("{}\n{long}", lines[0]))).contains("more than seq_len"));
    assert!(err(&write(lines[0].to_owned())).contains("no samples"));
    assert!(err(&write(String::new())).contains("empty file"));
    assert!(err(&write("{\"x\":1}\n".into())).contains("not a calibration set"));
    // A line beyond the cap, and bytes that are not UTF-8.
    let p = write(text.clone());
    let e = format::load(&p, &tok, 64).unwrap_err().to_string();
    assert!(e.contains(":1: line longer than 64 bytes"), "{e}");
    let mut bytes = text.into_bytes();
    let at = bytes.len() - 10;
    bytes[at] = 0xff;
    let p = dir.path().join("u.jsonl");
    fs::write(&p, bytes).unwrap();
    assert!(err(&p).contains(":5: not JSON"));
}

#[test]
fn hostile_inputs_never_panic() {
    let (tok, info) = tiny_zh();
    let dir = tempfile::tempdir().unwrap();
    let inputs: [(&str, &[u8]); 7] = [
        ("a.json", b"[{\"text\": \"unterminated"),
        ("b.json", b"{\"data\": 5}"),
        (
            "c.jsonl",
            b"\xff\xfe\x00\x01\n{\"messages\": 3}\n{\"question\": [], \"answer\": 1}",
        ),
        ("d.parquet", b"PAR1\x10\x00\x00\x00PAR1"),
        ("e.json", &[b'['; 100_000]),
        ("f.txt", b"\xc3"),
        (
            "g.jsonl",
            b"{\"instruction\": {\"x\": 1}, \"output\": null}",
        ),
    ];
    for (name, bytes) in inputs {
        let p = dir.path().join(name);
        fs::write(&p, bytes).unwrap();
    }
    let huge = dir.path().join("h.jsonl");
    fs::write(&huge, format!("{{\"text\":\"{}\"}}\n", "长".repeat(5000))).unwrap();
    let out = dir.path().join("o.jsonl");
    let opts = Options {
        skip_bad: true,
        max_line: 1000,
        ..options(vec![source("x", dir.path())])
    };
    let e = build(&opts, &tok, &info, None, &out, &Silent).unwrap_err();
    assert!(matches!(e, DatasetError::TooFew(_)), "{e}");
    let opts = Options {
        skip_bad: false,
        ..opts
    };
    let e = build(&opts, &tok, &info, None, &out, &Silent).unwrap_err();
    assert!(e.to_string().contains("a.json:1: not valid JSON"), "{e}");
}
