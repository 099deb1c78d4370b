//! Calibrated quantization: AWQ, GPTQ or both, layer by layer, into the
//! same GGUF (tensor names and types) that plain quantization to the same
//! file type or recipe writes.
//!
//! For each layer, with every calibration sample's hidden states at the
//! layer's input (computed by the layers before it, *already quantized*):
//!
//! 1. one pass of the layer in float collects, per input of its matrices
//!    (attention input, attention output, FFN input, FFN middle — per expert
//!    for MoE), the Hessian `XᵀX` and mean |x|; with GPTQ, a dense layer's
//!    pass collects only the attention input's and those AWQ scores, and
//!    stops at the input of the last of them;
//! 2. AWQ (if asked) searches the scales of each group ([`crate::awq`]) and
//!    folds them into the norms and the preceding matrices;
//! 3. the matrices are quantized in the order the layer reads them: Q/K/V,
//!    the attention output, gate/up (and experts), down. With GPTQ, each
//!    group after the first gets a fresh pass that sees the groups before it
//!    quantized ("true sequential"), and is rounded with error feedback
//!    ([`crate::gptq`]); without, each matrix is encoded by llama.cpp's
//!    importance-weighted encoder with the pass's statistics;
//! 4. a last pass through the quantized layer gives the next layer's input.
//!
//! The pass after the quantized Q/K/V keeps the heads' outputs, so the next
//! one computes only the attention output projection; the passes after the
//! quantized attention start from its output, kept per sample by the first
//! pass that computes it, and the last pass from a dense FFN's kept middle
//! ([`Kept`]: the same bits as recomputing them).
//!
//! Memory: the hidden states of all samples (samples × length × n_embd
//! floats), one layer's weights in `f32`, the Hessians of one layer
//! (inputs² × 8 bytes each), the kept results when they fit; quantized
//! tensors go to a work folder next to the output as they are made
//! (committed layer by layer, so a stopped run resumes: `work.rs`), and the
//! output is written from it at the end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use memwall_format::GgmlType;
use memwall_format::arch::Arch;
use memwall_format::blocks::dequantize_row;
use memwall_format::gguf::{GgufModel, GgufWriter, TensorSpec, Value};
use memwall_format::progress::{Progress, Unit};
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::job::{self, ImatrixInput, Options};
use memwall_quantize::recipe::Recipe;
use memwall_quantize::{IMATRIX_ENCODABLE, quantize_row_imatrix};
use memwall_runtime::forward::{Kept, Model, Observer};
use memwall_runtime::kernels::{Kernels, Pool, ProductTiles};
use rayon::prelude::*;

use crate::CalibrateError;
use crate::awq::{self, Linear};
use crate::gptq;
use crate::lattice::LATTICE_TYPES;
use crate::linalg::Hessian;
use crate::work::{Manifest, Work};

/// Which calibration to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Activation-aware scales, then importance-weighted rounding.
    Awq,
    /// Error-feedback rounding onto the block grids.
    Gptq,
    /// AWQ's scales, then GPTQ's rounding.
    AwqGptq,
}

impl Method {
    /// The name used on the command line and in the metadata.
    pub fn name(self) -> &'static str {
        match self {
            Method::Awq => "awq",
            Method::Gptq => "gptq",
            Method::AwqGptq => "awq+gptq",
        }
    }

    fn awq(self) -> bool {
        matches!(self, Method::Awq | Method::AwqGptq)
    }

    fn gptq(self) -> bool {
        matches!(self, Method::Gptq | Method::AwqGptq)
    }
}

/// Everything that decides the calibration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The method.
    pub method: Method,
    /// AWQ's grid of exponents.
    pub awq_grid: usize,
    /// GPTQ's settings.
    pub gptq: gptq::Settings,
    /// The calibration set's name (recorded in the output).
    pub dataset: String,
    /// Its SHA-256.
    pub dataset_sha256: String,
    /// Insist on continuing the interrupted run whose work folder is next to
    /// the output (`work.rs`): one of other settings is refused, not
    /// replaced. (The same run is always continued.)
    pub resume: bool,
    /// Refuse to start when the estimated peak ([`Memory::total`]) is
    /// larger than this many bytes.
    pub memory_limit: Option<u64>,
}

/// What happened to one group of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupReport {
    /// `blk.N.attn_in` and so on.
    pub input: String,
    /// AWQ's exponent (`None`: no scaling, or AWQ not run).
    pub alpha: Option<f32>,
    /// AWQ's output error with / without its scales.
    pub awq_error_ratio: Option<f64>,
    /// GPTQ dampening used (fraction of the mean diagonal), if GPTQ ran.
    pub damp: Option<f64>,
    /// Calibration tokens that reached this input.
    pub tokens: u64,
}

impl GroupReport {
    /// The report as JSON (`--json` output and the work folder's state).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"input": self.input, "alpha": self.alpha,
            "awq_error_ratio": self.awq_error_ratio, "damp": self.damp, "tokens": self.tokens})
    }
}

/// The result of [`run`].
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Per layer and group.
    pub groups: Vec<GroupReport>,
    /// Matrices calibrated.
    pub calibrated: usize,
    /// Expert matrices no calibration token reached (encoded without).
    pub unreached_experts: usize,
    /// Tensors written as plain quantization does (embeddings, output head, norms…).
    pub plain: usize,
    /// Bytes written.
    pub bytes: u64,
    /// Seconds per layer.
    pub layer_seconds: Vec<f64>,
    /// Seconds in all.
    pub seconds: f64,
    /// Seconds running layers over the samples (including the statistics).
    pub forward_seconds: f64,
    /// Of which accumulating Hessians.
    pub hessian_seconds: f64,
    /// Seconds in AWQ's scale search.
    pub awq_seconds: f64,
    /// Seconds in GPTQ (factorisation and rounding) or plain encoding.
    pub quantize_seconds: f64,
    /// Of which GPTQ's factorisations of the Hessians.
    pub factor_seconds: f64,
    /// Layers taken over from an interrupted run.
    pub resumed_layers: usize,
    /// Memory the run needs at its peak, estimated before it starts.
    pub memory: Memory,
}

/// The inputs a layer's matrices read, in the order the forward pass
/// computes them: the quantization stages.
const STAGES: [&str; 5] = ["attn_in", "attn_out", "ffn_in", "ffn_mid", "shexp_mid"];

