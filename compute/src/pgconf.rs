//! The configuration files compute_ctl writes into a fresh data directory.
//!
//! A compute is stateless: every start fetches a new basebackup and writes these files
//! from scratch, so they are rendered here from typed settings and never edited in place.
//! The one change while postgres runs is a new page service address (the tenant moved):
//! `postgresql.conf` is then rendered again with it and replaced whole.
//! The text is pure (no I/O) so that unit tests can hold it to what the extension and the
//! pageserver expect.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use proto::{Lsn, TenantId, TimelineId};

/// What goes into `postgresql.conf`.
#[derive(Clone, Debug)]
pub struct ComputeSettings {
    /// `listen_addresses`.
    pub listen: String,
    pub port: u16,
    /// `host:port` of the pageserver's page service, for the extension.
    pub pageserver_pg: String,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// The cluster CA's certificate file (`fjord.tls_ca_file`): the extension's page service
    /// connections are TLS, and the pageserver's certificate must be signed by it and name
    /// the host in `pageserver_pg`. `None`: cleartext (a cluster made with `--no-tls`).
    pub tls_ca_file: Option<String>,
    pub shared_buffers: String,
    /// Set for a compute started at a past LSN: it must not add WAL to its branch, so it
    /// is read-only and the pageserver does not follow it.
    pub static_lsn: Option<Lsn>,
    /// `host:port,...` of the safekeepers (`fjord.safekeepers`): the compute's WAL goes to
    /// them and a commit waits for a majority. `None`: the pageserver follows the compute
    /// directly and a commit waits for it.
    pub safekeepers: Option<String>,
    /// Where postgres puts its Unix-domain socket; `None` leaves TCP only.
    pub socket_dir: Option<String>,
    /// A read replica (hot standby): the `primary_conninfo` that streams the branch's
    /// committed WAL from the safekeepers ([`replica_conninfo`]). Such a compute writes no
    /// WAL and has no WAL proposer.
    pub replica_conninfo: Option<String>,
    /// `-c name=value` settings, appended last so that they win.
    pub overrides: Vec<(String, String)>,
}

/// The longest socket directory we put a socket in: `sun_path` holds 107 bytes, and the
/// socket's own name (`.s.PGSQL.65535`) takes 15 of them.
const SOCKET_DIR_LEN_MAX: usize = 90;

/// The socket directory for a data directory: the data directory itself when its path is
/// short enough, else none (TCP only). Keeping the socket inside the data directory means two
/// computes never share a socket directory and a refetch removes a stale socket.
pub fn socket_dir_for(pgdata: &Path) -> Option<String> {
    let s = pgdata.to_str()?;
    (s.len() <= SOCKET_DIR_LEN_MAX).then(|| s.to_string())
}

/// Quotes a value for postgresql.conf: single quotes, with embedded ones doubled and
/// backslashes (the configuration file's escape character) doubled. Quoting every value is
/// valid for every GUC type, so `-c` values need no type knowledge.
pub fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Parses a `-c name=value` argument.
pub fn parse_override(arg: &str) -> anyhow::Result<(String, String)> {
    let Some((name, value)) = arg.split_once('=') else {
        bail!("invalid setting {arg:?}: expected name=value");
    };
    let name = name.trim();
    let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    if !valid {
        bail!("invalid setting name {name:?}: use letters, digits, '_' and '.'");
    }
    Ok((name.to_string(), value.to_string()))
}

