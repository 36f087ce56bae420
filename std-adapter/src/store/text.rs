//! Full-text search in memory: the terms of a text, the terms of a query, and BM25 over a
//! conversation's documents, for adapters without an index of their own ([`MemoryStore`]).
//!
//! Words are the core's one definition ([`ctxwin_core::terms::search_words`]), lower-cased and
//! stemmed ([`ctxwin_core::terms::stem`]); a query drops stop words unless nothing else is
//! left, brings an irregular verb's other forms, and counts words of one stem once, as the
//! SQLite adapter's query does.
//!
//! [`MemoryStore`]: super::MemoryStore

use std::collections::HashMap;

use ctxwin_core::terms;

/// Query words beyond this many are ignored (bounds the cost of a pasted paragraph).
const MAX_QUERY_TERMS: usize = 32;

/// BM25's term-frequency saturation: the lexical ranking of every adapter (SQLite FTS5's
/// `bm25()` default, and `bm25` here). A ranking that rescales a hit's relevance for
/// another length (retrieval ranking a short reply as the exchange it closes) uses it too.
pub const BM25_K1: f64 = 1.2;
/// BM25's length normalisation (SQLite FTS5's default): see [`BM25_K1`].
pub const BM25_B: f64 = 0.75;

/// The index terms of `text`, in order.
pub(crate) fn terms(text: &str) -> Vec<String> {
    terms::search_words(text).map(|word| terms::stem(&word.to_lowercase()).to_string()).collect()
}

/// The words a query `text` searches for, as the user wrote them (unstemmed): each word with an
/// irregular verb's other forms, words of one stem once, stop words dropped unless nothing
/// else is left, at most [`MAX_QUERY_TERMS`]. Adapters whose database stems (PostgreSQL's
/// text search) take these; [`query_terms`] stems them.
pub(crate) fn query_words(text: &str) -> Vec<&str> {
    let mut words: Vec<&str> = Vec::new();
    for word in terms::search_words(text) {
        for form in core::iter::once(word).chain(terms::verb_forms(word).iter().copied()) {
            if !words.iter().any(|w| terms::same_stem(w, form)) {
                words.push(form);
            }
        }
    }
    if words.iter().any(|w| !terms::is_stop_word(w)) {
        words.retain(|w| !terms::is_stop_word(w));
    }
    words.truncate(MAX_QUERY_TERMS);
    words
}

/// The terms a query `text` searches for (empty: nothing to search).
pub(crate) fn query_terms(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in query_words(text) {
        let term = terms::stem(&word.to_lowercase()).to_string();
        if !out.contains(&term) {
            out.push(term);
        }
    }
    out
}

/// BM25 scores of `docs` (each a document's terms) for `query` terms: `(index, score)` of the
/// documents matching at least one term, best first, ties by index.
pub(crate) fn bm25(docs: &[Vec<String>], query: &[String]) -> Vec<(usize, f64)> {
    if docs.is_empty() || query.is_empty() {
        return Vec::new();
    }
    let count = docs.len() as f64;
    let avgdl = docs.iter().map(Vec::len).sum::<usize>() as f64 / count;
    let idf: Vec<f64> = query
        .iter()
        .map(|term| {
            let df = docs.iter().filter(|doc| doc.contains(term)).count() as f64;
            // FTS5's floor: a term in most documents still counts a little.
            (((count - df + 0.5) / (df + 0.5)) + 1.0).ln().max(1e-6)
        })
        .collect();
    let mut scored: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .filter_map(|(index, doc)| {
            let mut frequencies: HashMap<&str, f64> = HashMap::new();
            for term in doc {
                *frequencies.entry(term.as_str()).or_default() += 1.0;
            }
            let norm = BM25_K1 * (1.0 - BM25_B + BM25_B * doc.len() as f64 / avgdl.max(1.0));
            let score: f64 = query
                .iter()
                .zip(&idf)
                .filter_map(|(term, idf)| {
                    let tf = *frequencies.get(term.as_str())?;
                    Some(idf * tf * (BM25_K1 + 1.0) / (tf + norm))
                })
                .sum();
            (score > 0.0).then_some((index, score))
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored
}

/// A short excerpt of `text` around the first word of `query`, matched words in `«»`.
pub(crate) fn snippet(text: &str, query: &[String]) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let hit = |word: &str| {
        terms::search_words(word)
            .any(|w| query.iter().any(|q| *q == terms::stem(&w.to_lowercase())))
    };
    let first = words.iter().position(|w| hit(w)).unwrap_or(0);
    let start = first.saturating_sub(8);
    let end = (first + 8).min(words.len());
    let mut out: Vec<String> = Vec::new();
    if start > 0 {
        out.push("…".into());
    }
    for word in words.get(start..end).unwrap_or_default() {
        out.push(if hit(word) { format!("«{word}»") } else { (*word).to_string() });
    }
    if end < words.len() {
        out.push("…".into());
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_match_stems_and_verb_forms() {
        let query = query_terms("What hobby did Sofia take up?");
        let docs = vec![terms("Sofia has taken up pottery"), terms("the weather is grey")];
        let scored = bm25(&docs, &query);
        assert_eq!(scored.len(), 1);
        assert_eq!(scored[0].0, 0);
        assert!(query_terms("  * ( ").is_empty());
    }

    #[test]
    fn shorter_documents_rank_higher_for_one_match() {
        let docs = vec![
            terms("the parser failed on a long line with many other words around it"),
            terms("the parser failed"),
        ];
        let scored = bm25(&docs, &query_terms("parser"));
        assert_eq!(scored[0].0, 1);
    }

    #[test]
    fn snippets_mark_matches() {
        let query = query_terms("dogs");
        assert_eq!(snippet("we adopted two dogs in May", &query), "we adopted two «dogs» in May");
    }
}
