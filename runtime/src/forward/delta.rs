//! Gated delta-net layers, Qwen3.5's linear attention, as llama.cpp runs them
//! (`src/models/qwen35.cpp`, `delta-net-base.cpp`): the projected queries,
//! keys and values go through a short causal convolution and SiLU; queries and
//! keys are L2-normalised per head; then each value head keeps a
//! `head_k_dim × head_v_dim` state `S` that, token by token, decays
//! (`S ← S·exp(g)`), moves towards the new value along the key (the delta
//! rule: `S ← S + k ⊗ β(v − Sᵀk)`) and is read by the query (`o = Sᵀq`). The
//! output is RMS-normalised per head, gated by `silu(z)` and projected back.
//!
//! The state replaces the KV cache: its size does not grow with the context.
//! A batch runs the tokens one after another through the same operations as
//! token-by-token decoding, so both give the same bits.

use super::*;

impl<'a> Model<'a> {
    /// The gated delta-net part of a block over `t_n` normed rows `h`,
    /// continuing from `state` (the convolution's last inputs, then every
    /// value head's matrix) and leaving it after the last token.
    pub(super) fn delta_net_block(
        &self,
        d: &DeltaNet,
        h: &[f32],
        t_n: usize,
        state: &mut [f32],
    ) -> Result<Vec<f32>, ForwardError> {
        let lin = d.lin;
        let mut shared = None;
        let mut x = self.matmul_sharing(&d.qkv, h, t_n, &mut shared)?;
        let mut z = self.matmul_sharing(&d.z, h, t_n, &mut shared)?;
        let beta = self.matmul_sharing(&d.beta, h, t_n, &mut shared)?;
        let alpha = self.matmul_sharing(&d.alpha, h, t_n, &mut shared)?;
        let (window, heads) = state.split_at_mut((lin.conv_kernel - 1) * lin.conv_dim());
        convolve(&d.conv, lin, window, &mut x);
        self.silu(&mut x);
        let gates = Gates::new(d, &alpha, &beta);
        // Per value head, tokens in order: `[head][token][dim]`.
        let (hk, hv) = (lin.head_k_dim, lin.head_v_dim);
        let mut by_head = self.spare.take_dirty(lin.n_v_heads * t_n * hv);
        let mut work: Vec<(&mut [f32], &mut [f32])> = heads
            .chunks_exact_mut(hk * hv)
            .zip(by_head.chunks_exact_mut(t_n * hv))
            .collect();
        let threads = self.pool.as_ref().map_or(1, |p| p.threads());
        let per_task = lin.n_v_heads.div_ceil(threads);
        let eps = self.config.eps;
        for_each_chunk(self.pool.as_deref(), &mut work, per_task, |i, part| {
            let mut scratch = HeadScratch::new(lin);
            for (n, (s, out)) in part.iter_mut().enumerate() {
                let j = i * per_task + n;
                for t in 0..t_n {
                    let row = &x[t * lin.conv_dim()..(t + 1) * lin.conv_dim()];
                    let (decay, b) = gates.at(t, j);
                    let o = &mut out[t * hv..(t + 1) * hv];
                    scratch.step(lin, row, j, s, decay, b, eps, o);
                }
            }
        });
        drop(work);
        // Back to `[token][head][dim]`, normed per head and gated by silu(z).
        self.silu(&mut z);
        let mut y = self.spare.take_dirty(t_n * lin.value_dim());
        for (t, (yt, zt)) in y
            .chunks_exact_mut(lin.value_dim())
            .zip(z.chunks_exact(lin.value_dim()))
            .enumerate()
        {
            for (j, (yh, zh)) in yt.chunks_exact_mut(hv).zip(zt.chunks_exact(hv)).enumerate() {
                let o = &by_head[(j * t_n + t) * hv..][..hv];
                rms_norm(o, &d.norm, eps, yh);
                for (v, g) in yh.iter_mut().zip(zh) {
                    *v *= g;
                }
            }
        }
        for b in [x, z, beta, alpha, by_head] {
            self.spare.give(b);
        }
        let out = self.matmul(&d.out, &y, t_n);
        self.spare.give(y);
        out
    }

    /// `x ← x · sigmoid(x)`, element by element over the pool.
    pub(super) fn silu(&self, x: &mut [f32]) {
        self.logistic(x, true);
    }

    /// `x ← sigmoid(x)`, element by element over the pool.
    pub(super) fn sigmoid(&self, x: &mut [f32]) {
        self.logistic(x, false);
    }

    fn logistic(&self, x: &mut [f32], times_x: bool) {
        const CHUNK: usize = 4096;
        for_each_chunk(self.pool.as_deref(), x, CHUNK, |_, xs| {
            let mut e: Vec<f32> = xs.iter().map(|v| -v).collect();
            self.kernels.exp_fast_in_place(&mut e);
            for (v, e) in xs.iter_mut().zip(&e) {
                *v = if times_x {
                    *v / (1.0 + e)
                } else {
                    1.0 / (1.0 + e)
                };
            }
        });
    }
}

