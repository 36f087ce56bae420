//! Stable hashes and canonical JSON: fingerprints that survive restarts and re-serialization.
//!
//! The one home of 64-bit FNV-1a in ctxwin-std: message fingerprints, conversation keys and
//! anything else that must hash the same in every build and on every machine (unlike `std`'s
//! `DefaultHasher`, whose seed and algorithm may change); and of [`raw_hash`], the hash of a
//! message's raw bytes, read a word at a time because every request hashes all of them. Neither
//! is a cryptographic hash nor a checksum against deliberate tampering.
//!
//! A message's *fingerprint* hashes what it means, not how it was serialized: its role
//! (`developer` counts as `system`) and a list of normalized blocks (text, tool calls with
//! canonical arguments, tool-result ids, opaque blocks as canonical JSON), so that a client
//! library's echo of an answer, with other key order, spacing, `null` members or moved
//! `cache_control` marks, has the fingerprint of the answer itself.
//!
//! ```
//! use ctxwin_std::format::fingerprint::{canonical, hash_str};
//! let a: serde_json::Value = serde_json::from_str(r#"{"b": 1, "a": null, "cache_control": {}}"#)?;
//! let b: serde_json::Value = serde_json::from_str(r#"{"b":1}"#)?;
//! assert_eq!(hash_str(&canonical(&a)), hash_str(&canonical(&b)));
//! # Ok::<(), serde_json::Error>(())
//! ```

use serde_json::Value;

/// FNV-1a's 64-bit offset basis: the seed to start a hash with.
///
/// ```
/// use ctxwin_std::format::fingerprint::{fnv1a, FNV_SEED};
/// assert_eq!(fnv1a(FNV_SEED, b""), FNV_SEED);
/// ```
pub const FNV_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a's 64-bit prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a of `bytes`, continuing from `seed` ([`FNV_SEED`] to start), so a hash can be
/// fed in pieces.
///
/// ```
/// use ctxwin_std::format::fingerprint::{fnv1a, FNV_SEED};
/// let whole = fnv1a(FNV_SEED, b"hello world");
/// assert_eq!(fnv1a(fnv1a(FNV_SEED, b"hello "), b"world"), whole);
/// ```
pub fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME))
}

/// 64-bit FNV-1a of `text`.
///
/// ```
/// assert_eq!(ctxwin_std::format::fingerprint::hash_str("a"), 0xaf63_dc4c_8601_ec8c);
/// ```
pub fn hash_str(text: &str) -> u64 {
    fnv1a(FNV_SEED, text.as_bytes())
}

/// A stable 64-bit hash of `bytes`, 8 bytes at a time (a folded 64×64→128-bit multiply per
/// word, the mix of wyhash and foldhash): what tells a message sent with the same bytes as
/// last time without reading it. Byte-wise FNV-1a costs about 4 cycles a byte, ~3 ms for a
/// 2 MB request on every request; this is several times cheaper, and the same on every
/// machine and in every build (little-endian words, constants fixed here).
///
/// ```
/// use ctxwin_std::format::fingerprint::raw_hash;
/// assert_eq!(raw_hash(b"hello world"), raw_hash(b"hello world"));
/// assert_ne!(raw_hash(b"hello world"), raw_hash(b"hello worle"));
/// // The length is hashed: trailing zero bytes make another hash.
/// assert_ne!(raw_hash(b"a"), raw_hash(b"a\0"));
/// ```
pub fn raw_hash(bytes: &[u8]) -> u64 {
    const SEED: u64 = 0x243f_6a88_85a3_08d3;
    const MUL: u64 = 0x9e37_79b9_7f4a_7c15;
    let fold = |state: u64, word: u64| {
        let product = u128::from(state ^ word) * u128::from(MUL);
        (product as u64) ^ ((product >> 64) as u64)
    };
    let mut state = SEED ^ (bytes.len() as u64);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        state = fold(state, u64::from_le_bytes(<[u8; 8]>::try_from(word).unwrap_or_default()));
    }
    let mut tail = [0u8; 8];
    for (slot, byte) in tail.iter_mut().zip(words.remainder()) {
        *slot = *byte;
    }
    state = fold(state, u64::from_le_bytes(tail));
    fold(state, SEED)
}

/// `value` as canonical JSON: object keys sorted, `null` members and `cache_control` marks
/// dropped (clients move their cache breakpoints from turn to turn; the message stays the same).
///
/// ```
/// use ctxwin_std::format::fingerprint::canonical;
/// let value = serde_json::json!({"b": 1, "a": {"y": null, "x": [1, 2]}});
/// assert_eq!(canonical(&value), r#"{"a":{"x":[1,2]},"b":1}"#);
/// ```
pub fn canonical(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map
                .iter()
                .filter(|(key, value)| !value.is_null() && key.as_str() != "cache_control")
                .collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Straight into the buffer: a tool result's text is escaped once, not copied.
                let _ = serde_json::to_writer(&mut *out, key);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// A JSON text as canonical JSON when it parses, else the text itself (tool-call arguments a
/// model produced are usually JSON, but need not be).
///
/// ```
/// use ctxwin_std::format::fingerprint::canonical_text;
/// assert_eq!(canonical_text("{\"q\": 2, \"p\": 1}"), r#"{"p":1,"q":2}"#);
/// assert_eq!(canonical_text("not json"), "not json");
/// ```
pub fn canonical_text(text: &str) -> String {
    serde_json::from_str::<Value>(text).map_or_else(|_| text.to_string(), |v| canonical(&v))
}

/// The normalized blocks of one message, in order, from which its fingerprint is hashed.
///
/// ```
/// use ctxwin_std::format::fingerprint::Normalized;
/// let mut a = Normalized::default();
/// a.text("hi");
/// a.call("c1", "ls", r#"{"dir": "."}"#);
/// let mut b = Normalized::default();
/// b.text("hi");
/// b.call("c1", "ls", r#"{"dir":"."}"#);
/// assert_eq!(a.clone().fingerprint("assistant"), b.clone().fingerprint("assistant"));
/// assert_ne!(a.fingerprint("assistant"), b.fingerprint("user"));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Normalized {
    blocks: Vec<Value>,
}

