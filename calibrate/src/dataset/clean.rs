//! Cleaning: which script a document is written in, and duplicate removal.
//!
//! Exact duplicates are documents whose whitespace-normalised text has the
//! same SHA-256. Near duplicates are found with MinHash over character
//! 5-gram shingles: [`PERMUTATIONS`] hash functions, banded for LSH into
//! [`BANDS`] bands of [`ROWS`] rows (a pair at Jaccard 0.8 shares a band with
//! probability 1 − (1 − 0.8⁴)³² > 0.9999; at 0.3 with 0.23), and a candidate
//! counts as a duplicate when the share of equal signature entries (the
//! Jaccard estimate, standard error ≈ 0.035 at 0.8) reaches the threshold.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};

/// Counts of letters by script.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Script {
    /// CJK unified ideographs (and compatibility ideographs).
    pub cjk: u64,
    /// Latin letters.
    pub latin: u64,
    /// Other alphabetic characters (Cyrillic, kana, Hangul, …).
    pub other: u64,
}

/// Whether `c` is a CJK ideograph.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF      // unified ideographs
        | 0x3400..=0x4DBF    // extension A
        | 0x20000..=0x2A6DF  // extension B
        | 0x2A700..=0x2EBEF  // extensions C–F
        | 0x30000..=0x323AF  // extensions G–H
        | 0xF900..=0xFAFF    // compatibility ideographs
        | 0x2F800..=0x2FA1F  // compatibility supplement
        | 0x3007             // 〇
    )
}

fn is_latin(c: char) -> bool {
    c.is_ascii_alphabetic()
        || matches!(c as u32, 0x00C0..=0x024F | 0x1E00..=0x1EFF)
            && c.is_alphabetic()
            && c != '×'
            && c != '÷'
}

impl Script {
    /// Counts the letters of `text`.
    pub fn of(text: &str) -> Script {
        let mut s = Script::default();
        for c in text.chars() {
            if is_cjk(c) {
                s.cjk += 1;
            } else if is_latin(c) {
                s.latin += 1;
            } else if c.is_alphabetic() {
                s.other += 1;
            }
        }
        s
    }

    /// All letters counted.
    pub fn letters(&self) -> u64 {
        self.cjk + self.latin + self.other
    }

    /// The CJK share of the letters (0 when there are none).
    pub fn cjk_share(&self) -> f64 {
        match self.letters() {
            0 => 0.0,
            n => self.cjk as f64 / n as f64,
        }
    }

    /// The dominant script: `zh`, `en` or `other` (also for no letters).
    pub fn dominant(&self) -> &'static str {
        if self.cjk > 0 && self.cjk >= self.latin && self.cjk >= self.other {
            "zh"
        } else if self.latin > 0 && self.latin >= self.other {
            "en"
        } else {
            "other"
        }
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Script) {
        self.cjk += other.cjk;
        self.latin += other.latin;
        self.other += other.other;
    }
}

/// Hash functions per signature.
pub const PERMUTATIONS: usize = 128;
/// LSH bands.
pub const BANDS: usize = 32;
/// Signature entries per band.
pub const ROWS: usize = PERMUTATIONS / BANDS;
/// Characters per shingle.
pub const SHINGLE: usize = 5;

/// SplitMix64's output function: a strong 64-bit mixer.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over bytes.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The text with every run of whitespace made one space, trimmed.
pub(crate) fn normalise(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The MinHash signature of normalised text (lower-cased).
pub(crate) fn signature(normalised: &str) -> [u64; PERMUTATIONS] {
    let chars: Vec<char> = normalised.chars().flat_map(char::to_lowercase).collect();
    let mut shingles = HashSet::new();
    if chars.len() <= SHINGLE {
        shingles.insert(hash_chars(&chars));
    } else {
        for w in chars.windows(SHINGLE) {
            shingles.insert(hash_chars(w));
        }
    }
    let mut sig = [u64::MAX; PERMUTATIONS];
    for &h in &shingles {
        for (i, slot) in sig.iter_mut().enumerate() {
            let v = mix64(h ^ SEEDS[i]);
            if v < *slot {
                *slot = v;
            }
        }
    }
    sig
}

fn hash_chars(chars: &[char]) -> u64 {
    let mut buf = [0u8; 4 * SHINGLE];
    let mut n = 0;
    for c in chars {
        n += c.encode_utf8(&mut buf[n..]).len();
    }
    fnv1a(&buf[..n])
}

/// Per-permutation seeds, fixed so that signatures do not depend on the run.
const SEEDS: [u64; PERMUTATIONS] = {
    let mut seeds = [0u64; PERMUTATIONS];
    let mut state = 0x6d65_6d77_616c_6c21u64; // "memwall!"
    let mut i = 0;
    while i < PERMUTATIONS {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        seeds[i] = z ^ (z >> 31);
        i += 1;
    }
    seeds
};

/// The estimated Jaccard similarity of two signatures.
pub(crate) fn similarity(a: &[u64; PERMUTATIONS], b: &[u64; PERMUTATIONS]) -> f64 {
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    same as f64 / PERMUTATIONS as f64
}

/// Why a document was dropped as a duplicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dup {
    Exact,
    Near,
}

