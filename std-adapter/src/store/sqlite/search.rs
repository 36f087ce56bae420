//! Retrieval: BM25 full-text search over messages and summaries.

use super::error::{Failure, Sql, from_sql_int};
use super::{SqliteArchive, decode_unverified, row_name, sql_limit};
use crate::store::types::normalise;
use crate::store::{Scope, SearchHit, SearchQuery, StoreError, SummaryHit, checksum};
use ctxwin_core::terms::is_stop_word;

/// Query words beyond this many are ignored (bounds the cost of a pasted paragraph).
const MAX_QUERY_TERMS: usize = 32;

/// Tokens of context around the match in a snippet.
const SNIPPET_TOKENS: i64 = 16;

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
    if terms.iter().any(|t| !is_stop_word(t)) {
        terms.retain(|t| !is_stop_word(t));
    }
    terms.truncate(MAX_QUERY_TERMS);
    if terms.is_empty() {
        return None;
    }
    let quoted: Vec<String> =
        terms.iter().map(|t| format!("\"{}\"", t.replace('"', "\"\""))).collect();
    Some(quoted.join(" OR "))
}

/// `fts` limited to the message text of session `session_id` (the index intersects the
/// session's postings with the words': only the text columns are searched for the words, the
/// `session_id` column only for the session).
fn in_session(fts: &str, session_id: i64) -> String {
    format!("session_id : \"{session_id}\" AND {{content tool_text original}} : ({fts})")
}

/// `fts` limited to the summaries of session `session_id`.
fn summaries_in_session(fts: &str, session_id: i64) -> String {
    format!("session_id : \"{session_id}\" AND text : ({fts})")
}

/// The columns of a hit: those of [`super::MESSAGE_COLUMNS`] with the original text and raw
/// JSON left out (NULL: a search verifies the head of each row's checksum and serves none of
/// them), then the rank.
const HIT_COLUMNS: &str = "m.id, m.unit, m.level, m.role, m.content, m.tool_calls, \
     m.tool_call_id, NULL, m.timestamp, m.tokens, m.name, m.is_error, NULL, m.checksum";

/// A hit of `scope` from a row selected with [`HIT_COLUMNS`], its rank at column 14 and its
/// snippet (if any) at 15; the head of its checksum verified.
fn decode_hit(scope: &Scope, row: &rusqlite::Row<'_>, snippets: bool) -> Sql<SearchHit> {
    let decoded = decode_unverified(scope, row)?;
    let stored: Option<i64> = row.get(13)?;
    let computed = checksum::message_head(scope, &decoded);
    match stored {
        Some(stored) if checksum::head(stored as u64) == computed => {}
        Some(stored) => {
            return Err(Failure(checksum::mismatch(
                row_name(scope, decoded.id),
                stored as u64 >> 32,
                u64::from(computed),
            )));
        }
        None => {
            return Err(Failure(StoreError::damaged(
                row_name(scope, decoded.id),
                "its checksum is missing",
            )));
        }
    }
    let rank: f64 = row.get(14)?;
    Ok(SearchHit {
        id: decoded.id,
        unit: decoded.unit,
        role: decoded.message.role,
        timestamp: decoded.timestamp,
        content: decoded.message.content,
        snippet: if snippets { row.get(15)? } else { String::new() },
        score: -rank,
    })
}

impl SqliteArchive {
    pub(super) fn search_sql(&self, scope: &Scope, query: &SearchQuery<'_>) -> Sql<Vec<SearchHit>> {
        let Some(fts) = fts_query(query.text) else { return Ok(Vec::new()) };
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let Some(session_id) = self.session_id(scope)? else { return Ok(Vec::new()) };
        self.index_waiting(session_id)?;
        let matched = in_session(&fts, session_id);
        let ranked = if query.snippets {
            None
        } else {
            self.ranked_in_index(scope, &matched, session_id, query.limit)?
        };
        let mut hits = match ranked {
            Some(hits) => hits,
            None => self.ranked_after_join(scope, &matched, session_id, query)?,
        };
        let mut scores: Vec<f64> = hits.iter().map(|hit| hit.score).collect();
        normalise(&mut scores);
        for (hit, score) in hits.iter_mut().zip(scores) {
            hit.score = score;
        }
        tracing::trace!(query = query.text, hits = hits.len(), "archive: search");
        Ok(hits)
    }

