//! `memwall calibrate dataset` on tiny-zh with the calib-zh corpus.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{memwall, repo, stdout_of};
use memwall_calibrate::dataset::{Dataset, DatasetError};
use memwall_format::gguf::GgufModel;
use memwall_runtime::tokenizer::Tokenizer;
use serde_json::Value;

const MODEL: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const CORPUS: &str = "fixtures/calib-zh";

/// Long documents: held-out lines after the first 60 (those are evaluation text).
fn long_docs(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("fixtures/tiny-zh/heldout.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().skip(60).take(40).collect();
    let out = dir.join("long.jsonl");
    std::fs::write(&out, lines.join("\n")).unwrap();
    out
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

fn read_set(path: &Path) -> (Value, Vec<Value>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap());
    let header = lines.next().unwrap();
    (header, lines.collect())
}

/// The mixed build every test starts from: four named sources.
fn mixed_args(dir: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let long = long_docs(dir);
    let mut args: Vec<String> = [
        "calibrate",
        "dataset",
        "-m",
        MODEL,
        "--source",
        &format!("qa={CORPUS}/cmrc.jsonl"),
        "--source",
        &format!("qa={CORPUS}/webqa.jsonl"),
        "--source",
        &format!("qa={CORPUS}/squad.json"),
        "--source",
        &format!("qa={CORPUS}/faq.parquet"),
        "--source",
        &format!("inst={CORPUS}/alpaca.jsonl"),
        "--source",
        &format!("long={}", s(&long)),
        "--mix",
        "qa=0.5,inst=0.1,long=0.4",
        "-n",
        "40",
        "--seq-len",
        "128",
        "-o",
        &s(out),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

fn run(args: &[String]) -> String {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    stdout_of(&refs)
}

#[test]
fn mixed_set_has_header_exact_lengths_shares_and_provenance() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("calib.jsonl");
    let report: Value =
        serde_json::from_str(&run(&mixed_args(dir.path(), &out, &["--json"]))).unwrap();

    let (header, samples) = read_set(&out);
    assert_eq!(header["memwall_calibration"], 1);
    assert_eq!(header["model"], "Tiny Zh");
    assert_eq!(header["tokenizer"]["model"], "gpt2");
    assert_eq!(header["tokenizer"]["n_vocab"], 6144);
    assert_eq!(header["tokenizer"]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(header["seq_len"], 128);
    assert_eq!(header["seed"], 42);
    assert_eq!(header["samples"], 40);
    assert_eq!(samples.len(), 40);

    let mut per_source = BTreeMap::<String, usize>::new();
    for sample in &samples {
        let tokens = sample["tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), 128);
        assert!(tokens.iter().all(|t| t.as_u64().unwrap() < 6144));
        let prov = sample["provenance"].as_array().unwrap();
        assert!(!prov.is_empty());
        // A sample comes from one source; its provenance points at real rows.
        let source = prov[0]["source"].as_str().unwrap();
        assert!(prov.iter().all(|p| p["source"] == source));
        for p in prov {
            assert!(
                repo().join(p["file"].as_str().unwrap()).exists()
                    || Path::new(p["file"].as_str().unwrap()).exists()
            );
            assert!(p["line"].as_u64().unwrap() >= 1);
        }
        *per_source.entry(source.to_owned()).or_default() += 1;
        assert!(!sample["text"].as_str().unwrap().is_empty());
    }
    // Shares 0.5 / 0.1 / 0.4 of 40 samples.
    assert_eq!(per_source["qa"], 20);
    assert_eq!(per_source["inst"], 4);
    assert_eq!(per_source["long"], 16);
    let shares: Vec<f64> = header["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["share"].as_f64().unwrap())
        .collect();
    assert!((shares[0] - 0.5).abs() < 1e-9 && (shares[2] - 0.4).abs() < 1e-9);
    // The qa source reads four files of three shapes (plus Parquet's plain QA).
    assert_eq!(header["sources"][0]["paths"].as_array().unwrap().len(), 4);

    // The report.
    assert_eq!(report["samples"], 40);
    assert_eq!(report["total_tokens"], 40 * 128);
    let qa = &report["sources"][0];
    assert_eq!(qa["name"], "qa");
    // 50 CMRC + 60 WebQA + 9 SQuAD + 12 Parquet rows.
    assert_eq!(qa["documents"], 131);
    assert_eq!(qa["shapes"]["squad"], 59);
    assert_eq!(qa["shapes"]["qa"], 72);
    assert_eq!(qa["bad"], 0);
    assert_eq!(report["sources"][1]["shapes"]["alpaca"], 35);
    assert!(report["language"]["documents"]["zh"].as_u64().unwrap() > 150);
    assert!(report["histogram"].as_array().unwrap().len() >= 3);
    assert!(
        report["next"]
            .as_str()
            .unwrap()
            .starts_with("memwall calibrate imatrix -m")
    );
    assert_eq!(report["output"], s(&out));

    // The library reads it back for the same model.
    let model = GgufModel::open(&repo().join(MODEL)).unwrap();
    let tok = Tokenizer::from_gguf(model.metadata()).unwrap();
    let set = Dataset::load(&out, &tok).unwrap();
    assert_eq!((set.samples.len(), set.seq_len), (40, 128));
}

#[test]
fn same_inputs_and_seed_give_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a.jsonl"),
        dir.path().join("b.jsonl"),
        dir.path().join("c.jsonl"),
    );
    let text = run(&mixed_args(dir.path(), &a, &[]));
    assert!(text.contains("next: memwall calibrate imatrix"), "{text}");
    run(&mixed_args(dir.path(), &b, &[]));
    run(&mixed_args(dir.path(), &c, &["--seed", "7"]));
    let bytes = |p: &Path| std::fs::read(p).unwrap();
    assert_eq!(bytes(&a), bytes(&b));
    assert_ne!(bytes(&a), bytes(&c));
}

#[test]
fn chat_renders_through_tiny_zh_chatml_template() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("chat.jsonl");
    stdout_of(&[
        "calibrate",
        "dataset",
        "-m",
        MODEL,
        &format!("{CORPUS}/chat.jsonl"),
        &format!("{CORPUS}/webqa.jsonl"),
        "--chat",
        "-n",
        "6",
        "--seq-len",
        "96",
        "-o",
        &s(&out),
    ]);
    let (header, samples) = read_set(&out);
    assert_eq!(header["chat"], true);
    let names: Vec<&str> = header["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["chat", "webqa"]);
    // ChatML turns, with <|im_start|> (id 1) as a single special token.
    let all_text: String = samples
        .iter()
        .map(|s| s["text"].as_str().unwrap())
        .collect();
    assert!(all_text.contains("<|im_start|>user\n"), "{all_text}");
    assert!(all_text.contains("<|im_start|>assistant\n"));
    assert!(
        !all_text.contains("问："),
        "QA rows became turns, not 问/答 text"
    );
    assert!(
        samples
            .iter()
            .all(|s| s["tokens"].as_array().unwrap().contains(&Value::from(1)))
    );

    // Without --chat, chat rows are `role: content` lines and QA rows 问/答 text.
    let plain = dir.path().join("plain.jsonl");
    let out = memwall(&[
        "calibrate",
        "dataset",
        "-m",
        MODEL,
        &format!("{CORPUS}/chat.jsonl"),
        &format!("{CORPUS}/webqa.jsonl"),
        "-n",
        "6",
        "--seq-len",
        "96",
        "-o",
        &s(&plain),
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("role: content"));
    let (header, samples) = read_set(&plain);
    assert_eq!(header["chat"], false);
    let all_text: String = samples
        .iter()
        .map(|s| s["text"].as_str().unwrap())
        .collect();
    assert!(all_text.contains("问："));
    assert!(!all_text.contains("<|im_start|>"));
}

#[test]
fn another_models_tokenizer_refuses_the_set() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("calib.jsonl");
    stdout_of(&[
        "calibrate",
        "dataset",
        "-m",
        MODEL,
        &format!("{CORPUS}/webqa.jsonl"),
        "-n",
        "4",
        "--seq-len",
        "64",
        "-o",
        &s(&out),
    ]);
    let smol =
        GgufModel::open(&repo().join("fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(smol.metadata()).unwrap();
    let e = Dataset::load(&out, &tok).unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, DatasetError::WrongTokenizer { .. }), "{m}");
    assert!(m.contains("built for `Tiny Zh`"), "{m}");
    assert!(
        m.contains("6144 tokens") && m.contains("49152 tokens"),
        "{m}"
    );
    assert!(m.contains("memwall calibrate dataset -m"), "{m}");
}

#[test]
fn bad_rows_fail_with_file_and_line_or_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    let good = std::fs::read_to_string(repo().join(CORPUS).join("webqa.jsonl")).unwrap();
    let mut lines: Vec<&str> = good.lines().take(30).collect();
    lines.insert(2, r#"{"question": "没有答案"}"#);
    lines.insert(5, "{\"question\": \"截断");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let out = dir.path().join("calib.jsonl");
    let args = [
        "calibrate",
        "dataset",
        "-m",
        MODEL,
        &s(&bad),
        "-n",
        "2",
        "--seq-len",
        "64",
        "-o",
        &s(&out),
    ];
    let o = memwall(&args);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.jsonl:3: missing field `answer`"), "{err}");
    assert!(err.contains("--skip-bad"), "{err}");
    assert!(!out.exists());
    assert!(!dir.path().join("calib.jsonl.partial").exists());

    let mut skip = args.to_vec();
    skip.extend(["--skip-bad", "--json"]);
    let report: Value = serde_json::from_str(&stdout_of(&skip)).unwrap();
    assert_eq!(report["sources"][0]["bad"], 2);
    assert_eq!(report["sources"][0]["documents"], 30);
    let examples = report["bad_examples"].as_array().unwrap();
    assert!(
        examples[1]
            .as_str()
            .unwrap()
            .contains("bad.jsonl:6: not valid JSON")
    );
    assert_eq!(read_set(&out).1.len(), 2);

    // Too little text for one sample says what to do.
    let o = memwall(&[
        "calibrate",
        "dataset",
        "-m",
        MODEL,
        &s(&bad),
        "--skip-bad",
        "--seq-len",
        "100000",
        "-o",
        &s(&dir.path().join("none.jsonl")),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not enough text for one sample") && err.contains("--seq-len"),
        "{err}"
    );
}

#[test]
fn template_and_fields_override_detection() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.jsonl");
    stdout_of(&[
        "calibrate",
        "dataset",
        "-m",
        MODEL,
        &format!("{CORPUS}/webqa.jsonl"),
        "--template",
        r"Q: {question}\nA: {answer}",
        "-n",
        "2",
        "--seq-len",
        "64",
        "-o",
        &s(&out),
    ]);
    let (_, samples) = read_set(&out);
    let text: String = samples
        .iter()
        .map(|s| s["text"].as_str().unwrap())
        .collect();
    assert!(text.contains("\nA: "), "{text}");
    assert!(!text.contains("问："));

    let o = memwall(&[
        "calibrate",
        "dataset",
        "-m",
        MODEL,
        &format!("{CORPUS}/webqa.jsonl"),
        "--fields",
        "question,context",
        "-n",
        "2",
        "--seq-len",
        "64",
        "-o",
        &s(&out),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("webqa.jsonl:1: missing field `context`"));
}
