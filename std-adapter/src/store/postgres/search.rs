//! Full-text search: PostgreSQL's text search (English stemming, a GIN index) finds a
//! conversation's matches, and BM25 ranks them in the same statement.
//!
//! The query's words are the ones every adapter searches for
//! ([`query_words`](crate::store::text::query_words): an irregular verb's other forms, stop
//! words dropped unless nothing else is left); PostgreSQL stems them as it stemmed the rows.
//! A row matches when it holds every lexeme of one of the words (words are OR-ed). Its score
//! is BM25 (k1 1.2, b 0.75) over the query's lexemes, with the collection statistics of the
//! conversation alone (its row count and mean indexed length, kept in `conversations`;
//! document frequencies counted over its matches): another conversation's rows are never
//! counted or ranked in. Scores are then normalised as every adapter's (best `1.0`).
//!
//! Message rows are indexed when their conversation is searched, not when they are written
//! (schema V4): a search first indexes the conversation's rows written or changed since its
//! last one, then searches. Summaries are indexed as they are written (a trigger: they are
//! rare).

use postgres::Row;
use postgres::types::Type;

use super::error::{Failure, Pg, get};
use super::escape::scope_params;
use super::escape::unescape_lossy;
use super::rows::decode_unverified;
use super::summaries::{SUMMARY_COLUMNS, decode_verified};
use super::{PgStore, row_name, sql_limit};
use crate::store::text::{BM25_B as B, BM25_K1 as K1, query_words};
use crate::store::types::normalise;
use crate::store::{Scope, SearchHit, SearchQuery, StoreError, SummaryHit, checksum};

