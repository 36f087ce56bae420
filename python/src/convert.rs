//! Python messages read into chat messages: LangChain message objects, OpenAI chat-completions
//! dicts and Anthropic Messages dicts, one message at a time so that a trim reads only the
//! messages its walk needs.
//!
//! A message becomes one [`Part`], except an Anthropic user message, which becomes one tool
//! result per `tool_result` block (in order) and then one user message for its other blocks
//! (the std format reader's rule). Each part remembers which message and block it came from,
//! so a trimmed result is given back as the caller's own objects.

use ctxwin_core::Role;
use ctxwin_std::{ChatMessage, ToolCall};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString};

use crate::errors::{Kind, error};

/// Which kind of messages a list holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `langchain_core.messages.BaseMessage` objects.
    LangChain,
    /// OpenAI chat-completions message dicts.
    OpenAi,
    /// Anthropic Messages dicts.
    Anthropic,
}

impl Shape {
    pub(crate) fn parse(name: &str) -> PyResult<Shape> {
        match name {
            "langchain" => Ok(Shape::LangChain),
            "openai" => Ok(Shape::OpenAi),
            "anthropic" => Ok(Shape::Anthropic),
            other => Err(error(
                Kind::Usage,
                format!("unknown message format {other:?}: use langchain, openai or anthropic"),
            )),
        }
    }
}

/// Which piece of its message a part is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Block {
    /// The whole message, or (Anthropic user message) every block that is not a tool result.
    Rest,
    /// The `tool_result` block at this index of an Anthropic user message.
    ToolResult(usize),
}

impl Block {
    /// The block as Python sees it: -1 for [`Block::Rest`].
    pub(crate) fn code(self) -> i64 {
        match self {
            Block::Rest => -1,
            Block::ToolResult(index) => i64::try_from(index).unwrap_or(i64::MAX),
        }
    }
}

/// One chat message read from a Python message.
#[derive(Debug)]
pub(crate) struct Part {
    /// Index of the Python message it came from.
    pub source: usize,
    /// Which piece of it.
    pub block: Block,
    /// The message.
    pub message: ChatMessage,
    /// The content followed by one byte, so that every part's text, empty or not, starts at an
    /// address of its own: a per-message counter recognises a message by it.
    text: String,
}

impl Part {
    fn new(source: usize, block: Block, message: ChatMessage) -> Part {
        let mut text = String::with_capacity(message.content.len() + 1);
        text.push_str(&message.content);
        text.push('\0');
        Part { source, block, message, text }
    }

    /// The content, at this part's own address.
    pub(crate) fn content(&self) -> &str {
        self.text.get(..self.message.content.len()).unwrap_or_default()
    }
}

/// Reads the messages of a Python list of one [`Shape`].
pub(crate) struct Reader<'py> {
    messages: Bound<'py, PyList>,
    shape: Shape,
}

impl<'py> Reader<'py> {
    pub(crate) fn new(messages: Bound<'py, PyList>, shape: Shape) -> Reader<'py> {
        Reader { messages, shape }
    }

    pub(crate) fn len(&self) -> usize {
        self.messages.len()
    }

    pub(crate) fn py(&self) -> Python<'py> {
        self.messages.py()
    }

    /// Message `index` itself.
    pub(crate) fn message(&self, index: usize) -> PyResult<Bound<'py, PyAny>> {
        self.messages.get_item(index)
    }

    /// Whether message `index` is a system message.
    pub(crate) fn is_system(&self, index: usize) -> PyResult<bool> {
        let message = self.message(index)?;
        Ok(match self.shape {
            Shape::LangChain => langchain_role(&message, index)? == Role::System,
            Shape::OpenAi | Shape::Anthropic => {
                matches!(
                    dict_str(&message, "role", index)?.as_deref(),
                    Some("system" | "developer")
                )
            }
        })
    }

    /// Appends the parts of message `index` to `out`.
    pub(crate) fn read(&self, index: usize, out: &mut Vec<Part>) -> PyResult<()> {
        let message = self.message(index)?;
        match self.shape {
            Shape::LangChain => {
                out.push(Part::new(index, Block::Rest, langchain(&message, index)?))
            }
            Shape::OpenAi => out.push(Part::new(index, Block::Rest, openai(&message, index)?)),
            Shape::Anthropic => anthropic(&message, index, out)?,
        }
        Ok(())
    }
}

fn invalid(index: usize, what: impl std::fmt::Display) -> PyErr {
    error(Kind::InvalidInput, format!("message {index}: {what}"))
}

fn json_dumps(value: &Bound<'_, PyAny>) -> PyResult<String> {
    static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = value.py();
    let dumps = DUMPS
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("json")?.getattr("dumps")?.unbind()))?;
    dumps.bind(py).call1((value,))?.extract()
}

