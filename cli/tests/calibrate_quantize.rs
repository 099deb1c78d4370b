//! `memwall calibrate quantize`: the output is the GGUF plain quantization
//! writes (same tensor names, shapes and types) plus calibration metadata;
//! stock llama.cpp runs it (llama-perplexity's recorded perplexity of the very
//! same bytes agrees with memwall's); calibration lowers the KL divergence
//! from the F16 model below importance-weighted rounding on the same data;
//! the result does not depend on the thread count; MoE experts are
//! calibrated one by one; bad input is refused with nothing left behind.
//! Expectations: fixtures/calibrate/record.sh.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{kld_mean, repo, stdout_of};
use memwall_format::GgmlType;
use memwall_format::gguf::{Value, parse};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

const TINY: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn sha(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

/// Runs memwall in `dir` (relative paths are stored in the output's metadata).
fn memwall_in(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Tensor name → (type, shape).
type Tensors = BTreeMap<String, (GgmlType, Vec<u64>)>;

/// The tensors and the metadata of a GGUF file.
fn layout(path: &Path) -> (Tensors, BTreeMap<String, Value>) {
    let bytes = std::fs::read(path).unwrap();
    let h = parse(&bytes).unwrap();
    let tensors = h
        .tensors
        .iter()
        .map(|t| (t.name.clone(), (t.ty, t.dims.clone())))
        .collect();
    let meta = h
        .metadata
        .iter()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect();
    (tensors, meta)
}

#[test]
fn calibrated_files_keep_the_plain_layout_run_in_llama_cpp_and_lower_the_kld() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text_dir = repo().join("fixtures/perplexity");
    let recorded: Json = serde_json::from_str(
        &std::fs::read_to_string(repo().join("fixtures/calibrate/llama-imatrix.json")).unwrap(),
    )
    .unwrap();
    let tiny = repo().join(TINY);
    // The reference: plain Q4_K_M, and with an imatrix from the same windows.
    let plain = d.join("plain.gguf");
    stdout_of(&["quantize", s(&tiny), s(&plain), "Q4_K_M"]);
    let calib = [
        "-f",
        "heldout-24k.txt",
        "--samples",
        "16",
        "--seq-len",
        "128",
    ];
    let imx = d.join("imatrix.gguf");
    ok(
        memwall_in(
            &text_dir,
            &[
                "calibrate",
                "imatrix",
                "-m",
                s(&tiny),
                "-f",
                "heldout-24k.txt",
                "-c",
                "128",
                "--chunks",
                "16",
                "-o",
                s(&imx),
            ],
        ),
        "imatrix",
    );
    let weighted = d.join("weighted.gguf");
    stdout_of(&[
        "quantize",
        s(&tiny),
        s(&weighted),
        "Q4_K_M",
        "--imatrix",
        s(&imx),
    ]);
    // The F16 model's log-probabilities on 24 later windows of the text.
    let base = d.join("base.kld");
    stdout_of(&[
        "perplexity",
        "-m",
        s(&tiny),
        "-f",
        "fixtures/perplexity/heldout-24k.txt",
        "-c",
        "128",
        "--save-logits",
        s(&base),
    ]);
    let (plain_tensors, _) = layout(&plain);
    let k_weighted = kld_mean(&weighted, &base);
    let mut klds = BTreeMap::new();
    for method in ["awq", "gptq", "awq+gptq"] {
        let out = d.join(format!("{method}.gguf"));
        let mut args = vec!["calibrate", "quantize", "-m", s(&tiny), "--method", method];
        args.extend_from_slice(&calib);
        args.extend_from_slice(&["--type", "Q4_K_M", "-o", s(&out)]);
        ok(memwall_in(&text_dir, &args), method);
        let (tensors, meta) = layout(&out);
        assert_eq!(
            tensors, plain_tensors,
            "{method}: tensors differ from plain Q4_K_M"
        );
        assert_eq!(
            meta["memwall.calibration.method"],
            Value::String(method.into())
        );
        assert_eq!(meta["memwall.calibration.samples"], Value::U32(16));
        assert_eq!(meta["memwall.calibration.tokens"], Value::U64(16 * 128));
        assert!(meta.contains_key("quantize.imatrix.file"));
        // The statistics of the 28 block matrices and of the output head
        // (tiny-zh's is its own, not the embeddings), calibrated too.
        assert_eq!(meta["quantize.imatrix.entries_count"], Value::U32(29));
        // The bytes llama-perplexity ran; its perplexity agrees with memwall's.
        let r = &recorded["calibrated"][method];
        assert_eq!(sha(&out), r["sha256"].as_str().unwrap(), "{method}");
        let want = r["llama_perplexity"][0].as_f64().unwrap();
        let got: Json = serde_json::from_str(&stdout_of(&[
            "perplexity",
            "-m",
            s(&out),
            "-f",
            "fixtures/perplexity/heldout-24k.txt",
            "-c",
            "128",
            "--json",
        ]))
        .unwrap();
        let ppl = got["ppl"].as_f64().unwrap();
        assert!(
            (ppl / want - 1.0).abs() < 1e-3,
            "{method}: memwall {ppl} vs llama.cpp {want}"
        );
        klds.insert(method, kld_mean(&out, &base));
    }
    // GPTQ's error feedback beats importance-weighted rounding on the same data.
    assert!(
        klds["gptq"] < 0.9 * k_weighted,
        "{klds:?} vs weighted {k_weighted}"
    );
    assert!(
        klds["awq+gptq"] < 0.9 * k_weighted,
        "{klds:?} vs weighted {k_weighted}"
    );
}

#[test]
fn output_does_not_depend_on_the_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = repo().join(TINY);
    let text = repo().join("fixtures/perplexity/heldout-24k.txt");
    let mut digests = Vec::new();
    for threads in ["1", "2", "8"] {
        let out = dir.path().join(format!("t{threads}.gguf"));
        stdout_of(&[
            "calibrate",
            "quantize",
            "-m",
            s(&tiny),
            "-f",
            s(&text),
            "--samples",
            "4",
            "--seq-len",
            "64",
            "--type",
            "Q5_K_M",
            "-t",
            threads,
            "-o",
            s(&out),
        ]);
        digests.push(sha(&out));
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
}

/// With GPTQ, AWQ leaves alone every group GPTQ puts on a codebook (it chooses
/// those weights' points, signs and scale itself); without GPTQ it scales
/// them. tiny-zh's IQ2_XXS file has a lattice matrix in every group.
#[test]
fn awq_scales_no_group_that_gptq_puts_on_a_codebook() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = repo().join(TINY);
    let text = repo().join("fixtures/perplexity/heldout-24k.txt");
    let searched = |method: &str| -> Vec<bool> {
        let out = dir.path().join(format!("{method}.gguf"));
        let report = stdout_of(&[
            "calibrate",
            "quantize",
            "-m",
            s(&tiny),
            "-f",
            s(&text),
            "--samples",
            "4",
            "--seq-len",
            "64",
            "--type",
            "IQ2_XXS",
            "--method",
            method,
            "--json",
            "-o",
            s(&out),
        ]);
        let report: Json = serde_json::from_str(&report).unwrap();
        let groups = report["groups"].as_array().unwrap();
        assert!(!groups.is_empty(), "{method}: no groups in {report}");
        groups
            .iter()
            .map(|g| !g["awq_error_ratio"].is_null())
            .collect()
    };
    let with_gptq = searched("awq+gptq");
    assert!(with_gptq.iter().all(|&s| !s), "awq+gptq: {with_gptq:?}");
    // (Alone it searches every group it can scale: not the attention
    // output, whose V is shared by several heads here.)
    let alone = searched("awq");
    assert_eq!(alone.iter().filter(|&&s| s).count(), 12, "awq: {alone:?}");
}

