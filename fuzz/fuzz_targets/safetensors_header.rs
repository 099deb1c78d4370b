//! Safetensors files: the input is written as `model.safetensors` next to a
//! `config.json` of `{}` and opened as a checkpoint. memwall accepts exactly
//! the files the `safetensors` crate accepts whose tensors are all F32, F16 or
//! BF16; an accepted file's tensors are sorted by name, lie after the header
//! and inside the file, do not overlap, have `elements × element size` bytes,
//! and sit at the `data_offsets` the header (read here with serde_json) gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memwall_convert::checkpoint::{Checkpoint, SourceType};
use safetensors::{Dtype, SafeTensors};

fuzz_target!(|data: &[u8]| {
    let dir = std::path::Path::new("/dev/shm").join(format!(
        "memwall-fuzz-safetensors_header-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("config.json"), "{}").expect("write config");
    std::fs::write(dir.join("model.safetensors"), data).expect("write shard");
    let opened = Checkpoint::open(&dir);
    let reference = SafeTensors::deserialize(data).ok().filter(|st| {
        st.tensors()
            .iter()
            .all(|(_, v)| matches!(v.dtype(), Dtype::F32 | Dtype::F16 | Dtype::BF16))
    });
    match (&opened, &reference) {
        (Ok(ckpt), Some(st)) => check(ckpt, st, data),
        (Err(_), None) => {}
        (Ok(_), None) => panic!("accepted a file the safetensors crate refuses"),
        (Err(e), Some(_)) => panic!("refused a valid file: {e}"),
    }
    drop(opened);
    std::fs::remove_dir_all(&dir).expect("remove temp dir");
});

fn check(ckpt: &Checkpoint, st: &SafeTensors, data: &[u8]) {
    let n = u64::from_le_bytes(data[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value =
        serde_json::from_slice(&data[8..8 + n]).expect("header is JSON");
    let tensors = ckpt.tensors();
    assert_eq!(tensors.len(), st.len());
    assert!(
        tensors.windows(2).all(|w| w[0].name < w[1].name),
        "not sorted by name, or a name twice"
    );
    let mut ranges: Vec<_> = tensors.iter().map(|t| t.range.clone()).collect();
    ranges.sort_by_key(|r| (r.start, r.end));
    for w in ranges.windows(2) {
        assert!(
            w[0].end <= w[1].start,
            "tensors overlap: {:?} {:?}",
            w[0],
            w[1]
        );
    }
    for t in tensors {
        assert!(
            t.range.start >= 8 + n && t.range.end <= data.len(),
            "{} outside the data",
            t.name
        );
        let elements = t
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .expect("no overflow");
        assert_eq!(
            elements.checked_mul(t.ty.size()),
            Some(t.range.len()),
            "{} size",
            t.name
        );
        let entry = &header[&t.name];
        let dtype = match t.ty {
            SourceType::F32 => "F32",
            SourceType::F16 => "F16",
            SourceType::BF16 => "BF16",
        };
        assert_eq!(entry["dtype"], dtype, "{}", t.name);
        let shape: Vec<usize> = serde_json::from_value(entry["shape"].clone()).expect("shape");
        assert_eq!(shape, t.shape, "{}", t.name);
        let offsets: [usize; 2] =
            serde_json::from_value(entry["data_offsets"].clone()).expect("offsets");
        assert_eq!(
            t.range,
            8 + n + offsets[0]..8 + n + offsets[1],
            "{}",
            t.name
        );
        assert_eq!(ckpt.data(t), &data[t.range.clone()]);
    }
}
