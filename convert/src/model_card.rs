//! The model card: the YAML front matter of a checkpoint's `README.md`, read as
//! gguf-py's `Metadata.load_model_card` and `apply_metadata_heuristic` read it
//! (llama.cpp 0c1e570, `gguf-py/gguf/metadata.py`): naming fields the card
//! states outright, license, base models, datasets, tags and languages.
//!
//! The YAML is parsed with `yaml-rust2` (YAML 1.2 core schema) after gguf-py's
//! two textual fixes (`- no` quoted, tabs as two spaces); PyYAML's YAML 1.1
//! extras (`yes`/`on` booleans, dates) do not occur in the fields read here.

use std::path::{Path, PathBuf};

use yaml_rust2::{ScanError, Yaml, YamlLoader};

use crate::naming::{id_parts, id_to_title};

/// Largest `README.md` read (the front matter is at its top).
const MAX_CARD: u64 = 4 << 20;

/// Why a model card could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    /// `README.md` could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The card.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The front matter is not YAML.
    #[error("{}: front matter is not valid YAML: {error}", path.display())]
    Yaml {
        /// The card.
        path: PathBuf,
        /// The parser's error.
        error: ScanError,
    },
}

/// One base model or dataset entry, fields in gguf-py's writing order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Source {
    /// `name`.
    pub name: Option<String>,
    /// `author`.
    pub author: Option<String>,
    /// `version`.
    pub version: Option<String>,
    /// `organization`.
    pub organization: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// `url`.
    pub url: Option<String>,
    /// `doi`.
    pub doi: Option<String>,
    /// `uuid`.
    pub uuid: Option<String>,
    /// `repo_url`.
    pub repo_url: Option<String>,
}

/// What the card contributes to the `general.*` keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Card {
    /// `general.name`.
    pub name: Option<String>,
    /// `general.author`.
    pub author: Option<String>,
    /// `general.version`.
    pub version: Option<String>,
    /// `general.organization`.
    pub organization: Option<String>,
    /// `general.description`.
    pub description: Option<String>,
    /// `general.finetune`.
    pub finetune: Option<String>,
    /// `general.basename`.
    pub basename: Option<String>,
    /// `general.size_label`.
    pub size_label: Option<String>,
    /// `general.source.url`, `.doi`, `.uuid`, `.repo_url`.
    pub source: [Option<String>; 4],
    /// `general.license` (a list is joined with commas).
    pub license: Option<String>,
    /// `general.license.name`.
    pub license_name: Option<String>,
    /// `general.license.link`.
    pub license_link: Option<String>,
    /// `general.base_model.*`; `None` when the card names none.
    pub base_models: Option<Vec<Source>>,
    /// `general.dataset.*`.
    pub datasets: Option<Vec<Source>>,
    /// `general.tags` (tags, then the pipeline tag).
    pub tags: Option<Vec<String>>,
    /// `general.languages`.
    pub languages: Option<Vec<String>>,
}

/// A scalar as the string gguf-py would write (Python's `str` of it).
fn text(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(if *b { "True" } else { "False" }.to_owned()),
        _ => None,
    }
}

/// The front matter of `README.md` in `dir` as a YAML mapping, or `None`.
fn front_matter(dir: &Path) -> Result<Option<Yaml>, CardError> {
    use std::io::Read;
    let path = dir.join("README.md");
    let Ok(file) = std::fs::File::open(&path) else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    file.take(MAX_CARD)
        .read_to_end(&mut bytes)
        .map_err(|error| CardError::Io {
            path: path.clone(),
            error,
        })?;
    let content = String::from_utf8_lossy(&bytes);
    let mut lines = content.lines();
    if lines.next() != Some("---") {
        return Ok(None);
    }
    let mut yaml = String::new();
    for line in lines {
        if line == "---" {
            break;
        }
        yaml.push_str(line);
        yaml.push('\n');
    }
    // gguf-py's fixes: the Norway problem, and tabs (as in some Qwen cards).
    let yaml = yaml.replace("- no\n", "- \"no\"\n").replace('\t', "  ");
    let docs = YamlLoader::load_from_str(&yaml).map_err(|error| CardError::Yaml { path, error })?;
    Ok(docs
        .into_iter()
        .next()
        .filter(|d| matches!(d, Yaml::Hash(_))))
}

fn get<'a>(card: &'a Yaml, key: &str) -> Option<&'a Yaml> {
    match card {
        Yaml::Hash(h) => h.get(&Yaml::String(key.to_owned())),
        _ => None,
    }
}

/// Base models or datasets: a string or list of ids, URLs or mappings.
fn sources(value: Option<&Yaml>, total_params: i64) -> Vec<Source> {
    let items: Vec<&Yaml> = match value {
        Some(Yaml::Array(a)) => a.iter().collect(),
        Some(y @ Yaml::String(_)) => vec![y],
        _ => Vec::new(),
    };
    #[expect(clippy::expect_used, reason = "a literal pattern, exercised by tests")]
    let hf_url = regex::Regex::new(r"^https?://huggingface.co/([^/]+/[^/]+)$").expect("valid");
    items
        .into_iter()
        .map(|item| {
            let mut s = Source::default();
            match item {
                Yaml::String(id) => {
                    let from_id = |s: &mut Source, id: &str, repo: bool| {
                        let p = id_parts(id, total_params);
                        s.name = p.full_name.as_deref().map(id_to_title);
                        s.organization = p.organization.as_deref().map(id_to_title);
                        s.version = p.version.clone();
                        if repo {
                            if let (Some(org), Some(name)) = (&p.organization, &p.full_name) {
                                s.repo_url = Some(format!("https://huggingface.co/{org}/{name}"));
                            }
                        }
                    };
                    if ["http://", "https://", "ssh://"]
                        .iter()
                        .any(|p| id.starts_with(p))
                    {
                        s.repo_url = Some(id.clone());
                        if id.contains("huggingface.co") {
                            if let Some(m) = hf_url.captures(id) {
                                from_id(&mut s, &m[1], false);
                            }
                        }
                    } else {
                        from_id(&mut s, id, true);
                    }
                }
                Yaml::Hash(_) => {
                    let field = |k: &str| get(item, k).and_then(text);
                    s = Source {
                        name: field("name"),
                        author: field("author"),
                        version: field("version"),
                        organization: field("organization"),
                        description: field("description"),
                        url: field("url"),
                        doi: field("doi"),
                        uuid: field("uuid"),
                        repo_url: field("repo_url"),
                    };
                }
                // gguf-py logs an error and still counts an empty entry.
                _ => {}
            }
            s
        })
        .collect()
}

