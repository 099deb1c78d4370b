//! Rows into documents: the shape of a JSON row is recognised (or given by a
//! template or a field list) and rendered as text or as a conversation.
//!
//! Default renderings (plain Chinese-style text, what a model sees in use):
//!
//! | shape | fields | text |
//! |---|---|---|
//! | SQuAD / CMRC | `context, question, answers` | `{context}\n问：{question}\n答：{answer}` |
//! | DuReader / WebQA | `question, answer` or `answers` | `问：{question}\n答：{answer}` |
//! | Alpaca | `instruction, input, output` | `问：{instruction}\n{input}\n答：{output}` (no input line when empty) |
//! | chat | `messages[{role, content}]`, `conversations[{from, value}]` | through the chat template, else `role: content` lines |
//! | plain | `text` or `content` | the text |
//!
//! With chat rendering on, the QA and Alpaca shapes become a user turn (the
//! context, a newline and the question; or instruction and input) and an
//! assistant turn (the answer or output).

use serde_json::{Map, Value};

use super::BadKind;

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (as the data names it).
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

/// Renders conversations with a model's chat template. The library does not
/// evaluate templates itself; the caller supplies this.
pub trait ChatRenderer {
    /// The conversation as the model sees it (no generation prompt). An error
    /// message makes the row bad.
    fn render(&self, messages: &[ChatMessage]) -> Result<String, String>;
}

/// How rows become text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Render {
    /// Recognise the shape of each row (see the module docs).
    #[default]
    Detect,
    /// A template with `{field}` placeholders (`{{`/`}}` for braces; `\n`,
    /// `\t` and `\\` escapes as typed on a command line). An array field gives
    /// its first element; a missing field makes the row bad.
    Template(String),
    /// These fields, joined with newlines; a missing field makes the row bad.
    Fields(Vec<String>),
}

/// A piece of a parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Literal(String),
    Field(String),
}

/// Parses a template (see [`Render::Template`]).
pub(crate) fn parse_template(src: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut lit = String::new();
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => lit.push('\n'),
                Some('t') => lit.push('\t'),
                Some('\\') => lit.push('\\'),
                Some(other) => {
                    lit.push('\\');
                    lit.push(other);
                }
                None => lit.push('\\'),
            },
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                lit.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                lit.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => return Err(format!("`{{{name}` is not closed")),
                    }
                }
                let name = name.trim();
                if name.is_empty() {
                    return Err("an empty `{}` placeholder".to_owned());
                }
                if !lit.is_empty() {
                    pieces.push(Piece::Literal(std::mem::take(&mut lit)));
                }
                pieces.push(Piece::Field(name.to_owned()));
            }
            '}' => return Err("a `}` without `{` (write `}}` for a brace)".to_owned()),
            c => lit.push(c),
        }
    }
    if !lit.is_empty() {
        pieces.push(Piece::Literal(lit));
    }
    if !pieces.iter().any(|p| matches!(p, Piece::Field(_))) {
        return Err("the template has no `{field}` placeholder".to_owned());
    }
    Ok(pieces)
}

/// A rendered row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Doc {
    /// Plain text.
    Text(String),
    /// A conversation; `native` when the row was a chat (not a QA turned into one).
    Chat {
        messages: Vec<ChatMessage>,
        native: bool,
    },
}

/// The shape a row was recognised as (for the report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Squad,
    Qa,
    Alpaca,
    Chat,
    Text,
    Template,
}

impl Shape {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Shape::Squad => "squad",
            Shape::Qa => "qa",
            Shape::Alpaca => "alpaca",
            Shape::Chat => "chat",
            Shape::Text => "text",
            Shape::Template => "template",
        }
    }
}

/// The text of a field value: a string; a number or boolean as written; an
/// array's first element; an object's `text`. `None` for null and empties.
fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Array(items) => items.first().and_then(text_of),
        Value::Object(m) => m.get("text").and_then(text_of),
        Value::Null => None,
    }
}

fn require(row: &Map<String, Value>, field: &str) -> Result<String, BadKind> {
    row.get(field)
        .and_then(text_of)
        .ok_or_else(|| BadKind::MissingField(field.to_owned()))
}

/// Renders a row with a parsed template.
pub(crate) fn render_template(
    pieces: &[Piece],
    row: &Map<String, Value>,
) -> Result<String, BadKind> {
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Literal(s) => out.push_str(s),
            Piece::Field(name) => out.push_str(&require(row, name)?),
        }
    }
    Ok(out)
}

