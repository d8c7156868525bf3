//! Test support only: a FUSE filesystem held in memory that models a volatile page cache,
//! for tests that claim "what was acknowledged survives a power loss".
//!
//! Every file and directory has two versions: the *current* one, which every system call
//! sees, and the *durable* one, which is what a power loss leaves. Writes, truncations,
//! creations, links, renames and deletions change only the current version. `fsync` of a
//! file copies its current data to its durable data; `fsync` of a directory copies its
//! current entries (names and the files or directories they point to) to its durable
//! entries. [`VolatileMount::power_loss`] replaces every current version by its durable one
//! and forgets what is no longer reachable from the root: a file whose data was never
//! synced is empty, one whose directory entry was never synced is gone, a rename not
//! followed by an `fsync` of the directory is undone, and a directory created without an
//! `fsync` of its parent disappears with everything below it.
//!
//! This is the strictest reading of POSIX: a real file system (ext4, XFS) often makes more
//! durable than was asked for (a journal commit carries other changes along), never less.
//! Code that is durable here is durable on them; code that loses data here can lose it on
//! them, depending on timing. Jepsen's LazyFS models the same thing for the same reason.
//!
//! The kernel caches nothing of it: entries and attributes have a zero TTL and files are
//! opened with `FOPEN_DIRECT_IO`, so after a power loss every read comes here.
//!
//! Mounting needs `/dev/fuse` and root (a direct `mount(2)`; `fuser` falls back to the
//! setuid helper `fusermount3` only where `/dev/fuse` is open to everyone); the filesystem
//! is served by a thread of the test process and unmounted when the [`VolatileMount`] is
//! dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, WriteFlags,
};

/// The kernel keeps no entry or attribute: after a power loss it must ask again.
const TTL: Duration = Duration::ZERO;
const ROOT: u64 = 1;

#[derive(Clone, Debug)]
enum Content {
    File(Vec<u8>),
    Dir(BTreeMap<OsString, u64>),
}

#[derive(Debug)]
struct Node {
    /// What system calls see.
    current: Content,
    /// What a power loss leaves: the content as of the last fsync.
    durable: Content,
    mtime: SystemTime,
}

impl Node {
    fn new(current: Content) -> Node {
        let durable = match current {
            Content::File(_) => Content::File(Vec::new()),
            Content::Dir(_) => Content::Dir(BTreeMap::new()),
        };
        Node { current, durable, mtime: SystemTime::now() }
    }
}

/// What happened so far, for tests that want to show the code under test did sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub file_syncs: u64,
    pub dir_syncs: u64,
    pub power_losses: u64,
}

#[derive(Debug)]
struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    uid: u32,
    gid: u32,
    stats: Stats,
}

