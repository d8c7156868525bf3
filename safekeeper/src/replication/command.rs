//! Replication commands: the tokenizer (after PostgreSQL's `repl_scanner.l`) and parser
//! (after `repl_gram.y`) for the commands a safekeeper serves, and the text of a Query
//! message.

use bytes::Bytes;
use proto::Lsn;

use super::messages::{sqlstate, PgError};
use super::{SERVER_VERSION, SERVER_VERSION_NUM};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Token {
    /// A keyword or identifier, lowercased.
    Word(String),
    /// A double-quoted identifier, as written.
    Quoted(String),
    Lsn(Lsn),
    Number(u64),
    Semicolon,
    Other(char),
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::Word(w) => write!(f, "{w}"),
            Token::Quoted(q) => write!(f, "{q:?}"),
            Token::Lsn(l) => write!(f, "{l}"),
            Token::Number(n) => write!(f, "{n}"),
            Token::Semicolon => write!(f, ";"),
            Token::Other(c) => write!(f, "{c}"),
        }
    }
}

/// Splits a replication command into tokens, as PostgreSQL's `repl_scanner.l` does for the
/// part of the grammar served here.
pub(super) fn tokenize(s: &str) -> Result<Vec<Token>, String> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    let mut tokens = Vec::new();
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
        } else if c == ';' {
            tokens.push(Token::Semicolon);
            rest = &rest[1..];
        } else if c == '"' {
            let mut ident = String::new();
            let mut chars = rest[1..].char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                if c == '"' {
                    if rest[1 + i + 1..].starts_with('"') {
                        ident.push('"');
                        chars.next();
                    } else {
                        end = Some(1 + i + 1);
                        break;
                    }
                } else {
                    ident.push(c);
                }
            }
            let end = end.ok_or("unterminated quoted identifier")?;
            if ident.is_empty() {
                return Err("zero-length delimited identifier".into());
            }
            tokens.push(Token::Quoted(ident));
            rest = &rest[end..];
        } else if is_word(c) {
            let n = rest.find(|c: char| !is_word(c)).unwrap_or(rest.len());
            let word = &rest[..n];
            let after = &rest[n..];
            if after.starts_with('/') && word.bytes().all(|b| b.is_ascii_hexdigit()) {
                let m = after[1..].find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(after.len() - 1);
                let text = &rest[..n + 1 + m];
                let lsn = text.parse::<Lsn>().map_err(|e| e.to_string())?;
                tokens.push(Token::Lsn(lsn));
                rest = &rest[n + 1 + m..];
            } else {
                if word.bytes().all(|b| b.is_ascii_digit()) {
                    tokens.push(Token::Number(word.parse().map_err(|_| format!("number {word} is out of range"))?));
                } else {
                    tokens.push(Token::Word(word.to_ascii_lowercase()));
                }
                rest = after;
            }
        } else {
            tokens.push(Token::Other(c));
            rest = &rest[c.len_utf8()..];
        }
    }
    if tokens.last() == Some(&Token::Semicolon) {
        tokens.pop();
    }
    Ok(tokens)
}

/// A parsed command.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Command {
    IdentifySystem,
    Show(String),
    StartReplication {
        start: Lsn,
        timeline: Option<u64>,
    },
    /// fjord's: the pageserver's remote-consistent LSN and its attachment generation.
    FjordRemoteConsistentLsn {
        generation: u32,
        lsn: Lsn,
    },
}

pub(super) fn syntax_error(command: &str, what: String) -> PgError {
    PgError::error(sqlstate::SYNTAX_ERROR, format!("syntax error in {command}: {what}"))
}

pub(super) fn expect_end(command: &str, tokens: &[Token]) -> Result<(), PgError> {
    match tokens.first() {
        None => Ok(()),
        Some(t) => Err(syntax_error(command, format!("unexpected \"{t}\""))),
    }
}

