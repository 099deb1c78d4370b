//! Chat templates: the Jinja template a model carries in
//! `tokenizer.chat_template`, rendered with minijinja the way transformers
//! renders it with jinja2 (`trim_blocks`, `lstrip_blocks`, Python's string
//! methods, `raise_exception`, `strftime_now`, `{% generation %}` blocks,
//! `tools` and `documents` given as Python's `None`, and jinja2's `length`
//! and `iterable` where they differ from minijinja's), with a fuel limit so
//! that a hostile template cannot run forever and an output limit so that it
//! cannot write without end.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use minijinja::value::{Object, ObjectRepr};
use minijinja::{Environment, Error, ErrorKind, State, Value, context};
use serde_json::json;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_owned(),
            content: content.to_owned(),
        }
    }
}

/// Instructions a template may execute before it is stopped. Real templates
/// need a few dozen (Qwen, Llama) to a few thousand (Gemma 4, the costliest
/// of llama.cpp's collection: 3.6 million for 1000 messages) per message; a
/// hostile one stops within about a second.
pub(crate) const FUEL: u64 = 10_000_000;

/// Output a template may write besides its inputs: the markup around the
/// messages of a long conversation takes a few KB.
const OUTPUT_SLACK: usize = 16 << 20;

/// The most a template may write for `input` bytes of messages and special
/// tokens: each input a few times over (a template may repeat the system
/// prompt or the last message) plus [`OUTPUT_SLACK`].
pub(crate) fn output_limit(input: usize) -> usize {
    input.saturating_mul(4).saturating_add(OUTPUT_SLACK)
}

