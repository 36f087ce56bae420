//! A lazily parsed JSON tree over the input text that knows where each value sits.
//!
//! Every value is a slice of the input (serde_json's borrowed `RawValue`), so an error can name
//! the exact line of the offending value, and JSON carried verbatim (tool `input`, tool
//! schemas) keeps its original text.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use super::error::{FormatError, Problem};

/// Input text and the 1-based line it starts on.
pub(super) struct Source<'a> {
    text: &'a str,
    first_line: usize,
}

impl<'a> Source<'a> {
    pub(super) const fn new(text: &'a str, first_line: usize) -> Self {
        Self { text, first_line }
    }

    /// Checks the whole text is one JSON value and returns it, at the root path.
    pub(super) fn root(&'a self) -> Result<Node<'a, 'static>, FormatError> {
        let raw: &'a RawValue = serde_json::from_str(self.text)
            .map_err(|err| FormatError::syntax(&err, self.first_line))?;
        Ok(Node { raw: raw.get(), src: self, path: ROOT, message: None })
    }

    /// The line on which `slice` (a part of this source's text) begins.
    fn line_of(&self, slice: &str) -> usize {
        let start = self.text.as_ptr().addr();
        let newlines = slice
            .as_ptr()
            .addr()
            .checked_sub(start)
            .and_then(|offset| self.text.get(..offset))
            .map_or(0, |before| before.bytes().filter(|b| *b == b'\n').count());
        self.first_line.saturating_add(newlines)
    }
}

/// One step of a field path.
#[derive(Clone, Copy, Debug)]
pub(super) enum Seg {
    Key(&'static str),
    Index(usize),
}

/// A field path as a linked list through the caller's stack; rendered only for errors.
#[derive(Clone, Copy, Debug)]
pub(super) struct Path<'p> {
    parent: Option<&'p Path<'p>>,
    seg: Option<Seg>,
}

/// The path of the document root.
pub(super) const ROOT: Path<'static> = Path { parent: None, seg: None };
/// The path `messages`, root of JSONL records and of bare message arrays.
pub(super) static MESSAGES: Path<'static> = Path { parent: None, seg: Some(Seg::Key("messages")) };

impl<'p> Path<'p> {
    pub(super) const fn child(parent: &'p Path<'p>, seg: Seg) -> Self {
        Self { parent: Some(parent), seg: Some(seg) }
    }

    pub(super) fn render(&self) -> String {
        let mut segs = Vec::new();
        let mut at = Some(self);
        while let Some(path) = at {
            segs.extend(path.seg);
            at = path.parent;
        }
        let mut out = String::new();
        for seg in segs.iter().rev() {
            match seg {
                Seg::Key(key) if out.is_empty() => out.push_str(key),
                Seg::Key(key) => {
                    out.push('.');
                    out.push_str(key);
                }
                Seg::Index(i) => {
                    out.push('[');
                    out.push_str(&i.to_string());
                    out.push(']');
                }
            }
        }
        out
    }
}

/// The JSON type of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

impl Kind {
    const fn described(self) -> &'static str {
        match self {
            Kind::Object => "an object",
            Kind::Array => "an array",
            Kind::String => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
            Kind::Null => "null",
        }
    }
}

/// One JSON value of the input with its path and the message it belongs to.
#[derive(Clone, Copy)]
pub(super) struct Node<'a, 'p> {
    raw: &'a str,
    src: &'a Source<'a>,
    path: Path<'p>,
    message: Option<usize>,
}

impl<'a, 'p> Node<'a, 'p> {
    /// The same value under another path (a bare array is `messages`, a JSONL record
    /// `messages[i]`).
    pub(super) const fn labelled(mut self, path: Path<'p>) -> Self {
        self.path = path;
        self
    }

    /// The same value, marked as belonging to input message `index`.
    pub(super) const fn in_message(mut self, index: usize) -> Self {
        self.message = Some(index);
        self
    }

