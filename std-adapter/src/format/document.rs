//! Reading a JSON document — a bare message array or a request body — with the readers of
//! either provider, which differ only in how they read one message and a body's other fields.

use super::Provider;
use super::error::{FormatError, Problem};
use super::node::{Kind, MESSAGES, Node, Object};
use super::{anthropic, openai};
use crate::message::{ChatMessage, Conversation};

impl Provider {
    /// Reads one message object of this provider's layout into `out` (one or more messages).
    pub(super) fn read_message(
        self,
        node: &Node<'_, '_>,
        out: &mut Vec<ChatMessage>,
    ) -> Result<(), FormatError> {
        match self {
            Provider::OpenAi => openai::read_message(node, out),
            Provider::Anthropic => anthropic::read_message(node, out),
        }
    }

    /// Undoes what this provider's writer adds to make a conversation valid for its API (the
    /// opening user turn of an assistant-first Anthropic conversation).
    pub(super) fn finish(self, conv: &mut Conversation) {
        if self == Provider::Anthropic {
            anthropic::drop_opening_placeholder(&mut conv.messages);
        }
    }

    /// Reads the non-message fields a body or a JSONL header line carries.
    pub(super) fn read_header(
        self,
        obj: &Object<'_, '_>,
        conv: &mut Conversation,
    ) -> Result<(), FormatError> {
        match self {
            Provider::OpenAi => openai::read_header(obj, conv),
            Provider::Anthropic => anthropic::read_header(obj, conv),
        }
    }
}

/// Reads a bare message array or a request body (`messages`, `tools`, and for Anthropic
/// `system`; other keys ignored). An OpenAI body with a top-level `system` is refused: it is
/// Anthropic's layout, and reading it as OpenAI would drop the system prompt.
pub(super) fn read_document(
    root: &Node<'_, '_>,
    conv: &mut Conversation,
    provider: Provider,
) -> Result<(), FormatError> {
    match root.kind() {
        Kind::Array => read_messages(&root.labelled(MESSAGES), conv, provider)?,
        Kind::Object => {
            let body = root.object()?;
            if let (Provider::OpenAi, Some(system)) = (provider, body.field("system")) {
                return Err(system.error(Problem::Unsupported(
                    "top-level `system` in an OpenAI body (Anthropic's layout?)".to_owned(),
                )));
            }
            read_messages(&body.required("messages")?, conv, provider)?;
            provider.read_header(&body, conv)?;
        }
        _ => return Err(root.wrong_type("an array of messages or an object with `messages`")),
    }
    provider.finish(conv);
    Ok(())
}

fn read_messages(
    list: &Node<'_, '_>,
    conv: &mut Conversation,
    provider: Provider,
) -> Result<(), FormatError> {
    for (index, message) in list.array("an array of messages")?.into_iter().enumerate() {
        provider.read_message(&message.in_message(index), &mut conv.messages)?;
    }
    Ok(())
}