impl State {
    fn new() -> State {
        let mut root = Node::new(Content::Dir(BTreeMap::new()));
        // The mount point itself always exists.
        root.durable = Content::Dir(BTreeMap::new());
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        State { nodes: HashMap::from([(ROOT, root)]), next_ino: ROOT + 1, uid, gid, stats: Stats::default() }
    }

    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn entries(&self, ino: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match &self.node(ino)?.current {
            Content::Dir(entries) => Ok(entries),
            Content::File(_) => Err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, ino: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        let node = self.node_mut(ino)?;
        node.mtime = SystemTime::now();
        match &mut node.current {
            Content::Dir(entries) => Ok(entries),
            Content::File(_) => Err(Errno::ENOTDIR),
        }
    }

    fn data_mut(&mut self, ino: u64) -> Result<&mut Vec<u8>, Errno> {
        let node = self.node_mut(ino)?;
        node.mtime = SystemTime::now();
        match &mut node.current {
            Content::File(data) => Ok(data),
            Content::Dir(_) => Err(Errno::EISDIR),
        }
    }

    fn lookup(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.entries(parent)?.get(name).copied().ok_or(Errno::ENOENT)
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.node(ino)?;
        let (kind, size, perm, nlink) = match &node.current {
            Content::File(data) => (FileType::RegularFile, data.len() as u64, 0o644, 1),
            Content::Dir(_) => (FileType::Directory, 0, 0o755, 2),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: node.mtime,
            mtime: node.mtime,
            ctime: node.mtime,
            crtime: node.mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    fn add(&mut self, parent: u64, name: &OsStr, content: Content) -> Result<u64, Errno> {
        if self.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, Node::new(content));
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        Ok(ino)
    }

    fn is_dir(&self, ino: u64) -> Result<bool, Errno> {
        Ok(matches!(self.node(ino)?.current, Content::Dir(_)))
    }

    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        match (dir, self.is_dir(ino)?) {
            (false, true) => return Err(Errno::EISDIR),
            (true, false) => return Err(Errno::ENOTDIR),
            (true, true) if !self.entries(ino)?.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        // The node stays: a durable entry may still name it.
        self.entries_mut(parent)?.remove(name);
        Ok(())
    }

    fn rename(&mut self, parent: u64, name: &OsStr, new_parent: u64, new_name: &OsStr, flags: RenameFlags) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) || flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        let ino = self.lookup(parent, name)?;
        self.entries(new_parent)?;
        if let Ok(target) = self.lookup(new_parent, new_name) {
            if target == ino {
                return Ok(());
            }
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            match (self.is_dir(ino)?, self.is_dir(target)?) {
                (false, true) => return Err(Errno::EISDIR),
                (true, false) => return Err(Errno::ENOTDIR),
                (true, true) if !self.entries(target)?.is_empty() => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        self.entries_mut(parent)?.remove(name);
        self.entries_mut(new_parent)?.insert(new_name.to_owned(), ino);
        Ok(())
    }

    fn sync(&mut self, ino: u64) -> Result<(), Errno> {
        let node = self.node_mut(ino)?;
        node.durable = node.current.clone();
        match node.current {
            Content::File(_) => self.stats.file_syncs += 1,
            Content::Dir(_) => self.stats.dir_syncs += 1,
        }
        Ok(())
    }

    fn power_loss(&mut self) {
        for node in self.nodes.values_mut() {
            node.current = node.durable.clone();
        }
        let mut reachable = BTreeSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(ino) = todo.pop() {
            if let Some(Node { current: Content::Dir(entries), .. }) = self.nodes.get(&ino) {
                for child in entries.values() {
                    if reachable.insert(*child) {
                        todo.push(*child);
                    }
                }
            }
        }
        self.nodes.retain(|ino, _| reachable.contains(ino));
        self.stats.power_losses += 1;
    }
}

/// The filesystem as fuser serves it; its state is shared with the [`VolatileMount`].
struct VolatileFs {
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl VolatileFs {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn reply_entry(&self, reply: ReplyEntry, result: Result<u64, Errno>) {
        match result.and_then(|ino| self.state().attr(ino)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }
}

fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for VolatileFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self.state().lookup(parent.0, name);
        self.reply_entry(reply, result);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state().attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = self.state();
        let result = (|| {
            if let Some(size) = size {
                let len = usize::try_from(size).map_err(|_| Errno::EFBIG)?;
                state.data_mut(ino.0)?.resize(len, 0);
            }
            state.attr(ino.0)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        let result = self.state().add(parent.0, name, Content::Dir(BTreeMap::new()));
        self.reply_entry(reply, result);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.state().remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.state().remove(parent.0, name, true));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.state().rename(parent.0, name, newparent.0, newname, flags));
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let result = (|| {
            let mut state = self.state();
            if state.is_dir(ino.0)? {
                return Err(Errno::EPERM);
            }
            if state.entries(newparent.0)?.contains_key(newname) {
                return Err(Errno::EEXIST);
            }
            state.entries_mut(newparent.0)?.insert(newname.to_owned(), ino.0);
            Ok(ino.0)
        })();
        self.reply_entry(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = (|| {
            let mut state = self.state();
            if flags.0 & libc::O_TRUNC != 0 {
                state.data_mut(ino.0)?.clear();
            } else {
                state.node(ino.0)?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, _flags: i32, reply: ReplyCreate) {
        let result = (|| {
            let mut state = self.state();
            let ino = state.add(parent.0, name, Content::File(Vec::new()))?;
            state.attr(ino)
        })();
        match result {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let state = self.state();
        match state.node(ino.0).map(|n| &n.current) {
            Ok(Content::File(data)) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
                let end = start.saturating_add(size as usize).min(data.len());
                reply.data(&data[start..end]);
            }
            Ok(Content::Dir(_)) => reply.error(Errno::EISDIR),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = (|| {
            let mut state = self.state();
            let file = state.data_mut(ino.0)?;
            let start = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
            let end = start.checked_add(data.len()).ok_or(Errno::EFBIG)?;
            if file.len() < end {
                file.resize(end, 0);
            }
            file[start..end].copy_from_slice(data);
            u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
        })();
        match result {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.state().sync(ino.0));
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let state = self.state();
        let entries = match state.entries(ino.0) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        let mut all: Vec<(u64, FileType, OsString)> =
            vec![(ino.0, FileType::Directory, ".".into()), (ROOT, FileType::Directory, "..".into())];
        for (name, child) in entries {
            let kind = if state.is_dir(*child).unwrap_or(false) { FileType::Directory } else { FileType::RegularFile };
            all.push((*child, kind, name.clone()));
        }
        for (i, (child, kind, name)) in all.into_iter().enumerate().skip(usize::try_from(offset).unwrap_or(usize::MAX)) {
            if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply_empty(reply, self.state().sync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}

/// A mounted volatile filesystem; unmounted when dropped.
pub struct VolatileMount {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
}

impl VolatileMount {
    /// Mounts an empty volatile filesystem on `mountpoint`, an existing empty directory.
    pub fn mount(mountpoint: &Path) -> io::Result<VolatileMount> {
        let state = Arc::new(Mutex::new(State::new()));
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("volatilefs".into()), MountOption::Subtype("volatilefs".into())];
        let fs = VolatileFs { state: Arc::clone(&state) };
        let session = fuser::spawn_mount(fs, mountpoint, &config).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mount volatilefs on {} (needs /dev/fuse, and root or fusermount3): {e}", mountpoint.display()),
            )
        })?;
        Ok(VolatileMount { state, session: Some(session), mountpoint: mountpoint.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Drops everything that was not fsynced, as a power loss would. Stop the code under
    /// test first: a file it still has open may be gone.
    pub fn power_loss(&self) {
        lock(&self.state).power_loss();
    }

    pub fn stats(&self) -> Stats {
        lock(&self.state).stats
    }
}

impl Drop for VolatileMount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            if let Err(e) = session.umount_and_join() {
                eprintln!("unmount volatilefs at {}: {e}", self.mountpoint.display());
            }
        }
    }
}
