//! Where a conversation lives under the state directory.

use std::path::{Path, PathBuf};

use crate::hash::{digest_hex, is_hex_name};

/// The directory of conversation `key` under `state_dir`: `<tenant>/<conversation>` for a key
/// [`crate::keys`] built, else one named by a hash of the key (no name from a key reaches a
/// path as it is).
///
/// ```
/// use std::path::Path;
/// let key = format!("{}.{}", "a".repeat(64), "b".repeat(64));
/// let dir = ctxwin_proxy::conv::conv_dir(Path::new("s"), &key);
/// assert_eq!(dir, Path::new("s").join("a".repeat(64)).join("b".repeat(64)));
/// let other = ctxwin_proxy::conv::conv_dir(Path::new("s"), "../x");
/// assert!(other.starts_with("s") && other.file_name().unwrap().len() == 64);
/// ```
pub fn conv_dir(state_dir: &Path, key: &str) -> PathBuf {
    match key.split_once('.') {
        Some((tenant, conversation)) if is_tenant_key(key) => {
            state_dir.join(tenant).join(conversation)
        }
        _ => state_dir.join(digest_hex(&[b"ctxwin directory v1", key.as_bytes()])),
    }
}

/// Whether `key` is `<tenant>.<conversation>`, as [`crate::keys`] builds them (a key stored
/// before tenants is not).
pub fn is_tenant_key(key: &str) -> bool {
    key.split_once('.')
        .is_some_and(|(tenant, conversation)| is_hex_name(tenant) && is_hex_name(conversation))
}

/// The session name and checkpoint directory of generation `generation` of conversation `key`
/// (whose directory is `dir`): the key and `checkpoints/`, or `key#N` and `checkpoints-N/`
/// for a later generation.
pub(super) fn generation(key: &str, dir: &Path, generation: u32) -> (String, PathBuf) {
    if generation == 0 {
        (key.to_string(), dir.join("checkpoints"))
    } else {
        (format!("{key}#{generation}"), dir.join(format!("checkpoints-{generation}")))
    }
}
