//! One module per subcommand: `run(args)` turns parsed arguments into work in
//! the libraries and renders the result.

pub mod bench;
pub mod calibrate;
pub mod compare;
pub mod convert;
pub mod demo;
pub mod export;
pub mod inspect;
pub mod perplexity;
pub mod plan;
pub mod push;
pub mod quantize;
pub mod run;
pub mod tokenize;
pub mod validate;

use memwall_convert::export::ExportError;
use memwall_convert::job::ConvertError;
use std::path::Path;

use memwall_format::gguf::{GgufError, GgufModel, LoadMode};
use memwall_format::kv_override::KvOverride;
use memwall_quantize::job::JobError;
use memwall_runtime::residency::{available_memory, lock_model};

/// llama.cpp's `string_process_escapes`: `\n \r \t \' \" \\` and `\xHH`;
/// any other backslash stays as it is.
pub fn process_escapes(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'\\' && i + 1 < input.len() {
            i += 1;
            match input[i] {
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b't' => out.push(b'\t'),
                b'\'' => out.push(b'\''),
                b'"' => out.push(b'"'),
                b'\\' => out.push(b'\\'),
                b'x' if i + 2 < input.len()
                    && input[i + 1].is_ascii_hexdigit()
                    && input[i + 2].is_ascii_hexdigit() =>
                {
                    let hex = [input[i + 1], input[i + 2]];
                    let text = std::str::from_utf8(&hex).unwrap_or("00");
                    out.push(u8::from_str_radix(text, 16).unwrap_or(0));
                    i += 2;
                }
                other => {
                    out.push(b'\\');
                    out.push(other);
                }
            }
        } else {
            out.push(input[i]);
        }
        i += 1;
    }
    out
}

/// `text` with llama.cpp's escapes processed (see [`process_escapes`]), which
/// must leave UTF-8 text; `what` names it in the error.
pub fn unescape(text: &str, what: &str) -> anyhow::Result<String> {
    String::from_utf8(process_escapes(text.as_bytes())).map_err(|e| {
        anyhow::anyhow!(
            "{what}: its \\xHH escapes make byte {} not UTF-8 (or pass --no-escape)",
            e.utf8_error().valid_up_to()
        )
    })
}

/// Parses `--override-kv KEY=TYPE:VALUE` arguments as llama-quantize takes
/// them: one override each.
pub fn parse_overrides(specs: &[String]) -> anyhow::Result<Vec<KvOverride>> {
    specs
        .iter()
        .map(|s| KvOverride::parse(s).map_err(anyhow::Error::from))
        .collect()
}

/// Parses `--override-kv` arguments as llama-cli takes them: each a
/// comma-separated list.
pub fn parse_override_lists(specs: &[String]) -> anyhow::Result<Vec<KvOverride>> {
    let mut all = Vec::new();
    for s in specs {
        all.extend(KvOverride::parse_list(s)?);
    }
    Ok(all)
}

/// Opens a model to run, with `--override-kv` applied to what is read of it.
pub fn apply_overrides(gguf: &mut GgufModel, overrides: &[KvOverride]) {
    for o in overrides {
        gguf.metadata_mut().set(o.key.clone(), o.loaded());
    }
}

/// Refuses a model path that is a folder, before anything is mapped (mapping
/// a folder fails with "No such device"): a checkpoint folder gets the
/// command that converts it.
pub fn check_model_path(path: &Path) -> anyhow::Result<()> {
    if path.is_dir() {
        if path.join("config.json").is_file() {
            anyhow::bail!(
                "{}: this is a Hugging Face checkpoint folder, not a GGUF file; convert it \
                 first: memwall convert {}",
                path.display(),
                path.display()
            );
        }
        anyhow::bail!(
            "{}: this is a folder; give a .gguf file (for a split model, any of its files)",
            path.display()
        );
    }
    Ok(())
}

/// Opens the GGUF model the user named (see [`check_model_path`]).
pub fn open_model(path: &Path) -> anyhow::Result<GgufModel> {
    check_model_path(path)?;
    Ok(GgufModel::open(path)?)
}

/// The folder an output path goes into (`.` for a bare file name).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Checks, before any work, that the file `path` (`what`: "the output", "the
/// recipe"…) can be written where the user asked: its folder exists (memwall
/// creates no missing folders, for every command) and `path` is not a folder.
pub fn check_output_file(path: &Path, what: &str) -> anyhow::Result<()> {
    if path.is_dir() {
        anyhow::bail!(
            "{}: is a folder; name a file for {what} (e.g. {})",
            path.display(),
            path.join("out.gguf").display()
        );
    }
    check_parent(path, what)
}

/// Checks that the folder an output folder `path` goes into exists; `path`
/// itself is created by the command.
pub fn check_output_dir(path: &Path, what: &str) -> anyhow::Result<()> {
    if path.exists() && !path.is_dir() {
        anyhow::bail!(
            "{}: is a file; {what} is a folder: name a folder that does not exist yet",
            path.display()
        );
    }
    check_parent(path, what)
}

