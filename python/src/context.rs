//! `ctxwin._native.Context`: a std [`Session`] behind a mutex, every call made with the GIL
//! released. The only file of the package that touches the session; it uses
//! [`SessionBuilder`] (`new`, `config`, `counter`, `archive`, `archive_in_memory`,
//! `checkpoints`, `restore_latest`) and [`Session`]'s `push`, `add_tool`, `compose_with`,
//! `stats`, `checkpoint`, `checkpoints`, `restore`, `forget`, `forget_matching`,
//! `abort_pending_calls`, `start_task`, `finish_task`, `tasks`, `current_task` (with
//! `SessionBuilder::task_detection`) and `archive().search` (the archive port).

use std::sync::{Mutex, MutexGuard, PoisonError};

use ctxwin_core::Config;
use ctxwin_core::task::Task;
use ctxwin_std::format::Format;
use ctxwin_std::session::{
    ComposeOptions, RecallFor, RestorePoint, Session, SessionBuilder, TaskDetection,
};
use ctxwin_std::store::SearchQuery;
use ctxwin_std::store::{CheckpointId, Location};
use ctxwin_std::{ChatMessage, ToolDefinition};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::{Reader, Shape};
use crate::errors::{self, Kind};
use crate::items::create_dir;
use crate::tokenizer::Tokenizer;

/// Where a context keeps its archive and checkpoints: as the CLI's `[store] url`, a state
/// directory or a PostgreSQL URL ([`Location::parse`]), or memory.
enum Store {
    /// A state directory (`archive.db` and `checkpoints/`) or a PostgreSQL database.
    At(Location),
    /// In memory: lost with the process, no checkpoints.
    Memory,
}

impl Store {
    fn parse(store: &str) -> Store {
        if store == ":memory:" {
            return Store::Memory;
        }
        Store::At(Location::parse(store))
    }
}

/// One conversation's managed context window (see `ctxwin.Context`).
#[pyclass(frozen, module = "ctxwin._native")]
pub(crate) struct Context {
    session: Mutex<Session>,
    name: String,
}

impl Context {
    fn session(&self) -> MutexGuard<'_, Session> {
        // A panic while holding the lock cannot leave the session half-changed in a way the
        // next call would not report: keep serving.
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One task as the package shows it, read while the session is locked.
struct TaskInfo {
    number: u32,
    goal: String,
    open: bool,
    first_id: u64,
    last_id: Option<u64>,
    summary_id: Option<u64>,
    summary: Option<String>,
    source_tokens: u32,
    summary_tokens: u32,
    ratio: Option<f32>,
}

impl TaskInfo {
    /// `task` with its summary's text, when the session level still holds it.
    fn of(session: &Session, task: &Task) -> TaskInfo {
        let summary_id = task.summary_id();
        let summary = summary_id
            .and_then(|id| session.manager().core().get(id))
            .map(|message| message.content().to_string());
        TaskInfo {
            number: task.number(),
            goal: task.goal().to_string(),
            open: task.is_open(),
            first_id: task.first_id(),
            last_id: task.last_id(),
            summary_id,
            summary,
            source_tokens: task.source_tokens(),
            summary_tokens: task.summary_tokens(),
            ratio: task.compression_ratio(),
        }
    }

