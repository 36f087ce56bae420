//! LLM summaries and extraction off the agent's critical path (a double buffer).
//!
//! The core keeps summarizing synchronously with its extractive summarizer and extracting
//! with its patterns: that is the buffer the agent composes with. For every summary the core
//! creates or changes, the session sends a job to a background worker thread
//! ([`SessionBuilder::llm`](super::SessionBuilder::llm)): the summary's source messages, read
//! back from the archive, folded into what the model wrote before. When the answer arrives
//! and passes the client's checks, the session swaps it into the core in place of the
//! extractive text ([`ContextManager::replace_summary`](ctxwin_core::ContextManager::replace_summary):
//! same id, sources and place) at the start of its next operation, or in
//! [`Session::wait_for_summaries`], and records it in the archive's summary records with the
//! same sources. An answer to a summary the core has changed meanwhile is not swapped in; it
//! becomes the base of the next job for that summary, which sends only the newer messages.
//!
//! Extraction works the same way for user messages: the model's values for declared keys are
//! set in the core ([`ContextManager::set_entity`](ctxwin_core::ContextManager::set_entity))
//! unless a newer message changed that key meanwhile.
//!
//! Failure is normal: a server that is down or slow, an HTTP error, an empty answer, one
//! longer than what it summarizes or than the summary's budget, one that is not a summary.
//! The extractive summary (or the pattern extractor's values) simply stays, the failure is
//! counted by [`FallbackReason`](crate::llm::FallbackReason) in [`LlmStats`] and logged, and
//! nothing is lost: the originals are in the archive.

mod jobs;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ctxwin_core::{Level, manager::ReplaceError};
use serde::Serialize;

use super::sync::fingerprint;
use super::{Session, SessionError};
use crate::llm::worker::{ExtractJob, Next, Outcome, SummaryJob, Worker};
use crate::llm::{FallbackCounts, FallbackReason, Latencies, LlmClient, LlmError, LlmSummary};

/// What a session uses the model for.
///
/// ```
/// use ctxwin_std::session::LlmOptions;
/// let options = LlmOptions { extraction: false, ..LlmOptions::default() };
/// assert!(options.summaries && options.max_summary_tokens.is_none());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlmOptions {
    /// Rewrite the core's summaries with the model (on by default).
    pub summaries: bool,
    /// Extract declared entity keys from user messages with the model (on by default; only
    /// with an entity schema).
    pub extraction: bool,
    /// `max_tokens` of summary answers; by default three quarters of the core's cap for the
    /// summary (`Config::summary_tokens`, at most the session budget, less the message
    /// framing; 40 tokens for a one-line summary), so that the answer still fits when the
    /// core's counter counts it higher than the model's tokenizer did.
    pub max_summary_tokens: Option<u32>,
    /// Extraction jobs allowed to wait at once; further user messages are not sent to the
    /// model while that many wait (8 by default).
    pub max_pending_extractions: usize,
}

impl Default for LlmOptions {
    fn default() -> Self {
        Self {
            summaries: true,
            extraction: true,
            max_summary_tokens: None,
            max_pending_extractions: 8,
        }
    }
}

