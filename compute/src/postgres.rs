//! The postmaster as compute_ctl's child: start, wait until it accepts connections, forward
//! shutdown signals, and report how it exited.
//!
//! compute_ctl stays in the foreground as the supervisor (no `pg_ctl`, no daemon): whoever
//! runs it (the `fjord` CLI, a container runtime, systemd) sees one process whose exit status
//! is postgres'. Signals map to PostgreSQL's shutdown modes:
//!
//! | compute_ctl gets | postmaster gets | mode |
//! |---|---|---|
//! | SIGTERM, SIGINT | SIGINT (after a `CHECKPOINT` through psql) | fast: roll back sessions, checkpoint, exit |
//! | SIGQUIT | SIGQUIT | immediate: exit at once |
//!
//! The postmaster is started with a parent-death signal (SIGKILL), so it never outlives its
//! supervisor: an orphaned compute would keep a port and a WAL stream that nobody manages.

use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use logtail::log_tail;

/// The last shutdown signal received and not yet forwarded; 0 for none.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Set once postgres has been asked to shut down: what talks to it from then on (the lease
/// thread asking for the replay position) stops instead of reporting it unreachable.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Whether postgres has been asked to shut down.
pub fn shutting_down() -> bool {
    SHUTTING_DOWN.load(Ordering::SeqCst)
}

extern "C" fn on_signal(signum: libc::c_int) {
    // Only an atomic store: the one thing a signal handler may safely do here.
    PENDING_SIGNAL.store(signum, Ordering::SeqCst);
}

