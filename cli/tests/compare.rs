//! `memwall compare` on tiny-zh: the quantizations it makes and caches, the
//! numbers per file, the table, JSON, Markdown and chart it writes, and the
//! files it refuses.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::SystemTime;

use common::{memwall, repo};
use memwall_format::gguf::GgufModel;
use memwall_quantize::fit::{Device, KvType, Shape, Weights, decode_speed, gguf_tensors};
use serde_json::Value;

const BASE: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const TEXT: &str = "fixtures/perplexity/heldout-24k.txt";
/// A different tiny model (vocabulary of 257 tokens, tiny-zh has 6144).
const OTHER: &str = "fixtures/llamacpp/tiny-q4_k_m.gguf";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `memwall compare BASE [extra…] -f TEXT -c 128 --chunks N -o OUT --cache CACHE`.
fn compare(base: &Path, out: &Path, cache: &Path, chunks: &str, extra: &[&str]) -> Output {
    let mut args = vec!["compare", s(base)];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "-f",
        TEXT,
        "-c",
        "128",
        "--chunks",
        chunks,
        "-o",
        s(out),
        "--cache",
        s(cache),
    ]);
    memwall(&args)
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "memwall compare failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn row<'a>(report: &'a Value, ty: &str) -> &'a Value {
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["type"] == ty)
        .unwrap_or_else(|| panic!("no row of type {ty} in {report:#}"))
}

fn mtime(path: &Path) -> SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

