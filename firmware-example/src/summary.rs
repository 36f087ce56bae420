//! A deterministic summary of drained outbox units (a stand-in until the core has a
//! summarizer strategy): counts and id range of what left the window, plus the newest
//! reading verbatim. Summaries evicted from the session level are folded into the next one,
//! so the id ranges never lose a message.

use crate::text::TextBuf;
use ctxwin_core::{Level, Role, manager::EvictedUnit};

/// Longest summary text, in bytes.
pub const SUMMARY_BYTES: usize = 160;

/// What the drained units since the last summary held.
#[derive(Clone, Copy, Debug)]
pub struct Digest {
    first_id: u64,
    last_id: u64,
    units: u32,
    readings: u32,
    calls: u32,
    reduced: u32,
    notes: u32,
    folded: u32,
    last_reading: TextBuf<48>,
}

impl Default for Digest {
    fn default() -> Self {
        Self::new()
    }
}

impl Digest {
    /// Nothing absorbed.
    pub const fn new() -> Self {
        Self {
            first_id: u64::MAX,
            last_id: 0,
            units: 0,
            readings: 0,
            calls: 0,
            reduced: 0,
            notes: 0,
            folded: 0,
            last_reading: TextBuf::new(),
        }
    }

    /// Takes in one evicted unit.
    pub fn absorb(&mut self, unit: &EvictedUnit<'_>) {
        self.units += 1;
        for message in unit.messages() {
            self.cover(message.id(), message.id());
            if message.is_summary() {
                self.folded += 1;
                for (first, last) in message.summary_sources() {
                    self.cover(first, last);
                }
                continue;
            }
            match message.role() {
                Role::User => {
                    self.readings += 1;
                    self.last_reading.clear();
                    self.last_reading.push_str(message.content());
                }
                Role::Assistant if message.level() == Level::Volatile => self.notes += 1,
                Role::Assistant => self.calls += message.tool_call_count() as u32,
                Role::Tool if message.was_reduced() => self.reduced += 1,
                _ => {}
            }
        }
    }

    fn cover(&mut self, first: u64, last: u64) {
        self.first_id = self.first_id.min(first);
        self.last_id = self.last_id.max(last);
    }

    /// Units absorbed since the last [`reset`](Self::reset).
    pub fn units(&self) -> u32 {
        self.units
    }

    /// The id range the summary stands for.
    pub fn sources(&self) -> [(u64, u64); 1] {
        [(self.first_id.min(self.last_id), self.last_id)]
    }

    /// The summary text, e.g. `#12-#40: 7 readings, 7 calls (1 log reduced), 1 note, 1 earlier
    /// summary; last t=9 temp=22.1C hum=47% vib=11mg`.
    pub fn write(&self, out: &mut TextBuf<SUMMARY_BYTES>) {
        let [(first, last)] = self.sources();
        out.clear();
        out.push_str("#").push_u64(first).push_str("-#").push_u64(last).push_str(": ");
        out.push_u64(self.readings.into()).push_str(" readings, ");
        out.push_u64(self.calls.into()).push_str(" calls");
        if self.reduced > 0 {
            out.push_str(" (").push_u64(self.reduced.into()).push_str(" log reduced)");
        }
        if self.notes > 0 {
            out.push_str(", ").push_u64(self.notes.into()).push_str(" notes");
        }
        if self.folded > 0 {
            out.push_str(", ").push_u64(self.folded.into()).push_str(" earlier summaries");
        }
        if !self.last_reading.as_str().is_empty() {
            out.push_str("; last ").push_str(self.last_reading.as_str());
        }
    }

    /// Forgets everything absorbed.
    pub fn reset(&mut self) {
        *self = Self::new();
    }
}
