//! A conversation that other instances of a fleet serve too (both ports on one PostgreSQL).
//!
//! Its session holds the conversation's lease: every write carries the session's fence and
//! the database refuses one older than the newest handed out. A request first reads the
//! newest fence ([`Conv::catch_up`]) — unless the conversation stays on this instance, where
//! its first write proves the lease instead ([`Conv::lease_proved_by_writes`]); when another
//! instance took the conversation since, the session reloads (the newest checkpoint and the
//! rows after it) and the conversation rebuilds what it recorded from the same two: the
//! caller state of that checkpoint (what it recorded up to its last checkpoint) and the
//! archived rows after the last message that names, each message's entry read again from
//! its raw JSON. So no checkpoint is needed per request: the rows a request writes are what
//! the next instance reads.
//!
//! The session does not read the fence before each operation nor redo one on a state another
//! instance extended
//! ([`Session::redo_when_overtaken`](ctxwin_std::session::Session::redo_when_overtaken)):
//! one push redone there would land after the other instance's messages. A write refused as
//! stale fails the request's work, which is redone whole instead (`crate::pipeline`), on the
//! rebuilt record, where the messages already written are found known.

use ctxwin_std::core::Role;
use ctxwin_std::session::PushOptions;
use ctxwin_std::store::{ArchivedMessage, Ports};
use serde_json::Value;

use super::ingest::{TOOLS_PREFIX, calls_hash};
use super::state::{Entry, Recorded};
use super::validate::{level_of, pins};
use super::{Conv, ConvError, ConvSettings, stores};
use crate::hash::{canonical, hash_str};
use crate::wire::{
    Analyzed, Part, Provider, Request, analyze_item, analyze_message, raw_hash, without_recall_tool,
};

/// Rows read at once while rebuilding.
const PAGE: usize = 500;

/// Lease reads in a row that must find a conversation still this instance's before its
/// requests are taken without one ([`Conv::lease_proved_by_writes`]).
pub(super) const QUIET_CHECKS: u32 = 2;

impl Conv {
    /// Opens conversation `key` of a fleet: takes its lease, restores its newest checkpoint
    /// and the rows archived after it, and rebuilds what it recorded. A conversation nobody
    /// stored yet starts empty with `window`; a stored one keeps the window it was created
    /// with.
    ///
    /// # Errors
    /// Session and store errors; [`ConvError::State`] when what the checkpoint recorded does
    /// not read.
    pub(super) fn open_fleet(
        ports: &Ports,
        key: &str,
        provider: Provider,
        settings: &ConvSettings,
    ) -> Result<Self, ConvError> {
        let builder = settings.policies(stores::fleet_builder(ports, key));
        let window = match builder.stored_caller_state()?.as_deref() {
            Some(bytes) if !bytes.is_empty() => {
                Recorded::decode(bytes).map_err(ConvError::State)?.window
            }
            _ => settings.window,
        };
        let config = settings.session_config(window, settings.reserve, 0);
        let mut session = builder.config(config).restore_latest(true).build()?;
        session.redo_when_overtaken(false);
        let stores = super::Stores::Fleet(ports.clone());
        let settings = ConvSettings { window, ..settings.clone() };
        let mut conv =
            Self::from_parts(key, provider, session, &stores, Recorded::new(window), settings);
        conv.rebuild()?;
        // Served before, maybe by another instance that still serves it.
        conv.roams = !conv.recorded.entries.is_empty();
        Ok(conv)
    }

    /// In a fleet: when another instance took the conversation since this one last served it,
    /// reloads the session and rebuilds what the conversation recorded (one query when it did
    /// not). Returns whether it reloaded. Does nothing for a conversation of one process.
    ///
    /// # Errors
    /// Store errors; [`ConvError::State`] when the store's state does not read.
    pub fn catch_up(&mut self) -> Result<bool, ConvError> {
        if self.fleet && self.session.catch_up()? {
            self.pending_answer = None;
        }
        let reloaded = self.session.counters().reloads != self.seen_reloads;
        if reloaded {
            self.overtaken();
        } else if self.roams {
            self.quiet += 1;
            self.roams = self.quiet < QUIET_CHECKS;
        }
        self.resync()?;
        Ok(reloaded)
    }

