//! Holder crate for the cross-crate integration tests in `tests/`.
