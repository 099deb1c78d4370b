//! `memwall inspect FILE`: what a GGUF file (or split model) holds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};
use memwall_format::ggml_type::{GgmlType, file_type};
use memwall_format::gguf::{GgufModel, describe_type, keys};
use memwall_format::model_info::{HyperParams, TokenizerInfo};
use serde_json::json;

use crate::render::{float_text, human_bytes, human_count, quote, value_json, value_text};

/// Arguments of `memwall inspect`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// Show every array element and whole strings instead of previews.
    #[arg(long)]
    pub full: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

impl Args {
    /// The file named (`run` has checked that there is one).
    fn path(&self) -> &std::path::Path {
        self.model.path().unwrap_or(std::path::Path::new(""))
    }
}

/// Per-type totals.
#[derive(Default)]
struct TypeTotal {
    tensors: u64,
    elements: u64,
    bytes: u64,
}

fn bpw(bytes: u64, elements: u64) -> f64 {
    if elements == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / elements as f64
    }
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let model = super::open_model(args.model.path()?)?;
    let out = if args.json {
        json_report(&model, &args)?
    } else {
        text_report(&model, &args)
    };
    print!("{out}");
    Ok(())
}

fn totals(model: &GgufModel) -> (BTreeMap<GgmlType, TypeTotal>, TypeTotal) {
    let mut by_type: BTreeMap<GgmlType, TypeTotal> = BTreeMap::new();
    let mut all = TypeTotal::default();
    for (_, t) in model.tensors() {
        for total in [by_type.entry(t.ty).or_default(), &mut all] {
            total.tensors += 1;
            total.elements += t.elements;
            total.bytes += t.size;
        }
    }
    (by_type, all)
}

fn file_type_text(model: &GgufModel) -> String {
    match model.metadata().get_u64(keys::FILE_TYPE) {
        Ok(Some(id)) => {
            let name = u32::try_from(id)
                .ok()
                .and_then(file_type)
                .map_or("unknown", |f| f.name);
            format!("{name} ({id})")
        }
        Ok(None) => "not set".into(),
        Err(e) => e.to_string(),
    }
}

