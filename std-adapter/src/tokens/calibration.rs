//! [`Calibrator`]: learns from the provider's reported prompt tokens how far the counter's
//! estimates are off, and turns that into a budget (or an estimator margin) that keeps real
//! payloads under the window.

use std::collections::VecDeque;

use ctxwin_core::estimator::Margin;
use ctxwin_core::{Config, Level};

const PERMILLE: u128 = 1_000;

/// Why an observation, a configuration or a stored state was refused.
///
/// ```
/// use ctxwin_std::tokens::{CalibrationError, Calibrator};
///
/// let mut calibrator = Calibrator::new();
/// assert_eq!(calibrator.observe(0, 10), Err(CalibrationError::ZeroEstimate { actual: 10 }));
/// assert_eq!(calibrator.observations(), 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CalibrationError {
    /// The estimate was 0 tokens: no ratio can be learned from it.
    #[error("estimated payload of 0 tokens (provider billed {actual}): nothing to calibrate")]
    ZeroEstimate {
        /// The provider's count.
        actual: u32,
    },
    /// The provider reported 0 prompt tokens, which no real request costs.
    #[error("provider reported 0 prompt tokens for an estimate of {estimated}")]
    ZeroActual {
        /// The estimate.
        estimated: u32,
    },
    /// A [`CalibratorConfig`] field is out of range.
    #[error("invalid calibrator config: {0}")]
    Config(&'static str),
    /// A deserialized state is inconsistent.
    #[error("invalid calibrator state: {0}")]
    State(&'static str),
}

/// How a [`Calibrator`] weighs its observations.
///
/// ```
/// use ctxwin_std::tokens::CalibratorConfig;
///
/// let config = CalibratorConfig { window: 8, ..CalibratorConfig::DEFAULT };
/// assert!(config.validate().is_ok());
/// assert!(CalibratorConfig { window: 0, ..config }.validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CalibratorConfig {
    /// Recent observations kept exactly; their largest ratio always bounds the factor (≥ 1).
    pub window: u16,
    /// Weight of a new ratio in the mean reported by [`Calibrator::ratio`] (in `(0, 1]`).
    pub mean_weight: f64,
    /// Share of the gap the envelope closes toward a lower ratio per observation (in `[0, 1]`;
    /// 0 never lowers it).
    pub release: f64,
    /// Extra safety on top of the observed ratios, in thousandths (20 = 2%).
    pub headroom_permille: u16,
    /// Most a calibrated budget may exceed the configured one, in thousandths of it (at
    /// least 1000; 1500 = ×1.5), whatever the reports say: a provider that under-reports (a
    /// cached prefix left out of `input_tokens`) cannot inflate the window without bound.
    pub max_raise_permille: u16,
}

impl CalibratorConfig {
    /// 32 recent observations, mean weight 1/8, release 1/16, headroom 2%, a calibrated
    /// budget at most ×1.5 the configured one (the default estimator's margin, ×1.24, on
    /// text it already counts 1.2× high).
    pub const DEFAULT: CalibratorConfig = CalibratorConfig {
        window: 32,
        mean_weight: 0.125,
        release: 0.0625,
        headroom_permille: 20,
        max_raise_permille: 1_500,
    };

