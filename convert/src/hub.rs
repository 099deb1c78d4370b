//! Checkpoints named by Hugging Face repo id (`org/name[@revision]`), found in
//! the local Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`) with the `hf-hub` crate's cache layout.
//! Downloading is not supported yet.

use std::path::PathBuf;

use hf_hub::{Cache, Repo, RepoType};

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

fn cache_root() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return Ok(PathBuf::from(p).join("hub"));
    }
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
        .ok_or_else(|| "no HF_HUB_CACHE, HF_HOME or HOME to find the Hugging Face cache".into())
}

/// The snapshot folder of `org/name[@revision]` (default revision `main`) in
/// the local cache.
pub fn resolve(spec: &str) -> Result<PathBuf, String> {
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
            .ok_or_else(|| format!("{}: unexpected cache layout", config.display()));
    }
    // A commit hash names its snapshot folder directly.
    let snapshot = root
        .join(format!("models--{}", id.replace('/', "--")))
        .join("snapshots")
        .join(revision);
    if snapshot.join("config.json").is_file() {
        return Ok(snapshot);
    }
    Err(format!(
        "{id} (revision {revision}) is not in the Hugging Face cache at {}; memwall does not download \
         yet: run `huggingface-cli download {id}` or pass a local checkpoint folder",
        root.display()
    ))
}