fn check_parent(path: &Path, what: &str) -> anyhow::Result<()> {
    let folder = folder_of(path);
    if folder.is_dir() {
        return Ok(());
    }
    // The nearest existing ancestor tells a missing folder from a file in the way.
    let blocked = folder.ancestors().find(|a| a.exists() && !a.is_dir());
    match blocked {
        Some(file) => anyhow::bail!(
            "{}: cannot write {what} there: a folder in the path is a file ({}); choose \
             another path",
            path.display(),
            file.display()
        ),
        None => anyhow::bail!(
            "{}: cannot write {what} there: the folder {} does not exist (memwall creates no \
             missing folders: `mkdir -p {}` first, or choose another path)",
            path.display(),
            folder.display(),
            folder.display()
        ),
    }
}

/// A next step for the user, for errors where there is an obvious one.
pub fn hint(err: &anyhow::Error) -> Option<&'static str> {
    if let Some(hint) = os_error(err).and_then(os_hint) {
        return Some(hint);
    }
    if let Some(job) = err.chain().find_map(|e| e.downcast_ref::<JobError>()) {
        match job {
            JobError::NonFinite { .. } => {
                return Some(
                    "the model's weights are damaged (NaN or infinite); convert it again from \
                     the original checkpoint",
                );
            }
            JobError::Metadata { .. } | JobError::Facts { .. } => {
                return Some(
                    "the file lacks model metadata; is it a model converted by llama.cpp or memwall?",
                );
            }
            _ => {}
        }
    }
    // Transparent wrappers hide the GGUF error from the source chain.
    let gguf = err.chain().find_map(|e| {
        e.downcast_ref::<GgufError>()
            .or_else(|| match e.downcast_ref::<ExportError>() {
                Some(ExportError::Gguf(g)) => Some(g),
                _ => None,
            })
            .or_else(|| match e.downcast_ref::<ConvertError>() {
                Some(ConvertError::Gguf(g)) => Some(g),
                _ => None,
            })
    })?;
    Some(match gguf {
        GgufError::Format { .. } => {
            "the file is damaged, truncated or not GGUF; download or convert it again \
             (a .safetensors checkpoint needs `memwall convert` first)"
        }
        GgufError::Split { .. } => {
            "keep all files of a split model in one folder with the names llama-gguf-split gave them"
        }
        GgufError::Io { path, .. } if path.extension().is_some_and(|e| e == "partial") => {
            "the output could not be written: check that its folder exists and is writable"
        }
        GgufError::Io { .. } => "check that the path exists and is readable",
        GgufError::Write { .. } => return None,
    })
}