    /// Checks every field is in range.
    ///
    /// # Errors
    ///
    /// [`CalibrationError::Config`] naming the field.
    ///
    /// ```
    /// use ctxwin_std::tokens::CalibratorConfig;
    ///
    /// let bad = CalibratorConfig { release: f64::NAN, ..CalibratorConfig::DEFAULT };
    /// assert!(bad.validate().unwrap_err().to_string().contains("release"));
    /// ```
    pub fn validate(&self) -> Result<(), CalibrationError> {
        if self.window == 0 {
            return Err(CalibrationError::Config("window must be at least 1"));
        }
        if !(self.mean_weight > 0.0 && self.mean_weight <= 1.0) {
            return Err(CalibrationError::Config("mean_weight must be in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.release) {
            return Err(CalibrationError::Config("release must be in [0, 1]"));
        }
        if self.max_raise_permille < 1_000 {
            return Err(CalibrationError::Config("max_raise_permille must be at least 1000"));
        }
        Ok(())
    }
}

impl Default for CalibratorConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One request: the payload tokens estimated and the prompt tokens billed.
///
/// ```
/// use ctxwin_std::tokens::Observation;
///
/// assert_eq!(Observation { estimated: 200, actual: 250 }.ratio(), 1.25);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Observation {
    /// Tokens the counter estimated for the payload (framing included).
    pub estimated: u32,
    /// Prompt tokens the provider reported.
    pub actual: u32,
}

impl Observation {
    /// `actual / estimated`: above 1 when the estimate was low.
    pub fn ratio(&self) -> f64 {
        f64::from(self.actual) / f64::from(self.estimated)
    }

    /// Whether `self`'s ratio exceeds `other`'s, compared exactly.
    fn exceeds(&self, other: &Observation) -> bool {
        u64::from(self.actual) * u64::from(other.estimated)
            > u64::from(other.actual) * u64::from(self.estimated)
    }
}

/// Adapts the budget to the provider's real token counts.
///
/// After each request, feed it the payload tokens the core estimated and the prompt tokens
/// the provider billed (`usage.prompt_tokens`, `usage.input_tokens`). It keeps:
///
/// - the last [`window`](CalibratorConfig::window) observations, exactly: the largest
///   actual/estimated ratio among them always bounds the safety factor, so one underestimate
///   raises it at once and keeps it raised for `window` requests;
/// - an *envelope* that jumps up to any larger ratio and otherwise moves down toward the
///   observed ratios by [`release`](CalibratorConfig::release) of the gap per request, so the
///   factor falls slowly after overestimates;
/// - an exponentially weighted mean of the ratio, for statistics ([`Calibrator::ratio`]).
///
/// The safety factor is `max(envelope, largest recent ratio) × (1 + headroom)`. Giving the
/// core `recommended_budget(real_budget)` then guarantees, for any request whose true ratio is
/// at most one seen in the window, `estimated ≤ budget' ⇒ actual ≤ real_budget`: the
/// estimator is never the reason a request is rejected.
///
/// Integer arithmetic decides the guarantee; the floating-point envelope only tightens it.
/// Deterministic: the same observations give the same state. The state serializes with
/// serde, so it survives restarts.
///
/// It models a ratio only: a constant extra per request (a provider-side system prompt) looks
/// like a large ratio on small payloads, which keeps the budget conservative until those
/// requests leave the window and the envelope releases.
///
/// # Examples
///
/// ```
/// use ctxwin_std::tokens::Calibrator;
///
/// let mut calibrator = Calibrator::new();
/// calibrator.observe(1_000, 1_100)?; // the provider billed 10% more than estimated
/// let budget = calibrator.recommended_budget(28_672);
/// assert!(u64::from(budget) * 1_100 <= 28_672 * 1_000);
/// assert_eq!(calibrator.observations(), 1);
/// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
/// ```
///
/// ```
/// use ctxwin_core::estimator::Margin;
/// use ctxwin_std::tokens::Calibrator;
///
/// let mut calibrator = Calibrator::new();
/// for _ in 0..10 {
///     calibrator.observe(1_250, 1_000)?; // Margin::SAFE overestimates by 25%
/// }
/// assert_eq!(calibrator.ratio(), Some(0.8));
/// // The budget may exceed the real one: estimates run high.
/// assert!(calibrator.recommended_budget(10_000) > 10_000);
/// // Or keep the budget and shrink the estimator's margin instead.
/// let margin = calibrator.recommended_margin(Margin::SAFE);
/// assert_eq!((margin.num(), margin.den()), (1_020, 1_000));
///
/// let restored: Calibrator = serde_json::from_str(&serde_json::to_string(&calibrator)?)?;
/// assert_eq!(restored, calibrator);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "CalibratorState")]
pub struct Calibrator {
    config: CalibratorConfig,
    recent: VecDeque<Observation>,
    mean: f64,
    envelope: f64,
    observations: u64,
}

/// The serialized form, checked before it becomes a [`Calibrator`].
#[derive(serde::Deserialize)]
struct CalibratorState {
    config: CalibratorConfig,
    recent: VecDeque<Observation>,
    mean: f64,
    envelope: f64,
    observations: u64,
}

impl TryFrom<CalibratorState> for Calibrator {
    type Error = CalibrationError;

