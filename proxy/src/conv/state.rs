//! What a conversation has recorded of the messages its session holds, kept in the session's
//! checkpoints as the caller's state ([`Session::set_caller_state`]): restored with the
//! session, so the proxy keeps no store of its own. A message's raw JSON is in its archive row
//! ([`ArchivedMessage::raw`]), once.
//!
//! The bytes: `CWPX`, a version byte (3), then [`Recorded`] in postcard's encoding (varints,
//! compact: about 30 bytes a message), then the answer waiting for the client's next request
//! (`Option<String>`, its JSON), then the conversation's [`Bill`]. Versions 1 (without the
//! answer) and 2 (without the bill) still read.
//!
//! [`Session::set_caller_state`]: ctxwin_std::session::Session::set_caller_state
//! [`ArchivedMessage::raw`]: ctxwin_std::store::ArchivedMessage::raw

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::bill::Bill;

const MAGIC: &[u8; 4] = b"CWPX";
const VERSION: u8 = 3;
/// The version before the waiting answer was kept (read, never written).
const VERSION_1: u8 = 1;
/// The version before the bill was kept (read, never written).
const VERSION_2: u8 = 2;

/// One message of the recorded sequence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Fingerprint of its canonical form.
    pub fp: u64,
    /// Hash of the raw JSON last seen for it (equal bytes need no reading).
    pub raw_hash: u64,
    /// A system message leading the conversation (kept permanently).
    pub pinned: bool,
    /// Hash of its tool-call ids (0 without calls).
    pub calls: u64,
    /// Session ids of its parts, in order (the first part's archive row holds its raw JSON).
    pub ids: Vec<u64>,
    /// Anthropic content-block indexes of each part.
    pub blocks: Vec<Vec<usize>>,
    /// Estimated tokens of all its parts.
    pub tokens: u32,
    /// Built from an upstream answer the client had not echoed yet (by older proxies, which
    /// recorded a waiting answer at checkpoints; answers now wait in [`Recorded::pending`]).
    pub from_answer: bool,
}

/// What a conversation has recorded: its window, the sequence of messages its session holds
/// and the tool definitions it pushed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// The window the conversation was created with: it keeps it for life.
    pub window: u32,
    /// The messages, in order.
    pub entries: Vec<Entry>,
    /// Session ids of the tool-definition messages (never emitted as messages).
    pub placeholders: BTreeSet<u64>,
    /// Fingerprint of the tool definitions last pushed.
    pub tools_fp: u64,
    /// The upstream's last answer (its JSON) while it waits for the client's next request,
    /// which either carries it (then the client's copy is stored) or supersedes it (a retry, a
    /// regenerate: it is dropped). Encoded after the rest (version 2).
    #[serde(skip)]
    pub pending: Option<String>,
    /// What the conversation cost so far ([`super::bill`]). Encoded after the waiting answer
    /// (version 3).
    #[serde(skip)]
    pub bill: Bill,
    /// Session id → (entry, part): derived from `entries`.
    #[serde(skip)]
    by_id: HashMap<u64, (usize, usize)>,
}

impl Recorded {
    /// Nothing recorded yet, for a `window`-token model.
    pub fn new(window: u32) -> Self {
        Self { window, ..Self::default() }
    }

