//! Background processes the CLI starts (the pageserver, compute_ctl) and finds again later
//! through pid files; the user they run as (never root); whether a started service answers.
//!
//! A process is started in a session of its own (`setsid`), so that it outlives the `fjord`
//! command and a Ctrl-C in the user's terminal does not reach it; its stdout and stderr go to
//! a log file. A pid file is trusted only if that pid is alive, not a zombie, and runs the
//! expected executable: a stale file whose pid was reused by another program reads as
//! "not running".

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use logtail::log_tail;

/// A process known by pid file.
pub struct Daemon {
    pub pid_file: PathBuf,
    pub log_file: PathBuf,
    /// The executable's file name, matched against `/proc/<pid>/exe`.
    pub exe_name: String,
}

impl Daemon {
    /// Starts `cmd` in its own session with output appended to the log, and records its pid.
    /// Returns the child so that the caller can notice an early exit while waiting for it.
    pub fn spawn(&self, cmd: &mut Command) -> anyhow::Result<Child> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_file)
            .with_context(|| format!("open log file {}", self.log_file.display()))?;
        let log2 = log.try_clone().context("duplicate the log file handle")?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        // A service's fatal error is the last thing in its log, and the CLI shows the end of
        // the log when a start fails: keep anyhow's backtraces out of the way (panics still
        // get theirs from RUST_BACKTRACE).
        if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
            cmd.env("RUST_LIB_BACKTRACE", "0");
        }
        // SAFETY: setsid is async-signal-safe and nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("could not start {:?}", cmd.get_program()))?;
        crate::state::write_atomically(&self.pid_file, format!("{}\n", child.id()).as_bytes())?;
        Ok(child)
    }

    /// The pid of the running process, or `None`.
    pub fn running_pid(&self) -> anyhow::Result<Option<i32>> {
        let text = match std::fs::read_to_string(&self.pid_file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            other => other.with_context(|| format!("read pid file {}", self.pid_file.display()))?,
        };
        let pid: i32 =
            text.trim().parse().with_context(|| format!("pid file {} holds {:?}, not a pid", self.pid_file.display(), text.trim()))?;
        Ok(is_running(pid, &self.exe_name).then_some(pid))
    }

    /// Sends `signal`, waits up to `timeout` for the process to exit, then kills it. Removes
    /// the pid file. Returns false if it was not running.
    pub fn stop(&self, signal: i32, timeout: Duration) -> anyhow::Result<bool> {
        let Some(pid) = self.running_pid()? else {
            remove_file_if_exists(&self.pid_file)?;
            return Ok(false);
        };
        send_signal(pid, signal)?;
        if !wait_for_exit(pid, &self.exe_name, timeout) {
            tracing::warn!("{} (pid {pid}) did not exit within {} s; killing it", self.exe_name, timeout.as_secs());
            send_signal(pid, libc::SIGKILL)?;
            if !wait_for_exit(pid, &self.exe_name, Duration::from_secs(10)) {
                bail!("{} (pid {pid}) survived SIGKILL", self.exe_name);
            }
        }
        remove_file_if_exists(&self.pid_file)?;
        Ok(true)
    }
}

