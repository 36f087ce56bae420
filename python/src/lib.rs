//! `ctxwin._native`: the Rust half of the `ctxwin` Python package. A thin layer: messages are
//! read from Python objects (`convert`), the core's stateless trim runs over them
//! (`trim`), a std session keeps a conversation (`context`), the archive port keeps the Agents SDK
//! session's items (`items`), the record port the LangGraph saver's checkpoints (`records`), token counters come from the
//! std adapter (`tokenizer`) and errors become the exception classes of `ctxwin.errors`
//! (`errors`). The Python API, its documentation and its tests are in `python/ctxwin/`.

mod context;
mod convert;
mod errors;
mod items;
mod records;
mod tokenizer;
mod trim;

use pyo3::prelude::*;

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(trim::trim, module)?)?;
    module.add_class::<tokenizer::Tokenizer>()?;
    module.add_class::<context::Context>()?;
    module.add_class::<items::ItemLog>()?;
    module.add_class::<records::Records>()?;
    module.add("ABORTED_RESULT", ctxwin_core::manager::ABORTED_RESULT)?;
    Ok(())
}
