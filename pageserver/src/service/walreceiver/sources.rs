//! The list of servers a WAL receiver may stream from, as the management API accepts it
//! and as `wal_receiver.json` persists it.
//!
//! Two JSON shapes are accepted, both with unknown fields refused: the original single
//! source `{"host", "port", "user"}` (a compute's walsender) and `{"sources": [...]}` (the
//! timeline's safekeepers, or any list of walsenders serving the same WAL). Both become a
//! [`WalSources`]; it is always written back in the list shape, and reading accepts both, so
//! files written before lists existed still load. The list shape may carry a `token`, which
//! the receiver presents to a source that asks for a password.
//!
//! Who may set them is the server's rule (`Pageserver::start_wal_receiver`): an admin sets
//! and changes a timeline's sources; a compute may only restart the registered ones.
//!
//! Invariant: a `WalSources` holds 1..=`SOURCES_MAX` sources, no port 0, no empty host or
//! user, and no two with the same host and port. Validation happens here, when bytes
//! become the type, so the receiver never meets an invalid list.

use std::fmt;

use pageserver_api::models::WalSourceList;
use serde::Serialize;

/// At most this many sources per receiver: three safekeepers is the expected case, and a
/// lag probe connects to every other source at once.
pub const SOURCES_MAX: usize = 16;

/// One server to stream from: the management API's type, so that what a client sends is
/// what the receiver connects to.
pub use pageserver_api::models::WalSource;

/// A validated, non-empty list of sources, in the order the receiver tries them, and the
/// token the receiver presents to them (if the admin who registered them gave one).
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct WalSources {
    sources: Vec<WalSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
}

/// Never shows the token.
impl fmt::Debug for WalSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WalSources").field("sources", &self.sources).field("token", &self.token.as_ref().map(|_| "<redacted>")).finish()
    }
}

impl WalSources {
    pub fn new(sources: Vec<WalSource>) -> Result<WalSources, String> {
        if sources.is_empty() {
            return Err("sources must not be empty".into());
        }
        if sources.len() > SOURCES_MAX {
            return Err(format!("too many sources: {}, at most {SOURCES_MAX}", sources.len()));
        }
        for (i, s) in sources.iter().enumerate() {
            if s.host.is_empty() {
                return Err(format!("source {i} has an empty host"));
            }
            if s.user.is_empty() {
                return Err(format!("source {i} ({s}) has an empty user"));
            }
            if s.port == 0 {
                return Err(format!("source {i} has an invalid port: 0"));
            }
            if let Some(j) = sources[..i].iter().position(|o| o.host == s.host && o.port == s.port) {
                return Err(format!("duplicate source {s}: sources {j} and {i}"));
            }
        }
        Ok(WalSources { sources, token: None })
    }

    /// The same list with the token the receiver presents to its sources.
    pub fn with_token(mut self, token: Option<String>) -> WalSources {
        self.token = token.map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
        self
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The first source in `other` that is not one of these (same host, port and user), if
    /// any: what a caller who may not change a timeline's sources named beyond them.
    pub fn first_not_among<'a>(&self, other: &'a WalSources) -> Option<&'a WalSource> {
        other.sources.iter().find(|o| !self.sources.contains(o))
    }

    /// Parses either JSON shape (see the module documentation) and validates the list.
    pub fn from_json(bytes: &[u8]) -> Result<WalSources, String> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        // serde would also take a struct as an array of its fields; only objects are meant.
        let Some(object) = value.as_object() else {
            return Err(format!("expected a JSON object, got {value}"));
        };
        let is_list = object.contains_key("sources");
        if let Some(list) = object.get("sources").and_then(|l| l.as_array()) {
            if let Some((i, v)) = list.iter().enumerate().find(|(_, v)| !v.is_object()) {
                return Err(format!("source {i} is not a JSON object: {v}"));
            }
        }
        let (sources, token) = if is_list {
            let list = serde_json::from_value::<WalSourceList>(value).map_err(|e| e.to_string())?;
            (list.sources, list.token)
        } else {
            (vec![serde_json::from_value::<WalSource>(value).map_err(|e| e.to_string())?], None)
        };
        Ok(WalSources::new(sources)?.with_token(token))
    }

    /// The list shape, which `from_json` reads back (with the token: the file that holds it
    /// is private to the pageserver's user).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a list of strings and numbers encodes")
    }

    pub fn as_slice(&self) -> &[WalSource] {
        &self.sources
    }

    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Never true (a `WalSources` has at least one source); here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }
}

impl From<WalSource> for WalSources {
    fn from(source: WalSource) -> WalSources {
        WalSources::new(vec![source]).expect("a single source is a valid list")
    }
}

