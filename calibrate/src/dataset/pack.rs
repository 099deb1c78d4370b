//! Mixing and packing: how many samples each source gets, and documents'
//! tokens laid into samples of exactly `seq_len` tokens.
//!
//! A sample starts with BOS when the vocabulary adds one; documents follow
//! each other separated by one separator token (EOS, else a newline token);
//! a document longer than the room left continues in the next sample, so no
//! text is dropped except the unfinished last sample of a source.

use super::clean::mix64;

/// SplitMix64: a small, fast, seedable generator. The same seed gives the
/// same sequence on every platform, which keeps calibration sets reproducible.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// A uniform integer below `n` (`n` > 0), by Lemire's multiply-shift with
    /// rejection, so there is no modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Shuffles `items` (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// Splits `total` samples by `shares` (normalised, non-negative) with the
/// largest-remainder method: the counts add up to `total` exactly, ties go to
/// the earlier source.
pub(crate) fn allocate(total: usize, shares: &[f64]) -> Vec<usize> {
    let sum: f64 = shares.iter().sum();
    if shares.is_empty() || sum <= 0.0 {
        return vec![0; shares.len()];
    }
    let exact: Vec<f64> = shares.iter().map(|s| s / sum * total as f64).collect();
    let mut counts: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut left = total.saturating_sub(counts.iter().sum());
    let mut order: Vec<usize> = (0..shares.len()).filter(|&i| shares[i] > 0.0).collect();
    order.sort_by(|&a, &b| {
        let ra = exact[a] - exact[a].floor();
        let rb = exact[b] - exact[b].floor();
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        counts[i] += 1;
        left -= 1;
    }
    counts
}

/// Where some tokens of a sample came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provenance {
    /// The source's name.
    pub source: String,
    /// The input file.
    pub file: String,
    /// 1-based line (JSONL), element (JSON), record (Parquet); 1 for a text file.
    pub line: usize,
    /// Tokens of the sample taken from there.
    pub tokens: usize,
}

/// One packed sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Exactly `seq_len` token ids.
    pub tokens: Vec<u32>,
    /// Where the document tokens came from, in order.
    pub provenance: Vec<Provenance>,
}

/// Builds the samples of one source.
pub(crate) struct Packer {
    seq_len: usize,
    bos: Option<u32>,
    separator: Option<u32>,
    current: Sample,
    /// Whether the current sample holds document tokens already.
    has_doc: bool,
    /// Finished samples.
    pub(crate) done: Vec<Sample>,
}

impl Packer {
    /// A packer for samples of `seq_len` (> 1 when `bos` is set) tokens.
    pub(crate) fn new(seq_len: usize, bos: Option<u32>, separator: Option<u32>) -> Packer {
        let mut p = Packer {
            seq_len,
            bos,
            separator,
            current: Sample {
                tokens: Vec::new(),
                provenance: Vec::new(),
            },
            has_doc: false,
            done: Vec::new(),
        };
        p.open();
        p
    }

    fn open(&mut self) {
        self.current = Sample {
            tokens: Vec::with_capacity(self.seq_len),
            provenance: Vec::new(),
        };
        self.current.tokens.extend(self.bos);
        self.has_doc = false;
    }

    fn room(&self) -> usize {
        self.seq_len - self.current.tokens.len()
    }

    fn close_if_full(&mut self) {
        if self.room() == 0 {
            let sample = std::mem::replace(
                &mut self.current,
                Sample {
                    tokens: Vec::new(),
                    provenance: Vec::new(),
                },
            );
            self.done.push(sample);
            self.open();
        }
    }

    /// Appends a document, stopping as soon as `limit` samples are done.
    /// Returns the number of the document's tokens placed.
    pub(crate) fn push(
        &mut self,
        tokens: &[u32],
        source: &str,
        file: &str,
        line: usize,
        limit: usize,
    ) -> usize {
        let mut placed = 0;
        if tokens.is_empty() || self.done.len() >= limit {
            return 0;
        }
        if self.has_doc {
            if let Some(sep) = self.separator {
                self.current.tokens.push(sep);
                self.close_if_full();
                if self.done.len() >= limit {
                    return 0;
                }
            }
        }
        while placed < tokens.len() && self.done.len() < limit {
            let take = self.room().min(tokens.len() - placed);
            self.current
                .tokens
                .extend_from_slice(&tokens[placed..placed + take]);
            self.current.provenance.push(Provenance {
                source: source.to_owned(),
                file: file.to_owned(),
                line,
                tokens: take,
            });
            self.has_doc = true;
            placed += take;
            self.close_if_full();
        }
        placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_deterministic_and_shuffles_everything() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        assert_eq!(a.next_u64(), b.next_u64());
        // The reference SplitMix64 sequence from seed 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut v: Vec<u32> = (0..100).collect();
        a.shuffle(&mut v);
        let mut w: Vec<u32> = (0..100).collect();
        b.shuffle(&mut w);
        assert_eq!(v, w);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
        for _ in 0..1000 {
            assert!(a.below(3) < 3);
        }
    }

    #[test]
    fn allocation_follows_ratios_and_adds_up() {
        assert_eq!(allocate(10, &[0.7, 0.3]), vec![7, 3]);
        assert_eq!(allocate(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
        assert_eq!(allocate(7, &[2.0, 0.0, 1.0]), vec![5, 0, 2]);
        assert_eq!(allocate(512, &[0.7, 0.3]).iter().sum::<usize>(), 512);
        assert_eq!(allocate(5, &[0.0]), vec![0]);
    }

    #[test]
    fn packing_gives_exact_lengths_bos_separators_and_chunks() {
        let mut p = Packer::new(8, Some(1), Some(2));
        let long: Vec<u32> = (100..120).collect();
        assert_eq!(p.push(&[10, 11, 12], "s", "f", 1, 10), 3);
        assert_eq!(p.push(&long, "s", "f", 2, 10), 20);
        assert_eq!(p.push(&[30, 31], "s", "f", 3, 10), 2);
        let s = &p.done;
        assert!(s.iter().all(|s| s.tokens.len() == 8 && s.tokens[0] == 1));
        assert_eq!(s[0].tokens, vec![1, 10, 11, 12, 2, 100, 101, 102]);
        // The long document continues in the next samples, nothing dropped.
        assert_eq!(s[1].tokens, vec![1, 103, 104, 105, 106, 107, 108, 109]);
        assert_eq!(s[2].tokens, vec![1, 110, 111, 112, 113, 114, 115, 116]);
        assert_eq!(p.current.tokens, vec![1, 117, 118, 119, 2, 30, 31]);
        assert_eq!(s.len(), 3, "the fourth sample is not full yet");
        assert_eq!(
            s[0].provenance
                .iter()
                .map(|p| (p.line, p.tokens))
                .collect::<Vec<_>>(),
            vec![(1, 3), (2, 3)]
        );
        assert_eq!(s[1].provenance[0].line, 2);
    }

    #[test]
    fn packing_stops_at_the_limit_and_works_without_bos() {
        let mut p = Packer::new(4, None, None);
        let doc: Vec<u32> = (0..100).collect();
        assert_eq!(p.push(&doc, "s", "f", 1, 2), 8);
        assert_eq!(p.done.len(), 2);
        assert_eq!(p.done[1].tokens, vec![4, 5, 6, 7]);
        assert_eq!(p.push(&doc, "s", "f", 2, 2), 0);
    }
}
