//! Composing the body to forward: the session's payload, each message the client sent
//! written back from its raw JSON (as this request carried it), reduced where the core
//! reduced it, with what the core adds (retrieved text, summaries) in the provider's shape.

use std::collections::HashMap;

use ctxwin_std::ChatMessage;
use ctxwin_std::core::Level;
use ctxwin_std::session::{ComposeOptions, RecallFor};

use super::{Composed, Conv, ConvError};
use crate::wire::{KeptPart, ManagedBody, Provider, Request};

/// A message to emit, in payload order.
enum Slot {
    Entry(usize),
    Core(ChatMessage),
}

impl Conv {
    /// Composes the payload for `request` and writes the body to forward.
    ///
    /// # Errors
    /// `PinnedOverBudget` when what must stay does not fit; `ToolCallsPending`; store errors.
    pub fn compose(&mut self, request: &Request) -> Result<Composed, ConvError> {
        // Retrieval leaves out what the payload holds: before anything of this conversation
        // left the core it can find nothing, and its full-text search is most of a request's
        // cost (the archive is shared by every conversation).
        let recall = if self.evicted_any { RecallFor::Settings } else { RecallFor::Nothing };
        let payload = self.session.compose_with(ComposeOptions::new(&[]).recall(recall))?;
        self.evicted_any |= payload.evicted_units > 0;
        let manager = self.session.manager();
        let permanent: Vec<_> = manager.messages(Level::Permanent).collect();
        let history: Vec<_> = manager.history().collect();
        let rendered = &payload.conversation.messages;
        let system_end = rendered.len().saturating_sub(history.len());
        let extra: Vec<String> = rendered
            .get(permanent.len().min(system_end)..system_end)
            .unwrap_or_default()
            .iter()
            .map(|m| m.content.clone())
            .collect();
        // Which parts of each entry the payload keeps, and the reduced text of kept parts.
        let mut kept: HashMap<usize, Vec<KeptPart>> = HashMap::new();
        let mut order: Vec<Slot> = Vec::new();
        let mut emitted_ids = Vec::new();
        let mut first_history = None;
        for (n, message) in permanent.iter().chain(history.iter()).enumerate() {
            if n == permanent.len() {
                first_history = Some(order.len());
            }
            let id = message.id();
            if self.recorded.placeholders.contains(&id) {
                continue;
            }
            emitted_ids.push(id);
            match self.recorded.locate(id) {
                Some((entry, part)) => {
                    let reduced = message.was_reduced().then(|| message.content().to_string());
                    let parts = kept.entry(entry).or_default();
                    if parts.is_empty() {
                        order.push(Slot::Entry(entry));
                    }
                    parts.push(KeptPart { part, reduced });
                }
                None => order.push(Slot::Core(ChatMessage {
                    role: message.role(),
                    content: message.content().to_string(),
                    tool_calls: Vec::new(),
                    tool_call_id: message.tool_call_id().map(str::to_string),
                    is_error: false,
                    name: None,
                })),
            }
        }
        let tokens = payload.tokens;
        let evicted = payload.evicted_units;
        let mut body = ManagedBody::new(self.provider, request, extra);
        for (n, slot) in order.into_iter().enumerate() {
            if first_history == Some(n) {
                body.history_starts();
            }
            match slot {
                Slot::Entry(e) => {
                    let raw = self.raw(request, e)?;
                    if self.provider == Provider::Anthropic && request.has_system_item && e == 0 {
                        body.system(raw);
                        continue;
                    }
                    let parts = kept.remove(&e).unwrap_or_default();
                    body.message(&raw, &self.recorded.entries[e].blocks, &parts);
                }
                Slot::Core(chat) => body.core_message(&chat),
            }
        }
        let body = body.finish();
        let cache_stable =
            !self.last_emitted.is_empty() && emitted_ids.starts_with(&self.last_emitted);
        self.last_emitted = emitted_ids;
        self.dirty = true;
        Ok(Composed { body, tokens, evicted, cache_stable })
    }

    /// The raw JSON of entry `e`: from this request, or else its archive row.
    fn raw(&self, request: &Request, e: usize) -> Result<String, ConvError> {
        if let Some(raw) = request.items.get(e) {
            return Ok(raw.get().to_string());
        }
        let id = self.recorded.entries.get(e).and_then(|entry| entry.ids.first().copied());
        let archive = self.session.archive();
        let row = match (id, archive) {
            (Some(id), Some(archive)) => archive.get(self.session.scope(), id)?,
            _ => None,
        };
        row.and_then(|row| row.raw).ok_or_else(|| {
            ConvError::State(format!("message {e}'s raw JSON is not in the archive (id {id:?})"))
        })
    }
}