/// What the session's LLM work did.
///
/// ```
/// let stats = ctxwin_std::session::LlmStats::default();
/// assert_eq!(stats.summary_fallbacks.total(), 0);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LlmStats {
    /// Summary jobs sent to the worker.
    pub summaries_requested: u64,
    /// Model summaries swapped into the core.
    pub summaries_swapped: u64,
    /// Model summaries not swapped in because the core had changed or dropped the summary
    /// meanwhile (not a failure: the text is the base of the next job).
    pub summaries_superseded: u64,
    /// Summaries left extractive, by why the model's was not used.
    pub summary_fallbacks: FallbackCounts,
    /// Why the newest summary fallback happened (the error's message).
    pub last_summary_failure: Option<String>,
    /// Extraction jobs sent.
    pub extractions_requested: u64,
    /// Extraction answers that were usable.
    pub extractions_accepted: u64,
    /// Entity values the model set.
    pub entity_values_set: u64,
    /// User messages not sent for extraction because too many waited.
    pub extractions_skipped: u64,
    /// Extractions left to the pattern extractor, by why the model's answer was not used.
    pub extraction_fallbacks: FallbackCounts,
    /// Why the newest extraction fallback happened.
    pub last_extraction_failure: Option<String>,
    /// Jobs sent whose answer has not been applied yet.
    pub pending_jobs: usize,
    /// Median duration of the summary calls (failed ones included), in milliseconds.
    pub summary_latency_p50_ms: Option<u64>,
    /// 90th percentile of the summary calls' durations, in milliseconds.
    pub summary_latency_p90_ms: Option<u64>,
    /// Longest summary call, in milliseconds.
    pub summary_latency_max_ms: Option<u64>,
    /// Median duration of the extraction calls, in milliseconds.
    pub extraction_latency_p50_ms: Option<u64>,
    /// 90th percentile of the extraction calls' durations, in milliseconds.
    pub extraction_latency_p90_ms: Option<u64>,
    /// Longest extraction call, in milliseconds.
    pub extraction_latency_max_ms: Option<u64>,
}

/// What [`Session::wait_for_summaries`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlmWait {
    /// Answers applied (swapped in, counted as fallbacks, or superseded) while waiting.
    pub applied: usize,
    /// Jobs still waiting when it returned (0: the worker is idle).
    pub pending: usize,
}

/// A summary the model wrote and the source ranges it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LlmText {
    pub text: String,
    pub covers: Vec<(u64, u64)>,
}

/// The session's LLM state: the worker, the model's texts, jobs running.
#[derive(Debug)]
pub(crate) struct LlmState {
    pub options: LlmOptions,
    pub worker: Worker,
    /// The newest model text of each summary, by summary id.
    pub texts: BTreeMap<u64, LlmText>,
    /// Summaries with a job running; `true` once the core changed them again meanwhile.
    pub in_flight: BTreeMap<u64, bool>,
    pub extractions_pending: usize,
    /// Bumped by a restore: answers to older jobs are stale.
    pub generation: u64,
    pub stats: LlmStats,
    pub summary_latency: Latencies,
    pub extraction_latency: Latencies,
}

impl LlmState {
    pub(crate) fn start(client: LlmClient, options: LlmOptions) -> Result<Self, SessionError> {
        Ok(Self {
            options,
            worker: Worker::spawn(client)
                .map_err(|error| SessionError::LlmWorker(error.to_string()))?,
            texts: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            extractions_pending: 0,
            generation: 0,
            stats: LlmStats::default(),
            summary_latency: Latencies::default(),
            extraction_latency: Latencies::default(),
        })
    }
}

