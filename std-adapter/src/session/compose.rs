//! Composing the payload (as an owned conversation or a ready request body), with the
//! retrieval each call asks for.

use ctxwin_core::{OpenAiRequest, Payload, PayloadItem};

use super::convert::render;
use super::{Recall, RetrievalSettings, Session, SessionError};
use crate::format::{self, Format};
use crate::message::Conversation;

/// What one payload retrieves from the archive ([`ComposeOptions::recall`]).
///
/// ```
/// use ctxwin_std::session::RecallFor;
/// assert_eq!(RecallFor::default(), RecallFor::Settings);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecallFor<'a> {
    /// The live request (the newest user message) when the retrieval settings say
    /// [`auto`](RetrievalSettings::auto), nothing otherwise.
    #[default]
    Settings,
    /// Nothing: no archive read.
    Nothing,
    /// The live request, whatever the settings say.
    LiveRequest,
    /// Turns matching this query.
    Query(&'a str),
}

/// How to compose one payload: its dynamic context and what it retrieves. Everything here
/// holds for this call only: the session's settings stay as they are.
///
/// ```
/// use ctxwin_std::session::{ComposeOptions, RecallFor, RetrievalSettings};
/// let options = ComposeOptions::new(&["task: keep CI green"])
///     .recall(RecallFor::Query("which postgres version"))
///     .retrieval(RetrievalSettings { max_items: 3, ..RetrievalSettings::DEFAULT });
/// assert_eq!(options.dynamic.len(), 1);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ComposeOptions<'a> {
    /// Dynamic context (task goals, instructions), each sent as a system message.
    pub dynamic: &'a [&'a str],
    /// What to retrieve for this payload.
    pub recall: RecallFor<'a>,
    /// Retrieval settings for this payload (the session's when `None`).
    pub retrieval: Option<RetrievalSettings>,
}

impl<'a> ComposeOptions<'a> {
    /// `dynamic`, retrieving as the session's settings say.
    pub fn new(dynamic: &'a [&'a str]) -> Self {
        Self { dynamic, recall: RecallFor::Settings, retrieval: None }
    }

    /// Retrieving `recall` for this payload.
    #[must_use]
    pub fn recall(self, recall: RecallFor<'a>) -> Self {
        Self { recall, ..self }
    }

    /// Retrieving with `settings` for this payload.
    #[must_use]
    pub fn retrieval(self, settings: RetrievalSettings) -> Self {
        Self { retrieval: Some(settings), ..self }
    }
}

/// Where a message of a [`ComposedPayload`] comes from: a message the core holds (which a
/// caller that kept the client's own copy writes back from it), or text the core adds for
/// this payload.
///
/// ```
/// use ctxwin_std::session::{Origin, SessionBuilder};
/// use ctxwin_std::{ChatMessage, core::Role};
/// let mut session = SessionBuilder::new("s").build()?;
/// let system = session.push(&ChatMessage::text(Role::System, "Be terse."))?.id;
/// let user = session.push(&ChatMessage::text(Role::User, "What changed?"))?.id;
/// let payload = session.compose(&["Goal: a green build."])?;
/// assert_eq!(payload.origins, [
///     Origin::System { id: system, reduced: false },
///     Origin::Added,
///     Origin::History { id: user, reduced: false },
/// ]);
/// # Ok::<(), ctxwin_std::session::SessionError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A permanent-level message the core holds (system prompt, rules), by id; `reduced` when
    /// the core keeps a reduced form of it (the message's content is that form).
    System {
        /// Its id.
        id: u64,
        /// The core keeps a reduced form of it.
        reduced: bool,
    },
    /// A history message the core holds (one it was given, or one it wrote itself, such as a
    /// synthetic result for a call never answered), by id.
    History {
        /// Its id.
        id: u64,
        /// The core keeps a reduced form of it.
        reduced: bool,
    },
    /// Text the core adds for this payload: dynamic context, retrieved text, the entity
    /// table, the memory summary.
    Added,
}

