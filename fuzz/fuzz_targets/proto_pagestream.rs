//! The page service codec on arbitrary input: never panics, and an accepted message
//! re-encodes to exactly the bytes it was decoded from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::pagestream::{Request, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok((req, used)) = Request::decode(data) {
        let mut buf = Vec::new();
        req.encode(&mut buf);
        assert_eq!(&buf[..], &data[..used]);
    }
    if let Ok((resp, used)) = Response::decode(data) {
        let mut buf = Vec::new();
        resp.encode(&mut buf);
        assert_eq!(&buf[..], &data[..used]);
    }
});
