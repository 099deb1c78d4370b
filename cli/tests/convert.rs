//! `memwall convert` as a user runs it.

mod common;

use common::{memwall, stdout_of};
use sha2::{Digest, Sha256};

#[test]
fn tiny_zh_converts_to_llama_cpps_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tz.gguf");
    stdout_of(&[
        "convert",
        "fixtures/tiny-zh",
        "--pre",
        "gpt-2",
        "-o",
        out.to_str().unwrap(),
    ]);
    let ours = Sha256::digest(std::fs::read(&out).unwrap());
    let theirs = Sha256::digest(
        std::fs::read(common::repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf")).unwrap(),
    );
    assert_eq!(ours, theirs);
}

#[test]
fn missing_pre_tokenizer_and_bad_paths_fail_with_a_next_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let run = |args: &[&str]| {
        let o = memwall(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        String::from_utf8(o.stderr).unwrap()
    };
    // tiny-zh's vocabulary is its own: llama.cpp does not recognise it either.
    let err = run(&["convert", "fixtures/tiny-zh", "-o", out.to_str().unwrap()]);
    assert!(
        err.contains("not one llama.cpp recognises") && err.contains("--pre"),
        "{err}"
    );
    let err = run(&["convert", "./no-such-folder", "--pre", "smollm"]);
    assert!(err.contains("not a checkpoint folder"), "{err}");
    let err = run(&[
        "convert",
        "fixtures/tiny-zh",
        "--pre",
        "gpt-2",
        "--outtype",
        "q4_k",
    ]);
    assert!(err.contains("f32, f16, bf16 or q8_0"), "{err}");
    // A checkpoint without weights: named, and nothing written.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    std::fs::write(
        empty.join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"]}"#,
    )
    .unwrap();
    let err = run(&[
        "convert",
        empty.to_str().unwrap(),
        "--pre",
        "gpt-2",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(err.contains("no model.safetensors"), "{err}");
    assert!(!out.exists());
}

#[test]
fn repo_ids_are_found_in_the_hugging_face_cache() {
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--someorg--tiny-zh");
    let snapshot = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(
            common::repo().join("fixtures/tiny-zh").join(f),
            snapshot.join(f),
        )
        .unwrap();
    }
    let out = cache.path().join("out.gguf");
    let run = |id: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_memwall"))
            .args(["convert", id, "--pre", "gpt-2", "-o", out.to_str().unwrap()])
            .env("HF_HUB_CACHE", cache.path())
            .output()
            .unwrap()
    };
    let ok = run("someorg/tiny-zh");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // The same tensors as the committed conversion; the metadata differs only in
    // general.name (the snapshot folder's name, as llama.cpp would name it).
    let ours = memwall_format::gguf::GgufFile::open(&out).unwrap();
    let theirs = memwall_format::gguf::GgufFile::open(
        &common::repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf"),
    )
    .unwrap();
    assert_eq!(ours.tensors().len(), theirs.tensors().len());
    for (a, b) in ours.tensors().iter().zip(theirs.tensors()) {
        assert_eq!((&a.name, a.ty), (&b.name, b.ty));
        assert!(ours.tensor_data(a) == theirs.tensor_data(b), "{}", a.name);
    }
    assert_eq!(
        ours.metadata().get_str("general.name").unwrap(),
        Some("0123abcd")
    );
    let by_rev = run("someorg/tiny-zh@0123abcd");
    assert!(
        by_rev.status.success(),
        "{}",
        String::from_utf8_lossy(&by_rev.stderr)
    );
    // Not cached, downloads forbidden: the error says how to allow them.
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args([
            "convert",
            "someorg/other-model",
            "-o",
            out.to_str().unwrap(),
        ])
        .env("HF_HUB_CACHE", cache.path())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8(missing.stderr).unwrap();
    assert!(
        err.contains("not in the Hugging Face cache") && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
}

#[test]
fn write_failures_leave_nothing_behind() {
    // A file-size limit makes writes fail part way, as a full disk does (SIGXFSZ ignored,
    // so write returns EFBIG instead of killing the process).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tz.gguf");
    let bin = env!("CARGO_BIN_EXE_memwall");
    let script = format!(
        "trap '' XFSZ; ulimit -f 2048; exec '{bin}' convert fixtures/tiny-zh --pre gpt-2 -o '{}'",
        out.display()
    );
    let o = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(common::repo())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tz.gguf"), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // An output folder that does not exist: named, nothing written.
    let missing = dir.path().join("no/such/dir/x.gguf");
    let o = memwall(&[
        "convert",
        "fixtures/tiny-zh",
        "--pre",
        "gpt-2",
        "-o",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no/such/dir"));
    // The same for export.
    let script = format!(
        "trap '' XFSZ; ulimit -f 2048; exec '{bin}' export fixtures/tiny-zh/reference/tiny-zh-f16.gguf '{}'",
        dir.path().join("hf").display()
    );
    let o = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(common::repo())
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
