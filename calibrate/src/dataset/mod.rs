//! Calibration sets (being written: see the `dataset` task).

/// A calibration set as `memwall calibrate dataset` writes it.
#[derive(Clone, Debug, Default)]
pub struct Dataset {
    /// Token ids of each sample, BOS first when the vocabulary adds one.
    pub samples: Vec<Vec<u32>>,
    /// Tokens per sample the set was built for.
    pub seq_len: usize,
    /// SHA-256 of the file, hex.
    pub sha256: String,
}
