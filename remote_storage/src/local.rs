//! The local-directory backend's durability: a put returns only once the object's bytes,
//! its directory entry and the entries of every directory above it are on stable storage.
//!
//! `object_store`'s `LocalFileSystem` with `with_fsync(true)` writes a staging file, fsyncs
//! it, renames (or, for a put that must not replace, hard-links) it into place and fsyncs
//! the object's directory. It also fsyncs the directories it creates itself, but a put into
//! a directory that already exists trusts that directory's own entry to be durable, and it
//! may not be: another thread may have just created it and not yet synced its parent, or an
//! earlier process may have created it without syncing (and then exited, or crashed without
//! taking the OS down). So before each put, [`LocalDirs::prepare`] makes sure every
//! directory from the store's root down to the object's has its entry durable in its
//! parent: it creates what is missing and fsyncs the parent of each directory the first time
//! this process uses it, whoever created it, and remembers it. After the first put into a
//! directory this costs nothing; a put then costs two fsyncs (the file and its directory).

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;

pub(crate) struct LocalDirs {
    fs: Arc<LocalFileSystem>,
    /// The store's directory, canonical (as `LocalFileSystem` resolves keys under it).
    root: PathBuf,
    /// Directories below the root whose entry in their parent this process has fsynced.
    durable: Mutex<HashSet<PathBuf>>,
}

impl LocalDirs {
    /// Opens the store at `dir`, creating it if missing, and makes the path to it durable.
    pub(crate) fn open(dir: &Path) -> io::Result<(LocalDirs, Arc<LocalFileSystem>)> {
        let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.as_os_str().is_empty() && !d.exists()).collect();
        std::fs::create_dir_all(dir)?;
        for created in missing {
            crashsafe::fsync_dir(created.parent().unwrap_or(Path::new("/")))?;
        }
        // The root may also have been created by a process that did not sync its entry.
        let root = std::fs::canonicalize(dir)?;
        crashsafe::fsync_dir(&root)?;
        if let Some(parent) = root.parent() {
            crashsafe::fsync_dir(parent)?;
        }
        let fs = Arc::new(LocalFileSystem::new_with_prefix(&root).map_err(io::Error::other)?.with_fsync(true));
        Ok((LocalDirs { fs: Arc::clone(&fs), root, durable: Mutex::new(HashSet::new()) }, fs))
    }

    /// Makes the directories above the object `key` exist durably, before it is put.
    pub(crate) fn prepare(&self, key: &ObjectPath) -> object_store::Result<()> {
        let path = self.fs.path_to_filesystem(key)?;
        let parent = path.parent().unwrap_or(&self.root);
        self.ensure_dir(parent).map_err(|e| object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(io::Error::new(e.kind(), format!("make directory {} durable: {e}", parent.display()))),
        })
    }

    fn ensure_dir(&self, dir: &Path) -> io::Result<()> {
        if dir == self.root || !dir.starts_with(&self.root) || self.known(dir) {
            return Ok(());
        }
        let parent = dir.parent().unwrap_or(&self.root);
        self.ensure_dir(parent)?;
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        crashsafe::fsync_dir(parent)?;
        self.durable.lock().unwrap_or_else(|e| e.into_inner()).insert(dir.to_path_buf());
        Ok(())
    }

    fn known(&self, dir: &Path) -> bool {
        self.durable.lock().unwrap_or_else(|e| e.into_inner()).contains(dir)
    }
}
