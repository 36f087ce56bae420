//! [`SessionStats`]: the core's metrics block plus calibration, archive and counter caches,
//! as an aligned table (`Display`) or JSON (`Serialize`).

use std::fmt;

use ctxwin_core::{Level, Stats};
use serde::{Deserialize, Serialize};

use super::{LlmStats, Session, SessionError};

/// What the session itself did, kept across checkpoints.
///
/// ```
/// let counters = ctxwin_std::session::SessionCounters::default();
/// assert_eq!(counters.id_repairs, 0);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionCounters {
    /// Messages pushed or imported.
    pub messages_pushed: u64,
    /// Archive rows written (write-ahead, updates, evicted units, synthetic records).
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
    /// Archive rows written ahead under an id the core then gave to something else (a
    /// summary made while evicting, a tool definition after a refused message), rewritten to
    /// describe what holds the id.
    pub id_repairs: u64,
    /// Messages written ahead that the core then refused (their rows are overwritten by the
    /// next message, which takes the same id).
    pub refused_after_write_ahead: u64,
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
    /// Summaries in the database (all sessions).
    pub summaries: u64,
    /// Database size in bytes.
    pub db_size_bytes: u64,
}

/// The exact counter's cache.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TokenCacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that ran the tokenizer.
    pub misses: u64,
    /// Counts held.
    pub entries: usize,
    /// Most counts held.
    pub capacity: usize,
    /// Share of lookups that hit.
    pub hit_rate: Option<f64>,
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
    /// The core's metrics block.
    pub core: Stats,
    /// Calibration against billed tokens.
    pub calibration: CalibrationStats,
    /// The archive, when there is one.
    pub archive: Option<ArchiveUsage>,
    /// The exact counter's cache, when counting exactly.
    pub token_cache: Option<TokenCacheStats>,
    /// What the session did.
    pub counters: SessionCounters,
    /// The newest checkpoint written or restored.
    pub last_checkpoint: Option<String>,
    /// LLM summaries and extraction, when the session has an LLM.
    pub llm: Option<LlmStats>,
}

impl Session {
    /// The session's statistics.
    ///
    /// # Errors
    /// Archive errors while counting its rows.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// let stats = session.stats()?;
    /// assert_eq!((stats.core.used, stats.calibration.observations), (0, 0));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn stats(&self) -> Result<SessionStats, SessionError> {
        let archive = match self.archive.as_ref() {
            Some(archive) => {
                let all = archive.stats()?;
                Some(ArchiveUsage {
                    messages: archive.message_count(Some(&self.name))?,
                    summaries: all.summaries,
                    db_size_bytes: all.db_size_bytes,
                })
            }
            None => None,
        };
        let counter = self.manager.counter();
        Ok(SessionStats {
            session: self.name.clone(),
            counter: counter.kind(),
            core: self.manager.stats(),
            calibration: CalibrationStats {
                observations: self.calibrator.observations(),
                ratio: self.calibrator.ratio(),
                safety_factor: self.calibrator.safety_factor(),
                configured_window: self.configured.context_window,
                effective_window: self.manager.config().context_window,
            },
            archive,
            token_cache: counter.cache_stats().map(|cache| TokenCacheStats {
                hits: cache.hits,
                misses: cache.misses,
                entries: cache.entries,
                capacity: cache.capacity,
                hit_rate: cache.hit_rate(),
            }),
            counters: self.counters.clone(),
            last_checkpoint: self.last_checkpoint.as_ref().map(ToString::to_string),
            llm: self.llm_stats(),
        })
    }
}

impl fmt::Display for SessionStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = &self.core;
        let row =
            |f: &mut fmt::Formatter<'_>, key: &str, value: String| writeln!(f, "{key:<24} {value}");
        row(f, "session", format!("{} ({} counter)", self.session, self.counter))?;
        row(
            f,
            "budget / used",
            format!("{} / {} ({}%)", core.budget, core.used, core.percent_used()),
        )?;
        let calibration = &self.calibration;
        row(
            f,
            "window",
            format!(
                "{} effective of {} configured",
                calibration.effective_window, calibration.configured_window
            ),
        )?;
        let ratio = calibration.ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.3}"));
        row(
            f,
            "billed / estimated",
            format!(
                "{ratio} over {} reports (safety x{:.3})",
                calibration.observations, calibration.safety_factor
            ),
        )?;
        writeln!(
            f,
            "{:<10} {:>8} {:>8} {:>9} {:>12}",
            "level", "tokens", "budget", "messages", "bytes"
        )?;
        for level in Level::ALL {
            let stats = core.level(level);
            writeln!(
                f,
                "{:<10} {:>8} {:>8} {:>9} {:>12}",
                level.to_string(),
                stats.tokens,
                stats.budget,
                format!("{}/{}", stats.messages, stats.message_capacity),
                format!("{}/{}", stats.bytes, stats.byte_capacity),
            )?;
        }
        let counters = &core.counters;
        row(f, "turns", core.turn.to_string())?;
        row(f, "messages pushed", self.counters.messages_pushed.to_string())?;
        row(
            f,
            "evicted",
            format!("{} units, {} tokens", counters.units_evicted, counters.tokens_evicted),
        )?;
        row(
            f,
            "reduced outputs",
            format!(
                "{} ({} tokens saved)",
                counters.observations_reduced, counters.tokens_saved_by_reduction
            ),
        )?;
        row(
            f,
            "summaries",
            format!("{} live, {} recorded", core.summaries(), self.counters.summaries_recorded),
        )?;
        if let Some(archive) = &self.archive {
            row(
                f,
                "archive",
                format!("{} messages, {} bytes on disk", archive.messages, archive.db_size_bytes),
            )?;
        }
        if let Some(cache) = &self.token_cache {
            let rate =
                cache.hit_rate.map_or_else(|| "-".to_string(), |r| format!("{:.1}%", r * 100.0));
            row(
                f,
                "token cache",
                format!("{} hits, {} misses ({rate})", cache.hits, cache.misses),
            )?;
        }
        if let Some(llm) = &self.llm {
            let ms = |p50: Option<u64>, p90: Option<u64>, max: Option<u64>| match (p50, p90, max) {
                (Some(p50), Some(p90), Some(max)) => {
                    format!("p50 {p50} ms, p90 {p90} ms, max {max} ms")
                }
                _ => "no calls".to_string(),
            };
            row(
                f,
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
            )?;
            row(f, "llm summary fallbacks", llm.summary_fallbacks.to_string())?;
            row(
                f,
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
            )?;
            row(f, "llm extraction fallbacks", llm.extraction_fallbacks.to_string())?;
        }
        row(
            f,
            "checkpoints",
            format!(
                "{} written, {} failed, last {}",
                self.counters.checkpoints_written,
                self.counters.checkpoint_failures,
                self.last_checkpoint.as_deref().unwrap_or("-")
            ),
        )
    }
}
