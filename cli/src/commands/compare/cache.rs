//! The quantizations `memwall compare` makes, kept between runs.
//!
//! `<cache>/<base stem>-<TYPE>.gguf` is written by the quantize job (atomically:
//! `.partial`, then renamed), and beside it `<base stem>-<TYPE>.gguf.json`
//! records what it was made from. A file is reused only when that record names
//! the same memwall version, the same type, and a base whose every file has the
//! same size, modification time and SHA-256 of its first and last MiB, and when
//! the quantized file still has the size it was written with. Anything else —
//! no record, a changed or touched base, a truncated output — remakes it.
//!
//! Hashing only the ends keeps the check instant on a 70 GB base; the header
//! and first tensors (first MiB), the last tensors (last MiB), the size and the
//! modification time together catch a re-conversion or an edit in practice.
//! Two comparisons writing the same cache at the same time are not supported
//! (they would share the `.partial` file).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, UNIX_EPOCH};

use anyhow::{Context, Result};
use memwall_format::atomic::AtomicFile;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Progress;
use memwall_quantize::fit::Choice;
use memwall_quantize::job;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Bytes hashed at each end of a base file.
const END_BYTES: u64 = 1 << 20;

/// How a quantized file came to be.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Made {
    /// Quantized in this run, in this many seconds.
    Now(f64),
    /// Reused from the cache.
    Cached,
}

/// The identity of the base model's files, as recorded in the sidecars.
pub(super) fn base_key(model: &GgufModel) -> Result<Value> {
    let files = model
        .files()
        .iter()
        .map(|f| file_key(f.path()))
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({ "files": files }))
}

fn file_key(path: &Path) -> Result<Value> {
    let context = || format!("{}: reading the base model", path.display());
    let mut file = std::fs::File::open(path).with_context(context)?;
    let meta = file.metadata().with_context(context)?;
    let size = meta.len();
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos().to_string());
    let mut hash = Sha256::new();
    hash.update(size.to_le_bytes());
    let mut buf = vec![0u8; END_BYTES.min(size) as usize];
    file.read_exact(&mut buf).with_context(context)?;
    hash.update(&buf);
    let tail = size.saturating_sub(END_BYTES).max(END_BYTES.min(size));
    file.seek(SeekFrom::Start(tail)).with_context(context)?;
    buf.resize((size - tail) as usize, 0);
    file.read_exact(&mut buf).with_context(context)?;
    hash.update(&buf);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(json!({
        "name": name,
        "bytes": size,
        "modified_unix_ns": modified,
        "ends_sha256": format!("{:x}", hash.finalize()),
    }))
}

/// `<out>.json`, the record beside a cached file.
fn sidecar(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

fn record(choice: &Choice, base: &Value, out_bytes: u64) -> Value {
    json!({
        "memwall": env!("CARGO_PKG_VERSION"),
        "type": choice.label,
        "recipe": choice.recipe.as_ref().map(|r| r.to_toml()),
        "base": base,
        "bytes": out_bytes,
    })
}

/// Whether `out` holds a usable quantization to `choice` of the base described by `base`.
fn is_current(out: &Path, choice: &Choice, base: &Value) -> bool {
    let Ok(text) = std::fs::read_to_string(sidecar(out)) else {
        return false;
    };
    let Ok(saved) = serde_json::from_str::<Value>(&text) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata(out) else {
        return false;
    };
    saved == record(choice, base, meta.len())
}

/// Makes (or reuses) the quantization of `base` to `choice` at `out`.
/// Returns how it came to be and the quantize plan's warnings.
pub(super) fn ensure(
    base: &GgufModel,
    base_path: &Path,
    base_key: &Value,
    choice: &Choice,
    out: &Path,
    pool: &rayon::ThreadPool,
    progress: &dyn Progress,
) -> Result<(Made, Vec<String>)> {
    if is_current(out, choice, base_key) {
        return Ok((Made::Cached, Vec::new()));
    }
    // A stale record must not outlive the file it described.
    match std::fs::remove_file(sidecar(out)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("{}: removing", sidecar(out).display()));
        }
        _ => {}
    }
    let mut options = job::Options::new(choice.ftype);
    options.recipe = choice.recipe.clone();
    let context = || {
        format!(
            "quantizing {} to {}",
            base_path.display(),
            choice.label.as_str()
        )
    };
    let plan = job::plan(base, base_path, &options).with_context(context)?;
    let started = Instant::now();
    let written = pool
        .install(|| job::run(base, &plan, None, false, out, progress))
        .with_context(context)?;
    let seconds = started.elapsed().as_secs_f64();
    let bytes: u64 = written
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()
        .with_context(|| format!("{}: reading back", out.display()))?;
    let path = sidecar(out);
    let text = serde_json::to_string_pretty(&record(choice, base_key, bytes))? + "\n";
    let mut file =
        AtomicFile::create(&path).with_context(|| format!("{}: writing", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.commit())
        .with_context(|| format!("{}: writing", path.display()))?;
    Ok((Made::Now(seconds), plan.warnings))
}
