//! Fault injection for every command that writes: an output folder that
//! cannot be written, a full disk (RLIMIT_FSIZE), SIGKILL part way through a
//! write, an input file truncated while it is mapped (SIGBUS), and Ctrl-C or
//! SIGTERM. After each: exit status 1 (or 130/143 for the signals) with a
//! message that names the file; nothing at the output path, or the previous
//! file there intact; no temporaries left, at the latest after the next
//! successful run. An interrupted `memwall push` is tested in push.rs.
//!
//! Timing never decides an assertion: a fault that came too late (the command
//! had finished) is retried, and every outcome is checked either way.
// Linux only: /proc, prctl and capabilities; the code under test is portable.
#![cfg(target_os = "linux")]
// `--nocapture` shows where each fault landed and what memwall said.
#![allow(clippy::print_stderr)]

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::repo;

const TINY: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const TEXT: &str = "fixtures/perplexity/heldout-24k.txt";

/// A command that writes: its arguments for an input and an output path.
struct Writer {
    name: &'static str,
    /// The input it maps (a GGUF file, or a checkpoint folder for convert).
    input: &'static str,
    args: fn(input: &str, out: &str) -> Vec<String>,
    /// The output is a folder (export, compare).
    folder: bool,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

const CONVERT: Writer = Writer {
    name: "convert",
    input: "fixtures/tiny-zh",
    args: |input, out| strings(&["convert", input, "--pre", "gpt-2", "-o", out]),
    folder: false,
};

const QUANTIZE: Writer = Writer {
    name: "quantize",
    input: TINY,
    args: |input, out| strings(&["quantize", input, out, "Q8_0"]),
    folder: false,
};

const EXPORT: Writer = Writer {
    name: "export",
    input: TINY,
    args: |input, out| strings(&["export", input, out]),
    folder: true,
};

const DATASET: Writer = Writer {
    name: "calibrate dataset",
    input: TINY,
    args: |input, out| {
        strings(&[
            "calibrate",
            "dataset",
            "-m",
            input,
            "fixtures/calib-zh/webqa.jsonl",
            "-n",
            "6",
            "--seq-len",
            "96",
            "-o",
            out,
        ])
    },
    folder: false,
};

const IMATRIX: Writer = Writer {
    name: "calibrate imatrix",
    input: TINY,
    args: |input, out| {
        strings(&[
            "calibrate",
            "imatrix",
            "-m",
            input,
            "-f",
            TEXT,
            "-c",
            "128",
            "--chunks",
            "4",
            "-o",
            out,
        ])
    },
    folder: false,
};

const CALIBRATED: Writer = Writer {
    name: "calibrate quantize",
    input: TINY,
    args: |input, out| {
        strings(&[
            "calibrate",
            "quantize",
            "-m",
            input,
            "-f",
            TEXT,
            "--samples",
            "2",
            "--seq-len",
            "32",
            "--method",
            "gptq",
            "--type",
            "Q4_K_M",
            "-o",
            out,
        ])
    },
    folder: false,
};

const PERPLEXITY: Writer = Writer {
    name: "perplexity --save-logits",
    input: TINY,
    args: |input, out| {
        strings(&[
            "perplexity",
            "-m",
            input,
            "-f",
            TEXT,
            "-c",
            "128",
            "--chunks",
            "4",
            "--save-logits",
            out,
        ])
    },
    folder: false,
};

const PLAN: Writer = Writer {
    name: "plan --write-recipe",
    input: TINY,
    args: |input, out| strings(&["plan", input, "--budget", "9000", "--write-recipe", out]),
    folder: false,
};

/// `-o OUT --cache OUT-cache`: both folders next to each other.
const COMPARE: Writer = Writer {
    name: "compare",
    input: TINY,
    args: |input, out| {
        strings(&[
            "compare",
            input,
            "--types",
            "Q8_0",
            "-f",
            TEXT,
            "-c",
            "128",
            "--chunks",
            "2",
            "-o",
            out,
            "--cache",
            &format!("{out}-cache"),
        ])
    },
    folder: true,
};

// ---------------------------------------------------------------------------
// Running memwall

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// What the child changes about itself before it runs memwall.
#[derive(Clone, Copy)]
enum Setup {
    Nothing,
    /// A file-size limit (RLIMIT_FSIZE) of this many bytes: writes past it
    /// fail with EFBIG (memwall ignores SIGXFSZ, whose default action would
    /// kill it), as on a full disk.
    FileSizeLimit(u64),
    /// Subject root to file permissions; see [`without_dac_override`].
    NoDacOverride,
}

/// `memwall ARGS` in the repository root, after `setup` in the child. Ctrl-C
/// and SIGTERM are reset to their default first, so memwall installs its
/// handlers even when the tests run in the background.
fn command(args: &[String], setup: Setup) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memwall"));
    c.args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure only makes async-signal-safe system calls
    // (signal, setrlimit, prctl), as required between fork and exec.
    unsafe {
        c.pre_exec(move || {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            match setup {
                Setup::Nothing => Ok(()),
                Setup::FileSizeLimit(bytes) => limit_file_size(bytes),
                Setup::NoDacOverride => without_dac_override(),
            }
        });
    }
    c
}

