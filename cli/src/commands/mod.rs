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
pub mod validate;

use memwall_convert::export::ExportError;
use memwall_convert::job::ConvertError;
use memwall_quantize::job::JobError;
use memwall_runtime::gguf::{GgufError, GgufModel, LoadMode, available_memory};

/// A next step for the user, for errors where there is an obvious one.
pub fn hint(err: &anyhow::Error) -> Option<&'static str> {
    if let Some(job) = err.chain().find_map(|e| e.downcast_ref::<JobError>()) {
        match job {
            JobError::NonFinite { .. } => {
                return Some(
                    "the model's weights are damaged (NaN or infinite); convert it again from \
                     the original checkpoint",
                );
            }
            JobError::Metadata { .. } => {
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
        GgufError::Io { .. } => "check that the path exists and is readable",
        GgufError::Write { .. } => return None,
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
    /// Streaming mode for models larger than free RAM: lock this many MiB of the
    /// most reused weights (output head, then the first layers) and stream the
    /// rest from storage, reading ahead --prefetch layers.
    #[arg(long, value_name = "MiB", conflicts_with_all = ["mlock", "no_mmap"])]
    pub resident: Option<u64>,
    /// Layers read ahead in streaming mode.
    #[arg(long, default_value_t = 2, value_name = "N", requires = "resident")]
    pub prefetch: usize,
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
        let report = model.enable_streaming(memwall_runtime::forward::Streaming {
            resident_bytes: mib << 20,
            prefetch: self.prefetch,
        })?;
        Ok(Some(report))
    }
}

/// Bytes this process has caused to be read from storage (`read_bytes` of
/// `/proc/self/io`), where the OS reports it.
pub fn storage_read_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    let line = text.lines().find(|l| l.starts_with("read_bytes:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
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
            gguf.lock_memory().map_err(|e| {
                anyhow::anyhow!(
                    "{}: --mlock failed ({e}); raise the limit with `ulimit -l unlimited` or drop --mlock",
                    path.display()
                )
            })?;
        }
        Ok(gguf)
    }
}