pub fn postgresql_conf(s: &ComputeSettings) -> String {
    let mut out = String::new();
    let mut set = |name: &str, value: &str| {
        let _ = writeln!(out, "{name} = {}", quote(value));
    };
    set("listen_addresses", &s.listen);
    set("port", &s.port.to_string());
    set("unix_socket_directories", s.socket_dir.as_deref().unwrap_or(""));
    set("shared_buffers", &s.shared_buffers);
    set("shared_preload_libraries", "fjord");
    set("fjord.pageserver_address", &s.pageserver_pg);
    set("fjord.tenant_id", &s.tenant_id.to_string());
    set("fjord.timeline_id", &s.timeline_id.to_string());
    set("fjord.tls_ca_file", s.tls_ca_file.as_deref().unwrap_or(""));
    // Without safekeepers the pageserver follows the compute over physical replication (WAL
    // senders), and the compute's own pg_wal is the only place it can re-read WAL from after
    // a reconnect; with safekeepers, the WAL proposer reads what a lagging safekeeper lacks
    // from pg_wal. Either way: keep plenty.
    set("wal_level", "replica");
    set("max_wal_senders", "10");
    set("max_replication_slots", "10");
    set("wal_keep_size", "1GB");
    match s.static_lsn {
        _ if s.replica_conninfo.is_some() => {
            // A hot standby: it replays what the safekeepers have committed (only on the
            // pages it holds; the extension's redo filter leaves the rest to the
            // pageserver) and reads every page at its replay position. Its feedback
            // (replay position, oldest snapshot) goes to the safekeepers every second.
            set("hot_standby", "on");
            set("primary_conninfo", s.replica_conninfo.as_deref().unwrap_or_default());
            set("hot_standby_feedback", "on");
            set("wal_receiver_status_interval", "1s");
            set("wal_retrieve_retry_interval", "1s");
            set("synchronous_standby_names", "");
        }
        None if s.safekeepers.is_some() => {
            // The extension's WAL proposer streams the WAL to the safekeepers and releases
            // a committing backend once a majority has it (it is the standby `walproposer`).
            set("fjord.safekeepers", s.safekeepers.as_deref().unwrap_or_default());
            set("synchronous_standby_names", "walproposer");
        }
        None => {
            // A commit is acknowledged only once the pageserver (application_name
            // `fjord_pageserver`) has flushed it: the compute keeps no data files of its own.
            set("synchronous_standby_names", "fjord_pageserver");
        }
        Some(lsn) => {
            // A compute at a past LSN is not followed by the pageserver: nothing to wait for,
            // and nothing may be written. Every page is read as of that LSN.
            set("synchronous_standby_names", "");
            set("default_transaction_read_only", "on");
            set("fjord.read_lsn", &lsn.to_string());
        }
    }
    set("synchronous_commit", "on");
    // With safekeepers, a commit is durable once a majority of them flushed it; the
    // compute's own pg_wal is only where the WAL proposer reads it from (PostgreSQL's flush
    // LSN still advances only after the write), and a compute never restarts on its data
    // directory. An fsync there would add a disk flush to every commit and protect nothing.
    // Without safekeepers the pageserver is the durable copy, and local fsync stays on as
    // before.
    // A replica's pg_wal holds only what it streamed from the safekeepers: no fsync either.
    set("fsync", if (s.safekeepers.is_some() && s.static_lsn.is_none()) || s.replica_conninfo.is_some() { "off" } else { "on" });
    // No page a compute writes can be torn: it never writes a data page to a disk that
    // recovery would read (pages live in the pageserver, rebuilt from WAL; the local file
    // cache is never a redo base and is dropped after a crash), so full-page images
    // protect nothing and cost 8 KiB per page per checkpoint through every safekeeper
    // and the pageserver's ingest (docs/decisions/0012-full-page-writes-off.md).
    // `-c full_page_writes=on` turns them back on: overrides come last.
    set("full_page_writes", "off");
    // A crashed compute is replaced by a new one from a basebackup, not restarted locally:
    // local crash recovery would replay WAL the pageserver may not have.
    set("restart_after_crash", "off");
    // compute_ctl sends postgres' stderr to a file; no collector process.
    set("logging_collector", "off");
    set("log_destination", "stderr");
    set("log_line_prefix", "%m [%p] %q%u@%d ");
    if !s.overrides.is_empty() {
        out.push_str("# compute_ctl -c settings\n");
        for (name, value) in &s.overrides {
            let _ = writeln!(out, "{name} = {}", quote(value));
        }
    }
    format!("# Written by compute_ctl at every start; edits are lost with the data directory.\n{out}")
}