pub(super) fn parse_command(tokens: &[Token]) -> Result<Command, PgError> {
    let Some(first) = tokens.first() else { unreachable!("empty queries are answered before parsing") };
    let rest = &tokens[1..];
    let word = |t: Option<&Token>| match t {
        Some(Token::Word(w)) => Some(w.clone()),
        _ => None,
    };
    match word(Some(first)).as_deref() {
        Some("identify_system") => {
            expect_end("IDENTIFY_SYSTEM", rest)?;
            Ok(Command::IdentifySystem)
        }
        Some("show") => {
            // var_name: IDENT ('.' IDENT)*
            let mut name = String::new();
            let mut rest = rest;
            loop {
                match rest.first() {
                    Some(Token::Word(w)) | Some(Token::Quoted(w)) => name.push_str(w),
                    Some(t) => return Err(syntax_error("SHOW", format!("expected a parameter name, found \"{t}\""))),
                    None => return Err(syntax_error("SHOW", "expected a parameter name".into())),
                }
                rest = &rest[1..];
                if rest.first() == Some(&Token::Other('.')) {
                    name.push('.');
                    rest = &rest[1..];
                } else {
                    break;
                }
            }
            expect_end("SHOW", rest)?;
            Ok(Command::Show(name))
        }
        Some("start_replication") => {
            const C: &str = "START_REPLICATION";
            let mut rest = rest;
            if word(rest.first()).as_deref() == Some("slot") {
                match rest.get(1) {
                    Some(Token::Word(_) | Token::Quoted(_)) => rest = &rest[2..],
                    _ => return Err(syntax_error(C, "expected a slot name after SLOT".into())),
                }
            }
            match word(rest.first()).as_deref() {
                Some("physical") => rest = &rest[1..],
                Some("logical") => {
                    return Err(PgError::error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "logical replication is not served by a safekeeper; use START_REPLICATION [PHYSICAL] X/X",
                    ))
                }
                _ => {}
            }
            let start = match rest.first() {
                Some(Token::Lsn(l)) => *l,
                Some(t) => return Err(syntax_error(C, format!("expected a start LSN such as 0/16B3748, found \"{t}\""))),
                None => return Err(syntax_error(C, "expected a start LSN such as 0/16B3748".into())),
            };
            rest = &rest[1..];
            let mut timeline = None;
            if word(rest.first()).as_deref() == Some("timeline") {
                match rest.get(1) {
                    Some(Token::Number(n)) => timeline = Some(*n),
                    _ => return Err(syntax_error(C, "expected a timeline number after TIMELINE".into())),
                }
                rest = &rest[2..];
            }
            expect_end(C, rest)?;
            Ok(Command::StartReplication { start, timeline })
        }
        Some("fjord_remote_consistent_lsn") => {
            const C: &str = "FJORD_REMOTE_CONSISTENT_LSN";
            let generation = match rest.first() {
                Some(Token::Number(n)) => u32::try_from(*n).map_err(|_| syntax_error(C, format!("generation {n} is out of range")))?,
                Some(t) => return Err(syntax_error(C, format!("expected a generation number, found \"{t}\""))),
                None => return Err(syntax_error(C, "expected a generation number and an LSN".into())),
            };
            let lsn = match rest.get(1) {
                Some(Token::Lsn(l)) => *l,
                Some(t) => return Err(syntax_error(C, format!("expected an LSN such as 0/16B3748, found \"{t}\""))),
                None => return Err(syntax_error(C, "expected an LSN such as 0/16B3748 after the generation".into())),
            };
            expect_end(C, &rest[2..])?;
            Ok(Command::FjordRemoteConsistentLsn { generation, lsn })
        }
        Some(
            w @ ("timeline_history"
            | "base_backup"
            | "create_replication_slot"
            | "drop_replication_slot"
            | "read_replication_slot"
            | "upload_manifest"),
        ) => Err(PgError::error(
            sqlstate::FEATURE_NOT_SUPPORTED,
            format!("{} is not supported by a safekeeper (it serves IDENTIFY_SYSTEM, SHOW and START_REPLICATION)", w.to_ascii_uppercase()),
        )),
        _ => Err(PgError::error(
            sqlstate::FEATURE_NOT_SUPPORTED,
            format!(
                "unknown replication command starting with \"{first}\": a safekeeper serves only \
                 IDENTIFY_SYSTEM, SHOW and START_REPLICATION (SQL is not accepted on physical replication connections)"
            ),
        )),
    }
}

