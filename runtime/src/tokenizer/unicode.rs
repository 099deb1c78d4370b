//! Code point classes as llama.cpp's `unicode_cpt_flags` sees them: one
//! general category (`\p{L}`, `\p{N}`, …) per code point plus White_Space,
//! from llama.cpp's own table (see `unicode_table.rs`), so that pre-tokenizer
//! splits agree with it even where Unicode versions differ.

use super::unicode_table::{CATEGORY_RANGES, WHITESPACE};

/// The classes of one code point; `Flags::NONE` stands for "outside the text",
/// which the splitters use for positions past the end of a fragment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub(crate) const NONE: Flags = Flags(0);
    const UNDEFINED: u16 = 0x01;
    const NUMBER: u16 = 0x02;
    const LETTER: u16 = 0x04;
    const ACCENT_MARK: u16 = 0x10;
    const PUNCTUATION: u16 = 0x20;
    const WHITESPACE: u16 = 0x100;

    /// The flags of `cpt` (`UNDEFINED` above U+10FFFF, like llama.cpp).
    pub(crate) fn of(cpt: u32) -> Flags {
        if let Some(&f) = ASCII.get(cpt as usize) {
            return f;
        }
        lookup(cpt)
    }

    /// `\p{L}`.
    pub(crate) fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }

    /// `\p{N}`.
    pub(crate) fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }

    /// `\p{M}` (combining marks).
    pub(crate) fn is_accent_mark(self) -> bool {
        self.0 & Self::ACCENT_MARK != 0
    }

    /// `\p{P}`.
    pub(crate) fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }

    /// `\s` (Unicode White_Space).
    pub(crate) fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }

    /// Whether this is a real code point (llama.cpp's `as_uint() != 0`): every
    /// code point has a category bit, only [`Flags::NONE`] has none.
    pub(crate) fn is_some(self) -> bool {
        self.0 != 0
    }
}

fn lookup(cpt: u32) -> Flags {
    if cpt >= 0x110000 {
        return Flags(Flags::UNDEFINED);
    }
    // The table starts at 0 and ends with 0x110000, so `i` is at least 1.
    let i = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cpt);
    let category = CATEGORY_RANGES[i - 1].1;
    let space = if WHITESPACE.binary_search(&cpt).is_ok() {
        Flags::WHITESPACE
    } else {
        0
    };
    Flags(u16::from(category) | space)
}

static ASCII: std::sync::LazyLock<[Flags; 128]> = std::sync::LazyLock::new(|| {
    let mut t = [Flags::NONE; 128];
    for (c, slot) in (0u32..).zip(t.iter_mut()) {
        *slot = lookup(c);
    }
    t
});

/// Lower-cases the ASCII letters; the contraction rules compare the result
/// with `s t m d r e v l`, which no other code point lowercases to in
/// llama.cpp's table (checked by `gen_unicode_table.py`).
pub(crate) fn ascii_lower(cpt: u32) -> u32 {
    if (u32::from(b'A')..=u32::from(b'Z')).contains(&cpt) {
        cpt + 32
    } else {
        cpt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_agree_with_the_table() {
        assert!(Flags::of('a' as u32).is_letter());
        assert!(Flags::of('7' as u32).is_number());
        assert!(Flags::of(' ' as u32).is_whitespace());
        assert!(Flags::of('\n' as u32).is_whitespace());
        assert!(Flags::of('中' as u32).is_letter());
        assert!(Flags::of('，' as u32).is_punctuation());
        assert!(Flags::of(0x3000).is_whitespace());
        assert!(!Flags::of(0x0301).is_letter());
        assert!(Flags::of(0x0301).is_accent_mark());
        assert!(Flags::of('½' as u32).is_number());
        assert!(!Flags::of('😀' as u32).is_letter());
        assert!(Flags::of(0x10FFFF).is_some());
        assert!(Flags::of(0x110000).is_some());
        assert!(!Flags::NONE.is_some());
    }
}
