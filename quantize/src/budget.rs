//! Fitting a byte budget: what quantizing each weight matrix to each candidate
//! type costs, and the choice of one type per matrix that keeps the predicted
//! loss smallest within the budget.
//!
//! The cost of a matrix `W` at type `t` is measured on its own weights: every
//! row is encoded as `llama-quantize` would (with the importance matrix when
//! there is one), decoded, and the error `ΔW` weighted per input column. For
//! a block's output projection with an [`Influence`] (collected on text by
//! memwall-calibrate) the weights are `b_j = mean_t x_tj² / ms(r_t)` and
//! `E = Σ_ij b_j ΔW_ij²` is the noise the matrix adds to the residual stream
//! `r` per token, as a fraction of the stream's power — what later layers see
//! through their normalisations, comparable between layers. Every other
//! matrix (inside a block, stacked experts, the embeddings, the output head)
//! is weighted by the importance matrix's mean squared activations `a_j`
//! (1 without an entry) and its error taken relative to its own weighted
//! output, `Σ_ij a_j ΔW_ij² / Σ_ij a_j W_ij²`. Small independent
//! perturbations add up in the KL divergence to second order, so the loss of
//! a whole file is predicted as `Σ_m gain(group of m) · E_m(t_m)`; the gains
//! (how much KL divergence a unit of error of one role — `attn_q`,
//! `ffn_down`, `output`… — makes) come from measuring a few probe files
//! (memwall-calibrate's `fit`).
//!
//! [`allocate`] solves the multiple-choice knapsack greedily on each matrix's
//! lower convex hull of (bytes, predicted loss): start every matrix at its
//! smallest type and take the upgrades that buy the most loss per byte while
//! they fit. The result is within one upgrade's loss of the optimum.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use memwall_format::GgmlType;
use memwall_format::blocks::dequantize_row;
use memwall_format::ggml_type::{FILE_TYPES, FileTypeInfo, file_type_by_name};
use memwall_format::gguf::GgufModel;
use memwall_format::progress::{Progress, Unit};
use rayon::prelude::*;

use crate::imatrix::Imatrix;
use crate::job::{self, ImatrixUse, JobError, Options};
use crate::recipe::{Recipe, make_override};
use crate::rules::{Override, fallback_for};
use crate::{IMATRIX_REQUIRED, quantize_row_imatrix};

/// Why a budget cannot be fitted.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// Planning or reading the model failed.
    #[error(transparent)]
    Job(#[from] JobError),
    /// No candidate type can encode a matrix.
    #[error(
        "{tensor}: no candidate type encodes it (rows of {row} weights; the candidates are {candidates}); add a type whose block divides {row}, such as Q8_0 or Q4_0"
    )]
    NoCandidate {
        /// The matrix.
        tensor: String,
        /// Its row length.
        row: u64,
        /// The candidates, by name.
        candidates: String,
    },
    /// The budget is below the smallest file the candidates make.
    #[error(
        "a budget of {budget} bytes is below the smallest file the candidate types make ({smallest} bytes); raise the budget or add a smaller type"
    )]
    TooSmall {
        /// The budget.
        budget: u64,
        /// Every matrix at its smallest candidate, plus what is not fitted.
        smallest: u64,
    },
}

/// One type a matrix can take: its size and its error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The type.
    pub ty: GgmlType,
    /// Bytes of the matrix at this type.
    pub bytes: u64,
    /// Weighted squared error, by the matrix's influence or relative to its
    /// output (see the module's documentation).
    pub error: f64,
}

/// A weight matrix to fit and its candidates, smallest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// Tensor name.
    pub name: String,
    /// Its role: the name without `blk.N.` (`attn_q.weight`, `output.weight`).
    pub group: String,
    /// Its block, if it has one.
    pub layer: Option<u32>,
    /// Weights.
    pub elements: u64,
    /// Candidate types, by increasing size.
    pub options: Vec<Candidate>,
}

