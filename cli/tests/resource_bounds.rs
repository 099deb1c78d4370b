//! Resource bounds: hostile GGUF files (containers claiming huge counts and
//! lengths, and well-formed files whose hyper-parameters lie) are refused
//! with an error under a 96 MiB address-space limit — so no allocation sized
//! by the file's claims is ever attempted — and `run` and `perplexity` on the
//! 12.2 MiB tiny-zh stay within the bound docs/RELIABILITY.md states.

mod common;

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use common::repo;
use memwall_format::gguf::{GgufFile, GgufWriter, Metadata, TensorSpec, Value};

const TINY: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const TEXT: &str = "fixtures/perplexity/heldout-24k.txt";

/// The address-space limit every command here runs under: `perplexity` of
/// tiny-zh needs between 64 and 96 MiB of it (code, libc, thread stacks and
/// the mapped model included), so anything sized by a hostile claim fails.
const ADDRESS_SPACE: u64 = 96 << 20;

/// What a limited child did: exit code (None when a signal ended it), stderr,
/// stdout and peak resident memory.
struct Limited {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    peak_rss: u64,
}

/// Runs `memwall ARGS` with RLIMIT_AS at `limit`; GNU time measures its peak
/// RSS (the kernel's count, not the program's own report). Not wait4 here:
/// Linux carries the forking test harness's high-water mark into the child's
/// `ru_maxrss`, while GNU time's own is tiny.
fn limited(args: &[&str], limit: u64, dir: &Path) -> Limited {
    let out_path = dir.join("stdout");
    let err_path = dir.join("stderr");
    let rss_path = dir.join("rss");
    let mut cmd = Command::new("/usr/bin/time");
    cmd.arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&rss_path)
        .arg(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(repo())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap());
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = cmd
        .status()
        .expect("GNU time at /usr/bin/time (apt install time)");
    let rss = std::fs::read_to_string(&rss_path).unwrap();
    // GNU time reports a signal death as "Command terminated by signal N" and
    // exits 128+N itself; the last line is always the %M figure (KiB).
    let signal = rss
        .lines()
        .find_map(|l| l.strip_prefix("Command terminated by signal "))
        .map(|n| n.trim().parse().unwrap());
    let kib: u64 = rss.lines().last().unwrap().trim().parse().unwrap();
    Limited {
        code: if signal.is_some() {
            None
        } else {
            status.code()
        },
        signal,
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
        peak_rss: kib * 1024,
    }
}

/// Asserts a clean refusal: exit code 1, an error that names the file and
/// contains `expect`, and none of the signs of a crash.
fn refused(r: &Limited, file: &Path, expect: &str, what: &str) {
    assert_eq!(
        (r.code, r.signal),
        (Some(1), None),
        "{what}: not a clean error exit\n{}",
        r.stderr
    );
    for crash in ["panicked", "memory allocation", "Aborted", "RUST_BACKTRACE"] {
        assert!(!r.stderr.contains(crash), "{what}: {}", r.stderr);
    }
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(
        r.stderr.contains(name),
        "{what}: the error does not name {name}: {}",
        r.stderr
    );
    assert!(
        r.stderr.contains(expect),
        "{what}: expected “{expect}” in: {}",
        r.stderr
    );
}

/// Asserts a successful run within the stated bound of 40 MiB peak RSS.
fn within_bound(r: &Limited, what: &str) {
    assert_eq!(r.code, Some(0), "{what}: {}", r.stderr);
    assert!(
        r.peak_rss < 40 << 20,
        "{what}: peak RSS {} MiB",
        r.peak_rss >> 20
    );
}

/// GGUF v3 bytes by hand, for containers the writer would never produce.
struct Raw(Vec<u8>);

