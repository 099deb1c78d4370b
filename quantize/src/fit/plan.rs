//! The plan: for every quantization choice of a model, how much memory it
//! needs on a device, whether it fits in RAM or must stream from flash, and
//! how fast it decodes; and which choice to recommend. `memwall plan` renders
//! this, `memwall push` checks a phone against [`memwall_footprint`].

use memwall_format::GgmlType;
use memwall_format::gguf::GgufModel;
use memwall_format::model_info::HyperParams;

use super::{
    Choice, Device, Footprint, KvType, Load, ModelShapeError, Runtime, Shape, Speed, TensorShape,
    Token, Weights, WeightsError, footprint, token_speed,
};

/// Why a model cannot be planned.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The file as it is cannot be sized (a tensor its type cannot hold).
    #[error(transparent)]
    AsStored(#[from] WeightsError),
    /// A choice cannot be planned for this model.
    #[error("planning {label}: {error}")]
    Planning {
        /// The choice's label (`Q4_K_M`, a recipe's name).
        label: String,
        /// Why.
        error: WeightsError,
    },
}

/// The model, as the planner sees it.
#[derive(Clone, Debug)]
pub struct Subject {
    /// What the user named (for messages and commands).
    pub name: String,
    /// Its shape.
    pub shape: Shape,
    /// Its tensors (GGUF's, or built from `config.json`); empty for bare
    /// parameter counts.
    pub tensors: Vec<TensorShape>,
    /// Total parameters (bare counts only).
    pub params: u64,
    /// Parameters each token reads (bare counts only).
    pub active_params: u64,
    /// GGUF header bytes (metadata and vocabulary), estimated without a file.
    pub header_bytes: u64,
    /// For a GGUF file: the file as it is.
    pub as_stored: Option<AsStored>,
}

/// A GGUF file planned as it is.
#[derive(Clone, Debug)]
pub struct AsStored {
    /// The label of its row.
    pub label: String,
    /// Whether any tensor is quantized (quantizing it again loses quality).
    pub quantized: bool,
}

/// Where a choice's weights live on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// Everything in RAM.
    Ram,
    /// Weights partly streamed from flash (`--resident`).
    Streaming,
    /// Not even the KV cache and buffers fit.
    No,
}

impl Fit {
    /// The word `memwall plan` prints.
    pub fn name(self) -> &'static str {
        match self {
            Fit::Ram => "RAM",
            Fit::Streaming => "streaming",
            Fit::No => "no",
        }
    }
}

/// One planned choice.
#[derive(Clone, Debug)]
pub struct Row {
    /// The choice's name (or `as is (…)`, or a nominal row's).
    pub label: String,
    /// From the tensor shapes (else the seed's `params × bits ÷ 8`).
    pub exact: bool,
    /// Bits per weight over the whole file.
    pub bits_per_weight: f64,
    /// Bytes of weights.
    pub weight_bytes: u64,
    /// Bytes of the file (weights and header).
    pub file_bytes: u64,
    /// What memwall's runtime holds.
    pub memwall: Footprint,
    /// What llama.cpp holds.
    pub llama: Footprint,
    /// Where it fits.
    pub fits: Fit,
    /// Decode speed on the device.
    pub speed: Speed,
    /// The choice behind the row (none for "as is" and the nominal rows).
    pub choice: Option<Choice>,
    /// The GGUF file as it is (no choice to make: it exists).
    pub as_is: bool,
}

/// The context, batch and cache type the plan is for.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Context length.
    pub ctx: u64,
    /// Prompt batch.
    pub batch: u64,
    /// KV cache type (llama.cpp's; memwall's cache is f16).
    pub kv: KvType,
}

