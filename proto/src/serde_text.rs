//! serde for the identifiers and positions, in their text form: an `Lsn` is `"16/B374D848"`
//! and a `TenantId` or `TimelineId` 32 lowercase hex digits, exactly what `Display` prints
//! and `FromStr` parses.
//!
//! This is the form every JSON API of fjord uses, so a type that derives `Serialize` with an
//! `Lsn` field puts the same bytes on the wire as a client that formats the text itself. Deserializing
//! validates through `FromStr`, so a malformed value is refused when the text becomes the
//! type, with `FromStr`'s message.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::{Lsn, TenantId, TimelineId};

/// Accepts a string and parses it with `FromStr`; anything else is a type error naming
/// what was expected.
struct TextVisitor<T>(&'static str, PhantomData<T>);

impl<T> Visitor<'_> for TextVisitor<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(E::custom)
    }
}

macro_rules! serde_as_text {
    ($name:ident, $expecting:literal) => {
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_str(TextVisitor($expecting, PhantomData))
            }
        }
    };
}

serde_as_text!(Lsn, "an LSN as a string such as \"16/B374D848\"");
serde_as_text!(TenantId, "a tenant id as a string of 32 hexadecimal digits");
serde_as_text!(TimelineId, "a timeline id as a string of 32 hexadecimal digits");

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn text_forms_on_the_wire() {
        assert_eq!(serde_json::to_string(&Lsn(0x16B3748)).unwrap(), r#""0/16B3748""#);
        assert_eq!(serde_json::to_string(&Lsn::INVALID).unwrap(), r#""0/0""#);
        let id = TenantId([0xab; 16]);
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{}\"", "ab".repeat(16)));
        assert_eq!(serde_json::from_str::<Lsn>(r#""16/B374D848""#).unwrap(), Lsn(0x16_B374_D848));
    }

    #[test]
    fn malformed_text_is_refused_with_the_parse_error() {
        let err = serde_json::from_str::<Lsn>(r#""16-B3""#).unwrap_err().to_string();
        assert!(err.starts_with("invalid LSN: \"16-B3\""), "{err}");
        let err = serde_json::from_str::<TimelineId>(r#""xyz""#).unwrap_err().to_string();
        assert!(err.starts_with("invalid timeline id: \"xyz\""), "{err}");
        // A number is not an LSN, even though an LSN is a number inside.
        let err = serde_json::from_str::<Lsn>("23676744").unwrap_err().to_string();
        assert!(err.contains("expected an LSN as a string"), "{err}");
    }

    proptest! {
        #[test]
        fn json_round_trips(v in any::<u64>(), bytes in any::<[u8; 16]>()) {
            let lsn = Lsn(v);
            prop_assert_eq!(serde_json::from_str::<Lsn>(&serde_json::to_string(&lsn).unwrap()).unwrap(), lsn);
            let id = TimelineId(bytes);
            prop_assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{id}\""));
            prop_assert_eq!(serde_json::from_str::<TimelineId>(&serde_json::to_string(&id).unwrap()).unwrap(), id);
        }
    }
}
