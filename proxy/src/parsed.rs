//! The requests parsed last, so that the next request of a conversation reads only what it
//! adds: an agent sends its whole history every time, and everything but the newest turn and
//! the moving cache mark is the same bytes as last time ([`Request::parse_after`]).
//!
//! Requests are found by their tenant and their opening (the body up to the end of its first
//! message): the newest request of each opening is kept, oldest dropped first once the bodies
//! kept pass [`MAX_BYTES`]. Another tenant's request is never taken from, whatever its bytes.

use std::sync::{Arc, Mutex, PoisonError};

use indexmap::IndexMap;

use crate::hash::{fnv1a, hash_str};
use crate::wire::{self, Provider, Request, raw_hash};

/// Bytes of request bodies kept (about the newest body of a hundred 2 MB conversations).
pub const MAX_BYTES: usize = 256 << 20;

#[derive(Debug)]
struct Entry {
    tenant: String,
    request: Arc<Request>,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Kept {
    /// By [`key`], oldest first.
    entries: IndexMap<u64, Entry>,
    bytes: usize,
}

/// The newest parsed request of each tenant's openings.
///
/// ```
/// use ctxwin_proxy::parsed::Parsed;
/// use ctxwin_proxy::wire::Provider;
/// let parsed = Parsed::default();
/// let first = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello."}]}"#;
/// let next = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Bye."}]}"#;
/// assert_eq!(parsed.parse("t", Provider::OpenAi, first)?.reused(), 0);
/// assert_eq!(parsed.parse("t", Provider::OpenAi, next)?.reused(), 1);
/// assert_eq!(parsed.parse("u", Provider::OpenAi, next)?.reused(), 0); // another tenant
/// # Ok::<(), ctxwin_proxy::wire::BadRequest>(())
/// ```
#[derive(Debug)]
pub struct Parsed {
    kept: Mutex<Kept>,
    max_bytes: usize,
}

impl Default for Parsed {
    fn default() -> Self {
        Self::new(MAX_BYTES)
    }
}

/// Where a request of `tenant` with `opening` is kept.
fn key(tenant: &str, provider: Provider, opening: &[u8]) -> u64 {
    let seed = fnv1a(hash_str(tenant), provider.as_str().as_bytes());
    fnv1a(seed, &raw_hash(opening).to_le_bytes())
}

impl Parsed {
    /// Keeps at most `max_bytes` of bodies.
    pub fn new(max_bytes: usize) -> Self {
        Self { kept: Mutex::default(), max_bytes }
    }

    /// Parses `body` of `tenant`, continuing the newest request kept with the same opening,
    /// and keeps it in that one's place.
    ///
    /// # Errors
    /// As [`Request::parse`].
    pub fn parse(
        &self,
        tenant: &str,
        provider: Provider,
        body: &[u8],
    ) -> Result<Arc<Request>, wire::BadRequest> {
        let request = Request::parse_after(provider, body, |opening| {
            let kept = self.lock();
            let entry = kept.entries.get(&key(tenant, provider, opening))?;
            (entry.tenant == tenant).then(|| entry.request.clone())
        })?;
        let request = Arc::new(request);
        if let Some(opening) = request.opening() {
            self.keep(key(tenant, provider, opening), tenant, request.clone(), body.len());
        }
        Ok(request)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn keep(&self, key: u64, tenant: &str, request: Arc<Request>, bytes: usize) {
        if bytes > self.max_bytes {
            return;
        }
        let entry = Entry { tenant: tenant.to_string(), request, bytes };
        let mut kept = self.lock();
        if let Some(old) = kept.entries.shift_remove(&key) {
            kept.bytes -= old.bytes;
        }
        kept.bytes += bytes;
        kept.entries.insert(key, entry);
        while kept.bytes > self.max_bytes {
            let Some((_, old)) = kept.entries.shift_remove_index(0) else { break };
            kept.bytes -= old.bytes;
        }
    }

    /// Requests kept.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(turns: usize) -> Vec<u8> {
        let messages: Vec<_> = (0..turns)
            .map(|i| match i % 2 {
                0 => json!({"role": "user", "content": format!("question {i}")}),
                _ => json!({"role": "assistant", "content": format!("answer {i}")}),
            })
            .collect();
        json!({"model": "m", "messages": messages}).to_string().into_bytes()
    }

    #[test]
    fn a_conversation_continues_its_newest_request() {
        let parsed = Parsed::default();
        assert_eq!(parsed.parse("t", Provider::OpenAi, &body(3)).unwrap().reused(), 0);
        assert_eq!(parsed.parse("t", Provider::OpenAi, &body(5)).unwrap().reused(), 2);
        assert_eq!(parsed.parse("t", Provider::OpenAi, &body(7)).unwrap().reused(), 4);
        assert_eq!(parsed.len(), 1);
        // Another provider's endpoint, another tenant: nothing taken.
        assert_eq!(parsed.parse("t", Provider::Anthropic, &body(9)).unwrap().reused(), 0);
        assert_eq!(parsed.parse("u", Provider::OpenAi, &body(9)).unwrap().reused(), 0);
        assert_eq!(parsed.len(), 3);
    }

    #[test]
    fn the_oldest_go_first_past_the_bound() {
        let parsed = Parsed::new(3 * body(3).len());
        for tenant in ["a", "b", "c", "d"] {
            parsed.parse(tenant, Provider::OpenAi, &body(3)).unwrap();
        }
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed.parse("a", Provider::OpenAi, &body(5)).unwrap().reused(), 0);
        assert_eq!(parsed.parse("d", Provider::OpenAi, &body(5)).unwrap().reused(), 2);
        // A body larger than the bound is not kept.
        let small = Parsed::new(10);
        small.parse("a", Provider::OpenAi, &body(3)).unwrap();
        assert!(small.is_empty());
    }
}
