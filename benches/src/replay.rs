//! The benchmark workload's source: a recorded 1,000-message agent session in OpenAI
//! chat-completions JSONL (`benches/data/conv_1000.jsonl.gz`: a system prompt, user and
//! assistant turns, parallel tool calls with their results, every 31st tool result 16–40 KB),
//! split into turns and replayed as often as a long history needs, with fresh tool-call ids.

use std::io::BufReader;

use ctxwin_core::{Message, Role, ToolCall};
use ctxwin_std::ChatMessage;
use ctxwin_std::format::{self, Format};
use flate2::read::GzDecoder;

use crate::DataError;

/// The shipped session, gzip-compressed OpenAI JSONL (852,980 bytes, 1,000 messages).
pub const CONV_1000_GZ: &[u8] = include_bytes!("../data/conv_1000.jsonl.gz");

/// Caller's-clock milliseconds between two replayed messages.
pub const MESSAGE_INTERVAL_MS: u64 = 5_000;

/// One user turn: a user message and everything up to the next one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// The turn's messages, in order.
    pub messages: Vec<ChatMessage>,
}

impl Turn {
    /// Text bytes of the turn: contents, tool-call ids, names and arguments, result ids.
    ///
    /// ```
    /// use ctxwin_benches::replay::Turn;
    /// use ctxwin_std::ChatMessage;
    /// let turn = Turn { messages: vec![ChatMessage::tool_result("c1", "ok")] };
    /// assert_eq!(turn.bytes(), 4);
    /// ```
    pub fn bytes(&self) -> usize {
        self.messages
            .iter()
            .map(|m| {
                let calls: usize = m
                    .tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                    .sum();
                m.content.len() + calls + m.tool_call_id.as_ref().map_or(0, String::len)
            })
            .sum()
    }

    /// The same turn with every tool-call id (in calls and in results) prefixed by `prefix`,
    /// so a replayed turn never reuses an id of an earlier round.
    ///
    /// ```
    /// use ctxwin_benches::replay::Turn;
    /// use ctxwin_std::{ChatMessage, ToolCall};
    /// let turn = Turn {
    ///     messages: vec![
    ///         ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "ls", "{}")]),
    ///         ChatMessage::tool_result("c1", "ok"),
    ///     ],
    /// };
    /// let fresh = turn.with_id_prefix("r7_");
    /// assert_eq!(fresh.messages[0].tool_calls[0].id, "r7_c1");
    /// assert_eq!(fresh.messages[1].tool_call_id.as_deref(), Some("r7_c1"));
    /// ```
    pub fn with_id_prefix(&self, prefix: &str) -> Turn {
        let mut turn = self.clone();
        for message in &mut turn.messages {
            for call in &mut message.tool_calls {
                call.id.insert_str(0, prefix);
            }
            if let Some(id) = &mut message.tool_call_id {
                id.insert_str(0, prefix);
            }
        }
        turn
    }
}

/// The recorded session: its leading system messages and its turns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// System messages before the first turn (pushed once, never replayed).
    pub system: Vec<ChatMessage>,
    /// The turns, in order.
    pub turns: Vec<Turn>,
}

impl Session {
    /// Decompresses and parses the shipped session ([`CONV_1000_GZ`]).
    ///
    /// # Errors
    ///
    /// [`DataError`] if the shipped file is damaged.
    ///
    /// ```
    /// let session = ctxwin_benches::replay::Session::load()?;
    /// assert_eq!(session.system.len(), 1);
    /// assert_eq!(session.message_count(), 1_000);
    /// # Ok::<(), ctxwin_benches::DataError>(())
    /// ```
    pub fn load() -> Result<Session, DataError> {
        let reader = BufReader::new(GzDecoder::new(CONV_1000_GZ));
        let conversation = format::read_from(reader, Format::OpenAiJsonl)?;
        Ok(Session::from_messages(conversation.messages))
    }

