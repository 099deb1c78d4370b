//! Pre-tokenizers: how text is cut into words before BPE merges them.
//!
//! llama.cpp applies a list of regexes per `tokenizer.ggml.pre`, each one
//! refining the pieces the previous one left (matches *and* the gaps between
//! them become pieces). The big GPT-2 / Llama 3 / Qwen2 expressions run as
//! hand-written scanners in llama.cpp (`unicode_regex_split_custom_*`); the
//! others run through `std::regex` (ECMAScript, leftmost match, greedy). Both
//! kinds are written out here as scanners over code points, so that no regex
//! engine is needed: each [`Step`] documents the expression it stands for.

use super::unicode::{Flags, ascii_lower};

/// A piece of the text: code point indices `start..end`.
pub(crate) type Span = (usize, usize);

/// One regex of a pre-tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// Llama 3's expression with `\p{N}` instead of `\p{N}{1,3}`.
    Qwen2,
    /// Qwen2's expression where letter runs take combining marks too:
    /// `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+` and ` ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*`.
    Qwen35,
    /// `[^\n]+|[\n]+`: runs of newlines and runs of everything else.
    Newlines,
    /// `\p{N}`: every digit on its own.
    Digit,
    /// `\p{N}+`
    Digits,
    /// `[0-9][0-9][0-9]`
    AsciiDigits3,
    /// `[\p{P}\$\+<=>\^~\|]+`
    PunctuationRun,
    /// `[\r\n]`
    Newline,
    /// `\s?[A-Za-zµÀ-ÖØ-öø-ƺ…]+` (DeepSeek LLM's cased-letter class)
    DeepseekLetters,
    /// `\s?[!-/:-~！-／：-～‘-‟　-。]+`
    DeepseekPunctuation,
    /// `\s+$`
    TrailingSpace,
    /// `[一-龥ࠀ-一가-퟿]+`
    DeepseekCjk,
}

/// Splits `cpts` (with their `flags`) by `steps`, in order.
pub(crate) fn split(cpts: &[u32], flags: &[Flags], steps: &[Step]) -> Vec<Span> {
    let mut spans = if cpts.is_empty() {
        Vec::new()
    } else {
        vec![(0, cpts.len())]
    };
    let text = Text { cpts, flags };
    for &step in steps {
        let mut out = Vec::with_capacity(spans.len() * 2);
        for &span in &spans {
            match step {
                Step::Gpt2 => text.gpt2(span, &mut out),
                Step::Llama3 => text.llama3(span, Some(3), false, &mut out),
                Step::Qwen2 => text.llama3(span, Some(1), false, &mut out),
                Step::Qwen35 => text.llama3(span, Some(1), true, &mut out),
                Step::Newlines => text.newlines(span, &mut out),
                _ => text.regex(step, span, &mut out),
            }
        }
        spans = out;
    }
    spans
}

const CR: u32 = '\r' as u32;
const LF: u32 = '\n' as u32;
const SPACE: u32 = ' ' as u32;
const APOSTROPHE: u32 = '\'' as u32;

struct Text<'a> {
    cpts: &'a [u32],
    flags: &'a [Flags],
}

/// The scanner state of one span: llama.cpp's `_get_cpt`, `_get_flags` and
/// `_add_token`, where positions outside the span read as nothing.
struct Cursor<'a, 'o> {
    text: &'a Text<'a>,
    start: usize,
    end: usize,
    prev_end: usize,
    out: &'o mut Vec<Span>,
}

impl Cursor<'_, '_> {
    fn cpt(&self, pos: usize) -> Option<u32> {
        (self.start..self.end)
            .contains(&pos)
            .then(|| self.text.cpts[pos])
    }

    fn flags(&self, pos: usize) -> Flags {
        if (self.start..self.end).contains(&pos) {
            self.text.flags[pos]
        } else {
            Flags::NONE
        }
    }

    /// Ends the current word at `end` (nothing if empty).
    fn add(&mut self, end: usize) {
        if end > self.prev_end {
            self.out.push((self.prev_end, end));
        }
        self.prev_end = end;
    }

