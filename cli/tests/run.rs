//! `memwall run`: the chat REPL driven through standard input (its prompt tokens
//! are the ones transformers' apply_chat_template gives, fixtures/chat/record.sh),
//! stop strings, EOG, JSON statistics, and clear errors.

mod common;

use std::process::Command;

use common::{memwall, memwall_with_stdin, repo, stdout_of};
use serde_json::Value;

const TINY: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";

/// Sixteen greedy tokens of tiny-zh after 北京是, as JSON.
const TINY_GREEDY: [&str; 10] = [
    "run",
    "-m",
    TINY,
    "-p",
    "北京是",
    "-n",
    "16",
    "--temp",
    "0",
    "--json",
];

/// `memwall perplexity` of tiny-zh on three 64-token chunks of held-out text, as JSON.
const TINY_PPL: [&str; 10] = [
    "perplexity",
    "-m",
    TINY,
    "-f",
    "fixtures/perplexity/heldout-24k.txt",
    "-c",
    "64",
    "--chunks",
    "3",
    "--json",
];

fn recorded(model: &str, case: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(repo().join("fixtures/chat/transformers.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["models"][model][case]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Runs `memwall ARGS` with `input` on standard input; returns stdout (must succeed).
fn with_stdin(args: &[&str], input: &str) -> String {
    let out = memwall_with_stdin(args, input.as_bytes());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_chat_repl_sends_what_transformers_templates() {
    let system = "你是一个乐于助人的助手。";
    let out = with_stdin(
        &[
            "run", "-m", TINY, "--chat", "--system", system, "-n", "8", "--temp", "0", "--json",
        ],
        "Say hello in Chinese.\n\n再说一遍。\n/exit\nnot read\n",
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let turns = v["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{v}");
    let ids = |t: &Value| -> Vec<u64> {
        t["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    // Turn one is transformers' rendering of (system, user) with the generation prompt.
    assert_eq!(ids(&turns[0]), recorded("tiny-zh", "system+gen"));
    // Turn two carries the whole conversation: turn one's prompt, the reply, the new message.
    let second = ids(&turns[1]);
    assert!(second.starts_with(&ids(&turns[0])), "history kept");
    assert!(second.len() > ids(&turns[0]).len() + 4);
    for t in turns {
        assert!(t["generated_tokens"].as_u64().unwrap() <= 8);
        assert!(t["peak_rss_bytes"].as_u64().unwrap() > 0);
        assert!(t["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
    }
    // /reset forgets: the next prompt is a fresh (system, user) conversation again.
    let out = with_stdin(
        &[
            "run", "-m", TINY, "--chat", "--system", system, "-n", "4", "--temp", "0", "--json",
        ],
        "Say hello in Chinese.\n/reset\nSay hello in Chinese.\n",
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let turns = v["turns"].as_array().unwrap();
    assert_eq!(ids(&turns[0]), ids(&turns[1]));
}

#[test]
fn greedy_is_deterministic_and_stop_strings_cut_the_text() {
    let run = |extra: &[&str]| -> Value {
        let mut args = vec!["run", "-m", TINY, "-p", "北京是", "-n", "24", "--json"];
        args.extend_from_slice(extra);
        serde_json::from_str(&stdout_of(&args)).unwrap()
    };
    let a = run(&["--temp", "0"]);
    assert_eq!(a, {
        let mut b = run(&["--temp", "0", "-t", "1"]);
        // Timings and page-cache effects differ (the first run may read the file from
        // storage, the second finds it cached); the text and counts do not.
        for k in [
            "first_token_ms",
            "prompt_tokens_per_second",
            "decode_tokens_per_second",
            "peak_rss_bytes",
            "file_rss_bytes",
            "storage_read_bytes_per_token",
        ] {
            b[k] = a[k].clone();
        }
        b
    });
    let text = a["text"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());
    // Stop at the first character of the greedy continuation after its first two.
    let cut: String = text.chars().skip(2).take(1).collect();
    let stopped = run(&["--temp", "0", "--stop", &cut]);
    assert_eq!(stopped["stopped_by"], "stop");
    let expected: String = text.chars().take_while(|c| c.to_string() != cut).collect();
    assert_eq!(stopped["text"].as_str().unwrap(), expected);
    // Sampling with a seed repeats itself.
    let sampled = |seed: &str| run(&["--temp", "0.8", "--seed", seed])["text"].clone();
    assert_eq!(sampled("7"), sampled("7"));
}

#[test]
fn missing_prompt_and_small_context_are_clear_errors() {
    let out = memwall(&["run", "-m", TINY]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-p TEXT or -f FILE"));
    let out = memwall(&["run", "-m", TINY, "-p", ""]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("prompt is empty"));
    let out = memwall(&["run", "-m", TINY, "-p", "一二三四五六七八九十", "-c", "4"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("raise -c"));
}

#[test]
fn greedy_smollm2_continues_as_llama_completion() {
    let text = std::fs::read_to_string(repo().join("fixtures/run/llama-completion.json")).unwrap();
    let recorded: Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model = common::smollm2_f16(dir.path());
    let bytes = std::fs::read(&model).unwrap();
    let sha = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(&bytes));
    assert_eq!(
        sha,
        recorded["sha256"].as_str().unwrap(),
        "not the file llama.cpp ran"
    );
    let n = recorded["n_predict"].as_u64().unwrap().to_string();
    for case in recorded["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let out: Value = serde_json::from_str(&stdout_of(&[
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            prompt,
            "-n",
            &n,
            "--temp",
            "0",
            "--json",
        ]))
        .unwrap();
        assert_eq!(out["text"], case["text"], "{prompt}");
        let eos = case["eos"].as_bool().unwrap();
        assert_eq!(
            out["stopped_by"],
            if eos { "eog" } else { "length" },
            "{prompt}"
        );
    }
}

#[test]
fn streaming_mode_changes_memory_not_results() {
    // Pin 2 MiB of tiny-zh (the output head does not fit; so layers stream), read ahead 1.
    let run = |extra: &[&str]| -> Value {
        let mut args = TINY_GREEDY.to_vec();
        args.extend_from_slice(extra);
        serde_json::from_str(&stdout_of(&args)).unwrap()
    };
    let plain = run(&[]);
    let streamed = run(&["--resident", "2", "--prefetch", "1"]);
    assert_eq!(plain["text"], streamed["text"]);
    let ppl = |extra: &[&str]| -> f64 {
        let mut args = TINY_PPL.to_vec();
        args.extend_from_slice(extra);
        let v: Value = serde_json::from_str(&stdout_of(&args)).unwrap();
        v["ppl"].as_f64().unwrap()
    };
    assert_eq!(ppl(&[]), ppl(&["--resident", "0"]));
    // Streaming needs the mapping.
    let out = memwall(&["run", "-m", TINY, "-p", "x", "--resident", "2", "--no-mmap"]);
    assert!(!out.status.success());
}

/// A mixture of experts streams its experts into a cache (here 4 of its 8,
/// with `--resident 0`), filled at start from an importance matrix's
/// per-expert counts when one is given: the text stays the same, the profile
/// fills every slot, and a file without expert counts is refused by name.
#[test]
fn moe_streaming_with_an_expert_profile_keeps_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let moe = common::moe_f16(dir.path());
    let moe = moe.to_str().unwrap();
    let imatrix = dir.path().join("imatrix.gguf");
    let imatrix = imatrix.to_str().unwrap();
    stdout_of(&[
        "calibrate",
        "imatrix",
        "-m",
        moe,
        "-f",
        "fixtures/perplexity/heldout-24k.txt",
        "-c",
        "64",
        "--chunks",
        "2",
        "-o",
        imatrix,
    ]);
    let text = |extra: &[&str]| -> Value {
        let mut args = vec![
            "run", "-m", moe, "-p", "hello", "-n", "8", "--temp", "0", "--json",
        ];
        args.extend_from_slice(extra);
        serde_json::from_str(&stdout_of(&args)).unwrap()
    };
    let plain = text(&[]);
    assert_eq!(plain["text"], text(&["--resident", "0"])["text"]);
    assert_eq!(
        plain["text"],
        text(&["--resident", "0", "--expert-profile", imatrix])["text"]
    );
    let bench: Value = serde_json::from_str(&stdout_of(&[
        "bench",
        "-m",
        moe,
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--resident",
        "0",
        "--expert-profile",
        imatrix,
        "--json",
    ]))
    .unwrap();
    let experts = &bench["streaming"]["experts"];
    assert_eq!(experts["experts"], 8, "2 layers × 4 experts");
    assert_eq!(experts["slots"], 4, "2 routed + 2 read ahead");
    assert_eq!(experts["prewarmed"], 4, "the profile fills every slot");
    for row in bench["results"].as_array().unwrap() {
        let rate = row["experts"]["hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&rate), "{row}");
        assert!(row["experts"]["requests_per_token"].as_f64().unwrap() > 0.0);
    }
    // The model itself has no `.counts` tensors.
    let out = memwall(&[
        "run",
        "-m",
        moe,
        "-p",
        "x",
        "-n",
        "1",
        "--resident",
        "0",
        "--expert-profile",
        moe,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not an expert profile") && err.contains("per-expert counts"),
        "{err}"
    );
}

/// `MEMWALL_KERNELS` pins the dot products and caps attention, `exp` and the
/// activation quantizers at the same instruction set: every backend this CPU
/// runs gives the same perplexity bits and greedy text (prompt batches and
/// decoding), and `bench` names the backend it ran. Backends this CPU lacks
/// are refused with an error.
#[test]
fn every_kernel_backend_gives_the_same_results() {
    let with = |kernels: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_memwall"))
            .args(args)
            .env("MEMWALL_KERNELS", kernels)
            .current_dir(repo())
            .output()
            .unwrap()
    };
    let bench_args = [
        "bench", "-m", TINY, "-p", "8", "-n", "2", "-t", "1", "-r", "1", "--json",
    ];
    let mut seen = Vec::new();
    for kernels in ["scalar", "avx2", "avx512", "neon", "neon-dot"] {
        let bench = with(kernels, &bench_args);
        if !bench.status.success() {
            let err = String::from_utf8_lossy(&bench.stderr);
            assert!(
                err.contains("not supported by this CPU"),
                "{kernels}: {err}"
            );
            continue;
        }
        let bench: Value = serde_json::from_slice(&bench.stdout).unwrap();
        assert_eq!(bench["kernels"], kernels);
        let json = |args: &[&str]| -> Value {
            let out = with(kernels, args);
            assert!(
                out.status.success(),
                "{kernels}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).unwrap()
        };
        let ppl = json(&TINY_PPL)["ppl"].as_f64().unwrap();
        let text = json(&TINY_GREEDY)["text"].as_str().unwrap().to_owned();
        seen.push((kernels, ppl.to_bits(), text));
    }
    assert!(
        seen.len() >= 2,
        "scalar and at least one SIMD backend: {seen:?}"
    );
    for (kernels, ppl, text) in &seen[1..] {
        assert_eq!((ppl, text), (&seen[0].1, &seen[0].2), "{kernels} vs scalar");
    }
}

#[test]
fn bench_sweeps_and_recommends() {
    let v: Value = serde_json::from_str(&stdout_of(&[
        "bench", "-m", TINY, "-p", "16", "-n", "4", "-t", "1,2", "-b", "8,16", "-r", "1", "--json",
    ]))
    .unwrap();
    // 2 thread counts × (2 batch sizes of pp + tg).
    assert_eq!(v["results"].as_array().unwrap().len(), 6);
    for r in v["results"].as_array().unwrap() {
        assert!(r["tokens_per_second"].as_f64().unwrap() > 0.0);
    }
    assert!(v["recommended"]["prompt"]["threads"].as_u64().is_some());
    assert_eq!(v["recommended"]["decode"]["n_batch"], 1);
}

/// A copy of tiny-zh whose chat template is `template`, padded with spaces to
/// the length of the original so that nothing else in the file moves.
fn tiny_with_template(dir: &std::path::Path, template: &str) -> std::path::PathBuf {
    let mut bytes = std::fs::read(repo().join(TINY)).unwrap();
    let key = b"tokenizer.chat_template";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // Value type (u32, 8 = string), then the string's length (u64) and bytes.
    assert_eq!(bytes[at..at + 4], 8u32.to_le_bytes());
    let len = u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap()) as usize;
    assert!(template.len() <= len);
    let start = at + 12;
    bytes[start..start + len].fill(b' ');
    bytes[start..start + template.len()].copy_from_slice(template.as_bytes());
    let path = dir.join("hostile.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_template_that_eats_memory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_with_template(dir.path(), "{{ ('x'*99999999)|list|length }}");
    let start = std::time::Instant::now();
    let out = memwall(&["run", "-m", model.to_str().unwrap(), "--chat", "-p", "hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the chat template used more than 1 GiB of memory or crashed"),
        "{stderr}"
    );
    assert!(stderr.contains("without --chat"), "{stderr}");
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
    // An ordinary template error still comes back from the child as itself.
    let model = tiny_with_template(dir.path(), "{{ raise_exception('no system role') }}");
    let out = memwall(&["run", "-m", model.to_str().unwrap(), "--chat", "-p", "hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the chat template failed: "), "{stderr}");
    assert!(stderr.contains("no system role"), "{stderr}");
}

#[test]
fn escape_sequences_never_reach_the_terminal() {
    // The prompt is echoed: a colour and a window title in it are dropped whole.
    let prompt = "\u{1b}[31m北京\u{1b}[0m\u{1b}]0;title\u{7}是";
    let args = ["run", TINY, "-p", prompt, "-n", "8", "--temp", "0"];
    let out = memwall(&args);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("北京是"), "{text:?}");
    assert!(!text.contains('\u{1b}') && !text.contains("[31m") && !text.contains("title"));
    // The reply follows, as --json gives it.
    let mut json = args.to_vec();
    json.push("--json");
    let v: Value = serde_json::from_str(&stdout_of(&json)).unwrap();
    assert_eq!(text, format!("北京是{}\n", v["text"].as_str().unwrap()));
}

#[test]
fn a_piped_chat_prints_its_statistics_to_standard_error() {
    let out = memwall_with_stdin(
        &["run", TINY, "--chat", "-n", "8", "--temp", "0"],
        "北京是哪个国家的首都？\n你好\n".as_bytes(),
    );
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let stats: Vec<&str> = stderr.lines().filter(|l| l.starts_with('[')).collect();
    assert_eq!(stats.len(), 2, "one line per reply: {stderr}");
    assert!(stats.iter().all(|l| l.contains("generated at")), "{stderr}");
    // stdout holds only the replies.
    assert!(
        !String::from_utf8(out.stdout)
            .unwrap()
            .contains("prompt tokens")
    );
}