impl Matrix {
    /// The option of type `ty`, or of the llama.cpp fallback that stands in
    /// for it where its block does not divide the rows.
    pub fn option_of(&self, ty: GgmlType) -> Option<usize> {
        let at = |t: GgmlType| self.options.iter().position(|o| o.ty == t);
        at(ty).or_else(|| fallback_for(ty).and_then(at))
    }
}

/// The model's matrices with their candidates, and the bytes of everything
/// else in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Sensitivity {
    /// The matrices.
    pub matrices: Vec<Matrix>,
    /// Header, metadata (with room for the recipe), the tensors that are not
    /// fitted (norms, routers, whatever llama.cpp's rules never quantize) and
    /// the most padding the matrices can need.
    pub other_bytes: u64,
}

/// Room left for the recipe memwall records in the output's metadata.
const RECIPE_ROOM: u64 = 16 << 10;

/// The role and block of a tensor name: `blk.7.ffn_down.weight` → (`ffn_down.weight`, 7).
pub fn group_of(name: &str) -> (String, Option<u32>) {
    if let Some(rest) = name.strip_prefix("blk.")
        && let Some((n, role)) = rest.split_once('.')
        && let Ok(layer) = n.parse()
    {
        return (role.to_owned(), Some(layer));
    }
    (name.to_owned(), None)
}

/// Per output projection (by tensor name), the weight of each input column in
/// its error: `Σ_ij b_j ΔW_ij²`. memwall-calibrate's `influence` collects
/// `b_j = mean_t x_tj² / ms(r_t)`, the noise a column adds to the residual
/// stream `r` relative to the stream's power.
pub type Influence = HashMap<String, Vec<f32>>;

/// The matrices llama.cpp's Q8_0 rules quantize, the types each can take,
/// and the bytes of the rest of the file.
struct Layout {
    plan: job::Plan,
    /// Index into the plan's tensors and the usable types, smallest first.
    fitted: Vec<(usize, Vec<GgmlType>)>,
    other_bytes: u64,
}

