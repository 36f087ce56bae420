//! The PostgreSQL schema and its migrations.
//!
//! [`MIGRATIONS`] is append-only and numbered from 1: each is applied once, recorded in
//! `ctxwin_migrations` (version, name, when). `migrate` runs in ONE transaction that first
//! takes `pg_advisory_xact_lock` (released by the commit): processes opening the store at
//! once queue for it, the first applies what is missing, the others find it recorded. No
//! session-scoped state (no session advisory lock, no `SET`, no prepared statement kept):
//! it works the same behind a transaction-mode pooler (PgBouncer `pool_mode = transaction`).
//! A store a newer build migrated further is refused ([`StoreError::SchemaTooNew`]).
//!
//! The tables live in the connection's current schema (the first of its `search_path`):
//! several stores share a database in schemas of their own.

use postgres::Client;

use super::error::{Failure, Pg, get};
use crate::store::StoreError;

/// One migration: its name (recorded) and its SQL.
pub struct Migration {
    /// What it does, recorded with its number.
    pub name: &'static str,
    /// The statements.
    pub sql: &'static str,
}

/// The migrations, oldest first: entry `i` is version `i + 1`. Never edit a published one.
pub const MIGRATIONS: &[Migration] = &[
    Migration { name: "fleet store", sql: V1 },
    Migration { name: "records", sql: V2 },
    Migration { name: "lease holders", sql: V3 },
    Migration { name: "search indexed when searched", sql: V4 },
];

/// The schema version this build writes.
///
/// ```
/// assert_eq!(ctxwin_std::store::postgres::schema::SCHEMA_VERSION, 4);
/// ```
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Characters of a row's text (content, tool calls, original) its search vector holds:
/// PostgreSQL's tsvector holds at most 1 MB, which this many characters of any text stay
/// under. Rows are stored whole; words past it are not found by a search.
pub const INDEXED_CHARS: usize = 131_072;

/// The first key of the advisory lock migrations take (`ctxw`); the second is a hash of the
/// schema, so stores in other schemas of the database migrate without waiting for this one.
const LOCK_CLASS: i32 = 0x6374_7877;

/// Version 1.
///
/// * `ctxwin_meta`: the store's identity (random, written once).
/// * `conversations`: one row per scope (tenant, name), never deleted: it holds the newest
///   fence handed out (`acquire` raises it; every fenced write locks the row and compares),
///   the checkpoint sequence, and the counts BM25 needs (rows and their indexed words),
///   kept by statement triggers in the writing transaction.
/// * `messages`, `summaries`: the rows, each with its checksum, and a `search` tsvector that
///   a trigger computes from content, tool calls and original text (at most
///   [`INDEXED_CHARS`] characters; English stemming with stop words kept:
///   `ctxwin_english`), holding the lexeme `@ <conversation id>` too, so a search
///   intersects the conversation's postings with the words' in the GIN index instead of
///   ranking every conversation's matches.
/// * `message_vectors`: vectors as little-endian `f32` bytes (no extension needed); deleted
///   with their message and when its content changes.
/// * `compression_events`, `checkpoints` (framed payloads, ordered by a sequence).
///
/// Texts may hold U+FFFF escapes (see the `escape` module): PostgreSQL's `text` has no
/// U+0000.
const V1: &str = r#"
-- English stemming without stop words (as SQLite's porter tokenizer and the in-memory store
-- index every word; queries drop stop words themselves unless nothing else is left).
CREATE TEXT SEARCH DICTIONARY ctxwin_english_stem (TEMPLATE = snowball, Language = english);
CREATE TEXT SEARCH CONFIGURATION ctxwin_english (COPY = english);
ALTER TEXT SEARCH CONFIGURATION ctxwin_english
    ALTER MAPPING REPLACE english_stem WITH ctxwin_english_stem;

CREATE TABLE ctxwin_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO ctxwin_meta (key, value)
VALUES ('identity', replace(gen_random_uuid()::text, '-', ''));

CREATE TABLE conversations (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant         text COLLATE "C" NOT NULL,
    name           text COLLATE "C" NOT NULL,
    fence          bigint NOT NULL DEFAULT 0,
    checkpoint_seq bigint NOT NULL DEFAULT 0,
    messages       bigint NOT NULL DEFAULT 0,
    message_terms  bigint NOT NULL DEFAULT 0,
    summaries      bigint NOT NULL DEFAULT 0,
    summary_terms  bigint NOT NULL DEFAULT 0,
    UNIQUE (tenant, name)
);

