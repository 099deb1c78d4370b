//! Mixed-precision recipes: a base llama.cpp file type plus an ordered list
//! of `pattern → type` rules, in a TOML file a user can read, diff and
//! version. The first rule whose pattern is found in a tensor's name (and
//! whose layer range, if any, holds the tensor's `blk.N`) decides that
//! tensor's type; tensors no rule names get the base file type's own mix.
//!
//! ```toml
//! name = "attn-q8-ffn-q4"
//! description = "Attention in Q8_0, feed-forward in Q4_K"
//! base = "Q4_K_M"           # llama.cpp file type for everything else
//! output = "Q6_K"           # optional, like --output-tensor-type
//! token_embedding = "Q6_K"  # optional, like --token-embedding-type
//!
//! [[rule]]
//! match = 'attn_(q|k|v|qkv|output)\.weight$'
//! type = "Q8_0"
//!
//! [[rule]]
//! match = 'ffn_down'
//! layers = "0-3, 28-31"     # optional: only these blocks
//! type = "Q6_K"
//! ```
//!
//! Patterns are regular expressions searched anywhere in the name (like
//! `llama-quantize --tensor-type`). A rule's type still falls back when the
//! row length is not a multiple of its block (Q4_K → Q5_0 on 576-wide rows).

use std::fmt::Write as _;

use memwall_format::GgmlType;
use memwall_format::ggml_type::{FileTypeInfo, file_type_by_name};

use crate::rules::Override;

/// A parsed recipe.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// Short name, recorded in the output's metadata.
    pub name: String,
    /// What the recipe is for.
    pub description: String,
    /// Base file type: `general.file_type` of the output and the mix applied
    /// to tensors no rule names.
    pub base: &'static FileTypeInfo,
    /// Type of `output.weight` (and of tied embeddings).
    pub output: Option<GgmlType>,
    /// Type of `token_embd.weight`.
    pub token_embedding: Option<GgmlType>,
    /// Rules, first match wins.
    pub rules: Vec<Override>,
}

/// Built-in recipes: (name, TOML text).
pub const PRESETS: [(&str, &str); 3] = [
    (
        "attn-f16-ffn-q4",
        r#"name = "attn-f16-ffn-q4"
description = "Attention projections in F16, feed-forward in Q4_K, embeddings and output in Q6_K"
base = "Q4_K_M"
output = "Q6_K"
token_embedding = "Q6_K"

[[rule]]
match = '\.attn_(q|k|v|qkv|output)\.weight$'
type = "F16"

[[rule]]
match = '\.ffn_(gate|up|down)(_exps|_shexp)?\.weight$'
type = "Q4_K"
"#,
    ),
    (
        "attn-q8-ffn-q4",
        r#"name = "attn-q8-ffn-q4"
description = "Attention projections in Q8_0, feed-forward in Q4_K, embeddings and output in Q6_K"
base = "Q4_K_M"
output = "Q6_K"
token_embedding = "Q6_K"

[[rule]]
match = '\.attn_(q|k|v|qkv|output)\.weight$'
type = "Q8_0"

[[rule]]
match = '\.ffn_(gate|up|down)(_exps|_shexp)?\.weight$'
type = "Q4_K"
"#,
    ),
    (
        "attn-q8-ffn-q4-down-q6",
        r#"name = "attn-q8-ffn-q4-down-q6"
description = "Attention in Q8_0, FFN down projections in Q6_K, gate/up in Q4_K, embeddings and output in Q6_K"
base = "Q4_K_M"
output = "Q6_K"
token_embedding = "Q6_K"

[[rule]]
match = '\.attn_(q|k|v|qkv|output)\.weight$'
type = "Q8_0"

[[rule]]
match = '\.ffn_down(_exps|_shexp)?\.weight$'
type = "Q6_K"

[[rule]]
match = '\.ffn_(gate|up)(_exps|_shexp)?\.weight$'
type = "Q4_K"
"#,
    ),
];

