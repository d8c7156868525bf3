//! fjord's vocabulary: identifiers, positions, keys and (later) wire messages.
//!
//! This is the leaf crate of the workspace. It has no sockets, no files and no async
//! runtime, so that every service and the extension can share it and so that its decoders
//! can be fuzzed in isolation. Validation happens here, when bytes or text become domain
//! types: a value of a type from this crate is always well-formed.

pub mod filecache;
pub mod id;
pub mod key;
pub mod lsn;
pub mod page;
pub mod pagestream;
pub mod reltag;
mod serde_text;
pub mod walredo;

pub use id::{IdParseError, TenantId, TimelineId};

/// The environment variable in which a client process (compute_ctl, a compute, the
/// pageserver reading WAL) finds its token for the storage services (`auth` crate).
pub const AUTH_TOKEN_ENV: &str = "FJORD_AUTH_TOKEN";
pub use key::{Key, KeyError, KeyKind, KeyRange, SlruKind, KEY_SIZE_BYTES};
pub use lsn::{Lsn, LsnParseError};
pub use reltag::{BlockNumber, ForkNumber, Oid, RelTag};