/// Trust for loopback, including replication (the pageserver's WAL receiver); see
/// [`pg_hba_conf`] for a compute that listens on other addresses too.
pub const PG_HBA_CONF: &str = "\
# Written by compute_ctl: trust on loopback only, for a development cluster.
# TYPE  DATABASE     USER  ADDRESS        METHOD
local   all          all                  trust
host    all          all   127.0.0.1/32   trust
host    all          all   ::1/128        trust
local   replication  all                  trust
host    replication  all   127.0.0.1/32   trust
host    replication  all   ::1/128        trust
";

/// `pg_hba.conf` for a compute listening on `listen` (`listen_addresses`): loopback, and
/// each explicit address it listens on as a single host. A connection from this host to one
/// of those comes from that address (compute_ctl's own checkpoint and queries connect to the
/// first listen address), so it is trusted like loopback; other hosts are not.
pub fn pg_hba_conf(listen: &str) -> String {
    let mut text = PG_HBA_CONF.to_string();
    for addr in listen.split(',').filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok()) {
        if addr.is_loopback() || addr.is_unspecified() {
            continue;
        }
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        text.push_str(&format!(
            "host    all          all   {addr}/{bits}   trust
host    replication  all   {addr}/{bits}   trust
"
        ));
    }
    text
}

/// The `primary_conninfo` of a read replica: every safekeeper in turn (libpq tries the
/// next host when one cannot be reached), naming the timeline the way the safekeepers'
/// replication protocol takes it from PostgreSQL's walreceiver (`options`, since the
/// walreceiver always sends `dbname=replication`). With a token, it is the password: a
/// safekeeper with authentication on asks for one (PostgreSQL shows it as `********` in
/// `pg_stat_wal_receiver`; the file is the data directory's, mode 0600). With the cluster
/// CA (`tls_ca`), the connection is TLS and verified (`sslmode=verify-full`): each
/// safekeeper's certificate must be signed by the CA and name the host dialled.
pub fn replica_conninfo(
    safekeepers: &[(String, u16)],
    tenant: TenantId,
    timeline: TimelineId,
    name: &str,
    token: Option<&str>,
    tls_ca: Option<&str>,
) -> String {
    let hosts: Vec<&str> = safekeepers.iter().map(|(h, _)| h.as_str()).collect();
    let ports: Vec<String> = safekeepers.iter().map(|(_, p)| p.to_string()).collect();
    // A libpq connection string value: single-quoted, with \ and ' escaped by a backslash.
    let quoted = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
    let password = token.map(|t| format!(" password={}", quoted(t))).unwrap_or_default();
    let ssl = tls_ca.map(|ca| format!(" sslmode=verify-full sslrootcert={}", quoted(ca))).unwrap_or_default();
    format!(
        "host={} port={} options='-c fjord.timeline={tenant}/{timeline}' application_name={} connect_timeout=2{password}{ssl}",
        hosts.join(","),
        ports.join(","),
        quoted(name)
    )
}

/// Replaces `postgresql.conf` in a running compute's data directory, atomically (a reload
/// reads the whole old file or the whole new one): the tenant moved to another pageserver
/// and `fjord.pageserver_address` with it. The file is rendered from the same settings as at
/// start, so nothing else changes.
pub fn write_postgresql_conf(pgdata: &Path, settings: &ComputeSettings) -> anyhow::Result<()> {
    let path = pgdata.join("postgresql.conf");
    crashsafe::write_file_atomic(&path, postgresql_conf(settings).as_bytes()).with_context(|| format!("replace {}", path.display()))
}

