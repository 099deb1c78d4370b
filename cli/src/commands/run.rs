//! `memwall run -m MODEL.gguf`: generate text from a prompt, or chat with the
//! model's own template, streaming whole UTF-8 characters as they come.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use memwall_runtime::forward::Model;
use memwall_runtime::generate::{Generator, Stats};
use memwall_runtime::kernels::Kernels;
use memwall_runtime::sampling::{Sampler, SamplerConfig};
use memwall_runtime::tokenizer::Tokenizer;
use serde_json::json;

use crate::chat::{ChatTemplate, Message};

/// ChatML, used (with a warning) when a model carries no template of its own.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Arguments of `memwall run`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: crate::args::ModelArg,
    /// The prompt (in chat mode: the first user message).
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from FILE (one newline at its end is dropped, as
    /// llama-cli does).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Tokens to generate at most (per reply in chat mode).
    #[arg(
        short = 'n',
        long = "n-predict",
        visible_alias = "predict",
        default_value_t = 256
    )]
    pub n_predict: usize,
    /// Chat: apply the model's chat template; without -p/-f, an interactive
    /// conversation on standard input (`/reset` forgets it, `/exit` or end of
    /// input ends it). With -p/-f, one reply (llama-cli's -cnv -st).
    #[arg(long)]
    pub chat: bool,
    /// llama-cli's -cnv: an interactive conversation (memwall's --chat without -p).
    #[arg(long, hide = true)]
    pub conversation: bool,
    /// llama-cli's -no-cnv: no conversation (memwall's default).
    #[arg(long, hide = true, conflicts_with_all = ["conversation", "chat"])]
    pub no_conversation: bool,
    /// llama-cli's -st: one reply, then exit (what --chat -p does).
    #[arg(long, hide = true)]
    pub single_turn: bool,
    /// A system message for chat mode (llama-cli's -sys).
    #[arg(long, visible_alias = "system-prompt", value_name = "TEXT")]
    pub system: Option<String>,
    /// Stop when the output contains TEXT (repeatable); TEXT is not printed.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Process escapes (\n, \t, \\, \xHH, …) in the prompt and --stop, as
    /// llama-cli does by default.
    #[arg(short = 'e', long = "escape", overrides_with = "no_escape")]
    pub escape: bool,
    /// Take the prompt and --stop as they are, backslashes included.
    #[arg(long = "no-escape", overrides_with = "escape")]
    pub no_escape: bool,
    /// Context length (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size", visible_alias = "ctx", value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub ctx: Option<usize>,
    #[command(flatten)]
    pub threads: crate::args::Threads,
    #[command(flatten)]
    pub batch: crate::args::Batch512,
    /// Temperature; 0 is greedy. Below ~0.3 small models start to repeat.
    #[arg(long = "temp", default_value_t = 0.7)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this total probability.
    #[arg(long, default_value_t = 0.9)]
    pub top_p: f32,
    /// Drop tokens less likely than this × the most likely one.
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for tokens seen in the last --repeat-last-n (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Window of the repetition penalty.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Seed of the sampler.
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
    /// KEY=TYPE:VALUE,…: read the model with these metadata values instead of
    /// the file's (TYPE int, float, bool or str; repeatable), as llama-cli's --override-kv.
    #[arg(long, value_name = "KEY=TYPE:VALUE,…")]
    pub override_kv: Vec<String>,
    #[command(flatten)]
    pub load: super::LoadArgs,
    /// Print one JSON object (text and statistics) instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// Peak resident memory of this process, in bytes.
fn peak_rss() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is valid.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    // Linux reports kilobytes.
    usage.ru_maxrss.max(0) as u64 * 1024
}

/// Resident pages of this process backed by files (its code and libraries;
/// the model too when mapped), from `/proc/self/status`; 0 where the system
/// does not say. They count in the peak RSS as far as the page cache holds
/// them, so that peak moves with what else the machine has read.
fn file_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("RssFile:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

fn stats_json(s: &Stats) -> serde_json::Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated,
        "first_token_ms": s.first_token.as_secs_f64() * 1e3,
        "prompt_tokens_per_second": s.prompt_tokens as f64 / s.prompt_time.as_secs_f64().max(1e-9),
        "decode_tokens_per_second": s.generated as f64 / s.decode_time.as_secs_f64().max(1e-9),
        "stopped_by": s.stopped_by.name(),
        "peak_rss_bytes": peak_rss(),
        "file_rss_bytes": file_rss(),
        "storage_read_bytes_per_token": s.decode_read.map(|b| b / s.generated.max(1) as u64),
    })
}