    fn try_from(state: CalibratorState) -> Result<Self, Self::Error> {
        state.config.validate()?;
        if state.recent.len() > usize::from(state.config.window) {
            return Err(CalibrationError::State("more recent observations than the window"));
        }
        if state.observations < state.recent.len() as u64 {
            return Err(CalibrationError::State("fewer observations than recent ones"));
        }
        if state.recent.iter().any(|o| o.estimated == 0 || o.actual == 0) {
            return Err(CalibrationError::State("an observation has a zero count"));
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if state.observations > 0 && !(positive(state.mean) && positive(state.envelope)) {
            return Err(CalibrationError::State("mean and envelope must be finite and positive"));
        }
        Ok(Calibrator {
            config: state.config,
            recent: state.recent,
            mean: state.mean,
            envelope: state.envelope,
            observations: state.observations,
        })
    }
}

impl Calibrator {
    /// A calibrator with [`CalibratorConfig::DEFAULT`] and no observations.
    ///
    /// ```
    /// use ctxwin_std::tokens::Calibrator;
    /// assert_eq!(Calibrator::new().ratio(), None);
    /// ```
    pub fn new() -> Calibrator {
        Calibrator {
            config: CalibratorConfig::DEFAULT,
            recent: VecDeque::new(),
            mean: 1.0,
            envelope: 1.0,
            observations: 0,
        }
    }

    /// A calibrator with `config` and no observations.
    ///
    /// # Errors
    ///
    /// [`CalibrationError::Config`] if a field is out of range.
    ///
    /// ```
    /// use ctxwin_std::tokens::{Calibrator, CalibratorConfig};
    ///
    /// let config = CalibratorConfig { headroom_permille: 0, ..CalibratorConfig::DEFAULT };
    /// assert_eq!(Calibrator::with_config(config)?.recommended_budget(1_000), 1_000);
    /// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
    /// ```
    pub fn with_config(config: CalibratorConfig) -> Result<Calibrator, CalibrationError> {
        config.validate()?;
        Ok(Calibrator { config, ..Calibrator::new() })
    }

    /// The configuration.
    ///
    /// ```
    /// use ctxwin_std::tokens::{Calibrator, CalibratorConfig};
    /// assert_eq!(Calibrator::new().config(), CalibratorConfig::DEFAULT);
    /// ```
    pub fn config(&self) -> CalibratorConfig {
        self.config
    }