#[test]
fn compares_quantizations_and_reuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let (out, cache) = (dir.path().join("out"), dir.path().join("cache"));
    let base = repo().join(BASE);
    let types = ["--types", "Q4_K_M,Q6_K,attn-f16-ffn-q4"];
    let run = compare(&base, &out, &cache, "8", &types);
    let stdout = ok(&run);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();

    // The table: everything before the line on the cache (which has timings and
    // paths). The decode estimate comes from the device profiles, which `memwall
    // plan` owns and tunes: it is checked against them below, and masked here.
    let table = stdout.split("\nQuantizations:").next().unwrap();
    let masked: Vec<String> = table
        .lines()
        .map(|l| match l.rsplit_once("  ") {
            Some((head, last)) if last.trim().parse::<f64>().is_ok() => {
                format!("{head}  {:>w$}", "[t/s]", w = last.len())
            }
            _ => l.to_owned(),
        })
        .collect();
    insta::assert_snapshot!("table", masked.join("\n"));
    assert!(stdout.contains("Quantizations: made Q4_K_M"), "{stdout}");

    // compare.json: one row per file, sane numbers.
    let report = read_json(&out.join("compare.json"));
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), 4, "{report:#}");
    assert_eq!(report["evaluation"]["windows"], 8);
    assert_eq!(report["evaluation"]["n_ctx"], 128);
    assert_eq!(report["evaluation"]["scored_per_file"], 8 * 63);
    assert_eq!(report["device"]["name"], "phone-16gb");
    // Sorted by size, the base last.
    let sizes: Vec<u64> = files.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert!(sizes[..3].windows(2).all(|w| w[0] <= w[1]), "{sizes:?}");
    assert_eq!(files[3]["role"], "base");
    let base_row = row(&report, "F16");
    assert_eq!(base_row["file"], "tiny-zh-f16.gguf");
    assert_eq!(f(&base_row["kld"]["mean"]), 0.0);
    assert_eq!(f(&base_row["top1"]["percent"]), 100.0);
    // llama-perplexity's running estimate after 8 windows of 128 (llama-perplexity.json).
    assert!((f(&base_row["ppl"]["value"]) - 115.1645).abs() < 0.05);
    let (q4, q6) = (row(&report, "Q4_K_M"), row(&report, "Q6_K"));
    let mixed = row(&report, "attn-f16-ffn-q4");
    for r in [q4, q6, mixed] {
        assert_eq!(r["role"], "quantized");
        assert_eq!(r["source"], "made");
        let kld = f(&r["kld"]["mean"]);
        assert!(kld > 0.0 && kld < 0.1, "{r:#}");
        assert!(f(&r["kld"]["plus_minus"]) > 0.0);
        let top1 = f(&r["top1"]["percent"]);
        assert!((80.0..100.0).contains(&top1), "{r:#}");
        let ppl = f(&r["ppl"]["value"]);
        assert!(
            (ppl / f(&base_row["ppl"]["value"]) - 1.0).abs() < 0.05,
            "{r:#}"
        );
        assert!(f(&r["bytes"]) < f(&base_row["bytes"]));
        assert!((f(&r["mib"]) * 1048576.0 - f(&r["bytes"])).abs() < 1.0);
        assert!(f(&r["decode"]["tokens_per_s"]) > 0.0);
        assert!(Path::new(r["path"].as_str().unwrap()).starts_with(&cache));
    }
    // The decode estimate is the planner's, for half a window of F16 KV cache.
    let device = Device::resolve("phone-16gb").unwrap();
    for r in files {
        let model = GgufModel::open(Path::new(r["path"].as_str().unwrap())).unwrap();
        let shape = Shape::from_gguf(&model).unwrap();
        let weights = Weights::as_stored(&gguf_tensors(&model)).unwrap();
        let speed = decode_speed(&device, &shape, &weights, KvType::F16, 64, u64::MAX);
        assert_eq!(f(&r["decode"]["tokens_per_s"]), speed.tokens_per_s);
        assert_eq!(r["decode"]["limit"], speed.limit());
    }
    assert!(f(&q6["kld"]["mean"]) < f(&q4["kld"]["mean"]));
    assert!(f(&q6["top1"]["percent"]) > f(&q4["top1"]["percent"]));
    let bpw = |r: &Value| f(&r["bits_per_weight"]);
    assert!(bpw(q4) < bpw(q6) && bpw(q6) < bpw(mixed) && bpw(mixed) < bpw(base_row));
    assert!((bpw(base_row) - 16.0).abs() < 0.1, "F16 plus F32 norms");
    assert_eq!(
        q4["path"].as_str().unwrap(),
        s(&cache.join("tiny-zh-Q4_K_M.gguf"))
    );

    // compare.md: the table and what was measured.
    let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
    assert!(md.contains("| tiny-zh-Q6_K.gguf | Q6_K |"), "{md}");
    assert!(md.contains("8 windows of 128 tokens"), "{md}");
    assert!(md.contains("phone-16gb"), "{md}");

    // The SVG: valid XML, one marker per plotted file (the base is not a point).
    let svg = std::fs::read_to_string(out.join("quality-vs-size.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let markers = doc
        .descendants()
        .filter(|n| n.has_tag_name("circle"))
        .count();
    assert_eq!(markers, 3);
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    for label in ["Q4_K_M", "Q6_K", "attn-f16-ffn-q4"] {
        assert!(texts.contains(&label), "{label} not in {texts:?}");
    }
    assert!(texts.iter().any(|t| t.contains("not a point")), "{texts:?}");

    // The PNG when a font is found, else a warning that names --font.
    let png = out.join("quality-vs-size.png");
    if png.exists() {
        let bytes = std::fs::read(&png).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert!(stdout.contains("quality-vs-size.png"), "{stdout}");
    } else {
        assert!(stderr.contains("--font"), "{stderr}");
        assert!(stderr.contains("no font found"), "{stderr}");
    }

    // A second run reuses every quantization and gives the same numbers.
    let made: Vec<PathBuf> = ["Q4_K_M", "Q6_K", "attn-f16-ffn-q4"]
        .iter()
        .map(|t| cache.join(format!("tiny-zh-{t}.gguf")))
        .collect();
    let before: Vec<SystemTime> = made.iter().map(|p| mtime(p)).collect();
    let again = ok(&compare(
        &base,
        &out,
        &cache,
        "8",
        &[&types[..], &["--json"]].concat(),
    ));
    let second: Value = serde_json::from_str(&again).unwrap();
    for ty in ["Q4_K_M", "Q6_K", "attn-f16-ffn-q4"] {
        let (a, b) = (row(&report, ty), row(&second, ty));
        assert_eq!(b["source"], "cached", "{b:#}");
        assert_eq!(b["quantize_seconds"], Value::Null);
        for key in ["bytes", "bits_per_weight", "ppl", "kld", "top1", "decode"] {
            assert_eq!(a[key], b[key], "{ty} {key}");
        }
    }
    let after: Vec<SystemTime> = made.iter().map(|p| mtime(p)).collect();
    assert_eq!(before, after);
    // --json printed the same report compare.json holds.
    assert_eq!(second, read_json(&out.join("compare.json")));
}

#[test]
fn a_changed_base_is_quantized_again() {
    let dir = tempfile::tempdir().unwrap();
    let (out, cache) = (dir.path().join("out"), dir.path().join("cache"));
    let base = dir.path().join("tiny-zh-f16.gguf");
    std::fs::copy(repo().join(BASE), &base).unwrap();
    let types = ["--types", "Q4_K_M", "--json"];
    let source = |stdout: &str| -> (String, f64) {
        let report: Value = serde_json::from_str(stdout).unwrap();
        let r = row(&report, "Q4_K_M");
        (
            r["source"].as_str().unwrap().to_owned(),
            f(&r["ppl"]["value"]),
        )
    };
    let quantized = cache.join("tiny-zh-Q4_K_M.gguf");
    let (first, ppl) = source(&ok(&compare(&base, &out, &cache, "2", &types)));
    assert_eq!(first, "made");
    assert!(cache.join("tiny-zh-Q4_K_M.gguf.json").exists());
    assert_eq!(
        source(&ok(&compare(&base, &out, &cache, "2", &types))).0,
        "cached"
    );

    // Change the last weight (the lowest mantissa byte of output_norm's last
    // f32), then put the modification time back: the content alone must tell.
    let modified = mtime(&base);
    let made_at = mtime(&quantized);
    let mut bytes = std::fs::read(&base).unwrap();
    let at = bytes.len() - 4;
    bytes[at] ^= 1;
    std::fs::write(&base, &bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&base)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    let (third, third_ppl) = source(&ok(&compare(&base, &out, &cache, "2", &types)));
    assert_eq!(third, "made");
    assert_ne!(mtime(&quantized), made_at);
    // The change is tiny: same perplexity to a few digits.
    assert!((third_ppl / ppl - 1.0).abs() < 1e-3);

    // Touching the base (same bytes, new time) also remakes it.
    std::fs::File::options()
        .write(true)
        .open(&base)
        .unwrap()
        .set_modified(modified - std::time::Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        source(&ok(&compare(&base, &out, &cache, "2", &types))).0,
        "made"
    );
}

#[test]
fn a_file_of_another_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (out, cache) = (dir.path().join("out"), dir.path().join("cache"));
    let run = compare(
        &repo().join(BASE),
        &out,
        &cache,
        "2",
        &[OTHER, "--types", "Q4_K_M"],
    );
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("tiny-q4_k_m.gguf"), "{stderr}");
    assert!(
        stderr.contains("vocabulary has 257 tokens, the base's 6144"),
        "{stderr}"
    );
    // Refused before any work: nothing quantized, nothing written.
    assert!(!cache.join("tiny-zh-Q4_K_M.gguf").exists());
    assert!(!out.exists());
}

