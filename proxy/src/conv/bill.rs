//! What a conversation costs, measured honestly: the upstream's billed usage, the same bill
//! against an estimate of sending the client's own body direct, and how much of each
//! forwarded prompt, byte for byte, the previous one began with.
//!
//! * **Billed**: the upstream's `usage` of each answer: uncached input, cache writes, cache
//!   reads (OpenAI: `prompt_tokens` less `cached_tokens`, and `cached_tokens`). Its *cost* is in
//!   base-input tokens: Anthropic uncached ×1, write ×1.25, read ×0.1; OpenAI uncached ×1,
//!   cached ×0.5 (gpt-4o's discount).
//! * **Direct estimate**: what the body the client sent would have cost sent as it is, under
//!   the same prices and a simple cache model (the bench's `cache.rs` without its 20-block
//!   lookback and breakpoint walk): the client's previous body is cached for 5 minutes
//!   ([`CACHE_LIFETIME_MS`]) and this body extends it (a client resends its history), so its
//!   items up to the previous body's count are read from the cache and the rest is new.
//!   Anthropic: with a `cache_control` mark in the body, the prefix is read at ×0.1 once it
//!   reaches 1,024 tokens ([`MIN_CACHED`]) and the rest written at ×1.25; without a mark all
//!   of it is ×1. OpenAI: from 1,024 tokens, the prefix counted in 128-token steps at ×0.5,
//!   the rest ×1. Tokens are the proxy's estimates of the client's messages and tool
//!   definitions, scaled by the answer's billed prompt over the proxy's estimate of what it
//!   forwarded (the calibration each answer gives), so both sides are in the upstream's tokens.
//! * **Stable prefix share** (bytes): per forwarded request, the prompt is the concatenation
//!   of the body's `tools`, `system` and `messages` values, in that order (the providers'
//!   cache order; other fields are not prompt). Its stable prefix is the length of the
//!   longest common prefix with the conversation's previous forwarded prompt, counted in
//!   whole 1 KiB blocks ([`BLOCK`]; a partial last block counts when equal); the share is the
//!   sum of stable prefixes over the sum of prompt lengths, over the requests that had a
//!   previous one in this process (block hashes are not kept across restarts: the first
//!   request after a load is not measured).
//!
//! The totals are kept in the conversation's checkpoints (with what it recorded,
//! `conv::state`): they survive restarts and unloads.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::assemble::Billed;
use crate::wire::{Provider, raw_hash};

/// The granularity of the stable-prefix measure, in bytes.
pub const BLOCK: usize = 1024;

/// How long the direct estimate's cache keeps a body: 5 minutes, both providers' default.
pub use crate::wire::CACHE_LIFETIME_MS;

/// The fewest tokens a provider caches (Anthropic's minimum for most models, OpenAI's).
pub const MIN_CACHED: u64 = 1024;

/// OpenAI's cached prefix grows in steps of this many tokens.
const OPENAI_STEP: u64 = 128;

/// A provider's input prices, in thousandths of its base input price.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prices {
    /// Cache reads.
    pub read: u64,
    /// Cache writes (OpenAI: none billed apart, ×1).
    pub write: u64,
}

impl Prices {
    /// The prices of `provider`: Anthropic write ×1.25, read ×0.1; OpenAI cached ×0.5.
    ///
    /// ```
    /// use ctxwin_proxy::conv::bill::Prices;
    /// use ctxwin_proxy::wire::Provider;
    /// assert_eq!(Prices::of(Provider::Anthropic).read, 100);
    /// ```
    pub fn of(provider: Provider) -> Self {
        match provider {
            Provider::Anthropic => Self { read: 100, write: 1_250 },
            Provider::OpenAi => Self { read: 500, write: 1_000 },
        }
    }

    /// The cost of `billed`, in thousandths of a base-input token.
    ///
    /// ```
    /// use ctxwin_proxy::assemble::Billed;
    /// use ctxwin_proxy::conv::bill::Prices;
    /// use ctxwin_proxy::wire::Provider;
    /// let billed = Billed { uncached: 10, cache_write: 100, cache_read: 1_000 };
    /// assert_eq!(Prices::of(Provider::Anthropic).cost(&billed), 10_000 + 125_000 + 100_000);
    /// ```
    pub fn cost(&self, billed: &Billed) -> u64 {
        billed
            .uncached
            .saturating_mul(1_000)
            .saturating_add(billed.cache_write.saturating_mul(self.write))
            .saturating_add(billed.cache_read.saturating_mul(self.read))
    }
}

