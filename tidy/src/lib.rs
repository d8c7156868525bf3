//! Nothing to link: this crate exists for its tests (`tests/tidy.rs`), which read the whole
//! tree and fail when an architecture invariant written in ARCHITECTURE.md stops being true.
//! A sentence in a document can drift; a failing `cargo test` cannot.