    /// Whether a request may be taken without reading the lease first: in a fleet, while the
    /// conversation stays on this instance (as a load balancer with affinity keeps it: new
    /// here, or found here by the last `QUIET_CHECKS` lease reads). Its first write then
    /// proves the lease: the database refuses it when another instance took the conversation
    /// meanwhile, and the request is redone on the reloaded state, as a request overtaken
    /// midway is. A request that writes nothing proves nothing and reads the lease after
    /// ([`Conv::writes`]). Saves a round trip per request; a conversation that moves
    /// between instances reads the lease first, as a refused write would cost one more.
    pub fn lease_proved_by_writes(&self) -> bool {
        self.fleet && !self.roams
    }

    /// Notes that another instance took the conversation (a write was refused as stale).
    pub fn overtaken(&mut self) {
        self.roams = true;
        self.quiet = 0;
    }

    /// How many writes (rows, checkpoints, summaries) this conversation's session has made,
    /// each under its lease: unchanged over a request that wrote nothing.
    pub fn writes(&self) -> u64 {
        let counters = self.session.counters();
        counters.archive_rows_written + counters.checkpoints_written + counters.summaries_recorded
    }

    /// In a fleet: whether another instance took the conversation's lease since this one's
    /// session took it (one query). What was waiting here (an answer not yet pushed) is
    /// dropped then: the client that got it sends it back with its next request, wherever.
    pub(super) fn stale_here(&mut self) -> Result<bool, ConvError> {
        if !self.fleet {
            return Ok(false);
        }
        let Some(archive) = self.session.archive() else { return Ok(false) };
        let stale = archive.current_fence(self.session.scope())? > self.session.fence();
        if stale {
            self.pending_answer = None;
            self.dirty = false;
        }
        Ok(stale)
    }

    /// Rebuilds what the conversation recorded when its session reloaded since the last
    /// rebuild (another instance served it; the session found out by itself).
    pub(super) fn resync(&mut self) -> Result<(), ConvError> {
        let reloads = self.session.counters().reloads;
        if reloads == self.seen_reloads {
            return Ok(());
        }
        let resumed = self.session.last_reload().is_some_and(|report| report.resumed);
        if resumed && reloads == self.seen_reloads + 1 { self.resume() } else { self.rebuild() }
    }

    /// What the conversation recorded, after its session resumed on its own state (one
    /// reload since the record was last made, which kept the session's state and replayed
    /// only the rows other instances wrote after its own:
    /// [`ReloadReport::resumed`](ctxwin_std::session::ReloadReport::resumed)): the record held,
    /// then those rows read into entries as [`rebuild`](Self::rebuild) reads them. The record
    /// matches the session's rows up to its own (the session resumes only with nothing left
    /// unwritten), so this is the record a rebuild makes, without decoding the checkpoint's
    /// nor reading again the rows since it.
    fn resume(&mut self) -> Result<(), ConvError> {
        let replayed = self.session.take_replayed();
        let recorded = std::mem::take(&mut self.recorded);
        let mut rebuild = Rebuild { recorded, pending: None, provider: self.provider };
        for row in &replayed {
            rebuild.adopt(row, |part| self.rendering(part).content);
        }
        let stored_next = self.stored_next;
        self.rebuilt(rebuild, stored_next)?;
        tracing::debug!(session = %self.key, rows = replayed.len(), "proxy: conversation resumed with the rows other instances wrote");
        Ok(())
    }

