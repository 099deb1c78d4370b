//! Importance-matrix reader (GGUF and legacy `.dat`): any file either fails
//! with an error naming the file, or loads into entries with unique, non-empty
//! value lists of finite, non-negative numbers (means of squared activations).
//! An accepted matrix written back by memwall's writers (GGUF, and legacy
//! `.dat` when the name fits) loads to the same values.
#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use memwall_calibrate::imatrix::{Entry, Stats};
use memwall_quantize::imatrix::Imatrix;

/// A scratch file in /dev/shm, removed when dropped (also when the property fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str, bytes: &[u8]) -> Scratch {
        let path = PathBuf::from(format!(
            "/dev/shm/memwall-fuzz-imatrix-{}-{tag}",
            std::process::id()
        ));
        std::fs::write(&path, bytes).expect("/dev/shm is writable");
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fuzz_target!(|data: &[u8]| {
    let input = Scratch::new("in", data);
    let m = match Imatrix::load(&input.0) {
        Ok(m) => m,
        Err(e) => {
            assert!(
                e.to_string().starts_with(&*input.0.to_string_lossy()),
                "{e}"
            );
            return;
        }
    };
    assert!(!m.entries.is_empty(), "an accepted imatrix has entries");
    for (name, values) in &m.entries {
        assert!(!values.is_empty(), "{name}: no values");
        assert!(
            values.iter().all(|v| v.is_finite() && *v >= 0.0),
            "{name}: {values:?}"
        );
    }

    // One token per column turns the means back into sums that divide to themselves.
    let stats = Stats {
        entries: m
            .entries
            .iter()
            .map(|(name, values)| {
                (
                    name.clone(),
                    Entry {
                        sums: values.clone(),
                        counts: vec![1],
                    },
                )
            })
            .collect(),
        datasets: m.datasets.clone(),
        chunk_count: m.chunk_count,
        chunk_size: m.chunk_size.max(1),
    };
    if let Ok(bytes) = stats.gguf_bytes() {
        let again = Scratch::new("gguf", &bytes);
        let back = Imatrix::load(&again.0).expect("memwall's GGUF imatrix loads");
        assert_eq!(back.entries, m.entries, "GGUF round trip");
        assert_eq!(back.datasets, m.datasets);
        assert_eq!(back.chunk_count, m.chunk_count);
    }
    let again = Scratch::new("dat", &stats.legacy_bytes());
    let back = Imatrix::load(&again.0).expect("memwall's legacy imatrix loads");
    assert_eq!(back.entries, m.entries, "legacy round trip");
});
