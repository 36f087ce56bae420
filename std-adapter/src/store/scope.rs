//! [`Scope`] (whose rows these are) and [`Fence`] (whether this writer still holds them).

use std::fmt;

/// Who a row, summary, vector or checkpoint belongs to: a tenant and one of its
/// conversations. Every call of a port takes one, and adapters put it INTO the query or key
/// (never filter what another scope stored afterwards). Tenant `""` is the local tenant (the
/// command line, a library user).
///
/// ```
/// use ctxwin_std::store::Scope;
/// let local = Scope::local("main");
/// assert_eq!((local.tenant.as_str(), local.conversation.as_str()), ("", "main"));
/// assert_eq!(local.to_string(), "main");
/// let acme = Scope::new("acme", "main");
/// assert_ne!(acme, local);
/// assert_eq!(acme.to_string(), "acme/main");
/// assert_eq!(acme.sibling("main@rewound-1"), Scope::new("acme", "main@rewound-1"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Scope {
    /// The tenant (`""` for the local one).
    pub tenant: String,
    /// The conversation (a session's name).
    pub conversation: String,
}

impl Scope {
    /// Conversation `conversation` of tenant `tenant`.
    pub fn new(tenant: impl Into<String>, conversation: impl Into<String>) -> Self {
        Self { tenant: tenant.into(), conversation: conversation.into() }
    }

    /// Conversation `conversation` of the local tenant (`""`).
    pub fn local(conversation: impl Into<String>) -> Self {
        Self::new("", conversation)
    }

    /// Another conversation of the same tenant (a side conversation: rows a restore set
    /// aside, a recovery's copy).
    #[must_use]
    pub fn sibling(&self, conversation: impl Into<String>) -> Self {
        Self::new(self.tenant.clone(), conversation)
    }
}

impl fmt::Display for Scope {
    /// `conversation` for the local tenant, `tenant/conversation` otherwise.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tenant.is_empty() {
            f.write_str(&self.conversation)
        } else {
            write!(f, "{}/{}", self.tenant, self.conversation)
        }
    }
}

/// A fencing token for one conversation: adapters with leases (a database many processes
/// write) hand out a newer fence with every [`acquire`](super::ArchiveStore::acquire) and
/// refuse, inside the write's own transaction, a write whose fence is older than the newest
/// handed out ([`StoreError::Fenced`](super::StoreError::Fenced)): a process that lost its
/// lease (paused, partitioned) cannot overwrite what the new holder wrote. Adapters without
/// leases (SQLite in one process, a directory) accept any fence. [`Fence::NONE`] is unfenced.
///
/// ```
/// use ctxwin_std::store::Fence;
/// assert!(Fence::NONE < Fence(1));
/// assert!(Fence::NONE.is_none());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

impl Fence {
    /// No fence: written without a lease.
    pub const NONE: Fence = Fence(0);

    /// Whether this is [`Fence::NONE`].
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }
}
