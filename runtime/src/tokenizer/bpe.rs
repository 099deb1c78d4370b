//! Byte-level BPE (`tokenizer.ggml.model = gpt2`): GPT-2's byte ↔ character
//! mapping, and the merge loop over one pre-tokenized word.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's printable stand-in for each byte: printable Latin-1 bytes map to
/// themselves, the others to U+0100 onwards in byte order (space → `Ġ`,
/// newline → `Ċ`).
pub(crate) static BYTE_TO_CHAR: std::sync::LazyLock<[char; 256]> = std::sync::LazyLock::new(|| {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    for (b, slot) in (0u32..).zip(table.iter_mut()) {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cpt = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        // Every value is below U+0144.
        *slot = char::from_u32(cpt).unwrap_or('\0');
    }
    table
});

/// The byte a GPT-2 stand-in character encodes, if it is one.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    static TABLE: std::sync::LazyLock<[Option<u8>; 0x144]> = std::sync::LazyLock::new(|| {
        let mut table = [None; 0x144];
        for (b, &c) in (0u8..=255).zip(BYTE_TO_CHAR.iter()) {
            table[c as usize] = Some(b);
        }
        table
    });
    TABLE.get(c as usize).copied().flatten()
}

/// Appends the GPT-2 encoding of `bytes` to `out`.
pub(crate) fn byte_encode(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        out.push(BYTE_TO_CHAR[usize::from(b)]);
    }
}

/// Symbol id of a string that no merge mentions.
const NO_SYMBOL: u32 = u32::MAX;

/// The merge table, with every string a merge mentions interned so that the
/// loop compares integers: `(left, right) → (rank, merged)`.
#[derive(Debug, Default)]
pub(crate) struct Merges {
    symbols: HashMap<String, u32>,
    ranks: HashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    /// Adds the merge `left right` with `rank`, unless the pair is already
    /// there (llama.cpp keeps the first rank of a repeated pair).
    pub(crate) fn insert(&mut self, left: &str, right: &str, rank: u32) {
        let l = self.intern(left);
        let r = self.intern(right);
        if self.ranks.contains_key(&(l, r)) {
            return;
        }
        let merged = self.intern(&format!("{left}{right}"));
        self.ranks.insert((l, r), (rank, merged));
    }

    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.symbols.get(s) {
            return id;
        }
        // At most three strings per merge, and merges are an array that fits in memory.
        let id = u32::try_from(self.symbols.len()).unwrap_or(NO_SYMBOL - 1);
        self.symbols.insert(s.to_owned(), id);
        id
    }

    /// Runs the merges over `word` (already byte-encoded) and returns the
    /// byte ranges of the final symbols, in order.
    pub(crate) fn apply(&self, word: &str) -> Vec<(usize, usize)> {
        struct Symbol {
            start: usize,
            len: usize,
            id: u32,
            prev: Option<usize>,
            next: Option<usize>,
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        for (i, (start, c)) in word.char_indices().enumerate() {
            let len = c.len_utf8();
            let text = &word[start..start + len];
            symbols.push(Symbol {
                start,
                len,
                id: self.symbols.get(text).copied().unwrap_or(NO_SYMBOL),
                prev: i.checked_sub(1),
                next: (start + len < word.len()).then_some(i + 1),
            });
        }
        // Min-heap on (rank, left index): the lowest rank first, leftmost on ties.
        let mut queue: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
        let bigram = |symbols: &[Symbol], left: usize, right: usize| {
            let (l, r) = (&symbols[left], &symbols[right]);
            self.ranks
                .get(&(l.id, r.id))
                .map(|&(rank, _)| Reverse((rank, left, right, l.len + r.len)))
        };
        for i in 1..symbols.len() {
            queue.extend(bigram(&symbols, i - 1, i));
        }
        while let Some(Reverse((_, left, right, len))) = queue.pop() {
            let (l, r) = (&symbols[left], &symbols[right]);
            // Symbols only grow, so a changed pair has a different length.
            if l.len == 0 || r.len == 0 || l.len + r.len != len {
                continue;
            }
            let merged = self
                .ranks
                .get(&(l.id, r.id))
                .map_or(NO_SYMBOL, |&(_, merged)| merged);
            let next = r.next;
            symbols[left].len = len;
            symbols[left].id = merged;
            symbols[left].next = next;
            symbols[right].len = 0;
            if let Some(n) = next {
                symbols[n].prev = Some(left);
            }
            if let Some(p) = symbols[left].prev {
                queue.extend(bigram(&symbols, p, left));
            }
            if let Some(n) = next {
                queue.extend(bigram(&symbols, left, n));
            }
        }
        symbols
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| (s.start, s.start + s.len))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_round_trips() {
        assert_eq!(BYTE_TO_CHAR[usize::from(b' ')], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[usize::from(b'\n')], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[usize::from(b'a')], 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[usize::from(b)]), Some(b));
        }
        assert_eq!(char_to_byte('中'), None);
    }

    #[test]
    fn merges_follow_rank_not_position() {
        let mut m = Merges::default();
        m.insert("b", "c", 0);
        m.insert("a", "b", 1);
        m.insert("a", "bc", 2);
        assert_eq!(m.apply("abc"), [(0, 3)]);
        assert_eq!(m.apply("abd"), [(0, 2), (2, 3)]);
    }
}
