//! `ctxwin._native.ItemLog`: items kept in order per conversation, through the archive port
//! (`store::open`: a state directory's `archive.db`, a PostgreSQL database, or memory). The
//! Agents SDK session (`ctxwin.agents.CtxwinSession`) stores its items here.
//!
//! Each item is one archived row: its JSON exactly as given is the row's raw JSON, and the
//! row's message is the item's role and text (so the archive's search finds it). Ids are
//! 1, 2, 3, … per conversation; popping deletes the newest row.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use ctxwin_core::Role;
use ctxwin_std::store::{
    self, ArchiveStore, ArchivedMessage, Fence, Location, MemoryStore, Scope, StoreError,
};
use ctxwin_std::{ChatMessage, ToolCall};
use pyo3::prelude::*;
use serde_json::Value;

use crate::errors::{self, Kind};

/// Rows read per call while listing a conversation.
const PAGE: usize = 1024;

/// The archive behind `store` (see `ctxwin.agents.CtxwinSession`): `":memory:"`, a
/// `postgres://` URL, or a state directory (created if missing).
pub(crate) fn open_archive(store: &str) -> PyResult<Arc<dyn ArchiveStore>> {
    if store == ":memory:" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    let location = Location::parse(store);
    if let Location::Directory(dir) = &location {
        create_dir(dir)?;
    }
    Ok(store::open(&location).map_err(errors::store)?.archive)
}

/// Creates the state directory `dir` if missing.
pub(crate) fn create_dir(dir: &PathBuf) -> PyResult<()> {
    std::fs::create_dir_all(dir).map_err(|e| {
        errors::error(
            Kind::Storage,
            format!("cannot create the state directory {}: {e}", dir.display()),
        )
    })
}

/// Items by conversation, oldest first, in one store (shared by every conversation that uses
/// it; safe to share between threads, every call made with the GIL released).
#[pyclass(frozen, module = "ctxwin._native")]
pub(crate) struct ItemLog {
    archive: Arc<dyn ArchiveStore>,
    /// Held from reading the newest id to writing after it, so that two threads adding to
    /// one conversation never take the same ids.
    writing: Mutex<()>,
    tenant: String,
}

impl ItemLog {
    fn scope(&self, conversation: &str) -> Scope {
        Scope::new(self.tenant.clone(), conversation)
    }

    fn rows(&self, scope: &Scope) -> Result<Vec<ArchivedMessage>, StoreError> {
        let mut rows = Vec::new();
        loop {
            let after = rows.last().map_or(0, |row: &ArchivedMessage| row.id);
            let page = self.archive.rows_after(scope, after, PAGE)?;
            let done = page.len() < PAGE;
            rows.extend(page);
            if done {
                return Ok(rows);
            }
        }
    }
}

#[pymethods]
impl ItemLog {
    #[new]
    #[pyo3(signature = (store, *, tenant=String::new()))]
    fn new(py: Python<'_>, store: &str, tenant: String) -> PyResult<ItemLog> {
        let archive = py.detach(|| open_archive(store))?;
        Ok(ItemLog { archive, writing: Mutex::new(()), tenant })
    }

    /// Stores the JSON items after `conversation`'s others, all or none.
    fn add(&self, py: Python<'_>, conversation: &str, items: Vec<String>) -> PyResult<()> {
        let scope = self.scope(conversation);
        let messages = items
            .iter()
            .enumerate()
            .map(|(n, item)| as_message(item, n))
            .collect::<PyResult<Vec<_>>>()?;
        py.detach(|| {
            let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
            let first = self.archive.max_id(&scope).map_err(errors::store)?.unwrap_or(0) + 1;
            let rows: Vec<ArchivedMessage> = messages
                .into_iter()
                .zip(items)
                .zip(first..)
                .map(|((message, raw), id)| {
                    let mut row = ArchivedMessage::new(id, id, message);
                    row.raw = Some(raw);
                    row
                })
                .collect();
            self.archive.put(&scope, Fence::NONE, &rows).map_err(errors::store)
        })
    }

    /// Every item of `conversation` as stored (JSON), oldest first.
    fn items(&self, py: Python<'_>, conversation: &str) -> PyResult<Vec<String>> {
        let scope = self.scope(conversation);
        let rows = py.detach(|| self.rows(&scope).map_err(errors::store))?;
        rows.into_iter()
            .map(|row| {
                row.raw.ok_or_else(|| {
                    errors::error(
                        Kind::Corrupt,
                        format!("{scope}: row {} is not an item (it has no JSON)", row.id),
                    )
                })
            })
            .collect()
    }

    /// Removes and returns `conversation`'s newest item (`None` when there is none).
    fn pop(&self, py: Python<'_>, conversation: &str) -> PyResult<Option<String>> {
        let scope = self.scope(conversation);
        py.detach(|| {
            let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(last) = self.archive.max_id(&scope).map_err(errors::store)? else {
                return Ok(None);
            };
            let row = self.archive.get(&scope, last).map_err(errors::store)?;
            self.archive.delete_from(&scope, Fence::NONE, last).map_err(errors::store)?;
            Ok(row.and_then(|row| row.raw))
        })
    }

    /// Removes every item of `conversation`.
    fn clear(&self, py: Python<'_>, conversation: &str) -> PyResult<()> {
        let scope = self.scope(conversation);
        py.detach(|| {
            let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
            self.archive.delete_conversation(&scope, Fence::NONE).map(drop).map_err(errors::store)
        })
    }
}

/// The role and text of an Agents SDK (Responses API) item: a message's role and text, a
/// function call as an assistant call, a call's output as a tool result, anything else
/// (reasoning, …) as assistant text of its JSON.
fn as_message(item: &str, index: usize) -> PyResult<ChatMessage> {
    let value: Value = serde_json::from_str(item)
        .map_err(|e| errors::error(Kind::InvalidInput, format!("item {index} is not JSON: {e}")))?;
    let text_field = |key: &str| match value.get(key) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let call_id = value.get("call_id").and_then(Value::as_str).map(str::to_owned);
    let kind = value.get("type").and_then(Value::as_str).unwrap_or("message");
    if let Some(role) = value.get("role").and_then(Value::as_str) {
        let role = match role {
            "system" | "developer" => Role::System,
            "assistant" => Role::Assistant,
            _ => Role::User,
        };
        return Ok(ChatMessage::text(role, text_field("content")));
    }
    if kind.ends_with("_call_output") {
        let mut message = ChatMessage::text(Role::Tool, text_field("output"));
        message.tool_call_id = call_id;
        return Ok(message);
    }
    if kind.ends_with("_call") {
        let name = value.get("name").and_then(Value::as_str).unwrap_or(kind);
        let arguments = value.get("arguments").map_or_else(String::new, |a| match a {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        });
        let call = ToolCall::new(call_id.unwrap_or_default(), name, arguments);
        return Ok(ChatMessage::assistant_calls("", vec![call]));
    }
    Ok(ChatMessage::text(Role::Assistant, text_field("summary")))
}
