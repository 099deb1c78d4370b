//! The user documents cannot drift from the binary: every fenced `console`
//! block of README.md, docs/GUIDE.md, docs/zh/GUIDE.md and
//! docs/zh/QUICKSTART.md is run and its output compared with what the block
//! quotes, the way `trycmd` checks command transcripts. A document's other
//! blocks are commands to adapt (`bash`) or file formats (`toml`); a block
//! that quotes output without its command fails the test, and so does any
//! change of output until the document follows.
//!
//! A `console` block holds `$ COMMAND` lines (continued with `\`), each
//! followed by the output it prints (standard output and error, as a
//! terminal shows them). In the quoted output:
//! - a line `…` stands for any number of lines (the output is cut there);
//! - numbers that depend on the machine (seconds, speeds, memory peaks,
//!   kernel names, a measured profile's values) are compared as placeholders;
//! - a command whose output quotes `memwall: error:` or `error:` must fail,
//!   any other must succeed.
//!
//! Commands run in a scratch folder that holds the repository's `fixtures`
//! and, as the guide's folders, the published `config.json` of the large
//! models it plans (fixtures/configs); `/tmp/` in a command is that folder's
//! `tmp/`. `memwall` (or `cargo run --release --`) is the binary under test,
//! `cat FILE` prints a file, `mkdir -p DIR` makes one, `NAME=value` sets a
//! variable for the rest of the document (exported to its commands, `$NAME`
//! expands to it) and `NAME=value COMMAND` sets it for that command only. Commands the demo ran are taken
//! from its transcript (it prints each command and its output); a command
//! already run in the same scratch folder is not run again.
//!
//! To update a document, `MEMWALL_DOCS_DUMP=FILE cargo test -p memwall --test
//! docs` writes every command's output, as printed, to FILE.

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::repo;
use regex::Regex;

/// A fenced block of a document.
struct Block {
    doc: String,
    /// Line of the opening fence (1-based).
    line: usize,
    lang: String,
    body: Vec<String>,
}

fn blocks(doc: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(repo().join(doc)).unwrap();
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => {
                open = Some(Block {
                    doc: doc.to_owned(),
                    line: i + 1,
                    lang: lang.trim().to_owned(),
                    body: Vec::new(),
                })
            }
            (Some(_), Some("")) => out.push(open.take().unwrap()),
            (Some(b), _) => b.body.push(line.to_owned()),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{doc}: a fenced block is not closed");
    out
}

/// Words of a shell command line: quotes, `$NAME` and `${NAME}`, `#` comments.
fn words(line: &str, vars: &HashMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut started = false;
    let mut chars = line.chars().peekable();
    let expand = |chars: &mut std::iter::Peekable<std::str::Chars>, word: &mut String| {
        let braced = chars.peek() == Some(&'{');
        if braced {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if braced {
            assert_eq!(chars.next(), Some('}'), "{line}");
        }
        let value = vars
            .get(&name)
            .unwrap_or_else(|| panic!("${name} is not set before: {line}"));
        word.push_str(value);
    };
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            '#' if !started => break,
            '\'' => {
                started = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                started = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.push(chars.next().unwrap()),
                        '$' => expand(&mut chars, &mut word),
                        c => word.push(c),
                    }
                }
            }
            '$' => {
                started = true;
                expand(&mut chars, &mut word);
            }
            '\\' => {
                started = true;
                word.push(chars.next().unwrap());
            }
            c => {
                started = true;
                word.push(c);
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

/// One `$ COMMAND` of a console block and the output it quotes.
struct Step {
    line: usize,
    command: String,
    expected: Vec<String>,
}

fn steps(block: &Block) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut lines = block.body.iter().enumerate();
    while let Some((i, line)) = lines.next() {
        if let Some(cmd) = line.strip_prefix("$ ") {
            let mut command = cmd.to_owned();
            while command.ends_with('\\') {
                command.pop();
                let (_, next) = lines.next().expect("a continued line");
                command.push(' ');
                command.push_str(next.trim());
            }
            out.push(Step {
                line: block.line + 1 + i,
                command,
                expected: Vec::new(),
            });
        } else {
            let step = out.last_mut().unwrap_or_else(|| {
                panic!(
                    "{}:{}: a console block starts with its `$ COMMAND`",
                    block.doc, block.line
                )
            });
            step.expected.push(line.clone());
        }
    }
    out
}