/// Why a recipe, a type name, a layer range or a rule pattern is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    /// Not TOML.
    #[error("{0}")]
    Toml(String),
    /// A key the recipe (or a rule) does not have.
    #[error("unknown key '{key}' (known: {known})")]
    UnknownKey {
        /// The key.
        key: String,
        /// The keys there are.
        known: &'static str,
    },
    /// A top-level field that must be a string.
    #[error("'{key}' must be a string, not {found}")]
    NotAString {
        /// The field.
        key: &'static str,
        /// The TOML type it has.
        found: &'static str,
    },
    /// No `name`.
    #[error("a recipe needs a name")]
    NoName,
    /// No `base`.
    #[error("a recipe needs a base file type, e.g. base = \"Q4_K_M\"")]
    NoBase,
    /// A `base` that is no llama.cpp file type.
    #[error("unknown base file type '{0}'")]
    UnknownBase(String),
    /// A tensor type that is no ggml type.
    #[error("unknown tensor type '{name}'; memwall encodes {valid}")]
    UnknownType {
        /// What was given.
        name: String,
        /// The types memwall encodes.
        valid: String,
    },
    /// `rule` is not an array of tables.
    #[error("'rule' must be an array of tables ([[rule]])")]
    RulesNotArray,
    /// A problem of rule `index` (from 1).
    #[error("rule {index}: {problem}")]
    Rule {
        /// Which rule, from 1.
        index: usize,
        /// What is wrong with it.
        problem: Box<RecipeError>,
    },
    /// A rule that is not a table.
    #[error("must be a table")]
    RuleNotATable,
    /// A rule without `match`.
    #[error("needs match = '<regex>'")]
    NoMatch,
    /// A rule without `type`.
    #[error("needs type = \"<ggml type>\"")]
    NoType,
    /// A layer number out of range.
    #[error("bad layer {0}")]
    BadLayer(i64),
    /// `layers` of another TOML type.
    #[error("layers must be a string such as \"0-3, 28-31\"")]
    LayersNotAString,
    /// A layer range that does not parse.
    #[error("bad layer range '{0}' (expected N or N-M, e.g. \"0-3, 28-31\")")]
    BadLayerRange(String),
    /// No layer range at all.
    #[error("empty layer range")]
    EmptyLayerRange,
    /// A pattern that is no regular expression.
    #[error("bad pattern '{pattern}': {message}")]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// The regex engine's message.
        message: String,
    },
}

/// Parses a type name the way `llama-quantize` does (case-insensitive ggml
/// type name), with the valid names in the error.
pub fn parse_type(name: &str) -> Result<GgmlType, RecipeError> {
    GgmlType::all()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let valid: Vec<String> = crate::ENCODABLE
                .iter()
                .map(|t| t.name().to_ascii_uppercase())
                .collect();
            RecipeError::UnknownType {
                name: name.to_owned(),
                valid: valid.join(", "),
            }
        })
}

/// Parses `"0-3, 28-31, 40"` into inclusive ranges.
pub fn parse_layers(text: &str) -> Result<Vec<(u32, u32)>, RecipeError> {
    let mut ranges = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || RecipeError::BadLayerRange(part.to_owned());
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let a: u32 = a.parse().map_err(|_| bad())?;
        let b: u32 = b.parse().map_err(|_| bad())?;
        if a > b {
            return Err(bad());
        }
        ranges.push((a, b));
    }
    if ranges.is_empty() {
        return Err(RecipeError::EmptyLayerRange);
    }
    Ok(ranges)
}

/// Builds one rule (`--tensor-type` or a recipe rule).
pub fn make_override(
    pattern: &str,
    ty: GgmlType,
    layers: Vec<(u32, u32)>,
    always: bool,
) -> Result<Override, RecipeError> {
    let regex = regex::Regex::new(pattern).map_err(|e| RecipeError::BadPattern {
        pattern: pattern.to_owned(),
        message: e.to_string(),
    })?;
    Ok(Override {
        text: pattern.to_owned(),
        regex,
        ty,
        layers,
        always,
    })
}