impl Normalized {
    /// A text block.
    pub fn text(&mut self, text: &str) {
        self.blocks.push(Value::Array(vec![Value::from("t"), Value::from(text)]));
    }

    /// A tool call, its arguments canonical when they are JSON.
    pub fn call(&mut self, id: &str, name: &str, arguments: &str) {
        self.blocks.push(Value::Array(vec![
            Value::from("c"),
            Value::from(id),
            Value::from(name),
            Value::from(canonical_text(arguments)),
        ]));
    }

    /// The id of the call a tool message answers.
    pub fn result_id(&mut self, id: &str) {
        self.blocks.push(Value::Array(vec![Value::from("i"), Value::from(id)]));
    }

    /// A whole tool-result block (Anthropic), canonical.
    pub fn result_block(&mut self, block: &Value) {
        self.blocks.push(Value::Array(vec![Value::from("r"), Value::from(canonical(block))]));
    }

    /// A block the format does not interpret, canonical.
    pub fn opaque(&mut self, block: &Value) {
        self.blocks.push(Value::Array(vec![Value::from("o"), Value::from(canonical(block))]));
    }

    /// The fingerprint of a message of `role` (`developer` hashes as `system`) with these
    /// blocks (taken, not copied).
    pub fn fingerprint(self, role: &str) -> u64 {
        self.fingerprint_and_form(role).0
    }

    /// [`fingerprint`](Self::fingerprint) and the canonical form it hashes (what a
    /// conversation's full-width content key is computed from).
    pub fn fingerprint_and_form(self, role: &str) -> (u64, String) {
        let role = if role == "developer" { "system" } else { role };
        let all = Value::Array(vec![Value::from(role), Value::Array(self.blocks)]);
        let form = canonical(&all);
        (hash_str(&form), form)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_sorts_and_drops_marks() {
        let a: Value = serde_json::from_str(
            r#"{"b":1,"a":{"y":null,"x":[1,2]},"cache_control":{"type":"ephemeral"}}"#,
        )
        .unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":[1,2]},"b":1}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(canonical(&a), r#"{"a":{"x":[1,2]},"b":1}"#);
        assert_eq!(canonical_text("{\"q\": 2, \"p\": 1}"), r#"{"p":1,"q":2}"#);
        assert_eq!(canonical_text("not json"), "not json");
    }

    /// Keys and leaves are written as serde_json writes them (fingerprints are stored: a
    /// changed byte would make every stored conversation look edited).
    #[test]
    fn canonical_writes_strings_and_numbers_as_serde_json_does() {
        let text = "tab\t quote\" back\\slash \u{1} é 💡 </script> \u{2028}";
        let leaves = [
            Value::from(text),
            Value::from(1.5),
            Value::from(-0.0),
            Value::from(1e300),
            Value::from(u64::MAX),
            Value::from(i64::MIN),
            Value::from(true),
        ];
        for leaf in &leaves {
            assert_eq!(canonical(leaf), leaf.to_string());
            let object = serde_json::json!({ "a": leaf.clone(), text: [leaf.clone()] });
            let expected =
                format!("{{{}:{leaf},{}:[{leaf}]}}", Value::from("a"), Value::from(text));
            assert_eq!(canonical(&object), expected);
        }
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(hash_str(""), FNV_SEED);
        assert_eq!(hash_str("a"), 0xaf63_dc4c_8601_ec8c);
        // The published FNV-1a 64 test vector.
        assert_eq!(hash_str("foobar"), 0x8594_4171_f739_67e8);
    }

    /// Fingerprints are stored (in the proxy's checkpoints): these values must never
    /// change, or stored conversations stop matching their clients' histories.
    #[test]
    fn fingerprints_are_the_stored_ones() {
        let mut blocks = Normalized::default();
        blocks.text("hi");
        assert_eq!(blocks.clone().fingerprint("user"), hash_str(r#"["user",[["t","hi"]]]"#));
        blocks.call("c", "f", "{\"b\": 1, \"a\": 2}");
        blocks.result_id("c");
        assert_eq!(
            blocks.fingerprint("developer"),
            hash_str(r#"["system",[["t","hi"],["c","c","f","{\"a\":2,\"b\":1}"],["i","c"]]]"#)
        );
    }
}
