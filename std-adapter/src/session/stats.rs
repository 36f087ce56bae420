//! [`SessionStats`]: the core's metrics block plus calibration, archive, checkpoints and
//! counter caches. The one stats model: JSON through `Serialize`, text through
//! [`SessionStats::overview`] / [`SessionStats::details`] rows rendered by
//! [`SessionStats::render_rows`] (`Display` renders both; the `ctxwin stats` command the
//! overview, with its own notes added).

use std::fmt;

use ctxwin_core::{Level, Stats, StrategyKind};
use serde::{Deserialize, Serialize};

#[cfg(feature = "http")]
use super::LlmStats;
use super::{Calibration, Session, SessionError};
use crate::tokens::CacheStats;

/// What the session itself did, kept across checkpoints.
///
/// ```
/// let counters = ctxwin_std::session::SessionCounters::default();
/// assert_eq!(counters.messages_pushed, 0);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionCounters {
    /// Messages pushed or imported.
    pub messages_pushed: u64,
    /// Archive rows written (messages, records the core wrote); through a wrapper that
    /// queues or holds them ([`Deferred`](crate::store::Deferred),
    /// [`Batched`](crate::store::Batched)), rows handed to it.
    pub archive_rows_written: u64,
    /// Units archived and released from the core's outbox.
    pub units_archived: u64,
    /// Summaries recorded (new or changed versions).
    pub summaries_recorded: u64,
    /// Checkpoints written.
    pub checkpoints_written: u64,
    /// Periodic checkpoints that failed (retried on the next push).
    pub checkpoint_failures: u64,
    /// Restores from a checkpoint.
    pub restores: u64,
    /// Reloads from the store ([`Session::reload`](super::Session::reload)): another process
    /// had taken the lease.
    pub reloads: u64,
}

/// How far the counter's estimates are from the provider's counts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CalibrationStats {
    /// Usage reports recorded.
    pub observations: u64,
    /// Typical billed/estimated ratio (above 1: the counter estimates low); `None` before the
    /// first report.
    pub ratio: Option<f64>,
    /// What estimates are scaled by when the window is shrunk.
    pub safety_factor: f64,
    /// The window the session was configured with.
    pub configured_window: u32,
    /// The window the core plans with after calibration.
    pub effective_window: u32,
}

/// This session's part of the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ArchiveUsage {
    /// Messages archived for this session.
    pub messages: u64,
    /// Summaries recorded for this session.
    pub summaries: u64,
    /// Bytes the whole archive takes on its medium, when its adapter can tell.
    pub store_bytes: Option<u64>,
}

/// Everything measurable about a session.
///
/// ```
/// use ctxwin_std::session::SessionBuilder;
/// use ctxwin_std::{ChatMessage, core::Role};
/// let mut session = SessionBuilder::new("s").archive_in_memory().build()?;
/// session.push(&ChatMessage::text(Role::User, "hello"))?;
/// let stats = session.stats()?;
/// assert_eq!(stats.archive.unwrap().messages, 1);
/// assert!(stats.to_string().contains("working"));
/// assert!(serde_json::to_string(&stats).unwrap().contains("\"calibration\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionStats {
    /// The session's name.
    pub session: String,
    /// `"estimator"` or `"exact"`.
    pub counter: &'static str,
    /// The compression strategy the session was configured with.
    pub strategy: StrategyKind,
    /// The core's metrics block.
    pub core: Stats,
    /// Calibration against billed tokens.
    pub calibration: CalibrationStats,
    /// The archive, when there is one.
    pub archive: Option<ArchiveUsage>,
    /// The exact counter's cache, when counting exactly.
    pub token_cache: Option<CacheStats>,
    /// What the session did.
    pub counters: SessionCounters,
    /// The newest checkpoint written or restored.
    pub last_checkpoint: Option<String>,
    /// Checkpoint files in the session's checkpoint directory; `None` without one.
    pub checkpoints_kept: Option<usize>,
    /// LLM summaries and extraction, when the session has an LLM (cargo feature `http`).
    #[cfg(feature = "http")]
    pub llm: Option<LlmStats>,
    /// The tasks the core keeps (the newest four) and how task boundaries are found.
    pub tasks: TaskStats,
}

