//! Crash-safe file creation: write to a temporary name, fsync, rename, fsync the directory.
//!
//! After a crash a file either exists under its final name with all its bytes, or not at
//! all; what can be left behind is a file or directory with the `.___temp` suffix, which
//! loading deletes. Nothing else in the crate renames or creates durable files.

use std::fs::{self, File};
use std::io::{self, Write};
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
    let tmp = temp_path(path);
    {
        let mut file = File::create(&tmp)?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