/// What machine-dependent values become before comparing.
fn redactions() -> Vec<(Regex, &'static str)> {
    [
        // Seconds and milliseconds.
        (r"\b\d+(\.\d+)? (s|ms)\b", "# $2"),
        // Measured speeds (plan's estimates, "tokens/s on DEVICE", stay).
        (r"\b\d+(\.\d+)? (t/s|[KMG]?i?B/s)", "# $2"),
        (r"\(\d+ tokens/s,", "(# tokens/s,"),
        (r"\| (pp|tg)(\d+) \| [\d.]+ ± [\d.]+ \|", "| $1$2 | # ± # |"),
        // Memory and storage the process saw.
        (r"peak RSS [\d.]+ ([KMG]iB|B)", "peak RSS #"),
        (
            r"[\d.]+ ([KMG]iB|B) read from storage per token",
            "# read from storage per token",
        ),
        (
            r" \(through the page cache: this file system refuses direct reads\)",
            "",
        ),
        // The CPU's kernels and cores.
        (r"\b(avx512|avx2|scalar|neon-dot|neon)\b", "[kernels]"),
        (r"\(\d+ threads", "(# threads"),
        (r"\bon \d+ threads", "on # threads"),
        // Scratch files named after the process.
        (r"memwall-push-\d+\.chunk", "memwall-push-#.chunk"),
        // A measured device profile.
        (r"^(\w+) = -?\d[\d.]*$", "$1 = #"),
        (
            r"measured by memwall plan --measure-host on [^\x22]*",
            "measured on #",
        ),
        // The PNG chart needs a font the machine may not have.
        (r", quality-vs-size\.png", ""),
        (r" \(and \.png when a font was found\)", ""),
    ]
    .into_iter()
    .map(|(re, to)| (Regex::new(re).unwrap(), to))
    .collect()
}

fn normalize(lines: &[String], rules: &[(Regex, &str)]) -> Vec<String> {
    let mut out: Vec<String> = lines
        .iter()
        .map(|l| {
            rules.iter().fold(l.trim_end().to_owned(), |l, (re, to)| {
                re.replace_all(&l, *to).into_owned()
            })
        })
        .collect();
    while out.first().is_some_and(String::is_empty) {
        out.remove(0);
    }
    while out.last().is_some_and(String::is_empty) {
        out.pop();
    }
    out
}