    fn into_dict(self, py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("number", self.number)?;
        dict.set_item("goal", self.goal)?;
        dict.set_item("open", self.open)?;
        dict.set_item("first_id", self.first_id)?;
        dict.set_item("last_id", self.last_id)?;
        dict.set_item("summary_id", self.summary_id)?;
        dict.set_item("summary", self.summary)?;
        dict.set_item("source_tokens", self.source_tokens)?;
        dict.set_item("summary_tokens", self.summary_tokens)?;
        dict.set_item("ratio", self.ratio.map(f64::from))?;
        Ok(dict)
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> PyResult<String> {
    serde_json::to_string(value).map_err(|e| errors::error(Kind::Internal, e.to_string()))
}

#[pymethods]
impl Context {
    #[new]
    #[pyo3(signature = (name, store, *, config=None, tokenizer=None, checkpoint_every=None, tenant=None, task_detection=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: String,
        store: &str,
        config: Option<&str>,
        tokenizer: Option<PyRef<'_, Tokenizer>>,
        checkpoint_every: Option<u32>,
        tenant: Option<String>,
        task_detection: Option<&str>,
    ) -> PyResult<Context> {
        let detection = match task_detection {
            None => TaskDetection::Off,
            Some(name) => TaskDetection::parse(name).ok_or_else(|| {
                errors::error(
                    Kind::Usage,
                    format!("unknown task_detection {name:?}: use \"off\" or \"new-request\""),
                )
            })?,
        };
        let config: Config = match config {
            Some(json) => serde_json::from_str(json)
                .map_err(|e| errors::error(Kind::Config, format!("config: {e}")))?,
            None => Config::DEFAULT,
        };
        let counter = tokenizer.map(|t| t.counter().clone()).unwrap_or_default();
        let store = Store::parse(store);
        let session_name = name.clone();
        let session = py.detach(move || {
            let builder = SessionBuilder::new(session_name)
                .config(config)
                .counter(counter)
                .task_detection(detection);
            let builder = match tenant {
                Some(tenant) => builder.tenant(tenant),
                None => builder,
            };
            let builder = match store {
                Store::Memory => builder.archive_in_memory(),
                Store::At(location) => {
                    if let Location::Directory(dir) = &location {
                        create_dir(dir)?;
                    }
                    let builder = builder.store(location).restore_latest(true);
                    match checkpoint_every {
                        Some(every) => builder.checkpoint_interval_messages(every),
                        None => builder,
                    }
                }
            };
            builder.build().map_err(errors::session)
        })?;
        Ok(Context { session: Mutex::new(session), name })
    }

    /// The session name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Pushes the messages of a list of one shape; returns the ids they got.
    fn push_messages(&self, messages: Bound<'_, PyList>, shape: &str) -> PyResult<Vec<u64>> {
        let py = messages.py();
        let reader = Reader::new(messages, Shape::parse(shape)?);
        let mut parts = Vec::new();
        for index in 0..reader.len() {
            reader.read(index, &mut parts)?;
        }
        let chats: Vec<ChatMessage> = parts.into_iter().map(|p| p.message).collect();
        py.detach(|| {
            let mut session = self.session();
            let mut ids = Vec::with_capacity(chats.len());
            for chat in &chats {
                ids.push(session.push(chat).map_err(errors::session)?.id);
            }
            Ok(ids)
        })
    }

    /// Declares a tool the model may call.
    fn add_tool(
        &self,
        py: Python<'_>,
        name: String,
        description: String,
        parameters: String,
    ) -> PyResult<u64> {
        let tool = ToolDefinition { name, description, parameters };
        py.detach(|| self.session().add_tool(&tool).map_err(errors::session))
    }

    /// Closes calls still waiting for results with a synthetic result.
    fn abort_pending_calls(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.session().abort_pending_calls().map_err(errors::session))
    }

    /// This turn's payload: `(body JSON, tokens, budget, evicted units, recalled ids)`.
    #[pyo3(signature = (format, dynamic, query=None))]
    fn compose(
        &self,
        py: Python<'_>,
        format: &str,
        dynamic: Vec<String>,
        query: Option<String>,
    ) -> PyResult<(String, u32, u32, usize, Vec<u64>)> {
        let format = match format {
            "openai" => Format::OpenAiJson,
            "anthropic" => Format::AnthropicJson,
            other => {
                return Err(errors::error(
                    Kind::Usage,
                    format!("unknown format {other:?}: use \"openai\" or \"anthropic\""),
                ));
            }
        };
        py.detach(|| {
            let dynamic: Vec<&str> = dynamic.iter().map(String::as_str).collect();
            let recall = match query.as_deref() {
                Some(query) => RecallFor::Query(query),
                None => RecallFor::Settings,
            };
            let payload = self
                .session()
                .compose_with(ComposeOptions::new(&dynamic).recall(recall))
                .map_err(errors::session)?;
            let body = payload.write(format).map_err(errors::session)?;
            Ok((body, payload.tokens, payload.budget, payload.evicted_units, payload.recall.ids))
        })
    }

    /// The session's statistics as JSON.
    fn stats(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| to_json(&self.session().stats().map_err(errors::session)?))
    }

