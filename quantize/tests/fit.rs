//! The planner's tensor lists against what llama.cpp's converter really wrote
//! (fixtures/synth/llama-convert.json, every architecture memwall converts) and
//! against llama.cpp's F16 conversion of tiny-zh.

use std::path::Path;

use memwall_fixtures::synth::{self, Arch};
use memwall_format::gguf::GgufModel;
use memwall_quantize::fit::{Choice, Shape, TensorShape, gguf_tensors};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn sorted(mut v: Vec<(String, String, Vec<u64>)>) -> Vec<(String, String, Vec<u64>)> {
    v.sort();
    v
}

fn listing(tensors: &[TensorShape]) -> Vec<(String, String, Vec<u64>)> {
    sorted(
        tensors
            .iter()
            .map(|t| (t.name.clone(), t.ty.name().to_uppercase(), t.dims.clone()))
            .collect(),
    )
}

#[test]
fn config_json_gives_the_tensors_llama_cpp_writes_for_every_architecture() {
    let text = std::fs::read_to_string(repo().join("fixtures/synth/llama-convert.json")).unwrap();
    let recorded: serde_json::Value = serde_json::from_str(&text).unwrap();
    let archs = recorded["archs"].as_object().unwrap();
    assert_eq!(archs.len(), 7);
    for (name, entry) in archs {
        let arch = Arch::from_name(name)
            .or_else(|| {
                Arch::ALL
                    .into_iter()
                    .find(|a| a.model_type().replace('_', "-") == *name)
            })
            .unwrap_or_else(|| panic!("{name}"));
        let mut shape = synth::tiny(arch);
        shape.vocab = 49152; // the reference checkpoints carry SmolLM2's tokenizer
        let config = synth::config_json(arch, &shape);
        let planned = Shape::from_hf_config(&config).unwrap();
        let want: Vec<(String, String, Vec<u64>)> = entry["outtypes"]["f16"]["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let dims = t[2]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect();
                (
                    t[0].as_str().unwrap().to_owned(),
                    t[1].as_str().unwrap().to_owned(),
                    dims,
                )
            })
            .collect();
        assert_eq!(listing(&planned.tensors()), sorted(want), "{name}");
    }
}

