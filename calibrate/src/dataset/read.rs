//! Reading inputs: the files of a source, each turned into rows.
//!
//! A text file is one row (the whole file, paragraphs and all); a JSONL file
//! one row per non-blank line; a JSON file one row per element of its array
//! (top level or under `data`), with SQuAD's nested
//! `data[].paragraphs[].qas[]` flattened into `{context, question, answers}`
//! rows; a Parquet file one row per record. Rows that cannot be used are
//! reported as [`BadRow`]s, the caller decides whether they stop the build.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{BadKind, BadRow, DatasetError};

/// The longest line a JSONL input or a calibration set may have.
pub const MAX_LINE: usize = 64 << 20;

/// Folders nested deeper than this are not followed (symlink loops).
const MAX_DEPTH: usize = 64;

/// What a row holds before rendering.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Body {
    /// A plain text document.
    Text(String),
    /// A JSON object (or a Parquet record as one).
    Json(Map<String, Value>),
}

/// One row of an input file.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    /// 1-based line (JSONL), element (JSON), record (Parquet); 1 for a text file.
    pub line: usize,
    /// The content.
    pub body: Body,
}

/// How a file is read, from its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Text,
    Jsonl,
    Json,
    Parquet,
}

impl Format {
    pub(crate) fn of(path: &Path) -> Format {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("jsonl" | "ndjson") => Format::Jsonl,
            Some("json") => Format::Json,
            Some("parquet") => Format::Parquet,
            _ => Format::Text,
        }
    }
}

fn io_error(path: &Path, error: io::Error) -> DatasetError {
    DatasetError::Io {
        path: path.to_owned(),
        error,
    }
}

/// The files of `path`: itself, or every non-hidden file under it (recursively),
/// sorted by path.
pub(crate) fn list_files(path: &Path) -> Result<Vec<PathBuf>, DatasetError> {
    let meta = fs::metadata(path).map_err(|e| io_error(path, e))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut out = Vec::new();
    walk(path, 0, &mut out)?;
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<(), DatasetError> {
    if depth > MAX_DEPTH {
        return Err(DatasetError::Options(format!(
            "{}: folders nested more than {MAX_DEPTH} deep (a symlink loop?)",
            dir.display()
        )));
    }
    for entry in fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let meta = fs::metadata(&path).map_err(|e| io_error(&path, e))?;
        if meta.is_dir() {
            walk(&path, depth + 1, out)?;
        } else if meta.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// One line read by [`read_line`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// The line is in the buffer (without its newline).
    Some,
    /// The line was longer than the limit; it has been skipped.
    TooLong,
    /// End of input.
    Eof,
}

/// Reads one line into `buf`, never holding more than `max` bytes of it.
pub(crate) fn read_line(r: &mut impl BufRead, buf: &mut Vec<u8>, max: usize) -> io::Result<Line> {
    buf.clear();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let n = r.by_ref().take(limit).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(Line::Eof);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        return Ok(Line::Some);
    }
    if buf.len() <= max {
        // The last line, without a newline.
        return Ok(Line::Some);
    }
    // Skip the rest of the line without keeping it.
    buf.clear();
    loop {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return Ok(Line::TooLong);
        }
        if let Some(pos) = avail.iter().position(|&b| b == b'\n') {
            r.consume(pos + 1);
            return Ok(Line::TooLong);
        }
        let n = avail.len();
        r.consume(n);
    }
}