    /// Records one request: `estimated` payload tokens, `actual` prompt tokens billed.
    ///
    /// # Errors
    ///
    /// [`CalibrationError::ZeroEstimate`] or [`CalibrationError::ZeroActual`]; the state is
    /// then unchanged.
    ///
    /// ```
    /// use ctxwin_std::tokens::Calibrator;
    ///
    /// let mut calibrator = Calibrator::new();
    /// calibrator.observe(100, 90)?;
    /// calibrator.observe(100, 150)?; // one underestimate raises the factor at once
    /// assert!(calibrator.safety_factor() >= 1.5);
    /// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
    /// ```
    pub fn observe(&mut self, estimated: u32, actual: u32) -> Result<(), CalibrationError> {
        if estimated == 0 {
            return Err(CalibrationError::ZeroEstimate { actual });
        }
        if actual == 0 {
            return Err(CalibrationError::ZeroActual { estimated });
        }
        let observation = Observation { estimated, actual };
        let ratio = observation.ratio();
        if self.observations == 0 {
            self.mean = ratio;
            self.envelope = ratio;
        } else {
            self.mean += self.config.mean_weight * (ratio - self.mean);
            self.envelope = if ratio >= self.envelope {
                ratio
            } else {
                self.envelope - self.config.release * (self.envelope - ratio)
            };
        }
        if self.recent.len() >= usize::from(self.config.window) {
            self.recent.pop_front();
        }
        self.recent.push_back(observation);
        self.observations = self.observations.saturating_add(1);
        tracing::trace!(estimated, actual, ratio, factor = self.safety_factor(), "calibrated");
        Ok(())
    }

    /// Observations recorded since creation or [`Calibrator::reset`].
    ///
    /// ```
    /// use ctxwin_std::tokens::Calibrator;
    /// assert_eq!(Calibrator::new().observations(), 0);
    /// ```
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// The recent observations, oldest first (at most [`CalibratorConfig::window`]).
    ///
    /// ```
    /// use ctxwin_std::tokens::{Calibrator, Observation};
    ///
    /// let mut calibrator = Calibrator::new();
    /// calibrator.observe(10, 12)?;
    /// assert_eq!(calibrator.recent().collect::<Vec<_>>(), [Observation { estimated: 10, actual: 12 }]);
    /// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
    /// ```
    pub fn recent(&self) -> impl ExactSizeIterator<Item = Observation> + '_ {
        self.recent.iter().copied()
    }

    /// The typical actual/estimated ratio (exponentially weighted mean), `None` before the
    /// first observation. Above 1 means the counter estimates low.
    ///
    /// ```
    /// use ctxwin_std::tokens::Calibrator;
    ///
    /// let mut calibrator = Calibrator::new();
    /// calibrator.observe(100, 120)?;
    /// assert_eq!(calibrator.ratio(), Some(1.2));
    /// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
    /// ```
    pub fn ratio(&self) -> Option<f64> {
        (self.observations > 0).then_some(self.mean)
    }

    /// The recent observation with the largest ratio (the first of equals).
    fn peak(&self) -> Option<Observation> {
        self.recent.iter().copied().reduce(|peak, o| if o.exceeds(&peak) { o } else { peak })
    }

    /// The factor estimates are scaled by: `max(envelope, largest recent ratio) × (1 +
    /// headroom)`; `1 + headroom` before the first observation.
    ///
    /// ```
    /// use ctxwin_std::tokens::Calibrator;
    ///
    /// let mut calibrator = Calibrator::new();
    /// assert_eq!(calibrator.safety_factor(), 1.02);
    /// calibrator.observe(100, 200)?;
    /// assert_eq!(calibrator.safety_factor(), 2.04);
    /// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
    /// ```
    pub fn safety_factor(&self) -> f64 {
        let base = match self.peak() {
            Some(peak) => peak.ratio().max(self.envelope),
            None => 1.0,
        };
        base * self.headroom() as f64 / PERMILLE as f64
    }

    fn headroom(&self) -> u128 {
        PERMILLE + u128::from(self.config.headroom_permille)
    }

