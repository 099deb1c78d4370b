//! Errors a user meets in the first ten minutes say what was given, what is
//! wrong and what to do, exit non-zero, leave nothing at the output path and
//! come before any long work: names with a near miss ("did you mean …?"),
//! types memwall cannot write yet, arguments in the wrong order, outputs in
//! folders that do not exist (refused by every command alike), a checkpoint
//! folder where a GGUF file is wanted, and options that need another.

mod common;

use std::path::{Path, PathBuf};

use common::{error_of, memwall, stdout_of, usage_error};

const TINY: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const TEXT: &str = "fixtures/perplexity/heldout-24k.txt";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn names_with_a_near_miss_get_did_you_mean() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    for (args, want) in [
        (
            vec!["quantize", TINY, s(&out), "Q4KM"],
            "(did you mean Q4_K_M?)",
        ),
        (
            vec!["quantize", TINY, s(&out), "Q4_K_MM"],
            "(did you mean Q4_K_M?)",
        ),
        (
            vec![
                "quantize",
                TINY,
                s(&out),
                "Q8_0",
                "--tensor-type",
                "attn_v=q80",
            ],
            "(did you mean Q8_0?)",
        ),
        (
            vec!["quantize", TINY, s(&out), "--recipe", "attn-f16-ffn-4"],
            "(did you mean attn-f16-ffn-q4?)",
        ),
        (
            vec!["plan", TINY, "-d", "phone-16g"],
            "(did you mean phone-16gb?)",
        ),
        (
            vec![
                "compare",
                TINY,
                "-f",
                TEXT,
                "--types",
                "Q5KM",
                "-o",
                s(&dir.path().join("r")),
            ],
            "(did you mean Q5_K_M?)",
        ),
        (
            vec![
                "convert",
                "fixtures/tiny-zh",
                "--pre",
                "gpt2",
                "-o",
                s(&out),
            ],
            "(did you mean gpt-2?)",
        ),
        (
            vec![
                "calibrate",
                "quantize",
                "-m",
                TINY,
                "-f",
                TEXT,
                "--type",
                "Q4KS",
                "-o",
                s(&out),
            ],
            "(did you mean Q4_K_S?)",
        ),
    ] {
        let err = error_of(&args);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
    // An architecture: a checkpoint whose config.json names a class with a typo.
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    let config = std::fs::read_to_string(common::repo().join("fixtures/tiny-zh/config.json"))
        .unwrap()
        .replace("LlamaForCausalLM", "LLamaForCausalLM");
    std::fs::write(ckpt.join("config.json"), config).unwrap();
    let err = error_of(&["plan", s(&ckpt)]);
    assert!(err.contains("(did you mean LlamaForCausalLM?)"), "{err}");
    for name in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(
            common::repo().join("fixtures/tiny-zh").join(name),
            ckpt.join(name),
        )
        .unwrap();
    }
    let err = error_of(&["convert", s(&ckpt), "--pre", "gpt-2", "-o", s(&out)]);
    assert!(err.contains("(did you mean LlamaForCausalLM?)"), "{err}");
    assert!(!out.exists());
}

#[test]
fn the_valid_list_shows_every_file_type_memwall_writes() {
    let err = error_of(&["quantize", TINY, "/tmp/never.gguf", "Q4KM"]);
    let writes = err.split_once("memwall writes").unwrap().1;
    assert!(!err.contains("planned"), "{err}");
    let writable = [
        "Q4_K_M",
        "Q6_K",
        "IQ4_XS",
        "Q2_K_S",
        "BF16",
        "TQ1_0",
        "MXFP4_MOE",
        "Q1_0",
        "Q2_0",
    ];
    for t in writable {
        assert!(writes.contains(t), "{t}: {err}");
    }
    for t in [
        "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S",
        "IQ3_M",
    ] {
        assert!(writes.contains(t), "{t}: {err}");
    }
    // As in llama-quantize, NVFP4 is a tensor type, no file type.
    assert!(!writes.contains("NVFP4"), "{err}");
}

