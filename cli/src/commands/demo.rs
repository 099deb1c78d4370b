//! `memwall demo`: the whole workflow on tiny-zh, the 6.3M-parameter
//! Chinese/English llama built into the binary. Every step is an ordinary
//! memwall command, printed before it runs, so the demo doubles as a recipe
//! for the user's own model.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};

/// tiny-zh's Hugging Face checkpoint (BF16 safetensors, tokenizer, chat template).
const CHECKPOINT: [(&str, &[u8]); 6] = [
    (
        "config.json",
        include_bytes!("../../../fixtures/tiny-zh/config.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("../../../fixtures/tiny-zh/generation_config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../../../fixtures/tiny-zh/model.safetensors"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../../../fixtures/tiny-zh/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../../../fixtures/tiny-zh/tokenizer_config.json"),
    ),
    (
        "chat_template.jinja",
        include_bytes!("../../../fixtures/tiny-zh/chat_template.jinja"),
    ),
];

/// The Chinese QA calibration data written for memwall (fixtures/calib-zh).
const CALIBRATION: [(&str, &[u8]); 4] = [
    (
        "cmrc.jsonl",
        include_bytes!("../../../fixtures/calib-zh/cmrc.jsonl"),
    ),
    (
        "webqa.jsonl",
        include_bytes!("../../../fixtures/calib-zh/webqa.jsonl"),
    ),
    (
        "alpaca.jsonl",
        include_bytes!("../../../fixtures/calib-zh/alpaca.jsonl"),
    ),
    (
        "chat.jsonl",
        include_bytes!("../../../fixtures/calib-zh/chat.jsonl"),
    ),
];

/// Held-out text tiny-zh never saw in training (fixtures/perplexity).
const HELDOUT: &[u8] = include_bytes!("../../../fixtures/perplexity/heldout-24k.txt");

/// Arguments of `memwall demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Folder to write into (default: ./memwall-demo, or the first free
    /// memwall-demo-N). An existing folder is only used if it is empty.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub threads: crate::args::Threads,
}

