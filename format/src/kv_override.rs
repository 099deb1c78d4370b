//! Metadata overrides `KEY=TYPE:VALUE`, as llama.cpp's `--override-kv` takes
//! them (`string_parse_kv_override` in its `common/common.cpp`): TYPE is
//! `int`, `float`, `bool` (`true`/`false`) or `str`; the key is shorter than
//! 128 bytes and a string value at most 127.
//!
//! llama.cpp keeps an int as `i64` and a float as `f64` while loading a model,
//! and `llama-quantize` writes them into its output as `u32` (of the absolute
//! value) and `f32`; [`KvOverride::loaded`] and [`KvOverride::written`] give
//! the value each way. Unlike llama.cpp (`atol`, `atof`), a number that does
//! not parse whole is refused rather than read as 0.

use std::fmt;

use crate::gguf::Value;

/// The value of an override, as typed on the command line.
#[derive(Clone, Debug, PartialEq)]
pub enum OverrideValue {
    /// `int:N`.
    Int(i64),
    /// `float:X`.
    Float(f64),
    /// `bool:true` or `bool:false`.
    Bool(bool),
    /// `str:TEXT`.
    Str(String),
}

/// One `KEY=TYPE:VALUE`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvOverride {
    /// The metadata key.
    pub key: String,
    /// Its new value.
    pub value: OverrideValue,
}

/// Why an override does not parse; the message quotes it and shows the form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "--override-kv {spec}: {reason} (expected KEY=TYPE:VALUE, TYPE int, float, bool or str, e.g. llama.context_length=int:8192)"
)]
pub struct KvOverrideError {
    /// The text given.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
}

impl KvOverride {
    /// Parses `KEY=TYPE:VALUE`.
    pub fn parse(spec: &str) -> Result<KvOverride, KvOverrideError> {
        let err = |reason: String| KvOverrideError {
            spec: spec.to_owned(),
            reason,
        };
        let (key, typed) = spec.split_once('=').ok_or_else(|| err("no '='".into()))?;
        if key.is_empty() {
            return Err(err("the key is empty".into()));
        }
        if key.len() >= 128 {
            return Err(err(format!(
                "the key is {} bytes; llama.cpp takes at most 127",
                key.len()
            )));
        }
        let (ty, text) = typed
            .split_once(':')
            .ok_or_else(|| err("no TYPE: before the value".into()))?;
        let value = match ty {
            "int" => OverrideValue::Int(
                text.trim()
                    .parse()
                    .map_err(|_| err(format!("'{text}' is not an integer")))?,
            ),
            "float" => {
                let v: f64 = text
                    .trim()
                    .parse()
                    .map_err(|_| err(format!("'{text}' is not a number")))?;
                OverrideValue::Float(v)
            }
            "bool" => match text {
                "true" => OverrideValue::Bool(true),
                "false" => OverrideValue::Bool(false),
                _ => return Err(err(format!("'{text}' is not true or false"))),
            },
            "str" => {
                if text.len() > 127 {
                    return Err(err(format!(
                        "the value is {} bytes; llama.cpp takes at most 127",
                        text.len()
                    )));
                }
                OverrideValue::Str(text.to_owned())
            }
            other => return Err(err(format!("unknown TYPE '{other}'"))),
        };
        Ok(KvOverride {
            key: key.to_owned(),
            value,
        })
    }

