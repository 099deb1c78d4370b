//! Chat templates: the Jinja template a model carries in
//! `tokenizer.chat_template`, rendered with minijinja the way transformers
//! renders it with jinja2 (`trim_blocks`, `lstrip_blocks`, Python's string
//! methods, `raise_exception`, `strftime_now`), with a fuel limit so that a
//! hostile template cannot run forever.

use anyhow::{Result, anyhow};
use minijinja::{Environment, Error, ErrorKind, Value, context};
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

/// Instructions a template may execute before it is stopped (a real template
/// needs a few thousand per message).
const FUEL: u64 = 50_000_000;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles `source`.
    pub fn new(source: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| -> String {
            strftime_now(&format)
        });
        env.add_template_owned("chat".to_owned(), source.to_owned())
            .map_err(|e| anyhow!("the chat template does not compile: {e}"))?;
        Ok(ChatTemplate { env })
    }

    /// Renders `messages`, ending with the assistant's turn opened when
    /// `add_generation_prompt`.
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
        template
            .render(context! {
                messages => Value::from_serialize(&list),
                add_generation_prompt => add_generation_prompt,
                bos_token => bos_token,
                eos_token => eos_token,
            })
            .map_err(|e| anyhow!("the chat template failed: {e}"))
    }
}

/// The date as `strftime` would format it, for the few codes templates use
/// (`%d %m %Y %y %b %B %H %M %S %%`).
fn strftime_now(format: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
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
    use memwall_runtime::gguf::GgufModel;
    use memwall_runtime::tokenizer::Tokenizer;

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