    /// Splits messages into the leading system messages and turns, each starting at a user
    /// message (messages before the first user message form a turn of their own).
    ///
    /// ```
    /// use ctxwin_benches::replay::Session;
    /// use ctxwin_std::ChatMessage;
    /// use ctxwin_core::Role;
    /// let session = Session::from_messages(vec![
    ///     ChatMessage::text(Role::System, "be brief"),
    ///     ChatMessage::text(Role::User, "hi"),
    ///     ChatMessage::text(Role::Assistant, "hello"),
    ///     ChatMessage::text(Role::User, "bye"),
    /// ]);
    /// assert_eq!(session.turns.len(), 2);
    /// assert_eq!(session.turns[0].messages.len(), 2);
    /// ```
    pub fn from_messages(messages: Vec<ChatMessage>) -> Session {
        let mut system = Vec::new();
        let mut turns: Vec<Turn> = Vec::new();
        for message in messages {
            let opens_turn = message.role == Role::User || turns.is_empty();
            if message.role == Role::System && turns.is_empty() {
                system.push(message);
            } else if opens_turn {
                turns.push(Turn { messages: vec![message] });
            } else if let Some(turn) = turns.last_mut() {
                turn.messages.push(message);
            }
        }
        Session { system, turns }
    }

    /// Messages in the session, system messages included.
    pub fn message_count(&self) -> usize {
        self.system.len() + self.turns.iter().map(|t| t.messages.len()).sum::<usize>()
    }

    /// The `index`-th turn of an endless replay: round `index / turns` of the session, with
    /// ids prefixed `r{round}_` from the second round on.
    ///
    /// ```
    /// let session = ctxwin_benches::replay::Session::load()?;
    /// let n = session.turns.len();
    /// assert_eq!(session.replayed_turn(0), session.turns[0]);
    /// let again = session.replayed_turn(n);
    /// assert_eq!(again.messages.len(), session.turns[0].messages.len());
    /// assert_ne!(again, session.turns[0]);
    /// # Ok::<(), ctxwin_benches::DataError>(())
    /// ```
    pub fn replayed_turn(&self, index: usize) -> Turn {
        let count = self.turns.len().max(1);
        let round = index / count;
        match self.turns.get(index % count) {
            Some(turn) if round == 0 => turn.clone(),
            Some(turn) => turn.with_id_prefix(&format!("r{round}_")),
            None => Turn { messages: Vec::new() },
        }
    }

    /// A typical tool-using turn, with ids prefixed `probe_`: the session's first turn (a
    /// question, an assistant message with three parallel calls, their three results and an
    /// answer; 6 messages, about 3.8 KB).
    pub fn typical_turn(&self) -> Turn {
        self.turns.first().map_or(Turn { messages: Vec::new() }, |t| t.with_id_prefix("probe_"))
    }

    /// A heavy turn, with ids prefixed `probe_`: the first turn holding a tool result over
    /// 16 KB (reduced to head and tail on push).
    pub fn heavy_turn(&self) -> Turn {
        self.turns
            .iter()
            .find(|t| t.messages.iter().any(|m| m.role == Role::Tool && m.content.len() > 16_384))
            .map_or(Turn { messages: Vec::new() }, |t| t.with_id_prefix("probe_"))
    }

    /// Tool-output lines of the session joined until `len` bytes (cut at a line end):
    /// a realistic large observation.
    ///
    /// ```
    /// let session = ctxwin_benches::replay::Session::load()?;
    /// let output = session.tool_output(40 * 1024);
    /// assert!(output.len() <= 40 * 1024 && output.len() > 39 * 1024);
    /// # Ok::<(), ctxwin_benches::DataError>(())
    /// ```
    pub fn tool_output(&self, len: usize) -> String {
        let mut output = String::with_capacity(len);
        let lines = self
            .turns
            .iter()
            .flat_map(|t| &t.messages)
            .filter(|m| m.role == Role::Tool)
            .flat_map(|m| m.content.lines());
        for line in lines {
            if output.len() + line.len() + 1 > len {
                break;
            }
            output.push_str(line);
            output.push('\n');
        }
        output
    }
}

