//! Cross-crate integration tests.

mod quality;
