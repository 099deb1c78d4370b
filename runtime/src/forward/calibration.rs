//! Hooks for calibration: the inputs of every matrix product shown to an
//! [`Observer`], one layer run at a time, and weights replaced in place.

use super::*;

/// Sees the input of every weight matrix product of the forward pass, in
/// the order the forward pass computes them (calibration collects its
/// statistics through this).
pub trait Observer: Send + Sync {
    /// `x` holds `tokens` rows of the input to `tensor` (for a tensor that
    /// stacks experts, expert `expert`'s share of the tokens), one row per
    /// token, as the product reads them (before any activation rounding).
    fn matmul_input(&self, tensor: &str, expert: Option<usize>, x: &[f32], tokens: usize);

    /// `x` holds `tokens` rows of the residual stream of layer `layer` just
    /// after a block (attention, then feed-forward; once for a parallel
    /// block) added its output: the matrices whose inputs were shown since
    /// the previous call belong to that block.
    fn residual(&self, layer: usize, x: &[f32], tokens: usize) {
        let _ = (layer, x, tokens);
    }
}

/// Intermediate results of one layer over one sample, kept by one
/// calibration pass for the next passes over the same sample, so that the
/// parts of the layer whose weights are final run once (with the same bits
/// as running them again). Each is kept by the first pass that computes it
/// after its flag is set, and read by the passes after that; a new layer
/// starts from a new `Kept`.
#[derive(Debug, Default)]
pub struct Kept {
    /// The attention's Q/K/V projections are final: keep the input of its
    /// output projection (the heads' outputs, after Qwen3.5's output gate),
    /// `tokens × n_head·head_dim` values, until the attention output is kept.
    pub heads_final: bool,
    /// The attention block's matrices are final: keep its output (after
    /// the block's post-norm), `tokens × n_embd` values.
    pub attention_final: bool,
    /// A dense FFN's gate and up are final: keep `act(gate·h) ⊙ up·h`,
    /// `tokens × n_ff` values (mixtures of experts are always computed).
    pub ffn_middle_final: bool,
    heads: KeptRows,
    attention: KeptRows,
    ffn_middle: KeptRows,
}

impl Kept {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let rows = [&self.heads, &self.attention, &self.ffn_middle];
        rows.iter().map(|r| r.values.len() * 4).sum()
    }
}

/// The rows of one result, filled micro-batch by micro-batch in order.
#[derive(Debug, Default)]
struct KeptRows {
    values: Vec<f32>,
    rows: usize,
    complete: bool,
}

impl KeptRows {
    /// Rows `first..first + n` when every row of the sample is held.
    fn get(&self, first: usize, n: usize) -> Option<&[f32]> {
        if !self.complete || self.rows == 0 {
            return None;
        }
        let width = self.values.len() / self.rows;
        self.values.get(first * width..(first + n) * width)
    }

    /// Appends the `n` rows from row `first` of a `total`-row sample (a pass
    /// starting again at row 0 starts over).
    fn put(&mut self, first: usize, n: usize, total: usize, values: &[f32]) {
        if first == 0 {
            self.values.clear();
            self.rows = 0;
            self.complete = false;
        }
        if self.rows == first {
            self.values.extend_from_slice(values);
            self.rows += n;
            self.complete = self.rows == total;
        }
    }
}

/// A [`Kept`] and the rows a micro-batch of [`Model::forward_layer`] covers.
pub(super) struct Keeping<'k> {
    kept: &'k mut Kept,
    first: usize,
    n: usize,
    total: usize,
}

impl Keeping<'_> {
    /// This micro-batch's rows of `rows`, when `ready` (its flag) is set.
    fn rows<'s>(&self, ready: bool, rows: &'s KeptRows) -> Option<&'s [f32]> {
        ready.then(|| rows.get(self.first, self.n)).flatten()
    }

    /// The kept attention output of this micro-batch.
    pub(super) fn attention(&self) -> Option<&[f32]> {
        self.rows(self.kept.attention_final, &self.kept.attention)
    }

    /// Keeps the attention output of this micro-batch, if final. Once all
    /// of it is kept, nothing reads the heads again.
    pub(super) fn keep_attention(&mut self, attn: &[f32]) {
        if self.kept.attention_final {
            (self.kept.attention).put(self.first, self.n, self.total, attn);
            if self.kept.attention.complete {
                self.kept.heads = KeptRows::default();
            }
        }
    }

    /// The kept heads' outputs of this micro-batch.
    pub(super) fn heads(&self) -> Option<&[f32]> {
        self.rows(self.kept.heads_final, &self.kept.heads)
    }

    /// Keeps the heads' outputs of this micro-batch, if final.
    pub(super) fn keep_heads(&mut self, heads: &[f32]) {
        if self.kept.heads_final {
            (self.kept.heads).put(self.first, self.n, self.total, heads);
        }
    }
}

