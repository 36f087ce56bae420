//! A compaction while the provider's prompt cache is cold: after a pause longer than the
//! cache lives, the next request writes its whole prefix anyway, so compacting first costs
//! no extra write, makes that write smaller, and puts the next compaction (a rewrite of a
//! warm prefix) further off (issue 27: "prefer a cache that is cold or about to expire").

use super::bill::CACHE_LIFETIME_MS;
use super::{Conv, ConvError};
use crate::wire::{Provider, Request};

/// How long OpenAI keeps a prefix cached after its last use: 5 to 10 minutes of inactivity
/// (longer off-peak); the longer bound, so a cache that may still be warm is not taken for
/// cold.
pub const OPENAI_CACHE_LIFETIME_MS: u64 = 10 * 60 * 1000;

/// Anthropic's cache lifetime when a mark asks for the hour (`"ttl": "1h"`).
pub const ANTHROPIC_HOUR_MS: u64 = 60 * 60 * 1000;

/// How long the provider keeps `request`'s prefix cached after its last use; `None` when the
/// request asks for a retention this cannot see the end of (OpenAI's
/// `prompt_cache_retention`).
///
/// ```
/// use ctxwin_proxy::conv::cache_lifetime_ms;
/// use ctxwin_proxy::wire::{Provider, Request};
/// let five = Request::parse(Provider::Anthropic, br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}"#)?;
/// assert_eq!(cache_lifetime_ms(Provider::Anthropic, &five), Some(5 * 60 * 1000));
/// let hour = Request::parse(Provider::Anthropic, br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","ttl": "1h"}}]}]}"#)?;
/// assert_eq!(cache_lifetime_ms(Provider::Anthropic, &hour), Some(60 * 60 * 1000));
/// let kept = Request::parse(Provider::OpenAi, br#"{"model":"m","prompt_cache_retention":"24h","messages":[{"role":"user","content":"hi"}]}"#)?;
/// assert_eq!(cache_lifetime_ms(Provider::OpenAi, &kept), None);
/// # Ok::<(), ctxwin_proxy::wire::BadRequest>(())
/// ```
pub fn cache_lifetime_ms(provider: Provider, request: &Request) -> Option<u64> {
    match provider {
        Provider::OpenAi if request.fields.contains_key("prompt_cache_retention") => None,
        Provider::OpenAi => Some(OPENAI_CACHE_LIFETIME_MS),
        Provider::Anthropic => {
            let marks = request
                .fields
                .values()
                .map(|v| v.get())
                .chain(request.items.iter().map(|m| m.get()));
            let hour = marks.into_iter().any(asks_for_the_hour);
            Some(if hour { ANTHROPIC_HOUR_MS } else { CACHE_LIFETIME_MS })
        }
    }
}

/// Whether `raw` JSON holds a `"ttl"` of `"1h"` (whatever the spacing).
fn asks_for_the_hour(raw: &str) -> bool {
    raw.match_indices("\"ttl\"").any(|(at, key)| {
        let rest = raw[at + key.len()..].trim_start();
        rest.strip_prefix(':').is_some_and(|value| value.trim_start().starts_with("\"1h\""))
    })
}

impl Conv {
    /// Compacts the history before `request`'s messages are pushed when the conversation's
    /// previous request was sent longer ago than the provider keeps its cache (at `now_ms`)
    /// and the history is more than halfway from the low-water mark to the budget: the
    /// compaction would come soon anyway, and now it rewrites nothing that was cached.
    /// Returns the units evicted.
    pub(super) fn compact_if_cold(
        &mut self,
        request: &Request,
        now_ms: u64,
    ) -> Result<usize, ConvError> {
        let last = self.recorded.bill.client_at_ms;
        let Some(lifetime) = cache_lifetime_ms(self.provider, request) else { return Ok(0) };
        if last == 0 || now_ms.saturating_sub(last) <= lifetime {
            return Ok(0);
        }
        let manager = self.session.manager();
        let (budget, used) = (manager.budget(), manager.used());
        let low = manager.config().low_water_tokens();
        if used <= low.saturating_add(budget.saturating_sub(low) / 2) {
            return Ok(0);
        }
        let evicted = self.session.compact()?;
        tracing::debug!(session = %self.key, idle_ms = now_ms - last, evicted, "proxy: compacted while the prompt cache was cold");
        Ok(evicted)
    }
}