#[test]
fn nvfp4_is_a_tensor_type_and_no_file_type_as_in_llama_quantize() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    for dry_run in [false, true] {
        let mut args = vec!["quantize", TINY, s(&out), "NVFP4"];
        if dry_run {
            args.push("--dry-run");
        }
        let err = error_of(&args);
        assert!(err.contains("no NVFP4 file type"), "{err}");
        assert!(err.contains("--tensor-type ffn=nvfp4"), "{err}");
        // Before the model is read.
        assert!(!err.contains("blk."), "{err}");
        assert!(!out.exists());
    }
    let err = error_of(&[
        "calibrate",
        "quantize",
        "-m",
        TINY,
        "-f",
        TEXT,
        "--type",
        "NVFP4",
        "-o",
        s(&out),
    ]);
    assert!(err.contains("no NVFP4 file type"), "{err}");
    let err = error_of(&[
        "quantize",
        TINY,
        s(&out),
        "Q8_0",
        "--output-tensor-type",
        "q8_k",
    ]);
    assert!(err.contains("cannot encode Q8_K yet"), "{err}");
    assert!(!out.exists());
    // The tensor type is written where it is asked for.
    let plan = stdout_of(&[
        "quantize",
        TINY,
        s(&out),
        "Q8_0",
        "--tensor-type",
        "ffn=nvfp4",
        "--dry-run",
    ]);
    assert!(plan.contains("nvfp4"), "{plan}");
}

