//! The storage services' HTTP APIs as one crate: the request and response bodies of every
//! route of the pageserver ([`models`]) and of the storage controller ([`controller`]), the
//! text forms of times and durations they use ([`time`]), and blocking clients over them
//! ([`client`], feature `client`, on by default).
//!
//! The servers serialize these types and their callers (the CLI, compute_ctl, the
//! controller's heartbeats, a pageserver registering with the controller) deserialize them,
//! so they cannot disagree about a field's name, type or meaning. Identifiers and LSNs are
//! `proto` types, which serde writes in their text form (`"0/16B3748"`, 32 hex digits):
//! the JSON is the same a human types into curl.
//!
//! Invariant: the JSON these types produce is byte for byte what the server emitted before
//! they existed (field names and order, strings for ids, LSNs and 64-bit identifiers);
//! `tests/wire.rs` holds each body as recorded, and the pageserver's router is tested
//! against the same bytes.

#[cfg(feature = "client")]
pub mod client;
pub mod controller;
pub mod models;
pub mod time;

#[cfg(feature = "client")]
pub use client::{Client, ClientConfig, ControllerClient, Error};
