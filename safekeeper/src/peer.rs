//! How a connection's end is logged: a client that goes away (a compute stopped or killed,
//! a sync that closes its sockets once it is done, a pageserver that moves to another
//! safekeeper) is routine and logged at INFO; any other error is a WARN worth reading.

use std::io::ErrorKind;

/// Whether `e` (or an error it wraps) says the peer closed or reset the connection.
pub fn went_away(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(went_away_io))
}

/// Whether an I/O error on a connection says the peer closed or reset it.
pub fn went_away_io(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted | ErrorKind::UnexpectedEof)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn a_reset_wrapped_in_context_is_a_peer_going_away() {
        let e: anyhow::Result<()> = Err(std::io::Error::from(ErrorKind::ConnectionReset)).context("read from the client");
        assert!(went_away(&e.unwrap_err()));
        let e: anyhow::Result<()> = Err(std::io::Error::from(ErrorKind::BrokenPipe)).context("write to the client");
        assert!(went_away(&e.unwrap_err()));
    }

    #[test]
    fn other_errors_are_not() {
        assert!(!went_away(&anyhow::anyhow!("the proposer's term is stale")));
        let e: anyhow::Result<()> = Err(std::io::Error::from(ErrorKind::PermissionDenied)).context("open a segment");
        assert!(!went_away(&e.unwrap_err()));
    }
}