/// A byte sink that refuses to grow past its limit, so that rendering stops
/// at the first write over it instead of filling memory.
struct Capped {
    out: Vec<u8>,
    limit: usize,
    full: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            self.full = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Python's `None` as transformers passes it for `tools` and `documents`:
/// minijinja's own none iterates as an empty list and `is iterable`, where
/// jinja2 raises (`for tool in tools`) and says false. This one is false, is
/// `none` (the test is replaced to say so), prints `None` and cannot be
/// iterated or measured.
#[derive(Debug)]
struct PyNone;

impl Object for PyNone {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn is_true(self: &Arc<Self>) -> bool {
        false
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("None")
    }
}

fn is_none(v: &Value) -> bool {
    v.is_none() || v.downcast_object_ref::<PyNone>().is_some()
}

/// [`PyNone`] as minijinja's none, which its filters read as an empty list.
fn empty_if_none(v: Value) -> Value {
    if is_none(&v) { Value::from(()) } else { v }
}

/// transformers' `{% generation %}` … `{% endgeneration %}` (its
/// AssistantTracker extension, which renders the body unchanged) as an
/// `{% if true %}` block with the same whitespace control.
fn rewrite_generation_blocks(source: &str) -> String {
    // `-`/`+` whitespace control at the start of `t`, and the rest.
    fn marker(t: &str) -> (Option<char>, &str) {
        match t.chars().next() {
            Some(c @ ('-' | '+')) => (Some(c), &t[1..]),
            _ => (None, t),
        }
    }
    // The rewritten tag and what follows it, if `tag` (after `{%`) is one.
    fn rewrite(tag: &str) -> Option<(String, &str)> {
        let (open, body) = marker(tag);
        let body = body.trim_start();
        let (statement, body) = match body.strip_prefix("endgeneration") {
            Some(b) => ("endif", b),
            None => ("if true", body.strip_prefix("generation")?),
        };
        let (close, body) = marker(body.trim_start());
        let after = body.strip_prefix("%}")?;
        let [open, close] = [open, close].map(|m| m.map(String::from).unwrap_or_default());
        Some((format!("{{%{open} {statement} {close}%}}"), after))
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i + 2..];
        match rewrite(tag) {
            Some((rewritten, after)) => {
                out.push_str(&rewritten);
                rest = after;
            }
            None => {
                out.push_str("{%");
                rest = tag;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[test]
fn generation_blocks_become_if_blocks_with_the_same_whitespace_control() {
    assert_eq!(
        rewrite_generation_blocks(
            "a{%- generation %}b{% endgeneration -%} {%generations%}{% if x %}"
        ),
        "a{%- if true %}b{% endif -%} {%generations%}{% if x %}"
    );
}

/// The hidden subcommand of the memwall binary that renders one template in
/// a child process ([`ChatTemplate::render_isolated`], [`serve_render`]).
pub(crate) const RENDER_SUBCOMMAND: &str = "__render-template";

/// Address space (RLIMIT_AS) of the child that renders a template: minijinja
/// has no memory limit, and `('x' * 99999999)|list` asks for gigabytes in one
/// instruction, which aborts the process. Real templates render in a few MB
/// (the child's binary and heap included, well under 100 MB).
pub(crate) const RENDER_MEMORY_LIMIT: u64 = 1 << 30;

/// Wall-clock time the child may take; the fuel limit stops it within about
/// a second, this is for whatever else keeps it from answering.
const RENDER_TIMEOUT: Duration = Duration::from_secs(10);

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The source, for the child of [`ChatTemplate::render_isolated`].
    source: String,
    fuel: u64,
}

impl ChatTemplate {
    /// Compiles `source`.
    pub fn new(source: &str) -> Result<ChatTemplate> {
        Self::with_fuel(source, FUEL)
    }

    /// Compiles `source` with another fuel limit: the fuzz target's
    /// instrumented build runs each instruction about ten times slower.
    pub(crate) fn with_fuel(source: &str, fuel: u64) -> Result<ChatTemplate> {
        Self::build(source, fuel, None)
    }

    /// Compiles `source` with `strftime_now` reading `clock` (seconds since
    /// 1970, UTC) instead of the system clock, or the system clock for `None`.
    fn build(source: &str, fuel: u64, clock: Option<u64>) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(fuel));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        // jinja2: `None is iterable` is false, `Undefined|length` is 0.
        env.add_test("none", |v: Value| is_none(&v));
        env.add_test("iterable", |v: Value| !is_none(&v) && v.try_iter().is_ok());
        let length = |v: Value| -> Result<usize, Error> {
            if v.is_undefined() {
                return Ok(0);
            }
            v.len().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    format!("object of type '{}' has no len()", v.kind()),
                )
            })
        };
        env.add_filter("length", length);
        env.add_filter("count", length);
        // jinja2's select/reject/map filters take None as an empty list.
        use minijinja::filters;
        use minijinja::value::Rest;
        type Name<'a> = Option<std::borrow::Cow<'a, str>>;
        type Attr<'a> = std::borrow::Cow<'a, str>;
        env.add_filter(
            "select",
            |st: &State, v: Value, t: Name<'_>, a: Rest<Value>| {
                filters::select(st, empty_if_none(v), t, a)
            },
        );
        env.add_filter(
            "reject",
            |st: &State, v: Value, t: Name<'_>, a: Rest<Value>| {
                filters::reject(st, empty_if_none(v), t, a)
            },
        );
        env.add_filter(
            "selectattr",
            |st: &State, v: Value, k: Attr<'_>, t: Name<'_>, a: Rest<Value>| {
                filters::selectattr(st, empty_if_none(v), k, t, a)
            },
        );
        env.add_filter(
            "rejectattr",
            |st: &State, v: Value, k: Attr<'_>, t: Name<'_>, a: Rest<Value>| {
                filters::rejectattr(st, empty_if_none(v), k, t, a)
            },
        );
        env.add_filter("map", |st: &State, v: Value, a: Rest<Value>| {
            filters::map(st, empty_if_none(v), a)
        });
        env.add_function("strftime_now", move |format: String| -> String {
            let secs = clock.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
            });
            strftime(secs, &format)
        });
        env.add_template_owned("chat".to_owned(), rewrite_generation_blocks(source))
            .map_err(|e| anyhow!("the chat template does not compile: {e}"))?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            fuel,
        })
    }

    /// Renders `messages` as [`ChatTemplate::render`] does, but in a child
    /// process (`memwall __render-template`) whose memory is limited to
    /// [`RENDER_MEMORY_LIMIT`] and which is killed after [`RENDER_TIMEOUT`]:
    /// the template comes from the model file, and running out of memory
    /// would abort memwall itself. Spawning takes a few milliseconds, once per
    /// turn of a conversation.
    pub fn render_isolated(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String> {
        let request = json!({
            "template": self.source,
            "fuel": self.fuel,
            "messages": messages
                .iter()
                .map(|m| json!({"role": m.role, "content": m.content}))
                .collect::<Vec<_>>(),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": bos_token,
            "eos_token": eos_token,
        })
        .to_string();
        let exe = std::env::current_exe()
            .context("cannot find the memwall binary to render the chat template")?;
        let mut child = std::process::Command::new(exe)
            .arg(RENDER_SUBCOMMAND)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("cannot start a process to render the chat template")?;
        let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(anyhow!("the chat template renderer has no pipes"));
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The child reads its whole request before it writes anything.
            let wrote = stdin.write_all(request.as_bytes());
            drop(stdin);
            let mut out = Vec::new();
            let read = stdout.read_to_end(&mut out);
            let _ = tx.send((wrote.is_ok() && read.is_ok()).then_some(out));
        });
        let received = rx.recv_timeout(RENDER_TIMEOUT);
        if received.is_err() {
            let _ = child.kill();
        }
        let status = child
            .wait()
            .context("waiting for the chat template renderer")?;
        let Ok(output) = received else {
            return Err(anyhow!(
                "the chat template took more than {} s to render (the model's template is \
                 hostile or broken); run without --chat to use plain prompts",
                RENDER_TIMEOUT.as_secs()
            ));
        };
        let response = output
            .filter(|_| status.success())
            .and_then(|out| serde_json::from_slice::<serde_json::Value>(&out).ok());
        match response {
            Some(v) if v["text"].is_string() => Ok(v["text"].as_str().unwrap_or("").to_owned()),
            Some(v) if v["error"].is_string() => {
                Err(anyhow!("{}", v["error"].as_str().unwrap_or("")))
            }
            _ => Err(anyhow!(
                "the chat template used more than {} GiB of memory or crashed while rendering \
                 (the model's template is hostile or broken); run without --chat to use plain \
                 prompts",
                RENDER_MEMORY_LIMIT >> 30
            )),
        }
    }

    /// Renders `messages`, ending with the assistant's turn opened when
    /// `add_generation_prompt`, in this process: with no memory limit, so for
    /// templates from model files only in the child of
    /// [`ChatTemplate::render_isolated`].
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String> {
        let list: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        let template = self.env.get_template("chat")?;
        let input = messages
            .iter()
            .map(|m| m.role.len() + m.content.len())
            .sum::<usize>()
            + bos_token.len()
            + eos_token.len();
        let mut out = Capped {
            out: Vec::new(),
            limit: output_limit(input),
            full: false,
        };
        // transformers passes `tools` and `documents` as None when there are none.
        let ctx = context! {
            messages => Value::from_serialize(&list),
            tools => Value::from_object(PyNone),
            documents => Value::from_object(PyNone),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        };
        if let Err(e) = template.render_captured_to(ctx, &mut out) {
            if out.full {
                return Err(anyhow!(
                    "the chat template failed: it writes more than {} bytes for {input} bytes of messages",
                    out.limit
                ));
            }
            return Err(anyhow!("the chat template failed: {e}"));
        }
        // minijinja writes whole strings, and the inputs are strings.
        String::from_utf8(out.out)
            .map_err(|_| anyhow!("the chat template failed: its output is not UTF-8"))
    }
}

