//! Deterministic keyword extraction: identifiers, file paths, numbers and capitalized names.
//!
//! Keywords are what a later question is likely to name ("the bug in `src/lexer.rs`", "what did
//! Alice say about `parse_header`", "error 502"). Plain lower-case prose words are left to the
//! full-text index; this list keeps the salient tokens so they can be looked up exactly and
//! counted.

use std::collections::BTreeMap;

/// At most this many keywords are kept per message (the most frequent ones).
pub const MAX_KEYWORDS_PER_MESSAGE: usize = 64;

/// Keywords longer than this (in bytes) are dropped: they are blobs, not names.
pub const MAX_KEYWORD_LEN: usize = 128;

/// Whether `word` (any case) is a stop word: ctxwin's one list, [`ctxwin_core::terms::STOP_WORDS`].
///
/// ```
/// use ctxwin_std::store::keywords::is_stop_word;
/// assert!(is_stop_word("The"));
/// assert!(!is_stop_word("parser"));
/// ```
pub use ctxwin_core::terms::is_stop_word;

/// Extracts the keywords of `text` with how often each occurs, lower-cased, most frequent first
/// (ties in byte order), at most [`MAX_KEYWORDS_PER_MESSAGE`].
///
/// A token is a keyword when it is a file path (`src/main.rs`, `Cargo.toml`), an identifier
/// (`parse_header`, `maxTokens`, `std::fs::read`, `E0502`), a number of two or more digits
/// (`404`, `1.2.3`), an acronym (`HTTP`) or a capitalized name (`Alice`) that is not a stop word
/// and does not merely open a sentence.
///
/// # Examples
///
/// ```
/// use ctxwin_std::store::keywords::extract;
/// let kws = extract("Ask Alice: parse_header in src/lexer.rs fails, see issue 502. The fix works.");
/// let words: Vec<&str> = kws.iter().map(|(k, _)| k.as_str()).collect();
/// assert_eq!(words, ["502", "alice", "parse_header", "src/lexer.rs"]);
/// ```
pub fn extract(text: &str) -> Vec<(String, u32)> {
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    add_keywords(text, &mut counts);
    finish(counts)
}

/// Like [`extract`] over several texts at once (content, tool calls, original), counted
/// together.
///
/// ```
/// use ctxwin_std::store::keywords::extract_all;
/// let kws = extract_all(["read Cargo.toml", "Cargo.toml has 12 deps"]);
/// assert_eq!(kws.first(), Some(&("cargo.toml".to_string(), 2)));
/// ```
pub fn extract_all<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<(String, u32)> {
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for text in texts {
        add_keywords(text, &mut counts);
    }
    finish(counts)
}

fn finish(counts: BTreeMap<String, u32>) -> Vec<(String, u32)> {
    let mut ranked: Vec<(String, u32)> = counts.into_iter().collect();
    // Stable sort keeps byte order among equal counts, so the result is deterministic.
    ranked.sort_by_key(|entry| std::cmp::Reverse(entry.1));
    ranked.truncate(MAX_KEYWORDS_PER_MESSAGE);
    ranked
}

fn add_keywords(text: &str, counts: &mut BTreeMap<String, u32>) {
    let mut sentence_start = true;
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !is_token_char(c)).unwrap_or(rest.len());
        let (raw, after) = rest.split_at(end);
        let token = trim_token(raw);
        if token.len() <= MAX_KEYWORD_LEN && is_keyword(token, sentence_start) {
            let entry = counts.entry(token.to_lowercase()).or_insert(0);
            *entry = entry.saturating_add(1);
        }
        if !raw.is_empty() {
            sentence_start = raw.ends_with('.');
        }
        let mut separators = after.char_indices();
        let skip =
            separators.find(|(_, c)| is_token_char(*c)).map_or(after.len(), |(index, _)| index);
        let (gap, next) = after.split_at(skip);
        if gap.contains(['!', '?', '\n']) {
            sentence_start = true;
        }
        rest = next;
    }
}

