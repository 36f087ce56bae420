//! Words and terms in text: what the importance score compares and what the extractive
//! summarizer keeps. A *term* is something summaries usually lose and agents need back:
//! an identifier (`snake_case`, `camelCase`, `a::path`), a file path, a number, a flag.
//!
//! This is ctxwin's one definition of terms and stop words: the std archive's keyword index
//! builds on [`is_term`] and [`is_stop_word`].

/// Common English words that are never terms, keywords or content words, even when
/// capitalized at a sentence start: the one stop-word list of ctxwin (the std archive's keyword
/// index uses it too). Sorted and lower-case, for [`is_stop_word`]'s binary search.
///
/// ```
/// assert!(ctxwin_core::terms::STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
/// ```
#[rustfmt::skip]
pub const STOP_WORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as",
    "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by",
    "can", "could", "did", "do", "does", "doing", "done", "down", "during", "e.g", "each", "else",
    "etc", "even", "every", "few", "for", "from", "further", "get", "got", "had", "has", "have",
    "having", "he", "hello", "her", "here", "hers", "herself", "hi", "him", "himself", "his", "how",
    "however", "i", "i.e", "if", "in", "into", "is", "it", "its", "itself", "just", "let", "like",
    "made", "make", "many", "may", "me", "might", "more", "most", "much", "must", "my", "myself",
    "need", "next", "no", "nor", "not", "now", "of", "off", "ok", "okay", "on", "once", "one",
    "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "please", "same",
    "see", "she", "should", "so", "some", "such", "sure", "than", "thank", "thanks", "that", "the",
    "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those",
    "through", "to", "too", "under", "until", "up", "use", "very", "want", "was", "we", "well",
    "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with",
    "would", "yes", "yet", "you", "your", "yours", "yourself", "yourselves",
];

/// Whether `word` (ASCII case ignored) is one of the [`STOP_WORDS`].
///
/// ```
/// use ctxwin_core::terms::is_stop_word;
/// assert!(is_stop_word("The"));
/// assert!(!is_stop_word("parser"));
/// ```
pub fn is_stop_word(word: &str) -> bool {
    STOP_WORDS
        .binary_search_by(|stop| stop.bytes().cmp(word.bytes().map(|b| b.to_ascii_lowercase())))
        .is_ok()
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || !c.is_ascii()
        || matches!(c, '_' | '.' | '/' | ':' | '-' | '@' | '#' | '=')
}

/// Maximal runs of word-ish characters, with trailing sentence punctuation trimmed.
///
/// ```
/// let tokens: Vec<&str> = ctxwin_core::terms::tokens("Fix src/lib.rs: line 42.").collect();
/// assert_eq!(tokens, ["Fix", "src/lib.rs", "line", "42"]);
/// ```
pub fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !is_token_char(c))
        .map(|token| {
            token.trim_end_matches(['.', ':', '-', '=']).trim_start_matches(['-', ':', '='])
        })
        .filter(|token| !token.is_empty())
}

/// Whether `token` is a term: an identifier (`snake_case`, `camelCase`, `a::path`, `E0502`), a
/// file path, a number of two or more digits, or a kebab-case flag, worth keeping verbatim.
///
/// ```
/// use ctxwin_core::terms::is_term;
/// assert!(is_term("parse_header") && is_term("src/lexer.rs") && is_term("502"));
/// assert!(!is_term("parser") && !is_term("7"));
/// ```
pub fn is_term(token: &str) -> bool {
    let bytes = token.as_bytes();
    if bytes.len() < 2 {
        return false;
    }
    let digits = bytes.iter().filter(|b| b.is_ascii_digit()).count();
    let letters = bytes.iter().filter(|b| b.is_ascii_alphabetic()).count();
    let inner_upper = bytes.windows(2).any(|w| {
        w.first().is_some_and(u8::is_ascii_lowercase)
            && w.get(1).is_some_and(u8::is_ascii_uppercase)
    });
    let has = |byte: u8| bytes.contains(&byte);
    let path = has(b'/') || (has(b'.') && letters > 0 && !token.ends_with('.'));
    let kebab = letters >= 4 && has(b'-');
    digits >= 2
        || (digits > 0 && letters > 0)
        || has(b'_')
        || crate::small::contains(token, "::")
        || inner_upper
        || path
        || kebab
}