/// Plans the file and lists each matrix's usable candidates: where a
/// candidate's block does not divide a matrix's rows, its llama.cpp fallback
/// (Q4_K → Q5_0, …) stands in; the types that need an importance matrix
/// only where the matrix has an entry.
fn layout(
    model: &GgufModel,
    input: &Path,
    imatrix: Option<&Imatrix>,
    candidates: &[GgmlType],
) -> Result<Layout, BudgetError> {
    let plan = job::plan(model, input, &q8_options(imatrix))?;
    let mut candidates = candidates.to_vec();
    candidates.sort_by_key(|t| bits(*t));
    candidates.dedup();
    let file: u64 = plan.file_sizes()?.iter().sum();
    let mut fitted = Vec::new();
    let mut fitted_bytes = 0;
    for (i, t) in plan.tensors.iter().enumerate() {
        if !t.target.is_quantized() {
            continue;
        }
        fitted_bytes += t.target_bytes;
        let row = t.dims.first().copied().unwrap_or(1).max(1);
        let weighted = column_weights(t, imatrix).is_some();
        let mut usable: Vec<GgmlType> = candidates
            .iter()
            .filter_map(|&ty| {
                if row % ty.block_size() == 0 {
                    Some(ty)
                } else {
                    fallback_for(ty).filter(|f| row % f.block_size() == 0)
                }
            })
            .filter(|ty| weighted || !IMATRIX_REQUIRED.contains(ty))
            .collect();
        usable.sort_by_key(|t| bits(*t));
        usable.dedup();
        if usable.is_empty() {
            return Err(BudgetError::NoCandidate {
                tensor: t.name.clone(),
                row,
                candidates: candidates
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        fitted.push((i, usable));
    }
    let other_bytes = file - fitted_bytes + fitted.len() as u64 * plan.alignment + RECIPE_ROOM;
    Ok(Layout {
        plan,
        fitted,
        other_bytes,
    })
}

/// The importance-matrix entry the encoders of tensor `t` use.
fn column_weights<'m>(t: &job::TensorPlan, imatrix: Option<&'m Imatrix>) -> Option<&'m [f32]> {
    match (t.imatrix, imatrix) {
        (ImatrixUse::Used, Some(m)) => m.entries.get(&t.source_name).map(Vec::as_slice),
        _ => None,
    }
}

/// The smallest file the candidate types make of `model`, without
/// measuring anything (what a budget must hold at least).
pub fn smallest_file(
    model: &GgufModel,
    input: &Path,
    imatrix: Option<&Imatrix>,
    candidates: &[GgmlType],
) -> Result<u64, BudgetError> {
    let layout = layout(model, input, imatrix, candidates)?;
    let matrices: u64 = layout
        .fitted
        .iter()
        .map(|(i, usable)| {
            let dims = &layout.plan.tensors[*i].dims;
            usable
                .iter()
                .map(|&ty| bytes_at(ty, dims))
                .min()
                .unwrap_or(0)
        })
        .sum();
    Ok(matrices + layout.other_bytes)
}

/// Measures every matrix of `model` at every candidate type: the encoders
/// use `imatrix` as llama-quantize would; the error is weighted by the
/// matrix's `influence` where it has one, else taken relative to the
/// matrix's own output (see [`Candidate::error`]). The matrices are the
/// tensors llama.cpp's Q8_0 rules would quantize.
pub fn measure(
    model: &GgufModel,
    input: &Path,
    imatrix: Option<&Imatrix>,
    influence: Option<&Influence>,
    candidates: &[GgmlType],
    progress: &dyn Progress,
) -> Result<Sensitivity, BudgetError> {
    let layout = layout(model, input, imatrix, candidates)?;
    let tensors = &layout.plan.tensors;
    progress.start(
        "measuring",
        layout
            .fitted
            .iter()
            .map(|(i, _)| tensors[*i].source_bytes)
            .sum(),
        Unit::Bytes,
    );
    let mut matrices = Vec::with_capacity(layout.fitted.len());
    for (i, usable) in &layout.fitted {
        let t = &tensors[*i];
        progress.item(&t.name);
        let Some((_, data)) = model.tensor(&t.source_name) else {
            return Err(JobError::Tensor {
                tensor: t.name.clone(),
                message: "vanished from the input".into(),
            }
            .into());
        };
        let weights = column_weights(t, imatrix);
        let ne0 = t.dims.first().copied().unwrap_or(1).max(1) as usize;
        let influence = influence
            .and_then(|b| b.get(&t.name))
            .filter(|b| b.len() == ne0)
            .map(Vec::as_slice);
        let errors = errors(t, data, weights, influence, usable)?;
        model.release(&t.source_name, 0..t.source_bytes);
        progress.advance(t.source_bytes);
        let (group, layer) = group_of(&t.name);
        let options = usable
            .iter()
            .zip(errors)
            .map(|(&ty, error)| Candidate {
                ty,
                bytes: bytes_at(ty, &t.dims),
                error,
            })
            .collect();
        matrices.push(Matrix {
            name: t.name.clone(),
            group,
            layer,
            elements: t.elements,
            options,
        });
    }
    progress.finish();
    Ok(Sensitivity {
        matrices,
        other_bytes: layout.other_bytes,
    })
}

/// llama.cpp's Q8_0 rules with `imatrix`: the options that list the matrices
/// to fit, and the base of every probe file (whose matrices get
/// [`exact_rule`]s).
pub fn q8_options(imatrix: Option<&Imatrix>) -> Options {
    #[expect(clippy::expect_used, reason = "Q8_0 is in the file-type table")]
    let mut options = Options::new(file_type_by_name("Q8_0").expect("Q8_0 is a file type"));
    options.imatrix = imatrix.map(|m| job::ImatrixInput {
        label: String::new(),
        data: m.clone(),
    });
    options
}

/// A rule giving exactly the tensor `name` the type `ty`.
pub fn exact_rule(name: &str, ty: GgmlType) -> Override {
    rule(&format!("^{}$", regex::escape(name)), ty, Vec::new())
}

/// A recipe rule on a pattern built from escaped names.
fn rule(pattern: &str, ty: GgmlType, layers: Vec<(u32, u32)>) -> Override {
    #[expect(clippy::expect_used, reason = "escaped names in a fixed pattern")]
    make_override(pattern, ty, layers, true).expect("escaped names make valid patterns")
}

/// Bytes of `matrices` at their smallest options.
fn smallest(matrices: &[Matrix]) -> u64 {
    matrices
        .iter()
        .map(|m| m.options.iter().map(|o| o.bytes).min().unwrap_or(0))
        .sum()
}

/// Bytes of a tensor of shape `dims` at `ty` (the most there is when the
/// shape cannot take it, so that it is never chosen).
fn bytes_at(ty: GgmlType, dims: &[u64]) -> u64 {
    ty.tensor_size(dims).map(|s| s.bytes).unwrap_or(u64::MAX)
}

/// Bits per weight of a type, for ordering.
fn bits(ty: GgmlType) -> u64 {
    ty.type_size() * 8 * 1024 / ty.block_size()
}

/// The squared error of `data` (tensor `t`) at each of `types` (encoded with
/// the importance `weights`): weighted by `influence` when given
/// (`Σ_ij b_j ΔW_ij²`), else by `weights` and relative to the matrix's
/// weighted signal (`Σ a_j ΔW_ij² / Σ a_j W_ij²`, a noise-to-signal ratio).
fn errors(
    t: &job::TensorPlan,
    data: &[u8],
    weights: Option<&[f32]>,
    influence: Option<&[f32]>,
    types: &[GgmlType],
) -> Result<Vec<f64>, BudgetError> {
    let ne0 = t.dims.first().copied().unwrap_or(1).max(1) as usize;
    let rows_per_expert = t.dims.get(1).copied().unwrap_or(1).max(1) as usize;
    let src_row = t
        .source
        .tensor_size(&[ne0 as u64])
        .map(|s| s.bytes)
        .unwrap_or(0) as usize;
    let fail = |message: String| {
        BudgetError::Job(JobError::Tensor {
            tensor: t.name.clone(),
            message,
        })
    };
    if src_row == 0 || data.len() % src_row != 0 {
        return Err(fail(format!("{} bytes are not whole rows", data.len())));
    }
    let per_row = data
        .par_chunks(src_row)
        .enumerate()
        .map_init(
            || (vec![0f32; ne0], vec![0f32; ne0], Vec::new()),
            |(x, y, q), (r, row)| -> Result<Vec<f64>, BudgetError> {
                dequantize_row(t.source, row, x).map_err(|e| fail(e.to_string()))?;
                let a = weights.map(|m| {
                    let e = r / rows_per_expert;
                    &m[e * ne0..(e + 1) * ne0]
                });
                // The error's weights: the influence, else the importance.
                let weight = |j: usize| match influence {
                    Some(b) => b[j] as f64,
                    None => a.map_or(1.0, |a| a[j] as f64),
                };
                let signal: f64 = x
                    .iter()
                    .enumerate()
                    .map(|(j, &w)| weight(j) * (w as f64) * (w as f64))
                    .sum();
                types
                    .iter()
                    .map(|&ty| {
                        let bytes = ty.tensor_size(&[ne0 as u64]).map(|s| s.bytes).unwrap_or(0);
                        q.resize(bytes as usize, 0u8);
                        quantize_row_imatrix(ty, x, q, a).map_err(|e| fail(e.to_string()))?;
                        dequantize_row(ty, q, y).map_err(|e| fail(e.to_string()))?;
                        let e: f64 = x
                            .iter()
                            .zip(y.iter())
                            .enumerate()
                            .map(|(j, (&w, &v))| {
                                let d = (v - w) as f64;
                                weight(j) * d * d
                            })
                            .sum();
                        Ok(e)
                    })
                    .chain(std::iter::once(Ok(signal)))
                    .collect()
            },
        )
        .collect::<Result<Vec<Vec<f64>>, BudgetError>>()?;
    // Per type the error, then the signal `Σ a_j w_ij²` the error is relative to.
    let mut total = vec![0f64; types.len() + 1];
    for row in per_row {
        for (t, e) in total.iter_mut().zip(row) {
            *t += e;
        }
    }
    let signal = total.pop().unwrap_or(0.0);
    if influence.is_none() && signal > 0.0 {
        for e in &mut total {
            *e /= signal;
        }
    }
    Ok(total)
}

/// One type per matrix (indices into [`Matrix::options`]), its size and its
/// predicted loss.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// The option chosen for each matrix.
    pub chosen: Vec<usize>,
    /// Bytes of the matrices at their types.
    pub bytes: u64,
    /// `Σ gain · error` of the chosen options.
    pub predicted: f64,
}