    /// The budget to give the core (e.g. as `Config::context_window −
    /// reserved_for_reply`) so that a payload it estimates at most this many tokens costs at
    /// most `real_budget` real tokens, for any request whose true ratio is at most the
    /// largest in the window: `budget' × ratio × (1 + headroom) ≤ real_budget`. May exceed
    /// `real_budget` when the counter estimates high. Saturates at `u32::MAX`.
    ///
    /// ```
    /// use ctxwin_std::tokens::Calibrator;
    ///
    /// let mut calibrator = Calibrator::new();
    /// assert_eq!(calibrator.recommended_budget(10_200), 10_000); // headroom only
    /// calibrator.observe(1_000, 1_250)?;
    /// assert_eq!(calibrator.recommended_budget(10_200), 8_000);
    /// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
    /// ```
    pub fn recommended_budget(&self, real_budget: u32) -> u32 {
        let headroom = self.headroom();
        let budget = u128::from(real_budget);
        let Some(peak) = self.peak() else {
            return saturate_u32(budget * PERMILLE / headroom);
        };
        let exact =
            budget * u128::from(peak.estimated) * PERMILLE / (u128::from(peak.actual) * headroom);
        // Rounded to nearest: the exact bound above already decides the guarantee, and `as`
        // saturates (NaN gives 0), so the envelope can only lower the budget.
        let by_envelope = (f64::from(real_budget) * PERMILLE as f64
            / (self.envelope * headroom as f64))
            .round() as u128;
        saturate_u32(exact.min(by_envelope))
    }

    /// The margin to give the core's [`Estimator`](ctxwin_core::estimator::Estimator), in
    /// thousandths, when the observed estimates were made with `current`:
    /// `current × safety factor`, at least ×1, at most ×65.535.
    ///
    /// An alternative to [`Calibrator::recommended_budget`], not an addition. After switching
    /// the estimator to the returned margin, call [`Calibrator::reset`]: observations made
    /// with different margins must not be mixed.
    ///
    /// ```
    /// use ctxwin_core::estimator::Margin;
    /// use ctxwin_std::tokens::Calibrator;
    ///
    /// let mut calibrator = Calibrator::new();
    /// calibrator.observe(1_000, 1_100)?;
    /// let margin = calibrator.recommended_margin(Margin::TIGHT);
    /// assert_eq!((margin.num(), margin.den()), (1_122, 1_000));
    /// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
    /// ```
    pub fn recommended_margin(&self, current: Margin) -> Margin {
        let headroom = self.headroom();
        let (num, den) = (u128::from(current.num()), u128::from(current.den()));
        let thousandths = match self.peak() {
            Some(peak) => {
                let exact = (num * u128::from(peak.actual) * headroom)
                    .div_ceil(den * u128::from(peak.estimated));
                let by_envelope =
                    (num as f64 * self.envelope * headroom as f64 / den as f64).round() as u128;
                exact.max(by_envelope)
            }
            None => (num * headroom).div_ceil(den),
        };
        let clamped = thousandths.clamp(PERMILLE, u128::from(u16::MAX));
        u16::try_from(clamped)
            .ok()
            .and_then(|num| Margin::new(num, PERMILLE as u16))
            .unwrap_or(current)
    }

    /// `configured` with the budget [`recommended_budget`](Self::recommended_budget) gives:
    /// what the core should plan with so that a payload it composes costs at most
    /// `configured.budget()` billed tokens. Unchanged before the first observation.
    ///
    /// When estimates ran high (the default estimator's margin over-counts most text), the
    /// budget rises above the configured one: the margin the estimator was built with is
    /// tightened to what the provider bills, and the same water marks fill more of the real
    /// window, up to [`max_raise_permille`](CalibratorConfig::max_raise_permille) of the
    /// configured budget. When they ran low, it falls. The reply reserve stays; the level budgets (as
    /// [`Config::level_budget`] caps them, then taken as given: `fit_budgets` off) scale with
    /// a raised budget, and shrink with a lowered one only when they would no longer fit.
    ///
    /// ```
    /// use ctxwin_core::Config;
    /// use ctxwin_std::tokens::Calibrator;
    ///
    /// let mut calibrator = Calibrator::new();
    /// assert_eq!(calibrator.calibrated_config(&Config::DEFAULT), Config::DEFAULT);
    /// for _ in 0..4 {
    ///     calibrator.observe(1_400, 1_000)?; // the provider billed 1/1.4 of the estimate
    /// }
    /// let raised = calibrator.calibrated_config(&Config::DEFAULT);
    /// assert!(raised.budget() > Config::DEFAULT.budget());
    /// // A payload of the whole raised budget, billed at the observed ratio, still fits.
    /// assert!(u64::from(raised.budget()) * 1_000 <= u64::from(Config::DEFAULT.budget()) * 1_400);
    /// assert_eq!(raised.reply_reserve(), Config::DEFAULT.reply_reserve());
    /// assert!(raised.validate().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn calibrated_config(&self, configured: &Config) -> Config {
        let real = configured.budget();
        if self.observations == 0 || real == 0 {
            return *configured;
        }
        let ceiling = u64::from(real) * u64::from(self.config.max_raise_permille) / 1_000;
        let budget = match u32::try_from(ceiling) {
            Ok(ceiling) => self.recommended_budget(real).min(ceiling),
            Err(_) => self.recommended_budget(real),
        };
        with_budget(configured, budget)
    }

