//! Measuring each composed request for the conversation's [`bill`](super::bill): the direct
//! estimate of the body the client sent, and the forwarded prompt's stable prefix in bytes.
//! Kept with the conversation until the request's answer adds them to the bill
//! ([`Conv::record_answer`](super::Conv::record_answer)).

use std::time::{SystemTime, UNIX_EPOCH};

use super::bill::{
    CACHE_LIFETIME_MS, ClientBody, Forwarded, direct_cost, prompt_blocks, stable_prefix,
};
use super::{Composed, Conv};
use crate::wire::{Provider, Request};

/// The mark that asks Anthropic to cache a prefix.
const CACHE_MARK: &str = "\"cache_control\"";

pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether the client marks a prefix of `request` for Anthropic's cache: a `cache_control` in
/// its tool definitions, its `system` or its newest message (where agents put the moving mark).
fn marked(request: &Request) -> bool {
    let tools = request.fields.get("tools").is_some_and(|t| t.get().contains(CACHE_MARK));
    let system = request.has_system_item
        && request.items.first().is_some_and(|s| s.get().contains(CACHE_MARK));
    let newest = request.items.last().is_some_and(|m| m.get().contains(CACHE_MARK));
    tools || system || newest
}

impl Conv {
    /// Measures `composed`, the payload of `request` (whose messages were taken): what the
    /// client's body would cost sent direct, and the forwarded prompt's stable prefix against
    /// the previous forwarded one.
    pub fn measure(&mut self, request: &Request, composed: &Composed) {
        let now = self.request_time();
        let entries =
            &self.recorded.entries[..request.items.len().min(self.recorded.entries.len())];
        let tokens =
            |n: usize| -> u64 { entries.iter().take(n).map(|e| u64::from(e.tokens)).sum() };
        let manager = self.session.manager();
        let tools = self.recorded.placeholders.last().and_then(|id| manager.get(*id));
        let tools = tools.map_or(0, |m| u64::from(m.tokens()));
        let bill = &mut self.recorded.bill;
        let warm =
            bill.client_at_ms > 0 && now.saturating_sub(bill.client_at_ms) <= CACHE_LIFETIME_MS;
        let prefix = usize::try_from(bill.client_items).unwrap_or(usize::MAX);
        let body = ClientBody {
            tokens: tools + tokens(entries.len()),
            cached_prefix: if warm { tools + tokens(prefix) } else { 0 },
            marked: self.provider == Provider::OpenAi || marked(request),
        };
        bill.client_items = request.items.len() as u64;
        bill.client_at_ms = now;
        let (blocks, len) = prompt_blocks(&composed.body, composed.prompt.in_cache_order());
        let measured = !self.prompt_blocks.is_empty();
        let stable = stable_prefix(&self.prompt_blocks, &blocks, len);
        self.prompt_blocks = blocks;
        self.forwarded = Some(Forwarded {
            direct_milli: direct_cost(self.provider, &body),
            sent_tokens: composed.tokens,
            prompt_bytes: measured.then_some(len as u64),
            stable_bytes: if measured { stable as u64 } else { 0 },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_mark_is_found_where_agents_put_it() {
        let parse = |body: &str| Request::parse(Provider::Anthropic, body.as_bytes()).unwrap();
        let plain =
            parse(r#"{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}]}"#);
        assert!(!marked(&plain));
        let newest = parse(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}"#,
        );
        assert!(marked(&newest));
        let tools = parse(
            r#"{"model":"m","tools":[{"name":"t","cache_control":{"type":"ephemeral"}}],"messages":[]}"#,
        );
        assert!(marked(&tools));
    }
}
