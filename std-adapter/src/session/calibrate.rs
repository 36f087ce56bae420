//! Calibration: the provider's billed prompt tokens set the window the core plans with, so
//! that real payloads stay under the real window.

use ctxwin_core::Config;

use super::{Calibration, Session, SessionError};
use crate::tokens::Calibrator;
use crate::tokens::calibration::with_budget;

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
        // The caller's change applies as asked: no raise of it is held back.
        let effective = effective_config(&config, &self.calibration.calibrator);
        if effective == *self.manager.config() {
            return Ok(());
        }
        self.manager.set_config(effective).map_err(|error| {
            self.calibration.configured = before;
            SessionError::from(error)
        })
    }

    /// Gives the core the configured config with the calibrated window, unless that only
    /// raises the window the core plans with now, by less than [`RAISE_STEP_PERMILLE`] of
    /// its budget ([`holds_back`]): the lower window stays, as safe as it was.
    pub(super) fn apply_calibration(&mut self) -> Result<(), SessionError> {
        let Calibration { configured, calibrator } = &self.calibration;
        let effective = effective_config(configured, calibrator);
        let current = *self.manager.config();
        if effective != current && !holds_back(configured, calibrator, &current, &effective) {
            self.manager.set_config(effective)?;
        }
        Ok(())
    }
}

/// The least raise of the calibrated budget applied, in thousandths of the budget the core
/// plans with (1%). The calibrator's envelope releases toward lower ratios a little with
/// every usage report, which would raise the window by a token or two per request; each
/// change of the window is a state a replay of pushes does not reproduce, so a session under
/// a lease checkpoints it, and whoever serves the conversation next restores that checkpoint
/// instead of resuming on its own state. Held back until the raises add up to a step, the
/// window moves seldom; a lower window is applied at once.
pub(crate) const RAISE_STEP_PERMILLE: u64 = 10;

/// Whether `effective` (what `calibrator` makes of `configured`) is to wait: it raises the
/// budget of `current`, by less than [`RAISE_STEP_PERMILLE`] of it, and `current` is what
/// `calibrator` would make of `configured` at that lower budget (a calibrated window held
/// back, not a configuration changed since). Keeping `current` plans with less room than
/// the calibrator allows, never more.
fn holds_back(
    configured: &Config,
    calibrator: &Calibrator,
    current: &Config,
    effective: &Config,
) -> bool {
    let (now, raised) = (u64::from(current.budget()), u64::from(effective.budget()));
    calibrator.observations() > 0
        && raised > now
        && (raised - now) * 1_000 < now * RAISE_STEP_PERMILLE
        && u32::try_from(now).is_ok_and(|now| with_budget(configured, now) == *current)
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

    #[test]
    fn small_raises_wait_until_they_add_up_to_a_step_and_a_lower_window_applies_at_once() {
        let mut session = crate::session::SessionBuilder::new("s").build().unwrap();
        // One report at par, then overestimates: once it leaves the recent window, the
        // envelope releases toward 0.8 a little with every report.
        session.record_usage(1_000, 1_000).unwrap();
        let (mut exact_moves, mut applied) = (0, Vec::new());
        let mut exact = effective_config(session.configured(), session.calibrator()).budget();
        for _ in 0..120 {
            let before = session.manager().budget();
            session.record_usage(1_000, 800).unwrap();
            let next = effective_config(session.configured(), session.calibrator()).budget();
            exact_moves += usize::from(next != exact);
            exact = next;
            let now = session.manager().budget();
            assert!(now <= next, "never more room than the calibrator allows");
            assert!(
                u64::from(next - now) * 1_000 < u64::from(now) * RAISE_STEP_PERMILLE,
                "{now} held back too far below {next}"
            );
            if now != before {
                assert!(now > before, "overestimates only raise it");
                assert!(u64::from(now - before) * 1_000 >= u64::from(before) * RAISE_STEP_PERMILLE);
                applied.push(now);
            }
        }
        assert!(
            !applied.is_empty() && applied.len() * 4 < exact_moves,
            "{applied:?}, {exact_moves}"
        );
        // A higher ratio lowers the window at once, however little.
        let before = session.manager().budget();
        session.record_usage(1_000, 900).unwrap();
        assert!(session.manager().budget() < before);
        // A configuration changed by the caller applies, a slightly larger window too.
        let window = session.configured().context_window;
        session.reconfigure(|config| config.context_window = window + 16).unwrap();
        let expected = effective_config(session.configured(), session.calibrator());
        assert_eq!(*session.manager().config(), expected);
    }

    proptest! {
        #[test]
        fn a_window_held_back_is_within_a_step_below_the_calibrated_one(
            ratios in proptest::collection::vec(700u32..1_300, 1..80),
        ) {
            let mut session = crate::session::SessionBuilder::new("s").build().unwrap();
            for actual in &ratios {
                session.record_usage(1_000, *actual).unwrap();
                let exact = effective_config(session.configured(), session.calibrator());
                let now = session.manager().config();
                prop_assert!(now.budget() <= exact.budget());
                prop_assert!(
                    u64::from(exact.budget() - now.budget()) * 1_000
                        < u64::from(now.budget()) * RAISE_STEP_PERMILLE
                );
                prop_assert_eq!(now.reply_reserve(), exact.reply_reserve());
            }
        }

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
