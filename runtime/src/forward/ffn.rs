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

    /// The feed-forward part of layer `l`.
    pub(super) fn ffn(
        &self,
        l: usize,
        ffn: &Ffn,
        h: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        match ffn {
            Ffn::Dense { gate, up, down } => self.swiglu(gate, up, down, h, t_n),
            Ffn::Moe {
                router,
                gate,
                up,
                down,
                shared,
            } => {
                let mut out = self.moe(l, router, [gate, up, down], h, t_n)?;
                if let Some(s) = shared {
                    self.add_shared_expert(s, h, t_n, &mut out)?;
                }
                Ok(out)
            }
        }
    }

    /// `out += sigmoid(gate_inp · h) · swiglu(h)`: the shared expert, added
    /// after the routed ones as llama.cpp adds it.
    fn add_shared_expert(
        &self,
        s: &Shared,
        h: &[f32],
        t_n: usize,
        out: &mut [f32],
    ) -> Result<(), ForwardError> {
        let mut g = self.matmul(&s.gate_inp, h, t_n)?;
        self.sigmoid(&mut g);
        let y = self.swiglu(&s.gate, &s.up, &s.down, h, t_n)?;
        let e = self.config.n_embd;
        for ((o, y), g) in out.chunks_exact_mut(e).zip(y.chunks_exact(e)).zip(&g) {
            for (o, y) in o.iter_mut().zip(y) {
                *o += y * g;
            }
        }
        self.spare.give(g);
        self.spare.give(y);
        Ok(())
    }

    /// Mixture of experts: softmax over the router's logits, the top
    /// `n_expert_used` experts per token with their probabilities renormalised
    /// to sum 1, and the weighted sum of those experts' SwiGLU outputs. Each
    /// expert runs once over the tokens routed to it; when the experts stream,
    /// the ones already in the cache run while the others are read, and the
    /// outputs are summed in expert order either way (the same bits).
    pub(super) fn moe(
        &self,
        l: usize,
        router: &Matrix,
        [gate, up, down]: [&Matrix; 3],
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
        let run = |x: usize, parts: [Option<&[u8]>; 3]| {
            let tokens = &routed[x];
            let mut input = Vec::with_capacity(tokens.len() * e);
            for &(t, _) in tokens {
                input.extend_from_slice(&h[t * e..(t + 1) * e]);
            }
            let g = over(gate.expert(x, ff), parts[0]);
            let u = over(up.expert(x, ff), parts[1]);
            let d = over(down.expert(x, e), parts[2]);
            self.swiglu(&g, &u, &d, &input, tokens.len())
        };
        let add = |out: &mut [f32], x: usize, y: &[f32]| {
            for (i, &(t, w)) in routed[x].iter().enumerate() {
                for (o, v) in out[t * e..(t + 1) * e].iter_mut().zip(&y[i * e..]) {
                    *o += w * v;
                }
            }
        };
        let chosen: Vec<usize> = (0..n_exp).filter(|&x| !routed[x].is_empty()).collect();
        let mut out = vec![0f32; t_n * e];
        // Replaced weights (calibration) are not in the file the cache reads.
        let cache = (self.stream.as_ref())
            .and_then(|s| s.experts.as_ref())
            .and_then(|(cache, layers)| Some((cache, *layers.get(&l)?)))
            .filter(|_| self.replaced.is_empty());
        let Some((cache, moe_layer)) = cache else {
            for &x in &chosen {
                let y = run(x, [None; 3])?;
                add(&mut out, x, &y);
            }
            return Ok(out);
        };
        let mut ys: Vec<Option<Vec<f32>>> = vec![None; n_exp];
        let mut request = cache.request(moe_layer, &chosen);
        while let Some((x, held)) = request.next() {
            ys[x] = Some(run(x, [held.part(0), held.part(1), held.part(2)])?);
        }
        for (x, y) in ys.iter().enumerate() {
            if let Some(y) = y {
                add(&mut out, x, y);
            }
        }
        Ok(out)
    }
}

/// `m` over `data` when given (an expert's rows as the cache read them; a
/// part whose read failed leaves the mapping's).
fn over<'m>(m: Matrix<'m>, data: Option<&'m [u8]>) -> Matrix<'m> {
    Matrix {
        data: data.unwrap_or(m.data),
        ..m
    }
}
