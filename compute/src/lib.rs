//! Placeholder: this crate has no code yet (see README.md).
