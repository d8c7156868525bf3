//! The startup of a replication connection: encryption requests declined, the startup
//! packet read and checked, the timeline it names found (the parent module's
//! documentation lists the parameters); with authentication on, the token asked for as a
//! cleartext password and checked.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut, Bytes};
use proto::{TenantId, TimelineId};
use tokio::io::AsyncReadExt;

use crate::stream::ReadHalf;

use super::messages::{message, put_cstr, sqlstate, PgError};
use super::{Conn, TIMELINE_OPTION};
use crate::access::Authenticator;

const STARTUP_PACKET_MAX: usize = 10_000;
const PROTOCOL_3_0: u32 = 3 << 16;
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

/// What the startup packet asked for.
pub(super) struct Startup {
    pub tenant: TenantId,
    pub timeline: TimelineId,
    pub application_name: Option<String>,
}

/// Reads a startup packet's length and code and its body, validating the length.
pub(super) async fn read_startup_packet(read: &mut ReadHalf) -> Result<Option<(u32, Bytes)>, PgError> {
    let mut head = [0u8; 4];
    match read.read_exact(&mut head).await {
        Ok(_) => {}
        // A client that connects and goes away (a port probe) is no error.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(PgError::fatal(sqlstate::CONNECTION_FAILURE, format!("could not read the startup packet: {e}"))),
    }
    let len = u32::from_be_bytes(head) as usize;
    if !(8..=STARTUP_PACKET_MAX).contains(&len) {
        return Err(PgError::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            format!("invalid length of startup packet: {len} bytes (expected 8 to {STARTUP_PACKET_MAX})"),
        ));
    }
    let mut body = vec![0u8; len - 4];
    read.read_exact(&mut body)
        .await
        .map_err(|e| PgError::fatal(sqlstate::PROTOCOL_VIOLATION, format!("incomplete startup packet ({len} bytes announced): {e}")))?;
    let mut body = Bytes::from(body);
    let code = body.get_u32();
    Ok(Some((code, body)))
}

/// Splits `key\0value\0...\0` into pairs.
pub(super) fn parse_startup_params(mut body: Bytes) -> Result<BTreeMap<String, String>, PgError> {
    let bad = |what: &str| PgError::fatal(sqlstate::PROTOCOL_VIOLATION, format!("invalid startup packet layout: {what}"));
    let cstr = |body: &mut Bytes| -> Result<String, PgError> {
        let n = body.iter().position(|&b| b == 0).ok_or_else(|| bad("expected terminator as last byte"))?;
        let s = body.split_to(n);
        body.advance(1);
        String::from_utf8(s.to_vec()).map_err(|_| bad("a parameter is not valid UTF-8"))
    };
    let mut params = BTreeMap::new();
    loop {
        let key = cstr(&mut body)?;
        if key.is_empty() {
            break;
        }
        let value = cstr(&mut body)?;
        params.insert(key, value);
    }
    if !body.is_empty() {
        return Err(bad("bytes after the terminator"));
    }
    Ok(params)
}

/// The value of `-c name=value` or `--name=value` in PostgreSQL's `options` string
/// (whitespace separates arguments; a backslash escapes the next character).
pub(super) fn option_value(options: &str, name: &str) -> Option<String> {
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.extend(chars.next()),
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    args.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        args.push(cur);
    }
    let mut found = None;
    let mut i = 0;
    while i < args.len() {
        let setting = if args[i] == "-c" {
            i += 1;
            args.get(i).map(String::as_str)
        } else {
            args[i].strip_prefix("-c").or_else(|| args[i].strip_prefix("--"))
        };
        if let Some((k, v)) = setting.and_then(|s| s.split_once('=')) {
            if k.replace('-', "_").eq_ignore_ascii_case(name) {
                found = Some(v.to_string());
            }
        }
        i += 1;
    }
    found
}

/// Parses `<tenant id>/<timeline id>`.
pub(super) fn parse_timeline_name(s: &str, from: &str) -> Result<(TenantId, TimelineId), PgError> {
    let bad = |why: String| {
        PgError::fatal(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{from} {s:?} does not name a timeline: {why} (expected <tenant id>/<timeline id>, 32 hex digits each)"),
        )
    };
    let (t, tl) = s.split_once('/').ok_or_else(|| bad("no '/'".into()))?;
    let tenant = t.parse::<TenantId>().map_err(|e| bad(e.to_string()))?;
    let timeline = tl.parse::<TimelineId>().map_err(|e| bad(e.to_string()))?;
    Ok((tenant, timeline))
}

