//! `config.json` as `memwall convert` and `memwall plan` read it: transformers'
//! defaults are filled deterministically and idempotently; the converter's
//! hyper-parameter keys, when accepted, are all present-once, and every F32
//! it writes is finite (gguf-py cannot pack a float32 overflow); the planner's
//! shape, when accepted, lies within the bounds `Shape::check` states, and the
//! arithmetic `memwall plan` then does on it (tensor list, parameter count,
//! weight bytes of Q4_K_M and F16 for lists of up to 2000 tensors, KV cache
//! and working memory at the trained context) stays within u64.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memwall_convert::arch::Arch;
use memwall_convert::hf_config::with_defaults;
use memwall_convert::metadata::hparams;
use memwall_convert::tensors::OutType;
use memwall_quantize::fit::{Choice, KvType, Load, Runtime, Shape, footprint};
use memwall_format::gguf::{Metadata, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(mut config) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let original = config.clone();
    with_defaults(&mut config);
    let mut again = config.clone();
    with_defaults(&mut again);
    assert_eq!(
        again, config,
        "filling the defaults twice changes the config"
    );
    let mut fresh = original;
    with_defaults(&mut fresh);
    assert_eq!(fresh, config, "filling the defaults is not deterministic");

    if let Some(arch) = config["architectures"][0]
        .as_str()
        .and_then(|c| Arch::for_class(c).ok())
    {
        let mut meta = Metadata::new();
        if hparams(&mut meta, &config, arch, OutType::F16).is_ok() {
            for (key, value) in meta.iter() {
                if let Value::F32(f) = value {
                    assert!(f.is_finite(), "{key} = {f}");
                }
            }
            assert!(meta.contains(&format!("{}.block_count", arch.gguf)));
            let mut meta2 = Metadata::new();
            hparams(&mut meta2, &config, arch, OutType::F16).expect("deterministic");
            assert_eq!(meta, meta2);
        }
    }

    let Ok(shape) = Shape::from_hf_config(&config) else {
        return;
    };
    shape.check().expect("from_hf_config checks the shape");
    let tensors = shape.tensors();
    let mut params = 0u64;
    for t in &tensors {
        let n = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        params = n
            .and_then(|n| params.checked_add(n))
            .expect("parameter count overflows");
    }
    assert!(params > 0);
    // The mixer costs ~0.1 ms per tensor under ASan: shapes of thousands of
    // layers (legal up to 4096) would time out. Their byte sums are bounded by
    // the parameter count just checked (at most 4 bytes per weight).
    if tensors.len() > 2000 {
        return;
    }
    for name in ["Q4_K_M", "F16"] {
        let choice = Choice::by_name(name).expect("known type");
        // A shape the mixer cannot quantize is an error, not a panic.
        if let Ok(w) = choice.weights(&shape.facts(), &tensors) {
            let bytes = w.parts.iter().try_fold(0u64, |a, p| a.checked_add(p.bytes));
            let bytes = bytes.expect("weight bytes overflow");
            let load = Load {
                file_bytes: bytes,
                header_bytes: shape.n_vocab * 36 + (64 << 10),
                ctx: shape.ctx_train.clamp(1, 1 << 20),
                batch: 512,
                kv: KvType::F16,
            };
            for runtime in [Runtime::Memwall, Runtime::LlamaCpp] {
                let f = footprint(runtime, &shape, &load);
                let total = [f.weights, f.kv, f.compute, f.overhead]
                    .iter()
                    .try_fold(0u64, |a, &b| a.checked_add(b));
                assert!(total.is_some(), "footprint overflows");
            }
        }
    }
    let _ = shape.dispatches_per_token();
    let _ = shape.kv_bytes_per_token(KvType::F32);
    let _ = shape.kv_bytes(KvType::F32, 1 << 20);
    let _ = shape.attention_ops(1 << 20);
});