/// Limits this process's address space (RLIMIT_AS) to `bytes`: an allocation
/// past it fails, and Rust aborts the process, instead of the system running
/// out of memory. For the child that renders a chat template.
pub(crate) fn limit_address_space(bytes: u64) -> anyhow::Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read or fill the struct they are
    // given and change only this process's limits.
    let ok = unsafe {
        libc::getrlimit(libc::RLIMIT_AS, &mut limit) == 0 && {
            // A lower limit already set (`ulimit -v`) stays.
            let bytes = (bytes as libc::rlim_t).min(limit.rlim_max);
            limit.rlim_cur = bytes;
            limit.rlim_max = bytes;
            libc::setrlimit(libc::RLIMIT_AS, &limit) == 0
        }
    };
    if !ok {
        anyhow::bail!(
            "cannot limit the memory of the chat template renderer: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// What to do about a failed read or write, by its OS error.
fn os_hint(code: i32) -> Option<&'static str> {
    Some(match code {
        libc::EFBIG => {
            "the file-size limit was reached (`ulimit -f`): raise it, or write the output elsewhere"
        }
        libc::ENOSPC | libc::EDQUOT => {
            "the disk is full (or the quota used up): free some space, or write the output to \
             another disk"
        }
        libc::EROFS => "the file system is read-only: write the output elsewhere",
        libc::EACCES | libc::EPERM => {
            "permission denied: check that the output folder is writable and the inputs readable"
        }
        libc::ENOTDIR => "a folder in the path is a file: check the output path",
        _ => return None,
    })
}

/// The OS error code behind a failed read or write, wherever the libraries
/// keep it (some keep the `io::Error` as a field, not as the source).
fn os_error(err: &anyhow::Error) -> Option<i32> {
    use memwall_calibrate::CalibrateError;
    fn gguf(g: &GgufError) -> Option<&std::io::Error> {
        match g {
            GgufError::Io { error, .. } => Some(error),
            _ => None,
        }
    }
    let typed = err.chain().find_map(|e| {
        let io = e
            .downcast_ref::<std::io::Error>()
            .or_else(|| e.downcast_ref::<GgufError>().and_then(gguf))
            .or_else(|| match e.downcast_ref::<JobError>()? {
                JobError::Io { error, .. } => Some(error),
                JobError::Gguf(g) => gguf(g),
                _ => None,
            })
            .or_else(|| match e.downcast_ref::<ConvertError>()? {
                ConvertError::Gguf(g) => gguf(g),
                _ => None,
            })
            .or_else(|| match e.downcast_ref::<ExportError>()? {
                ExportError::Gguf(g) => gguf(g),
                _ => None,
            })
            .or_else(|| match e.downcast_ref::<CalibrateError>()? {
                CalibrateError::Io { error, .. } => Some(error),
                CalibrateError::Gguf(g) => gguf(g),
                _ => None,
            });
        io.and_then(std::io::Error::raw_os_error)
    });
    // Errors that reached here as text end with io::Error's "(os error N)".
    typed.or_else(|| {
        let text = err.root_cause().to_string();
        let code = text.strip_suffix(')')?.rsplit_once("(os error ")?.1;
        code.parse().ok()
    })
}

/// How a model is brought into memory, for the commands that run one.
#[derive(clap::Args)]
pub struct LoadArgs {
    /// Read the whole model into memory instead of mapping it.
    #[arg(long)]
    pub no_mmap: bool,
    /// Lock the model in RAM (no paging out); warns when it exceeds the free memory.
    #[arg(long)]
    pub mlock: bool,
    /// Streaming mode for models larger than free RAM: hold this many MiB of
    /// weights in RAM — the most reused ones locked (output head, then the first
    /// layers), plus buffers into which the rest is read from storage,
    /// --prefetch layers ahead of the computation.
    #[arg(long, value_name = "MiB", conflicts_with_all = ["mlock", "no_mmap"])]
    pub resident: Option<u64>,
    /// Layers' worth of weights read ahead in streaming mode (the read-ahead
    /// buffers hold this much plus one matrix, at least two matrices).
    #[arg(long, default_value_t = 1, value_name = "N", requires = "resident")]
    pub prefetch: usize,
    /// With --resident on a mixture of experts: fill the expert cache at start
    /// with the experts an importance matrix (memwall calibrate's or
    /// llama-imatrix's GGUF, whose per-expert counts say how often each was
    /// routed to) found most used.
    #[arg(long, value_name = "IMATRIX", requires = "resident")]
    pub expert_profile: Option<std::path::PathBuf>,
    /// With --resident on a mixture of experts: while the reader is idle, also
    /// read the experts the previous token used in the next layer (helps when
    /// consecutive tokens share experts; costs storage reads when they do not).
    #[arg(long, requires = "resident")]
    pub expert_guess: bool,
}

impl LoadArgs {
    /// Turns on streaming when `--resident` is given; returns what it set up.
    pub fn stream(
        &self,
        model: &mut memwall_runtime::forward::Model,
    ) -> anyhow::Result<Option<memwall_runtime::forward::StreamingReport>> {
        let Some(mib) = self.resident else {
            return Ok(None);
        };
        let mut report = model.enable_streaming(memwall_runtime::forward::Streaming {
            resident_bytes: mib << 20,
            prefetch: self.prefetch,
            speculate: self.expert_guess,
        })?;
        if let Some(path) = &self.expert_profile {
            check_model_path(path)?;
            use anyhow::Context as _;
            let profile = GgufModel::open(path)
                .with_context(|| format!("{}: cannot read the expert profile", path.display()))?;
            let read = model.prewarm_experts(&profile).with_context(|| {
                format!(
                    "{}: not an expert profile for this model (make one with `memwall \
                     calibrate imatrix` on text like yours)",
                    path.display()
                )
            })?;
            if let Some(x) = report.experts.as_mut() {
                x.prewarmed = read;
            }
        }
        Ok(Some(report))
    }
}

impl LoadArgs {
    /// Opens a model for running: mapped (default) or read (`--no-mmap`), and
    /// with `--mlock` locked in RAM, warning first when that is more than the
    /// memory available (a phone's OS kills the process without a message).
    pub fn open(&self, path: &std::path::Path) -> anyhow::Result<GgufModel> {
        let mode = if self.no_mmap {
            LoadMode::Read
        } else {
            LoadMode::Mmap
        };
        check_model_path(path)?;
        let gguf = GgufModel::open_with(path, mode)?;
        if self.mlock {
            let size = gguf.total_file_size();
            if let Some(free) = available_memory().filter(|&free| size > free) {
                eprintln!(
                    "memwall: warning: --mlock pins {} but only {} is available; the system may \
                     kill memwall (drop --mlock to let pages be evicted)",
                    crate::render::human_bytes(size),
                    crate::render::human_bytes(free)
                );
            }
            lock_model(&gguf).map_err(|e| {
                anyhow::anyhow!(
                    "{}: --mlock failed ({e}); raise the limit with `ulimit -l unlimited` or drop --mlock",
                    path.display()
                )
            })?;
        }
        Ok(gguf)
    }
}

#[cfg(test)]
mod tests {
    use super::process_escapes;

    #[test]
    fn escapes_are_llama_cpps() {
        assert_eq!(process_escapes(br#"a\nb\tc\\d\'e\"f"#), b"a\nb\tc\\d'e\"f");
        assert_eq!(process_escapes(br"\x41\x4"), b"A\\x4");
        assert_eq!(process_escapes(br"\q\"), b"\\q\\");
        assert_eq!(process_escapes(br"\xe4\xb8\xad"), "中".as_bytes());
    }
}