impl Raw {
    fn header(n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(3).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

#[test]
fn containers_claiming_huge_sizes_are_refused_without_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    cases.push((
        "tensors",
        Raw::header(1 << 40, 0).zeros(64).0.clone(),
        "tensor count 1099511627776",
    ));
    cases.push((
        "keys",
        Raw::header(0, 1 << 40).zeros(64).0.clone(),
        "1099511627776",
    ));
    let mut r = Raw::header(0, 1);
    r.str("general.name").u32(8).u64(1 << 62).zeros(64);
    cases.push(("string", r.0, "4611686018427387904"));
    let mut r = Raw::header(0, 1);
    r.str("tokenizer.ggml.tokens")
        .u32(9)
        .u32(8)
        .u64(1 << 60)
        .zeros(64);
    cases.push(("array", r.0, "1152921504606846976"));
    // One F32 tensor of 2^20 × 2^20 elements (4 TiB) at offset 0 in a
    // 100-byte file.
    let mut r = Raw::header(1, 1);
    r.str("general.architecture").u32(8).str("llama");
    r.str("token_embd.weight")
        .u32(2)
        .u64(1 << 20)
        .u64(1 << 20)
        .u32(0)
        .u64(0);
    r.zeros(64);
    cases.push(("tensor data", r.0, "past the end"));

    for (what, bytes, expect) in cases {
        let path = dir
            .path()
            .join(format!("hostile-{}.gguf", what.replace(' ', "-")));
        std::fs::write(&path, &bytes).unwrap();
        let p = path.to_str().unwrap();
        for args in [
            vec!["inspect", p],
            vec!["validate", p],
            vec!["run", "-m", p, "-p", "hi", "-n", "1"],
            vec![
                "perplexity",
                "-m",
                p,
                "-f",
                TEXT,
                "-c",
                "64",
                "--chunks",
                "1",
            ],
        ] {
            let r = limited(&args, ADDRESS_SPACE, dir.path());
            refused(&r, &path, expect, &format!("{what} / {}", args[0]));
        }
    }
}

/// tiny-zh with one metadata key replaced.
fn tiny_with(dir: &Path, key: &str, value: Value) -> std::path::PathBuf {
    let src = GgufFile::open(&repo().join(TINY)).unwrap();
    let mut meta: Metadata = src.metadata().clone();
    meta.set(key, value);
    let tensors: Vec<TensorSpec> = src.header().tensors.iter().map(TensorSpec::from).collect();
    let mut w = GgufWriter::new(Vec::new(), "t".as_ref(), 3, meta, tensors).unwrap();
    for t in &src.header().tensors {
        w.write_tensor(&t.name, src.tensor_data(t)).unwrap();
    }
    let path = dir.join(format!("tiny-{}.gguf", key.replace('.', "-")));
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    path
}

#[test]
fn lying_hyper_parameters_are_refused_without_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Value, &str)> = vec![
        ("llama.block_count", Value::U32(1_000_000), "blk.4"),
        (
            "llama.embedding_length",
            Value::U32(1 << 31),
            "embedding_length",
        ),
        ("llama.attention.head_count", Value::U32(0), "head_count"),
        (
            "llama.attention.head_count_kv",
            Value::U32(3),
            "head_count_kv",
        ),
        ("llama.rope.dimension_count", Value::U32(1 << 20), "rope"),
    ];
    for (key, value, expect) in cases {
        let path = tiny_with(dir.path(), key, value);
        let p = path.to_str().unwrap();
        for args in [
            vec!["run", "-m", p, "-p", "hi", "-n", "1"],
            vec![
                "perplexity",
                "-m",
                p,
                "-f",
                TEXT,
                "-c",
                "64",
                "--chunks",
                "1",
            ],
        ] {
            let r = limited(&args, ADDRESS_SPACE, dir.path());
            refused(&r, &path, expect, &format!("{key} / {}", args[0]));
        }
    }
}

/// Hyper-parameters the forward pass takes from the tensors' shapes, not the
/// metadata: a lying `feed_forward_length` or `vocab_size` changes nothing.
#[test]
fn unused_hyper_parameters_do_not_drive_allocation() {
    let dir = tempfile::tempdir().unwrap();
    for key in ["llama.feed_forward_length", "llama.vocab_size"] {
        let path = tiny_with(dir.path(), key, Value::U32(1 << 31));
        let p = path.to_str().unwrap();
        let r = limited(
            &["run", "-m", p, "-p", "hi", "-n", "1"],
            ADDRESS_SPACE,
            dir.path(),
        );
        within_bound(&r, key);
    }
}

/// A file claiming a context of 2^32 tokens: the default context stays
/// capped at 4096, and asking for 10^9 tokens of it only loses the up-front
/// KV reservation (refused by the system, so the cache grows with the tokens
/// actually held): both run within the limit.
#[test]
fn a_huge_context_is_capped_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_with(dir.path(), "llama.context_length", Value::U32(u32::MAX));
    let p = path.to_str().unwrap();
    let r = limited(
        &["run", "-m", p, "-p", "hi", "-n", "1"],
        ADDRESS_SPACE,
        dir.path(),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = limited(
        &["run", "-m", p, "-c", "1000000000", "-p", "hi", "-n", "1"],
        ADDRESS_SPACE,
        dir.path(),
    );
    within_bound(&r, "-c 10^9");
}

/// The bound docs/RELIABILITY.md states: `run` and `perplexity` of tiny-zh
/// (12.2 MiB of F16 weights; mapped, and read with `--no-mmap`) complete
/// within 96 MiB of address space and 40 MiB of peak RSS.
#[test]
fn run_and_perplexity_of_tiny_zh_stay_within_the_stated_bound() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec![
            "run", "-m", TINY, "-p", "你好", "-n", "16", "-c", "256", "--json",
        ],
        vec![
            "perplexity",
            "-m",
            TINY,
            "-f",
            TEXT,
            "-c",
            "128",
            "--chunks",
            "4",
            "--json",
        ],
        vec![
            "run",
            "-m",
            TINY,
            "--no-mmap",
            "-p",
            "你好",
            "-n",
            "16",
            "-c",
            "256",
            "--json",
        ],
    ] {
        let r = limited(&args, ADDRESS_SPACE, dir.path());
        within_bound(&r, &format!("{args:?}"));
        assert!(r.stdout.contains('{'), "{args:?}: no JSON");
    }
}
