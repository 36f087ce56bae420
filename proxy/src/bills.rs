//! The conversations' bills as the running proxy reports them ([`crate::conv::bill`]): each
//! conversation's after its latest answer, for `GET /metrics/conversations` (JSON), and the
//! [`TOP_CONVERSATIONS`] largest on `/metrics`.
//!
//! Per-conversation numbers are not Prometheus series for every conversation: a proxy serves
//! thousands, and a label per conversation would make as many series, each kept by the
//! server for its retention. `/metrics` carries the totals ([`Metrics`]) and the largest
//! bills (a bounded set of series whose members change); `/metrics/conversations` lists the
//! bill of each conversation answered since the proxy started (at most
//! [`TRACKED_CONVERSATIONS`], the least recently answered dropped first), cumulative since the
//! conversation began: the bills are kept in each conversation's checkpoints.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde_json::{Value, json};

use crate::conv::bill::Bill;
use crate::metrics::Metrics;

/// Conversations with the largest bills on `/metrics`.
pub const TOP_CONVERSATIONS: usize = 10;

/// Conversations whose bills `/metrics/conversations` lists at most.
pub const TRACKED_CONVERSATIONS: usize = 10_000;

/// Each conversation's bill after its latest answer.
#[derive(Debug, Default)]
pub struct Bills {
    /// Key → (when last updated, a count; the bill).
    table: Mutex<HashMap<String, (u64, Bill)>>,
    clock: AtomicU64,
}

impl Bills {
    /// Takes conversation `key`'s bill after an answer (`before` it): `metrics`' totals grow
    /// by the difference, and the conversation's entry is replaced.
    pub fn record(&self, metrics: &Metrics, key: &str, before: &Bill, after: &Bill) {
        let grow = |total: &AtomicU64, a: u64, b: u64| {
            total.fetch_add(b.saturating_sub(a), Relaxed);
        };
        grow(&metrics.billed_milli, before.billed_milli, after.billed_milli);
        grow(&metrics.direct_milli, before.direct_milli, after.direct_milli);
        grow(&metrics.prompt_bytes, before.prompt_bytes, after.prompt_bytes);
        grow(&metrics.stable_bytes, before.stable_bytes, after.stable_bytes);
        let now = self.clock.fetch_add(1, Relaxed);
        let mut table = self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if table.len() >= TRACKED_CONVERSATIONS && !table.contains_key(key) {
            let oldest = table.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                table.remove(&oldest);
            }
        }
        table.insert(key.to_string(), (now, after.clone()));
    }

    /// The bills, largest first.
    fn largest(&self) -> Vec<(String, Bill)> {
        let table = self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut list: Vec<(String, Bill)> =
            table.iter().map(|(k, (_, b))| (k.clone(), b.clone())).collect();
        list.sort_by(|a, b| b.1.billed_milli.cmp(&a.1.billed_milli).then(a.0.cmp(&b.0)));
        list
    }

    /// The conversations' bills, largest first, and the totals of `metrics`, as JSON
    /// (`GET /metrics/conversations`).
    pub fn json(&self, metrics: &Metrics) -> Value {
        let list = self.largest();
        let conversations: Vec<Value> =
            list.iter().map(|(key, bill)| bill_json(Some(key), bill)).collect();
        let total = Bill {
            billed_milli: metrics.billed_milli.load(Relaxed),
            direct_milli: metrics.direct_milli.load(Relaxed),
            prompt_bytes: metrics.prompt_bytes.load(Relaxed),
            stable_bytes: metrics.stable_bytes.load(Relaxed),
            uncached: metrics.billed_uncached.load(Relaxed),
            cache_write: metrics.billed_cache_write.load(Relaxed),
            cache_read: metrics.billed_cache_read.load(Relaxed),
            requests: list.iter().map(|(_, b)| b.requests).sum(),
            ..Bill::default()
        };
        json!({
            "total": bill_json(None, &total),
            "conversations": conversations,
            "tracked_at_most": TRACKED_CONVERSATIONS,
        })
    }

    /// The [`TOP_CONVERSATIONS`] largest bills in the Prometheus text exposition.
    pub fn render_top(&self, out: &mut String) {
        let name = "ctxwin_proxy_conversation_cost_tokens";
        let _ = writeln!(
            out,
            "# HELP {name} The {TOP_CONVERSATIONS} conversations with the largest bills: billed and direct-estimate cost in base-input tokens since each began (all of them: /metrics/conversations).\n# TYPE {name} gauge"
        );
        for (key, bill) in self.largest().into_iter().take(TOP_CONVERSATIONS) {
            for (kind, milli) in
                [("billed", bill.billed_milli), ("direct_estimate", bill.direct_milli)]
            {
                let _ = writeln!(
                    out,
                    "{name}{{conversation=\"{key}\",kind=\"{kind}\"}} {}",
                    milli as f64 / 1000.0
                );
            }
        }
    }
}