    /// The common case, cheap: the index ranks its own entries for the session and only the
    /// best `limit` are joined to their rows (ranking after the join carries every matching
    /// row's columns through the sort: about a tenth more of a search's work on a
    /// 10,000-message session). `None` when an entry does not lead to a row of the session (a
    /// damaged index: the index is a copy of the rows): then [`Self::ranked_after_join`]
    /// decides, so such an entry can neither hand over another session's message nor push the
    /// session's own out.
    /// Puts the rows of session `session_id` still waiting for the full-text index into it
    /// ([`index_when_searched`](SqliteArchive::index_when_searched)): setting their mark
    /// makes the update trigger index them. Nothing is written when none waits (one read of
    /// a partial index).
    fn index_waiting(&self, session_id: i64) -> Sql<()> {
        let waiting: bool = self.read_conn().query_row(
            "SELECT EXISTS (SELECT 1 FROM messages WHERE session_id = ?1 AND indexed = 0)",
            [session_id],
            |row| row.get(0),
        )?;
        if !waiting {
            return Ok(());
        }
        let _turn = super::write_turn(&self.gate);
        self.conn().execute(
            "UPDATE messages SET indexed = 1 WHERE session_id = ?1 AND indexed = 0",
            [session_id],
        )?;
        Ok(())
    }

