//! Composing the body to forward: the session's payload, each message the client sent
//! written back from its raw JSON (as this request carried it), reduced where the core
//! reduced it, with what the core adds (retrieved text, summaries) in the provider's shape.

use std::collections::HashMap;

use ctxwin_std::ChatMessage;
use ctxwin_std::core::Level;
use ctxwin_std::core::Role;
use ctxwin_std::session::{ComposeOptions, ComposedPayload, Origin, RecallFor, RetrievalSettings};

use super::{Composed, Conv, ConvError};
use crate::wire::{KeptPart, ManagedBody, Provider, Request, recall_marker};

/// A message to emit, in payload order.
enum Slot {
    /// Recorded message `.0` (of its parts' role `.1`), with the parts the payload keeps.
    Entry(usize, Role, Vec<KeptPart>),
    /// A message the core wrote itself.
    Core(ChatMessage),
}

/// What a payload emits ([`Conv::plan`]).
#[derive(Default)]
struct Plan {
    /// The texts the core added (retrieved text, summaries), in order.
    added: Vec<String>,
    /// The messages, in order.
    order: Vec<Slot>,
    /// The slot where the history starts (after the pinned system messages).
    first_history: Option<usize>,
    /// Session ids of the messages emitted.
    emitted: Vec<u64>,
}

/// A message the core wrote itself (a synthetic tool result), as the provider formats write
/// one: its role, text and the call it answers.
fn core_written(message: &ChatMessage) -> ChatMessage {
    ChatMessage {
        role: message.role,
        content: message.content.clone(),
        tool_calls: Vec::new(),
        tool_call_id: message.tool_call_id.clone(),
        is_error: false,
        name: None,
    }
}

impl Conv {
    /// Composes the payload for `request` and writes the body to forward.
    ///
    /// # Errors
    /// `PinnedOverBudget` when what must stay does not fit; `ToolCallsPending`; store errors.
    pub fn compose(&mut self, request: &Request) -> Result<Composed, ConvError> {
        self.compose_if(request, true)?
            .ok_or_else(|| ConvError::State("composing with the archive stopped short".into()))
    }

    /// [`compose`](Self::compose) without touching the archive, for an async thread: `None`
    /// when the payload needs a new retrieved block (an archive search, which may wait for the
    /// archive's writer); [`compose`](Self::compose), on a thread that may block, then
    /// finishes it. Between compactions the frozen block is reused and nothing is searched.
    ///
    /// # Errors
    /// As [`compose`](Self::compose).
    pub fn compose_in_memory(&mut self, request: &Request) -> Result<Option<Composed>, ConvError> {
        self.compose_if(request, false)
    }

    /// Composes the payload and writes the body; `None` when it needs an archive search and
    /// `may_search` is false.
    fn compose_if(
        &mut self,
        request: &Request,
        may_search: bool,
    ) -> Result<Option<Composed>, ConvError> {
        let Some(payload) = self.compose_payload(may_search)? else { return Ok(None) };
        let recall = self.declares_recall(request);
        let plan = self.plan(&payload, recall);
        let mut body = ManagedBody::new(self.provider, request, plan.added);
        let recall = recall && body.declare_recall();
        if self.evicted_any {
            // Until something left, the body is the client's own, its marks included.
            body.cache_head();
        }
        for (n, slot) in plan.order.into_iter().enumerate() {
            if plan.first_history == Some(n) {
                body.history_starts();
            }
            match slot {
                Slot::Entry(e, role, parts) => {
                    let raw = self.raw(request, e)?;
                    if self.provider == Provider::Anthropic && request.has_system_item && e == 0 {
                        body.system(raw);
                        continue;
                    }
                    body.message(&raw, role, &self.recorded.entries[e].blocks, &parts);
                }
                Slot::Core(chat) => body.core_message(&chat),
            }
        }
        let (body, prompt) = body.finish_at();
        let cache_stable =
            !self.last_emitted.is_empty() && plan.emitted.starts_with(&self.last_emitted);
        self.last_emitted = plan.emitted;
        self.dirty = true;
        let tasks_finished = self.tasks_finished();
        let room = self.session.configured().budget().saturating_sub(payload.tokens);
        Ok(Some(Composed {
            body,
            tokens: payload.tokens,
            evicted: payload.evicted_units,
            cache_stable,
            tasks_finished,
            prompt,
            recall,
            room,
        }))
    }

    /// The compression ratios of tasks finished since the last call (with a summary).
    fn tasks_finished(&mut self) -> Vec<f64> {
        let reported = self.tasks_reported;
        let finished =
            self.session.tasks().iter().filter(|t| !t.is_open() && t.number() > reported);
        let ratios =
            finished.clone().filter_map(|t| t.compression_ratio().map(f64::from)).collect();
        self.tasks_reported = finished.map(|t| t.number()).max().unwrap_or(reported);
        ratios
    }

