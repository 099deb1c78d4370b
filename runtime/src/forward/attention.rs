//! Attention: causal grouped-query attention over the KV cache, one query at
//! a time or a batch at once with the same bits.

use super::session::{Kv, by_head, by_head_transposed};
use super::*;

/// `s ← exp_fast(s − max s)` for every score; returns their sequential sum.
pub(super) fn softmax_numerators(kernels: &Kernels, scores: &mut [f32]) -> f32 {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for s in scores.iter_mut() {
        *s -= max;
    }
    kernels.exp_fast_in_place(scores);
    let mut sum = 0f32;
    for s in scores.iter() {
        sum += *s;
    }
    sum
}

impl<'a> Model<'a> {
    /// Per-head norm of `t_n` rows of `heads` heads.
    pub(super) fn head_norm(&self, x: &mut [f32], weight: &[f32], heads: usize) {
        let c = &self.config;
        let hd = c.head_dim;
        let mut tmp = vec![0f32; hd];
        for (i, head) in x.chunks_exact_mut(hd).enumerate() {
            let h = i % heads;
            let w = if weight.len() == hd {
                weight
            } else {
                &weight[h * hd..(h + 1) * hd]
            };
            if c.arch.layer_norm() {
                layer_norm(head, w, None, c.eps, &mut tmp);
            } else {
                rms_norm(head, w, c.eps, &mut tmp);
            }
            head.copy_from_slice(&tmp);
        }
    }

