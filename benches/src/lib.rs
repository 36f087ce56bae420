//! Holder crate for the criterion benches in `benches/`.