/// Checks the startup parameters of a replication connection.
pub(super) fn check_startup(params: &BTreeMap<String, String>) -> Result<Startup, PgError> {
    match params.get("replication").map(|v| v.to_ascii_lowercase()) {
        Some(v) if ["true", "on", "yes", "1"].contains(&v.as_str()) => {}
        Some(v) if v == "database" => {
            return Err(PgError::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "logical replication (replication=database) is not served by a safekeeper; connect with replication=true",
            ))
        }
        Some(v) if ["false", "off", "no", "0"].contains(&v.as_str()) => {
            return Err(PgError::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "a safekeeper serves only physical replication connections, and this one has replication=false",
            ))
        }
        Some(v) => {
            return Err(PgError::fatal(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("invalid value for parameter \"replication\": {v:?} (expected true, on, yes or 1)"),
            ))
        }
        None => {
            return Err(PgError::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "a safekeeper serves only physical replication connections: the startup parameter replication=true is missing",
            ))
        }
    }
    if params.get("user").is_none_or(|u| u.is_empty()) {
        return Err(PgError::fatal(sqlstate::INVALID_AUTHORIZATION, "no PostgreSQL user name specified in startup packet"));
    }
    let (tenant, timeline) = match params.get("database").filter(|d| d.as_str() != "replication") {
        Some(db) => parse_timeline_name(db, "database")?,
        None => match params.get("options").and_then(|o| option_value(o, TIMELINE_OPTION)) {
            Some(v) => parse_timeline_name(&v, TIMELINE_OPTION)?,
            None => {
                return Err(PgError::fatal(
                    sqlstate::INVALID_CATALOG_NAME,
                    format!(
                        "no timeline named: set the startup parameter database=<tenant id>/<timeline id>, \
                         or options='-c {TIMELINE_OPTION}=<tenant id>/<timeline id>'"
                    ),
                ))
            }
        },
    };
    Ok(Startup { tenant, timeline, application_name: params.get("application_name").cloned() })
}

/// Runs the startup: `Ok(None)` if the client went away or cancelled.
pub(super) async fn startup(conn: &mut Conn) -> Result<Option<Startup>, PgError> {
    let read = conn.read.as_mut().expect("the reader is taken only after the startup");
    // At most one SSL and one GSS negotiation, as PostgreSQL allows.
    for _ in 0..3 {
        let Some((code, body)) = read_startup_packet(read).await? else { return Ok(None) };
        match code {
            SSL_REQUEST | GSSENC_REQUEST => {
                if !body.is_empty() {
                    return Err(PgError::fatal(sqlstate::PROTOCOL_VIOLATION, "invalid length of encryption request packet"));
                }
                super::write_flush(&mut conn.write, b"N")
                    .await
                    .map_err(|e| PgError::fatal(sqlstate::CONNECTION_FAILURE, format!("write to the client: {e}")))?;
            }
            CANCEL_REQUEST => {
                tracing::debug!("ignoring a cancel request: a replication connection has nothing to cancel");
                return Ok(None);
            }
            code if code >> 16 == 3 => {
                let params = parse_startup_params(body)?;
                let unknown_pq: Vec<&String> = params.keys().filter(|k| k.starts_with("_pq_.")).collect();
                if code != PROTOCOL_3_0 || !unknown_pq.is_empty() {
                    message(&mut conn.out, b'v', |b| {
                        b.put_u32(0);
                        b.put_u32(unknown_pq.len() as u32);
                        for k in &unknown_pq {
                            put_cstr(b, k);
                        }
                    });
                }
                return check_startup(&params).map(Some);
            }
            code => {
                return Err(PgError::fatal(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    format!("unsupported frontend protocol {}.{}: server supports 3.0", code >> 16, code & 0xffff),
                ))
            }
        }
    }
    Err(PgError::fatal(sqlstate::PROTOCOL_VIOLATION, "too many encryption requests before the startup packet"))
}

/// PostgreSQL's `AuthenticationCleartextPassword` code.
const AUTH_REQ_PASSWORD: u32 = 3;

/// Asks for the token as a cleartext password and checks it grants reading the timeline's
/// WAL (see the module documentation of `replication`). `Ok(Err(refusal))`: the `FATAL`
/// error to send, already logged and counted by the check; `Err`: the exchange itself
/// failed (a protocol violation, a broken connection).
pub(super) async fn authenticate(
    conn: &mut Conn,
    auth: &Authenticator,
    startup: &Startup,
) -> Result<Result<auth::Claims, PgError>, PgError> {
    let access = auth::Access::ReadWal { tenant: startup.tenant, timeline: startup.timeline };
    let request = "replication connection";
    let refuse = |e: auth::AuthError| {
        let code = if e.is_unauthenticated() { sqlstate::INVALID_PASSWORD } else { sqlstate::INVALID_AUTHORIZATION };
        PgError::fatal(code, e.to_string())
    };
    message(&mut conn.out, b'R', |b| b.put_u32(AUTH_REQ_PASSWORD));
    super::write_flush(&mut conn.write, &conn.out)
        .await
        .map_err(|e| PgError::fatal(sqlstate::CONNECTION_FAILURE, format!("write to the client: {e}")))?;
    conn.out.clear();
    let read = conn.read.as_mut().expect("the reader is taken only after the startup");
    let password = match read_password(read).await? {
        Password::Token(token) => token,
        Password::None => {
            // libpq closes the connection when it has no password to give.
            let e = auth::AuthError::Missing;
            auth.refused(&e, access, &conn.peer, request);
            return Ok(Err(refuse(e)));
        }
        Password::Refused(e) => {
            auth.refused(&e, access, &conn.peer, request);
            return Ok(Err(refuse(e)));
        }
    };
    Ok(auth.check(Some(&password), access, &conn.peer, request).map_err(refuse))
}

