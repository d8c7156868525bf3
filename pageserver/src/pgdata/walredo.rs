//! WAL redo through PostgreSQL: a pool of long-lived `postgres --wal-redo fjord` processes.
//!
//! A page is rebuilt by sending its base image (if any) and the WAL records after it to a
//! redo process, which replays them with PostgreSQL's own redo routines (the C loop in
//! `extension/c/walredo.c`, protocol in `proto::walredo`) and sends the page back.
//!
//! Invariants:
//! - A process serves one request at a time; the pool hands each caller its own process
//!   and takes it back only after a complete, successful exchange. A process that failed,
//!   timed out or answered short is killed, never reused: its state is unknown.
//! - Every wait on a process is bounded by `request_timeout`; pipes are non-blocking and
//!   waited on with poll(2), so a stuck process costs a timeout, not a stuck pageserver.
//! - The error of a failed request carries the process's last stderr lines, which is
//!   where PostgreSQL says what went wrong.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::page::PAGE_SIZE_BYTES;
use proto::walredo::WalRedoRequest;
use proto::{BlockNumber, Lsn, RelTag};

#[derive(Clone, Debug)]
pub struct WalRedoConfig {
    /// The `postgres` binary of our patched build (patch 0002 adds `--wal-redo`).
    pub postgres_bin: PathBuf,
    /// The most processes run at once; more callers wait for one to be free.
    pub processes_max: usize,
    pub request_timeout: Duration,
    /// Run the processes as this (uid, gid). postgres refuses to run as root, so a
    /// pageserver started as root (tests run by CI) names an unprivileged user here.
    pub run_as: Option<(u32, u32)>,
}

#[derive(Debug, thiserror::Error)]
pub enum WalRedoError {
    #[error("could not start the wal redo process {bin}: {source}")]
    Spawn { bin: String, source: std::io::Error },
    /// `what` names the request: "wal redo of block 7 of base/5/16384" or "masking ...".
    #[error("{what} failed: {reason}; the redo process said: {stderr}")]
    Failed { what: String, reason: String, stderr: String },
    #[error("{what} timed out after {timeout:?}; the redo process said: {stderr}")]
    Timeout { what: String, timeout: Duration, stderr: String },
}

/// One WAL record to replay, with the LSN where it ends (the LSN it is stored under).
#[derive(Clone, Debug)]
pub struct RedoRecord {
    pub end_lsn: Lsn,
    pub rec: Bytes,
}

const STDERR_LINES_KEPT: usize = 20;

struct RedoProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Ends at EOF on stderr, i.e. when the process is gone.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl RedoProcess {
    fn spawn(config: &WalRedoConfig) -> Result<RedoProcess, WalRedoError> {
        let mut cmd = Command::new(&config.postgres_bin);
        cmd.arg("--wal-redo").arg("fjord").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).env_remove("PGDATA");
        if let Some((uid, gid)) = config.run_as {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        let spawn_err = |source| WalRedoError::Spawn { bin: config.postgres_bin.display().to_string(), source };
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr_pipe = child.stderr.take().expect("stderr is piped");
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_reader = spawn_stderr_reader(stderr_pipe, Arc::clone(&stderr), child.id());
        // From here on, dropping the process kills and reaps the child.
        let process = RedoProcess { child, stdin, stdout, stderr, stderr_reader };
        set_nonblocking(process.stdin.as_raw_fd()).map_err(spawn_err)?;
        set_nonblocking(process.stdout.as_raw_fd()).map_err(spawn_err)?;
        Ok(process)
    }

    /// What the process wrote to stderr; call after `kill`, so that everything it wrote
    /// before dying has been read.
    fn stderr_text(&mut self) -> String {
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
        let lines = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// False if the process has exited (say, killed while idle).
    fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for RedoProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_stderr_reader(pipe: ChildStderr, lines: Arc<Mutex<VecDeque<String>>>, pid: u32) -> Option<std::thread::JoinHandle<()>> {
    let spawned = std::thread::Builder::new().name(format!("walredo-stderr-{pid}")).spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            tracing::warn!(pid, "wal redo process: {line}");
            let mut l = lines.lock().unwrap_or_else(|p| p.into_inner());
            if l.len() == STDERR_LINES_KEPT {
                l.pop_front();
            }
            l.push_back(line);
        }
    });
    match spawned {
        Ok(handle) => Some(handle),
        Err(e) => {
            // The process still works; only its error messages are lost.
            tracing::error!(pid, "could not start a thread to read wal redo stderr: {e}");
            None
        }
    }
}

