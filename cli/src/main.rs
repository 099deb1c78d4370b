//! The `memwall` command-line tool: argument parsing, settings, rendering and
//! exit codes. All work happens in the library crates; this binary is the only
//! place in memwall that prints.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod chart;
mod chat;
mod commands;
mod progress;
mod render;
mod signals;
mod spellings;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Get large language models through the memory wall and onto phones.
#[derive(Parser)]
#[command(name = "memwall", version, about, long_about = None)]
#[command(after_help = "Examples:
  memwall inspect model.gguf               header, metadata, tensors, totals
  memwall inspect model.gguf --json | jq   the same, for scripts
  memwall inspect model-00001-of-00003.gguf   a split model, all files at once
  memwall convert ./checkpoint             HF checkpoint to GGUF, as llama.cpp writes it
  memwall export model.gguf ./checkpoint   GGUF back to an HF checkpoint
  memwall quantize model-f16.gguf Q4_K_M   llama.cpp's Q4_K_M, byte for byte
  memwall quantize model-f16.gguf out.gguf --recipe attn-f16-ffn-q4
  memwall perplexity -m model.gguf -f text.txt   perplexity, as llama-perplexity computes it
  memwall plan model-f16.gguf --device phone-16gb   will it fit, and how fast?
  memwall demo                             the whole workflow on a built-in model

Run `memwall <command> --help` for the options of each command.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert a Hugging Face checkpoint folder to GGUF: the same file as
    /// llama.cpp's convert_hf_to_gguf.py.
    #[command(after_help = "Examples:
  memwall convert ./SmolLM2-135M-Instruct          writes SmolLM2-135M-Instruct-f16.gguf
  memwall convert ./Qwen3-8B --outtype bf16 -o qwen3-8b-bf16.gguf
  memwall convert ./my-model --pre gpt-2          a tokenizer llama.cpp does not recognise
  memwall convert ./Mixtral-8x7B-v0.1 --outtype q8_0
  memwall convert Qwen/Qwen3-8B                    from the HF cache, else downloaded into it

Architectures: LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, CohereForCausalLM;
byte-level BPE (tokenizer.json) and SentencePiece (tokenizer.model) tokenizers.
Then: memwall quantize OUT.gguf Q4_K_M")]
    Convert(commands::convert::Args),
    /// Export a GGUF model as a Hugging Face checkpoint folder (safetensors,
    /// config, tokenizer) that transformers loads and `memwall convert` reads back.
    #[command(after_help = "Examples:
  memwall export SmolLM2-135M-Instruct.Q4_1.gguf ./SmolLM2-135M-Instruct
  memwall export model-Q4_K_M.gguf ./model-hf --dtype f32    exact dequantized values
  memwall export model.gguf ./model-hf --max-shard-size 2G --json

Weights are dequantized (every type `memwall inspect` marks dequantizable),
llama.cpp's Q/K row permutation is undone and experts are unstacked.
Architectures: llama (and mistral, mixtral), qwen2, qwen3, qwen3moe, command-r,
qwen35 and qwen35moe (Qwen3.5: its converter transforms undone, the MTP block
kept), gemma4 (as Gemma4ForCausalLM; not the E2B/E4B variants); byte-level BPE,
SentencePiece and Gemma 4 vocabularies. Then: memwall convert ./model-hf")]
    Export(commands::export::Args),
    /// Show what a GGUF file holds: header, metadata, hyper-parameters,
    /// tokenizer, tensors and totals.
    #[command(after_help = "Examples:
  memwall inspect SmolLM2-135M-Instruct.Q4_1.gguf
  memwall inspect model.gguf --full        every array element and the whole chat template
  memwall inspect model.gguf --json        machine-readable output

A split model (name-00001-of-00003.gguf) is opened as one model from any of its files.")]
    Inspect(commands::inspect::Args),
    /// Quantize a GGUF model: llama.cpp's types and mixes (same bytes as
    /// llama-quantize), or a mixed-precision recipe.
    #[command(after_help = "Examples:
  memwall quantize model-f16.gguf Q4_K_M                 writes model-Q4_K_M.gguf
  memwall quantize model-f16.gguf out.gguf Q5_K_M --imatrix imatrix.gguf
  memwall quantize model-f16.gguf out.gguf Q4_K_M --tensor-type 'attn_v=q8_0'
  memwall quantize model-f16.gguf out.gguf --recipe attn-f16-ffn-q4
  memwall quantize model-f16.gguf Q4_K_M --dry-run       the plan: types, sizes, file size
  memwall quantize model-f16.gguf Q4_K_M --dry-run --json
  memwall quantize model-f16.gguf out.gguf Q4_K_M 8       llama-quantize's trailing thread count
  memwall quantize model-f16.gguf out.gguf Q8_0 --override-kv general.name=str:mine

