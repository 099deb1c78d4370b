//! `memwall plan`: predicted memory against the peak RSS `memwall run
//! --no-mmap` really reaches (tiny-zh and SmolLM2, several context lengths),
//! the seed's arithmetic for a 35B dense and a 30B-A3B MoE model, checkpoints,
//! budgets, device profiles and bad input.

mod common;

use common::{memwall, memwall_in_with_stdin, repo, stdout_of};
use serde_json::Value;

const TINY: &str = "fixtures/tiny-zh/reference/tiny-zh-f16.gguf";
const SMOL: &str = "fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Qwen3-30B-A3B as bare numbers: 30.5B parameters, 3.3B of them active
/// (8 of 128 experts).
const QWEN3_30B_A3B: &[&str] = &[
    "--params",
    "30.5e9",
    "--layers",
    "48",
    "--kv-heads",
    "4",
    "--head-dim",
    "128",
    "--vocab",
    "151936",
    "--experts",
    "128",
    "--active-experts",
    "8",
    "--active-params",
    "3.3e9",
];

fn plan_json(args: &[&str]) -> Value {
    let mut all = vec!["plan"];
    all.extend_from_slice(args);
    all.push("--json");
    serde_json::from_str(&stdout_of(&all)).unwrap()
}

/// Tensor bytes `memwall quantize TINY … --dry-run` plans with `how` (a type or `--recipe F`).
fn dry_run_tensor_bytes(how: &[&str]) -> u64 {
    let mut args = vec!["quantize", TINY, "/tmp/never-written.gguf"];
    args.extend_from_slice(how);
    args.extend_from_slice(&["--dry-run", "--json"]);
    let dry: Value = serde_json::from_str(&stdout_of(&args)).unwrap();
    dry["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["target_bytes"].as_u64().or(t["bytes"].as_u64()).unwrap())
        .sum()
}

#[test]
fn predicted_memory_is_within_ten_percent_of_the_peak_rss_of_run() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("fixtures/perplexity/heldout-24k.txt")).unwrap();
    // (model, characters of held-out text): about 128, 512 and 2048 tokens of
    // tiny-zh; 256 and 1024 of SmolLM2 (its prompt processing is slow).
    let cases = [
        (TINY, 400),
        (TINY, 1600),
        (TINY, 6800),
        (SMOL, 500),
        (SMOL, 2000),
    ];
    for (model, chars) in cases {
        let prompt = dir.path().join(format!("prompt-{chars}.txt"));
        std::fs::write(&prompt, text.chars().take(chars).collect::<String>()).unwrap();
        let run: Value = serde_json::from_str(&stdout_of(&[
            "run",
            "-m",
            model,
            "-f",
            prompt.to_str().unwrap(),
            "-c",
            "4096",
            "-n",
            "2",
            "--temp",
            "0",
            "--no-mmap",
            "--json",
        ]))
        .unwrap();
        // The code's pages count in the peak as far as the page cache holds
        // them (a debug build's are many, and vary with what ran before):
        // compare what the process allocated, the peak without them.
        let file = run["file_rss_bytes"].as_u64().unwrap();
        assert!(file > 0, "run --json reports no file-backed RSS");
        let rss = (run["peak_rss_bytes"].as_u64().unwrap() - file) as f64;
        let tokens = run["prompt_tokens"].as_u64().unwrap() + 2;
        // The cache grows with the tokens evaluated: plan for exactly those.
        let plan = plan_json(&[model, "-c", &tokens.to_string(), "--types", "Q8_0"]);
        let row = &plan["rows"][0];
        assert!(row["choice"].as_str().unwrap().starts_with("as is"));
        let memwall = &row["memwall"];
        let code = memwall["code_bytes"].as_u64().unwrap();
        assert!(code > 0 && code < memwall["overhead_bytes"].as_u64().unwrap());
        let predicted = (memwall["total_bytes"].as_u64().unwrap() - code) as f64;
        let ratio = predicted / rss;
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{model} at {tokens} tokens: predicted {predicted} besides code, peak RSS {rss} \
             besides file-backed pages (ratio {ratio:.3})"
        );
    }
}

