//! Whose a request is: its tenant and its conversation within the tenant, named by full-width
//! keyed hashes ([`KeyedHash`], under the state directory's secret).
//!
//! * **Tenant.** The credential the client presents and the proxy forwards upstream: every
//!   `Authorization`, `x-api-key` and `api-key` value, byte for byte. An operator may name a
//!   header that says the tenant instead (`[proxy] tenant_header`); a request without it falls
//!   back to its credential. A request with neither belongs to the one anonymous tenant. The
//!   three sources are hashed apart: a header value never names the same tenant as a key.
//! * **Conversation.** The `x-ctxwin-session` value as opaque bytes, or without it the
//!   canonical form of the messages up to the first user message, hashed with the tenant.
//! * **Key.** `<tenant>.<conversation>`, 64 hex digits each: the session's name in the archive,
//!   and `<state_dir>/<tenant>/<conversation>/` on disk
//!   ([`crate::conv::conv_dir`]). A branch is `<tenant>.<hash of the parent key and index>`.
//!   No client byte reaches a key, a name or a path; a credential is never stored.

use axum::http::HeaderMap;

use crate::hash::{KeyedHash, digest_hex};
use crate::wire::{self, Provider, Request};

/// The header naming a conversation.
pub const SESSION_HEADER: &str = "x-ctxwin-session";

/// The headers carrying the credential a client presents (forwarded upstream as they are).
pub const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "x-api-key", "api-key"];

const TENANT: &[u8] = b"ctxwin tenant v1";
const CONVERSATION: &[u8] = b"ctxwin conversation v1";
const BRANCH: &[u8] = b"ctxwin branch v2";

/// The tenant of a request with `headers`: 64 hex digits. `tenant_header` names the header
/// that identifies tenants, when the operator set one.
///
/// ```
/// use axum::http::HeaderMap;
/// use ctxwin_proxy::hash::KeyedHash;
/// use ctxwin_proxy::keys::tenant;
/// let keys = KeyedHash::new(&[1; 32]);
/// let with = |pairs: &[(&'static str, &'static str)]| {
///     let mut headers = HeaderMap::new();
///     for (name, value) in pairs {
///         headers.insert(*name, value.parse().unwrap());
///     }
///     headers
/// };
/// let a = tenant(&keys, None, &with(&[("authorization", "Bearer sk-a")]));
/// let b = tenant(&keys, None, &with(&[("authorization", "Bearer sk-b")]));
/// let anonymous = tenant(&keys, None, &HeaderMap::new());
/// assert!(a != b && a != anonymous && a.len() == 64);
/// // With a tenant header, the header decides; without it, the key still does.
/// let team = with(&[("authorization", "Bearer sk-a"), ("x-team", "red")]);
/// assert_ne!(tenant(&keys, Some("x-team"), &team), a);
/// assert_eq!(tenant(&keys, Some("x-team"), &with(&[("authorization", "Bearer sk-a")])), a);
/// ```
pub fn tenant(keys: &KeyedHash, tenant_header: Option<&str>, headers: &HeaderMap) -> String {
    if let Some(name) = tenant_header
        && let Some(value) = headers.get(name).filter(|v| !v.is_empty())
    {
        return keys.hex(&[TENANT, b"header", name.as_bytes(), value.as_bytes()]);
    }
    let mut fields: Vec<&[u8]> = vec![TENANT, b"credential"];
    for name in CREDENTIAL_HEADERS {
        for value in headers.get_all(name).iter().filter(|v| !v.is_empty()) {
            fields.push(name.as_bytes());
            fields.push(value.as_bytes());
        }
    }
    if fields.len() == 2 {
        return keys.hex(&[TENANT, b"anonymous"]);
    }
    keys.hex(&fields)
}

/// The key of the conversation a request belongs to: `<tenant>.<conversation>`.
///
/// # Errors
/// [`wire::BadRequest`] when a message hashed for the content key does not read.
pub fn conversation_key(
    keys: &KeyedHash,
    tenant_header: Option<&str>,
    headers: &HeaderMap,
    request: &Request,
    provider: Provider,
) -> Result<String, wire::BadRequest> {
    let tenant = tenant(keys, tenant_header, headers);
    let conversation = match headers.get(SESSION_HEADER).filter(|v| !v.is_empty()) {
        Some(id) => keys.hex(&[CONVERSATION, tenant.as_bytes(), b"session", id.as_bytes()]),
        None => {
            let mut forms = Vec::new();
            for i in 0..request.items.len() {
                let message = wire::analyze_item(provider, request, i)?;
                let user = message.role == "user";
                forms.push(message.form);
                if user {
                    break;
                }
            }
            let mut fields: Vec<&[u8]> =
                vec![CONVERSATION, tenant.as_bytes(), b"content", provider.as_str().as_bytes()];
            fields.extend(forms.iter().map(String::as_bytes));
            keys.hex(&fields)
        }
    };
    Ok(format!("{tenant}.{conversation}"))
}