/// How a run ended.
struct Ended {
    status: ExitStatus,
    stderr: String,
}

impl Ended {
    fn describe(&self) -> String {
        format!("{:?}, stderr:\n{}", self.status, self.stderr)
    }
}

fn finish(mut child: Child) -> Ended {
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    // Stdout is small (a report); read it so that the child never blocks on it.
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    Ended {
        status: child.wait().unwrap(),
        stderr,
    }
}

fn run(args: &[String], setup: Setup) -> Ended {
    finish(command(args, setup).spawn().unwrap())
}

fn run_ok(args: &[String]) {
    let e = run(args, Setup::Nothing);
    assert!(e.status.success(), "{args:?}: {}", e.describe());
}

fn limit_file_size(bytes: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit reads the struct and changes only this process.
    if unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// As root, permissions do not stop writes (CAP_DAC_OVERRIDE): drop that
/// capability from the bounding set, so the exec'd memwall runs without it.
fn without_dac_override() -> std::io::Result<()> {
    // SAFETY: geteuid and prctl have no memory-safety preconditions.
    unsafe {
        if libc::geteuid() == 0 {
            // CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (linux/capability.h).
            for cap in [1, 2] {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
    }
    Ok(())
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions; the child is not yet
    // reaped, so its pid is still its own.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
}

/// Polls `condition` as fast as possible until it holds (true) or the child
/// has exited (false). A generous timeout turns a hang into a failure.
fn wait_until(child: &mut Child, mut condition: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "timed out waiting for the child"
        );
        std::thread::yield_now();
    }
}

// ---------------------------------------------------------------------------
// Looking at what is left

/// Every file under `dir` (relative path → contents), folders as empty entries.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let path = e.unwrap().path();
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                out.insert(format!("{name}/"), Vec::new());
                walk(root, &path, out);
            } else {
                out.insert(name, std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn names(t: &BTreeMap<String, Vec<u8>>) -> Vec<&str> {
    t.keys().map(String::as_str).collect()
}

/// Temporaries: `.partial` files and folders, calibration scratch, compare's
/// base log-probabilities, the PNG chart's scratch.
fn temporaries(t: &BTreeMap<String, Vec<u8>>) -> Vec<&str> {
    names(t)
        .into_iter()
        .filter(|n| n.contains(".partial") || n.contains(".calibrating") || n.ends_with(".logits"))
        .collect()
}

/// Files whose bytes do not depend on the run (compare's report holds timings).
fn stable(name: &str) -> bool {
    !(name.ends_with("compare.json")
        || name.ends_with("compare.md")
        || name.ends_with(".svg")
        || name.ends_with(".png")
        || name.ends_with(".gguf.json"))
}

/// The output path of `w` in `dir`.
fn output(w: &Writer, dir: &Path) -> PathBuf {
    dir.join(if w.folder { "out" } else { "out.bin" })
}

fn assert_clean_failure(w: &Writer, e: &Ended, dir: &Path, expect: &[&str]) {
    eprintln!("{}: {}", w.name, e.stderr.trim_end());
    assert_eq!(e.status.code(), Some(1), "{}: {}", w.name, e.describe());
    let first = e.stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("memwall: error: ") && first.contains(s(dir)),
        "{}: the message should name the file: {}",
        w.name,
        e.stderr
    );
    assert!(!e.stderr.contains("panicked"), "{}: {}", w.name, e.stderr);
    for text in expect {
        assert!(
            e.stderr.contains(text),
            "{}: {text:?} in {}",
            w.name,
            e.stderr
        );
    }
}

// ---------------------------------------------------------------------------
// The faults

/// The output folder is read-only (and, as a second case, a file), then the
/// disk fills up half way through the largest file: exit 1 naming the file,
/// and nothing left.
fn unwritable_and_full(w: &Writer, largest: u64, complete: &dyn Fn(&str, &[u8]) -> bool) {
    let dir = tempfile::tempdir().unwrap();
    // A parent that is a regular file: fails for root too.
    let file = dir.path().join("not-a-folder");
    std::fs::write(&file, b"x").unwrap();
    let out = output(w, &file);
    let e = run(&(w.args)(w.input, s(&out)), Setup::Nothing);
    assert_clean_failure(w, &e, &file, &["a folder in the path is a file"]);
    assert_eq!(names(&tree(dir.path())), ["not-a-folder"]);

    // A read-only folder (root is made subject to it by dropping CAP_DAC_OVERRIDE).
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    set_mode(&ro, 0o555);
    if read_only_is_enforced(&ro) {
        let out = output(w, &ro);
        let e = run(&(w.args)(w.input, s(&out)), Setup::NoDacOverride);
        assert_clean_failure(w, &e, &ro, &["ermission denied"]);
        assert!(tree(&ro).is_empty(), "{}: {:?}", w.name, names(&tree(&ro)));
    } else {
        eprintln!(
            "{}: read-only folders are not enforced here; case skipped",
            w.name
        );
    }
    set_mode(&ro, 0o755);

    // Disk full: a file-size limit at half the largest output file.
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let out = output(w, &full);
    let e = run(
        &(w.args)(w.input, s(&out)),
        Setup::FileSizeLimit(largest / 2),
    );
    assert_clean_failure(w, &e, &full, &["file-size limit was reached"]);
    let left = tree(&full);
    // compare and demo make their folders before they write.
    assert!(
        left.iter().all(|(k, v)| k.ends_with('/') || complete(k, v)),
        "{}: left behind {:?}",
        w.name,
        names(&left)
    );
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Whether a child set up like memwall fails to create a file in `dir`.
fn read_only_is_enforced(dir: &Path) -> bool {
    let probe = dir.join("probe");
    let mut c = Command::new("touch");
    c.arg(&probe).stderr(Stdio::null());
    // SAFETY: as in `command`.
    unsafe { c.pre_exec(without_dac_override) };
    let status = c.status();
    let _ = std::fs::remove_file(&probe);
    matches!(status, Ok(s) if !s.success())
}

/// Makes the reference output in a fresh folder; returns the folder, its
/// contents and the size of its largest file.
fn reference(w: &Writer) -> (tempfile::TempDir, BTreeMap<String, Vec<u8>>, u64) {
    let dir = tempfile::tempdir().unwrap();
    run_ok(&(w.args)(w.input, s(&output(w, dir.path()))));
    let t = tree(dir.path());
    assert!(temporaries(&t).is_empty(), "{}: {:?}", w.name, names(&t));
    let largest = t.values().map(|v| v.len() as u64).max().unwrap_or(0);
    (dir, t, largest)
}

/// Where to stop a run: a name and a condition on the output folder.
type Point = (&'static str, Box<dyn Fn(&Path) -> bool>);

/// Temporaries of `w` worth killing at: one appears, one has data, one is half written.
fn kill_points(w: &Writer, largest: u64) -> Vec<Point> {
    let any = |pred: fn(&str, u64, u64) -> bool| -> Box<dyn Fn(&Path) -> bool> {
        Box::new(move |dir: &Path| {
            tree(dir).iter().any(|(n, v)| {
                (n.contains(".partial") || n.contains(".calibrating") || n.ends_with(".logits"))
                    && pred(n, v.len() as u64, largest)
            })
        })
    };
    let mut points: Vec<Point> = vec![
        ("a temporary appears", any(|_, _, _| true)),
        ("a temporary holds data", any(|_, n, _| n > 0)),
    ];
    // compare's largest file is its cached quantization, made once (by the reference run).
    if w.name != "compare" && w.name != "calibrate quantize" {
        points.push((
            "a temporary is half written",
            any(|_, n, largest| n >= largest / 2),
        ));
    }
    if w.name == "calibrate quantize" {
        points.push((
            "the output is being written after calibration",
            Box::new(|dir: &Path| dir.join("out.bin.partial").exists()),
        ));
    }
    points
}

/// SIGKILL at each point, several times: the output path holds the previous
/// file (or nothing, for a folder), or the complete new one if the command
/// won the race; the next run succeeds and leaves exactly the reference.
fn killed_mid_write(w: &Writer, dir: &Path, want: &BTreeMap<String, Vec<u8>>, largest: u64) {
    let out = output(w, dir);
    let args = (w.args)(w.input, s(&out));
    let previous = b"the previous output\n";
    let mut landed = Vec::new();
    for (name, point) in kill_points(w, largest) {
        for _attempt in 0..12 {
            // What an earlier kill left would satisfy the point at once; the
            // rerun at the end checks that the last kill's leftovers go away.
            for t in temporaries(&tree(dir)) {
                let p = dir.join(t.trim_end_matches('/'));
                let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
            }
            if w.folder {
                if w.name == "export" {
                    let _ = std::fs::remove_dir_all(&out);
                }
            } else {
                std::fs::write(&out, previous).unwrap();
            }
            let mut child = command(&args, Setup::Nothing).spawn().unwrap();
            let reached = wait_until(&mut child, || point(dir));
            if reached {
                signal(&child, libc::SIGKILL);
            }
            let e = finish(child);
            let killed = e.status.signal() == Some(libc::SIGKILL);
            assert!(killed || e.status.success(), "{}: {}", w.name, e.describe());
            // The output path: previous, absent or complete — never a torn file.
            let now = tree(dir);
            for (n, v) in &now {
                if temporaries(&now).contains(&n.as_str()) || !stable(n) || n.ends_with('/') {
                    continue;
                }
                let fine = want.get(n) == Some(v) || (n == "out.bin" && v == previous);
                assert!(
                    fine,
                    "{} killed at {name:?}: {n} is torn ({} bytes)",
                    w.name,
                    v.len()
                );
            }
            if killed {
                landed.push((name, _attempt + 1, names(&now).join(" ")));
                break;
            }
        }
    }
    eprintln!("{}: SIGKILL landed at {landed:?}", w.name);
    assert!(
        !landed.is_empty(),
        "{}: no SIGKILL landed mid-write",
        w.name
    );
    // The next run cleans up: exactly the reference is left.
    if w.name == "export" {
        let _ = std::fs::remove_dir_all(&out);
    }
    run_ok(&args);
    let now = tree(dir);
    assert_eq!(names(&now), names(want), "{}: left behind", w.name);
    for (n, v) in &now {
        if stable(n) {
            assert!(want[n] == *v, "{}: {n} differs after the rerun", w.name);
        }
    }
}

/// All faults for one writer.
fn check(w: &Writer) {
    let started = Instant::now();
    let (dir, want, largest) = reference(w);
    // A calibration that fails after finished layers keeps them in its work
    // folder (the same command continues from there); nothing else stays.
    let kept = |n: &str, _: &[u8]| w.name == "calibrate quantize" && n.contains(".calibrating/");
    unwritable_and_full(w, largest, &kept);
    killed_mid_write(w, dir.path(), &want, largest);
    eprintln!("{}: {:.1} s", w.name, started.elapsed().as_secs_f64());
}

#[test]
fn convert_faults() {
    check(&CONVERT);
}

#[test]
fn quantize_faults() {
    check(&QUANTIZE);
}

#[test]
fn export_faults() {
    check(&EXPORT);
}

#[test]
fn calibrate_dataset_faults() {
    check(&DATASET);
}

#[test]
fn calibrate_imatrix_faults() {
    check(&IMATRIX);
}

#[test]
fn calibrate_quantize_faults() {
    check(&CALIBRATED);
}

#[test]
fn perplexity_save_logits_faults() {
    check(&PERPLEXITY);
}

#[test]
fn plan_write_recipe_faults() {
    check(&PLAN);
}

#[test]
fn compare_faults() {
    check(&COMPARE);
}

#[test]
fn demo_refuses_unwritable_folders_and_a_full_disk() {
    // The demo's steps are the commands above; here only its own writes (the
    // unpacked inputs) fail: a minute-long run is not repeated.
    let demo = Writer {
        name: "demo",
        input: "",
        args: |_, out| strings(&["demo", "-o", out, "-t", "1"]),
        folder: true,
    };
    // Inputs unpacked before the disk filled up are whole copies.
    let whole = |name: &str, bytes: &[u8]| {
        let file = Path::new(name).file_name().unwrap();
        ["fixtures/tiny-zh", "fixtures/calib-zh"]
            .iter()
            .any(|d| std::fs::read(repo().join(d).join(file)).is_ok_and(|b| b == bytes))
    };
    // Its first file is tiny-zh's config.json (772 bytes).
    unwritable_and_full(&demo, 700, &whole);
}

// ---------------------------------------------------------------------------
// Inputs that shrink under the reader, and Ctrl-C

/// A private copy of `w`'s input in `dir`; returns (path to give, file that is mapped).
fn copy_input(w: &Writer, dir: &Path) -> (PathBuf, PathBuf) {
    let src = repo().join(w.input);
    if src.is_dir() {
        let to = dir.join("ckpt");
        std::fs::create_dir(&to).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
            }
        }
        let mapped = to.join("model.safetensors");
        (to, mapped)
    } else {
        let to = dir.join("in.gguf");
        std::fs::copy(&src, &to).unwrap();
        (to.clone(), to)
    }
}

/// Whether process `pid` has `path` mapped.
fn maps(pid: u32, path: &Path) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains(s(path)))
}