/// Runs the demo.
pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let dir = output_dir(args.output.as_deref())?;
    let inputs = dir.join("inputs");
    unpack(&inputs)?;
    let p = |name: &str| dir.join(name).display().to_string();
    let i = |name: &str| inputs.join(name).display().to_string();
    let threads = args.threads.given().map(|t| t.to_string());
    let with_threads = |mut v: Vec<String>| {
        if let Some(t) = &threads {
            v.push("-t".into());
            v.push(t.clone());
        }
        v
    };
    let f16 = p("tiny-zh-f16.gguf");
    let calibrated = p("tiny-zh-Q4_K_M-awq-gptq.gguf");
    println!(
        "memwall demo: tiny-zh (a 6.3M-parameter Chinese/English llama) from checkpoint to chat.\n\
         Writing into {}\n",
        dir.display()
    );

    let mut steps: Vec<(&str, Vec<String>)> = vec![(
        "Convert the Hugging Face checkpoint to GGUF (the file llama.cpp's converter writes)",
        strings(&["convert", &i("tiny-zh"), "--pre", "gpt-2", "-o", &f16]),
    )];
    for ty in ["Q4_K_M", "Q5_K_M", "Q6_K"] {
        steps.push((
            "Quantize with llama.cpp's mix (the bytes llama-quantize writes)",
            strings(&["quantize", &f16, &p(&format!("tiny-zh-{ty}.gguf")), ty]),
        ));
    }
    steps.push((
        "Mixed precision: attention in F16, feed-forward in 4-bit",
        strings(&[
            "quantize",
            &f16,
            &p("tiny-zh-attn-f16-ffn-q4.gguf"),
            "--recipe",
            "attn-f16-ffn-q4",
        ]),
    ));
    // tiny-zh is a chat model: its QA and chat rows go through its template.
    let mut dataset = strings(&["calibrate", "dataset", "-m", &f16, "--chat"]);
    for (name, _) in CALIBRATION {
        dataset.push(i(&format!("calib-zh/{name}")));
    }
    dataset.extend(strings(&[
        "-n",
        "32",
        "--seq-len",
        "256",
        "--repeat",
        "-o",
        &p("calib-zh.jsonl"),
    ]));
    steps.push((
        "Build a calibration set from the bundled Chinese QA data, as the model sees chats",
        dataset,
    ));
    steps.push((
        "Calibrate Q4_K_M on it: AWQ scales, then GPTQ onto Q4_K's own grid",
        with_threads(strings(&[
            "calibrate",
            "quantize",
            "-m",
            &f16,
            "--dataset",
            &p("calib-zh.jsonl"),
            "--method",
            "awq+gptq",
            "--type",
            "Q4_K_M",
            "-o",
            &calibrated,
        ])),
    ));
    steps.push((
        "Compare them all on held-out text: size, perplexity, KL divergence against F16",
        with_threads(strings(&[
            "compare",
            &f16,
            &p("tiny-zh-Q4_K_M.gguf"),
            &p("tiny-zh-Q5_K_M.gguf"),
            &p("tiny-zh-Q6_K.gguf"),
            &p("tiny-zh-attn-f16-ffn-q4.gguf"),
            &calibrated,
            "--types",
            "none",
            "-f",
            &i("heldout.txt"),
            "-c",
            "256",
            "--chunks",
            "16",
            "-o",
            &p("compare"),
            "--cache",
            &p("cache"),
        ])),
    ));
    steps.push((
        "Plan for a 16 GB phone: memory at 2048 tokens of context, decode speed",
        strings(&["plan", &f16, "--device", "phone-16gb", "-c", "2048"]),
    ));
    steps.push((
        "Chat with the calibrated model (its own chat template)",
        with_threads(strings(&[
            "run",
            "-m",
            &calibrated,
            "--chat",
            "-p",
            "请介绍一下北京。",
            "-n",
            "48",
            "--seed",
            "7",
        ])),
    ));

    let n = steps.len();
    for (k, (what, line)) in steps.iter().enumerate() {
        println!("── step {}/{n}: {what}", k + 1);
        println!("$ memwall {}", shell_line(line));
        let t = Instant::now();
        crate::run_line(line)
            .with_context(|| format!("demo step {}: memwall {}", k + 1, line[0]))?;
        println!("   ({:.1} s)\n", t.elapsed().as_secs_f64());
    }

    println!(
        "Done in {:.0} s. Everything is in {}:",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    for (name, what) in [
        ("tiny-zh-f16.gguf", "the converted model"),
        (
            "tiny-zh-Q4_K_M.gguf …",
            "llama.cpp's Q4_K_M, Q5_K_M, Q6_K and the mixed-precision recipe",
        ),
        (
            "tiny-zh-Q4_K_M-awq-gptq.gguf",
            "the calibrated Q4_K_M (stock llama.cpp runs it)",
        ),
        (
            "compare/compare.md",
            "the comparison table (also compare.json)",
        ),
        (
            "compare/quality-vs-size.svg",
            "the chart (and .png when a font was found)",
        ),
        ("calib-zh.jsonl", "the calibration set"),
    ] {
        println!("  {name:<30} {what}");
    }
    println!(
        "Next: the same steps on your model — memwall convert, quantize, calibrate, compare, plan, \
         then memwall push to the phone (docs/GUIDE.md)."
    );
    Ok(())
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// The command line as a user would type it (arguments with spaces or
/// shell characters quoted).
fn shell_line(args: &[String]) -> String {
    args.iter()
        .map(|a| crate::render::shell_word(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `requested` (must be empty or absent), or the first free `memwall-demo[-N]`.
fn output_dir(requested: Option<&Path>) -> Result<PathBuf> {
    let free = |p: &Path| -> bool {
        !p.exists() || std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_none())
    };
    let dir = match requested {
        Some(p) => {
            if !free(p) {
                anyhow::bail!(
                    "{} exists and is not empty; name a new folder with -o",
                    p.display()
                );
            }
            p.to_owned()
        }
        None => (1..1000)
            .map(|k| {
                if k == 1 {
                    PathBuf::from("memwall-demo")
                } else {
                    PathBuf::from(format!("memwall-demo-{k}"))
                }
            })
            .find(|p| free(p))
            .context("no free memwall-demo-N folder here; name one with -o")?,
    };
    if !dir.is_dir() {
        super::check_output_dir(&dir, "the demo folder")?;
        std::fs::create_dir(&dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    }
    Ok(dir)
}

fn write(path: PathBuf, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("{}: cannot create", parent.display()))?;
    }
    // Atomically: a full disk leaves no torn copy among the demo's inputs.
    let mut f = memwall_format::atomic::AtomicFile::create(&path)
        .with_context(|| format!("{}: cannot write", path.display()))?;
    std::io::Write::write_all(&mut f, bytes)
        .and_then(|()| f.commit())
        .with_context(|| format!("{}: cannot write", path.display()))
}

/// Writes the built-in tiny-zh checkpoint into `dir`.
pub fn unpack_checkpoint(dir: &Path) -> Result<()> {
    for (name, bytes) in CHECKPOINT {
        write(dir.join(name), bytes)?;
    }
    Ok(())
}

fn unpack(inputs: &Path) -> Result<()> {
    unpack_checkpoint(&inputs.join("tiny-zh"))?;
    for (name, bytes) in CALIBRATION {
        write(inputs.join("calib-zh").join(name), bytes)?;
    }
    write(inputs.join("heldout.txt"), HELDOUT)
}