/// The causal convolution of every channel over `window` (the previous
/// `conv_kernel - 1` inputs, oldest first) and the `t_n` rows of `x`, in
/// place; `window` then holds the last inputs. Each output is the sum of its
/// taps from the oldest, as ggml's `ssm_conv` adds them.
fn convolve(taps: &[f32], lin: Linear, window: &mut [f32], x: &mut [f32]) {
    let (k, c) = (lin.conv_kernel, lin.conv_dim());
    let t_n = x.len() / c;
    // Inputs in order: the window, then the new rows.
    let mut inputs = Vec::with_capacity((k - 1 + t_n) * c);
    inputs.extend_from_slice(window);
    inputs.extend_from_slice(x);
    for (t, row) in x.chunks_exact_mut(c).enumerate() {
        for (ch, out) in row.iter_mut().enumerate() {
            let w = &taps[ch * k..(ch + 1) * k];
            let mut sum = 0f32;
            for (i, &wi) in w.iter().enumerate() {
                sum += inputs[(t + i) * c + ch] * wi;
            }
            *out = sum;
        }
    }
    window.copy_from_slice(&inputs[t_n * c..]);
}

/// Per token and value head: the decay `exp(softplus(alpha + dt_bias) · a)`
/// and the write strength `sigmoid(beta)`.
struct Gates {
    decay: Vec<f32>,
    beta: Vec<f32>,
    heads: usize,
}

impl Gates {
    fn new(d: &DeltaNet, alpha: &[f32], beta: &[f32]) -> Gates {
        let heads = d.lin.n_v_heads;
        let decay = alpha
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let j = i % heads;
                (softplus(a + d.dt_bias[j]) * d.a[j]).exp()
            })
            .collect();
        let beta = beta.iter().map(|&b| 1.0 / (1.0 + (-b).exp())).collect();
        Gates { decay, beta, heads }
    }

    fn at(&self, t: usize, j: usize) -> (f32, f32) {
        let i = t * self.heads + j;
        (self.decay[i], self.beta[i])
    }
}

/// `ln(1 + eˣ)`, linear above 20 as ggml's softplus.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// One task's buffers for the recurrence of one head at a time.
struct HeadScratch {
    q: Vec<f32>,
    k: Vec<f32>,
    delta: Vec<f32>,
}

impl HeadScratch {
    fn new(lin: Linear) -> HeadScratch {
        HeadScratch {
            q: vec![0.0; lin.head_k_dim],
            k: vec![0.0; lin.head_k_dim],
            delta: vec![0.0; lin.head_v_dim],
        }
    }

    /// One token through value head `j`'s state `s` (`head_k_dim` rows of
    /// `head_v_dim`): `row` is the token's convolved queries, keys and
    /// values; the head's output goes to `o`.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        lin: Linear,
        row: &[f32],
        j: usize,
        s: &mut [f32],
        decay: f32,
        beta: f32,
        eps: f32,
        o: &mut [f32],
    ) {
        let (hk, hv) = (lin.head_k_dim, lin.head_v_dim);
        // Value head j reads key head j % n_k_heads (the file's tiled order).
        let kh = j % lin.n_k_heads;
        let q = &row[kh * hk..(kh + 1) * hk];
        let k = &row[lin.key_dim() + kh * hk..][..hk];
        let v = &row[2 * lin.key_dim() + j * hv..][..hv];
        // Queries are also scaled by 1/√head_k_dim.
        l2_norm(q, eps, 1.0 / (hk as f32).sqrt(), &mut self.q);
        l2_norm(k, eps, 1.0, &mut self.k);
        // Decay, and what the state recalls for this key: Σ_k S[k]·k.
        let recall = &mut self.delta;
        recall.fill(0.0);
        for (sk, &kk) in s.chunks_exact_mut(hv).zip(&self.k) {
            for (r, sv) in recall.iter_mut().zip(sk.iter_mut()) {
                *sv *= decay;
                *r += *sv * kk;
            }
        }
        // δ = β(v − recall); S += k ⊗ δ; o = Σ_k S[k]·q.
        for (dv, &vv) in recall.iter_mut().zip(v) {
            *dv = (vv - *dv) * beta;
        }
        o.fill(0.0);
        for ((sk, &kk), &qk) in s.chunks_exact_mut(hv).zip(&self.k).zip(&self.q) {
            for ((sv, &dv), ov) in sk.iter_mut().zip(recall.iter()).zip(o.iter_mut()) {
                *sv += kk * dv;
                *ov += *sv * qk;
            }
        }
    }
}

/// `x / √(Σx² + eps) · scale` (llama.cpp: an RMSNorm with `eps / n`, times
/// `1/√n`; the sum in `f64`).
fn l2_norm(x: &[f32], eps: f32, scale: f32, out: &mut [f32]) {
    let n = x.len() as f32;
    let sum: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let r = 1.0 / ((sum / x.len() as f64) as f32 + eps / n).sqrt() / n.sqrt() * scale;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * r;
    }
}
