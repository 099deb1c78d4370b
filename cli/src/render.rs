//! Formatting helpers shared by the commands' text output.

use memwall_format::gguf::{Array, Value};
use serde_json::json;

/// Array elements shown before "… N more" when not in `--full` mode.
pub const ARRAY_PREVIEW: usize = 6;
/// Characters of a string shown when not in `--full` mode.
pub const STRING_PREVIEW: usize = 120;

/// `98362432` → `93.8 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `134515008` → `134.5 M`.
pub fn human_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1} K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} M", n as f64 / 1e6),
        _ => format!("{:.2} B", n as f64 / 1e9),
    }
}

/// A quoted, escaped string, cut to `limit` characters unless `full`.
pub fn quote(s: &str, full: bool) -> String {
    let count = s.chars().count();
    if full || count <= STRING_PREVIEW {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(STRING_PREVIEW).collect();
        format!("{head:?}… ({count} chars)")
    }
}

/// A float, shown as the shortest f32 text when it is exactly an f32 (most
/// GGUF floats are stored as float32 and widened on reading).
pub fn float_text(v: f64) -> String {
    if f64::from(v as f32) == v {
        (v as f32).to_string()
    } else {
        v.to_string()
    }
}

/// A metadata value for the text listing.
pub fn value_text(value: &Value, full: bool) -> String {
    match value {
        Value::String(s) => quote(s, full),
        Value::Array(a) => array_text(a, full),
        Value::F32(v) => v.to_string(),
        Value::F64(v) => float_text(*v),
        Value::Bool(v) => v.to_string(),
        other => other
            .as_i64()
            .map_or_else(|| format!("{other:?}"), |v| v.to_string()),
    }
}

fn array_text(a: &Array, full: bool) -> String {
    let shown = if full {
        a.len()
    } else {
        a.len().min(ARRAY_PREVIEW)
    };
    let items: Vec<String> = (0..shown)
        .filter_map(|i| a.get(i))
        .map(|v| value_text(&v, full))
        .collect();
    let more = a.len() - shown;
    let tail = if more > 0 {
        format!(", … {more} more")
    } else {
        String::new()
    };
    let plural = if a.len() == 1 { "" } else { "s" };
    format!("[{}{tail}] ({} item{plural})", items.join(", "), a.len())
}

/// A metadata value as JSON. Arrays are cut to a preview unless `full`;
/// non-finite floats become `null`.
pub fn value_json(value: &Value, full: bool) -> serde_json::Value {
    match value {
        Value::String(s) => json!(s),
        Value::Array(a) => {
            let shown = if full {
                a.len()
            } else {
                a.len().min(ARRAY_PREVIEW)
            };
            let items: Vec<_> = (0..shown)
                .filter_map(|i| a.get(i))
                .map(|v| value_json(&v, full))
                .collect();
            if full {
                json!(items)
            } else {
                json!({ "len": a.len(), "head": items })
            }
        }
        Value::F32(v) => json!(f64::from(*v)),
        Value::F64(v) => json!(v),
        Value::Bool(v) => json!(v),
        Value::U64(v) => json!(v),
        other => json!(other.as_i64()),
    }
}

/// `text` as one word of a shell command line: as it is when it holds only
/// characters no shell treats specially, else in single quotes.
pub fn shell_word(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=+:,@%".contains(c))
    {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(98362432), "93.8 MiB");
        assert_eq!(human_count(134_515_008), "134.5 M");
        assert_eq!(human_count(34_900_000_000), "34.90 B");
    }

    #[test]
    fn arrays_are_previewed() {
        let a = Value::Array(Array::U32((0..10).collect()));
        assert_eq!(
            value_text(&a, false),
            "[0, 1, 2, 3, 4, 5, … 4 more] (10 items)"
        );
        assert_eq!(
            value_json(&a, false),
            json!({"len": 10, "head": [0, 1, 2, 3, 4, 5]})
        );
        assert_eq!(value_json(&a, true), json!([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]));
        assert_eq!(
            value_json(&Value::F32(f32::NAN), false),
            serde_json::Value::Null
        );
    }
}