/// The first answer of a SQuAD/CMRC/DuReader row: `answer` (a string, list or
/// `{text}`) or `answers` as `{text:[…]}`, a list of strings or of `{text}`.
fn answer_of(row: &Map<String, Value>) -> Result<String, BadKind> {
    for key in ["answer", "answers"] {
        let Some(v) = row.get(key) else { continue };
        let found = match v {
            Value::Object(m) => m.get("text").and_then(text_of),
            other => text_of(other),
        };
        return found.ok_or_else(|| BadKind::Empty(key.to_owned()));
    }
    Err(BadKind::MissingField("answer".to_owned()))
}

fn messages_of(list: &[Value], key: &str) -> Result<Vec<ChatMessage>, BadKind> {
    let mut out = Vec::with_capacity(list.len().min(4096));
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(BadKind::MissingField(format!("{key}[{i}].role")));
        };
        let (role, content) = if m.contains_key("from") || m.contains_key("value") {
            ("from", "value")
        } else {
            ("role", "content")
        };
        let role_text = m
            .get(role)
            .and_then(Value::as_str)
            .ok_or_else(|| BadKind::MissingField(format!("{key}[{i}].{role}")))?;
        let content_text = m
            .get(content)
            .and_then(text_of)
            .ok_or_else(|| BadKind::MissingField(format!("{key}[{i}].{content}")))?;
        let role_text = match role_text {
            "human" => "user",
            "gpt" | "bot" | "model" => "assistant",
            other => other,
        };
        out.push(ChatMessage {
            role: role_text.to_owned(),
            content: content_text,
        });
    }
    if out.is_empty() {
        return Err(BadKind::Empty(key.to_owned()));
    }
    Ok(out)
}

fn turn(role: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: role.to_owned(),
        content,
    }
}

/// Recognises and renders a JSON row. `chat` turns QA and Alpaca rows into
/// conversations.
pub(crate) fn detect(row: &Map<String, Value>, chat: bool) -> Result<(Shape, Doc), BadKind> {
    for key in ["messages", "conversations"] {
        if let Some(v) = row.get(key) {
            let Value::Array(list) = v else {
                return Err(BadKind::MissingField(format!("{key}[0]")));
            };
            let messages = messages_of(list, key)?;
            return Ok((
                Shape::Chat,
                Doc::Chat {
                    messages,
                    native: true,
                },
            ));
        }
    }
    if row.contains_key("question") {
        let question = require(row, "question")?;
        let answer = answer_of(row)?;
        let context = row.get("context").and_then(text_of);
        let shape = if context.is_some() {
            Shape::Squad
        } else {
            Shape::Qa
        };
        let doc = if chat {
            let user = match context {
                Some(c) => format!("{c}\n{question}"),
                None => question,
            };
            Doc::Chat {
                messages: vec![turn("user", user), turn("assistant", answer)],
                native: false,
            }
        } else {
            let prefix = context.map(|c| format!("{c}\n")).unwrap_or_default();
            Doc::Text(format!("{prefix}问：{question}\n答：{answer}"))
        };
        return Ok((shape, doc));
    }
    if row.contains_key("instruction") {
        let instruction = require(row, "instruction")?;
        let output = require(row, "output")?;
        let input = row
            .get("input")
            .and_then(text_of)
            .filter(|s| !s.trim().is_empty());
        let doc = if chat {
            let user = match input {
                Some(i) => format!("{instruction}\n{i}"),
                None => instruction,
            };
            Doc::Chat {
                messages: vec![turn("user", user), turn("assistant", output)],
                native: false,
            }
        } else {
            let input = input.map(|i| format!("{i}\n")).unwrap_or_default();
            Doc::Text(format!("问：{instruction}\n{input}答：{output}"))
        };
        return Ok((Shape::Alpaca, doc));
    }
    for key in ["text", "content"] {
        if let Some(v) = row.get(key) {
            return text_of(v)
                .map(|t| (Shape::Text, Doc::Text(t)))
                .ok_or_else(|| BadKind::Empty(key.to_owned()));
        }
    }
    Err(BadKind::UnknownShape(row.keys().cloned().collect()))
}