CREATE TABLE messages (
    conversation_id bigint NOT NULL REFERENCES conversations (id),
    id              bigint NOT NULL,
    unit            bigint NOT NULL,
    level           smallint NOT NULL,
    role            text NOT NULL,
    content         text NOT NULL,
    tool_calls      text,
    tool_text       text NOT NULL,
    tool_call_id    text,
    original        text,
    timestamp       bigint NOT NULL,
    tokens          bigint NOT NULL,
    name            text,
    is_error        boolean NOT NULL,
    raw             text,
    checksum        bigint NOT NULL,
    search          tsvector NOT NULL DEFAULT '',
    search_len      integer NOT NULL DEFAULT 0,
    PRIMARY KEY (conversation_id, id)
);
CREATE INDEX messages_search ON messages USING gin (search);

CREATE TABLE summaries (
    conversation_id bigint NOT NULL REFERENCES conversations (id),
    id              bigint NOT NULL,
    level           smallint NOT NULL,
    text            text NOT NULL,
    created_at      bigint NOT NULL,
    tokens_before   bigint NOT NULL,
    tokens_after    bigint NOT NULL,
    source_ids      bigint[] NOT NULL,
    checksum        bigint NOT NULL,
    search          tsvector NOT NULL DEFAULT '',
    search_len      integer NOT NULL DEFAULT 0,
    PRIMARY KEY (conversation_id, id)
);
CREATE INDEX summaries_search ON summaries USING gin (search);

CREATE TABLE message_vectors (
    conversation_id bigint NOT NULL,
    message_id      bigint NOT NULL,
    model           text NOT NULL,
    vector          bytea NOT NULL,
    checksum        bigint NOT NULL,
    PRIMARY KEY (conversation_id, message_id, model),
    FOREIGN KEY (conversation_id, message_id) REFERENCES messages (conversation_id, id)
        ON DELETE CASCADE
);

CREATE TABLE compression_events (
    conversation_id bigint NOT NULL REFERENCES conversations (id),
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    timestamp       bigint NOT NULL,
    tokens_before   bigint NOT NULL,
    tokens_after    bigint NOT NULL,
    units_evicted   bigint NOT NULL,
    summaries_made  bigint NOT NULL,
    strategy        text NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);

CREATE TABLE checkpoints (
    conversation_id bigint NOT NULL REFERENCES conversations (id),
    seq             bigint NOT NULL,
    id              text COLLATE "C" NOT NULL,
    frame           bytea NOT NULL,
    written_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, seq),
    UNIQUE (conversation_id, id)
);

-- The search vector of a row: its words (English stems) plus its conversation's lexeme.
CREATE FUNCTION ctxwin_index_message() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    words tsvector;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.content IS NOT DISTINCT FROM OLD.content
        AND NEW.tool_text IS NOT DISTINCT FROM OLD.tool_text
        AND NEW.original IS NOT DISTINCT FROM OLD.original
        AND NEW.conversation_id = OLD.conversation_id THEN
        NEW.search := OLD.search;
        NEW.search_len := OLD.search_len;
        RETURN NEW;
    END IF;
    words := to_tsvector('ctxwin_english', left(NEW.content || ' ' || NEW.tool_text || ' '
        || coalesce(NEW.original, ''), 131072));
    NEW.search_len := (SELECT coalesce(sum(coalesce(array_length(positions, 1), 1)), 0)
        FROM unnest(words));
    NEW.search := words || array_to_tsvector(ARRAY['@ ' || NEW.conversation_id]);
    RETURN NEW;
END $$;
CREATE TRIGGER messages_index BEFORE INSERT OR UPDATE ON messages
    FOR EACH ROW EXECUTE FUNCTION ctxwin_index_message();

