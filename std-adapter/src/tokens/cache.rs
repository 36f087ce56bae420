//! A bounded, thread-safe cache of per-text token counts.
//!
//! Keys are a 64-bit SipHash of the text (with per-cache random keys, so crafted collisions
//! are impractical) plus its byte length; the text itself is never copied. Eviction is
//! generational: new entries go to a *young* map; when it holds half the capacity it becomes
//! the *old* map and the previous old map is dropped. A hit in the old map moves the entry
//! back to the young one. Every operation is O(1) amortised, memory stays under `capacity`
//! entries, and recently used counts survive: an LRU approximation without a linked list or
//! a dependency.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

/// Counts an [`ExactCounter`](super::ExactCounter) caches by default (under 4 MB).
pub const DEFAULT_CACHE_CAPACITY: usize = 65_536;

/// Hit and size counters of a count cache.
///
/// # Examples
///
/// ```
/// use ctxwin_std::tokens::CacheStats;
///
/// let stats = CacheStats { hits: 3, misses: 1, entries: 1, capacity: 8 };
/// assert_eq!(stats.lookups(), 4);
/// assert_eq!(stats.hit_rate(), Some(0.75));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to run the tokenizer.
    pub misses: u64,
    /// Counts held now.
    pub entries: usize,
    /// Most counts ever held (0: caching is off).
    pub capacity: usize,
}

impl CacheStats {
    /// Hits plus misses.
    ///
    /// ```
    /// use ctxwin_std::tokens::CacheStats;
    /// assert_eq!(CacheStats::default().lookups(), 0);
    /// ```
    pub fn lookups(&self) -> u64 {
        self.hits.saturating_add(self.misses)
    }

    /// Share of lookups that hit, `None` before the first lookup.
    ///
    /// ```
    /// use ctxwin_std::tokens::CacheStats;
    /// assert_eq!(CacheStats::default().hit_rate(), None);
    /// ```
    pub fn hit_rate(&self) -> Option<f64> {
        let lookups = self.lookups();
        (lookups > 0).then(|| self.hits as f64 / lookups as f64)
    }
}

/// A cache key: the text's hash and byte length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    hash: u64,
    len: usize,
}

#[derive(Debug, Default)]
struct Generations {
    young: HashMap<Key, u32>,
    old: HashMap<Key, u32>,
    hits: u64,
    misses: u64,
}

/// The cache: a hasher with random keys and two generations behind a mutex.
#[derive(Debug)]
pub(crate) struct CountCache {
    hasher: RandomState,
    capacity: usize,
    generations: Mutex<Generations>,
}

impl CountCache {
    /// A cache holding at most `capacity` counts; 0 turns caching off (lookups still count
    /// as misses).
    pub(crate) fn new(capacity: usize) -> CountCache {
        CountCache {
            hasher: RandomState::new(),
            capacity,
            generations: Mutex::new(Generations::default()),
        }
    }

    /// The key of `text`, computed without holding the lock.
    pub(crate) fn key(&self, text: &str) -> Key {
        Key { hash: self.hasher.hash_one(text), len: text.len() }
    }

    fn lock(&self) -> MutexGuard<'_, Generations> {
        // Nothing panics while the lock is held, and the maps stay consistent even if
        // something did, so a poisoned lock is safe to keep using.
        self.generations.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn young_limit(&self) -> usize {
        (self.capacity / 2).max(1)
    }

    /// The cached count of `key`, counting the hit or miss.
    pub(crate) fn get(&self, key: Key) -> Option<u32> {
        let mut generations = self.lock();
        if let Some(&count) = generations.young.get(&key) {
            generations.hits += 1;
            return Some(count);
        }
        match generations.old.remove(&key) {
            Some(count) => {
                generations.hits += 1;
                self.insert_young(&mut generations, key, count);
                Some(count)
            }
            None => {
                generations.misses += 1;
                None
            }
        }
    }

    /// Stores `count` for `key`.
    pub(crate) fn insert(&self, key: Key, count: u32) {
        if self.capacity == 0 {
            return;
        }
        let mut generations = self.lock();
        self.insert_young(&mut generations, key, count);
    }

    fn insert_young(&self, generations: &mut Generations, key: Key, count: u32) {
        if self.capacity == 0 {
            return;
        }
        if generations.young.len() >= self.young_limit() && !generations.young.contains_key(&key) {
            generations.old = std::mem::take(&mut generations.young);
            generations.old.remove(&key);
        }
        generations.young.insert(key, count);
    }

    /// Drops every cached count; the hit and miss counters stay.
    pub(crate) fn clear(&self) {
        let mut generations = self.lock();
        generations.young = HashMap::new();
        generations.old = HashMap::new();
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let generations = self.lock();
        CacheStats {
            hits: generations.hits,
            misses: generations.misses,
            entries: generations.young.len() + generations.old.len(),
            capacity: self.capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_and_misses_are_counted() {
        let cache = CountCache::new(8);
        let key = cache.key("hello world");
        assert_eq!(cache.get(key), None);
        cache.insert(key, 2);
        assert_eq!(cache.get(key), Some(2));
        assert_eq!(cache.get(key), Some(2));
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.entries, stats.capacity), (2, 1, 1, 8));
    }

    #[test]
    fn keys_tell_texts_apart() {
        let cache = CountCache::new(8);
        assert_eq!(cache.key("abc"), cache.key("abc"));
        assert_ne!(cache.key("abc"), cache.key("abd"));
        assert_ne!(cache.key(""), cache.key("a"));
    }

    #[test]
    fn size_stays_within_capacity_and_recent_entries_survive() {
        let cache = CountCache::new(10);
        let texts: Vec<String> = (0..100).map(|i| format!("text {i}")).collect();
        for (i, text) in texts.iter().enumerate() {
            cache.insert(cache.key(text), i as u32);
            assert!(cache.stats().entries <= 10);
        }
        assert_eq!(cache.stats().entries, 10);
        // The newest five are in the young generation, the five before them in the old one.
        for (i, text) in texts.iter().enumerate().skip(95) {
            assert_eq!(cache.get(cache.key(text)), Some(i as u32), "{text}");
        }
        assert_eq!(cache.get(cache.key(&texts[90])), Some(90));
        assert_eq!(cache.get(cache.key(&texts[89])), None);
        assert_eq!(cache.get(cache.key(&texts[0])), None);
    }

    #[test]
    fn an_old_hit_is_promoted() {
        let cache = CountCache::new(4);
        for (i, text) in ["a", "b", "c", "d"].iter().enumerate() {
            cache.insert(cache.key(text), i as u32);
        }
        // young = {c, d}, old = {a, b}; reading "a" moves it to young, pushing {c, d} to old.
        assert_eq!(cache.get(cache.key("a")), Some(0));
        cache.insert(cache.key("e"), 4);
        cache.insert(cache.key("f"), 5);
        assert_eq!(cache.get(cache.key("a")), Some(0));
        assert_eq!(cache.get(cache.key("b")), None);
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let cache = CountCache::new(0);
        let key = cache.key("x");
        cache.insert(key, 1);
        assert_eq!(cache.get(key), None);
        assert_eq!(cache.stats().entries, 0);
        assert_eq!(cache.stats().misses, 1);
    }

    #[test]
    fn clear_keeps_counters() {
        let cache = CountCache::new(4);
        let key = cache.key("x");
        cache.insert(key, 1);
        assert_eq!(cache.get(key), Some(1));
        cache.clear();
        assert_eq!(cache.get(key), None);
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.entries), (1, 1, 0));
    }
}