/// Every row of the plan: the file as it is (for a GGUF), then each choice
/// (for bare counts: the nominal FP16/INT8/INT4 rows and one row per base
/// type).
pub fn rows(
    subject: &Subject,
    choices: &[Choice],
    device: &Device,
    run: Run,
) -> Result<Vec<Row>, PlanError> {
    let shape = &subject.shape;
    let facts = shape.facts();
    let mut rows = Vec::new();
    let mut push_row = |label: String,
                        exact: bool,
                        weight_bytes: u64,
                        bits: f64,
                        token: Token,
                        choice: Option<Choice>,
                        as_is: bool,
                        weights: Option<&Weights>| {
        let file_bytes = weight_bytes + subject.header_bytes;
        let load = Load {
            file_bytes,
            header_bytes: subject.header_bytes,
            ctx: run.ctx,
            batch: run.batch,
            kv: run.kv,
        };
        // memwall's runtime keeps its KV cache in f16 whatever the plan's type.
        let memwall = footprint(
            Runtime::Memwall,
            shape,
            &Load {
                kv: KvType::F16,
                ..load
            },
        );
        let llama = footprint(Runtime::LlamaCpp, shape, &load);
        let usable = device.usable_bytes();
        let rest = memwall.total() - memwall.weights;
        let fits = if memwall.total() <= usable {
            Fit::Ram
        } else if rest + (usable / 10) <= usable {
            Fit::Streaming
        } else {
            Fit::No
        };
        let resident = match fits {
            Fit::Ram => weight_bytes,
            _ => usable.saturating_sub(rest).min(weight_bytes),
        };
        let mut token = token;
        // Known tensors stream as memwall streams them (a mixture of experts
        // reads only the routed experts its cache misses); bare numbers read
        // the share that is not resident.
        token.streamed_share = match weights {
            _ if weight_bytes == 0 || token.weight_bytes == 0 => 0.0,
            Some(w) => {
                let flash =
                    w.streamed_bytes_per_token(shape.n_expert, shape.n_expert_used, resident);
                flash as f64 / token.weight_bytes as f64
            }
            None => weight_bytes.saturating_sub(resident) as f64 / weight_bytes as f64,
        };
        let speed = token_speed(device, &token);
        rows.push(Row {
            label,
            exact,
            bits_per_weight: bits,
            weight_bytes,
            file_bytes,
            memwall,
            llama,
            fits,
            speed,
            choice,
            as_is,
        });
    };
    let kv_tokens = run.ctx / 2;
    let attention = shape.attention_ops(kv_tokens);
    let kv_bytes = shape.kv_bytes(run.kv, kv_tokens);
    if let Some(stored) = &subject.as_stored {
        let w = Weights::as_stored(&subject.tensors)?;
        let token = token_of(&w, shape, kv_bytes, attention);
        push_row(
            stored.label.clone(),
            true,
            w.bytes(),
            w.bits_per_weight(),
            token,
            None,
            true,
            Some(&w),
        );
    }
    if subject.tensors.is_empty() {
        // Bare numbers: the seed's arithmetic, params × bits ÷ 8.
        let nominal = |bits: f64, ty: GgmlType| {
            let bytes = (subject.params as f64 * bits / 8.0).round() as u64;
            let token = Token {
                weight_bytes: (subject.active_params as f64 * bits / 8.0).round() as u64,
                kv_bytes,
                products: vec![(ty, subject.active_params)],
                attention,
                streamed_share: 0.0,
                dispatches: shape.dispatches_per_token(),
                model_bytes: bytes,
            };
            (bytes, token)
        };
        for (label, bits, ty) in [
            ("FP16 (nominal)", 16.0, GgmlType::F16),
            ("INT8 (nominal)", 8.0, GgmlType::Q8_0),
            ("INT4 (nominal)", 4.0, GgmlType::Q4_K),
        ] {
            let (bytes, token) = nominal(bits, ty);
            push_row(label.into(), false, bytes, bits, token, None, false, None);
        }
        // One row per distinct base type: a mix's own rules need tensor names.
        let mut seen = Vec::new();
        for c in choices.iter().filter(|c| c.recipe.is_none()) {
            let ty = c.ftype.base.unwrap_or(GgmlType::F16);
            if seen.contains(&ty) {
                continue;
            }
            seen.push(ty);
            let bits = nominal_bits(c);
            let (bytes, token) = nominal(bits, ty);
            push_row(
                format!("{} (≈)", c.label),
                false,
                bytes,
                bits,
                token,
                Some(c.clone()),
                false,
                None,
            );
        }
    } else {
        for c in choices {
            let w = c
                .weights(&facts, &subject.tensors)
                .map_err(|error| PlanError::Planning {
                    label: c.label.clone(),
                    error,
                })?;
            let token = token_of(&w, shape, kv_bytes, attention);
            push_row(
                c.label.clone(),
                true,
                w.bytes(),
                w.bits_per_weight(),
                token,
                Some(c.clone()),
                false,
                Some(&w),
            );
        }
    }
    Ok(rows)
}

