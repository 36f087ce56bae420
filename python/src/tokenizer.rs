//! `ctxwin.Tokenizer`: the std adapter's token counters by name — the built-in estimator, or
//! an exact tokenizer (`cl100k`, `smollm2`, a Hugging Face `tokenizer.json`), resolved as the
//! CLI's `--tokenizer` resolves them.

use std::path::Path;

use ctxwin_core::counter::TokenCounter;
use ctxwin_std::session::Counter;
use ctxwin_std::tokens::ExactCounter;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;

use crate::errors::{Kind, error};

/// A token counter: ``Tokenizer()`` or ``Tokenizer("estimator")`` is the built-in estimator
/// (no tokenizer file, errs high); ``"cl100k"`` and ``"smollm2"`` are exact tokenizers shipped
/// inside ctxwin; any other name is the path of a Hugging Face ``tokenizer.json`` (plain or
/// gzip).
#[pyclass(frozen, module = "ctxwin._native")]
pub(crate) struct Tokenizer {
    counter: Counter,
    name: String,
}

impl Tokenizer {
    pub(crate) fn counter(&self) -> &Counter {
        &self.counter
    }

    /// The counter `name` stands for.
    pub(crate) fn resolve(name: &str) -> PyResult<Counter> {
        let exact = match name {
            "estimator" | "approximate" => return Ok(Counter::default()),
            "cl100k" => ExactCounter::cl100k(),
            "smollm2" => ExactCounter::smollm2(),
            path => ExactCounter::from_file(Path::new(path)),
        };
        exact.map(Counter::Exact).map_err(|e| {
            error(
                Kind::Config,
                format!(
                    "tokenizer {name:?}: {e}; use \"estimator\", \"cl100k\", \"smollm2\" or the path of a tokenizer.json"
                ),
            )
        })
    }
}

#[pymethods]
impl Tokenizer {
    #[new]
    #[pyo3(signature = (name = "estimator"))]
    fn new(py: Python<'_>, name: &str) -> PyResult<Tokenizer> {
        let owned = name.to_owned();
        let counter = py.detach(|| Tokenizer::resolve(&owned))?;
        Ok(Tokenizer { counter, name: name.to_owned() })
    }

    /// Tokens ``text`` costs (without per-message framing).
    fn count(&self, py: Python<'_>, text: PyBackedStr) -> u32 {
        py.detach(|| self.counter.count(&text))
    }

    /// The name it was made from.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// ``"estimator"`` or ``"exact"``.
    #[getter]
    fn kind(&self) -> &'static str {
        self.counter.kind()
    }

    fn __repr__(&self) -> String {
        format!("Tokenizer({:?})", self.name)
    }
}
