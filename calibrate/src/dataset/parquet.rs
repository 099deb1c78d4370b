//! Parquet input, the format Hugging Face datasets are stored in: read record
//! by record with the `parquet` crate's row API (no arrow), each record turned
//! into a JSON object so that shape detection treats it like a JSONL line.
//!
//! The `parquet` crate checks the footer and page sizes against the file, but
//! it is a large decoder written for trusted data; a panic inside it is caught
//! here and reported as a bad file rather than taking the process down.

use std::fs::File;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row as Record};
use serde_json::{Map, Number, Value};

use super::read::{Body, Row};
use super::{BadKind, BadRow, DatasetError};

/// Reads every record of `file`.
pub(crate) fn read(
    file: &Path,
    sink: &mut dyn FnMut(Result<Row, BadRow>) -> Result<(), DatasetError>,
) -> Result<(), DatasetError> {
    let f = File::open(file).map_err(|error| DatasetError::Io {
        path: file.to_owned(),
        error,
    })?;
    let bad = |line: usize, why: String| BadRow {
        file: file.to_owned(),
        line,
        kind: BadKind::Parquet(why),
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), DatasetError> {
        let reader = match SerializedFileReader::new(f) {
            Ok(r) => r,
            Err(e) => return sink(Err(bad(1, e.to_string()))),
        };
        let rows = match reader.get_row_iter(None) {
            Ok(rows) => rows,
            Err(e) => return sink(Err(bad(1, e.to_string()))),
        };
        for (i, record) in rows.enumerate() {
            let line = i + 1;
            match record {
                Ok(record) => sink(record_to_row(&record, line).map_err(|kind| BadRow {
                    file: file.to_owned(),
                    line,
                    kind,
                }))?,
                // The reader cannot go on after a decoding error.
                Err(e) => return sink(Err(bad(line, e.to_string()))),
            }
        }
        Ok(())
    }));
    match outcome {
        Ok(result) => result,
        Err(_) => sink(Err(bad(
            1,
            "the Parquet decoder failed on this file (corrupt or unsupported)".to_owned(),
        ))),
    }
}

fn record_to_row(record: &Record, line: usize) -> Result<Row, BadKind> {
    let mut map = Map::new();
    for (name, field) in record.get_column_iter() {
        map.insert(name.clone(), field_to_json(field)?);
    }
    Ok(Row {
        line,
        body: Body::Json(map),
    })
}

/// A Parquet value as JSON: strings, numbers, lists and groups as such;
/// binary columns must hold UTF-8; dates and times as their text.
fn field_to_json(field: &Field) -> Result<Value, BadKind> {
    Ok(match field {
        Field::Null => Value::Null,
        Field::Bool(b) => Value::Bool(*b),
        Field::Byte(n) => Value::from(*n),
        Field::Short(n) => Value::from(*n),
        Field::Int(n) => Value::from(*n),
        Field::Long(n) => Value::from(*n),
        Field::UByte(n) => Value::from(*n),
        Field::UShort(n) => Value::from(*n),
        Field::UInt(n) => Value::from(*n),
        Field::ULong(n) => Value::from(*n),
        Field::Float(x) => Number::from_f64(f64::from(*x)).map_or(Value::Null, Value::Number),
        Field::Double(x) => Number::from_f64(*x).map_or(Value::Null, Value::Number),
        Field::Str(s) => Value::String(s.clone()),
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(s) => Value::String(s.to_owned()),
            Err(_) => return Err(BadKind::NotUtf8),
        },
        Field::Group(row) => {
            let mut map = Map::new();
            for (name, f) in row.get_column_iter() {
                map.insert(name.clone(), field_to_json(f)?);
            }
            Value::Object(map)
        }
        Field::ListInternal(list) => Value::Array(
            list.elements()
                .iter()
                .map(field_to_json)
                .collect::<Result<_, _>>()?,
        ),
        Field::MapInternal(map) => {
            let mut out = Map::new();
            for (k, v) in map.entries() {
                let key = match field_to_json(k)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                out.insert(key, field_to_json(v)?);
            }
            Value::Object(out)
        }
        other => Value::String(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_parquet_is_a_bad_row_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        for bytes in [
            &b""[..],
            b"PAR1",
            b"PAR1\x00\x00\x00\x00PAR1",
            b"PAR1garbage\xff\xff\xff\x7fPAR1",
        ] {
            let p = dir.path().join("x.parquet");
            std::fs::write(&p, bytes).unwrap();
            let mut got = Vec::new();
            read(&p, &mut |r| {
                got.push(r);
                Ok(())
            })
            .unwrap();
            assert_eq!(got.len(), 1);
            let e = got[0].as_ref().unwrap_err();
            assert!(matches!(e.kind, BadKind::Parquet(_)), "{e}");
        }
    }

    #[test]
    fn snappy_zstd_and_gzip_files_are_read_row_by_row() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/calib-zh");
        for (name, rows, first) in [
            ("faq.parquet", 12, "怎样查看一个文件的前几行？"),
            ("faq-zstd.parquet", 5, "watch 命令有什么用？"),
            (
                "faq-gzip.parquet",
                4,
                "《春望》中“感时花溅泪”的下一句是什么？",
            ),
        ] {
            let mut got = Vec::new();
            read(&dir.join(name), &mut |r| {
                got.push(r.unwrap());
                Ok(())
            })
            .unwrap();
            assert_eq!(got.len(), rows, "{name}");
            assert_eq!(got[rows - 1].line, rows);
            let Body::Json(m) = &got[0].body else {
                panic!("{name}")
            };
            assert_eq!(m["question"], first);
            assert!(m["answer"].as_str().is_some_and(|a| !a.is_empty()));
        }
    }
}
