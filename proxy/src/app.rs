//! The running proxy's shared state: settings, counters, the upstream client, the stores every
//! conversation shares, and the registry of conversations (one lock each, loaded on demand,
//! unloaded under the resident cap, checkpointed when idle and at shutdown).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::StatusCode;
use ctxwin_std::store::Deferred;
use ctxwin_std::store::sqlite::SqliteArchive;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::bills::Bills;
use crate::config::ProxyConfig;
use crate::conv::{
    Conv, ConvError, ConvSettings, Stores, is_tenant_key, open_stores, persisted_keys,
};
use crate::errors::Failure;
use crate::hash::KeyedHash;
use crate::metrics::Metrics;
use crate::parsed::Parsed;
use crate::pool::Pool;
use crate::upstream;
use crate::wire::Provider;

/// A locked conversation: `None` while it is not loaded.
pub type Guard = OwnedMutexGuard<Option<Conv>>;

/// A conversation's place in the registry: one lock each.
#[derive(Debug, Default)]
struct Slot {
    conv: Arc<AsyncMutex<Option<Conv>>>,
    last_used: AtomicU64,
    /// Loaded or created since the proxy started: it may have stored something since.
    loaded_once: AtomicBool,
}

/// Shared state of a running proxy.
#[derive(Debug)]
pub struct App {
    /// The settings.
    pub config: ProxyConfig,
    /// The counters.
    pub metrics: Metrics,
    /// Each conversation's bill after its latest answer.
    pub bills: Bills,
    /// The upstream's HTTP client.
    pub client: reqwest::Client,
    /// Names tenants and conversations ([`crate::keys`]).
    pub keys: KeyedHash,
    /// The blocking pool session work runs on.
    pub pool: Pool,
    /// The requests parsed last: a conversation's next one reads only what it adds.
    pub parsed: Parsed,
    stores: Stores,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// The slots whose conversation is in memory (or being loaded): what the cap chooses
    /// from, so making room costs the resident count, not every conversation ever seen.
    resident: Mutex<HashMap<String, Arc<Slot>>>,
    /// The conversations with something stored when the proxy started
    /// ([`persisted_keys`]); any other one not loaded since is new.
    persisted: HashSet<String>,
    clock: AtomicU64,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl App {
    /// Whether the conversations are a fleet's, on a shared PostgreSQL.
    pub fn is_fleet(&self) -> bool {
        self.stores.is_fleet()
    }

    /// The archive's writer thread on a state directory (`None` in a fleet, whose rows are
    /// written on the request path).
    pub fn archive_writer(&self) -> Option<&Deferred<SqliteArchive>> {
        self.stores.local().map(|local| local.writer.as_ref())
    }

    /// A proxy with `config`.
    ///
    /// # Errors
    /// When the state directory or the HTTP client cannot be set up.
    pub fn new(config: ProxyConfig) -> Result<Arc<Self>, String> {
        let state = |e: &dyn std::fmt::Display| {
            format!("state directory {}: {e}", config.state_dir.display())
        };
        let (stores, keys) = open_stores(&config)?;
        let persisted = persisted_keys(&stores).map_err(|e| state(&e))?;
        let untenanted = persisted.iter().filter(|key| !is_tenant_key(key)).count();
        if untenanted > 0 {
            tracing::warn!(
                conversations = untenanted,
                "proxy: conversations stored before tenants are kept but not continued (their keys name no tenant); clients start new ones"
            );
        }
        let client = upstream::client(&config)?;
        let parsed = Parsed::new(config.parse_cache_bytes);
        Ok(Arc::new(Self {
            config,
            metrics: Metrics::default(),
            bills: Bills::default(),
            client,
            keys,
            pool: if stores.is_fleet() {
                Pool::new(crate::pool::fleet_workers())
            } else {
                Pool::default()
            },
            parsed,
            stores,
            slots: Mutex::default(),
            resident: Mutex::default(),
            persisted,
            clock: AtomicU64::new(0),
        }))
    }

    fn slot(&self, key: &str) -> Arc<Slot> {
        let mut slots = locked(&self.slots);
        let slot = slots.entry(key.to_string()).or_default().clone();
        slot.last_used.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        slot
    }

    /// Conversations known (resident or not).
    pub fn known_sessions(&self) -> usize {
        locked(&self.slots).len()
    }

    /// Locks conversation `key`, loading it if it is not resident (a conversation with
    /// nothing stored is created in memory; `model` names its window).
    ///
    /// # Errors
    /// When the conversation cannot be loaded or created.
    pub async fn lock(
        self: &Arc<Self>,
        key: &str,
        provider: Provider,
        model: &str,
    ) -> Result<Guard, Failure> {
        let slot = self.slot(key);
        let mut guard = slot.conv.clone().lock_owned().await;
        if guard.is_some() {
            return Ok(guard);
        }
        // Counted as resident from now: the cap makes room before the load, not after the
        // answer (only more conversations in flight at once than the cap can pass it).
        self.metrics.resident.fetch_add(1, Relaxed);
        self.enforce_cap().await;
        let new = !self.stores.is_fleet()
            && !slot.loaded_once.load(Relaxed)
            && !self.persisted.contains(key);
        match self.load(key, provider, model, new).await {
            Ok(conv) => *guard = Some(conv),
            Err(failure) => {
                self.metrics.resident.fetch_sub(1, Relaxed);
                return Err(failure);
            }
        }
        slot.loaded_once.store(true, Relaxed);
        locked(&self.resident).insert(key.to_string(), slot.clone());
        self.metrics.loads.fetch_add(1, Relaxed);
        Ok(guard)
    }

    /// Creates conversation `key` (`new`: nothing to read, memory work done here) or opens it
    /// from its checkpoint on the blocking pool.
    async fn load(
        &self,
        key: &str,
        provider: Provider,
        model: &str,
        new: bool,
    ) -> Result<Conv, Failure> {
        let dir = self.config.state_dir.clone();
        let settings = ConvSettings::for_model(&self.config, model);
        if new {
            return Conv::create(&dir, &self.stores, key, provider, &settings)
                .map_err(|e| Failure::from(&e));
        }
        let (name, stores) = (key.to_string(), self.stores.clone());
        self.pool
            .run(move || Conv::open(&dir, &stores, &name, provider, &settings))
            .await
            .map_err(|e| {
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, format!("loading the session: {e}"))
            })?
            .map_err(|e: ConvError| Failure::from(&e))
    }