TYPE: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q1_0 Q2_0 Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L
      Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ2_M
      IQ3_XXS IQ3_XS IQ3_S IQ3_M IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4_MOE F16 BF16
      F32, or llama-quantize's number (15 = Q4_K_M); IQ1_*, IQ2_* and IQ3_XXS
      need --imatrix, as in llama-quantize. NVFP4 is a tensor type only
      (--tensor-type ffn=nvfp4), as in llama-quantize. As with
      llama-quantize, a thread count may follow TYPE. The short form names the
      output after the input without its -f16/-bf16/-f32: model-f16.gguf Q4_K_M
      writes model-Q4_K_M.gguf.
Built-in recipes: attn-f16-ffn-q4, attn-q8-ffn-q4, attn-q8-ffn-q4-down-q6; a
recipe file is TOML (see docs/RECIPES.md). The output records the recipe in
the memwall.recipe metadata key.")]
    Quantize(Box<commands::quantize::Args>),
    /// Perplexity of a text, computed as llama-perplexity does, and KL
    /// divergence against a reference model.
    #[command(after_help = "Examples:
  memwall perplexity -m model-f16.gguf -f wiki.test.raw                 PPL over 512-token windows
  memwall perplexity -m model-f16.gguf -f text.txt -c 256 --chunks 20 -t 8
  memwall perplexity -m model-f16.gguf -f text.txt --save-logits f16.kld
  memwall perplexity -m model-Q4_K_M.gguf --kl-divergence f16.kld       KLD, top-1 agreement, Δp
  memwall perplexity -m model-f16.gguf -f text.txt --save-logits f16.topk --top-k 64
  memwall perplexity -m model.gguf -f text.txt --json

Each window of -c tokens starts with BOS (when the vocabulary adds one) and
only its second half is scored, as llama-perplexity does; the numbers agree
with it (see docs/RUNTIME.md). The --save-logits file is llama.cpp's
--kl-divergence-base format, so either tool reads the other's; with --top-k it
is memwall's compact reference (about 16·K bytes a position instead of 2 per
vocabulary entry), which only memwall reads.")]
    Perplexity(commands::perplexity::Args),
    /// Check that a model file is fit to ship: structure, finite numbers, a
    /// forward pass, and quality against a reference; non-zero exit on failure.
    #[command(after_help = "Examples:
  memwall validate model-Q4_K_M.gguf
  memwall validate model-Q4_K_M.gguf --reference model-f16.gguf -f text.txt
  memwall validate model-Q4_K_M.gguf --reference model-f16.gguf -f text.txt --max-kld 0.05 --json

Checks: every tensor the architecture needs, with the right shape and type;
no NaN or infinity in values or block scales; a forward pass with finite
logits; with --reference, the KL divergence (and optionally the perplexity
ratio) on the text against a limit. Exit status 1 when any check fails.")]
    Validate(commands::validate::Args),
    /// Which quantization should I use? Makes the missing quantizations of a
    /// model, measures each one's quality loss against it and its size and speed.
    #[command(after_help = "Examples:
  memwall compare model-f16.gguf -f text.txt           Q4_K_M, Q5_K_M, Q6_K, attn-f16-ffn-q4
  memwall compare model-f16.gguf --types Q4_K_M,Q8_0,attn-q8-ffn-q4 -f a.txt -f b.txt
  memwall compare model-f16.gguf model-Q4_K_M-awq.gguf -f text.txt -c 256 --chunks 40
  memwall compare model-f16.gguf --dataset calib.jsonl --device phone-8gb -o report/
  memwall compare model-f16.gguf -f text.txt --json