/// Whether `token` is a term only for its hyphen (`ctxwin-core`, but also `double-check`):
/// one hyphen between letters is as often English as an identifier.
pub(crate) fn is_hyphenated_word(token: &str) -> bool {
    token.bytes().filter(|&b| b == b'-').count() == 1
        && token.bytes().all(|b| b == b'-' || b.is_ascii_alphabetic())
}

/// Whether `token` is a content word: alphabetic, at least four letters, not a stop word.
///
/// ```
/// use ctxwin_core::terms::is_content_word;
/// assert!(is_content_word("database") && !is_content_word("these") && !is_content_word("db"));
/// ```
pub fn is_content_word(token: &str) -> bool {
    token.len() >= 4 && token.chars().all(crate::small::is_letter) && !is_stop_word(token)
}

/// The search words of `text`, as the archive's retrieval and the summaries match them: runs
/// of letters and digits (an apostrophe splits a word), with a possessive or contracted
/// ending dropped (`Caroline's`, `Caroline’s` and `dogs'` give `Caroline`, `dogs`; the lone
/// `s`, `t`, `ll`, `re`, `ve`, `d`, `m` after an apostrophe are not words).
///
/// ```
/// let words: Vec<&str> = ctxwin_core::terms::search_words("Caroline's dog (Max) isn’t 3.").collect();
/// assert_eq!(words, ["Caroline", "dog", "Max", "isn", "3"]);
/// ```
pub fn search_words(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    let mut had_word = false;
    core::iter::from_fn(move || {
        loop {
            let start = rest.find(char::is_alphanumeric)?;
            let gap = rest.get(..start).unwrap_or("");
            let attached = had_word && matches!(gap, "'" | "\u{2019}");
            let tail = rest.get(start..).unwrap_or("");
            let len = tail.find(|c: char| !c.is_alphanumeric()).unwrap_or(tail.len());
            let word = tail.get(..len).unwrap_or("");
            rest = tail.get(len..).unwrap_or("");
            had_word = true;
            if !(attached && is_clitic(word)) {
                return Some(word);
            }
        }
    })
}

/// Whether `word` is a clitic that follows an apostrophe (`s`, `t`, `ll`, `re`, `ve`, `d`, `m`).
fn is_clitic(word: &str) -> bool {
    ["s", "t", "ll", "re", "ve", "d", "m"].iter().any(|c| c.eq_ignore_ascii_case(word))
}

/// A light English stem of `word` (compare stems ignoring ASCII case): plural, `-ing`, `-ed`
/// and a final `y` are cut, so `stories`/`story`, `dogs`/`dog`, `painting`/`paints`/`painted`
/// meet. Always a prefix of `word`; words of three letters or fewer stay whole.
///
/// ```
/// use ctxwin_core::terms::stem;
/// assert_eq!(stem("stories"), stem("story"));
/// assert_eq!(stem("dogs"), "dog");
/// assert_eq!(stem("painting"), stem("painted"));
/// assert_eq!(stem("classes"), "class");
/// assert_eq!(stem("bus"), "bus");
/// ```
pub fn stem(word: &str) -> &str {
    let lower_ends = |suffix: &str| {
        word.len() > suffix.len()
            && word
                .get(word.len() - suffix.len()..)
                .is_some_and(|end| end.eq_ignore_ascii_case(suffix))
    };
    let cut = |n: usize| word.get(..word.len() - n).unwrap_or(word);
    if word.len() <= 3 || !word.is_ascii() {
        return word;
    }
    let mut out = word;
    if lower_ends("ies") {
        out = cut(3);
    } else if lower_ends("sses") || lower_ends("shes") || lower_ends("ches") || lower_ends("xes") {
        out = cut(2);
    } else if lower_ends("ing") && word.len() > 5 {
        out = cut(3);
    } else if lower_ends("ed") && word.len() > 4 {
        out = cut(2);
    } else if (lower_ends("s") && !lower_ends("ss") && !lower_ends("us") && !lower_ends("is"))
        || lower_ends("y")
    {
        out = cut(1);
    }
    // A doubled final consonant left by `-ing`/`-ed` (`running`, `planned`) is one.
    let bytes = out.as_bytes();
    if out.len() < word.len() && bytes.len() > 3 {
        if let [.., a, b] = bytes {
            if a == b && !matches!(a.to_ascii_lowercase(), b'l' | b's' | b'z' | b'e' | b'o') {
                return out.get(..out.len() - 1).unwrap_or(out);
            }
        }
    }
    out
}

