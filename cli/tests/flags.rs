//! One flag vocabulary, as a llama.cpp user expects it: the model as the first
//! argument or `-m/--model` in every command that reads one; `-c/--ctx-size`,
//! `-b/--batch-size`, `-t/--threads`, `-f/--file` and `-d/--device` spelled
//! alike; llama.cpp's own spellings either meaning what they mean there or
//! refused with a note — never something else.

mod common;

use std::path::Path;

use common::{memwall, memwall_with_stdin, repo, stdout_of, usage_error};
use serde_json::Value;
use sha2::{Digest, Sha256};

const TINY: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const TEXT: &str = "fixtures/perplexity/heldout-24k.txt";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&stdout_of(args)).unwrap()
}

fn sha(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

/// `value` without the fields that differ between two runs (time, speed, memory).
fn steady(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.retain(|k, _| {
            !(k.contains("second") || k.contains("ms") || k.contains("rss") || k == "setup")
        });
        for v in map.values_mut() {
            *v = steady(v.take());
        }
    }
    value
}

#[test]
fn every_command_that_reads_a_model_takes_it_first_or_with_m() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    // The same command line both ways gives the same answer.
    let both = |before: &[&str], after: &[&str]| {
        let mut first = before.to_vec();
        first.push(TINY);
        first.extend_from_slice(after);
        let mut flag = before.to_vec();
        flag.extend_from_slice(&["-m", TINY]);
        flag.extend_from_slice(after);
        (
            steady(serde_json::from_str(&stdout_of(&first)).unwrap()),
            steady(serde_json::from_str(&stdout_of(&flag)).unwrap()),
        )
    };
    for (before, after) in [
        (vec!["inspect"], vec!["--json"]),
        (vec!["validate"], vec!["--json"]),
        (vec!["plan"], vec!["--json"]),
        (vec!["quantize"], vec!["Q4_K_M", "--dry-run", "--json"]),
        (
            vec!["run"],
            vec!["-p", "北京", "-n", "4", "--temp", "0", "--json"],
        ),
        (
            vec!["perplexity"],
            vec!["-f", TEXT, "-c", "64", "--chunks", "2", "--json"],
        ),
    ] {
        let (first, flag) = both(&before, &after);
        assert_eq!(first, flag, "{before:?}");
    }
    // quantize IN OUT TYPE = quantize -m IN OUT TYPE (clap's first slot holds OUT then).
    stdout_of(&["quantize", TINY, &d("a.gguf"), "Q8_0"]);
    stdout_of(&["quantize", "-m", TINY, &d("b.gguf"), "Q8_0"]);
    assert_eq!(
        sha(&dir.path().join("a.gguf")),
        sha(&dir.path().join("b.gguf"))
    );
    // export IN OUT_DIR = export -m IN OUT_DIR.
    stdout_of(&["export", "-m", &d("a.gguf"), &d("hf")]);
    assert!(dir.path().join("hf/config.json").is_file());
    // compare BASE FILES… = compare -m BASE FILES….
    let compare = json(&[
        "compare",
        "-m",
        TINY,
        &d("a.gguf"),
        "--types",
        "none",
        "-f",
        TEXT,
        "-c",
        "64",
        "--chunks",
        "2",
        "-o",
        &d("report"),
        "--json",
    ]);
    let names: Vec<&str> = compare["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["file"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a.gguf", "tiny-zh-f16.gguf"], "{compare}");
    // bench, tokenize and convert too.
    for line in [
        vec!["bench", TINY, "-p", "8", "-n", "2", "-r", "1", "--json"],
        vec![
            "bench", "-m", TINY, "-p", "8", "-n", "2", "-r", "1", "--json",
        ],
    ] {
        let v = json(&line);
        assert_eq!(v["results"].as_array().unwrap().len(), 2, "{line:?}");
    }
    assert_eq!(
        stdout_of(&["tokenize", TINY, "-p", "北京", "--ids"]),
        stdout_of(&["tokenize", "-m", TINY, "-p", "北京", "--ids"])
    );
    stdout_of(&[
        "convert",
        "-m",
        "fixtures/tiny-zh",
        "--pre",
        "gpt-2",
        "-o",
        &d("c.gguf"),
    ]);
    assert!(dir.path().join("c.gguf").is_file());
    // Two different models are one too many.
    let out = memwall(&["run", TINY, "-m", &d("a.gguf"), "-p", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give the model once"));
}

#[test]
fn context_batch_threads_and_device_are_spelled_alike() {
    // plan took -c/--ctx and --batch; llama.cpp's --ctx-size and --batch-size work too.
    for ctx in [["-c", "1024"], ["--ctx-size", "1024"], ["--ctx", "1024"]] {
        let v = json(&["plan", TINY, ctx[0], ctx[1], "--json"]);
        assert_eq!(v["ctx"], 1024, "{ctx:?}");
    }
    for batch in [["-b", "128"], ["--batch-size", "128"], ["--batch", "128"]] {
        let v = json(&["plan", TINY, batch[0], batch[1], "--json"]);
        assert_eq!(v["batch"], 128, "{batch:?}");
    }
    // -d is the device everywhere a device is estimated for.
    let plan = json(&["plan", TINY, "-d", "phone-8gb", "--json"]);
    assert_eq!(plan["device"]["name"], "phone-8gb");
    let dir = tempfile::tempdir().unwrap();
    let q8 = dir.path().join("q8.gguf");
    stdout_of(&["quantize", TINY, s(&q8), "Q8_0"]);
    let compare = json(&[
        "compare",
        TINY,
        s(&q8),
        "--types",
        "none",
        "--file",
        TEXT,
        "--ctx-size",
        "64",
        "--chunks",
        "1",
        "-d",
        "phone-8gb",
        "-t",
        "1",
        "-o",
        s(&dir.path().join("r")),
        "--json",
    ]);
    assert_eq!(compare["device"]["name"], "phone-8gb", "{compare}");
    // -c, -b and -t reach the commands that run a model.
    let ppl = json(&[
        "perplexity",
        TINY,
        "--file",
        TEXT,
        "--ctx-size",
        "64",
        "--batch-size",
        "32",
        "--threads",
        "1",
        "--chunks",
        "1",
        "--json",
    ]);
    assert_eq!(ppl["setup"]["n_ctx"], 64);
    assert_eq!(ppl["setup"]["n_batch"], 32);
    assert_eq!(ppl["setup"]["threads"], 1);
    // -c nv was read as a context of "nv": llama-cli's -cnv is a flag of its own now.
    let err = usage_error(&["run", TINY, "-c", "nv"]);
    assert!(err.contains("--ctx-size"), "{err}");
}

#[test]
fn llama_cpp_options_memwall_has_no_use_for_are_refused_with_a_note() {
    for (line, flag, note) in [
        (vec!["run", TINY, "-ngl", "99", "-p", "x"], "-ngl", "CPU"),
        (
            vec!["bench", "-m", TINY, "--n-gpu-layers=99"],
            "--n-gpu-layers",
            "CPU",
        ),
        (
            vec!["perplexity", "-m", TINY, "-fa", "on"],
            "-fa",
            "flash-attention",
        ),
        (
            vec!["run", TINY, "-ctk", "q8_0", "-p", "x"],
            "-ctk",
            "--kv-type q8_0",
        ),
        (vec!["bench", "-m", TINY, "-ub", "256"], "-ub", "-b"),
        (
            vec!["run", "-hf", "org/model", "-p", "x"],
            "-hf",
            "memwall convert",
        ),
        (
            vec!["run", TINY, "--device", "CUDA0", "-p", "x"],
            "--device",
            "plan and compare",
        ),
    ] {
        let err = usage_error(&line);
        assert!(
            err.starts_with(&format!("error: {flag} is")),
            "{line:?}: {err}"
        );
        assert!(err.contains(note), "{line:?}: {err}");
    }
    // llama-bench's -mmp 0 is memwall's --no-mmap.
    let v = json(&[
        "bench", "-m", TINY, "-p", "8", "-n", "0", "-r", "1", "-mmp", "0", "--json",
    ]);
    assert_eq!(v["results"].as_array().unwrap().len(), 1);
    // llama-bench's -o json is --json.
    let v = json(&[
        "bench", "-m", TINY, "-p", "8", "-n", "0", "-r", "1", "-o", "json",
    ]);
    assert_eq!(v["model"], TINY);
}

#[test]
fn llama_cli_conversation_flags_mean_what_they_mean_there() {
    let chat = |args: &[&str]| {
        let out = memwall_with_stdin(args, "北京是哪个国家的首都？\n".as_bytes());
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let sampling = ["-n", "12", "--temp", "0"];
    let mut cnv = vec!["run", TINY, "-cnv", "-sys", "Answer briefly."];
    cnv.extend_from_slice(&sampling);
    let mut ours = vec!["run", TINY, "--chat", "--system", "Answer briefly."];
    ours.extend_from_slice(&sampling);
    assert_eq!(chat(&cnv), chat(&ours));
    // -cnv -p answers and goes on talking in llama-cli; --chat -p answers once: say so.
    let out = memwall(&["run", TINY, "-cnv", "-p", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("-st"));
    // -cnv -st -p is llama-cli's one reply: what --chat -p does.
    let one = stdout_of(&[
        "run", TINY, "-cnv", "-st", "-p", "北京", "-n", "8", "--temp", "0",
    ]);
    let ours = stdout_of(&[
        "run", TINY, "--chat", "-p", "北京", "-n", "8", "--temp", "0",
    ]);
    assert_eq!(one, ours);
}

#[test]
fn kl_divergence_base_means_what_it_means_in_llama_perplexity() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.kld");
    let saved = dir.path().join("saved.kld");
    let q4 = dir.path().join("q4.gguf");
    stdout_of(&["quantize", TINY, s(&q4), "Q4_K_M"]);
    let window = ["-c", "64", "--chunks", "3"];
    // Alone, --kl-divergence-base writes the base, as --save-logits does.
    let mut write = vec![
        "perplexity",
        "-m",
        TINY,
        "-f",
        TEXT,
        "--kl-divergence-base",
        s(&base),
    ];
    write.extend_from_slice(&window);
    stdout_of(&write);
    let mut save = vec![
        "perplexity",
        "-m",
        TINY,
        "-f",
        TEXT,
        "--save-logits",
        s(&saved),
    ];
    save.extend_from_slice(&window);
    stdout_of(&save);
    assert_eq!(sha(&base), sha(&saved));
    // With --kl-divergence (no file), it is the base read.
    let llama = json(&[
        "perplexity",
        "-m",
        s(&q4),
        "--kl-divergence-base",
        s(&base),
        "--kl-divergence",
        "--json",
    ]);
    let ours = json(&[
        "perplexity",
        "-m",
        s(&q4),
        "--kl-divergence",
        s(&saved),
        "--json",
    ]);
    assert_eq!(llama["kld"], ours["kld"]);
    assert!(llama["kld"]["mean"].as_f64().unwrap() > 0.0);
    let out = memwall(&["perplexity", "-m", s(&q4), "--kl-divergence"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kl-divergence FILE"));
}

#[test]
fn quantize_options_write_what_llama_quantize_writes() {
    // Recorded by fixtures/cli/record.sh: --prune-layers, --override-kv,
    // --tensor-type-file among --tensor-type, with and without an imatrix.
    let text = std::fs::read_to_string(repo().join("fixtures/cli/llama-quantize.json")).unwrap();
    let recorded: Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let cases = recorded["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for case in cases {
        let line = case["args"].as_str().unwrap();
        let mut args = vec!["quantize"];
        args.extend(
            line.split(' ')
                .map(|a| if a == "OUT" { s(&out) } else { a }),
        );
        stdout_of(&args);
        assert_eq!(sha(&out), case["sha256"].as_str().unwrap(), "{line}");
        assert_eq!(
            std::fs::metadata(&out).unwrap().len(),
            case["bytes"].as_u64().unwrap()
        );
        std::fs::remove_file(&out).unwrap();
    }
    // A pruned model runs, and says how many blocks it has.
    stdout_of(&["quantize", "--prune-layers", "1,3", TINY, s(&out), "Q8_0"]);
    let v = json(&["inspect", s(&out), "--json"]);
    let blocks = v["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"] == "llama.block_count")
        .unwrap();
    assert_eq!(blocks["value"], 2);
    stdout_of(&["run", s(&out), "-p", "北京", "-n", "2"]);
    let err = common::error_of(&["quantize", "--prune-layers", "4", TINY, s(&out), "Q8_0"]);
    assert!(
        err.contains("--prune-layers 4: the model has blocks 0 to 3"),
        "{err}"
    );
}

#[test]
fn quantize_takes_llama_quantizes_trailing_thread_count() {
    let text =
        std::fs::read_to_string(repo().join("fixtures/tiny-zh/reference/llama-quantize.json"))
            .unwrap();
    let recorded: Value = serde_json::from_str(&text).unwrap();
    let want = recorded["mix"]["Q4_K_M"]["sha256"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.gguf");
    let report = json(&["quantize", TINY, s(&out), "Q4_K_M", "1", "--json"]);
    assert_eq!(report["threads"], 1);
    assert_eq!(sha(&out), want);
    // The short form too, and llama-quantize's numbers for types (15 = Q4_K_M).
    let input = dir.path().join("tiny-zh-f16.gguf");
    std::fs::copy(repo().join(TINY), &input).unwrap();
    let report = json(&["quantize", s(&input), "15", "2", "--json"]);
    assert_eq!(report["threads"], 2);
    assert_eq!(report["file_type"]["name"], "Q4_K_M");
    assert_eq!(sha(&dir.path().join("tiny-zh-Q4_K_M.gguf")), want);
    let err = common::error_of(&["quantize", TINY, s(&out), "Q4_K_M", "2", "-t", "3"]);
    assert!(err.contains("two thread counts"), "{err}");
    let err = common::error_of(&["quantize", TINY, s(&out), "Q4_K_M", "two"]);
    assert!(err.contains("'two' is not a thread count"), "{err}");
}

#[test]
fn run_reads_the_model_with_override_kv() {
    let prompt_tokens = |extra: &[&str]| {
        let mut args = vec![
            "run", TINY, "-p", "北京", "-n", "1", "--temp", "0", "--json",
        ];
        args.extend_from_slice(extra);
        json(&args)["prompt_tokens"].as_u64().unwrap()
    };
    // tiny-zh adds no BOS; told to, it does (one more prompt token).
    let plain = prompt_tokens(&[]);
    let bos = prompt_tokens(&["--override-kv", "tokenizer.ggml.add_bos_token=bool:true"]);
    assert_eq!(bos, plain + 1);
    // llama-cli's comma-separated list.
    let listed = prompt_tokens(&[
        "--override-kv",
        "tokenizer.ggml.add_bos_token=bool:true,general.name=str:renamed",
    ]);
    assert_eq!(listed, bos);
    let err = common::error_of(&[
        "run",
        TINY,
        "-p",
        "x",
        "--override-kv",
        "llama.context_length=8",
    ]);
    assert!(err.contains("KEY=TYPE:VALUE"), "{err}");
}

#[test]
fn run_reads_prompts_and_stop_strings_as_llama_cli_does() {
    let tokens = |args: &[&str]| {
        let mut line = vec!["run", TINY, "-n", "1", "--temp", "0", "--json"];
        line.extend_from_slice(args);
        json(&line)["prompt_tokens"].as_u64().unwrap()
    };
    // Escapes are processed, as llama-cli does unless --no-escape.
    let newline = tokens(&["-p", "北京\n是"]);
    assert_eq!(tokens(&["-p", r"北京\n是"]), newline);
    assert_ne!(tokens(&["-p", r"北京\n是", "--no-escape"]), newline);
    // -f drops one newline at the end of the file, as llama-cli's -f does.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, "北京是\n").unwrap();
    assert_eq!(tokens(&["-f", s(&file)]), tokens(&["-p", "北京是"]));
    // --stop "\n" stops at a newline (the text before it is kept).
    let free = json(&[
        "run",
        TINY,
        "-p",
        "北京是",
        "-n",
        "48",
        "--temp",
        "0",
        "--json",
    ]);
    let text = free["text"].as_str().unwrap();
    let cut = text.find('\n').expect("a newline in 48 greedy tokens");
    let stopped = json(&[
        "run",
        TINY,
        "-p",
        "北京是",
        "-n",
        "48",
        "--temp",
        "0",
        "--stop",
        r"\n",
        "--json",
    ]);
    assert_eq!(stopped["text"], &text[..cut]);
    assert_eq!(stopped["stopped_by"], "stop");
}
