//! The pageserver's management API as one crate: the request and response bodies of every
//! route ([`models`]), the text forms of times and durations they use ([`time`]), and one
//! blocking client over them ([`client`], feature `client`, on by default).
//!
//! The pageserver serializes these types and the CLI and compute_ctl deserialize them, so
//! the three cannot disagree about a field's name, type or meaning. Identifiers and LSNs are
//! `proto` types, which serde writes in their text form (`"0/16B3748"`, 32 hex digits):
//! the JSON is the same a human types into curl. The pageserver depends on this crate
//! without the `client` feature, so it never links an HTTP client.
//!
//! Invariant: the JSON these types produce is byte for byte what the server emitted before
//! they existed (field names and order, strings for ids, LSNs and 64-bit identifiers);
//! `tests/wire.rs` holds each body as recorded, and the pageserver's router is tested
//! against the same bytes.

#[cfg(feature = "client")]
pub mod client;
pub mod models;
pub mod time;

#[cfg(feature = "client")]
pub use client::{Client, ClientConfig, Error};
