//! Times and durations as the API writes them: points in time in RFC 3339
//! (`2026-11-24T10:30:00Z`, `2026-11-24T11:30:00.25+01:00`) and durations as a number with
//! one unit (`7d`, `12h`, `30m`, `1s`, `250ms`), the way a human types them into curl or a
//! TOML file.
//!
//! Invariants: `format_rfc3339` and `HumanDuration`'s `Display` write forms their parsers
//! read back to the same value (to the microsecond for times); parsers validate every field
//! and return an error naming the text, never panic.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Text that is not a time or a duration the API accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TimeParseError {
    #[error("invalid timestamp {text:?}: {reason} (expected RFC 3339, such as 2026-11-24T10:30:00Z)")]
    Timestamp { text: String, reason: &'static str },
    #[error("invalid duration {text:?} (expected a number and a unit: ms, s, m, h or d, such as 7d or 30s)")]
    Duration { text: String },
}

/// A duration written as a whole number and one unit: `ms`, `s`, `m`, `h` or `d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

const UNITS: [(&str, u64); 5] = [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)];

impl FromStr for HumanDuration {
    type Err = TimeParseError;

    fn from_str(s: &str) -> Result<HumanDuration, TimeParseError> {
        let err = || TimeParseError::Duration { text: s.to_string() };
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        let (number, unit) = s.split_at(digits);
        let number: u64 = number.parse().map_err(|_| err())?;
        let (_, millis) = UNITS.iter().find(|(name, _)| *name == unit).ok_or_else(err)?;
        number.checked_mul(*millis).map(|ms| HumanDuration(Duration::from_millis(ms))).ok_or_else(err)
    }
}

