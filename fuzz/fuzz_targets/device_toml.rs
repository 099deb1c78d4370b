//! Device profiles for `memwall plan`: any text either fails with an error, or
//! gives profiles that pass the checks the built-ins pass (a reserve below the
//! RAM, finite positive rates, efficiency and overlap in range) and that
//! `to_toml` (what `--measure-host` saves) parses back to exactly. The
//! planner's arithmetic on them — footprints, what stays resident, decode
//! speed of a small dense and a large MoE model, cache-resident or streaming
//! from flash — gives finite, positive speeds and never panics.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use memwall_quantize::fit::device::parse_all;
use memwall_quantize::fit::{
    Choice, Device, KvType, Load, Runtime, Shape, Weights, decode_speed, footprint,
};

fn check(d: &Device) {
    assert!(d.os_reserve_bytes < d.ram_bytes, "{d:?}");
    assert!(d.usable_bytes() > 0);
    for r in [d.ram_bandwidth, d.storage_read, d.compute] {
        assert!(r.is_finite() && r > 0.0, "{d:?}");
    }
    assert!(d.bandwidth_efficiency > 0.0 && d.bandwidth_efficiency <= 1.0);
    assert!((0.0..=1.0).contains(&d.overlap_loss));
    assert!(d.dispatch.is_finite() && d.dispatch >= 0.0);
    assert!(d.threads >= 1);
    for (_, r) in d.compute_by_type.iter().chain(&d.streaming_by_type) {
        assert!(r.is_finite() && *r > 0.0, "{d:?}");
    }
}

/// A small dense model (cache-resident on any profile) and Qwen3-30B-A3B's
/// shape (streams from flash on a phone), each as Q4_K_M, computed once.
fn models() -> &'static [(Shape, Weights); 2] {
    static MODELS: OnceLock<[(Shape, Weights); 2]> = OnceLock::new();
    MODELS.get_or_init(|| {
        let mut big = Shape::dense("qwen3moe", 48, 2048, 6144, 32, 4, 128, 151936, false);
        (big.n_expert, big.n_expert_used, big.n_ff_expert) = (128, 8, 768);
        let small = Shape::dense("llama", 4, 256, 704, 4, 2, 64, 1000, true);
        [small, big].map(|shape| {
            let q4km = Choice::by_name("Q4_K_M").unwrap();
            let weights = q4km.weights(&shape.facts(), &shape.tensors()).unwrap();
            (shape, weights)
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(devices) = parse_all(text) else { return };
    for d in &devices {
        check(d);
        let saved = d.to_toml();
        let back = parse_all(&saved).unwrap_or_else(|e| panic!("{e}\n{saved}"));
        assert_eq!(back, [d.clone()], "{saved}");

        for (shape, weights) in models() {
            let load = Load {
                file_bytes: weights.bytes(),
                header_bytes: 1 << 20,
                ctx: 4096,
                batch: 512,
                kv: KvType::F16,
            };
            let f = footprint(Runtime::Memwall, shape, &load);
            let rest = f.total() - f.weights;
            let resident = d.usable_bytes().saturating_sub(rest).min(weights.bytes());
            for resident in [weights.bytes(), resident, 0] {
                let s = decode_speed(d, shape, weights, KvType::F16, 2048, resident);
                assert!(
                    s.tokens_per_s.is_finite() && s.tokens_per_s > 0.0,
                    "{s:?} {d:?}"
                );
                assert!(s.ram_bound > 0.0 && s.compute_bound > 0.0, "{s:?}");
                assert!(s.flash_bound.is_none_or(|b| b > 0.0), "{s:?}");
                assert!(s.flash_bytes_per_token <= s.bytes_per_token);
            }
        }
    }
});
