//! The feed-forward part of a block: SwiGLU, and mixtures of experts that run
//! each expert once over the tokens routed to it.

use super::*;

impl<'a> Model<'a> {
    /// `down · (silu(gate · h) ⊙ (up · h))`.
    pub(super) fn swiglu(
        &self,
        gate: &Matrix,
        up: &Matrix,
        down: &Matrix,
        h: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut shared = None;
        let mut g = self.matmul_sharing(gate, h, t_n, &mut shared)?;
        let u = self.matmul_sharing(up, h, t_n, &mut shared)?;
        // Element by element, so any split over threads gives the same bits.
        const CHUNK: usize = 4096;
        for_each_chunk(self.pool.as_deref(), &mut g, CHUNK, |c, gs| {
            let mut e: Vec<f32> = gs.iter().map(|g| -g).collect();
            self.kernels.exp_fast_in_place(&mut e);
            for ((g, u), e) in gs.iter_mut().zip(&u[c * CHUNK..]).zip(&e) {
                *g = *g / (1.0 + e) * u;
            }
        });
        let y = self.matmul(down, &g, t_n);
        self.spare.give(g);
        self.spare.give(u);
        y
    }

    pub(super) fn ffn(&self, ffn: &Ffn, h: &[f32], t_n: usize) -> Result<Vec<f32>, ForwardError> {
        match ffn {
            Ffn::Dense { gate, up, down } => self.swiglu(gate, up, down, h, t_n),
            Ffn::Moe {
                router,
                gate,
                up,
                down,
            } => self.moe(router, gate, up, down, h, t_n),
        }
    }

    /// Mixture of experts: softmax over the router's logits, the top
    /// `n_expert_used` experts per token with their probabilities renormalised
    /// to sum 1, and the weighted sum of those experts' SwiGLU outputs.
    pub(super) fn moe(
        &self,
        router: &Matrix,
        gate: &Matrix,
        up: &Matrix,
        down: &Matrix,
        h: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let (e, n_exp) = (c.n_embd, c.n_expert);
        let ff = gate.rows / n_exp;
        let logits = self.matmul(router, h, t_n)?;
        // Per expert: the tokens routed to it, with their weights.
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_exp];
        for t in 0..t_n {
            let row = &logits[t * n_exp..(t + 1) * n_exp];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let probs: Vec<f32> = row.iter().map(|v| math::exp(v - max)).collect();
            let total: f32 = probs.iter().sum();
            let mut order: Vec<usize> = (0..n_exp).collect();
            order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let chosen = &order[..c.n_expert_used];
            let sum: f32 = chosen.iter().map(|&i| probs[i] / total).sum();
            for &i in chosen {
                let mut w = probs[i] / total / sum;
                if c.expert_weights_scale != 0.0 && c.expert_weights_scale != 1.0 {
                    w *= c.expert_weights_scale;
                }
                routed[i].push((t, w));
            }
        }
        let mut out = vec![0f32; t_n * e];
        for (x, tokens) in routed.iter().enumerate() {
            if tokens.is_empty() {
                continue;
            }
            let mut input = Vec::with_capacity(tokens.len() * e);
            for &(t, _) in tokens {
                input.extend_from_slice(&h[t * e..(t + 1) * e]);
            }
            let y = self.swiglu(
                &gate.expert(x, ff),
                &up.expert(x, ff),
                &down.expert(x, e),
                &input,
                tokens.len(),
            )?;
            for (i, &(t, w)) in tokens.iter().enumerate() {
                for (o, v) in out[t * e..(t + 1) * e].iter_mut().zip(&y[i * e..]) {
                    *o += w * v;
                }
            }
        }
        Ok(out)
    }
}