    /// Q/K/V projections, RoPE, the cache update, attention, the output gate
    /// (Qwen3.5) and the output projection.
    pub(super) fn attention_block(
        &self,
        layer: &Attention,
        h: &[f32],
        tables: &[Vec<(f32, f32)>],
        session: &mut Session,
        l: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let t_n = tables.len();
        let (qd, kvd, hd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.head_dim);
        let mut shared = None;
        let mut q = self.matmul_sharing(&layer.wq, h, t_n, &mut shared)?;
        // Each head's queries are followed by its gate: split them apart.
        let gate = layer.gated.then(|| {
            let mut gate = self.spare.take_dirty(t_n * qd);
            let mut queries = self.spare.take_dirty(t_n * qd);
            for ((pair, qh), gh) in q
                .chunks_exact(2 * hd)
                .zip(queries.chunks_exact_mut(hd))
                .zip(gate.chunks_exact_mut(hd))
            {
                qh.copy_from_slice(&pair[..hd]);
                gh.copy_from_slice(&pair[hd..]);
            }
            self.spare.give(std::mem::replace(&mut q, queries));
            gate
        });
        let mut k = self.matmul_sharing(&layer.wk, h, t_n, &mut shared)?;
        let mut v = self.matmul_sharing(&layer.wv, h, t_n, &mut shared)?;
        add_bias(&mut q, layer.bq.as_deref());
        add_bias(&mut k, layer.bk.as_deref());
        add_bias(&mut v, layer.bv.as_deref());
        if let Some(w) = &layer.q_norm {
            self.head_norm(&mut q, w, c.n_head);
        }
        if let Some(w) = &layer.k_norm {
            self.head_norm(&mut k, w, c.n_head_kv);
        }
        for (t, table) in tables.iter().enumerate() {
            for head in q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                c.rope.apply(head, table);
            }
            for head in k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                c.rope.apply(head, table);
            }
        }
        session.k[l].extend(&self.kernels, &k);
        session.v[l].extend(&self.kernels, &v);
        let mut attn = self.attention(&q, &session.k[l], &session.v[l], session.n_past, t_n);
        for b in [q, k, v] {
            self.spare.give(b);
        }
        if let Some(mut gate) = gate {
            self.sigmoid(&mut gate);
            for (a, g) in attn.iter_mut().zip(&gate) {
                *a *= g;
            }
            self.spare.give(gate);
        }
        let mut o = self.matmul(&layer.wo, &attn, t_n)?;
        self.spare.give(attn);
        add_bias(&mut o, layer.bo.as_deref());
        Ok(o)
    }

    /// Causal grouped-query attention of the `t_n` new queries over the cache.
    pub(super) fn attention(
        &self,
        q: &[f32],
        k: &Cache,
        v: &Cache,
        n_past: usize,
        t_n: usize,
    ) -> Vec<f32> {
        let c = &self.config;
        let (qd, kvd, hd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.head_dim);
        // An f16 cache: the queries rounded to f16 as well, as ggml converts
        // them for its f16 products (once here, not per work item).
        let rounded = (c.kv_type == KvType::F16).then(|| {
            const VALUES: usize = 4096;
            let mut r = self.spare.take_dirty(q.len());
            for_each_chunk(self.pool.as_deref(), &mut r, VALUES, |i, r| {
                let mut halves = [0u16; VALUES];
                let halves = &mut halves[..r.len()];
                self.kernels.narrow_f16(&q[i * VALUES..][..r.len()], halves);
                self.kernels.widen_f16(halves, r);
            });
            r
        });
        let q = rounded.as_deref().unwrap_or(q);
        // Every value is written by one work item below.
        let mut out = self.spare.take_dirty(t_n * qd);
        // For a batch, decode the cache to f32 once, by KV head, instead of
        // once per query (same values, so the same result).
        let n_kv = n_past + t_n;
        let dense = (t_n > 1).then(|| {
            (
                by_head_transposed(
                    &self.kernels,
                    k,
                    n_kv,
                    c,
                    self.spare.take(kvd * n_kv.next_multiple_of(KEY_TILE)),
                ),
                by_head(&self.kernels, v, n_kv, c, self.spare.take_dirty(kvd * n_kv)),
            )
        });
        let view = match &dense {
            Some(((kt, stride), v)) => Kv::Dense {
                kt,
                stride: *stride,
                v,
            },
            None => Kv::Cache(k, v),
        };
        // One work item per (token, head), or for a batch per (token, KV
        // head) with the query heads that share it: each writes its own slice
        // of `out` with the same arithmetic on any thread, so the result does
        // not depend on threads. Each sums into its own small buffer first
        // (when `out` was fresh zero pages, reading before writing faulted
        // them in twice, the second time with a TLB flush on every core).
        let group = c.n_head / c.n_head_kv;
        let heads = if dense.is_some() { group } else { 1 };
        let per = c.n_head / heads;
        let work = |i: usize, oh: &mut [f32]| {
            let (t, first) = (i / per, i % per * heads);
            let mut acc = vec![0f32; heads * hd];
            self.attend(
                &q[t * qd + first * hd..][..heads * hd],
                first,
                &view,
                n_past + t + 1,
                &mut acc,
            );
            oh.copy_from_slice(&acc);
        };
        for_each_chunk(self.pool.as_deref(), &mut out, heads * hd, work);
        if let Some(((kt, _), v)) = dense {
            self.spare.give(kt);
            self.spare.give(v);
        }
        if let Some(r) = rounded {
            self.spare.give(r);
        }
        out
    }

    /// The query heads `first..` (`q.len() / head_dim` of them, all reading
    /// one KV head) over the first `n_kv` cached positions, into `out` (`q`
    /// already rounded to f16 for an f16 cache).
    ///
    /// Each score is the sequential sum `((q0·k0 + q1·k1) + q2·k2) + …` (from
    /// `-0.0`, as `Iterator::sum`), and the output the sequential sum over
    /// positions of `(s_j / Σs) · v_j`, whichever layout the cache is read from
    /// and however many heads are taken together, so a batch and
    /// token-by-token decoding give the same bits.
    pub(super) fn attend(&self, q: &[f32], first: usize, kv: &Kv, n_kv: usize, out: &mut [f32]) {
        let c = &self.config;
        let (kvd, hd) = (c.n_head_kv * c.head_dim, c.head_dim);
        let kv_head = first / (c.n_head / c.n_head_kv);
        let scale = 1.0 / (hd as f32).sqrt();
        let kernels = &self.kernels;
        match kv {
            Kv::Cache(k, v) => {
                let mut buf = vec![0f32; hd];
                let mut scores = Vec::with_capacity(n_kv);
                for (qh, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
                    scores.clear();
                    for j in 0..n_kv {
                        k.read(kernels, j * kvd + kv_head * hd, &mut buf);
                        let dot: f32 = qh.iter().zip(&buf).map(|(a, b)| a * b).sum();
                        scores.push(dot * scale);
                    }
                    let sum = softmax_numerators(kernels, &mut scores);
                    for (j, s) in scores.iter().enumerate() {
                        v.read(kernels, j * kvd + kv_head * hd, &mut buf);
                        kernels.axpy(out, s / sum, &buf);
                    }
                }
            }
            Kv::Dense { kt, stride, v } => {
                let kt = &kt[kv_head * hd * stride..][..hd * stride];
                let v = &v[kv_head * v.len() / c.n_head_kv..];
                let mut tiles = [[0f32; KEY_TILE]; attn::HEADS];
                let mut scores = Vec::new();
                for (qh, out) in q
                    .chunks(attn::HEADS * hd)
                    .zip(out.chunks_mut(attn::HEADS * hd))
                {
                    let heads = qh.len() / hd;
                    scores.clear();
                    scores.resize(heads * n_kv, 0.0);
                    for j0 in (0..n_kv).step_by(KEY_TILE) {
                        kernels.key_tiles(qh, hd, &kt[j0..], *stride, &mut tiles[..heads]);
                        let m = KEY_TILE.min(n_kv - j0);
                        for (row, tile) in scores.chunks_exact_mut(n_kv).zip(&tiles) {
                            for (s, &dot) in row[j0..j0 + m].iter_mut().zip(tile) {
                                *s = dot * scale;
                            }
                        }
                    }
                    let mut sums = [0f32; attn::HEADS];
                    for (sum, row) in sums.iter_mut().zip(scores.chunks_exact_mut(n_kv)) {
                        *sum = softmax_numerators(kernels, row);
                    }
                    kernels.weighted_rows(out, &mut scores, &sums[..heads], v);
                }
            }
        }
    }
}
