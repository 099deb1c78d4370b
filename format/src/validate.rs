//! Checks of a model file's numbers: every tensor's float values and block
//! scales finite (where ggml's `ggml_validate_row_data` looks). The shape and
//! type of every tensor an architecture needs is checked by
//! [`forward::Model::new`](crate::forward::Model::new).

use crate::blocks::{DEQUANTIZABLE, validate_row};
use crate::gguf::GgufModel;
use crate::progress::{Progress, Unit};

/// One problem in one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The tensor.
    pub tensor: String,
    /// What is wrong.
    pub message: String,
}

/// Scans every tensor for NaN and infinity: all values of F32/F16/BF16
/// tensors, the scales of quantized blocks. Types memwall does not decode are
/// reported as unchecked, not as damaged.
pub fn scan_tensors(gguf: &GgufModel, progress: &dyn Progress) -> (Vec<Finding>, Vec<String>) {
    let total: u64 = gguf.tensors().map(|(_, t)| t.size).sum();
    progress.start("checking tensors", total, Unit::Bytes);
    let mut findings = Vec::new();
    let mut unchecked = Vec::new();
    for (_, info) in gguf.tensors() {
        progress.item(&info.name);
        let Some((_, data)) = gguf.tensor(&info.name) else {
            continue;
        };
        if !DEQUANTIZABLE.contains(&info.ty) {
            unchecked.push(info.name.clone());
        } else if let Err(i) = validate_row(info.ty, data) {
            let what = if info.ty.is_quantized() {
                format!(
                    "block {i} ({} type) has a NaN or infinite scale",
                    info.ty.name()
                )
            } else {
                format!("value {i} is NaN or infinite")
            };
            findings.push(Finding {
                tensor: info.name.clone(),
                message: what,
            });
        }
        progress.advance(info.size);
    }
    progress.finish();
    (findings, unchecked)
}
