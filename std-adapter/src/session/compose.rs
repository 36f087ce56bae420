//! Composing the payload (as an owned conversation or a ready request body) and retrieving
//! archived text to feed back as dynamic context.

use ctxwin_core::OpenAiRequest;

use super::convert::render;
use super::{Recall, Session, SessionError};
use crate::archive::as_dynamic_context;
use crate::format::{self, Format};
use crate::message::Conversation;

/// This turn's payload, owned: ready for [`format::write`] in any provider format.
///
/// `conversation.messages` starts with the system messages (permanent ones, then each piece
/// of dynamic context, the entity block and the `[Memory Summary]` when there are any), then
/// the history; `conversation.tools` holds the tool definitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComposedPayload {
    /// What the model sees.
    pub conversation: Conversation,
    /// Its token cost as the session's counter counts it (framing included); never above the
    /// core's budget. Pass it to [`Session::record_usage`] with the provider's count.
    pub tokens: u32,
    /// The budget it was composed under (window minus reply reserve, after calibration).
    pub budget: u32,
    /// Units evicted to make room for the caller's dynamic context (now in the archive);
    /// retrieved text never evicts anything.
    pub evicted_units: usize,
    /// What retrieval put into this payload (for the live request or an explicit query).
    pub recall: Recall,
}

impl ComposedPayload {
    /// The payload as a request body in `format`.
    ///
    /// # Errors
    /// [`SessionError::Format`] when the format cannot express something (Anthropic needs
    /// tool-call arguments that are JSON objects).
    ///
    /// ```
    /// use ctxwin_std::format::Format;
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// session.push(&ChatMessage::text(Role::User, "hi"))?;
    /// let body = session.compose(&[])?.write(Format::OpenAiJson)?;
    /// assert!(body.contains(r#""content": "hi""#));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn write(&self, format: Format) -> Result<String, SessionError> {
        Ok(format::write(&self.conversation, format)?)
    }
}