    /// How many messages were archived after the last one the record in the newest
    /// checkpoint names: what a rebuild reads again, each message's raw JSON analyzed (the
    /// session's own checkpoints, after a calibration or a compaction, keep the record last
    /// set: they do not shorten it).
    pub(super) fn replay_length(&self) -> u64 {
        self.session.manager().next_id().saturating_sub(self.stored_next)
    }

    /// What the conversation recorded, from the session as (re)loaded: the caller state of
    /// the checkpoint it restored, then every archived row after the last message that
    /// names, read back into entries ([`Rebuild`]).
    fn rebuild(&mut self) -> Result<(), ConvError> {
        let recorded = match self.session.caller_state() {
            [] => Recorded::new(self.recorded.window),
            bytes => Recorded::decode(bytes).map_err(ConvError::State)?,
        };
        let mut rebuild = Rebuild { recorded, pending: None, provider: self.provider };
        let named = rebuild.recorded.last_id();
        // The rows after the session's checkpoint are the ones its reload replayed; only
        // those between the last message the record names and that checkpoint are read.
        let replayed = self.session.take_replayed();
        let first = replayed.first().map_or(self.session.manager().next_id(), |row| row.id);
        if let Some(archive) = self.session.archive().filter(|_| named + 1 < first) {
            let scope = self.session.scope();
            let mut after = named;
            loop {
                let rows = archive.rows_after(scope, after, PAGE)?;
                for row in rows.iter().take_while(|row| row.id < first) {
                    rebuild.adopt(row, |part| self.rendering(part).content);
                }
                match rows.last() {
                    Some(last) if rows.len() == PAGE && last.id + 1 < first => after = last.id,
                    _ => break,
                }
            }
        }
        for row in replayed.iter().filter(|row| row.id > named) {
            rebuild.adopt(row, |part| self.rendering(part).content);
        }
        self.rebuilt(rebuild, named + 1)?;
        tracing::debug!(session = %self.key, messages = self.recorded.entries.len(), "proxy: conversation rebuilt from the store");
        Ok(())
    }

    /// Takes what `rebuild` read as the conversation's record, the checkpoint's record
    /// naming the messages before `stored_next`; completes a message whose writer stopped
    /// between its parts.
    fn rebuilt(&mut self, rebuild: Rebuild, stored_next: u64) -> Result<(), ConvError> {
        let (recorded, unfinished) = rebuild.finish();
        self.recorded = recorded;
        if let Some((message, next)) = unfinished {
            self.finish_message(&message, next)?;
        }
        self.stored_next = stored_next;
        self.pending_answer = None;
        self.last_emitted.clear();
        // Another instance forwarded since: its prompt, not this one's last, came before.
        self.prompt_blocks.clear();
        self.forwarded = None;
        self.dirty = false;
        self.exchanges = 0;
        self.evicted_any = self
            .recorded
            .entries
            .iter()
            .flat_map(|e| e.ids.iter())
            .any(|id| self.session.manager().get(*id).is_none());
        self.seen_reloads = self.session.counters().reloads;
        // The reply reserve is the conversation's, whichever instance raised it: the one the
        // newest checkpoint was configured with (its writer checkpointed any change before
        // writing on). A request asking the same changes nothing then, and checkpoints nothing.
        if let Some(stored) = self.session.checkpoint_configured() {
            self.reserve = Some(stored.reserved_for_reply);
        }
        Ok(())
    }
}

impl Conv {
    /// Pushes the parts of `message` from `next` on: the last recorded message, whose writer
    /// stopped before them (killed between two parts' writes). Its client's next request
    /// finds the message known; without them the rest would never be stored.
    fn finish_message(&mut self, message: &Analyzed, next: usize) -> Result<(), ConvError> {
        let pinned = self.recorded.entries.last().is_some_and(|e| e.pinned);
        tracing::warn!(session = %self.key, parts = message.parts.len() - next, "proxy: the last message lacks parts (its writer stopped); writing them");
        for part in message.parts.iter().skip(next) {
            let chat = self.rendering(part);
            let options = PushOptions { level: level_of(&chat, pinned), ..PushOptions::default() };
            let report = self.session.push_with(&chat, options)?;
            let tokens = self.session.manager().get(report.id).map_or(0, |m| m.tokens());
            self.recorded.extend_last(report.id, part.blocks.clone(), tokens);
        }
        Ok(())
    }
}

