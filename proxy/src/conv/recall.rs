//! The recall tool's side of a conversation: whether a request declares it, and the archived
//! text its calls get back, bounded by the room the window has left.

use ctxwin_std::core::counter::TokenCounter;

use super::Conv;
use crate::wire::{RECALL_TOOL, RecallCall, RecallResult, Request, names_recall_tool};

impl Conv {
    /// Whether `request`'s body declares the recall tool: the settings ask for it, the
    /// archive keeps whole texts, and no tool of the client's has its name (then it is
    /// neither declared nor answered; said once per conversation).
    pub(super) fn declares_recall(&mut self, request: &Request) -> bool {
        if self.recall_declared(request) {
            return true;
        }
        let tools = request.fields.get("tools").map(|t| t.get());
        if !self.settings.recall_tool || !names_recall_tool(self.provider, tools) {
            return false;
        }
        if !self.recall_clash_logged {
            self.recall_clash_logged = true;
            tracing::warn!(session = %self.key, "proxy: the client has a tool named {RECALL_TOOL}; the proxy's recall tool is not declared in this conversation");
        }
        false
    }

    /// [`declares_recall`](Self::declares_recall) without its log. Only beside the client's
    /// own tools: a request without any has no tool outputs to cut, and its prompt would
    /// grow by the definition for nothing (a `tools` that is not a list could not take it).
    pub(super) fn recall_declared(&self, request: &Request) -> bool {
        let tools = request.fields.get("tools").map(|t| t.get());
        let listed = tools
            .and_then(|t| t.strip_prefix('['))
            .is_some_and(|t| !t.trim_start().starts_with(']'));
        self.settings.recall_tool
            && self.session.archive().is_some()
            && listed
            && !names_recall_tool(self.provider, tools)
    }

    /// The results of recall `calls`, each the whole archived text of the message it names
    /// (the lines asked for), found in this conversation's scope only: an id of another
    /// conversation or tenant is an error result, as is one that is not archived. Together
    /// they take at most `room` tokens, each at most [`ConvSettings::recall_cap`]; a text
    /// cut there says which line to ask from next. Returns the results and the tokens they
    /// take.
    ///
    /// [`ConvSettings::recall_cap`]: super::ConvSettings::recall_cap
    pub fn recall_results(&self, calls: &[RecallCall], room: u32) -> (Vec<RecallResult>, u32) {
        let mut left = room;
        let mut results = Vec::with_capacity(calls.len());
        for call in calls {
            let (text, is_error, tokens) = match self.recalled_text(call, left) {
                Ok((text, tokens)) => (text, false, tokens),
                Err(reason) => (reason, true, 0),
            };
            left = left.saturating_sub(tokens);
            results.push(RecallResult { call_id: call.call_id.clone(), text, is_error });
        }
        (results, room - left)
    }

    /// The text one recall `call` gets, within `room` tokens, and its tokens; the reason
    /// it gets none.
    fn recalled_text(&self, call: &RecallCall, room: u32) -> Result<(String, u32), String> {
        let id = call.id.ok_or("give the id that the cut output's last line names")?;
        let archive = self.session.archive().ok_or("the archive is not available")?;
        let row = match archive.get(self.session.scope(), id) {
            Ok(Some(row)) => row,
            Ok(None) => return Err(format!("no archived output {id} in this conversation")),
            Err(error) => {
                tracing::warn!(session = %self.key, %error, "proxy: recall read failed");
                return Err(format!("output {id} could not be read from the archive"));
            }
        };
        let lines: Vec<&str> = row.full_text().split('\n').collect();
        let total = lines.len();
        let from = call.from_line.unwrap_or(1).max(1);
        let to = call.to_line.unwrap_or(total).min(total);
        if from > to {
            return Err(format!("output {id} has {total} lines: lines {from}-{to} are not in it"));
        }
        let cap = room.min(self.settings.recall_cap());
        let counter = self.session.manager().counter();
        let (mut text, mut tokens, mut last) = (String::new(), 0u32, from - 1);
        for line in lines.iter().take(to).skip(from - 1) {
            let cost = counter.count(line).saturating_add(1);
            if tokens.saturating_add(cost) > cap {
                break;
            }
            if last >= from {
                text.push('\n');
            }
            text.push_str(line);
            (tokens, last) = (tokens + cost, last + 1);
        }
        if last < from {
            return Err(format!(
                "line {from} of output {id} does not fit the {cap} tokens the context window has left for it"
            ));
        }
        if last < to {
            text.push_str(&format!("\n[ctxwin: lines {from}-{last} of {total} shown, as many as fit; call {RECALL_TOOL} with {{\"id\": {id}, \"from_line\": {}}} for the next]", last + 1));
        }
        Ok((text, tokens))
    }
}
