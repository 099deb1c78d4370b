//! `memwall push MODEL.gguf`: a GGUF model onto an Android phone through `adb`.
//!
//! Steps: pick the device (`adb devices`; `--serial` when several), check it
//! before anything is sent (CPU ABI, free storage at the destination, RAM the
//! model needs at `--ctx`), then send the file in chunks into
//! `DEST/NAME.partial` (each chunk `adb push`ed as `DEST/.NAME.chunk` and
//! written into place with the phone's `dd`), verify the SHA-256 on the phone
//! and only then rename it to `DEST/NAME`: the final name only ever holds a
//! verified file. An interrupted push resumes at the last whole chunk of the
//! partial file (after checking that the bytes already there are this file's).
//! `--with-runtime` sends an aarch64 `memwall` binary the same way.
//!
//! Chunks are 64 MiB; the hidden option `--chunk-mib N` changes that (the tests
//! use 1 MiB to get several chunks out of a small model). Every shell command
//! is followed by `echo` of its exit status, so failures are seen even through
//! adb versions older than Android 7's, which always exit 0.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use memwall_format::progress::{Progress, Unit};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::progress::Bar;
use crate::render::human_bytes;

const MIB: u64 = 1 << 20;
/// Block size of the phone-side `dd`; chunks and resume offsets are multiples of it.
const DD_BLOCK: u64 = 65536;
/// Room left free on the phone beyond the data and one staged chunk.
const STORAGE_MARGIN: u64 = 16 * MIB;
/// Name of the runtime binary on the phone.
const RUNTIME_NAME: &str = "memwall";
/// ELF machine number of aarch64.
const EM_AARCH64: u16 = 183;
/// Printed after every shell command with its exit status.
const RC_MARK: &str = "__memwall_rc=";
/// Threads in the printed llama-cli command.
const LLAMA_THREADS: u32 = 4;

