//! The gains that turn measured matrix errors into a predicted KL divergence
//! (see `memwall_quantize::budget`), from probe files.
//!
//! A reference probe puts every matrix at its largest candidate type; each
//! group's probe puts that group's matrices (every `attn_q`, every
//! `ffn_down`, the output head…) at the probe type and leaves the rest as in
//! the reference. The group's gain is the KL divergence its probe adds over
//! the reference's, per unit of the error its matrices add:
//! `(KLD_g − KLD_ref) / Σ_{m∈g} (E_m(probe) − E_m(largest))`. One forward pass
//! over the probe text per group, however many candidate types there are.

use std::path::Path;
use std::sync::Arc;

use memwall_format::GgmlType;
use memwall_format::cleanup::ScratchFile;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::{Progress, Silent};
use memwall_quantize::budget::{self, Assignment, BudgetError, Matrix, Sensitivity};
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::job::{self, JobError, Options};
use memwall_quantize::recipe::Recipe;
use memwall_runtime::eval::{self, Baseline, EvalError};
use memwall_runtime::forward::{ForwardError, Model};
use memwall_runtime::kernels::Kernels;

use crate::influence;

/// Why a budget could not be fitted.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    /// The budget does not hold the file at the smallest candidate types.
    #[error(
        "a budget of {:.2} MiB is below the smallest file these types make ({:.2} MiB); raise the budget or add a smaller type",
        mib(*budget),
        mib(*smallest)
    )]
    TooSmall {
        /// The budget.
        budget: u64,
        /// The whole file with every matrix at its smallest candidate.
        smallest: u64,
    },
    /// Measuring or allocating failed.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// Writing a probe file failed.
    #[error(transparent)]
    Job(#[from] JobError),
    /// A probe could not be opened.
    #[error(transparent)]
    Gguf(#[from] memwall_format::gguf::GgufError),
    /// A probe could not be run.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// A probe could not be evaluated.
    #[error(transparent)]
    Eval(#[from] EvalError),
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The candidate types when none are named: llama.cpp's K-quants and Q8_0
/// (rows they do not divide take llama.cpp's fallbacks).
pub const DEFAULT_CANDIDATES: [GgmlType; 6] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
];

/// The probe type when none is named.
pub const DEFAULT_PROBE: GgmlType = GgmlType::Q3_K;

/// What to fit.
#[derive(Clone, Debug)]
pub struct Target {
    /// The types a matrix may take.
    pub candidates: Vec<GgmlType>,
    /// The type the group probes put their matrices at.
    pub probe: GgmlType,
    /// The largest file, in bytes.
    pub budget: u64,
}

/// A fitted budget: the measured matrices, the gains and the choice.
#[derive(Clone, Debug)]
pub struct Fitted {
    /// Every matrix at every candidate type.
    pub sensitivity: Sensitivity,
    /// The roles' gains.
    pub gains: Gains,
    /// The chosen type of each matrix.
    pub assignment: Assignment,
    /// Seconds spent measuring the matrices.
    pub measure_seconds: f64,
}

impl Fitted {
    /// The predicted KL divergence of the chosen file.
    pub fn predicted_kld(&self) -> f64 {
        self.gains.predict(self.assignment.predicted)
    }

    /// The choice as a recipe.
    pub fn recipe(&self, name: &str, description: &str) -> Recipe {
        budget::recipe(
            name,
            description,
            &self.sensitivity.matrices,
            &self.assignment,
        )
    }

    /// Bytes of the whole file (at most: the padding and recipe room are counted in full).
    pub fn bytes(&self) -> u64 {
        self.assignment.bytes + self.sensitivity.other_bytes
    }

    /// What each role got: its types with their counts, bytes and share of
    /// the (added-up) predicted divergence, in the order the roles appear.
    pub fn roles(&self) -> Vec<RoleShare> {
        let (s, a) = (&self.sensitivity, &self.assignment);
        let mut out: Vec<RoleShare> = Vec::new();
        for (m, &o) in s.matrices.iter().zip(&a.chosen) {
            let c = m.options[o];
            let at = match out.iter().position(|r| r.group == m.group) {
                Some(at) => at,
                None => {
                    out.push(RoleShare {
                        group: m.group.clone(),
                        types: Vec::new(),
                        bytes: 0,
                        predicted: 0.0,
                    });
                    out.len() - 1
                }
            };
            let r = &mut out[at];
            match r.types.iter_mut().find(|(t, _)| *t == c.ty) {
                Some((_, n)) => *n += 1,
                None => r.types.push((c.ty, 1)),
            }
            r.bytes += c.bytes;
            r.predicted += self.gains.gain(&m.group) * c.error;
        }
        out
    }
}

/// One role's share of a fit.
#[derive(Clone, Debug, PartialEq)]
pub struct RoleShare {
    /// The role (`ffn_down.weight`).
    pub group: String,
    /// The types its matrices took, with how many took each.
    pub types: Vec<(GgmlType, usize)>,
    /// Its bytes.
    pub bytes: u64,
    /// Its part of the added-up predicted divergence.
    pub predicted: f64,
}

/// The probe text and how to run it.
pub struct Probing<'a> {
    /// The text's tokens (BOS first when the vocabulary adds one).
    pub tokens: &'a [u32],
    /// Its windows.
    pub options: &'a eval::Options,
    /// Kernels and threads.
    pub compute: (Kernels, usize),
    /// Folder for the probe files and the base's log-probabilities.
    pub scratch: &'a Path,
}

/// Fits `target.budget` for `model` (opened from `input`): refuses a budget
/// below the smallest file before anything runs, evaluates the base on the
/// probe text (collecting the output projections' [`influence`](crate::influence) on
/// the way), measures every matrix at every candidate, measures the gains
/// and allocates.
pub fn fit(
    model: &GgufModel,
    input: &Path,
    imatrix: Option<&Imatrix>,
    probing: &Probing<'_>,
    target: &Target,
    progress: &dyn Progress,
) -> Result<Fitted, FitError> {
    let smallest = budget::smallest_file(model, input, imatrix, &target.candidates)?;
    if smallest > target.budget {
        return Err(FitError::TooSmall {
            budget: target.budget,
            smallest,
        });
    }
    let mut base = Model::new(model, probing.options.n_ctx)?;
    base.set_compute(probing.compute.0, probing.compute.1);
    let collector = Arc::new(influence::Collector::new());
    base.set_observer(Some(collector.clone()));
    let logits = ScratchFile::new(probing.scratch, "memwall-fit-", ".kld");
    let baseline = Baseline::new(&base, probing.tokens, probing.options, logits, progress)?;
    drop(base);
    let influence = collector.take();
    let started = std::time::Instant::now();
    let sensitivity = budget::measure(
        model,
        input,
        imatrix,
        Some(&influence),
        &target.candidates,
        progress,
    )?;
    let measure_seconds = started.elapsed().as_secs_f64();
    let mut prober = Prober {
        input,
        model,
        baseline: &baseline,
        probing,
        imatrix,
        quantize: budget::q8_options(imatrix),
        progress,
    };
    let gains = gains(&mut prober, &sensitivity, target.probe)?;
    let per_matrix = gains.of(&sensitivity.matrices);
    let assignment = budget::allocate(
        &sensitivity.matrices,
        &per_matrix,
        target.budget - sensitivity.other_bytes,
    )?;
    Ok(Fitted {
        sensitivity,
        gains,
        assignment,
        measure_seconds,
    })
}

/// One group's probe.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// The group (`ffn_down.weight`).
    pub group: String,
    /// Mean KL divergence of the probe file from the base.
    pub kld: f64,
    /// The error the probe adds over the reference, summed over the group.
    pub error: f64,
    /// KL divergence per unit of error.
    pub gain: f64,
    /// False when the probe added no measurable divergence and the gain is
    /// a floor (a tenth of the smallest measured gain).
    pub measured: bool,
}

