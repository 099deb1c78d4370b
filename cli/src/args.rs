//! Argument groups the commands share (`#[command(flatten)]`), spelled as
//! llama.cpp's tools spell the same thing: `-m/--model`, `-c/--ctx-size`,
//! `-b/--batch-size`, `-t/--threads`, `-f/--file`, `-d/--device`. A command
//! that reads a model takes it as its first argument or with `-m`.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The model a command reads: its first argument, or `-m/--model` as
/// llama.cpp's tools take it.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArg {
    /// The GGUF model (any file of a split model); or give it with -m.
    #[arg(
        value_name = "MODEL",
        required_unless_present = "model_flag",
        index = 1
    )]
    pub model: Option<PathBuf>,
    /// The model, as llama.cpp's tools take it (instead of the first argument).
    #[arg(short = 'm', long = "model", value_name = "MODEL", id = "model_flag")]
    pub model_flag: Option<PathBuf>,
}

impl ModelArg {
    /// The model, for a command that takes no other positional argument.
    pub fn path(&self) -> Result<&Path> {
        match (&self.model, &self.model_flag) {
            (Some(p), Some(m)) if p != m => bail!(
                "two models: {} and -m {}; give the model once (this command reads one model)",
                p.display(),
                m.display()
            ),
            (_, Some(m)) => Ok(m),
            (Some(p), None) => Ok(p),
            (None, None) => bail!("give the model: MODEL or -m MODEL"),
        }
    }

    /// The model and, when it came with `-m`, the first positional argument,
    /// which then belongs to the arguments after the model (clap fills the
    /// first positional slot with it).
    pub fn split(&self) -> Result<(PathBuf, Option<PathBuf>)> {
        match (&self.model, &self.model_flag) {
            (p, Some(m)) => Ok((m.clone(), p.clone())),
            (Some(p), None) => Ok((p.clone(), None)),
            (None, None) => bail!("give the model: MODEL or -m MODEL"),
        }
    }
}

/// `-t/--threads`.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct Threads {
    /// Threads (default: every core). Results do not depend on it.
    #[arg(short = 't', long = "threads", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub threads: Option<u32>,
}

impl Threads {
    /// The count given, or every core.
    pub fn count(&self) -> usize {
        match self.threads {
            Some(t) => t as usize,
            None => all_cores(),
        }
    }

    /// The count given, if any.
    pub fn given(&self) -> Option<usize> {
        self.threads.map(|t| t as usize)
    }
}

/// The cores this process may use.
pub fn all_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `-c/--ctx-size` with a default (`--ctx` is kept as an alias), one group
/// per default (clap keeps a default's text in a static that generic groups
/// would share).
macro_rules! ctx_group {
    ($name:ident, $default:literal) => {
        #[doc = concat!("`-c/--ctx-size`, ", stringify!($default), " by default.")]
        #[derive(clap::Args, Clone, Copy, Debug)]
        pub struct $name {
            /// Context length in tokens.
            #[arg(short = 'c', long = "ctx-size", visible_alias = "ctx", value_name = "N",
                  default_value_t = $default,
                  value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
            pub ctx: usize,
        }
    };
}

ctx_group!(Ctx512, 512);
ctx_group!(Ctx2048, 2048);

/// `-b/--batch-size` with a default (`--batch` is kept as an alias).
macro_rules! batch_group {
    ($name:ident, $default:literal) => {
        #[doc = concat!("`-b/--batch-size`, ", stringify!($default), " by default.")]
        #[derive(clap::Args, Clone, Copy, Debug)]
        pub struct $name {
            /// Tokens evaluated per forward call (bounds the working memory, as llama.cpp's -b).
            #[arg(short = 'b', long = "batch-size", visible_alias = "batch", value_name = "N",
                  default_value_t = $default,
                  value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
            pub batch: usize,
        }
    };
}

batch_group!(Batch512, 512);
batch_group!(Batch2048, 2048);

/// `-d/--device`: the device profile of speed and memory estimates.
#[derive(clap::Args, Clone, Debug)]
pub struct DeviceArg {
    /// Device profile: a built-in name (`memwall plan --list-devices`) or a TOML file.
    #[arg(short = 'd', long = "device", value_name = "PROFILE", default_value = DEFAULT_DEVICE)]
    pub device: String,
}

/// The device profile when `--device` is not given.
pub const DEFAULT_DEVICE: &str = "phone-16gb";