enum Password {
    Token(String),
    /// The client closed the connection or sent `Terminate` instead.
    None,
    /// A password that cannot be a token (too long, not UTF-8, no terminator).
    Refused(auth::AuthError),
}

/// Reads the `PasswordMessage` that answers `AuthenticationCleartextPassword`.
async fn read_password(read: &mut ReadHalf) -> Result<Password, PgError> {
    let mut head = [0u8; 5];
    match read.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Password::None),
        Err(e) => return Err(PgError::fatal(sqlstate::CONNECTION_FAILURE, format!("read from the client: {e}"))),
    }
    match head[0] {
        b'p' => {}
        b'X' => return Ok(Password::None),
        tag => {
            return Err(PgError::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                format!(
                    "expected a password message ('p') in answer to the request for a password, got message type {tag} ({:?})",
                    tag as char
                ),
            ))
        }
    }
    read.read_exact(&mut head[1..])
        .await
        .map_err(|e| PgError::fatal(sqlstate::PROTOCOL_VIOLATION, format!("unexpected EOF or error within a password message: {e}")))?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len < 5 {
        return Err(PgError::fatal(sqlstate::PROTOCOL_VIOLATION, format!("invalid length {len} of a password message")));
    }
    // The length counts itself and the terminating NUL.
    let token_bytes = len - 5;
    if token_bytes > auth::TOKEN_BYTES_MAX {
        // Not read: refused for its length alone.
        return Ok(Password::Refused(auth::AuthError::Malformed(format!(
            "{token_bytes} bytes, longer than the {} allowed",
            auth::TOKEN_BYTES_MAX
        ))));
    }
    let mut body = vec![0u8; len - 4];
    read.read_exact(&mut body)
        .await
        .map_err(|e| PgError::fatal(sqlstate::PROTOCOL_VIOLATION, format!("incomplete password message ({len} bytes announced): {e}")))?;
    if body.pop() != Some(0) || body.contains(&0) {
        return Ok(Password::Refused(auth::AuthError::Malformed("the password message is not one NUL-terminated string".into())));
    }
    match String::from_utf8(body) {
        Ok(token) => Ok(Password::Token(token)),
        Err(_) => Ok(Password::Refused(auth::AuthError::Malformed("the password is not UTF-8".into()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_timeline_from_options() {
        assert_eq!(option_value("-c fjord.timeline=a/b", TIMELINE_OPTION).as_deref(), Some("a/b"));
        assert_eq!(option_value("--fjord.timeline=a/b -c x=y", TIMELINE_OPTION).as_deref(), Some("a/b"));
        assert_eq!(option_value("-cfjord.timeline=a\\ b", TIMELINE_OPTION).as_deref(), Some("a b"));
        assert_eq!(option_value("-c other=1", TIMELINE_OPTION), None);
    }

    #[test]
    fn startup_parameters_are_checked() {
        let params = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        let t = "0123456789abcdef0123456789abcdef";
        let ok = check_startup(&params(&[("user", "u"), ("replication", "on"), ("database", &format!("{t}/{t}"))])).unwrap();
        assert_eq!(ok.tenant.to_string(), t);
        let e = |p: &[(&str, &str)]| check_startup(&params(p)).err().expect("refused");
        assert!(e(&[("user", "u"), ("database", &format!("{t}/{t}"))]).message.contains("replication=true is missing"));
        assert!(e(&[("user", "u"), ("replication", "database"), ("database", "x")]).message.contains("logical replication"));
        assert!(e(&[("user", "u"), ("replication", "maybe")]).message.contains("invalid value"));
        assert_eq!(e(&[("user", "u"), ("replication", "true"), ("database", "nope")]).code, sqlstate::INVALID_PARAMETER_VALUE);
        assert_eq!(e(&[("user", "u"), ("replication", "true"), ("database", "replication")]).code, sqlstate::INVALID_CATALOG_NAME);
        assert_eq!(e(&[("replication", "true"), ("database", &format!("{t}/{t}"))]).code, sqlstate::INVALID_AUTHORIZATION);
    }
}