/// Whether two words have the same [`stem`] (ASCII case ignored).
///
/// ```
/// assert!(ctxwin_core::terms::same_stem("Hobbies", "hobby"));
/// assert!(!ctxwin_core::terms::same_stem("cat", "car"));
/// ```
pub fn same_stem(a: &str, b: &str) -> bool {
    stem(a).eq_ignore_ascii_case(stem(b))
}

/// Common English irregular verbs, one row of forms each (base, past, participle; variants
/// after): stemming cannot join `take` and `taken`, `buy` and `bought`. Verbs whose forms are
/// all stop words (`be`, `have`, `do`) are left out. Sorted by base form.
#[rustfmt::skip]
const IRREGULAR_VERBS: &[&[&str]] = &[
    &["arise", "arose", "arisen"], &["awake", "awoke", "awoken"], &["bear", "bore", "born", "borne"],
    &["beat", "beaten"], &["become", "became"], &["begin", "began", "begun"], &["bend", "bent"],
    &["bet", "betting"], &["bid", "bidding"], &["bind", "bound"], &["bite", "bit", "bitten"],
    &["bleed", "bled"], &["blow", "blew", "blown"], &["break", "broke", "broken"],
    &["breed", "bred"], &["bring", "brought"], &["build", "built"], &["burn", "burnt"],
    &["buy", "bought"], &["catch", "caught"], &["choose", "chose", "chosen"], &["cling", "clung"],
    &["come", "came"], &["creep", "crept"], &["deal", "dealt"], &["dig", "dug"], &["draw", "drew", "drawn"],
    &["dream", "dreamt"], &["drink", "drank", "drunk"], &["drive", "drove", "driven"],
    &["eat", "ate", "eaten"], &["fall", "fell", "fallen"], &["feed", "fed"], &["feel", "felt"],
    &["fight", "fought"], &["find", "found"], &["flee", "fled"], &["fly", "flew", "flown"],
    &["forbid", "forbade", "forbidden"], &["forget", "forgot", "forgotten"],
    &["forgive", "forgave", "forgiven"], &["freeze", "froze", "frozen"], &["give", "gave", "given"],
    &["go", "went", "gone"], &["grind", "ground"], &["grow", "grew", "grown"], &["hang", "hung"],
    &["hear", "heard"], &["hide", "hid", "hidden"], &["hit", "hitting"], &["hold", "held"],
    &["hurt", "hurting"], &["keep", "kept"], &["kneel", "knelt"], &["know", "knew", "known"],
    &["lay", "laid"], &["lead", "led"], &["lean", "leant"], &["leap", "leapt"], &["learn", "learnt"],
    &["leave", "left"], &["lend", "lent"], &["lie", "lay", "lain"], &["light", "lit"],
    &["lose", "lost"], &["mean", "meant"], &["meet", "met"], &["pay", "paid"], &["prove", "proven"],
    &["quit", "quitting"], &["ride", "rode", "ridden"], &["ring", "rang", "rung"],
    &["rise", "rose", "risen"], &["run", "ran", "running"], &["say", "said"], &["seek", "sought"],
    &["sell", "sold"], &["send", "sent"], &["sew", "sewn"], &["shake", "shook", "shaken"],
    &["shine", "shone"], &["shoot", "shot"], &["show", "shown"], &["shrink", "shrank", "shrunk"],
    &["shut", "shutting"], &["sing", "sang", "sung"], &["sink", "sank", "sunk"], &["sit", "sat"],
    &["sleep", "slept"], &["slide", "slid"], &["speak", "spoke", "spoken"], &["speed", "sped"],
    &["spend", "spent"], &["spin", "spun"], &["split", "splitting"], &["spread", "spreading"],
    &["spring", "sprang", "sprung"], &["stand", "stood"], &["steal", "stole", "stolen"],
    &["stick", "stuck"], &["sting", "stung"], &["stink", "stank", "stunk"], &["strike", "struck"],
    &["swear", "swore", "sworn"], &["sweep", "swept"], &["swim", "swam", "swum"],
    &["swing", "swung"], &["take", "took", "taken"], &["teach", "taught"], &["tear", "tore", "torn"],
    &["tell", "told"], &["think", "thought"], &["throw", "threw", "thrown"],
    &["understand", "understood"], &["wake", "woke", "woken"], &["wear", "wore", "worn"],
    &["weave", "wove", "woven"], &["weep", "wept"], &["win", "won"], &["wind", "wound"],
    &["write", "wrote", "written"],
];