/// A branch's key: the parent's tenant, and a hash of the parent's key, the index `at` where
/// the history leaves it and what it has there: `next`, the fingerprint of its message at
/// that index ([`wire::Analyzed::fp`]), or `None` when the history ends there (a rewind).
/// Branches are found by content: a resend of the same edit or of the same shorter history
/// goes to the branch it made before, and each other edit at that index to its own, one hop
/// from the parent. A history that also leaves the branch goes on to the branch's own
/// branches, at a later index each time: a request follows at most one hop per place its
/// history was edited, however often it is sent.
///
/// ```
/// let parent = format!("{}.{}", "a".repeat(64), "b".repeat(64));
/// let branch = ctxwin_proxy::keys::branch_key(&parent, 3, Some(7));
/// assert!(branch.starts_with(&format!("{}.", "a".repeat(64))));
/// assert_eq!(branch.len(), parent.len());
/// assert_eq!(branch, ctxwin_proxy::keys::branch_key(&parent, 3, Some(7)));
/// assert_ne!(branch, ctxwin_proxy::keys::branch_key(&parent, 3, Some(8)));
/// assert_ne!(branch, ctxwin_proxy::keys::branch_key(&parent, 3, None));
/// assert_ne!(branch, ctxwin_proxy::keys::branch_key(&parent, 4, Some(7)));
/// ```
pub fn branch_key(parent: &str, at: usize, next: Option<u64>) -> String {
    let tenant = parent.split_once('.').map_or("", |(tenant, _)| tenant);
    let at = u64::try_from(at).unwrap_or(u64::MAX).to_le_bytes();
    let next = match next {
        Some(fp) => [&[1u8][..], &fp.to_le_bytes()].concat(),
        None => vec![0],
    };
    format!("{tenant}.{}", digest_hex(&[BRANCH, parent.as_bytes(), &at, &next]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::is_hex_name;
    use serde_json::json;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                axum::http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
    }

    fn request(first: &str) -> Request {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": first},
            {"role": "assistant", "content": "Later turns do not name the conversation."},
        ]})
        .to_string();
        Request::parse(Provider::OpenAi, body.as_bytes()).unwrap()
    }

    #[test]
    fn every_credential_header_and_every_byte_of_a_session_id_counts() {
        let keys = KeyedHash::new(&[9; 32]);
        let key = |pairs: &[(&str, &[u8])]| {
            conversation_key(&keys, None, &headers(pairs), &request("hi"), Provider::OpenAi)
                .unwrap()
        };
        let tenants: Vec<String> = [
            key(&[]),
            key(&[("authorization", b"Bearer k1")]),
            key(&[("authorization", b"Bearer k2")]),
            key(&[("x-api-key", b"Bearer k1")]),
            key(&[("api-key", b"Bearer k1")]),
            key(&[("authorization", b"Bearer k1"), ("x-api-key", b"k3")]),
        ]
        .into_iter()
        .map(|k| k.split_once('.').unwrap().0.to_string())
        .collect();
        for (i, a) in tenants.iter().enumerate() {
            assert!(is_hex_name(a));
            assert!(tenants[i + 1..].iter().all(|b| b != a), "{i}: {tenants:?}");
        }
        let ids: [&[u8]; 5] =
            ["会话-A".as_bytes(), "会话-B".as_bytes(), b"agent/7", b"agent:7", b"agent 7"];
        let convs: Vec<String> = ids.iter().map(|id| key(&[("x-ctxwin-session", id)])).collect();
        for (i, a) in convs.iter().enumerate() {
            let (tenant, conv) = a.split_once('.').unwrap();
            assert!(is_hex_name(tenant) && is_hex_name(conv), "{a}");
            assert!(convs[i + 1..].iter().all(|b| b != a), "{i}: {convs:?}");
        }
        // The same session id under another credential is another conversation.
        assert_ne!(
            key(&[("x-ctxwin-session", b"agent/7")]),
            key(&[("x-ctxwin-session", b"agent/7"), ("authorization", b"Bearer k1")])
        );
    }

    #[test]
    fn the_content_key_is_the_opening_within_the_tenant() {
        let keys = KeyedHash::new(&[9; 32]);
        let none = HeaderMap::new();
        let key = |request: &Request, headers: &HeaderMap| {
            conversation_key(&keys, None, headers, request, Provider::OpenAi).unwrap()
        };
        assert_eq!(key(&request("hi"), &none), key(&request("hi"), &none));
        assert_ne!(key(&request("hi"), &none), key(&request("hello"), &none));
        let other = headers(&[("authorization", b"Bearer k1")]);
        assert_ne!(key(&request("hi"), &none), key(&request("hi"), &other));
        // The canonical form: a moved cache mark or a block list for a string is the same.
        let blocks = json!({"model": "m", "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
        ]})
        .to_string();
        let blocks = Request::parse(Provider::OpenAi, blocks.as_bytes()).unwrap();
        assert_eq!(key(&blocks, &none), key(&request("hi"), &none));
    }

    #[test]
    fn a_branch_stays_in_its_tenant_and_its_name_does_not_grow() {
        let parent = format!("{}.{}", "c".repeat(64), "d".repeat(64));
        let mut key = parent.clone();
        for at in 0..100 {
            key = branch_key(&key, at, Some(at as u64));
            let (tenant, conv) = key.split_once('.').unwrap();
            assert_eq!(tenant, "c".repeat(64));
            assert!(is_hex_name(conv));
        }
        assert_eq!(key.len(), parent.len());
    }
}