/// A summary's compression ratio below which it keeps too much detail.
pub const TASK_RATIO_WARNING: f64 = 2.0;

/// The tasks of a session: how boundaries are found, and per task how much its summary
/// compressed it.
///
/// ```
/// use ctxwin_std::session::SessionBuilder;
/// use ctxwin_std::{ChatMessage, core::Role};
/// let mut session = SessionBuilder::new("s").build()?;
/// session.start_task("rename the config key")?;
/// session.push(&ChatMessage::text(Role::User, "Rename `trigger` to `trigger_percent` in src/config.rs and every test that reads it, then run the suite"))?;
/// session.push(&ChatMessage::text(Role::Assistant, "Renamed it in src/config.rs, tests/config.rs and tests/cli.rs; the suite passes."))?;
/// session.finish_task("renamed")?;
/// let stats = session.stats()?;
/// assert_eq!(stats.tasks.tasks.len(), 1);
/// assert!(stats.tasks.tasks[0].ratio.is_some());
/// assert!(stats.overview().iter().any(|(key, _)| key == "  task 1"));
/// # Ok::<(), ctxwin_std::session::SessionError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskStats {
    /// How boundaries are found ([`TaskDetection::as_str`](super::TaskDetection::as_str)).
    pub detection: &'static str,
    /// What detection does, in a sentence.
    pub detection_explained: &'static str,
    /// Tasks detection started in this process.
    pub detected: u64,
    /// The tasks kept, oldest first.
    pub tasks: Vec<TaskRatio>,
}

/// One task's compression.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskRatio {
    /// Its number.
    pub number: u32,
    /// Its goal.
    pub goal: String,
    /// Whether it is still running.
    pub open: bool,
    /// Tokens of its messages.
    pub source_tokens: u32,
    /// Tokens of its summary (0 without one).
    pub summary_tokens: u32,
    /// `source_tokens / summary_tokens`, once summarized.
    pub ratio: Option<f64>,
    /// Whether the ratio is under [`TASK_RATIO_WARNING`]: the summary keeps too much detail.
    pub warning: bool,
}

impl TaskStats {
    fn of(session: &Session) -> TaskStats {
        let detection = session.task_detection();
        let tasks = session
            .tasks()
            .iter()
            .map(|task| {
                let ratio = task.compression_ratio().map(f64::from);
                TaskRatio {
                    number: task.number(),
                    goal: task.goal().to_string(),
                    open: task.is_open(),
                    source_tokens: task.source_tokens(),
                    summary_tokens: task.summary_tokens(),
                    ratio,
                    warning: ratio.is_some_and(|r| r < TASK_RATIO_WARNING),
                }
            })
            .collect();
        TaskStats {
            detection: detection.as_str(),
            detection_explained: detection.explain(),
            detected: session.task_state.detected,
            tasks,
        }
    }

    /// Overview rows: how tasks are found, then one row per task.
    fn rows(&self) -> Vec<(String, String)> {
        let mut rows = vec![(
            "tasks".to_string(),
            format!("{}: {}", self.detection, self.detection_explained),
        )];
        for task in &self.tasks {
            let value = match (task.open, task.ratio) {
                (true, _) => format!("{:?}: running", task.goal),
                (false, None) => format!("{:?}: done, no summary", task.goal),
                (false, Some(ratio)) => format!(
                    "{:?}: {} -> {} tokens ({ratio:.1}x){}",
                    task.goal,
                    thousands(task.source_tokens),
                    thousands(task.summary_tokens),
                    if task.warning {
                        "; warning: under 2x, the summary keeps too much detail"
                    } else {
                        ""
                    }
                ),
            };
            rows.push((format!("  task {}", task.number), value));
        }
        rows
    }
}

impl Session {
    /// What the session did so far (the counters of [`stats`](Self::stats), read without
    /// touching the stores).
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert_eq!(session.counters().reloads, 0);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn counters(&self) -> &SessionCounters {
        &self.counters
    }