/// Whether `actual` is `expected`, a line `…` standing for any lines.
fn matches(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "…" => {
            (0..=actual.len()).any(|skip| matches(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(a, more)| a == first && matches(rest, more)),
    }
}

/// What a command printed (standard output and error in the order written) and
/// whether it succeeded.
#[derive(Clone)]
struct Ran {
    output: Vec<String>,
    ok: bool,
}

/// The scratch folder the documents' commands run in, and what ran there.
struct Session {
    dir: tempfile::TempDir,
    vars: HashMap<String, String>,
    ran: HashMap<Vec<String>, Ran>,
    rules: Vec<(Regex, &'static str)>,
    console_blocks: usize,
    /// What the documents quote wrongly, all of it reported at the end.
    failures: Vec<String>,
}

impl Session {
    fn new() -> Session {
        let dir = tempfile::tempdir().unwrap();
        let root = repo().canonicalize().unwrap();
        std::os::unix::fs::symlink(root.join("fixtures"), dir.path().join("fixtures")).unwrap();
        for model in [
            "Qwen2.5-32B-Instruct",
            "Qwen3-30B-A3B",
            "c4ai-command-r-v01",
            "Qwen3.5-35B-A3B",
            "gemma-4-26B-A4B-it",
            "gemma-4-31B-it",
        ] {
            std::fs::create_dir(dir.path().join(model)).unwrap();
            std::fs::copy(
                root.join("fixtures/configs")
                    .join(model)
                    .join("config.json"),
                dir.path().join(model).join("config.json"),
            )
            .unwrap();
        }
        std::fs::create_dir(dir.path().join("tmp")).unwrap();
        Session {
            dir,
            vars: HashMap::new(),
            ran: HashMap::new(),
            rules: redactions(),
            console_blocks: 0,
            failures: Vec::new(),
        }
    }

    fn scratch(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// The command's words with `/tmp/` moved into the scratch folder.
    fn localize(&self, words: Vec<String>) -> Vec<String> {
        let tmp = format!("{}/tmp/", self.scratch());
        words
            .into_iter()
            .map(|w| w.replace("/tmp/", &tmp))
            .collect()
    }

    /// The scratch folder's paths as the document writes them.
    fn unlocalize(&self, text: &str) -> String {
        let scratch = self.scratch();
        text.replace(&format!("{scratch}/tmp/"), "/tmp/")
            .replace(&format!("{scratch}/"), "")
            .replace(&scratch, ".")
    }

    fn run(&mut self, words: Vec<String>, at: &str) -> Ran {
        let words = self.localize(words);
        let mut key = words.clone();
        let mut env: Vec<(&String, &String)> = self.vars.iter().collect();
        env.sort();
        key.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        if let Some(ran) = self.ran.get(&key) {
            return ran.clone();
        }
        let ran = match words[0].as_str() {
            "cat" => {
                assert_eq!(words.len(), 2, "{at}: cat FILE");
                let text = std::fs::read_to_string(self.dir.path().join(&words[1]))
                    .unwrap_or_else(|e| panic!("{at}: cat {}: {e}", words[1]));
                Ran {
                    output: text.lines().map(str::to_owned).collect(),
                    ok: true,
                }
            }
            "mkdir" if words.len() == 3 && words[1] == "-p" => {
                std::fs::create_dir_all(self.dir.path().join(&words[2])).unwrap();
                Ran {
                    output: Vec::new(),
                    ok: true,
                }
            }
            "memwall" => self.memwall(&words[1..]),
            other => panic!("{at}: `{other}` is not a command the documents' test runs"),
        };
        if words.get(1).map(String::as_str) == Some("demo") {
            self.remember_demo_steps(&ran, &key[words.len()..]);
        }
        self.ran.insert(key, ran.clone());
        ran
    }

    fn memwall(&self, args: &[String]) -> Ran {
        let log = self.dir.path().join(".output");
        let file = std::fs::File::create(&log).unwrap();
        let status = Command::new(env!("CARGO_BIN_EXE_memwall"))
            .args(args)
            .current_dir(self.dir.path())
            .envs(&self.vars)
            .env("HF_HUB_OFFLINE", "1")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .status()
            .unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        Ran {
            output: self.unlocalize(&text).lines().map(str::to_owned).collect(),
            ok: status.success(),
        }
    }

    /// The demo prints `$ memwall …` before each step and `   (N s)` after:
    /// each step's output is that command's.
    fn remember_demo_steps(&mut self, demo: &Ran, env: &[String]) {
        let mut lines = demo.output.iter().peekable();
        while let Some(line) = lines.next() {
            let Some(command) = line.strip_prefix("$ ") else {
                continue;
            };
            let mut output = Vec::new();
            while let Some(l) = lines.next_if(|l| !(l.starts_with("   (") && l.ends_with(" s)"))) {
                output.push(l.clone());
            }
            let mut key = self.localize(words(command, &HashMap::new()));
            key.extend(env.iter().cloned());
            self.ran.insert(key, Ran { output, ok: true });
        }
    }

    /// Runs a console block and compares each command's output with the quote.
    fn check(&mut self, block: &Block) {
        self.console_blocks += 1;
        for step in steps(block) {
            let at = format!("{}:{}", block.doc, step.line);
            let words = words(&step.command, &self.vars);
            let assignment = match words.as_slice() {
                [w] | [_, w] if words.len() == 1 || words[0] == "export" => Some(w),
                _ => None,
            }
            .filter(|w| w.contains('=') && !w.starts_with('-'));
            if let Some((name, value)) = assignment.and_then(|w| w.split_once('=')) {
                assert!(
                    step.expected.is_empty(),
                    "{at}: an assignment prints nothing"
                );
                let value = self.localize(vec![value.to_owned()]).remove(0);
                self.vars.insert(name.to_owned(), value);
                continue;
            }
            // `NAME=value COMMAND`: the variable for this command only.
            let mut words = words;
            let mut saved = Vec::new();
            while words.len() > 1 && words[0].contains('=') && !words[0].starts_with('-') {
                let word = words.remove(0);
                let (name, value) = word.split_once('=').unwrap();
                let value = self.localize(vec![value.to_owned()]).remove(0);
                saved.push((name.to_owned(), self.vars.insert(name.to_owned(), value)));
            }
            let words: Vec<String> = match words.as_slice() {
                [cargo, run, release, dashes, rest @ ..]
                    if cargo == "cargo"
                        && run == "run"
                        && release == "--release"
                        && dashes == "--" =>
                {
                    std::iter::once("memwall".to_owned())
                        .chain(rest.iter().cloned())
                        .collect()
                }
                _ => words,
            };
            let ran = self.run(words, &at);
            for (name, old) in saved.into_iter().rev() {
                match old {
                    Some(v) => self.vars.insert(name, v),
                    None => self.vars.remove(&name),
                };
            }
            let expected = normalize(&step.expected, &self.rules);
            let fails = expected
                .iter()
                .any(|l| l.starts_with("memwall: error:") || l.starts_with("error:"));
            if ran.ok == fails {
                self.failures.push(format!(
                    "{at}: `{}` {}:\n{}",
                    step.command,
                    if fails { "should fail" } else { "failed" },
                    ran.output.join("\n")
                ));
            }
            // For whoever updates a document: every command's output, as printed.
            if let Ok(dump) = std::env::var("MEMWALL_DOCS_DUMP") {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dump)
                    .unwrap();
                writeln!(f, "=== {at}\n$ {}\n{}", step.command, ran.output.join("\n")).unwrap();
            }
            let actual = normalize(&ran.output, &self.rules);
            if !expected.is_empty() && !matches(&expected, &actual) {
                self.failures.push(format!(
                    "{at}: `{}` prints something else now; update the document.\n\
                     --- quoted (machine-dependent values as #) ---\n{}\n\
                     --- printed ---\n{}\n",
                    step.command,
                    expected.join("\n"),
                    actual.join("\n")
                ));
            }
        }
    }
}

/// Commands a `bash` block may hold: no output there (it goes in `console`).
const COMMANDS: [&str; 9] = [
    "memwall",
    "cargo",
    "adb",
    "llama-cli",
    "llama-quantize",
    "rustup",
    "export",
    "scripts/test.sh",
    "MEMWALL_SKIP_AARCH64=1",
];

fn check_documents(docs: &[&str], session: &mut Session) {
    for doc in docs {
        // A document's variables are its own.
        session.vars.clear();
        for block in blocks(doc) {
            let at = format!("{}:{}", block.doc, block.line);
            match block.lang.as_str() {
                "console" => session.check(&block),
                "bash" | "sh" => {
                    let mut continued = false;
                    for line in &block.body {
                        let first = line.split_whitespace().next().unwrap_or("");
                        let command = COMMANDS.contains(&first)
                            || first.contains('=') && !first.starts_with('-');
                        assert!(
                            continued || line.trim().is_empty() || command,
                            "{at}: `{line}` looks like output: quote output in a console \
                             block, after its `$ COMMAND`"
                        );
                        continued = line.trim_end().ends_with('\\');
                    }
                }
                "toml" => {}
                other => panic!(
                    "{at}: a ```{other} block: commands and their output go in ```console \
                     blocks, commands to adapt in ```bash, file formats in ```toml"
                ),
            }
        }
    }
}

#[test]
fn the_readme_and_the_quick_start_run_as_quoted() {
    let mut session = Session::new();
    check_documents(&["README.md", "docs/zh/QUICKSTART.md"], &mut session);
    assert!(
        session.failures.is_empty(),
        "{}",
        session.failures.join("\n")
    );
    assert!(
        session.console_blocks >= 5,
        "{} console blocks",
        session.console_blocks
    );
}

#[test]
fn the_guides_quote_what_the_commands_print() {
    // One scratch folder for both: the Chinese guide quotes the same commands.
    let mut session = Session::new();
    check_documents(&["docs/GUIDE.md"], &mut session);
    assert!(
        session.failures.is_empty(),
        "{}",
        session.failures.join("\n")
    );
    let english = session.console_blocks;
    assert!(english >= 20, "{english} console blocks");
    check_documents(&["docs/zh/GUIDE.md"], &mut session);
    assert!(
        session.failures.is_empty(),
        "{}",
        session.failures.join("\n")
    );
    assert!(
        session.console_blocks >= 2 * english - 2,
        "the Chinese guide quotes less"
    );
}

#[test]
fn quoted_output_is_compared_line_by_line_with_cuts() {
    let lines = |s: &str| s.lines().map(str::to_owned).collect::<Vec<_>>();
    assert!(matches(&lines("a\n…\nd"), &lines("a\nb\nc\nd")));
    assert!(matches(&lines("…\nd"), &lines("d")));
    assert!(!matches(&lines("a\n…\nd"), &lines("a\nb\nc")));
    assert!(!matches(&lines("a\nd"), &lines("a\nb\nd")));
    let rules = redactions();
    let n = |s: &str| normalize(&lines(s), &rules).join("\n");
    assert_eq!(
        n("[22 prompt tokens at 2033.0 t/s, first token after 11 ms; peak RSS 14.4 MiB]"),
        n("[22 prompt tokens at 1.5 t/s, first token after 900 ms; peak RSS 1.2 GiB]")
    );
    assert_ne!(
        n("Q2_K 10.8 GiB 15.7 (compute)"),
        n("Q2_K 10.9 GiB 15.7 (compute)")
    );
    let vars = HashMap::from([("T".to_owned(), "a b".to_owned())]);
    assert_eq!(
        words(r#"run -p "北京 $T" 'x y' z\ w # comment"#, &vars),
        ["run", "-p", "北京 a b", "x y", "z w"]
    );
}
