//! The weightings ggml's importance-matrix quantizers share. Sums run
//! sequentially in `f32`, as ggml's loops do, so results stay bit-exact.

/// `Σ v²`, accumulated in order.
pub(crate) fn sum_squares(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |s, &v| s + v * v)
}

/// `Σ v`, accumulated in order.
pub(crate) fn sum(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |s, &v| s + v)
}

/// Per-weight importance `qw · √(σ² + x²)`.
pub(crate) fn importance(x: &[f32], qw: &[f32], sigma2: f32) -> Vec<f32> {
    x.iter()
        .zip(qw)
        .map(|(&v, &q)| q * (sigma2 + v * v).sqrt())
        .collect()
}