/// Bits per weight of a file type's base type: the seed's arithmetic for bare numbers.
pub fn nominal_bits(choice: &Choice) -> f64 {
    choice
        .ftype
        .base
        .map_or(16.0, |t| (t.type_size() * 8) as f64 / t.block_size() as f64)
}

/// What one token reads and computes with weights `w`.
fn token_of(w: &Weights, shape: &Shape, kv_bytes: u64, attention: u64) -> Token {
    Token {
        weight_bytes: w.bytes_per_token(shape.n_expert, shape.n_expert_used),
        kv_bytes,
        products: w.products_per_token(shape.n_expert, shape.n_expert_used),
        attention,
        streamed_share: 0.0,
        dispatches: shape.dispatches_per_token(),
        model_bytes: w.bytes(),
    }
}

/// Which rows may be picked: the choices, and the file as it is. A file that
/// is already quantized is not made bigger (quality lost is not regained):
/// only choices smaller than it compete with it.
pub fn eligible(subject: &Subject, rows: &[Row]) -> Vec<bool> {
    let quantized = subject.as_stored.as_ref().is_some_and(|s| s.quantized);
    let as_is = rows.iter().find(|r| r.as_is).map(|r| r.weight_bytes);
    rows.iter()
        .map(|r| match (r.as_is, quantized, as_is) {
            (true, _, _) => true,
            (false, true, Some(bytes)) => r.choice.is_some() && r.weight_bytes < bytes,
            (false, _, _) => r.choice.is_some(),
        })
        .collect()
}

/// The largest (best quality) eligible choice (`ok`, from [`eligible`]) that
/// fits `budget` bytes with memwall holding everything in RAM.
pub fn pick_for_budget(rows: &[Row], ok: &[bool], budget: u64) -> Option<usize> {
    rows.iter()
        .enumerate()
        .filter(|&(i, r)| ok[i] && r.choice.is_some() && r.memwall.total() <= budget)
        .max_by_key(|(_, r)| r.weight_bytes)
        .map(|(i, _)| i)
}

/// The best eligible row that fits in RAM with 10 % of `usable` to spare;
/// else the best that fits at all; else the smallest that streams (it reads
/// the least from flash). The file as it is wins a tie (nothing to make).
pub fn recommend(rows: &[Row], ok: &[bool], usable: u64) -> Option<usize> {
    let best = |fits: &dyn Fn(&Row) -> bool| {
        rows.iter()
            .enumerate()
            .filter(|&(i, r)| ok[i] && fits(r))
            .max_by_key(|(_, r)| (r.weight_bytes, r.as_is))
            .map(|(i, _)| i)
    };
    best(&|r| r.fits == Fit::Ram && r.memwall.total() as f64 <= 0.9 * usable as f64)
        .or_else(|| best(&|r| r.fits == Fit::Ram))
        .or_else(|| {
            rows.iter()
                .enumerate()
                .filter(|&(i, r)| ok[i] && r.fits == Fit::Streaming)
                .min_by_key(|(_, r)| (r.weight_bytes, !r.as_is))
                .map(|(i, _)| i)
        })
}