    /// Forgets every observation (the configuration stays).
    ///
    /// ```
    /// use ctxwin_std::tokens::Calibrator;
    ///
    /// let mut calibrator = Calibrator::new();
    /// calibrator.observe(10, 20)?;
    /// calibrator.reset();
    /// assert_eq!(calibrator, Calibrator::new());
    /// # Ok::<(), ctxwin_std::tokens::CalibrationError>(())
    /// ```
    pub fn reset(&mut self) {
        *self = Calibrator { config: self.config, ..Calibrator::new() };
    }
}

impl Default for Calibrator {
    fn default() -> Self {
        Self::new()
    }
}

/// `configured` planning with `budget` in place of its own, as
/// [`Calibrator::calibrated_config`] gives it for the budget it recommends: the reply reserve
/// kept, the level budgets (as [`Config::level_budget`] caps them, then taken as given:
/// `fit_budgets` off) scaled with a raised budget and shrunk with a lowered one only when they
/// would no longer fit; `configured` itself when `budget` is its own.
pub(crate) fn with_budget(configured: &Config, budget: u32) -> Config {
    let real = configured.budget();
    if budget == real || real == 0 {
        return *configured;
    }
    let reserve = configured.reply_reserve();
    // What the core plans with (`fit_budgets` caps), taken as given from here on: the
    // caps would otherwise move with the calibrated window.
    let levels = [Level::Permanent, Level::Session, Level::Working]
        .map(|level| configured.level_budget(level));
    let sum: u64 = levels.iter().map(|&b| u64::from(b)).sum();
    let scaled = |level: u32| {
        u32::try_from(u64::from(level) * u64::from(budget) / u64::from(real)).unwrap_or(u32::MAX)
    };
    let levels = if budget > real || sum > u64::from(budget) { levels.map(scaled) } else { levels };
    let [permanent_budget, session_budget, working_budget] = levels;
    Config {
        context_window: budget.saturating_add(reserve),
        reserved_for_reply: reserve,
        permanent_budget,
        session_budget,
        working_budget,
        fit_budgets: false,
        ..*configured
    }
}

