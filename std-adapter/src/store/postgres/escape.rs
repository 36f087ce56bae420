//! Text as PostgreSQL stores it: its `text` cannot hold U+0000, which a message (a tool's
//! binary output, a client's JSON string) may. Every text the adapter stores goes through
//! [`escape`] and comes back through [`unescape`]: U+0000 becomes [`ESCAPE`] `0`, and
//! [`ESCAPE`] itself is doubled. Text without either (nearly all) is stored as it is, and
//! checksums cover the text as the caller gave it.
//!
//! The escaped forms make a prefix code, so `escape(a)` is a prefix of `escape(b)` exactly
//! when `a` is a prefix of `b` (conversation prefixes stay prefixes), and `escape(a)` occurs
//! in `escape(b)` whenever `a` occurs in `b` (a search for forgotten text finds every row that
//! holds it; a candidate is confirmed on the decoded row).

use std::borrow::Cow;

use crate::store::Scope;

/// The escape character: U+FFFF, a noncharacter no text is meant to hold.
pub(super) const ESCAPE: char = '\u{FFFF}';

/// `text` as stored.
pub(super) fn escape(text: &str) -> Cow<'_, str> {
    if !text.contains(['\0', ESCAPE]) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\0' => {
                out.push(ESCAPE);
                out.push('0');
            }
            ESCAPE => {
                out.push(ESCAPE);
                out.push(ESCAPE);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// An optional text as stored.
pub(super) fn escape_opt(text: Option<&str>) -> Option<String> {
    text.map(|text| escape(text).into_owned())
}

/// Stored `text` back as the caller gave it; `Err` (what is wrong) for an escape no
/// [`escape`] writes.
pub(super) fn unescape(text: String) -> Result<String, String> {
    if !text.contains(ESCAPE) {
        return Ok(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != ESCAPE {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('\0'),
            Some(ESCAPE) => out.push(ESCAPE),
            other => return Err(format!("a stored text has the escape U+FFFF before {other:?}")),
        }
    }
    Ok(out)
}

/// An optional stored text back.
pub(super) fn unescape_opt(text: Option<String>) -> Result<Option<String>, String> {
    text.map(unescape).transpose()
}

/// Stored `text` back for people (a snippet cut anywhere): a dangling escape is dropped.
pub(super) fn unescape_lossy(text: String) -> String {
    if !text.contains(ESCAPE) {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != ESCAPE {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('0') => {
                chars.next();
                out.push('\0');
            }
            Some(&ESCAPE) => {
                chars.next();
                out.push(ESCAPE);
            }
            _ => {}
        }
    }
    out
}

/// The tenant and name of `scope` as stored, for `$1` and `$2`.
pub(super) fn scope_params(scope: &Scope) -> (String, String) {
    (escape(&scope.tenant).into_owned(), escape(&scope.conversation).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_text_is_stored_as_it_is() {
        assert!(matches!(escape("hello"), Cow::Borrowed("hello")));
        assert_eq!(escape("a\0b"), "a\u{FFFF}0b");
        assert_eq!(escape("\u{FFFF}"), "\u{FFFF}\u{FFFF}");
        assert!(unescape("a\u{FFFF}x".into()).is_err());
        assert!(unescape("a\u{FFFF}".into()).is_err());
        assert_eq!(unescape_lossy("a\u{FFFF}".into()), "a");
    }

    proptest! {
        #[test]
        fn round_trips_and_keeps_prefixes_and_substrings(
            a in "[a\\x00\u{FFFF}0]{0,8}",
            b in "[a\\x00\u{FFFF}0]{0,8}",
            c in "[a\\x00\u{FFFF}0]{0,8}",
        ) {
            prop_assert_eq!(unescape(escape(&a).into_owned()).unwrap(), a.clone());
            prop_assert!(!escape(&a).contains('\0'));
            let whole = format!("{a}{b}{c}");
            prop_assert!(escape(&whole).starts_with(escape(&a).as_ref()));
            prop_assert!(escape(&whole).contains(escape(&b).as_ref()));
            prop_assert_eq!(escape(&b).starts_with(escape(&a).as_ref()), b.starts_with(&a));
        }
    }
}
