//! A compaction while the provider's prompt cache is cold: after a pause longer than the
//! cache lives, the next request writes its whole prefix anyway, so compacting first costs
//! no extra write, makes that write smaller, and puts the next compaction (a rewrite of a
//! warm prefix) further off (issue 27: "prefer a cache that is cold or about to expire").

use super::{Conv, ConvError};
use crate::wire::{CACHE_LIFETIME_MS, Request, cache_lifetime_ms};

impl Conv {
    /// Compacts the history before `request`'s messages are pushed when its newest message
    /// was pushed longer ago than the provider keeps its cache (at `now_ms`) and the history
    /// is more than halfway from the low-water mark to the budget: the compaction would come
    /// soon anyway, and now it rewrites nothing that was cached. The newest message's
    /// timestamp, not this instance's clock of its last request: an instance taking over a
    /// conversation replays its rows with their timestamps, and decides as the one that
    /// served it would have. Returns the units evicted.
    pub(super) fn compact_if_cold(
        &mut self,
        request: &Request,
        now_ms: u64,
    ) -> Result<usize, ConvError> {
        let Some(last) = self.session.manager().history().next_back().map(|m| m.timestamp()) else {
            return Ok(0);
        };
        // No provider keeps a prefix less than CACHE_LIFETIME_MS: most requests stop here.
        let idle = now_ms.saturating_sub(last);
        if idle <= CACHE_LIFETIME_MS {
            return Ok(0);
        }
        let Some(lifetime) = cache_lifetime_ms(self.provider, request) else { return Ok(0) };
        if idle <= lifetime {
            return Ok(0);
        }
        let manager = self.session.manager();
        let (budget, used) = (manager.budget(), manager.used());
        let low = manager.config().low_water_tokens();
        if used <= low.saturating_add(budget.saturating_sub(low) / 2) {
            return Ok(0);
        }
        let evicted = self.session.compact()?;
        tracing::debug!(session = %self.key, idle_ms = idle, evicted, "proxy: compacted while the prompt cache was cold");
        Ok(evicted)
    }
}
