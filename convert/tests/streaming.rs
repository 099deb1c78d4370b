//! Streaming changes what is held in RAM, never a logit: memwall-synth's
//! checkpoints (a dense llama, and Qwen3-MoE and Mixtral with 16 experts, 4 per
//! token, and a skewed router), converted to Q8_0 and run with every weight in
//! the mapping and again under streaming budgets from nothing to everything,
//! give the same bits for a prompt batch and the tokens decoded after it.
//! Under budgets that leave the experts streaming, the cache reads exactly one
//! expert's bytes per miss (besides what it reads ahead on a guess, when asked to).

mod common;

use common::{fixtures, options};

use memwall_convert::job::convert;
use memwall_convert::tensors::OutType;
use memwall_fixtures::synth::{Arch, Options, tiny, write_checkpoint};
use memwall_format::gguf::GgufModel;
use memwall_format::progress::Silent;
use memwall_runtime::forward::{Model, Streaming};

/// The logits of a 9-token prompt batch and of 6 tokens decoded one by one.
fn logits(model: &Model) -> Vec<f32> {
    let mut session = model.session();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 5_077 + 11) % 49_152).collect();
    let mut out = model.forward(&mut session, &prompt).unwrap();
    for i in 0..6u32 {
        out.extend(
            model
                .forward(&mut session, &[(i * 7_919 + 3) % 49_152])
                .unwrap(),
        );
    }
    out
}

fn gguf_of(dir: &std::path::Path, arch: Arch) -> std::path::PathBuf {
    let mut shape = tiny(arch);
    shape.vocab = 49_152;
    if arch.is_moe() {
        shape.experts = 16;
        shape.experts_used = 4;
    }
    let synth = Options {
        tokenizer_dir: Some(fixtures().join("smollm2")),
        weight_scale: 8.0,
        router_skew: 0.5,
        ..Options::default()
    };
    let hf = dir.join(arch.model_type());
    write_checkpoint(&hf, arch, &shape, &synth, &mut |_| {}).unwrap();
    let out = dir.join(format!("{}.gguf", arch.model_type()));
    let convert_options = options(OutType::Q8_0, Some("smollm"));
    convert(&hf, &out, &convert_options, &Silent).unwrap();
    out
}

#[test]
fn streaming_gives_the_same_bits_as_the_mapping_dense_and_moe() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Arch::Llama, Arch::Qwen3Moe, Arch::Mixtral] {
        let path = gguf_of(dir.path(), arch);
        let gguf = GgufModel::open(&path).unwrap();
        let name = arch.model_type();
        let plain = logits(&Model::new(&gguf, 64).unwrap());
        let size = gguf.total_file_size();
        let mut cached_runs = 0;
        let budgets = [0, size / 8, size / 3, size / 2, 2 * size];
        let runs = budgets
            .iter()
            .map(|&b| (b, false))
            .chain([(0, true), (size / 3, true)]);
        for (resident, speculate) in runs {
            let mut model = Model::new(&gguf, 64).unwrap();
            let report = model
                .enable_streaming(Streaming {
                    resident_bytes: resident,
                    prefetch: 1,
                    speculate,
                })
                .unwrap();
            let streamed = logits(&model);
            assert!(
                plain
                    .iter()
                    .zip(&streamed)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}, {resident} bytes resident: the logits moved"
            );
            let stats = model.expert_stats();
            assert_eq!(
                stats.is_some(),
                report.experts.is_some(),
                "{name}, {resident}: a cache is reported when it runs"
            );
            if !arch.is_moe() || resident >= size {
                assert!(
                    report.experts.is_none(),
                    "{name}, {resident}: no expert cache"
                );
                continue;
            }
            let x = report.experts.unwrap();
            let s = stats.unwrap();
            assert_eq!(x.experts, 32, "{name}: 2 layers × 16 experts");
            assert!(x.slots >= 6 && x.slots <= 32, "{name}: {} slots", x.slots);
            // 2 layers × (the prompt's distinct experts + 6 × 4 decoded).
            assert!(
                s.requests >= 2 * (4 + 6 * 4),
                "{name}: {} requests",
                s.requests
            );
            assert_eq!(
                s.bytes_read - s.bytes_guessed,
                (s.requests - s.hits) * s.bundle_bytes,
                "{name}, {resident}: one expert's bytes per miss"
            );
            if !speculate {
                assert_eq!(s.bytes_guessed, 0);
            }
            assert_eq!(s.uses.len(), 2);
            cached_runs += 1;
        }
        if arch.is_moe() {
            assert!(
                cached_runs >= 3,
                "{name}: budgets below the file stream experts"
            );
        }
    }
}
