//! Turning what the core did into LLM jobs: a summary job for every new or changed summary
//! (its sources read back from the archive), an extraction job for every user message.
//!
//! A summary job builds on what the model already wrote: the model's text for this summary
//! (or for summaries it absorbed, when the core merged several) is the previous summary, and
//! only the source messages those texts do not cover yet are sent. So a rolling summary the
//! core extends every few turns costs the model only the new turns each time.

use std::collections::BTreeMap;

use ctxwin_core::{Level, Role};

use super::LlmText;
use crate::llm::FallbackReason;
use crate::llm::worker::{ExtractJob, Job, SummaryJob};
use crate::message::ChatMessage;
use crate::session::sync::{contains, fingerprint, overlaps, span, within};
use crate::session::{Session, SessionError};

/// Most source messages one summary job sends (the newest); the client cuts the prompt to its
/// input budget anyway.
const MAX_JOB_MESSAGES: usize = 200;
/// Most source ids looked up in the archive for one job (ranges may be coalesced over ids
/// that are not archived messages).
const MAX_SOURCE_IDS: usize = 2_000;
/// Tokens of a one-line summary (the core's own cap for `Detail::Line`).
const LINE_TOKENS: u32 = 40;
/// `MessageRef::detail` of a one-line summary.
const LINE_DETAIL: u8 = 2;

impl Session {
    /// Sends a summary job for each of `ids` that is a live session summary; a summary whose
    /// job is still running is marked to be summarized again when that job's answer arrives.
    pub(in crate::session) fn schedule_llm_summaries(&mut self, ids: &[u64]) {
        let Some(llm) = self.llm.as_mut() else { return };
        if !llm.options.summaries {
            return;
        }
        for &id in ids {
            let Some(llm) = self.llm.as_mut() else { return };
            if let Some(dirty) = llm.in_flight.get_mut(&id) {
                *dirty = true;
                continue;
            }
            match self.summary_job(id) {
                Ok(Some(job)) => self.send_job(Job::Summary(job)),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(id, %error, "session: cannot read a summary's sources; keeping the extractive summary");
                    if let Some(llm) = self.llm.as_mut() {
                        llm.stats.summary_fallbacks.add(FallbackReason::Other);
                    }
                }
            }
        }
    }

    /// Sends an extraction job for the user message `id` (when extraction is on, the schema
    /// declares keys, and fewer than the allowed extractions wait).
    pub(in crate::session) fn schedule_llm_extraction(&mut self, id: u64, message: &ChatMessage) {
        let Some(llm) = self.llm.as_ref() else { return };
        let schema = &self.manager.config().entity_schema;
        if !llm.options.extraction || schema.is_empty() || message.role != Role::User {
            return;
        }
        if llm.extractions_pending >= llm.options.max_pending_extractions {
            tracing::debug!(id, "session: LLM extraction skipped, too many waiting");
            if let Some(llm) = self.llm.as_mut() {
                llm.stats.extractions_skipped += 1;
            }
            return;
        }
        let entities = self.manager.entities();
        let snapshot = entities
            .iter()
            .filter_map(|(key, value)| Some((key.to_owned(), value?.to_owned())))
            .collect::<BTreeMap<_, _>>();
        let job = ExtractJob {
            message_id: id,
            generation: llm.generation,
            keys: schema.keys().map(str::to_owned).collect(),
            snapshot,
            text: message.content.clone(),
        };
        self.send_job(Job::Extract(job));
    }

    /// Queues `job`, or counts it as a fallback when the worker is gone.
    pub(super) fn send_job(&mut self, job: Job) {
        let Some(llm) = self.llm.as_mut() else { return };
        let sent = match &job {
            Job::Summary(job) => Some(job.summary_id),
            Job::Extract(_) => None,
        };
        match (llm.worker.send(job), sent) {
            (Ok(()), Some(id)) => {
                llm.in_flight.insert(id, false);
                llm.stats.summaries_requested += 1;
            }
            (Ok(()), None) => {
                llm.extractions_pending += 1;
                llm.stats.extractions_requested += 1;
            }
            (Err(_), Some(id)) => {
                tracing::warn!(id, "session: LLM worker gone; keeping the extractive summary");
                llm.stats.summary_fallbacks.add(FallbackReason::WorkerGone);
            }
            (Err(_), None) => {
                tracing::warn!("session: LLM worker gone; keeping the pattern extractor's values");
                llm.stats.extraction_fallbacks.add(FallbackReason::WorkerGone);
            }
        }
    }

    /// The job for the live session summary `id`, or `None` when it is not one or nothing is
    /// new to summarize.
    fn summary_job(&self, id: u64) -> Result<Option<SummaryJob>, SessionError> {
        let Some(summary) = self.manager.get(id) else { return Ok(None) };
        if !summary.is_summary() || summary.level() != Level::Session {
            return Ok(None);
        }
        let ranges: Vec<(u64, u64)> = summary.summary_sources().collect();
        let fingerprint = fingerprint(summary.content(), &ranges, summary.detail());
        let detail = summary.detail();
        let Some(llm) = self.llm.as_ref() else { return Ok(None) };
        let priors = priors(&llm.texts, id, &ranges);
        let covered: Vec<(u64, u64)> =
            priors.iter().flat_map(|(_, text)| text.covers.iter().copied()).collect();
        let own = priors.iter().find(|(prior, _)| *prior == id).map(|(_, text)| text.text.clone());
        let mut messages: Vec<ChatMessage> = priors
            .iter()
            .filter(|(prior, _)| *prior != id)
            .map(|(_, text)| {
                ChatMessage::text(Role::System, format!("Earlier summary: {}", text.text))
            })
            .collect();
        let sources = self.uncovered_sources(&ranges, &covered)?;
        messages.extend(sources);
        if messages.is_empty() {
            return Ok(None);
        }
        let config = self.manager.config();
        let cap = config.summary_tokens.min(config.session_budget);
        let cap = cap.saturating_sub(u32::from(config.message_overhead));
        let cap = if detail == LINE_DETAIL { cap.min(LINE_TOKENS) } else { cap };
        // The core counts the answer with its own counter, often higher than the model's
        // tokenizer (the estimator adds a margin): ask for less than the cap.
        let cap = model_tokens(cap);
        Ok(Some(SummaryJob {
            summary_id: id,
            fingerprint,
            generation: llm.generation,
            previous: own,
            messages,
            covers: ranges,
            max_tokens: llm.options.max_summary_tokens.unwrap_or(cap).max(1),
        }))
    }

    /// The archived messages with ids in `ranges` but not in `covered` (tool definitions left
    /// out), oldest first, at most [`MAX_JOB_MESSAGES`] of the newest.
    fn uncovered_sources(
        &self,
        ranges: &[(u64, u64)],
        covered: &[(u64, u64)],
    ) -> Result<Vec<ChatMessage>, SessionError> {
        let Some(archive) = self.stores.archive.as_deref() else { return Ok(Vec::new()) };
        let ids = ranges
            .iter()
            .rev()
            .flat_map(|&(first, last)| (first..=last).rev())
            .filter(|id| !contains(covered, *id) && !self.tracker.tool_definitions.contains(id))
            .take(MAX_SOURCE_IDS);
        let mut messages = Vec::new();
        for id in ids {
            if let Some(row) = archive.get(&self.scope, id)? {
                messages.push(row.message);
                if messages.len() == MAX_JOB_MESSAGES {
                    break;
                }
            }
        }
        messages.reverse();
        Ok(messages)
    }
}

