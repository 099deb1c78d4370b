//! The perplexity of tiny-zh is the same on every kernel backend this CPU has
//! (scalar, AVX2, AVX-512 on x86-64; scalar, NEON, NEON with dot products on
//! aarch64, where scripts/test.sh runs this under qemu), and equals the value the
//! x86-64 build computes (recorded below) within 0.01 % — in fact bit for bit:
//! every kernel backend follows one accumulation order and the forward pass's
//! exp/ln/sin/cos are computed without the platform libm. The quantized files
//! are made here by memwall-quantize (the same bytes as llama-quantize).

use std::path::{Path, PathBuf};

use memwall_format::ggml_type::file_type_by_name;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;
use memwall_quantize::job::{self, Options};
use memwall_runtime::eval::{self, Options as Eval};
use memwall_runtime::forward::Model;
use memwall_runtime::kernels::{Backend, Kernels};
use memwall_runtime::tokenizer::Tokenizer;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

const CHUNKS: usize = 4;

/// memwall's perplexity on x86-64 (AVX-512 machine, 2026-11-29), 4 windows of 128.
/// llama-perplexity gives 173.9158, 174.2783, 174.2176, 170.8818 at this point;
/// its agreement with memwall is tested over the whole text in cli/tests/perplexity.rs.
const RECORDED: [(&str, f64); 4] = [
    ("F16", 173.926_697_763_079_35),
    ("Q8_0", 174.060_573_452_694_57),
    ("Q4_K_M", 174.301_513_611_146_36),
    ("IQ4_XS", 170.855_647_977_576_2),
];

fn model_file(ty: &str, dir: &Path) -> PathBuf {
    let f16 = fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf");
    if ty == "F16" {
        return f16;
    }
    let out = dir.join(format!("tiny-zh-{ty}.gguf"));
    let input = GgufModel::open(&f16).unwrap();
    let options = Options::new(file_type_by_name(ty).unwrap());
    let plan = job::plan(&input, &f16, &options).unwrap();
    job::run(&input, &plan, None, false, &out, &Silent).unwrap();
    out
}

fn perplexity(path: &Path, backend: Backend) -> f64 {
    let gguf = GgufModel::open(path).unwrap();
    let tokenizer = Tokenizer::from_gguf(gguf.metadata()).unwrap();
    let text = std::fs::read_to_string(fixtures().join("perplexity/heldout-24k.txt")).unwrap();
    let tokens = tokenizer.encode(&text, true, false);
    let mut model = Model::new(&gguf, 128).unwrap();
    model.set_compute(Kernels::new(backend).unwrap(), 2);
    let options = Eval {
        n_ctx: 128,
        n_batch: 128,
        max_chunks: Some(CHUNKS),
        bos: tokenizer.add_bos().then(|| tokenizer.bos()).flatten(),
        all_outputs: false,
    };
    eval::perplexity(&model, &tokens, &options, None, &Silent)
        .unwrap()
        .ppl
}

#[test]
fn every_backend_gives_the_recorded_perplexity() {
    let dir = tempfile::tempdir().unwrap();
    let backends = Backend::supported();
    let best = *backends.last().unwrap();
    let mut seen = Vec::new();
    for (ty, recorded) in RECORDED {
        let path = model_file(ty, dir.path());
        // Every backend for one K-quant model, the best one for the others (qemu is slow).
        let run: Vec<Backend> = if ty == "Q4_K_M" {
            backends.clone()
        } else {
            vec![best]
        };
        for backend in run {
            let ppl = perplexity(&path, backend);
            seen.push(format!("{ty} {} {ppl:.6}", backend.name()));
            assert!(
                (ppl / recorded - 1.0).abs() < 1e-4,
                "{ty} on {}: {ppl} vs {recorded} recorded on x86-64; all: {seen:?}",
                backend.name()
            );
        }
    }
}

/// A baseline of a model against itself: the same perplexity, KL divergence
/// 0 but for the rounding of the saved log-probabilities (llama.cpp's format
/// keeps them in 16 bits), the same top token everywhere; its scratch file is
/// gone once the baseline is.
#[test]
fn a_baseline_compares_models_through_a_scratch_file_it_removes() {
    let gguf = GgufModel::open(&fixtures().join("tiny-zh/reference/tiny-zh-f16.gguf")).unwrap();
    let tokenizer = Tokenizer::from_gguf(gguf.metadata()).unwrap();
    let text = std::fs::read_to_string(fixtures().join("perplexity/heldout-24k.txt")).unwrap();
    let tokens = tokenizer.encode(&text, true, false);
    let model = Model::new(&gguf, 128).unwrap();
    let options = Eval {
        n_ctx: 128,
        n_batch: 128,
        max_chunks: Some(2),
        bos: tokenizer.add_bos().then(|| tokenizer.bos()).flatten(),
        all_outputs: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let scratch = memwall_format::cleanup::ScratchFile::new(dir.path(), "base-", ".kld");
    let path = scratch.path().to_owned();
    let baseline = eval::Baseline::new(&model, &tokens, &options, scratch, &Silent).unwrap();
    assert!(path.exists());
    let stats = baseline.compare(&model, &options, &Silent).unwrap();
    assert!(stats.kld.mean.abs() < 1e-5, "{}", stats.kld.mean);
    assert_eq!(stats.same_top.mean, 1.0);
    assert_eq!(stats.ppl.mean, baseline.perplexity.ppl);
    drop(baseline);
    assert!(!path.exists());
}