/// A memory limit that leaves no room for the results kept between a
/// layer's passes makes the passes recompute them: the same bytes, and the
/// estimate says nothing is kept.
#[test]
fn results_kept_between_passes_are_dropped_under_a_tight_limit_without_changing_a_byte() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = repo().join(TINY);
    let text = repo().join("fixtures/perplexity/heldout-24k.txt");
    let run = |name: &str, limit: Option<u64>| {
        let out = dir.path().join(name);
        let mut args = vec![
            "calibrate".to_owned(),
            "quantize".into(),
            "-m".into(),
            s(&tiny).into(),
            "-f".into(),
            s(&text).into(),
            "--samples".into(),
            "8".into(),
            "--seq-len".into(),
            "128".into(),
            "--type".into(),
            "Q4_K_M".into(),
            "--json".into(),
            "-o".into(),
            s(&out).into(),
        ];
        if let Some(mib) = limit {
            args.extend(["--memory-limit".into(), mib.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let report: Json = serde_json::from_str(&stdout_of(&args)).unwrap();
        let tokens = report["tokens"].as_u64().unwrap();
        (sha(&out), report["memory"].clone(), tokens)
    };
    let (kept_sha, memory, tokens) = run("kept.gguf", None);
    let (total, kept) = (
        memory["total"].as_u64().unwrap(),
        memory["kept"].as_u64().unwrap(),
    );
    // tiny-zh: every token's attention output (width 256) and FFN middle (768), f32.
    assert_eq!(kept, tokens * (256 + 768) * 4, "{memory}");
    let limit = (total - kept).div_ceil(1 << 20);
    assert!(limit << 20 < total, "{memory}");
    let (recomputed_sha, memory, _) = run("recomputed.gguf", Some(limit));
    assert_eq!(memory["kept"], 0, "{memory}");
    assert_eq!(recomputed_sha, kept_sha);
}

#[test]
fn moe_experts_are_calibrated_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let moe = common::moe_f16(dir.path());
    let out = dir.path().join("moe-q4.gguf");
    let plain = dir.path().join("plain.gguf");
    stdout_of(&["quantize", s(&moe), s(&plain), "Q4_K_M"]);
    let report: Json = serde_json::from_str(&stdout_of(&[
        "calibrate",
        "quantize",
        "-m",
        s(&moe),
        "-f",
        "fixtures/perplexity/heldout-24k.txt",
        "--samples",
        "4",
        "--seq-len",
        "128",
        "--method",
        "gptq",
        "--type",
        "Q4_K_M",
        "-o",
        s(&out),
        "--json",
    ]))
    .unwrap();
    assert_eq!(layout(&out).0, layout(&plain).0);
    // Every layer: Q, K, V, output, and the three stacked expert tensors;
    // then the output head.
    let layers = report["layer_seconds"].as_array().unwrap().len();
    assert_eq!(
        report["calibrated"].as_u64().unwrap() as usize,
        layers * 7 + 1
    );
    // Each expert's FFN input saw only its own tokens: fewer than all.
    let groups = report["groups"].as_array().unwrap();
    assert!(
        groups
            .iter()
            .any(|g| g["input"].as_str().unwrap().ends_with("ffn_in"))
    );
    let v: Json = serde_json::from_str(&stdout_of(&[
        "perplexity",
        "-m",
        s(&out),
        "-f",
        "fixtures/perplexity/heldout-24k.txt",
        "-c",
        "128",
        "--chunks",
        "4",
        "--json",
    ]))
    .unwrap();
    assert!(v["ppl"].as_f64().unwrap().is_finite());
}

#[test]
fn bad_input_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tiny = repo().join(TINY);
    let q4 = d.join("q4.gguf");
    stdout_of(&["quantize", s(&tiny), s(&q4), "Q4_K_M"]);
    let out = d.join("out.gguf");
    let run = |args: &[&str]| {
        let r = common::memwall(args);
        assert!(!r.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&r.stderr).into_owned()
    };
    let text = "fixtures/perplexity/heldout-24k.txt";
    // An already quantized model.
    let err = run(&[
        "calibrate",
        "quantize",
        "-m",
        s(&q4),
        "-f",
        text,
        "--samples",
        "2",
        "--seq-len",
        "64",
        "--type",
        "Q4_K_M",
        "-o",
        s(&out),
    ]);
    assert!(err.contains("already quantized"), "{err}");
    // A text shorter than one window.
    let short = d.join("short.txt");
    std::fs::write(&short, "短").unwrap();
    let err = run(&[
        "calibrate",
        "quantize",
        "-m",
        s(&tiny),
        "-f",
        s(&short),
        "--type",
        "Q4_K_M",
        "-o",
        s(&out),
    ]);
    assert!(err.contains("fewer than one window"), "{err}");
    // A set built for another vocabulary.
    let set = d.join("smol.jsonl");
    stdout_of(&[
        "calibrate",
        "dataset",
        "-m",
        "fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
        "fixtures/calib-zh/webqa.jsonl",
        "-n",
        "2",
        "--seq-len",
        "32",
        "-o",
        s(&set),
    ]);
    let err = run(&[
        "calibrate",
        "quantize",
        "-m",
        s(&tiny),
        "--dataset",
        s(&set),
        "--type",
        "Q4_K_M",
        "-o",
        s(&out),
    ]);
    assert!(err.contains("vocabulary differs"), "{err}");
    // No type.
    let err = run(&[
        "calibrate",
        "quantize",
        "-m",
        s(&tiny),
        "-f",
        text,
        "-o",
        s(&out),
    ]);
    assert!(err.contains("--type"), "{err}");
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!out.exists(), "{left:?}");
    assert!(left.iter().all(|n| !n.contains("out.gguf")), "{left:?}");
}