    /// Runs `work` on the locked conversation on the blocking pool; gives the lock back with
    /// the result.
    ///
    /// # Errors
    /// 500 when the task panicked (the conversation's lock is released).
    pub async fn on_pool<R: Send + 'static>(
        &self,
        mut guard: Guard,
        work: impl FnOnce(&mut Guard) -> Result<R, ConvError> + Send + 'static,
    ) -> Result<(Guard, Result<R, ConvError>), Failure> {
        self.pool
            .run(move || {
                let result = work(&mut guard);
                (guard, result)
            })
            .await
            .map_err(|e| {
                Failure::new(StatusCode::INTERNAL_SERVER_ERROR, format!("session task: {e}"))
            })
    }

    /// Checkpoints and unloads the least recently used idle conversations above the cap.
    pub async fn enforce_cap(self: &Arc<Self>) {
        let cap = self.config.max_resident as u64;
        if self.metrics.resident.load(Relaxed) <= cap {
            return;
        }
        let mut candidates: Vec<(u64, String, Arc<Slot>)> = locked(&self.resident)
            .iter()
            .map(|(k, s)| (s.last_used.load(Relaxed), k.clone(), s.clone()))
            .collect();
        candidates.sort_by_key(|(used, _, _)| *used);
        for (_, key, slot) in candidates {
            if self.metrics.resident.load(Relaxed) <= cap {
                break;
            }
            let Ok(mut guard) = slot.conv.clone().try_lock_owned() else { continue };
            let Some(mut conv) = guard.take() else { continue };
            locked(&self.resident).remove(&key);
            self.metrics.resident.fetch_sub(1, Relaxed);
            self.metrics.unloads.fetch_add(1, Relaxed);
            // The slot stays locked until the checkpoint is written: a request for it waits.
            let _ = self
                .pool
                .run(move || {
                    if let Err(error) = conv.checkpoint() {
                        tracing::error!(session = conv.key(), %error, "proxy: checkpoint before unload failed");
                    }
                    drop(conv);
                    drop(guard);
                })
                .await;
        }
    }

    /// Checkpoints the conversations idle for `idle` that changed since their last checkpoint
    /// (skipping busy ones).
    pub async fn checkpoint_idle(self: &Arc<Self>, idle: Duration) {
        let slots: Vec<Arc<Slot>> = locked(&self.slots).values().cloned().collect();
        for slot in slots {
            let Ok(guard) = slot.conv.clone().try_lock_owned() else { continue };
            let due = guard.as_ref().is_some_and(|c| c.is_dirty() && c.idle() >= idle);
            if due {
                self.checkpoint_locked(guard).await;
            }
        }
    }

    /// Checkpoints the locked conversation (if loaded) off the async threads; a failure is
    /// logged and leaves the conversation dirty for the next try.
    async fn checkpoint_locked(&self, mut guard: Guard) {
        let _ = self
            .pool
            .run(move || {
                if let Some(conv) = guard.as_mut()
                    && let Err(error) = conv.checkpoint()
                {
                    tracing::error!(session = conv.key(), %error, "proxy: checkpoint failed");
                }
            })
            .await;
    }

    /// Copies the archive's WAL into its database file on the blocking pool (outside the
    /// session-work permits), on a connection of its own: a commit of the connection the
    /// sessions share then has less to copy itself when the WAL passes 1,000 pages, and
    /// under light load none, so no request waits for the disk sync a copy ends with. A commit
    /// is durable against a crash of the process (the OS holds it), not of the machine until
    /// the next copy.
    pub async fn checkpoint_wal(&self) {
        let Stores::Local(local) = &self.stores else { return };
        let wal = local.wal.clone();
        match tokio::task::spawn_blocking(move || wal.checkpoint_wal()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "proxy: archive WAL checkpoint failed"),
            Err(error) => tracing::warn!(%error, "proxy: archive WAL checkpoint task failed"),
        }
    }

    /// Checkpoints every resident conversation (on shutdown).
    pub async fn checkpoint_all(self: &Arc<Self>) {
        let slots: Vec<Arc<Slot>> = locked(&self.slots).values().cloned().collect();
        for slot in slots {
            let guard = slot.conv.clone().lock_owned().await;
            self.checkpoint_locked(guard).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[proxy] parse_cache_mib` bounds the bodies the app keeps parsed: at 0 a
    /// conversation's next request is read whole, by default it continues the last one.
    #[test]
    fn the_parse_cache_holds_what_the_setting_says() {
        let first = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello."}]}"#;
        let next = br#"{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Bye."}]}"#;
        let reused = |toml: &str| {
            let dir = tempfile::tempdir().unwrap();
            let mut config =
                ProxyConfig { state_dir: dir.path().join("state"), ..ProxyConfig::default() };
            config.apply_toml(toml).unwrap();
            let app = App::new(config).unwrap();
            app.parsed.parse("t", Provider::OpenAi, first).unwrap();
            app.parsed.parse("t", Provider::OpenAi, next).unwrap().reused()
        };
        assert_eq!(reused(""), 1);
        assert_eq!(reused("[proxy]\nparse_cache_mib = 0"), 0);
    }
}