/// Text of a content value: a string, or a list of strings and blocks (text blocks give their
/// text, other blocks their JSON, so that images and files are counted high rather than not
/// at all), joined with newlines.
fn text_of(content: &Bound<'_, PyAny>, index: usize) -> PyResult<String> {
    if content.is_none() {
        return Ok(String::new());
    }
    if let Ok(text) = content.cast::<PyString>() {
        return Ok(text.to_str()?.to_owned());
    }
    let Ok(list) = content.cast::<PyList>() else {
        return Err(invalid(index, "content must be a string or a list of blocks"));
    };
    let mut out = String::new();
    for (n, item) in list.iter().enumerate() {
        if n > 0 {
            out.push('\n');
        }
        if let Ok(text) = item.cast::<PyString>() {
            out.push_str(text.to_str()?);
            continue;
        }
        let block = item.cast::<PyDict>().map_err(|_| {
            invalid(index, format_args!("content block {n} is neither a string nor a dict"))
        })?;
        let kind = block.get_item("type")?;
        let text_key = match kind.as_ref().and_then(|k| k.extract::<String>().ok()).as_deref() {
            Some("text" | "input_text" | "output_text") => Some("text"),
            Some("thinking") => Some("thinking"),
            _ => None,
        };
        match text_key.map(|key| block.get_item(key)).transpose()?.flatten() {
            Some(text) if text.is_instance_of::<PyString>() => {
                out.push_str(text.cast::<PyString>()?.to_str()?);
            }
            _ => out.push_str(&json_dumps(&item)?),
        }
    }
    Ok(out)
}

fn langchain_role(message: &Bound<'_, PyAny>, index: usize) -> PyResult<Role> {
    let py = message.py();
    let kind: String = message
        .getattr(intern!(py, "type"))
        .and_then(|t| t.extract())
        .map_err(|_| invalid(index, "not a LangChain message (no `type`)"))?;
    Ok(match kind.as_str() {
        "system" => Role::System,
        "human" => Role::User,
        "ai" => Role::Assistant,
        "tool" => Role::Tool,
        "chat" => {
            let role: String = message.getattr(intern!(py, "role"))?.extract()?;
            match role.as_str() {
                "system" | "developer" => Role::System,
                "assistant" | "ai" => Role::Assistant,
                _ => Role::User,
            }
        }
        other => {
            return Err(invalid(
                index,
                format_args!(
                    "a {other:?} message has no place in a chat payload (use a ToolMessage with a tool_call_id)"
                ),
            ));
        }
    })
}

fn langchain(message: &Bound<'_, PyAny>, index: usize) -> PyResult<ChatMessage> {
    let py = message.py();
    let role = langchain_role(message, index)?;
    let content = text_of(&message.getattr(intern!(py, "content"))?, index)?;
    let mut chat = ChatMessage::text(role, content);
    match role {
        Role::Assistant => {
            for field in [intern!(py, "tool_calls"), intern!(py, "invalid_tool_calls")] {
                let Ok(calls) = message.getattr(field) else { continue };
                let Ok(calls) = calls.cast_into::<PyList>() else { continue };
                for call in calls.iter() {
                    chat.tool_calls.push(langchain_call(&call, index)?);
                }
            }
        }
        Role::Tool => {
            let id = message.getattr(intern!(py, "tool_call_id"))?;
            chat.tool_call_id = Some(if id.is_none() { String::new() } else { id.extract()? });
        }
        Role::System | Role::User => {}
    }
    Ok(chat)
}

fn langchain_call(call: &Bound<'_, PyAny>, index: usize) -> PyResult<ToolCall> {
    let call = call.cast::<PyDict>().map_err(|_| invalid(index, "a tool call is not a dict"))?;
    let get = |key: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(call.get_item(key)?.filter(|v| !v.is_none()))
    };
    let id = match get("id")? {
        Some(id) => id.extract::<String>()?,
        None => String::new(),
    };
    let name = match get("name")? {
        Some(name) => name.extract::<String>()?,
        None => String::new(),
    };
    let arguments = match get("args")? {
        Some(args) if args.is_instance_of::<PyString>() => args.extract::<String>()?,
        Some(args) => json_dumps(&args)?,
        None => "{}".to_owned(),
    };
    Ok(ToolCall::new(id, name, arguments))
}

fn as_dict<'a, 'py>(
    message: &'a Bound<'py, PyAny>,
    index: usize,
) -> PyResult<&'a Bound<'py, PyDict>> {
    message.cast::<PyDict>().map_err(|_| invalid(index, "not a dict"))
}

fn dict_str(message: &Bound<'_, PyAny>, key: &str, index: usize) -> PyResult<Option<String>> {
    match as_dict(message, index)?.get_item(key)? {
        Some(value) if !value.is_none() => value
            .extract::<String>()
            .map(Some)
            .map_err(|_| invalid(index, format_args!("`{key}` is not a string"))),
        _ => Ok(None),
    }
}

