//! Errors of the format readers and writers: where the input is wrong and what is wrong there.

use std::fmt;

/// A conversation could not be read or written.
///
/// It names the place (`line`, `message`, `field`) and the [`Problem`]. Display is one line,
/// for example `line 4: messages[3].tool_calls[0].function.arguments: expected a string, found a
/// number`.
///
/// # Examples
///
/// ```
/// use ctxwin_std::format::{read, Format, Problem};
///
/// let input = "{\"role\":\"user\",\"content\":\"hi\"}\n{\"role\":\"robot\",\"content\":\"x\"}\n";
/// let err = read(input, Format::OpenAiJsonl).unwrap_err();
/// assert_eq!(err.line, Some(2));
/// assert_eq!(err.message, Some(1));
/// assert_eq!(err.field, "messages[1].role");
/// assert!(matches!(err.problem, Problem::UnknownRole(ref r) if r == "robot"));
/// assert_eq!(err.to_string(), "line 2: messages[1].role: unknown role `robot`");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct FormatError {
    /// 1-based line of the input where the offending value starts (JSON and JSONL alike).
    /// `None` for writer errors, which have no input text.
    pub line: Option<usize>,
    /// 0-based index of the offending message: in the input's message list when reading (the
    /// record index in JSONL, header line not counted), in [`Conversation::messages`] when writing.
    ///
    /// [`Conversation::messages`]: crate::Conversation::messages
    pub message: Option<usize>,
    /// Path of the offending field from the document root, e.g.
    /// `messages[3].tool_calls[0].function.arguments` or `tools[1].parameters`; empty when the
    /// problem is not in one field (a JSON syntax error, an I/O error).
    pub field: String,
    /// What is wrong.
    pub problem: Problem,
}

/// What was wrong with a value, see [`FormatError`].
///
/// # Examples
///
/// ```
/// use ctxwin_std::format::Problem;
/// let p = Problem::WrongType { expected: "a string", found: "null" };
/// assert_eq!(p.to_string(), "expected a string, found null");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// The text is not JSON; `column` is 1-based within `line`.
    #[error("invalid JSON at column {column}: {detail}")]
    Syntax {
        /// 1-based column of the error.
        column: usize,
        /// serde_json's description, without its position.
        detail: String,
    },
    /// A required field is absent.
    #[error("missing required field")]
    Missing,
    /// A value has the wrong JSON type.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// The type the format requires, with article (`a string`).
        expected: &'static str,
        /// The JSON type found (`null`, `a number`, ...).
        found: &'static str,
    },
    /// A role this format does not have.
    #[error("unknown role `{0}`")]
    UnknownRole(String),
    /// Content or a tool of a kind a [`Conversation`](crate::Conversation) cannot hold (images,
    /// thinking blocks, server tools, ...): refused rather than silently dropped.
    #[error("unsupported {0}")]
    Unsupported(String),
    /// The field is not allowed on a message of this role.
    #[error("not allowed on a `{0}` message")]
    NotAllowed(&'static str),
    /// JSON carried as text (tool-call arguments, tool parameters) is not the JSON it must be.
    #[error("invalid JSON text: {0}")]
    InvalidJsonText(String),
    /// Reading the input failed.
    #[error("I/O error: {0}")]
    Io(#[source] std::io::Error),
}

impl FormatError {
    /// An error with no input position, for the writers.
    pub(crate) fn at_message(message: usize, field: String, problem: Problem) -> Self {
        Self { line: None, message: Some(message), field, problem }
    }

    /// An error in a tool definition, for the writers.
    pub(crate) fn at_field(field: String, problem: Problem) -> Self {
        Self { line: None, message: None, field, problem }
    }

    /// A JSON syntax error of text starting at 1-based `first_line`.
    pub(crate) fn syntax(err: &serde_json::Error, first_line: usize) -> Self {
        let full = err.to_string();
        let detail = match full.rsplit_once(" at line ") {
            Some((detail, _)) => detail.to_owned(),
            None => full,
        };
        let line = first_line.saturating_add(err.line().saturating_sub(1));
        Self {
            line: Some(line),
            message: None,
            field: String::new(),
            problem: Problem::Syntax { column: err.column(), detail },
        }
    }

    /// An I/O error while reading `line`.
    pub(crate) fn io(err: std::io::Error, line: usize) -> Self {
        Self { line: Some(line), message: None, field: String::new(), problem: Problem::Io(err) }
    }

    fn describe(&self) -> Describe<'_> {
        Describe(self)
    }
}

struct Describe<'e>(&'e FormatError);

impl fmt::Display for Describe<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        if let Some(line) = e.line {
            write!(f, "line {line}: ")?;
        }
        if !e.field.is_empty() {
            write!(f, "{}: ", e.field)?;
        }
        write!(f, "{}", e.problem)
    }
}

/// A format name that [`Format::from_str`](std::str::FromStr::from_str) does not know.
///
/// # Examples
///
/// ```
/// use ctxwin_std::format::Format;
/// let err = "yaml".parse::<Format>().unwrap_err();
/// assert_eq!(err.name, "yaml");
/// assert!(err.to_string().contains("openai-jsonl"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown format `{name}` (expected one of: openai, openai-jsonl, anthropic, anthropic-jsonl)"
)]
pub struct UnknownFormat {
    /// The name given.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_line_with_every_part() {
        let e = FormatError {
            line: Some(7),
            message: Some(3),
            field: "messages[3].content".into(),
            problem: Problem::WrongType { expected: "a string", found: "a number" },
        };
        assert_eq!(e.to_string(), "line 7: messages[3].content: expected a string, found a number");
    }

    #[test]
    fn writer_errors_have_no_line() {
        let e = FormatError::at_message(
            2,
            "messages[2].tool_calls[0].arguments".into(),
            Problem::InvalidJsonText("EOF".into()),
        );
        assert_eq!(e.to_string(), "messages[2].tool_calls[0].arguments: invalid JSON text: EOF");
    }

    #[test]
    fn syntax_error_strips_serde_position_and_offsets_line() {
        let err = serde_json::from_str::<serde_json::Value>("{\n\"a\": }").unwrap_err();
        let e = FormatError::syntax(&err, 10);
        assert_eq!(e.line, Some(11));
        assert!(matches!(e.problem, Problem::Syntax { column: 6, .. }), "{e:?}");
        assert!(!e.to_string().contains("at line"), "{e}");
        assert!(!e.to_string().contains('\n'));
    }
}