/// Whether process `pid` is stopped (state T in /proc/PID/stat).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// The command maps its input; it is stopped, the input cut to 4 KiB, and it
/// continues: reading a page past the new end raises SIGBUS, which must end
/// in exit 1 naming the file, no output and no temporaries.
fn input_truncated(w: &Writer) {
    let mut landed = 0;
    let mut attempts = 0;
    while landed == 0 {
        attempts += 1;
        assert!(attempts <= 10, "{}: the truncation never landed", w.name);
        let dir = tempfile::tempdir().unwrap();
        let (input, mapped) = copy_input(w, dir.path());
        let before = names(&tree(dir.path()))
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        let out = output(w, dir.path());
        let mut child = command(&(w.args)(s(&input), s(&out)), Setup::Nothing)
            .spawn()
            .unwrap();
        let pid = child.id();
        if wait_until(&mut child, || maps(pid, &mapped)) {
            signal(&child, libc::SIGSTOP);
            let stop = wait_until(&mut child, || stopped(pid));
            std::fs::OpenOptions::new()
                .write(true)
                .open(&mapped)
                .unwrap()
                .set_len(4096)
                .unwrap();
            if stop {
                signal(&child, libc::SIGCONT);
            }
        }
        let e = finish(child);
        if e.status.success() {
            continue; // It had read everything already.
        }
        assert_eq!(e.status.code(), Some(1), "{}: {}", w.name, e.describe());
        if e.stderr
            .contains("changed or shrank while it was being read")
        {
            landed += 1;
            eprintln!("{}: {}", w.name, e.stderr.trim_end());
            assert!(
                e.stderr.contains(s(&mapped)),
                "{}: not named: {}",
                w.name,
                e.stderr
            );
        } else {
            // The shorter file was read again and refused: also clean.
            assert!(
                e.stderr.starts_with("memwall: error: "),
                "{}: {}",
                w.name,
                e.stderr
            );
        }
        assert!(!e.stderr.contains("panicked"), "{}: {}", w.name, e.stderr);
        let now = tree(dir.path());
        let now: Vec<&str> = names(&now)
            .into_iter()
            .filter(|n| !before.iter().any(|b| b == n))
            .collect();
        // compare makes its folders (the cache holds nothing unfinished).
        assert!(
            now.iter().all(|n| n.ends_with('/')),
            "{}: left behind {now:?}",
            w.name
        );
    }
    eprintln!(
        "{}: SIGBUS turned into an error after {attempts} attempt(s)",
        w.name
    );
}

