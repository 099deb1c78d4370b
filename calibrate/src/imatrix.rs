//! Importance matrices: for every weight matrix product of the forward pass,
//! the sum over calibration tokens of each input column's squared activation,
//! and how many tokens were summed (per expert for stacked MoE tensors). This
//! is the diagonal of the layer's Hessian `XᵀX`, which llama.cpp's weighted
//! encoders use to spend precision where activations are large.
//!
//! [`Collector`] gathers the sums through the forward pass's
//! [`Observer`] hook, [`from_text`] runs it over a text cut into windows
//! exactly as `llama-imatrix` does (so the two tools' sums agree to rounding),
//! and [`Stats`] writes the result in llama-imatrix's GGUF format or its
//! legacy `.dat` format, both of which `llama-quantize --imatrix` reads.
//!
//! Source of the formats and of which products count: `tools/imatrix/imatrix.cpp`
//! of llama.cpp 0c1e570 (`collect_imatrix`, `save_imatrix`, `save_imatrix_legacy`).
//! Only weights named `blk.*` count, plus `output.weight` when asked for;
//! each dense tensor has one token count, each stacked expert tensor one per
//! expert.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use memwall_format::GgmlType;
use memwall_format::atomic::AtomicFile;
use memwall_format::gguf::{Array, GgufWriter, Metadata, TensorSpec};
use memwall_format::progress::Progress;
use memwall_quantize::imatrix::Imatrix;
use memwall_runtime::eval::{self, Perplexity};
use memwall_runtime::forward::{Model, Observer};

use crate::CalibrateError;

/// The sums of one weight tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Per matrix (one, or one per expert), the sum of squared activations of
    /// each input column: `matrices × columns` values.
    pub sums: Vec<f32>,
    /// Per matrix, the tokens summed.
    pub counts: Vec<u64>,
}

impl Entry {
    /// Input columns per matrix.
    pub fn columns(&self) -> usize {
        self.sums.len() / self.counts.len().max(1)
    }
}

/// A finished importance matrix.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Per weight tensor name, its sums.
    pub entries: BTreeMap<String, Entry>,
    /// Names of the calibration texts.
    pub datasets: Vec<String>,
    /// Chunks (windows or samples) the sums cover.
    pub chunk_count: u32,
    /// Tokens per chunk.
    pub chunk_size: u32,
}

/// Collects [`Stats`] entries from a running [`Model`] (see the module docs).
pub struct Collector {
    n_expert: usize,
    output: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    /// The first problem seen (a non-finite sum, or a tensor whose width changed).
    problem: Option<CalibrateError>,
}

