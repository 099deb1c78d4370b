//! The `memwall` command-line tool: argument parsing, settings, rendering and
//! exit codes. All work happens in the library crates; this binary is the only
//! place in memwall that prints.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod commands;
mod render;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Get large language models through the memory wall and onto phones.
#[derive(Parser)]
#[command(name = "memwall", version, about, long_about = None)]
#[command(after_help = "Examples:
  memwall inspect model.gguf               header, metadata, tensors, totals
  memwall inspect model.gguf --json | jq   the same, for scripts
  memwall inspect model-00001-of-00003.gguf   a split model, all files at once

Run `memwall <command> --help` for the options of each command.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a GGUF file holds: header, metadata, hyper-parameters,
    /// tokenizer, tensors and totals.
    #[command(after_help = "Examples:
  memwall inspect SmolLM2-135M-Instruct.Q4_1.gguf
  memwall inspect model.gguf --full        every array element and the whole chat template
  memwall inspect model.gguf --json        machine-readable output

A split model (name-00001-of-00003.gguf) is opened as one model from any of its files.")]
    Inspect(commands::inspect::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => commands::inspect::run(args),
    };
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
