//! Crash-safe file primitives, the one home for them in the tree: write to a temporary
//! name, fsync, rename, fsync the directory; and the lock that keeps a second process off a
//! data directory.
//!
//! After a crash a file written with [`write_file_atomic`] either exists under its final
//! name with all its bytes, or not at all (the old contents stay); what can be left behind
//! is a file or directory with the `.___temp` suffix, which its owner deletes when it loads
//! (`is_temp_name`, `remove_temp`). The pageserver, the safekeeper, compute_ctl and the CLI
//! use these instead of their own renames, so that every durable replace in fjord follows
//! the same order: data fsynced before the rename, the rename fsynced before success.
//!
//! [`DataDirLock`] is an exclusive `flock` on a lock file holding the owner's pid: a second
//! pageserver or safekeeper started on the same directory fails at once with a message
//! naming the holder, and a crash leaves nothing to clean up (the kernel drops the lock).

use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Suffix of files and directories being written; never a valid layer or timeline name.
pub const TEMP_SUFFIX: &str = ".___temp";

pub fn is_temp_name(name: &str) -> bool {
    name.ends_with(TEMP_SUFFIX)
}

pub fn temp_path(final_path: &Path) -> PathBuf {
    let mut name = final_path.as_os_str().to_owned();
    name.push(TEMP_SUFFIX);
    PathBuf::from(name)
}

/// Makes a directory's entries (creations, renames, deletions) durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Renames a fully written and fsynced `tmp` to `target` and makes the rename durable.
pub fn durable_rename(tmp: &Path, target: &Path) -> io::Result<()> {
    fs::rename(tmp, target)?;
    fsync_dir(target.parent().unwrap_or(Path::new(".")))
}

/// Writes `bytes` to `path` so that after a crash the file has either the old contents or
/// the new ones, never a mix.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with_mode(path, bytes, 0o666)
}

/// [`write_file_atomic`] for a file that holds a secret (a token): created with mode 0600
/// before it has any contents, so no other user can ever read it.
pub fn write_private_file_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with_mode(path, bytes, 0o600)
}

fn write_atomic_with_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = temp_path(path);
    {
        // A leftover temporary file may have another mode; it is replaced, not reused.
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    durable_rename(&tmp, path)
}

/// Removes a leftover temporary file or directory.
pub fn remove_temp(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// Why a data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("data directory {dir} is in use by another {owner} (pid {pid}, lock file {lock_file})")]
    InUse { dir: PathBuf, owner: &'static str, pid: String, lock_file: PathBuf },
    #[error("could not lock {lock_file}: {error}")]
    Io { lock_file: PathBuf, error: io::Error },
}

/// An exclusive lock on a data directory, held for the life of the value (in practice: of
/// the process). See the module documentation.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Takes an exclusive `flock` on `<dir>/<lock_file_name>` and writes our pid into it.
    /// `owner` names the kind of process in the error ("pageserver", "safekeeper").
    pub fn acquire(dir: &Path, lock_file_name: &str, owner: &'static str) -> Result<DataDirLock, LockError> {
        let path = dir.join(lock_file_name);
        let io_err = |error| LockError::Io { lock_file: path.clone(), error };
        let mut f = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io_err)?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut pid = String::new();
                let _ = f.read_to_string(&mut pid);
                return Err(LockError::InUse { dir: dir.to_path_buf(), owner, pid: pid.trim().to_string(), lock_file: path });
            }
            return Err(io_err(error));
        }
        f.set_len(0).and_then(|_| f.rewind()).and_then(|_| writeln!(f, "{}", std::process::id())).map_err(io_err)?;
        Ok(DataDirLock { _file: f, path })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_file_is_never_readable_by_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        // A leftover temporary file readable by everyone is replaced, not written into.
        fs::write(temp_path(&path), b"old").unwrap();
        fs::set_permissions(temp_path(&path), fs::Permissions::from_mode(0o644)).unwrap();
        write_private_file_atomic(&path, b"token").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"token");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_file_atomic(&path, b"one").unwrap();
        write_file_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f")]);
        assert!(is_temp_name("x.___temp") && !is_temp_name("x"));
    }

    #[test]
    fn a_second_lock_on_a_directory_is_refused_with_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path(), "x.lock", "pageserver").unwrap();
        let err = DataDirLock::acquire(dir.path(), "x.lock", "pageserver").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("in use by another pageserver") && msg.contains(&std::process::id().to_string()), "{msg}");
        drop(first);
        DataDirLock::acquire(dir.path(), "x.lock", "pageserver").unwrap();
    }
}