fn text_report(model: &GgufModel, args: &Args) -> String {
    let mut o = String::new();
    let m = model.metadata();
    let first = &model.files()[0];
    let h = first.header();
    // Writing to a String cannot fail; `let _ =` keeps the lines short.
    let _ = writeln!(o, "File         {}", args.path().display());
    if model.files().len() > 1 {
        let _ = writeln!(o, "Split        {} files", model.files().len());
        for f in model.files() {
            let _ = writeln!(
                o,
                "  {}  {} bytes, {} tensors",
                f.path().display(),
                f.file_size(),
                f.tensors().len()
            );
        }
    }
    let size = model.total_file_size();
    let _ = writeln!(o, "Size         {size} bytes ({})", human_bytes(size));
    let _ = writeln!(
        o,
        "GGUF         version {}, alignment {}, {} metadata keys, {} tensors, data at byte {}",
        h.version,
        h.alignment,
        m.len(),
        model.tensor_count(),
        h.data_offset
    );
    let arch = m
        .get_str(keys::ARCHITECTURE)
        .ok()
        .flatten()
        .unwrap_or("(not set)");
    let name = m
        .get_str(keys::NAME)
        .ok()
        .flatten()
        .map(|n| format!(" {n:?}"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "Model        {arch}{name}, file type {}",
        file_type_text(model)
    );
    if let Ok(Some(recipe)) = m.get_str("memwall.recipe.name") {
        let _ = writeln!(
            o,
            "Recipe       {recipe} (memwall quantize --recipe; the rules are in memwall.recipe)"
        );
    }

    let _ = writeln!(o, "\nMetadata ({} keys)", m.len());
    let width = m.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in m.iter() {
        let ty = describe_type(value);
        let _ = writeln!(
            o,
            "  {key:width$}  {ty:14} {}",
            value_text(value, args.full)
        );
    }

    let _ = writeln!(o, "\nHyper-parameters");
    match HyperParams::try_from(m) {
        Ok(hp) => {
            let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
            let optf = |v: Option<f64>| v.map_or("-".to_owned(), float_text);
            let rows = [
                ("architecture", hp.architecture.clone()),
                ("context length", hp.context_length.to_string()),
                ("embedding length", hp.embedding_length.to_string()),
                ("blocks", hp.block_count.to_string()),
                ("feed-forward length", opt(hp.feed_forward_length)),
                (
                    "heads (q / kv)",
                    format!("{} / {}", hp.head_count, hp.head_count_kv),
                ),
                ("head dim", hp.head_dim().to_string()),
                ("rope dims", opt(hp.rope_dimension_count)),
                ("rope freq base", optf(hp.rope_freq_base)),
                (
                    "rope scaling",
                    match (&hp.rope_scaling_type, hp.rope_scaling_factor) {
                        (Some(t), f) => format!("{t} ×{}", optf(f)),
                        (None, _) => "-".into(),
                    },
                ),
                ("rms norm eps", optf(hp.rms_norm_eps)),
                ("layer norm eps", optf(hp.layer_norm_eps)),
                (
                    "experts (used)",
                    match hp.expert_count {
                        Some(n) => format!("{n} ({})", opt(hp.expert_used_count)),
                        None => "-".into(),
                    },
                ),
                ("vocab size", opt(hp.vocab_size)),
            ];
            for (k, v) in rows {
                let _ = writeln!(o, "  {k:20} {v}");
            }
        }
        Err(e) => {
            let _ = writeln!(o, "  cannot decode: {e}");
        }
    }

    let _ = writeln!(o, "\nTokenizer");
    match TokenizerInfo::from_metadata(m) {
        Ok(Some(t)) => {
            let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            let optb = |v: Option<bool>| v.map_or("-".to_owned(), |b| b.to_string());
            let types: Vec<String> = t
                .token_types
                .iter()
                .map(|(n, c)| format!("{n} {c}"))
                .collect();
            let special: Vec<String> = t
                .special
                .iter()
                .map(|s| match &s.text {
                    Some(text) => format!("{} {} {}", s.role, s.id, quote(text, false)),
                    None => format!("{} {} (out of range)", s.role, s.id),
                })
                .collect();
            let rows = [
                ("model", opt(&t.model)),
                ("pre-tokenizer", opt(&t.pre)),
                ("tokens", format!("{} ({})", t.tokens, types.join(", "))),
                ("merges", t.merges.to_string()),
                ("scores", if t.has_scores { "yes" } else { "no" }.into()),
                (
                    "special",
                    if special.is_empty() {
                        "-".into()
                    } else {
                        special.join(", ")
                    },
                ),
                (
                    "add bos / eos",
                    format!("{} / {}", optb(t.add_bos), optb(t.add_eos)),
                ),
                (
                    "chat template",
                    t.chat_template_len
                        .map_or("none".into(), |n| format!("{n} bytes")),
                ),
            ];
            for (k, v) in rows {
                let _ = writeln!(o, "  {k:20} {v}");
            }
        }
        Ok(None) => {
            let _ = writeln!(o, "  none");
        }
        Err(e) => {
            let _ = writeln!(o, "  cannot decode: {e}");
        }
    }

    let _ = writeln!(o, "\nTensors ({})", model.tensor_count());
    let split = model.files().len() > 1;
    let name_w = model
        .tensors()
        .map(|(_, t)| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        o,
        "  {:>4}  {:name_w$}  {:7}  {:22}  {:>12}  {:>11}  {:>11}{}",
        "#",
        "name",
        "type",
        "shape (ne)",
        "elements",
        "bytes",
        "offset",
        if split { "  file" } else { "" }
    );
    for (i, (f, t)) in model.tensors().enumerate() {
        let shape = t
            .dims
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" × ");
        let file = if split {
            format!("  {}", f + 1)
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "  {i:>4}  {:name_w$}  {:7}  {shape:22}  {:>12}  {:>11}  {:>11}{file}",
            t.name,
            t.ty.name(),
            t.elements,
            t.size,
            t.offset
        );
    }

    let (by_type, all) = totals(model);
    let _ = writeln!(o, "\nTotals");
    let _ = writeln!(
        o,
        "  {:7}  {:>7}  {:>13}  {:>9}  {:>12}  {:>10}  {:>7}",
        "type", "tensors", "parameters", "", "bytes", "", "bpw"
    );
    let rows = by_type
        .iter()
        .map(|(ty, t)| (ty.name(), t))
        .chain([("all", &all)]);
    for (name, t) in rows {
        let _ = writeln!(
            o,
            "  {name:7}  {:>7}  {:>13}  {:>9}  {:>12}  {:>10}  {:>7.4}",
            t.tensors,
            t.elements,
            human_count(t.elements),
            t.bytes,
            human_bytes(t.bytes),
            bpw(t.bytes, t.elements)
        );
    }
    o
}