/// Catches SIGTERM, SIGINT and SIGQUIT from now on; [`Postmaster::supervise`] forwards them.
pub fn catch_shutdown_signals() -> anyhow::Result<()> {
    for signum in [libc::SIGTERM, libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: installs an async-signal-safe handler; the sigaction struct is zeroed and
        // then filled as sigaction(2) requires.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signum, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            bail!("could not install a handler for signal {signum}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A shutdown signal that arrived and has not been handled yet.
pub fn pending_signal() -> Option<i32> {
    match PENDING_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

pub struct Postmaster {
    child: Child,
    pgdata: PathBuf,
    log_path: PathBuf,
    /// How to run `CHECKPOINT` before a fast shutdown (see `checkpoint_before_shutdown`).
    checkpoint: Option<Command>,
}

impl Postmaster {
    /// Starts `postgres -D pgdata` with stdout and stderr appended to `log_path`.
    pub fn start(pg_bin_dir: &Path, pgdata: &Path, log_path: &Path) -> anyhow::Result<Postmaster> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("open postgres log {}", log_path.display()))?;
        let log2 = log.try_clone().context("duplicate the postgres log handle")?;
        let postgres = pg_bin_dir.join("postgres");
        let mut cmd = Command::new(&postgres);
        cmd.arg("-D").arg(pgdata).stdin(Stdio::null()).stdout(log).stderr(log2);
        // SAFETY: prctl and getppid are async-signal-safe; nothing else runs between fork
        // and exec.
        unsafe {
            let supervisor = libc::getpid();
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The supervisor may have died before prctl took effect.
                if libc::getppid() != supervisor {
                    return Err(std::io::Error::other("compute_ctl exited while starting postgres"));
                }
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("could not start {}", postgres.display()))?;
        tracing::info!(pid = child.id(), "postgres started");
        Ok(Postmaster { child, pgdata: pgdata.to_path_buf(), log_path: log_path.to_path_buf(), checkpoint: None })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the server accepts connections: first until its lock file says it is
    /// ready (probing a server that is still starting makes it log "FATAL: the database
    /// system is starting up"), then until a TCP connection to `host:port` succeeds (the
    /// lock file's "ready" comes once the postmaster listens and accepts sessions; the
    /// connection checks that it listens where clients will connect). A connection that
    /// sends nothing and closes is not logged by PostgreSQL 13 and later. Fails with the tail
    /// of the postgres log if it exits first or does not get there within `timeout`.
    pub fn wait_ready(&mut self, host: &str, port: u16, timeout: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("wait for postgres")? {
                bail!(
                    "postgres exited during startup ({}); the end of {}:\n{}",
                    describe(status),
                    self.log_path.display(),
                    log_tail(&self.log_path, 20)
                );
            }
            if let Some(sig) = pending_signal() {
                bail!("got signal {sig} while postgres was starting");
            }
            if pm_status(&self.pgdata).as_deref() == Some(PM_STATUS_READY) && accepts_tcp(host, port) {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!(
                    "postgres did not accept connections on {host}:{port} within {} s; the end of {}:\n{}",
                    timeout.as_secs(),
                    self.log_path.display(),
                    log_tail(&self.log_path, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Before a fast shutdown, run `CHECKPOINT` through psql. PostgreSQL's shutdown
    /// checkpoint must not write WAL of its own, so fjord's storage manager cannot log a
    /// full-page image of a page still dirty at that point; the one that matters is a
    /// sequence's page, whose last values would otherwise be skipped by the next compute
    /// (up to 32, as after a crash). An online checkpoint just before writes those pages
    /// the normal way, leaving the shutdown checkpoint nothing of the kind to write.
    pub fn checkpoint_before_shutdown(&mut self, pg_bin_dir: &Path, host: &str, port: u16, user: &str) {
        let mut cmd = Command::new(pg_bin_dir.join("psql"));
        // Then one commit, which does not wait for the safekeepers: it writes no WAL of its
        // own (an xid alone), and PostgreSQL commits such a transaction without waiting for
        // its standbys. A commit that waits (one that writes a record) would not help while
        // the extension saves as the durable LSN the commit LSN its WAL proposer worker last
        // published, which lags the one such a commit is released at: the stop comes sooner
        // after it, and more cached pages are dropped as not durable at the next start
        // (`file_cache`). A statement timeout bounds it at 2 s.
        cmd.args(["-X", "-q", "-h", host, "-p", &port.to_string(), "-U", user, "-d", "postgres", "-c", "CHECKPOINT"])
            .args(["-c", "SET statement_timeout = '2s'", "-c", "SELECT pg_current_xact_id()"])
            .env("PGCONNECT_TIMEOUT", "5")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.checkpoint = Some(cmd);
    }

    fn run_checkpoint(&mut self) {
        let Some(cmd) = self.checkpoint.as_mut() else { return };
        let started = Instant::now();
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("could not run psql for a checkpoint before shutdown: {e}");
                return;
            }
        };
        while started.elapsed() < Duration::from_secs(30) {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => {
                    tracing::info!(ms = started.elapsed().as_millis() as u64, "checkpoint before shutdown done");
                    return;
                }
                Ok(Some(status)) => {
                    tracing::warn!("checkpoint before shutdown failed ({}); shutting down anyway", describe(status));
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => {
                    tracing::warn!("waiting for the checkpoint before shutdown: {e}");
                    return;
                }
            }
        }
        tracing::warn!("checkpoint before shutdown took more than 30 s; shutting down anyway");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Waits for postgres to exit, forwarding shutdown signals to it as they arrive.
    pub fn supervise(&mut self) -> anyhow::Result<ExitStatus> {
        loop {
            if let Some(status) = self.child.try_wait().context("wait for postgres")? {
                return Ok(status);
            }
            if let Some(received) = pending_signal() {
                PENDING_SIGNAL.store(0, Ordering::SeqCst);
                self.shutdown(received)?;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends postgres the shutdown signal that corresponds to one compute_ctl received.
    pub fn shutdown(&mut self, received: i32) -> anyhow::Result<()> {
        let (send, mode) = if received == libc::SIGQUIT { (libc::SIGQUIT, "immediate") } else { (libc::SIGINT, "fast") };
        tracing::info!("got signal {received}, asking postgres for a {mode} shutdown");
        SHUTTING_DOWN.store(true, Ordering::SeqCst);
        if send == libc::SIGINT {
            self.run_checkpoint();
        }
        // Never signal a postgres that has already been reaped (by wait_ready or supervise):
        // its pid may belong to another process by now. One that exits after this check is
        // a zombie until we reap it, so its pid stays ours.
        if let Ok(Some(_)) = self.child.try_wait() {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(self.child.id()).context("postgres pid out of range")?;
        // SAFETY: a plain kill(2) of our own child, which has not been reaped yet.
        if unsafe { libc::kill(pid, send) } != 0 {
            let err = std::io::Error::last_os_error();
            // ESRCH: it already exited; supervise() will collect it.
            if err.raw_os_error() != Some(libc::ESRCH) {
                return Err(err).context("signal postgres");
            }
        }
        Ok(())
    }

    /// Kills postgres at once and reaps it; used when startup fails half-way.
    pub fn kill(mut self) {
        let _ = self.shutdown(libc::SIGQUIT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// "exit code 1" or "killed by signal 9".
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown status".to_string(),
    }
}

/// The process exit code that reports `status` to our own parent: postgres' code, or
/// 128 + the signal, as a shell does.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}

/// The postmaster's status line in `postmaster.pid` (`LOCK_FILE_LINE_PM_STATUS` in
/// PostgreSQL's `utils/pidfile.h`).
const LOCK_FILE_LINE_PM_STATUS: usize = 8;
/// Written once the server accepts connections (a hot standby too, once consistent).
const PM_STATUS_READY: &str = "ready";

/// The postmaster's status from its lock file ("starting", "ready", "standby", "stopping"),
/// or `None` while the file or the line is not there yet.
/// Whether a TCP connection to `host:port` is accepted within a second.
fn accepts_tcp(host: &str, port: u16) -> bool {
    use std::net::ToSocketAddrs;
    let Ok(addrs) = (host, port).to_socket_addrs() else { return false };
    addrs.into_iter().any(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
}

fn pm_status(pgdata: &Path) -> Option<String> {
    let text = std::fs::read_to_string(pgdata.join("postmaster.pid")).ok()?;
    text.lines().nth(LOCK_FILE_LINE_PM_STATUS - 1).map(|l| l.trim().to_string())
}

/// Runs one query through psql and returns its single value as text (unaligned, no
/// headers); an error says what psql printed.
pub fn query_value(pg_bin_dir: &Path, host: &str, port: u16, user: &str, sql: &str) -> anyhow::Result<String> {
    let out = Command::new(pg_bin_dir.join("psql"))
        .args(["-X", "-A", "-t", "-q", "-h", host, "-p", &port.to_string(), "-U", user, "-d", "postgres", "-c", sql])
        .env("PGCONNECT_TIMEOUT", "5")
        .stdin(Stdio::null())
        .output()
        .context("run psql")?;
    if !out.status.success() {
        anyhow::bail!("psql failed ({}): {}", describe(out.status), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One psql connection kept open for a query asked again and again (the lease thread's
/// replay position, every second). A new connection per question would sometimes reach a
/// postgres that has just started to shut down, which refuses it with a FATAL line in its
/// log; an open session is ended by the shutdown like every other one. psql reading a
/// script from a pipe exits when its connection is lost (it never reconnects), so a
/// session never reaches a server that is going away.
pub struct Session {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

/// What psql prints after each answer, so that a query that fails (its error goes to
/// psql's standard error) still ends with a line to read.
const SESSION_END_OF_ANSWER: &str = "-- end of answer --";

impl Session {
    pub fn open(pg_bin_dir: &Path, host: &str, port: u16, user: &str) -> anyhow::Result<Session> {
        let mut child = Command::new(pg_bin_dir.join("psql"))
            .args(["-X", "-A", "-t", "-q", "-h", host, "-p", &port.to_string(), "-U", user, "-d", "postgres"])
            .env("PGCONNECT_TIMEOUT", "5")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("run psql")?;
        let stdin = child.stdin.take().context("psql's standard input")?;
        let stdout = std::io::BufReader::new(child.stdout.take().context("psql's standard output")?);
        Ok(Session { child, stdin, stdout })
    }

    /// Runs `sql` (one statement, without its semicolon) and returns its single value as
    /// text; an error if the query failed or psql is gone (its connection lost or refused).
    pub fn query_value(&mut self, sql: &str) -> anyhow::Result<String> {
        use std::io::{BufRead, Write};
        write!(self.stdin, "{sql};\n\\echo '{SESSION_END_OF_ANSWER}'\n").and_then(|()| self.stdin.flush()).context("psql has exited")?;
        let mut value = None;
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).context("read psql's answer")? == 0 {
                bail!("psql has exited (its connection is gone)");
            }
            let line = line.trim_end();
            if line == SESSION_END_OF_ANSWER {
                return value.context("the query returned no value (it failed)");
            }
            value = Some(line.to_string());
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 128 + libc::SIGKILL);
        assert_eq!(describe(ExitStatus::from_raw(libc::SIGKILL)), "killed by signal 9");
    }

    #[test]
    fn the_status_line_of_the_lock_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(pm_status(dir.path()), None);
        let head = "4242\n/data\n1700000000\n5432\n/tmp\n127.0.0.1\n  5432001    163840\n";
        std::fs::write(dir.path().join("postmaster.pid"), head).unwrap();
        assert_eq!(pm_status(dir.path()), None);
        std::fs::write(dir.path().join("postmaster.pid"), format!("{head}starting\n")).unwrap();
        assert_eq!(pm_status(dir.path()).as_deref(), Some("starting"));
        std::fs::write(dir.path().join("postmaster.pid"), format!("{head}ready   \n")).unwrap();
        assert_eq!(pm_status(dir.path()).as_deref(), Some(PM_STATUS_READY));
    }
}
