//! Outputs do not depend on the thread count: `convert` (rayon's pool through
//! RAYON_NUM_THREADS), `quantize` (`-t`) with an importance matrix and with a
//! recipe — 1, 2 and 8 threads give byte-identical files. (`calibrate quantize`:
//! cli/tests/calibrate_quantize.rs, the same three counts.)

mod common;

use std::path::Path;
use std::process::Command;

use common::repo;
use sha2::{Digest, Sha256};

const THREADS: [&str; 3] = ["1", "2", "8"];

fn sha(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    format!("{:x}", Sha256::digest(&bytes))
}

/// Runs `memwall ARGS` with `env` set; it must succeed.
fn run(args: &[&str], env: &[(&str, &str)]) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn convert_is_byte_identical_across_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    let reference = sha(&repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf"));
    for outtype in ["f16", "q8_0"] {
        let mut digests = Vec::new();
        for t in THREADS {
            let out = dir.path().join(format!("{outtype}-{t}.gguf"));
            run(
                &[
                    "convert",
                    "fixtures/tiny-zh",
                    "--pre",
                    "gpt-2",
                    "--outtype",
                    outtype,
                    "-o",
                    out.to_str().unwrap(),
                ],
                &[("RAYON_NUM_THREADS", t)],
            );
            digests.push(sha(&out));
        }
        assert!(
            digests.windows(2).all(|w| w[0] == w[1]),
            "{outtype}: {digests:?}"
        );
        if outtype == "f16" {
            // And it is llama.cpp's conversion.
            assert_eq!(digests[0], reference);
        }
    }
}

#[test]
fn quantize_is_byte_identical_across_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    let input = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
    let cases: [(&str, &[&str]); 3] = [
        (
            "q4km-imatrix",
            &[
                "Q4_K_M",
                "--imatrix",
                "fixtures/tiny-zh/reference/imatrix.gguf",
            ],
        ),
        ("iq4xs", &["IQ4_XS"]),
        ("recipe", &["--recipe", "attn-q8-ffn-q4-down-q6"]),
    ];
    for (name, extra) in cases {
        let mut digests = Vec::new();
        for t in THREADS {
            let out = dir.path().join(format!("{name}-{t}.gguf"));
            let mut args = vec!["quantize", input, out.to_str().unwrap()];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["-t", t]);
            run(&args, &[]);
            digests.push(sha(&out));
        }
        assert!(
            digests.windows(2).all(|w| w[0] == w[1]),
            "{name}: {digests:?}"
        );
    }
}
