//! Checkpoints named by Hugging Face repo id (`org/name[@revision]`), found in
//! the local Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`) with the `hf-hub` crate's cache layout, or
//! downloaded into it ([`download`]: the files a conversion reads, from
//! `HF_ENDPOINT` or huggingface.co, with `HF_TOKEN` for gated repos).

use std::path::PathBuf;

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};
use memwall_format::progress::{Progress, Unit};

/// Whether `spec` looks like a repo id rather than a path.
pub fn is_repo_id(spec: &str) -> bool {
    let id = spec.split('@').next().unwrap_or(spec);
    let mut parts = id.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none() && !id.starts_with('.')
}

/// Why a Hub repository could not be found or fetched.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// No environment variable says where the cache is.
    #[error("no HF_HUB_CACHE, HF_HOME or HOME to find the Hugging Face cache")]
    NoCache,
    /// A cached file outside a snapshot folder.
    #[error("{}: unexpected cache layout", .0.display())]
    Layout(PathBuf),
    /// The repository (at that revision) is not in the cache.
    #[error("{id} (revision {revision}) is not in the Hugging Face cache at {}", root.display())]
    NotCached {
        /// `org/name`.
        id: String,
        /// The revision asked for.
        revision: String,
        /// The cache folder.
        root: PathBuf,
    },
    /// Not cached, and downloads are off.
    #[error(
        "{0}, and HF_HUB_OFFLINE is set: unset it to download, or pass a local checkpoint folder"
    )]
    Offline(Box<HubError>),
    /// `config.json` is not cached and downloads are off.
    #[error("{0} is not in the Hugging Face cache and HF_HUB_OFFLINE is set")]
    OfflineConfig(String),
    /// The download client could not be set up.
    #[error("cannot set up downloads: {0}")]
    Client(String),
    /// Listing the repository failed.
    #[error(
        "{id} (revision {revision}): cannot list the repository: {message} (gated repositories need HF_TOKEN)"
    )]
    List {
        /// `org/name`.
        id: String,
        /// The revision asked for.
        revision: String,
        /// The client's message.
        message: String,
    },
    /// The repository is not a checkpoint memwall converts.
    #[error("{id}: {what}")]
    NotConvertible {
        /// `org/name`.
        id: String,
        /// What it lacks.
        what: &'static str,
    },
    /// A file could not be downloaded.
    #[error("{id}: downloading {file}: {message}{}", if *gated_hint { " (gated repositories need HF_TOKEN)" } else { "" })]
    Download {
        /// `org/name`.
        id: String,
        /// The file.
        file: String,
        /// The client's message.
        message: String,
        /// Whether to say that gated repositories need a token (the first
        /// request to a repository).
        gated_hint: bool,
    },
}

fn cache_root() -> Result<PathBuf, HubError> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return Ok(PathBuf::from(p).join("hub"));
    }
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
        .ok_or(HubError::NoCache)
}

/// The snapshot folder of `org/name[@revision]` (default revision `main`) in
/// the local cache.
pub fn resolve(spec: &str) -> Result<PathBuf, HubError> {
    let (id, revision) = match spec.split_once('@') {
        Some((id, rev)) => (id, rev),
        None => (spec, "main"),
    };
    let root = cache_root()?;
    let cache = Cache::new(root.clone());
    let repo = cache.repo(Repo::with_revision(
        id.to_owned(),
        RepoType::Model,
        revision.to_owned(),
    ));
    if let Some(config) = repo.get("config.json") {
        return config
            .parent()
            .map(PathBuf::from)
            .ok_or_else(|| HubError::Layout(config.clone()));
    }
    // A commit hash names its snapshot folder directly.
    let snapshot = root
        .join(format!("models--{}", id.replace('/', "--")))
        .join("snapshots")
        .join(revision);
    if snapshot.join("config.json").is_file() {
        return Ok(snapshot);
    }
    Err(HubError::NotCached {
        id: id.to_owned(),
        revision: revision.to_owned(),
        root,
    })
}

/// Files of a repository that a conversion reads.
pub fn wanted(name: &str) -> bool {
    const FILES: [&str; 11] = [
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "added_tokens.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "chat_template.json",
        "README.md",
    ];
    (name.ends_with(".safetensors") && !name.contains('/'))
        || FILES.contains(&name)
        || (name.starts_with("additional_chat_templates/") && name.ends_with(".jinja"))
}

/// Forwards hf-hub's per-file progress: one byte-counted stage per file.
struct Forward<'a>(&'a dyn Progress);

