//! `TenantId` and `TimelineId`: 128-bit identifiers, printed as 32 lowercase hex digits.
//!
//! A tenant is one customer's set of databases; a timeline is one branch of its WAL
//! history. Both are random 16-byte values chosen by whoever creates them; the type makes
//! sure a tenant id is never passed where a timeline id is expected.

use std::fmt;
use std::str::FromStr;

/// Text that is not a 32-digit hexadecimal id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} id: {text:?} (expected 32 hexadecimal digits)")]
pub struct IdParseError {
    pub kind: &'static str,
    pub text: String,
}

fn parse_hex16(kind: &'static str, s: &str) -> Result<[u8; 16], IdParseError> {
    let err = || IdParseError { kind, text: s.to_string() };
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err());
    }
    let mut out = [0u8; 16];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let pair = std::str::from_utf8(chunk).map_err(|_| err())?;
        out[i] = u8::from_str_radix(pair, 16).map_err(|_| err())?;
    }
    Ok(out)
}

macro_rules! id_type {
    ($name:ident, $kind:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub [u8; 16]);

        impl $name {
            pub fn from_bytes(bytes: [u8; 16]) -> Self {
                Self(bytes)
            }

            pub fn as_bytes(&self) -> &[u8; 16] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for b in self.0 {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self)
            }
        }

        impl FromStr for $name {
            type Err = IdParseError;
            fn from_str(s: &str) -> Result<Self, IdParseError> {
                parse_hex16($kind, s).map(Self)
            }
        }
    };
}

id_type!(TenantId, "tenant", "Identifies a tenant: one customer's set of databases.");
id_type!(TimelineId, "timeline", "Identifies a timeline: one branch of a tenant's WAL history.");

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_malformed_ids() {
        for bad in ["", "abc", &"0".repeat(31), &"0".repeat(33), &"g".repeat(32)] {
            let err = bad.parse::<TenantId>().unwrap_err();
            assert_eq!(err.kind, "tenant");
        }
        assert!("é".repeat(16).parse::<TimelineId>().is_err());
    }

    proptest! {
        #[test]
        fn display_round_trips(bytes in any::<[u8; 16]>()) {
            let id = TimelineId(bytes);
            let text = id.to_string();
            prop_assert_eq!(text.len(), 32);
            prop_assert_eq!(text.parse::<TimelineId>().unwrap(), id);
            prop_assert_eq!(text.to_uppercase().parse::<TimelineId>().unwrap(), id);
        }
    }
}
