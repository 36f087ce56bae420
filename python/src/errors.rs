//! Rust errors as the Python exceptions of `ctxwin.errors`: one class per exit-code category
//! of the command line (`cli/src/error.rs`), so a Python caller and a shell script tell the
//! same problems apart the same way.

use ctxwin_core::Error as CoreError;
use ctxwin_core::trim::{TrimError, Unsupported};
use ctxwin_std::session::SessionError;
use ctxwin_std::store::{ErrorKind, StoreError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes, by the CLI's exit-code names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Internal,
    Usage,
    InvalidInput,
    Storage,
    Budget,
    Corrupt,
    NoState,
    Config,
}

impl Kind {
    fn class_name(self) -> &'static str {
        match self {
            Kind::Internal => "InternalError",
            Kind::Usage => "UsageError",
            Kind::InvalidInput => "InvalidInputError",
            Kind::Storage => "StorageError",
            Kind::Budget => "BudgetError",
            Kind::Corrupt => "CorruptStateError",
            Kind::NoState => "NoStateError",
            Kind::Config => "ConfigError",
        }
    }
}

/// An error of `kind` with `message`, raised as its `ctxwin.errors` class.
pub(crate) fn error(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match class(py, kind) {
        Ok(class) => PyErr::from_type(class, message),
        Err(err) => err,
    })
}

fn class(py: Python<'_>, kind: Kind) -> PyResult<Bound<'_, PyType>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let module =
        MODULE.get_or_try_init(py, || PyModule::import(py, "ctxwin.errors").map(Bound::unbind))?;
    Ok(module.bind(py).getattr(kind.class_name())?.cast_into::<PyType>()?)
}

/// A session error as the CLI classifies it.
pub(crate) fn session(err: SessionError) -> PyErr {
    let (kind, message) = classify_session(err);
    error(kind, message)
}

fn classify_session(err: SessionError) -> (Kind, String) {
    let text = err.to_string();
    match err {
        SessionError::Core(core) => (core_kind(core), text),
        SessionError::Config(_) | SessionError::Setting(_) | SessionError::Tokenizer(_) => {
            (Kind::Config, text)
        }
        SessionError::Store(store) => (store_kind(&store), text),
        SessionError::BadCheckpoint { .. } | SessionError::ArchiveInUse { .. } => {
            (Kind::Corrupt, text)
        }
        SessionError::Format(_) | SessionError::ToolDefinition { .. } => (Kind::InvalidInput, text),
        SessionError::NoArchive { .. } | SessionError::NoCheckpoints { .. } => (Kind::Usage, text),
        SessionError::AfterStore { source, .. } | SessionError::Import { source, .. } => {
            (classify_session(*source).0, text)
        }
        _ => (Kind::Internal, text),
    }
}

/// The category of a refusal of the context manager.
pub(crate) fn core_kind(err: CoreError) -> Kind {
    match err {
        CoreError::OrphanToolResult
        | CoreError::DuplicateToolResult
        | CoreError::InvalidMessage(_)
        | CoreError::InvalidToolDefinition
        | CoreError::ToolCallsPending { .. } => Kind::InvalidInput,
        CoreError::MessageTooLarge { .. }
        | CoreError::LevelOverBudget { .. }
        | CoreError::LevelFull { .. }
        | CoreError::PinnedOverBudget { .. } => Kind::Budget,
        CoreError::InvalidConfig(_) => Kind::Config,
        CoreError::NoOpenTask | CoreError::TaskInsideUnit => Kind::Usage,
        _ => Kind::Internal,
    }
}

/// A storage failure as the CLI classifies it.
pub(crate) fn store(err: StoreError) -> PyErr {
    let kind = store_kind(&err);
    error(kind, err.to_string())
}

/// The category of a storage failure, by its kind (no backend's error type is named), as the
/// CLI's `from_store` classifies it.
fn store_kind(err: &StoreError) -> Kind {
    match err {
        StoreError::NoUsableCheckpoint { .. } => Kind::NoState,
        _ => match err.kind() {
            ErrorKind::Damaged => Kind::Corrupt,
            ErrorKind::NotFound | ErrorKind::Invalid => Kind::InvalidInput,
            ErrorKind::Busy | ErrorKind::Io | ErrorKind::Full | ErrorKind::Backend => Kind::Storage,
            _ => Kind::Internal,
        },
    }
}

/// A refusal of the stateless trim, naming the message (as the caller numbers them) when one
/// is to blame.
pub(crate) fn trim(err: TrimError, source_of: impl Fn(usize) -> usize) -> PyErr {
    match err {
        TrimError::Refused { error: refusal, index } => {
            let what = match refusal {
                CoreError::OrphanToolResult => {
                    "the tool result answers no pending tool call; put the assistant message with the call before it".to_string()
                }
                CoreError::DuplicateToolResult => "that tool call already has a result".into(),
                CoreError::ToolCallsPending { unanswered } => format!(
                    "the conversation ends with {unanswered} tool call(s) without results, which a provider would refuse; add the results or drop the calls"
                ),
                CoreError::PinnedOverBudget { needed, budget, .. } => format!(
                    "the system message alone needs {needed} tokens, over max_tokens={budget}; raise max_tokens or shorten the system message"
                ),
                CoreError::InvalidMessage(why) => format!("invalid message: {why}"),
                other => other.to_string(),
            };
            let message = match index {
                Some(index) => format!("message {}: {what}", source_of(index)),
                None => what,
            };
            error(core_kind(refusal), message)
        }
        TrimError::Unsupported(Unsupported::LateSystemMessage(index)) => error(
            Kind::Internal,
            format!("message {}: a system message the trim cannot place", source_of(index)),
        ),
        TrimError::Unsupported(other) => {
            error(Kind::Internal, format!("unsupported by the stateless trim: {other:?}"))
        }
    }
}