    /// The session's statistics.
    ///
    /// # Errors
    /// Archive errors while counting its rows, checkpoint errors while listing its
    /// checkpoint directory.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// let stats = session.stats()?;
    /// assert_eq!((stats.core.used, stats.calibration.observations), (0, 0));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn stats(&self) -> Result<SessionStats, SessionError> {
        let archive = match self.stores.archive.as_deref() {
            Some(archive) => {
                let usage = archive.usage(&self.scope)?;
                Some(ArchiveUsage {
                    messages: usage.messages,
                    summaries: usage.summaries,
                    store_bytes: usage.store_bytes,
                })
            }
            None => None,
        };
        let counter = self.manager.counter();
        let checkpoints_kept = match self.stores.checkpoints.as_deref() {
            Some(sink) => Some(sink.ids(&self.scope)?.len()),
            None => None,
        };
        let Calibration { configured, calibrator } = &self.calibration;
        Ok(SessionStats {
            session: self.scope.conversation.clone(),
            counter: counter.kind(),
            strategy: configured.strategy,
            core: self.manager.stats(),
            calibration: CalibrationStats {
                observations: calibrator.observations(),
                ratio: calibrator.ratio(),
                safety_factor: calibrator.safety_factor(),
                configured_window: configured.context_window,
                effective_window: self.manager.config().context_window,
            },
            archive,
            token_cache: counter.cache_stats(),
            counters: self.counters.clone(),
            last_checkpoint: self.checkpointing.last.as_ref().map(ToString::to_string),
            checkpoints_kept,
            #[cfg(feature = "http")]
            llm: self.llm_stats(),
            tasks: TaskStats::of(self),
        })
    }
}

/// `1234567` as `1,234,567`: how the session's and the CLI's reports print counts.
///
/// ```
/// assert_eq!(ctxwin_std::session::thousands(1_234_567u32), "1,234,567");
/// assert_eq!(ctxwin_std::session::thousands(12u8), "12");
/// ```
pub fn thousands(value: impl Into<u64>) -> String {
    let digits = value.into().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `"-"` or the value with `show`.
fn or_dash<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| "-".to_string(), show)
}

