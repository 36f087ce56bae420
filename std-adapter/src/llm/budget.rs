//! Token estimates and cutting prompt input to a token budget.

/// Smallest share of the budget a kept piece gets; below it, whole old pieces are dropped.
const MIN_PIECE_TOKENS: u32 = 24;

/// A conservative token estimate without a tokenizer: one token per 3 ASCII characters and
/// one per byte of every non-ASCII character, rounded up.
///
/// Byte-level BPE tokenizers (GPT, SmolLM2, Llama) spend about 4 ASCII characters per token
/// on prose and more than one token per CJK character or emoji, so this overestimates, and
/// input cut to it fits the model's context.
///
/// ```
/// use ctxwin_std::llm::estimate_tokens;
/// assert_eq!(estimate_tokens(""), 0);
/// assert_eq!(estimate_tokens("abcdef"), 2);
/// assert_eq!(estimate_tokens("abcdefg"), 3);
/// assert_eq!(estimate_tokens("你好"), 6);
/// ```
pub fn estimate_tokens(text: &str) -> u32 {
    let units: u64 =
        text.chars().map(|c| if c.is_ascii() { 1 } else { 3 * c.len_utf8() as u64 }).sum();
    u32::try_from(units.div_ceil(3)).unwrap_or(u32::MAX)
}

/// Pieces of prompt input after [`fit`].
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Fitted {
    pub(super) pieces: Vec<String>,
    /// Some piece was shortened or dropped.
    pub(super) cut: bool,
}

/// Shortens `pieces` until their token counts add up to at most `budget`.
///
/// Long pieces are cut in the middle (head and tail stay) down to a common cap, so every
/// piece keeps its start and end and short pieces stay whole ("water-filling"). When even
/// [`MIN_PIECE_TOKENS`] each does not fit, the oldest pieces after `pinned` leading ones are
/// replaced by one "omitted" line.
pub(super) fn fit(
    pieces: Vec<String>,
    pinned: usize,
    budget: u32,
    count: &dyn Fn(&str) -> u32,
) -> Fitted {
    let mut pieces = pieces;
    let total: u64 = pieces.iter().map(|p| u64::from(count(p))).sum();
    if total <= u64::from(budget) {
        return Fitted { pieces, cut: false };
    }
    let most_pieces = usize::try_from((budget / MIN_PIECE_TOKENS).max(2)).unwrap_or(usize::MAX);
    if pieces.len() > most_pieces {
        let pinned = pinned.min(pieces.len());
        let drop = pieces.len() - most_pieces + 1;
        let drop = drop.min(pieces.len() - pinned);
        pieces.drain(pinned..pinned + drop);
        pieces.insert(pinned, format!("[{drop} earlier messages omitted]"));
    }
    let costs: Vec<u32> = pieces.iter().map(|p| count(p)).collect();
    let cap = water_level(&costs, budget);
    let fitted = pieces
        .into_iter()
        .zip(costs)
        .map(|(piece, cost)| if cost <= cap { piece } else { cut_to(&piece, cap, count) })
        .collect();
    Fitted { pieces: fitted, cut: true }
}

/// `text` cut in the middle to the most characters whose count stays within `cap` (binary
/// search: counts grow with the characters kept).
fn cut_to(text: &str, cap: u32, count: &dyn Fn(&str) -> u32) -> String {
    let (mut fits, mut too_many) = (0usize, text.chars().count());
    while too_many - fits > 1 {
        let middle = fits + (too_many - fits) / 2;
        if count(&cut_middle(text, middle)) <= cap {
            fits = middle;
        } else {
            too_many = middle;
        }
    }
    cut_middle(text, fits)
}

/// The largest cap `c` with `Σ min(cost, c) ≤ budget`.
fn water_level(costs: &[u32], budget: u32) -> u32 {
    let mut sorted = costs.to_vec();
    sorted.sort_unstable();
    let mut used = 0u64;
    let mut left = sorted.len() as u64;
    for cost in sorted {
        if used + u64::from(cost) * left > u64::from(budget) {
            let level = u64::from(budget).saturating_sub(used) / left.max(1);
            return u32::try_from(level).unwrap_or(u32::MAX);
        }
        used += u64::from(cost);
        left -= 1;
    }
    u32::MAX
}

/// `text` shortened to about `keep` characters: the first two thirds and the last third of
/// them, joined by a marker saying how much was cut.
pub(super) fn cut_middle(text: &str, keep: usize) -> String {
    let chars = text.chars().count();
    if chars <= keep {
        return text.to_owned();
    }
    let head = keep * 2 / 3;
    let tail = keep - head;
    let cut = chars - head - tail;
    let head_text: String = text.chars().take(head).collect();
    let tail_text: String = text.chars().skip(chars - tail).collect();
    format!("{head_text} [...{cut} characters cut...] {tail_text}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn total(fitted: &Fitted) -> u32 {
        fitted.pieces.iter().map(|p| estimate_tokens(p)).sum()
    }

    #[test]
    fn estimate_rounds_up_and_charges_non_ascii_by_bytes() {
        assert_eq!(estimate_tokens("a"), 1);
        assert_eq!(estimate_tokens("abc"), 1);
        assert_eq!(estimate_tokens("🎉"), 4);
        assert_eq!(estimate_tokens("é"), 2);
    }

    #[test]
    fn input_within_budget_is_untouched() {
        let pieces = vec!["short".to_owned(), "also short".to_owned()];
        let fitted = fit(pieces.clone(), 0, 100, &estimate_tokens);
        assert_eq!(fitted, Fitted { pieces, cut: false });
    }

    #[test]
    fn long_pieces_are_cut_in_the_middle_and_short_ones_kept() {
        let long = format!("START {} END", "x".repeat(3000));
        let fitted = fit(vec!["keep me".to_owned(), long], 0, 200, &estimate_tokens);
        assert!(fitted.cut);
        assert_eq!(fitted.pieces[0], "keep me");
        assert!(fitted.pieces[1].starts_with("START"));
        assert!(fitted.pieces[1].ends_with("END"));
        assert!(fitted.pieces[1].contains("characters cut"));
        assert!(total(&fitted) <= 200, "{}", total(&fitted));
    }

    #[test]
    fn too_many_pieces_drop_the_oldest_after_the_pinned() {
        let mut pieces = vec!["SUMMARY".to_owned()];
        pieces.extend((0..100).map(|i| format!("message {i} {}", "y".repeat(60))));
        let fitted = fit(pieces, 1, 240, &estimate_tokens);
        assert_eq!(fitted.pieces[0], "SUMMARY");
        assert!(fitted.pieces[1].ends_with("earlier messages omitted]"), "{}", fitted.pieces[1]);
        assert!(fitted.pieces.last().unwrap().starts_with("message 99"));
        assert!(total(&fitted) <= 240);
    }

    #[test]
    fn cut_middle_keeps_head_and_tail() {
        assert_eq!(cut_middle("abcdefghij", 3), "ab [...7 characters cut...] j");
        assert_eq!(cut_middle("abc", 3), "abc");
    }

    proptest! {
        #[test]
        fn fitted_input_fits_when_the_budget_allows_the_markers(
            lens in proptest::collection::vec(0usize..4000, 1..30),
            budget in 400u32..4000,
        ) {
            let pieces: Vec<String> = lens.iter().map(|&n| "word ".repeat(n / 5 + 1)).collect();
            let fitted = fit(pieces, 0, budget, &estimate_tokens);
            prop_assert!(total(&fitted) <= budget, "total {} budget {}", total(&fitted), budget);
        }
    }
}