CREATE FUNCTION ctxwin_index_summary() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    words tsvector;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.text IS NOT DISTINCT FROM OLD.text
        AND NEW.conversation_id = OLD.conversation_id THEN
        NEW.search := OLD.search;
        NEW.search_len := OLD.search_len;
        RETURN NEW;
    END IF;
    words := to_tsvector('ctxwin_english', left(NEW.text, 131072));
    NEW.search_len := (SELECT coalesce(sum(coalesce(array_length(positions, 1), 1)), 0)
        FROM unnest(words));
    NEW.search := words || array_to_tsvector(ARRAY['@ ' || NEW.conversation_id]);
    RETURN NEW;
END $$;
CREATE TRIGGER summaries_index BEFORE INSERT OR UPDATE ON summaries
    FOR EACH ROW EXECUTE FUNCTION ctxwin_index_summary();

-- A message's vectors describe its content: a new content drops them.
CREATE FUNCTION ctxwin_drop_stale_vectors() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM message_vectors
    WHERE conversation_id = OLD.conversation_id AND message_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER messages_stale_vectors AFTER UPDATE OF content ON messages
    FOR EACH ROW WHEN (OLD.content IS DISTINCT FROM NEW.content)
    EXECUTE FUNCTION ctxwin_drop_stale_vectors();

-- BM25's counts per conversation (rows, indexed words), once per statement.
CREATE FUNCTION ctxwin_count_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE conversations c SET messages = c.messages + d.rows, message_terms = c.message_terms + d.terms
        FROM (SELECT conversation_id, count(*) AS rows, sum(search_len) AS terms
              FROM added GROUP BY conversation_id) d
        WHERE c.id = d.conversation_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE conversations c SET messages = c.messages - d.rows, message_terms = c.message_terms - d.terms
        FROM (SELECT conversation_id, count(*) AS rows, sum(search_len) AS terms
              FROM removed GROUP BY conversation_id) d
        WHERE c.id = d.conversation_id;
    ELSE
        UPDATE conversations c SET message_terms = c.message_terms + d.terms
        FROM (SELECT conversation_id, sum(terms) AS terms FROM (
                  SELECT conversation_id, search_len AS terms FROM added
                  UNION ALL SELECT conversation_id, -search_len FROM removed) changes
              GROUP BY conversation_id) d
        WHERE c.id = d.conversation_id AND d.terms <> 0;
    END IF;
    RETURN NULL;
END $$;
CREATE FUNCTION ctxwin_count_summaries() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE conversations c SET summaries = c.summaries + d.rows, summary_terms = c.summary_terms + d.terms
        FROM (SELECT conversation_id, count(*) AS rows, sum(search_len) AS terms
              FROM added GROUP BY conversation_id) d
        WHERE c.id = d.conversation_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE conversations c SET summaries = c.summaries - d.rows, summary_terms = c.summary_terms - d.terms
        FROM (SELECT conversation_id, count(*) AS rows, sum(search_len) AS terms
              FROM removed GROUP BY conversation_id) d
        WHERE c.id = d.conversation_id;
    ELSE
        UPDATE conversations c SET summary_terms = c.summary_terms + d.terms
        FROM (SELECT conversation_id, sum(terms) AS terms FROM (
                  SELECT conversation_id, search_len AS terms FROM added
                  UNION ALL SELECT conversation_id, -search_len FROM removed) changes
              GROUP BY conversation_id) d
        WHERE c.id = d.conversation_id AND d.terms <> 0;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER messages_count_insert AFTER INSERT ON messages
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION ctxwin_count_messages();
CREATE TRIGGER messages_count_update AFTER UPDATE ON messages
    REFERENCING OLD TABLE AS removed NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION ctxwin_count_messages();
CREATE TRIGGER messages_count_delete AFTER DELETE ON messages
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION ctxwin_count_messages();
CREATE TRIGGER summaries_count_insert AFTER INSERT ON summaries
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION ctxwin_count_summaries();
CREATE TRIGGER summaries_count_update AFTER UPDATE ON summaries
    REFERENCING OLD TABLE AS removed NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION ctxwin_count_summaries();
CREATE TRIGGER summaries_count_delete AFTER DELETE ON summaries
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION ctxwin_count_summaries();
"#;