#[test]
fn inputs_truncated_while_mapped_are_errors_not_crashes() {
    for w in [
        &CONVERT,
        &QUANTIZE,
        &EXPORT,
        &IMATRIX,
        &CALIBRATED,
        &PERPLEXITY,
        &COMPARE,
    ] {
        input_truncated(w);
    }
}

/// SIGINT or SIGTERM once a temporary exists: exit 130 or 143, saying so, and
/// the temporaries are gone (the handler removed them).
fn interrupted(w: &Writer, sig: libc::c_int) {
    let dir = tempfile::tempdir().unwrap();
    let out = output(w, dir.path());
    let args = (w.args)(w.input, s(&out));
    let has_temporary = || !temporaries(&tree(dir.path())).is_empty();
    for _attempt in 0..12 {
        let mut child = command(&args, Setup::Nothing).spawn().unwrap();
        if wait_until(&mut child, has_temporary) {
            signal(&child, sig);
        }
        let e = finish(child);
        if e.status.success() {
            let _ = std::fs::remove_dir_all(&out);
            continue;
        }
        assert_eq!(
            e.status.code(),
            Some(128 + sig),
            "{}: {}",
            w.name,
            e.describe()
        );
        let said = if sig == libc::SIGINT {
            "memwall: interrupted"
        } else {
            "memwall: terminated"
        };
        assert!(e.stderr.contains(said), "{}: {}", w.name, e.stderr);
        // (A calibration interrupted before writing its output has only its
        // work folder, which it keeps.)
        assert!(
            e.stderr.contains("unfinished output files were removed")
                || w.name == "calibrate quantize",
            "{}: {}",
            w.name,
            e.stderr
        );
        eprintln!("{}: {}", w.name, e.stderr.trim_end());
        let left = tree(dir.path());
        // A calibration's work folder stays: the same command continues it.
        let work = |n: &&str| w.name == "calibrate quantize" && n.contains(".calibrating/");
        assert!(
            temporaries(&left).iter().all(work),
            "{}: left behind {:?}",
            w.name,
            names(&left)
        );
        assert!(!out.exists() || w.name == "compare", "{}", w.name);
        return;
    }
    panic!("{}: the signal never landed", w.name);
}