fn print_stats(s: &Stats) {
    let read = s.decode_read.map_or(String::new(), |b| {
        format!(
            "; {} read from storage per token",
            crate::render::human_bytes(b / s.generated.max(1) as u64)
        )
    });
    eprintln!(
        "\n[{} prompt tokens at {:.1} t/s, first token after {:.0} ms; {} generated at {:.1} t/s; stopped by {}; peak RSS {}{read}]",
        s.prompt_tokens,
        s.prompt_tokens as f64 / s.prompt_time.as_secs_f64().max(1e-9),
        s.first_token.as_secs_f64() * 1e3,
        s.generated,
        s.generated as f64 / s.decode_time.as_secs_f64().max(1e-9),
        s.stopped_by.name(),
        crate::render::human_bytes(peak_rss())
    );
}

/// Runs the command.
pub fn run(args: Args) -> Result<()> {
    let path = args.model.path()?.to_owned();
    if args.conversation && (args.prompt.is_some() || args.file.is_some()) && !args.single_turn {
        bail!(
            "llama-cli's -cnv -p answers the prompt and goes on talking; memwall's --chat -p \
             answers once (llama-cli's -st): add -st for that, or drop -p for a conversation"
        );
    }
    if args.system.is_some() && !(args.chat || args.conversation) {
        bail!("--system is a message of chat mode: add --chat");
    }
    let chat = args.chat || args.conversation;
    let overrides = super::parse_override_lists(&args.override_kv)?;
    let mut gguf = args.load.open(&path)?;
    super::apply_overrides(&mut gguf, &overrides);
    let tokenizer = Tokenizer::from_gguf(gguf.metadata())
        .with_context(|| format!("{}: tokenizer", path.display()))?;
    let trained = gguf
        .metadata()
        .get_str("general.architecture")
        .ok()
        .flatten()
        .and_then(|a| {
            gguf.metadata()
                .get_u64(&format!("{a}.context_length"))
                .ok()
                .flatten()
        })
        .unwrap_or(4096) as usize;
    let n_ctx = args.ctx.unwrap_or(trained.min(4096));
    let mut model = Model::new(&gguf, n_ctx)
        .with_context(|| format!("{}: cannot run this model", path.display()))?;
    if let Some(t) = args.threads.given() {
        model.set_compute(Kernels::from_env()?, t);
    }
    if let Some(r) = args.load.stream(&mut model)? {
        if !args.json {
            eprintln!(
                "streaming: {} locked in RAM ({} of {} layers{}), up to {} read from storage per token \
                 into {} of read-ahead buffers{}",
                crate::render::human_bytes(r.pinned_bytes),
                r.pinned_layers,
                model.config.n_layer,
                if r.output_pinned {
                    " and the output head"
                } else {
                    ""
                },
                crate::render::human_bytes(r.streamed_bytes),
                crate::render::human_bytes(r.ring_bytes),
                if r.direct || r.streamed_bytes == 0 {
                    ""
                } else {
                    " (through the page cache: this file system refuses direct reads)"
                }
            );
            if let Some(x) = &r.experts {
                eprintln!(
                    "streaming: experts read as routed, {} of {} held at a time ({} each, the most used kept)",
                    x.slots,
                    x.experts,
                    crate::render::human_bytes(x.bundle_bytes)
                );
            }
        }
    }
    let sampler = Sampler::new(SamplerConfig {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed: args.seed.unwrap_or(SamplerConfig::default().seed),
    });
    let mut engine = Generator::new(model, tokenizer, sampler, args.batch.batch);
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => {
            let mut text = std::fs::read_to_string(f)
                .with_context(|| format!("{}: cannot read the prompt", f.display()))?;
            if text.ends_with('\n') {
                text.pop();
            }
            Some(text)
        }
        (None, None) => None,
    };
    // llama-cli processes escapes in the prompt and its reverse prompts.
    let escape = !args.no_escape;
    let prompt = match prompt {
        Some(p) if escape => Some(super::unescape(&p, "the prompt")?),
        p => p,
    };
    let stops: Vec<String> = if escape {
        args.stop
            .iter()
            .map(|s| super::unescape(s, "--stop"))
            .collect::<Result<_>>()?
    } else {
        args.stop.clone()
    };
    if !chat {
        let Some(prompt) = prompt else {
            bail!("give a prompt with -p TEXT or -f FILE, or talk to the model with --chat");
        };
        let tokens = engine.tokenizer().encode(&prompt, true, true);
        return one_shot(&mut engine, &tokens, &args, &stops, Some(&prompt));
    }
    let template = chat_template(&gguf, args.json)?;
    let special = |id: Option<u32>| {
        id.and_then(|i| engine.tokenizer().token_text(i))
            .unwrap_or("")
            .to_owned()
    };
    let (bos, eos) = (
        special(engine.tokenizer().bos()),
        special(engine.tokenizer().eos()),
    );
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::new("system", system));
    }
    if let Some(prompt) = prompt {
        messages.push(Message::new("user", &prompt));
        let text = template.render_isolated(&messages, true, &bos, &eos)?;
        let tokens = engine.tokenizer().encode(&text, false, true);
        return one_shot(&mut engine, &tokens, &args, &stops, None);
    }
    repl(&mut engine, &template, messages, &args, &stops, &bos, &eos)
}