/// Arguments of `memwall push`.
#[derive(clap::Args)]
#[command(mut_arg("model", |a| a.help("The GGUF model to send (a single file); or give it with -m")))]
#[command(mut_arg("ctx", |a| a.help("Context length the RAM check sizes the KV cache for (and the \
    printed commands use)")))]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// The device, as `adb devices` lists it (needed when several are
    /// attached; default: the ANDROID_SERIAL variable, as adb reads it).
    #[arg(short = 's', long, value_name = "SERIAL")]
    pub serial: Option<String>,
    /// Folder on the phone; created if missing.
    #[arg(long, default_value = "/data/local/tmp/memwall", value_name = "DIR")]
    pub dest: String,
    /// Also send the memwall runtime built for aarch64 (default:
    /// target/aarch64-linux-android/release/memwall, else the static build of
    /// scripts/phone-build.sh, target/phone/memwall, which needs no loader or
    /// libraries, else target/aarch64-unknown-linux-gnu/release/memwall).
    /// Give PATH with `=`.
    #[arg(
        long,
        value_name = "PATH",
        num_args = 0..=1,
        require_equals = true
    )]
    pub with_runtime: Option<Option<PathBuf>>,
    #[command(flatten)]
    pub ctx: crate::args::Ctx2048,
    /// The adb program (default: the ADB variable, else `adb` on PATH).
    #[arg(long, value_name = "PATH")]
    pub adb: Option<PathBuf>,
    /// Print a JSON summary instead of text (and no progress bar).
    #[arg(long)]
    pub json: bool,
    /// Chunk size in MiB (tests use small chunks).
    #[arg(long, hide = true, default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub chunk_mib: u64,
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let chunk = args.chunk_mib * MIB;
    let dest = dest_dir(&args.dest)?;
    let mut warnings: Vec<String> = Vec::new();
    let warn = |warnings: &mut Vec<String>, message: String| {
        eprintln!("memwall: warning: {message}");
        warnings.push(message);
    };
    let say = |line: &str| {
        if !args.json {
            println!("{line}");
        }
    };

    // Everything local first: the model, its name, the runtime binary.
    let model_path = args.model.path()?.to_owned();
    let ctx = args.ctx.ctx as u64;
    let model = super::open_model(&model_path)?;
    if model.files().len() > 1 {
        bail!(
            "{}: a split model ({} files); `memwall push` sends single files: merge it first \
             with `llama-gguf-split --merge {} merged.gguf`",
            model_path.display(),
            model.files().len(),
            model_path.display()
        );
    }
    let name = file_name(&model_path)?;
    if name == RUNTIME_NAME {
        bail!(
            "{}: rename the model: on the phone `{RUNTIME_NAME}` is the runtime's name",
            model_path.display()
        );
    }
    let data = model.files()[0].bytes();
    let ram_need = memwall_quantize::fit::plan::ram_needed(&model, ctx);

    let runtime = match &args.with_runtime {
        None => None,
        Some(path) => {
            let path = runtime_path(path.as_deref())?;
            let bytes = std::fs::read(&path)
                .with_context(|| format!("cannot read the runtime {}", path.display()))?;
            if let Some(interp) = check_aarch64_elf(&path, &bytes)? {
                if !interp.starts_with("/system/") {
                    warn(
                        &mut warnings,
                        format!(
                            "the runtime {} is linked dynamically against {interp}, which Android \
                             does not have: it will not start on a phone (it does on ARM64 Linux); \
                             build the static runtime with `scripts/phone-build.sh` (or for \
                             Android with the NDK, docs/RUNTIME.md)",
                            path.display()
                        ),
                    );
                }
            }
            Some((path, bytes))
        }
    };

    // The device.
    let program = args
        .adb
        .clone()
        .or_else(|| {
            std::env::var_os("ADB")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("adb"));
    let requested = args.serial.clone().or_else(|| {
        std::env::var("ANDROID_SERIAL")
            .ok()
            .filter(|v| !v.is_empty())
    });
    let (serial, several) = select_device(&program, requested.as_deref())?;
    let adb = Adb {
        program,
        serial: serial.clone(),
    };
    let abi = adb
        .shell("getprop ro.product.cpu.abi")
        .context("cannot read the phone's CPU ABI")?
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("unknown")
        .to_owned();
    if runtime.is_some() && abi == "unknown" {
        warn(
            &mut warnings,
            format!(
                "could not read the CPU ABI of the phone {serial}; sending the aarch64 runtime anyway"
            ),
        );
    } else if runtime.is_some() && abi != "arm64-v8a" {
        bail!(
            "the phone {serial} has CPU ABI {abi}, but the memwall runtime is an aarch64 \
             (arm64-v8a) program and cannot run there; push the model without --with-runtime \
             and run it with a llama.cpp built for {abi}"
        );
    }
    say(&format!("device   {serial} ({abi})"));

    let q_dest = sh_quote(&dest);
    adb.shell(&format!("mkdir -p {q_dest}"))
        .with_context(|| format!("cannot create {dest} on the phone {serial}"))?;

    // What is on the phone already, and the local checksums.
    let bar = Bar::new(!args.json);
    let mut uploads = vec![Upload::new(name.clone(), &dest, data)];
    if let Some((_, bytes)) = &runtime {
        uploads.push(Upload::new(RUNTIME_NAME.to_owned(), &dest, bytes));
    }
    for up in &mut uploads {
        up.survey(&adb, chunk, &bar)?;
        if up.skipped {
            say(&format!(
                "{}: already on the device ({}, same SHA-256)",
                up.name, up.remote
            ));
        } else if let Some(note) = &up.note {
            say(note);
        }
    }

    // Storage.
    let to_push: u64 = uploads
        .iter()
        .filter(|u| !u.skipped)
        .map(|u| u.data.len() as u64 - u.resume)
        .sum();
    // The chunk staged next to the partial file takes room too.
    let staged = uploads
        .iter()
        .filter(|u| !u.skipped)
        .map(|u| chunk.min(u.data.len() as u64))
        .max()
        .unwrap_or(0);
    let storage_need = if to_push == 0 {
        0
    } else {
        to_push + staged + STORAGE_MARGIN
    };
    let df = adb
        .shell(&format!("df -k {q_dest}"))
        .with_context(|| format!("cannot read the free storage at {dest}"))?;
    let free = parse_df_available_kib(&df).map(|kib| kib.saturating_mul(1024));
    match free {
        None => warn(
            &mut warnings,
            format!(
                "could not read the free storage at {dest} from `df -k` ({}); pushing anyway",
                first_line(&df)
            ),
        ),
        Some(free) if free < storage_need => bail!(
            "not enough storage on the phone {serial} at {dest}: the push needs {} ({} of data, \
             one {} chunk and a {} margin) but only {} is free; delete old files there (e.g. \
             `adb shell rm {dest}/OLD.gguf`) or choose another --dest",
            human_bytes(storage_need),
            human_bytes(to_push),
            human_bytes(staged),
            human_bytes(STORAGE_MARGIN),
            human_bytes(free)
        ),
        Some(free) => say(&format!(
            "storage  {} free at {dest}, {} to send",
            human_bytes(free),
            human_bytes(to_push)
        )),
    }

    // RAM.
    let meminfo = adb
        .shell("cat /proc/meminfo")
        .context("cannot read the phone's memory (/proc/meminfo)")?;
    let ram_total = meminfo_kib(&meminfo, "MemTotal").map(|k| k.saturating_mul(1024));
    let ram_available = meminfo_kib(&meminfo, "MemAvailable").map(|k| k.saturating_mul(1024));
    let mut resident_mib = None;
    match ram_total {
        None => warn(
            &mut warnings,
            "could not read the phone's RAM from /proc/meminfo; not checked".to_owned(),
        ),
        Some(total) => {
            let avail = ram_available.unwrap_or(total);
            say(&format!(
                "memory   {} total, {} available; {name} needs about {} at -c {}",
                human_bytes(total),
                human_bytes(avail),
                human_bytes(ram_need),
                ctx
            ));
            if ram_need > total {
                // What is left once the KV cache, buffers and process are in
                // (memwall plan's streaming rule), in whole 64 MiB steps.
                let rest = ram_need.saturating_sub(model.total_file_size());
                let mib = (avail.saturating_sub(rest) / MIB / 64 * 64).max(64);
                resident_mib = Some(mib);
                warn(
                    &mut warnings,
                    format!(
                        "{name} needs about {} of RAM at -c {}, more than the phone's {}: it will \
                         only run with mmap streaming (`memwall run --resident {mib}`), reading \
                         weights from storage for every token",
                        human_bytes(ram_need),
                        ctx,
                        human_bytes(total)
                    ),
                );
            } else if ram_need > avail {
                warn(
                    &mut warnings,
                    format!(
                        "{name} needs about {} of RAM at -c {}, more than the {} available now: \
                         close other apps before running it",
                        human_bytes(ram_need),
                        ctx,
                        human_bytes(avail)
                    ),
                );
            }
        }
    }

    // Send.
    let tmp = TempChunk::new();
    for up in &mut uploads {
        if !up.skipped {
            up.send(&adb, chunk, &tmp, &bar, &|line: &str| say(line))?;
        }
    }
    drop(tmp);
    if runtime.is_some() {
        let remote = sh_quote(&uploads[1].remote);
        adb.shell(&format!("chmod 755 {remote}")).with_context(|| {
            format!("cannot make {} executable on the phone", uploads[1].remote)
        })?;
    }
    let runtime_on_phone = runtime.is_some()
        || adb
            .shell(&format!(
                "if [ -x {0} ]; then echo yes; else echo no; fi",
                sh_quote(&format!("{dest}/{RUNTIME_NAME}"))
            ))
            .map(|out| out.trim() == "yes")
            .unwrap_or(false);

    // How to run it.
    let adb_shell = if several || requested.is_some() {
        format!("adb -s {} shell", sh_quote(&serial))
    } else {
        "adb shell".to_owned()
    };
    // adb joins its arguments and the phone's shell splits them again, so a
    // path that needs quoting there is quoted once more for the local shell.
    let remote_model = sh_quote(&uploads[0].remote);
    let remote_runtime = sh_quote(&format!("{dest}/{RUNTIME_NAME}"));
    let resident = resident_mib.map_or(String::new(), |mib| format!(" --resident {mib}"));
    let on_phone = format!(
        "{remote_runtime} run -m {remote_model} --chat -c {}{resident}",
        ctx
    );
    let memwall_cmd = if remote_model == uploads[0].remote && !remote_runtime.starts_with('\'') {
        format!("{adb_shell} {on_phone}")
    } else {
        format!("{adb_shell} {}", sh_quote(&on_phone))
    };
    let llama_cmd = format!(
        "llama-cli -m {remote_model} -c {} -t {LLAMA_THREADS} -cnv",
        ctx
    );

    let m = &uploads[0];
    if args.json {
        let runtime_json = match (&runtime, uploads.get(1)) {
            (Some((path, _)), Some(r)) => json!({
                "local": path, "path": r.remote, "bytes": r.data.len(), "bytes_pushed": r.pushed,
                "resumed_from": r.resume, "sha256": r.sha256, "skipped": r.skipped,
            }),
            _ => Value::Null,
        };
        let report = json!({
            "serial": serial, "abi": abi, "dest": m.remote, "bytes": m.data.len(),
            "bytes_pushed": m.pushed, "resumed_from": m.resume, "sha256": m.sha256,
            "skipped": m.skipped, "free_bytes": free, "ram_total": ram_total,
            "ram_available": ram_available, "ram_needed": ram_need, "ctx": ctx,
            "runtime": runtime_json, "runtime_on_phone": runtime_on_phone,
            "warnings": warnings,
            "commands": {"memwall": memwall_cmd, "llama_cli": llama_cmd},
            "seconds": started.elapsed().as_secs_f64(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!();
    println!("Run it on the phone with memwall:");
    println!("  {memwall_cmd}");
    if !runtime_on_phone {
        println!(
            "  (the runtime is not on the phone yet: push it with `memwall push {} --with-runtime`)",
            model_path.display()
        );
    }
    println!("or with llama.cpp's llama-cli (built for Android, in `{adb_shell}`):");
    println!("  {llama_cmd}");
    Ok(())
}

/// One file to send: the model or the runtime.
struct Upload<'a> {
    name: String,
    data: &'a [u8],
    /// `DEST/NAME`, `DEST/NAME.partial`, `DEST/.NAME.chunk` on the phone.
    remote: String,
    partial: String,
    staged: String,
    /// Local SHA-256, hex.
    sha256: String,
    /// Offset the push starts at (bytes of the partial file kept).
    resume: u64,
    /// The same file is on the phone already.
    skipped: bool,
    /// Bytes sent in this run.
    pushed: u64,
    /// A line for the user about the resume.
    note: Option<String>,
}

impl<'a> Upload<'a> {
    fn new(name: String, dest: &str, data: &'a [u8]) -> Self {
        Upload {
            remote: format!("{dest}/{name}"),
            partial: format!("{dest}/{name}.partial"),
            staged: format!("{dest}/.{name}.chunk"),
            name,
            data,
            sha256: String::new(),
            resume: 0,
            skipped: false,
            pushed: 0,
            note: None,
        }
    }

    /// Looks at the phone: is the file there already, and how much of a
    /// previous push can be kept. Computes the local SHA-256.
    fn survey(&mut self, adb: &Adb, chunk: u64, bar: &Bar) -> Result<()> {
        let len = self.data.len() as u64;
        let (q_final, q_partial, q_staged) = (
            sh_quote(&self.remote),
            sh_quote(&self.partial),
            sh_quote(&self.staged),
        );
        let sizes = adb
            .shell(&format!(
                "rm -f {q_staged} && (stat -c %s {q_final} 2>/dev/null || echo -) && \
                 (stat -c %s {q_partial} 2>/dev/null || echo -)"
            ))
            .with_context(|| format!("cannot look for {} on the phone", self.remote))?;
        let mut sizes = sizes.lines().map(|l| l.trim().parse::<u64>().ok());
        let final_size = sizes.next().flatten();
        let partial_size = sizes.next().flatten();

        let mut resume = match partial_size {
            Some(p) if p <= len => p / chunk * chunk,
            _ => 0,
        };
        let (sha, prefix_sha) = checksum(self.data, resume, &self.name, bar);
        self.sha256 = sha;
        if final_size == Some(len) {
            let remote_sha = remote_sha256(adb, &self.remote)?;
            if remote_sha == self.sha256 {
                self.skipped = true;
                return Ok(());
            }
        }
        if resume > 0 {
            let cmd = format!(
                "dd if={q_partial} bs={DD_BLOCK} count={} 2>/dev/null | sha256sum",
                resume / DD_BLOCK
            );
            let out = adb
                .shell(&cmd)
                .with_context(|| format!("cannot read {} on the phone", self.partial))?;
            if parse_sha256(&out).as_deref() == Some(prefix_sha.as_str()) {
                self.note = Some(format!(
                    "{}: resuming at {} of {} ({} bytes already on the phone)",
                    self.name,
                    human_bytes(resume),
                    human_bytes(len),
                    resume
                ));
            } else {
                self.note = Some(format!(
                    "{}: the partial copy on the phone is not this file's beginning; starting over",
                    self.name
                ));
                resume = 0;
            }
        }
        self.resume = resume;
        Ok(())
    }

    /// Sends the file from `self.resume`, verifies it on the phone and gives
    /// it its final name.
    fn send(
        &mut self,
        adb: &Adb,
        chunk: u64,
        tmp: &TempChunk,
        bar: &Bar,
        say: &dyn Fn(&str),
    ) -> Result<()> {
        let started = Instant::now();
        let len = self.data.len() as u64;
        let (q_partial, q_staged) = (sh_quote(&self.partial), sh_quote(&self.staged));
        if self.resume == 0 {
            adb.shell(&format!("rm -f {q_partial}"))
                .with_context(|| format!("cannot remove {} on the phone", self.partial))?;
        }
        // The bar counts this run's bytes only, so that its rate and ETA are right.
        bar.start("pushing", len - self.resume, Unit::Bytes);
        bar.item(&self.name);
        let mut offset = self.resume;
        while offset < len {
            let end = (offset + chunk).min(len);
            let piece = &self.data[offset as usize..end as usize];
            tmp.write(piece)?;
            let interrupted = || {
                format!(
                    "pushing {} to the phone stopped at {} of {}; what arrived is kept: run the \
                     command again to resume",
                    self.name,
                    human_bytes(offset),
                    human_bytes(len)
                )
            };
            adb.run(&["push", &tmp.0.to_string_lossy(), &self.staged])
                .with_context(interrupted)?;
            adb.shell(&format!(
                "dd if={q_staged} of={q_partial} bs={DD_BLOCK} seek={} conv=notrunc 2>/dev/null \
                 && rm -f {q_staged}",
                offset / DD_BLOCK
            ))
            .with_context(interrupted)?;
            self.pushed += end - offset;
            bar.advance(end - offset);
            offset = end;
        }
        bar.finish();

        // sha256sum reads the whole file on the phone: a few seconds per GiB.
        bar.start("verifying", 1, Unit::Items);
        bar.item(&format!("SHA-256 of {} on the phone", self.name));
        let remote_sha = remote_sha256(adb, &self.partial);
        bar.finish();
        let remote_sha = remote_sha?;
        if remote_sha != self.sha256 {
            adb.shell(&format!("rm -f {q_partial}")).with_context(|| {
                format!("cannot delete the bad copy {} on the phone", self.partial)
            })?;
            bail!(
                "checksum mismatch for {} on the phone: SHA-256 {remote_sha}, expected {}; the \
                 copy on the phone was deleted; run the command again (if it happens again, \
                 try another cable or USB port)",
                self.name,
                self.sha256
            );
        }
        adb.shell(&format!("mv -f {q_partial} {}", sh_quote(&self.remote)))
            .with_context(|| format!("cannot rename {} on the phone", self.partial))?;
        let seconds = started.elapsed().as_secs_f64();
        say(&format!(
            "pushed   {} to {}: {} in {seconds:.1} s ({}/s), SHA-256 verified on the phone",
            self.name,
            self.remote,
            human_bytes(self.pushed),
            human_bytes((self.pushed as f64 / seconds.max(1e-3)) as u64)
        ));
        Ok(())
    }
}

/// SHA-256 of `data` (hex), and of `data[..prefix]`, with progress.
fn checksum(data: &[u8], prefix: u64, name: &str, bar: &Bar) -> (String, String) {
    const PIECE: usize = 8 << 20;
    let prefix = (prefix as usize).min(data.len());
    bar.start("checksum", data.len() as u64, Unit::Bytes);
    bar.item(name);
    let mut hasher = Sha256::new();
    for piece in data[..prefix].chunks(PIECE) {
        hasher.update(piece);
        bar.advance(piece.len() as u64);
    }
    let prefix_sha = format!("{:x}", hasher.clone().finalize());
    for piece in data[prefix..].chunks(PIECE) {
        hasher.update(piece);
        bar.advance(piece.len() as u64);
    }
    bar.finish();
    (format!("{:x}", hasher.finalize()), prefix_sha)
}

/// SHA-256 of a file on the phone.
fn remote_sha256(adb: &Adb, path: &str) -> Result<String> {
    let out = adb
        .shell(&format!("sha256sum {}", sh_quote(path)))
        .with_context(|| format!("cannot compute the SHA-256 of {path} on the phone"))?;
    parse_sha256(&out).ok_or_else(|| {
        anyhow!(
            "cannot compute the SHA-256 of {path} on the phone: `sha256sum` printed {:?} \
             (the phone needs toybox's sha256sum, Android 6 or newer)",
            first_line(&out)
        )
    })
}

/// The hash of `sha256sum` output: the first word, 64 hex digits.
fn parse_sha256(out: &str) -> Option<String> {
    let word = out.split_whitespace().next()?;
    let word = word.strip_prefix('\\').unwrap_or(word);
    (word.len() == 64 && word.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| word.to_ascii_lowercase())
}

/// `adb` bound to one device.
struct Adb {
    program: PathBuf,
    serial: String,
}

impl Adb {
    fn command_line(&self, args: &[&str]) -> String {
        let mut line = format!("{} -s {}", self.program.display(), sh_quote(&self.serial));
        for a in args {
            line.push(' ');
            line.push_str(&sh_quote(a));
        }
        line
    }

    /// Runs `adb -s SERIAL ARGS`, which must exit 0; returns its stdout.
    fn run(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-s", self.serial.as_str()];
        all.extend_from_slice(args);
        let out = spawn(&self.program, &all)?;
        if !out.status.success() {
            bail!(
                "`{}` failed ({}){}",
                self.command_line(args),
                out.status,
                details(&out.stdout, &out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).replace('\r', ""))
    }

    /// Runs `cmd` in the phone's shell; it must exit 0. Returns its stdout.
    fn shell(&self, cmd: &str) -> Result<String> {
        let wrapped = format!("{cmd}; echo {RC_MARK}$?");
        let out = spawn(&self.program, &["-s", &self.serial, "shell", &wrapped])?;
        let stdout = String::from_utf8_lossy(&out.stdout).replace('\r', "");
        let line = self.command_line(&["shell", cmd]);
        let Some(at) = stdout.rfind(RC_MARK) else {
            bail!(
                "`{line}` failed ({}){}",
                out.status,
                details(&out.stdout, &out.stderr)
            );
        };
        let body = &stdout[..at];
        let rc = stdout[at + RC_MARK.len()..].trim();
        if rc != "0" {
            bail!(
                "`{line}` failed on the phone (exit status {rc}){}",
                details(body.as_bytes(), &out.stderr)
            );
        }
        Ok(body.to_owned())
    }
}

/// Runs the adb program.
fn spawn(program: &Path, args: &[&str]) -> Result<Output> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                anyhow!(
                    "cannot run `{}`: not found; install Android's platform-tools (adb) and put \
                     it on PATH, or name it with --adb PATH or the ADB variable",
                    program.display()
                )
            } else {
                anyhow!("cannot run `{}`: {e}", program.display())
            }
        })
}