/// The perplexity a llama.cpp file type adds to Llama-3-8B, as llama-quantize's
/// help lists it (tools/quantize/quantize.cpp of the recorded tree): the
/// prior on quality where nothing has been measured. Larger models lose less
/// at the same bits and smaller ones more, so it ranks the types rather than
/// predicting a loss; the i-quants and ternary types have no number there.
pub fn ppl_increase_llama3_8b(ftype: &str) -> Option<f64> {
    Some(match ftype {
        "F32" | "F16" | "BF16" => 0.0,
        "Q8_0" => 0.0026,
        "Q6_K" => 0.0217,
        "Q5_K_M" => 0.0569,
        "Q5_K_S" => 0.1049,
        "Q5_1" => 0.1062,
        "Q5_0" => 0.1316,
        "Q4_K_M" => 0.1754,
        "Q4_K_S" => 0.2689,
        "Q4_1" => 0.4511,
        "Q4_0" => 0.4685,
        "Q3_K_L" => 0.5562,
        "Q3_K_M" => 0.6569,
        "Q3_K_S" => 1.6321,
        "Q2_K_S" => 3.1836,
        "Q2_K" => 3.5199,
        _ => return None,
    })
}

/// Perplexity added to Llama-3-8B above which a recommendation comes with a
/// warning: Q3_K_S and Q2_K lie above it, Q3_K_M (0.66) below.
const RISKY_PPL: f64 = 1.0;
/// Bits per weight below which a choice without a published number is
/// treated as risky: the 2- and 1-bit i-quants, the ternary types (IQ3_XXS,
/// 3.06, is not).
const RISKY_BITS: f64 = 3.0;

/// Whether `row` risks a visible loss of quality: its type adds more than
/// [`RISKY_PPL`] to Llama-3-8B's perplexity, or, without a number, its base
/// type (a recipe: the whole file) has fewer than [`RISKY_BITS`] bits per
/// weight. A file as it is never is (it exists; measure it).
pub fn risky(row: &Row) -> bool {
    let Some(choice) = &row.choice else {
        return false;
    };
    if choice.recipe.is_some() {
        return row.bits_per_weight < RISKY_BITS;
    }
    match ppl_increase_llama3_8b(choice.ftype.name) {
        Some(ppl) => ppl > RISKY_PPL,
        None => nominal_bits(choice) < RISKY_BITS,
    }
}

/// Share of a risky recommendation's decode speed a streaming alternative
/// keeps, at least, to be offered for its quality rather than its speed.
const STREAMING_SPEED_KEPT: f64 = 0.8;

/// What to weigh before taking a risky recommendation.
#[derive(Clone, Debug)]
pub struct Alternatives {
    /// The longest shorter context (halving `-c`, down to 256) at which a
    /// choice that is not risky fits in RAM, and that choice's row there.
    pub shorter_context: Option<(u64, Row)>,
    /// A choice that is not risky and streams from flash at the plan's
    /// context: the largest with [`STREAMING_SPEED_KEPT`] of the
    /// recommendation's speed, else the fastest.
    pub streaming: Option<Row>,
}

/// The alternatives to the recommended row `rows[recommended]` when it is
/// [`risky`]; `None` when it is not.
pub fn alternatives(
    subject: &Subject,
    choices: &[Choice],
    device: &Device,
    run: Run,
    rows: &[Row],
    recommended: usize,
) -> Result<Option<Alternatives>, PlanError> {
    if !risky(&rows[recommended]) {
        return Ok(None);
    }
    let ok = eligible(subject, rows);
    let safe: Vec<&Row> = (rows.iter().enumerate())
        .filter(|&(i, r)| ok[i] && r.fits == Fit::Streaming && !risky(r))
        .map(|(_, r)| r)
        .collect();
    // The largest that keeps most of the recommendation's speed, else the
    // fastest.
    let floor = STREAMING_SPEED_KEPT * rows[recommended].speed.tokens_per_s;
    let streaming = (safe.iter())
        .filter(|r| r.speed.tokens_per_s >= floor)
        .max_by_key(|r| r.weight_bytes)
        .or_else(|| {
            (safe.iter()).max_by(|a, b| a.speed.tokens_per_s.total_cmp(&b.speed.tokens_per_s))
        })
        .map(|&r| r.clone());
    let mut shorter_context = None;
    let mut ctx = run.ctx / 2;
    while ctx >= 256 {
        let shorter = self::rows(subject, choices, device, Run { ctx, ..run })?;
        let ok = eligible(subject, &shorter);
        let safe = recommend(&shorter, &ok, device.usable_bytes())
            .map(|i| &shorter[i])
            .filter(|r| r.fits == Fit::Ram && !risky(r));
        if let Some(r) = safe {
            shorter_context = Some((ctx, r.clone()));
            break;
        }
        ctx /= 2;
    }
    Ok(Some(Alternatives {
        shorter_context,
        streaming,
    }))
}