/// The model's chat template, or ChatML with a warning.
fn chat_template(gguf: &memwall_format::gguf::GgufModel, quiet: bool) -> Result<ChatTemplate> {
    match gguf
        .metadata()
        .get_str("tokenizer.chat_template")
        .ok()
        .flatten()
    {
        Some(source) => ChatTemplate::new(source),
        None => {
            if !quiet {
                eprintln!(
                    "memwall: warning: the model has no chat template (tokenizer.chat_template); using ChatML, which may not be what it was trained on"
                );
            }
            ChatTemplate::new(CHATML)
        }
    }
}

/// Generated text as it may reach a terminal. A model can emit escape
/// sequences it learned from its training text (colours, window titles,
/// cursor moves), often split over several tokens: those are dropped whole
/// (CSI `ESC [ … final`, OSC `ESC ] … BEL` or `ESC \`, other `ESC x`, and the
/// C1 forms), and any other control character but newline and tab becomes
/// U+FFFD. `--json` keeps the text as generated.
#[derive(Default)]
struct TerminalText {
    state: Escape,
}

/// Where a [`TerminalText`] is inside an escape sequence.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
enum Escape {
    /// Plain text.
    #[default]
    None,
    /// After ESC.
    Start,
    /// After ESC and an intermediate byte (`ESC ( B`).
    Intermediate,
    /// Inside a control sequence (`ESC [`), until its final byte.
    Csi,
    /// Inside a string (OSC, DCS, SOS, PM, APC), until BEL or ST.
    Text,
    /// After ESC inside a string (`ESC \` ends it).
    TextEsc,
}

impl TerminalText {
    /// The part of `piece` that may be printed, given what came before.
    fn push(&mut self, piece: &str) -> String {
        let mut out = String::with_capacity(piece.len());
        for c in piece.chars() {
            self.state = match (self.state, c) {
                (Escape::None, '\u{1b}') => Escape::Start,
                (Escape::None, '\u{9b}') => Escape::Csi,
                (Escape::None, '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}') => {
                    Escape::Text
                }
                (Escape::None, c) => {
                    out.push(if c.is_control() && c != '\n' && c != '\t' {
                        '\u{fffd}'
                    } else {
                        c
                    });
                    Escape::None
                }
                (Escape::Start, '[') => Escape::Csi,
                (Escape::Start, ']' | 'P' | 'X' | '^' | '_') => Escape::Text,
                (Escape::Start | Escape::Intermediate, ' '..='/') => Escape::Intermediate,
                (Escape::Start | Escape::Intermediate, '0'..='~') => Escape::None,
                (Escape::Csi, ' '..='?') => Escape::Csi,
                (Escape::Csi, '@'..='~') => Escape::None,
                // A string ends at BEL or ST; a newline ends it too, so that text
                // after an unterminated string is not swallowed.
                (Escape::Text, '\u{7}' | '\u{9c}') => Escape::None,
                (Escape::Text, '\u{1b}') => Escape::TextEsc,
                (Escape::TextEsc, '\\') => Escape::None,
                (Escape::Text | Escape::TextEsc, '\n') => {
                    out.push('\n');
                    Escape::None
                }
                (Escape::Text | Escape::TextEsc, _) => Escape::Text,
                // Not a sequence after all: what follows the ESC is text again.
                (_, c) => {
                    self.state = Escape::None;
                    out.push_str(&self.push(&c.to_string()));
                    self.state
                }
            };
        }
        out
    }
}