#[test]
fn ctrl_c_and_sigterm_remove_unfinished_outputs() {
    interrupted(&CONVERT, libc::SIGINT);
    interrupted(&EXPORT, libc::SIGTERM);
    interrupted(&CALIBRATED, libc::SIGINT);
    interrupted(&COMPARE, libc::SIGTERM);
    interrupted(&PERPLEXITY, libc::SIGINT);
}

/// Runs `args` with `TMPDIR` in a fresh folder, signals it once one of its own
/// scratch files (`own(pid)` names them) exists: after Ctrl-C nothing is left,
/// after SIGKILL the next run cleans up; a run to the end leaves nothing.
fn scratch_files_are_cleaned(what: &str, args: &[String], own: fn(u32) -> Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let run = || {
        let mut c = command(args, Setup::Nothing);
        c.env("TMPDIR", tmp.path());
        c
    };
    let scratch = || names(&tree(tmp.path())).len();
    for sig in [libc::SIGKILL, libc::SIGINT] {
        let mut landed = false;
        for _attempt in 0..12 {
            let mut child = run().spawn().unwrap();
            // Its own files: the ones a SIGKILL left may still be there.
            let own: Vec<PathBuf> = own(child.id()).iter().map(|n| tmp.path().join(n)).collect();
            if wait_until(&mut child, || own.iter().any(|p| p.exists())) {
                signal(&child, sig);
            }
            let e = finish(child);
            if e.status.success() {
                continue;
            }
            if sig == libc::SIGKILL {
                assert_eq!(e.status.signal(), Some(libc::SIGKILL), "{}", e.describe());
                assert!(scratch() > 0, "{what}: SIGKILL left nothing to clean up");
            } else {
                assert_eq!(e.status.code(), Some(130), "{}", e.describe());
                assert!(e.stderr.contains("memwall: interrupted"), "{}", e.stderr);
                assert_eq!(scratch(), 0, "{what}: {:?}", names(&tree(tmp.path())));
            }
            landed = true;
            break;
        }
        assert!(landed, "{what}: signal {sig} never landed");
    }
    let e = finish(run().spawn().unwrap());
    assert!(e.status.success(), "{}", e.describe());
    assert_eq!(scratch(), 0, "{what}: {:?}", names(&tree(tmp.path())));
}