impl fmt::Display for WalSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.sources.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(host: &str, port: u16) -> WalSource {
        WalSource { host: host.into(), port, user: "u".into(), plaintext: false }
    }

    #[test]
    fn both_shapes_parse() {
        let one = WalSources::from_json(br#"{"host": "127.0.0.1", "port": 5432, "user": "postgres"}"#).unwrap();
        assert_eq!(one.as_slice(), &[WalSource { host: "127.0.0.1".into(), port: 5432, user: "postgres".into(), plaintext: false }]);
        let list = WalSources::from_json(
            br#"{"sources": [{"host": "a", "port": 1, "user": "u"}, {"host": "a", "port": 2, "user": "u"}, {"host": "b", "port": 1, "user": "u"}]}"#,
        )
        .unwrap();
        assert_eq!(list.as_slice(), &[src("a", 1), src("a", 2), src("b", 1)]);
        assert_eq!(list.to_string(), "a:1, a:2, b:1");
    }

    #[test]
    fn invalid_bodies_are_refused_with_a_reason() {
        let cases: &[(&str, &str)] = &[
            (r#"{"sources": []}"#, "sources must not be empty"),
            (
                r#"{"sources": [{"host": "a", "port": 1, "user": "u"}, {"host": "a", "port": 1, "user": "v"}]}"#,
                "duplicate source a:1: sources 0 and 1",
            ),
            (r#"{"sources": [{"host": "a", "port": 0, "user": "u"}]}"#, "source 0 has an invalid port: 0"),
            (r#"{"host": "a", "port": 0, "user": "u"}"#, "source 0 has an invalid port: 0"),
            (r#"{"host": "", "port": 1, "user": "u"}"#, "source 0 has an empty host"),
            (r#"{"host": "a", "port": 1, "user": ""}"#, "source 0 (a:1) has an empty user"),
            (r#"{"sources": [{"host": "a", "port": 1, "user": "u"}], "extra": 1}"#, "unknown field `extra`"),
            (r#"{"sources": [{"host": "a", "port": 1, "user": "u", "password": "x"}]}"#, "unknown field `password`"),
            (r#"{"host": "a", "port": 1, "user": "u", "dbname": "x"}"#, "unknown field `dbname`"),
            (r#"{"host": "a", "port": 70000, "user": "u"}"#, "invalid value: integer `70000`"),
            (r#"{"host": "a", "user": "u"}"#, "missing field `port`"),
            (r#"{"sources": {"host": "a", "port": 1, "user": "u"}}"#, "invalid type: map, expected a sequence"),
            (r#"["a", 1, "u"]"#, "expected a JSON object, got [\"a\",1,\"u\"]"),
            (r#"{"sources": [["a", 1, "u"]]}"#, "source 0 is not a JSON object: [\"a\",1,\"u\"]"),
            (r#"{"#, "EOF while parsing"),
        ];
        for (body, expected) in cases {
            let err = WalSources::from_json(body.as_bytes()).unwrap_err();
            assert!(err.contains(expected), "{body}: {err:?} does not contain {expected:?}");
        }
        let seventeen: Vec<WalSource> = (1..=17).map(|p| src("h", p)).collect();
        assert_eq!(WalSources::new(seventeen).unwrap_err(), "too many sources: 17, at most 16");
        let sixteen: Vec<WalSource> = (1..=16).map(|p| src("h", p)).collect();
        assert_eq!(WalSources::new(sixteen).unwrap().len(), 16);
    }

    #[test]
    fn persisted_form_round_trips_and_old_files_load() {
        let list = WalSources::new(vec![src("a", 1), src("::1", 2)]).unwrap();
        assert_eq!(list.to_string(), "a:1, [::1]:2");
        assert_eq!(WalSources::from_json(&list.to_json()).unwrap(), list);
        let with_token = list.clone().with_token(Some("t0k3n".into()));
        assert_eq!(WalSources::from_json(&with_token.to_json()).unwrap(), with_token);
        assert_eq!(with_token.token(), Some("t0k3n"));
        assert!(!format!("{with_token:?}").contains("t0k3n"), "Debug shows no token");
        assert_eq!(list.first_not_among(&with_token), None);
        let other = WalSources::new(vec![src("a", 1), src("c", 3)]).unwrap();
        assert_eq!(list.first_not_among(&other), Some(&src("c", 3)));
        // What `wal_receiver.json` held before lists existed.
        let old = serde_json::to_vec_pretty(&src("127.0.0.1", 5432)).unwrap();
        assert_eq!(WalSources::from_json(&old).unwrap(), WalSources::from(src("127.0.0.1", 5432)));
    }
}