    /// The length of a contraction (`'s`, `'RE`, …) at `pos`, if one starts there.
    fn contraction(&self, pos: usize, fold_case: bool) -> Option<usize> {
        if self.cpt(pos) != Some(APOSTROPHE) || pos + 1 >= self.end {
            return None;
        }
        let fold = |c: Option<u32>| {
            c.map(|c| if fold_case { ascii_lower(c) } else { c })
                .and_then(char::from_u32)
        };
        let next = fold(self.cpt(pos + 1));
        if matches!(next, Some('s' | 't' | 'm' | 'd')) {
            return Some(2);
        }
        if pos + 2 < self.end {
            let pair = (next, fold(self.cpt(pos + 2)));
            if matches!(
                pair,
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
            ) {
                return Some(3);
            }
        }
        None
    }

    /// Number of whitespace code points from `pos`, and the end of the last
    /// `\r`/`\n` among them (0 if none).
    fn whitespace_run(&self, pos: usize) -> (usize, usize) {
        let mut n = 0;
        let mut last_newline_end = 0;
        while self.flags(pos + n).is_whitespace() {
            if matches!(self.cpt(pos + n), Some(CR | LF)) {
                last_newline_end = pos + n + 1;
            }
            n += 1;
        }
        (n, last_newline_end)
    }
}

fn other(f: Flags) -> bool {
    !(f.is_whitespace() || f.is_letter() || f.is_number())
}