/// The matches of `$3` (the words) among `{table}` rows of conversation `$1`/`$2`, each with
/// its BM25 score, best first, at most `$4`; `{rows}` and `{terms}` name the conversation's
/// counts for the table. Leaves CTEs `c` (the conversation), `q` (the query) and `scored`.
fn ranked(table: &str, rows: &str, terms: &str) -> String {
    format!(
        "WITH c AS (
             SELECT id, {rows} AS n_rows, {terms} AS n_terms FROM conversations
             WHERE tenant = $1 AND name = $2
         ), q AS (
             SELECT string_agg('(' || t::text || ')', ' | ')::tsquery AS query
             FROM (SELECT plainto_tsquery('ctxwin_english', w) AS t FROM unnest($3::text[]) AS w) words
             WHERE numnode(t) > 0
         ), lexemes AS (
             SELECT DISTINCT l FROM unnest($3::text[]) AS w,
                 unnest(tsvector_to_array(to_tsvector('ctxwin_english', w))) AS l
         ), matched AS (
             SELECT d.id, d.search, d.search_len FROM {table} d, c, q
             WHERE d.conversation_id = c.id
               AND d.search @@ (q.query && ('''@ ' || c.id || '''')::tsquery)
         ), frequencies AS (
             SELECT d.id, d.search_len, u.lexeme,
                    coalesce(array_length(u.positions, 1), 1)::float8 AS tf
             FROM matched d, unnest(d.search) AS u
             WHERE u.lexeme IN (SELECT l FROM lexemes)
         ), documents AS (
             SELECT lexeme, count(*)::float8 AS df FROM frequencies GROUP BY lexeme
         ), scored AS (
             SELECT f.id, sum(
                 greatest(ln((c.n_rows - s.df + 0.5) / (s.df + 0.5) + 1.0), 1e-6)
                 * f.tf * ($5 + 1.0)
                 / (f.tf + $5 * (1.0 - $6 + $6 * f.search_len
                     / greatest(c.n_terms::float8 / greatest(c.n_rows, 1), 1.0)))
             ) AS score
             FROM frequencies f JOIN documents s USING (lexeme), c
             GROUP BY f.id
             ORDER BY score DESC, f.id
             LIMIT $4
         )"
    )
}

/// Indexes the message rows of conversation `$1`/`$2` not indexed yet (written or changed
/// since its last search; schema V4's `ctxwin_index_messages`) and moves its counts, in the
/// statement's own transaction, before a search reads them. Nothing of another conversation
/// is read or written.
const INDEX_PENDING: &str =
    "SELECT ctxwin_index_messages(c.id) FROM conversations c WHERE c.tenant = $1 AND c.name = $2";

/// The columns of a hit: those of [`MESSAGE_COLUMNS`](super::rows::MESSAGE_COLUMNS) with the
/// original text and raw JSON left out (a search verifies the head of each row's checksum
/// and serves neither).
const HIT_COLUMNS: &str = "m.id, m.unit, m.level, m.role, m.content, m.tool_calls, \
     m.tool_call_id, NULL::text, m.timestamp, m.tokens, m.name, m.is_error, NULL::text, \
     m.checksum";

/// How a snippet is cut: matched words in `«»`, about a line of words.
const HEADLINE: &str = "StartSel=«, StopSel=», MaxWords=24, MinWords=8, ShortWord=0, \
     MaxFragments=1, FragmentDelimiter=\" … \"";

/// A hit of `scope` from a row selected with [`HIT_COLUMNS`], its score at column 14 and its
/// snippet (if any) at 15; the head of its checksum verified.
fn decode_hit(scope: &Scope, row: &Row, snippets: bool) -> Pg<SearchHit> {
    let decoded = decode_unverified(scope, row)?;
    let stored: i64 = get(row, 13)?;
    let computed = checksum::message_head(scope, &decoded);
    if checksum::head(stored as u64) != computed {
        return Err(Failure(checksum::mismatch(
            row_name(scope, decoded.id),
            stored as u64 >> 32,
            u64::from(computed),
        )));
    }
    Ok(SearchHit {
        id: decoded.id,
        unit: decoded.unit,
        role: decoded.message.role,
        timestamp: decoded.timestamp,
        content: decoded.message.content,
        snippet: if snippets { unescape_lossy(get(row, 15)?) } else { String::new() },
        score: get(row, 14)?,
    })
}

/// The query's words as a SQL array; `None` when there is nothing to search.
fn words(query: &SearchQuery<'_>) -> Option<Vec<String>> {
    let words: Vec<String> = query_words(query.text).into_iter().map(str::to_string).collect();
    (!words.is_empty() && query.limit > 0).then_some(words)
}

impl PgStore {
    pub(super) fn search_pg(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SearchHit>, StoreError> {
        let Some(words) = words(query) else { return Ok(Vec::new()) };
        let (tenant, name) = scope_params(scope);
        let snippet = if query.snippets {
            format!(
                "ts_headline('ctxwin_english', left(m.content || ' ' || m.tool_text || ' '
                     || coalesce(m.original, ''), {}), (SELECT query FROM q), '{HEADLINE}')",
                super::schema::INDEXED_CHARS
            )
        } else {
            "NULL::text".into()
        };
        let sql = format!(
            "{} SELECT {HIT_COLUMNS}, s.score, {snippet}
             FROM scored s JOIN messages m ON m.conversation_id = (SELECT id FROM c)
                 AND m.id = s.id
             ORDER BY s.score DESC, m.id",
            ranked("messages", "messages", "message_terms")
        );
        let limit = sql_limit(query.limit);
        self.run(|client| {
            client.query_typed(INDEX_PENDING, &[(&tenant, Type::TEXT), (&name, Type::TEXT)])?;
            let rows = client.query_typed(
                &sql,
                &[
                    (&tenant, Type::TEXT),
                    (&name, Type::TEXT),
                    (&words, Type::TEXT_ARRAY),
                    (&limit, Type::INT8),
                    (&K1, Type::FLOAT8),
                    (&B, Type::FLOAT8),
                ],
            )?;
            let mut hits = rows
                .iter()
                .map(|row| decode_hit(scope, row, query.snippets))
                .collect::<Pg<Vec<_>>>()?;
            let mut scores: Vec<f64> = hits.iter().map(|hit| hit.score).collect();
            normalise(&mut scores);
            for (hit, score) in hits.iter_mut().zip(scores) {
                hit.score = score;
            }
            tracing::trace!(query = query.text, hits = hits.len(), "postgres store: search");
            Ok(hits)
        })
    }

    pub(super) fn search_summaries_pg(
        &self,
        scope: &Scope,
        query: &SearchQuery<'_>,
    ) -> Result<Vec<SummaryHit>, StoreError> {
        let Some(words) = words(query) else { return Ok(Vec::new()) };
        let (tenant, name) = scope_params(scope);
        let sql = format!(
            "{} SELECT {SUMMARY_COLUMNS}, s.score
             FROM scored s JOIN summaries u ON u.conversation_id = (SELECT id FROM c)
                 AND u.id = s.id
             ORDER BY s.score DESC, u.id",
            ranked("summaries", "summaries", "summary_terms")
        );
        let limit = sql_limit(query.limit);
        self.run(|client| {
            let rows = client.query_typed(
                &sql,
                &[
                    (&tenant, Type::TEXT),
                    (&name, Type::TEXT),
                    (&words, Type::TEXT_ARRAY),
                    (&limit, Type::INT8),
                    (&K1, Type::FLOAT8),
                    (&B, Type::FLOAT8),
                ],
            )?;
            let mut hits = Vec::with_capacity(rows.len());
            let mut scores = Vec::with_capacity(rows.len());
            for row in &rows {
                let summary = decode_verified(scope, row)?;
                scores.push(get::<f64>(row, 8)?);
                hits.push(SummaryHit {
                    id: summary.id,
                    level: summary.level,
                    text: summary.text,
                    score: 0.0,
                });
            }
            normalise(&mut scores);
            for (hit, score) in hits.iter_mut().zip(scores) {
                hit.score = score;
            }
            Ok(hits)
        })
    }
}