#[test]
fn tiny_zh_config_matches_its_gguf_and_so_do_the_planned_bytes() {
    let text = std::fs::read_to_string(repo().join("fixtures/tiny-zh/config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    let from_config = Shape::from_hf_config(&config).unwrap();
    let gguf =
        GgufModel::open(&repo().join("fixtures/tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let from_gguf = Shape::from_gguf(&gguf).unwrap();
    assert_eq!(from_config, from_gguf);
    let (a, b) = (from_config.tensors(), gguf_tensors(&gguf));
    assert_eq!(listing(&a), listing(&b));
    // The planned Q4_K_M bytes are the bytes `memwall quantize` (= llama-quantize) writes:
    // the recorded llama-quantize output of tiny-zh has these tensor bytes.
    for ty in ["Q4_K_M", "Q6_K", "Q8_0", "attn-f16-ffn-q4"] {
        let c = Choice::by_name(ty).unwrap();
        let wa = c.weights(&from_config.facts(), &a).unwrap();
        let wb = c.weights(&from_gguf.facts(), &b).unwrap();
        assert_eq!(wa.bytes(), wb.bytes(), "{ty}");
    }
    let plan = memwall_quantize::job::plan(
        &gguf,
        Path::new("tiny-zh-f16.gguf"),
        &memwall_quantize::job::Options::new(
            memwall_format::ggml_type::file_type_by_name("Q4_K_M").unwrap(),
        ),
    )
    .unwrap();
    let planned = Choice::by_name("Q4_K_M")
        .unwrap()
        .weights(&from_gguf.facts(), &b)
        .unwrap();
    assert_eq!(planned.bytes(), plan.target_bytes());
}

/// Qwen3-30B-A3B's shape: 48 layers, 128 experts of 768, 8 per token.
fn qwen3_30b_a3b() -> Shape {
    let mut moe = Shape::dense("qwen3", 48, 2048, 6144, 32, 4, 128, 151936, false);
    moe.arch = "qwen3moe".into();
    moe.n_expert = 128;
    moe.n_expert_used = 8;
    moe.n_ff_expert = 768;
    moe
}

#[test]
fn moe_tokens_read_only_their_experts() {
    let moe = qwen3_30b_a3b();
    let c = Choice::by_name("Q4_K_M").unwrap();
    let w = c.weights(&moe.facts(), &moe.tensors()).unwrap();
    let per_token = w.bytes_per_token(moe.n_expert, moe.n_expert_used);
    // Qwen3-30B-A3B: 30.5B parameters, 3.3B active.
    let params = w.elements() as f64;
    assert!((30.0e9..31.0e9).contains(&params), "{params}");
    let active: u64 = w
        .products_per_token(moe.n_expert, moe.n_expert_used)
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert!((3.0e9..3.6e9).contains(&(active as f64)), "{active}");
    assert!(per_token * 6 < w.bytes(), "{per_token} of {}", w.bytes());
}

/// Qwen3-30B-A3B at Q4_K_M on a phone: streaming reads the routed experts the
/// cache misses and whatever dense matrix did not fit, never the whole stacks.
#[test]
fn moe_streaming_reads_only_routed_experts_that_miss_the_cache() {
    let moe = qwen3_30b_a3b();
    let c = Choice::by_name("Q4_K_M").unwrap();
    let w = c.weights(&moe.facts(), &moe.tensors()).unwrap();
    let (n, k) = (moe.n_expert, moe.n_expert_used);
    let total = w.bytes();
    let per_token = w.bytes_per_token(n, k);
    let read = |resident: u64| w.streamed_bytes_per_token(n, k, resident);
    assert_eq!(read(total), 0, "everything resident");
    // Less RAM never reads less; every budget reads less than a token's weights.
    let budgets: Vec<u64> = (0..=10).map(|i| total / 10 * i).collect();
    for pair in budgets.windows(2) {
        assert!(read(pair[0]) >= read(pair[1]), "{pair:?}");
    }
    assert!(read(0) <= per_token, "{} of {per_token}", read(0));
    // Half the file in RAM: the dense part is pinned and about 45 % of the experts
    // are cached; the prior misses about 12 % of the routed experts.
    let half = read(total / 2);
    let routed = per_token as f64 * 0.8;
    assert!(
        (half as f64) < 0.2 * routed && (half as f64) > 0.05 * routed,
        "{half} of {per_token}"
    );
    // A dense model reads the share that is not resident, as before.
    let dense = Shape::dense("qwen3", 4, 2048, 6144, 32, 4, 128, 151936, false);
    let wd = c.weights(&dense.facts(), &dense.tensors()).unwrap();
    let t = wd.bytes();
    let expect = (wd.bytes_per_token(0, 0) as f64 * 0.75).round() as u64;
    assert_eq!(wd.streamed_bytes_per_token(0, 0, t / 4), expect);
}

#[test]
fn the_routing_prior_misses_a_tenth_with_half_the_experts_cached() {
    use memwall_quantize::fit::expert_miss_rate;
    assert_eq!(expert_miss_rate(0.0), 1.0);
    assert_eq!(expert_miss_rate(1.0), 0.0);
    let half = expert_miss_rate(0.5);
    assert!((half - 0.10).abs() < 0.002, "{half}");
    let mut last = 1.0;
    for i in 1..100 {
        let m = expert_miss_rate(f64::from(i) / 100.0);
        assert!(m < last, "{i}");
        last = m;
    }
}

/// Found by the `hf_config` fuzz target: every field of this Mixtral config is
/// within its own bound, but together they make about 2^67 weights, and the sums
/// `memwall plan` makes over the tensor list overflowed u64.
#[test]
fn fuzz_weight_count_overflow_is_refused() {
    let text = std::fs::read_to_string(
        repo().join("fuzz/seeds/hf_config/regression-weight-count-overflow.json"),
    )
    .unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        Shape::from_hf_config(&config).unwrap_err().to_string(),
        "the shape has 221360946502473633792 weights; expected at most 17592186044416 (2^44)"
    );
}

/// Found by the `device_toml` fuzz target: `to_toml` (what `plan
/// --measure-host` saves) rounded to two or three decimals, so a slow storage
/// (0.004 GB/s → `0.00`) or compute rate (→ `0.000`) saved a profile that was
/// refused when loaded; and a reserve a few bytes below the RAM passed the
/// check in GiB but equalled it in bytes, leaving 0 bytes usable.
#[test]
fn fuzz_saved_device_profiles_load_back() {
    use memwall_quantize::fit::device::parse_all;
    let text = "name = \"slow\"\nram_gb = 0.2\nos_reserve_gb = 0.1\nram_bandwidth_gbs = 0.01\n\
                bandwidth_efficiency = 0.011\nstorage_read_gbs = 0.004\nthreads = 1\n\
                compute_gweights_s = 0.0015\ndispatch_us = 100000\ncache_mb = 0.5\n\
                [compute]\nQ4_K = 0.0004\n[streaming]\nQ8_0 = 0.00025\n";
    let device = parse_all(text).unwrap().remove(0);
    let saved = device.to_toml();
    let back = parse_all(&saved).unwrap_or_else(|e| panic!("{e}\n{saved}"));
    assert_eq!(back, vec![device]);

    let err = parse_all(&text.replace(
        "ram_gb = 0.2\nos_reserve_gb = 0.1",
        "ram_gb = 0.1250000001\nos_reserve_gb = 0.12500000005",
    ))
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "os_reserve_gb (0.12500000005) must be less than ram_gb (0.1250000001)"
    );
}