/// The other forms of an irregular English verb (`took` gives `take`, `took`, `taken`): what a
/// search for one form should also match. Empty for any other word. ASCII case is ignored.
///
/// ```
/// use ctxwin_core::terms::verb_forms;
/// assert_eq!(verb_forms("Taken"), ["take", "took", "taken"]);
/// assert_eq!(verb_forms("bought"), ["buy", "bought"]);
/// assert!(verb_forms("adopted").is_empty());
/// ```
pub fn verb_forms(word: &str) -> &'static [&'static str] {
    IRREGULAR_VERBS
        .iter()
        .find(|forms| forms.iter().any(|form| form.eq_ignore_ascii_case(word)))
        .copied()
        .unwrap_or(&[])
}

/// FNV-1a over the ASCII-lowercased bytes: the same word in any case hashes the same.
pub(crate) fn hash(token: &str) -> u32 {
    token.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte.to_ascii_lowercase())).wrapping_mul(0x0100_0193)
    })
}

/// Up to four distinct 16-bit term hashes (0 = empty slot), stored in a message's header for
/// cheap "does this come up again later" checks.
pub(crate) fn key_terms<'a>(texts: impl IntoIterator<Item = &'a str>) -> [u16; 4] {
    let mut out = [0u16; 4];
    let mut filled = 0usize;
    for token in texts.into_iter().flat_map(tokens).filter(|t| is_term(t)) {
        let short = (hash(token) as u16).max(1);
        if out.contains(&short) {
            continue;
        }
        if let Some(slot) = out.get_mut(filled) {
            *slot = short;
            filled += 1;
        } else {
            break;
        }
    }
    out
}

/// Whether two key-term sets share a term.
pub(crate) fn share_a_term(a: &[u16; 4], b: &[u16; 4]) -> bool {
    a.iter().any(|&x| x != 0 && b.contains(&x))
}

/// The content words of a task text, as hashes (at most 16).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WordSet {
    hashes: [u32; 16],
    len: usize,
}

impl WordSet {
    pub(crate) fn of(text: &str) -> Self {
        let mut set = WordSet::default();
        for token in tokens(text).filter(|t| is_content_word(t) || is_term(t)) {
            let h = hash(token);
            if set.contains(h) {
                continue;
            }
            match set.hashes.get_mut(set.len) {
                Some(slot) => {
                    *slot = h;
                    set.len += 1;
                }
                None => break,
            }
        }
        set
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn contains(&self, h: u32) -> bool {
        self.hashes.get(..self.len).is_some_and(|hashes| hashes.contains(&h))
    }

    /// How many of this set's words `text` contains, out of [`len`](Self::len).
    pub(crate) fn found_in<'a>(&self, texts: impl IntoIterator<Item = &'a str>) -> usize {
        let mut seen = 0u16;
        for token in texts.into_iter().flat_map(tokens) {
            let h = hash(token);
            if let Some(at) =
                self.hashes.get(..self.len).and_then(|hs| hs.iter().position(|&x| x == h))
            {
                seen |= 1 << at;
            }
        }
        seen.count_ones() as usize
    }