/// What sending the client's body direct would cost ([`direct_cost`]): its tokens, and of
/// them the prefix its previous body left in the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientBody {
    /// Estimated tokens of the whole body (messages and tool definitions).
    pub tokens: u64,
    /// Of those, the prefix the previous body cached (0 when it expired or there was none).
    pub cached_prefix: u64,
    /// The body carries a `cache_control` mark (Anthropic caches nothing without one).
    pub marked: bool,
}

/// The direct estimate's cost of `body` for `provider`, in thousandths of a base-input
/// token (estimated tokens, not yet scaled).
///
/// ```
/// use ctxwin_proxy::conv::bill::{ClientBody, direct_cost};
/// use ctxwin_proxy::wire::Provider;
/// let body = ClientBody { tokens: 10_000, cached_prefix: 9_000, marked: true };
/// // 9,000 read at ×0.1, 1,000 written at ×1.25.
/// assert_eq!(direct_cost(Provider::Anthropic, &body), 900_000 + 1_250_000);
/// // OpenAI: 1,024 + 62 steps of 128 = 8,960 cached at ×0.5, 1,040 at ×1.
/// assert_eq!(direct_cost(Provider::OpenAi, &body), 4_480_000 + 1_040_000);
/// ```
pub fn direct_cost(provider: Provider, body: &ClientBody) -> u64 {
    let prices = Prices::of(provider);
    let prefix = body.cached_prefix.min(body.tokens);
    let billed = match provider {
        Provider::Anthropic if !body.marked => {
            Billed { uncached: body.tokens, ..Billed::default() }
        }
        Provider::Anthropic => {
            let read = if prefix >= MIN_CACHED { prefix } else { 0 };
            let rest = body.tokens - read;
            if body.tokens >= MIN_CACHED {
                Billed { uncached: 0, cache_write: rest, cache_read: read }
            } else {
                Billed { uncached: rest, cache_write: 0, cache_read: read }
            }
        }
        Provider::OpenAi => {
            let read = if prefix >= MIN_CACHED {
                MIN_CACHED + (prefix - MIN_CACHED) / OPENAI_STEP * OPENAI_STEP
            } else {
                0
            };
            Billed { uncached: body.tokens - read, cache_write: 0, cache_read: read }
        }
    };
    prices.cost(&billed)
}

/// Hashes of a forwarded prompt's [`BLOCK`]-byte blocks: the prompt is the concatenation of
/// `ranges` of `body`. Returns the hashes and the prompt's length.
///
/// ```
/// use ctxwin_proxy::conv::bill::{BLOCK, prompt_blocks};
/// let body = vec![b'x'; 3 * BLOCK];
/// let (whole, len) = prompt_blocks(&body, [0..3 * BLOCK].into_iter());
/// let (split, _) = prompt_blocks(&body, [0..10, 10..3 * BLOCK].into_iter());
/// assert_eq!((whole.len(), len), (3, 3 * BLOCK));
/// assert_eq!(whole, split, "blocks span the parts");
/// ```
pub fn prompt_blocks(body: &[u8], ranges: impl Iterator<Item = Range<usize>>) -> (Vec<u64>, usize) {
    let mut hashes = Vec::new();
    let mut carry: Vec<u8> = Vec::new();
    let mut len = 0;
    for range in ranges {
        let mut bytes = body.get(range).unwrap_or_default();
        len += bytes.len();
        if !carry.is_empty() {
            let (head, rest) = bytes.split_at((BLOCK - carry.len()).min(bytes.len()));
            carry.extend_from_slice(head);
            bytes = rest;
            if carry.len() == BLOCK {
                hashes.push(raw_hash(&carry));
                carry.clear();
            }
        }
        let mut blocks = bytes.chunks_exact(BLOCK);
        hashes.extend((&mut blocks).map(raw_hash));
        carry.extend_from_slice(blocks.remainder());
    }
    if !carry.is_empty() {
        hashes.push(raw_hash(&carry));
    }
    (hashes, len)
}

