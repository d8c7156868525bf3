//! The list of safekeepers a compute proposes to, `host:port,host:port,...`: one parser for
//! both places that read it (compute_ctl's `--safekeepers`, the extension's
//! `fjord.safekeepers`), so that a list one accepts the other accepts too, and both refuse
//! a bad one with the same words.
//!
//! Rules: entries separated by commas (spaces around them ignored), none empty; each is
//! `host:port` with a port from 1 to 65535; an IPv6 address is written `[addr]:port`, as in
//! a URL; no entry twice; at most [`SAFEKEEPERS_MAX`] entries.

/// The most safekeepers a compute may name: the quorum is a majority of them, and more than
/// 7 only adds latency to every commit without a failure model that needs it.
pub const SAFEKEEPERS_MAX: usize = 7;

/// One safekeeper of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafekeeperAddr {
    /// As written (`[v6]:port` keeps its brackets): what a connection is made to.
    pub addr: String,
    /// The host without brackets (for a PostgreSQL connection string).
    pub host: String,
    pub port: u16,
}

/// A list that cannot be used. Its message starts with the name of the setting the list came
/// from (`fjord.safekeepers entry "a:0" has an invalid port "0" (1-65535)`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting} {problem}")]
pub struct SafekeeperListError {
    /// The setting's name as the user knows it (`fjord.safekeepers`, `--safekeepers`).
    pub setting: String,
    pub problem: SafekeeperListProblem,
}

/// What is wrong with a list.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SafekeeperListProblem {
    #[error("\"{list}\" has an empty entry")]
    EmptyEntry { list: String },
    #[error("entry \"{entry}\" is not host:port")]
    NotHostPort { entry: String },
    #[error("entry \"{entry}\" has no valid host")]
    InvalidHost { entry: String },
    #[error("entry \"{entry}\": write an IPv6 address as [addr]:port")]
    BareIpv6 { entry: String },
    #[error("entry \"{entry}\" has an invalid port \"{port}\" (1-65535)")]
    InvalidPort { entry: String, port: String },
    #[error("names \"{entry}\" twice")]
    Duplicate { entry: String },
    #[error("names {count} safekeepers; at most {SAFEKEEPERS_MAX} are supported")]
    TooMany { count: usize },
}

/// Parses `text`, the value of the setting named `setting` (named in the error).
pub fn parse_safekeeper_list(setting: &str, text: &str) -> Result<Vec<SafekeeperAddr>, SafekeeperListError> {
    parse(text).map_err(|problem| SafekeeperListError { setting: setting.to_string(), problem })
}

fn parse(text: &str) -> Result<Vec<SafekeeperAddr>, SafekeeperListProblem> {
    use SafekeeperListProblem::*;
    let mut list: Vec<SafekeeperAddr> = Vec::new();
    for entry in text.split(',').map(str::trim) {
        let owned = || entry.to_string();
        if entry.is_empty() {
            return Err(EmptyEntry { list: text.to_string() });
        }
        let Some((host, port)) = entry.rsplit_once(':') else { return Err(NotHostPort { entry: owned() }) };
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if bare.is_empty() || bare.contains(|c: char| c.is_whitespace() || c == '[' || c == ']') {
            return Err(InvalidHost { entry: owned() });
        }
        // Without brackets, `::1:5454` would be ambiguous about where the port starts.
        if bare.contains(':') && bare == host {
            return Err(BareIpv6 { entry: owned() });
        }
        let port = match port.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => return Err(InvalidPort { entry: owned(), port: port.to_string() }),
        };
        if list.iter().any(|s| s.addr == entry) {
            return Err(Duplicate { entry: owned() });
        }
        list.push(SafekeeperAddr { addr: owned(), host: bare.to_string(), port });
    }
    if list.len() > SAFEKEEPERS_MAX {
        return Err(TooMany { count: list.len() });
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse() {
        let l = parse_safekeeper_list("x", "127.0.0.1:5454, sk2:5455,[::1]:5456").unwrap();
        let got: Vec<(&str, &str, u16)> = l.iter().map(|s| (s.addr.as_str(), s.host.as_str(), s.port)).collect();
        assert_eq!(got, [("127.0.0.1:5454", "127.0.0.1", 5454), ("sk2:5455", "sk2", 5455), ("[::1]:5456", "::1", 5456)]);
    }

    /// The messages are the ones test_runner/compute/test_walproposer.py expects from the
    /// extension (with `fjord.safekeepers` as the setting).
    #[test]
    fn bad_lists_are_named() {
        let nine = (0..9).map(|i| format!("h{i}:1")).collect::<Vec<_>>().join(",");
        for (bad, message) in [
            ("", r#"fjord.safekeepers "" has an empty entry"#),
            ("a:1,,b:2", r#"fjord.safekeepers "a:1,,b:2" has an empty entry"#),
            ("localhost", r#"fjord.safekeepers entry "localhost" is not host:port"#),
            ("a:0", r#"fjord.safekeepers entry "a:0" has an invalid port "0" (1-65535)"#),
            ("a:99999", r#"fjord.safekeepers entry "a:99999" has an invalid port "99999" (1-65535)"#),
            ("a:x", r#"fjord.safekeepers entry "a:x" has an invalid port "x" (1-65535)"#),
            (":5454", r#"fjord.safekeepers entry ":5454" has no valid host"#),
            ("a b:5454", r#"fjord.safekeepers entry "a b:5454" has no valid host"#),
            ("[]:5454", r#"fjord.safekeepers entry "[]:5454" has no valid host"#),
            ("::1:5454", r#"fjord.safekeepers entry "::1:5454": write an IPv6 address as [addr]:port"#),
            ("a:1,a:1,b:1", r#"fjord.safekeepers names "a:1" twice"#),
            (&nine, "fjord.safekeepers names 9 safekeepers; at most 7 are supported"),
        ] {
            let err = parse_safekeeper_list("fjord.safekeepers", bad).unwrap_err();
            assert_eq!(err.to_string(), message, "{bad:?}");
        }
    }
}