#[test]
fn a_run_killed_after_a_finished_layer_continues_to_the_same_bytes_and_resume_refuses_other_options()
 {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tiny = repo().join(TINY);
    let text = repo().join("fixtures/perplexity/heldout-24k.txt");
    let args = |out: &Path, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "calibrate",
            "quantize",
            "-m",
            s(&tiny),
            "-f",
            s(&text),
            "--samples",
            "24",
            "--seq-len",
            "128",
            "--type",
            "Q4_K_M",
            "-o",
            s(out),
        ]
        .map(String::from)
        .to_vec();
        a.extend(extra.iter().map(|e| e.to_string()));
        a
    };
    let whole = d.join("whole.gguf");
    stdout_of(
        &args(&whole, &[])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );

    // Killed (SIGKILL: no handler runs) once the work folder records a finished layer.
    let out = d.join("out.gguf");
    let work = d.join("out.gguf.calibrating");
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args(&out, &[]))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let layers = |work: &Path| -> u64 {
        std::fs::read(work.join("state.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Json>(&b).ok())
            .and_then(|v| v["layers"].as_u64())
            .unwrap_or(0)
    };
    let started = std::time::Instant::now();
    while layers(&work) == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before it could be killed"
        );
        assert!(started.elapsed().as_secs() < 300, "no layer finished");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let done = layers(&work);
    assert!((1..4).contains(&done), "{done} layers");
    assert!(!out.exists());

    // --resume with another option than the interrupted run's is refused, named.
    let r = common::memwall(
        &args(&out, &["--resume", "--damp", "0.02"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && err.contains("gptq_damp"), "{err}");
    assert_eq!(layers(&work), done);
    // The same command again continues: the bytes of the uninterrupted run,
    // and the folder is gone.
    let report: Json = serde_json::from_str(&stdout_of(
        &args(&out, &["--json"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    ))
    .unwrap();
    assert_eq!(report["resumed_layers"].as_u64(), Some(done));
    assert_eq!(sha(&out), sha(&whole));
    assert!(!work.exists());
}
