//! Sharded checkpoints: the input is `model.safetensors.index.json`, then up
//! to four shard files, separated by `FUZZSPLIT`; shard i is written as
//! `model-0000i-of-0000n.safetensors` into `<tmp>/ckpt/`, next to a
//! `config.json` of `{}`. A valid shard `<tmp>/outside.safetensors` sits one
//! level up, where `../` would reach it. An accepted checkpoint has unique
//! tensor names; each tensor lives in a shard that is a file directly inside
//! the checkpoint folder, and the index's weight_map names exactly these
//! tensors, each with that shard's file name.
#![no_main]

use std::collections::{BTreeMap, HashSet};

use libfuzzer_sys::fuzz_target;
use memwall_convert::checkpoint::Checkpoint;

const SEPARATOR: &[u8] = b"FUZZSPLIT";

fn chunks(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(i) = rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
        out.push(&rest[..i]);
        rest = &rest[i + SEPARATOR.len()..];
    }
    out.push(rest);
    out
}

/// A one-tensor safetensors file: `escaped`, F32, shape [1].
fn outside_shard() -> Vec<u8> {
    let header = br#"{"escaped":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(&1f32.to_le_bytes());
    out
}

fuzz_target!(|data: &[u8]| {
    let parts = chunks(data);
    if parts.len() > 5 {
        return;
    }
    let tmp = std::path::Path::new("/dev/shm").join(format!(
        "memwall-fuzz-safetensors_index-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let dir = tmp.join("ckpt");
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(tmp.join("outside.safetensors"), outside_shard()).expect("write outside");
    std::fs::write(dir.join("config.json"), "{}").expect("write config");
    std::fs::write(dir.join("model.safetensors.index.json"), parts[0]).expect("write index");
    let n = parts.len() - 1;
    for (i, shard) in parts[1..].iter().enumerate() {
        let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        std::fs::write(dir.join(name), shard).expect("write shard");
    }
    if let Ok(ckpt) = Checkpoint::open(&dir) {
        check(&ckpt, &dir, parts[0]);
    }
    std::fs::remove_dir_all(&tmp).expect("remove temp dir");
});

fn check(ckpt: &Checkpoint, dir: &std::path::Path, index: &[u8]) {
    let index: serde_json::Value = serde_json::from_slice(index).expect("accepted index is JSON");
    let weight_map: BTreeMap<&str, &str> = index["weight_map"]
        .as_object()
        .expect("weight_map")
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().expect("file name")))
        .collect();
    let dir = dir.canonicalize().expect("folder");
    let mut names = HashSet::new();
    for t in ckpt.tensors() {
        assert!(
            names.insert(t.name.as_str()),
            "tensor {} in two shards",
            t.name
        );
        let shard = ckpt.shard_path(t);
        let real = shard.canonicalize().expect("the shard exists");
        assert_eq!(
            real.parent(),
            Some(dir.as_path()),
            "{} escapes the folder",
            shard.display()
        );
        let file = real.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            weight_map.get(t.name.as_str()),
            Some(&file),
            "index disagrees on {}",
            t.name
        );
    }
    let listed: HashSet<&str> = weight_map.keys().copied().collect();
    assert_eq!(
        listed, names,
        "the index lists other tensors than the shards hold"
    );
}
