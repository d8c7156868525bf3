//! `Key::from_bytes` and `Key::from_str` on arbitrary input: never panic, and whatever is
//! accepted round-trips exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::Key;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = Key::from_bytes(data) {
        assert_eq!(&key.to_bytes()[..], data);
        assert_eq!(key.to_string().parse::<Key>().ok(), Some(key));
        let _ = key.kind();
        let _ = key.next();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(key) = text.parse::<Key>() {
            assert_eq!(Key::from_bytes(&key.to_bytes()).ok(), Some(key));
        }
    }
});