/// This turn's payload, owned: ready for [`format::write`] in any provider format.
///
/// `conversation.messages` starts with the system messages (permanent ones, then each piece
/// of dynamic context, the entity block and the `[Memory Summary]` when there are any), then
/// the history; `conversation.tools` holds the tool definitions. `origins` says where each
/// message comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComposedPayload {
    /// What the model sees.
    pub conversation: Conversation,
    /// Where each of `conversation.messages` comes from, in the same order.
    pub origins: Vec<Origin>,
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

/// Where each message [`render`] writes for `payload` comes from, in its order (tool
/// definitions are not messages).
fn origins(payload: &Payload<'_>) -> Vec<Origin> {
    payload
        .items()
        .filter_map(|item| match item {
            PayloadItem::System(message) => {
                Some(Origin::System { id: message.id(), reduced: message.was_reduced() })
            }
            PayloadItem::Message(message) => {
                Some(Origin::History { id: message.id(), reduced: message.was_reduced() })
            }
            PayloadItem::ToolDefinition(_) => None,
            PayloadItem::Dynamic(_) | PayloadItem::Entities(_) | PayloadItem::MemorySummary(_) => {
                Some(Origin::Added)
            }
        })
        .collect()
}

impl Session {
    /// Composes this turn's payload with `dynamic` context (task goals, retrieved text: each
    /// sent as a system message), retrieving as the session's settings say: with an archive
    /// and [`RetrievalSettings::auto`] (the default), archived turns matching the live request
    /// (the newest user message) fill the room the payload has left, for this payload only
    /// ([`Session::recall`]). Units evicted to make room for `dynamic` are written to the
    /// archive, then released. [`compose_with`](Self::compose_with) takes per-call options.
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
        self.compose_with(ComposeOptions::new(dynamic))
    }

    /// Composes this turn's payload as `options` say. The retrieved block only takes free
    /// room: composing never evicts or stores anything for it.
    ///
    /// # Errors
    /// As [`compose`](Self::compose).
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// use ctxwin_std::session::{ComposeOptions, RecallFor, SessionBuilder};
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let config = Config { max_messages: 2, locked_tail: 1, ..Config::DEFAULT };
    /// let mut session = SessionBuilder::new("s").config(config).archive_in_memory().build()?;
    /// session.push(&ChatMessage::text(Role::User, "The staging database is Postgres 16."))?;
    /// for turn in 0..3 {
    ///     session.push(&ChatMessage::text(Role::User, format!("turn {turn}")))?;
    /// }
    /// let asked = ComposeOptions::new(&[]).recall(RecallFor::Query("which postgres version"));
    /// let payload = session.compose_with(asked)?;
    /// // The hit, and in the free room the turn after it.
    /// assert_eq!(payload.recall.ids, [1, 2]);
    /// assert!(payload.conversation.messages[0].content.contains("Postgres 16"));
    /// let none = session.compose_with(ComposeOptions::new(&[]).recall(RecallFor::Nothing))?;
    /// assert!(none.recall.ids.is_empty());
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn compose_with(
        &mut self,
        options: ComposeOptions<'_>,
    ) -> Result<ComposedPayload, SessionError> {
        self.serving(true, |session| session.compose_once(&options))
    }

    fn compose_once(
        &mut self,
        options: &ComposeOptions<'_>,
    ) -> Result<ComposedPayload, SessionError> {
        #[cfg(feature = "http")]
        self.poll_llm();
        let memory = self.with_error_memory(options.dynamic);
        let mut all: Vec<&str> = options.dynamic.to_vec();
        all.extend(memory.as_deref());
        let recall = self.recall_for(&ComposeOptions { dynamic: &all, ..*options })?;
        if !recall.block.is_empty() {
            all.push(&recall.block);
        }
        let since = self.tracker.next_id;
        let (conversation, origins, tokens) = {
            let payload = self.manager.compose(&all)?;
            (render(&payload)?, origins(&payload), payload.tokens())
        };
        let after = self.after_op(since, &|_| false)?;
        Ok(ComposedPayload {
            conversation,
            origins,
            tokens,
            budget: self.manager.budget(),
            evicted_units: after.drained.units.len(),
            recall,
        })
    }

    /// The recall `options` ask for (with an embedder, the messages archived since the last
    /// build are embedded first, and while a task runs under the importance strategy their
    /// similarity to its goal goes to the core).
    fn recall_for(&mut self, options: &ComposeOptions<'_>) -> Result<Recall, SessionError> {
        self.supply_task_relevance()?;
        let settings = options.retrieval.unwrap_or(self.recall.settings);
        let query = match options.recall {
            RecallFor::Nothing => return Ok(Recall::default()),
            RecallFor::Settings if !settings.auto => return Ok(Recall::default()),
            RecallFor::Query(query) => Some(query.to_string()),
            RecallFor::Settings | RecallFor::LiveRequest => self.live_request(),
        };
        if self.stores.archive.is_none() {
            return Ok(Recall::default());
        }
        self.sync_vectors()?;
        match query {
            Some(query) if !query.trim().is_empty() => {
                self.recall_with(&query, options.dynamic, &settings)
            }
            _ => Ok(Recall::default()),
        }
    }

    /// Composes the payload as `options` say and writes it as an OpenAI chat-completions
    /// request body for `model` with the core's zero-copy writer. Returns the body and the
    /// payload's tokens.
    ///
    /// # Errors
    /// As [`compose`](Self::compose).
    ///
    /// ```
    /// use ctxwin_std::{ChatMessage, core::Role};
    /// let mut session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// session.push(&ChatMessage::text(Role::User, "hi"))?;
    /// let options = ctxwin_std::session::ComposeOptions::new(&[]);
    /// let (body, tokens) = session.compose_openai_body(options, "gpt-4o-mini")?;
    /// assert!(body.starts_with(r#"{"model":"gpt-4o-mini","messages":[{"role":"user""#));
    /// assert!(tokens > 0);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn compose_openai_body(
        &mut self,
        options: ComposeOptions<'_>,
        model: &str,
    ) -> Result<(String, u32), SessionError> {
        self.serving(true, |session| session.compose_openai_body_once(&options, model))
    }

    fn compose_openai_body_once(
        &mut self,
        options: &ComposeOptions<'_>,
        model: &str,
    ) -> Result<(String, u32), SessionError> {
        #[cfg(feature = "http")]
        self.poll_llm();
        let memory = self.with_error_memory(options.dynamic);
        let mut all: Vec<&str> = options.dynamic.to_vec();
        all.extend(memory.as_deref());
        let recall = self.recall_for(&ComposeOptions { dynamic: &all, ..*options })?;
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
}

