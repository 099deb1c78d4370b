//! GGUF metadata: key/value pairs in file order, with typed accessors.

use std::collections::HashMap;

use super::value::{Array, Value};

/// Metadata keys that every part of memwall shares.
pub mod keys {
    /// Model architecture (`llama`, `qwen2`, …).
    pub const ARCHITECTURE: &str = "general.architecture";
    /// Data alignment of the tensor section (u32, power of two).
    pub const ALIGNMENT: &str = "general.alignment";
    /// `llama_ftype` of the file.
    pub const FILE_TYPE: &str = "general.file_type";
    /// Human-readable model name.
    pub const NAME: &str = "general.name";
    /// Quantization format version (2 today).
    pub const QUANTIZATION_VERSION: &str = "general.quantization_version";
    /// Index of this file among the split files (0-based, u16).
    pub const SPLIT_NO: &str = "split.no";
    /// Number of split files (u16).
    pub const SPLIT_COUNT: &str = "split.count";
    /// Number of tensors in all split files together (i32).
    pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";
}

/// Why a metadata lookup failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MetadataError {
    /// The key is absent.
    #[error("metadata key '{0}' is missing")]
    Missing(String),
    /// The key has a value of another type.
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the caller asked for.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
}

/// Metadata key/value pairs in file order, with lookup by key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Empty metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sets `key` to `value`. A new key goes to the end; an existing key keeps
    /// its position. Returns the previous value.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Option<Value> {
        let key = key.into();
        let value = value.into();
        match self.index.get(&key) {
            Some(&i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
                None
            }
        }
    }

    /// Appends a pair whose key must not be present yet (used by the reader,
    /// which rejects duplicate keys). Returns `false`, changing nothing, if it is.
    pub(crate) fn push_new(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Removes `key`, keeping the order of the others. Returns its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        let (_, value) = self.entries.remove(i);
        for slot in self.index.values_mut() {
            if *slot > i {
                *slot -= 1;
            }
        }
        Some(value)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The pairs in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, MetadataError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        convert(value)
            .map(Some)
            .ok_or_else(|| MetadataError::WrongType {
                key: key.to_owned(),
                expected,
                found: describe_type(value),
            })
    }

    /// An unsigned integer stored with any integer width (u8…u64, or a
    /// non-negative i8…i64). `Ok(None)` when absent.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, MetadataError> {
        self.typed(key, "non-negative integer", Value::as_u64)
    }

    /// Like [`Metadata::get_u64`], for values that must fit `u32`.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, MetadataError> {
        self.typed(key, "integer in u32 range", |v| {
            v.as_u64().and_then(|n| u32::try_from(n).ok())
        })
    }

    /// A signed integer stored with any integer width.
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, MetadataError> {
        self.typed(key, "integer", Value::as_i64)
    }

    /// A float stored as F32 or F64.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, MetadataError> {
        self.typed(key, "float", Value::as_f64)
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, MetadataError> {
        self.typed(key, "string", Value::as_str)
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, MetadataError> {
        self.typed(key, "bool", Value::as_bool)
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, MetadataError> {
        self.typed(key, "array", Value::as_array)
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Option<&[String]>, MetadataError> {
        self.typed(key, "array of string", |v| {
            v.as_array().and_then(Array::as_strings)
        })
    }

    /// Like [`Metadata::get_u64`] but the key must be present.
    pub fn require_u64(&self, key: &str) -> Result<u64, MetadataError> {
        self.get_u64(key)?
            .ok_or_else(|| MetadataError::Missing(key.to_owned()))
    }

    /// Like [`Metadata::get_str`] but the key must be present.
    pub fn require_str(&self, key: &str) -> Result<&str, MetadataError> {
        self.get_str(key)?
            .ok_or_else(|| MetadataError::Missing(key.to_owned()))
    }
}

impl Metadata {
    /// The data alignment this metadata declares: `general.alignment`, which
    /// must be a uint32 power of two no larger than [`super::MAX_ALIGNMENT`], or
    /// [`super::DEFAULT_ALIGNMENT`] when absent.
    pub fn alignment(&self) -> Result<u64, AlignmentError> {
        match self.get(keys::ALIGNMENT) {
            None => Ok(super::DEFAULT_ALIGNMENT),
            Some(Value::U32(a)) if a.is_power_of_two() && u64::from(*a) <= super::MAX_ALIGNMENT => {
                Ok(u64::from(*a))
            }
            Some(Value::U32(a)) => Err(AlignmentError::Value(*a)),
            Some(other) => Err(AlignmentError::Type(describe_type(other))),
        }
    }
}

/// An unusable `general.alignment`; it displays what was found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlignmentError {
    /// A uint32 that is no power of two, or larger than [`super::MAX_ALIGNMENT`].
    #[error("{0}")]
    Value(u32),
    /// A value of another type (its description, e.g. `string`).
    #[error("{0}")]
    Type(String),
}

/// A type description for messages: `uint32`, `array[string]`.
pub fn describe_type(value: &Value) -> String {
    match value {
        Value::Array(a) => describe_array_type(a),
        other => other.value_type().name().to_owned(),
    }
}

fn describe_array_type(array: &Array) -> String {
    match array {
        Array::Array(inner) => match inner.first() {
            Some(first) => format!("array[{}]", describe_array_type(first)),
            None => "array[array]".to_owned(),
        },
        other => format!("array[{}]", other.element_type()),
    }
}

impl FromIterator<(String, Value)> for Metadata {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        let mut m = Metadata::new();
        for (k, v) in iter {
            m.set(k, v);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_insertion_order_and_positions() {
        let mut m = Metadata::new();
        m.set("b", 1u32);
        m.set("a", "x");
        m.set("c", true);
        assert_eq!(m.set("a", "y"), Some(Value::from("x")));
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["b", "a", "c"]);
        assert_eq!(m.remove("b"), Some(Value::U32(1)));
        assert_eq!(m.get_str("a"), Ok(Some("y")));
        assert_eq!(m.get_bool("c"), Ok(Some(true)));
        assert!(!m.push_new("a".into(), Value::U8(0)));
    }

    #[test]
    fn integer_accessors_accept_every_width() {
        let mut m = Metadata::new();
        m.set("u32", 7u32);
        m.set("i32", 7i32);
        m.set("u64", 7u64);
        m.set("u8", 7u8);
        m.set("neg", -1i32);
        m.set("big", u64::MAX);
        for key in ["u32", "i32", "u64", "u8"] {
            assert_eq!(m.get_u64(key), Ok(Some(7)), "{key}");
            assert_eq!(m.get_u32(key), Ok(Some(7)), "{key}");
            assert_eq!(m.get_i64(key), Ok(Some(7)), "{key}");
        }
        assert!(matches!(
            m.get_u64("neg"),
            Err(MetadataError::WrongType { .. })
        ));
        assert_eq!(m.get_i64("neg"), Ok(Some(-1)));
        assert!(matches!(
            m.get_u32("big"),
            Err(MetadataError::WrongType { .. })
        ));
        assert!(matches!(
            m.get_i64("big"),
            Err(MetadataError::WrongType { .. })
        ));
        assert_eq!(m.get_u64("absent"), Ok(None));
        assert_eq!(
            m.require_u64("absent"),
            Err(MetadataError::Missing("absent".into()))
        );
    }

    #[test]
    fn wrong_type_names_key_and_types() {
        let mut m = Metadata::new();
        m.set("k", Array::String(vec!["a".into()]));
        let err = m.get_u64("k").unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata key 'k' has type array[string], expected non-negative integer"
        );
        assert_eq!(m.get_str_array("k"), Ok(Some(&["a".to_owned()][..])));
    }
}