/// The text of a Query message: one NUL-terminated UTF-8 string and nothing after it.
pub(super) fn query_text(body: &Bytes) -> Result<&str, PgError> {
    let n = body
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| PgError::error(sqlstate::PROTOCOL_VIOLATION, "invalid string in message: the query string is not NUL-terminated"))?;
    if n + 1 != body.len() {
        return Err(PgError::error(
            sqlstate::PROTOCOL_VIOLATION,
            format!("invalid message format: {} bytes after the query string", body.len() - n - 1),
        ));
    }
    std::str::from_utf8(&body[..n]).map_err(|e| {
        PgError::error(sqlstate::CHARACTER_NOT_IN_REPERTOIRE, format!("invalid byte sequence for encoding \"UTF8\" in the query: {e}"))
    })
}

/// The value `SHOW name` answers, if it is one served here.
pub(super) fn show_value(name: &str, wal_segment_size: u32) -> Option<String> {
    Some(match name.to_ascii_lowercase().as_str() {
        // As PostgreSQL shows it: in the largest unit that divides it.
        "wal_segment_size" if wal_segment_size.is_multiple_of(1 << 30) => format!("{}GB", wal_segment_size >> 30),
        "wal_segment_size" => format!("{}MB", wal_segment_size >> 20),
        "server_version" => SERVER_VERSION.into(),
        "server_version_num" => SERVER_VERSION_NUM.into(),
        "data_directory_mode" => "0700".into(),
        "integer_datetimes" => "on".into(),
        "server_encoding" | "client_encoding" => "UTF8".into(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizes_replication_commands() {
        assert_eq!(
            tokenize("start_replication SLOT \"My\"\"slot\" physical 1A/B374D848 TIMELINE 1;").unwrap(),
            vec![
                Token::Word("start_replication".into()),
                Token::Word("slot".into()),
                Token::Quoted("My\"slot".into()),
                Token::Word("physical".into()),
                Token::Lsn(Lsn(0x1A_B374_D848)),
                Token::Word("timeline".into()),
                Token::Number(1),
            ]
        );
        assert_eq!(tokenize("  ;  ").unwrap(), vec![]);
        assert!(tokenize("START_REPLICATION 1/ZZ").is_err());
        assert!(tokenize("SHOW \"unterminated").is_err());
        assert!(tokenize("START_REPLICATION 123456789/0").is_err());
    }

    #[test]
    fn parses_commands() {
        let parse = |s: &str| parse_command(&tokenize(s).unwrap());
        assert_eq!(parse("identify_system").unwrap(), Command::IdentifySystem);
        assert_eq!(parse("SHOW wal_segment_size;").unwrap(), Command::Show("wal_segment_size".into()));
        assert_eq!(parse("START_REPLICATION 0/3000000").unwrap(), Command::StartReplication { start: Lsn(0x300_0000), timeline: None });
        assert_eq!(
            parse("START_REPLICATION SLOT s PHYSICAL 0/3000000 TIMELINE 1").unwrap(),
            Command::StartReplication { start: Lsn(0x300_0000), timeline: Some(1) }
        );
        assert_eq!(
            parse("FJORD_REMOTE_CONSISTENT_LSN 3 1/16B3748").unwrap(),
            Command::FjordRemoteConsistentLsn { generation: 3, lsn: Lsn(0x1_016B_3748) }
        );
        for bad in [
            "FJORD_REMOTE_CONSISTENT_LSN",
            "FJORD_REMOTE_CONSISTENT_LSN 3",
            "FJORD_REMOTE_CONSISTENT_LSN 0/1 3",
            "FJORD_REMOTE_CONSISTENT_LSN 4294967296 0/1",
            "FJORD_REMOTE_CONSISTENT_LSN 3 0/1 x",
        ] {
            assert_eq!(parse(bad).unwrap_err().code, sqlstate::SYNTAX_ERROR, "{bad}");
        }
        for bad in
            ["IDENTIFY_SYSTEM now", "START_REPLICATION", "START_REPLICATION PHYSICAL", "START_REPLICATION 0/1 TIMELINE", "SHOW", "SHOW 1"]
        {
            assert_eq!(parse(bad).unwrap_err().code, sqlstate::SYNTAX_ERROR, "{bad}");
        }
        for unsupported in ["TIMELINE_HISTORY 1", "BASE_BACKUP", "SELECT 1", "START_REPLICATION SLOT s LOGICAL 0/1"] {
            let e = parse(unsupported).unwrap_err();
            assert_eq!(e.code, sqlstate::FEATURE_NOT_SUPPORTED, "{unsupported}");
            assert!(!e.fatal);
        }
    }
}