    fn ranked_in_index(
        &self,
        scope: &Scope,
        matched: &str,
        session_id: i64,
        limit: usize,
    ) -> Sql<Option<Vec<SearchHit>>> {
        let conn = self.read_conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {HIT_COLUMNS}, r.rank, m.session_id
             FROM (SELECT rowid, bm25(messages_fts, 1.0, 1.0, 1.0, 0.0) AS rank
                   FROM messages_fts WHERE messages_fts MATCH ?1
                   ORDER BY rank, rowid LIMIT ?2) r
             LEFT JOIN messages m ON m.pk = r.rowid
             ORDER BY r.rank, m.id"
        ))?;
        let mut rows = stmt.query(rusqlite::params![matched, sql_limit(limit)])?;
        let mut hits = Vec::new();
        while let Some(row) = rows.next()? {
            if row.get::<_, Option<i64>>(15)? != Some(session_id) {
                return Ok(None);
            }
            hits.push(decode_hit(scope, row, false)?);
        }
        Ok(Some(hits))
    }

    /// Every match joined to its row and checked against the session before the limit: the
    /// search with snippets, and the fallback of [`Self::ranked_in_index`].
    fn ranked_after_join(
        &self,
        scope: &Scope,
        matched: &str,
        session_id: i64,
        query: &SearchQuery<'_>,
    ) -> Sql<Vec<SearchHit>> {
        let conn = self.read_conn();
        let mut stmt = if query.snippets {
            conn.prepare_cached(&format!(
                "SELECT {HIT_COLUMNS}, bm25(messages_fts, 1.0, 1.0, 1.0, 0.0) AS rank,
                        snippet(messages_fts, -1, '«', '»', '…', ?4)
                 FROM messages_fts JOIN messages m ON m.pk = messages_fts.rowid
                 WHERE messages_fts MATCH ?1 AND m.session_id = ?3
                 ORDER BY rank, m.id LIMIT ?2"
            ))?
        } else {
            conn.prepare_cached(&format!(
                "SELECT {HIT_COLUMNS}, bm25(messages_fts, 1.0, 1.0, 1.0, 0.0) AS rank
                 FROM messages_fts JOIN messages m ON m.pk = messages_fts.rowid
                 WHERE messages_fts MATCH ?1 AND m.session_id = ?3
                 ORDER BY rank, m.id LIMIT ?2"
            ))?
        };
        let limit = sql_limit(query.limit);
        let mut rows = if query.snippets {
            stmt.query(rusqlite::params![matched, limit, session_id, SNIPPET_TOKENS])?
        } else {
            stmt.query(rusqlite::params![matched, limit, session_id])?
        };
        let mut hits = Vec::new();
        while let Some(row) = rows.next()? {
            hits.push(decode_hit(scope, row, query.snippets)?);
        }
        Ok(hits)
    }

    pub(super) fn search_summaries_sql(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Sql<Vec<SummaryHit>> {
        let Some(fts) = fts_query(query.text) else { return Ok(Vec::new()) };
        let Some(session_id) = self.session_id(scope)? else { return Ok(Vec::new()) };
        let found: Vec<(u64, f64)> = {
            let conn = self.read_conn();
            let mut stmt = conn.prepare_cached(
                "SELECT u.id, bm25(summaries_fts, 1.0, 0.0) AS rank
                 FROM summaries_fts JOIN summaries u ON u.pk = summaries_fts.rowid
                 WHERE summaries_fts MATCH ?1 AND u.session_id = ?3
                 ORDER BY rank, u.id LIMIT ?2",
            )?;
            let matched = summaries_in_session(&fts, session_id);
            let rows = stmt.query_map(
                rusqlite::params![matched, sql_limit(query.limit), session_id],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, f64>(1)?)),
            )?;
            let mut found = Vec::new();
            for row in rows {
                let (id, rank) = row?;
                found.push((from_sql_int("summary id", id)?, -rank));
            }
            found
        };
        let mut scores: Vec<f64> = found.iter().map(|(_, score)| *score).collect();
        normalise(&mut scores);
        let mut hits = Vec::with_capacity(found.len());
        for ((id, _), score) in found.into_iter().zip(scores) {
            // Read whole, sources included: verified against its checksum.
            if let Some(summary) = self.summary_sql(scope, id)? {
                hits.push(SummaryHit { id, level: summary.level, text: summary.text, score });
            }
        }
        Ok(hits)
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

    fn row(id: u64, text: impl Into<String>) -> crate::store::ArchivedMessage {
        let text = crate::message::ChatMessage::text(ctxwin_core::Role::User, text.into());
        crate::store::ArchivedMessage::new(id, id, text)
    }

    #[test]
    fn a_session_ranks_its_own_matches_however_many_other_sessions_match() {
        use crate::store::{ArchiveStore, Fence};
        let archive = SqliteArchive::open_in_memory().unwrap();
        for session in 0..30 {
            let rows: Vec<_> = (1..=20)
                .map(|id| row(id, format!("the build of service {session} passed, run {id}")))
                .collect();
            archive.put(&Scope::local(format!("s{session}")), Fence::NONE, &rows).unwrap();
        }
        let mine = Scope::local("mine");
        archive.put(&mine, Fence::NONE, &[row(1, "the build broke on arm64")]).unwrap();
        // A session id is not a word of the text: "7" finds the text's 7s, not session 7's rows.
        let hits = archive.search(&mine, &SearchQuery::new("build", 5)).unwrap();
        assert_eq!(hits.len(), 1, "{hits:?}");
        assert_eq!((hits[0].content.as_str(), hits[0].score), ("the build broke on arm64", 1.0));
        let s3 = Scope::local("s3");
        let hits = archive.search(&s3, &SearchQuery::new("build 7", 25)).unwrap();
        assert_eq!(hits.len(), 20);
        assert!(hits[0].content.ends_with("run 7"), "{hits:?}");
        assert!(hits.iter().all(|hit| hit.score > 0.0 && hit.score <= 1.0));
        let snippets = archive.search(&s3, &SearchQuery::new("7", 100).with_snippets()).unwrap();
        assert!(snippets.iter().all(|h| h.content.contains('7') && h.snippet.contains("«7»")));
    }

    #[test]
    fn a_session_search_returns_and_ranks_only_its_own_rows() {
        use crate::store::{ArchiveStore, Fence};
        let archive = SqliteArchive::open_in_memory().unwrap();
        // Another session's rows match every word, and better (short, repeated): ranked with
        // them, the session's one match would fall below any limit.
        let theirs: Vec<_> =
            (1..=300).map(|id| row(id, "balance code KESTREL balance code KESTREL")).collect();
        archive.put(&Scope::local("theirs"), Fence::NONE, &theirs).unwrap();
        let mine = Scope::local("mine");
        let text = "the account balance was checked on the first day";
        archive.put(&mine, Fence::NONE, &[row(1, text)]).unwrap();
        let only_mine = |archive: &SqliteArchive| {
            for limit in [1, 5, 500] {
                for snippets in [false, true] {
                    let mut query = SearchQuery::new("balance code KESTREL", limit);
                    if snippets {
                        query = query.with_snippets();
                    }
                    let hits = archive.search(&mine, &query).unwrap();
                    assert_eq!(hits.len(), 1, "limit {limit}: {hits:?}");
                    assert_eq!(hits[0].content, text, "{hits:?}");
                }
            }
            let nobody = Scope::local("nobody");
            assert!(archive.search(&nobody, &SearchQuery::new("balance", 5)).unwrap().is_empty());
        };
        only_mine(&archive);
        // An index entry naming the wrong session (the full-text index is a copy of the rows):
        // the row itself is checked, so another session's message is still never returned.
        let conn = archive.conn_for_tests();
        conn.execute_batch(
            "INSERT INTO messages_fts (rowid, content, tool_text, original, session_id)
             SELECT m.pk, m.content, m.tool_text, m.original,
                    (SELECT id FROM sessions WHERE name = 'mine')
             FROM messages m JOIN sessions s ON s.id = m.session_id
             WHERE s.name = 'theirs' LIMIT 3",
        )
        .unwrap();
        drop(conn);
        only_mine(&archive);
        // An index entry for a row that does not exist, ranked first: skipped, not an error,
        // and the session's own message is still found at limit 1.
        let conn = archive.conn_for_tests();
        conn.execute_batch(
            "INSERT INTO messages_fts (rowid, content, tool_text, original, session_id)
             VALUES (999999, 'balance code KESTREL balance code KESTREL balance', '', NULL,
                     (SELECT id FROM sessions WHERE name = 'mine'))",
        )
        .unwrap();
        drop(conn);
        only_mine(&archive);
    }

    #[test]
    fn a_search_on_the_read_connection_does_not_wait_for_a_write_in_progress() {
        use crate::store::{ArchiveStore, Fence};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let archive = SqliteArchive::open(&path).unwrap().with_read_connections(2).unwrap();
        let s = Scope::local("s");
        archive.put(&s, Fence::NONE, &[row(1, "staging runs Postgres 16")]).unwrap();
        // A writer holding the shared connection, as the deferred writer's thread does for a
        // transaction of many sessions' rows.
        let held = archive.conn_for_tests();
        held.execute_batch("BEGIN IMMEDIATE; DELETE FROM compression_metrics;").unwrap();
        let reader = archive.clone();
        // Two searches at once: one on each read connection, or one waiting for the other.
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let (reader, tx, s) = (reader.clone(), tx.clone(), s.clone());
            std::thread::spawn(move || {
                let found = reader.search(&s, &SearchQuery::new("postgres", 5));
                let _ = tx.send(found.map(|hits| hits.len()));
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
        let memory = SqliteArchive::open_in_memory().unwrap().with_read_connections(2).unwrap();
        assert!(memory.readers.is_none());
    }

    proptest! {
        #[test]
        fn any_input_is_a_valid_fts5_query(query in any::<String>()) {
            use crate::store::{ArchiveStore, Fence};
            let archive = SqliteArchive::open_in_memory().unwrap();
            let s = Scope::local("s");
            archive.put(&s, Fence::NONE, &[row(1, "AND OR NOT NEAR col:val \"x\" *")]).unwrap();
            prop_assert!(archive.search(&s, &SearchQuery::new(&query, 5).with_snippets()).is_ok());
            prop_assert!(archive.search_summaries(&s, &SearchQuery::new(&query, 5)).is_ok());
        }
    }
}