    /// The caller's state to keep in a checkpoint.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut bytes = MAGIC.to_vec();
        bytes.push(VERSION);
        let bytes =
            postcard::to_extend(self, bytes).map_err(|e| format!("recorded messages: {e}"))?;
        let bytes = postcard::to_extend(&self.pending, bytes)
            .map_err(|e| format!("waiting answer: {e}"))?;
        postcard::to_extend(&self.bill, bytes).map_err(|e| format!("bill: {e}"))
    }

    /// Reads what [`encode`](Self::encode) wrote.
    ///
    /// # Errors
    /// Bytes of another kind or version, or that do not decode.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let body = bytes
            .strip_prefix(&MAGIC[..])
            .ok_or("not the proxy's recorded messages (no CWPX magic)")?;
        match body.split_first() {
            Some((&version, body)) if (VERSION_1..=VERSION).contains(&version) => {
                let (mut recorded, rest): (Self, &[u8]) = postcard::take_from_bytes(body)
                    .map_err(|e| format!("recorded messages do not decode: {e}"))?;
                if version >= VERSION_2 {
                    let (pending, rest) = postcard::take_from_bytes(rest)
                        .map_err(|e| format!("the waiting answer does not decode: {e}"))?;
                    recorded.pending = pending;
                    if version == VERSION {
                        recorded.bill = postcard::from_bytes(rest)
                            .map_err(|e| format!("the bill does not decode: {e}"))?;
                    }
                }
                recorded.index();
                Ok(recorded)
            }
            Some((version, _)) => {
                Err(format!("recorded messages version {version}, this build reads {VERSION}"))
            }
            None => Err("recorded messages cut short".into()),
        }
    }

    fn index(&mut self) {
        self.by_id.clear();
        for (e, entry) in self.entries.iter().enumerate() {
            for (p, id) in entry.ids.iter().enumerate() {
                self.by_id.insert(*id, (e, p));
            }
        }
    }

    /// Appends `entry`.
    pub fn push(&mut self, entry: Entry) {
        let seq = self.entries.len();
        for (p, id) in entry.ids.iter().enumerate() {
            self.by_id.insert(*id, (seq, p));
        }
        self.entries.push(entry);
    }

    /// Appends part `id` (its content blocks, its tokens) to the last entry.
    pub fn extend_last(&mut self, id: u64, blocks: Vec<usize>, tokens: u32) {
        let Some(seq) = self.entries.len().checked_sub(1) else { return };
        let entry = &mut self.entries[seq];
        self.by_id.insert(id, (seq, entry.ids.len()));
        entry.ids.push(id);
        entry.blocks.push(blocks);
        entry.tokens = entry.tokens.saturating_add(tokens);
    }

    /// The newest session id recorded (of a message part or a tool-definition placeholder);
    /// 0 when none is.
    pub fn last_id(&self) -> u64 {
        let parts = self.by_id.keys().max().copied().unwrap_or(0);
        parts.max(self.placeholders.last().copied().unwrap_or(0))
    }

    /// The entry and part of the message with session id `id`.
    pub fn locate(&self, id: u64) -> Option<(usize, usize)> {
        self.by_id.get(&id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ids: &[u64]) -> Entry {
        Entry {
            fp: u64::MAX - 1,
            raw_hash: 7,
            pinned: false,
            calls: 0,
            ids: ids.to_vec(),
            blocks: vec![vec![0, 2]; ids.len()],
            tokens: 42,
            from_answer: true,
        }
    }

    #[test]
    fn recorded_messages_round_trip_and_their_index_is_rebuilt() {
        let mut recorded = Recorded::new(8_192);
        recorded.push(entry(&[1]));
        recorded.push(entry(&[3, 4]));
        recorded.placeholders.insert(2);
        recorded.tools_fp = 99;
        let bytes = recorded.encode().unwrap();
        let back = Recorded::decode(&bytes).unwrap();
        assert_eq!(back, recorded);
        assert_eq!(back.locate(4), Some((1, 1)));
        assert!(bytes.len() < 80, "{} bytes", bytes.len());
        recorded.pending = Some(r#"{"role":"assistant","content":"Yes."}"#.into());
        assert_eq!(Recorded::decode(&recorded.encode().unwrap()).unwrap(), recorded);
        recorded.bill.requests = 3;
        recorded.bill.cache_read = 12_345;
        assert_eq!(Recorded::decode(&recorded.encode().unwrap()).unwrap(), recorded);
    }

    #[test]
    fn version_2_reads_without_a_bill() {
        let mut recorded = Recorded::new(8_192);
        recorded.pending = Some("{}".into());
        let mut bytes = MAGIC.to_vec();
        bytes.push(VERSION_2);
        let bytes = postcard::to_extend(&recorded, bytes).unwrap();
        let bytes = postcard::to_extend(&recorded.pending, bytes).unwrap();
        let back = Recorded::decode(&bytes).unwrap();
        assert_eq!((back.pending.as_deref(), back.bill), (Some("{}"), Bill::default()));
    }

    #[test]
    fn version_1_reads_without_a_waiting_answer() {
        let mut recorded = Recorded::new(8_192);
        recorded.push(entry(&[1]));
        let mut bytes = MAGIC.to_vec();
        bytes.push(VERSION_1);
        let bytes = postcard::to_extend(&recorded, bytes).unwrap();
        let back = Recorded::decode(&bytes).unwrap();
        assert_eq!((back.entries.len(), back.pending), (1, None));
    }

    #[test]
    fn other_bytes_are_refused_not_read_as_empty() {
        let bytes = Recorded::new(1).encode().unwrap();
        assert!(Recorded::decode(b"").unwrap_err().contains("magic"));
        assert!(Recorded::decode(b"CWPX").unwrap_err().contains("cut short"));
        let mut newer = bytes.clone();
        newer[4] = 4;
        assert!(Recorded::decode(&newer).unwrap_err().contains("version 4"));
        assert!(Recorded::decode(&bytes[..bytes.len() - 1]).unwrap_err().contains("decode"));
    }
}