/// Chooses a type for every matrix so that their bytes stay within `budget`
/// and `Σ gain(m) · error` is as small as the greedy convex-hull solution
/// makes it. `gains[i]` weighs matrix `i`'s error.
pub fn allocate(
    matrices: &[Matrix],
    gains: &[f64],
    budget: u64,
) -> Result<Assignment, BudgetError> {
    let cost = |i: usize, o: usize| gains[i] * matrices[i].options[o].error;
    let smallest = smallest(matrices);
    if smallest > budget {
        return Err(BudgetError::TooSmall { budget, smallest });
    }
    // Each matrix's lower convex hull over (bytes, cost), from its smallest option.
    let mut upgrades = Vec::new();
    let mut chosen = Vec::with_capacity(matrices.len());
    for (i, m) in matrices.iter().enumerate() {
        let mut order: Vec<usize> = (0..m.options.len()).collect();
        order.sort_by(|&a, &b| {
            m.options[a]
                .bytes
                .cmp(&m.options[b].bytes)
                .then(cost(i, a).total_cmp(&cost(i, b)))
        });
        let mut hull: Vec<usize> = Vec::new();
        for o in order {
            // Only options that lower the cost can be worth their bytes.
            if hull.last().is_some_and(|&h| cost(i, o) >= cost(i, h)) {
                continue;
            }
            while hull.len() >= 2 {
                let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
                let slope = |p: usize, q: usize| {
                    (cost(i, q) - cost(i, p))
                        / (m.options[q].bytes as f64 - m.options[p].bytes as f64)
                };
                // b is above the chord a–o: drop it.
                if slope(a, o) <= slope(a, b) {
                    hull.pop();
                } else {
                    break;
                }
            }
            hull.push(o);
        }
        chosen.push(hull[0]);
        for (step, pair) in hull.windows(2).enumerate() {
            let (from, to) = (pair[0], pair[1]);
            let bytes = m.options[to].bytes - m.options[from].bytes;
            let gain = cost(i, from) - cost(i, to);
            upgrades.push((gain / bytes.max(1) as f64, i, step, to, bytes));
        }
    }
    // Most loss saved per byte first; a matrix's steps in order.
    upgrades.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut used = smallest;
    let mut next_step = vec![0usize; matrices.len()];
    let mut blocked = vec![false; matrices.len()];
    for (_, i, step, to, bytes) in upgrades {
        if blocked[i] || step != next_step[i] {
            continue;
        }
        if used + bytes > budget {
            blocked[i] = true;
            continue;
        }
        used += bytes;
        chosen[i] = to;
        next_step[i] += 1;
    }
    let predicted = chosen.iter().enumerate().map(|(i, &o)| cost(i, o)).sum();
    Ok(Assignment {
        chosen,
        bytes: used,
        predicted,
    })
}