/// Version 2: the record port ([`RecordStore`](crate::store::RecordStore)): keyed records of
/// a tenant's namespace with their checksums, names and keys escaped as every text (see the
/// `escape` module) and compared byte by byte (`COLLATE "C"`), so a key prefix is a range of
/// the primary key. `fields` is the JSON text of the record's fields, matched as `jsonb`
/// (numbers by value). Records have no row in `conversations`: they are not conversations of
/// the archive, and take no fence.
const V2: &str = r#"
CREATE TABLE records (
    tenant     text COLLATE "C" NOT NULL,
    namespace  text COLLATE "C" NOT NULL,
    collection text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      bytea NOT NULL,
    fields     text,
    checksum   bigint NOT NULL,
    PRIMARY KEY (tenant, namespace, collection, key)
);
"#;

/// Version 3: the holder of each conversation's lease beside its fence: the
/// [`PgStore`](super::PgStore) handle that took it (a random number each handle draws). A
/// fenced write is taken only from the holder of the newest fence, so a lease whose commit a
/// server crash lost (taken without waiting for the disk) cannot leave two writers on one
/// fence: see `raise_fence`. 0: no holder recorded (leases taken before this version).
const V3: &str = r#"
ALTER TABLE conversations ADD COLUMN holder bigint NOT NULL DEFAULT 0;
"#;

/// Version 4: a message's search vector is computed when its conversation is searched, not
/// when the row is written. Written that way, a row cost PostgreSQL a PL/pgSQL trigger
/// (the vector), two statement triggers updating the conversation's BM25 counts (the
/// upsert's `INSERT` and `UPDATE`) and a foreign-key check (a `KEY SHARE` lock on the
/// conversation's row): about 80% of the server's time on a proxy fleet's writes.
///
/// * **`search` NULL: not indexed yet.** Rows are written without a vector; an upsert that
///   changes a row's content, tool calls' text or original text sets it NULL again in the
///   statement that changes it (the `messages` conflict clause; a forget's redaction too).
///   Rows written before this version keep their vectors.
/// * **`search_len`: what the conversation's counts hold for the row** (NULL: not counted).
///   A changed row keeps its old length until it is indexed again, so no writer reads or
///   updates `conversations` for the counts: `messages` is the number of rows with a
///   `search_len`, `message_terms` the sum.
/// * **`ctxwin_index_messages(conversation)`**, which a search calls first (for the
///   conversation it searches, no other), indexes that conversation's rows whose `search` is
///   NULL (found through the partial index `messages_unindexed`: work bounded by the rows
///   written since its last search; a conversation nobody searches costs nothing) and moves
///   the counts by the difference. It holds the conversation's row locked (`FOR NO KEY
///   UPDATE`, as every writer of its rows does) while it indexes, reading the rows after the
///   lock: nothing it counts changes under it.
/// * **Deletes** (forget, prune, a conversation deleted) take the counted rows out of the
///   counts in a statement trigger on `DELETE` (deletes are rare).
/// * **No foreign keys to `conversations`** on `messages`, `summaries`, `checkpoints` and
///   `compression_events`: a conversation's row is never deleted, and every statement that
///   writes a row resolves the conversation's id from its (tenant, name) in the same
///   statement or transaction, under its lock. `message_vectors` keeps its key to
///   `messages` (its vectors go with their message).
///
/// Summaries keep their triggers: they are written once per compaction, not per request.
/// Instances of an older build still running on the store do not index what they search:
/// upgrade every instance together.
const V4: &str = r#"
DROP TRIGGER messages_index ON messages;
DROP TRIGGER messages_count_insert ON messages;
DROP TRIGGER messages_count_update ON messages;
DROP TRIGGER messages_count_delete ON messages;
DROP FUNCTION ctxwin_index_message();
DROP FUNCTION ctxwin_count_messages();

ALTER TABLE messages
    ALTER COLUMN search DROP NOT NULL, ALTER COLUMN search DROP DEFAULT,
    ALTER COLUMN search_len DROP NOT NULL, ALTER COLUMN search_len DROP DEFAULT,
    DROP CONSTRAINT messages_conversation_id_fkey;
ALTER TABLE summaries DROP CONSTRAINT summaries_conversation_id_fkey;
ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_conversation_id_fkey;
ALTER TABLE compression_events DROP CONSTRAINT compression_events_conversation_id_fkey;

CREATE INDEX messages_unindexed ON messages (conversation_id) WHERE search IS NULL;