impl SessionStats {
    /// The overview, as `(label, value)` rows: tokens of the budget, per level, messages,
    /// summaries, compression, evictions, reductions, checkpoints, LLM. What `ctxwin stats`
    /// prints (it adds its own notes: the command of the last compression, retrieved items,
    /// the configured server).
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// let rows = session.stats()?.overview();
    /// assert_eq!(rows[0], ("session".to_string(), "s (estimator counter, sliding_window strategy)".to_string()));
    /// assert!(rows.iter().any(|(key, _)| key == "last compression"));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn overview(&self) -> Vec<(String, String)> {
        let core = &self.core;
        let mut rows: Vec<(String, String)> = vec![
            (
                "session".into(),
                format!("{} ({} counter, {} strategy)", self.session, self.counter, self.strategy),
            ),
            (
                "tokens".into(),
                format!(
                    "{} / {} ({}%), eviction above {}",
                    thousands(core.used),
                    thousands(core.budget),
                    core.percent_used(),
                    thousands(core.trigger)
                ),
            ),
        ];
        rows.extend(self.level_rows());
        rows.extend(self.content_rows().map(|(key, value)| (key.to_string(), value)));
        rows.extend(self.activity_rows().map(|(key, value)| (key.to_string(), value)));
        rows.extend(self.tasks.rows());
        rows
    }

    /// A row per level: tokens of its budget, messages.
    fn level_rows(&self) -> Vec<(String, String)> {
        let core = &self.core;
        let usages: Vec<_> = Level::ALL.iter().map(|&level| (level, core.level(level))).collect();
        let width = |f: &dyn Fn(&ctxwin_core::stats::LevelStats) -> u32| {
            usages.iter().map(|(_, u)| thousands(f(u)).len()).max().unwrap_or(1)
        };
        let (tw, bw, mw) = (width(&|u| u.tokens), width(&|u| u.budget), width(&|u| u.messages));
        usages
            .iter()
            .map(|(level, usage)| {
                (
                    format!("  {}", level.as_str()),
                    format!(
                        "{:>tw$} / {:<bw$}  {:>mw$} {}",
                        thousands(usage.tokens),
                        thousands(usage.budget),
                        thousands(usage.messages),
                        if usage.messages == 1 { "message" } else { "messages" }
                    ),
                )
            })
            .collect()
    }

    /// What the context and the archive hold, and how compressed.
    fn content_rows(&self) -> [(&'static str, String); 4] {
        let core = &self.core;
        let counters = &core.counters;
        let archived = self.archive.map_or(0, |a| a.messages);
        let recorded = self.archive.map_or(0, |a| a.summaries);
        let ratio = core.compression_permille() as f64 / 1000.0;
        let last = match counters.last_compression_turn {
            None => format!("never (turn {})", core.turn),
            Some(turn) => format!("turn {turn} (now {})", core.turn),
        };
        [
            (
                "messages",
                format!(
                    "{} in context, {} archived",
                    thousands(core.messages()),
                    thousands(archived)
                ),
            ),
            (
                "summaries",
                format!("{} in context, {} recorded", core.summaries(), thousands(recorded)),
            ),
            (
                "compression",
                format!("{ratio:.2}x ({} tokens ingested)", thousands(counters.tokens_ingested)),
            ),
            ("last compression", last),
        ]
    }

    /// Compactions, the prompt cache, evictions, reductions, checkpoints and the model.
    fn activity_rows(&self) -> [(&'static str, String); 6] {
        let counters = &self.core.counters;
        let checkpoints = match self.checkpoints_kept {
            Some(kept) => {
                format!("{kept} kept, last {}", self.last_checkpoint.as_deref().unwrap_or("-"))
            }
            None => "none (no checkpoint directory)".to_string(),
        };
        #[cfg(not(feature = "http"))]
        let llm = "none (built without the http feature)".to_string();
        #[cfg(feature = "http")]
        let llm = match &self.llm {
            Some(llm) => format!(
                "{} of {} summaries rewritten, {} of {} extractions accepted, {} pending",
                llm.summaries_swapped,
                llm.summaries_requested,
                llm.extractions_accepted,
                llm.extractions_requested,
                llm.pending_jobs
            ),
            None => "none (extractive summaries)".to_string(),
        };
        [
            (
                "compactions",
                format!(
                    "{}; {:.1}% of {} composes extended the previous payload",
                    thousands(counters.compactions),
                    counters.extending_permille() as f64 / 10.0,
                    thousands(counters.composes)
                ),
            ),
            (
                "prompt cache",
                format!(
                    "{} cached + {} new prompt tokens ({:.1}% cached); input cost {:.2} of uncached (read 0.1x, write 1.25x)",
                    thousands(counters.prompt_tokens_cached),
                    thousands(counters.prompt_tokens_new),
                    counters.cached_permille() as f64 / 10.0,
                    counters.cost_permille(100, 1_250) as f64 / 1000.0
                ),
            ),
            (
                "evicted",
                format!(
                    "{} messages in {} units ({} tokens)",
                    thousands(counters.messages_evicted),
                    thousands(counters.units_evicted),
                    thousands(counters.tokens_evicted)
                ),
            ),
            (
                "reduced",
                format!(
                    "{} tool outputs ({} tokens saved)",
                    thousands(counters.observations_reduced),
                    thousands(counters.tokens_saved_by_reduction)
                ),
            ),
            ("checkpoints", checkpoints),
            ("llm", llm),
        ]
    }

    /// The details below the overview, as `(label, value)` rows: calibration, level
    /// capacities, what the session did, the archive, the token cache, LLM latencies and
    /// fallbacks, checkpoint writes.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// let rows = session.stats()?.details();
    /// assert!(rows.iter().any(|(key, value)| key == "budget / used" && value.ends_with("(0%)")));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn details(&self) -> Vec<(String, String)> {
        let core = &self.core;
        let counters = &core.counters;
        let calibration = &self.calibration;
        let mut rows: Vec<(&str, String)> = vec![
            (
                "budget / used",
                format!("{} / {} ({}%)", core.budget, core.used, core.percent_used()),
            ),
            (
                "window",
                format!(
                    "{} effective of {} configured",
                    calibration.effective_window, calibration.configured_window
                ),
            ),
            (
                "billed / estimated",
                format!(
                    "{} over {} reports (safety x{:.3})",
                    or_dash(calibration.ratio, |r| format!("{r:.3}")),
                    calibration.observations,
                    calibration.safety_factor
                ),
            ),
        ];
        let mut level_rows = Vec::new();
        for level in Level::ALL {
            let stats = core.level(level);
            level_rows.push((
                format!("{} capacity", level.as_str()),
                format!(
                    "{}/{} messages, {}/{} bytes",
                    stats.messages, stats.message_capacity, stats.bytes, stats.byte_capacity
                ),
            ));
        }
        rows.extend([
            ("turns", core.turn.to_string()),
            ("messages pushed", self.counters.messages_pushed.to_string()),
            (
                "reduced outputs",
                format!(
                    "{} ({} tokens saved)",
                    counters.observations_reduced, counters.tokens_saved_by_reduction
                ),
            ),
            (
                "summaries recorded",
                format!("{} live, {} recorded", core.summaries(), self.counters.summaries_recorded),
            ),
        ]);
        if let Some(archive) = &self.archive {
            let bytes = or_dash(archive.store_bytes, |bytes| format!("{bytes} bytes"));
            rows.push(("archive", format!("{} messages, {bytes} in the store", archive.messages)));
        }
        if let Some(cache) = &self.token_cache {
            let rate = or_dash(cache.hit_rate(), |r| format!("{:.1}%", r * 100.0));
            rows.push((
                "token cache",
                format!("{} hits, {} misses ({rate})", cache.hits, cache.misses),
            ));
        }
        #[cfg(feature = "http")]
        if let Some(llm) = &self.llm {
            rows.extend(llm_rows(llm));
        }
        rows.push((
            "checkpoints written",
            format!(
                "{} written, {} failed",
                self.counters.checkpoints_written, self.counters.checkpoint_failures
            ),
        ));
        let mut out: Vec<(String, String)> =
            rows.into_iter().map(|(key, value)| (key.to_string(), value)).collect();
        out.splice(3..3, level_rows);
        out
    }

    /// `rows` as text: one `label  value` line each, labels padded to one width.
    ///
    /// ```
    /// use ctxwin_std::SessionStats;
    /// let rows = [("a".to_string(), "1".to_string()), ("bcd".to_string(), "2".to_string())];
    /// assert_eq!(SessionStats::render_rows(&rows), "a    1\nbcd  2\n");
    /// ```
    pub fn render_rows(rows: &[(String, String)]) -> String {
        let width = rows.iter().map(|(key, _)| key.chars().count()).max().unwrap_or(0);
        rows.iter().map(|(key, value)| format!("{key:<width$}  {value}\n")).collect()
    }
}

