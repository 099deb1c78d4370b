//! `memwall push` against fixtures/adb/fake-adb, a scripted STAND-IN for
//! Android's `adb`: real adb and phones are not available on CI. The fake
//! emulates one device (or none, or two) whose file system is a temporary
//! folder (`FAKE_ADB_ROOT`; the phone's /data/... is ROOT/data/...): `devices`,
//! `-s SERIAL`, `push`, and `shell` with getprop, `df -k`, /proc/meminfo and the
//! host's own mkdir/stat/dd/sha256sum/mv/rm/chmod. Fault knobs simulate a pulled
//! cable, a corrupted transfer, a full or small phone. It logs every call to
//! ROOT/adb.log (and `pushed BYTES REMOTE` per successful push), which the
//! tests read to count chunks. See fixtures/adb/README.md.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::repo;
use serde_json::Value;
use sha2::{Digest, Sha256};

const MODEL: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const NAME: &str = "tiny-zh-f16.gguf";
const DEST: &str = "data/local/tmp/memwall";
const MIB: u64 = 1 << 20;

/// A fake phone: its root folder and a private temporary folder for memwall's
/// local chunk files.
struct Phone {
    root: tempfile::TempDir,
    tmp: tempfile::TempDir,
}

impl Phone {
    fn new() -> Phone {
        Phone {
            root: tempfile::tempdir().unwrap(),
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    /// ROOT/data/local/tmp/memwall/NAME and friends.
    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(DEST).join(name)
    }

    /// Runs `memwall push ARGS --adb fake-adb --chunk-mib 1` with the fake's
    /// environment plus `env`.
    fn push(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memwall"));
        cmd.arg("push")
            .args(args)
            .args(["--adb", "fixtures/adb/fake-adb", "--chunk-mib", "1"])
            .current_dir(repo())
            .env("FAKE_ADB_ROOT", self.root.path())
            .env("TMPDIR", self.tmp.path())
            .env_remove("ANDROID_SERIAL")
            .env_remove("ADB");
        for var in [
            "FAKE_ADB_DEVICES",
            "FAKE_ADB_STATE",
            "FAKE_ADB_ABI",
            "FAKE_ADB_FREE_KB",
            "FAKE_ADB_MEM_KB",
            "FAKE_ADB_MEMAVAIL_KB",
            "FAKE_ADB_FAIL_AFTER_PUSHES",
            "FAKE_ADB_CORRUPT",
            "FAKE_ADB_LEGACY_EXIT",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().copied());
        cmd.output().unwrap()
    }

    /// A successful push; returns stdout.
    fn push_ok(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let out = self.push(args, env);
        assert!(
            out.status.success(),
            "push {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Sizes of the successful `adb push`es since the log was last cleared.
    fn pushes(&self) -> Vec<u64> {
        let log = std::fs::read_to_string(self.root.path().join("adb.log")).unwrap_or_default();
        log.lines()
            .filter_map(|l| l.strip_prefix("pushed "))
            .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
            .collect()
    }

    fn clear_log(&self) {
        let _ = std::fs::remove_file(self.root.path().join("adb.log"));
    }

    /// Names in the destination folder on the fake phone.
    fn listing(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root.path().join(DEST))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The local temporary folder holds nothing (chunk files were removed).
    fn assert_no_local_temp(&self) {
        let left: Vec<_> = std::fs::read_dir(self.tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
}

fn model_bytes() -> Vec<u8> {
    std::fs::read(repo().join(MODEL)).unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Chunks of 1 MiB in the model.
fn chunk_count(len: u64) -> usize {
    len.div_ceil(MIB) as usize
}

/// A 64-bit little-endian ELF executable header for `machine`, with a
/// PT_INTERP program header when `interp` is given, padded to 300 KiB.
fn elf(machine: u16, interp: Option<&str>) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little-endian
    b[6] = 1;
    b[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    b[18..20].copy_from_slice(&machine.to_le_bytes());
    b[20..24].copy_from_slice(&1u32.to_le_bytes());
    if let Some(interp) = interp {
        b[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let mut ph = vec![0u8; 56];
        ph[..4].copy_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        ph[8..16].copy_from_slice(&120u64.to_le_bytes());
        ph[32..40].copy_from_slice(&(interp.len() as u64 + 1).to_le_bytes());
        b.extend_from_slice(&ph);
        b.extend_from_slice(interp.as_bytes());
        b.push(0);
    }
    b.extend((0..300 * 1024).map(|i: u32| (i * 7 % 251) as u8));
    b
}

#[test]
fn pushes_model_byte_identical_and_prints_run_commands() {
    let phone = Phone::new();
    let out = phone.push_ok(&[MODEL], &[]);
    let bytes = model_bytes();
    assert_eq!(std::fs::read(phone.path(NAME)).unwrap(), bytes);
    // Only the verified file under its final name: no .partial, no staged chunk.
    assert_eq!(phone.listing(), vec![NAME.to_owned()]);
    phone.assert_no_local_temp();
    // Several chunks, each sent once, adding up to the file.
    let pushes = phone.pushes();
    assert_eq!(pushes.len(), chunk_count(bytes.len() as u64));
    assert!(pushes.len() > 1);
    assert_eq!(pushes.iter().sum::<u64>(), bytes.len() as u64);
    assert!(out.contains("device   FAKE0001 (arm64-v8a)"), "{out}");
    assert!(out.contains("SHA-256 verified on the phone"), "{out}");
    assert!(
        out.contains(
            "adb shell /data/local/tmp/memwall/memwall run -m \
             /data/local/tmp/memwall/tiny-zh-f16.gguf --chat -c 2048"
        ),
        "{out}"
    );
    assert!(
        out.contains("llama-cli -m /data/local/tmp/memwall/tiny-zh-f16.gguf -c 2048 -t 4 -cnv"),
        "{out}"
    );
    // No runtime on the phone: the output says how to send it.
    assert!(out.contains("--with-runtime"), "{out}");
}

#[test]
fn json_summary() {
    let phone = Phone::new();
    let v = json(&phone.push_ok(&[MODEL, "--json", "--ctx", "1024"], &[]));
    let bytes = model_bytes();
    let len = bytes.len() as u64;
    assert_eq!(v["serial"], "FAKE0001");
    assert_eq!(v["abi"], "arm64-v8a");
    assert_eq!(v["dest"], "/data/local/tmp/memwall/tiny-zh-f16.gguf");
    assert_eq!(v["bytes"], len);
    assert_eq!(v["bytes_pushed"], len);
    assert_eq!(v["resumed_from"], 0);
    assert_eq!(v["sha256"], sha256_hex(&bytes));
    assert_eq!(v["skipped"], false);
    assert_eq!(v["ram_total"], 7_812_000u64 * 1024);
    assert_eq!(v["ram_available"], 3_906_000u64 * 1024);
    assert_eq!(v["free_bytes"], 100_000_000u64 * 1024);
    assert_eq!(v["ctx"], 1024);
    assert_eq!(v["runtime"], Value::Null);
    assert_eq!(v["warnings"], serde_json::json!([]));
    // What `memwall plan` predicts `memwall run --no-mmap` holds at that context.
    let ram_1024 = v["ram_needed"].as_u64().unwrap();
    let plan: Value = serde_json::from_str(&common::stdout_of(&[
        "plan", MODEL, "-c", "1024", "--types", "Q8_0", "--json",
    ]))
    .unwrap();
    assert_eq!(
        ram_1024,
        plan["rows"][0]["memwall"]["total_bytes"].as_u64().unwrap()
    );
    assert!(ram_1024 > len, "{ram_1024}");
    let again = json(&phone.push_ok(&[MODEL, "--json", "--ctx", "4096"], &[]));
    assert!(again["ram_needed"].as_u64().unwrap() > ram_1024);
    let memwall = v["commands"]["memwall"].as_str().unwrap();
    assert_eq!(
        memwall,
        "adb shell /data/local/tmp/memwall/memwall run -m \
         /data/local/tmp/memwall/tiny-zh-f16.gguf --chat -c 1024"
    );
    assert_eq!(
        v["commands"]["llama_cli"],
        "llama-cli -m /data/local/tmp/memwall/tiny-zh-f16.gguf -c 1024 -t 4 -cnv"
    );
}

#[test]
fn already_present_is_skipped() {
    let phone = Phone::new();
    phone.push_ok(&[MODEL], &[]);
    phone.clear_log();
    let out = phone.push_ok(&[MODEL], &[]);
    assert!(
        out.contains("tiny-zh-f16.gguf: already on the device"),
        "{out}"
    );
    assert!(phone.pushes().is_empty());
    let v = json(&phone.push_ok(&[MODEL, "--json"], &[]));
    assert_eq!(v["skipped"], true);
    assert_eq!(v["bytes_pushed"], 0);
    assert!(phone.pushes().is_empty());
    assert_eq!(std::fs::read(phone.path(NAME)).unwrap(), model_bytes());

    // A different file under the same name is replaced, not skipped.
    let mut other = model_bytes();
    other[1000] ^= 0xff;
    std::fs::write(phone.path(NAME), &other).unwrap();
    let v = json(&phone.push_ok(&[MODEL, "--json"], &[]));
    assert_eq!(v["skipped"], false);
    assert_eq!(v["bytes_pushed"], v["bytes"]);
    assert_eq!(std::fs::read(phone.path(NAME)).unwrap(), model_bytes());
}

#[test]
fn too_little_storage_is_refused_before_pushing() {
    let phone = Phone::new();
    let out = phone.push(&[MODEL], &[("FAKE_ADB_FREE_KB", "20000")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("not enough storage on the phone FAKE0001"),
        "{err}"
    );
    // The needed and the free amounts are named.
    assert!(err.contains("only 19.5 MiB is free"), "{err}");
    assert!(err.contains("needs 29.2 MiB (12.2 MiB of data"), "{err}");
    assert!(phone.pushes().is_empty());
    assert!(phone.listing().is_empty(), "{:?}", phone.listing());
}

#[test]
fn checksum_mismatch_deletes_the_copy() {
    let phone = Phone::new();
    let out = phone.push(&[MODEL], &[("FAKE_ADB_CORRUPT", "1")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("checksum mismatch for tiny-zh-f16.gguf"),
        "{err}"
    );
    assert!(
        err.contains("the copy on the phone was deleted; run the command again"),
        "{err}"
    );
    assert!(!phone.path(NAME).exists());
    assert!(!phone.path(&format!("{NAME}.partial")).exists());
    assert!(phone.listing().is_empty(), "{:?}", phone.listing());
    phone.assert_no_local_temp();
    // Without the fault, the next run succeeds.
    phone.push_ok(&[MODEL], &[]);
    assert_eq!(std::fs::read(phone.path(NAME)).unwrap(), model_bytes());
}

#[test]
fn interrupted_push_resumes() {
    let phone = Phone::new();
    let bytes = model_bytes();
    let len = bytes.len() as u64;
    let out = phone.push(&[MODEL], &[("FAKE_ADB_FAIL_AFTER_PUSHES", "3")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("stopped at 3.0 MiB of 12.2 MiB") && err.contains("run the command again"),
        "{err}"
    );
    // adb's own message and the command line are in the error.
    assert!(err.contains("Connection reset by peer"), "{err}");
    assert!(
        err.contains("fixtures/adb/fake-adb -s FAKE0001 push"),
        "{err}"
    );
    assert!(!phone.path(NAME).exists());
    let partial = std::fs::read(phone.path(&format!("{NAME}.partial"))).unwrap();
    assert_eq!(partial, &bytes[..3 * MIB as usize]);
    phone.assert_no_local_temp();

    phone.clear_log();
    let out = phone.push_ok(&[MODEL], &[]);
    assert!(
        out.contains("tiny-zh-f16.gguf: resuming at 3.0 MiB of 12.2 MiB"),
        "{out}"
    );
    let pushes = phone.pushes();
    assert_eq!(pushes.len(), chunk_count(len) - 3);
    assert_eq!(pushes.iter().sum::<u64>(), len - 3 * MIB);
    assert_eq!(std::fs::read(phone.path(NAME)).unwrap(), bytes);
    // The half chunk the failed push left is gone too.
    assert_eq!(phone.listing(), vec![NAME.to_owned()]);
}

#[test]
fn resume_reports_offset_in_json() {
    let phone = Phone::new();
    let out = phone.push(&[MODEL, "--json"], &[("FAKE_ADB_FAIL_AFTER_PUSHES", "5")]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no JSON on failure");
    let v = json(&phone.push_ok(&[MODEL, "--json"], &[]));
    assert_eq!(v["resumed_from"], 5 * MIB);
    assert_eq!(v["bytes_pushed"], v["bytes"].as_u64().unwrap() - 5 * MIB);
    assert_eq!(std::fs::read(phone.path(NAME)).unwrap(), model_bytes());
}

#[test]
fn partial_of_another_file_starts_over() {
    let phone = Phone::new();
    let dir = phone.root.path().join(DEST);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{NAME}.partial")), vec![0x5a; 5 << 20]).unwrap();
    let out = phone.push_ok(&[MODEL], &[]);
    assert!(
        out.contains("not this file's beginning; starting over"),
        "{out}"
    );
    assert_eq!(
        phone.pushes().len(),
        chunk_count(model_bytes().len() as u64)
    );
    assert_eq!(std::fs::read(phone.path(NAME)).unwrap(), model_bytes());
    assert_eq!(phone.listing(), vec![NAME.to_owned()]);
}

#[test]
fn no_device() {
    let phone = Phone::new();
    let out = phone.push(&[MODEL], &[("FAKE_ADB_DEVICES", "0")]);
    assert!(!out.status.success());
    assert!(
        stderr(&out)
            .contains("no device: connect the phone with USB debugging on, then `adb devices`"),
        "{}",
        stderr(&out)
    );
    assert!(phone.pushes().is_empty());
}

#[test]
fn several_devices_need_a_serial() {
    let phone = Phone::new();
    let out = phone.push(&[MODEL], &[("FAKE_ADB_DEVICES", "2")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(
            "several devices are attached: FAKE0001 (device), FAKE0002 (device); choose one \
             with --serial"
        ),
        "{err}"
    );
    assert!(phone.pushes().is_empty());

    let out = phone.push(&[MODEL, "--serial", "NOPE"], &[("FAKE_ADB_DEVICES", "2")]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("device NOPE is not attached"),
        "{}",
        stderr(&out)
    );

    let v = json(&phone.push_ok(
        &[MODEL, "--serial", "FAKE0002", "--json"],
        &[("FAKE_ADB_DEVICES", "2")],
    ));
    assert_eq!(v["serial"], "FAKE0002");
    // Every adb call after `devices` names the device.
    let log = std::fs::read_to_string(phone.root.path().join("adb.log")).unwrap();
    let calls: Vec<&str> = log.lines().filter(|l| !l.starts_with("pushed ")).collect();
    assert!(calls.len() > 10);
    for call in &calls {
        assert!(
            *call == "devices" || call.starts_with("-s FAKE0002 "),
            "{call}"
        );
    }
    assert!(
        v["commands"]["memwall"]
            .as_str()
            .unwrap()
            .starts_with("adb -s FAKE0002 shell ")
    );
}

#[test]
fn unauthorized_device() {
    let phone = Phone::new();
    let out = phone.push(&[MODEL], &[("FAKE_ADB_STATE", "unauthorized")]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("device FAKE0001 has not authorized this computer"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn runtime_that_is_not_aarch64_is_refused() {
    let phone = Phone::new();
    let dir = tempfile::tempdir().unwrap();
    let x86 = dir.path().join("memwall-x86");
    std::fs::write(&x86, elf(62, None)).unwrap();
    let arg = format!("--with-runtime={}", x86.display());
    let out = phone.push(&[MODEL, &arg], &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("is a program for x86-64 (ELF machine 62), not aarch64"),
        "{err}"
    );
    assert!(
        err.contains("cargo build --release --target aarch64-unknown-linux-gnu -p memwall"),
        "{err}"
    );
    // Refused before anything reached the phone.
    assert!(phone.pushes().is_empty());
    assert!(phone.listing().is_empty());

    // Not a program at all.
    let arg = format!("--with-runtime={MODEL}");
    let out = phone.push(&[MODEL, &arg], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is not a program (no ELF header)"));
    assert!(phone.pushes().is_empty());
}

#[test]
fn runtime_is_pushed_and_made_executable() {
    use std::os::unix::fs::PermissionsExt;
    let phone = Phone::new();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("memwall-arm64");
    let image = elf(183, Some("/lib/ld-linux-aarch64.so.1"));
    std::fs::write(&bin, &image).unwrap();
    let arg = format!("--with-runtime={}", bin.display());
    let out = phone.push(&[MODEL, &arg, "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&String::from_utf8_lossy(&out.stdout));
    let runtime = phone.path("memwall");
    assert_eq!(std::fs::read(&runtime).unwrap(), image);
    let mode = std::fs::metadata(&runtime).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(v["runtime"]["path"], "/data/local/tmp/memwall/memwall");
    assert_eq!(v["runtime"]["bytes"], image.len());
    assert_eq!(v["runtime"]["sha256"], sha256_hex(&image));
    assert_eq!(v["runtime_on_phone"], true);
    // A glibc-linked build does not start on Android: said, not refused.
    let err = stderr(&out);
    assert!(
        err.contains("linked dynamically against /lib/ld-linux-aarch64.so.1"),
        "{err}"
    );
    assert_eq!(phone.listing(), vec!["memwall".to_owned(), NAME.to_owned()]);

    // On a 32-bit phone the runtime is refused; the model alone is fine.
    let phone = Phone::new();
    let abi = [("FAKE_ADB_ABI", "armeabi-v7a")];
    let out = phone.push(&[MODEL, &arg], &abi);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("has CPU ABI armeabi-v7a, but the memwall runtime is an aarch64"),
        "{}",
        stderr(&out)
    );
    assert!(phone.pushes().is_empty());
    let v = json(&phone.push_ok(&[MODEL, "--json"], &abi));
    assert_eq!(v["abi"], "armeabi-v7a");
}

#[test]
fn model_larger_than_ram_warns_and_pushes() {
    let phone = Phone::new();
    let out = phone.push(&[MODEL, "--json"], &[("FAKE_ADB_MEM_KB", "20000")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("it will only run with mmap streaming (`memwall run --resident 64`)"),
        "{err}"
    );
    let v = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(v["warnings"].as_array().unwrap().len(), 1);
    assert!(
        v["commands"]["memwall"]
            .as_str()
            .unwrap()
            .ends_with("--chat -c 2048 --resident 64"),
        "{}",
        v["commands"]["memwall"]
    );
    assert_eq!(std::fs::read(phone.path(NAME)).unwrap(), model_bytes());
}

#[test]
fn failing_shell_command_is_caught_through_old_adb() {
    // adb before Android 7 exits 0 whatever the command did; memwall reads the
    // exit status it echoes after each command.
    let phone = Phone::new();
    std::fs::create_dir_all(phone.root.path().join("data")).unwrap();
    std::fs::write(phone.root.path().join("data/blocked"), b"a file").unwrap();
    let out = phone.push(
        &[MODEL, "--dest", "/data/blocked/models"],
        &[("FAKE_ADB_LEGACY_EXIT", "1")],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot create /data/blocked/models on the phone FAKE0001"),
        "{err}"
    );
    assert!(
        err.contains("shell 'mkdir -p /data/blocked/models'` failed on the phone (exit status 1)"),
        "{err}"
    );
    assert!(phone.pushes().is_empty());
}

#[test]
fn missing_adb_is_explained() {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(["push", MODEL, "--adb", "/nonexistent/adb"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot run `/nonexistent/adb`: not found; install Android's platform-tools"),
        "{err}"
    );
}

#[test]
fn fake_adb_is_executable() {
    use std::os::unix::fs::PermissionsExt;
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/adb/fake-adb");
    let mode = std::fs::metadata(&fake).unwrap().permissions().mode();
    assert_eq!(mode & 0o111, 0o111, "chmod +x fixtures/adb/fake-adb");
}

#[test]
fn awkward_file_name_is_quoted_for_the_phone() {
    let phone = Phone::new();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("my model's.gguf");
    std::fs::copy(repo().join(MODEL), &local).unwrap();
    let v = json(&phone.push_ok(&[local.to_str().unwrap(), "--json"], &[]));
    assert_eq!(
        std::fs::read(phone.path("my model's.gguf")).unwrap(),
        model_bytes()
    );
    assert_eq!(phone.listing(), vec!["my model's.gguf".to_owned()]);
    assert_eq!(v["dest"], "/data/local/tmp/memwall/my model's.gguf");
    // Quoted for the phone's shell, then the whole command once more for the
    // local shell (adb joins its arguments before the phone splits them).
    let cmd = v["commands"]["memwall"].as_str().unwrap();
    let on_phone = "/data/local/tmp/memwall/memwall run -m \
                    '/data/local/tmp/memwall/my model'\\''s.gguf' --chat -c 2048";
    let twice = format!("'{}'", on_phone.replace('\'', "'\\''"));
    assert_eq!(cmd, format!("adb shell {twice}"));
    // A shell reads the command back into the arguments adb should get.
    let echoed = Command::new("sh")
        .args([
            "-c",
            &format!("printf '%s|' {}", &cmd["adb shell ".len()..]),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(echoed.stdout).unwrap(),
        format!("{on_phone}|")
    );
}

/// `--with-runtime` without a path sends the static build of
/// scripts/phone-build.sh (target/phone/memwall) before a glibc-linked one,
/// and says nothing about loaders: it needs none.
#[test]
fn the_static_runtime_is_what_with_runtime_sends_by_default() {
    let phone = Phone::new();
    let target = tempfile::tempdir().unwrap();
    let dynamic = elf(183, Some("/lib/ld-linux-aarch64.so.1"));
    let gnu = target.path().join("aarch64-unknown-linux-gnu/release");
    std::fs::create_dir_all(&gnu).unwrap();
    std::fs::write(gnu.join("memwall"), &dynamic).unwrap();
    let static_image = elf(183, None);
    std::fs::create_dir_all(target.path().join("phone")).unwrap();
    std::fs::write(target.path().join("phone/memwall"), &static_image).unwrap();
    let env = [("CARGO_TARGET_DIR", target.path().to_str().unwrap())];
    let out = phone.push(&[MODEL, "--with-runtime", "--json"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(phone.path("memwall")).unwrap(), static_image);
    assert!(
        !stderr(&out).contains("linked dynamically"),
        "{}",
        stderr(&out)
    );

    // Without the static build, the glibc one goes, with the way to the static one.
    std::fs::remove_file(target.path().join("phone/memwall")).unwrap();
    let phone = Phone::new();
    let out = phone.push(&[MODEL, "--with-runtime", "--json"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(phone.path("memwall")).unwrap(), dynamic);
    assert!(
        stderr(&out).contains("scripts/phone-build.sh"),
        "{}",
        stderr(&out)
    );
}