/// The stable prefix of a prompt of `len` bytes with blocks `now`, after a prompt with blocks
/// `before`: its leading blocks equal to those, in bytes.
///
/// ```
/// use ctxwin_proxy::conv::bill::{BLOCK, stable_prefix};
/// assert_eq!(stable_prefix(&[1, 2, 3], &[1, 2, 9, 4], 4 * BLOCK), 2 * BLOCK);
/// assert_eq!(stable_prefix(&[1, 2], &[1, 2], BLOCK + 10), BLOCK + 10);
/// ```
pub fn stable_prefix(before: &[u64], now: &[u64], len: usize) -> usize {
    let equal = before.iter().zip(now).take_while(|(a, b)| a == b).count();
    (equal * BLOCK).min(len)
}

/// One forwarded request, measured when it was composed, waiting for its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forwarded {
    /// The direct estimate of the client's body, unscaled ([`direct_cost`]).
    pub direct_milli: u64,
    /// The proxy's estimate of the forwarded prompt's tokens.
    pub sent_tokens: u32,
    /// The forwarded prompt's bytes, when it was compared with a previous one.
    pub prompt_bytes: Option<u64>,
    /// Its stable prefix, bytes.
    pub stable_bytes: u64,
}

/// A conversation's totals (kept in its checkpoints).
///
/// ```
/// use ctxwin_proxy::assemble::Billed;
/// use ctxwin_proxy::conv::bill::{Bill, Forwarded};
/// use ctxwin_proxy::wire::Provider;
/// let mut bill = Bill::default();
/// let sent = Forwarded { direct_milli: 2_000_000, sent_tokens: 1_000, prompt_bytes: Some(4_096), stable_bytes: 3_072 };
/// let billed = Billed { uncached: 100, cache_write: 0, cache_read: 1_900 };
/// bill.answered(Provider::Anthropic, &billed, &sent);
/// // The estimate is scaled to the upstream's tokens: 2,000 billed for 1,000 estimated.
/// assert_eq!(bill.direct_milli, 4_000_000);
/// assert_eq!(bill.billed_milli, 100_000 + 190_000);
/// assert_eq!(bill.stable_share(), Some(0.75));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bill {
    /// Answers with their usage counted.
    pub requests: u64,
    /// Billed prompt tokens at the base price.
    pub uncached: u64,
    /// Billed prompt tokens written to the cache.
    pub cache_write: u64,
    /// Billed prompt tokens read from the cache (OpenAI: cached tokens).
    pub cache_read: u64,
    /// The bill's cost, thousandths of a base-input token.
    pub billed_milli: u64,
    /// The direct estimate's cost, same unit.
    pub direct_milli: u64,
    /// Forwarded prompt bytes of the requests measured.
    pub prompt_bytes: u64,
    /// Their stable prefixes, bytes.
    pub stable_bytes: u64,
    /// Items of the client's previous body (the direct estimate's cached prefix).
    pub client_items: u64,
    /// When the client's previous body was sent, ms since the Unix epoch.
    pub client_at_ms: u64,
}

impl Bill {
    /// Adds `other`'s counts to this bill (for a total over conversations); the client's
    /// previous body (`client_items`, `client_at_ms`) is one conversation's and stays.
    ///
    /// ```
    /// use ctxwin_proxy::conv::bill::Bill;
    ///
    /// let one = Bill { requests: 2, cache_read: 900, billed_milli: 90_000, ..Bill::default() };
    /// let mut total = Bill::default();
    /// total.add_counts(&one);
    /// total.add_counts(&one);
    /// assert_eq!((total.requests, total.cache_read, total.billed_milli), (4, 1_800, 180_000));
    /// ```
    pub fn add_counts(&mut self, other: &Bill) {
        self.requests += other.requests;
        self.uncached += other.uncached;
        self.cache_write += other.cache_write;
        self.cache_read += other.cache_read;
        self.billed_milli += other.billed_milli;
        self.direct_milli += other.direct_milli;
        self.prompt_bytes += other.prompt_bytes;
        self.stable_bytes += other.stable_bytes;
    }

