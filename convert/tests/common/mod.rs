//! Helpers shared by the converter's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use memwall_format::GgmlType;
use sha2::{Digest, Sha256};

/// The repository's `fixtures/` folder.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// SHA-256 as lowercase hex.
pub fn sha(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

/// The quantizer's row encoder, as the CLI passes it (Q8_0 output).
pub fn quantize(
    ty: GgmlType,
    x: &[f32],
    y: &mut [u8],
) -> Result<(), memwall_convert::tensors::RowEncodeError> {
    Ok(memwall_quantize::quantize_row(ty, x, y)?)
}
