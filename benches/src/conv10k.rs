//! The 10,000-message session the cache-cost and cold-trim benches replay:
//! `benches/data/conv_10000.jsonl.gz` (OpenAI chat-completions JSONL, 8.6 MB uncompressed:
//! one system prompt, 2,595 user and 4,554 assistant messages, 2,850 tool results), read at
//! run time (not embedded, so other bench binaries do not carry its 1.9 MB).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use ctxwin_std::ChatMessage;
use ctxwin_std::format::{self, Format};
use flate2::read::GzDecoder;

use crate::DataError;

/// Where the shipped file is.
pub fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/conv_10000.jsonl.gz")
}

/// Decompresses and parses the shipped session: every message in file order, the system
/// prompt first.
///
/// # Errors
///
/// [`DataError`] if the file is missing or damaged.
pub fn load() -> Result<Vec<ChatMessage>, DataError> {
    let reader = BufReader::new(GzDecoder::new(File::open(path())?));
    let conversation = format::read_from(reader, Format::OpenAiJsonl)?;
    let mut messages = Vec::with_capacity(conversation.messages.len() + 1);
    if let Some(system) = conversation.system {
        messages.push(ChatMessage::text(ctxwin_core::Role::System, system));
    }
    messages.extend(conversation.messages);
    Ok(messages)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shipped_session_has_ten_thousand_messages() {
        let messages = super::load().unwrap();
        assert_eq!(messages.len(), 10_000);
        assert_eq!(messages[0].role, ctxwin_core::Role::System);
    }
}