/// `memwall validate --reference` keeps the reference's log-probabilities in
/// `$TMPDIR/memwall-validate-PID.kld` while it compares.
#[test]
fn an_interrupted_validate_leaves_no_reference_logits() {
    let args = strings(&[
        "validate",
        TINY,
        "--reference",
        TINY,
        "-f",
        TEXT,
        "-c",
        "128",
    ]);
    scratch_files_are_cleaned("validate", &args, |pid| {
        vec![format!("memwall-validate-{pid}.kld")]
    });
}

/// `memwall calibrate fit` keeps the base's log-probabilities and each probe
/// file in `$TMPDIR/memwall-fit-PID.{kld,gguf}` while it measures; the recipe
/// is written to an output folder outside that one, and only at the end.
#[test]
fn an_interrupted_fit_leaves_no_probe_files() {
    let out = tempfile::tempdir().unwrap();
    let recipe = out.path().join("fit.toml");
    let args = strings(&[
        "calibrate",
        "fit",
        "-m",
        TINY,
        "-f",
        TEXT,
        "--probe-ctx",
        "64",
        "--chunks",
        "4",
        "--budget",
        "4MiB",
        "-o",
        recipe.to_str().unwrap(),
    ]);
    scratch_files_are_cleaned("calibrate fit", &args, |pid| {
        vec![
            format!("memwall-fit-{pid}.kld"),
            format!("memwall-fit-{pid}.gguf"),
            format!("memwall-fit-{pid}.gguf.partial"),
        ]
    });
    assert!(recipe.exists());
}