/// Writes `postgresql.conf`, `pg_hba.conf` and an empty `pg_ident.conf`, replacing whatever
/// the basebackup held; for a read replica also `standby.signal`, which (with the
/// basebackup's `fjord.signal`) makes postgres a hot standby that replays from the
/// basebackup's LSN (patch 0009).
pub fn write_config_files(pgdata: &Path, settings: &ComputeSettings) -> anyhow::Result<()> {
    let write = |name: &str, text: &str| {
        let path = pgdata.join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))
    };
    write("postgresql.conf", &postgresql_conf(settings))?;
    write("pg_hba.conf", &pg_hba_conf(&settings.listen))?;
    write("pg_ident.conf", "")?;
    if settings.replica_conninfo.is_some() {
        write("standby.signal", "")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ComputeSettings {
        ComputeSettings {
            listen: "127.0.0.1".into(),
            port: 55432,
            pageserver_pg: "127.0.0.1:6400".into(),
            tenant_id: "11111111111111111111111111111111".parse().unwrap(),
            timeline_id: "22222222222222222222222222222222".parse().unwrap(),
            tls_ca_file: None,
            shared_buffers: "128MB".into(),
            static_lsn: None,
            safekeepers: None,
            socket_dir: None,
            replica_conninfo: None,
            overrides: vec![],
        }
    }

    #[test]
    fn replica_config_streams_from_the_safekeepers_and_proposes_nothing() {
        let sks = [("127.0.0.1".to_string(), 5454), ("127.0.0.1".to_string(), 5455)];
        let mut s = settings();
        s.safekeepers = Some("127.0.0.1:5454,127.0.0.1:5455".into());
        s.replica_conninfo = Some(replica_conninfo(&sks, s.tenant_id, s.timeline_id, "it's", None, None));
        let conf = postgresql_conf(&s);
        assert_eq!(
            value_of(&conf, "primary_conninfo").unwrap(),
            r"'host=127.0.0.1,127.0.0.1 port=5454,5455 options=''-c fjord.timeline=11111111111111111111111111111111/22222222222222222222222222222222'' application_name=''it\\''s'' connect_timeout=2'"
        );
        assert_eq!(value_of(&conf, "hot_standby").unwrap(), "'on'");
        assert_eq!(value_of(&conf, "hot_standby_feedback").unwrap(), "'on'");
        assert_eq!(value_of(&conf, "synchronous_standby_names").unwrap(), "''");
        assert!(value_of(&conf, "fjord.safekeepers").is_none(), "a replica must not run a WAL proposer");
        assert_eq!(value_of(&conf, "fsync").unwrap(), "'off'");
    }

    #[test]
    fn a_replica_with_a_token_gives_it_as_its_password() {
        let sks = [("127.0.0.1".to_string(), 5454)];
        let s = settings();
        let conninfo = replica_conninfo(&sks, s.tenant_id, s.timeline_id, "r", Some("aa.bb.cc"), None);
        assert!(conninfo.ends_with(" connect_timeout=2 password='aa.bb.cc'"), "{conninfo}");
    }

    #[test]
    fn a_replica_with_the_cluster_ca_verifies_the_safekeepers() {
        let sks = [("sk1.example".to_string(), 5454)];
        let s = settings();
        let conninfo = replica_conninfo(&sks, s.tenant_id, s.timeline_id, "r", None, Some("/repo/tls/ca.crt"));
        assert!(conninfo.ends_with(" connect_timeout=2 sslmode=verify-full sslrootcert='/repo/tls/ca.crt'"), "{conninfo}");
    }

    fn value_of(conf: &str, name: &str) -> Option<String> {
        // The last assignment wins, as in PostgreSQL.
        conf.lines().filter_map(|l| l.strip_prefix(&format!("{name} = "))).next_back().map(str::to_string)
    }

    #[test]
    fn primary_config_names_the_pageserver_and_waits_for_it() {
        let conf = postgresql_conf(&settings());
        assert_eq!(value_of(&conf, "shared_preload_libraries").unwrap(), "'fjord'");
        assert_eq!(value_of(&conf, "fjord.pageserver_address").unwrap(), "'127.0.0.1:6400'");
        assert_eq!(value_of(&conf, "fjord.tenant_id").unwrap(), "'11111111111111111111111111111111'");
        assert_eq!(value_of(&conf, "fjord.timeline_id").unwrap(), "'22222222222222222222222222222222'");
        assert_eq!(value_of(&conf, "synchronous_standby_names").unwrap(), "'fjord_pageserver'");
        assert_eq!(value_of(&conf, "restart_after_crash").unwrap(), "'off'");
        assert_eq!(value_of(&conf, "full_page_writes").unwrap(), "'off'");
        assert_eq!(value_of(&conf, "port").unwrap(), "'55432'");
        assert_eq!(value_of(&conf, "unix_socket_directories").unwrap(), "''");
        assert!(value_of(&conf, "default_transaction_read_only").is_none());
        assert_eq!(value_of(&conf, "fjord.tls_ca_file").unwrap(), "''", "no CA: the page service link is cleartext");
    }

    #[test]
    fn with_a_ca_the_page_service_link_is_tls() {
        let conf = postgresql_conf(&ComputeSettings { tls_ca_file: Some("/repo/tls/ca.crt".into()), ..settings() });
        assert_eq!(value_of(&conf, "fjord.tls_ca_file").unwrap(), "'/repo/tls/ca.crt'");
    }

    #[test]
    fn compute_with_safekeepers_waits_for_the_walproposer() {
        let conf = postgresql_conf(&ComputeSettings { safekeepers: Some("a:1,b:2,c:3".into()), ..settings() });
        assert_eq!(value_of(&conf, "fjord.safekeepers").unwrap(), "'a:1,b:2,c:3'");
        assert_eq!(value_of(&conf, "synchronous_standby_names").unwrap(), "'walproposer'");
        assert_eq!(value_of(&conf, "synchronous_commit").unwrap(), "'on'");
        assert_eq!(value_of(&conf, "fsync").unwrap(), "'off'");
        assert!(value_of(&postgresql_conf(&settings()), "fjord.safekeepers").is_none());
        assert_eq!(value_of(&postgresql_conf(&settings()), "fsync").unwrap(), "'on'");
    }

    #[test]
    fn static_compute_is_read_only_and_waits_for_nobody() {
        let conf = postgresql_conf(&ComputeSettings { static_lsn: Some(Lsn(0x100)), ..settings() });
        assert_eq!(value_of(&conf, "synchronous_standby_names").unwrap(), "''");
        assert_eq!(value_of(&conf, "default_transaction_read_only").unwrap(), "'on'");
        assert_eq!(value_of(&conf, "fjord.read_lsn").unwrap(), "'0/100'");
    }

    #[test]
    fn overrides_come_last_and_are_quoted() {
        let conf = postgresql_conf(&ComputeSettings {
            overrides: vec![
                ("fsync".into(), "off".into()),
                ("application_name".into(), "it's".into()),
                ("cluster_name".into(), r"a\b".into()),
            ],
            ..settings()
        });
        assert_eq!(value_of(&conf, "fsync").unwrap(), "'off'");
        assert_eq!(value_of(&conf, "application_name").unwrap(), "'it''s'");
        assert_eq!(value_of(&conf, "cluster_name").unwrap(), r"'a\\b'");
    }

    #[test]
    fn override_arguments_are_validated() {
        assert_eq!(parse_override("work_mem=64MB").unwrap(), ("work_mem".into(), "64MB".into()));
        assert_eq!(parse_override("a.b=x=y").unwrap(), ("a.b".into(), "x=y".into()));
        assert_eq!(parse_override("empty=").unwrap(), ("empty".into(), String::new()));
        for bad in ["novalue", "=1", "bad name=1", "x;y=1"] {
            assert!(parse_override(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn socket_goes_into_short_data_directories_only() {
        assert_eq!(socket_dir_for(Path::new("/tmp/x/pgdata")).as_deref(), Some("/tmp/x/pgdata"));
        assert_eq!(socket_dir_for(&Path::new("/tmp").join("d".repeat(100))), None);
    }

    #[test]
    fn hba_trusts_the_computes_own_listen_addresses_as_single_hosts() {
        let text = pg_hba_conf("127.0.0.1, 10.77.0.10,*,fe80::1,localhost");
        assert!(text.contains("host    all          all   10.77.0.10/32   trust\n"), "{text}");
        assert!(text.contains("host    replication  all   fe80::1/128   trust\n"), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("host")).count(), 8, "{text}");
        assert_eq!(pg_hba_conf("127.0.0.1"), PG_HBA_CONF);
    }

    #[test]
    fn hba_trusts_loopback_only() {
        for line in PG_HBA_CONF.lines().filter(|l| l.starts_with("host")) {
            assert!(line.contains("127.0.0.1/32") || line.contains("::1/128"), "{line}");
        }
    }
}
