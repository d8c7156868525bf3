//! fjord's safekeeper (being built).