/// The detail rows of the LLM work: summaries and extraction, with their latencies.
#[cfg(feature = "http")]
fn llm_rows(llm: &LlmStats) -> [(&'static str, String); 4] {
    let ms = |p50: Option<u64>, p90: Option<u64>, max: Option<u64>| match (p50, p90, max) {
        (Some(p50), Some(p90), Some(max)) => format!("p50 {p50} ms, p90 {p90} ms, max {max} ms"),
        _ => "no calls".to_string(),
    };
    [
        (
            "llm summaries",
            format!(
                "{} swapped of {} requested, {} superseded, {} pending; {}",
                llm.summaries_swapped,
                llm.summaries_requested,
                llm.summaries_superseded,
                llm.pending_jobs,
                ms(
                    llm.summary_latency_p50_ms,
                    llm.summary_latency_p90_ms,
                    llm.summary_latency_max_ms
                )
            ),
        ),
        ("llm summary fallbacks", llm.summary_fallbacks.to_string()),
        (
            "llm extraction",
            format!(
                "{} accepted of {} requested, {} values set; {}",
                llm.extractions_accepted,
                llm.extractions_requested,
                llm.entity_values_set,
                ms(
                    llm.extraction_latency_p50_ms,
                    llm.extraction_latency_p90_ms,
                    llm.extraction_latency_max_ms
                )
            ),
        ),
        ("llm extraction fallbacks", llm.extraction_fallbacks.to_string()),
    ]
}

/// The overview, then the details, one aligned table.
impl fmt::Display for SessionStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rows = self.overview();
        rows.extend(self.details());
        f.write_str(&Self::render_rows(&rows))
    }
}
