//! The blocking pool that session work runs on: how many tasks at once, and the permits that
//! hold them to it.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinError;

/// Session tasks run at once: twice the cores (at least 2).
///
/// ```
/// assert!(ctxwin_proxy::pool::workers() >= 2);
/// ```
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).saturating_mul(2).max(2)
}

/// Runs session work (SQLite, the core) on tokio's blocking pool, at most [`workers`] tasks
/// at once: the archive takes one writer at a time and the machine has few cores, so more
/// threads would only wait, each with its stack, and switch.
#[derive(Debug)]
pub struct Pool {
    permits: Arc<Semaphore>,
}

impl Default for Pool {
    fn default() -> Self {
        Self::new(workers())
    }
}

/// Session tasks a fleet's instance runs at once, each with a connection to the database:
/// as many as [`workers`]. More would mostly wait: on a small machine the database shares
/// the cores, and each connection is a server process of its own, with caches to warm
/// (measured on 2 cores with three instances: 16 tasks and connections each cost
/// PostgreSQL about 45% more CPU per request than 4, for fewer requests per second).
///
/// ```
/// assert_eq!(ctxwin_proxy::pool::fleet_workers(), ctxwin_proxy::pool::workers());
/// ```
pub fn fleet_workers() -> usize {
    workers()
}

impl Pool {
    /// A pool running at most `permits` tasks at once (at least 1).
    pub fn new(permits: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(permits.max(1))) }
    }

    /// Runs `work` on the blocking pool once a permit is free. The permit goes with the task:
    /// it is held until the work ends even if the caller is dropped meanwhile.
    ///
    /// # Errors
    /// When the task panicked.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let pool = ctxwin_proxy::pool::Pool::default();
    /// assert_eq!(pool.run(|| 6 * 7).await.unwrap(), 42);
    /// # });
    /// ```
    pub async fn run<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, JoinError> {
        let permit = self.permits.clone().acquire_owned().await.ok();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
    }
}
