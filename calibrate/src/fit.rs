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

use memwall_format::GgmlType;
use memwall_format::cleanup::ScratchFile;
use memwall_format::ggml_type::file_type_by_name;
use memwall_format::gguf::GgufModel;
use memwall_format::progress::{Progress, Silent};
use memwall_quantize::budget::{self, Assignment, BudgetError, Matrix, Sensitivity};
use memwall_quantize::imatrix::Imatrix;
use memwall_quantize::job::{self, ImatrixInput, JobError, Options};
use memwall_quantize::recipe::Recipe;
use memwall_quantize::recipe::make_override;
use memwall_runtime::eval::{self, Baseline, EvalError};
use memwall_runtime::forward::{ForwardError, Model};
use memwall_runtime::kernels::Kernels;

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

/// Fits `target.budget` for `model` (opened from `input`): measures every
/// matrix at every candidate, refuses a budget below the smallest file before
/// anything runs, evaluates the base on the probe text, measures the gains and
/// allocates.
pub fn fit(
    model: &GgufModel,
    input: &Path,
    imatrix: Option<&Imatrix>,
    probing: &Probing<'_>,
    target: &Target,
    progress: &dyn Progress,
) -> Result<Fitted, FitError> {
    let started = std::time::Instant::now();
    let sensitivity = budget::measure(model, input, imatrix, &target.candidates, progress)?;
    let smallest: u64 = sensitivity
        .matrices
        .iter()
        .map(|m| m.options.iter().map(|o| o.bytes).min().unwrap_or(0))
        .sum::<u64>()
        + sensitivity.other_bytes;
    if smallest > target.budget {
        return Err(FitError::TooSmall {
            budget: target.budget,
            smallest,
        });
    }
    let measure_seconds = started.elapsed().as_secs_f64();
    let mut base = Model::new(model, probing.options.n_ctx)?;
    base.set_compute(probing.compute.0, probing.compute.1);
    let logits = ScratchFile::new(probing.scratch, "memwall-fit-", ".kld");
    let baseline = Baseline::new(&base, probing.tokens, probing.options, logits, progress)?;
    drop(base);
    let setup = ProbeSetup {
        input,
        model,
        baseline: &baseline,
        options: probing.options,
        imatrix,
        compute: probing.compute,
        scratch: probing.scratch,
    };
    let gains = gains(&setup, &sensitivity, target.probe, progress)?;
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
        matrices
            .iter()
            .map(|m| {
                self.probes
                    .iter()
                    .find(|p| p.group == m.group)
                    .map_or(0.0, |p| p.gain)
            })
            .collect()
    }
}

/// Where the probes are evaluated.
struct ProbeSetup<'a> {
    /// The base (F16) model file and its evaluation on the probe text.
    input: &'a Path,
    /// The base model, opened.
    model: &'a GgufModel,
    /// The base's log-probabilities on the probe text.
    baseline: &'a Baseline,
    /// The windows the baseline was evaluated on.
    options: &'a eval::Options,
    /// The importance matrix the files are quantized with.
    imatrix: Option<&'a Imatrix>,
    /// Kernels and threads for the probes' forward passes.
    compute: (Kernels, usize),
    /// Folder for the probe files (each removed when measured).
    scratch: &'a Path,
}

/// Measures the gains of every group of `sensitivity`'s matrices with
/// `probe` (or each matrix's smallest candidate where `probe` is not one).
fn gains(
    setup: &ProbeSetup<'_>,
    sensitivity: &Sensitivity,
    probe: GgmlType,
    progress: &dyn Progress,
) -> Result<Gains, FitError> {
    let matrices = &sensitivity.matrices;
    let mut groups: Vec<&str> = Vec::new();
    for m in matrices {
        if !groups.contains(&m.group.as_str()) {
            groups.push(&m.group);
        }
    }
    let top = |m: &Matrix| m.options.len() - 1;
    let low = |m: &Matrix| m.options.iter().position(|o| o.ty == probe).unwrap_or(0);
    let reference_kld = kld(setup, matrices, |_, m| top(m), progress)?;
    let mut probes = Vec::with_capacity(groups.len());
    for group in groups {
        let in_group = |m: &Matrix| m.group == group;
        let value = kld(
            setup,
            matrices,
            |_, m| if in_group(m) { low(m) } else { top(m) },
            progress,
        )?;
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
    // Every group at the probe type at once: how the groups' errors combine.
    let all_kld = kld(setup, matrices, |_, m| low(m), progress)?;
    let gain_of = |m: &Matrix| {
        probes
            .iter()
            .find(|p| p.group == m.group)
            .map_or(0.0, |p| p.gain)
    };
    let all_additive: f64 = matrices
        .iter()
        .map(|m| gain_of(m) * m.options[low(m)].error)
        .sum();
    let interaction = if all_additive > 0.0 && all_kld > all_additive {
        (all_kld / all_additive - 1.0) / all_additive
    } else {
        0.0
    };
    Ok(Gains {
        reference_kld,
        probes,
        all_kld,
        all_additive,
        interaction,
    })
}

/// Writes the file that gives matrix `i` option `choose(i, m)`, and measures
/// its mean KL divergence from the base.
fn kld(
    setup: &ProbeSetup<'_>,
    matrices: &[Matrix],
    choose: impl Fn(usize, &Matrix) -> usize,
    progress: &dyn Progress,
) -> Result<f64, FitError> {
    let types: Vec<GgmlType> = matrices
        .iter()
        .enumerate()
        .map(|(i, m)| m.options[choose(i, m)].ty)
        .collect();
    let scratch = ScratchFile::new(setup.scratch, "memwall-fit-", ".gguf");
    write(setup, matrices, &types, scratch.path())?;
    let gguf = GgufModel::open(scratch.path())?;
    let mut model = Model::new(&gguf, setup.options.n_ctx)?;
    model.set_compute(setup.compute.0, setup.compute.1);
    let stats = setup.baseline.compare(&model, setup.options, progress)?;
    Ok(stats.kld.mean)
}

/// Quantizes the base with matrix `i` at `types[i]` (everything else as
/// llama.cpp's Q8_0 rules leave it).
fn write(
    setup: &ProbeSetup<'_>,
    matrices: &[Matrix],
    types: &[GgmlType],
    out: &Path,
) -> Result<(), FitError> {
    #[expect(clippy::expect_used, reason = "Q8_0 is in the file-type table")]
    let mut options = Options::new(file_type_by_name("Q8_0").expect("Q8_0 is a file type"));
    options.imatrix = setup.imatrix.map(|m| ImatrixInput {
        label: String::new(),
        data: m.clone(),
    });
    for (m, &ty) in matrices.iter().zip(types) {
        let pattern = format!("^{}$", regex_escape(&m.name));
        #[expect(clippy::expect_used, reason = "an escaped name in a fixed pattern")]
        options.tensor_types.push(
            make_override(&pattern, ty, Vec::new(), true)
                .expect("escaped names are valid patterns"),
        );
    }
    let plan = job::plan(setup.model, setup.input, &options)?;
    job::run(setup.model, &plan, setup.imatrix, false, out, &Silent)?;
    Ok(())
}

/// `name` with the regular-expression metacharacters of tensor names escaped.
fn regex_escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        if !c.is_ascii_alphanumeric() && c != '_' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
