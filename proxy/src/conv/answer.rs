//! The upstream's answer: its usage calibrates the session at once; the message waits for the
//! next request (which usually carries the client's own copy of it) or the next checkpoint.

use std::time::Instant;

use super::{Conv, ConvError, WRITER_BACKLOG};
use crate::assemble::Answer;
use crate::hash::hash_str;
use crate::wire::analyze_message;

impl Conv {
    /// Records the upstream's answer, usage fed to the calibrator now. The message waits for
    /// the next request (taken in its archive transaction; see [`ingest`](Self::ingest)) or
    /// the next checkpoint, whichever comes first. Returns the units evicted (by an earlier
    /// answer still waiting, taken now).
    ///
    /// # Errors
    /// Session refusals and store failures.
    pub fn record_answer(&mut self, answer: &Answer, sent_tokens: u32) -> Result<usize, ConvError> {
        // In a fleet, another instance that took the conversation meanwhile serves it now
        // (found by the session's first operation): the answer is the client's, which sends
        // it back with its next request, and the record is rebuilt from the store.
        let evicted = match self.settle_answer() {
            Err(error) if error.is_overtaken() => return self.resync().map(|()| 0),
            settled => settled?,
        };
        self.pending_answer = Some(answer.message.clone());
        self.dirty = true;
        if let Some(prompt) = answer.prompt_tokens.filter(|p| *p > 0)
            && sent_tokens > 0
            && let Err(error) = self.session.record_usage(sent_tokens, prompt)
        {
            if error.is_overtaken() {
                self.resync()?;
            } else {
                tracing::warn!(session = %self.key, %error, "proxy: usage not recorded");
            }
        }
        Ok(evicted)
    }

    /// Pushes the waiting answer into the session (its rows queued to the writer).
    /// Returns the units evicted.
    pub(super) fn settle_answer(&mut self) -> Result<usize, ConvError> {
        let Some(message) = self.pending_answer.take() else { return Ok(0) };
        let analyzed = match analyze_message(self.provider, &message) {
            Ok(analyzed) => analyzed,
            Err(reason) => {
                tracing::warn!(session = %self.key, reason, "proxy: answer not recorded");
                return Ok(0);
            }
        };
        let raw = message.to_string();
        let raw_hash = hash_str(&raw);
        self.record(&analyzed, &raw, raw_hash, true)
    }

    /// Whether recording the next answer and counting its exchange would touch the disk: a
    /// checkpoint falls due (every `every`), or the archive's writer is so far behind that
    /// queueing the rows of an answer still waiting would wait for room; in a fleet always
    /// (the lease is read first).
    pub fn answer_needs_io(&self, every: u32) -> bool {
        self.fleet
            || self.exchanges.saturating_add(1) >= every
            || (self.pending_answer.is_some() && self.writer_queue() >= WRITER_BACKLOG)
    }

    /// Counts one exchange; true when `every` have passed since the last checkpoint.
    pub fn exchange_done(&mut self, every: u32) -> bool {
        self.last_used = Instant::now();
        self.exchanges = self.exchanges.saturating_add(1);
        self.exchanges >= every
    }
}