/// `: stderr …; stdout …` for an error message, shortened.
fn details(stdout: &[u8], stderr: &[u8]) -> String {
    let clip = |b: &[u8]| {
        let s = String::from_utf8_lossy(b).replace('\r', "");
        let s = s.trim();
        if s.chars().count() > 1000 {
            format!("{}…", s.chars().take(1000).collect::<String>())
        } else {
            s.to_owned()
        }
    };
    let (out, err) = (clip(stdout), clip(stderr));
    match (err.is_empty(), out.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(": {err}"),
        (true, false) => format!(": {out}"),
        (false, false) => format!(": {err} (output: {out})"),
    }
}

/// Picks the device: `requested`, or the only one attached. Returns the
/// serial and whether several devices are attached.
fn select_device(program: &Path, requested: Option<&str>) -> Result<(String, bool)> {
    let out = spawn(program, &["devices"])?;
    if !out.status.success() {
        bail!(
            "`{} devices` failed ({}){}",
            program.display(),
            out.status,
            details(&out.stdout, &out.stderr)
        );
    }
    let devices = parse_devices(&String::from_utf8_lossy(&out.stdout));
    let several = devices.len() > 1;
    let listing = || {
        devices
            .iter()
            .map(|(s, state)| format!("{s} ({state})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(serial) = requested {
        return match devices.iter().find(|(s, _)| s == serial) {
            None if devices.is_empty() => bail!(
                "device {serial} is not attached (`adb devices` lists none): connect the phone \
                 with USB debugging on, then `adb devices`"
            ),
            None => bail!(
                "device {serial} is not attached; `adb devices` lists {}",
                listing()
            ),
            Some((_, state)) if state != "device" => Err(state_error(serial, state)),
            Some(_) => Ok((serial.to_owned(), several)),
        };
    }
    let ready: Vec<&String> = devices
        .iter()
        .filter(|(_, state)| state == "device")
        .map(|(s, _)| s)
        .collect();
    match (ready.as_slice(), devices.first()) {
        (_, None) => {
            bail!("no device: connect the phone with USB debugging on, then `adb devices`")
        }
        ([one], _) => Ok(((*one).clone(), several)),
        ([], Some((serial, state))) => Err(state_error(serial, state)),
        _ => bail!(
            "several devices are attached: {}; choose one with --serial SERIAL",
            listing()
        ),
    }
}

/// The error for a device adb lists but cannot use.
fn state_error(serial: &str, state: &str) -> anyhow::Error {
    match state {
        "unauthorized" => anyhow!(
            "device {serial} has not authorized this computer: unlock the phone and accept the \
             \"Allow USB debugging\" prompt, then run the command again"
        ),
        "offline" => anyhow!(
            "device {serial} is offline: reconnect the cable (or run `adb kill-server`) and try again"
        ),
        _ => anyhow!("device {serial} is not ready (adb reports \"{state}\")"),
    }
}

/// `adb devices` output: (serial, state) of every line `SERIAL<TAB>STATE`.
fn parse_devices(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let (serial, state) = line.trim_end_matches('\r').split_once('\t')?;
            let serial = serial.trim();
            let state = state.split_whitespace().next().unwrap_or("unknown");
            (!serial.is_empty() && !serial.starts_with('*'))
                .then(|| (serial.to_owned(), state.to_owned()))
        })
        .collect()
}

