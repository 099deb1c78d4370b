//! `memwall tokenize`: llama-tokenize's options and output forms, byte for
//! byte (fixtures/cli/llama-tokenize.json), and llama-tokenize's ids for the
//! recorded tokenizer cases (fixtures/tokenizer/llama-tokenize.json).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{error_of, repo};
use serde_json::Value;

fn fixture(path: &str) -> Value {
    let text = std::fs::read_to_string(repo().join(path))
        .unwrap_or_else(|e| panic!("{path}: {e} (SmolLM2 needs fixtures/fetch.sh)"));
    serde_json::from_str(&text).unwrap()
}

/// Runs `memwall tokenize ARGS` in the repository root with `stdin` (a file) on
/// standard input; returns stdout, which must be a success's.
fn tokenize(args: &[String], stdin: Option<&Path>) -> Vec<u8> {
    let input = match stdin {
        Some(p) => Stdio::from(std::fs::File::open(repo().join(p)).unwrap()),
        None => Stdio::null(),
    };
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .arg("tokenize")
        .args(args)
        .current_dir(repo())
        .stdin(input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn output_forms_are_llama_tokenizes_byte_for_byte() {
    let recorded = fixture("fixtures/cli/llama-tokenize.json");
    let cases = recorded["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 18);
    for case in cases {
        let mut args = vec!["-m".to_owned(), case["model"].as_str().unwrap().to_owned()];
        args.extend(
            case["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned()),
        );
        let stdin = case["stdin"].as_str().map(Path::new);
        let got = tokenize(&args, stdin);
        assert_eq!(
            hex(&got),
            case["stdout_hex"].as_str().unwrap(),
            "{args:?}: memwall printed\n{}",
            String::from_utf8_lossy(&got)
        );
    }
}

#[test]
fn ids_are_llama_tokenizes_for_the_recorded_tokenizer_cases() {
    let recorded = fixture("fixtures/tokenizer/llama-tokenize.json");
    let texts = fixture("fixtures/tokenizer/texts.json");
    let dir = tempfile::tempdir().unwrap();
    // Each text in a file, read byte for byte with -f (and no escapes), as recorded.
    let mut files = std::collections::HashMap::new();
    for t in texts["texts"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let path = dir.path().join(format!("{name}.txt"));
        std::fs::write(&path, t["text"].as_str().unwrap()).unwrap();
        files.insert(name.to_owned(), path);
    }
    // The models whose changes to their source --override-kv can make
    // (set keys; removing one it cannot).
    let models = recorded["models"].as_object().unwrap();
    let mut jobs = Vec::new();
    for case in recorded["cases"].as_array().unwrap() {
        let model = &models[case["model"].as_str().unwrap()];
        if !model["remove"].as_array().unwrap().is_empty() {
            continue;
        }
        let mut args = vec![
            "-m".to_owned(),
            model["source"].as_str().unwrap().to_owned(),
        ];
        for (key, value) in model["set"].as_object().unwrap() {
            let typed = match value {
                Value::Bool(b) => format!("bool:{b}"),
                Value::String(s) => format!("str:{s}"),
                other => panic!("{key}: {other}"),
            };
            args.extend(["--override-kv".to_owned(), format!("{key}={typed}")]);
        }
        let text = &files[case["text"].as_str().unwrap()];
        args.extend([
            "-f".to_owned(),
            text.display().to_string(),
            "--ids".to_owned(),
            "--no-escape".to_owned(),
        ]);
        if case["add_special"] == false {
            args.push("--no-bos".to_owned());
        }
        if case["parse_special"] == false {
            args.push("--no-parse-special".to_owned());
        }
        jobs.push((args, case));
    }
    assert_eq!(
        jobs.len(),
        7 * 46 * 3,
        "tiny-zh, smollm2, spm, qwen35, gemma-4, spm+no-prefix, spm+eos"
    );
    // Two at a time: each run loads a vocabulary (SmolLM2's is 49152 tokens).
    let failures: Vec<String> = std::thread::scope(|scope| {
        let half = jobs.len().div_ceil(2);
        let workers: Vec<_> = jobs
            .chunks(half)
            .map(|chunk| {
                scope.spawn(move || {
                    let mut failures = Vec::new();
                    for (args, case) in chunk {
                        let stdout = tokenize(args, None);
                        let got: Vec<u64> = serde_json::from_slice::<Vec<u64>>(&stdout).unwrap();
                        let want: Vec<u64> = case["ids"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_u64().unwrap())
                            .collect();
                        if got != want {
                            failures.push(format!(
                                "{} / {}: memwall {got:?}, llama-tokenize {want:?}",
                                case["model"], case["text"]
                            ));
                        }
                    }
                    failures
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_text_is_needed_and_a_folder_is_no_model() {
    let err = error_of(&[
        "tokenize",
        "-m",
        "fixtures/tiny-zh/reference/tiny-zh-f16.gguf",
    ]);
    assert!(err.contains("-p TEXT, -f FILE or --stdin"), "{err}");
    let err = error_of(&["tokenize", "-m", "fixtures/tiny-zh", "-p", "x"]);
    assert!(err.contains("memwall convert fixtures/tiny-zh"), "{err}");
    // --stdin takes precedence over -p, as in llama-tokenize.
    let out = common::memwall_with_stdin(
        &[
            "tokenize",
            "fixtures/tiny-zh/reference/tiny-zh-f16.gguf",
            "-p",
            "ignored",
            "--stdin",
            "--show-count",
        ],
        "北京".as_bytes(),
    );
    // Pieces are bytes: a Chinese character may be split over two tokens.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("ign"), "{text}");
    assert!(text.ends_with("Total number of tokens: 3\n"), "{text}");
}