/// The reference probe and every group's.
#[derive(Clone, Debug, PartialEq)]
pub struct Gains {
    /// Mean KL divergence of the reference probe (every matrix at its largest type).
    pub reference_kld: f64,
    /// The groups, in the order their first matrix appears.
    pub probes: Vec<Probe>,
    /// Mean KL divergence of the probe with every group at the probe type at once.
    pub all_kld: f64,
    /// What the groups' gains predict for that probe (`Σ gain · error`).
    pub all_additive: f64,
    /// How much faster than additively the divergence grows: `β` of
    /// `KLD ≈ A · (1 + β·A)` for an additive prediction `A`, from the
    /// all-groups probe (0 when it added no more than the sum).
    pub interaction: f64,
}

impl Gains {
    /// The KL divergence predicted for an additive prediction `a`
    /// (`Σ gain · error` of a file): `a · (1 + β·a)`. Monotone in `a`, so the
    /// allocation that minimises `a` minimises it too.
    pub fn predict(&self, additive: f64) -> f64 {
        additive * (1.0 + self.interaction * additive)
    }

    /// The gain of each matrix, by its group.
    pub fn of(&self, matrices: &[Matrix]) -> Vec<f64> {
        matrices.iter().map(|m| self.gain(&m.group)).collect()
    }

