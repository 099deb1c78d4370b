//! "Did you mean …?" for names users type: quantization types, recipes,
//! device profiles, architectures, pre-tokenizers.

/// Letters and digits only, lower case: `Q4_K_M`, `q4-k-m` and `Q4KM` are the same key.
fn key(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Levenshtein distance between two short strings.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The candidate `name` most likely stands for: one with the same letters
/// and digits (ignoring case and separators), else the nearest within a few
/// edits (a third of its length, at least one); `None` when nothing is close.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let wanted = key(name);
    if wanted.is_empty() {
        return None;
    }
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        let k = key(candidate);
        if k == wanted {
            return Some(candidate);
        }
        let d = distance(&wanted, &k);
        let limit = (k.chars().count() / 3).max(1);
        if d <= limit && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, candidate));
        }
    }
    best.map(|(_, c)| c)
}

/// `" (did you mean X?)"` when a candidate is close, else an empty string:
/// for the end of an error message.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(name, candidates).map_or(String::new(), |c| format!(" (did you mean {c}?)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: [&str; 6] = ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q8_0", "IQ4_XS", "F16"];

    #[test]
    fn separators_and_case_do_not_matter() {
        assert_eq!(closest("Q4KM", TYPES), Some("Q4_K_M"));
        assert_eq!(closest("q4-k-m", TYPES), Some("Q4_K_M"));
        assert_eq!(closest("iq4xs", TYPES), Some("IQ4_XS"));
    }

    #[test]
    fn a_typo_finds_the_nearest_name() {
        assert_eq!(closest("Q4_K_N", TYPES), Some("Q4_K_M"));
        assert_eq!(closest("Q8_1", TYPES), Some("Q8_0"));
        assert_eq!(
            closest("phone-16g", ["phone-8gb", "phone-12gb", "phone-16gb"]),
            Some("phone-16gb")
        );
        assert_eq!(
            closest("LlamaForCausalLm", ["LlamaForCausalLM", "Qwen2ForCausalLM"]),
            Some("LlamaForCausalLM")
        );
    }

    #[test]
    fn nothing_close_suggests_nothing() {
        assert_eq!(closest("model.gguf", TYPES), None);
        assert_eq!(closest("", TYPES), None);
        assert_eq!(did_you_mean("banana", TYPES), "");
        assert_eq!(did_you_mean("Q4KM", TYPES), " (did you mean Q4_K_M?)");
    }
}