/// Spawns a daemon and waits until `is_up` (its HTTP API answers), at most 30 s.
pub fn spawn_and_wait(
    daemon: &Daemon,
    cmd: &mut Command,
    what: &str,
    url: &str,
    is_up: impl Fn() -> bool,
) -> anyhow::Result<std::process::Child> {
    let mut child = daemon.spawn(cmd)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().with_context(|| format!("wait for {what}"))? {
            crate::process::remove_file_if_exists(&daemon.pid_file)?;
            bail!("{what} exited during startup ({status}); the end of {}:\n{}", daemon.log_file.display(), log_tail(&daemon.log_file, 20));
        }
        if is_up() {
            return Ok(child);
        }
        if Instant::now() > deadline {
            daemon.stop(libc::SIGKILL, Duration::from_secs(5))?;
            bail!(
                "{what} did not answer on {url} within 30 s; the end of {}:\n{}",
                daemon.log_file.display(),
                log_tail(&daemon.log_file, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// True if `pid` is alive (not a zombie) and runs an executable named `exe_name`.
pub fn is_running(pid: i32, exe_name: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the parenthesised command name, which may itself hold ')'.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    if matches!(state, None | Some('Z') | Some('X')) {
        return false;
    }
    match std::fs::read_link(format!("/proc/{pid}/exe")) {
        // A replaced binary reads as "<path> (deleted)".
        Ok(exe) => exe.file_name().and_then(|n| n.to_str()).is_some_and(|n| n == exe_name || n.starts_with(&format!("{exe_name} "))),
        Err(_) => false,
    }
}

pub fn send_signal(pid: i32, signal: i32) -> anyhow::Result<()> {
    // SAFETY: a plain kill(2).
    if unsafe { libc::kill(pid, signal) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err).with_context(|| format!("send signal {signal} to pid {pid}"));
        }
    }
    Ok(())
}

fn wait_for_exit(pid: i32, exe_name: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !is_running(pid, exe_name) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !is_running(pid, exe_name)
}

pub fn remove_file_if_exists(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_context(|| format!("remove {}", path.display())),
        _ => Ok(()),
    }
}

/// Refuses to go on as root: postgres (initdb, computes, the pageserver's WAL redo) does.
pub fn refuse_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: a plain libc call.
    if unsafe { libc::geteuid() } == 0 {
        anyhow::bail!("cannot {what} as root: PostgreSQL refuses to run as root; run fjord as an unprivileged user");
    }
    Ok(())
}

/// Whether anything answers on `url`: a status, or a TLS handshake that fails (a server of
/// another CA, such as another repo's on the same ports, or one without TLS). For a check
/// that the ports are free, where [`http_up`] would miss another repo's service.
pub fn http_answers(url: &str, tls: Option<&tls::ClientTls>) -> bool {
    let config = pageserver_api::ClientConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Some(Duration::from_secs(2)),
        tls: tls.cloned(),
    };
    match pageserver_api::client::agent(&config).get(format!("{url}/v1/status")).call() {
        Ok(_) => true,
        Err(e) => pageserver_api::client::tls_failure(&e, url, tls).is_some(),
    }
}

/// Whether something answers `GET {url}/v1/status` with 200 (over https, verified against
/// `tls`, for an `https://` URL).
pub fn http_up(url: &str, tls: Option<&tls::ClientTls>) -> bool {
    let config = pageserver_api::ClientConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Some(Duration::from_secs(2)),
        tls: tls.cloned(),
    };
    let answer = pageserver_api::client::agent(&config).get(format!("{url}/v1/status")).call();
    answer.is_ok_and(|r| r.status().is_success())
}

/// The name of the user running fjord: the superuser of the clusters it creates.
pub fn os_user_name() -> anyhow::Result<String> {
    let uid = nix::unistd::geteuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => Ok(user.name),
        Ok(None) => anyhow::bail!("user id {uid} is not in the password database"),
        Err(e) => anyhow::bail!("cannot look up user id {uid} in the password database: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_files_are_checked_against_the_executable() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon { pid_file: dir.path().join("sleep.pid"), log_file: dir.path().join("sleep.log"), exe_name: "sleep".into() };
        assert_eq!(daemon.running_pid().unwrap(), None);
        let mut child = daemon.spawn(Command::new("sleep").arg("30")).unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        assert_eq!(daemon.running_pid().unwrap(), Some(pid));
        let other = Daemon { pid_file: daemon.pid_file.clone(), log_file: daemon.log_file.clone(), exe_name: "pageserver".into() };
        assert_eq!(other.running_pid().unwrap(), None, "a pid running another program is not ours");
        // Our own child turns into a zombie when it exits, until reaped: reap it in the
        // background so that stop() sees it gone.
        let reaper = std::thread::spawn(move || child.wait());
        assert!(daemon.stop(libc::SIGTERM, Duration::from_secs(5)).unwrap());
        reaper.join().unwrap().unwrap();
        assert!(!daemon.pid_file.exists());
        assert!(!daemon.stop(libc::SIGTERM, Duration::from_secs(1)).unwrap(), "stopping twice is fine");
        std::fs::write(&daemon.pid_file, "garbage").unwrap();
        assert!(daemon.running_pid().unwrap_err().to_string().contains("not a pid"));
    }
}
