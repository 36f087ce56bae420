//! The providers' documented prompt-cache billing, on a simulated clock.
//!
//! **Anthropic** (prompt caching, 5-minute cache): the prompt is tools → system → messages;
//! each `cache_control` breakpoint (at most 4) caches the prefix ending at its block. At each
//! breakpoint the upstream looks for a cached prefix ending at that block or at one of the 19
//! blocks before it (20-block lookback); the longest found is read. Each breakpoint after it
//! whose prefix reaches 1,024 tokens is written. A hit refreshes the 5-minute lifetime of
//! the entry it read and of every cached prefix of it. Billed: cache writes 1.25×, reads 0.1×, the rest 1× base input.
//!
//! **OpenAI** (automatic prompt caching): every prompt of at least 1,024 tokens is cached; a
//! later prompt sharing a prefix reads it, counted from 1,024 tokens in 128-token increments.
//! Cached input is billed at [`OPENAI_CACHED_INPUT`]; entries live 5 minutes after last use
//! (OpenAI says 5–10 minutes of inactivity). The prefix is matched at message granularity.

use std::collections::HashMap;

use crate::tokens::{Layout, prefix_hashes};

/// Cache write price, × base input (Anthropic, 5-minute cache).
pub const ANTHROPIC_CACHE_WRITE: f64 = 1.25;
/// Cache read price, × base input (Anthropic).
pub const ANTHROPIC_CACHE_READ: f64 = 0.1;
/// Cached input price, × base input, of gpt-4o ($2.50 input, $1.25 cached input per million
/// tokens; the model's 128k window is the window the OpenAI runs compare with).
pub const OPENAI_CACHED_INPUT: f64 = 0.5;
/// How long a cache entry lives after its last use, in ms (both providers).
pub const CACHE_TTL_MS: u64 = 5 * 60 * 1_000;
/// How many blocks before a breakpoint Anthropic checks for a cached prefix (the breakpoint's
/// own block included).
pub const LOOKBACK_BLOCKS: usize = 20;
/// The shortest prefix either provider caches, in tokens.
pub const MIN_CACHEABLE_TOKENS: u64 = 1_024;
/// OpenAI counts cached tokens in steps of this many (after the first 1,024).
pub const OPENAI_CACHE_STEP: u64 = 128;
/// The most `cache_control` breakpoints Anthropic accepts in one request.
pub const MAX_BREAKPOINTS: usize = 4;

/// What one request was billed, in tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Input billed at the base price.
    pub input: u64,
    /// Input written to the cache (Anthropic).
    pub cache_write: u64,
    /// Input read from the cache.
    pub cache_read: u64,
    /// The cache read reaches past the tools and system into the messages.
    pub reads_messages: bool,
}

impl Usage {
    /// The prompt's tokens.
    pub fn prompt(&self) -> u64 {
        self.input + self.cache_write + self.cache_read
    }

    /// The bill in base-input tokens, under Anthropic's prices (`anthropic`) or OpenAI's at
    /// [`OPENAI_CACHED_INPUT`].
    pub fn bill(&self, anthropic: bool) -> f64 {
        if anthropic {
            self.input as f64
                + self.cache_write as f64 * ANTHROPIC_CACHE_WRITE
                + self.cache_read as f64 * ANTHROPIC_CACHE_READ
        } else {
            self.bill_openai(OPENAI_CACHED_INPUT)
        }
    }

    /// The bill in base-input tokens under OpenAI's prices with cached input at `cached` ×
    /// base (0.5 gpt-4o, 0.25 gpt-4.1, 0.1 gpt-5).
    pub fn bill_openai(&self, cached: f64) -> f64 {
        self.input as f64 + self.cache_read as f64 * cached
    }
}

/// Anthropic's prompt cache: prefix hash → expiry (ms).
#[derive(Debug, Default)]
pub struct AnthropicCache {
    entries: HashMap<u64, u64>,
}

