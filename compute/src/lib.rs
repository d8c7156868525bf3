//! compute_ctl's pieces: it starts a fjord compute (PostgreSQL with the `fjord` extension)
//! from a pageserver basebackup and supervises it. See README.md for the start sequence.
//!
//! Invariant: a compute owns no state worth keeping. Every start begins with an empty data
//! directory; nothing here ever reuses or repairs an old one. The one thing reused is the
//! local file cache, which lives outside the data directory and is only a cache: what is
//! kept of it is decided in `file_cache.rs`, and anything doubtful is dropped.

pub mod controller;
pub mod file_cache;
pub mod pageserver;
pub mod pgconf;
pub mod postgres;
pub mod safekeepers;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use anyhow::{bail, Context};

/// Makes `pgdata` an empty directory with mode 0700 (PostgreSQL refuses looser modes):
/// creates it if absent, refuses it if it holds anything. Returns whether it was created.
pub fn prepare_pgdata(pgdata: &Path) -> anyhow::Result<bool> {
    let mut created = false;
    match std::fs::metadata(pgdata) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(pgdata)
                .with_context(|| format!("create data directory {}", pgdata.display()))?;
            created = true;
        }
        Err(e) => return Err(e).with_context(|| format!("inspect data directory {}", pgdata.display())),
        Ok(meta) if !meta.is_dir() => bail!("cannot use {} as data directory: it is not a directory", pgdata.display()),
        Ok(_) => {
            let mut entries = std::fs::read_dir(pgdata).with_context(|| format!("list data directory {}", pgdata.display()))?;
            if entries.next().is_some() {
                bail!(
                    "cannot use data directory {}: it is not empty (a compute always starts from a fresh basebackup; remove it or choose another)",
                    pgdata.display()
                );
            }
        }
    }
    set_mode_0700(pgdata)?;
    Ok(created)
}

/// Undoes [`prepare_pgdata`] after a failed start, so that a retry finds what the first
/// attempt found: no directory, or an empty one. Failures are logged, not returned: the
/// caller is already reporting the error that matters.
pub fn clear_pgdata(pgdata: &Path, created: bool) {
    let result = if created {
        std::fs::remove_dir_all(pgdata)
    } else {
        std::fs::read_dir(pgdata).and_then(|entries| {
            for entry in entries {
                let path = entry?.path();
                if path.is_dir() && !path.is_symlink() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
            }
            Ok(())
        })
    };
    if let Err(e) = result {
        tracing::warn!("could not clean up data directory {}: {e}", pgdata.display());
    }
}

/// PostgreSQL requires its data directory to be 0700 (or 0750); a tar entry for `.` may
/// have loosened it.
pub fn set_mode_0700(pgdata: &Path) -> anyhow::Result<()> {
    std::fs::set_permissions(pgdata, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("set mode 0700 on {}", pgdata.display()))
}

/// The name of the user this process runs as: postgres runs as it, and a basebackup of a
/// tenant created by `fjord tenant create` has it as superuser.
pub fn os_user_name() -> anyhow::Result<String> {
    let uid = nix::unistd::geteuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => Ok(user.name),
        Ok(None) => bail!("user id {uid} is not in the password database"),
        Err(e) => bail!("cannot look up user id {uid} in the password database: {e}"),
    }
}

/// True when running as root, which PostgreSQL refuses.
pub fn running_as_root() -> bool {
    // SAFETY: a plain libc call.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn pgdata_must_be_absent_or_empty() {
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("a/b/pgdata");
        assert!(prepare_pgdata(&fresh).unwrap());
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(!prepare_pgdata(&fresh).unwrap());
        std::fs::write(fresh.join("PG_VERSION"), "15").unwrap();
        std::fs::create_dir(fresh.join("base")).unwrap();
        let err = prepare_pgdata(&fresh).unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
        clear_pgdata(&fresh, false);
        assert!(!prepare_pgdata(&fresh).unwrap(), "emptied, not removed");
        clear_pgdata(&fresh, true);
        assert!(!fresh.exists());
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(prepare_pgdata(&file).unwrap_err().to_string().contains("not a directory"));
    }

    #[test]
    fn user_name_is_known() {
        assert!(!os_user_name().unwrap().is_empty());
    }
}
