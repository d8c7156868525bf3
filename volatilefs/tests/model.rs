//! The model itself, through real system calls on a mount: what is fsynced survives a
//! power loss, and nothing else does.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use volatilefs::VolatileMount;

fn fsync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

fn write(path: &Path, bytes: &[u8], sync: bool) {
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
    if sync {
        f.sync_all().unwrap();
    }
}

#[test]
fn only_what_was_fsynced_survives_a_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let fs = VolatileMount::mount(dir.path()).unwrap();
    let root = fs.path();

    // Synced data and synced entry: survives whole.
    write(&root.join("kept"), b"kept", true);
    // Synced entry, unsynced data: survives empty.
    write(&root.join("empty"), b"lost bytes", false);
    // Synced data, unsynced entry (created after the directory's fsync below): gone.
    fs::create_dir(root.join("d")).unwrap();
    fsync_dir(root);
    write(&root.join("d/synced-data-only"), b"x", true);
    // A synced directory whose parent entry was never synced: gone with its contents.
    fs::create_dir_all(root.join("d/e")).unwrap();
    write(&root.join("d/e/f"), b"f", true);
    fsync_dir(&root.join("d/e"));
    // A rename not followed by an fsync of the directory is undone.
    write(&root.join("old"), b"old", true);
    fsync_dir(root);
    fs::rename(root.join("old"), root.join("new")).unwrap();
    // Data written after the last fsync is lost, the earlier data stays.
    write(&root.join("kept"), b"kept, then overwritten", false);
    assert_eq!(fs::read(root.join("kept")).unwrap(), b"kept, then overwritten");

    let before = fs.stats();
    assert!(before.file_syncs >= 4 && before.dir_syncs >= 3, "{before:?}");
    fs.power_loss();

    assert_eq!(fs::read(root.join("kept")).unwrap(), b"kept");
    assert_eq!(fs::read(root.join("empty")).unwrap(), b"");
    assert!(root.join("d").is_dir());
    assert!(!root.join("d/synced-data-only").exists());
    assert!(!root.join("d/e").exists());
    assert_eq!(fs::read(root.join("old")).unwrap(), b"old");
    assert!(!root.join("new").exists());
    let mut names: Vec<String> = fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["d", "empty", "kept", "old"]);

    // The usual durable replace (temporary file, fsync, rename, fsync the directory) and a
    // hard link survive; the filesystem works on after a power loss.
    write(&root.join("d/tmp"), b"replaced", true);
    fs::rename(root.join("d/tmp"), root.join("kept")).unwrap();
    fs::hard_link(root.join("kept"), root.join("d/link")).unwrap();
    fsync_dir(root);
    fsync_dir(&root.join("d"));
    fs.power_loss();
    assert_eq!(fs::read(root.join("kept")).unwrap(), b"replaced");
    assert_eq!(fs::read(root.join("d/link")).unwrap(), b"replaced");
    assert!(!root.join("d/tmp").exists());
}