    /// Adds the answer to request `sent`, billed `billed` by `provider`'s upstream.
    pub fn answered(&mut self, provider: Provider, billed: &Billed, sent: &Forwarded) {
        let prompt = billed.uncached + billed.cache_write + billed.cache_read;
        let direct = match (prompt, sent.sent_tokens) {
            (0, _) | (_, 0) => sent.direct_milli,
            (prompt, tokens) => {
                let scaled =
                    u128::from(sent.direct_milli) * u128::from(prompt) / u128::from(tokens);
                u64::try_from(scaled).unwrap_or(u64::MAX)
            }
        };
        self.requests += 1;
        self.uncached = self.uncached.saturating_add(billed.uncached);
        self.cache_write = self.cache_write.saturating_add(billed.cache_write);
        self.cache_read = self.cache_read.saturating_add(billed.cache_read);
        self.billed_milli = self.billed_milli.saturating_add(Prices::of(provider).cost(billed));
        self.direct_milli = self.direct_milli.saturating_add(direct);
        if let Some(bytes) = sent.prompt_bytes {
            self.prompt_bytes = self.prompt_bytes.saturating_add(bytes);
            self.stable_bytes = self.stable_bytes.saturating_add(sent.stable_bytes);
        }
    }

    /// The bill over the direct estimate (`None` before an answer with usage).
    pub fn vs_direct(&self) -> Option<f64> {
        (self.direct_milli > 0).then(|| self.billed_milli as f64 / self.direct_milli as f64)
    }

    /// Stable prefix bytes over forwarded prompt bytes (`None` before a measured request).
    pub fn stable_share(&self) -> Option<f64> {
        (self.prompt_bytes > 0).then(|| self.stable_bytes as f64 / self.prompt_bytes as f64)
    }

    /// Share of billed prompt tokens read from the cache (`None` before any).
    pub fn cache_read_share(&self) -> Option<f64> {
        let total = self.uncached + self.cache_write + self.cache_read;
        (total > 0).then(|| self.cache_read as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_tell_where_a_prompt_changed() {
        let mut body = vec![b'a'; 10 * BLOCK + 100];
        let (before, _) = prompt_blocks(&body, std::iter::once(0..body.len()));
        body[5 * BLOCK + 7] = b'b';
        let (now, len) = prompt_blocks(&body, std::iter::once(0..body.len()));
        assert_eq!(stable_prefix(&before, &now, len), 5 * BLOCK);
        // Appending keeps the whole previous prompt's full blocks stable.
        body.extend_from_slice(&[b'c'; 3000]);
        let (longer, len) = prompt_blocks(&body, std::iter::once(0..body.len()));
        assert_eq!(stable_prefix(&now, &longer, len), 10 * BLOCK);
        // A change in front (a block added to `system` before the messages) makes nothing stable.
        let mut front = body.clone();
        front[0] = b'z';
        let (moved, len) = prompt_blocks(&front, std::iter::once(0..front.len()));
        assert_eq!(stable_prefix(&longer, &moved, len), 0);
    }

    #[test]
    fn direct_estimate_follows_the_cache_model() {
        let cold = ClientBody { tokens: 5_000, cached_prefix: 0, marked: true };
        assert_eq!(direct_cost(Provider::Anthropic, &cold), 5_000 * 1_250);
        let unmarked = ClientBody { marked: false, cached_prefix: 4_000, ..cold };
        assert_eq!(direct_cost(Provider::Anthropic, &unmarked), 5_000 * 1_000);
        let small = ClientBody { tokens: 900, cached_prefix: 800, marked: true };
        assert_eq!(
            direct_cost(Provider::Anthropic, &small),
            900 * 1_000,
            "under 1,024: nothing cached"
        );
        assert_eq!(direct_cost(Provider::OpenAi, &small), 900 * 1_000);
        let warm = ClientBody { tokens: 5_000, cached_prefix: 1_100, marked: false };
        assert_eq!(direct_cost(Provider::OpenAi, &warm), 1_024 * 500 + 3_976 * 1_000);
    }

    #[test]
    fn bills_add_up_and_read_back() {
        let mut bill = Bill::default();
        let sent =
            Forwarded { direct_milli: 1_000, sent_tokens: 0, prompt_bytes: None, stable_bytes: 0 };
        bill.answered(
            Provider::OpenAi,
            &Billed { uncached: 1, cache_write: 0, cache_read: 2 },
            &sent,
        );
        assert_eq!(
            (bill.billed_milli, bill.direct_milli),
            (2_000, 1_000),
            "unscaled without an estimate"
        );
        assert_eq!(bill.stable_share(), None);
        assert_eq!(bill.vs_direct(), Some(2.0));
        let bytes = postcard::to_extend(&bill, Vec::new()).unwrap();
        assert_eq!(postcard::from_bytes::<Bill>(&bytes).unwrap(), bill);
    }
}