#[test]
fn bare_numbers_reproduce_the_seed_arithmetic_for_35b_dense() {
    let v = plan_json(&[
        "--params",
        "35e9",
        "--layers",
        "40",
        "--kv-heads",
        "32",
        "--head-dim",
        "128",
        "--vocab",
        "256000",
    ]);
    let nominal = &v["model"]["nominal_bytes"];
    assert_eq!(nominal["fp16"], 70_000_000_000u64);
    assert_eq!(nominal["int8"], 35_000_000_000u64);
    assert_eq!(nominal["int4"], 17_500_000_000u64);
    let rows = v["rows"].as_array().unwrap();
    let row = |label: &str| rows.iter().find(|r| r["choice"] == label).unwrap();
    assert_eq!(row("FP16 (nominal)")["weights_bytes"], 70_000_000_000u64);
    assert_eq!(row("INT8 (nominal)")["weights_bytes"], 35_000_000_000u64);
    assert_eq!(row("INT4 (nominal)")["weights_bytes"], 17_500_000_000u64);
    // KV cache: 40 layers × 32 KV heads × 128 × 2048 × 2 (K and V) × 2 bytes = 1.34 GB.
    assert_eq!(v["kv_bytes"], 40u64 * 32 * 128 * 2048 * 2 * 2);
    let kv = v["kv_bytes"].as_u64().unwrap() as f64;
    assert!((1e9..=2e9).contains(&kv));
    // A 16 GB phone keeps 10-12 GB for apps: 4-bit 35B only runs streaming from flash.
    let int4 = row("INT4 (nominal)");
    assert_eq!(int4["fits"], "streaming");
    assert!(int4["decode"]["flash_bytes_per_token"].as_u64().unwrap() > 0);
    assert!(
        int4["commands"]["memwall"]
            .as_str()
            .unwrap()
            .contains("--resident")
    );
}

#[test]
fn a_30b_a3b_moe_reads_only_its_active_experts() {
    let moe = plan_json(QWEN3_30B_A3B);
    assert_eq!(moe["model"]["nominal_bytes"]["fp16"], 61_000_000_000u64);
    let rows = moe["rows"].as_array().unwrap();
    let int4 = rows
        .iter()
        .find(|r| r["choice"] == "INT4 (nominal)")
        .unwrap();
    assert_eq!(int4["weights_bytes"], 15_250_000_000u64);
    // Bytes per token: 3.3B active × 4 bits, plus the KV cache at half the context.
    let kv_half = 48u64 * 4 * 128 * 1024 * 2 * 2;
    assert_eq!(
        int4["decode"]["bytes_per_token"].as_u64().unwrap(),
        1_650_000_000 + kv_half
    );
    // A 4-bit MoE that fits decodes about params/active times faster than the dense model.
    let q2 = rows.iter().find(|r| r["choice"] == "Q2_K (≈)").unwrap();
    assert_eq!(q2["fits"], "RAM");
    assert_eq!(moe["recommended"], "Q2_K (≈)");
    let ram_bound = q2["decode"]["ram_bound"].as_f64().unwrap();
    let device = &moe["device"];
    let bw = device["ram_bandwidth_bytes_per_s"].as_f64().unwrap()
        * device["bandwidth_efficiency"].as_f64().unwrap();
    let bytes = q2["decode"]["bytes_per_token"].as_f64().unwrap();
    assert!((ram_bound - bw / bytes).abs() < 1e-6 * ram_bound);
}

