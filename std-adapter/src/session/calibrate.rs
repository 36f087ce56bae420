//! Calibration: the provider's billed prompt tokens shrink the window the core plans with, so
//! that real payloads stay under the real window.

use ctxwin_core::{Config, Level};

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
        self.calibrator.observe(estimated_tokens, prompt_tokens)?;
        self.apply_calibration()?;
        tracing::debug!(
            estimated_tokens,
            prompt_tokens,
            budget = self.manager.budget(),
            "session: usage recorded"
        );
        Ok(())
    }

    /// Gives the core the configured config with the calibrated window.
    pub(super) fn apply_calibration(&mut self) -> Result<(), SessionError> {
        let effective = effective_config(&self.configured, &self.calibrator);
        if effective != *self.manager.config() {
            self.manager.set_config(effective)?;
        }
        Ok(())
    }
}

/// `configured` with its budget lowered to what `calibrator` recommends (never raised; level
/// budgets scaled down with it when they would no longer fit). Unchanged before the first
/// observation.
pub(crate) fn effective_config(configured: &Config, calibrator: &Calibrator) -> Config {
    let real = configured.budget();
    if calibrator.observations() == 0 || real == 0 {
        return *configured;
    }
    let budget = calibrator.recommended_budget(real).min(real);
    if budget == real {
        return *configured;
    }
    let scale = |level: u32| (u64::from(level) * u64::from(budget) / u64::from(real)) as u32;
    // The numbers the core plans with (`fit_budgets` caps), taken as given from here on: the
    // cap would otherwise move with the shrunken window.
    let reserve = configured.reply_reserve();
    let (permanent, session, working) = (
        configured.level_budget(Level::Permanent),
        configured.level_budget(Level::Session),
        configured.level_budget(Level::Working),
    );
    let levels = u64::from(permanent) + u64::from(session) + u64::from(working);
    let mut effective = Config {
        context_window: budget.saturating_add(reserve),
        reserved_for_reply: reserve,
        permanent_budget: permanent,
        session_budget: session,
        working_budget: working,
        fit_budgets: false,
        ..*configured
    };
    if levels > u64::from(budget) {
        effective.permanent_budget = scale(permanent);
        effective.session_budget = scale(session);
        effective.working_budget = scale(working);
    }
    effective
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unchanged_before_observations_and_for_overestimates() {
        let mut calibrator = Calibrator::new();
        assert_eq!(effective_config(&Config::DEFAULT, &calibrator), Config::DEFAULT);
        for _ in 0..40 {
            calibrator.observe(1_250, 1_000).unwrap();
        }
        assert_eq!(effective_config(&Config::DEFAULT, &calibrator), Config::DEFAULT);
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
            prop_assert!(effective.context_window <= configured.context_window);
            let worst = ratios.iter().max().copied().unwrap_or(1_000);
            // A payload of the whole effective budget, billed at the worst ratio seen.
            let billed = u64::from(effective.budget()) * u64::from(worst) / 1_000;
            prop_assert!(billed <= u64::from(configured.budget()));
        }
    }
}