/// The "Available" column (KiB) of the last line of `df -k` output (POSIX,
/// toybox or GNU, also when a long device name wrapped the line): the number
/// just before the `Use%` column.
fn parse_df_available_kib(text: &str) -> Option<u64> {
    let last = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    let words: Vec<&str> = last.split_whitespace().collect();
    let pct = words.iter().enumerate().skip(1).find_map(|(i, w)| {
        let digits = w.strip_suffix('%')?;
        (digits.is_empty() || digits.bytes().all(|b| b.is_ascii_digit()) || digits == "-")
            .then_some(i)
    })?;
    words.get(pct.checked_sub(1)?)?.parse().ok()
}

/// A `Key: N kB` line of /proc/meminfo.
fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, rest) = line.split_once(':')?;
        if k.trim() != key {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

fn first_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("nothing")
}

/// The destination folder: absolute, without a trailing slash.
fn dest_dir(dest: &str) -> Result<String> {
    let trimmed = dest.trim_end_matches('/');
    if !dest.starts_with('/') || trimmed.is_empty() {
        bail!(
            "--dest {dest:?}: give an absolute folder on the phone, such as /data/local/tmp/memwall"
        );
    }
    if dest.contains(['\n', '\r', '\0']) {
        bail!("--dest {dest:?}: the folder name contains a line break");
    }
    Ok(trimmed.to_owned())
}

