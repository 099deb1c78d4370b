//! How much each input column of a block's output projection moves the
//! model's residual stream: the weights a budget fit measures those
//! matrices' errors with.
//!
//! The output projection of a block (`attn_output`, `ffn_down`) adds
//! `ΔW·x_t` of quantization noise straight to the residual stream for token
//! `t`. What the rest of the model sees is that noise *relative to the
//! stream*, because every later block reads the stream through a
//! normalisation: the same noise is large after a layer whose stream is small
//! and negligible on a token carrying one of the huge activations many models
//! keep in a few channels. So the influence of column `j` is
//!
//! `b_j = mean_t x_tj² / ms(r_t)`
//!
//! with `r_t` the stream just after the block added its output and `ms` the
//! mean square over its width; `Σ_ij b_j ΔW_ij²` is the noise the matrix adds
//! to the stream per token as a fraction of the stream's power (columns taken
//! as uncorrelated). llama.cpp's importance matrix is `mean_t x_tj²`: the same
//! statistic without the per-token normalisation, whose scale differs by
//! orders of magnitude between layers and is dominated by the few tokens with
//! huge activations. The matrices inside a block (q, k, v, gate, up) reach the
//! stream through attention or the activation, so their noise is not measured
//! against the stream; the fit takes their error relative to their own
//! output.
//!
//! [`Collector`] gathers `b` through the forward pass's [`Observer`] hook: it
//! keeps the input of the last matrix product until the stream after the
//! block is shown, and adds it up (the output projection's) weighted by
//! `1 / ms(r_t)`. Stacked experts see only their own tokens, which the stream
//! does not identify, so they get no influence.

use std::collections::HashMap;
use std::sync::Mutex;

use memwall_quantize::budget::Influence;
use memwall_runtime::forward::Observer;

/// Collects an [`Influence`] from a running model (see the module docs).
#[derive(Default)]
pub struct Collector {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last matrix product's input since the stream was last shown
    /// (tensor, values, tokens); none when it was a stacked expert's or not
    /// a block's.
    last: Option<(String, Vec<f32>, usize)>,
    /// A buffer for the next input.
    spare: Vec<f32>,
    /// Per tensor, `Σ_t x_tj² / ms(r_t)` and the tokens added.
    sums: HashMap<String, (Vec<f64>, u64)>,
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Self {
        Collector::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The influence of every output projection seen so far: per tensor, the
    /// mean over tokens of each column's `x_tj² / ms(r_t)`.
    pub fn take(&self) -> Influence {
        let mut state = self.lock();
        state.last = None;
        std::mem::take(&mut state.sums)
            .into_iter()
            .map(|(name, (sums, n))| {
                let n = n.max(1) as f64;
                (name, sums.iter().map(|s| (s / n) as f32).collect())
            })
            .collect()
    }
}

impl Observer for Collector {
    fn matmul_input(&self, tensor: &str, expert: Option<usize>, x: &[f32], tokens: usize) {
        let mut state = self.lock();
        let state = &mut *state;
        if let Some((_, values, _)) = state.last.take() {
            state.spare = values;
        }
        // Only the last product before the stream counts: an expert's or the
        // output head's leaves nothing to attribute.
        if expert.is_none() && tokens > 0 && tensor.starts_with("blk.") {
            let mut values = std::mem::take(&mut state.spare);
            values.clear();
            values.extend_from_slice(x);
            state.last = Some((tensor.to_owned(), values, tokens));
        }
    }

    fn residual(&self, layer: usize, x: &[f32], tokens: usize) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some((tensor, values, n)) = state.last.take() else {
            return;
        };
        // The block's output projection when the last product was this
        // layer's, over the same tokens as the stream.
        let prefix = format!("blk.{layer}.");
        if n == tokens
            && x.len() % tokens == 0
            && values.len() % n == 0
            && tensor.starts_with(&prefix)
        {
            let width = x.len() / tokens;
            let cols = values.len() / n;
            let (sums, count) = state
                .sums
                .entry(tensor)
                .or_insert_with(|| (vec![0.0; cols], 0));
            if sums.len() == cols {
                for (row, r) in values.chunks_exact(cols).zip(x.chunks_exact(width)) {
                    // 1 / ms(r_t); a token whose stream is zero carries no noise
                    // the later blocks could see relative to it, and is left out.
                    let ms = r.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / width as f64;
                    if !(ms > 0.0 && ms.is_finite()) {
                        continue;
                    }
                    for (a, &v) in sums.iter_mut().zip(row) {
                        *a += (v as f64) * (v as f64) / ms;
                    }
                }
                *count += n as u64;
            }
        }
        state.spare = values;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_is_weighted_by_the_stream_after_its_block() {
        let c = Collector::new();
        // Two tokens, two columns; the second token's stream is 10× larger.
        c.matmul_input("blk.0.ffn_down.weight", None, &[1.0, 2.0, 1.0, 2.0], 2);
        c.residual(0, &[1.0, 1.0, 10.0, 10.0], 2);
        let b = c.take();
        let down = &b["blk.0.ffn_down.weight"];
        // (1/1 + 1/100) / 2 and (4/1 + 4/100) / 2.
        assert!((down[0] - 0.505).abs() < 1e-6, "{down:?}");
        assert!((down[1] - 2.02).abs() < 1e-6, "{down:?}");
    }

    #[test]
    fn inputs_belong_to_the_next_stream_of_their_own_layer() {
        let c = Collector::new();
        // The output head's input of a window, then layer 0's attention.
        c.matmul_input("output.weight", None, &[5.0], 1);
        c.matmul_input("blk.1.attn_q.weight", None, &[5.0], 1);
        c.residual(0, &[1.0], 1);
        c.matmul_input("blk.0.attn_q.weight", None, &[2.0], 1);
        c.residual(0, &[2.0], 1);
        // Experts are left out, and a router's input before them is not
        // the block's last product.
        c.matmul_input("blk.0.ffn_gate_inp.weight", None, &[2.0], 1);
        c.matmul_input("blk.0.ffn_down_exps.weight", Some(3), &[2.0], 1);
        c.residual(0, &[2.0], 1);
        let b = c.take();
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b["blk.0.attn_q.weight"], vec![1.0]);
    }

    #[test]
    fn only_the_block_output_projection_gets_an_influence() {
        let c = Collector::new();
        for m in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            c.matmul_input(&format!("blk.2.{m}.weight"), None, &[3.0], 1);
        }
        c.residual(2, &[3.0], 1);
        for m in ["ffn_gate", "ffn_up", "ffn_down"] {
            c.matmul_input(&format!("blk.2.{m}.weight"), None, &[6.0], 1);
        }
        c.residual(2, &[3.0], 1);
        let mut b: Vec<_> = c.take().into_iter().collect();
        b.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            b,
            [
                ("blk.2.attn_output.weight".to_owned(), vec![1.0]),
                ("blk.2.ffn_down.weight".to_owned(), vec![4.0]),
            ]
        );
    }
}