/// Joins a conversation as `role: content` lines (no template).
pub(crate) fn join_messages(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&m.role);
        out.push_str(": ");
        out.push_str(&m.content);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    fn text(v: Value) -> (Shape, String) {
        match detect(&obj(v), false).unwrap() {
            (s, Doc::Text(t)) => (s, t),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn squad_and_cmrc_answers_in_every_form() {
        for answers in [
            json!({"text": ["A", "B"], "answer_start": [0, 3]}),
            json!(["A", "B"]),
            json!([{"text": "A", "answer_start": 0}]),
        ] {
            let (s, t) = text(json!({"context": "C", "question": "Q", "answers": answers}));
            assert_eq!(s, Shape::Squad);
            assert_eq!(t, "C\n问：Q\n答：A");
        }
        let e = detect(
            &obj(json!({"context": "C", "question": "Q", "answers": {"text": []}})),
            false,
        )
        .unwrap_err();
        assert_eq!(e, BadKind::Empty("answers".into()));
    }

    #[test]
    fn webqa_dureader_alpaca_text_shapes() {
        assert_eq!(
            text(json!({"question": "Q", "answer": "A"})),
            (Shape::Qa, "问：Q\n答：A".into())
        );
        assert_eq!(
            text(json!({"question": "Q", "answers": ["A1", "A2"]})),
            (Shape::Qa, "问：Q\n答：A1".into())
        );
        assert_eq!(
            text(json!({"instruction": "I", "input": "X", "output": "O"})),
            (Shape::Alpaca, "问：I\nX\n答：O".into())
        );
        assert_eq!(
            text(json!({"instruction": "I", "input": "", "output": "O"})),
            (Shape::Alpaca, "问：I\n答：O".into())
        );
        assert_eq!(text(json!({"text": "T"})), (Shape::Text, "T".into()));
        assert_eq!(
            text(json!({"content": "T", "id": 3})),
            (Shape::Text, "T".into())
        );
    }

    #[test]
    fn missing_fields_are_named() {
        let e = detect(&obj(json!({"question": "Q"})), false).unwrap_err();
        assert_eq!(e, BadKind::MissingField("answer".into()));
        let e = detect(&obj(json!({"instruction": "I", "input": "x"})), false).unwrap_err();
        assert_eq!(e, BadKind::MissingField("output".into()));
        let e = detect(&obj(json!({"title": "x", "url": "y"})), false).unwrap_err();
        assert_eq!(e, BadKind::UnknownShape(vec!["title".into(), "url".into()]));
        let e = detect(
            &obj(json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]})),
            false,
        )
        .unwrap_err();
        assert_eq!(e, BadKind::MissingField("messages[1].content".into()));
    }

    #[test]
    fn chats_and_sharegpt_conversations() {
        let (s, d) = detect(
            &obj(json!({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]})),
            false,
        )
        .unwrap();
        assert_eq!(s, Shape::Chat);
        let Doc::Chat { messages, native } = d else {
            panic!()
        };
        assert!(native);
        assert_eq!(join_messages(&messages), "user: Q\nassistant: A");
    }

    #[test]
    fn chat_mode_turns_qa_and_alpaca_into_turns() {
        let (_, d) = detect(
            &obj(json!({"context": "C", "question": "Q", "answers": ["A"]})),
            true,
        )
        .unwrap();
        assert_eq!(
            d,
            Doc::Chat {
                messages: vec![turn("user", "C\nQ".into()), turn("assistant", "A".into())],
                native: false
            }
        );
        let (_, d) = detect(
            &obj(json!({"instruction": "I", "input": "X", "output": "O"})),
            true,
        )
        .unwrap();
        let Doc::Chat { messages, .. } = d else {
            panic!()
        };
        assert_eq!(messages[0].content, "I\nX");
    }

    #[test]
    fn templates_render_fields_escapes_and_braces() {
        let t = parse_template(r"问：{question}\n答：{answers} {{x}}").unwrap();
        let row = obj(json!({"question": "Q", "answers": ["A", "B"]}));
        assert_eq!(render_template(&t, &row).unwrap(), "问：Q\n答：A {x}");
        let e = render_template(&t, &obj(json!({"question": "Q"}))).unwrap_err();
        assert_eq!(e, BadKind::MissingField("answers".into()));
        assert!(parse_template("no fields").is_err());
        assert!(parse_template("{open").is_err());
        assert!(parse_template("a } b {x}").is_err());
        assert!(parse_template("{}").is_err());
    }
}