#[test]
fn q2_k_s_without_an_importance_matrix_is_one_error_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    let err = error_of(&["quantize", TINY, s(&out), "Q2_K_S"]);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("Q2_K_S needs an importance matrix: pass --imatrix"),
        "{err}"
    );
    assert!(err.contains("memwall calibrate imatrix"), "{err}");
    assert!(!out.exists());
    for t in [
        "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS",
    ] {
        let err = error_of(&["quantize", TINY, s(&out), t]);
        assert!(
            err.contains(&format!("{t} needs an importance matrix: pass --imatrix")),
            "{err}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn arguments_in_the_wrong_order_point_at_the_order() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    let err = error_of(&["quantize", TINY, "Q4_K_M", s(&out)]);
    assert!(err.contains("the output comes before the type"), "{err}");
    assert!(
        err.contains(&format!("memwall quantize {TINY} {} Q4_K_M", s(&out))),
        "{err}"
    );
    let err = error_of(&["quantize", TINY, s(&out)]);
    assert!(err.contains("missing TYPE after the output"), "{err}");
    assert!(!out.exists());
}

/// Every command that writes, with its output in a folder that does not exist.
fn writers(missing: &Path, q4: &Path) -> Vec<(Vec<String>, PathBuf)> {
    let m = |name: &str| missing.join(name);
    let line = |args: &[&str], out: PathBuf| {
        let mut v: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        v.push(out.display().to_string());
        (v, out)
    };
    vec![
        line(
            &[
                "quantize",
                TINY,
                "Q8_0",
                "--tensor-type",
                "attn_v=q8_0",
                "-t",
                "1",
                "--",
            ],
            m("q.gguf"),
        ),
        line(
            &["convert", "fixtures/tiny-zh", "--pre", "gpt-2", "-o"],
            m("c.gguf"),
        ),
        line(&["export", TINY], m("hf")),
        line(
            &["perplexity", "-m", TINY, "-f", TEXT, "--save-logits"],
            m("f16.kld"),
        ),
        line(
            &["plan", TINY, "--budget", "100", "--write-recipe"],
            m("fit.toml"),
        ),
        line(&["plan", "--measure-host", "--save"], m("me.toml")),
        line(
            &[
                "calibrate",
                "dataset",
                "-m",
                TINY,
                "fixtures/calib-zh/cmrc.jsonl",
                "-o",
            ],
            m("set.jsonl"),
        ),
        line(
            &["calibrate", "imatrix", "-m", TINY, "-f", TEXT, "-o"],
            m("imatrix.gguf"),
        ),
        line(
            &[
                "calibrate",
                "quantize",
                "-m",
                TINY,
                "-f",
                TEXT,
                "--type",
                "Q4_K_M",
                "-o",
            ],
            m("cal.gguf"),
        ),
        line(
            &["compare", TINY, s(q4), "--types", "none", "-f", TEXT, "-o"],
            m("report"),
        ),
        line(&["compare", TINY, "-f", TEXT, "--cache"], m("cache")),
        line(&["demo", "-o"], m("demo")),
    ]
}

#[test]
fn outputs_in_folders_that_do_not_exist_are_refused_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let q4 = dir.path().join("q4.gguf");
    stdout_of(&["quantize", TINY, s(&q4), "Q4_K_M"]);
    let missing = dir.path().join("no/such/folder");
    for (mut args, out) in writers(&missing, &q4) {
        // quantize's output goes before its type.
        if args[0] == "quantize" {
            let out = args.pop().unwrap();
            args.retain(|a| a != "--");
            args.insert(2, out);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = std::time::Instant::now();
        let err = error_of(&args);
        // The path the user gave, what is wrong, what to do.
        assert!(err.contains(s(&out)), "{args:?}: {err}");
        assert!(err.contains("does not exist"), "{args:?}: {err}");
        assert!(
            err.contains(&format!("mkdir -p {}", missing.display())),
            "{args:?}: {err}"
        );
        assert!(!err.contains(".partial"), "{args:?}: {err}");
        // Before the work (the demo and compare take seconds, measuring the host too).
        assert!(started.elapsed().as_secs() < 5, "{args:?} worked first");
        assert!(!dir.path().join("no").exists(), "{args:?} created folders");
    }
    // An output that names a folder is refused too.
    let err = error_of(&["quantize", TINY, s(dir.path()), "Q8_0"]);
    assert!(err.contains("is a folder; name a file"), "{err}");
    // The folder an output folder goes in exists: the output folder is made.
    let report = dir.path().join("report");
    stdout_of(&[
        "compare",
        TINY,
        s(&q4),
        "--types",
        "none",
        "-f",
        TEXT,
        "-c",
        "64",
        "--chunks",
        "1",
        "-o",
        s(&report),
    ]);
    assert!(report.join("compare.md").is_file());
}

#[test]
fn a_checkpoint_folder_where_a_gguf_is_wanted_points_at_convert() {
    for args in [
        vec!["inspect", "fixtures/tiny-zh"],
        vec!["run", "fixtures/tiny-zh", "-p", "x"],
        vec!["quantize", "fixtures/tiny-zh", "Q4_K_M", "--dry-run"],
        vec!["validate", "fixtures/tiny-zh"],
    ] {
        let err = error_of(&args);
        assert!(
            err.contains(
                "fixtures/tiny-zh: this is a Hugging Face checkpoint folder, not a GGUF file"
            ),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("memwall convert fixtures/tiny-zh"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("os error"), "{args:?}: {err}");
    }
    let err = error_of(&["inspect", "fixtures"]);
    assert!(
        err.contains("fixtures: this is a folder; give a .gguf file"),
        "{err}"
    );
    // And a GGUF where a checkpoint is wanted.
    let err = error_of(&["convert", TINY]);
    assert!(err.contains("already GGUF"), "{err}");
}

#[test]
fn options_that_need_another_say_so() {
    // validate -f without --reference was ignored (exit 0).
    let err = usage_error(&["validate", TINY, "-f", TEXT]);
    assert!(err.contains("--reference"), "{err}");
    // compare takes a calibration set instead of text: -f is not required as such.
    let err = error_of(&["compare", TINY]);
    assert!(
        err.contains("-f TEXT") && err.contains("--dataset SET"),
        "{err}"
    );
    let out = memwall(&["compare", "--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(
        help.contains("Usage: memwall compare [OPTIONS] [BASE.gguf] [FILES]..."),
        "{help}"
    );
    // run --system is chat mode's.
    let err = error_of(&["run", TINY, "-p", "x", "--system", "be brief"]);
    assert!(err.contains("add --chat"), "{err}");
}
