//! The comparison as a table, Markdown, JSON and a quality-vs-size chart.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use memwall_format::atomic::AtomicFile;
use serde_json::{Value, json};

use super::{Made, Origin, Report, Row};
use crate::chart::{self, Point, Scatter};
use crate::render::human_bytes;

/// What [`write_outputs`] wrote.
#[derive(Clone, Debug)]
pub struct Outputs {
    /// The folder.
    pub dir: PathBuf,
    /// `compare.md`.
    pub markdown: PathBuf,
    /// `compare.json`.
    pub json: PathBuf,
    /// `quality-vs-size.svg`.
    pub svg: PathBuf,
    /// `quality-vs-size.png`, unless no font was found.
    pub png: Option<PathBuf>,
    /// Why something was not written.
    pub warnings: Vec<String>,
}

fn file_cell(r: &Row) -> String {
    if r.is_base() {
        format!("{} (base)", r.name())
    } else {
        r.name()
    }
}

fn ppl_cell(r: &Row) -> String {
    format!("{:.4} ± {:.4}", r.ppl.0, r.ppl.1)
}

fn kld_cell(r: &Row) -> String {
    if r.is_base() {
        "0 (reference)".into()
    } else {
        format!("{:.5} ± {:.5}", r.kld.0, r.kld.1)
    }
}

fn top1_cell(r: &Row) -> String {
    if r.is_base() {
        "100 %".into()
    } else {
        format!("{:.2} ± {:.2} %", 100.0 * r.top1.0, 100.0 * r.top1.1)
    }
}

fn speed_cell(r: &Row) -> String {
    format!("{:.1}", r.tokens_per_s)
}

fn bpw_cell(r: &Row) -> String {
    format!("{:.2}", r.bits_per_weight)
}

/// The header and cells of every row, in table order.
fn cells(report: &Report) -> (Vec<String>, Vec<Vec<String>>) {
    let header = vec![
        "file".to_owned(),
        "type".to_owned(),
        "size".to_owned(),
        "bpw".to_owned(),
        "PPL".to_owned(),
        "KLD vs base".to_owned(),
        "top-1 agreement".to_owned(),
        format!("decode t/s on {}", report.device.name),
    ];
    let rows = report
        .rows
        .iter()
        .map(|r| {
            vec![
                file_cell(r),
                r.label.clone(),
                human_bytes(r.bytes),
                bpw_cell(r),
                ppl_cell(r),
                kld_cell(r),
                top1_cell(r),
                speed_cell(r),
            ]
        })
        .collect();
    (header, rows)
}

