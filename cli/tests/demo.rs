//! `memwall demo`: the whole workflow on the built-in tiny-zh, as CI runs it.
//! Checks what it prints (every step's command), what it writes (the GGUF
//! files, the calibration set, the comparison and its chart) and that the
//! numbers make sense (calibration helps, more bits lose less), and that it
//! warns about nothing it chose itself.

mod common;

use common::memwall;
use serde_json::Value;

#[test]
fn the_demo_runs_every_step_and_writes_what_it_says() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let out = memwall(&["demo", "-o", dir.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every step announces itself and the command it runs.
    for k in 1..=10 {
        assert!(
            stdout.contains(&format!("── step {k}/10: ")),
            "step {k}\n{stdout}"
        );
    }
    for command in [
        "$ memwall convert ",
        "$ memwall quantize ",
        "--recipe attn-f16-ffn-q4",
        "$ memwall calibrate dataset ",
        "$ memwall calibrate quantize ",
        "--method awq+gptq",
        "$ memwall compare ",
        "$ memwall plan ",
        "$ memwall run ",
    ] {
        assert!(stdout.contains(command), "{command}\n{stdout}");
    }
    assert!(
        stdout.contains(&format!("Everything is in {}", dir.display())),
        "{stdout}"
    );
    // The plan recommends a choice and the commands to run it, with the
    // demo's real path (the file exists: it is the F16 as it is).
    assert!(
        stdout.contains("Recommended: ") && stdout.contains("llama-cli -m "),
        "{stdout}"
    );
    let f16 = dir.join("tiny-zh-f16.gguf");
    assert!(
        stdout.contains(&format!("  memwall run -m {} --chat", f16.display())),
        "{stdout}"
    );
    // The demo does not warn about choices it made itself (it passed --chat
    // to calibrate dataset, whose chat rows asked for it).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("warning"), "{stderr}");
    // A Chinese reply: the chat step prints CJK text.
    let chat = &stdout[stdout.find("step 10/10").unwrap()..];
    assert!(
        chat.chars()
            .any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c) && !"请介绍一下北京".contains(c)),
        "{chat}"
    );

    for f in [
        "tiny-zh-f16.gguf",
        "tiny-zh-Q4_K_M.gguf",
        "tiny-zh-Q5_K_M.gguf",
        "tiny-zh-Q6_K.gguf",
        "tiny-zh-attn-f16-ffn-q4.gguf",
        "tiny-zh-Q4_K_M-awq-gptq.gguf",
        "calib-zh.jsonl",
        "compare/compare.md",
        "compare/quality-vs-size.svg",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    // The converted model is llama.cpp's conversion, byte for byte.
    let converted = std::fs::read(dir.join("tiny-zh-f16.gguf")).unwrap();
    let reference =
        std::fs::read(common::repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    assert!(
        converted == reference,
        "the demo's conversion differs from llama.cpp's"
    );

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("compare/compare.json")).unwrap())
            .unwrap();
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), 6, "five quantizations and the base");
    let kld = |name: &str| {
        files.iter().find(|f| f["file"] == name).unwrap()["kld"]["mean"]
            .as_f64()
            .unwrap()
    };
    let (q4, cal, q5, q6) = (
        kld("tiny-zh-Q4_K_M.gguf"),
        kld("tiny-zh-Q4_K_M-awq-gptq.gguf"),
        kld("tiny-zh-Q5_K_M.gguf"),
        kld("tiny-zh-Q6_K.gguf"),
    );
    assert!(cal < 0.8 * q4, "calibrated {cal} vs plain {q4}");
    assert!(q6 < q5 && q5 < q4, "{q6} {q5} {q4}");
    // No temporary files are left behind.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.ends_with(".partial") && !name.ends_with(".calibrating"),
            "{name}"
        );
    }

    // A second demo into the same folder is refused, nothing touched.
    let again = memwall(&["demo", "-o", dir.to_str().unwrap()]);
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("not empty") && err.contains("-o"), "{err}");
}