impl<'a> Model<'a> {
    /// A spare buffer holding a copy of `v`.
    pub(super) fn spare_copy(&self, v: &[f32]) -> Vec<f32> {
        let mut out = self.spare.take_dirty(v.len());
        out.copy_from_slice(v);
        out
    }

    /// [`Model::ffn`], with a dense FFN's middle kept or taken from `kept`.
    pub(super) fn ffn_kept(
        &self,
        l: usize,
        ffn: &Ffn,
        h: &[f32],
        x: &[f32],
        t_n: usize,
        kept: Option<&mut Keeping>,
    ) -> Result<Vec<f32>, ForwardError> {
        let kept = kept.filter(|k| k.kept.ffn_middle_final);
        let (Some(k), Ffn::Dense { gate, up, down }) = (kept, ffn) else {
            return self.ffn(l, ffn, h, x, t_n);
        };
        let middle = match k.kept.ffn_middle.get(k.first, k.n) {
            Some(m) => self.spare_copy(m),
            None => {
                let m = self.glu_middle(gate, up, h, t_n)?;
                k.kept.ffn_middle.put(k.first, k.n, k.total, &m);
                m
            }
        };
        let y = self.matmul(down, &middle, t_n);
        self.spare.give(middle);
        y
    }

    /// The embeddings of `tokens`, one row of `n_embd` per token: the input
    /// of layer 0 for [`Model::forward_layer`].
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, ForwardError> {
        let e = self.config.n_embd;
        let mut x = vec![0f32; tokens.len() * e];
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= self.config.n_vocab {
                return Err(ForwardError::Token(id));
            }
            decode(&self.embd, id as usize, &mut x[t * e..(t + 1) * e])?;
        }
        if let Some(s) = self.config.embd_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        Ok(x)
    }

    /// The output head's input for hidden states `x` after the last layer
    /// (one row of `n_embd` per token): the final normalisation. Calibration
    /// collects the head's statistics from it without computing the logits.
    pub fn head_input(&self, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        self.norm(x, &self.output_norm, &mut out);
        out
    }

    /// Runs layer `l` alone over one sequence whose hidden states (one row of
    /// `n_embd` per token, positions from 0) are `x`, replacing them with the
    /// layer's output. Calibration runs a model this way, one layer at a time
    /// over all its samples; what `kept` holds of this sample and layer is
    /// used, and what its flags ask for is kept.
    pub fn forward_layer(
        &self,
        l: usize,
        x: &mut [f32],
        kept: &mut Kept,
    ) -> Result<(), ForwardError> {
        let c = &self.config;
        let t_n = x.len() / c.n_embd;
        if l >= c.n_layer || x.len() != t_n * c.n_embd {
            return Err(ForwardError::Metadata(format!(
                "layer {l} of {} over {} values (not a multiple of {})",
                c.n_layer,
                x.len(),
                c.n_embd
            )));
        }
        if t_n > c.n_ctx {
            return Err(ForwardError::ContextFull(c.n_ctx));
        }
        let mut session = self.session();
        let mut h = vec![0f32; x.len()];
        // In micro-batches when sliding-window layers hold rings.
        let piece = if c.swa.is_some() { UBATCH } else { t_n.max(1) };
        let e = c.n_embd;
        for (x, h) in x.chunks_mut(piece * e).zip(h.chunks_mut(piece * e)) {
            let n = x.len() / e;
            let tables = self.layer_tables(session.n_past, n);
            let mut keeping = Keeping {
                kept: &mut *kept,
                first: session.n_past,
                n,
                total: t_n,
            };
            self.layer_step(l, x, h, &tables, &mut session, Rows::Kept(&mut keeping))?;
            session.n_past += n;
        }
        Ok(())
    }

    /// The rotation tables of `n` tokens from position `first`, made once
    /// for every pass and sample that starts there with as many tokens.
    fn layer_tables(&self, first: usize, n: usize) -> Arc<Tables> {
        let mut last = self.layer_tables.lock().unwrap_or_else(|e| e.into_inner());
        match &*last {
            Some((f, t)) if *f == first && t.len() == n => t.clone(),
            _ => {
                let t = Arc::new(Tables::new(&self.config, first, n));
                *last = Some((first, t.clone()));
                t
            }
        }
    }

    /// Like [`Model::forward_layer`] without changing `x`, but stops as soon
    /// as the input of matrix `tensor` has been shown to the observer (the
    /// rest of the layer is not computed). Stacked expert tensors never stop
    /// the pass: every expert's input is shown.
    pub fn forward_layer_until(
        &mut self,
        l: usize,
        x: &[f32],
        tensor: &str,
        kept: &mut Kept,
    ) -> Result<(), ForwardError> {
        let mut tmp = x.to_vec();
        self.stop_at = Some(tensor.to_owned());
        let result = self.forward_layer(l, &mut tmp, kept);
        self.stop_at = None;
        match result {
            Ok(()) | Err(ForwardError::Stopped(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the weights of matrix `name` (a tensor the forward pass
    /// reads) with `data` of type `ty`, which must hold the same shape.
    pub fn replace_matrix(
        &mut self,
        name: &str,
        ty: GgmlType,
        data: Arc<[u8]>,
    ) -> Result<(), ForwardError> {
        let (cols, rows) = self
            .all_matrices()
            .find(|m| m.name == name)
            .map(|m| (m.cols, m.total_rows))
            .ok_or_else(|| tensor_err(name, "is not a matrix of this model"))?;
        if !DEQUANTIZABLE.contains(&ty) {
            return Err(tensor_err(
                name,
                format!("type {} is not decoded", ty.name()),
            ));
        }
        let row_bytes = ty
            .tensor_size(&[cols as u64])
            .map_err(|e| tensor_err(name, e.to_string()))?
            .bytes as usize;
        if data.len() != rows * row_bytes {
            return Err(tensor_err(
                name,
                format!(
                    "replacement of {} bytes; {rows} rows of {cols} {} weights take {}",
                    data.len(),
                    ty.name(),
                    rows * row_bytes
                ),
            ));
        }
        self.replaced.insert(name.to_owned(), (ty, data));
        Ok(())
    }

    /// Drops the replacements of the matrices whose names start with
    /// `prefix` (a calibrated layer that no pass reads again): the tensors
    /// read the model file again, and their bytes are freed.
    pub fn drop_replacements(&mut self, prefix: &str) {
        self.replaced.retain(|name, _| !name.starts_with(prefix));
    }

    /// Replaces a norm's weight or bias vector (`blk.N.attn_norm.weight`,
    /// `blk.N.ffn_norm.bias`, `output_norm.weight`, …).
    pub fn replace_norm(&mut self, name: &str, values: Vec<f32>) -> Result<(), ForwardError> {
        let (prefix, field) = name
            .rsplit_once('.')
            .ok_or_else(|| tensor_err(name, "is not a norm"))?;
        let norm = if prefix == "output_norm" {
            Some(&mut self.output_norm)
        } else {
            prefix
                .strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(l, kind)| {
                    let layer = self.layers.get_mut(l.parse::<usize>().ok()?)?;
                    match kind {
                        "attn_norm" => Some(&mut layer.attn_norm),
                        // Gemma's sandwich norm; Qwen3.5 names its FFN norm so.
                        "post_attention_norm" if layer.post_attn_norm.is_some() => {
                            layer.post_attn_norm.as_mut()
                        }
                        "ffn_norm" | "post_attention_norm" => layer.ffn_norm.as_mut(),
                        _ => None,
                    }
                })
        }
        .ok_or_else(|| tensor_err(name, "is not a norm of this model"))?;
        let slot = match field {
            "weight" => &mut norm.weight,
            "bias" => norm
                .bias
                .as_mut()
                .ok_or_else(|| tensor_err(name, "this norm has no bias"))?,
            _ => return Err(tensor_err(name, "is not a norm weight or bias")),
        };
        if values.len() != slot.len() || values.iter().any(|v| !v.is_finite()) {
            return Err(tensor_err(
                name,
                format!("replacement must be {} finite values", slot.len()),
            ));
        }
        *slot = values;
        Ok(())
    }

    /// Every weight matrix of the model.
    pub(super) fn all_matrices(&self) -> impl Iterator<Item = &Matrix<'a>> {
        self.layers
            .iter()
            .flat_map(Layer::matrices)
            .chain([&self.output])
    }
}
