//! Counters for `GET /metrics` (Prometheus text format), and the conversations' bills for
//! `GET /metrics/conversations` (JSON).
//!
//! Per-conversation numbers are not Prometheus series for every conversation: a proxy serves
//! thousands, and a label per conversation would make as many series, each kept by the
//! server for its retention. `/metrics` carries the totals and the [`TOP_CONVERSATIONS`]
//! conversations with the largest bills (a bounded set of series whose members change);
//! `/metrics/conversations` lists the bill of each conversation answered since the proxy
//! started (at most [`TRACKED_CONVERSATIONS`], the least recently answered dropped first),
//! cumulative since the conversation began: the bills are kept in each conversation's
//! checkpoints ([`crate::conv::bill`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde_json::{Value, json};

use crate::conv::bill::Bill;

/// Conversations with the largest bills on `/metrics`.
pub const TOP_CONVERSATIONS: usize = 10;

/// Conversations whose bills `/metrics/conversations` lists at most.
pub const TRACKED_CONVERSATIONS: usize = 10_000;

/// Upper bounds of the added-latency histogram, in seconds.
const BUCKETS: [f64; 12] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// How long a request waited for the upstream: a handler puts it in its response's
/// extensions, and the added-latency histogram leaves it out
/// ([`Metrics::added_latency`]; the layer that times requests reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamWait(pub Duration);

/// The proxy's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Estimated tokens of the histories clients sent.
    pub tokens_in: AtomicU64,
    /// Estimated tokens of the payloads forwarded.
    pub tokens_sent: AtomicU64,
    /// Units evicted (compactions).
    pub compactions: AtomicU64,
    /// Managed requests forwarded.
    pub managed: AtomicU64,
    /// Managed requests whose message prefix was unchanged since the conversation's last.
    pub cache_stable: AtomicU64,
    /// Conversations loaded from disk or created.
    pub loads: AtomicU64,
    /// Conversations checkpointed and unloaded under the resident cap.
    pub unloads: AtomicU64,
    /// Conversations that branched off a diverging history.
    pub branches: AtomicU64,
    /// Conversations in memory now.
    pub resident: AtomicU64,
    /// Client connections open now.
    pub connections: AtomicU64,
    /// Client connections refused at the connection limit.
    pub connections_refused: AtomicU64,
    /// Prompt tokens the upstream billed at the base input price (its `usage`).
    pub billed_uncached: AtomicU64,
    /// Prompt tokens the upstream wrote to its prompt cache.
    pub billed_cache_write: AtomicU64,
    /// Prompt tokens the upstream read from its prompt cache.
    pub billed_cache_read: AtomicU64,
    /// Tasks finished with a summary.
    pub tasks_finished: AtomicU64,
    /// Of those, summaries under 2x smaller than their task (too detailed).
    pub tasks_under_2x: AtomicU64,
    /// Sum of the finished tasks' compression ratios, in thousandths.
    tasks_ratio_milli: AtomicU64,
    /// The bills' cost, thousandths of a base-input token ([`Bill::billed_milli`]).
    billed_milli: AtomicU64,
    /// The direct estimates' cost, same unit ([`Bill::direct_milli`]).
    direct_milli: AtomicU64,
    /// Forwarded prompt bytes measured against the conversation's previous prompt.
    prompt_bytes: AtomicU64,
    /// Of those, the stable prefixes' bytes.
    stable_bytes: AtomicU64,
    /// Each conversation's bill, with when it was last updated (a count).
    bills: Mutex<HashMap<String, (u64, Bill)>>,
    bills_clock: AtomicU64,
    latency: [AtomicU64; BUCKETS.len() + 1],
    latency_sum_ns: AtomicU64,
    samples: Mutex<Option<Vec<u32>>>,
}

impl Metrics {
    /// Counts a task finished with a summary `ratio` times smaller than its messages.
    pub fn task_finished(&self, ratio: f64) {
        self.tasks_finished.fetch_add(1, Relaxed);
        if ratio < 2.0 {
            self.tasks_under_2x.fetch_add(1, Relaxed);
        }
        self.tasks_ratio_milli.fetch_add((ratio * 1000.0).round() as u64, Relaxed);
    }