/// The file type named after the type holding most of the assignment's bytes
/// (`general.file_type` of the output; every matrix has its own rule).
fn base_type(matrices: &[Matrix], assignment: &Assignment) -> &'static FileTypeInfo {
    let mut bytes: BTreeMap<&str, u64> = BTreeMap::new();
    for (m, &o) in matrices.iter().zip(&assignment.chosen) {
        *bytes.entry(m.options[o].ty.name()).or_default() += m.options[o].bytes;
    }
    let main = bytes
        .iter()
        .max_by_key(|(_, b)| **b)
        .map_or("q8_0", |(t, _)| *t);
    let name = match main {
        "q2_K" => "Q2_K",
        "q3_K" => "Q3_K_M",
        "q4_K" => "Q4_K_M",
        "q5_K" => "Q5_K_M",
        "q6_K" => "Q6_K",
        other => other,
    };
    file_type_by_name(&name.to_ascii_uppercase())
        .or_else(|| file_type_by_name("Q8_0"))
        .unwrap_or(&FILE_TYPES[0])
}

/// The assignment as a recipe: one rule per role and type, limited to the
/// layers that take it (tensors outside blocks by exact name).
pub fn recipe(
    name: &str,
    description: &str,
    matrices: &[Matrix],
    assignment: &Assignment,
) -> Recipe {
    // (role, type, layers), in the order the roles first appear.
    let mut rules: Vec<(&str, GgmlType, Vec<u32>)> = Vec::new();
    for (m, &o) in matrices.iter().zip(&assignment.chosen) {
        let ty = m.options[o].ty;
        let at = match rules.iter().position(|r| r.0 == m.group && r.1 == ty) {
            Some(at) => at,
            None => {
                rules.push((&m.group, ty, Vec::new()));
                rules.len() - 1
            }
        };
        rules[at].2.extend(m.layer);
    }
    let overrides = rules
        .into_iter()
        .map(|(group, ty, layers)| {
            if layers.is_empty() {
                exact_rule(group, ty)
            } else {
                let pattern = format!(r"^blk\.\d+\.{}$", regex::escape(group));
                rule(&pattern, ty, ranges(&layers))
            }
        })
        .collect();
    Recipe {
        name: name.to_owned(),
        description: description.to_owned(),
        base: base_type(matrices, assignment),
        output: None,
        token_embedding: None,
        rules: overrides,
    }
}