impl Text<'_> {
    fn cursor<'o>(&self, (start, end): Span, out: &'o mut Vec<Span>) -> Cursor<'_, 'o> {
        Cursor {
            text: self,
            start,
            end,
            prev_end: start,
            out,
        }
    }

    fn gpt2(&self, span: Span, out: &mut Vec<Span>) {
        let mut c = self.cursor(span, out);
        let mut pos = c.start;
        while pos < c.end {
            let cpt = c.cpt(pos);
            if let Some(n) = c.contraction(pos, false) {
                pos += n;
                c.add(pos);
                continue;
            }
            let space = cpt == Some(SPACE);
            let mut f2 = if space {
                c.flags(pos + 1)
            } else {
                c.flags(pos)
            };
            // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
            let class: Option<fn(Flags) -> bool> = if f2.is_letter() {
                Some(Flags::is_letter)
            } else if f2.is_number() {
                Some(Flags::is_number)
            } else if other(f2) && f2.is_some() {
                Some(|f| other(f) && f.is_some())
            } else {
                None
            };
            if let Some(class) = class {
                pos += usize::from(space);
                while class(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                c.add(pos);
                continue;
            }
            let (n, _) = c.whitespace_run(pos);
            if n > 1 && c.cpt(pos + n).is_some() {
                // `\s+(?!\S)`: leave the last space to the next word
                pos += n - 1;
            } else if n > 0 {
                pos += n;
            } else {
                pos += 1;
            }
            c.add(pos);
        }
    }

    /// Llama 3 (`digits` = 3), Qwen2 (`digits` = 1) and Qwen3.5 (Qwen2 with
    /// `marks`: combining marks join letter runs and leave the "other" class).
    fn llama3(&self, span: Span, digits: Option<usize>, marks: bool, out: &mut Vec<Span>) {
        let max_digits = digits.unwrap_or(usize::MAX);
        let word = |f: Flags| f.is_letter() || (marks && f.is_accent_mark());
        let other = |f: Flags| other(f) && !(marks && f.is_accent_mark());
        let mut c = self.cursor(span, out);
        let mut pos = c.start;
        while pos < c.end {
            let cpt = c.cpt(pos);
            let f = c.flags(pos);
            if let Some(n) = c.contraction(pos, true) {
                pos += n;
                c.add(pos);
                continue;
            }
            // `[^\r\n\p{L}\p{N}]?\p{L}+` (`[\p{L}\p{M}]+` with marks)
            if !(matches!(cpt, Some(CR | LF)) || f.is_number())
                && (word(f) || word(c.flags(pos + 1)))
            {
                pos += 1;
                while word(c.flags(pos)) {
                    pos += 1;
                }
                c.add(pos);
                continue;
            }
            // `\p{N}{1,3}` / `\p{N}`
            if f.is_number() {
                let mut ini = pos;
                while c.flags(pos).is_number() {
                    pos += 1;
                    if pos - ini >= max_digits {
                        c.add(pos);
                        ini = pos;
                    }
                }
                c.add(pos);
                continue;
            }
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*` (llama.cpp tests the flags of `pos`
            // itself for "is a code point", not those after the space)
            let space = cpt == Some(SPACE);
            let mut f2 = if space { c.flags(pos + 1) } else { f };
            if other(f2) && f.is_some() {
                pos += usize::from(space);
                while other(f2) && f2.is_some() {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                while matches!(c.cpt(pos), Some(CR | LF)) {
                    pos += 1;
                }
                c.add(pos);
                continue;
            }
            let (n, last_newline_end) = c.whitespace_run(pos);
            if last_newline_end > 0 {
                // `\s*[\r\n]+`
                pos = last_newline_end;
            } else if n > 1 && c.cpt(pos + n).is_some() {
                pos += n - 1;
            } else if n > 0 {
                pos += n;
            } else {
                pos += 1;
            }
            c.add(pos);
        }
    }

    /// `[^\n]+|[\n]+` (llama.cpp's `unicode_regex_split_custom_newlines`).
    fn newlines(&self, (start, end): Span, out: &mut Vec<Span>) {
        let mut pos = start;
        while pos < end {
            let newline = self.cpts[pos] == LF;
            let run = pos;
            while pos < end && (self.cpts[pos] == LF) == newline {
                pos += 1;
            }
            out.push((run, pos));
        }
    }

    /// A `std::regex` step: every leftmost match and every gap between
    /// matches becomes a piece.
    fn regex(&self, step: Step, (start, end): Span, out: &mut Vec<Span>) {
        let mut from = start;
        while let Some((s, e)) = self.find(step, from, end) {
            if s > from {
                out.push((from, s));
            }
            out.push((s, e));
            from = e;
        }
        if from < end {
            out.push((from, end));
        }
    }

    /// The leftmost match of `step` in `from..end`.
    fn find(&self, step: Step, from: usize, end: usize) -> Option<Span> {
        let run = |mut p: usize, class: &dyn Fn(usize) -> bool| {
            while p < end && class(p) {
                p += 1;
            }
            p
        };
        let first = |class: &dyn Fn(usize) -> bool| (from..end).find(|&p| class(p));
        match step {
            Step::Digit => first(&|p| self.flags[p].is_number()).map(|p| (p, p + 1)),
            Step::Digits => {
                let class = |p: usize| self.flags[p].is_number();
                first(&class).map(|p| (p, run(p, &class)))
            }
            Step::PunctuationRun => {
                let class = |p: usize| self.collapsed_punctuation(p);
                first(&class).map(|p| (p, run(p, &class)))
            }
            Step::AsciiDigits3 => {
                let digit = |p: usize| {
                    p < end && char::from_u32(self.cpts[p]).is_some_and(|c| c.is_ascii_digit())
                };
                (from..end)
                    .find(|&p| digit(p) && digit(p + 1) && digit(p + 2))
                    .map(|p| (p, p + 3))
            }
            Step::Newline => first(&|p| matches!(self.cpts[p], CR | LF)).map(|p| (p, p + 1)),
            Step::DeepseekLetters | Step::DeepseekPunctuation => {
                let ranges = if step == Step::DeepseekLetters {
                    DEEPSEEK_LETTERS
                } else {
                    DEEPSEEK_PUNCTUATION
                };
                let class = |p: usize| self.wide_in(p, ranges);
                // `\s?` is greedy: a space counts if a class member follows it.
                let mut p = from;
                while p < end {
                    if self.flags[p].is_whitespace() && p + 1 < end && class(p + 1) {
                        return Some((p, run(p + 1, &class)));
                    }
                    if class(p) {
                        return Some((p, run(p, &class)));
                    }
                    p += 1;
                }
                None
            }
            Step::DeepseekCjk => {
                let class = |p: usize| self.wide_in(p, DEEPSEEK_CJK);
                first(&class).map(|p| (p, run(p, &class)))
            }
            Step::TrailingSpace => {
                let mut s = end;
                while s > from && self.flags[s - 1].is_whitespace() {
                    s -= 1;
                }
                (s < end).then_some((s, end))
            }
            Step::Gpt2 | Step::Llama3 | Step::Qwen2 | Step::Qwen35 | Step::Newlines => None,
        }
    }

    /// `[\p{P}\$\+<=>\^~\|]` on llama.cpp's "collapsed" text: ASCII stays
    /// itself and meets the ASCII list, other code points meet `\p{P}` by
    /// category (whitespace collapses to a space first).
    fn collapsed_punctuation(&self, p: usize) -> bool {
        let cpt = self.cpts[p];
        match char::from_u32(cpt) {
            Some(c) if c.is_ascii() => {
                matches!(c, '!'..='#' | '%'..='*' | ','..='/' | ':' | ';' | '?' | '@' | '['..=']' | '_' | '{' | '}')
                    || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
            }
            _ => !self.flags[p].is_whitespace() && self.flags[p].is_punctuation(),
        }
    }

    /// Class membership as `std::wregex` sees the text: non-ASCII whitespace
    /// was replaced by U+000B, which is in none of these classes.
    fn wide_in(&self, p: usize, ranges: &[(u32, u32)]) -> bool {
        let cpt = self.cpts[p];
        if cpt > 0x7F && self.flags[p].is_whitespace() {
            return false;
        }
        ranges.iter().any(|&(a, b)| (a..=b).contains(&cpt))
    }
}

/// The character class of DeepSeek LLM's letter expression, as ranges.
#[rustfmt::skip]
const DEEPSEEK_LETTERS: &[(u32, u32)] = &[
    (0x0041, 0x005A), (0x0061, 0x007A), (0x00B5, 0x00B5), (0x00C0, 0x00D6), (0x00D8, 0x00F6),
    (0x00F8, 0x01BA), (0x01BC, 0x01BF), (0x01C4, 0x0293), (0x0295, 0x02AF), (0x0370, 0x0373),
    (0x0376, 0x0377), (0x037B, 0x037D), (0x037F, 0x037F), (0x0386, 0x0386), (0x0388, 0x038A),
    (0x038C, 0x038C), (0x038E, 0x03A1), (0x03A3, 0x03F5), (0x03F7, 0x0481), (0x048A, 0x052F),
    (0x0531, 0x0556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D), (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107),
    (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F),
    (0x2145, 0x2149), (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F),
    (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
];

/// `[!-/:-~！-／：-～‘-‟　-。]`
const DEEPSEEK_PUNCTUATION: &[(u32, u32)] = &[
    (0x0021, 0x002F),
    (0x003A, 0x007E),
    (0xFF01, 0xFF0F),
    (0xFF1A, 0xFF5E),
    (0x2018, 0x201F),
    (0x3000, 0x3002),
];

/// `[一-龥ࠀ-一가-퟿]`
const DEEPSEEK_CJK: &[(u32, u32)] = &[(0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF)];

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str, steps: &[Step]) -> Vec<String> {
        let cpts: Vec<u32> = text.chars().map(u32::from).collect();
        let flags: Vec<Flags> = cpts.iter().map(|&c| Flags::of(c)).collect();
        split(&cpts, &flags, steps)
            .into_iter()
            .map(|(s, e)| text.chars().skip(s).take(e - s).collect())
            .collect()
    }

    #[test]
    fn gpt2_keeps_one_space_for_the_next_word() {
        assert_eq!(
            words("Hello  world's 123!!\n", &[Step::Gpt2]),
            ["Hello", " ", " world", "'s", " 123", "!!", "\n"]
        );
    }

    #[test]
    fn llama3_splits_digits_by_three_and_folds_contractions() {
        assert_eq!(
            words("I'M 1234567 ok\n\n x", &[Step::Llama3]),
            ["I", "'M", " ", "123", "456", "7", " ok", "\n\n", " x"]
        );
    }

    #[test]
    fn qwen35_keeps_combining_marks_in_words() {
        // U+0301 after a space: Qwen2 leaves it to the "other" class with the space.
        assert_eq!(words("x \u{301}e", &[Step::Qwen2]), ["x", " \u{301}", "e"]);
        assert_eq!(words("x \u{301}e", &[Step::Qwen35]), ["x", " \u{301}e"]);
        assert_eq!(
            words("ca\u{301}fe 12", &[Step::Qwen35]),
            ["ca\u{301}fe", " ", "1", "2"]
        );
    }

    #[test]
    fn newlines_split_into_runs() {
        assert_eq!(
            words("a b\n\n c\n", &[Step::Newlines]),
            ["a b", "\n\n", " c", "\n"]
        );
    }

    #[test]
    fn regex_steps_keep_gaps() {
        assert_eq!(words("a12b3", &[Step::Digit]), ["a", "1", "2", "b", "3"]);
        assert_eq!(words("12345", &[Step::AsciiDigits3]), ["123", "45"]);
        assert_eq!(words("x  ", &[Step::TrailingSpace]), ["x", "  "]);
    }
}
