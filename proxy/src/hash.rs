//! Stable hashes and canonical JSON, from [`ctxwin_std::format::fingerprint`] (the one home of
//! FNV-1a): conversation keys and tool-definition fingerprints hash as message fingerprints do.

pub use ctxwin_std::format::fingerprint::{FNV_SEED, canonical, canonical_text, fnv1a, hash_str};