/// A bill as JSON: billed tokens, costs (in base-input tokens), ratios (`null` before there
/// is anything to divide by); `key` names its conversation.
///
/// ```
/// use ctxwin_proxy::conv::bill::Bill;
/// let bill = Bill { requests: 1, billed_milli: 500, direct_milli: 1_000, ..Bill::default() };
/// let json = ctxwin_proxy::bills::bill_json(Some("t.c"), &bill);
/// assert_eq!((json["bill_vs_direct"].as_f64(), json["conversation"].as_str()), (Some(0.5), Some("t.c")));
/// assert!(json["stable_prefix_share"].is_null());
/// ```
pub fn bill_json(key: Option<&str>, bill: &Bill) -> Value {
    json!({
        "conversation": key,
        "requests": bill.requests,
        "billed_tokens": {"uncached": bill.uncached, "cache_write": bill.cache_write, "cache_read": bill.cache_read},
        "cache_read_share": bill.cache_read_share(),
        "billed_cost": bill.billed_milli as f64 / 1000.0,
        "direct_estimate_cost": bill.direct_milli as f64 / 1000.0,
        "bill_vs_direct": bill.vs_direct(),
        "prompt_bytes_measured": bill.prompt_bytes,
        "stable_prefix_bytes": bill.stable_bytes,
        "stable_prefix_share": bill.stable_share(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_bills_add_to_the_totals_and_the_top_is_bounded() {
        let (m, bills) = (Metrics::default(), Bills::default());
        for n in 0..(TOP_CONVERSATIONS as u64 + 5) {
            let after = Bill {
                requests: 1,
                billed_milli: 1_000 * (n + 1),
                direct_milli: 2_000 * (n + 1),
                prompt_bytes: 100,
                stable_bytes: 90,
                ..Bill::default()
            };
            bills.record(&m, &format!("t.c{n:02}"), &Bill::default(), &after);
        }
        let mut text = m.render();
        bills.render_top(&mut text);
        let series = text
            .lines()
            .filter(|l| l.starts_with("ctxwin_proxy_conversation_cost_tokens{"))
            .count();
        assert_eq!(series, 2 * TOP_CONVERSATIONS, "{text}");
        assert!(
            text.contains(
                "ctxwin_proxy_conversation_cost_tokens{conversation=\"t.c14\",kind=\"billed\"} 15\n"
            ),
            "{text}"
        );
        assert!(!text.contains("conversation=\"t.c00\""), "{text}");
        assert!(text.contains("ctxwin_proxy_bill_vs_direct 0.5\n"), "{text}");
        assert!(text.contains("ctxwin_proxy_cache_stable_share 0.9\n"), "{text}");
        // A conversation's next answer adds only what grew.
        let before =
            Bill { requests: 1, billed_milli: 1_000, direct_milli: 2_000, ..Bill::default() };
        let after =
            Bill { requests: 2, billed_milli: 1_500, direct_milli: 4_000, ..Bill::default() };
        bills.record(&m, "t.c00", &before, &after);
        let json = bills.json(&m);
        assert_eq!(json["conversations"].as_array().unwrap().len(), TOP_CONVERSATIONS + 5);
        assert_eq!(json["conversations"][0]["conversation"], "t.c14");
        let total = &json["total"];
        assert_eq!(total["billed_cost"].as_f64(), Some((1..=15).sum::<u64>() as f64 + 0.5));
        let c00 = json["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["conversation"] == "t.c00")
            .unwrap();
        assert_eq!(c00["bill_vs_direct"].as_f64(), Some(0.375));
    }
}