/// Reads every row of `file`, handing each (or why it is bad) to `sink`.
pub(crate) fn read_file(
    file: &Path,
    max_line: usize,
    sink: &mut dyn FnMut(Result<Row, BadRow>) -> Result<(), DatasetError>,
) -> Result<(), DatasetError> {
    let bad = |line: usize, kind: BadKind| BadRow {
        file: file.to_owned(),
        line,
        kind,
    };
    match Format::of(file) {
        Format::Text => {
            let bytes = fs::read(file).map_err(|e| io_error(file, e))?;
            match String::from_utf8(bytes) {
                Ok(text) => sink(Ok(Row {
                    line: 1,
                    body: Body::Text(text),
                })),
                Err(e) => {
                    let at = e.utf8_error().valid_up_to();
                    let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
                    sink(Err(bad(line, BadKind::NotUtf8)))
                }
            }
        }
        Format::Jsonl => {
            let f = File::open(file).map_err(|e| io_error(file, e))?;
            let mut r = BufReader::with_capacity(1 << 16, f);
            let mut buf = Vec::new();
            let mut line = 0usize;
            loop {
                line += 1;
                match read_line(&mut r, &mut buf, max_line).map_err(|e| io_error(file, e))? {
                    Line::Eof => return Ok(()),
                    Line::TooLong => sink(Err(bad(line, BadKind::TooLong(max_line))))?,
                    Line::Some => {
                        let Ok(text) = std::str::from_utf8(&buf) else {
                            sink(Err(bad(line, BadKind::NotUtf8)))?;
                            continue;
                        };
                        if text.trim().is_empty() {
                            continue;
                        }
                        match serde_json::from_str::<Value>(text) {
                            Ok(Value::Object(map)) => sink(Ok(Row {
                                line,
                                body: Body::Json(map),
                            }))?,
                            Ok(Value::String(s)) => sink(Ok(Row {
                                line,
                                body: Body::Text(s),
                            }))?,
                            Ok(other) => sink(Err(bad(
                                line,
                                BadKind::NotObject(json_kind(&other).to_owned()),
                            )))?,
                            Err(e) => sink(Err(bad(line, BadKind::Json(e.to_string()))))?,
                        }
                    }
                }
            }
        }
        Format::Json => {
            let bytes = fs::read(file).map_err(|e| io_error(file, e))?;
            let value = match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => v,
                Err(e) => {
                    let kind = if std::str::from_utf8(&bytes).is_err() {
                        BadKind::NotUtf8
                    } else {
                        BadKind::Json(e.to_string())
                    };
                    return sink(Err(bad(e.line().max(1), kind)));
                }
            };
            let items = match value {
                Value::Array(items) => items,
                Value::Object(mut map) => match map.remove("data") {
                    Some(Value::Array(items)) => items,
                    _ if map.contains_key("paragraphs") => vec![Value::Object(map)],
                    _ => {
                        return sink(Err(bad(1, BadKind::MissingField("data".to_owned()))));
                    }
                },
                other => {
                    return sink(Err(bad(
                        1,
                        BadKind::NotObject(json_kind(&other).to_owned()),
                    )));
                }
            };
            let mut index = 0usize;
            for item in items {
                for row in flatten_squad(item) {
                    index += 1;
                    match row {
                        Value::Object(map) => sink(Ok(Row {
                            line: index,
                            body: Body::Json(map),
                        }))?,
                        Value::String(s) => sink(Ok(Row {
                            line: index,
                            body: Body::Text(s),
                        }))?,
                        other => sink(Err(bad(
                            index,
                            BadKind::NotObject(json_kind(&other).to_owned()),
                        )))?,
                    }
                }
            }
            Ok(())
        }
        Format::Parquet => super::parquet::read(file, sink),
    }
}

/// SQuAD's nested article `{title, paragraphs:[{context, qas:[…]}]}` as one
/// `{context, question, answers}` row per question; anything else unchanged.
fn flatten_squad(item: Value) -> Vec<Value> {
    let Value::Object(mut article) = item else {
        return vec![item];
    };
    let Some(Value::Array(paragraphs)) = article.remove("paragraphs") else {
        return vec![Value::Object(article)];
    };
    let mut out = Vec::new();
    for paragraph in paragraphs {
        let Value::Object(mut paragraph) = paragraph else {
            out.push(paragraph);
            continue;
        };
        let context = paragraph.remove("context");
        let Some(Value::Array(qas)) = paragraph.remove("qas") else {
            // A paragraph without questions is still text.
            let mut row = Map::new();
            row.insert("text".to_owned(), context.unwrap_or(Value::Null));
            out.push(Value::Object(row));
            continue;
        };
        for qa in qas {
            match qa {
                Value::Object(mut qa) => {
                    if let Some(c) = &context {
                        qa.entry("context").or_insert_with(|| c.clone());
                    }
                    out.push(Value::Object(qa));
                }
                other => out.push(other),
            }
        }
    }
    out
}