impl AnthropicCache {
    /// Bills a request of `layout` sent at `now_ms`, and updates the cache.
    pub fn bill(&mut self, layout: &Layout, now_ms: u64) -> Usage {
        let prefixes = prefix_hashes(&layout.units);
        let mut cumulative = Vec::with_capacity(layout.units.len());
        let mut total = 0u64;
        for unit in &layout.units {
            total += u64::from(unit.tokens);
            cumulative.push(total);
        }
        let breakpoints: Vec<usize> =
            layout.units.iter().enumerate().filter(|(_, u)| u.breakpoint).map(|(i, _)| i).collect();
        let live = |entries: &HashMap<u64, u64>, i: usize| {
            entries.get(&prefixes[i]).is_some_and(|&expires| expires > now_ms)
        };
        let mut read_end: Option<usize> = None;
        for &b in &breakpoints {
            let lowest = (b + 1).saturating_sub(LOOKBACK_BLOCKS);
            if let Some(hit) = (lowest..=b).rev().find(|&i| live(&self.entries, i)) {
                read_end = Some(read_end.map_or(hit, |r| r.max(hit)));
            }
        }
        let read = read_end.map_or(0, |r| cumulative[r]);
        // A hit keeps warm every cached prefix of what it read (the shorter prefixes are the
        // same content): a system prompt cached at its own breakpoint stays cached while
        // the conversation's longer prefixes are read.
        if let Some(r) = read_end {
            for prefix in &prefixes[..=r] {
                if let Some(expires) = self.entries.get_mut(prefix) {
                    *expires = now_ms + CACHE_TTL_MS;
                }
            }
        }
        let mut written_to = None;
        for &b in &breakpoints {
            if read_end.is_some_and(|r| b <= r) || cumulative[b] < MIN_CACHEABLE_TOKENS {
                continue;
            }
            self.entries.insert(prefixes[b], now_ms + CACHE_TTL_MS);
            written_to = Some(b);
        }
        let write = written_to.map_or(0, |w| cumulative[w] - read);
        Usage {
            input: total - read - write,
            cache_write: write,
            cache_read: read,
            reads_messages: read_end.is_some_and(|r| r >= layout.messages_start),
        }
    }
}

/// OpenAI's automatic prompt cache: prefix hash → (its tokens, expiry ms).
#[derive(Debug, Default)]
pub struct OpenAiCache {
    entries: HashMap<u64, (u64, u64)>,
}

impl OpenAiCache {
    /// Bills a request of `layout` sent at `now_ms`, and caches its prefixes.
    pub fn bill(&mut self, layout: &Layout, now_ms: u64) -> Usage {
        let prefixes = prefix_hashes(&layout.units);
        let total = layout.tokens();
        let mut matched = 0u64;
        let mut matched_units = 0;
        for (i, prefix) in prefixes.iter().enumerate() {
            match self.entries.get(prefix) {
                Some(&(tokens, expires)) if expires > now_ms => {
                    matched = tokens;
                    matched_units = i + 1;
                }
                _ => break,
            }
        }
        let cached = if total >= MIN_CACHEABLE_TOKENS && matched >= MIN_CACHEABLE_TOKENS {
            MIN_CACHEABLE_TOKENS
                + (matched - MIN_CACHEABLE_TOKENS) / OPENAI_CACHE_STEP * OPENAI_CACHE_STEP
        } else {
            0
        };
        if total >= MIN_CACHEABLE_TOKENS {
            let mut tokens = 0u64;
            for (unit, prefix) in layout.units.iter().zip(&prefixes) {
                tokens += u64::from(unit.tokens);
                self.entries.insert(*prefix, (tokens, now_ms + CACHE_TTL_MS));
            }
        }
        Usage {
            input: total - cached,
            cache_write: 0,
            cache_read: cached,
            reads_messages: cached > 0
                && matched_units > layout.messages_start
                && cached > layout.head_tokens(),
        }
    }
}

/// Why a request's cache read would not reach into the messages (a diagnosis for the CSV; it
/// bills nothing), from the cache as it is before the request is billed: `previous` is the
/// prefix hashes of the conversation's previous request. The caller keeps it only for
/// requests whose read did not reach the messages.
///
/// `first` (no previous request), `system` (the prompt changed before the messages: tools or
/// system, e.g. a retrieved block), `head` (the first message changed: a compaction),
/// `expired` (the unchanged messages' prefix was cached but its entry expired), `lookback`
/// (it is cached and live, but more than 20 blocks before every breakpoint: Anthropic),
/// `unwritten` (the messages kept their prefix but no breakpoint cached any of it),
/// `minimum` (OpenAI: under 1,024 tokens or one step).
pub fn miss_cause(
    anthropic: Option<&AnthropicCache>,
    openai: Option<&OpenAiCache>,
    previous: Option<&[u64]>,
    layout: &Layout,
    now_ms: u64,
) -> &'static str {
    let Some(previous) = previous else { return "first" };
    let prefixes = prefix_hashes(&layout.units);
    let same = prefixes.iter().zip(previous).take_while(|(a, b)| a == b).count();
    if same < layout.messages_start {
        return "system";
    }
    if same == layout.messages_start {
        return "head";
    }
    let shared = layout.messages_start..same;
    let expiry = |i: usize| match (anthropic, openai) {
        (Some(cache), _) => cache.entries.get(&prefixes[i]).copied(),
        (_, Some(cache)) => cache.entries.get(&prefixes[i]).map(|&(_, expires)| expires),
        _ => None,
    };
    let cached: Vec<(usize, u64)> =
        shared.clone().filter_map(|i| expiry(i).map(|expires| (i, expires))).collect();
    if cached.is_empty() {
        return "unwritten";
    }
    if cached.iter().all(|&(_, expires)| expires <= now_ms) {
        return "expired";
    }
    if anthropic.is_some() {
        return "lookback";
    }
    "minimum"
}
