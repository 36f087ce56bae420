//! Named pass/fail checks, each logged with defmt.

/// Tally of the checks run so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checks {
    passed: u32,
    failed: u32,
}

impl Checks {
    /// No checks yet.
    pub const fn new() -> Self {
        Self { passed: 0, failed: 0 }
    }

    /// Records `ok` for the check `what`; a failure is logged as an error.
    pub fn check(&mut self, ok: bool, what: &str) -> bool {
        if ok {
            self.passed += 1;
            defmt::debug!("check ok: {=str}", what);
        } else {
            self.failed += 1;
            defmt::error!("CHECK FAILED: {=str}", what);
        }
        ok
    }

    /// Checks passed.
    pub fn passed(&self) -> u32 {
        self.passed
    }

    /// Checks failed.
    pub fn failed(&self) -> u32 {
        self.failed
    }

    /// Whether every check so far held.
    pub fn all_ok(&self) -> bool {
        self.failed == 0 && self.passed > 0
    }
}
