//! `cli.json`: what the command line counts itself across processes (items retrieved into
//! payloads, the last compression), beside the session's checkpoints.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::CliError;

/// The last command that evicted or summarized anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Compression {
    /// When it ran, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Which command (`add`, `import`, `build`, `compress`, `summarize`).
    pub command: String,
    /// Units it evicted to the archive.
    pub units_evicted: u64,
    /// Tokens in those units.
    pub tokens_evicted: u64,
    /// Summaries it added or rewrote.
    pub summaries: u64,
    /// Tokens in the context after it.
    pub tokens_after: u32,
}

/// The notes file's content.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Notes {
    /// Archived messages `build --retrieve` put into payloads.
    pub retrieved_items: u64,
    /// The last compression.
    pub last_compression: Option<Compression>,
    /// The content as loaded, to skip writing when nothing changed.
    #[serde(skip)]
    loaded: Option<Box<Notes>>,
}

impl Notes {
    /// Reads the notes at `path`; a missing file is empty notes, a damaged one an error.
    pub(crate) fn load(path: &Path) -> Result<Notes, CliError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Notes::default());
            }
            Err(error) => return Err(CliError::io("read", path, &error)),
        };
        let mut notes: Notes = serde_json::from_str(&text).map_err(|e| {
            CliError::Corrupt(format!(
                "{} is damaged ({e}); delete it to reset the retrieved-items count and last compression",
                path.display()
            ))
        })?;
        notes.loaded = Some(Box::new(notes.clone()));
        Ok(notes)
    }

    /// Writes the notes to `path` (through a temporary file, so a crash leaves the old or the
    /// new content) when they differ from what was loaded.
    pub(crate) fn save_if_changed(&mut self, path: &Path) -> Result<(), CliError> {
        let current = Notes { loaded: None, ..self.clone() };
        if self.loaded.as_deref() == Some(&current)
            || (self.loaded.is_none() && current == Notes::default())
        {
            return Ok(());
        }
        let json = serde_json::to_string_pretty(&current)
            .map_err(|e| CliError::Internal(format!("notes do not serialize: {e}")))?;
        ctxwin_std::statefs::replace_file(path, (json + "\n").as_bytes())?;
        self.loaded = Some(Box::new(current));
        Ok(())
    }
}

/// The system clock in milliseconds since the Unix epoch (0 before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
}

/// How long ago `at_ms` was, in words ("12 s ago", "3 min ago", "5 h ago", "2 d ago").
pub(crate) fn ago(at_ms: u64, now_ms: u64) -> String {
    let secs = now_ms.saturating_sub(at_ms) / 1000;
    match secs {
        0..60 => format!("{secs} s ago"),
        60..3600 => format!("{} min ago", secs / 60),
        3600..86_400 => format!("{} h ago", secs / 3600),
        _ => format!("{} d ago", secs / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip_and_skip_needless_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cli.json");
        let mut notes = Notes::load(&path).unwrap();
        notes.save_if_changed(&path).unwrap();
        assert!(!path.exists(), "empty notes are not written");
        notes.retrieved_items = 3;
        notes.save_if_changed(&path).unwrap();
        let loaded = Notes::load(&path).unwrap();
        assert_eq!(loaded.retrieved_items, 3);
        std::fs::write(&path, "{broken").unwrap();
        let error = Notes::load(&path).unwrap_err();
        assert_eq!(error.exit(), crate::Exit::Corrupt);
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(ago(0, 5_000), "5 s ago");
        assert_eq!(ago(0, 180_000), "3 min ago");
        assert_eq!(ago(0, 7_200_000), "2 h ago");
        assert_eq!(ago(10, 0), "0 s ago");
    }
}