-- Counted rows deleted leave the counts (rows never indexed were never counted).
CREATE FUNCTION ctxwin_uncount_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conversations c
    SET messages = c.messages - d.rows, message_terms = c.message_terms - d.terms
    FROM (SELECT conversation_id, count(search_len) AS rows, sum(search_len) AS terms
          FROM removed WHERE search_len IS NOT NULL GROUP BY conversation_id) d
    WHERE c.id = d.conversation_id;
    RETURN NULL;
END $$;
CREATE TRIGGER messages_uncount AFTER DELETE ON messages
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION ctxwin_uncount_messages();

-- Indexes conversation `target`'s rows not indexed yet; how many.
CREATE FUNCTION ctxwin_index_messages(target bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    indexed bigint;
BEGIN
    IF NOT EXISTS (SELECT FROM messages WHERE conversation_id = target AND search IS NULL) THEN
        RETURN 0;
    END IF;
    -- Every writer of the conversation's rows holds this lock: the statement below takes
    -- its snapshot after it, and nothing it reads changes until the transaction ends.
    PERFORM FROM conversations WHERE id = target FOR NO KEY UPDATE;
    WITH pending AS (
        SELECT id, search_len AS counted, to_tsvector('ctxwin_english',
            left(content || ' ' || tool_text || ' ' || coalesce(original, ''), 131072)) AS words
        FROM messages WHERE conversation_id = target AND search IS NULL
    ), done AS (
        UPDATE messages m
        SET search = p.words || array_to_tsvector(ARRAY['@ ' || target]),
            search_len = (SELECT coalesce(sum(coalesce(array_length(positions, 1), 1)), 0)
                          FROM unnest(p.words))
        FROM pending p
        WHERE m.conversation_id = target AND m.id = p.id
        RETURNING p.counted, m.search_len AS now_len
    ), totals AS (
        SELECT count(*) AS n, count(*) - count(counted) AS added,
               coalesce(sum(now_len - coalesce(counted, 0)), 0) AS terms
        FROM done
    ), moved AS (
        UPDATE conversations c
        SET messages = c.messages + t.added, message_terms = c.message_terms + t.terms
        FROM totals t WHERE c.id = target
    )
    SELECT n INTO indexed FROM totals;
    RETURN indexed;
END $$;
"#;

/// Applies what [`MIGRATIONS`] holds beyond the store's version, in one transaction under
/// the migration lock; the version the store is at.
pub(super) fn migrate(client: &mut Client) -> Pg<i64> {
    migrate_to(client, SCHEMA_VERSION)
}

/// [`migrate`], up to version `target` (a test's store at an older version).
pub(super) fn migrate_to(client: &mut Client, target: i64) -> Pg<i64> {
    let mut tx = client.transaction()?;
    tx.query_typed(
        "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))",
        &[(&LOCK_CLASS, postgres::types::Type::INT4)],
    )?;
    let schema: Option<String> = get(&tx.query_typed_one("SELECT current_schema()", &[])?, 0)?;
    if schema.is_none() {
        return Err(Failure(StoreError::Invalid {
            detail: "the connection's search_path names no existing schema to create ctxwin's \
                     tables in (create it, or set search_path / options=-csearch_path=...)"
                .into(),
        }));
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS ctxwin_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )?;
    let found: i64 = get(
        &tx.query_typed_one("SELECT coalesce(max(version), 0)::int8 FROM ctxwin_migrations", &[])?,
        0,
    )?;
    if found > SCHEMA_VERSION {
        return Err(Failure(StoreError::SchemaTooNew { found, supported: SCHEMA_VERSION }));
    }
    let wanted = usize::try_from(target).unwrap_or(0);
    for (version, migration) in
        (1_i32..).zip(MIGRATIONS).take(wanted).skip(usize::try_from(found).unwrap_or(0))
    {
        tx.batch_execute(migration.sql)?;
        tx.query_typed(
            "INSERT INTO ctxwin_migrations (version, name) VALUES ($1, $2)",
            &[
                (&version, postgres::types::Type::INT4),
                (&migration.name, postgres::types::Type::TEXT),
            ],
        )?;
        tracing::info!(version, name = migration.name, "postgres store: migrated");
    }
    tx.commit()?;
    Ok(target.max(found))
}
