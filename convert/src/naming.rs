//! The `general.*` naming keys llama.cpp's converter derives from a model's
//! id (gguf-py `metadata.py`: `get_model_id_components`, `id_to_title`,
//! `apply_metadata_heuristic`; `utility.py`: `size_label`): name, organization,
//! basename, finetune, version and size label, from `config.json`'s
//! `_name_or_path` and the checkpoint folder's name.
//!
//! Fields the model card states ([`crate::model_card`]) come first.

use std::collections::BTreeSet;
use std::path::Path;

use regex::Regex;

/// The parts of a model id such as `mistralai/Mixtral-8x7B-Instruct-v0.1`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdParts {
    /// The id without its organization.
    pub full_name: Option<String>,
    /// The organization (before `/`).
    pub organization: Option<String>,
    /// `Mixtral`.
    pub basename: Option<String>,
    /// `Instruct`.
    pub finetune: Option<String>,
    /// `v0.1`.
    pub version: Option<String>,
    /// `8x7B`.
    pub size_label: Option<String>,
}

/// Naming keys, in the order the converter writes them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Naming {
    /// `general.name`.
    pub name: Option<String>,
    /// `general.version`.
    pub version: Option<String>,
    /// `general.organization`.
    pub organization: Option<String>,
    /// `general.finetune`.
    pub finetune: Option<String>,
    /// `general.basename`.
    pub basename: Option<String>,
    /// `general.size_label`.
    pub size_label: Option<String>,
}

#[expect(
    clippy::expect_used,
    reason = "called with literal patterns only, all exercised by tests"
)]
fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("valid pattern")
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Basename,
    SizeLabel,
    Finetune,
    Version,
    Type,
}

