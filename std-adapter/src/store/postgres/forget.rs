//! Forgetting: text out of a conversation's rows (content, tool calls, original, raw JSON),
//! its search vectors (cleared: the next search indexes the scrubbed text), its vectors
//! (dropped with the content they described) and summaries, then `VACUUM` of the tables so
//! no dead row version keeps it in their pages.

use postgres::types::Type;

use super::error::{Pg, from_sql_int, get};
use super::escape::escape;
use super::rows::{MESSAGE_COLUMNS, decode_message, encode, upsert};
use super::summaries::{SUMMARY_COLUMNS, decode};
use super::{PgStore, Tx, lock_scope};
use crate::store::types::scrub_row;
use crate::store::{FORGOTTEN, Fence, Forget, Forgotten, Scope, StoreError};

/// Rows of `$1` named by `$2` or holding one of the texts `$3` anywhere (as stored).
const CANDIDATES: &str = "FROM messages m WHERE m.conversation_id = $1 AND (m.id = ANY($2)
    OR EXISTS (SELECT 1 FROM unnest($3::text[]) AS t (x)
               WHERE strpos(m.content, t.x) > 0 OR strpos(m.tool_text, t.x) > 0
                  OR strpos(coalesce(m.original, ''), t.x) > 0
                  OR strpos(coalesce(m.tool_calls, ''), t.x) > 0
                  OR strpos(coalesce(m.raw, ''), t.x) > 0))
    ORDER BY m.id";

impl PgStore {
    pub(super) fn forget_pg(
        &self,
        scope: &Scope,
        fence: Fence,
        what: &Forget<'_>,
    ) -> Result<Forgotten, StoreError> {
        self.inner.archived.forget(scope);
        let texts: Vec<&str> = what.texts.iter().copied().filter(|t| !t.is_empty()).collect();
        let what = Forget { ids: what.ids, texts: &texts };
        let forgotten = self.transaction(|tx| {
            let Some(conversation) = lock_scope(tx, scope, fence, false)? else {
                return Ok(Forgotten::default());
            };
            let messages = forget_rows(tx, scope, conversation, &what)?;
            let summaries = forget_in_summaries(tx, scope, conversation, &messages, &texts)?;
            Ok(Forgotten { messages, summaries })
        })?;
        if !forgotten.messages.is_empty() || !forgotten.summaries.is_empty() {
            self.vacuum("messages, summaries, message_vectors")?;
        }
        tracing::info!(
            %scope,
            messages = forgotten.messages.len(),
            summaries = forgotten.summaries.len(),
            "postgres store: forgot"
        );
        Ok(forgotten)
    }
}

/// Scrubs the rows of `conversation` that `what` names or that hold its texts; their ids.
fn forget_rows(
    tx: &mut Tx<'_>,
    scope: &Scope,
    conversation: i64,
    what: &Forget<'_>,
) -> Pg<Vec<u64>> {
    let ids: Vec<i64> = what.ids.iter().filter_map(|&id| i64::try_from(id).ok()).collect();
    let texts: Vec<String> = what.texts.iter().map(|t| escape(t).into_owned()).collect();
    let rows = tx.query(
        &format!("SELECT {MESSAGE_COLUMNS} {CANDIDATES}"),
        &[(&conversation, Type::INT8), (&ids, Type::INT8_ARRAY), (&texts, Type::TEXT_ARRAY)],
    )?;
    let mut forgotten = Vec::new();
    let mut rewritten = Vec::new();
    for row in &rows {
        let id = from_sql_int("message id", get(row, 0)?)?;
        match decode_message(scope, row) {
            Ok(stored) => {
                let mut scrubbed = stored.clone();
                scrub_row(&mut scrubbed, what);
                if what.ids.contains(&id) || scrubbed != stored {
                    forgotten.push(id);
                    rewritten.push(scrubbed);
                }
            }
            // A damaged row holding the text: scrubbed in SQL, its checksum left as it is (it
            // stays reported as damaged, and the text is gone).
            Err(_) => {
                scrub_in_place(tx, conversation, id, what, &texts)?;
                forgotten.push(id);
            }
        }
    }
    upsert(tx, conversation, &encode(scope, &rewritten)?)?;
    Ok(forgotten)
}