    /// Parses a comma-separated list, as llama.cpp's common options
    /// (`llama-cli`, `llama-perplexity`…) take `--override-kv`: fields split at
    /// commas outside double quotes, `""` a quote inside them (its `parse_csv_row`).
    pub fn parse_list(spec: &str) -> Result<Vec<KvOverride>, KvOverrideError> {
        let mut fields = Vec::new();
        let mut field = String::new();
        let mut quoted = false;
        let mut chars = spec.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' if !quoted && field.is_empty() => quoted = true,
                '"' if quoted && chars.peek() == Some(&'"') => {
                    field.push('"');
                    chars.next();
                }
                '"' if quoted => quoted = false,
                ',' if !quoted => fields.push(std::mem::take(&mut field)),
                c => field.push(c),
            }
        }
        fields.push(field);
        fields.iter().map(|f| KvOverride::parse(f)).collect()
    }

    /// The value as llama.cpp's loader holds it (ints `i64`, floats `f64`).
    pub fn loaded(&self) -> Value {
        match &self.value {
            OverrideValue::Int(v) => Value::I64(*v),
            OverrideValue::Float(v) => Value::F64(*v),
            OverrideValue::Bool(v) => Value::Bool(*v),
            OverrideValue::Str(v) => Value::String(v.clone()),
        }
    }

    /// The value as `llama-quantize` writes it into its output: an int as the
    /// `u32` of its absolute value (truncated, as the C cast does), a float
    /// as `f32`.
    pub fn written(&self) -> Value {
        match &self.value {
            OverrideValue::Int(v) => Value::U32(v.unsigned_abs() as u32),
            OverrideValue::Float(v) => Value::F32(*v as f32),
            OverrideValue::Bool(v) => Value::Bool(*v),
            OverrideValue::Str(v) => Value::String(v.clone()),
        }
    }
}

impl fmt::Display for KvOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            OverrideValue::Int(v) => write!(f, "{}=int:{v}", self.key),
            OverrideValue::Float(v) => write!(f, "{}=float:{v}", self.key),
            OverrideValue::Bool(v) => write!(f, "{}=bool:{v}", self.key),
            OverrideValue::Str(v) => write!(f, "{}=str:{v}", self.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_parses_and_converts_as_llama_cpp_does() {
        let o = KvOverride::parse("llama.context_length=int:-8192").unwrap();
        assert_eq!(o.value, OverrideValue::Int(-8192));
        assert_eq!(o.loaded(), Value::I64(-8192));
        assert_eq!(o.written(), Value::U32(8192));
        let o = KvOverride::parse("a.b=float:0.5").unwrap();
        assert_eq!(o.written(), Value::F32(0.5));
        assert_eq!(o.loaded(), Value::F64(0.5));
        let o = KvOverride::parse("tokenizer.ggml.add_bos_token=bool:false").unwrap();
        assert_eq!(o.written(), Value::Bool(false));
        let o = KvOverride::parse("general.name=str:a=b:c").unwrap();
        assert_eq!(o.value, OverrideValue::Str("a=b:c".into()));
        assert_eq!(o.to_string(), "general.name=str:a=b:c");
    }

    #[test]
    fn a_list_splits_at_commas_outside_quotes() {
        let list = KvOverride::parse_list(
            "tokenizer.ggml.add_bos_token=bool:false,\"general.name=str:a,b\",x.y=int:2",
        )
        .unwrap();
        let keys: Vec<&str> = list.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(
            keys,
            ["tokenizer.ggml.add_bos_token", "general.name", "x.y"]
        );
        assert_eq!(list[1].value, OverrideValue::Str("a,b".into()));
        assert!(
            KvOverride::parse_list("a=int:1,").is_err(),
            "an empty field"
        );
    }

    #[test]
    fn malformed_overrides_say_what_is_wrong() {
        for (spec, why) in [
            ("general.name", "no '='"),
            ("=int:1", "the key is empty"),
            ("k=1", "no TYPE:"),
            ("k=int:12abc", "not an integer"),
            ("k=float:x", "not a number"),
            ("k=bool:yes", "not true or false"),
            ("k=u32:1", "unknown TYPE 'u32'"),
        ] {
            let e = KvOverride::parse(spec).unwrap_err().to_string();
            assert!(e.contains(why), "{spec}: {e}");
            assert!(e.contains("KEY=TYPE:VALUE"), "{e}");
        }
        let long = format!("{}=int:1", "k".repeat(128));
        assert!(KvOverride::parse(&long).is_err());
        let long = format!("k=str:{}", "v".repeat(128));
        assert!(KvOverride::parse(&long).is_err());
    }
}
