//! Retrieval: BM25 full-text search over messages and summaries, and keyword lookups.

use ctxwin_core::Role;

use super::error::{ArchiveError, from_sql_int};
use super::{Archive, keywords, sql_limit};

/// Query words beyond this many are ignored (bounds the cost of a pasted paragraph).
const MAX_QUERY_TERMS: usize = 32;

/// Tokens of context around the match in a snippet.
const SNIPPET_TOKENS: i64 = 16;

/// One message found by [`Archive::search`].
#[derive(Clone, Debug, PartialEq)]
pub struct SearchHit {
    /// Session the message belongs to.
    pub session: String,
    /// Message id.
    pub id: u64,
    /// Unit id.
    pub unit: u64,
    /// Author.
    pub role: Role,
    /// Caller's timestamp (ms).
    pub timestamp: u64,
    /// The stored content (reduced form if the message was reduced).
    pub content: String,
    /// A short excerpt around the match, matched words in `«»`.
    pub snippet: String,
    /// Relevance: the negated BM25 rank, so higher is better.
    pub score: f64,
}

/// One summary found by [`Archive::search_summaries`].
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryHit {
    /// Session the summary belongs to.
    pub session: String,
    /// Summary id (give it to [`Archive::drill_down`]).
    pub id: u64,
    /// Hierarchy level.
    pub level: u8,
    /// The summary text.
    pub text: String,
    /// Relevance: the negated BM25 rank, so higher is better.
    pub score: f64,
}

/// One message holding a keyword, from [`Archive::by_keyword`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeywordHit {
    /// Session.
    pub session: String,
    /// Message id.
    pub id: u64,
    /// Unit id.
    pub unit: u64,
    /// How often the keyword occurs in the message.
    pub count: u32,
}

/// A keyword and how many messages hold it, from [`Archive::keyword_counts`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeywordCount {
    /// The keyword (lower-case).
    pub keyword: String,
    /// Messages that hold it.
    pub messages: u64,
}

/// Turns plain user words into an FTS5 query that cannot fail to parse. Words are the core's
/// one definition, [`ctxwin_core::terms::search_words`] (letters and digits; possessives and
/// clitics dropped, so `Caroline's` searches `Caroline`); each becomes a quoted term (FTS5
/// operators lose their meaning), words with the same [`stem`](ctxwin_core::terms::stem) count
/// once, and they are OR-ed so BM25 ranks the messages matching most of them first. Stop words
/// are dropped when other words remain. The index stems with Porter, so `dogs` finds `dog`;
/// an irregular verb also searches its other forms ([`ctxwin_core::terms::verb_forms`]).
/// `None` when nothing is left to search for.
pub(crate) fn fts_query(user: &str) -> Option<String> {
    let mut terms: Vec<&str> = Vec::new();
    for chunk in user.split_whitespace() {
        let core = chunk.trim_matches(|c: char| !c.is_alphanumeric());
        let core =
            core.strip_suffix("'s").or_else(|| core.strip_suffix("\u{2019}s")).unwrap_or(core);
        // A path or identifier (`src/lib.rs`, `col:val`) stays one phrase.
        let joined = core.contains(|c: char| !c.is_alphanumeric() && c != '\'' && c != '\u{2019}');
        let words: Vec<&str> =
            if joined { vec![core] } else { ctxwin_core::terms::search_words(chunk).collect() };
        for word in words {
            // An irregular verb brings its other forms (`take` finds `taken`, `took`).
            let forms = ctxwin_core::terms::verb_forms(word);
            for word in core::iter::once(word).chain(forms.iter().copied()) {
                if !terms.iter().any(|t| ctxwin_core::terms::same_stem(t, word)) {
                    terms.push(word);
                }
            }
        }
    }
    if terms.iter().any(|t| !keywords::is_stop_word(t)) {
        terms.retain(|t| !keywords::is_stop_word(t));
    }
    terms.truncate(MAX_QUERY_TERMS);
    if terms.is_empty() {
        return None;
    }
    let quoted: Vec<String> =
        terms.iter().map(|t| format!("\"{}\"", t.replace('"', "\"\""))).collect();
    Some(quoted.join(" OR "))
}

/// `fts` (a [`fts_query`]) limited to the message text columns: the index's `session_id`
/// column is matched only by [`in_session`].
fn in_text(fts: &str) -> String {
    format!("{{content tool_text original}} : ({fts})")
}

/// `fts` limited to the message text of session `session_id` (the index intersects the
/// session's postings with the words').
fn in_session(fts: &str, session_id: i64) -> String {
    format!("session_id : \"{session_id}\" AND {}", in_text(fts))
}