/// Sorted layer numbers as inclusive ranges.
fn ranges(layers: &[u32]) -> Vec<(u32, u32)> {
    let mut sorted = layers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<(u32, u32)> = Vec::new();
    for l in sorted {
        match out.last_mut() {
            Some((_, end)) if *end + 1 == l => *end = l,
            _ => out.push((l, l)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(i: usize, options: &[(u64, f64)]) -> Matrix {
        let types = [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ];
        Matrix {
            name: format!("blk.{i}.ffn_up.weight"),
            group: "ffn_up.weight".into(),
            layer: Some(i as u32),
            elements: 256,
            options: options
                .iter()
                .zip(types)
                .map(|(&(bytes, error), ty)| Candidate { ty, bytes, error })
                .collect(),
        }
    }

    /// The best total over every combination that fits (small cases only).
    fn brute_force(matrices: &[Matrix], gains: &[f64], budget: u64) -> f64 {
        let mut best = f64::INFINITY;
        let n: usize = matrices.iter().map(|m| m.options.len()).product();
        for mut code in 0..n {
            let (mut bytes, mut cost) = (0, 0.0);
            for (i, m) in matrices.iter().enumerate() {
                let o = code % m.options.len();
                code /= m.options.len();
                bytes += m.options[o].bytes;
                cost += gains[i] * m.options[o].error;
            }
            if bytes <= budget {
                best = best.min(cost);
            }
        }
        best
    }

    #[test]
    fn the_allocation_fits_and_is_within_one_upgrade_of_the_optimum() {
        let mut state = 11u64;
        let mut next = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) as f64 / (1u64 << 31) as f64
        };
        for case in 0..200 {
            let matrices: Vec<Matrix> = (0..5)
                .map(|i| {
                    let scale = 0.1 + next() * 10.0;
                    let size = 50 + (next() * 100.0) as u64;
                    // Errors fall roughly fourfold per added bit, with noise.
                    let options: Vec<(u64, f64)> = (0..4)
                        .map(|b| {
                            let bytes = size * (2 + b as u64);
                            (bytes, scale * 0.25f64.powi(b) * (0.7 + 0.6 * next()))
                        })
                        .collect();
                    matrix(i, &options)
                })
                .collect();
            let gains: Vec<f64> = (0..5).map(|_| 0.5 + next()).collect();
            let smallest: u64 = matrices.iter().map(|m| m.options[0].bytes).sum();
            let largest: u64 = matrices.iter().map(|m| m.options[3].bytes).sum();
            let budget = smallest + ((largest - smallest) as f64 * next()) as u64;
            let got = allocate(&matrices, &gains, budget).unwrap();
            assert!(got.bytes <= budget, "case {case}: {} > {budget}", got.bytes);
            let bytes: u64 = got
                .chosen
                .iter()
                .enumerate()
                .map(|(i, &o)| matrices[i].options[o].bytes)
                .sum();
            assert_eq!(bytes, got.bytes);
            let best = brute_force(&matrices, &gains, budget);
            let step = matrices
                .iter()
                .enumerate()
                .map(|(i, m)| gains[i] * m.options[0].error)
                .fold(0.0, f64::max);
            assert!(got.predicted >= best - 1e-12, "case {case}");
            assert!(
                got.predicted <= best + step,
                "case {case}: {} against the optimum {best}",
                got.predicted
            );
        }
    }

    #[test]
    fn a_budget_below_the_smallest_file_is_refused_with_the_smallest_size() {
        let m = [matrix(0, &[(100, 1.0), (200, 0.5)])];
        let err = allocate(&m, &[1.0], 99).unwrap_err();
        assert!(
            matches!(err, BudgetError::TooSmall { smallest: 100, .. }),
            "{err}"
        );
        // Exactly the smallest fits, and a budget for everything takes the best.
        assert_eq!(allocate(&m, &[1.0], 100).unwrap().chosen, [0]);
        assert_eq!(allocate(&m, &[1.0], 1000).unwrap().chosen, [1]);
    }

    #[test]
    fn an_option_that_costs_more_bytes_and_loses_more_is_never_chosen() {
        let m = [matrix(0, &[(100, 1.0), (150, 2.0), (200, 0.5)])];
        assert_eq!(allocate(&m, &[1.0], 180).unwrap().chosen, [0]);
        assert_eq!(allocate(&m, &[1.0], 200).unwrap().chosen, [2]);
    }

    #[test]
    fn the_recipe_names_each_role_and_type_with_its_layers() {
        let options = [(100, 1.0), (150, 0.5), (200, 0.25), (300, 0.1)];
        let mut matrices: Vec<Matrix> = (0..6).map(|i| matrix(i, &options)).collect();
        matrices.push(Matrix {
            name: "output.weight".into(),
            group: "output.weight".into(),
            layer: None,
            ..matrix(0, &options)
        });
        let assignment = Assignment {
            chosen: vec![2, 2, 0, 2, 3, 3, 3],
            bytes: 0,
            predicted: 0.0,
        };
        let r = recipe("fit", "test", &matrices, &assignment);
        let text = r.to_toml();
        let parsed = Recipe::parse(&text).unwrap();
        assert_eq!(parsed.to_toml(), text);
        let rule_for = |name: &str| r.rules.iter().find(|o| o.matches(name)).map(|o| o.ty);
        for (m, &o) in matrices.iter().zip(&assignment.chosen) {
            assert_eq!(rule_for(&m.name), Some(m.options[o].ty), "{}", m.name);
        }
        assert!(text.contains("layers = \"0-1, 3\""), "{text}");
        assert_eq!(
            group_of("blk.12.attn_q.weight"),
            ("attn_q.weight".into(), Some(12))
        );
        assert_eq!(group_of("output.weight"), ("output.weight".into(), None));
    }
}