/// The core tool calls of each message (empty for messages without), to borrow from.
///
/// ```
/// use ctxwin_benches::replay::tool_calls;
/// use ctxwin_std::{ChatMessage, ToolCall};
/// let messages = [ChatMessage::assistant_calls("", vec![ToolCall::new("c1", "ls", "{}")])];
/// assert_eq!(tool_calls(&messages)[0][0].name, "ls");
/// ```
pub fn tool_calls(messages: &[ChatMessage]) -> Vec<Vec<ToolCall<'_>>> {
    messages
        .iter()
        .map(|m| m.tool_calls.iter().map(ctxwin_std::ToolCall::as_core).collect())
        .collect()
}

/// Core messages borrowing `messages` and their `calls` (from [`tool_calls`]), stamped
/// `clock`, `clock + MESSAGE_INTERVAL_MS`, …
///
/// ```
/// use ctxwin_benches::replay::{core_messages, tool_calls};
/// use ctxwin_std::ChatMessage;
/// use ctxwin_core::Role;
/// let messages = [ChatMessage::text(Role::User, "hi"), ChatMessage::tool_result("c1", "ok")];
/// let calls = tool_calls(&messages);
/// let core = core_messages(&messages, &calls, 1_000);
/// assert_eq!(core[1].tool_call_id, Some("c1"));
/// assert_eq!(core[1].timestamp, 6_000);
/// ```
pub fn core_messages<'a>(
    messages: &'a [ChatMessage],
    calls: &'a [Vec<ToolCall<'a>>],
    clock: u64,
) -> Vec<Message<'a>> {
    messages
        .iter()
        .zip(calls)
        .zip(0u64..)
        .map(|((m, calls), i)| {
            let at = clock + i * MESSAGE_INTERVAL_MS;
            match &m.tool_call_id {
                Some(id) if m.role == Role::Tool => Message::tool_result(id, &m.content).at(at),
                _ => Message::new(m.role, &m.content).with_tool_calls(calls).at(at),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_shipped_session_splits_into_turns_that_start_with_a_user_message() {
        let session = Session::load().unwrap();
        assert_eq!(session.system.len(), 1);
        assert_eq!(session.turns.len(), 264);
        assert!(session.turns.iter().all(|t| t.messages[0].role == Role::User));
        assert_eq!(session.message_count(), 1_000);
    }

    #[test]
    fn replayed_rounds_never_reuse_a_tool_call_id() {
        let session = Session::load().unwrap();
        let n = session.turns.len();
        let mut ids = HashSet::new();
        for index in 0..3 * n {
            for message in session.replayed_turn(index).messages {
                for call in message.tool_calls {
                    assert!(ids.insert(call.id.clone()), "{} reused", call.id);
                }
            }
        }
        assert_eq!(ids.len(), 3 * 283);
    }

    #[test]
    fn probe_turns_are_the_documented_shapes() {
        let session = Session::load().unwrap();
        let typical = session.typical_turn();
        let roles: Vec<Role> = typical.messages.iter().map(|m| m.role).collect();
        use Role::{Assistant as A, Tool as T, User as U};
        assert_eq!(roles, [U, A, T, T, T, A]);
        assert!(typical.messages[2].tool_call_id.as_deref().unwrap().starts_with("probe_"));
        let heavy = session.heavy_turn();
        assert!(heavy.bytes() > 16_384);
        assert!(heavy.messages.iter().any(|m| m.content.len() > 16_384));
    }

    #[test]
    fn core_messages_keep_roles_contents_and_calls() {
        let session = Session::load().unwrap();
        let turn = session.typical_turn();
        let calls = tool_calls(&turn.messages);
        let core = core_messages(&turn.messages, &calls, 0);
        assert_eq!(core.len(), turn.messages.len());
        for (core, chat) in core.iter().zip(&turn.messages) {
            assert_eq!(core.role, chat.role);
            assert_eq!(core.content, chat.content);
            assert_eq!(core.tool_calls.len(), chat.tool_calls.len());
            assert_eq!(core.tool_call_id, chat.tool_call_id.as_deref());
        }
    }
}