/// A JSON value's type, for messages.
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(path: &Path) -> Vec<Result<Row, BadRow>> {
        let mut out = Vec::new();
        read_file(path, MAX_LINE, &mut |r| {
            out.push(r);
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn read_line_caps_and_skips_a_huge_line() {
        let data = format!("short\n{}\nafter\nlast", "x".repeat(1000));
        let mut r = BufReader::with_capacity(16, data.as_bytes());
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, &mut buf, 100).unwrap(), Line::Some);
        assert_eq!(buf, b"short");
        assert_eq!(read_line(&mut r, &mut buf, 100).unwrap(), Line::TooLong);
        assert!(buf.capacity() < 1000, "never held the whole line");
        assert_eq!(read_line(&mut r, &mut buf, 100).unwrap(), Line::Some);
        assert_eq!(buf, b"after");
        assert_eq!(read_line(&mut r, &mut buf, 100).unwrap(), Line::Some);
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut r, &mut buf, 100).unwrap(), Line::Eof);
    }

    #[test]
    fn jsonl_rows_keep_line_numbers_and_report_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.jsonl");
        let mut bytes = b"{\"text\":\"one\"}\n\n[1,2]\n{\"text\":\"trunc".to_vec();
        bytes.extend_from_slice(b"\n\xff\xfe\n\"plain\"\n");
        fs::write(&p, bytes).unwrap();
        let rows = rows(&p);
        assert_eq!(rows.len(), 5);
        assert_eq!(rows[0].as_ref().unwrap().line, 1);
        let e = rows[1].as_ref().unwrap_err();
        assert_eq!(
            (e.line, &e.kind),
            (3, &BadKind::NotObject("an array".into()))
        );
        let e = rows[2].as_ref().unwrap_err();
        assert_eq!(e.line, 4);
        assert!(matches!(e.kind, BadKind::Json(_)), "{e}");
        assert_eq!(rows[3].as_ref().unwrap_err().kind, BadKind::NotUtf8);
        assert_eq!(rows[3].as_ref().unwrap_err().line, 5);
        assert_eq!(rows[4].as_ref().unwrap().body, Body::Text("plain".into()));
    }

    #[test]
    fn text_files_are_one_document_and_non_utf8_names_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("doc.md");
        fs::write(&p, "第一段。\n\n第二段。\n").unwrap();
        let r = rows(&p);
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0].as_ref().unwrap().body,
            Body::Text("第一段。\n\n第二段。\n".into())
        );
        fs::write(&p, b"ok\nok\nbad \xc3\x28\n").unwrap();
        let r = rows(&p);
        let e = r[0].as_ref().unwrap_err();
        assert_eq!((e.line, &e.kind), (3, &BadKind::NotUtf8));
    }

    #[test]
    fn json_arrays_data_objects_and_nested_squad() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        fs::write(
            &p,
            r#"{"version":"1","data":[{"title":"t","paragraphs":[{"context":"C1","qas":[
                {"question":"Q1","answers":[{"text":"A1","answer_start":0}]},
                {"question":"Q2","answers":[{"text":"A2"}]}]}]}]}"#,
        )
        .unwrap();
        let r = rows(&p);
        assert_eq!(r.len(), 2);
        let Body::Json(m) = &r[1].as_ref().unwrap().body else {
            panic!()
        };
        assert_eq!(m["context"], "C1");
        assert_eq!(m["question"], "Q2");
        assert_eq!(r[1].as_ref().unwrap().line, 2);

        fs::write(&p, r#"[{"text":"a"},{"text":"b"}]"#).unwrap();
        assert_eq!(rows(&p).len(), 2);

        fs::write(&p, r#"[{"text":"a"},{"te"#).unwrap();
        let r = rows(&p);
        assert!(matches!(r[0].as_ref().unwrap_err().kind, BadKind::Json(_)));

        fs::write(&p, r#"{"rows":[]}"#).unwrap();
        let r = rows(&p);
        assert_eq!(
            r[0].as_ref().unwrap_err().kind,
            BadKind::MissingField("data".into())
        );
    }

    #[test]
    fn folders_are_walked_sorted_without_hidden_files() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("b/c")).unwrap();
        fs::write(dir.path().join("b/c/z.txt"), "z").unwrap();
        fs::write(dir.path().join("b/a.txt"), "a").unwrap();
        fs::write(dir.path().join("a.jsonl"), "").unwrap();
        fs::write(dir.path().join(".hidden"), "h").unwrap();
        let files = list_files(dir.path()).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().to_owned())
            .collect();
        assert_eq!(
            names,
            vec![
                PathBuf::from("a.jsonl"),
                PathBuf::from("b/a.txt"),
                PathBuf::from("b/c/z.txt")
            ]
        );
    }
}