/// Scrubs damaged row `id` of `conversation` in SQL.
fn scrub_in_place(
    tx: &mut Tx<'_>,
    conversation: i64,
    id: u64,
    what: &Forget<'_>,
    texts: &[String],
) -> Pg<()> {
    let Ok(sql_id) = i64::try_from(id) else { return Ok(()) };
    if what.ids.contains(&id) {
        tx.query(
            "UPDATE messages SET content = $3, tool_calls = NULL, tool_text = '',
                 original = NULL, raw = NULL, search = NULL
             WHERE conversation_id = $1 AND id = $2",
            &[(&conversation, Type::INT8), (&sql_id, Type::INT8), (&FORGOTTEN, Type::TEXT)],
        )?;
    }
    for text in texts {
        tx.query(
            "UPDATE messages SET content = replace(content, $3, $4),
                 tool_text = replace(tool_text, $3, $4), original = replace(original, $3, $4),
                 raw = CASE WHEN strpos(coalesce(raw, ''), $3) > 0 THEN NULL ELSE raw END,
                 tool_calls = CASE WHEN strpos(coalesce(tool_calls, ''), $3) > 0
                     THEN NULL ELSE tool_calls END,
                 search = NULL
             WHERE conversation_id = $1 AND id = $2",
            &[
                (&conversation, Type::INT8),
                (&sql_id, Type::INT8),
                (text, Type::TEXT),
                (&FORGOTTEN, Type::TEXT),
            ],
        )?;
    }
    Ok(())
}

/// Scrubs `texts` out of the summaries of `conversation` that quote them or stand for one of
/// the `messages` forgotten; their ids.
fn forget_in_summaries(
    tx: &mut Tx<'_>,
    scope: &Scope,
    conversation: i64,
    messages: &[u64],
    texts: &[&str],
) -> Pg<Vec<u64>> {
    let sources: Vec<i64> = messages.iter().filter_map(|&id| i64::try_from(id).ok()).collect();
    let escaped: Vec<String> = texts.iter().map(|t| escape(t).into_owned()).collect();
    let rows = tx.query(
        &format!(
            "SELECT {SUMMARY_COLUMNS} FROM summaries u WHERE u.conversation_id = $1
               AND (u.source_ids && $2::int8[]
                    OR EXISTS (SELECT 1 FROM unnest($3::text[]) AS t (x)
                               WHERE strpos(u.text, t.x) > 0))
             ORDER BY u.id"
        ),
        &[(&conversation, Type::INT8), (&sources, Type::INT8_ARRAY), (&escaped, Type::TEXT_ARRAY)],
    )?;
    let mut touched = Vec::with_capacity(rows.len());
    for row in &rows {
        let id = from_sql_int("summary id", get(row, 0)?)?;
        touched.push(id);
        match decode(scope, row) {
            Ok((mut summary, _)) => {
                for text in texts {
                    summary.text = summary.text.replace(text, FORGOTTEN);
                }
                super::summaries::upsert(
                    tx,
                    conversation,
                    &super::summaries::encode(scope, &summary)?,
                )?;
            }
            Err(_) => {
                let sql_id = get::<i64>(row, 0)?;
                for text in &escaped {
                    tx.query(
                        "UPDATE summaries SET text = replace(text, $3, $4)
                         WHERE conversation_id = $1 AND id = $2",
                        &[
                            (&conversation, Type::INT8),
                            (&sql_id, Type::INT8),
                            (text, Type::TEXT),
                            (&FORGOTTEN, Type::TEXT),
                        ],
                    )?;
                }
            }
        }
    }
    Ok(touched)
}