/// `max_tokens` to ask the model for when the answer must cost at most `budget` tokens as
/// the core counts: three quarters, room for a counter that counts the model's text higher.
pub(crate) fn model_tokens(budget: u32) -> u32 {
    (budget / 4).saturating_mul(3).max(1)
}

/// The model's texts a job for summary `id` over `ranges` can build on: the summary's own
/// first, then others that lie inside `ranges` (absorbed by a merge), largest first, none
/// overlapping another.
fn priors<'a>(
    texts: &'a BTreeMap<u64, LlmText>,
    id: u64,
    ranges: &[(u64, u64)],
) -> Vec<(u64, &'a LlmText)> {
    let mut candidates: Vec<(u64, &LlmText)> = texts
        .iter()
        .filter(|(_, text)| !text.covers.is_empty() && within(&text.covers, ranges))
        .map(|(&prior, text)| (prior, text))
        .collect();
    candidates.sort_by_key(|&(prior, text)| (prior != id, std::cmp::Reverse(span(&text.covers))));
    let mut chosen: Vec<(u64, &LlmText)> = Vec::new();
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for (prior, text) in candidates {
        if !text.covers.iter().any(|&range| overlaps(&taken, range)) {
            taken.extend_from_slice(&text.covers);
            chosen.push((prior, text));
        }
    }
    chosen.sort_by_key(|&(prior, text)| (prior == id, text.covers.first().map_or(0, |r| r.0)));
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(covers: &[(u64, u64)]) -> LlmText {
        LlmText { text: format!("{covers:?}"), covers: covers.to_vec() }
    }

    #[test]
    fn priors_prefer_the_summary_itself_and_never_overlap() {
        let texts = BTreeMap::from([
            (10, text(&[(1, 4)])),
            (11, text(&[(5, 8)])),
            (12, text(&[(1, 8)])),
            (13, text(&[(20, 30)])),
        ]);
        let chosen: Vec<u64> = priors(&texts, 10, &[(1, 9)]).iter().map(|(id, _)| *id).collect();
        assert_eq!(chosen, [11, 10], "own text last (it becomes `previous`), 12 overlaps it");
        let merged: Vec<u64> = priors(&texts, 99, &[(1, 9)]).iter().map(|(id, _)| *id).collect();
        assert_eq!(merged, [12], "the largest absorbed text wins");
        assert!(priors(&texts, 99, &[(40, 50)]).is_empty());
    }
}
