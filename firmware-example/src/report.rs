//! Checks and log lines without defmt or `core::fmt`: plain text over semihosting stdout,
//! for the `minimal` and `snapshot` binaries (defmt and its logger would cost flash they are
//! measured without). QEMU prints the text as is; no decoder needed.

use crate::text::decimal;
use cortex_m_semihosting::debug;
use cortex_m_semihosting::hio::{self, HostStream};

/// Named pass/fail checks and log lines, written to the host's stdout.
#[allow(missing_debug_implementations)]
pub struct Report {
    out: Option<HostStream>,
    passed: u32,
    failed: u32,
}

impl Report {
    /// Opens semihosting stdout (nothing is printed if the host refuses).
    pub fn new() -> Self {
        Self { out: hio::hstdout().ok(), passed: 0, failed: 0 }
    }

    /// Writes `text` and a newline.
    pub fn line(&mut self, text: &str) {
        self.parts(&[text, "\n"]);
    }

    /// Writes `parts` one after the other (no buffer to assemble them in).
    fn parts(&mut self, parts: &[&str]) {
        if let Some(out) = self.out.as_mut() {
            for part in parts {
                let _ = out.write_all(part.as_bytes());
            }
        }
    }

    /// Writes `label` followed by `value` in decimal and `unit`.
    pub fn value(&mut self, label: &str, value: u64, unit: &str) {
        self.parts(&[label, decimal(value, &mut [0; 20]), unit, "\n"]);
    }

    /// Records `ok` for the check `what`; a failure is printed.
    pub fn check(&mut self, ok: bool, what: &str) -> bool {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
            self.parts(&["CHECK FAILED: ", what, "\n"]);
        }
        ok
    }

    /// Prints `ALL OK: <n> checks passed` or `FAILED: <n> checks failed` and returns whether every check
    /// held (and at least one ran).
    pub fn finish(&mut self) -> bool {
        let ok = self.failed == 0 && self.passed > 0;
        let (label, count, unit) = match ok {
            true => ("ALL OK: ", self.passed, " checks passed"),
            false => ("FAILED: ", self.failed, " checks failed"),
        };
        self.value(label, count.into(), unit);
        ok
    }

    /// Checks the painted stack's high-water mark against `stack_limit`, prints the summary
    /// ([`Report::finish`]) and ends the QEMU run with its exit code (0 when every check held).
    pub fn exit_checked(mut self, stack_limit: usize) -> ! {
        let high_water = crate::stack::high_water();
        self.value("stack high-water: ", high_water as u64, " bytes");
        self.check(high_water <= stack_limit, "stack high-water within the limit");
        let code = if self.finish() { debug::EXIT_SUCCESS } else { debug::EXIT_FAILURE };
        debug::exit(code);
        loop {
            cortex_m::asm::wfi();
        }
    }
}

impl Default for Report {
    fn default() -> Self {
        Self::new()
    }
}
