//! Telling a TLS client from a plaintext one by the first bytes it sends.

/// Whether `first` (a connection's first bytes, however many have arrived, at least one)
/// can be the start of a TLS ClientHello: a handshake record (22) of TLS 1.0 to 1.3
/// (version 3.1 to 3.4 on the record, 3.0 accepted as a ClientHello may carry it).
/// No message of fjord's plaintext protocols starts so: an HTTP request starts with a
/// letter, a PostgreSQL startup packet and a pagestream message with a big-endian length.
pub fn looks_like_tls(first: &[u8]) -> bool {
    match first {
        [] => false,
        [0x16] => true,
        [0x16, 0x03] => true,
        [0x16, 0x03, minor, ..] => *minor <= 0x04,
        _ => false,
    }
}
