//! fjord's safekeeper. Today only the sans-I/O consensus core exists (see README.md).

pub mod consensus;
