//! Stable hashes: FNV-1a and canonical JSON from [`ctxwin_std::format::fingerprint`] (their one
//! home: conversation keys and tool-definition fingerprints hash as message fingerprints do),
//! and full-width keyed hashes for the names of tenants and conversations.

use std::path::Path;

use ring::hmac;

pub use ctxwin_std::format::fingerprint::{FNV_SEED, canonical, canonical_text, fnv1a, hash_str};

/// The file under the state directory holding the key of [`KeyedHash`].
pub const SECRET_FILE: &str = "tenant.key";

/// HMAC-SHA-256 under the state directory's secret: tenant and conversation names that are
/// full width (256 bits, 64 hex digits), that nobody without the secret can compute from a
/// credential or a session id, and that stay the same across restarts.
///
/// ```
/// use ctxwin_proxy::hash::KeyedHash;
/// let key = KeyedHash::new(&[7; 32]);
/// let name = key.hex(&[b"tenant", b"Bearer sk-1"]);
/// assert_eq!(name.len(), 64);
/// assert_eq!(name, key.hex(&[b"tenant", b"Bearer sk-1"]));
/// // Fields are length-prefixed: moving a byte from one to the next is another name.
/// assert_ne!(name, key.hex(&[b"tenan", b"tBearer sk-1"]));
/// assert_ne!(name, KeyedHash::new(&[8; 32]).hex(&[b"tenant", b"Bearer sk-1"]));
/// ```
#[derive(Clone)]
pub struct KeyedHash(hmac::Key);

impl std::fmt::Debug for KeyedHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyedHash(..)")
    }
}

impl KeyedHash {
    /// A keyed hash with `secret` as its key.
    pub fn new(secret: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    /// The keyed hash of the state directory `dir`: its secret ([`SECRET_FILE`], 32 bytes
    /// from the operating system's random generator) is created on first use, owner-only, by
    /// [`ctxwin_std::statefs::secret_file`].
    ///
    /// # Errors
    /// When the secret cannot be read or created (a damaged one is reported, never replaced:
    /// every name it keyed would be lost).
    pub fn for_state_dir(dir: &Path) -> Result<Self, ctxwin_std::statefs::StateFsError> {
        let secret = ctxwin_std::statefs::secret_file(&dir.join(SECRET_FILE), 32, |bytes| {
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), bytes)
                .map_err(|_| std::io::Error::other("the system's random generator failed"))
        })?;
        Ok(Self::new(&secret))
    }

    /// The hash of `fields` (each prefixed with its length, so no two lists of fields hash
    /// alike by concatenation), as 64 lower-case hex digits.
    pub fn hex(&self, fields: &[&[u8]]) -> String {
        let mut context = hmac::Context::with_key(&self.0);
        for field in fields {
            context.update(&(field.len() as u64).to_le_bytes());
            context.update(field);
        }
        hex(context.sign().as_ref())
    }
}

/// SHA-256 of `fields` (length-prefixed as in [`KeyedHash::hex`]), as 64 hex digits: names
/// derived from names that are secret-keyed already.
pub fn digest_hex(fields: &[&[u8]]) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for field in fields {
        context.update(&(field.len() as u64).to_le_bytes());
        context.update(field);
    }
    hex(context.finish().as_ref())
}

/// Whether `text` is a name [`KeyedHash::hex`] or [`digest_hex`] writes.
pub fn is_hex_name(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]])
        .map(char::from)
        .collect()
}
