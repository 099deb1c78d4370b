//! SentencePiece (`tokenizer.ggml.model = llama`) as llama.cpp runs it: start
//! from UTF-8 characters, repeatedly join the adjacent pair whose joined text
//! is the vocabulary entry with the highest score, then emit each piece's
//! token or, for a character that is not in the vocabulary, its bytes.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A candidate join; the heap pops the highest score, leftmost on ties.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // llama.cpp: `l.score < r.score || (l.score == r.score && l.left > r.left)`
        // orders below; scores are finite in practice, NaN compares equal.
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Splits `text` (spaces already escaped to `▁`) into pieces: `Ok(id)` for a
/// vocabulary entry, `Err(range)` for bytes that must fall back.
pub(crate) fn segment(
    text: &str,
    token_to_id: &HashMap<String, u32>,
    scores: &[f32],
) -> Vec<Result<u32, (usize, usize)>> {
    struct Symbol {
        start: usize,
        len: usize,
        prev: Option<usize>,
        next: Option<usize>,
    }
    let mut symbols: Vec<Symbol> = text
        .char_indices()
        .enumerate()
        .map(|(i, (start, c))| Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: (start + c.len_utf8() < text.len()).then_some(i + 1),
        })
        .collect();
    let mut queue = BinaryHeap::new();
    let bigram = |symbols: &[Symbol], left: usize, right: usize| {
        let start = symbols[left].start;
        let len = symbols[left].len + symbols[right].len;
        let id = *token_to_id.get(&text[start..start + len])?;
        Some(Bigram {
            score: scores.get(id as usize).copied().unwrap_or(0.0),
            left,
            right,
            len,
        })
    };
    for i in 1..symbols.len() {
        queue.extend(bigram(&symbols, i - 1, i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (&symbols[b.left], &symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
            continue;
        }
        let next = r.next;
        symbols[b.left].len = b.len;
        symbols[b.left].next = next;
        symbols[b.right].len = 0;
        if let Some(n) = next {
            symbols[n].prev = Some(b.left);
        }
        if let Some(p) = symbols[b.left].prev {
            queue.extend(bigram(&symbols, p, b.left));
        }
        if let Some(n) = next {
            queue.extend(bigram(&symbols, b.left, n));
        }
    }
    let mut out = Vec::new();
    let mut i = (!symbols.is_empty()).then_some(0);
    while let Some(k) = i {
        let s = &symbols[k];
        let piece = &text[s.start..s.start + s.len];
        out.push(
            token_to_id
                .get(piece)
                .copied()
                .ok_or((s.start, s.start + s.len)),
        );
        i = s.next;
    }
    out
}