/// Reading archived rows back into the entries of what a conversation recorded, as
/// [`Conv::record`] made them: a row with raw JSON starts a message (its fingerprint, parts,
/// tool calls read again from that JSON); the rows of its further parts follow; a system
/// row of tool definitions is a placeholder; any other row the core wrote itself (the result
/// of a call it aborted), which the record leaves out as when it was written.
struct Rebuild {
    recorded: Recorded,
    /// The message whose further parts come next, and the index of the next.
    pending: Option<(Analyzed, usize)>,
    provider: Provider,
}

impl Rebuild {
    /// Adopts `row`; `rendering` is the text the proxy pushed for a part.
    fn adopt(&mut self, row: &ArchivedMessage, rendering: impl Fn(&Part) -> String) {
        if let Some(raw) = &row.raw {
            self.pending = None;
            match self.analyze(raw) {
                Ok(message) => self.start(row, raw, message),
                Err(reason) => {
                    tracing::warn!(
                        id = row.id,
                        reason,
                        "proxy: an archived message does not read; left out of the record"
                    );
                }
            }
            return;
        }
        if let Some((message, next)) = self.pending.take() {
            let fits = message.parts.get(next).is_some_and(|part| {
                part.chat.role == row.message.role && rendering(part) == row.full_text()
            });
            if fits {
                let blocks = message.parts[next].blocks.clone();
                self.recorded.extend_last(row.id, blocks, row.tokens);
                if next + 1 < message.parts.len() {
                    self.pending = Some((message, next + 1));
                }
                return;
            }
            self.pending = Some((message, next));
        }
        let tools = (row.message.role == Role::System)
            .then(|| row.full_text().strip_prefix(TOOLS_PREFIX))
            .flatten();
        if let Some(tools) = tools {
            // The fingerprint is the client's list's, without the recall tool it declared.
            let client = without_recall_tool(self.provider, tools);
            let parsed: Value = serde_json::from_str(&client).unwrap_or(Value::Null);
            self.recorded.placeholders.insert(row.id);
            self.recorded.tools_fp = hash_str(&canonical(&parsed));
        }
    }

    /// What was recorded; also the last message when some of its parts have no row (the
    /// instance writing it was killed between two), with the index of the first missing part.
    fn finish(self) -> (Recorded, Option<(Analyzed, usize)>) {
        (self.recorded, self.pending)
    }

