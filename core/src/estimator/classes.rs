//! Character classes and the one-pass feature count behind the estimator.

/// Number of features the estimator counts.
pub(crate) const FEATURE_COUNT: usize = 24;

/// What a character is, for token-cost purposes (by code point range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Class {
    Lower,
    Upper,
    Digit,
    Space,
    Newline,
    Punct,
    Ctrl,
    Symbol,
    Latin,
    Greek,
    Cyrillic,
    Semitic,
    Brahmic,
    Hangul,
    Han,
    CjkPunct,
    Kana,
    Astral,
}

const CLASS_COUNT: usize = Class::Astral as usize + 1;

/// A range end in [`NON_ASCII_ENDS`]'s unit.
const fn end(cp: u32) -> u16 {
    (cp >> 4) as u16
}

/// The classes of the code points from U+0080 up, as consecutive ranges: the end of each
/// (exclusive, divided by 16: every bound is a multiple of 16), its class in
/// [`NON_ASCII_CLASSES`]; past the last, [`Class::Astral`]. A table scan, not a `match` on
/// the ranges: about 200 B less code.
const NON_ASCII_ENDS: [u16; 32] = [
    end(0x00C0),
    end(0x0370),
    end(0x0400),
    end(0x0590),
    end(0x0900),
    end(0x1100),
    end(0x1200),
    end(0x1E00),
    end(0x1F00),
    end(0x2000),
    end(0x2E80),
    end(0x3000),
    end(0x3040),
    end(0x3130),
    end(0x3190),
    end(0x3200),
    end(0x3400),
    end(0xA000),
    end(0xAC00),
    end(0xD800),
    end(0xE000),
    end(0xF900),
    end(0xFB00),
    end(0xFE00),
    end(0xFE30),
    end(0xFE50),
    end(0xFE70),
    end(0xFF00),
    end(0xFFF0),
    end(0x1_0000),
    end(0x2_0000),
    end(0x4_0000),
];

/// The class of each range of [`NON_ASCII_ENDS`].
const NON_ASCII_CLASSES: [Class; 32] = [
    Class::Symbol,
    Class::Latin,
    Class::Greek,
    Class::Cyrillic,
    Class::Semitic,
    Class::Brahmic,
    Class::Hangul,
    Class::Brahmic,
    Class::Latin,
    Class::Greek,
    Class::Symbol,
    Class::Han,
    Class::CjkPunct,
    Class::Kana,
    Class::Hangul,
    Class::Kana,
    Class::Symbol,
    Class::Han,
    Class::Brahmic,
    Class::Hangul,
    Class::Astral,
    Class::Symbol,
    Class::Han,
    Class::Semitic,
    Class::Symbol,
    Class::CjkPunct,
    Class::Symbol,
    Class::Semitic,
    Class::CjkPunct,
    Class::Symbol,
    Class::Astral,
    Class::Han,
];

impl Class {
    pub(crate) const fn of(c: char) -> Class {
        match c {
            'a'..='z' => Class::Lower,
            'A'..='Z' => Class::Upper,
            '0'..='9' => Class::Digit,
            ' ' | '\t' => Class::Space,
            '\n' | '\r' => Class::Newline,
            '!'..='~' => Class::Punct,
            '\0'..='\x7f' => Class::Ctrl,
            _ => Class::of_non_ascii(c as u32),
        }
    }

    // `i < NON_ASCII_ENDS.len()`, both tables' length: the bounds checks fold away.
    #[allow(clippy::indexing_slicing)]
    const fn of_non_ascii(cp: u32) -> Class {
        let mut i = 0;
        while i < NON_ASCII_ENDS.len() {
            if cp < (NON_ASCII_ENDS[i] as u32) << 4 {
                return NON_ASCII_CLASSES[i];
            }
            i += 1;
        }
        Class::Astral
    }

    const fn is_letter(self) -> bool {
        matches!(
            self,
            Class::Lower
                | Class::Upper
                | Class::Latin
                | Class::Greek
                | Class::Cyrillic
                | Class::Semitic
                | Class::Brahmic
                | Class::Han
                | Class::Kana
                | Class::Hangul
        )
    }

    const fn is_non_ascii_letter(self) -> bool {
        self.is_letter() && !matches!(self, Class::Lower | Class::Upper)
    }

    const fn is_punct_like(self) -> bool {
        matches!(self, Class::Punct | Class::Symbol | Class::CjkPunct)
    }

    const fn is_whitespace(self) -> bool {
        matches!(self, Class::Space | Class::Newline)
    }
}

/// The 24 feature counts of one text, in the order of [`super::Weights`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Features {
    values: [u32; FEATURE_COUNT],
}

