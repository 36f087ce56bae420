//! How long a provider keeps a request's prompt prefix cached after its last use, as the
//! request asks for it.

use super::Provider;
use super::request::Request;

/// How long both providers keep a cached prefix by default: Anthropic's ephemeral cache, the
/// lower bound of OpenAI's.
pub const CACHE_LIFETIME_MS: u64 = 5 * 60 * 1000;

/// OpenAI's upper bound: a prefix stays 5 to 10 minutes after its last use (longer off-peak).
pub const OPENAI_CACHE_LIFETIME_MS: u64 = 10 * 60 * 1000;

/// Anthropic's lifetime when a mark asks for the hour (`"ttl": "1h"`).
pub const ANTHROPIC_HOUR_MS: u64 = 60 * 60 * 1000;

/// The longest a `provider` may keep `request`'s prefix cached after its last use: a pause
/// longer than this left it cold. `None` when the request asks for a retention whose end
/// this does not know (OpenAI's `prompt_cache_retention`). Reads every item of an Anthropic
/// request for a `"ttl"` mark: for a request after a long pause, not every request.
///
/// ```
/// use ctxwin_std::format::{Provider, Request, cache_lifetime_ms};
/// let five = Request::parse(Provider::Anthropic, br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}"#)?;
/// assert_eq!(cache_lifetime_ms(Provider::Anthropic, &five), Some(5 * 60 * 1000));
/// let hour = Request::parse(Provider::Anthropic, br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","ttl": "1h"}}]}]}"#)?;
/// assert_eq!(cache_lifetime_ms(Provider::Anthropic, &hour), Some(60 * 60 * 1000));
/// let kept = Request::parse(Provider::OpenAi, br#"{"model":"m","prompt_cache_retention":"24h","messages":[{"role":"user","content":"hi"}]}"#)?;
/// assert_eq!(cache_lifetime_ms(Provider::OpenAi, &kept), None);
/// # Ok::<(), ctxwin_std::format::BadRequest>(())
/// ```
pub fn cache_lifetime_ms(provider: Provider, request: &Request) -> Option<u64> {
    match provider {
        Provider::OpenAi if request.fields.contains_key("prompt_cache_retention") => None,
        Provider::OpenAi => Some(OPENAI_CACHE_LIFETIME_MS),
        Provider::Anthropic => {
            let fields = request.fields.values().map(|v| v.get());
            let mut raws = fields.chain(request.items.iter().map(|m| m.get()));
            let hour = raws.any(asks_for_the_hour);
            Some(if hour { ANTHROPIC_HOUR_MS } else { CACHE_LIFETIME_MS })
        }
    }
}

/// Whether `raw` JSON holds a `"ttl"` of `"1h"` (whatever the spacing).
fn asks_for_the_hour(raw: &str) -> bool {
    raw.match_indices("\"ttl\"").any(|(at, key)| {
        let rest = raw.get(at + key.len()..).unwrap_or("").trim_start();
        rest.strip_prefix(':').is_some_and(|value| value.trim_start().starts_with("\"1h\""))
    })
}