#[cfg(test)]
mod tests {
    use ctxwin_core::{Config, DynamicPlacement, Role};

    use super::super::SessionBuilder;
    use super::*;
    use crate::message::{ChatMessage, ToolCall};

    #[test]
    fn origins_follow_the_rendered_messages_wherever_the_core_places_its_text() {
        let config = Config {
            dynamic_placement: DynamicPlacement::BeforeNewestUser,
            observation_limit: 64,
            ..Config::DEFAULT
        };
        let mut session = SessionBuilder::new("s").config(config).build().unwrap();
        let mut push = |message: ChatMessage| session.push(&message).unwrap().id;
        let system = push(ChatMessage::text(Role::System, "Be terse."));
        let ask = push(ChatMessage::text(Role::User, "Build it."));
        let call = ToolCall::new("c1", "build", "{}");
        let calls = push(ChatMessage::assistant_calls("", vec![call]));
        let log: String = (0..200).map(|n| format!("line {n} of the build log\n")).collect();
        let result = push(ChatMessage::tool_result("c1", log));
        let newest = push(ChatMessage::text(Role::User, "Why did it fail?"));
        let payload = session.compose(&["Goal: a green build."]).unwrap();
        let held = |id, reduced| Origin::History { id, reduced };
        assert_eq!(
            payload.origins,
            [
                Origin::System { id: system, reduced: false },
                held(ask, false),
                held(calls, false),
                held(result, true),
                Origin::Added,
                held(newest, false),
            ]
        );
        let messages = &payload.conversation.messages;
        assert_eq!(messages[4].content, "Goal: a green build.");
        assert!(messages[3].content.contains("[Data Truncated]"), "{}", messages[3].content);
    }
}
