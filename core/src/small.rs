//! Small helpers that keep the core free of panic paths and large library code: core's char
//! searchers, `copy_within` and its sorts keep branches (and flash) a firmware does not want,
//! which the panic-never link check exposed.

/// `text.split_inclusive('\n')` over bytes.
pub(crate) fn split_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    core::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.bytes().position(|b| b == b'\n').map_or(rest.len(), |i| i + 1);
        let (line, tail) = rest.split_at_checked(end)?;
        rest = tail;
        Some(line)
    })
}

/// `text.lines()`: [`split_lines`] without the line ends (`\n`, and a `\r` before it); the
/// iterator of `str::lines` keeps a slice-index panic path.
#[cfg(feature = "tasks")]
pub(crate) fn lines(text: &str) -> impl Iterator<Item = &str> {
    split_lines(text).map(|line| {
        let line = line.strip_suffix("\n").unwrap_or(line);
        line.strip_suffix("\r").unwrap_or(line)
    })
}

/// Index of the last `byte` in `text` (`text.rfind(byte as char)` for ASCII bytes).
pub(crate) fn last_byte(text: &str, byte: u8) -> Option<usize> {
    text.bytes().rposition(|b| b == byte)
}

/// Whether `haystack` contains `needle` (bytes, case-sensitive).
pub(crate) fn contains(haystack: &str, needle: &str) -> bool {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    n.is_empty() || (h.len() >= n.len() && h.windows(n.len()).any(|w| w == n))
}

/// Whether `haystack` contains `needle`, ignoring ASCII case.
pub(crate) fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    n.is_empty() || (h.len() >= n.len() && h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n)))
}

/// Whether `c` counts as a letter: ASCII letters, and every non-ASCII character (scripts the
/// core does not tell apart without Unicode tables).
pub(crate) fn is_letter(c: char) -> bool {
    c.is_ascii_alphabetic() || !c.is_ascii()
}

/// Swaps items `a` and `b` (nothing when either is out of range).
pub(crate) fn swap<T>(items: &mut [T], a: usize, b: usize) {
    let (low, high) = (a.min(b), a.max(b));
    if low == high {
        return;
    }
    if let Some((left, right)) = items.split_at_mut_checked(high) {
        if let (Some(x), Some(y)) = (left.get_mut(low), right.first_mut()) {
            core::mem::swap(x, y);
        }
    }
}

/// Sorts a short slice by `key`, stably (insertion sort: fine for the ≤ 64 items the core sorts).
pub(crate) fn sort_by_key<T: Copy, K: Ord>(items: &mut [T], key: impl Fn(&T) -> K) {
    for i in 1..items.len() {
        let mut j = i;
        while j > 0 {
            let (Some(a), Some(b)) = (items.get(j - 1), items.get(j)) else { break };
            if key(a) <= key(b) {
                break;
            }
            swap(items, j - 1, j);
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn helpers_match_the_library(text in "\\PC{0,80}", needle in "[a-c:]{0,3}", mut items in proptest::collection::vec(0u8..20, 0..40)) {
            proptest::prop_assert_eq!(split_lines(&text).collect::<Vec<_>>(), text.split_inclusive('\n').collect::<Vec<_>>());
            proptest::prop_assert_eq!(last_byte(&text, b'\n'), text.rfind('\n'));
            proptest::prop_assert_eq!(contains(&text, &needle), text.contains(needle.as_str()));
            let mut expected = items.clone();
            expected.sort();
            sort_by_key(&mut items, |x| *x);
            proptest::prop_assert_eq!(items, expected);
        }
    }
}
