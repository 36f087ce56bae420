//! Calibration: the provider's billed prompt tokens set the window the core plans with, so
//! that real payloads stay under the real window.

use ctxwin_core::Config;

use super::{Session, SessionError};
use crate::tokens::Calibrator;

impl Session {
    /// Records what a request cost: `estimated_tokens` as the composed payload reported them
    /// ([`ComposedPayload::tokens`](super::ComposedPayload::tokens)) and `prompt_tokens` as
    /// the provider billed them (`usage.prompt_tokens`, `usage.input_tokens`). Then gives the
    /// core the effective window the calibrator recommends, never above the configured one;
    /// the next push or compose evicts to fit it.
    ///
    /// # Errors
    /// [`SessionError::Calibration`] for a zero count (nothing changes);
    /// [`SessionError::Config`] if the shrunken budgets do not validate.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let mut session = SessionBuilder::new("s").build()?;
    /// session.record_usage(1_000, 1_250)?; // the provider billed 25% more
    /// let configured = session.configured().budget();
    /// assert!(session.manager().budget() as f64 * 1.25 <= configured as f64);
    /// assert_eq!(session.calibrator().ratio(), Some(1.25));
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn record_usage(
        &mut self,
        estimated_tokens: u32,
        prompt_tokens: u32,
    ) -> Result<(), SessionError> {
        self.serving(true, |session| session.record_usage_once(estimated_tokens, prompt_tokens))
    }

    fn record_usage_once(
        &mut self,
        estimated_tokens: u32,
        prompt_tokens: u32,
    ) -> Result<(), SessionError> {
        self.calibration.calibrator.observe(estimated_tokens, prompt_tokens)?;
        self.apply_calibration()?;
        tracing::debug!(
            estimated_tokens,
            prompt_tokens,
            budget = self.manager.budget(),
            "session: usage recorded"
        );
        Ok(())
    }

    /// Changes the configuration the session was built with by `change` (a caller whose
    /// settings move: the reply reserve a request asks for, the tool-output limit of one
    /// tool). The calibrated window still applies; the next push or compose evicts to fit.
    ///
    /// # Errors
    /// [`SessionError::Config`] when the changed configuration does not validate: nothing
    /// changes then.
    ///
    /// ```
    /// use ctxwin_std::session::SessionBuilder;
    /// let mut session = SessionBuilder::new("s").build()?;
    /// session.reconfigure(|config| config.reserved_for_reply = 2_000)?;
    /// assert_eq!(session.manager().config().reserved_for_reply, 2_000);
    /// assert!(session.reconfigure(|config| config.observation_limit = 1).is_err());
    /// assert_eq!(session.configured().observation_limit, 1_000);
    /// # Ok::<(), ctxwin_std::session::SessionError>(())
    /// ```
    pub fn reconfigure(&mut self, change: impl FnOnce(&mut Config)) -> Result<(), SessionError> {
        let mut config = self.calibration.configured;
        change(&mut config);
        config.validate()?;
        let before = std::mem::replace(&mut self.calibration.configured, config);
        self.apply_calibration().inspect_err(|_| self.calibration.configured = before)
    }

    /// Gives the core the configured config with the calibrated window.
    pub(super) fn apply_calibration(&mut self) -> Result<(), SessionError> {
        let effective =
            effective_config(&self.calibration.configured, &self.calibration.calibrator);
        if effective != *self.manager.config() {
            self.manager.set_config(effective)?;
        }
        Ok(())
    }
}

/// `configured` with the budget `calibrator` recommends
/// ([`Calibrator::calibrated_config`]): lowered when the provider billed more than estimated,
/// raised when it billed less (the estimator's margin tightened to the billed usage).
/// Unchanged before the first observation.
pub(crate) fn effective_config(configured: &Config, calibrator: &Calibrator) -> Config {
    calibrator.calibrated_config(configured)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unchanged_before_observations_raised_for_overestimates() {
        let mut calibrator = Calibrator::new();
        assert_eq!(effective_config(&Config::DEFAULT, &calibrator), Config::DEFAULT);
        for _ in 0..40 {
            calibrator.observe(1_250, 1_000).unwrap();
        }
        let effective = effective_config(&Config::DEFAULT, &calibrator);
        assert!(effective.validate().is_ok());
        assert!(effective.budget() > Config::DEFAULT.budget());
        // A payload of the whole raised budget, billed at 1/1.25 of its estimate, fits.
        let billed = u64::from(effective.budget()) * 1_000 / 1_250;
        assert!(billed <= u64::from(Config::DEFAULT.budget()), "{billed}");
        assert_eq!(effective.reply_reserve(), Config::DEFAULT.reply_reserve());
        // The level budgets keep their share of the budget.
        assert!(effective.working_budget > Config::DEFAULT.working_budget);
    }

    #[test]
    fn tight_level_budgets_shrink_with_the_window() {
        let configured = Config {
            context_window: 10_000,
            reserved_for_reply: 1_000,
            permanent_budget: 2_000,
            session_budget: 2_000,
            working_budget: 5_000,
            ..Config::DEFAULT
        };
        let mut calibrator = Calibrator::new();
        calibrator.observe(1_000, 1_500).unwrap();
        let effective = effective_config(&configured, &calibrator);
        assert!(effective.validate().is_ok());
        assert!(effective.working_budget < 5_000);
        assert_eq!(effective.reserved_for_reply, 1_000);
    }

    proptest! {
        #[test]
        fn real_cost_of_a_full_payload_fits(
            ratios in proptest::collection::vec(500u32..3_000, 1..10),
            window in 4_096u32..200_000,
        ) {
            let configured = Config { context_window: window, reserved_for_reply: 1_024, ..Config::DEFAULT };
            prop_assume!(configured.validate().is_ok());
            let mut calibrator = Calibrator::new();
            for actual in &ratios {
                calibrator.observe(1_000, *actual).unwrap();
            }
            let effective = effective_config(&configured, &calibrator);
            prop_assert!(effective.validate().is_ok());
            prop_assert_eq!(effective.reply_reserve(), configured.reply_reserve());
            let worst = ratios.iter().max().copied().unwrap_or(1_000);
            // A payload of the whole effective budget, billed at the worst ratio seen.
            let billed = u64::from(effective.budget()) * u64::from(worst) / 1_000;
            prop_assert!(billed <= u64::from(configured.budget()));
        }
    }
}