/// Generates once after `tokens` and prints the result.
fn one_shot(
    engine: &mut Generator,
    tokens: &[u32],
    args: &Args,
    stops: &[String],
    echo: Option<&str>,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let mut terminal = TerminalText::default();
    if !args.json {
        if let Some(p) = echo {
            write!(out, "{}", TerminalText::default().push(p))?;
            out.flush()?;
        }
    }
    let json = args.json;
    let mut emit = |piece: &str| {
        if !json {
            let _ = out.write_all(terminal.push(piece).as_bytes());
            let _ = out.flush();
        }
    };
    let (text, stats) = engine.generate(tokens, args.n_predict, stops, &mut emit)?;
    if json {
        let mut report = stats_json(&stats);
        report["text"] = json!(text);
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!();
        print_stats(&stats);
    }
    Ok(())
}

/// The interactive conversation: one user message per line of standard input.
fn repl(
    engine: &mut Generator,
    template: &ChatTemplate,
    start: Vec<Message>,
    args: &Args,
    stops: &[String],
    bos: &str,
    eos: &str,
) -> Result<()> {
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("chat with the model; /reset forgets the conversation, /exit or Ctrl-D ends it");
    }
    let mut messages = start.clone();
    let mut turns = Vec::new();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading standard input")?;
        let line = line.trim_end_matches('\r');
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = start.clone();
                engine.sampler_mut().reset();
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", line));
        let text = template.render_isolated(&messages, true, bos, eos)?;
        let tokens = engine.tokenizer().encode(&text, false, true);
        let json = args.json;
        let mut out = std::io::stdout().lock();
        let mut terminal = TerminalText::default();
        let mut emit = |piece: &str| {
            if !json {
                let _ = out.write_all(terminal.push(piece).as_bytes());
                let _ = out.flush();
            }
        };
        let (reply, stats) = engine.generate(&tokens, args.n_predict, stops, &mut emit)?;
        drop(out);
        if json {
            let mut turn = stats_json(&stats);
            turn["user"] = json!(line);
            turn["reply"] = json!(reply);
            turn["prompt_ids"] = json!(tokens);
            turns.push(turn);
        } else {
            println!();
            // On standard error, so piped replies stay clean.
            print_stats(&stats);
        }
        messages.push(Message::new("assistant", reply.trim()));
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "turns": turns }))?
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::TerminalText;

    fn filtered(pieces: &[&str]) -> String {
        let mut t = TerminalText::default();
        pieces.iter().map(|p| t.push(p)).collect()
    }

    #[test]
    fn escape_sequences_are_dropped_even_split_across_tokens() {
        assert_eq!(filtered(&["\u{1b}[33m  -- hi\u{1b}[m"]), "  -- hi");
        assert_eq!(
            filtered(&["a\u{1b}", "[3", "1;1", "m", "red", "\u{1b}[0", "m."]),
            "ared."
        );
        // A window title (OSC), ended by BEL or by ST split over two tokens.
        assert_eq!(filtered(&["x\u{1b}]0;pwned\u{7}y"]), "xy");
        assert_eq!(filtered(&["x\u{1b}]2;t", "itle\u{1b}", "\\y"]), "xy");
        // C1 forms and two- and three-character sequences.
        assert_eq!(filtered(&["a\u{9b}2Jb\u{1b}cd\u{1b}(Be"]), "abde");
    }

    #[test]
    fn other_control_characters_become_replacement_characters() {
        assert_eq!(
            filtered(&["a\u{7}b\rc\n\td\u{85}"]),
            "a\u{fffd}b\u{fffd}c\n\td\u{fffd}"
        );
        // An ESC before something that ends no sequence: the rest is text.
        assert_eq!(filtered(&["a\u{1b}", "\u{1b}[1mb"]), "ab");
        assert_eq!(filtered(&["a\u{1b}é"]), "aé");
    }

    #[test]
    fn an_unterminated_string_ends_at_a_newline() {
        assert_eq!(
            filtered(&["a\u{1b}]0;never ended", "\nnext line"]),
            "a\nnext line"
        );
    }
}
