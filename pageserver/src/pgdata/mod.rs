//! The PostgreSQL data path: PostgreSQL mapped onto the storage engine (`layerstore`).
//!
//! Everything here is plain library code over a `layerstore::Timeline`: no sockets, and no
//! threads but one per WAL redo process that reads its stderr (the WAL redo pool runs
//! child processes, which is how PostgreSQL's redo code is reached). The service (`crate::service`) calls into it; nothing here calls
//! the service. Only `pgwal` parses WAL; this layer maps decoded records to keys and values.

pub mod basebackup;
pub mod changes;
pub mod datadir;
pub mod import;
pub mod pageapi;
pub mod reconstruct;
pub mod timestamp;
pub mod walingest;
pub mod walredo;