impl hf_hub::api::Progress for Forward<'_> {
    fn init(&mut self, size: usize, filename: &str) {
        self.0
            .start(&format!("downloading {filename}"), size as u64, Unit::Bytes);
    }
    fn update(&mut self, size: usize) {
        self.0.advance(size as u64);
    }
    fn finish(&mut self) {
        self.0.finish();
    }
}

/// Downloads the files of `org/name[@revision]` a conversion needs (safetensors
/// weights, config, tokenizer, model card) into the Hugging Face cache, skipping
/// those already there, and returns the snapshot folder.
pub fn download(spec: &str, progress: &dyn Progress) -> Result<PathBuf, HubError> {
    let (id, revision) = match spec.split_once('@') {
        Some((id, rev)) => (id, rev),
        None => (spec, "main"),
    };
    let root = cache_root()?;
    let api = hub_api(root.clone())?;
    let repo = Repo::with_revision(id.to_owned(), RepoType::Model, revision.to_owned());
    let remote = api.repo(repo.clone());
    let info = remote.info().map_err(|e| HubError::List {
        id: id.to_owned(),
        revision: revision.to_owned(),
        message: e.to_string(),
    })?;
    let files: Vec<String> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.clone())
        .filter(|f| wanted(f))
        .collect();
    if !files.iter().any(|f| f == "config.json") {
        return Err(HubError::NotConvertible {
            id: id.to_owned(),
            what: "no config.json; not a transformers checkpoint",
        });
    }
    if !files.iter().any(|f| f.ends_with(".safetensors")) {
        return Err(HubError::NotConvertible {
            id: id.to_owned(),
            what: "no .safetensors weights (memwall converts safetensors checkpoints, not .bin or .pth)",
        });
    }
    let cached = Cache::new(root).repo(repo);
    let mut snapshot = None;
    for f in &files {
        progress.item(f);
        let path = match cached.get(f) {
            Some(p) => p,
            None => remote
                .download_with_progress(f, Forward(progress))
                .map_err(|e| HubError::Download {
                    id: id.to_owned(),
                    file: f.clone(),
                    message: e.to_string(),
                    gated_hint: false,
                })?,
        };
        if f == "config.json" {
            snapshot = path.parent().map(PathBuf::from);
        }
    }
    snapshot.ok_or_else(|| HubError::NotConvertible {
        id: id.to_owned(),
        what: "config.json has no snapshot folder",
    })
}

/// The checkpoint folder for `org/name[@revision]`: from the cache, else
/// downloaded, unless `HF_HUB_OFFLINE` is set.
pub fn resolve_or_download(spec: &str, progress: &dyn Progress) -> Result<PathBuf, HubError> {
    match resolve(spec) {
        Ok(dir) => Ok(dir),
        Err(missing) => {
            let offline = std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| v == "1" || v == "true");
            if offline {
                return Err(HubError::Offline(Box::new(missing)));
            }
            download(spec, progress)
        }
    }
}

/// The Hub client over the cache at `root`, honouring HF_ENDPOINT and HF_TOKEN.
fn hub_api(root: PathBuf) -> Result<hf_hub::api::sync::Api, HubError> {
    let mut builder = ApiBuilder::from_cache(Cache::new(root)).with_progress(false);
    if let Ok(endpoint) = std::env::var("HF_ENDPOINT") {
        builder = builder.with_endpoint(endpoint);
    }
    if let Ok(token) = std::env::var("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    builder.build().map_err(|e| HubError::Client(e.to_string()))
}

/// Downloads only `config.json` of `org/name[@revision]` into the Hugging Face
/// cache (what `memwall plan` needs: shapes, not weights) and returns its folder.
pub fn fetch_config(spec: &str) -> Result<PathBuf, HubError> {
    if std::env::var_os("HF_HUB_OFFLINE").is_some_and(|v| v != "0") {
        return Err(HubError::OfflineConfig(spec.to_owned()));
    }
    let (id, revision) = match spec.split_once('@') {
        Some((id, rev)) => (id, rev),
        None => (spec, "main"),
    };
    let api = hub_api(cache_root()?)?;
    let repo = Repo::with_revision(id.to_owned(), RepoType::Model, revision.to_owned());
    let path = api
        .repo(repo)
        .get("config.json")
        .map_err(|e| HubError::Download {
            id: id.to_owned(),
            file: "config.json".into(),
            message: e.to_string(),
            gated_hint: true,
        })?;
    path.parent()
        .map(PathBuf::from)
        .ok_or(HubError::Layout(path.clone()))
}