/// Bytes of the model's GGUF headers (metadata, vocabulary, tensor infos).
pub fn header_bytes(model: &GgufModel) -> u64 {
    model.files().iter().map(|f| f.header().data_offset).sum()
}

/// What `memwall run --no-mmap -c CTX -b BATCH` holds in memory for `model`
/// (the planner's model of the runtime; `memwall push` checks phones against it).
pub fn memwall_footprint(
    model: &GgufModel,
    ctx: u64,
    batch: u64,
) -> Result<Footprint, ModelShapeError> {
    let shape = Shape::from_gguf(model)?;
    let load = Load {
        file_bytes: model.total_file_size(),
        header_bytes: header_bytes(model),
        ctx,
        batch,
        kv: KvType::F16,
    };
    Ok(footprint(Runtime::Memwall, &shape, &load))
}

/// The largest file of `model`'s shape that `memwall run --no-mmap -c CTX`
/// can hold in `device`'s usable RAM, beside the KV cache, the batch's
/// buffers and the process (0 when those alone do not fit), with that footprint.
pub fn file_budget(
    device: &Device,
    model: &GgufModel,
    ctx: u64,
) -> Result<(u64, Footprint), ModelShapeError> {
    let mut rest = memwall_footprint(model, ctx, 512)?;
    rest.weights = 0;
    Ok((device.usable_bytes().saturating_sub(rest.total()), rest))
}