/// The model's file name, used on the phone too.
fn file_name(path: &Path) -> Result<String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{}: the file name must be UTF-8", path.display()))?;
    if name.contains(['\n', '\r']) {
        bail!("{}: the file name contains a line break", path.display());
    }
    Ok(name.to_owned())
}

/// The runtime binary: PATH, else the default build outputs.
fn runtime_path(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = given.filter(|p| !p.as_os_str().is_empty()) {
        if !path.is_file() {
            bail!("--with-runtime {}: no such file", path.display());
        }
        return Ok(path.to_owned());
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    let candidates = [
        target.join("aarch64-linux-android/release/memwall"),
        target.join("phone/memwall"),
        target.join("aarch64-unknown-linux-gnu/release/memwall"),
    ];
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    bail!(
        "no aarch64 memwall binary at {}, {} or {}: build the static one, which runs on a \
         stock phone, with `scripts/phone-build.sh` (for Android with the NDK: `cargo build \
         --release --target aarch64-linux-android -p memwall`, see docs/RUNTIME.md), or name \
         it with --with-runtime=PATH",
        candidates[1].display(),
        candidates[0].display(),
        candidates[2].display()
    )
}

/// Checks that `bytes` is a 64-bit little-endian ELF for aarch64; returns its
/// program interpreter (dynamic loader), if it names one.
fn check_aarch64_elf(path: &Path, bytes: &[u8]) -> Result<Option<String>> {
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let u64_at = |at: usize| {
        bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if bytes.get(..4) != Some(b"\x7fELF") {
        bail!(
            "{} is not a program (no ELF header); --with-runtime needs memwall built for aarch64",
            path.display()
        );
    }
    let machine = u16_at(18).unwrap_or(0);
    if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) || machine != EM_AARCH64 {
        let arch = match machine {
            3 => "x86",
            40 => "32-bit ARM",
            62 => "x86-64",
            183 => "aarch64 (but not 64-bit little-endian)",
            243 => "RISC-V",
            _ => "another CPU",
        };
        bail!(
            "{} is a program for {arch} (ELF machine {machine}), not aarch64: build it with \
             `cargo build --release --target aarch64-unknown-linux-gnu -p memwall` (docs/RUNTIME.md)",
            path.display()
        );
    }
    // PT_INTERP among the program headers, read defensively.
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return Ok(None);
    };
    for i in 0..u64::from(phnum) {
        let Some(at) = phoff
            .checked_add(i * u64::from(phentsize))
            .and_then(|a| usize::try_from(a).ok())
        else {
            break;
        };
        if u32_at(at) != Some(3) {
            continue;
        }
        let (Some(off), Some(size)) = (u64_at(at + 8), u64_at(at + 32)) else {
            break;
        };
        let range = usize::try_from(off)
            .ok()
            .zip(usize::try_from(off.saturating_add(size)).ok());
        let Some(raw) = range.and_then(|(a, b)| bytes.get(a..b)) else {
            break;
        };
        let interp = String::from_utf8_lossy(raw)
            .trim_end_matches('\0')
            .to_owned();
        return Ok(Some(interp));
    }
    Ok(None)
}