/// gguf-py's `get_model_id_components`.
pub fn id_parts(model_id: &str, total_params: i64) -> IdParts {
    if model_id.contains(' ') {
        return IdParts {
            full_name: Some(model_id.to_owned()),
            ..IdParts::default()
        };
    }
    let (mut org, full) = match model_id.split_once('/') {
        Some((o, f)) => (Some(o.to_owned()), f.to_owned()),
        None => (None, model_id.to_owned()),
    };
    if org.as_deref().is_some_and(|o| o.starts_with('.')) {
        org = None;
    }
    let version = re(r"(?i)^(v|iter)?\d+([.]\d+)*$");
    let qtype = re(r"(?i)^(i?q\d(_\w)*|b?fp?(16|32))$");
    let size = re(r"(?i)^(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)$");
    let tune = re(r"(?i)^(chat|instruct|vision|lora)$");
    let mut parts: Vec<String> = full
        .split('-')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    let mut kinds: Vec<BTreeSet<Kind>> = vec![BTreeSet::new(); parts.len()];
    for i in 0..parts.len() {
        let part = parts[i].clone();
        if version.is_match(&part) {
            kinds[i].insert(Kind::Version);
        } else if qtype.is_match(&part) {
            kinds[i].insert(Kind::Type);
            parts[i] = part.to_uppercase();
        } else if i > 0 && size.is_match(&part) {
            let mut p: Vec<char> = part.replace('_', ".").chars().collect();
            // bloom-7b1 → 7.1b
            if p.last().is_some_and(char::is_ascii_digit) && p.len() >= 2 {
                let (a, b) = (p[p.len() - 2], p[p.len() - 1]);
                p.truncate(p.len() - 2);
                p.extend(['.', b, a]);
            }
            if p.len() > 1 && p[p.len() - 2].is_ascii_digit() && "kmbt".contains(p[p.len() - 1]) {
                let last = p.len() - 1;
                p[last] = p[last].to_ascii_uppercase();
            }
            if total_params != 0 {
                let head: String = p[..p.len() - 1].iter().collect();
                let unit = " KMBT".find(p[p.len() - 1]).map_or(-1, |u| u as i32);
                if let Ok(v) = head.parse::<f64>() {
                    let label = v * 1000f64.powi(unit);
                    let total = total_params as f64;
                    let far = (total_params < 0 && label < (total_params.abs() / 8) as f64)
                        || (total_params > 0
                            && (label - total).abs() > (7 * total_params).div_euclid(8) as f64);
                    if far {
                        // Likely a context length.
                        kinds[i].insert(Kind::Finetune);
                        let last = p.len() - 1;
                        p[last] = p[last].to_ascii_lowercase();
                    }
                }
            }
            if kinds[i].is_empty() {
                kinds[i].insert(Kind::SizeLabel);
            }
            parts[i] = p.into_iter().collect();
        } else if i > 0 && tune.is_match(&part) {
            if total_params < 0 && part.eq_ignore_ascii_case("lora") {
                kinds[i].insert(Kind::Type);
            } else {
                kinds[i].insert(Kind::Finetune);
            }
        }
    }
    // Word sizes (small, xl…) do not count when a numeric size is present.
    let numeric_size = parts
        .iter()
        .zip(&kinds)
        .any(|(p, k)| k.contains(&Kind::SizeLabel) && p.chars().any(|c| c.is_ascii_digit()));
    if numeric_size {
        for (p, k) in parts.iter().zip(kinds.iter_mut()) {
            if k.contains(&Kind::SizeLabel) && p.chars().all(char::is_alphabetic) {
                k.remove(&Kind::SizeLabel);
            }
        }
    }
    let mut at_start = true;
    for (p, k) in parts.iter().zip(kinds.iter_mut()) {
        let alpha_first = p.chars().next().is_some_and(char::is_alphabetic);
        if at_start && ((k.is_empty() && alpha_first) || k.contains(&Kind::Version)) {
            k.insert(Kind::Basename);
        } else {
            at_start = false;
            if k.is_empty() {
                k.insert(Kind::Finetune);
            }
        }
    }
    for k in kinds.iter_mut().rev() {
        if k.contains(&Kind::Basename) && k.len() > 1 {
            k.remove(&Kind::Basename);
        } else {
            break;
        }
    }
    let join = |want: &dyn Fn(&BTreeSet<Kind>) -> bool| -> Option<String> {
        let mut seen = Vec::<&str>::new();
        for (p, k) in parts.iter().zip(&kinds) {
            if want(k) {
                seen.push(p);
            }
        }
        (!seen.is_empty()).then(|| seen.join("-"))
    };
    let mut basename = join(&|k| k.contains(&Kind::Basename));
    let size_label = {
        let mut unique: Vec<&str> = Vec::new();
        for (p, k) in parts.iter().zip(&kinds) {
            if k.contains(&Kind::SizeLabel) && !unique.contains(&p.as_str()) {
                unique.push(p);
            }
        }
        (!unique.is_empty()).then(|| unique.join("-"))
    };
    let finetune = join(&|k| k.contains(&Kind::Finetune));
    let version = join(&|k| k.contains(&Kind::Version) && !k.contains(&Kind::Basename));
    if size_label.is_none() && finetune.is_none() && version.is_none() {
        basename = None;
    }
    IdParts {
        full_name: Some(full),
        organization: org,
        basename,
        finetune,
        version,
        size_label,
    }
}

