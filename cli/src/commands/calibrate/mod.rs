//! `memwall calibrate …`: calibration sets, importance matrices, and
//! calibrated quantization.

pub mod dataset;
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

Layer by layer: statistics of every matrix input on the calibration samples
(inputs of layer i+1 come from the already quantized layers up to i), AWQ's
scales folded into the norms and preceding matrices, GPTQ's error-feedback
rounding onto the target type's own block grid. The output has the same
tensor names and types as `memwall quantize` (and llama-quantize) would
write, plus memwall.calibration.* metadata. See docs/CALIBRATE.md.")]
    Quantize(quantize::Args),
}

/// Runs a `calibrate` subcommand.
pub fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Imatrix(args) => imatrix::run(args),
        Command::Dataset(args) => dataset::run(args),
        Command::Quantize(args) => quantize::run(args),
    }
}
