//! A real PostgreSQL 15 cluster from our build, for the pageserver's integration tests:
//! `initdb`, configuration, start, `psql`, clean stop, all in a temporary directory.
//!
//! postgres refuses to run as root. When the tests run as root, every PostgreSQL program
//! runs through `runuser -u <FJORD_PG_USER, default fjord> --`, and the temporary directory
//! is handed to that user; the pageserver itself (this process) reads the files as root.
//! Reaching a binary: `FJORD_PG_BIN`, or `target/pg15/bin` as `scripts/setup` builds it.
//!
//! `compare.rs` holds what the tests that compare the store with a data directory share:
//! relation kinds from `pg_class`, masking with PostgreSQL's `rm_mask`, and the block by
//! block comparison with its documented exceptions.

#![allow(dead_code, reason = "each test binary that includes this module uses a different part of it")]

pub mod compare;

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub fn pg_bin_dir() -> PathBuf {
    let dir = std::env::var_os("FJORD_PG_BIN").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
            .join("../target/pg15/bin")
    });
    assert!(dir.join("postgres").exists(), "no postgres in {}; run ./scripts/setup first", dir.display());
    dir
}

/// When running as root: the unprivileged user's name, uid and gid.
pub fn unprivileged_user() -> Option<(String, u32, u32)> {
    // SAFETY: plain libc calls; getpwnam's result is read before any other call.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let user = std::env::var("FJORD_PG_USER").unwrap_or_else(|_| "fjord".to_string());
        let cuser = CString::new(user.clone()).expect("user name has no NUL");
        let pw = libc::getpwnam(cuser.as_ptr());
        assert!(!pw.is_null(), "running as root, but there is no user {user} to run postgres as");
        Some((user, (*pw).pw_uid, (*pw).pw_gid))
    }
}

fn chown(path: &Path, uid: u32, gid: u32) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("path has no NUL");
    // SAFETY: a valid C string.
    let rc = unsafe { libc::chown(c.as_ptr(), uid, gid) };
    assert_eq!(rc, 0, "chown {}: {}", path.display(), std::io::Error::last_os_error());
}

pub struct PgCluster {
    pub dir: tempfile::TempDir,
    pub pgdata: PathBuf,
    pub bin: PathBuf,
    port: u16,
    running: bool,
}

impl PgCluster {
    /// A fresh `initdb` in a new temporary directory under /tmp.
    pub fn initdb() -> PgCluster {
        let dir = tempfile::Builder::new().prefix("fjord-pg-").tempdir_in("/tmp").expect("create a temporary directory");
        if let Some((_, uid, gid)) = unprivileged_user() {
            chown(dir.path(), uid, gid);
        }
        let cluster = PgCluster { pgdata: dir.path().join("pgdata"), dir, bin: pg_bin_dir(), port: 5432, running: false };
        let pgdata = cluster.pgdata.display().to_string();
        cluster.run("initdb", &["-D", &pgdata, "--no-sync", "--encoding=UTF8", "--locale=C", "--auth=trust", "-U", "postgres"]);
        cluster
    }

    /// A command running PostgreSQL program `program`, as the unprivileged user if needed.
    pub fn command(&self, program: &str) -> Command {
        let bin = self.bin.join(program);
        match unprivileged_user() {
            Some((user, _, _)) => {
                let mut c = Command::new("runuser");
                c.args(["-u", &user, "--"]).arg(bin);
                c
            }
            None => Command::new(bin),
        }
    }

    fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self.command(program).args(args).output().unwrap_or_else(|e| panic!("run {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Appends settings to `postgresql.conf`.
    pub fn configure(&self, settings: &[(&str, &str)]) {
        let mut f = std::fs::OpenOptions::new().append(true).open(self.pgdata.join("postgresql.conf")).expect("open postgresql.conf");
        writeln!(f, "\n# written by fjord's pageserver tests").unwrap();
        for (k, v) in settings {
            writeln!(f, "{k} = {v}").unwrap();
        }
    }

    pub fn start(&mut self) {
        self.start_with("''");
    }

    /// Starts listening on `127.0.0.1:port` too, for clients that speak TCP only (the WAL
    /// receiver). `initdb --auth=trust` lets replication connections in from there.
    pub fn start_on_loopback(&mut self, port: u16) {
        self.port = port;
        self.start_with("'127.0.0.1'");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn start_with(&mut self, listen_addresses: &str) {
        let pgdata = self.pgdata.display().to_string();
        let log = self.dir.path().join("postgres.log").display().to_string();
        let opts = format!("-p {} -k {} -c listen_addresses={listen_addresses}", self.port, self.dir.path().display());
        self.run("pg_ctl", &["-D", &pgdata, "-l", &log, "-w", "-t", "60", "-o", &opts, "start"]);
        self.running = true;
    }

    /// A clean shutdown: a shutdown checkpoint is the last WAL record.
    pub fn stop(&mut self) {
        let pgdata = self.pgdata.display().to_string();
        self.run("pg_ctl", &["-D", &pgdata, "-m", "fast", "-w", "-t", "60", "stop"]);
        self.running = false;
    }

    /// Runs `sql` (any number of statements, fed on stdin) in database `db`; returns the
    /// unaligned, tuples-only output. Any error fails the test.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let mut child = self.psql_command(db, &["-F", "|"]).spawn().expect("start psql");
        child.stdin.take().expect("stdin").write_all(sql.as_bytes()).expect("write to psql");
        let out = child.wait_with_output().expect("wait for psql");
        assert!(out.status.success(), "psql in {db} failed: {}\n{sql}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `psql` on database `db` reading statements from its standard input, quiet,
    /// unaligned, tuples only, stopping at the first error; `extra` flags go first.
    fn psql_command(&self, db: &str, extra: &[&str]) -> Command {
        let sock = self.dir.path().display().to_string();
        let port = self.port.to_string();
        let mut cmd = self.command("psql");
        cmd.args(["-X", "-q", "-A", "-t"])
            .args(extra)
            .args(["-v", "ON_ERROR_STOP=1", "-h", &sock, "-p", &port, "-U", "postgres", "-d", db, "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs `pgbench` against database `db` with `args` (`-i -s 10`, `-T 10 -c 4`, ...);
    /// returns its standard output and error. Any failure fails the test.
    pub fn pgbench(&self, db: &str, args: &[&str]) -> String {
        let sock = self.dir.path().display().to_string();
        let port = self.port.to_string();
        let mut all: Vec<&str> = vec!["-h", &sock, "-p", &port, "-U", "postgres"];
        all.extend_from_slice(args);
        all.push(db);
        let out = self.command("pgbench").args(&all).output().expect("start pgbench");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "pgbench {args:?} failed ({}):\n{text}", out.status);
        text
    }

    /// A `psql` session that stays connected: statements sent to it run as they arrive, so
    /// a transaction can stay open while other sessions work.
    pub fn session(&self, db: &str) -> PgSession {
        let child = self.psql_command(db, &[]).spawn().expect("start psql");
        PgSession { child: Some(child), db: db.to_string() }
    }

    /// Waits (at most a minute) until `sql` returns `expected` in database `db`.
    pub fn wait_for(&self, db: &str, sql: &str, expected: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.psql(db, sql);
            if got.trim() == expected {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "waited a minute for {sql:?} to return {expected:?}; it returns {got:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `psql` returning rows split on `|`.
    pub fn rows(&self, db: &str, sql: &str) -> Vec<Vec<String>> {
        self.psql(db, sql).lines().filter(|l| !l.is_empty()).map(|l| l.split('|').map(str::to_string).collect()).collect()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.running {
            let pgdata = self.pgdata.display().to_string();
            let _ = self.command("pg_ctl").args(["-D", &pgdata, "-m", "immediate", "-w", "stop"]).output();
        }
    }
}

/// An open `psql` session (see `PgCluster::session`).
pub struct PgSession {
    /// `None` once `finish` has waited for it.
    child: Option<std::process::Child>,
    db: String,
}

impl PgSession {
    /// Sends statements; they run as soon as psql reads them. Nothing waits for them: the
    /// caller observes their effect from another session (`PgCluster::wait_for`).
    pub fn send(&mut self, sql: &str) {
        let stdin = self.child.as_mut().and_then(|c| c.stdin.as_mut()).expect("the session is open");
        stdin.write_all(sql.as_bytes()).and_then(|()| stdin.write_all(b"\n")).and_then(|()| stdin.flush()).expect("write to psql");
    }

    /// Sends `sql`, ends the session and checks that every statement succeeded.
    pub fn finish(mut self, sql: &str) -> String {
        self.send(sql);
        let mut child = self.child.take().expect("the session is open");
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("wait for psql");
        assert!(out.status.success(), "psql session in {} failed: {}", self.db, String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PgSession {
    fn drop(&mut self) {
        // A session abandoned by a failing test must not keep the server from stopping.
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The WAL redo configuration for our build, as root running as the unprivileged user.
pub fn walredo_config() -> pageserver::pgdata::walredo::WalRedoConfig {
    pageserver::pgdata::walredo::WalRedoConfig {
        postgres_bin: pg_bin_dir().join("postgres"),
        processes_max: 2,
        request_timeout: Duration::from_secs(60),
        run_as: unprivileged_user().map(|(_, uid, gid)| (uid, gid)),
    }
}