/// `memwall __render-template`: reads a request of
/// [`ChatTemplate::render_isolated`] from standard input, renders it in this
/// process and writes `{"text": …}` or `{"error": …}` to standard output. The
/// caller has limited this process's memory.
pub(crate) fn serve_render() -> Result<()> {
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input)?;
    let request: serde_json::Value = serde_json::from_slice(&input)?;
    let text = |key: &str| request[key].as_str().unwrap_or("");
    let messages: Vec<Message> = request["messages"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|m| {
                    Message::new(
                        m["role"].as_str().unwrap_or(""),
                        m["content"].as_str().unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let fuel = request["fuel"].as_u64().unwrap_or(FUEL);
    let rendered = ChatTemplate::with_fuel(text("template"), fuel).and_then(|t| {
        t.render(
            &messages,
            request["add_generation_prompt"].as_bool().unwrap_or(false),
            text("bos_token"),
            text("eos_token"),
        )
    });
    let response = match rendered {
        Ok(text) => json!({ "text": text }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(response.to_string().as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The time `secs` (since 1970, UTC) as `strftime` would format it, for the
/// few codes templates use (`%d %m %Y %y %b %B %H %M %S %%`).
fn strftime(secs: u64, format: &str) -> String {
    let days = (secs / 86_400) as i64;
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_hostile_templates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        // An endless loop runs out of fuel instead of hanging.
        let t = ChatTemplate::new("{% for i in range(1000000000) %}x{% endfor %}").unwrap();
        assert!(t.render(&[], false, "", "").is_err());
        // Endless output stops at the limit, naming it.
        let t =
            ChatTemplate::new("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}").unwrap();
        let err = t.render(&[], false, "", "").unwrap_err().to_string();
        assert_eq!(
            err,
            "the chat template failed: it writes more than 16777216 bytes for 0 bytes of messages"
        );
        // Found by the chat_template fuzz target: a billion iterations of nested
        // loops, each under range()'s limit, took 4 s of 50 million fuel in a
        // release build (over 10 s in the fuzzer's); 10 million stop it sooner.
        let t = ChatTemplate::new(
            "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}\
             {{ a ~ b ~ c }}{% endfor %}{% endfor %}{% endfor %}",
        )
        .unwrap();
        let err = t.render(&[], false, "", "").unwrap_err().to_string();
        assert!(err.contains("engine ran out of fuel"), "{err}");
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
        let err = t.render(&[], false, "", "").unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
        assert!(ChatTemplate::new("{% if %}").is_err());
        // Python string methods.
        let t = ChatTemplate::new("{{ messages[0].content.strip().upper() }}").unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "  hi ")], false, "", "")
                .unwrap(),
            "HI"
        );
    }
}

#[cfg(test)]
mod transformers {
    use super::*;
    use memwall_format::gguf::GgufModel;
    use memwall_runtime::tokenizer::Tokenizer;

    fn messages(recorded: &serde_json::Value) -> Vec<Message> {
        recorded
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect()
    }

    /// Every template of llama.cpp's `models/templates/` renders three
    /// conversations as transformers' renderer does, and fails where it fails
    /// (fixtures/chat/record_templates.sh; the clock is the recording's).
    #[test]
    fn every_llama_cpp_template_renders_as_transformers_renders_it() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let text = std::fs::read_to_string(root.join("fixtures/chat/templates.json")).unwrap();
        let recorded: serde_json::Value = serde_json::from_str(&text).unwrap();
        // 2026-11-29 12:34:56 UTC, the recording's clock.
        let now = recorded["now"].as_str().unwrap();
        assert_eq!(now, "2026-11-29T12:34:56");
        let clock = 20_786 * 86_400 + 12 * 3600 + 34 * 60 + 56;
        let (bos, eos) = (
            recorded["bos_token"].as_str().unwrap(),
            recorded["eos_token"].as_str().unwrap(),
        );
        let folder = root.join("fixtures/cache/llama.cpp-0c1e570/models/templates");
        let templates = recorded["templates"].as_object().unwrap();
        assert_eq!(templates.len(), 70);
        let mut failures = Vec::new();
        let mut rendered = 0;
        for (name, t) in templates {
            let path = folder.join(name);
            let source = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (run fixtures/fetch.sh)", path.display()));
            let sha: String = <sha2::Sha256 as sha2::Digest>::digest(source.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(sha, t["sha256"].as_str().unwrap(), "{name}");
            let template = ChatTemplate::build(&source, FUEL, Some(clock));
            for (case, c) in t["cases"].as_object().unwrap() {
                let generation = c["add_generation_prompt"].as_bool().unwrap();
                let ours = template
                    .as_ref()
                    .map_err(|e| anyhow!("{e}"))
                    .and_then(|t| t.render(&messages(&c["messages"]), generation, bos, eos));
                match (c["text"].as_str(), ours) {
                    (Some(want), Ok(got)) if got == want => rendered += 1,
                    (None, Err(_)) => {}
                    (want, got) => failures.push(format!(
                        "{name} / {case}:\n  transformers {:?}\n  memwall      {:?}",
                        want.map_or_else(
                            || c["error"].to_string(),
                            |w| w.chars().take(300).collect()
                        ),
                        got.map(|g| g.chars().take(300).collect::<String>())
                    )),
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} renderings differ ({rendered} equal):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    /// Renders the recorded conversations with the template from each model's
    /// GGUF and tokenizes them as `memwall run --chat` does; both must equal what
    /// transformers' apply_chat_template made (fixtures/chat/record.sh).
    #[test]
    fn prompts_equal_transformers_apply_chat_template() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let text = std::fs::read_to_string(root.join("fixtures/chat/transformers.json")).unwrap();
        let recorded: serde_json::Value = serde_json::from_str(&text).unwrap();
        for (name, path) in [
            ("tiny-zh", "fixtures/tiny-zh/reference/tiny-zh-f16.gguf"),
            ("smollm2", "fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ] {
            let gguf = GgufModel::open(&root.join(path)).unwrap();
            let tokenizer = Tokenizer::from_gguf(gguf.metadata()).unwrap();
            let source = gguf
                .metadata()
                .get_str("tokenizer.chat_template")
                .unwrap()
                .unwrap();
            let template = ChatTemplate::new(source).unwrap();
            let special = |id: Option<u32>| id.and_then(|i| tokenizer.token_text(i)).unwrap_or("");
            let (bos, eos) = (special(tokenizer.bos()), special(tokenizer.eos()));
            for (case, c) in recorded["models"][name].as_object().unwrap() {
                let messages: Vec<Message> = c["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
                    })
                    .collect();
                let generation = c["add_generation_prompt"].as_bool().unwrap();
                let ours = template.render(&messages, generation, bos, eos).unwrap();
                assert_eq!(ours, c["text"].as_str().unwrap(), "{name} {case}");
                let ids: Vec<u64> = tokenizer
                    .encode(&ours, false, true)
                    .iter()
                    .map(|&i| i as u64)
                    .collect();
                let theirs: Vec<u64> = c["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                assert_eq!(ids, theirs, "{name} {case}");
            }
        }
    }
}
