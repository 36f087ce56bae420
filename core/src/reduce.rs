//! Observation reduction: a huge tool output is kept as its first and last lines around a
//! `[Data Truncated]` marker, written straight into its final arena span (no scratch buffer).

use crate::counter::TokenCounter;

/// Smallest budget a reduced tool output may be squeezed into: head, marker and tail.
pub(crate) const MIN_REDUCED_TOKENS: u32 = 32;

/// Most tokens one tool result may keep: the observation limit, within the `room` its unit
/// has left in its level (its own framing taken out) less `reserve` for each of the unit's
/// `waiting` other results still to come, so that every result of a unit can be stored,
/// reduced if need be, however large the first ones are.
pub(crate) fn result_limit(observation_limit: u32, room: u32, waiting: u32, reserve: u32) -> u32 {
    observation_limit.min(room.saturating_sub(waiting.saturating_mul(reserve)))
}

/// Line that opens the omission marker.
pub const TRUNCATION_MARKER: &str = "[Data Truncated]";

/// A reduced text: `head`, then the marker, then `tail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reduction<'a> {
    pub head: &'a str,
    pub tail: &'a str,
    marker: Marker,
}

/// `[Data Truncated]\n... (N lines omitted) ...\n`, formatted without allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Marker {
    bytes: [u8; 64],
    len: usize,
}

impl Marker {
    fn new(newline_first: bool, omitted_lines: usize) -> Self {
        let mut marker = Marker { bytes: [0; 64], len: 0 };
        if newline_first {
            marker.push(b"\n");
        }
        marker.push(TRUNCATION_MARKER.as_bytes());
        marker.push(b"\n... (");
        let mut digits = [0u8; 20];
        let mut n = omitted_lines;
        let mut at = digits.len();
        loop {
            at -= 1;
            if let Some(slot) = digits.get_mut(at) {
                *slot = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 || at == 0 {
                break;
            }
        }
        marker.push(digits.get(at..).unwrap_or(&[]));
        marker.push(if omitted_lines == 1 {
            b" line omitted) ...\n"
        } else {
            b" lines omitted) ...\n"
        });
        marker
    }

    fn push(&mut self, piece: &[u8]) {
        let end = self.len + piece.len();
        if let Some(target) = self.bytes.get_mut(self.len..end) {
            target.copy_from_slice(piece);
            self.len = end;
        }
    }

    fn as_str(&self) -> &str {
        core::str::from_utf8(self.bytes.get(..self.len).unwrap_or(&[])).unwrap_or_default()
    }
}

impl<'a> Reduction<'a> {
    /// The marker text between head and tail.
    pub fn marker(&self) -> &str {
        self.marker.as_str()
    }

    /// Bytes of the reduced text.
    pub fn len(&self) -> usize {
        self.head.len() + self.marker.len + self.tail.len()
    }

    /// The three pieces in order.
    pub fn parts(&self) -> [&str; 3] {
        [self.head, self.marker(), self.tail]
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a char boundary.
fn prefix(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// The longest suffix of `text` of at most `max` bytes that starts on a char boundary.
fn suffix(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text.get(start..).unwrap_or_default()
}

/// Whole lines from the start of `text` costing at most `budget` tokens; a cut first line
/// when not even one fits.
fn head_lines<'a>(text: &'a str, budget: u32, counter: &impl TokenCounter) -> &'a str {
    let mut end = 0usize;
    let mut spent = 0u32;
    for line in crate::small::split_lines(text) {
        spent = spent.saturating_add(counter.count(line));
        if spent > budget {
            break;
        }
        end += line.len();
    }
    if end == 0 {
        return fit(text, budget, counter, prefix);
    }
    text.get(..end).unwrap_or_default()
}

/// Whole lines from the end of `text` costing at most `budget` tokens; a cut last line when
/// not even one fits.
fn tail_lines<'a>(text: &'a str, budget: u32, counter: &impl TokenCounter) -> &'a str {
    let mut start = text.len();
    let mut spent = 0u32;
    while start > 0 {
        let before = text.get(..start).unwrap_or_default();
        // The line ending at `start`: back to the newline before it (kept with the previous line).
        let line_start =
            crate::small::last_byte(before.strip_suffix('\n').unwrap_or(before), b'\n')
                .map_or(0, |i| i + 1);
        let line = before.get(line_start..).unwrap_or_default();
        spent = spent.saturating_add(counter.count(line));
        if spent > budget {
            break;
        }
        start = line_start;
    }
    if start == text.len() {
        return fit(text, budget, counter, suffix);
    }
    text.get(start..).unwrap_or_default()
}