/// Run state carried from one char to the next.
struct Scan {
    per_class: [u32; CLASS_COUNT],
    letter_runs: u32,
    long_run_excess: u32,
    camel_humps: u32,
    digit_groups: u32,
    punct_runs: u32,
    line_break_runs: u32,
    wide_space_runs: u32,
    u_escapes: u32,
    non_ascii_letter_runs: u32,
    prev: Class,
    prev_char: char,
    run_ascii_letters: u32,
    digits_in_group: u8,
    run_has_newline: bool,
    trailing_spaces: u32,
}

impl Features {
    /// Counts the features of `text` in one pass over its chars.
    ///
    /// `None` when `text` is longer than `u32::MAX` bytes; otherwise no count can overflow,
    /// since each is at most the number of chars.
    pub(crate) fn of(text: &str) -> Option<Features> {
        u32::try_from(text.len()).ok()?;
        let mut scan = Scan::new();
        for c in text.chars() {
            scan.push(c);
        }
        Some(scan.finish())
    }

    pub(crate) const fn values(&self) -> &[u32; FEATURE_COUNT] {
        &self.values
    }

    #[cfg(test)]
    pub(crate) const fn from_values(values: [u32; FEATURE_COUNT]) -> Features {
        Features { values }
    }
}

impl Scan {
    const fn new() -> Scan {
        Scan {
            per_class: [0; CLASS_COUNT],
            letter_runs: 0,
            long_run_excess: 0,
            camel_humps: 0,
            digit_groups: 0,
            punct_runs: 0,
            line_break_runs: 0,
            wide_space_runs: 0,
            u_escapes: 0,
            non_ascii_letter_runs: 0,
            // Ctrl belongs to no run, so the first char always starts one.
            prev: Class::Ctrl,
            prev_char: '\0',
            run_ascii_letters: 0,
            digits_in_group: 0,
            run_has_newline: false,
            trailing_spaces: 0,
        }
    }

    fn push(&mut self, c: char) {
        let class = Class::of(c);
        let prev = self.prev;
        if let Some(n) = self.per_class.get_mut(class as usize) {
            *n += 1;
        }
        if prev.is_whitespace() && !class.is_whitespace() {
            self.end_whitespace_run();
        }
        match class {
            Class::Lower | Class::Upper => {
                if !prev.is_letter() {
                    self.letter_runs += 1;
                    self.run_ascii_letters = 0;
                }
                self.run_ascii_letters += 1;
                if self.run_ascii_letters > 6 {
                    self.long_run_excess += 1;
                }
                if class == Class::Upper && prev == Class::Lower {
                    self.camel_humps += 1;
                }
                if c == 'u' && self.prev_char == '\\' {
                    self.u_escapes += 1;
                }
            }
            Class::Digit => {
                if prev != Class::Digit || self.digits_in_group == 3 {
                    self.digit_groups += 1;
                    self.digits_in_group = 0;
                }
                self.digits_in_group += 1;
            }
            Class::Space | Class::Newline => {
                if !prev.is_whitespace() {
                    self.run_has_newline = false;
                    self.trailing_spaces = 0;
                }
                if class == Class::Newline {
                    self.run_has_newline = true;
                    self.trailing_spaces = 0;
                } else {
                    self.trailing_spaces += 1;
                }
            }
            Class::Punct | Class::Symbol | Class::CjkPunct => {
                if !prev.is_punct_like() {
                    self.punct_runs += 1;
                }
            }
            Class::Ctrl | Class::Astral => {}
            Class::Latin
            | Class::Greek
            | Class::Cyrillic
            | Class::Semitic
            | Class::Brahmic
            | Class::Hangul
            | Class::Han
            | Class::Kana => {
                if !prev.is_letter() {
                    self.letter_runs += 1;
                    self.run_ascii_letters = 0;
                }
                if !prev.is_non_ascii_letter() {
                    self.non_ascii_letter_runs += 1;
                }
            }
        }
        self.prev = class;
        self.prev_char = c;
    }

    fn end_whitespace_run(&mut self) {
        self.line_break_runs += u32::from(self.run_has_newline);
        self.wide_space_runs += u32::from(self.trailing_spaces >= 2);
    }