fn saturate_u32(n: u128) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fed(observations: &[(u32, u32)]) -> Calibrator {
        let mut calibrator = Calibrator::new();
        for &(estimated, actual) in observations {
            calibrator.observe(estimated, actual).unwrap();
        }
        calibrator
    }

    #[test]
    fn rejected_observations_change_nothing() {
        let mut calibrator = fed(&[(100, 110)]);
        let before = calibrator.clone();
        assert_eq!(calibrator.observe(0, 5), Err(CalibrationError::ZeroEstimate { actual: 5 }));
        assert_eq!(calibrator.observe(5, 0), Err(CalibrationError::ZeroActual { estimated: 5 }));
        assert_eq!(calibrator, before);
    }

    #[test]
    fn window_forgets_the_oldest() {
        let config = CalibratorConfig { window: 2, release: 1.0, ..CalibratorConfig::DEFAULT };
        let mut calibrator = Calibrator::with_config(config).unwrap();
        calibrator.observe(100, 300).unwrap();
        assert_eq!(calibrator.recommended_budget(1_020), 333);
        calibrator.observe(100, 100).unwrap();
        calibrator.observe(100, 100).unwrap();
        // With release 1 the envelope follows at once, so the ×3 is gone with the window.
        assert_eq!(calibrator.recent().len(), 2);
        assert_eq!(calibrator.recommended_budget(1_020), 1_000);
        assert_eq!(calibrator.observations(), 3);
    }

    #[test]
    fn envelope_releases_slowly() {
        let config = CalibratorConfig { window: 1, ..CalibratorConfig::DEFAULT };
        let mut calibrator = Calibrator::with_config(config).unwrap();
        calibrator.observe(100, 200).unwrap();
        let mut previous = calibrator.safety_factor();
        for _ in 0..20 {
            calibrator.observe(100, 100).unwrap();
            let factor = calibrator.safety_factor();
            assert!(factor < previous);
            // Each step closes at most `release` (1/16) of the gap to the new ratio.
            assert!(factor >= 1.02 + (previous - 1.02) * (1.0 - 0.0625) - 1e-9);
            previous = factor;
        }
        assert!(previous > 1.02 * 1.25, "{previous}");
    }

    #[test]
    fn zero_release_never_lowers() {
        let config = CalibratorConfig { window: 1, release: 0.0, ..CalibratorConfig::DEFAULT };
        let mut calibrator = Calibrator::with_config(config).unwrap();
        calibrator.observe(10, 20).unwrap();
        calibrator.observe(10, 10).unwrap();
        assert_eq!(calibrator.safety_factor(), 2.0 * 1.02);
    }

    #[test]
    fn a_calibrated_budget_rises_at_most_to_the_ceiling() {
        // A provider reporting a tenth of the estimate (a cached prefix left out).
        let calibrator = fed(&[(10_000, 1_000)]);
        let raised = calibrator.calibrated_config(&Config::DEFAULT);
        assert_eq!(raised.budget(), Config::DEFAULT.budget() * 3 / 2);
        assert!(raised.validate().is_ok());
        let config = CalibratorConfig { max_raise_permille: 999, ..CalibratorConfig::DEFAULT };
        assert!(config.validate().unwrap_err().to_string().contains("max_raise_permille"));
        // Lowering is never capped.
        let lowered = fed(&[(1_000, 10_000)]).calibrated_config(&Config::DEFAULT);
        assert!(lowered.budget() < Config::DEFAULT.budget() / 9);
    }

    #[test]
    fn budget_saturates() {
        let calibrator = fed(&[(u32::MAX, 1)]);
        assert_eq!(calibrator.recommended_budget(u32::MAX), u32::MAX);
        assert_eq!(fed(&[(1, u32::MAX)]).recommended_budget(u32::MAX), 0);
    }

    #[test]
    fn margin_is_clamped() {
        let floor = fed(&[(100, 1)]).recommended_margin(Margin::SAFE);
        assert_eq!(floor.num(), floor.den());
        assert_eq!(fed(&[(1, 1_000)]).recommended_margin(Margin::TIGHT).num(), u16::MAX);
        assert_eq!(Calibrator::new().recommended_margin(Margin::TIGHT).num(), 1_020);
    }

    #[test]
    fn bad_states_are_refused() {
        let good = serde_json::to_value(fed(&[(10, 11), (10, 12)])).unwrap();
        let mutate = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut value = good.clone();
            edit(&mut value);
            serde_json::from_value::<Calibrator>(value).unwrap_err().to_string()
        };
        assert!(mutate(&|v| v["config"]["window"] = 1.into()).contains("window"));
        assert!(mutate(&|v| v["observations"] = 1.into()).contains("fewer observations"));
        assert!(mutate(&|v| v["recent"][0]["actual"] = 0.into()).contains("zero count"));
        assert!(mutate(&|v| v["mean"] = (-1.0).into()).contains("finite and positive"));
        assert!(mutate(&|v| v["config"]["mean_weight"] = 0.0.into()).contains("mean_weight"));
        assert!(serde_json::from_value::<Calibrator>(good).is_ok());
    }

    fn observation() -> impl Strategy<Value = (u32, u32)> {
        (1u32..2_000_000, 1u32..2_000_000)
    }

    proptest! {
        #[test]
        fn budget_covers_every_recent_ratio(
            history in proptest::collection::vec(observation(), 1..80),
            budget in any::<u32>(),
        ) {
            let calibrator = fed(&history);
            let recommended = u64::from(calibrator.recommended_budget(budget));
            let window = usize::from(CalibratorConfig::DEFAULT.window);
            for &(estimated, actual) in history.iter().rev().take(window) {
                // A request with this ratio, estimated at the recommended budget, fits.
                prop_assert!(
                    u128::from(recommended) * u128::from(actual) * 1_020
                        <= u128::from(budget) * u128::from(estimated) * 1_000
                );
            }
        }

        #[test]
        fn an_underestimate_lowers_the_budget_at_once(
            history in proptest::collection::vec(observation(), 0..40),
            (estimated, actual) in observation(),
            budget in 1u32..,
        ) {
            let mut calibrator = fed(&history);
            calibrator.observe(estimated, actual).unwrap();
            let recommended = u64::from(calibrator.recommended_budget(budget));
            prop_assert!(recommended * u64::from(actual) <= u64::from(budget) * u64::from(estimated));
        }

        #[test]
        fn overestimates_raise_the_budget_slowly(
            history in proptest::collection::vec(observation(), 1..40),
        ) {
            let mut calibrator = fed(&history);
            let window = usize::from(calibrator.config().window);
            let mut previous = calibrator.safety_factor();
            for _ in 0..2 * window {
                let before_envelope = calibrator.envelope;
                // A ratio below any in the history: the estimator now overestimates.
                calibrator.observe(2_000_000, 1).unwrap();
                let factor = calibrator.safety_factor();
                prop_assert!(factor <= previous + 1e-12);
                let ratio = 1.0 / 2_000_000.0;
                let slowest = before_envelope - 0.0625 * (before_envelope - ratio);
                prop_assert!(calibrator.envelope >= slowest - 1e-12);
                previous = factor;
            }
        }

        #[test]
        fn margin_covers_every_recent_ratio(
            history in proptest::collection::vec(observation(), 1..60),
            (num, den) in (1u16..4_000, 1u16..4_000),
        ) {
            let current = Margin::new(num.max(den), den).unwrap();
            let calibrator = fed(&history);
            let margin = calibrator.recommended_margin(current);
            prop_assert!(margin.num() >= margin.den());
            let window = usize::from(CalibratorConfig::DEFAULT.window);
            for &(estimated, actual) in history.iter().rev().take(window) {
                // margin / current ≥ actual / estimated, unless clamped at the top.
                let lhs = u128::from(margin.num()) * u128::from(current.den()) * u128::from(estimated);
                let rhs = u128::from(current.num()) * u128::from(margin.den()) * u128::from(actual);
                prop_assert!(lhs >= rhs || margin.num() == u16::MAX);
            }
        }

        #[test]
        fn state_round_trips(history in proptest::collection::vec(observation(), 0..50), budget in any::<u32>()) {
            let calibrator = fed(&history);
            let json = serde_json::to_string(&calibrator).unwrap();
            let restored: Calibrator = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(restored.recommended_budget(budget), calibrator.recommended_budget(budget));
            prop_assert_eq!(&restored, &calibrator);
            prop_assert_eq!(fed(&history), calibrator);
        }
    }
}