/// gguf-py's `value.get(a, value.get(b, value.get(c)))`: the first key present
/// wins, even when its value is null.
fn first_present<'a>(card: &'a Yaml, keys: &[&str]) -> Option<Option<&'a Yaml>> {
    keys.iter().find_map(|k| {
        get(card, k).map(|v| match v {
            Yaml::Null => None,
            v => Some(v),
        })
    })
}

/// Reads the model card of the checkpoint in `dir`; an absent card, or one
/// without front matter, gives an empty [`Card`].
pub fn load(dir: &Path, total_params: i64) -> Result<Card, CardError> {
    let Some(y) = front_matter(dir)? else {
        return Ok(Card::default());
    };
    let mut c = Card::default();
    // `use_model_card_metadata`: the first present key fills a field still empty.
    let fill = |slot: &mut Option<String>, keys: &[&str]| {
        for k in keys {
            if slot.is_none() {
                if let Some(v) = get(&y, k) {
                    *slot = text(v);
                }
            }
        }
    };
    fill(&mut c.name, &["name", "model_name"]);
    fill(&mut c.author, &["author", "model_author", "model_creator"]);
    fill(&mut c.version, &["version", "model_version"]);
    fill(&mut c.organization, &["organization", "model_organization"]);
    fill(&mut c.description, &["description", "model_description"]);
    fill(&mut c.finetune, &["finetune", "model_finetune"]);
    fill(
        &mut c.basename,
        &["basename", "model_basename", "model_type"],
    );
    fill(&mut c.size_label, &["size_label", "model_size_label"]);
    for (slot, keys) in c.source.iter_mut().zip([
        ["url", "model_url"],
        ["doi", "model_doi"],
        ["uuid", "model_uuid"],
        ["repo_url", "model_repo_url"],
    ]) {
        fill(slot, &keys);
    }
    if let Some(v) = first_present(&y, &["base_model", "base_models", "base_model_sources"]) {
        c.base_models = Some(sources(v, total_params));
    }
    if let Some(v) = first_present(&y, &["datasets", "dataset", "dataset_sources"]) {
        c.datasets = Some(sources(v, total_params));
    }
    c.license = match get(&y, "license") {
        Some(Yaml::Array(a)) => Some(a.iter().filter_map(text).collect::<Vec<_>>().join(",")),
        Some(v) => text(v),
        None => None,
    };
    fill(&mut c.license_name, &["license_name"]);
    fill(&mut c.license_link, &["license_link"]);
    // `use_array_model_card_metadata`: strings and lists append.
    let append = |slot: &mut Option<Vec<String>>, key: &str| match get(&y, key) {
        Some(Yaml::Array(a)) => slot
            .get_or_insert_with(Vec::new)
            .extend(a.iter().filter_map(text)),
        Some(Yaml::String(s)) => slot.get_or_insert_with(Vec::new).push(s.clone()),
        _ => {}
    };
    append(&mut c.tags, "tags");
    append(&mut c.tags, "pipeline_tag");
    append(&mut c.languages, "languages");
    append(&mut c.languages, "language");
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_front_matter_like_gguf_py() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("README.md"),
            "---\nlicense: apache-2.0\nlanguage:\n- en\n- no\ntags:\n\t- chat\npipeline_tag: text-generation\n\
             base_model: Qwen/Qwen2.5-32B\ndatasets: https://example.com/data\n---\n# Title\n",
        )
        .unwrap();
        let c = load(dir.path(), 0).unwrap();
        assert_eq!(c.license.as_deref(), Some("apache-2.0"));
        assert_eq!(c.languages, Some(vec!["en".into(), "no".into()]));
        assert_eq!(c.tags, Some(vec!["chat".into(), "text-generation".into()]));
        let base = &c.base_models.unwrap()[0];
        assert_eq!(base.name.as_deref(), Some("Qwen2.5 32B"));
        assert_eq!(base.organization.as_deref(), Some("Qwen"));
        assert_eq!(
            base.repo_url.as_deref(),
            Some("https://huggingface.co/Qwen/Qwen2.5-32B")
        );
        // Not a huggingface.co/org/name URL: only the URL.
        let data = &c.datasets.unwrap()[0];
        assert_eq!(data.name, None);
        assert_eq!(data.repo_url.as_deref(), Some("https://example.com/data"));
        std::fs::write(dir.path().join("README.md"), "# no front matter\n").unwrap();
        assert_eq!(load(dir.path(), 0).unwrap(), Card::default());
        std::fs::write(dir.path().join("README.md"), "---\nkey: [unclosed\n---\n").unwrap();
        assert!(
            load(dir.path(), 0)
                .unwrap_err()
                .to_string()
                .contains("README.md")
        );
    }
}