fn millis(duration: Option<Duration>) -> Option<u64> {
    duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Session {
    /// Waits up to `timeout` for the LLM jobs sent so far (summaries and extractions) and
    /// applies their answers: model summaries swapped into the core and recorded in the
    /// archive, entity values set, failures counted. A summary the core changed while its job
    /// ran gets a new job, which this also waits for. For tests, the CLI, and agents that
    /// want the model's summaries before composing.
    ///
    /// # Errors
    /// [`SessionError::NoLlm`] when the session was built without [`SessionBuilder::llm`](super::SessionBuilder::llm).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ctxwin_std::llm::LlmClientBuilder;
    /// use ctxwin_std::session::SessionBuilder;
    ///
    /// // Port 9 has no server: the job fails at once and the extractive summary stays.
    /// let client = LlmClientBuilder::new("http://127.0.0.1:9").max_retries(0).build()?;
    /// let mut session = SessionBuilder::new("s").archive_in_memory().llm(client).build()?;
    /// let wait = session.wait_for_summaries(Duration::from_secs(5))?;
    /// assert_eq!(wait.pending, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_for_summaries(&mut self, timeout: Duration) -> Result<LlmWait, SessionError> {
        if self.llm.is_none() {
            return Err(SessionError::NoLlm { operation: "wait_for_summaries" });
        }
        let deadline = Instant::now() + timeout;
        let mut applied = 0usize;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(llm) = self.llm.as_mut() else { break };
            match llm.worker.next(left) {
                Next::Ready(outcome) => {
                    self.apply_outcome(*outcome);
                    applied += 1;
                }
                Next::Gone => {
                    self.worker_gone();
                    break;
                }
                Next::Idle if left.is_zero() || llm.worker.pending() == 0 => break,
                Next::Idle => {}
            }
        }
        let pending = self.llm.as_ref().map_or(0, |llm| llm.worker.pending());
        Ok(LlmWait { applied, pending })
    }

    /// Statistics of the LLM work, when the session has an LLM.
    ///
    /// ```
    /// let session = ctxwin_std::session::SessionBuilder::new("s").build()?;
    /// assert!(session.llm_stats().is_none());
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn llm_stats(&self) -> Option<LlmStats> {
        let llm = self.llm.as_ref()?;
        Some(LlmStats {
            pending_jobs: llm.worker.pending(),
            summary_latency_p50_ms: millis(llm.summary_latency.median()),
            summary_latency_p90_ms: millis(llm.summary_latency.percentile(90)),
            summary_latency_max_ms: millis(llm.summary_latency.max()),
            extraction_latency_p50_ms: millis(llm.extraction_latency.median()),
            extraction_latency_p90_ms: millis(llm.extraction_latency.percentile(90)),
            extraction_latency_max_ms: millis(llm.extraction_latency.max()),
            ..llm.stats.clone()
        })
    }

    /// Applies every answer that has arrived, without waiting (start of each operation).
    pub(super) fn poll_llm(&mut self) {
        while let Some(llm) = self.llm.as_mut() {
            match llm.worker.next(Duration::ZERO) {
                Next::Ready(outcome) => self.apply_outcome(*outcome),
                Next::Gone => return self.worker_gone(),
                Next::Idle => return,
            }
        }
    }

    /// Forgets the model's texts and makes answers to running jobs stale (after a restore:
    /// ids are handed out again).
    pub(super) fn forget_llm_texts(&mut self) {
        if let Some(llm) = self.llm.as_mut() {
            llm.generation += 1;
            llm.texts.clear();
            llm.in_flight.clear();
            llm.extractions_pending = 0;
        }
    }

    fn worker_gone(&mut self) {
        let Some(llm) = self.llm.as_mut() else { return };
        tracing::error!("session: the LLM worker thread is gone; summaries stay extractive");
        for _ in std::mem::take(&mut llm.in_flight) {
            llm.stats.summary_fallbacks.add(FallbackReason::WorkerGone);
        }
        for _ in 0..std::mem::take(&mut llm.extractions_pending) {
            llm.stats.extraction_fallbacks.add(FallbackReason::WorkerGone);
        }
    }

    fn apply_outcome(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Summary { job, result, elapsed } => self.apply_summary(job, result, elapsed),
            Outcome::Extract { job, result, elapsed } => {
                self.apply_extraction(job, result, elapsed)
            }
        }
    }

    fn apply_summary(
        &mut self,
        job: SummaryJob,
        result: Result<LlmSummary, LlmError>,
        elapsed: Duration,
    ) {
        let Some(llm) = self.llm.as_mut() else { return };
        llm.summary_latency.record(elapsed);
        if job.generation != llm.generation {
            llm.stats.summaries_superseded += 1;
            return;
        }
        let id = job.summary_id;
        let changed_meanwhile = llm.in_flight.remove(&id).unwrap_or(false);
        match result {
            Err(error) => {
                let reason = FallbackReason::of(&error);
                llm.stats.summary_fallbacks.add(reason);
                llm.stats.last_summary_failure = Some(error.to_string());
                tracing::warn!(id, %reason, %error, ms = elapsed.as_millis() as u64, "session: LLM summary failed; keeping the extractive summary");
            }
            Ok(summary) => {
                llm.texts.insert(id, LlmText { text: summary.text, covers: job.covers });
                if self.current_fingerprint(id) == Some(job.fingerprint) {
                    self.swap_in(id, elapsed);
                } else if let Some(llm) = self.llm.as_mut() {
                    llm.stats.summaries_superseded += 1;
                    tracing::debug!(id, "session: LLM summary superseded by a newer core summary");
                }
            }
        }
        if changed_meanwhile && self.current_fingerprint(id).is_some() {
            self.schedule_llm_summaries(&[id]);
        }
        self.prune_llm_texts();
    }

    /// The fingerprint of live session summary `id`, as the tracker computes it.
    fn current_fingerprint(&self, id: u64) -> Option<u64> {
        let summary = self.manager.get(id)?;
        if !summary.is_summary() || summary.level() != Level::Session {
            return None;
        }
        let ranges: Vec<(u64, u64)> = summary.summary_sources().collect();
        Some(fingerprint(summary.content(), &ranges, summary.detail()))
    }

    /// Replaces summary `id`'s text in the core with the model's, and records it.
    fn swap_in(&mut self, id: u64, elapsed: Duration) {
        let Some(text) = self.llm.as_ref().and_then(|llm| llm.texts.get(&id)) else { return };
        let replaced = self.manager.replace_summary(id, &text.text.clone());
        let Some(llm) = self.llm.as_mut() else { return };
        match replaced {
            Ok(_) => {
                self.stores.lease.changed();
                llm.stats.summaries_swapped += 1;
                tracing::info!(
                    id,
                    ms = elapsed.as_millis() as u64,
                    "session: LLM summary swapped in"
                );
            }
            Err(ReplaceError::NotASummary { .. }) => {
                llm.stats.summaries_superseded += 1;
                return;
            }
            Err(error) => {
                let reason = match error {
                    ReplaceError::EmptyText => FallbackReason::EmptyAnswer,
                    _ => FallbackReason::TooLong,
                };
                llm.stats.summary_fallbacks.add(reason);
                llm.stats.last_summary_failure = Some(error.to_string());
                tracing::warn!(id, %reason, %error, "session: LLM summary does not fit; keeping the extractive summary");
                return;
            }
        }
        // The archive's record follows; a failed write stays in the journal for the next
        // operation.
        let recorded = self.journal_summaries();
        if let Err(error) = self.commit() {
            tracing::warn!(id, %error, "session: recording the LLM summary failed; written by the next operation");
        }
        let others: Vec<u64> = recorded.into_iter().filter(|&other| other != id).collect();
        self.schedule_llm_summaries(&others);
    }

    fn apply_extraction(
        &mut self,
        job: ExtractJob,
        result: Result<BTreeMap<String, String>, LlmError>,
        elapsed: Duration,
    ) {
        let Some(llm) = self.llm.as_mut() else { return };
        llm.extraction_latency.record(elapsed);
        if job.generation != llm.generation {
            return;
        }
        llm.extractions_pending = llm.extractions_pending.saturating_sub(1);
        let updated = match result {
            Ok(updated) => updated,
            Err(error) => {
                let reason = FallbackReason::of(&error);
                llm.stats.extraction_fallbacks.add(reason);
                llm.stats.last_extraction_failure = Some(error.to_string());
                tracing::warn!(id = job.message_id, %reason, %error, "session: LLM extraction failed; keeping the pattern extractor's values");
                return;
            }
        };
        llm.stats.extractions_accepted += 1;
        let mut set = 0u64;
        for (key, value) in updated {
            let before = job.snapshot.get(&key).map(String::as_str);
            // A newer message changed the key meanwhile: its value wins.
            if before == Some(value.as_str()) || self.manager.entities().get(&key) != before {
                continue;
            }
            match self.manager.set_entity(&key, Some(&value)) {
                Ok(()) => set += 1,
                Err(error) => tracing::debug!(key, %error, "session: LLM entity value skipped"),
            }
        }
        if let Some(llm) = self.llm.as_mut() {
            llm.stats.entity_values_set += set;
        }
    }

    /// Drops the model's texts of summaries the core no longer holds and no job works on.
    fn prune_llm_texts(&mut self) {
        let live: Vec<u64> = self.manager.session().map(|m| m.id()).collect();
        if let Some(llm) = self.llm.as_mut() {
            let in_flight = &llm.in_flight;
            llm.texts.retain(|id, _| live.contains(id) || in_flight.contains_key(id));
        }
    }
}

