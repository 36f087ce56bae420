//! The upstream's answer: its usage calibrates the session at once; the message waits for the
//! client's next request, which carries the client's own copy of it (stored then, as the
//! client sent it) or supersedes it (a retry or a regenerate: it is dropped). Until then it is
//! kept in the conversation's checkpoints.

use std::time::Instant;

use super::{Conv, ConvError, FLEET_CHECKPOINT_ROWS};
use crate::assemble::Answer;

impl Conv {
    /// Keeps the upstream's answer for the next request, usage fed to the calibrator now and
    /// added to the conversation's [`bill`](super::bill) with the request's measures. An
    /// answer still waiting is superseded: no request carried it. Returns the units evicted
    /// (none: nothing is pushed until a request carries the answer).
    ///
    /// # Errors
    /// Store failures while rebuilding a conversation that another instance of a fleet
    /// served meanwhile.
    pub fn record_answer(&mut self, answer: &Answer, sent_tokens: u32) -> Result<usize, ConvError> {
        if self.pending_answer.is_some() {
            tracing::debug!(session = %self.key, "proxy: a waiting answer superseded by the next");
        }
        self.pending_answer = Some(answer.message.clone());
        self.dirty = true;
        let sent = self.forwarded.take().unwrap_or_default();
        self.recorded.bill.answered(self.provider, &answer.billed, &sent);
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
        Ok(0)
    }

    /// Whether recording the next answer and counting its exchange would touch the disk: a
    /// checkpoint falls due (every `every`); in a fleet always (the lease is read first).
    pub fn answer_needs_io(&self, every: u32) -> bool {
        self.fleet || self.exchanges.saturating_add(1) >= every
    }

    /// Counts one exchange; true when `every` have passed since the last checkpoint, and in
    /// a fleet when a rebuild would read `FLEET_CHECKPOINT_ROWS` messages again (instances
    /// taking turns reset the count of exchanges, and an idle one no longer holds the
    /// conversation when its sweeper comes).
    pub fn exchange_done(&mut self, every: u32) -> bool {
        self.last_used = Instant::now();
        self.exchanges = self.exchanges.saturating_add(1);
        self.exchanges >= every || (self.fleet && self.replay_length() >= FLEET_CHECKPOINT_ROWS)
    }
}