/// Quotes `s` for the phone's shell when it holds anything but safe characters.
fn sh_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%,".contains(&b));
    if safe {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The local file each chunk is staged in for `adb push`; removed on drop
/// and by the signal handlers.
struct TempChunk(
    PathBuf,
    #[allow(dead_code, reason = "held for its Drop, which unlists the path")]
    memwall_format::cleanup::Registration,
);

impl TempChunk {
    /// `memwall-push-<pid>.chunk` in the temporary folder, after removing
    /// those of pushes that were killed (64 MiB each).
    fn new() -> TempChunk {
        let dir = std::env::temp_dir();
        memwall_format::cleanup::remove_stale(&dir, "memwall-push-", ".chunk");
        let path = dir.join(format!("memwall-push-{}.chunk", std::process::id()));
        let listed = memwall_format::cleanup::register_file(&path);
        TempChunk(path, listed)
    }

    fn write(&self, data: &[u8]) -> Result<()> {
        let mut file = File::create(&self.0)
            .with_context(|| format!("cannot create the temporary file {}", self.0.display()))?;
        file.write_all(data)
            .with_context(|| format!("cannot write the temporary file {}", self.0.display()))
    }
}

impl Drop for TempChunk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn df_outputs() {
        let toybox = "Filesystem      1K-blocks     Used Available Use% Mounted on\n\
                      /dev/block/dm-8 115084208 45154552  69929656  40% /data\n";
        assert_eq!(parse_df_available_kib(toybox), Some(69929656));
        let wrapped = "Filesystem 1K-blocks Used Available Use% Mounted on\n\
                       /dev/mapper/a-very-long-volume-name\n  1000 400 600 40% /data\r\n\n";
        assert_eq!(parse_df_available_kib(wrapped), Some(600));
        assert_eq!(parse_df_available_kib("/data 5.7G 1.2G 4.5G 4096"), None);
        assert_eq!(parse_df_available_kib(""), None);
        assert_eq!(parse_df_available_kib("df: /x: No such file"), None);
    }

    #[test]
    fn devices_output() {
        let text = "* daemon started successfully\nList of devices attached\n\
                    R58M1\tdevice\nemulator-5554\tunauthorized usb:1-1\n\n";
        assert_eq!(
            parse_devices(text),
            vec![
                ("R58M1".to_owned(), "device".to_owned()),
                ("emulator-5554".to_owned(), "unauthorized".to_owned())
            ]
        );
        assert!(parse_devices("List of devices attached\n\n").is_empty());
    }

    #[test]
    fn sha_and_meminfo() {
        let h = "AB".repeat(32);
        assert_eq!(
            parse_sha256(&format!("{h}  /data/x\n")),
            Some(h.to_ascii_lowercase())
        );
        assert_eq!(parse_sha256("sha256sum: not found"), None);
        let m = "MemTotal:        7812000 kB\nMemAvailable:   3906000 kB\n";
        assert_eq!(meminfo_kib(m, "MemTotal"), Some(7812000));
        assert_eq!(meminfo_kib(m, "MemAvailable"), Some(3906000));
        assert_eq!(meminfo_kib(m, "SwapTotal"), None);
    }

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("/data/local/tmp/a.gguf"), "/data/local/tmp/a.gguf");
        assert_eq!(
            sh_quote("/data/my model's.gguf"),
            "'/data/my model'\\''s.gguf'"
        );
    }
}