Per file: size, bits per weight, perplexity, KL divergence and top-1 agreement
against BASE (as memwall perplexity computes them, on the same windows), and
the decode speed estimated for --device. The quantizations are kept in
--cache (memwall-cache next to BASE) and remade only when BASE changes.
Writes compare.md, compare.json and quality-vs-size.svg/.png to -o
(compare-<BASE stem>); the PNG needs a font (--font FILE).")]
    Compare(commands::compare::Args),
    /// Measure prompt-processing and decode speed (tokens/s), as llama-bench does.
    #[command(after_help = "Examples:
  memwall bench -m model-Q4_K_M.gguf                  pp512 and tg128 on every core
  memwall bench -m model.gguf -p 128,512 -n 64 -t 1,2,4 -b 128,512
  memwall bench -m model.gguf --json

pp N: N tokens evaluated in batches of -b from an empty cache (logits of each
batch's last token); tg N: N tokens decoded one at a time. One warm-up run,
then -r repetitions; mean ± standard deviation. bench/runtime.sh prints the
ratios against llama-bench on the same machine.")]
    Bench(commands::bench::Args),
    /// Generate text, or chat with the model's own template, streaming the reply.
    #[command(after_help = "Examples:
  memwall run -m model.gguf -p \"The capital of France is\" -n 32 --temp 0
  memwall run -m model.gguf --chat -p \"北京是哪个国家的首都？\"
  memwall run -m model.gguf --chat --system \"Answer briefly.\"      interactive
  memwall run -m model.gguf -f prompt.txt --stop \"\\n\\n\" --json

Sampling: --temp 0.7 --top-p 0.9 --top-k 40 --min-p 0.05 by default (--temp 0
is greedy; below ~0.3 small models start to repeat); --repeat-penalty with
--repeat-last-n; --seed. Generation stops at the model's end-of-turn tokens,
at -n tokens, at a --stop string or when the context (-c) is full. Afterwards
the prompt and decode speed, first-token latency and peak memory are printed
to standard error (in the JSON with --json).")]
    Run(commands::run::Args),
    /// Show how a model's tokenizer splits a text: ids and pieces, as
    /// llama-tokenize prints them.
    #[command(after_help = "Examples:
  memwall tokenize -m model.gguf -p \"Hello world\"
  memwall tokenize -m model.gguf -f prompt.txt --ids
  cat prompt.txt | memwall tokenize model.gguf --stdin --show-count

The same options and output as llama-tokenize: one `id -> 'piece'` line per
token, or --ids for a list; BOS as the model adds it (--no-bos leaves it
out); special tokens in the text are parsed (--no-parse-special reads them
as text); escapes such as \\n are processed (--no-escape keeps them).")]
    Tokenize(commands::tokenize::Args),
    /// Send a model (and the memwall runtime) to an Android phone through adb:
    /// checks storage and RAM first, resumes an interrupted push, verifies SHA-256.
    #[command(after_help = "Examples:
  memwall push model-Q4_K_M.gguf                       to /data/local/tmp/memwall on the only phone
  memwall push model-Q4_K_M.gguf --with-runtime        and target/aarch64-*/release/memwall
  memwall push model.gguf --with-runtime=./memwall-arm64 --serial R58M12345
  memwall push model.gguf --dest /sdcard/Download --ctx 4096 --json

adb comes from --adb, the ADB variable or PATH; --serial from ANDROID_SERIAL
when unset. The file goes in 64 MiB chunks into NAME.partial, is checked with
sha256sum on the phone and only then renamed to NAME; run the same command
again after an interruption to resume. At the end it prints the commands that
run the model on the phone (memwall run, llama.cpp's llama-cli).")]
    Push(commands::push::Args),
    /// Calibrate on text close to the model's real use: calibration sets,
    /// importance matrices, AWQ/GPTQ quantization into llama.cpp's formats.
    #[command(subcommand)]
    Calibrate(commands::calibrate::Command),
    /// Will it fit? Memory and decode speed of every quantization on a device,
    /// the recommended choice and the commands to run it.
    #[command(after_help = "Examples:
  memwall plan model-F16.gguf                       every type and recipe on a 16 GB phone
  memwall plan ./Qwen3-30B-A3B --device phone-12gb -c 4096
  memwall plan Qwen/Qwen3-32B --kv-type q8_0        config.json from the Hub is enough
  memwall plan --params 35e9 --layers 40 --kv-heads 32 --head-dim 128 --vocab 256000
  memwall plan model-F16.gguf --budget 9000 --write-recipe fit.toml
  memwall plan --list-devices
  memwall plan --measure-host --save this-machine.toml   then --device this-machine.toml

Weights are exact for a GGUF or a checkpoint (llama.cpp's mixing rules on the
real tensor shapes); memory adds the KV cache (layers × KV heads × head size ×
context × 2 × bytes), working buffers and the process; decode speed is the
slower of RAM bandwidth and compute, plus flash reads when the weights do not
fit (see docs/PLAN.md). Then: memwall quantize, memwall push.")]
    Plan(commands::plan::Args),
    /// The whole workflow on the built-in tiny-zh model, in about a minute:
    /// convert, quantize, calibrate, compare, plan, chat.
    #[command(after_help = "Examples:
  memwall demo                     writes into ./memwall-demo (or -2, -3… if it exists)
  memwall demo -o /tmp/demo -t 2

Each step prints the memwall command it runs, so the same steps work on your
own model. tiny-zh is a 6.3M-parameter Chinese/English llama trained for
memwall's tests (fixtures/tiny-zh); it is built into the binary.")]
    Demo(commands::demo::Args),
    /// Internal: renders one chat template request (JSON on standard input)
    /// with limited memory, for `memwall run --chat`.
    #[command(name = "__render-template", hide = true)]
    RenderTemplate,
}

/// Makes glibc return buffers of 128 KiB and more to the system when they are
/// freed: its default threshold, but fixed. Left alone, the threshold rises
/// with every large buffer freed, after which prompt batches' activations stay
/// in the heap: peak memory then depends on allocation history (up to two
/// batches' worth more), not on what is live — bad on a phone, and it would
/// make `memwall plan`'s prediction a guess.
fn release_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// Hands the heap pages the argument parser used (its description of every
/// command and option, freed by now) back to the system, so that the
/// process's peak memory is the model's: what `memwall plan` predicts.
fn return_parser_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory at the top of glibc's heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs one parsed command.
fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Convert(args) => commands::convert::run(args),
        Command::Export(args) => commands::export::run(args),
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Quantize(args) => commands::quantize::run(*args),
        Command::Perplexity(args) => commands::perplexity::run(args),
        Command::Validate(args) => commands::validate::run(args),
        Command::Compare(args) => commands::compare::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Tokenize(args) => commands::tokenize::run(args),
        Command::Push(args) => commands::push::run(args),
        Command::Calibrate(command) => commands::calibrate::run(command),
        Command::Plan(args) => commands::plan::run(args),
        Command::Demo(args) => commands::demo::run(args),
        Command::RenderTemplate => {
            commands::limit_address_space(chat::RENDER_MEMORY_LIMIT)?;
            chat::serve_render()
        }
    }
}