fn json_report(model: &GgufModel, args: &Args) -> Result<String> {
    let m = model.metadata();
    let files: Vec<_> = model
        .files()
        .iter()
        .map(|f| {
            let h = f.header();
            json!({
                "path": f.path(),
                "size": f.file_size(),
                "version": h.version,
                "alignment": h.alignment,
                "data_offset": h.data_offset,
                "metadata_count": h.metadata.len(),
                "tensor_count": h.tensors.len(),
            })
        })
        .collect();
    let metadata: Vec<_> = m
        .iter()
        .map(
            |(k, v)| json!({"key": k, "type": describe_type(v), "value": value_json(v, args.full)}),
        )
        .collect();
    let hyperparameters = match HyperParams::try_from(m) {
        Ok(hp) => json!({
            "architecture": hp.architecture,
            "context_length": hp.context_length,
            "embedding_length": hp.embedding_length,
            "block_count": hp.block_count,
            "feed_forward_length": hp.feed_forward_length,
            "head_count": hp.head_count,
            "head_count_kv": hp.head_count_kv,
            "head_dim": hp.head_dim(),
            "rope_dimension_count": hp.rope_dimension_count,
            "rope_freq_base": hp.rope_freq_base,
            "rope_scaling_type": hp.rope_scaling_type,
            "rope_scaling_factor": hp.rope_scaling_factor,
            "rms_norm_eps": hp.rms_norm_eps,
            "layer_norm_eps": hp.layer_norm_eps,
            "expert_count": hp.expert_count,
            "expert_used_count": hp.expert_used_count,
            "vocab_size": hp.vocab_size,
        }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    let tokenizer = match TokenizerInfo::from_metadata(m) {
        Ok(Some(t)) => json!({
            "model": t.model,
            "pre": t.pre,
            "tokens": t.tokens,
            "token_types": t.token_types.iter().map(|(n, c)| (n.to_string(), json!(c))).collect::<serde_json::Map<_, _>>(),
            "merges": t.merges,
            "has_scores": t.has_scores,
            "special": t.special.iter().map(|s| json!({"role": s.role, "id": s.id, "text": s.text})).collect::<Vec<_>>(),
            "add_bos": t.add_bos,
            "add_eos": t.add_eos,
            "chat_template_bytes": t.chat_template_len,
        }),
        Ok(None) => serde_json::Value::Null,
        Err(e) => json!({ "error": e.to_string() }),
    };
    let tensors: Vec<_> = model
        .tensors()
        .map(|(f, t)| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.dims,
                "elements": t.elements,
                "bytes": t.size,
                "offset": t.offset,
                "file": f,
            })
        })
        .collect();
    let (by_type, all) = totals(model);
    let total_json = |name: &str, t: &TypeTotal| {
        json!({
            "type": name,
            "tensors": t.tensors,
            "parameters": t.elements,
            "bytes": t.bytes,
            "bits_per_weight": bpw(t.bytes, t.elements),
        })
    };
    let file_type = m.get_u64(keys::FILE_TYPE).ok().flatten();
    let report = json!({
        "path": args.path(),
        "size": model.total_file_size(),
        "files": files,
        "architecture": m.get_str(keys::ARCHITECTURE).ok().flatten(),
        "recipe": m.get_str("memwall.recipe.name").ok().flatten(),
        "file_type": file_type.map(|id| json!({
            "id": id,
            "name": u32::try_from(id).ok().and_then(file_type_lookup),
        })),
        "metadata": metadata,
        "hyperparameters": hyperparameters,
        "tokenizer": tokenizer,
        "tensors": tensors,
        "totals": {
            "by_type": by_type.iter().map(|(ty, t)| total_json(ty.name(), t)).collect::<Vec<_>>(),
            "all": total_json("all", &all),
        },
    });
    let mut s = serde_json::to_string_pretty(&report).context("encoding the JSON report")?;
    s.push('\n');
    Ok(s)
}

fn file_type_lookup(id: u32) -> Option<&'static str> {
    file_type(id).map(|f| f.name)
}