/// One line on what was measured and how.
fn measured_line(report: &Report) -> String {
    let base = report.base.file_name().map_or_else(
        || report.base.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let what = if report.dataset {
        format!("calibration set {}", report.source)
    } else {
        report.source.clone()
    };
    let reference = match report.kld_top_k {
        Some(k) => format!("{base}'s top {k} tokens and draws from the rest"),
        None => base,
    };
    format!(
        "Measured on {what}: {} windows of {} tokens ({} positions scored per file, of {} tokens); \
         KLD and top-1 against {reference}. Decode speed estimated for {} ({}), F16 KV cache of {} tokens.",
        report.windows,
        report.n_ctx,
        report.scored,
        report.tokens,
        report.device.name,
        report.device.description,
        report.kv_tokens,
    )
}

/// The comparison as an aligned text table (sorted by size, the base last),
/// then a line on what was measured. Nothing in it depends on timing.
pub fn render_table(report: &Report) -> String {
    let (header, rows) = cells(report);
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    // Text columns left-aligned, numbers right-aligned.
    let left = [true, true, false, false, false, false, false, false];
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            if i > 0 {
                s.push_str("  ");
            }
            if left[i] {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(&header);
    out.push_str(&line(
        &widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>(),
    ));
    for row in &rows {
        out.push_str(&line(row));
    }
    out.push('\n');
    out.push_str(&measured_line(report));
    out.push('\n');
    out
}

/// Which quantizations were made and which reused, and where they are.
pub(super) fn cache_line(report: &Report) -> String {
    let mut made = Vec::new();
    let mut cached = Vec::new();
    for r in &report.rows {
        match r.origin {
            Origin::Quantized(Made::Now(s)) => made.push(format!("{} ({s:.1} s)", r.label)),
            Origin::Quantized(Made::Cached) => cached.push(r.label.clone()),
            _ => {}
        }
    }
    let mut parts = Vec::new();
    if !made.is_empty() {
        parts.push(format!("made {}", made.join(", ")));
    }
    if !cached.is_empty() {
        parts.push(format!("reused {}", cached.join(", ")));
    }
    if parts.is_empty() {
        return String::new();
    }
    format!(
        "Quantizations: {} in {}",
        parts.join("; "),
        report.cache.display()
    )
}

fn pm(v: (f64, f64)) -> Value {
    json!({ "value": v.0, "plus_minus": v.1 })
}

fn row_json(r: &Row) -> Value {
    let (role, source, seconds) = match r.origin {
        Origin::Base => ("base", "base", None),
        Origin::Quantized(Made::Now(s)) => ("quantized", "made", Some(s)),
        Origin::Quantized(Made::Cached) => ("quantized", "cached", None),
        Origin::Given => ("given", "given", None),
    };
    json!({
        "file": r.name(),
        "path": r.path,
        "type": r.label,
        "role": role,
        "source": source,
        "quantize_seconds": seconds,
        "bytes": r.bytes,
        "mib": r.mib(),
        "tensor_bytes": r.tensor_bytes,
        "weights": r.weights,
        "bits_per_weight": r.bits_per_weight,
        "ppl": pm(r.ppl),
        "kld": {
            "mean": r.kld.0, "plus_minus": r.kld.1,
            "median": r.kld_spread.0, "p99": r.kld_spread.1, "max": r.kld_spread.2,
        },
        "top1": { "percent": 100.0 * r.top1.0, "plus_minus": 100.0 * r.top1.1 },
        "ln_ppl_ratio": pm(r.log_ppl_ratio),
        "delta_p_rms": pm(r.delta_p_rms),
        "decode": { "tokens_per_s": r.tokens_per_s, "limit": r.limit },
        "eval_seconds": r.eval_seconds,
    })
}

/// Every number of the report, machine-readable (`compare.json`, `--json`).
pub fn json(report: &Report) -> Value {
    json!({
        "base": report.base,
        "evaluation": {
            "source": report.source,
            "kind": if report.dataset { "dataset" } else { "text" },
            "tokens": report.tokens,
            "short_samples_left_out": report.short_samples,
            "windows": report.windows,
            "n_ctx": report.n_ctx,
            "scored_per_file": report.scored,
            "kld_top_k": report.kld_top_k,
            "threads": report.threads,
            "kernels": report.kernels,
        },
        "device": {
            "name": report.device.name,
            "description": report.device.description,
            "kv_cache": "f16",
            "kv_tokens": report.kv_tokens,
        },
        "cache": report.cache,
        "files": report.rows.iter().map(row_json).collect::<Vec<_>>(),
        "warnings": report.warnings,
    })
}

fn markdown(report: &Report) -> String {
    let base = report.base.file_name().map_or_else(
        || report.base.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let mut s = String::new();
    let _ = writeln!(s, "# Quantizations of {base} compared\n");
    let (header, rows) = cells(report);
    let _ = writeln!(s, "| {} |", header.join(" | "));
    let _ = writeln!(s, "|:--|:--|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        let escaped: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
        let _ = writeln!(s, "| {} |", escaped.join(" | "));
    }
    let _ = writeln!(s, "\n{}\n", measured_line(report));
    let _ = writeln!(
        s,
        "PPL: perplexity ± its standard error. KLD: mean KL divergence of each file's next-token \
         distribution from the base's (lower is better). Top-1 agreement: positions where the \
         most likely next token is the base's. bpw: tensor bytes × 8 / weights.\n"
    );
    let _ = writeln!(s, "![KL divergence vs size](quality-vs-size.svg)");
    s
}

/// The chart: KL divergence over size for every file but the base, which is
/// the reference (KLD 0) and appears as a line at its size.
pub(super) fn scatter(report: &Report) -> Scatter {
    let base = report.rows.iter().find(|r| r.is_base());
    let points = report
        .rows
        .iter()
        .filter(|r| !r.is_base())
        .map(|r| Point {
            label: match r.origin {
                Origin::Given => format!("{} ({})", r.label, r.name()),
                _ => r.label.clone(),
            },
            x: r.mib(),
            y: r.kld.0,
        })
        .collect();
    let name = report.base.file_name().map_or_else(
        || report.base.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let caption = match base {
        Some(b) => format!(
            "Base: {name} ({}, {:.1} MiB, PPL {:.3}), the reference with KLD 0, is the grey line, not a point",
            b.label,
            b.mib(),
            b.ppl.0
        ),
        None => format!("KL divergence from {name}"),
    };
    Scatter {
        title: "Quality vs size".into(),
        caption,
        x_desc: "file size (MiB)".into(),
        y_desc: "KL divergence from the base (lower is better)".into(),
        points,
        reference: base.map(|b| (b.mib(), format!("base {} ", b.label))),
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path).with_context(|| format!("{}: writing", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.commit())
        .with_context(|| format!("{}: writing", path.display()))
}

/// Writes `compare.md`, `compare.json`, `quality-vs-size.svg` and, when a font
/// is found, `quality-vs-size.png` into `dir` (created if needed; the folder
/// it goes in must exist, as for every memwall output), each atomically.
pub fn write_outputs(report: &Report, dir: &Path) -> Result<Outputs> {
    if !dir.is_dir() {
        crate::commands::check_output_dir(dir, "the report folder")?;
        std::fs::create_dir(dir)
            .with_context(|| format!("{}: cannot create the output folder", dir.display()))?;
    }
    let mut warnings = Vec::new();
    let chart = scatter(report);
    let svg = dir.join("quality-vs-size.svg");
    write_atomic(&svg, chart::svg(&chart)?.as_bytes())?;
    let png = match chart::use_font(report.font.as_deref())? {
        Some(_) => {
            let path = dir.join("quality-vs-size.png");
            chart::png(&chart, &path)?;
            Some(path)
        }
        None => {
            warnings.push(format!(
                "no font found for the PNG chart, so only {} was written; give a TrueType font with --font FILE (e.g. DejaVuSans.ttf from the fonts-dejavu-core package)",
                svg.display()
            ));
            None
        }
    };
    let json_path = dir.join("compare.json");
    write_atomic(
        &json_path,
        (serde_json::to_string_pretty(&json(report))? + "\n").as_bytes(),
    )?;
    let markdown_path = dir.join("compare.md");
    write_atomic(&markdown_path, markdown(report).as_bytes())?;
    Ok(Outputs {
        dir: dir.to_owned(),
        markdown: markdown_path,
        json: json_path,
        svg,
        png,
        warnings,
    })
}