fn is_token_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '.' | '/' | ':' | '-')
}

fn trim_token(raw: &str) -> &str {
    raw.trim_end_matches(['.', ':', '-', '/']).trim_start_matches([':', '-'])
}

/// Classifies one trimmed token: a term ([`ctxwin_core::terms::is_term`]: identifier, path,
/// number, flag), an acronym, or a capitalized name, never a stop word. A capitalized word
/// opening a sentence is only a keyword when it is also a term or an acronym (`HTTP`,
/// `PostgreSQL`), since "Open" or "Now" there is prose.
fn is_keyword(token: &str, sentence_start: bool) -> bool {
    if !token.chars().any(char::is_alphanumeric) || is_stop_word(token) {
        return false;
    }
    ctxwin_core::terms::is_term(token)
        || is_acronym(token)
        || (!sentence_start && is_capitalized_name(token))
}

fn is_capitalized_name(token: &str) -> bool {
    let mut chars = token.chars();
    let starts_upper = chars.next().is_some_and(char::is_uppercase);
    starts_upper && token.chars().count() >= 2 && token.chars().all(char::is_alphanumeric)
}

fn is_acronym(token: &str) -> bool {
    token.chars().filter(|c| c.is_uppercase()).count() >= 2
        && token.chars().all(|c| c.is_uppercase() || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn words(text: &str) -> Vec<String> {
        let mut kws: Vec<String> = extract(text).into_iter().map(|(k, _)| k).collect();
        kws.sort();
        kws
    }

    #[test]
    fn stop_words_are_sorted_for_binary_search() {
        let mut sorted = ctxwin_core::terms::STOP_WORDS.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, ctxwin_core::terms::STOP_WORDS);
    }

    #[test]
    fn classifies_paths_identifiers_numbers_and_names() {
        assert_eq!(
            words("Open /etc/hosts and ./src/main.rs then README.md."),
            ["./src/main.rs", "/etc/hosts", "readme.md"]
        );
        assert_eq!(
            words("call std::fs::read or maxTokens or E0502"),
            ["e0502", "maxtokens", "std::fs::read"]
        );
        assert_eq!(words("port 8080, version 1.2.3, pi 3.14 and 7"), ["1.2.3", "3.14", "8080"]);
        assert_eq!(
            words("Then Alice met Bob at PostgreSQL over HTTP"),
            ["alice", "bob", "http", "postgresql"]
        );
        assert_eq!(words("Open it. Close it! Run it\nNow"), Vec::<String>::new());
    }

    #[test]
    fn prose_and_stop_words_are_not_keywords() {
        assert!(words("the quick brown fox jumps over the lazy dog").is_empty());
        assert!(words("The This What e.g. i.e. -- ... ::").is_empty());
    }

    #[test]
    fn counts_and_orders_by_frequency() {
        let kws = extract("Ask Alice, Bob, Alice and alice: 42 42 42");
        assert_eq!(kws, [("42".to_string(), 3), ("alice".to_string(), 2), ("bob".to_string(), 1)]);
    }

    #[test]
    fn caps_count_and_length() {
        let text: String = (0..200).map(|i| format!("Name{i} ")).collect();
        assert_eq!(extract(&text).len(), MAX_KEYWORDS_PER_MESSAGE);
        let long = format!("a_{}", "x".repeat(MAX_KEYWORD_LEN));
        assert!(extract(&long).is_empty());
    }

    proptest! {
        #[test]
        fn never_panics_and_respects_bounds(text in any::<String>()) {
            let kws = extract(&text);
            prop_assert!(kws.len() <= MAX_KEYWORDS_PER_MESSAGE);
            for (kw, count) in &kws {
                prop_assert!(*count >= 1);
                prop_assert!(!kw.is_empty());
                prop_assert!(!is_stop_word(kw));
            }
        }

        #[test]
        fn deterministic(text in "[A-Za-z0-9_./: -]{0,200}") {
            prop_assert_eq!(extract(&text), extract(&text));
        }
    }
}