/// Python's `str.title()`: a letter is upper-cased after a non-letter, lower-cased after a letter.
fn title(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    let mut after_letter = false;
    for c in word.chars() {
        if c.is_alphabetic() {
            if after_letter {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
            after_letter = true;
        } else {
            out.push(c);
            after_letter = false;
        }
    }
    out
}

/// gguf-py's `id_to_title`: words title-cased unless they carry capitals,
/// are versions or start with a digit.
pub fn id_to_title(id: &str) -> String {
    let keep = re(r"^(v\d+(?:\.\d+)*|\d.*)$");
    id.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            let lower = w.chars().any(char::is_alphabetic) && !w.chars().any(char::is_uppercase);
            if lower && !keep.is_match(w) {
                title(w)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// gguf-py's `model_weight_count_rounded_notation` (2 significant digits at least).
pub fn rounded_count(n: u64) -> String {
    let n = n as f64;
    let (scaled, suffix) = if n > 1e12 {
        (n * 1e-12, "T")
    } else if n > 1e9 {
        (n * 1e-9, "B")
    } else if n > 1e6 {
        (n * 1e-6, "M")
    } else {
        (n * 1e-3, "K")
    };
    // Python's round() rounds halves to even; str(...).lstrip('0') counts digits.
    let rounded = scaled.round_ties_even() as u64;
    let digits = if rounded == 0 {
        0
    } else {
        rounded.to_string().len()
    };
    let fix = 2usize.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

/// gguf-py's `size_label`: `8x7.2B` for MoE models, `6.3M` otherwise.
pub fn size_label(total: u64, shared: u64, expert: u64, expert_count: u64) -> String {
    if expert_count > 0 {
        format!("{expert_count}x{}", rounded_count(shared + expert))
    } else {
        rounded_count(total)
    }
}

/// Parameter counts as gguf-py's `get_total_parameter_count` takes them from
/// the output tensors (GGUF name and dims): (total, shared, per-expert, experts).
pub fn parameter_counts<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a [u64])>,
) -> (u64, u64, u64, u64) {
    let (mut total, mut shared, mut expert) = (0u64, 0u64, 0u64);
    let (mut expert_sum, mut expert_tensors) = (0u64, 0u64);
    for (name, dims) in tensors {
        let size: u64 = dims.iter().product();
        if name.contains("_exps.") && dims.len() >= 3 {
            // gguf-py takes PyTorch's shape[-3] (shape[-2] for biases): GGUF dims[2] (dims[1]).
            let count = if name.contains(".bias") {
                dims[1]
            } else {
                dims[2]
            };
            expert += size / count.max(1);
            expert_sum += count;
            expert_tensors += 1;
        } else {
            shared += size;
        }
        total += size;
    }
    let experts = expert_sum.checked_div(expert_tensors).unwrap_or(0);
    (total, shared, expert, experts)
}

/// The naming keys for a checkpoint folder (`Metadata.load`: the model card's
/// fields, then `_name_or_path`, then the folder name; then `prepare_metadata`'s
/// fallbacks).
pub fn naming(
    dir: &Path,
    config: &serde_json::Value,
    counts: (u64, u64, u64, u64),
    card: &crate::model_card::Card,
) -> Naming {
    let (total, shared, expert, experts) = counts;
    let mut n = Naming {
        name: card.name.clone(),
        version: card.version.clone(),
        organization: card.organization.clone(),
        finetune: card.finetune.clone(),
        basename: card.basename.clone(),
        size_label: card.size_label.clone(),
    };
    let apply = |parts: IdParts, n: &mut Naming| {
        if n.name.is_none() {
            n.name = parts.full_name.as_deref().map(id_to_title);
        }
        if n.organization.is_none() {
            n.organization = parts.organization.as_deref().map(id_to_title);
        }
        n.basename = n.basename.take().or(parts.basename);
        n.finetune = n.finetune.take().or(parts.finetune);
        n.version = n.version.take().or(parts.version);
        n.size_label = n.size_label.take().or(parts.size_label);
    };
    if let Some(id) = config.get("_name_or_path").and_then(|v| v.as_str()) {
        if id.matches('/').count() <= 1 {
            apply(id_parts(id, total as i64), &mut n);
        }
    }
    let dir_name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|f| f.to_string_lossy().into_owned()))
        .or_else(|| dir.file_name().map(|f| f.to_string_lossy().into_owned()));
    if let Some(d) = &dir_name {
        apply(id_parts(d, total as i64), &mut n);
    }
    if n.name.is_none() {
        n.name = dir_name;
    }
    if n.size_label.is_none() && total > 0 {
        n.size_label = Some(size_label(total, shared, expert, experts));
    }
    n
}