/// Parses and runs `memwall ARGS…` in this process (the demo's steps).
pub(crate) fn run_line(args: &[String]) -> anyhow::Result<()> {
    let line = std::iter::once("memwall".to_owned())
        .chain(args.iter().cloned())
        .map(std::ffi::OsString::from)
        .collect();
    let line = spellings::translate(line).map_err(anyhow::Error::msg)?;
    let cli = Cli::try_parse_from(line).map_err(|e| anyhow::anyhow!("{e}"))?;
    execute(cli.command)
}

fn main() -> ExitCode {
    signals::install();
    release_large_buffers();
    // llama.cpp's spellings first: a usage error, as clap's are.
    let line = match spellings::translate(std::env::args_os().collect()) {
        Ok(line) => line,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(line);
    return_parser_memory();
    let result = execute(cli.command);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("memwall: error: {err:#}");
            if let Some(hint) = commands::hint(&err) {
                eprintln!("hint: {hint}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Columns a line takes in a terminal (CJK characters take two).
    fn columns(line: &str) -> usize {
        line.chars()
            .map(|c| {
                if ('\u{1100}'..='\u{ffef}').contains(&c) {
                    2
                } else {
                    1
                }
            })
            .sum()
    }

    #[test]
    fn help_examples_never_wrap_mid_command() {
        // clap wraps help at 100 columns at most; an example line longer than
        // that would break in the middle of a command.
        fn check(cmd: &clap::Command, path: &str) {
            let path = format!("{path} {}", cmd.get_name());
            if let Some(text) = cmd.get_after_help() {
                for line in text.to_string().lines() {
                    assert!(
                        columns(line) <= 100,
                        "{path}: {} columns: {line}",
                        columns(line)
                    );
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &path);
            }
        }
        check(&super::Cli::command(), "");
    }

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