    /// The value's JSON text exactly as in the input.
    pub(super) const fn raw(&self) -> &'a str {
        self.raw
    }

    pub(super) fn kind(&self) -> Kind {
        match self.raw.trim_start().as_bytes().first() {
            Some(b'{') => Kind::Object,
            Some(b'[') => Kind::Array,
            Some(b'"') => Kind::String,
            Some(b't' | b'f') => Kind::Bool,
            Some(b'n') => Kind::Null,
            _ => Kind::Number,
        }
    }

    /// An error about this value.
    pub(super) fn error(&self, problem: Problem) -> FormatError {
        FormatError {
            line: Some(self.src.line_of(self.raw)),
            message: self.message,
            field: self.path.render(),
            problem,
        }
    }

    /// A wrong-type error naming what was expected.
    pub(super) fn wrong_type(&self, expected: &'static str) -> FormatError {
        self.error(Problem::WrongType { expected, found: self.kind().described() })
    }

    fn parse<T: serde::Deserialize<'a>>(&self, expected: &'static str) -> Result<T, FormatError> {
        serde_json::from_str(self.raw).map_err(|_| self.wrong_type(expected))
    }

    fn child<'s>(&'s self, raw: &'a RawValue, seg: Seg) -> Node<'a, 's> {
        Node {
            raw: raw.get(),
            src: self.src,
            path: Path::child(&self.path, seg),
            message: self.message,
        }
    }

    pub(super) fn object(&self) -> Result<Object<'a, '_>, FormatError> {
        if self.kind() != Kind::Object {
            return Err(self.wrong_type("an object"));
        }
        let entries = self.parse("an object")?;
        Ok(Object { entries, node: self })
    }

    pub(super) fn array(&self, expected: &'static str) -> Result<Vec<Node<'a, '_>>, FormatError> {
        if self.kind() != Kind::Array {
            return Err(self.wrong_type(expected));
        }
        let items: Vec<&'a RawValue> = self.parse(expected)?;
        Ok(items.into_iter().enumerate().map(|(i, raw)| self.child(raw, Seg::Index(i))).collect())
    }

    pub(super) fn string(&self) -> Result<String, FormatError> {
        if self.kind() != Kind::String {
            return Err(self.wrong_type("a string"));
        }
        self.parse("a string")
    }

    pub(super) fn bool(&self) -> Result<bool, FormatError> {
        if self.kind() != Kind::Bool {
            return Err(self.wrong_type("a boolean"));
        }
        self.parse("a boolean")
    }
}

/// The fields of a JSON object, looked up by name.
pub(super) struct Object<'a, 's> {
    entries: BTreeMap<String, &'a RawValue>,
    node: &'s Node<'a, 's>,
}

impl<'a, 's> Object<'a, 's> {
    pub(super) fn has(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    /// The field, `None` when absent or `null`.
    pub(super) fn field(&self, key: &'static str) -> Option<Node<'a, 's>> {
        let raw = self.entries.get(key)?;
        let node = self.node.child(raw, Seg::Key(key));
        (node.kind() != Kind::Null).then_some(node)
    }

    /// The field, which must be present (it may be `null`; the typed getters reject that).
    pub(super) fn required(&self, key: &'static str) -> Result<Node<'a, 's>, FormatError> {
        match self.entries.get(key) {
            Some(raw) => Ok(self.node.child(raw, Seg::Key(key))),
            None => Err(self.missing(key)),
        }
    }

    /// A missing-field error for `key` of this object.
    pub(super) fn missing(&self, key: &'static str) -> FormatError {
        let mut err = self.node.error(Problem::Missing);
        err.field = Path::child(&self.node.path, Seg::Key(key)).render();
        err
    }

    pub(super) fn string(&self, key: &'static str) -> Result<String, FormatError> {
        self.required(key)?.string()
    }

    pub(super) fn opt_string(&self, key: &'static str) -> Result<Option<String>, FormatError> {
        self.field(key).map(|node| node.string()).transpose()
    }

    pub(super) fn opt_bool(&self, key: &'static str) -> Result<Option<bool>, FormatError> {
        self.field(key).map(|node| node.bool()).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_with_dots_and_brackets() {
        let msgs = &MESSAGES;
        let third = Path::child(msgs, Seg::Index(3));
        let calls = Path::child(&third, Seg::Key("tool_calls"));
        let first = Path::child(&calls, Seg::Index(0));
        let func = Path::child(&first, Seg::Key("function"));
        assert_eq!(func.render(), "messages[3].tool_calls[0].function");
        assert_eq!(ROOT.render(), "");
        assert_eq!(Path::child(&ROOT, Seg::Key("tools")).render(), "tools");
    }

    #[test]
    fn errors_name_the_line_of_the_value() {
        let text = "{\n  \"a\": [\n    1,\n    \"x\"\n  ]\n}";
        let src = Source::new(text, 1);
        let root = src.root().unwrap();
        let obj = root.object().unwrap();
        let items = obj.required("a").unwrap();
        let items = items.array("an array").unwrap();
        let err = items[1].bool().unwrap_err();
        assert_eq!(err.line, Some(4));
        assert_eq!(err.field, "a[1]");
        assert!(matches!(
            err.problem,
            Problem::WrongType { expected: "a boolean", found: "a string" }
        ));
        let missing = obj.missing("b");
        assert_eq!((missing.line, missing.field.as_str()), (Some(1), "b"));
    }

    #[test]
    fn raw_keeps_the_original_text_and_null_reads_as_absent() {
        let src = Source::new(r#"{"input": {"b": 1,  "a": [2]}, "n": null}"#, 5);
        let root = src.root().unwrap();
        let obj = root.object().unwrap();
        assert_eq!(obj.field("input").unwrap().raw(), r#"{"b": 1,  "a": [2]}"#);
        assert!(obj.field("n").is_none());
        assert!(obj.has("n"));
        assert_eq!(obj.required("n").unwrap().kind(), Kind::Null);
        assert_eq!(obj.opt_string("zzz").unwrap(), None);
    }

    #[test]
    fn syntax_errors_carry_the_line() {
        let src = Source::new("[\n1,\n]", 3);
        let err = src.root().err().unwrap();
        assert_eq!(err.line, Some(5));
        assert!(matches!(err.problem, Problem::Syntax { .. }));
    }
}