    /// The session's payload, with the retrieved block frozen between compactions.
    ///
    /// Retrieval leaves out what the payload holds: before anything of this conversation left
    /// the core it can find nothing, and its full-text search is most of a request's cost (the
    /// archive is shared by every conversation). The block sits before the history (a standing
    /// note), so it must not change while the history only grows: it is retrieved after a
    /// compaction (for the live request then) and sent unchanged until a compaction finds a
    /// new live request: a new request without a compaction keeps it (retrieving then would
    /// rewrite the cached prefix for the block alone). A compaction while the live request is
    /// the one the block was retrieved for keeps the block too: the same query would find much the same turns, and the
    /// prefix up to the history's head (tools, system, the block, the head) stays what the
    /// provider cached, so the compaction rewrites only what follows the head.
    ///
    /// Without `may_search`, `None` where the block is to be retrieved: before composing when
    /// the pushes compacted, or after a compose that compacted (its evictions are counted by
    /// the compose that finishes the payload).
    fn compose_payload(&mut self, may_search: bool) -> Result<Option<ComposedPayload>, ConvError> {
        let live = self.live_request_id();
        // Renewed when this request compacts (the prefix is rewritten anyway) for a new live
        // request; `recall_stale` says whether its pushes compacted.
        let renew = |conv: &Self, compacted: bool| {
            conv.retrieves()
                && (conv.recalled.is_none() || (compacted && conv.recalled_for != live))
        };
        let fresh = renew(self, self.recall_stale);
        if fresh && !may_search {
            return Ok(None);
        }
        let frozen = match &self.recalled {
            Some(block) if self.retrieves() && !fresh && !block.is_empty() => vec![block.clone()],
            _ => Vec::new(),
        };
        let mut payload = self.compose_once(&frozen, fresh, live)?;
        let mut evicted = std::mem::take(&mut self.evicted_unsent);
        if !fresh && renew(self, payload.evicted_units > 0) {
            // The frozen block's room came from a compaction: the prefix is rewritten now,
            // so the block is retrieved again now, not one request later.
            evicted += payload.evicted_units;
            if !may_search {
                self.evicted_unsent = evicted;
                self.recall_stale = true;
                self.evicted_any = true;
                return Ok(None);
            }
            payload = self.compose_once(&[], true, live)?;
        }
        payload.evicted_units += evicted;
        self.recall_stale = false;
        self.evicted_any |= payload.evicted_units > 0;
        Ok(Some(payload))
    }

    /// The session id of the live request: the newest user message the core holds.
    fn live_request_id(&self) -> Option<u64> {
        let manager = self.session.manager();
        manager.history().rfind(|m| m.role() == Role::User).map(|m| m.id())
    }

    /// One compose: with the `frozen` block, or retrieving a `fresh` one for the live request
    /// `live` (kept for the next requests).
    fn compose_once(
        &mut self,
        frozen: &[String],
        fresh: bool,
        live: Option<u64>,
    ) -> Result<ComposedPayload, ConvError> {
        let dynamic: Vec<&str> = frozen.iter().map(String::as_str).collect();
        let recall = if fresh { RecallFor::LiveRequest } else { RecallFor::Nothing };
        let options =
            ComposeOptions::new(&dynamic).recall(recall).retrieval(self.retrieval_settings());
        let payload = self.session.compose_with(options)?;
        if fresh {
            self.recalled = Some(payload.recall.block.clone());
            self.recalled_for = live;
        }
        Ok(payload)
    }

    /// The retrieval settings of this conversation's next block, sized from the room the
    /// pinned part leaves the history ([`ConvSettings::retrieval_within`]).
    ///
    /// [`ConvSettings::retrieval_within`]: super::ConvSettings::retrieval_within
    fn retrieval_settings(&self) -> RetrievalSettings {
        let budget = self.session.configured().budget();
        let pinned = self.session.manager().level_tokens(Level::Permanent);
        self.settings.retrieval_within(budget, pinned)
    }

    /// What `payload` emits, as the session says where each of its messages comes from: the
    /// texts the core added, and the messages it holds in order — a recorded message (with
    /// the parts of it the payload keeps, reduced where the core reduced them) or one the
    /// core wrote itself. The tool-definition placeholders are left out (the request's own
    /// `tools` field is sent).
    ///
    /// With `recall` (the recall tool is declared), a reduced part ends with the line naming
    /// its archived original ([`recall_marker`]): its session id, the same bytes on every
    /// request.
    fn plan(&self, payload: &ComposedPayload, recall: bool) -> Plan {
        let mut plan = Plan::default();
        // Which slot holds each recorded message: its parts gather there.
        let mut slot_of: HashMap<usize, usize> = HashMap::new();
        for (message, origin) in payload.conversation.messages.iter().zip(&payload.origins) {
            let (id, reduced) = match *origin {
                Origin::Added => {
                    plan.added.push(message.content.clone());
                    continue;
                }
                Origin::System { id, reduced } => (id, reduced),
                Origin::History { id, reduced } => {
                    plan.first_history.get_or_insert(plan.order.len());
                    (id, reduced)
                }
            };
            if self.recorded.placeholders.contains(&id) {
                continue;
            }
            plan.emitted.push(id);
            let Some((entry, part)) = self.recorded.locate(id) else {
                plan.order.push(Slot::Core(core_written(message)));
                continue;
            };
            let reduced = reduced.then(|| match recall {
                true => format!("{}{}", message.content, recall_marker(id)),
                false => message.content.clone(),
            });
            let kept = KeptPart { part, reduced };
            match slot_of.get(&entry) {
                Some(&at) => {
                    if let Some(Slot::Entry(_, _, parts)) = plan.order.get_mut(at) {
                        parts.push(kept);
                    }
                }
                None => {
                    slot_of.insert(entry, plan.order.len());
                    plan.order.push(Slot::Entry(entry, message.role, vec![kept]));
                }
            }
        }
        plan
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