fn set_nonblocking(fd: i32) -> std::io::Result<()> {
    // SAFETY: fcntl on a file descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Waits until `fd` is ready for `events` or `deadline` passes; false on timeout.
fn poll_until(fd: i32, events: libc::c_short, deadline: Instant) -> std::io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let mut pfd = libc::pollfd { fd, events, revents: 0 };
        let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n > 0 {
            return Ok(true);
        }
    }
}

enum IoFailure {
    Timeout,
    Failed(String),
}

fn write_all_until(w: &mut ChildStdin, mut buf: &[u8], deadline: Instant) -> Result<(), IoFailure> {
    while !buf.is_empty() {
        match w.write(buf) {
            Ok(0) => return Err(IoFailure::Failed("the redo process closed its input".into())),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => match poll_until(w.as_raw_fd(), libc::POLLOUT, deadline) {
                Ok(true) => {}
                Ok(false) => return Err(IoFailure::Timeout),
                Err(e) => return Err(IoFailure::Failed(format!("poll: {e}"))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(IoFailure::Failed(format!("could not write to the redo process: {e}"))),
        }
    }
    Ok(())
}

fn read_exact_until(r: &mut ChildStdout, buf: &mut [u8], deadline: Instant) -> Result<(), IoFailure> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => return Err(IoFailure::Failed(format!("the redo process exited after sending {done} of {} bytes", buf.len()))),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => match poll_until(r.as_raw_fd(), libc::POLLIN, deadline) {
                Ok(true) => {}
                Ok(false) => return Err(IoFailure::Timeout),
                Err(e) => return Err(IoFailure::Failed(format!("poll: {e}"))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(IoFailure::Failed(format!("could not read from the redo process: {e}"))),
        }
    }
    Ok(())
}

struct Pool {
    idle: Vec<RedoProcess>,
    running: usize,
}

/// The pool of redo processes. Cheap to share: wrap it in an `Arc`.
pub struct WalRedoManager {
    config: WalRedoConfig,
    pool: Mutex<Pool>,
    freed: Condvar,
}

impl WalRedoManager {
    pub fn new(config: WalRedoConfig) -> WalRedoManager {
        assert!(config.processes_max > 0, "processes_max must be at least 1");
        WalRedoManager { config, pool: Mutex::new(Pool { idle: Vec::new(), running: 0 }), freed: Condvar::new() }
    }

    /// Rebuilds block `blkno` of `rel`: `base` (if given) is its image before the first
    /// record; `records` are replayed in order. Without a base image the first record must
    /// initialize the page.
    pub fn redo(&self, rel: RelTag, blkno: BlockNumber, base: Option<&[u8]>, records: &[RedoRecord]) -> Result<Bytes, WalRedoError> {
        let mut msg = Vec::with_capacity(64 + base.map_or(0, |b| b.len()) + records.iter().map(|r| r.rec.len() + 21).sum::<usize>());
        WalRedoRequest::Begin { rel, blkno }.encode(&mut msg);
        if let Some(page) = base {
            if page.len() != PAGE_SIZE_BYTES {
                return Err(WalRedoError::Failed {
                    what: format!("wal redo of block {blkno} of {rel}"),
                    reason: format!("base image has {} bytes, expected {PAGE_SIZE_BYTES}", page.len()),
                    stderr: "(the request was not sent)".to_string(),
                });
            }
            WalRedoRequest::PushPage { rel, blkno, page: page.to_vec() }.encode(&mut msg);
        }
        for r in records {
            WalRedoRequest::ApplyRecord { start_lsn: Lsn::INVALID, end_lsn: r.end_lsn, record: r.rec.to_vec() }.encode(&mut msg);
        }
        WalRedoRequest::GetPage { rel, blkno }.encode(&mut msg);

        // A long chain of records takes longer: allow 1 ms per record on top.
        let allowance = Duration::from_millis(u64::try_from(records.len()).unwrap_or(u64::MAX));
        self.exchange(&msg, allowance, || format!("wal redo of block {blkno} of {rel}"))
    }

    /// Applies PostgreSQL's own `rm_mask` of resource manager `rmid` to `page` (block
    /// `blkno`): what `wal_consistency_checking` ignores when it compares pages (hint bits,
    /// unused space, the page LSN). For consistency checks in tests and tools.
    pub fn mask_page(&self, rmid: u8, blkno: BlockNumber, page: &[u8]) -> Result<Bytes, WalRedoError> {
        let what = || format!("masking block {blkno} for resource manager {rmid}");
        if page.len() != PAGE_SIZE_BYTES {
            return Err(WalRedoError::Failed {
                what: what(),
                reason: format!("the page has {} bytes, expected {PAGE_SIZE_BYTES}", page.len()),
                stderr: "(the request was not sent)".to_string(),
            });
        }
        let mut msg = Vec::with_capacity(PAGE_SIZE_BYTES + 16);
        WalRedoRequest::MaskPage { rmid, blkno, page: page.to_vec() }.encode(&mut msg);
        self.exchange(&msg, Duration::ZERO, what)
    }

    /// Sends `msg` to a process of the pool and reads one page back.
    fn exchange(&self, msg: &[u8], allowance: Duration, what: impl Fn() -> String) -> Result<Bytes, WalRedoError> {
        // The deadline covers waiting for a free process too: one tenant's long redo chains
        // must not make another's reads hang without an answer.
        let timeout = self.config.request_timeout + allowance;
        let deadline = Instant::now() + timeout;
        let Some(mut process) = self.checkout(deadline)? else {
            return Err(WalRedoError::Timeout {
                what: what(),
                timeout,
                stderr: format!("(no redo process became free; all {} were busy)", self.config.processes_max),
            });
        };
        let mut page = vec![0u8; PAGE_SIZE_BYTES];
        let result =
            write_all_until(&mut process.stdin, msg, deadline).and_then(|()| read_exact_until(&mut process.stdout, &mut page, deadline));
        match result {
            Ok(()) => {
                self.checkin(process);
                Ok(Bytes::from(page))
            }
            Err(failure) => {
                process.kill();
                let stderr = process.stderr_text();
                let stderr = if stderr.is_empty() { "(nothing)".to_string() } else { stderr };
                drop(process);
                self.release_slot();
                Err(match failure {
                    IoFailure::Timeout => WalRedoError::Timeout { what: what(), timeout, stderr },
                    IoFailure::Failed(reason) => WalRedoError::Failed { what: what(), reason, stderr },
                })
            }
        }
    }

    /// A process for one request: an idle one, a new one, or (if all are busy) the first
    /// to become free before `deadline`. `None` when the deadline passed.
    fn checkout(&self, deadline: Instant) -> Result<Option<RedoProcess>, WalRedoError> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            while let Some(mut p) = pool.idle.pop() {
                if p.is_alive() {
                    p.stderr.lock().unwrap_or_else(|e| e.into_inner()).clear();
                    return Ok(Some(p));
                }
                // It died while idle (say, killed by the OOM killer): replace it.
                tracing::warn!("an idle wal redo process had exited; starting a new one");
                pool.running -= 1;
            }
            if pool.running < self.config.processes_max {
                pool.running += 1;
                drop(pool);
                return RedoProcess::spawn(&self.config).map(Some).inspect_err(|_| self.release_slot());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            pool = self.freed.wait_timeout(pool, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn checkin(&self, process: RedoProcess) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).idle.push(process);
        self.freed.notify_one();
    }

    fn release_slot(&self) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).running -= 1;
        self.freed.notify_one();
    }

    /// How many redo processes are running now (idle or busy).
    pub fn processes_running(&self) -> usize {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).running
    }
}