/// RAM `memwall run --no-mmap -c CTX` needs for `model` (`memwall push`
/// checks a phone against it): [`memwall_footprint`] at the default batch; for
/// a file the planner cannot describe, the file, an f16 KV cache sized from its
/// hyperparameters and 64 MiB.
pub fn ram_needed(model: &GgufModel, ctx: u64) -> u64 {
    if let Ok(f) = memwall_footprint(model, ctx, 512) {
        return f.total();
    }
    let kv = HyperParams::try_from(model.metadata()).map_or(0, |hp| {
        let k = hp.head_dim();
        let v = hp.value_length.unwrap_or(k);
        hp.block_count
            .saturating_mul(hp.head_count_kv)
            .saturating_mul(k.saturating_add(v))
            .saturating_mul(ctx)
            .saturating_mul(2)
    });
    model
        .total_file_size()
        .saturating_add(kv)
        .saturating_add(64 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject() -> Subject {
        let shape = Shape::dense("llama", 30, 576, 1536, 9, 3, 64, 49152, true);
        Subject {
            name: "smol".into(),
            tensors: shape.tensors(),
            shape,
            params: 0,
            active_params: 0,
            header_bytes: 1 << 20,
            as_stored: None,
        }
    }

    fn device(gib: u64) -> Device {
        let mut d = Device::resolve("phone-16gb").unwrap();
        d.ram_bytes = gib << 30;
        d.os_reserve_bytes = 0;
        d
    }

    fn run() -> Run {
        Run {
            ctx: 4096,
            batch: 512,
            kv: KvType::F16,
        }
    }

    #[test]
    fn types_above_one_unit_of_llama3_8b_perplexity_or_under_3_bits_are_risky() {
        let names = ["Q3_K_M", "Q3_K_S", "Q2_K", "IQ3_XXS", "IQ2_M", "IQ4_XS"];
        let choices: Vec<Choice> = names.map(|n| Choice::by_name(n).unwrap()).to_vec();
        let s = subject();
        let rows = rows(&s, &choices, &device(16), run()).unwrap();
        let risky: Vec<(&str, bool)> = rows.iter().map(|r| (r.label.as_str(), risky(r))).collect();
        // Without a published number the base type decides, not the file's
        // bits (at SmolLM2's 576 widths every one of these falls back to 5).
        assert!(rows.iter().all(|r| r.bits_per_weight > 3.0));
        assert_eq!(
            risky,
            [
                ("Q3_K_M", false),
                ("Q3_K_S", true),
                ("Q2_K", true),
                ("IQ3_XXS", false),
                ("IQ2_M", true),
                ("IQ4_XS", false)
            ]
        );
        // Nothing risky is recommended on 16 GiB: no alternatives to weigh.
        let best = recommend(&rows, &eligible(&s, &rows), 16 << 30).unwrap();
        assert!(
            alternatives(&s, &choices, &device(16), run(), &rows, best)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn recommends_the_largest_choice_with_room_to_spare_and_picks_by_budget() {
        let choices: Vec<Choice> = ["Q4_K_M", "Q8_0", "F16"]
            .into_iter()
            .map(|n| Choice::by_name(n).unwrap())
            .collect();
        let s = subject();
        let rows = rows(&s, &choices, &device(16), run()).unwrap();
        let ok = eligible(&s, &rows);
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.fits == Fit::Ram));
        // Everything fits a 16 GiB device: the largest, F16.
        let best = recommend(&rows, &ok, 16 << 30).unwrap();
        assert_eq!(rows[best].label, "F16");
        // A budget between the Q8_0 and F16 footprints takes Q8_0.
        let [q4, q8, f16] = [0, 1, 2].map(|i| rows[i].memwall.total());
        assert!(q4 < q8 && q8 < f16);
        assert_eq!(pick_for_budget(&rows, &ok, (q8 + f16) / 2), Some(1));
        assert_eq!(pick_for_budget(&rows, &ok, q4 - 1), None);
        // Only Q4_K_M fits with 10 % to spare in a usable size just above it.
        let usable = (q4 as f64 / 0.9) as u64 + 1;
        assert_eq!(recommend(&rows, &ok, usable), Some(0));
    }

    #[test]
    fn a_model_larger_than_ram_streams_and_the_smallest_file_is_recommended() {
        let choices: Vec<Choice> = ["Q4_K_M", "Q8_0"]
            .into_iter()
            .map(|n| Choice::by_name(n).unwrap())
            .collect();
        let mut s = subject();
        s.shape = Shape::dense("llama", 64, 5120, 27648, 40, 8, 128, 152064, false);
        s.tensors = s.shape.tensors();
        let rows = rows(&s, &choices, &device(8), run()).unwrap();
        let ok = eligible(&s, &rows);
        assert!(rows.iter().all(|r| r.fits == Fit::Streaming), "{rows:?}");
        assert_eq!(recommend(&rows, &ok, 8 << 30), Some(0));
    }

    #[test]
    fn a_quantized_file_is_recommended_as_it_is_and_never_made_bigger() {
        let choices: Vec<Choice> = ["Q4_K_M", "Q8_0"]
            .into_iter()
            .map(|n| Choice::by_name(n).unwrap())
            .collect();
        let mut s = subject();
        let q4 = Choice::by_name("Q4_K_M").unwrap();
        let facts = s.shape.facts();
        let w = q4.weights(&facts, &s.tensors).unwrap();
        // The file as stored: the Q4_K_M tensors.
        s.tensors = s
            .tensors
            .iter()
            .zip(&w.parts)
            .map(|(t, p)| TensorShape {
                ty: p.ty,
                ..t.clone()
            })
            .collect();
        s.as_stored = Some(AsStored {
            label: "as is (smol-Q4_K_M)".into(),
            quantized: true,
        });
        let rows = rows(&s, &choices, &device(16), run()).unwrap();
        let ok = eligible(&s, &rows);
        assert!(rows[0].as_is);
        // Q8_0 (bigger than the file) is not eligible; Q4_K_M of the same
        // size loses the tie to the file itself.
        assert_eq!(ok, [true, false, false]);
        assert_eq!(recommend(&rows, &ok, 16 << 30), Some(0));
    }
}