impl Recipe {
    /// A built-in recipe by name.
    pub fn preset(name: &str) -> Option<Recipe> {
        PRESETS.iter().find(|(n, _)| *n == name).map(|(_, text)| {
            #[expect(
                clippy::expect_used,
                reason = "built-in text; a unit test parses every preset"
            )]
            Recipe::parse(text).expect("built-in recipes parse")
        })
    }

    /// Parses recipe TOML. Errors name the offending field or rule.
    pub fn parse(text: &str) -> Result<Recipe, RecipeError> {
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| RecipeError::Toml(e.to_string()))?;
        const KNOWN: [&str; 6] = [
            "name",
            "description",
            "base",
            "output",
            "token_embedding",
            "rule",
        ];
        if let Some(k) = doc.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(RecipeError::UnknownKey {
                key: k.clone(),
                known: "name, description, base, output, token_embedding, rule",
            });
        }
        let string = |key: &'static str| -> Result<Option<String>, RecipeError> {
            match doc.get(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(RecipeError::NotAString {
                    key,
                    found: other.type_str(),
                }),
            }
        };
        let name = string("name")?.ok_or(RecipeError::NoName)?;
        let description = string("description")?.unwrap_or_default();
        let base_name = string("base")?.ok_or(RecipeError::NoBase)?;
        let base = file_type_by_name(&base_name)
            .ok_or_else(|| RecipeError::UnknownBase(base_name.clone()))?;
        let output = string("output")?.map(|t| parse_type(&t)).transpose()?;
        let token_embedding = string("token_embedding")?
            .map(|t| parse_type(&t))
            .transpose()?;
        let mut rules = Vec::new();
        let raw_rules = match doc.get("rule") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) => a.clone(),
            Some(_) => return Err(RecipeError::RulesNotArray),
        };
        for (i, raw) in raw_rules.iter().enumerate() {
            let at = |problem: RecipeError| RecipeError::Rule {
                index: i + 1,
                problem: Box::new(problem),
            };
            let t = raw
                .as_table()
                .ok_or_else(|| at(RecipeError::RuleNotATable))?;
            if let Some(k) = t
                .keys()
                .find(|k| !["match", "type", "layers"].contains(&k.as_str()))
            {
                return Err(at(RecipeError::UnknownKey {
                    key: k.clone(),
                    known: "match, type, layers",
                }));
            }
            let pattern = t
                .get("match")
                .and_then(toml::Value::as_str)
                .ok_or_else(|| at(RecipeError::NoMatch))?;
            let ty = t
                .get("type")
                .and_then(toml::Value::as_str)
                .ok_or_else(|| at(RecipeError::NoType))?;
            let ty = parse_type(ty).map_err(at)?;
            let layers = match t.get("layers") {
                None => Vec::new(),
                Some(toml::Value::String(s)) => parse_layers(s).map_err(at)?,
                Some(toml::Value::Integer(n)) => {
                    let n = u32::try_from(*n).map_err(|_| at(RecipeError::BadLayer(*n)))?;
                    vec![(n, n)]
                }
                Some(_) => return Err(at(RecipeError::LayersNotAString)),
            };
            rules.push(make_override(pattern, ty, layers, true).map_err(at)?);
        }
        Ok(Recipe {
            name,
            description,
            base,
            output,
            token_embedding,
            rules,
        })
    }

    /// The recipe as canonical TOML, recorded in the output's metadata.
    pub fn to_toml(&self) -> String {
        let q = |s: &str| toml::Value::String(s.to_owned()).to_string();
        let mut out = String::new();
        let _ = writeln!(out, "name = {}", q(&self.name));
        if !self.description.is_empty() {
            let _ = writeln!(out, "description = {}", q(&self.description));
        }
        let _ = writeln!(out, "base = {}", q(self.base.name));
        if let Some(t) = self.output {
            let _ = writeln!(out, "output = {}", q(t.name()));
        }
        if let Some(t) = self.token_embedding {
            let _ = writeln!(out, "token_embedding = {}", q(t.name()));
        }
        for r in &self.rules {
            let _ = write!(out, "\n[[rule]]\nmatch = {}\n", q(&r.text));
            if !r.layers.is_empty() {
                let ranges: Vec<String> = r
                    .layers
                    .iter()
                    .map(|&(a, b)| {
                        if a == b {
                            a.to_string()
                        } else {
                            format!("{a}-{b}")
                        }
                    })
                    .collect();
                let _ = writeln!(out, "layers = {}", q(&ranges.join(", ")));
            }
            let _ = writeln!(out, "type = {}", q(r.ty.name()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_round_trip() {
        for (name, _) in PRESETS {
            let r = Recipe::preset(name).unwrap();
            assert_eq!(r.name, name);
            let again = Recipe::parse(&r.to_toml()).unwrap();
            assert_eq!(again.to_toml(), r.to_toml());
            assert_eq!(again.rules.len(), r.rules.len());
        }
    }

    #[test]
    fn rules_match_in_order_with_layers() {
        let r = Recipe::parse(
            r#"name = "t"
base = "Q4_K_M"
[[rule]]
match = 'ffn_down'
layers = "0-1, 5"
type = "Q6_K"
[[rule]]
match = 'ffn_'
type = "q4_k"
"#,
        )
        .unwrap();
        let pick = |n: &str| r.rules.iter().find(|o| o.matches(n)).map(|o| o.ty);
        assert_eq!(pick("blk.1.ffn_down.weight"), Some(GgmlType::Q6_K));
        assert_eq!(pick("blk.5.ffn_down.weight"), Some(GgmlType::Q6_K));
        assert_eq!(pick("blk.2.ffn_down.weight"), Some(GgmlType::Q4_K));
        assert_eq!(pick("blk.2.attn_q.weight"), None);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = Recipe::parse(
            "name = \"x\"\nbase = \"Q4_K_M\"\n[[rule]]\nmatch = 'a'\ntype = \"Q9_K\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rule 1") && e.contains("Q9_K") && e.contains("Q4_K"),
            "{e}"
        );
        let e = Recipe::parse("name = \"x\"\nbase = \"Q7\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("Q7"), "{e}");
        let e = Recipe::parse("name = \"x\"\nbase = \"Q4_K_M\"\nrules = []\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key 'rules'"), "{e}");
        let e = Recipe::parse(
            "name = \"x\"\nbase = \"Q4_K_M\"\n[[rule]]\nmatch = '('\ntype = \"F16\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bad pattern"), "{e}");
        assert!(parse_layers("3-1").is_err());
    }
}
