//! Taking a request's history into the conversation: the longest common prefix with what is
//! recorded is known (equal raw bytes need no reading), the rest is pushed, each message as
//! the core's text plus a filler standing for its opaque blocks' cost, its raw JSON kept in
//! its archive row.

use std::time::Instant;

use ctxwin_std::ChatMessage;
use ctxwin_std::core::counter::TokenCounter;
use ctxwin_std::core::{Level, Role};
use ctxwin_std::session::PushOptions;
use serde_json::Value;

use super::state::Entry;
use super::validate::{level_of, pins};
use super::{Conv, ConvError, Ingest};
use crate::hash::{canonical, hash_str};
use crate::wire::{Analyzed, Part, Request, analyze_item, raw_hash, tools_with_recall};

/// What the proxy pushes for a request's tool definitions, before their JSON
/// ([`Conv::tools_to_push`]).
pub(super) const TOOLS_PREFIX: &str = "[tool definitions]\n";

impl Conv {
    /// Compares the request's history with the recorded sequence and pushes what is new; the
    /// rows are queued to the archive's writer as they are pushed (written with other
    /// conversations' rows, many to a transaction). `hashes` are the items' raw hashes
    /// ([`crate::wire::raw_hashes`]): a message sent with the same bytes as last time is known
    /// without being read.
    ///
    /// # Errors
    /// [`ConvError::BadRequest`] for a message that does not read; session refusals (a tool
    /// result without its call, a message larger than its level) and store failures. Every
    /// new message is read and checked before any is pushed, so a refused request stores
    /// nothing; a store failure after that leaves the messages pushed before it recorded.
    pub fn ingest(&mut self, request: &Request, hashes: &[u64]) -> Result<Ingest, ConvError> {
        self.last_used = Instant::now();
        self.fit_reply(request)?;
        // A request that diverges belongs to another branch: this one, its waiting answer
        // included, is left as it is.
        if let Some(at) = self.compare_prefix(request, hashes)? {
            return Ok(Ingest::Diverged(at));
        }
        let known = self.recorded.entries.len();
        let incoming = request.items.len();
        // Every new message is read and checked before any is pushed: a refused request
        // stores nothing.
        let new = (known..incoming)
            .map(|i| analyze_item(self.provider, request, i).map(|message| (i, message)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConvError::BadRequest(e.0))?;
        self.validate(request, &new)?;
        self.settle_answer();
        if let Some(last) = self.recorded.entries.last_mut()
            && last.from_answer
            && incoming > known
        {
            last.from_answer = false;
        }
        let now = self.request_time();
        let mut evicted = self.compact_if_cold(request, now)?;
        evicted += self.take_tools(request)?;
        for (i, message) in &new {
            evicted += self.record(message, request.items[*i].get(), hashes[*i])?;
        }
        let tokens_in = self.recorded.entries.iter().map(|e| u64::from(e.tokens)).sum();
        self.evicted_any |= evicted > 0;
        self.recall_stale |= evicted > 0;
        Ok(Ingest::Extended { new: new.len(), tokens_in, evicted })
    }

    /// Settles the answer still waiting, for a request that follows the recorded messages
    /// and was accepted: it carries the client's copy of the answer (pushed with its new
    /// messages, as the client sent it), or it supersedes the answer — a retry or a
    /// regenerate: the client did not keep it, so it is dropped and resending a request does
    /// not grow the conversation.
    fn settle_answer(&mut self) {
        if self.pending_answer.take().is_some() {
            self.dirty = true;
        }
    }

    /// The request's tool definitions when they changed since the last pushed: their
    /// fingerprint and the text pushed for them: the tools the body declares, the recall
    /// tool included (pinned like the client's: its tokens are the prompt's). Definitions
    /// byte for byte those of the last request are not parsed again: a coding agent's are
    /// tens of KB, sent unchanged with every request.
    pub(super) fn tools_to_push(&mut self, request: &Request) -> Option<(u64, String)> {
        let tools = request.fields.get("tools")?;
        let raw = raw_hash(tools.get().as_bytes());
        if self.tools_seen == (raw, self.recorded.tools_fp) {
            return None;
        }
        let parsed: Value = serde_json::from_str(tools.get()).unwrap_or(Value::Null);
        let fp = hash_str(&canonical(&parsed));
        if fp == self.recorded.tools_fp || parsed.as_array().is_none_or(|a| a.is_empty()) {
            self.tools_seen = (raw, self.recorded.tools_fp);
            return None;
        }
        let declared = match self.recall_declared(request) {
            true => tools_with_recall(self.provider, Some(tools.get())),
            false => None,
        };
        Some((fp, format!("{}{}", TOOLS_PREFIX, declared.as_deref().unwrap_or(tools.get()))))
    }

    /// Pushes the request's tool definitions when they changed, as one permanent system
    /// message (never emitted: the request's own `tools` field is). Returns the units evicted.
    fn take_tools(&mut self, request: &Request) -> Result<usize, ConvError> {
        let Some((fp, text)) = self.tools_to_push(request) else { return Ok(0) };
        let options = PushOptions { level: Some(Level::Permanent), ..PushOptions::default() };
        let report = self.session.push_with(&ChatMessage::text(Role::System, text), options)?;
        self.recorded.placeholders.insert(report.id);
        self.recorded.tools_fp = fp;
        self.dirty = true;
        Ok(report.evicted_units.len())
    }

    /// Compares the request's history with the recorded messages: the index where it leaves
    /// them, if it does. A recorded message the client sends serialized otherwise is updated.
    fn compare_prefix(
        &mut self,
        request: &Request,
        hashes: &[u64],
    ) -> Result<Option<usize>, ConvError> {
        let known = self.recorded.entries.len();
        let incoming = request.items.len();
        for (i, &hash) in hashes.iter().enumerate().take(known.min(incoming)) {
            let entry = &self.recorded.entries[i];
            if entry.raw_hash == hash {
                continue;
            }
            let message =
                analyze_item(self.provider, request, i).map_err(|e| ConvError::BadRequest(e.0))?;
            if entry.fp == message.fp {
                // The same message, serialized otherwise (a cache mark moved).
                self.recorded.entries[i].raw_hash = hash;
                continue;
            }
            // The client's copy of an answer the proxy assembled: the same message, serialized
            // by the client's library. Adopt its fingerprint.
            // The tool calls must be the same: the core holds them, and their results.
            let adopt = i + 1 == known
                && entry.from_answer
                && message.role == "assistant"
                && entry.calls == calls_hash(&message);
            if !adopt {
                return Ok(Some(i));
            }
            tracing::debug!(session = %self.key, index = i, "proxy: adopting the client's copy of an answer");
            let entry = &mut self.recorded.entries[i];
            entry.fp = message.fp;
            entry.raw_hash = hash;
            entry.from_answer = false;
        }
        if incoming < known {
            return Ok(Some(incoming));
        }
        Ok(None)
    }

    /// Pushes the parts of one message and records it; the first part's archive row keeps
    /// `raw`, the message as the client sent it. Returns the units evicted.
    pub(super) fn record(
        &mut self,
        message: &Analyzed,
        raw: &str,
        raw_hash: u64,
    ) -> Result<usize, ConvError> {
        let pinned = pins(message, self.recorded.entries.last().is_none_or(|e| e.pinned));
        let mut entry = Entry {
            fp: message.fp,
            raw_hash,
            pinned,
            calls: calls_hash(message),
            ids: Vec::new(),
            blocks: Vec::new(),
            tokens: 0,
            from_answer: false,
        };
        let mut evicted = 0;
        let mut failure = None;
        for part in &message.parts {
            let level = level_of(&part.chat, pinned);
            let raw = entry.ids.is_empty().then_some(raw);
            let whole = self.keeps_whole(part);
            let timestamp = Some(self.request_time());
            let options = PushOptions { level, raw, whole, timestamp, ..PushOptions::default() };
            let rendering = self.rendering(part);
            match self.session.push_with(&rendering, options) {
                Ok(report) => {
                    evicted += report.evicted_units.len();
                    entry.tokens = entry.tokens.saturating_add(
                        self.session.manager().get(report.id).map_or(0, |m| m.tokens()),
                    );
                    entry.ids.push(report.id);
                    entry.blocks.push(part.blocks.clone());
                }
                Err(error) => {
                    failure = Some(ConvError::from(error));
                    break;
                }
            }
        }
        if !entry.ids.is_empty() {
            self.recorded.push(entry);
            self.dirty = true;
        }
        self.evicted_any |= evicted > 0;
        self.recall_stale |= evicted > 0;
        match failure {
            Some(error) => Err(error),
            None => Ok(evicted),
        }
    }

    /// The session's copy of `part`: its text, a line per opaque block, and a filler whose
    /// token count is the blocks' estimated cost.
    pub(super) fn rendering(&self, part: &Part) -> ChatMessage {
        let mut chat = part.chat.clone();
        if part.opaque.is_empty() {
            return chat;
        }
        let counter = self.session.manager().counter();
        for opaque in &part.opaque {
            let label = format!("[{}]", opaque.label);
            let have = counter.count(&label);
            let need = opaque.tokens.saturating_sub(have);
            if !chat.content.is_empty() {
                chat.content.push('\n');
            }
            chat.content.push_str(&label);
            let reps = (f64::from(need) / self.filler_rate).ceil() as usize;
            chat.content.push_str(&" ~".repeat(reps));
        }
        chat
    }
}

/// Hash of a message's tool-call ids, in order (0 without calls).
pub(super) fn calls_hash(message: &Analyzed) -> u64 {
    let ids: Vec<&str> = message
        .parts
        .iter()
        .flat_map(|p| p.chat.tool_calls.iter().map(|c| c.id.as_str()))
        .collect();
    if ids.is_empty() { 0 } else { hash_str(&ids.join("\u{1}")) }
}
