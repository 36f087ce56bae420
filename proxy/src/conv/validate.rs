//! Checking a request's new messages before any of them is pushed: a request the proxy
//! refuses stores nothing (issue 26). Every new message must read (done by the caller, which
//! analyzes them all first), the session must accept each (its shape and size, asked of the
//! core), and every tool result must answer a call: one pending in the session when it comes
//! first, or else a call of the request's own latest assistant message, once — the pairing
//! the providers' APIs require of a request.

use std::collections::HashSet;

use ctxwin_std::ChatMessage;
use ctxwin_std::core::{Level, Role};
use ctxwin_std::session::PushOptions;

use super::{Conv, ConvError};
use crate::wire::{Analyzed, Request};

/// The level a part of a message is pushed at: a system message leading the conversation is
/// permanent (`pinned`), another one working; the rest take their role's default.
pub(super) fn level_of(chat: &ChatMessage, pinned: bool) -> Option<Level> {
    (chat.role == Role::System).then_some(if pinned { Level::Permanent } else { Level::Working })
}

/// Whether `message` is pinned when it follows a pinned (or no) message, `leading`.
pub(super) fn pins(message: &Analyzed, leading: bool) -> bool {
    leading && message.parts.len() == 1 && message.parts[0].chat.role == Role::System
}

impl Conv {
    /// Checks `new`, the request's messages after those recorded, in order, and the tool
    /// definitions it would push, without storing anything.
    ///
    /// # Errors
    /// The session's refusal ([`ConvError::Session`]) or [`ConvError::BadRequest`] for a tool
    /// result that answers no call of the request.
    pub(super) fn validate(
        &mut self,
        request: &Request,
        new: &[(usize, Analyzed)],
    ) -> Result<(), ConvError> {
        if let Some((_, text)) = self.tools_to_push(request) {
            let options = PushOptions { level: Some(Level::Permanent), ..PushOptions::default() };
            self.session.check(&ChatMessage::text(Role::System, text), options)?;
        }
        let mut leading = self.recorded.entries.last().is_none_or(|e| e.pinned);
        // Calls of the request's latest new assistant message still unanswered; `None` until
        // a new message other than a tool result comes (results answer the session's calls).
        let mut calls: Option<HashSet<String>> = None;
        let mut answered: HashSet<String> = HashSet::new();
        for (index, message) in new {
            let pinned = pins(message, leading);
            leading = pinned;
            for part in &message.parts {
                let chat = self.rendering(part);
                let options = PushOptions { level: level_of(&chat, pinned), ..Default::default() };
                let Some(call) = chat.tool_call_id.as_deref().filter(|_| chat.role == Role::Tool)
                else {
                    self.session.check(&chat, options)?;
                    calls = Some(chat.tool_calls.iter().map(|c| c.id.clone()).collect());
                    continue;
                };
                let paired = match calls.as_mut() {
                    Some(calls) => calls.remove(call),
                    None => answered.insert(call.to_string()),
                };
                if !paired {
                    return Err(ConvError::BadRequest(format!(
                        "messages[{}]: a tool result for call {call:?}, which no earlier message of the request leaves unanswered",
                        request.message_index(*index)
                    )));
                }
                if calls.is_none() {
                    self.session.check(&chat, options)?;
                }
            }
        }
        Ok(())
    }
}