/// The input group a matrix reads, and whether it is the one whose input
/// is recorded for the group (so shared inputs are counted once). A gated
/// delta-net layer's projections read the attention input too, its output
/// projection the attention output; a shared expert reads the FFN input,
/// its down projection an input of its own. Gemma 4's router reads an input
/// of its own (the residual's plain RMSNorm, scaled) and its experts theirs
/// (the second pre-norm): the FFN input of `ffn_in` is its dense MLP's.
fn input_group(suffix: &str, arch: Arch) -> Option<(&'static str, bool)> {
    if arch == Arch::Gemma4 && suffix == "ffn_gate_inp.weight" {
        return Some(("router_in", true));
    }
    Some(match suffix {
        "attn_q.weight" | "attn_qkv.weight" => ("attn_in", true),
        "attn_k.weight" | "attn_v.weight" => ("attn_in", false),
        "attn_gate.weight" | "ssm_beta.weight" | "ssm_alpha.weight" => ("attn_in", false),
        "attn_output.weight" | "ssm_out.weight" => ("attn_out", true),
        "ffn_gate_shexp.weight" | "ffn_up_shexp.weight" => ("ffn_in", false),
        "ffn_down_shexp.weight" => ("shexp_mid", true),
        "ffn_gate_inp.weight" => ("ffn_in", true),
        "ffn_gate.weight" => ("ffn_in", true),
        "ffn_up.weight" => ("ffn_in", false),
        "ffn_gate_exps.weight" | "ffn_gate_up_exps.weight" => ("ffn_in", true),
        "ffn_up_exps.weight" => ("ffn_in", false),
        "ffn_down.weight" | "ffn_down_exps.weight" => ("ffn_mid", true),
        _ => return None,
    })
}

/// The key of an input: `attn_in`, or `ffn_in#3` for expert 3.
fn key(group: &str, expert: Option<usize>) -> String {
    match expert {
        Some(x) => format!("{group}#{x}"),
        None => group.to_owned(),
    }
}

/// Collects Hessians of the wanted inputs of one layer.
struct Collect {
    prefix: String,
    arch: Arch,
    wanted: HashSet<String>,
    found: Mutex<HashMap<String, Hessian>>,
    /// Nanoseconds spent accumulating.
    nanos: std::sync::atomic::AtomicU64,
    kernels: Kernels,
    /// The forward pass's threads, for the Hessians' products.
    pool: Option<Arc<Pool>>,
}