/// The largest cut of `text` (by `cut`) whose count fits `budget`, shrinking by halves: a
/// counter never gives more tokens than bytes in practice, so the first try usually fits.
fn fit<'a>(
    text: &'a str,
    budget: u32,
    counter: &impl TokenCounter,
    cut: fn(&str, usize) -> &str,
) -> &'a str {
    let mut max = budget as usize;
    loop {
        let piece = cut(text, max);
        if max == 0 || counter.count(piece) <= budget {
            return piece;
        }
        max /= 2;
    }
}

/// Reduces `text`, known to cost more than `limit` tokens, to at most `limit`: first lines,
/// marker, last lines. Head and tail share what the marker leaves, 60/40 (the head usually
/// says what ran, the tail how it ended).
///
/// The pieces are counted as the manager stores them (each piece on its own, summed) and
/// the result never costs more than `limit` for any counter that keeps the contract,
/// including one that rounds down: a piece's count is not the sum of its lines' counts (a
/// `len / 4` counter gives `"abc\nabc\n"` 2 tokens, its lines 1 each), so when the pieces
/// overshoot, the room shrinks in proportion and the cut is made again (at most 8 times,
/// then head and tail are dropped to the marker and whatever part of the tail fits).
/// `value · numerator / denominator` rounded down, for `numerator < denominator` (so the
/// result is below `value`), by shift-and-subtract on the 64-bit product: exact, and without
/// a 64-bit division (a compiler-builtins helper of almost 1 KiB on a 32-bit device).
/// Returns `value` when `numerator >= denominator`.
fn scale_down(value: u32, numerator: u32, denominator: u32) -> u32 {
    if numerator >= denominator {
        return value;
    }
    let product = u64::from(value) * u64::from(numerator);
    let divisor = u64::from(denominator);
    // The high word is below the divisor, so the quotient fits in 32 bits.
    let mut rest = product >> 32;
    let mut quotient = 0u32;
    for bit in (0..32).rev() {
        rest = (rest << 1) | ((product >> bit) & 1);
        quotient <<= 1;
        if rest >= divisor {
            rest -= divisor;
            quotient |= 1;
        }
    }
    quotient
}

pub(crate) fn reduce<'a>(text: &'a str, limit: u32, counter: &impl TokenCounter) -> Reduction<'a> {
    let marker_cost = counter.count(Marker::new(true, 1_000_000).as_str());
    // The one pass over the whole text: each cut then counts only what it keeps.
    let newlines = newlines(text);
    let mut room = limit.saturating_sub(marker_cost);
    for _ in 0..8 {
        let reduction = cut(text, newlines, room, counter);
        let cost =
            reduction.parts().iter().map(|p| counter.count(p)).fold(0u32, u32::saturating_add);
        if cost <= limit {
            return reduction;
        }
        if room == 0 {
            break;
        }
        // Shrink in proportion (one more cut usually fits), and by at least the excess.
        let scaled = scale_down(room, limit, cost);
        room = scaled.min(room.saturating_sub(cost - limit)).min(room - 1);
    }
    // Last resort: no head; the tail cut to what the marker leaves.
    let marker = Marker::new(false, lines(text, newlines));
    let left = limit.saturating_sub(counter.count(marker.as_str()));
    let tail = fit(text, left, counter, suffix);
    let tail = if counter.count(tail) <= left { tail } else { "" };
    Reduction { head: "", tail, marker }
}

