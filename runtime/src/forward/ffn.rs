//! The feed-forward part of a block: gated MLPs (SwiGLU, GeGLU), and
//! mixtures of experts that run each expert once over the tokens routed to it.

use super::*;

impl<'a> Model<'a> {
    /// `down · (act(gate · h) ⊙ (up · h))`, the model's activation.
    pub(super) fn glu(
        &self,
        gate: &Matrix,
        up: &Matrix,
        down: &Matrix,
        h: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let g = self.glu_middle(gate, up, h, t_n)?;
        let y = self.matmul(down, &g, t_n);
        self.spare.give(g);
        y
    }

    /// `act(gate · h) ⊙ (up · h)`: the input of a gated MLP's `down`.
    pub(super) fn glu_middle(
        &self,
        gate: &Matrix,
        up: &Matrix,
        h: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let mut shared = None;
        let mut g = self.matmul_sharing(gate, h, t_n, &mut shared)?;
        let u = self.matmul_sharing(up, h, t_n, &mut shared)?;
        self.gate_in_place(&mut g, &u);
        self.spare.give(u);
        Ok(g)
    }

    /// `g ← act(g) ⊙ u`, element by element, so any split over threads
    /// gives the same bits.
    fn gate_in_place(&self, g: &mut [f32], u: &[f32]) {
        const CHUNK: usize = 4096;
        match self.config.act {
            Act::Silu => for_each_chunk(self.pool.as_deref(), g, CHUNK, |c, gs| {
                let mut e: Vec<f32> = gs.iter().map(|g| -g).collect();
                self.kernels.exp_fast_in_place(&mut e);
                for ((g, u), e) in gs.iter_mut().zip(&u[c * CHUNK..]).zip(&e) {
                    *g = *g / (1.0 + e) * u;
                }
            }),
            Act::GeluTanh => {
                let gelu = if self.exact {
                    math::gelu
                } else {
                    math::gelu_f16
                };
                for_each_chunk(self.pool.as_deref(), g, CHUNK, |c, gs| {
                    for (g, u) in gs.iter_mut().zip(&u[c * CHUNK..]) {
                        *g = gelu(*g) * u;
                    }
                });
            }
        }
    }

    /// The feed-forward part of layer `l` over `h` (the FFN norm of the
    /// residual stream `x`, which Gemma 4's router reads).
    pub(super) fn ffn(
        &self,
        l: usize,
        ffn: &Ffn,
        h: &[f32],
        x: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        match ffn {
            Ffn::Dense { gate, up, down } => self.glu(gate, up, down, h, t_n),
            Ffn::Moe {
                router,
                experts,
                shared,
            } => {
                let logits = self.matmul(router, h, t_n)?;
                let mut out = self.moe(l, &logits, experts, h, t_n)?;
                self.spare.give(logits);
                if let Some(s) = shared {
                    self.add_shared_expert(s, h, t_n, &mut out)?;
                }
                Ok(out)
            }
            Ffn::DenseAndMoe(m) => self.dense_and_moe(l, m, h, x, t_n),
        }
    }