impl Session {
    /// Composes this turn's payload with `dynamic` context (task goals, retrieved text: each
    /// sent as a system message). Units evicted to make room for `dynamic` are archived, then
    /// released. With an archive and [`RetrievalSettings::auto`](super::RetrievalSettings)
    /// (the default), archived turns matching the live request (the newest user message) fill
    /// the room the payload has left, for this payload only ([`Session::recall`]).
    ///
    /// # Errors
    /// [`SessionError::Core`]: `ToolCallsPending` while calls wait for results,
    /// `PinnedOverBudget` when what must stay exceeds the budget (nothing is evicted then);
    /// archive errors.
    ///
    /// ```
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// session.push(&ChatMessage::text(Role::System, "Be terse."))?;
    /// session.push(&ChatMessage::text(Role::User, "What changed?"))?;
    /// let payload = session.compose(&["Retrieved: commit 3f2a renamed parse()"])?;
    /// let roles: Vec<_> = payload.conversation.messages.iter().map(|m| m.role.as_str()).collect();
    /// assert_eq!(roles, ["system", "system", "user"]);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn compose(&mut self, dynamic: &[&str]) -> Result<ComposedPayload, SessionError> {
        self.compose_recall(dynamic, None)
    }

    /// Like [`compose`](Self::compose), retrieving for `query` when given (else for the live
    /// request, when [`RetrievalSettings::auto`](super::RetrievalSettings) is on). The
    /// retrieved block only takes free room: composing never evicts or stores anything for it.
    ///
    /// # Errors
    /// As [`compose`](Self::compose).
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// use ctxwin_std::{ChatMessage, core::Role, session::SessionBuilder};
    /// let config = Config { max_messages: 2, locked_tail: 1, ..Config::DEFAULT };
    /// let mut session = SessionBuilder::new("s").config(config).archive_in_memory().build()?;
    /// session.push(&ChatMessage::text(Role::User, "The staging database is Postgres 16."))?;
    /// for turn in 0..3 {
    ///     session.push(&ChatMessage::text(Role::User, format!("turn {turn}")))?;
    /// }
    /// let payload = session.compose_recall(&[], Some("which postgres version"))?;
    /// // The hit, and in the free room the turn after it.
    /// assert_eq!(payload.recall.ids, [1, 2]);
    /// assert!(payload.conversation.messages[0].content.contains("Postgres 16"));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn compose_recall(
        &mut self,
        dynamic: &[&str],
        query: Option<&str>,
    ) -> Result<ComposedPayload, SessionError> {
        self.poll_llm();
        let recall = self.recall_for(dynamic, query)?;
        let mut all: Vec<&str> = dynamic.to_vec();
        if !recall.block.is_empty() {
            all.push(&recall.block);
        }
        let since = self.tracker.next_id;
        let (conversation, tokens) = {
            let payload = self.manager.compose(&all)?;
            (render(&payload)?, payload.tokens())
        };
        let after = self.after_op(since, &|_| false)?;
        Ok(ComposedPayload {
            conversation,
            tokens,
            budget: self.manager.budget(),
            evicted_units: after.drained.units.len(),
            recall,
        })
    }

    /// The recall for `query`, or for the live request when retrieval is automatic (with an
    /// embedder, the messages archived since the last build are embedded first).
    fn recall_for(
        &mut self,
        dynamic: &[&str],
        query: Option<&str>,
    ) -> Result<Recall, SessionError> {
        if self.archive.is_none() || (query.is_none() && !self.retrieval.auto) {
            return Ok(Recall::default());
        }
        self.sync_vectors()?;
        let query = match query {
            Some(query) => Some(query.to_string()),
            None if self.retrieval.auto => self.live_request(),
            None => None,
        };
        match query {
            Some(query) if !query.trim().is_empty() => self.recall(&query, dynamic),
            _ => Ok(Recall::default()),
        }
    }

    /// Composes the payload and writes it as an OpenAI chat-completions request body for
    /// `model` with the core's zero-copy writer. Returns the body and the payload's tokens.
    ///
    /// # Errors
    /// As [`compose`](Self::compose).
    ///
    /// ```
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// session.push(&ChatMessage::text(Role::User, "hi"))?;
    /// let (body, tokens) = session.compose_openai_body(&[], "gpt-4o-mini")?;
    /// assert!(body.starts_with(r#"{"model":"gpt-4o-mini","messages":[{"role":"user""#));
    /// assert!(tokens > 0);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn compose_openai_body(
        &mut self,
        dynamic: &[&str],
        model: &str,
    ) -> Result<(String, u32), SessionError> {
        self.poll_llm();
        let recall = self.recall_for(dynamic, None)?;
        let mut all: Vec<&str> = dynamic.to_vec();
        if !recall.block.is_empty() {
            all.push(&recall.block);
        }
        let since = self.tracker.next_id;
        let (body, tokens) = {
            let payload = self.manager.compose(&all)?;
            let mut body = Vec::new();
            let request = OpenAiRequest { model: Some(model), max_tokens: None };
            payload.write_openai(&mut body, request)?;
            (body, payload.tokens())
        };
        self.after_op(since, &|_| false)?;
        // The core writes JSON from UTF-8 text only; a failure here would be a core bug.
        let body = String::from_utf8(body).map_err(|e| {
            SessionError::Setting(format!("the core wrote a body that is not UTF-8: {e}"))
        })?;
        Ok((body, tokens))
    }

    /// Searches this session's archive for `query` and formats up to `limit` hits, best first,
    /// as one dynamic-context block of at most `max_chars` characters
    /// (`[Retrieved from archive]`, then `- (msg ID, ROLE) text` lines). Messages still in the
    /// context are left out: the model sees them already. Empty when nothing matches.
    ///
    /// # Errors
    /// [`SessionError::NoArchive`] without an archive; archive errors.
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// use ctxwin_std::session::SessionBuilder;
    /// use ctxwin_std::{ChatMessage, core::Role};
    ///
    /// let config = Config { max_messages: 2, locked_tail: 1, ..Config::DEFAULT };
    /// let mut session = SessionBuilder::new("s").config(config).archive_in_memory().build()?;
    /// session.push(&ChatMessage::text(Role::User, "The staging database is Postgres 16."))?;
    /// for turn in 0..3 {
    ///     session.push(&ChatMessage::text(Role::User, format!("turn {turn}")))?;
    /// }
    /// let block = session.retrieve("which postgres version", 3, 500)?;
    /// assert!(block.contains("Postgres 16"), "{block}");
    /// let payload = session.compose(&[&block])?;
    /// assert!(payload.conversation.messages[0].content.contains("Postgres 16"));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn retrieve(
        &self,
        query: &str,
        limit: usize,
        max_chars: usize,
    ) -> Result<String, SessionError> {
        let archive =
            self.archive.as_ref().ok_or(SessionError::NoArchive { operation: "retrieve" })?;
        self.archive_settled()?;
        let mut hits = archive.search(Some(&self.name), query, limit.saturating_mul(4))?;
        hits.retain(|hit| self.manager.get(hit.id).is_none());
        hits.truncate(limit);
        Ok(as_dynamic_context(&hits, max_chars))
    }
}
