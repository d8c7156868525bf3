//! The safekeeper protocol codec on arbitrary input: never panics, and an accepted message
//! re-encodes to exactly the bytes it was decoded from (a `Hello` of version 5 or later
//! with its token, one of an earlier version without). The seeds (`fuzz/seeds/quorum_wire/`)
//! are `Hello`s of versions 6 and 5, with a token and without, and of version 4, and version
//! 6's record boundaries: an `Append` (its boundary inside the bytes it carries), an
//! `AppendAck` and an `ElectedAck`.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quorum::wire::{AcceptorMessage, ProposerMessage};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let before = buf.len();
    if let Ok(Some(m)) = ProposerMessage::decode(&mut buf) {
        let used = before - buf.len();
        let mut out = BytesMut::new();
        m.encode(&mut out);
        assert_eq!(&out[..], &data[..used]);
    }
    let mut buf = BytesMut::from(data);
    if let Ok(Some(m)) = AcceptorMessage::decode(&mut buf) {
        let used = before - buf.len();
        let mut out = BytesMut::new();
        m.encode(&mut out);
        assert_eq!(&out[..], &data[..used]);
    }
});