/// `memwall push` stages each chunk in `$TMPDIR/memwall-push-PID.chunk` (the
/// transfer itself is tested in push.rs, against the stand-in adb): Ctrl-C
/// removes it; after SIGKILL the next push does.
#[test]
fn an_interrupted_push_leaves_no_local_chunk() {
    let phone = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let args = strings(&[
        "push",
        TINY,
        "--adb",
        "fixtures/adb/fake-adb",
        "--chunk-mib",
        "1",
    ]);
    let push = || {
        let mut c = command(&args, Setup::Nothing);
        c.env("FAKE_ADB_ROOT", phone.path())
            .env("TMPDIR", tmp.path())
            .env_remove("ANDROID_SERIAL")
            .env_remove("ADB");
        for (var, _) in std::env::vars().filter(|(v, _)| v.starts_with("FAKE_ADB_")) {
            c.env_remove(var);
        }
        c
    };
    let chunks = || names(&tree(tmp.path())).len();
    for sig in [libc::SIGKILL, libc::SIGINT] {
        let mut landed = false;
        for _attempt in 0..12 {
            // A fresh phone, so that the push starts from the beginning.
            let _ = std::fs::remove_dir_all(phone.path().join("data"));
            let mut child = push().spawn().unwrap();
            if wait_until(&mut child, || chunks() > 0) {
                signal(&child, sig);
            }
            let e = finish(child);
            if e.status.success() {
                continue;
            }
            if sig == libc::SIGKILL {
                assert_eq!(e.status.signal(), Some(libc::SIGKILL), "{}", e.describe());
            } else {
                assert_eq!(e.status.code(), Some(130), "{}", e.describe());
                assert!(
                    e.stderr.contains("unfinished output files were removed"),
                    "{}",
                    e.stderr
                );
                assert_eq!(chunks(), 0, "{:?}", names(&tree(tmp.path())));
            }
            landed = true;
            break;
        }
        assert!(landed, "push: signal {sig} never landed");
        // The next push completes (resuming) and leaves no chunk behind.
        let e = finish(push().spawn().unwrap());
        assert!(e.status.success(), "{}", e.describe());
        assert_eq!(chunks(), 0, "{:?}", names(&tree(tmp.path())));
    }
}

/// A reader that goes away (`memwall tokenize … | head`) ends memwall
/// quietly with 141, as a shell tool ends, and not with a panic about
/// printing: here the pipe is closed before memwall writes its first line,
/// and the ids of the held-out text would fill far more than a pipe holds.
#[test]
fn a_closed_standard_output_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(["tokenize", "-m", TINY, "-f", TEXT])
        .current_dir(repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