#[test]
fn given_files_are_compared_as_they_are_and_a_dataset_gives_the_windows() {
    let dir = tempfile::tempdir().unwrap();
    let (out, cache) = (dir.path().join("out"), dir.path().join("cache"));
    // A Q8_0 made by `memwall quantize`, given as FILES; no --types.
    let q8 = dir.path().join("tz-q8.gguf");
    ok(&memwall(&["quantize", BASE, s(&q8), "Q8_0"]));
    let set = dir.path().join("calib.jsonl");
    ok(&memwall(&[
        "calibrate",
        "dataset",
        "-m",
        BASE,
        "fixtures/calib-zh/cmrc.jsonl",
        "-n",
        "3",
        "--seq-len",
        "96",
        "-o",
        s(&set),
    ]));
    let base = repo().join(BASE);
    let run = memwall(&[
        "compare",
        s(&base),
        s(&q8),
        "--types",
        "none",
        "--dataset",
        s(&set),
        "-o",
        s(&out),
        "--cache",
        s(&cache),
        "--json",
    ]);
    let report: Value = serde_json::from_str(&ok(&run)).unwrap();
    assert_eq!(report["evaluation"]["kind"], "dataset");
    assert_eq!(report["evaluation"]["windows"], 3);
    assert_eq!(report["evaluation"]["n_ctx"], 96);
    assert_eq!(report["device"]["kv_tokens"], 48);
    let q8_row = row(&report, "Q8_0");
    assert_eq!(q8_row["role"], "given");
    assert_eq!(q8_row["file"], "tz-q8.gguf");
    assert!(f(&q8_row["kld"]["mean"]) < 0.01);
    assert_eq!(report["files"].as_array().unwrap().len(), 2);
    let svg = std::fs::read_to_string(out.join("quality-vs-size.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(
        doc.descendants()
            .filter(|n| n.has_tag_name("circle"))
            .count(),
        1
    );
}

#[test]
fn a_top_k_reference_gives_the_full_reference_s_divergence_and_a_fitted_recipe_is_a_type() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // A fitted recipe is compared as any recipe file is.
    let recipe = dir.path().join("fit.toml");
    ok(&memwall(&[
        "calibrate",
        "fit",
        "-m",
        BASE,
        "-f",
        TEXT,
        "--probe-ctx",
        "64",
        "--chunks",
        "4",
        "--budget",
        "3.5MiB",
        "-o",
        s(&recipe),
    ]));
    let base = repo().join(BASE);
    let types = format!("Q3_K_M,{}", s(&recipe));
    let report = |out: &str, extra: &[&str]| {
        let out = dir.path().join(out);
        let args = [&["--types", types.as_str(), "--json"][..], extra].concat();
        let v: Value =
            serde_json::from_str(&ok(&compare(&base, &out, &cache, "16", &args))).unwrap();
        v
    };
    let full = report("full", &[]);
    let top = report("top", &["--kld-top-k", "32"]);
    assert_eq!(full["evaluation"]["kld_top_k"], Value::Null);
    assert_eq!(top["evaluation"]["kld_top_k"], 32);
    for ty in ["Q3_K_M", "fit"] {
        let (a, b) = (
            f(&row(&full, ty)["kld"]["mean"]),
            f(&row(&top, ty)["kld"]["mean"]),
        );
        assert!((b / a - 1.0).abs() < 0.02, "{ty}: full {a}, top-32 {b}");
    }
    // The fitted recipe (3.5 MiB) is smaller than Q3_K_M (3.54 MiB) and closer to the base.
    let (q3, fit) = (row(&full, "Q3_K_M"), row(&full, "fit"));
    assert!(f(&fit["bytes"]) <= f(&q3["bytes"]));
    assert!(f(&fit["kld"]["mean"]) < f(&q3["kld"]["mean"]), "{fit} {q3}");
}

#[test]
fn unknown_types_and_unusable_fonts_fail_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let (out, cache) = (dir.path().join("out"), dir.path().join("cache"));
    let base = repo().join(BASE);
    let run = compare(&base, &out, &cache, "2", &["--types", "Q4_K_M,Q9_X"]);
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("unknown type or recipe 'Q9_X'"), "{stderr}");
    assert!(stderr.contains("attn-f16-ffn-q4"), "{stderr}");

    let run = compare(&base, &out, &cache, "2", &["--font", "Cargo.toml"]);
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("Cargo.toml: not a TrueType"), "{stderr}");
    assert!(!cache.exists() && !out.exists());
}
