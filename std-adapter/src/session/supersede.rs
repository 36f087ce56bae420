//! Which tool results a newer one supersedes: results of the same call (the same tool with
//! the same arguments) of the tools named by [`SessionBuilder::supersede`]. A file read again
//! shows the file as it is now, so the core cuts the older read to a note at its next
//! compaction ([`ctxwin_core::Message::supersede_key`]), and the archive keeps it whole.
//!
//! The key is computed at every push, replays included, from the result's call in the core:
//! a session reloaded from its rows keys them as their writer did.
//!
//! [`SessionBuilder::supersede`]: super::SessionBuilder::supersede

use ctxwin_core::Role;

use super::Session;
use crate::format::fingerprint::{FNV_SEED, fnv1a};
use crate::message::ChatMessage;

/// The supersede key of a result of tool `name` called with `arguments`: 64-bit FNV-1a over
/// the name and the arguments as serde_json writes them back (so that spacing does not
/// matter), folded to 32 bits, never 0 (no key).
///
/// ```
/// use ctxwin_std::session::supersede_key;
/// let read = supersede_key("Read", r#"{"file_path": "/src/lib.rs"}"#);
/// assert_eq!(read, supersede_key("Read", r#"{"file_path":"/src/lib.rs"}"#));
/// assert_ne!(read, supersede_key("Read", r#"{"file_path":"/src/main.rs"}"#));
/// assert_ne!(read, 0);
/// ```
pub fn supersede_key(name: &str, arguments: &str) -> u32 {
    let canonical = serde_json::from_str::<serde_json::Value>(arguments)
        .map_or_else(|_| arguments.to_string(), |value| value.to_string());
    let hash = fnv1a(fnv1a(fnv1a(FNV_SEED, name.as_bytes()), &[0]), canonical.as_bytes());
    ((hash >> 32) as u32 ^ hash as u32).max(1)
}

impl Session {
    /// The supersede key of `message` as pushed now: for a successful result of a call of a
    /// tool the session supersedes, [`supersede_key`] of that call; else 0.
    pub(super) fn supersede_key_of(&self, message: &ChatMessage) -> u32 {
        if message.role != Role::Tool || message.is_error || self.supersede.is_empty() {
            return 0;
        }
        let Some(call_id) = message.tool_call_id.as_deref() else { return 0 };
        let Some(head) = self.pending_head() else { return 0 };
        head.tool_calls()
            .find(|call| call.id == call_id)
            .filter(|call| self.supersede.iter().any(|tool| tool == call.name))
            .map_or(0, |call| supersede_key(call.name, call.arguments))
    }

    /// The tools whose results a newer result of the same call supersedes.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").supersede(["Read"]).build()?;
    /// assert_eq!(session.supersede_tools(), ["Read"]);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn supersede_tools(&self) -> &[String] {
        &self.supersede
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ctxwin_core::{Config, Role};

    use crate::message::{ChatMessage, ToolCall};
    use crate::session::{Session, SessionBuilder};
    use crate::store::{MemoryStore, Ports};

    const NOTE: &str = ctxwin_core::manager::SUPERSEDED_NOTE;

    fn config() -> Config {
        Config {
            context_window: 6_000,
            reserved_for_reply: 500,
            low_water_percent: 40,
            ..Config::DEFAULT
        }
    }

    /// Reads of files `turn % 3` (and a failed read of file 0 at turn 4); returns each
    /// result's id and file.
    fn read_files(session: &mut Session, turns: std::ops::Range<usize>) -> Vec<(u64, usize)> {
        let mut ids = Vec::new();
        for turn in turns {
            let (call, file) = (format!("r{turn}"), turn % 3);
            session.push(&ChatMessage::text(Role::User, format!("look at f{file}.rs"))).unwrap();
            let arguments = format!(r#"{{"file_path": "/src/f{file}.rs"}}"#);
            let calls = vec![ToolCall::new(call.clone(), "Read", arguments)];
            session.push(&ChatMessage::assistant_calls("", calls)).unwrap();
            let text: String =
                (0..40).map(|i| format!("{i:>6}\tturn {turn} f{file} line {i}\n")).collect();
            let mut result = ChatMessage::tool_result(call, text);
            result.is_error = turn == 4;
            ids.push((session.push(&result).unwrap().id, file));
        }
        ids
    }

    fn contents(session: &Session) -> Vec<String> {
        session.manager().history().map(|m| m.content().to_string()).collect()
    }

    #[test]
    fn a_file_read_again_supersedes_the_older_read_and_the_archive_keeps_it_whole() {
        let store = Arc::new(MemoryStore::new());
        let build = |name: &str, tools: &[&str]| {
            let ports = Ports { archive: store.clone(), checkpoints: store.clone() };
            let builder = SessionBuilder::new(name).ports(ports).config(config());
            builder.supersede(tools.iter().copied()).build().unwrap()
        };
        let mut session = build("keyed", &["Read"]);
        let ids = read_files(&mut session, 0..30);
        let mut plain = build("plain", &[]);
        read_files(&mut plain, 0..30);
        let cut: Vec<_> = ids
            .iter()
            .filter(|(id, _)| session.manager().get(*id).is_some_and(|m| m.content() == NOTE))
            .collect();
        assert!(!cut.is_empty(), "{:?}", contents(&session));
        for (id, file) in &cut {
            assert!(*id != ids[4].0, "a failed read is not keyed");
            let newer = ids.iter().any(|(other, f)| other > id && f == file);
            assert!(newer, "only a read of a file read again is cut");
            let row = session.archive().unwrap().get(session.scope(), *id).unwrap().unwrap();
            assert!(row.full_text().contains("line 39"), "the archive keeps it whole");
        }
        assert!(!contents(&plain).iter().any(|c| c == NOTE), "no tools named, nothing cut");
        let evicted = |s: &Session| s.manager().stats().counters.units_evicted;
        assert!(evicted(&session) < evicted(&plain), "{} / {}", evicted(&session), evicted(&plain));
    }

    #[test]
    fn a_reload_from_rows_keys_the_reads_as_their_writer_did() {
        let store = Arc::new(MemoryStore::new());
        let build = || {
            let ports = Ports { archive: store.clone(), checkpoints: store.clone() };
            let builder = SessionBuilder::new("s").ports(ports).config(config());
            builder.supersede(["Read"]).assume_new(true).build().unwrap()
        };
        let (mut writer, mut reader) = (build(), build());
        read_files(&mut writer, 0..3);
        writer.checkpoint().unwrap();
        read_files(&mut writer, 3..30);
        assert!(contents(&writer).iter().any(|c| c == NOTE));
        assert!(reader.reload().unwrap().replayed > 0);
        assert_eq!(contents(&reader), contents(&writer), "replayed with the same keys");
    }
}