/// The session's LLM double buffer against small local HTTP servers.
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ctxwin_core::{Config, EntitySchema, Role, StrategyKind};

    use super::LlmOptions;
    use crate::ChatMessage;
    use crate::llm::LlmClientBuilder;
    use crate::llm::mock::responder;
    use crate::session::{Session, SessionBuilder};
    use crate::store::MemoryStore;

    const SUMMARY: &str = "Worked through the build steps; src/step files edited.";

    fn config() -> Config {
        Config {
            strategy: StrategyKind::Summarization,
            summarize_threshold: 3,
            summarize_batch: 2,
            locked_tail: 2,
            entity_schema: EntitySchema::new(&["branch"]).unwrap(),
            // Plans on every push (per-push eviction), so summaries come without filling
            // the 28k budget first.
            low_water_percent: 100,
            ..Config::DEFAULT
        }
    }

    /// Answers summaries with [`SUMMARY`] and extractions with `{"branch": "fix-io"}`.
    fn answer(body: &str) -> String {
        if body.contains("json_schema") { r#"{"branch": "fix-io"}"#.into() } else { SUMMARY.into() }
    }

    fn session(url: &str, options: LlmOptions) -> Session {
        let client = LlmClientBuilder::new(url).max_retries(0).build().unwrap();
        SessionBuilder::new("llm")
            .config(config())
            .archive_store(Arc::new(MemoryStore::new()))
            .llm(client)
            .llm_options(options)
            .build()
            .unwrap()
    }

    /// Pushes `turns` user/assistant turns; returns the ids and texts pushed.
    fn push_turns(session: &mut Session, from: usize, turns: usize) -> Vec<(u64, String)> {
        let mut pushed = Vec::new();
        for turn in from..from + turns {
            for (role, text) in [
                (Role::User, format!("Step {turn}: edit src/step{turn}.rs and run cargo test")),
                (Role::Assistant, format!("Edited src/step{turn}.rs; cargo test: {turn} passed")),
            ] {
                let id = session.push(&ChatMessage::text(role, text.clone())).unwrap().id;
                pushed.push((id, text));
            }
        }
        pushed
    }

    fn rolling(session: &Session) -> (u64, String) {
        let summary = session.manager().session().find(|m| m.is_summary()).unwrap();
        (summary.id(), summary.content().to_owned())
    }

    #[test]
    fn model_summaries_are_swapped_in_and_recorded() {
        let server = responder(Duration::ZERO, answer);
        let mut session = session(&server.url, LlmOptions::default());
        let pushed = push_turns(&mut session, 0, 6);
        let wait = session.wait_for_summaries(Duration::from_secs(20)).unwrap();
        assert_eq!(wait.pending, 0);
        let (id, text) = rolling(&session);
        assert_eq!(text, SUMMARY);
        let stats = session.llm_stats().unwrap();
        assert!(stats.summaries_swapped >= 1, "{stats:?}");
        assert_eq!(stats.summary_fallbacks.total(), 0, "{stats:?}");
        assert!(stats.summary_latency_p50_ms.is_some());
        let archive = session.archive().unwrap();
        let record = archive.summary(session.scope(), id).unwrap().unwrap();
        assert_eq!(record.text, SUMMARY);
        let sources = archive.drill_down(session.scope(), id).unwrap();
        assert!(!sources.is_empty());
        for (id, text) in &pushed {
            assert_eq!(&archive.get(session.scope(), *id).unwrap().unwrap().message.content, text);
        }
        // The model's value for the declared key is set (the patterns find none here).
        assert_eq!(session.manager().entities().get("branch"), Some("fix-io"));
        assert!(stats.entity_values_set >= 1 && stats.extractions_accepted >= 1, "{stats:?}");
        let payload = session.compose(&[]).unwrap();
        assert!(payload.conversation.messages.iter().any(|m| m.content.contains(SUMMARY)));
        let table = session.stats().unwrap().to_string();
        assert!(table.contains("llm summaries"), "{table}");
    }

    #[test]
    fn later_jobs_send_only_new_messages_on_top_of_the_model_text() {
        let server = responder(Duration::ZERO, answer);
        let options = LlmOptions { extraction: false, ..LlmOptions::default() };
        let mut session = session(&server.url, options);
        push_turns(&mut session, 0, 5);
        session.wait_for_summaries(Duration::from_secs(20)).unwrap();
        let requests_before = server.requests.lock().unwrap().len();
        push_turns(&mut session, 5, 3);
        session.wait_for_summaries(Duration::from_secs(20)).unwrap();
        let requests = server.requests.lock().unwrap();
        let later = requests.get(requests_before..).unwrap_or_default();
        assert!(!later.is_empty());
        for body in later {
            assert!(body.contains("Summary so far:"), "{body}");
            assert!(
                !body.contains("src/step0.rs"),
                "step 0 is covered by the model's text: {body}"
            );
        }
    }

    #[test]
    fn answers_to_summaries_changed_meanwhile_are_not_swapped_in() {
        let server = responder(Duration::from_millis(800), answer);
        let options = LlmOptions { extraction: false, ..LlmOptions::default() };
        let mut session = session(&server.url, options);
        // Pushed faster than the model answers: the rolling summary changes under running jobs.
        push_turns(&mut session, 0, 10);
        let wait = session.wait_for_summaries(Duration::from_secs(30)).unwrap();
        assert_eq!(wait.pending, 0);
        let stats = session.llm_stats().unwrap();
        assert!(stats.summaries_superseded >= 1 && stats.summaries_swapped >= 1, "{stats:?}");
        assert_eq!(rolling(&session).1, SUMMARY, "the last job's answer is swapped in: {stats:?}");
    }

    #[test]
    fn a_dead_server_leaves_the_extractive_summaries_and_loses_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let mut session = session(&url, LlmOptions::default());
        let pushed = push_turns(&mut session, 0, 8);
        let wait = session.wait_for_summaries(Duration::from_secs(20)).unwrap();
        assert_eq!(wait.pending, 0);
        let stats = session.llm_stats().unwrap();
        assert_eq!(stats.summaries_swapped, 0);
        assert!(stats.summary_fallbacks.server_down >= 1, "{stats:?}");
        assert!(stats.extraction_fallbacks.server_down >= 1, "{stats:?}");
        assert_ne!(rolling(&session).1, SUMMARY);
        let archive = session.archive().unwrap();
        for (id, text) in &pushed {
            assert_eq!(&archive.get(session.scope(), *id).unwrap().unwrap().message.content, text);
        }
        assert!(session.compose(&[]).is_ok());
    }

    #[test]
    fn answers_that_do_not_fit_are_counted_and_the_extractive_text_stays() {
        let long: Vec<String> = (0..400).map(|i| format!("fact{i}")).collect();
        let long = long.join(" ");
        let server = responder(Duration::ZERO, move |_| long.clone());
        let options = LlmOptions { extraction: false, ..LlmOptions::default() };
        let mut session = session(&server.url, options);
        push_turns(&mut session, 0, 6);
        session.wait_for_summaries(Duration::from_secs(20)).unwrap();
        let stats = session.llm_stats().unwrap();
        assert_eq!(stats.summaries_swapped, 0);
        assert!(stats.summary_fallbacks.too_long >= 1, "{stats:?}");
        assert!(!rolling(&session).1.contains("fact1"));
    }

    #[test]
    fn waiting_needs_an_llm() {
        let mut session = SessionBuilder::new("plain").build().unwrap();
        assert!(matches!(
            session.wait_for_summaries(Duration::ZERO),
            Err(super::SessionError::NoLlm { .. })
        ));
    }
}
