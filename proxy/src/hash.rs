//! Stable hashes and canonical JSON: fingerprints that survive restarts and re-serialization.

use serde_json::Value;

/// 64-bit FNV-1a of `bytes`, continuing from `seed` (use [`FNV_SEED`] to start).
pub fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(seed, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// FNV-1a's offset basis.
pub const FNV_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a of `text`.
pub fn hash_str(text: &str) -> u64 {
    fnv1a(FNV_SEED, text.as_bytes())
}

/// `value` as canonical JSON: object keys sorted, `null` members and `cache_control` marks
/// dropped (clients move their cache breakpoints from turn to turn; the message stays the same).
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map
                .iter()
                .filter(|(key, value)| !value.is_null() && key.as_str() != "cache_control")
                .map(|(key, _)| key)
                .collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A JSON text as canonical JSON when it parses, else the text itself (tool-call arguments a
/// model produced are usually JSON, but need not be).
pub fn canonical_text(text: &str) -> String {
    serde_json::from_str::<Value>(text).map_or_else(|_| text.to_string(), |v| canonical(&v))
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

    #[test]
    fn fnv_is_stable() {
        assert_eq!(hash_str(""), FNV_SEED);
        assert_eq!(hash_str("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