impl Collector {
    /// A collector for a model with `n_expert` experts per MoE layer (0 for a
    /// dense model); `output` also collects the output head's input.
    pub fn new(n_expert: usize, output: bool) -> Self {
        Collector {
            n_expert,
            output,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The entries collected so far, or the first problem seen.
    pub fn take(&self) -> Result<BTreeMap<String, Entry>, CalibrateError> {
        let mut state = self.lock();
        if let Some(p) = state.problem.take() {
            return Err(p);
        }
        Ok(std::mem::take(&mut state.entries))
    }
}

impl Observer for Collector {
    fn matmul_input(&self, tensor: &str, expert: Option<usize>, x: &[f32], tokens: usize) {
        if !(tensor.starts_with("blk.") || (self.output && tensor == "output.weight")) {
            return;
        }
        if tokens == 0 {
            return;
        }
        let cols = x.len() / tokens;
        let matrices = if expert.is_some() {
            self.n_expert.max(1)
        } else {
            1
        };
        let m = expert.unwrap_or(0);
        let mut state = self.lock();
        if state.problem.is_some() {
            return;
        }
        let entry = state
            .entries
            .entry(tensor.to_owned())
            .or_insert_with(|| Entry {
                sums: vec![0.0; cols * matrices],
                counts: vec![0; matrices],
            });
        if entry.sums.len() != cols * matrices || m >= matrices {
            let message = format!(
                "{tensor}: inputs of {cols} columns for matrix {m} of {matrices} do not fit the {} sums collected before",
                entry.sums.len()
            );
            state.problem = Some(CalibrateError::Input(message));
            return;
        }
        let acc = &mut entry.sums[m * cols..(m + 1) * cols];
        // Token by token, in f32, as llama-imatrix adds them.
        for row in x.chunks_exact(cols) {
            for (a, v) in acc.iter_mut().zip(row) {
                *a += v * v;
            }
        }
        entry.counts[m] += tokens as u64;
        if !acc.iter().all(|v| v.is_finite()) {
            state.problem = Some(CalibrateError::NonFinite {
                tensor: tensor.to_owned(),
            });
        }
    }
}

/// How [`from_text`] cuts and runs the text.
#[derive(Clone, Debug)]
pub struct TextOptions {
    /// Tokens per window (`-c`, llama-imatrix's default is 512).
    pub n_ctx: usize,
    /// Tokens per forward call.
    pub n_batch: usize,
    /// Use at most this many windows.
    pub max_chunks: Option<usize>,
    /// The BOS id that replaces each window's first token (when the vocabulary adds BOS).
    pub bos: Option<u32>,
    /// Also collect the output head's input (`--process-output`).
    pub process_output: bool,
    /// The name recorded in `imatrix.datasets`.
    pub dataset: String,
}

/// The importance matrix of `model` over `tokens` (the whole text, with BOS
/// when the vocabulary adds one), cut into windows of `n_ctx` tokens as
/// `llama-imatrix` cuts it, and the perplexity it prints along the way.
pub fn from_text(
    model: &mut Model,
    tokens: &[u32],
    options: &TextOptions,
    progress: &dyn Progress,
) -> Result<(Stats, Perplexity), CalibrateError> {
    let collector = Arc::new(Collector::new(
        model.config.n_expert,
        options.process_output,
    ));
    model.set_observer(Some(collector.clone()));
    let eval_options = eval::Options {
        n_ctx: options.n_ctx,
        n_batch: options.n_batch,
        max_chunks: options.max_chunks,
        bos: options.bos,
        all_outputs: options.process_output,
    };
    let result = eval::perplexity(model, tokens, &eval_options, None, progress);
    model.set_observer(None);
    let ppl = result?;
    let entries = collector.take()?;
    let stats = Stats {
        entries,
        datasets: vec![options.dataset.clone()],
        chunk_count: ppl.chunks as u32,
        chunk_size: options.n_ctx as u32,
    };
    Ok((stats, ppl))
}

/// The importance matrix of `model` over a calibration set: each sample is
/// one sequence from an empty cache (its tokens as the set holds them, BOS
/// included), one chunk of the result.
pub fn from_samples(
    model: &mut Model,
    samples: &[Vec<u32>],
    seq_len: usize,
    process_output: bool,
    dataset: &str,
    progress: &dyn Progress,
) -> Result<Stats, CalibrateError> {
    if samples.is_empty() {
        return Err(CalibrateError::Input(
            "the calibration set has no samples".into(),
        ));
    }
    let collector = Arc::new(Collector::new(model.config.n_expert, process_output));
    model.set_observer(Some(collector.clone()));
    progress.start(
        "imatrix",
        samples.len() as u64,
        memwall_format::progress::Unit::Items,
    );
    let mut result = Ok(());
    for s in samples {
        let mut session = model.session();
        // Only the output head's input needs every position's logits.
        let first = if process_output {
            0
        } else {
            s.len().saturating_sub(1)
        };
        if let Err(e) = model.forward_from(&mut session, s, first) {
            result = Err(e);
            break;
        }
        progress.advance(1);
    }
    progress.finish();
    model.set_observer(None);
    result?;
    Ok(Stats {
        entries: collector.take()?,
        datasets: vec![dataset.to_owned()],
        chunk_count: samples.len() as u32,
        chunk_size: seq_len as u32,
    })
}

impl Stats {
    /// The metadata and tensors of the GGUF format, in llama-imatrix's order:
    /// tensors sorted by name, each `<name>.in_sum2` then `<name>.counts`.
    fn gguf_layout(&self) -> (Metadata, Vec<TensorSpec>) {
        let mut meta = Metadata::new();
        meta.set("general.type", "imatrix");
        meta.set("imatrix.datasets", Array::String(self.datasets.clone()));
        meta.set("imatrix.chunk_count", self.chunk_count);
        meta.set("imatrix.chunk_size", self.chunk_size);
        let mut specs = Vec::with_capacity(2 * self.entries.len());
        // ggml writes a 2-D tensor with one row as 1-D (trailing 1s dropped).
        let shape = |cols: usize, n_mat: usize| match n_mat {
            1 => vec![cols as u64],
            _ => vec![cols as u64, n_mat as u64],
        };
        for (name, e) in &self.entries {
            specs.push(TensorSpec {
                name: format!("{name}.in_sum2"),
                dims: shape(e.columns(), e.counts.len()),
                ty: GgmlType::F32,
            });
            specs.push(TensorSpec {
                name: format!("{name}.counts"),
                dims: shape(1, e.counts.len()),
                ty: GgmlType::F32,
            });
        }
        (meta, specs)
    }

    fn write_gguf_to<W: Write>(
        &self,
        mut w: GgufWriter<W>,
    ) -> Result<GgufWriter<W>, CalibrateError> {
        for (name, e) in &self.entries {
            w.write_tensor(
                &format!("{name}.in_sum2"),
                &f32_bytes(e.sums.iter().copied()),
            )?;
            w.write_tensor(
                &format!("{name}.counts"),
                &f32_bytes(e.counts.iter().map(|&c| c as f32)),
            )?;
        }
        Ok(w)
    }

    /// Writes llama-imatrix's GGUF format to `path` (atomically).
    pub fn write_gguf(&self, path: &Path) -> Result<(), CalibrateError> {
        let (meta, specs) = self.gguf_layout();
        let w = GgufWriter::create(path, 3, meta, specs)?;
        self.write_gguf_to(w)?.commit()?;
        Ok(())
    }

    /// The GGUF format in memory.
    pub fn gguf_bytes(&self) -> Result<Vec<u8>, CalibrateError> {
        let (meta, specs) = self.gguf_layout();
        let w = GgufWriter::new(Vec::new(), Path::new("imatrix"), 3, meta, specs)?;
        Ok(self.write_gguf_to(w)?.finish()?)
    }

    /// The legacy `.dat` format: per entry the mean squared activation times
    /// the number of chunks ("calls"), the chunk count, and the dataset name.
    pub fn legacy_bytes(&self) -> Vec<u8> {
        let chunk = u64::from(self.chunk_size.max(1));
        let mut out = Vec::new();
        let i32_le = |out: &mut Vec<u8>, v: i32| out.extend_from_slice(&v.to_le_bytes());
        i32_le(&mut out, self.entries.len() as i32);
        for (name, e) in &self.entries {
            i32_le(&mut out, name.len() as i32);
            out.extend_from_slice(name.as_bytes());
            let max = e.counts.iter().copied().max().unwrap_or(0);
            let ncall = max.div_ceil(chunk) as i32;
            i32_le(&mut out, ncall);
            i32_le(&mut out, e.sums.len() as i32);
            let cols = e.columns();
            for (i, &value) in e.sums.iter().enumerate() {
                let count = e.counts[i / cols.max(1)] as f32;
                // Matrices that saw no token are stored as 1, as llama-imatrix does.
                let (value, count) = if count == 0.0 {
                    (1.0, 1.0)
                } else {
                    (value, count)
                };
                out.extend_from_slice(&((value / count) * ncall as f32).to_le_bytes());
            }
        }
        i32_le(&mut out, self.chunk_count as i32);
        let dataset = self.datasets.last().map_or("", String::as_str);
        i32_le(&mut out, dataset.len() as i32);
        out.extend_from_slice(dataset.as_bytes());
        out
    }

    /// Writes the legacy `.dat` format to `path` (atomically).
    pub fn write_legacy(&self, path: &Path) -> Result<(), CalibrateError> {
        let io = |error| CalibrateError::Io {
            path: path.to_owned(),
            error,
        };
        let mut f = AtomicFile::create(path).map_err(io)?;
        f.write_all(&self.legacy_bytes()).map_err(io)?;
        f.commit().map_err(io)
    }

    /// The per-column mean squared activations the weighted encoders take,
    /// normalised exactly as when `llama-quantize` reads the GGUF file.
    pub fn to_imatrix(&self) -> Result<Imatrix, CalibrateError> {
        Ok(Imatrix::from_gguf(&self.gguf_bytes()?)?)
    }
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Stats {
        let mut entries = BTreeMap::new();
        entries.insert(
            "blk.0.ffn_up.weight".to_owned(),
            Entry {
                sums: vec![4.0, 8.0, 12.0],
                counts: vec![4],
            },
        );
        entries.insert(
            "blk.0.ffn_up_exps.weight".to_owned(),
            Entry {
                sums: vec![2.0, 6.0, 0.0, 0.0],
                counts: vec![2, 0],
            },
        );
        Stats {
            entries,
            datasets: vec!["text.txt".into()],
            chunk_count: 2,
            chunk_size: 2,
        }
    }

    #[test]
    fn gguf_round_trip_gives_means_and_ones_for_unused_experts() {
        let m = sample().to_imatrix().unwrap();
        assert_eq!(m.entries["blk.0.ffn_up.weight"], vec![1.0, 2.0, 3.0]);
        assert_eq!(
            m.entries["blk.0.ffn_up_exps.weight"],
            vec![1.0, 3.0, 1.0, 1.0]
        );
        assert_eq!(m.datasets, vec!["text.txt".to_owned()]);
        assert_eq!((m.chunk_count, m.chunk_size), (2, 2));
    }

    #[test]
    fn legacy_format_reads_back_as_the_same_means() {
        let m = Imatrix::from_legacy(&sample().legacy_bytes()).unwrap();
        assert_eq!(m.entries["blk.0.ffn_up.weight"], vec![1.0, 2.0, 3.0]);
        // Two calls: (2/2)·1 and (6/2)·1 for the used expert, 1 for the unused one.
        assert_eq!(
            m.entries["blk.0.ffn_up_exps.weight"],
            vec![1.0, 3.0, 1.0, 1.0]
        );
    }

    #[test]
    fn collector_sums_squares_per_expert_and_skips_other_tensors() {
        let c = Collector::new(2, false);
        c.matmul_input("blk.0.attn_q.weight", None, &[1.0, 2.0, 3.0, 4.0], 2);
        c.matmul_input("blk.0.ffn_gate_exps.weight", Some(1), &[1.0, -2.0], 1);
        c.matmul_input("output.weight", None, &[5.0, 5.0], 1);
        c.matmul_input("token_embd.weight", None, &[5.0, 5.0], 1);
        let e = c.take().unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e["blk.0.attn_q.weight"].sums, vec![10.0, 20.0]);
        assert_eq!(e["blk.0.attn_q.weight"].counts, vec![2]);
        assert_eq!(
            e["blk.0.ffn_gate_exps.weight"].sums,
            vec![0.0, 0.0, 1.0, 4.0]
        );
        assert_eq!(e["blk.0.ffn_gate_exps.weight"].counts, vec![0, 1]);
    }

    #[test]
    fn non_finite_input_is_an_error_naming_the_tensor() {
        let c = Collector::new(0, true);
        c.matmul_input("output.weight", None, &[f32::INFINITY, 1.0], 1);
        let err = c.take().unwrap_err().to_string();
        assert!(err.contains("output.weight"), "{err}");
    }
}