impl fmt::Display for HumanDuration {
    /// The largest unit that divides the duration (milliseconds are the finest).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX);
        let (unit, per) = UNITS.iter().find(|(_, per)| ms % per == 0 && ms > 0).copied().unwrap_or(("s", 1000));
        write!(f, "{}{unit}", ms / per)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HumanDuration, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day counted from 1970-01-01: (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Parses an RFC 3339 date-time: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`, with
/// `t`, `z` or a space accepted as RFC 3339 allows. A fraction finer than a microsecond is
/// truncated; leap seconds (`:60`) are refused.
pub fn parse_rfc3339(text: &str) -> Result<SystemTime, TimeParseError> {
    let err = |reason| TimeParseError::Timestamp { text: text.to_string(), reason };
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<u32> {
        let s = b.get(range)?;
        s.iter().all(u8::is_ascii_digit).then(|| s.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let sep = |i: usize, want: &[u8]| b.get(i).is_some_and(|c| want.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return Err(err("not in the form YYYY-MM-DDTHH:MM:SS"));
    }
    let (Some(year), Some(month), Some(day), Some(hour), Some(minute), Some(second)) =
        (num(0..4), num(5..7), num(8..10), num(11..13), num(14..16), num(17..19))
    else {
        return Err(err("a date or time field is not a number"));
    };
    let year = i64::from(year);
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return Err(err("no such date"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(err("no such time of day"));
    }
    let mut i = 19;
    let mut micros: u64 = 0;
    if sep(i, b".") {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return Err(err("a fraction without digits"));
        }
        for (k, d) in b[i + 1..i + 1 + digits].iter().enumerate() {
            if k < 6 {
                micros = micros * 10 + u64::from(d - b'0');
            }
        }
        micros *= 10u64.pow(6u32.saturating_sub(digits as u32));
        i += 1 + digits;
    }
    let offset_seconds: i64 = match b.get(i) {
        Some(b'Z' | b'z') if b.len() == i + 1 => 0,
        Some(sign @ (b'+' | b'-')) if b.len() == i + 6 && sep(i + 3, b":") => {
            let (Some(h), Some(m)) = (num(i + 1..i + 3), num(i + 4..i + 6)) else {
                return Err(err("the offset is not a number"));
            };
            if h > 23 || m > 59 {
                return Err(err("no such offset"));
            }
            let seconds = i64::from(h * 3600 + m * 60);
            if *sign == b'+' {
                seconds
            } else {
                -seconds
            }
        }
        _ => return Err(err("no offset (Z, +HH:MM or -HH:MM) at the end")),
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset_seconds;
    let since_epoch = Duration::from_secs(seconds.unsigned_abs());
    let t = if seconds >= 0 { UNIX_EPOCH + since_epoch } else { UNIX_EPOCH - since_epoch };
    Ok(t + Duration::from_micros(micros))
}

/// `t` in RFC 3339 in UTC, to the microsecond (the fraction only when there is one).
pub fn format_rfc3339(t: SystemTime) -> String {
    let (seconds, micros) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_micros()),
        Err(e) => {
            let d = e.duration();
            let (s, us) = (d.as_secs() as i64, d.subsec_micros());
            if us == 0 {
                (-s, 0)
            } else {
                (-s - 1, 1_000_000 - us)
            }
        }
    };
    let (days, in_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (in_day / 3600, in_day % 3600 / 60, in_day % 60);
    let fraction = if micros == 0 { String::new() } else { format!(".{micros:06}") };
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}{fraction}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: i64, micros: u64) -> SystemTime {
        let t = if seconds >= 0 {
            UNIX_EPOCH + Duration::from_secs(seconds as u64)
        } else {
            UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs())
        };
        t + Duration::from_micros(micros)
    }

    #[test]
    fn rfc3339_times() {
        let cases = [
            ("1970-01-01T00:00:00Z", at(0, 0)),
            ("2000-01-01T00:00:00Z", at(946_684_800, 0)),
            ("2026-11-24T00:00:00Z", at(1_795_478_400, 0)),
            ("2026-11-24t01:00:00.5+01:00", at(1_795_478_400, 500_000)),
            ("2026-11-23 23:30:00.123456789-00:30", at(1_795_478_400, 123_456)),
            ("2024-02-29T12:00:00z", at(1_709_208_000, 0)),
            ("1969-12-31T23:59:59.75Z", at(-1, 750_000)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_rfc3339(text), Ok(want), "{text}");
        }
        assert_eq!(format_rfc3339(at(1_795_478_400, 500_000)), "2026-11-24T00:00:00.500000Z");
        assert_eq!(format_rfc3339(at(946_684_800, 0)), "2000-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(at(-1, 750_000)), "1969-12-31T23:59:59.750000Z");
        let bad = [
            ("2026-11-24", "not in the form YYYY-MM-DDTHH:MM:SS"),
            ("2026-11-24T10:30:00", "no offset (Z, +HH:MM or -HH:MM) at the end"),
            ("2026-11-24T10:30:00+0100", "no offset (Z, +HH:MM or -HH:MM) at the end"),
            ("2026-02-29T10:30:00Z", "no such date"),
            ("2026-13-01T10:30:00Z", "no such date"),
            ("2026-11-24T24:00:00Z", "no such time of day"),
            ("2026-11-24T23:59:60Z", "no such time of day"),
            ("2026-11-24T10:30:00.Z", "a fraction without digits"),
            ("2026-11-2xT10:30:00Z", "a date or time field is not a number"),
            ("2026-11-24T10:30:00Zjunk", "no offset (Z, +HH:MM or -HH:MM) at the end"),
            ("2026-11-24T10:30:00+25:00", "no such offset"),
        ];
        for (text, reason) in bad {
            assert_eq!(parse_rfc3339(text), Err(TimeParseError::Timestamp { text: text.into(), reason }), "{text}");
        }
        assert_eq!(
            parse_rfc3339("now").unwrap_err().to_string(),
            "invalid timestamp \"now\": not in the form YYYY-MM-DDTHH:MM:SS (expected RFC 3339, such as 2026-11-24T10:30:00Z)"
        );
    }

    #[test]
    fn durations() {
        for (text, ms, canonical) in [
            ("7d", 604_800_000, "7d"),
            ("24h", 86_400_000, "1d"),
            ("90m", 5_400_000, "90m"),
            ("1s", 1000, "1s"),
            ("1500ms", 1500, "1500ms"),
            ("0s", 0, "0s"),
        ] {
            let d: HumanDuration = text.parse().unwrap();
            assert_eq!(d.0, Duration::from_millis(ms), "{text}");
            assert_eq!(d.to_string(), canonical);
        }
        for bad in ["", "7", "d", "7 d", "7w", "-1s", "1.5h", "99999999999999999999d"] {
            assert_eq!(bad.parse::<HumanDuration>(), Err(TimeParseError::Duration { text: bad.into() }), "{bad:?}");
        }
        assert_eq!(serde_json::to_string(&HumanDuration(Duration::from_secs(3600))).unwrap(), "\"1h\"");
        assert!(serde_json::from_str::<HumanDuration>("3600").is_err());
    }

    proptest! {
        #[test]
        fn formatted_times_parse_back(micros in -10_000_000_000_000_000i64..200_000_000_000_000_000i64) {
            let t = at(micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000) as u64);
            prop_assert_eq!(parse_rfc3339(&format_rfc3339(t)), Ok(t));
        }

        #[test]
        fn parsing_never_panics(text in ".{0,40}") {
            let _ = parse_rfc3339(&text);
            let _ = text.parse::<HumanDuration>();
        }

        #[test]
        fn durations_round_trip(ms in 0u64..10_000_000_000_000) {
            let d = HumanDuration(Duration::from_millis(ms));
            prop_assert_eq!(d.to_string().parse::<HumanDuration>(), Ok(d));
        }
    }
}