fn openai(message: &Bound<'_, PyAny>, index: usize) -> PyResult<ChatMessage> {
    let dict = as_dict(message, index)?;
    let role = match dict_str(message, "role", index)?.as_deref() {
        Some("system" | "developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        Some(other) => {
            return Err(invalid(index, format_args!("unknown role {other:?}")));
        }
        None => return Err(invalid(index, "no `role`")),
    };
    let content = match dict.get_item("content")? {
        Some(content) => text_of(&content, index)?,
        None => String::new(),
    };
    let mut chat = ChatMessage::text(role, content);
    if let Some(calls) = dict.get_item("tool_calls")?.filter(|c| !c.is_none()) {
        let calls = calls
            .cast_into::<PyList>()
            .map_err(|_| invalid(index, "`tool_calls` is not a list"))?;
        for call in calls.iter() {
            let call =
                call.cast::<PyDict>().map_err(|_| invalid(index, "a tool call is not a dict"))?;
            let id: String =
                call.get_item("id")?.map(|v| v.extract()).transpose()?.unwrap_or_default();
            let function = call
                .get_item("function")?
                .ok_or_else(|| invalid(index, "a tool call has no `function`"))?;
            let function = function
                .cast_into::<PyDict>()
                .map_err(|_| invalid(index, "`function` is not a dict"))?;
            let name: String =
                function.get_item("name")?.map(|v| v.extract()).transpose()?.unwrap_or_default();
            let arguments = match function.get_item("arguments")? {
                Some(args) if args.is_instance_of::<PyString>() => args.extract()?,
                Some(args) if !args.is_none() => json_dumps(&args)?,
                _ => "{}".to_owned(),
            };
            chat.tool_calls.push(ToolCall::new(id, name, arguments));
        }
    }
    if role == Role::Tool {
        chat.tool_call_id = Some(dict_str(message, "tool_call_id", index)?.unwrap_or_default());
    }
    Ok(chat)
}

fn anthropic(message: &Bound<'_, PyAny>, index: usize, out: &mut Vec<Part>) -> PyResult<()> {
    let dict = as_dict(message, index)?;
    let role = match dict_str(message, "role", index)?.as_deref() {
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("system") => Role::System,
        Some(other) => return Err(invalid(index, format_args!("unknown role {other:?}"))),
        None => return Err(invalid(index, "no `role`")),
    };
    let content = dict.get_item("content")?;
    let Some(blocks) = content.as_ref().and_then(|c| c.cast::<PyList>().ok()) else {
        let text = match &content {
            Some(content) => text_of(content, index)?,
            None => String::new(),
        };
        out.push(Part::new(index, Block::Rest, ChatMessage::text(role, text)));
        return Ok(());
    };
    let mut rest: Vec<Bound<'_, PyAny>> = Vec::new();
    let mut calls = Vec::new();
    for (n, block) in blocks.iter().enumerate() {
        let kind = block
            .cast::<PyDict>()
            .ok()
            .and_then(|b| b.get_item("type").ok().flatten())
            .and_then(|t| t.extract::<String>().ok());
        match kind.as_deref() {
            Some("tool_result") if role == Role::User => {
                let block = block.cast::<PyDict>()?;
                let id: String = block
                    .get_item("tool_use_id")?
                    .map(|v| v.extract())
                    .transpose()?
                    .unwrap_or_default();
                let text = match block.get_item("content")? {
                    Some(content) => text_of(&content, index)?,
                    None => String::new(),
                };
                let mut result = ChatMessage::tool_result(id, text);
                result.is_error =
                    block.get_item("is_error")?.is_some_and(|v| v.is_truthy().unwrap_or(false));
                out.push(Part::new(index, Block::ToolResult(n), result));
            }
            Some("tool_use") if role == Role::Assistant => {
                let block = block.cast::<PyDict>()?;
                let id: String =
                    block.get_item("id")?.map(|v| v.extract()).transpose()?.unwrap_or_default();
                let name: String =
                    block.get_item("name")?.map(|v| v.extract()).transpose()?.unwrap_or_default();
                let arguments = match block.get_item("input")? {
                    Some(input) => json_dumps(&input)?,
                    None => "{}".to_owned(),
                };
                calls.push(ToolCall::new(id, name, arguments));
            }
            _ => rest.push(block),
        }
    }
    let has_results = out.last().is_some_and(|p| p.source == index);
    if !rest.is_empty() || !has_results {
        let list = PyList::new(message.py(), rest)?;
        let mut chat = ChatMessage::text(role, text_of(list.as_any(), index)?);
        chat.tool_calls = calls;
        out.push(Part::new(index, Block::Rest, chat));
    }
    Ok(())
}
