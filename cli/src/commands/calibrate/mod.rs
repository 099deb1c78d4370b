//! `memwall calibrate …`: calibration sets, importance matrices, and
//! calibrated quantization.

pub mod dataset;
pub mod fit;
pub mod imatrix;
pub mod quantize;

/// The `calibrate` subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Collect an importance matrix (per-column sums of squared activations of
    /// every matrix product) in llama-imatrix's format.
    #[command(after_help = "Examples:
  memwall calibrate imatrix -m model-f16.gguf -f calibration.txt -o imatrix.gguf
  memwall calibrate imatrix -m model-f16.gguf -f text.txt -c 512 --chunks 100 --process-output
  memwall calibrate imatrix -m model-f16.gguf -f text.txt -o imatrix.dat --output-format dat
  memwall calibrate imatrix -m model-f16.gguf --dataset calib.jsonl -o imatrix.gguf

The text is cut into windows of -c tokens, each starting with BOS, as
llama-imatrix cuts it; the sums agree with llama-imatrix's for the same
model, text and -c (see docs/CALIBRATE.md). Both memwall quantize --imatrix
and llama-quantize --imatrix read the output.
Then: memwall quantize model-f16.gguf Q4_K_M --imatrix imatrix.gguf")]
    Imatrix(imatrix::Args),
    /// Build a calibration set: text, JSON/JSONL/Parquet QA data and chats,
    /// mixed by ratio, chunked, deduplicated, filtered by script and tokenized.
    Dataset(dataset::Args),
    /// Quantize with AWQ and/or GPTQ calibration into the same GGUF types
    /// plain quantization writes (stock llama.cpp runs the result).
    #[command(after_help = "Examples:
  memwall calibrate quantize -m model-f16.gguf --dataset calib.jsonl --type Q4_K_M \\
      -o model-Q4_K_M-awq-gptq.gguf
  memwall calibrate quantize -m model-f16.gguf --dataset calib.jsonl --method gptq \\
      --type Q5_K_M -o out.gguf
  memwall calibrate quantize -m model-f16.gguf -f text.txt --samples 64 --seq-len 512 \\
      --method awq --recipe attn-f16-ffn-q4 -o out.gguf
  memwall calibrate quantize -m model-f16.gguf --dataset calib.jsonl --budget 10.5GiB -o fit.gguf

Layer by layer: statistics of every matrix input on the calibration samples
(inputs of layer i+1 come from the already quantized layers up to i), AWQ's
scales folded into the norms and preceding matrices, GPTQ's error-feedback
rounding onto the target type's own block grid. The output has the same
tensor names and types as `memwall quantize` (and llama-quantize) would
write, plus memwall.calibration.* metadata. With --budget (or --device) the
types are fitted first, as memwall calibrate fit does, from the samples'
importance matrix and their first windows. See docs/CALIBRATE.md.")]
    Quantize(quantize::Args),
    /// Choose a type for every weight matrix so that the file fits a byte
    /// budget with the least predicted KL divergence; writes a recipe.
    #[command(after_help = "Examples:
  memwall calibrate fit -m model-f16.gguf --imatrix imatrix.gguf -f probe.txt --budget 3.5GiB
  memwall calibrate fit -m model-f16.gguf --imatrix imatrix.gguf -f probe.txt --budget 800MiB \\
      --types Q3_K,Q4_K,Q5_K,Q6_K -o small.toml --json
  memwall calibrate fit -m model-f16.gguf --imatrix imatrix.gguf -f probe.txt \\
      -d phone-16gb -c 4096 -o phone.toml

Every matrix is quantized at every candidate type and its error measured,
weighted by the importance matrix; probe files (one per role: attn_q, ffn_down,
output, ...) measure how much KL divergence a unit of each role's error makes
on the probe text; the recipe is the choice with the least predicted KL
divergence whose file fits the budget. See docs/RECIPES.md.
Then: memwall quantize model-f16.gguf out.gguf --recipe fit.toml --imatrix imatrix.gguf
  (or memwall calibrate quantize ... --recipe fit.toml for a calibrated file)")]
    Fit(fit::Args),
}

/// Runs a `calibrate` subcommand.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Imatrix(args) => imatrix::run(args),
        Command::Dataset(args) => dataset::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Fit(args) => fit::run(args),
    }
}
