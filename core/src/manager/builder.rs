//! The one way to build a manager with a counter or strategy of your own.

use core::marker::PhantomData;

use super::{ContextManager, check_strategy};
use crate::capacity::Capacities;
use crate::config::{Config, ConfigError};
use crate::counter::TokenCounter;
use crate::estimator::Estimator;
use crate::strategy::{Builtin, Strategy};

/// Builds a [`ContextManager`] with a token counter or a strategy of your own (a summarizer or
/// extractor of your own goes into a [`Builtin`] strategy); from [`ContextManager::builder`].
/// Without them, [`ContextManager::new`] and [`ContextManager::with_config`] are enough.
///
/// ```
/// use ctxwin_core::{Config, ContextManager, Error, StrategyKind, TinyCapacities};
/// use ctxwin_core::strategy::SlidingWindow;
/// let manager = ContextManager::<TinyCapacities>::builder().strategy(SlidingWindow::new()).build()?;
/// assert_eq!(manager.config().strategy, StrategyKind::SlidingWindow);
///
/// // A strategy never ignores the configuration silently.
/// let summarizing = Config { strategy: StrategyKind::Summarization, ..Config::DEFAULT };
/// let refused = ContextManager::<TinyCapacities>::builder()
///     .config(summarizing)
///     .strategy(SlidingWindow::new())
///     .build();
/// assert!(refused.is_err());
/// # Ok::<(), ctxwin_core::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build`"]
pub struct Builder<C: Capacities, K: TokenCounter = Estimator, S: Strategy = Builtin> {
    config: Config,
    counter: K,
    strategy: S,
    capacities: PhantomData<C>,
}

impl<C: Capacities> Builder<C, Estimator, Builtin> {
    pub(super) const fn new() -> Self {
        Builder {
            config: Config::DEFAULT,
            counter: Estimator::new(),
            strategy: Builtin::new(),
            capacities: PhantomData,
        }
    }
}

impl<C: Capacities, K: TokenCounter, S: Strategy> Builder<C, K, S> {
    /// The configuration ([`Config::DEFAULT`] otherwise).
    ///
    /// ```
    /// use ctxwin_core::{Config, ContextManager, TinyCapacities};
    /// let config = Config { locked_tail: 2, ..Config::DEFAULT };
    /// let manager = ContextManager::<TinyCapacities>::builder().config(config).build()?;
    /// assert_eq!(manager.config().locked_tail, 2);
    /// # Ok::<(), ctxwin_core::ConfigError>(())
    /// ```
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The token counter (the no-tokenizer [`Estimator`] otherwise).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, TinyCapacities};
    /// use ctxwin_core::counter::TokenCounter;
    /// struct Bytes;
    /// impl TokenCounter for Bytes {
    ///     fn count(&self, text: &str) -> u32 { text.len() as u32 }
    /// }
    /// let manager = ContextManager::<TinyCapacities>::builder().counter(Bytes).build()?;
    /// assert_eq!(manager.counter().count("four"), 4);
    /// # Ok::<(), ctxwin_core::ConfigError>(())
    /// ```
    pub fn counter<K2: TokenCounter>(self, counter: K2) -> Builder<C, K2, S> {
        Builder { config: self.config, counter, strategy: self.strategy, capacities: PhantomData }
    }

    /// The strategy ([`Builtin`], which runs [`Config::strategy`], otherwise).
    ///
    /// ```
    /// use ctxwin_core::{ContextManager, TinyCapacities};
    /// use ctxwin_core::strategy::SlidingWindow;
    /// let manager = ContextManager::<TinyCapacities>::builder().strategy(SlidingWindow::new()).build()?;
    /// # let _ = manager;
    /// # Ok::<(), ctxwin_core::ConfigError>(())
    /// ```
    pub fn strategy<S2: Strategy>(self, strategy: S2) -> Builder<C, K, S2> {
        Builder { config: self.config, counter: self.counter, strategy, capacities: PhantomData }
    }

    /// The empty manager; refuses an invalid configuration, or one whose `strategy` the
    /// strategy does not run ([`ConfigError::StrategyMismatch`]).
    ///
    /// ```
    /// use ctxwin_core::{Config, ConfigError, ContextManager, TinyCapacities};
    /// let bad = Config { trigger_percent: 0, ..Config::DEFAULT };
    /// let refused = ContextManager::<TinyCapacities>::builder().config(bad).build();
    /// assert_eq!(refused.err(), Some(ConfigError::TriggerOutOfRange));
    /// ```
    pub fn build(self) -> Result<ContextManager<C, K, S>, ConfigError> {
        self.config.validate()?;
        check_strategy(&self.config, &self.strategy)?;
        Ok(ContextManager::from_parts(self.config, self.counter, self.strategy))
    }
}

#[cfg(test)]
mod tests {
    use crate::capacity::TinyCapacities;
    use crate::config::{Config, ConfigError, StrategyKind};
    use crate::estimator::Estimator;
    use crate::manager::ContextManager;
    use crate::strategy::SlidingWindow;

    #[test]
    fn no_configured_strategy_is_silently_ignored() {
        let importance = Config { strategy: StrategyKind::Importance, ..Config::DEFAULT };
        let mismatch = Err(ConfigError::StrategyMismatch {
            configured: StrategyKind::Importance,
            runs: StrategyKind::SlidingWindow,
        });
        let mut lean = ContextManager::<TinyCapacities, Estimator, SlidingWindow>::UNCONFIGURED;
        assert_eq!(lean.set_config(importance), mismatch);
        assert_eq!(lean.set_config(Config::DEFAULT), Ok(()));
        let built = ContextManager::<TinyCapacities>::builder()
            .config(importance)
            .strategy(SlidingWindow::new())
            .build();
        assert_eq!(built.map(|_| ()), mismatch);
        // The built-in strategy runs whatever kind the configuration names.
        let mut builtin = ContextManager::<TinyCapacities>::new();
        assert_eq!(builtin.set_config(importance), Ok(()));
        // Nor does a snapshot restore one.
        let mut bytes = [0u8; 1024];
        let snapshot = builtin.snapshot_into(&mut bytes).unwrap_or_default();
        assert_eq!(
            lean.restore_from(snapshot),
            Err(crate::snapshot::SnapshotError::Invalid(crate::snapshot::Invariant::Config))
        );
    }
}