/// Newline bytes in `text`. Counted in blocks of 255 bytes into a `u8`, a loop the compiler
/// vectorizes 16 bytes at a time (a `usize` count per byte, or a search per line, is several
/// instructions a byte).
fn newlines(text: &str) -> usize {
    text.as_bytes()
        .chunks(255)
        .map(|block| block.iter().fold(0u8, |n, &b| n.wrapping_add(u8::from(b == b'\n'))))
        .map(usize::from)
        .sum()
}

/// `split_lines(text).count()` for a `text` holding `newlines` newline bytes: one line per
/// newline, plus an unterminated last line.
fn lines(text: &str, newlines: usize) -> usize {
    newlines + usize::from(text.as_bytes().last().is_some_and(|&b| b != b'\n'))
}

/// One cut with `room` tokens for head and tail; `newlines` is [`newlines`] of `text`, so
/// the omitted lines are counted from what the cut keeps, not by reading the middle again.
fn cut<'a>(
    text: &'a str,
    newlines: usize,
    room: u32,
    counter: &impl TokenCounter,
) -> Reduction<'a> {
    let head = head_lines(text, room * 3 / 5, counter);
    let rest = text.get(head.len()..).unwrap_or_default();
    let tail = tail_lines(rest, room - room * 3 / 5, counter);
    let middle = rest.get(..rest.len() - tail.len()).unwrap_or_default();
    let kept = self::newlines(head) + self::newlines(tail);
    let omitted = lines(middle, newlines.saturating_sub(kept));
    let marker = Marker::new(!head.is_empty() && !head.ends_with('\n'), omitted);
    Reduction { head, tail, marker }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The 32-bit scaling equals the 64-bit division it replaces.
        #[test]
        fn scale_down_is_the_64_bit_division(value: u32, a: u32, b: u32) {
            let (numerator, denominator) = (a.min(b), a.max(b).max(1));
            let expected = u64::from(value) * u64::from(numerator) / u64::from(denominator);
            let expected = if numerator >= denominator { value } else { expected as u32 };
            prop_assert_eq!(scale_down(value, numerator, denominator), expected);
        }
    }

    #[test]
    fn scale_down_edges() {
        assert_eq!(scale_down(u32::MAX, u32::MAX - 1, u32::MAX), u32::MAX - 1);
        assert_eq!(scale_down(7, 0, 1), 0);
        assert_eq!(scale_down(7, 5, 5), 7);
        assert_eq!(scale_down(1_000, 1, 3), 333);
    }

    /// One token per line-or-4-bytes, enough to make the arithmetic visible.
    struct QuarterBytes;
    impl TokenCounter for QuarterBytes {
        fn count(&self, text: &str) -> u32 {
            text.len().div_ceil(4) as u32
        }
    }

    fn joined(r: &Reduction<'_>) -> String {
        r.parts().concat()
    }

    #[test]
    fn keeps_head_and_tail_lines_and_counts_the_rest() {
        let text: String = (0..1000).map(|i| format!("line {i:04}\n")).collect();
        let reduced = reduce(&text, 200, &QuarterBytes);
        let out = joined(&reduced);
        assert!(out.starts_with("line 0000\n"));
        assert!(out.ends_with("line 0999\n"));
        assert!(reduced.head.ends_with('\n') && reduced.tail.starts_with("line "));
        let kept = reduced.head.lines().count() + reduced.tail.lines().count();
        assert!(
            out.contains(&format!("[Data Truncated]\n... ({} lines omitted) ...\n", 1000 - kept))
        );
        assert!(QuarterBytes.count(&out) <= 200, "{} tokens", QuarterBytes.count(&out));
    }

    #[test]
    fn one_giant_line_is_cut_on_char_boundaries() {
        let text = "é".repeat(20_000);
        let reduced = reduce(&text, 100, &QuarterBytes);
        let out = joined(&reduced);
        assert!(out.contains("(1 line omitted)"));
        assert!(QuarterBytes.count(&out) <= 100);
        assert!(reduced.head.chars().all(|c| c == 'é') && !reduced.head.is_empty());
        assert!(reduced.tail.chars().all(|c| c == 'é') && !reduced.tail.is_empty());
    }

    #[test]
    fn marker_counts_large_numbers() {
        assert_eq!(
            Marker::new(false, 1234567).as_str(),
            "[Data Truncated]\n... (1234567 lines omitted) ...\n"
        );
        assert_eq!(
            Marker::new(true, 0).as_str(),
            "\n[Data Truncated]\n... (0 lines omitted) ...\n"
        );
    }

    /// `len / 4`, rounding down (as `benches`' `QuarterLen`).
    struct QuarterDown;
    impl TokenCounter for QuarterDown {
        fn count(&self, text: &str) -> u32 {
            (text.len() / 4) as u32
        }
    }

    fn cost(r: &Reduction<'_>, counter: &impl TokenCounter) -> u32 {
        r.parts().iter().map(|p| counter.count(p)).sum()
    }

    /// Short lines lose up to 3/4 of a token each when counted one by one with a counter
    /// that rounds down: before the fix the pieces overshot the limit (here 200 → 290 and
    /// more), and the manager refused the reduced result.
    #[test]
    fn a_rounding_down_counter_never_overshoots() {
        let text: String = (0..5_000).map(|i| format!("ok {}\n", i % 10)).collect();
        for limit in [32, 33, 50, 200, 999, 1_000] {
            let reduced = reduce(&text, limit, &QuarterDown);
            assert!(
                cost(&reduced, &QuarterDown) <= limit,
                "limit {limit}: {}",
                cost(&reduced, &QuarterDown)
            );
            assert!(text.starts_with(reduced.head) && text.ends_with(reduced.tail));
        }
    }

    proptest::proptest! {
        #[test]
        fn never_exceeds_the_limit_rounding_down(text in "(ab|abcde|\n|é){0,2000}", limit in 32u32..400) {
            if QuarterDown.count(&text) > limit {
                let reduced = reduce(&text, limit, &QuarterDown);
                proptest::prop_assert!(cost(&reduced, &QuarterDown) <= limit);
                proptest::prop_assert!(cost(&reduced, &QuarterBytes) <= limit + 3);
            }
        }

        #[test]
        fn line_counts_match_split_lines(text in "(a|é|\n|\r\n){0,40}") {
            let expected = crate::small::split_lines(&text).count();
            proptest::prop_assert_eq!(lines(&text, newlines(&text)), expected);
        }

        #[test]
        fn byte_line_helpers_match_core(text in "(a|é|\n|\r\n){0,40}") {
            let expected: Vec<&str> = text.split_inclusive('\n').collect();
            proptest::prop_assert_eq!(crate::small::split_lines(&text).collect::<Vec<_>>(), expected);
            proptest::prop_assert_eq!(crate::small::last_byte(&text, b'\n'), text.rfind('\n'));
        }

        #[test]
        fn never_exceeds_the_limit_much(text in ".{0,3000}", limit in 32u32..400) {
            if QuarterBytes.count(&text) > limit {
                let reduced = reduce(&text, limit, &QuarterBytes);
                let out = joined(&reduced);
                proptest::prop_assert!(QuarterBytes.count(&out) <= limit + 2);
                proptest::prop_assert!(cost(&reduced, &QuarterBytes) <= limit);
                proptest::prop_assert!(text.starts_with(reduced.head));
                proptest::prop_assert!(text.ends_with(reduced.tail));
                proptest::prop_assert!(reduced.head.len() + reduced.tail.len() <= text.len());
            }
        }
    }
}