    /// Writes a checkpoint; returns its id.
    fn checkpoint(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| Ok(self.session().checkpoint().map_err(errors::session)?.to_string()))
    }

    /// The checkpoint ids, newest first.
    fn checkpoints(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| {
            let list = self.session().checkpoints().map_err(errors::session)?;
            Ok(list.into_iter().map(|info| info.id.to_string()).collect())
        })
    }

    /// Goes back to checkpoint `id` (the newest that restores when `None`); returns its id.
    #[pyo3(signature = (id=None))]
    fn restore(&self, py: Python<'_>, id: Option<String>) -> PyResult<String> {
        let point = match id.as_deref() {
            None | Some("latest") => RestorePoint::Latest,
            Some(id) => RestorePoint::Id(CheckpointId::parse(id).map_err(|e| {
                errors::error(Kind::InvalidInput, format!("checkpoint id {id:?}: {e}"))
            })?),
        };
        py.detach(|| {
            let report = self.session().restore(point).map_err(errors::session)?;
            Ok(report.id.to_string())
        })
    }

    /// Archived messages of this session matching `query`, best first: dicts with `id`,
    /// `unit`, `role`, `content`, `snippet`, `score`.
    fn search<'py>(
        &self,
        py: Python<'py>,
        query: String,
        limit: usize,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let hits = py.detach(|| {
            let session = self.session();
            let Some(archive) = session.archive() else { return Ok(Vec::new()) };
            let query = SearchQuery::new(&query, limit).with_snippets();
            archive.search(session.scope(), &query).map_err(|e| errors::session(e.into()))
        })?;
        hits.into_iter()
            .map(|hit| {
                let dict = PyDict::new(py);
                dict.set_item("id", hit.id)?;
                dict.set_item("unit", hit.unit)?;
                dict.set_item("role", hit.role.as_str())?;
                dict.set_item("content", hit.content)?;
                dict.set_item("snippet", hit.snippet)?;
                dict.set_item("score", hit.score)?;
                Ok(dict)
            })
            .collect()
    }

    /// Forgets message `id` (or, with `text`, every occurrence of it) in the window, the
    /// archive and every checkpoint; returns `(archived message ids, in window, checkpoints
    /// rewritten)`.
    #[pyo3(signature = (id=None, text=None))]
    fn forget(
        &self,
        py: Python<'_>,
        id: Option<u64>,
        text: Option<String>,
    ) -> PyResult<(Vec<u64>, bool, usize)> {
        py.detach(|| {
            let mut session = self.session();
            let report = match (id, text) {
                (Some(id), None) => session.forget(id),
                (None, Some(text)) => session.forget_matching(&text),
                _ => {
                    return Err(errors::error(
                        Kind::Usage,
                        "forget takes an id or a text, not both",
                    ));
                }
            }
            .map_err(errors::session)?;
            Ok((report.archive.messages, report.in_window, report.checkpoints_rewritten))
        })
    }

    /// Starts a task with `goal`, finishing the running one; returns its number.
    fn start_task(&self, py: Python<'_>, goal: String) -> PyResult<u32> {
        py.detach(|| self.session().start_task(&goal).map_err(errors::session))
    }

    /// Finishes the running task with `outcome` ("" lets the summary take the last answer).
    #[pyo3(signature = (outcome=None))]
    fn finish_task<'py>(
        &self,
        py: Python<'py>,
        outcome: Option<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let info = py.detach(|| {
            let mut session = self.session();
            let task =
                session.finish_task(outcome.as_deref().unwrap_or("")).map_err(errors::session)?;
            Ok::<_, PyErr>(TaskInfo::of(&session, &task))
        })?;
        info.into_dict(py)
    }

    /// The tasks kept (the newest four), oldest first.
    fn tasks<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let infos = py.detach(|| {
            let session = self.session();
            session.tasks().iter().map(|task| TaskInfo::of(&session, task)).collect::<Vec<_>>()
        });
        infos.into_iter().map(|info| info.into_dict(py)).collect()
    }

    /// The task running now.
    fn current_task<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let info = py.detach(|| {
            let session = self.session();
            session.current_task().map(|task| TaskInfo::of(&session, task))
        });
        info.map(|info| info.into_dict(py)).transpose()
    }
}