    /// Gemma 4's two branches: `post_1(mlp(h)) + post_2(Σ experts)`, the
    /// router reading `rms(x)/√n_embd ⊙ router_scale` and the experts
    /// `pre_2(x)`.
    fn dense_and_moe(
        &self,
        l: usize,
        m: &DenseAndMoe,
        h: &[f32],
        x: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let e = c.n_embd;
        let mut dense = self.glu(&m.gate, &m.up, &m.down, h, t_n)?;
        let mut scratch = self.spare.take_dirty(t_n * e);
        self.norm_in_place(&mut dense, &m.post_norm_1, &mut scratch);
        // The router's input, in ggml's order: the plain RMSNorm, times
        // 1/√n_embd, times the scale.
        let inv = 1.0 / (e as f32).sqrt();
        for (xr, sr) in x.chunks_exact(e).zip(scratch.chunks_exact_mut(e)) {
            rms_norm_plain(xr, e, c.eps, sr);
            for (v, s) in sr.iter_mut().zip(&m.router_scale) {
                *v = *v * inv * s;
            }
        }
        let logits = self.matmul(&m.router, &scratch, t_n)?;
        self.norm(x, &m.pre_norm_2, &mut scratch);
        let mut moe = self.moe(l, &logits, &m.experts, &scratch, t_n)?;
        self.spare.give(logits);
        self.norm_in_place(&mut moe, &m.post_norm_2, &mut scratch);
        self.spare.give(scratch);
        self.add(&mut dense, &moe);
        Ok(dense)
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
        let y = self.glu(&s.gate, &s.up, &s.down, h, t_n)?;
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

    /// Mixture of experts over the router's `logits`: softmax, the top
    /// `n_expert_used` experts per token with their probabilities renormalised
    /// to sum 1, and the weighted sum of those experts' gated-MLP outputs
    /// (each times its expert's scale, when the model has them). Each expert
    /// runs once over the tokens routed to it; when the experts stream, the
    /// ones already in the cache run while the others are read, and the
    /// outputs are summed in expert order either way (the same bits).
    pub(super) fn moe(
        &self,
        l: usize,
        logits: &[f32],
        experts: &Experts,
        h: &[f32],
        t_n: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let (e, n_exp) = (c.n_embd, c.n_expert);
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
            // llama.cpp keeps the sum off zero (6.1e-5, the smallest normal f16).
            let sum: f32 = chosen.iter().map(|&i| probs[i] / total).sum();
            let sum = sum.max(6.103_515_6e-5);
            for &i in chosen {
                let mut w = probs[i] / total / sum;
                if c.expert_weights_scale != 0.0 && c.expert_weights_scale != 1.0 {
                    w *= c.expert_weights_scale;
                }
                routed[i].push((t, w));
            }
        }
        let ff = experts.ff;
        let run = |x: usize, parts: &[Option<&[u8]>]| {
            let tokens = &routed[x];
            let mut input = Vec::with_capacity(tokens.len() * e);
            for &(t, _) in tokens {
                input.extend_from_slice(&h[t * e..(t + 1) * e]);
            }
            let ms = experts.expert(x);
            let part = |i: usize| over(ms[i], parts.get(i).copied().flatten());
            let n = tokens.len();
            if experts.up.is_some() {
                return self.glu(&part(0), &part(1), &part(2), &input, n);
            }
            // Gate and up rows in one tensor: one product, then split.
            let gu = self.matmul(&part(0), &input, n)?;
            let mut g = self.spare.take_dirty(n * ff);
            let mut u = self.spare.take_dirty(n * ff);
            for ((row, g), u) in gu
                .chunks_exact(2 * ff)
                .zip(g.chunks_exact_mut(ff))
                .zip(u.chunks_exact_mut(ff))
            {
                g.copy_from_slice(&row[..ff]);
                u.copy_from_slice(&row[ff..]);
            }
            self.spare.give(gu);
            self.gate_in_place(&mut g, &u);
            let y = self.matmul(&part(1), &g, n);
            self.spare.give(g);
            self.spare.give(u);
            y
        };
        let add = |out: &mut [f32], x: usize, y: &[f32]| {
            let s = experts.scale.as_ref().map(|s| s[x]);
            for (i, &(t, w)) in routed[x].iter().enumerate() {
                let (o, y) = (&mut out[t * e..(t + 1) * e], &y[i * e..(i + 1) * e]);
                match s {
                    // As llama.cpp: the expert's output times its scale, then the weight.
                    Some(s) => o.iter_mut().zip(y).for_each(|(o, v)| *o += w * (v * s)),
                    None => o.iter_mut().zip(y).for_each(|(o, v)| *o += w * v),
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
                let y = run(x, &[])?;
                add(&mut out, x, &y);
            }
            return Ok(out);
        };
        let mut ys: Vec<Option<Vec<f32>>> = vec![None; n_exp];
        let mut request = cache.request(moe_layer, &chosen);
        while let Some((x, held)) = request.next() {
            ys[x] = Some(run(x, &[held.part(0), held.part(1), held.part(2)])?);
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