    /// The gain of `group` (0 for a group no probe measured).
    pub fn gain(&self, group: &str) -> f64 {
        self.probes
            .iter()
            .find(|p| p.group == group)
            .map_or(0.0, |p| p.gain)
    }
}

/// Writes and evaluates probe files.
struct Prober<'a> {
    /// The base (F16) model file.
    input: &'a Path,
    /// The base model, opened.
    model: &'a GgufModel,
    /// The base's log-probabilities on the probe text.
    baseline: &'a Baseline,
    /// The probe text's windows, compute and scratch folder.
    probing: &'a Probing<'a>,
    /// The importance matrix the files are quantized with.
    imatrix: Option<&'a Imatrix>,
    /// Llama.cpp's Q8_0 rules with the importance matrix; each probe sets
    /// every matrix's type with one rule per matrix.
    quantize: Options,
    progress: &'a dyn Progress,
}

impl Prober<'_> {
    /// Writes the file that gives each matrix option `choose(m)`, and
    /// measures its mean KL divergence from the base.
    fn kld(
        &mut self,
        matrices: &[Matrix],
        choose: impl Fn(&Matrix) -> usize,
    ) -> Result<f64, FitError> {
        self.quantize.tensor_types = matrices
            .iter()
            .map(|m| budget::exact_rule(&m.name, m.options[choose(m)].ty))
            .collect();
        let scratch = ScratchFile::new(self.probing.scratch, "memwall-fit-", ".gguf");
        let plan = job::plan(self.model, self.input, &self.quantize)?;
        job::run(
            self.model,
            &plan,
            self.imatrix,
            false,
            scratch.path(),
            &Silent,
        )?;
        let gguf = GgufModel::open(scratch.path())?;
        let mut model = Model::new(&gguf, self.probing.options.n_ctx)?;
        model.set_compute(self.probing.compute.0, self.probing.compute.1);
        let stats = self
            .baseline
            .compare(&model, self.probing.options, self.progress)?;
        Ok(stats.kld.mean)
    }
}

/// Measures the gains of every group of `sensitivity`'s matrices with
/// `probe` (its llama.cpp fallback where its block does not divide a
/// matrix's rows; the smallest candidate where neither is one).
fn gains(
    prober: &mut Prober<'_>,
    sensitivity: &Sensitivity,
    probe: GgmlType,
) -> Result<Gains, FitError> {
    let matrices = &sensitivity.matrices;
    let mut groups: Vec<&str> = Vec::new();
    for m in matrices {
        if !groups.contains(&m.group.as_str()) {
            groups.push(&m.group);
        }
    }
    let top = |m: &Matrix| m.options.len() - 1;
    let low = |m: &Matrix| m.option_of(probe).unwrap_or(0);
    let reference_kld = prober.kld(matrices, top)?;
    let mut probes = Vec::with_capacity(groups.len());
    for group in groups {
        let in_group = |m: &Matrix| m.group == group;
        let value = prober.kld(matrices, |m| if in_group(m) { low(m) } else { top(m) })?;
        let error: f64 = matrices
            .iter()
            .filter(|m| in_group(m))
            .map(|m| m.options[low(m)].error - m.options[top(m)].error)
            .sum();
        let added = value - reference_kld;
        let measured = added > 0.0 && error > 0.0;
        probes.push(Probe {
            group: group.to_owned(),
            kld: value,
            error,
            gain: if measured { added / error } else { 0.0 },
            measured,
        });
    }
    let floor = probes
        .iter()
        .filter(|p| p.measured)
        .map(|p| p.gain)
        .fold(f64::INFINITY, f64::min);
    let floor = if floor.is_finite() { floor / 10.0 } else { 1.0 };
    for p in probes.iter_mut().filter(|p| !p.measured) {
        p.gain = floor;
    }
    let mut gains = Gains {
        reference_kld,
        probes,
        all_kld: 0.0,
        all_additive: 0.0,
        interaction: 0.0,
    };
    // Every group at the probe type at once: how the groups' errors combine.
    gains.all_kld = prober.kld(matrices, low)?;
    gains.all_additive = matrices
        .iter()
        .map(|m| gains.gain(&m.group) * m.options[low(m)].error)
        .sum();
    if gains.all_additive > 0.0 && gains.all_kld > gains.all_additive {
        gains.interaction = (gains.all_kld / gains.all_additive - 1.0) / gains.all_additive;
    }
    Ok(gains)
}