/// The session filter for a query: `Some(None)` = all sessions, `Some(Some(id))` = that
/// session, `None` = a session that has stored nothing (so nothing can match).
fn session_filter(
    archive: &Archive,
    session: Option<&str>,
) -> Result<Option<Option<i64>>, ArchiveError> {
    match session {
        None => Ok(Some(None)),
        Some(name) => Ok(archive.session_id(name)?.map(Some)),
    }
}

impl Archive {
    /// Finds messages whose content, tool calls (names and arguments) or original text match
    /// the words of `query`, best first (BM25), in `session` or in all sessions.
    ///
    /// `query` is plain user text: FTS5 syntax in it is treated as words, so no input makes
    /// this fail; a query with no words gives no hits.
    ///
    /// # Examples
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    ///
    /// let mut archive = Archive::open_in_memory()?;
    /// archive.store_unit("s", &[ArchivedMessage::new(1, 1,
    ///     ChatMessage::text(Role::User, "the tokenizer drops emoji"))])?;
    /// archive.store_unit("s", &[ArchivedMessage::new(2, 2,
    ///     ChatMessage::text(Role::User, "deploy to staging"))])?;
    /// let hits = archive.search(Some("s"), "emoji \"* AND -x (", 10)?;
    /// assert_eq!(hits.len(), 1);
    /// assert_eq!(hits[0].id, 1);
    /// assert!(hits[0].snippet.contains("«emoji»"));
    /// assert!(archive.search(None, "  ", 10)?.is_empty());
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn search(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, ArchiveError> {
        let (Some(fts), Some(filter)) = (fts_query(query), session_filter(self, session)?) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        // In one session the index matches that session's rows only (its postings intersected
        // with the words'), and each row is checked against the session again: the scope is
        // the query's, never a filter of every session's best matches.
        let matched = match filter {
            Some(id) => in_session(&fts, id),
            None => in_text(&fts),
        };
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(
            "SELECT s.name, m.id, m.unit, m.role, m.timestamp, m.content,
                    snippet(messages_fts, -1, '«', '»', '…', ?4),
                    bm25(messages_fts, 1.0, 1.0, 1.0, 0.0) AS rank
             FROM messages_fts
             JOIN messages m ON m.pk = messages_fts.rowid
             JOIN sessions s ON s.id = m.session_id
             WHERE messages_fts MATCH ?1 AND (?2 IS NULL OR m.session_id = ?2)
             ORDER BY rank, m.id LIMIT ?3",
        )?;
        let mut rows =
            stmt.query(rusqlite::params![matched, filter, sql_limit(limit), SNIPPET_TOKENS])?;
        let mut hits = Vec::new();
        while let Some(row) = rows.next()? {
            let role_name: String = row.get(3)?;
            let rank: f64 = row.get(7)?;
            hits.push(SearchHit {
                session: row.get(0)?,
                id: from_sql_int("message id", row.get(1)?)?,
                unit: from_sql_int("unit id", row.get(2)?)?,
                role: Role::parse(&role_name)
                    .ok_or_else(|| ArchiveError::Corrupt(format!("unknown role {role_name:?}")))?,
                timestamp: from_sql_int("timestamp", row.get(4)?)?,
                content: row.get(5)?,
                snippet: row.get(6)?,
                score: -rank,
            });
        }
        tracing::trace!(query, hits = hits.len(), "archive: search");
        Ok(hits)
    }

    /// Like [`search`](Self::search) in one session, without snippets (cheaper): what
    /// retrieval ranks. BM25 is SQLite FTS5's (`k1 = 1.2`, `b = 0.75`, every column weighted 1).
    ///
    /// # Errors
    /// SQLite errors.
    pub fn rank(
        &self,
        session: &str,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SearchHit>, ArchiveError> {
        let (Some(fts), Some(Some(filter))) =
            (fts_query(query), session_filter(self, Some(session))?)
        else {
            return Ok(Vec::new());
        };
        let conn = self.read_conn();
        // The session's own matches only (not the best of every session's, filtered after),
        // each row checked against the session before the limit: an index entry that names
        // the session wrongly (the index is a copy) can neither hand over another session's
        // message nor push the session's own out.
        let mut stmt = conn.prepare_cached(
            "SELECT m.id, m.unit, m.role, m.timestamp, m.content,
                    bm25(messages_fts, 1.0, 1.0, 1.0, 0.0) AS rank
             FROM messages_fts JOIN messages m ON m.pk = messages_fts.rowid
             WHERE messages_fts MATCH ?1 AND m.session_id = ?3
             ORDER BY rank, m.id LIMIT ?2",
        )?;
        let mut rows =
            stmt.query(rusqlite::params![in_session(&fts, filter), sql_limit(limit), filter])?;
        let mut hits = Vec::new();
        while let Some(row) = rows.next()? {
            let role_name: String = row.get(2)?;
            let rank: f64 = row.get(5)?;
            hits.push(SearchHit {
                session: session.to_string(),
                id: from_sql_int("message id", row.get(0)?)?,
                unit: from_sql_int("unit id", row.get(1)?)?,
                role: Role::parse(&role_name)
                    .ok_or_else(|| ArchiveError::Corrupt(format!("unknown role {role_name:?}")))?,
                timestamp: from_sql_int("timestamp", row.get(3)?)?,
                content: row.get(4)?,
                snippet: String::new(),
                score: -rank,
            });
        }
        Ok(hits)
    }

    /// Messages `ids` of `session` that are archived, in id order (one query; retrieval's
    /// neighbouring turns).
    ///
    /// # Errors
    /// SQLite errors.
    pub fn get_many(
        &self,
        session: &str,
        ids: &[u64],
    ) -> Result<Vec<super::ArchivedMessage>, ArchiveError> {
        let list: Vec<String> =
            ids.iter().filter(|&&id| i64::try_from(id).is_ok()).map(u64::to_string).collect();
        if list.is_empty() {
            return Ok(Vec::new());
        }
        let conn = self.read_conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {} FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = ?1 AND m.id IN ({}) ORDER BY m.id",
            super::MESSAGE_COLUMNS,
            list.join(",")
        ))?;
        let mut rows = stmt.query([session])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(super::decode_message(row)?);
        }
        Ok(out)
    }

    /// Finds summaries whose text matches the words of `query`, best first; same query rules as
    /// [`Archive::search`].
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, SummaryRecord};
    /// let mut archive = Archive::open_in_memory()?;
    /// archive.store_summary("s", &SummaryRecord::new(50, 1, "migrated the schema to v2", vec![]))?;
    /// let hits = archive.search_summaries(Some("s"), "schema", 5)?;
    /// assert_eq!(hits[0].id, 50);
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn search_summaries(
        &self,
        session: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SummaryHit>, ArchiveError> {
        let (Some(fts), Some(filter)) = (fts_query(query), session_filter(self, session)?) else {
            return Ok(Vec::new());
        };
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(
            "SELECT s.name, u.id, u.level, u.text, bm25(summaries_fts)
             FROM summaries_fts
             JOIN summaries u ON u.pk = summaries_fts.rowid
             JOIN sessions s ON s.id = u.session_id
             WHERE summaries_fts MATCH ?1 AND (?2 IS NULL OR u.session_id = ?2)
             ORDER BY bm25(summaries_fts), u.id LIMIT ?3",
        )?;
        let mut rows = stmt.query(rusqlite::params![fts, filter, sql_limit(limit)])?;
        let mut hits = Vec::new();
        while let Some(row) = rows.next()? {
            let level: i64 = row.get(2)?;
            let rank: f64 = row.get(4)?;
            hits.push(SummaryHit {
                session: row.get(0)?,
                id: from_sql_int("summary id", row.get(1)?)?,
                level: u8::try_from(level)
                    .map_err(|_| ArchiveError::Corrupt(format!("summary level {level}")))?,
                text: row.get(3)?,
                score: -rank,
            });
        }
        Ok(hits)
    }

    /// Messages holding `keyword` (matched case-insensitively against the extracted
    /// keywords), most occurrences first, then newest first.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut archive = Archive::open_in_memory()?;
    /// archive.store_unit("s", &[ArchivedMessage::new(1, 1,
    ///     ChatMessage::text(Role::User, "edit src/lib.rs and src/lib.rs again"))])?;
    /// let hits = archive.by_keyword(Some("s"), "SRC/LIB.RS", 10)?;
    /// assert_eq!((hits[0].id, hits[0].count), (1, 2));
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn by_keyword(
        &self,
        session: Option<&str>,
        keyword: &str,
        limit: usize,
    ) -> Result<Vec<KeywordHit>, ArchiveError> {
        let Some(filter) = session_filter(self, session)? else { return Ok(Vec::new()) };
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(
            "SELECT s.name, m.id, m.unit, k.count
             FROM keywords k
             JOIN messages m ON m.pk = k.message_pk
             JOIN sessions s ON s.id = m.session_id
             WHERE k.keyword = ?1 AND (?2 IS NULL OR m.session_id = ?2)
             ORDER BY k.count DESC, m.pk DESC LIMIT ?3",
        )?;
        let mut rows =
            stmt.query(rusqlite::params![keyword.to_lowercase(), filter, sql_limit(limit)])?;
        let mut hits = Vec::new();
        while let Some(row) = rows.next()? {
            let count: i64 = row.get(3)?;
            hits.push(KeywordHit {
                session: row.get(0)?,
                id: from_sql_int("message id", row.get(1)?)?,
                unit: from_sql_int("unit id", row.get(2)?)?,
                count: u32::try_from(count)
                    .map_err(|_| ArchiveError::Corrupt(format!("keyword count {count}")))?,
            });
        }
        Ok(hits)
    }

    /// The `limit` keywords held by the most messages, in `session` or all sessions.
    ///
    /// ```
    /// use ctxwin_std::archive::{Archive, ArchivedMessage};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut archive = Archive::open_in_memory()?;
    /// for (i, text) in ["fix parse_header", "test parse_header", "ship v2"].iter().enumerate() {
    ///     let id = i as u64 + 1;
    ///     archive.store_unit("s", &[ArchivedMessage::new(id, id, ChatMessage::text(Role::User, *text))])?;
    /// }
    /// let top = archive.keyword_counts(Some("s"), 1)?;
    /// assert_eq!((top[0].keyword.as_str(), top[0].messages), ("parse_header", 2));
    /// # Ok::<(), ctxwin_std::archive::ArchiveError>(())
    /// ```
    pub fn keyword_counts(
        &self,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<KeywordCount>, ArchiveError> {
        let Some(filter) = session_filter(self, session)? else { return Ok(Vec::new()) };
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(
            "SELECT k.keyword, count(*) AS n
             FROM keywords k JOIN messages m ON m.pk = k.message_pk
             WHERE ?1 IS NULL OR m.session_id = ?1
             GROUP BY k.keyword ORDER BY n DESC, k.keyword LIMIT ?2",
        )?;
        let mut rows = stmt.query(rusqlite::params![filter, sql_limit(limit)])?;
        let mut counts = Vec::new();
        while let Some(row) = rows.next()? {
            counts.push(KeywordCount {
                keyword: row.get(0)?,
                messages: from_sql_int("keyword count", row.get(1)?)?,
            });
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quotes_every_word_and_ors_them() {
        assert_eq!(fts_query("lexer panic").as_deref(), Some(r#""lexer" OR "panic""#));
        assert_eq!(fts_query(r#"say "parser""#).as_deref(), Some(r#""say" OR "said" OR "parser""#));
        // Irregular verbs search their other forms.
        assert_eq!(
            fts_query("What hobby did Sofia take up?").as_deref(),
            Some(r#""hobby" OR "Sofia" OR "take" OR "took" OR "taken""#)
        );
        assert_eq!(fts_query("col:val -x").as_deref(), Some(r#""col:val" OR "x""#));
        assert_eq!(fts_query("Caroline's dogs, dog").as_deref(), Some(r#""Caroline" OR "dogs""#));
    }

    #[test]
    fn drops_stop_words_unless_nothing_else_is_left() {
        assert_eq!(fts_query("what about the parser").as_deref(), Some(r#""parser""#));
        assert_eq!(fts_query("the THE").as_deref(), Some(r#""the""#));
    }

    #[test]
    fn no_words_no_query() {
        assert_eq!(fts_query(""), None);
        assert_eq!(fts_query(" * \" - ( ) :: "), None);
    }

    #[test]
    fn a_session_ranks_its_own_matches_however_many_other_sessions_match() {
        let mut archive = Archive::open_in_memory().unwrap();
        let row = |id: u64, text: String| {
            super::super::ArchivedMessage::new(
                id,
                id,
                super::super::ChatMessage::text(Role::User, text),
            )
        };
        for session in 0..30 {
            let rows: Vec<_> = (1..=20)
                .map(|id| row(id, format!("the build of service {session} passed, run {id}")))
                .collect();
            archive.store_messages(&format!("s{session}"), &rows).unwrap();
        }
        archive.store_messages("mine", &[row(1, "the build broke on arm64".into())]).unwrap();
        // A session id is not a word of the text: "7" finds the text's 7s, not session 7's rows.
        let hits = archive.rank("mine", "build", 5).unwrap();
        assert_eq!(hits.len(), 1, "{hits:?}");
        assert_eq!(hits[0].content, "the build broke on arm64");
        let hits = archive.rank("s3", "build 7", 25).unwrap();
        assert_eq!(hits.len(), 20);
        assert!(hits[0].content.ends_with("run 7"), "{hits:?}");
        let all = archive.search(None, "7", 100).unwrap();
        assert!(all.iter().all(|h| h.content.contains('7')), "{all:?}");
    }

    #[test]
    fn a_session_search_returns_and_ranks_only_its_own_rows() {
        let mut archive = Archive::open_in_memory().unwrap();
        let row = |id: u64, text: &str| {
            super::super::ArchivedMessage::new(
                id,
                id,
                super::super::ChatMessage::text(Role::User, text),
            )
        };
        // Another session's rows match every word, and better (short, repeated): ranked with
        // them, the session's one match would fall below any limit.
        let theirs: Vec<_> =
            (1..=300).map(|id| row(id, "balance code KESTREL balance code KESTREL")).collect();
        archive.store_messages("theirs", &theirs).unwrap();
        archive
            .store_messages("mine", &[row(1, "the account balance was checked on the first day")])
            .unwrap();
        let only_mine = |archive: &Archive| {
            for limit in [1, 5, 500] {
                let ranked = archive.rank("mine", "balance code KESTREL", limit).unwrap();
                let found = archive.search(Some("mine"), "balance code KESTREL", limit).unwrap();
                for hits in [ranked, found] {
                    assert_eq!(hits.len(), 1, "limit {limit}: {hits:?}");
                    assert_eq!(hits[0].session, "mine");
                    assert!(hits[0].content.starts_with("the account balance"), "{hits:?}");
                }
            }
            assert!(archive.rank("nobody", "balance", 5).unwrap().is_empty());
            assert!(archive.search(Some("nobody"), "balance", 5).unwrap().is_empty());
        };
        only_mine(&archive);
        // An index entry naming the wrong session (the full-text index is a copy of the rows):
        // the row itself is checked, so another session's message is still never returned.
        let conn = archive.conn_for_tests();
        conn.execute_batch(
            "INSERT INTO messages_fts (rowid, content, tool_text, original, session_id)
             SELECT m.pk, m.content, m.tool_text, m.original, (SELECT id FROM sessions WHERE name = 'mine')
             FROM messages m JOIN sessions s ON s.id = m.session_id WHERE s.name = 'theirs' LIMIT 3",
        )
        .unwrap();
        drop(conn);
        only_mine(&archive);
    }

    #[test]
    fn a_search_on_the_read_connection_does_not_wait_for_a_write_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let mut archive = Archive::open(&path).unwrap().with_read_connections(2).unwrap();
        let text = super::super::ChatMessage::text(Role::User, "staging runs Postgres 16");
        archive.store_unit("s", &[super::super::ArchivedMessage::new(1, 1, text)]).unwrap();
        // A writer holding the shared connection, as the archive's writer thread does for a
        // transaction of many sessions' rows.
        let held = archive.conn_for_tests();
        held.execute_batch("BEGIN IMMEDIATE; DELETE FROM keywords;").unwrap();
        let reader = archive.clone();
        // Two searches at once: one on each read connection, or one waiting for the other.
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let (reader, tx) = (reader.clone(), tx.clone());
            std::thread::spawn(move || {
                let _ = tx.send(reader.search(Some("s"), "postgres", 5).map(|hits| hits.len()));
            });
        }
        let found: Vec<_> =
            (0..3).map(|_| rx.recv_timeout(std::time::Duration::from_secs(5))).collect();
        held.execute_batch("ROLLBACK").unwrap();
        drop(held);
        for found in found {
            assert_eq!(found.expect("a search waited for the writer").unwrap(), 1);
        }
        // Without a file (an in-memory archive), it is the same handle as before.
        let memory = Archive::open_in_memory().unwrap().with_read_connections(2).unwrap();
        assert!(memory.readers.is_none());
    }

    proptest! {
        #[test]
        fn any_input_is_a_valid_fts5_query(query in any::<String>()) {
            let mut archive = Archive::open_in_memory().unwrap();
            let text = super::super::ChatMessage::text(Role::User, "AND OR NOT NEAR col:val \"x\" *");
            archive.store_unit("s", &[super::super::ArchivedMessage::new(1, 1, text)]).unwrap();
            prop_assert!(archive.search(None, &query, 5).is_ok());
            prop_assert!(archive.search_summaries(None, &query, 5).is_ok());
        }
    }
}
