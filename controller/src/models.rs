//! The controller's HTTP API types live in the API crate (`pageserver_api::controller`), so
//! that the pageservers, compute_ctl and the CLI that call it share them.

pub use pageserver_api::controller::*;