/// Documents seen so far, for duplicate checks in input order.
pub(crate) struct Deduper {
    near: Option<f64>,
    exact: HashSet<[u8; 32]>,
    signatures: Vec<[u64; PERMUTATIONS]>,
    bands: Vec<HashMap<u64, Vec<u32>>>,
}

impl Deduper {
    /// Exact duplicates always; near duplicates at Jaccard ≥ `near` when given.
    pub(crate) fn new(near: Option<f64>) -> Deduper {
        Deduper {
            near,
            exact: HashSet::new(),
            signatures: Vec::new(),
            bands: vec![HashMap::new(); BANDS],
        }
    }

    /// Whether `text` repeats a document seen before; if not, remembers it.
    pub(crate) fn check(&mut self, text: &str) -> Option<Dup> {
        let normalised = normalise(text);
        let digest: [u8; 32] = Sha256::digest(normalised.as_bytes()).into();
        if !self.exact.insert(digest) {
            return Some(Dup::Exact);
        }
        let threshold = self.near?;
        let sig = signature(&normalised);
        let keys: Vec<u64> = sig
            .chunks(ROWS)
            .map(|band| band.iter().fold(0u64, |h, &v| mix64(h ^ v)))
            .collect();
        let mut seen = HashSet::new();
        for (band, key) in keys.iter().enumerate() {
            if let Some(ids) = self.bands[band].get(key) {
                for &id in ids {
                    if seen.insert(id)
                        && similarity(&sig, &self.signatures[id as usize]) >= threshold
                    {
                        return Some(Dup::Near);
                    }
                }
            }
        }
        let id = u32::try_from(self.signatures.len()).unwrap_or(u32::MAX);
        self.signatures.push(sig);
        for (band, key) in keys.into_iter().enumerate() {
            self.bands[band].entry(key).or_default().push(id);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cjk_share_counts_letters_only() {
        let s = Script::of("ls 命令列出目录内容。123 ！");
        assert_eq!((s.cjk, s.latin, s.other), (8, 2, 0));
        assert!((s.cjk_share() - 0.8).abs() < 1e-12);
        assert_eq!(s.dominant(), "zh");
        let s = Script::of("The ls command lists files. Ünïcödé");
        assert_eq!(s.cjk, 0);
        assert_eq!(s.dominant(), "en");
        assert_eq!(Script::of("Привет мир").dominant(), "other");
        assert_eq!(Script::of("12 34 !!").cjk_share(), 0.0);
        assert_eq!(Script::of("〇𠀀").cjk, 2);
    }

    #[test]
    fn exact_duplicates_ignore_whitespace() {
        let mut d = Deduper::new(None);
        assert_eq!(d.check("tar  -xzf\n a.tgz"), None);
        assert_eq!(d.check("tar -xzf a.tgz  "), Some(Dup::Exact));
        assert_eq!(d.check("tar -xzf b.tgz"), None);
    }

    #[test]
    fn near_duplicates_are_caught_and_different_texts_kept() {
        let base = "grep 命令在文件中搜索与模式匹配的行，加上 -r 选项可以递归搜索整个目录，加上 -i 选项忽略大小写，加上 -n 选项显示行号。";
        let mut d = Deduper::new(Some(0.8));
        assert_eq!(d.check(base), None);
        // One character changed at the end: Jaccard well above 0.8.
        let near = base.replace("显示行号", "显示行数");
        let j = similarity(&signature(&normalise(base)), &signature(&normalise(&near)));
        assert!(j > 0.8, "{j}");
        assert_eq!(d.check(&near), Some(Dup::Near));
        assert_eq!(
            d.check("chmod 修改文件的权限位，例如 chmod 755 script.sh 让所有者可读写执行，其他人可读可执行。"),
            None
        );
        // With near-duplicate removal off, only exact copies go.
        let mut d = Deduper::new(None);
        assert_eq!(d.check(base), None);
        assert_eq!(d.check(&near), None);
    }

    #[test]
    fn similarity_estimates_jaccard() {
        // Two sets of shingles sharing about half of their elements.
        let a: String = (0..400)
            .map(|i| char::from_u32(0x4E00 + i).unwrap())
            .collect();
        let b: String = (200..600)
            .map(|i| char::from_u32(0x4E00 + i).unwrap())
            .collect();
        let j = similarity(&signature(&a), &signature(&b));
        // True Jaccard = 196 / 600 ≈ 0.33.
        assert!((j - 0.33).abs() < 0.15, "{j}");
    }
}