    /// [`found_in`](Self::found_in) for two sets in one pass over `texts` (each token hashed
    /// once).
    #[cfg(feature = "tasks")]
    pub(crate) fn found_in_each<'a>(
        sets: [&WordSet; 2],
        texts: impl IntoIterator<Item = &'a str>,
    ) -> [usize; 2] {
        let mut seen = [0u16; 2];
        for token in texts.into_iter().flat_map(tokens) {
            let h = hash(token);
            for (set, seen) in sets.iter().zip(seen.iter_mut()) {
                if let Some(at) =
                    set.hashes.get(..set.len).and_then(|hs| hs.iter().position(|&x| x == h))
                {
                    *seen |= 1 << at;
                }
            }
        }
        seen.map(|s| s.count_ones() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irregular_verbs_are_sorted_and_each_form_has_one_row() {
        assert!(IRREGULAR_VERBS.windows(2).all(|w| w[0][0] < w[1][0]));
        for forms in IRREGULAR_VERBS {
            assert!(forms.len() >= 2);
            for form in *forms {
                // `lay` is both a base form and the past of `lie`: the first row wins.
                if *form != "lay" {
                    assert_eq!(verb_forms(form), *forms, "{form}");
                }
            }
        }
    }

    #[test]
    fn recognises_terms() {
        for term in [
            "src/main.rs",
            "parse_config",
            "HashMap",
            "42",
            "v1.2",
            "a::b",
            "x86_64",
            "ctxwin-core",
        ] {
            let token = tokens(term).next().unwrap();
            assert!(is_term(token), "{term} -> {token}");
        }
        for word in ["the", "running", "Hello", "a", "I", "done."] {
            assert!(!is_term(word), "{word}");
        }
    }

    #[test]
    fn tokens_trim_sentence_punctuation() {
        let found: Vec<&str> =
            tokens("Opened src/lib.rs. Then ran `cargo test`: 3 failed.").collect();
        assert_eq!(found, ["Opened", "src/lib.rs", "Then", "ran", "cargo", "test", "3", "failed"]);
    }

    #[test]
    fn key_terms_are_distinct_and_case_blind() {
        let terms =
            key_terms(["Read SRC/lib.rs and src/lib.rs, then parse_config twice: parse_config"]);
        assert_eq!(terms.iter().filter(|&&t| t != 0).count(), 2);
        assert!(share_a_term(&terms, &key_terms(["parse_config failed"])));
        assert!(!share_a_term(&terms, &key_terms(["nothing here"])));
    }

    #[test]
    fn word_sets_measure_overlap() {
        let task = WordSet::of("Fix the failing parser tests in src/parser.rs");
        assert_eq!(task.len(), 4);
        assert_eq!(task.found_in(["the parser tests pass now"]), 2);
        assert_eq!(task.found_in(["unrelated chatter"]), 0);
    }
    #[test]
    fn search_words_drop_possessives_and_clitics() {
        let words: Vec<&str> =
            search_words("Caroline's and James’ dogs; we'll see, O'Brien's I'm 7's").collect();
        assert_eq!(
            words,
            ["Caroline", "and", "James", "dogs", "we", "see", "O", "Brien", "I", "7"]
        );
    }

    #[test]
    fn stems_meet_across_forms() {
        for (a, b) in
            [("running", "run"), ("planned", "plan"), ("hobbies", "hobby"), ("boxes", "box")]
        {
            assert!(same_stem(a, b), "{a} {b} -> {} {}", stem(a), stem(b));
        }
        assert_eq!(stem("Stories"), "Stor");
    }
}