    fn finish(mut self) -> Features {
        if self.prev.is_whitespace() {
            self.end_whitespace_run();
        }
        let n = |class: Class| self.per_class.get(class as usize).copied().unwrap_or(0);
        Features {
            values: [
                self.letter_runs,
                n(Class::Lower) + n(Class::Upper),
                self.long_run_excess,
                self.camel_humps,
                self.digit_groups,
                n(Class::Digit),
                self.punct_runs,
                n(Class::Punct),
                self.line_break_runs,
                self.wide_space_runs,
                self.u_escapes,
                n(Class::Latin),
                n(Class::Greek) + n(Class::Cyrillic),
                n(Class::Greek),
                n(Class::Semitic),
                n(Class::Brahmic),
                n(Class::Han),
                n(Class::Kana),
                n(Class::Hangul),
                n(Class::Symbol),
                n(Class::CjkPunct),
                n(Class::Astral),
                n(Class::Ctrl),
                self.non_ascii_letter_runs,
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feature vector of `text` as (index, count) pairs for the non-zero entries.
    fn nonzero(text: &str) -> Vec<(usize, u32)> {
        let features = Features::of(text).unwrap();
        features.values().iter().copied().enumerate().filter(|&(_, v)| v != 0).collect()
    }

    #[test]
    fn empty_text_has_no_features() {
        assert_eq!(nonzero(""), vec![]);
    }

    #[test]
    fn words_count_runs_letters_and_long_run_excess() {
        // 2 letter runs, 14 ASCII letters, "estimator" is 3 over 6, one space (not wide).
        assert_eq!(nonzero("token estimator"), vec![(0, 2), (1, 14), (2, 3)]);
    }

    #[test]
    fn camel_case_counts_lower_to_upper_inside_runs() {
        assert_eq!(nonzero("camelCaseX")[3], (3, 2));
        // Upper→lower and upper→upper are not humps; a digit ends the run.
        assert_eq!(nonzero("HTTPServer"), vec![(0, 1), (1, 10), (2, 4)]);
        assert_eq!(nonzero("aB1cD"), vec![(0, 2), (1, 4), (3, 2), (4, 1), (5, 1)]);
    }

    #[test]
    fn digit_runs_cost_one_group_per_three_digits() {
        assert_eq!(nonzero("1234567"), vec![(4, 3), (5, 7)]);
        assert_eq!(nonzero("123"), vec![(4, 1), (5, 3)]);
        // Punctuation splits runs: 1 + 1 + 1 groups, two punctuation runs of one comma.
        assert_eq!(nonzero("1,000,000"), vec![(4, 3), (5, 7), (6, 2), (7, 2)]);
    }

    #[test]
    fn backslash_u_is_an_escape() {
        // `\u00e9`: `\` punct run, `u` letter run, `00e9` splits into digits and a letter.
        let f = Features::of(r"\u00e9").unwrap();
        assert_eq!(f.values()[10], 1);
        // Any `u` after a backslash counts, also in `\\u`; `\n` and `u\` do not.
        assert_eq!(Features::of(r"\\u \n u\").unwrap().values()[10], 1);
    }

    #[test]
    fn whitespace_runs_with_line_breaks_and_indentation() {
        // One run with a newline; trailing horizontal part 0.
        assert_eq!(nonzero("a\n\nb")[2], (8, 1));
        // Newline then four spaces of indentation: both features.
        assert_eq!(&nonzero("a\n    b")[2..], &[(8, 1), (9, 1)]);
        // Two spaces inside a line: wide, no line break.
        assert_eq!(nonzero("a  b")[2], (9, 1));
        // One space after the newline is not wide; CRLF is one run; a run at the end counts.
        assert_eq!(nonzero("a \n b\r\n")[2], (8, 2));
        assert_eq!(nonzero("\t\t"), vec![(9, 1)]);
    }

    #[test]
    fn cjk_text_counts_per_script_and_one_non_ascii_run() {
        // 漢字 Han, です Kana, 。 CJK punctuation: one letter run, one punctuation run.
        assert_eq!(nonzero("漢字です。"), vec![(0, 1), (6, 1), (16, 2), (17, 2), (20, 1), (23, 1)]);
        assert_eq!(nonzero("한국어"), vec![(0, 1), (18, 3), (23, 1)]);
        assert_eq!(nonzero("𠀀"), vec![(0, 1), (16, 1), (23, 1)]);
    }

    #[test]
    fn european_scripts_and_mixed_runs() {
        // "straße": one letter run of 5 ASCII letters plus one Latin letter in its own
        // non-ASCII run.
        assert_eq!(nonzero("straße"), vec![(0, 1), (1, 5), (11, 1), (23, 1)]);
        assert_eq!(nonzero("αβγ"), vec![(0, 1), (12, 3), (13, 3), (23, 1)]);
        assert_eq!(nonzero("мир"), vec![(0, 1), (12, 3), (23, 1)]);
        assert_eq!(nonzero("שלום"), vec![(0, 1), (14, 4), (23, 1)]);
        assert_eq!(nonzero("हिंदी"), vec![(0, 1), (15, 5), (23, 1)]);
    }

    #[test]
    fn symbols_emoji_and_control_chars() {
        // © and € are symbols and join one punctuation-like run with `!`.
        assert_eq!(nonzero("©€!"), vec![(6, 1), (7, 1), (19, 2)]);
        assert_eq!(nonzero("🦀"), vec![(21, 1)]);
        assert_eq!(nonzero("\u{7}\u{7f}"), vec![(22, 2)]);
    }

    #[test]
    fn class_table_boundaries() {
        let cases = [
            ('\u{80}', Class::Symbol),
            ('\u{bf}', Class::Symbol),
            ('\u{c0}', Class::Latin),
            ('\u{370}', Class::Greek),
            ('\u{58f}', Class::Cyrillic),
            ('\u{590}', Class::Semitic),
            ('\u{900}', Class::Brahmic),
            ('\u{1100}', Class::Hangul),
            ('\u{1200}', Class::Brahmic),
            ('\u{1e00}', Class::Latin),
            ('\u{1f00}', Class::Greek),
            ('\u{2000}', Class::Symbol),
            ('\u{2e80}', Class::Han),
            ('\u{3000}', Class::CjkPunct),
            ('\u{3040}', Class::Kana),
            ('\u{3130}', Class::Hangul),
            ('\u{3190}', Class::Kana),
            ('\u{3200}', Class::Symbol),
            ('\u{3400}', Class::Han),
            ('\u{a000}', Class::Brahmic),
            ('\u{ac00}', Class::Hangul),
            ('\u{e000}', Class::Symbol),
            ('\u{f900}', Class::Han),
            ('\u{fb00}', Class::Semitic),
            ('\u{fe00}', Class::Symbol),
            ('\u{fe30}', Class::CjkPunct),
            ('\u{fe50}', Class::Symbol),
            ('\u{fe70}', Class::Semitic),
            ('\u{ff00}', Class::CjkPunct),
            ('\u{fff0}', Class::Symbol),
            ('\u{1ffff}', Class::Astral),
            ('\u{20000}', Class::Han),
            ('\u{3ffff}', Class::Han),
            ('\u{40000}', Class::Astral),
            ('\u{10ffff}', Class::Astral),
        ];
        for (c, class) in cases {
            assert_eq!(Class::of(c), class, "U+{:04X}", c as u32);
        }
    }

    /// The table gives every code point the class the range `match` it replaced gave.
    #[test]
    fn non_ascii_table_matches_the_ranges() {
        fn reference(cp: u32) -> Class {
            match cp {
                0x0080..=0x00BF => Class::Symbol,
                0x00C0..=0x036F => Class::Latin,
                0x0370..=0x03FF => Class::Greek,
                0x0400..=0x058F => Class::Cyrillic,
                0x0590..=0x08FF => Class::Semitic,
                0x0900..=0x10FF => Class::Brahmic,
                0x1100..=0x11FF => Class::Hangul,
                0x1200..=0x1DFF => Class::Brahmic,
                0x1E00..=0x1EFF => Class::Latin,
                0x1F00..=0x1FFF => Class::Greek,
                0x2000..=0x2E7F => Class::Symbol,
                0x2E80..=0x2FFF => Class::Han,
                0x3000..=0x303F => Class::CjkPunct,
                0x3040..=0x312F => Class::Kana,
                0x3130..=0x318F => Class::Hangul,
                0x3190..=0x31FF => Class::Kana,
                0x3200..=0x33FF => Class::Symbol,
                0x3400..=0x9FFF => Class::Han,
                0xA000..=0xABFF => Class::Brahmic,
                0xAC00..=0xD7FF => Class::Hangul,
                0xE000..=0xF8FF => Class::Symbol,
                0xF900..=0xFAFF => Class::Han,
                0xFB00..=0xFDFF => Class::Semitic,
                0xFE00..=0xFE2F => Class::Symbol,
                0xFE30..=0xFE4F => Class::CjkPunct,
                0xFE50..=0xFE6F => Class::Symbol,
                0xFE70..=0xFEFF => Class::Semitic,
                0xFF00..=0xFFEF => Class::CjkPunct,
                0xFFF0..=0xFFFF => Class::Symbol,
                0x2_0000..=0x3_FFFF => Class::Han,
                _ => Class::Astral,
            }
        }
        for cp in 0x80..=0x10_FFFFu32 {
            assert_eq!(Class::of_non_ascii(cp), reference(cp), "U+{cp:04X}");
        }
    }
}
