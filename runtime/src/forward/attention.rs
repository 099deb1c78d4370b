//! Attention: causal grouped-query attention over the KV cache, one query at
//! a time or a batch at once with the same bits.

use super::session::{by_head, by_head_transposed, key_stride};
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
    /// Per-head norm of rows of `heads` heads of `hd` values each: times
    /// `weight` (one `hd` vector shared by all heads, or one per head), or
    /// none (Gemma 4's values).
    pub(super) fn head_norm(&self, x: &mut [f32], weight: Option<&[f32]>, hd: usize, heads: usize) {
        let c = &self.config;
        let mut tmp = vec![0f32; hd];
        for (i, head) in x.chunks_exact_mut(hd).enumerate() {
            let h = i % heads;
            let w = weight.map(|w| {
                if w.len() == hd {
                    w
                } else {
                    &w[h * hd..(h + 1) * hd]
                }
            });
            match w {
                Some(w) if c.arch.layer_norm() => layer_norm(head, w, None, c.eps, &mut tmp),
                Some(w) => rms_norm(head, w, c.eps, &mut tmp),
                None => rms_norm_plain(head, hd, c.eps, &mut tmp),
            }
            head.copy_from_slice(&tmp);
        }
    }

    /// Q/K/V projections, RoPE, the cache update, attention, the output gate
    /// (Qwen3.5) and the output projection; the heads' outputs (the output
    /// projection's input) taken from or given to `kept`.
    pub(super) fn attention_block(
        &self,
        layer: &Attention,
        h: &[f32],
        tables: &Tables,
        session: &mut Session,
        l: usize,
        kept: Option<&mut Keeping>,
    ) -> Result<Vec<f32>, ForwardError> {
        let attn = match kept.as_deref().and_then(Keeping::heads) {
            Some(heads) => self.spare_copy(heads),
            None => {
                let attn = self.attention_heads(layer, h, tables, session, l)?;
                if let Some(k) = kept {
                    k.keep_heads(&attn);
                }
                attn
            }
        };
        let mut o = self.matmul(&layer.wo, &attn, tables.len())?;
        self.spare.give(attn);
        add_bias(&mut o, layer.bo.as_deref());
        Ok(o)
    }

    /// [`Model::attention_block`] up to the output projection's input.
    fn attention_heads(
        &self,
        layer: &Attention,
        h: &[f32],
        tables: &Tables,
        session: &mut Session,
        l: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let c = &self.config;
        let t_n = tables.len();
        let heads = layer.heads;
        let (qd, kvd, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
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
        // Without a value projection (Gemma 4's global layers) the values
        // are the keys as projected, before their norm and rotation.
        let mut v = match &layer.wv {
            Some(wv) => self.matmul_sharing(wv, h, t_n, &mut shared)?,
            None => {
                let mut v = self.spare.take_dirty(k.len());
                v.copy_from_slice(&k);
                v
            }
        };
        add_bias(&mut q, layer.bq.as_deref());
        add_bias(&mut k, layer.bk.as_deref());
        add_bias(&mut v, layer.bv.as_deref());
        if let Some(w) = &layer.q_norm {
            self.head_norm(&mut q, Some(w), hd, heads.n_head);
        }
        if let Some(w) = &layer.k_norm {
            self.head_norm(&mut k, Some(w), hd, heads.n_head_kv);
        }
        if layer.v_norm {
            self.head_norm(&mut v, None, hd, heads.n_head_kv);
        }
        let (rope, tables) = match (&c.swa, layer.swa) {
            (Some(swa), true) => (&swa.rope, &tables.swa),
            _ => (&c.rope, &tables.full),
        };
        for (t, table) in tables.iter().enumerate() {
            for head in q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                rope.apply(head, table);
            }
            for head in k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                rope.apply(head, table);
            }
        }
        session.k[l].extend(&self.kernels, session.n_past, &k);
        session.v[l].extend(&self.kernels, session.n_past, &v);
        let window = c.swa.as_ref().filter(|_| layer.swa).map(|s| s.window);
        let span = Span {
            heads,
            window,
            n_past: session.n_past,
        };
        let mut attn = self.attention(&q, &session.k[l], &session.v[l], span, t_n);
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
        Ok(attn)
    }

    /// Causal grouped-query attention of the `t_n` new queries over the cache.
    pub(super) fn attention(
        &self,
        q: &[f32],
        k: &Cache,
        v: &Cache,
        span: Span,
        t_n: usize,
    ) -> Vec<f32> {
        let c = &self.config;
        let heads = span.heads;
        let (qd, kvd, hd) = (heads.q_dim(), heads.kv_dim(), heads.head_dim);
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
        // once per query (same values, so the same result): the positions
        // the first query sees and every later one.
        let n_kv = span.n_past + t_n;
        let first = span
            .window
            .map_or(0, |w| (span.n_past + 1).saturating_sub(w));
        let n = n_kv - first;
        let dense = (t_n > 1).then(|| {
            (
                by_head_transposed(
                    &self.kernels,
                    k,
                    (first, n),
                    heads,
                    self.spare.take(kvd * key_stride(n)),
                ),
                by_head(
                    &self.kernels,
                    v,
                    (first, n),
                    heads,
                    self.spare.take_dirty(kvd * n),
                ),
            )
        });
        let group = heads.group();
        match &dense {
            // A batch: a work item per block of tokens, all heads (each writes
            // its own rows of `out`; the same arithmetic on any thread).
            Some(((kt, stride), v)) => {
                let kv = DenseKv {
                    kt,
                    stride: *stride,
                    v,
                    from: first,
                };
                let work = |i: usize, ob: &mut [f32]| {
                    ob.fill(0.0);
                    let q = &q[i * QUERY_BLOCK * qd..][..ob.len()];
                    for h0 in (0..heads.n_head).step_by(group) {
                        for first in (h0..h0 + group).step_by(attn::HEADS) {
                            let n = (h0 + group - first).min(attn::HEADS);
                            self.attend_block(q, (first, n), &kv, span, i * QUERY_BLOCK, ob);
                        }
                    }
                };
                for_each_chunk(self.pool.as_deref(), &mut out, QUERY_BLOCK * qd, work);
            }
            // One token: a work item per head. Each sums into its own small
            // buffer first (when `out` was fresh zero pages, reading before
            // writing faulted them in twice, the second time with a TLB
            // flush on every core).
            None => {
                let work = |i: usize, oh: &mut [f32]| {
                    let (t, head) = (i / heads.n_head, i % heads.n_head);
                    let mut acc = vec![0f32; hd];
                    self.attend(
                        &q[t * qd + head * hd..][..hd],
                        head,
                        (k, v),
                        span,
                        span.n_past + t + 1,
                        &mut acc,
                    );
                    oh.copy_from_slice(&acc);
                };
                for_each_chunk(self.pool.as_deref(), &mut out, hd, work);
            }
        }
        if let Some(((kt, _), v)) = dense {
            self.spare.give(kt);
            self.spare.give(v);
        }
        if let Some(r) = rounded {
            self.spare.give(r);
        }
        out
    }

    /// What each score is multiplied by: the model's own scale, or
    /// `1/√head_dim`.
    fn score_scale(&self, hd: usize) -> f32 {
        self.config
            .attn_scale
            .unwrap_or_else(|| 1.0 / (hd as f32).sqrt())
    }

    /// The query head `head` (`q`, `head_dim` values) over the cached
    /// positions a query at position `n_kv − 1` sees (all before it, or the
    /// last `window` with itself), into `out` (`q` already rounded to f16 for
    /// an f16 cache).
    ///
    /// Each score is the sequential sum `((q0·k0 + q1·k1) + q2·k2) + …` (from
    /// `-0.0`, as `Iterator::sum`), and the output the sequential sum over
    /// positions of `(s_j / Σs) · v_j`: [`Model::attend_block`] keeps this
    /// order for every (token, head), so a batch and token-by-token decoding
    /// give the same bits.
    fn attend(
        &self,
        q: &[f32],
        head: usize,
        (k, v): (&Cache, &Cache),
        span: Span,
        n_kv: usize,
        out: &mut [f32],
    ) {
        let heads = span.heads;
        let hd = heads.head_dim;
        let kv_head = head / heads.group();
        let scale = self.score_scale(hd);
        let start = span.window.map_or(0, |w| n_kv.saturating_sub(w));
        let kernels = &self.kernels;
        let mut buf = vec![0f32; hd];
        let mut scores = Vec::with_capacity(n_kv - start);
        for j in start..n_kv {
            k.read(kernels, j, kv_head * hd, &mut buf);
            let dot: f32 = q.iter().zip(&buf).map(|(a, b)| a * b).sum();
            scores.push(dot * scale);
        }
        let sum = softmax_numerators(kernels, &mut scores);
        for (j, s) in (start..n_kv).zip(&scores) {
            v.read(kernels, j, kv_head * hd, &mut buf);
            kernels.axpy(out, s / sum, &buf);
        }
    }

    /// The query heads `first..first + n` (`n ≤ attn::HEADS`, all reading one
    /// KV head) of the block of tokens whose queries are the rows of `q`
    /// (`q_dim` values each; the first is the batch's token `t0`) against the
    /// dense keys and values, added into the same rows of `out` (zeros).
    /// Each (token, head) sums what [`Model::attend`] sums for it, in the same
    /// order; the block's tokens take each tile of keys and each piece of
    /// values in turn, while it is in L1, instead of each token reading all
    /// of them from L2.
    fn attend_block(
        &self,
        q: &[f32],
        (first, n): (usize, usize),
        kv: &DenseKv,
        span: Span,
        t0: usize,
        out: &mut [f32],
    ) {
        let heads = span.heads;
        let (qd, hd) = (heads.q_dim(), heads.head_dim);
        let kv_head = first / heads.group();
        let scale = self.score_scale(hd);
        let kernels = &self.kernels;
        let stride = kv.stride;
        let kt = &kv.kt[kv_head * hd * stride..][..hd * stride];
        let v = &kv.v[kv_head * kv.v.len() / heads.n_head_kv..];
        // Each token's positions seen, `start..end`, counted from the first
        // one decoded, and where its `n` rows of scores (`end − start` each)
        // start in `scores`.
        let nt = q.len() / qd;
        let mut seen = [(0usize, 0usize, 0usize); QUERY_BLOCK];
        let mut total = 0;
        for (b, seen) in seen.iter_mut().enumerate().take(nt) {
            let n_kv = span.n_past + t0 + b + 1;
            let start = span.window.map_or(0, |w| n_kv.saturating_sub(w));
            *seen = (start - kv.from, n_kv - kv.from, total);
            total += n * (n_kv - start);
        }
        let seen = &seen[..nt];
        let lo = seen.iter().map(|s| s.0).min().unwrap_or(0);
        let hi = seen.iter().map(|s| s.1).max().unwrap_or(0);
        let mut scores = vec![0f32; total];
        let mut tiles = [[0f32; KEY_TILE]; attn::HEADS];
        // Tiles start at multiples of the tile (the padding covers the last
        // one); keys before a token's window are not read for it.
        for j0 in (lo / KEY_TILE * KEY_TILE..hi).step_by(KEY_TILE) {
            for (b, &(start, end, at)) in seen.iter().enumerate() {
                if j0 + KEY_TILE <= start || j0 >= end {
                    continue;
                }
                let qh = &q[b * qd + first * hd..][..n * hd];
                kernels.key_tiles(qh, hd, &kt[j0..], stride, &mut tiles[..n]);
                let (from, to) = (start.max(j0), end.min(j0 + KEY_TILE));
                let rows = scores[at..][..n * (end - start)].chunks_exact_mut(end - start);
                for (row, tile) in rows.zip(&tiles) {
                    for (s, &dot) in row[from - start..to - start]
                        .iter_mut()
                        .zip(&tile[from - j0..])
                    {
                        *s = dot * scale;
                    }
                }
            }
        }
        for &(start, end, at) in seen {
            let rows = &mut scores[at..][..n * (end - start)];
            let mut sums = [0f32; attn::HEADS];
            for (sum, row) in sums.iter_mut().zip(rows.chunks_exact_mut(end - start)) {
                *sum = softmax_numerators(kernels, row);
            }
            kernels.divide_rows(rows, &sums[..n]);
        }
        // The values piece by piece, each for every token of the block (the
        // heads' weights of the piece copied side by side first).
        let mut probs = [0f32; attn::HEADS * VALUE_PIECE];
        for p0 in (lo..hi).step_by(VALUE_PIECE) {
            for (b, &(start, end, at)) in seen.iter().enumerate() {
                let (from, to) = (start.max(p0), end.min(p0 + VALUE_PIECE));
                if from >= to {
                    continue;
                }
                let len = to - from;
                for h in 0..n {
                    let row = &scores[at + h * (end - start)..][..end - start];
                    probs[h * len..][..len].copy_from_slice(&row[from - start..to - start]);
                }
                let o = &mut out[b * qd + first * hd..][..n * hd];
                kernels.weighted_rows(o, &probs[..n * len], &v[from * hd..to * hd], n);
            }
        }
    }
}

/// Tokens whose queries one work item of a batch's attention takes together.
const QUERY_BLOCK: usize = 4;

/// Positions of values taken at a time by a block's tokens in turn
/// (`VALUE_PIECE × head_dim` floats: 16 KiB at a head size of 64).
const VALUE_PIECE: usize = 64;

/// A batch's keys and values, decoded to `f32` head by head: the positions
/// from `from` on; keys transposed, `[head][dim][pos]` with `stride`
/// positions per dim ([`key_stride`], the padding zeros); values
/// `[head][pos][dim]`.
struct DenseKv<'a> {
    kt: &'a [f32],
    stride: usize,
    v: &'a [f32],
    from: usize,
}

/// What one layer's attention reads: its heads, how far back a query sees,
/// and the tokens already in the cache.
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) heads: Heads,
    /// Positions a query sees, itself included (sliding-window layers).
    pub(super) window: Option<usize>,
    pub(super) n_past: usize,
}
