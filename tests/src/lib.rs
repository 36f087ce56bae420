//! Holder crate for the cross-crate integration tests in `tests/`, and the memory-quality
//! scenario they and the `memory_quality` bench share.

pub mod quality;