impl Observer for Collect {
    fn matmul_input(&self, tensor: &str, expert: Option<usize>, x: &[f32], tokens: usize) {
        let Some(suffix) = tensor.strip_prefix(&self.prefix) else {
            return;
        };
        let Some((group, true)) = input_group(suffix, self.arch) else {
            return;
        };
        // The router's input is the FFN input of every token (dense); the
        // experts' gate sees only the tokens routed to each expert.
        let k = key(group, expert);
        if tokens == 0 || !self.wanted.contains(&k) {
            return;
        }
        let cols = x.len() / tokens;
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        let h = found.entry(k).or_insert_with(|| Hessian::new(cols));
        if h.n == cols {
            let t = Instant::now();
            h.add(&self.kernels, self.pool.as_deref(), x, tokens);
            self.nanos.fetch_add(
                t.elapsed().as_nanos() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }
}

/// One matrix the calibration rewrites: where its weights come from and go.
struct Target {
    name: String,
    ty: GgmlType,
    /// Rows per expert (all rows when not stacked).
    rows: usize,
    cols: usize,
    experts: usize,
    /// The weights in `f32` (scaled by AWQ as it goes).
    w: Vec<f32>,
    /// Whether AWQ changed the weights.
    scaled: bool,
}

impl Target {
    fn suffix(&self) -> &str {
        self.name
            .split_once('.')
            .and_then(|(_, r)| r.split_once('.'))
            .map_or("", |(_, s)| s)
    }
}

fn decode_tensor(
    gguf: &GgufModel,
    name: &str,
) -> Result<(Vec<f32>, GgmlType, Vec<u64>), CalibrateError> {
    let (info, _) = gguf
        .tensor(name)
        .ok_or_else(|| CalibrateError::Input(format!("tensor {name} is missing")))?;
    let rows = (info.elements / info.dims[0].max(1)) as usize;
    let w = decode_rows(gguf, name, 0..rows)?;
    Ok((w, info.ty, info.dims.clone()))
}

/// Rows `rows` of the matrix `name` in `f32`; a value that is not finite is
/// refused.
fn decode_rows(
    gguf: &GgufModel,
    name: &str,
    rows: std::ops::Range<usize>,
) -> Result<Vec<f32>, CalibrateError> {
    let (info, data) = gguf
        .tensor(name)
        .ok_or_else(|| CalibrateError::Input(format!("tensor {name} is missing")))?;
    let cols = (info.dims[0] as usize).max(1);
    let rb = info
        .ty
        .tensor_size(&[info.dims[0]])
        .map_err(|e| CalibrateError::Input(format!("{name}: {e}")))?
        .bytes as usize;
    let bytes = data.get(rows.start * rb..rows.end * rb).ok_or_else(|| {
        CalibrateError::Input(format!("tensor {name}: rows {rows:?} are outside it"))
    })?;
    let mut out = vec![0f32; rows.len() * cols];
    out.par_chunks_mut(cols)
        .zip(bytes.par_chunks(rb.max(1)))
        .try_for_each(|(o, b)| dequantize_row(info.ty, b, o))
        .map_err(|e| CalibrateError::Input(format!("{name}: {e}")))?;
    if let Some(i) = out.iter().position(|v| !v.is_finite()) {
        return Err(CalibrateError::Input(format!(
            "tensor {name}: value {} is {} (the model is damaged)",
            rows.start * cols + i,
            out[i]
        )));
    }
    Ok(out)
}

fn encode_rows(
    w: &[f32],
    cols: usize,
    ty: GgmlType,
    imatrix: Option<&[f32]>,
    name: &str,
) -> Result<Vec<u8>, CalibrateError> {
    let rb = ty
        .tensor_size(&[cols as u64])
        .map_err(|e| CalibrateError::Input(format!("{name}: {e}")))?
        .bytes as usize;
    let weights = imatrix.filter(|_| IMATRIX_ENCODABLE.contains(&ty));
    let mut out = vec![0u8; w.len() / cols * rb];
    out.par_chunks_mut(rb)
        .zip(w.par_chunks(cols))
        .try_for_each(|(o, r)| quantize_row_imatrix(ty, r, o, weights))
        .map_err(|e| CalibrateError::Input(format!("{name}: {e}")))?;
    Ok(out)
}

/// Rows of the output head decoded and rounded at a time (a multiple of
/// GPTQ's row group, so the bits do not depend on it).
const HEAD_ROWS: usize = 4096;

/// The output head `t` calibrated on the hidden states after the last layer
/// `xs`: its input is their final norm; GPTQ rounds it slice by slice (its
/// rows are independent given the factor), else llama.cpp's encoder weighs
/// the columns by the input's mean squares. Returns the bytes and those mean
/// squares (the head's importance-matrix entry).
fn quantize_head(
    gguf: &GgufModel,
    model: &Model,
    xs: &[Vec<f32>],
    t: &job::TensorPlan,
    settings: &Settings,
    report: &mut Report,
) -> Result<(Vec<u8>, Vec<f32>), CalibrateError> {
    let cols = t.dims.first().copied().unwrap_or(0) as usize;
    let rows = t.dims.get(1).copied().unwrap_or(1) as usize;
    if cols != model.config.n_embd {
        return Err(CalibrateError::Input(format!(
            "tensor {}: rows of {cols} values, but the model's width is {}",
            t.name, model.config.n_embd
        )));
    }
    let started = Instant::now();
    let mut h = Hessian::new(cols);
    let (kernels, pool) = (model.kernels(), model.pool());
    let mut hessian = 0f64;
    for x in xs {
        let input = model.head_input(x);
        let at = Instant::now();
        h.add(&kernels, pool.as_deref(), &input, input.len() / cols);
        hessian += at.elapsed().as_secs_f64();
    }
    report.forward_seconds += started.elapsed().as_secs_f64();
    report.hessian_seconds += hessian;
    let mean_square = h.mean_square();
    let t_quant = Instant::now();
    let prepared = if settings.method.gptq() {
        Some(gptq::prepare(
            &mut h,
            settings.gptq,
            &format!("{} (the final norm's output)", t.name),
        )?)
    } else {
        None
    };
    drop(h);
    let mut bytes = Vec::new();
    for first in (0..rows).step_by(HEAD_ROWS) {
        let n = HEAD_ROWS.min(rows - first);
        let w = decode_rows(gguf, &t.name, first..first + n)?;
        let part = match &prepared {
            Some(p) => gptq::quantize(&w, n, cols, t.target, p, &mean_square)?,
            None => encode_rows(&w, cols, t.target, Some(&mean_square), &t.name)?,
        };
        bytes.extend_from_slice(&part);
    }
    report.quantize_seconds += t_quant.elapsed().as_secs_f64();
    Ok((bytes, mean_square))
}

/// Runs the layer over every sample, showing the matrix inputs of `wanted`
/// to a collector; returns the Hessians. With `advance`, the samples' hidden
/// states become the layer's outputs; with `until`, each pass stops once that
/// matrix's input has been seen (the rest of the layer is not needed).
#[allow(clippy::too_many_arguments)]
fn pass(
    model: &mut Model,
    l: usize,
    xs: &mut [Vec<f32>],
    kept: &mut [Kept],
    wanted: HashSet<String>,
    advance: bool,
    until: Option<&str>,
    report: &mut Report,
) -> Result<HashMap<String, Hessian>, CalibrateError> {
    let started = Instant::now();
    let collect = Arc::new(Collect {
        prefix: format!("blk.{l}."),
        arch: model.config.arch,
        wanted,
        found: Mutex::new(HashMap::new()),
        nanos: std::sync::atomic::AtomicU64::new(0),
        kernels: model.kernels(),
        pool: model.pool(),
    });
    if !collect.wanted.is_empty() {
        model.set_observer(Some(collect.clone()));
    }
    let mut result = Ok(());
    let mut none = Kept::default();
    for (i, x) in xs.iter_mut().enumerate() {
        let kept = kept.get_mut(i).unwrap_or(&mut none);
        let r = match (advance, until) {
            (true, _) => model.forward_layer(l, x, kept),
            (false, Some(t)) => model.forward_layer_until(l, x, t, kept),
            (false, None) => {
                let mut tmp = x.clone();
                model.forward_layer(l, &mut tmp, kept)
            }
        };
        if let Err(e) = r {
            result = Err(e);
            break;
        }
    }
    model.set_observer(None);
    result?;
    report.forward_seconds += started.elapsed().as_secs_f64();
    report.hessian_seconds +=
        collect.nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9;
    let found = std::mem::take(&mut *collect.found.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(found)
}

/// The first matrix of `targets` that reads input `group` (the one whose
/// input the forward pass shows for the group).
fn first_reader(targets: &[Target], group: &str, arch: Arch) -> Option<String> {
    (targets.iter())
        .find(|t| input_group(t.suffix(), arch) == Some((group, true)))
        .map(|t| t.name.clone())
}

/// `H / (s sᵀ)` and `|x| / s`: the statistics of the input divided by `s`.
fn rescale(h: &mut Hessian, s: &[f32]) {
    let n = h.n;
    for i in 0..n {
        for j in 0..n {
            h.h[i * n + j] /= f64::from(s[i]) * f64::from(s[j]);
        }
        h.abs_sum[i] /= f64::from(s[i]);
    }
}

/// The Hessian's full matrix in `f32` (from its lower triangle, without an
/// `f64` copy).
fn f32_full(h: &Hessian) -> Vec<f32> {
    let n = h.n;
    let mut out = vec![0f32; n * n];
    out.par_chunks_mut(n.max(1))
        .enumerate()
        .for_each(|(i, row)| {
            for (j, v) in row.iter_mut().enumerate() {
                *v = entry_f32(h, i, j);
            }
        });
    out
}

/// Entry `(i, j)` of the Hessian in `f32`, read from its lower triangle.
#[inline]
fn entry_f32(h: &Hessian, i: usize, j: usize) -> f32 {
    let (r, c) = if j <= i { (i, j) } else { (j, i) };
    h.h[r * h.n + c] as f32
}

/// [`f32_full`] as the products' tiles (`h.n` a multiple of
/// [`ProductTiles::TILE`], 32): tile `j` holds columns `32j..32j + 32` of
/// every row, each tile made by one task
/// (the rows of `H` below the tile are read along, those above it across
/// its 32 rows).
fn f32_tiles(h: &Hessian) -> ProductTiles {
    const TILE: usize = ProductTiles::TILE;
    let n = h.n;
    let mut tiles = ProductTiles::default();
    tiles
        .tiles_mut(n, n)
        .par_chunks_mut(TILE * n.max(1))
        .enumerate()
        .for_each(|(t, tile)| {
            for (i, row) in tile.chunks_exact_mut(TILE).enumerate() {
                for (c, v) in row.iter_mut().enumerate() {
                    *v = entry_f32(h, i, t * TILE + c);
                }
            }
        });
    tiles
}

/// Memory a calibration needs at its peak, by part, estimated from the
/// model's shapes and the calibration tokens before any work.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// The hidden states of every sample (`f32`).
    pub hidden: u64,
    /// At the peak: the `f32` weights held (the matrices being calibrated
    /// and, after AWQ, the rescaled copies the forward pass reads).
    pub weights: u64,
    /// At the peak: the Hessians held (`f64`, one per input and expert).
    pub hessians: u64,
    /// At the peak: GPTQ's factor of an input (`U` in `f32` and the columns
    /// of an inverse made at once), or AWQ's `f32` copy of a Hessian.
    pub factor: u64,
    /// With GPTQ, the results a layer's later passes take from the earlier
    /// ones instead of running its final parts again (`f32`: the heads'
    /// outputs, the attention output and a dense FFN's middle of every
    /// sample); 0 when they would
    /// not fit under the limit (the passes then recompute them).
    pub kept: u64,
    /// The sum, with the buffers of the forward pass.
    pub total: u64,
}

/// AWQ's groups of one layer (prefix `prefix`): the input, what its scales
/// fold into (a norm, or the matrix whose rows make the input), and the
/// matrices that read it.
type Group = (&'static str, &'static str, Vec<&'static str>);

fn awq_groups(
    gguf: &GgufModel,
    prefix: &str,
    c: &memwall_runtime::forward::Config,
    targets: &[Target],
) -> Vec<Group> {
    let find = |s: &str| targets.iter().any(|t| t.suffix() == s);
    let parallel = c.arch.parallel_blocks();
    let moe = c.n_expert > 0;
    let mut groups: Vec<Group> = Vec::new();
    if parallel && !moe {
        groups.push((
            "attn_in",
            "attn_norm",
            vec![
                "attn_q.weight",
                "attn_k.weight",
                "attn_v.weight",
                "ffn_gate.weight",
                "ffn_up.weight",
            ],
        ));
    } else if find("attn_qkv.weight") {
        // A gated delta-net layer: its four projections read the norm.
        groups.push((
            "attn_in",
            "attn_norm",
            vec![
                "attn_qkv.weight",
                "attn_gate.weight",
                "ssm_beta.weight",
                "ssm_alpha.weight",
            ],
        ));
    } else if gguf.tensor(&format!("{prefix}attn_v.weight")).is_none() {
        // Gemma 4's global layers: the values are the keys.
        groups.push((
            "attn_in",
            "attn_norm",
            vec!["attn_q.weight", "attn_k.weight"],
        ));
    } else {
        groups.push((
            "attn_in",
            "attn_norm",
            vec!["attn_q.weight", "attn_k.weight", "attn_v.weight"],
        ));
    }
    let has_v_bias = gguf.tensor(&format!("{prefix}attn_v.bias")).is_some();
    // Gemma 4 RMS-normalises its values, so a factor moved into V
    // would not come out again.
    if c.n_head == c.n_head_kv && !has_v_bias && c.arch != Arch::Gemma4 {
        groups.push(("attn_out", "attn_v.weight", vec!["attn_output.weight"]));
    }
    if !moe {
        if !parallel {
            let norm = if c.arch.hybrid() {
                "post_attention_norm"
            } else {
                "ffn_norm"
            };
            groups.push(("ffn_in", norm, vec!["ffn_gate.weight", "ffn_up.weight"]));
        }
        groups.push(("ffn_mid", "ffn_up.weight", vec!["ffn_down.weight"]));
    }
    groups
}

/// One layer's shapes, for the estimate: per quantization stage, the `f32`
/// bytes of its matrices, the Hessians of its dense input and of its
/// experts' inputs, and its widest input; the Hessians of inputs outside the
/// stages (a router's own input).
#[derive(Default)]
struct LayerShape {
    weights: [u64; STAGES.len()],
    dense: [u64; STAGES.len()],
    experts: [u64; STAGES.len()],
    cols: [u64; STAGES.len()],
    other: u64,
    /// A dense FFN's middle width (what the passes keep of it).
    dense_middle: u64,
}

impl LayerShape {
    fn of(plan: &job::Plan, c: &memwall_runtime::forward::Config, l: usize) -> LayerShape {
        let prefix = format!("blk.{l}.");
        let mut shape = LayerShape::default();
        let mut keys = HashSet::new();
        for t in plan.tensors.iter().filter(|t| t.name.starts_with(&prefix)) {
            let Some((group, records)) = input_group(&t.name[prefix.len()..], c.arch) else {
                continue;
            };
            let cols = t.dims[0];
            let experts = t.dims.get(2).copied().unwrap_or(1);
            let hessian = experts * cols * cols * 8;
            let recorded = records && keys.insert((group, experts > 1));
            let Some(s) = STAGES.iter().position(|&g| g == group) else {
                shape.other += if recorded { hessian } else { 0 };
                continue;
            };
            if t.converts() {
                shape.weights[s] += t.elements * 4;
            }
            shape.cols[s] = shape.cols[s].max(cols);
            if group == "ffn_mid" && experts == 1 {
                shape.dense_middle = shape.dense_middle.max(cols);
            }
            if recorded {
                if experts > 1 {
                    shape.experts[s] += hessian;
                } else {
                    shape.dense[s] += hessian;
                }
            }
        }
        shape
    }
}

/// The memory held at the peak of one phase: weights, Hessians, factor.
type Phase = (u64, u64, u64);

/// The peak of calibrating one layer of shape `s`, phase by phase as
/// [`run`] holds them: the float statistics pass, AWQ's search of each
/// group (its Hessian also in `f32`), the rescaled copies, and each stage's
/// GPTQ (its new Hessian and factor) or encoding. Hessians and `f32`
/// weights go as soon as nothing reads them again.
fn layer_peak(s: &LayerShape, settings: &Settings) -> Phase {
    let (awq, gptq) = (settings.method.awq(), settings.method.gptq());
    let all_weights: u64 = s.weights.iter().sum();
    let all_experts: u64 = s.experts.iter().sum();
    let moe = all_experts > 0;
    let mut phases: Vec<Phase> = Vec::new();
    // The float pass: every input with AWQ or experts, else only the attention input's.
    let float_dense: u64 = if awq || moe || !gptq {
        s.dense.iter().sum::<u64>() + s.other
    } else {
        s.dense[0]
    };
    let float_experts = if awq || moe || !gptq { all_experts } else { 0 };
    phases.push((all_weights, float_dense + float_experts, 0));
    if awq {
        for g in 0..STAGES.len() {
            // With GPTQ the groups before g are gone (the attention input's stays).
            let dense: u64 = if gptq {
                s.dense[0] * u64::from(g > 0) + s.dense[g..].iter().sum::<u64>()
            } else {
                s.dense.iter().sum()
            };
            let copy = s.cols[g] * s.cols[g] * 4;
            let other = s.other * u64::from(!gptq);
            phases.push((all_weights, dense + all_experts + other, copy));
        }
    }
    let copies = if awq && gptq { 2 } else { 1 };
    for g in 0..STAGES.len() {
        let weights = copies * s.weights[g..].iter().sum::<u64>();
        let later_experts: u64 = s.experts[g..].iter().sum();
        let hessians = if gptq {
            // The stage's own Hessians, and the experts' float ones kept
            // for experts its pass may not reach.
            s.dense[g] + s.experts[g] + later_experts * u64::from(awq || moe)
        } else {
            s.dense[g..].iter().sum::<u64>() + later_experts + s.other
        };
        let factor = if gptq {
            crate::linalg::factor_bytes(s.cols[g] as usize)
        } else {
            0
        };
        phases.push((weights, hessians, factor));
    }
    phases
        .into_iter()
        .max_by_key(|&(w, h, f)| w + h + f)
        .unwrap_or_default()
}

fn estimate_memory(
    plan: &job::Plan,
    c: &memwall_runtime::forward::Config,
    tokens: u64,
    settings: &Settings,
) -> Memory {
    let mut peak: Phase = (0, 0, 0);
    let mut widest = 0u64;
    let mut middle = 0u64;
    let mut heads = 0u64;
    let mut keep = |p: Phase| {
        if p.0 + p.1 + p.2 > peak.0 + peak.1 + peak.2 {
            peak = p;
        }
    };
    for l in 0..c.n_layer {
        let shape = LayerShape::of(plan, c, l);
        widest = widest.max(shape.cols.iter().copied().max().unwrap_or(0));
        middle = middle.max(shape.dense_middle);
        // The attention output's input (`STAGES[1]`): the heads' outputs.
        heads = heads.max(shape.cols[1]);
        keep(layer_peak(&shape, settings));
    }
    // The output head: a slice of its rows, its input's Hessian and factor.
    let e = c.n_embd as u64;
    let head_factor = if settings.method.gptq() {
        crate::linalg::factor_bytes(c.n_embd)
    } else {
        0
    };
    keep((HEAD_ROWS as u64 * e * 4, e * e * 8, head_factor));
    let (weights, hessians, factor) = peak;
    let hidden = tokens * e * 4;
    // A sample's activations through the widest product, and slack.
    let longest = c.n_ctx as u64;
    let buffers = 8 * longest * e.max(widest) * 4 + (64 << 20);
    let total = hidden + weights + hessians + factor + buffers;
    // The heads' outputs beside the attention output while it is kept,
    // then the attention output beside a dense FFN's middle.
    let kept = if settings.method.gptq() {
        tokens * (e + middle.max(heads)) * 4
    } else {
        0
    };
    // Kept results save time, not memory: left out when they would not fit.
    let kept = match settings.memory_limit {
        Some(limit) if total + kept > limit => 0,
        _ => kept,
    };
    Memory {
        hidden,
        weights,
        hessians,
        factor,
        kept,
        total: total + kept,
    }
}

/// What decides the output bytes of a run (compared on `--resume`): the
/// program, the model (size and a hash of its first 64 MiB, where the
/// header and tensor directory are), every calibration token, the settings
/// and the planned tensor types.
fn manifest(
    input: &Path,
    samples: &[Vec<u32>],
    settings: &Settings,
    plan: &job::Plan,
    recipe: Option<&Recipe>,
) -> Result<Manifest, CalibrateError> {
    use sha2::{Digest, Sha256};
    let io = |error| CalibrateError::Io {
        path: input.to_owned(),
        error,
    };
    let f = File::open(input).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    let mut head = Vec::new();
    f.take(64 << 20).read_to_end(&mut head).map_err(io)?;
    let mut tokens = Sha256::new();
    for s in samples {
        tokens.update((s.len() as u64).to_le_bytes());
        for t in s {
            tokens.update(t.to_le_bytes());
        }
    }
    let mut types = Sha256::new();
    for t in &plan.tensors {
        types.update(format!("{} {} {:?}\n", t.name, t.target, t.dims).as_bytes());
    }
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut m = Manifest::new();
    let mut put = |k: &str, v: serde_json::Value| {
        m.insert(k.to_owned(), v);
    };
    put("memwall", env!("CARGO_PKG_VERSION").into());
    put("model_bytes", size.into());
    put("model_head_sha256", hex(&Sha256::digest(&head)).into());
    put("tokens_sha256", hex(&tokens.finalize()).into());
    put("samples", samples.len().into());
    put("dataset_sha256", settings.dataset_sha256.clone().into());
    put("method", settings.method.name().into());
    put("awq_grid", settings.awq_grid.into());
    put("gptq_damp", settings.gptq.damp.into());
    put("plan_sha256", hex(&types.finalize()).into());
    // A fitted recipe is read back from here when its run is continued.
    if let Some(r) = recipe {
        put("recipe", r.to_toml().into());
    }
    Ok(m)
}

/// Calibrates `gguf` (opened as `model`) on `samples` and writes the result
/// to `out` as the quantization `options` describe. `input` names the model
/// file in messages.
#[allow(clippy::too_many_arguments)]
pub fn run(
    gguf: &GgufModel,
    input: &Path,
    model: &mut Model,
    samples: &[Vec<u32>],
    options: &Options,
    settings: &Settings,
    out: &Path,
    progress: &dyn Progress,
) -> Result<Report, CalibrateError> {
    let started_all = Instant::now();
    if samples.is_empty() || samples.iter().all(|s| s.len() < 2) {
        return Err(CalibrateError::Input(
            "the calibration set is empty (build one with `memwall calibrate dataset`)".into(),
        ));
    }
    if options.keep_split {
        return Err(CalibrateError::Input(
            "--keep-split is not supported by calibrated quantization".into(),
        ));
    }
    let job_err = |e: job::JobError| CalibrateError::Input(e.to_string());
    // Types as a plan with an importance matrix gives them.
    // (The entries only need the right names and sizes here.)
    let mut placeholder = Imatrix::default();
    for (_, t) in gguf.tensors() {
        if (t.name.starts_with("blk.") || t.name == "output.weight") && t.dims.len() >= 2 {
            let experts = t.dims.get(2).copied().unwrap_or(1);
            placeholder
                .entries
                .insert(t.name.clone(), vec![1.0; (t.dims[0] * experts) as usize]);
        }
    }
    let mut plan_options = options.clone();
    plan_options.imatrix = Some(ImatrixInput {
        label: settings.dataset.clone(),
        data: placeholder,
    });
    let plan = job::plan(gguf, input, &plan_options).map_err(job_err)?;
    let c = model.config.clone();
    let layer_of = |name: &str| -> Option<usize> {
        name.strip_prefix("blk.")?.split_once('.')?.0.parse().ok()
    };
    // Refuse a model that is already quantized: calibration needs its float weights.
    for t in &plan.tensors {
        if layer_of(&t.name).is_some()
            && t.dims.len() >= 2
            && !matches!(t.source, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        {
            return Err(CalibrateError::Input(format!(
                "{}: tensor {} is already quantized ({}); calibration needs the float model \
                 (convert the checkpoint to F16/BF16 with `memwall convert` and calibrate that)",
                input.display(),
                t.name,
                t.source
            )));
        }
    }
    let total_tokens: u64 = samples.iter().map(|s| s.len() as u64).sum();
    let memory = estimate_memory(&plan, &c, total_tokens, settings);
    if let Some(limit) = settings.memory_limit.filter(|&m| memory.total > m) {
        return Err(CalibrateError::Memory {
            need: memory.clone(),
            limit,
        });
    }
    let manifest = manifest(input, samples, settings, &plan, options.recipe.as_ref())?;
    let sizes: Vec<usize> = samples.iter().map(|s| s.len() * c.n_embd).collect();
    let (mut spill, resumed) = Work::open(out, &manifest, settings.resume, &sizes)?;
    let (first, mut xs, mut norms, mut imatrix_entries, mut report) = match resumed {
        Some(r) => (r.layers, r.xs, r.norms, r.imatrix, r.report),
        None => (
            0,
            samples
                .iter()
                .map(|s| model.embed(s))
                .collect::<Result<_, _>>()?,
            BTreeMap::new(),
            BTreeMap::new(),
            Report::default(),
        ),
    };
    report.resumed_layers = first;
    report.memory = memory;
    progress.start("calibrating", c.n_layer as u64, Unit::Items);
    progress.advance(first as u64);
    for l in first..c.n_layer {
        let started = Instant::now();
        let prefix = format!("blk.{l}.");
        // The layer's matrices that the plan quantizes.
        let mut targets: Vec<Target> = Vec::new();
        for t in plan.tensors.iter().filter(|t| t.name.starts_with(&prefix)) {
            let suffix = &t.name[prefix.len()..];
            if input_group(suffix, c.arch).is_none() || !t.converts() {
                continue;
            }
            let (w, _, dims) = decode_tensor(gguf, &t.name)?;
            let experts = if dims.len() == 3 { dims[2] as usize } else { 1 };
            let cols = dims[0] as usize;
            targets.push(Target {
                name: t.name.clone(),
                ty: t.target,
                rows: w.len() / cols / experts,
                cols,
                experts,
                w,
                scaled: false,
            });
        }
        let find = |targets: &[Target], s: &str| targets.iter().position(|t| t.suffix() == s);
        // 1. Float pass: statistics of every input.
        progress.item(&format!("layer {l}: statistics"));
        let groups = if settings.method.awq() {
            awq_groups(gguf, &prefix, &c, &targets)
        } else {
            Vec::new()
        };
        let mut wanted: HashSet<String> = STAGES.iter().map(|s| s.to_string()).collect();
        for x in 0..c.n_expert {
            wanted.insert(key("ffn_in", Some(x)));
            wanted.insert(key("ffn_mid", Some(x)));
        }
        // With GPTQ, a dense layer needs from this pass only the statistics
        // of the attention input and of the inputs AWQ scores (the stage
        // passes collect the others, on the quantized inputs); experts keep
        // theirs, for those the stage passes miss.
        if settings.method.gptq() && c.n_expert == 0 {
            wanted = groups.iter().map(|g| g.0.to_owned()).collect();
            wanted.insert(STAGES[0].to_owned());
        }
        // A dense layer's pass stops at the input of the last one wanted
        // that a matrix to quantize reads (`ffn_down`'s product and what
        // follows it are not needed).
        let read_by_target = |g: &str| {
            (targets.iter()).any(|t| input_group(t.suffix(), c.arch).is_some_and(|r| r.0 == g))
        };
        let stats_until = STAGES
            .iter()
            .rfind(|g| wanted.contains(**g) && read_by_target(g))
            .filter(|_| c.n_expert == 0)
            .and_then(|g| first_reader(&targets, g, c.arch));
        let mut stats = pass(
            model,
            l,
            &mut xs,
            &mut [],
            wanted,
            false,
            stats_until.as_deref(),
            &mut report,
        )?;
        let mut alphas: HashMap<&'static str, (Option<f32>, Option<f64>)> = HashMap::new();
        // 2. AWQ.
        if settings.method.awq() {
            // With GPTQ, a stage's float Hessian is AWQ's alone (the stage's
            // pass collects its own on quantized inputs): each goes once
            // AWQ has read it; the attention input's is GPTQ's too.
            let awq_only = |k: &str| settings.method.gptq() && k != STAGES[0] && !k.contains('#');
            let read: HashSet<&str> = groups.iter().map(|g| g.0).collect();
            stats.retain(|k, _| !awq_only(k) || read.contains(k.as_str()));
            let mut previous: Option<&str> = None;
            for (input, prev, members) in groups {
                if let Some(p) = previous.replace(input).filter(|p| awq_only(p)) {
                    stats.remove(p);
                }
                let Some(h) = stats.get(input) else { continue };
                let idx: Vec<usize> = members.iter().filter_map(|m| find(&targets, m)).collect();
                if idx.len() != members.len() {
                    // A member kept in float (or of an unexpected shape): leave the group alone.
                    continue;
                }
                // GPTQ places a codebook type's weights itself (points, signs and
                // the block's scale); AWQ's scales, searched under the plain
                // encoder, made those files worse (docs/BENCHMARKS.md).
                if settings.method.gptq()
                    && idx.iter().any(|&i| LATTICE_TYPES.contains(&targets[i].ty))
                {
                    continue;
                }
                // The preceding op must exist and be scalable.
                let prev_is_matrix = prev.ends_with(".weight");
                if prev_is_matrix && find(&targets, prev).is_none() {
                    continue;
                }
                progress.item(&format!("layer {l}: AWQ {input}"));
                let cols = h.n;
                // The products' tiles alone where the width allows (no
                // row-major copy to re-tile for every block of scored rows).
                let (tiles, rows);
                let hf = if cols % ProductTiles::TILE == 0 {
                    tiles = f32_tiles(h);
                    awq::HessianF32::Tiles(tiles.tiles())
                } else {
                    rows = f32_full(h);
                    awq::HessianF32::Rows(&rows)
                };
                let linears: Vec<Linear> = idx
                    .iter()
                    .map(|&i| Linear {
                        name: &targets[i].name,
                        w: &targets[i].w,
                        rows: targets[i].rows,
                        ty: targets[i].ty,
                    })
                    .collect();
                let t_awq = Instant::now();
                let choice = awq::search(
                    &model.kernels(),
                    &linears,
                    cols,
                    hf,
                    &h.mean_abs(),
                    &h.mean_square(),
                    settings.awq_grid,
                )?;
                report.awq_seconds += t_awq.elapsed().as_secs_f64();
                alphas.insert(
                    input,
                    (
                        choice.alpha,
                        Some(choice.error / choice.base_error.max(f64::MIN_POSITIVE)),
                    ),
                );
                if choice.alpha.is_none() {
                    continue;
                }
                let s = &choice.scales;
                for &i in &idx {
                    let t = &mut targets[i];
                    for row in t.w.chunks_exact_mut(cols) {
                        row.iter_mut().zip(s).for_each(|(w, s)| *w *= s);
                    }
                    t.scaled = true;
                }
                if prev_is_matrix {
                    let p = find(&targets, prev).unwrap_or_default();
                    let t = &mut targets[p];
                    let cols_p = t.cols;
                    for (r, row) in t.w.chunks_exact_mut(cols_p).enumerate() {
                        let d = s[r % s.len()];
                        row.iter_mut().for_each(|w| *w /= d);
                    }
                    t.scaled = true;
                } else {
                    for field in ["weight", "bias"] {
                        let name = format!("{prefix}{prev}.{field}");
                        let current = match norms.remove(&name) {
                            Some(v) => Some(v),
                            None => gguf
                                .tensor(&name)
                                .map(|_| decode_tensor(gguf, &name))
                                .transpose()?
                                .map(|v| v.0),
                        };
                        if let Some(mut v) = current {
                            v.iter_mut().zip(s).for_each(|(w, s)| *w /= s);
                            model.replace_norm(&name, v.clone())?;
                            norms.insert(name, v);
                        }
                    }
                }
                if let Some(h) = stats.get_mut(input) {
                    rescale(h, s);
                }
            }
            if let Some(p) = previous.filter(|p| awq_only(p)) {
                stats.remove(p);
            }
            // The scaled float weights, so that GPTQ's stage passes see them
            // (without GPTQ no pass runs before the layer is quantized).
            for t in targets
                .iter()
                .filter(|t| t.scaled && settings.method.gptq())
            {
                let bytes: Vec<u8> = t.w.iter().flat_map(|v| v.to_le_bytes()).collect();
                model.replace_matrix(&t.name, GgmlType::F32, bytes.into())?;
            }
        }
        // 3. Quantize group by group (per sample, what the passes keep).
        let mut kept: Vec<Kept> = Vec::new();
        if report.memory.kept > 0 {
            kept.resize_with(xs.len(), Kept::default);
        }
        for (stage, group) in STAGES.into_iter().enumerate() {
            let members: Vec<usize> = (0..targets.len())
                .filter(|&i| input_group(targets[i].suffix(), c.arch).map(|g| g.0) == Some(group))
                .collect();
            if members.is_empty() {
                continue;
            }
            if settings.method.gptq() && stage > 0 {
                progress.item(&format!("layer {l}: inputs of {group}"));
                let mut wanted: HashSet<String> = HashSet::from([group.to_owned()]);
                for x in 0..c.n_expert {
                    wanted.insert(key(group, Some(x)));
                }
                // The pass can stop at the group's first matrix when all are
                // dense (experts need the whole routed FFN).
                let dense = members.iter().all(|&i| targets[i].experts == 1);
                let stop = first_reader(&targets, group, c.arch).filter(|_| dense);
                // The stages before this one are quantized: what only they
                // compute is final from here on.
                for k in &mut kept {
                    k.heads_final = true;
                    k.attention_final = stage > 1;
                    k.ffn_middle_final = stage > 2;
                }
                // Its float Hessian (if any is left) is replaced: not both at once.
                stats.remove(group);
                for (k, h) in pass(
                    model,
                    l,
                    &mut xs,
                    &mut kept,
                    wanted,
                    false,
                    stop.as_deref(),
                    &mut report,
                )? {
                    stats.insert(k, h);
                }
            }
            let mut dense_damp = None;
            // GPTQ's factor of each input is made once for every matrix that
            // reads it (Q, K and V; gate and up; an expert's gate and up):
            // the dense inputs for the whole group, an expert's while its
            // matrices are quantized.
            let mut factors: HashMap<String, gptq::Prepared> = HashMap::new();
            let mut parts: Vec<Vec<u8>> = vec![Vec::new(); members.len()];
            let t_quant = Instant::now();
            let n_x = members
                .iter()
                .map(|&i| targets[i].experts)
                .max()
                .unwrap_or(1);
            for x in 0..n_x {
                factors.retain(|k, _| !k.contains('#'));
                for (m, &i) in members.iter().enumerate() {
                    let t = &targets[i];
                    if x >= t.experts {
                        continue;
                    }
                    if x == 0 {
                        progress.item(&format!("layer {l}: {}", t.name));
                    }
                    let k = key(group, (t.experts > 1).then_some(x));
                    let expert_rows = t.rows * t.cols;
                    let w = &t.w[x * expert_rows..(x + 1) * expert_rows];
                    let h = stats.get_mut(&k).filter(|h| h.tokens > 0 && h.n == t.cols);
                    let part = match h {
                        None => {
                            // No token reached this expert: plain rounding (GPTQModel's FailSafe).
                            report.unreached_experts += usize::from(t.experts > 1);
                            encode_rows(w, t.cols, t.ty, None, &t.name)?
                        }
                        Some(h) if settings.method.gptq() => {
                            if !factors.contains_key(&k) {
                                let what = format!("{} (input {k})", t.name);
                                let t_factor = Instant::now();
                                factors.insert(k.clone(), gptq::prepare(h, settings.gptq, &what)?);
                                report.factor_seconds += t_factor.elapsed().as_secs_f64();
                            }
                            let prepared = &factors[&k];
                            if t.experts == 1 {
                                dense_damp = Some(prepared.damp);
                            }
                            gptq::quantize(w, t.rows, t.cols, t.ty, prepared, &h.mean_square())?
                        }
                        Some(h) => encode_rows(w, t.cols, t.ty, Some(&h.mean_square()), &t.name)?,
                    };
                    parts[m].extend_from_slice(&part);
                }
            }
            drop(factors);
            report.quantize_seconds += t_quant.elapsed().as_secs_f64();
            for (&i, bytes) in members.iter().zip(parts) {
                let t = &targets[i];
                if let Some(h) = stats.get(&key(group, None)) {
                    if t.experts == 1 {
                        imatrix_entries.insert(t.name.clone(), h.mean_square());
                    }
                }
                spill.put(&t.name, &bytes)?;
                model.replace_matrix(&t.name, t.ty, bytes.into())?;
                report.calibrated += 1;
            }
            let (alpha, ratio) = alphas.get(group).copied().unwrap_or((None, None));
            report.groups.push(GroupReport {
                input: format!("blk.{l}.{group}"),
                alpha,
                awq_error_ratio: ratio,
                damp: dense_damp,
                tokens: stats.get(group).map_or(0, |h| h.tokens),
            });
            // Nothing reads this stage's statistics or float weights again.
            let expert = format!("{group}#");
            stats.retain(|k, _| k != group && !k.starts_with(&expert));
            for &i in &members {
                targets[i].w = Vec::new();
            }
        }
        drop(targets);
        // 4. The quantized layer's output is the next layer's input.
        progress.item(&format!("layer {l}: output"));
        for k in &mut kept {
            k.heads_final = true;
            k.attention_final = true;
            k.ffn_middle_final = true;
        }
        pass(
            model,
            l,
            &mut xs,
            &mut kept,
            HashSet::new(),
            true,
            None,
            &mut report,
        )?;
        drop(kept);
        report.layer_seconds.push(started.elapsed().as_secs_f64());
        // No pass reads this layer again: its replaced matrices go.
        model.drop_replacements(&prefix);
        spill.commit_layer(l, &xs, &norms, &imatrix_entries, &report)?;
        progress.advance(1);
    }
    // 5. An output head of its own (not the embeddings): calibrated on the
    //    final norm of the last layer's output.
    if let Some(t) = plan
        .tensors
        .iter()
        .find(|t| t.name == "output.weight" && t.converts())
    {
        progress.item("output head");
        let (bytes, mean_square) = quantize_head(gguf, model, &xs, t, settings, &mut report)?;
        imatrix_entries.insert(t.name.clone(), mean_square);
        spill.put(&t.name, &bytes)?;
        report.calibrated += 1;
    }
    drop(xs);
    progress.finish();

    // The output file: the plan again, now with the statistics as its imatrix
    // (llama-quantize's quantize.imatrix.* keys), plus memwall.calibration.*.
    let imatrix = Imatrix {
        entries: imatrix_entries,
        datasets: vec![settings.dataset.clone()],
        chunk_count: samples.len() as u32,
        chunk_size: samples.iter().map(Vec::len).max().unwrap_or(0) as u32,
        legacy: false,
    };
    plan_options.imatrix = Some(ImatrixInput {
        label: settings.dataset.clone(),
        data: imatrix,
    });
    let final_plan = job::plan(gguf, input, &plan_options).map_err(job_err)?;
    let mut meta = final_plan
        .metadata
        .first()
        .cloned()
        .ok_or_else(|| CalibrateError::Input("the plan has no output file".into()))?;
    let set = |meta: &mut memwall_format::gguf::Metadata, k: &str, v: Value| {
        meta.set(format!("memwall.calibration.{k}"), v);
    };
    set(&mut meta, "method", settings.method.name().into());
    set(&mut meta, "dataset", settings.dataset.clone().into());
    set(
        &mut meta,
        "dataset_sha256",
        settings.dataset_sha256.clone().into(),
    );
    set(&mut meta, "samples", Value::U32(samples.len() as u32));
    set(&mut meta, "tokens", Value::U64(total_tokens));
    if settings.method.gptq() {
        set(
            &mut meta,
            "gptq_damp",
            Value::F32(settings.gptq.damp as f32),
        );
    }
    if settings.method.awq() {
        set(&mut meta, "awq_grid", Value::U32(settings.awq_grid as u32));
    }
    set(&mut meta, "version", env!("CARGO_PKG_VERSION").into());
    let specs: Vec<TensorSpec> = final_plan
        .tensors
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            dims: job::stored_dims(&t.dims),
            ty: t.target,
        })
        .collect();
    let mut w = GgufWriter::create(out, 3, meta, specs)?;
    progress.start("writing", final_plan.tensors.len() as u64, Unit::Items);
    for t in &final_plan.tensors {
        progress.item(&t.name);
        if let Some(bytes) = spill.get(&t.name)? {
            w.write_tensor(&t.name, &bytes)?;
        } else if let Some(v) = norms.get(&t.name) {
            let bytes = encode_rows(v, v.len(), t.target, None, &t.name)?;
            w.write_tensor(&t.name, &bytes)?;
            report.plain += 1;
        } else if !t.converts() {
            let (_, data) = gguf
                .tensor(&t.name)
                .ok_or_else(|| CalibrateError::Input(format!("tensor {} is missing", t.name)))?;
            w.write_tensor(&t.name, data)?;
            report.plain += 1;
        } else {
            let (v, _, dims) = decode_tensor(gguf, &t.name)?;
            let bytes = encode_rows(&v, dims[0] as usize, t.target, None, &t.name)?;
            w.write_tensor(&t.name, &bytes)?;
            report.plain += 1;
        }
        progress.advance(1);
    }
    w.commit()?;
    spill.finish();
    progress.finish();
    report.bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    report.seconds = started_all.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hessians_tiles_hold_its_full_matrix() {
        let n = 96;
        let mut h = Hessian::new(n);
        let x = crate::test_values(n * 40, 11);
        h.add(&Kernels::detect(), None, &x, 40);
        let mut want = ProductTiles::default();
        want.pack(&f32_full(&h), n, n);
        let got = f32_tiles(&h);
        let bits = |t: &[f32]| t.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(got.tiles()), bits(want.tiles()));
    }
}