    /// Takes conversation `key`'s bill after an answer (`before` it): the totals grow by the
    /// difference, and the conversation's entry is replaced.
    pub fn conversation_bill(&self, key: &str, before: &Bill, after: &Bill) {
        let grow = |total: &AtomicU64, a: u64, b: u64| {
            total.fetch_add(b.saturating_sub(a), Relaxed);
        };
        grow(&self.billed_milli, before.billed_milli, after.billed_milli);
        grow(&self.direct_milli, before.direct_milli, after.direct_milli);
        grow(&self.prompt_bytes, before.prompt_bytes, after.prompt_bytes);
        grow(&self.stable_bytes, before.stable_bytes, after.stable_bytes);
        let now = self.bills_clock.fetch_add(1, Relaxed);
        let mut bills = self.bills.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if bills.len() >= TRACKED_CONVERSATIONS && !bills.contains_key(key) {
            let oldest = bills.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                bills.remove(&oldest);
            }
        }
        bills.insert(key.to_string(), (now, after.clone()));
    }

    /// The conversations' bills, largest first, and the totals, as JSON
    /// (`GET /metrics/conversations`).
    pub fn conversations_json(&self) -> Value {
        let bills = self.bills.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut list: Vec<(&String, &Bill)> = bills.iter().map(|(k, (_, b))| (k, b)).collect();
        list.sort_by(|a, b| b.1.billed_milli.cmp(&a.1.billed_milli).then(a.0.cmp(b.0)));
        let conversations: Vec<Value> =
            list.iter().map(|(key, bill)| bill_json(Some(key), bill)).collect();
        let total = Bill {
            billed_milli: self.billed_milli.load(Relaxed),
            direct_milli: self.direct_milli.load(Relaxed),
            prompt_bytes: self.prompt_bytes.load(Relaxed),
            stable_bytes: self.stable_bytes.load(Relaxed),
            uncached: self.billed_uncached.load(Relaxed),
            cache_write: self.billed_cache_write.load(Relaxed),
            cache_read: self.billed_cache_read.load(Relaxed),
            requests: bills.values().map(|(_, b)| b.requests).sum(),
            ..Bill::default()
        };
        json!({
            "total": bill_json(None, &total),
            "conversations": conversations,
            "tracked_at_most": TRACKED_CONVERSATIONS,
        })
    }

    /// Counts a request answered with `status` on `endpoint`.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *map.entry((endpoint, status)).or_default() += 1;
    }

    /// Requests answered with `status` on `endpoint` so far.
    pub fn requests(&self, endpoint: &'static str, status: u16) -> u64 {
        let map = self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&(endpoint, status)).copied().unwrap_or(0)
    }

    /// Records the time the proxy added to one request (upstream time excluded).
    pub fn added_latency(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let bucket = BUCKETS.iter().position(|b| secs <= *b).unwrap_or(BUCKETS.len());
        self.latency[bucket].fetch_add(1, Relaxed);
        self.latency_sum_ns
            .fetch_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX), Relaxed);
        let mut samples = self.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(samples) = samples.as_mut() {
            samples.push(u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX));
        }
    }

    /// Starts keeping every added-latency sample in microseconds (for benches).
    pub fn keep_samples(&self) {
        *self.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Vec::new());
    }

    /// The samples kept since [`keep_samples`](Self::keep_samples).
    pub fn take_samples(&self) -> Vec<u32> {
        let mut samples = self.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        samples.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP ctxwin_proxy_requests_total Requests answered, by endpoint and status.\n",
        );
        out.push_str("# TYPE ctxwin_proxy_requests_total counter\n");
        for ((endpoint, status), count) in
            self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter()
        {
            let _ = writeln!(
                out,
                "ctxwin_proxy_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {count}"
            );
        }
        let counters: [(&str, &str, &AtomicU64); 9] = [
            ("tokens_in_total", "Estimated tokens of the histories clients sent.", &self.tokens_in),
            (
                "tokens_sent_total",
                "Estimated tokens of the payloads forwarded upstream.",
                &self.tokens_sent,
            ),
            (
                "compactions_total",
                "Units evicted from context windows (to the archive).",
                &self.compactions,
            ),
            ("managed_requests_total", "Managed requests forwarded upstream.", &self.managed),
            (
                "cache_stable_requests_total",
                "Managed requests whose emitted messages (by session id, not bytes) began with the conversation's previous request's: the prompt's bytes are ctxwin_proxy_cache_stable_share.",
                &self.cache_stable,
            ),
            (
                "session_loads_total",
                "Conversations created or loaded from their checkpoint.",
                &self.loads,
            ),
            (
                "session_unloads_total",
                "Idle conversations checkpointed and unloaded under the resident cap.",
                &self.unloads,
            ),
            ("branches_total", "Conversations branched off a diverging history.", &self.branches),
            (
                "connections_refused_total",
                "Client connections refused at the connection limit (max_connections).",
                &self.connections_refused,
            ),
        ];
        for (name, help, value) in counters {
            let (name, value) = (format!("ctxwin_proxy_{name}"), value.load(Relaxed));
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        let (prompt, stable) = (self.prompt_bytes.load(Relaxed), self.stable_bytes.load(Relaxed));
        let share = if prompt == 0 { 0.0 } else { stable as f64 / prompt as f64 };
        let _ = writeln!(
            out,
            "# HELP ctxwin_proxy_cache_stable_share Forwarded prompt bytes (tools, system, messages) in the common prefix with the conversation's previous forwarded prompt, over all forwarded prompt bytes measured.\n# TYPE ctxwin_proxy_cache_stable_share gauge\nctxwin_proxy_cache_stable_share {share}"
        );
        let _ = writeln!(
            out,
            "# HELP ctxwin_proxy_resident_sessions Conversations in memory.\n# TYPE ctxwin_proxy_resident_sessions gauge\nctxwin_proxy_resident_sessions {}",
            self.resident.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ctxwin_proxy_connections Client connections open.\n# TYPE ctxwin_proxy_connections gauge\nctxwin_proxy_connections {}",
            self.connections.load(Relaxed)
        );
        self.render_tasks(&mut out);
        self.render_billed(&mut out);
        self.render_bills(&mut out);
        self.render_latency(&mut out);
        out
    }

    /// Finished tasks and how much their summaries compressed them.
    fn render_tasks(&self, out: &mut String) {
        let (finished, under) =
            (self.tasks_finished.load(Relaxed), self.tasks_under_2x.load(Relaxed));
        let sum = self.tasks_ratio_milli.load(Relaxed) as f64 / 1000.0;
        let _ = writeln!(
            out,
            "# HELP ctxwin_proxy_task_compression_ratio Finished tasks' messages over their summary, in tokens.
# TYPE ctxwin_proxy_task_compression_ratio summary
ctxwin_proxy_task_compression_ratio_sum {sum}
ctxwin_proxy_task_compression_ratio_count {finished}"
        );
        let _ = writeln!(
            out,
            "# HELP ctxwin_proxy_task_summaries_under_2x_total Task summaries less than 2x smaller than their task (too detailed).
# TYPE ctxwin_proxy_task_summaries_under_2x_total counter
ctxwin_proxy_task_summaries_under_2x_total {under}"
        );
    }

    /// The upstream's billed prompt tokens by price, in the Prometheus text exposition.
    fn render_billed(&self, out: &mut String) {
        let name = "ctxwin_proxy_upstream_prompt_tokens_total";
        let _ = writeln!(
            out,
            "# HELP {name} Prompt tokens the upstream billed (its usage), by price: uncached, written to its prompt cache, read from it.\n# TYPE {name} counter"
        );
        for (kind, value) in [
            ("uncached", &self.billed_uncached),
            ("cache_write", &self.billed_cache_write),
            ("cache_read", &self.billed_cache_read),
        ] {
            let _ = writeln!(out, "{name}{{kind=\"{kind}\"}} {}", value.load(Relaxed));
        }
    }

    /// The bill against the direct estimate, the stable prefix's bytes, and the conversations
    /// with the largest bills.
    fn render_bills(&self, out: &mut String) {
        let (billed, direct) = (self.billed_milli.load(Relaxed), self.direct_milli.load(Relaxed));
        let name = "ctxwin_proxy_upstream_cost_tokens_total";
        let _ = writeln!(
            out,
            "# HELP {name} Prompt cost in base-input tokens (cache writes and reads at their prices): the upstream's bill, and the estimate of sending the clients' bodies direct.\n# TYPE {name} counter\n{name}{{kind=\"billed\"}} {}\n{name}{{kind=\"direct_estimate\"}} {}",
            billed as f64 / 1000.0,
            direct as f64 / 1000.0
        );
        let ratio = if direct == 0 { 0.0 } else { billed as f64 / direct as f64 };
        let _ = writeln!(
            out,
            "# HELP ctxwin_proxy_bill_vs_direct The upstream's bill over the estimate of sending the clients' bodies direct.\n# TYPE ctxwin_proxy_bill_vs_direct gauge\nctxwin_proxy_bill_vs_direct {ratio}"
        );
        let name = "ctxwin_proxy_forwarded_prompt_bytes_total";
        let _ = writeln!(
            out,
            "# HELP {name} Forwarded prompt bytes compared with the conversation's previous forwarded prompt, and of them the common prefix.\n# TYPE {name} counter\n{name}{{part=\"measured\"}} {}\n{name}{{part=\"stable_prefix\"}} {}",
            self.prompt_bytes.load(Relaxed),
            self.stable_bytes.load(Relaxed)
        );
        let bills = self.bills.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut top: Vec<(&String, &Bill)> = bills.iter().map(|(k, (_, b))| (k, b)).collect();
        top.sort_by(|a, b| b.1.billed_milli.cmp(&a.1.billed_milli).then(a.0.cmp(b.0)));
        let name = "ctxwin_proxy_conversation_cost_tokens";
        let _ = writeln!(
            out,
            "# HELP {name} The {TOP_CONVERSATIONS} conversations with the largest bills: billed and direct-estimate cost in base-input tokens since each began (all of them: /metrics/conversations).\n# TYPE {name} gauge"
        );
        for (key, bill) in top.into_iter().take(TOP_CONVERSATIONS) {
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

    /// The added-latency histogram, in the Prometheus text exposition.
    fn render_latency(&self, out: &mut String) {
        out.push_str("# HELP ctxwin_proxy_added_latency_seconds Time the proxy added to a request, upstream excluded.\n");
        out.push_str("# TYPE ctxwin_proxy_added_latency_seconds histogram\n");
        let mut cumulative = 0;
        for (i, bound) in BUCKETS.iter().enumerate() {
            cumulative += self.latency[i].load(Relaxed);
            let _ = writeln!(
                out,
                "ctxwin_proxy_added_latency_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += self.latency[BUCKETS.len()].load(Relaxed);
        let _ =
            writeln!(out, "ctxwin_proxy_added_latency_seconds_bucket{{le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(
            out,
            "ctxwin_proxy_added_latency_seconds_sum {}",
            self.latency_sum_ns.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "ctxwin_proxy_added_latency_seconds_count {cumulative}");
    }
}

/// A bill as JSON: billed tokens, costs (in base-input tokens), ratios (`null` before there
/// is anything to divide by); `key` names its conversation.
///
/// ```
/// use ctxwin_proxy::conv::bill::Bill;
/// let bill = Bill { requests: 1, billed_milli: 500, direct_milli: 1_000, ..Bill::default() };
/// let json = ctxwin_proxy::metrics::bill_json(Some("t.c"), &bill);
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
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.request("openai", 200);
        m.added_latency(Duration::from_micros(300));
        m.task_finished(12.5);
        m.task_finished(1.5);
        let text = m.render();
        assert!(
            text.contains("ctxwin_proxy_requests_total{endpoint=\"openai\",status=\"200\"} 1"),
            "{text}"
        );
        assert!(text.contains("ctxwin_proxy_task_compression_ratio_sum 14\n"), "{text}");
        assert!(text.contains("ctxwin_proxy_task_compression_ratio_count 2\n"), "{text}");
        assert!(text.contains("ctxwin_proxy_task_summaries_under_2x_total 1\n"), "{text}");
        assert!(
            text.contains("ctxwin_proxy_added_latency_seconds_bucket{le=\"0.0005\"} 1"),
            "{text}"
        );
        assert!(text.contains("ctxwin_proxy_added_latency_seconds_count 1"), "{text}");
        assert!(text.contains("ctxwin_proxy_bill_vs_direct 0\n"), "{text}");
        m.billed_cache_read.fetch_add(900, Relaxed);
        let text = m.render();
        assert!(
            text.contains("ctxwin_proxy_upstream_prompt_tokens_total{kind=\"cache_read\"} 900"),
            "{text}"
        );
    }

    #[test]
    fn conversation_bills_add_to_the_totals_and_the_top_is_bounded() {
        let m = Metrics::default();
        for n in 0..(TOP_CONVERSATIONS as u64 + 5) {
            let after = Bill {
                requests: 1,
                billed_milli: 1_000 * (n + 1),
                direct_milli: 2_000 * (n + 1),
                prompt_bytes: 100,
                stable_bytes: 90,
                ..Bill::default()
            };
            m.conversation_bill(&format!("t.c{n:02}"), &Bill::default(), &after);
        }
        let text = m.render();
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
        m.conversation_bill("t.c00", &before, &after);
        let json = m.conversations_json();
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