    /// Reads `raw`: a message, or (Anthropic, first) the request's top-level `system`.
    fn analyze(&self, raw: &str) -> Result<Analyzed, String> {
        let value: Value = serde_json::from_str(raw).map_err(|e| e.to_string())?;
        if self.provider == Provider::Anthropic && !value.is_object() {
            let body = format!(r#"{{"model":"","system":{raw},"messages":[]}}"#);
            let request = Request::parse(self.provider, body.as_bytes()).map_err(|e| e.0)?;
            return analyze_item(self.provider, &request, 0).map_err(|e| e.0);
        }
        analyze_message(self.provider, &value)
    }

    /// Records message `message` whose first part is `row`.
    fn start(&mut self, row: &ArchivedMessage, raw: &str, message: Analyzed) {
        let leading = self.recorded.entries.last().is_none_or(|e| e.pinned);
        let entry = Entry {
            fp: message.fp,
            raw_hash: raw_hash(raw.as_bytes()),
            pinned: pins(&message, leading),
            calls: calls_hash(&message),
            ids: vec![row.id],
            blocks: vec![message.parts.first().map(|p| p.blocks.clone()).unwrap_or_default()],
            tokens: row.tokens,
            from_answer: false,
        };
        self.recorded.push(entry);
        if message.parts.len() > 1 {
            self.pending = Some((message, 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ctxwin_std::store::{ArchiveStore, Fence, MemoryStore, Scope};
    use serde_json::json;

    use super::*;
    use crate::conv::{Ingest, Stores};

    fn fleet() -> Stores {
        let store = Arc::new(MemoryStore::new());
        Stores::Fleet(Ports { archive: store.clone(), checkpoints: store })
    }

    fn open(stores: &Stores) -> Conv {
        let dir = std::path::Path::new("unused");
        let settings = ConvSettings::new(32_768, 1_024);
        Conv::open(dir, stores, "k", Provider::Anthropic, &settings).unwrap()
    }

    /// An Anthropic history: a system prompt, then `turns` turns of a call answered by two
    /// results in one user turn (two parts) and a text answer.
    fn history(turns: usize) -> Vec<Value> {
        let mut messages = vec![json!({"role": "user", "content": "build and test it"})];
        for t in 0..turns {
            let call = |n: usize| json!({"type": "tool_use", "id": format!("t{t}_{n}"), "name": "run", "input": {"n": n}});
            messages.push(json!({"role": "assistant", "content": [call(0), call(1)]}));
            let result = |n: usize| json!({"type": "tool_result", "tool_use_id": format!("t{t}_{n}"), "content": format!("step {n} of turn {t}: ok")});
            messages.push(json!({"role": "user", "content": [result(0), result(1)]}));
            messages.push(json!({"role": "assistant", "content": format!("turn {t} done")}));
            messages.push(json!({"role": "user", "content": format!("next, turn {}", t + 1)}));
        }
        messages
    }

    /// Takes `messages` (after catching up) and composes: the body forwarded.
    fn serve(conv: &mut Conv, messages: &[Value]) -> String {
        serve_asking(conv, messages, 64)
    }

    /// [`serve`], the request asking for `max_tokens`.
    fn serve_asking(conv: &mut Conv, messages: &[Value], max_tokens: u32) -> String {
        let tools = json!([{"name": "run", "input_schema": {"type": "object"}}]);
        let body = json!({"model": "m", "max_tokens": max_tokens, "system": "Be brief.", "tools": tools, "messages": messages});
        let request = Request::parse(Provider::Anthropic, body.to_string().as_bytes()).unwrap();
        let hashes = crate::wire::raw_hashes(&request);
        conv.catch_up().unwrap();
        assert!(matches!(conv.ingest(&request, &hashes).unwrap(), Ingest::Extended { .. }));
        String::from_utf8(conv.compose(&request).unwrap().body).unwrap()
    }

    fn rows(stores: &Stores) -> Vec<(u64, String)> {
        let Stores::Fleet(ports) = stores else { unreachable!() };
        let rows = ports.archive.rows_after(&Scope::local("k"), 0, 1_000).unwrap();
        rows.iter().map(|r| (r.id, r.full_text().to_string())).collect()
    }

    #[test]
    fn two_instances_taking_turns_forward_and_store_what_one_does() {
        let (shared, alone) = (fleet(), fleet());
        let (mut a, mut b, mut single) = (open(&shared), open(&shared), open(&alone));
        let full = history(4);
        for (turn, end) in (1..=full.len()).step_by(2).enumerate() {
            let conv = if turn % 2 == 0 { &mut a } else { &mut b };
            let forwarded = serve(conv, &full[..end]);
            assert_eq!(forwarded, serve(&mut single, &full[..end]), "request {turn}");
        }
        assert!(a.session().counters().reloads > 0 && b.session().counters().reloads > 0);
        assert_eq!(rows(&shared), rows(&alone), "each message once, in order");

        // The instance that served last is current; the other catches up with it.
        assert_ne!(a.len(), b.len());
        a.catch_up().unwrap();
        b.catch_up().unwrap();
        assert_eq!((a.len(), b.len()), (single.len(), single.len()));
        // Taking the conversation back, `b` resumed on its own state and record (nobody
        // checkpointed since): its record is the one a rebuild from the store makes.
        assert!(b.session().last_reload().unwrap().resumed);
        let rebuilt = open(&shared);
        assert_eq!(b.recorded.entries, rebuilt.recorded.entries);
        assert_eq!(b.recorded.placeholders, rebuilt.recorded.placeholders);
        assert_eq!(b.recorded.tools_fp, rebuilt.recorded.tools_fp);
    }

    #[test]
    fn a_rebuild_keeps_the_clients_tools_fingerprint_when_the_recall_tool_was_declared() {
        let shared = fleet();
        let settings = ConvSettings { recall_tool: true, ..ConvSettings::new(32_768, 1_024) };
        let dir = std::path::Path::new("unused");
        let open = || Conv::open(dir, &shared, "k", Provider::Anthropic, &settings).unwrap();
        let placeholders = || {
            let rows = rows(&shared);
            rows.iter().filter(|(_, text)| text.starts_with(TOOLS_PREFIX)).count()
        };
        let mut a = open();
        assert!(serve(&mut a, &history(1)).contains(crate::wire::RECALL_TOOL));
        assert_eq!(placeholders(), 1);
        let mut rebuilt = open();
        assert_eq!(rebuilt.recorded.tools_fp, a.recorded.tools_fp);
        serve(&mut rebuilt, &history(2));
        assert_eq!(placeholders(), 1, "the same tools are not pushed again");
    }

    /// Checkpoints written over the conversation's life, as of its newest: each records its
    /// writer's count, which a reload takes on.
    fn checkpoints_written(conv: &mut Conv) -> u64 {
        conv.catch_up().unwrap();
        conv.session().counters().checkpoints_written
    }

    #[test]
    fn a_takeover_writes_no_checkpoint_one_instance_would_not() {
        let (shared, alone) = (fleet(), fleet());
        let mut instances: Vec<Conv> = (0..3).map(|_| open(&shared)).collect();
        let mut single = open(&alone);
        let full = history(4);
        // The reserve changes twice in one instance's life (the first request; a larger
        // max_tokens), and the low-water mark once the pinned part is known.
        let asks = [64, 64, 64, 300, 64, 64, 64, 64, 64];
        for (turn, end) in (1..=full.len()).step_by(2).enumerate() {
            let conv = &mut instances[turn % 3];
            let forwarded = serve_asking(conv, &full[..end], asks[turn]);
            assert_eq!(forwarded, serve_asking(&mut single, &full[..end], asks[turn]));
        }
        assert!(instances.iter().all(|conv| conv.session().counters().reloads > 0));
        let alone = checkpoints_written(&mut single);
        assert!(alone > 0, "the configuration changed: checkpointed");
        // Each takeover continues from the configuration the conversation has: it changes
        // nothing a replay would miss, so it checkpoints nothing.
        assert_eq!(checkpoints_written(&mut instances[0]), alone);
        let configured = |conv: &Conv| *conv.session().configured();
        assert!(instances.iter().all(|conv| configured(conv) == configured(&single)));
    }

    #[test]
    fn a_message_whose_writer_stopped_between_its_parts_is_completed() {
        let stores = fleet();
        let mut a = open(&stores);
        let messages = &history(1)[..3];
        serve(&mut a, messages);
        let written = rows(&stores);
        // Killed between the two results' writes: the second part's row is missing.
        let Stores::Fleet(ports) = &stores else { unreachable!() };
        let last = written.last().unwrap().0;
        ports.archive.delete_from(&Scope::local("k"), Fence::NONE, last).unwrap();
        let mut b = open(&stores);
        assert_eq!(rows(&stores), written, "the missing part is written again");
        assert_eq!(b.recorded.entries.last().unwrap().ids.len(), 2);
        serve(&mut b, messages);
        assert_eq!(rows(&stores), written, "and the request resent finds it known");
    }
}