#[test]
fn a_checkpoint_plans_the_same_bytes_as_its_gguf() {
    let from_dir = plan_json(&["fixtures/tiny-zh", "--types", "Q4_K_M,Q6_K,attn-q8-ffn-q4"]);
    let from_gguf = plan_json(&[TINY, "--types", "Q4_K_M,Q6_K,attn-q8-ffn-q4"]);
    let rows = |v: &Value| -> Vec<(String, u64)> {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| !r["choice"].as_str().unwrap().starts_with("as is"))
            .map(|r| {
                (
                    r["choice"].as_str().unwrap().to_owned(),
                    r["weights_bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(rows(&from_dir), rows(&from_gguf));
    assert_eq!(rows(&from_dir).len(), 3);
    // The planned Q4_K_M bytes are the tensor bytes `memwall quantize --dry-run` plans.
    assert_eq!(rows(&from_gguf)[0].1, dry_run_tensor_bytes(&["Q4_K_M"]));
}

#[test]
fn a_budget_picks_the_largest_choice_that_fits_and_writes_a_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("fit.toml");
    let all = plan_json(&[TINY, "-c", "512"]);
    let totals: Vec<(String, u64, u64)> = all["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["choice"].as_str().unwrap().starts_with("as is"))
        .map(|r| {
            (
                r["choice"].as_str().unwrap().to_owned(),
                r["memwall"]["total_bytes"].as_u64().unwrap(),
                r["weights_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let budget_mib = 28u64;
    let want = totals
        .iter()
        .filter(|(_, total, _)| *total <= budget_mib << 20)
        .max_by_key(|(_, _, w)| *w)
        .unwrap()
        .0
        .clone();
    let v = plan_json(&[
        TINY,
        "-c",
        "512",
        "--budget",
        &budget_mib.to_string(),
        "--write-recipe",
        recipe.to_str().unwrap(),
    ]);
    assert_eq!(v["budget_choice"], want.as_str());
    assert_eq!(v["recommended"], want.as_str());
    // The recipe file drives `memwall quantize` to the same bytes the plan counted.
    let planned = totals.iter().find(|(c, _, _)| *c == want).unwrap().2;
    assert_eq!(
        dry_run_tensor_bytes(&["--recipe", recipe.to_str().unwrap()]),
        planned
    );
    let out = memwall(&["plan", TINY, "--budget", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing fits in 1 MiB"));
}

#[test]
fn recommended_commands_carry_context_threads_batch_and_memory_mode() {
    let v = plan_json(&[TINY, "-c", "1024", "-b", "256", "--device", "phone-8gb"]);
    let rec = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["recommended"] == true)
        .unwrap();
    let cmd = rec["commands"]["memwall"].as_str().unwrap();
    assert!(cmd.starts_with("memwall run -m "), "{cmd}");
    for part in ["-c 1024", "-t 4", "-b 256", "--no-mmap"] {
        assert!(cmd.contains(part), "{cmd}");
    }
    let llama = rec["commands"]["llama_cli"].as_str().unwrap();
    assert!(
        llama.starts_with("llama-cli -m ") && llama.contains("-c 1024"),
        "{llama}"
    );
    let q8 = plan_json(&[TINY, "--kv-type", "q8_0"]);
    assert!(
        q8["rows"][1]["commands"]["llama_cli"]
            .as_str()
            .unwrap()
            .contains("-ctk q8_0")
    );
    assert!(q8["kv_bytes"].as_u64().unwrap() < plan_json(&[TINY])["kv_bytes"].as_u64().unwrap());
    let text = stdout_of(&["plan", TINY]);
    assert!(
        text.contains("Recommended: ") && text.contains("memwall run -m"),
        "{text}"
    );
}

#[test]
fn device_profiles_are_data() {
    let list: Value =
        serde_json::from_str(&stdout_of(&["plan", "--list-devices", "--json"])).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["phone-8gb", "phone-12gb", "phone-16gb", "phone-24gb"]
    );
    let dir = tempfile::tempdir().unwrap();
    let mine = dir.path().join("mine.toml");
    std::fs::write(
        &mine,
        "name = \"mine\"\nram_gb = 6\nos_reserve_gb = 5.99\nram_bandwidth_gbs = 10\n\
         bandwidth_efficiency = 0.5\nstorage_read_gbs = 1\nthreads = 2\ncompute_gweights_s = 4\n",
    )
    .unwrap();
    let v = plan_json(&[TINY, "--device", mine.to_str().unwrap()]);
    assert_eq!(v["device"]["name"], "mine");
    // 10 MiB usable: the F16 model only runs streaming.
    let f16 = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["choice"] == "F16")
        .unwrap();
    assert_ne!(f16["fits"], "RAM");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "name = \"bad\"\nram_gb = \"lots\"\n").unwrap();
    let out = memwall(&["plan", TINY, "--device", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("ram_gb"), "{err}");
}

#[test]
fn measure_host_writes_a_profile_plan_can_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    let out = memwall(&[
        "plan",
        "--measure-host",
        "--save",
        path.to_str().unwrap(),
        "-t",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    for key in [
        "ram_bandwidth_gbs",
        "compute_gweights_s",
        "dispatch_us",
        "[device.compute]",
        "q4_K",
    ] {
        assert!(text.contains(key), "{text}");
    }
    let v = plan_json(&[TINY, "--device", path.to_str().unwrap()]);
    assert_eq!(v["device"]["name"], "this-machine");
    assert!(v["device"]["ram_bandwidth_bytes_per_s"].as_f64().unwrap() > 1e8);
    assert!(v["rows"][0]["decode"]["tokens_per_s"].as_f64().unwrap() > 1.0);
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = |name: &str, config: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("config.json"), config).unwrap();
        d
    };
    let cfg = checkpoint(
        "gpt",
        r#"{"architectures": ["GPTNeoXForCausalLM"], "hidden_size": 64}"#,
    );
    let huge = checkpoint(
        "huge",
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 1e30, "num_attention_heads": 8,
            "num_hidden_layers": 2, "vocab_size": 100, "intermediate_size": 64}"#,
    );
    let zero = checkpoint(
        "zero",
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 0,
            "num_hidden_layers": 2, "vocab_size": 100, "intermediate_size": 64}"#,
    );
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff").unwrap();
    for (args, want) in [
        (vec!["plan", "no/such/thing.gguf"], "no such file"),
        (vec!["plan", cfg.to_str().unwrap()], "GPTNeoXForCausalLM"),
        (vec!["plan", huge.to_str().unwrap()], "hidden_size"),
        (vec!["plan", zero.to_str().unwrap()], "heads is 0"),
        (vec!["plan", junk.to_str().unwrap()], "junk.gguf"),
        (vec!["plan", TINY, "--device", "phone-99gb"], "phone-16gb"),
        (vec!["plan", TINY, "--kv-type", "q4"], "--kv-type"),
        (vec!["plan", TINY, "--types", "Q7_X"], "Q7_X"),
        (vec!["plan", "--params", "35e9"], "--layers"),
    ] {
        let out = memwall(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The command lines under "Recommended:" in `plan`'s text.
fn recommended_lines(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.starts_with("Recommended:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().to_owned())
        .collect()
}

/// Runs a printed `memwall …` line in `dir` (plain words: these paths have no spaces).
fn paste(dir: &std::path::Path, line: &str, stdin: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    assert_eq!(words[0], "memwall", "{line}");
    let out = memwall_in_with_stdin(dir, &words[1..], stdin.as_bytes());
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_recommended_commands_run_as_pasted() {
    // From a GGUF, in another folder: the quantize line makes the file the run line runs.
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let f16 = models.join("tiny-zh-f16.gguf");
    std::fs::copy(repo().join(TINY), &f16).unwrap();
    let budget = ["-c", "512", "--types", "Q4_K_M,Q8_0", "--budget", "24"];
    let mut line = vec!["plan", f16.to_str().unwrap()];
    line.extend_from_slice(&budget);
    let text = stdout_of(&line);
    let lines = recommended_lines(&text);
    let q4 = models.join("tiny-zh-Q4_K_M.gguf");
    assert_eq!(
        lines[0],
        format!("memwall quantize {} {} Q4_K_M", f16.display(), q4.display()),
        "{text}"
    );
    assert!(lines[1].starts_with(&format!("memwall run -m {} --chat", q4.display())));
    assert!(lines[2].starts_with(&format!("llama-cli -m {}", q4.display())));
    paste(dir.path(), &lines[0], "");
    let reply = paste(dir.path(), &lines[1], "北京是哪个国家的首都？\n");
    assert!(!reply.trim().is_empty());
    // Now that the file exists, there is nothing to make.
    let again = recommended_lines(&stdout_of(&line));
    assert!(again[0].starts_with("memwall run -m "), "{again:?}");

    // A quantized file is recommended as it is, never a bigger one it cannot become.
    let text = stdout_of(&["plan", q4.to_str().unwrap()]);
    assert!(
        text.contains("Recommended: tiny-zh-Q4_K_M.gguf as it is"),
        "{text}"
    );
    let lines = recommended_lines(&text);
    assert!(
        lines[0].starts_with(&format!("memwall run -m {} ", q4.display())),
        "{lines:?}"
    );
    let json = plan_json(&[q4.to_str().unwrap()]);
    assert_eq!(json["recommended"], "as is (tiny-zh-Q4_K_M)");

    // From a checkpoint: convert, then quantize, then run, in the current folder.
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let ckpt = repo().join("fixtures/tiny-zh");
    let out = common::memwall_in(
        &work,
        &[
            "plan",
            ckpt.to_str().unwrap(),
            "-c",
            "512",
            "--types",
            "Q4_K_M,Q8_0",
            "--budget",
            "24",
        ],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines = recommended_lines(&text);
    assert_eq!(
        lines[0],
        format!("memwall convert {}", ckpt.display()),
        "{text}"
    );
    assert_eq!(
        lines[1],
        "memwall quantize tiny-zh-f16.gguf tiny-zh-Q4_K_M.gguf Q4_K_M"
    );
    // tiny-zh's tokenizer is its own: the plan says convert will ask for --pre.
    assert!(lines[4].contains("convert asks for --pre NAME"), "{text}");
    let err = common::memwall_in(&work, &lines[0].split(' ').skip(1).collect::<Vec<_>>());
    assert!(String::from_utf8_lossy(&err.stderr).contains("name it with --pre"));
    paste(&work, &format!("{} --pre gpt-2", lines[0]), "");
    paste(&work, &lines[1], "");
    paste(&work, &lines[2], "你好\n");
}

/// The seed's two phone cases (a 35B dense model on a 16 GB phone, a 30B-A3B
/// MoE on a 12 GB one) fit in RAM only at Q2_K: the plan says what that
/// costs (llama-quantize's own perplexity number), and offers a calibrated
/// file of the same size, a better type streamed from flash, and a
/// measurement; a longer context that a shorter one would let a better type
/// fit is offered too. A recommendation that is not risky carries none of it.
#[test]
fn a_risky_recommendation_says_its_cost_and_offers_alternatives() {
    let dense: &[&str] = &[
        "--params",
        "35e9",
        "--layers",
        "40",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--vocab",
        "256000",
        "--device",
        "phone-16gb",
    ];
    let moe = [QWEN3_30B_A3B, &["--device", "phone-12gb"]].concat();
    for case in [dense, &moe] {
        let v = plan_json(case);
        assert_eq!(v["recommended"], "Q2_K (≈)", "{case:?}");
        let q = &v["quality"];
        assert_eq!(q["risky"], true);
        assert_eq!(q["llama3_8b_ppl_increase"], 3.5199);
        assert!(q["warning"].as_str().unwrap().contains("3.52"), "{q}");
        let alt = &q["alternatives"];
        let calibrate = alt["calibrate"].as_str().unwrap();
        assert!(
            calibrate.starts_with("memwall calibrate quantize -m MODEL-f16.gguf")
                && calibrate.contains("--type Q2_K"),
            "{calibrate}"
        );
        // Streaming: a type with a smaller published loss, larger than Q2_K.
        let streamed = alt["streaming"]["choice"].as_str().unwrap();
        let rows = v["rows"].as_array().unwrap();
        let row = |label: &str| rows.iter().find(|r| r["choice"] == label).unwrap();
        assert_eq!(row(streamed)["fits"], "streaming", "{streamed}");
        assert!(
            row(streamed)["weights_bytes"].as_u64() > row("Q2_K (≈)")["weights_bytes"].as_u64()
        );
        assert!(
            ["Q3_K_M (≈)", "IQ4_XS (≈)", "Q4_K_M (≈)"].contains(&streamed),
            "{streamed}"
        );
        // Even 256 tokens of context leave no room for a better type.
        assert!(alt["shorter_context"].is_null(), "{alt}");
        let mut args = vec!["plan"];
        args.extend_from_slice(case);
        let text = stdout_of(&args);
        assert!(text.contains("Quality: Q2_K adds 3.52"), "{text}");
        assert!(text.contains("memwall compare MODEL-f16.gguf"), "{text}");
        assert!(text.contains("a shorter context does not help"), "{text}");
    }
    // A 14B model at 32768 tokens: halving the context lets IQ4_XS fit.
    let long = plan_json(&[
        "--params",
        "14e9",
        "--layers",
        "48",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--vocab",
        "152064",
        "-c",
        "32768",
    ]);
    assert_eq!(long["recommended"], "Q2_K (≈)");
    let shorter = &long["quality"]["alternatives"]["shorter_context"];
    assert_eq!(shorter["ctx"], 16384, "{shorter}");
    assert_eq!(shorter["choice"], "IQ4_XS (≈)");
    let usable = long["device"]["usable_bytes"].as_u64().unwrap();
    assert!(shorter["total_bytes"].as_u64().unwrap() <= usable);
    // tiny-zh as it is: nothing risky, no alternatives.
    let tiny = plan_json(&[TINY]);
    assert_eq!(tiny["quality"]["risky"], false, "{}", tiny["quality"]);
    assert!(tiny["quality"]["alternatives"].is_null());
    assert!(!stdout_of(&["plan", TINY]).contains("Quality:"));
}
