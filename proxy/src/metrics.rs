//! Counters for `GET /metrics` (Prometheus text format). The conversations' own bills, and
//! the largest of them on `/metrics`, are `crate::bills`'.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use ctxwin_std::store::DeferredStats;

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
    /// Follow-up requests the proxy sent upstream to answer the model's recall calls.
    pub recall_rounds: AtomicU64,
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
    /// The bills' cost, thousandths of a base-input token (`crate::conv::bill`).
    pub billed_milli: AtomicU64,
    /// The direct estimates' cost, same unit.
    pub direct_milli: AtomicU64,
    /// Forwarded prompt bytes measured against the conversation's previous forwarded prompt.
    pub prompt_bytes: AtomicU64,
    /// Of those, the stable prefixes' bytes.
    pub stable_bytes: AtomicU64,
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
        let counters: [(&str, &str, &AtomicU64); 10] = [
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
                "recall_rounds_total",
                "Follow-up requests sent upstream with the answers to the model's ctxwin_recall calls (billed like the rest: the billed counters include them).",
                &self.recall_rounds,
            ),
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

    /// The bill against the direct estimate, and the stable prefix's bytes.
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

/// What this process sent to the fleet's PostgreSQL: transactions, round trips, statements
/// prepared, and statements by kind (verb and first table).
pub fn render_postgres(out: &mut String) {
    let counts = ctxwin_std::store::postgres::statement_counts();
    for (name, help, value) in [
        ("transactions", "Transactions sent to PostgreSQL.", counts.transactions),
        ("round_trips", "Round trips to PostgreSQL.", counts.round_trips),
        ("prepared", "Statements prepared on PostgreSQL connections.", counts.prepared),
    ] {
        let name = format!("ctxwin_proxy_pg_{name}_total");
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    let name = "ctxwin_proxy_pg_statements_total";
    let _ = writeln!(
        out,
        "# HELP {name} Statements sent to PostgreSQL, by verb and first table.\n# TYPE {name} counter"
    );
    for (kind, count) in counts.by_kind {
        let _ = writeln!(out, "{name}{{kind=\"{kind}\"}} {count}");
    }
}

/// What the archive's writer thread has committed and what it still holds: rows are
/// acknowledged to clients when queued, so a queue that keeps growing means requests are
/// answered faster than they are archived (and will wait for room at the queue's bound).
pub fn render_archive_writer(out: &mut String, stats: &DeferredStats) {
    for (name, kind, help, value) in [
        (
            "archive_queued_rows",
            "gauge",
            "Rows the archive's writer thread holds, queued or being written.",
            stats.queued_rows as u64,
        ),
        (
            "archive_rows_committed_total",
            "counter",
            "Rows the archive's writer thread committed.",
            stats.rows_committed,
        ),
        (
            "archive_write_waits_total",
            "counter",
            "Writes that waited for room in the archive writer's queue.",
            stats.waited_for_room,
        ),
        (
            "archive_write_failures_total",
            "counter",
            "Archive transactions that failed (their rows were queued again).",
            stats.failed_attempts,
        ),
    ] {
        let name = format!("ctxwin_proxy_{name}");
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_archive_writers_queue_and_commits() {
        let stats =
            DeferredStats { queued_rows: 7, rows_committed: 40, ..DeferredStats::default() };
        let mut text = String::new();
        render_archive_writer(&mut text, &stats);
        assert!(text.contains("# TYPE ctxwin_proxy_archive_queued_rows gauge\n"), "{text}");
        assert!(text.contains("ctxwin_proxy_archive_queued_rows 7\n"), "{text}");
        assert!(text.contains("ctxwin_proxy_archive_rows_committed_total 40\n"), "{text}");
        assert!(text.contains("ctxwin_proxy_archive_write_waits_total 0\n"), "{text}");
    }

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
}
