//! `Key`: where a value lives in the pageserver's key space; `KeyRange`: a half-open span
//! of it.
//!
//! The pageserver stores every version of every relation page, and of every piece of state
//! a basebackup needs (SLRU pages, relmapper files, the lists of databases and relations,
//! two-phase state, the checkpoint and the control file), plus the timestamp of the last
//! commit (which maps points in time to LSNs), under a `(Key, Lsn)` pair. Layers
//! cover key ranges and are searched by range, so the encoding is chosen for its order: a
//! `Key` is 18 bytes, its derived `Ord` is the order of those bytes, and things read
//! together sort together. A relation fork's size key sorts directly after its last
//! possible block, so one range scan sees a fork's blocks and its size; all keys of one
//! database (its relmapper file, its relation directory, its relations) form one contiguous
//! range, so dropping a database drops one range.
//!
//! Layout. Columns are byte offsets; multi-byte fields are big-endian, so that byte order
//! is numeric order; `0` means the field must be zero.
//!
//! | kind                  | 0 tag | 1..5       | 5..9       | 9..13       | 13      | 14..18              |
//! |-----------------------|-------|------------|------------|-------------|---------|---------------------|
//! | database directory    | `00`  | 0          | 0          | 0           | 0       | 0                   |
//! | relmapper file        | `01`  | spcnode    | dbnode     | 0           | 0       | 0                   |
//! | relation directory    | `01`  | spcnode    | dbnode     | 0           | 1       | 0                   |
//! | relation block        | `01`  | spcnode    | dbnode     | relnode ≠ 0 | forknum | blkno ≠ `FFFFFFFF`  |
//! | relation size         | `01`  | spcnode    | dbnode     | relnode ≠ 0 | forknum | `FFFFFFFF`          |
//! | SLRU directory        | `02`  | SLRU kind  | 0          | 0           | 0       | 0                   |
//! | SLRU block            | `02`  | SLRU kind  | 1          | segno       | 0       | blkno ≠ `FFFFFFFF`  |
//! | SLRU segment size     | `02`  | SLRU kind  | 1          | segno       | 0       | `FFFFFFFF`          |
//! | two-phase directory   | `03`  | 0          | 0          | 0           | 0       | 0                   |
//! | two-phase state file  | `03`  | 1          | 0          | 0           | 0       | xid                 |
//! | checkpoint record     | `04`  | 0          | 0          | 0           | 0       | 0                   |
//! | control file          | `05`  | 0          | 0          | 0           | 0       | 0                   |
//! | last commit timestamp | `06`  | 0          | 0          | 0           | 0       | 0                   |
//! | last running xacts    | `07`  | 0          | 0          | 0           | 0       | 0                   |
//! | `Key::MAX` (sentinel) | `FF`  | `FFFFFFFF` | `FFFFFFFF` | `FFFFFFFF`  | `FF`    | `FFFFFFFF`          |
//!
//! forknum is PostgreSQL's (0 main, 1 fsm, 2 vm, 3 init); SLRU kind is 0 for `pg_xact`, 1 for
//! `pg_multixact/offsets`, 2 for `pg_multixact/members`. Relnode 0 (`InvalidOid`) never names a
//! relation file, so it holds the database's own metadata and a database is one contiguous
//! range. `FFFFFFFF` (`InvalidBlockNumber`) never names a block, so it holds the size, which
//! then sorts directly after the last possible block.
//!
//! Invariants. A `Key` is always one of the rows above: `from_bytes` rejects everything
//! else, so each key has exactly one byte form and decodes to exactly one `KeyKind`.
//! `Key::MIN` is the database directory key. `Key::MAX` sorts after every other key and never
//! holds a value; it exists so that every key that does has a successor (`Key::next`) to end
//! a half-open range with.

use std::fmt;
use std::str::FromStr;

use crate::reltag::{BlockNumber, ForkNumber, Oid, RelTag};

/// The length of a key's byte form.
pub const KEY_SIZE_BYTES: usize = 18;

// Tags order the key space by kind. Gaps are free for kinds added later; a new kind must
// get a tag below `TAG_MAX`, never reuse one, since keys are persisted in layer files.
const TAG_DB_DIR: u8 = 0x00;
const TAG_DATABASE: u8 = 0x01;
const TAG_SLRU: u8 = 0x02;
const TAG_TWOPHASE: u8 = 0x03;
const TAG_CHECKPOINT: u8 = 0x04;
const TAG_CONTROL_FILE: u8 = 0x05;
const TAG_LAST_COMMIT_TIMESTAMP: u8 = 0x06;
const TAG_LAST_RUNNING_XACTS: u8 = 0x07;
const TAG_MAX: u8 = 0xff;

// Under `TAG_DATABASE`, relnode 0 (`InvalidOid`, which PostgreSQL never gives a relation
// file) holds the database's own metadata; byte 13 says which. Putting it there, rather than
// under a tag of its own, is what keeps a whole database in one range.
const DB_META_RELMAP: u8 = 0;
const DB_META_RELDIR: u8 = 1;

const SLRU_SUB_DIR: u32 = 0;
const SLRU_SUB_SEGMENT: u32 = 1;
const TWOPHASE_SUB_DIR: u32 = 0;
const TWOPHASE_SUB_FILE: u32 = 1;

/// The last field of a relation fork's or SLRU segment's size key. It is `InvalidBlockNumber`,
/// which never names a real block, and the largest u32, so the size sorts after every block.
const SIZE_SLOT: u32 = BlockNumber::INVALID.0;

/// The largest block number a block key can hold (`MaxBlockNumber`).
const MAX_BLOCK: u32 = SIZE_SLOT - 1;

/// One of PostgreSQL's SLRUs whose pages the pageserver keeps. The numbering is part of the
/// key encoding and must not change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum SlruKind {
    /// Commit status of transactions, `pg_xact`.
    Clog = 0,
    /// `pg_multixact/offsets`.
    MultiXactOffsets = 1,
    /// `pg_multixact/members`.
    MultiXactMembers = 2,
}

impl SlruKind {
    /// All kinds, in key order.
    pub const ALL: [SlruKind; 3] = [SlruKind::Clog, SlruKind::MultiXactOffsets, SlruKind::MultiXactMembers];

    /// The kind with number `n` in the key encoding, or `None` if there is no such kind.
    pub fn from_u32(n: u32) -> Option<SlruKind> {
        usize::try_from(n).ok().and_then(|i| SlruKind::ALL.get(i)).copied()
    }

    /// The directory, relative to the data directory, that holds this SLRU's segment files.
    pub fn dir_name(self) -> &'static str {
        match self {
            SlruKind::Clog => "pg_xact",
            SlruKind::MultiXactOffsets => "pg_multixact/offsets",
            SlruKind::MultiXactMembers => "pg_multixact/members",
        }
    }

    fn successor(self) -> Option<SlruKind> {
        SlruKind::from_u32(self as u32 + 1)
    }
}

impl fmt::Display for SlruKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dir_name())
    }
}

/// What a key names: the decoded form of a `Key`, one variant per row of the layout table.
///
/// `Key::kind` produces it; `Key::try_from(KeyKind)` turns it back into a key, rejecting the
/// few values the types allow but the key space does not (relnode 0, block `FFFFFFFF`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// The list of databases.
    DbDir,
    /// A database's `pg_filenode.map`; `global/pg_filenode.map` is spcnode 1664, dbnode 0.
    RelMapFile { spcnode: Oid, dbnode: Oid },
    /// The list of relations of one database (spcnode 1664, dbnode 0: the shared catalogs).
    RelDir { spcnode: Oid, dbnode: Oid },
    /// One page of a relation fork.
    RelBlock { rel: RelTag, blkno: BlockNumber },
    /// The size in blocks of a relation fork, and whether it exists.
    RelSize { rel: RelTag },
    /// The list of segments of one SLRU.
    SlruDir { slru: SlruKind },
    /// One page of an SLRU segment.
    SlruBlock { slru: SlruKind, segno: u32, blkno: BlockNumber },
    /// The size in blocks of an SLRU segment, and whether it exists.
    SlruSegmentSize { slru: SlruKind, segno: u32 },
    /// The list of prepared transactions.
    TwoPhaseDir,
    /// The state file of the prepared transaction `xid` (`pg_twophase/%08X`).
    TwoPhaseFile { xid: u32 },
    /// The latest checkpoint record, from which a basebackup's `pg_control` is made.
    Checkpoint,
    /// `global/pg_control`.
    ControlFile,
    /// The commit timestamp of the newest transaction committed at or before an LSN: what
    /// maps a point in time to an LSN. Not a file of the data directory.
    LastCommitTimestamp,
    /// Where the newest running-transactions record at or before an LSN starts: where a hot
    /// standby can start and know at once which transactions are running. Not a file.
    LastRunningXacts,
    /// `Key::MAX`, the end of the key space; holds no value.
    Max,
}

impl KeyKind {
    /// A short name for the kind, for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            KeyKind::DbDir => "database directory",
            KeyKind::RelMapFile { .. } => "relmapper file",
            KeyKind::RelDir { .. } => "relation directory",
            KeyKind::RelBlock { .. } => "relation block",
            KeyKind::RelSize { .. } => "relation size",
            KeyKind::SlruDir { .. } => "SLRU directory",
            KeyKind::SlruBlock { .. } => "SLRU block",
            KeyKind::SlruSegmentSize { .. } => "SLRU segment size",
            KeyKind::TwoPhaseDir => "two-phase directory",
            KeyKind::TwoPhaseFile { .. } => "two-phase state file",
            KeyKind::Checkpoint => "checkpoint",
            KeyKind::ControlFile => "control file",
            KeyKind::LastCommitTimestamp => "last commit timestamp",
            KeyKind::LastRunningXacts => "last running xacts",
            KeyKind::Max => "maximum",
        }
    }

    /// The six fields of the layout table, without checking that the kind is encodable.
    fn fields(&self) -> Fields {
        let f = |tag, a, b, c, d, e| Fields { tag, a, b, c, d, e };
        match *self {
            KeyKind::DbDir => f(TAG_DB_DIR, 0, 0, 0, 0, 0),
            KeyKind::RelMapFile { spcnode, dbnode } => f(TAG_DATABASE, spcnode, dbnode, 0, DB_META_RELMAP, 0),
            KeyKind::RelDir { spcnode, dbnode } => f(TAG_DATABASE, spcnode, dbnode, 0, DB_META_RELDIR, 0),
            KeyKind::RelBlock { rel, blkno } => f(TAG_DATABASE, rel.spcnode, rel.dbnode, rel.relnode, rel.forknum as u8, blkno.0),
            KeyKind::RelSize { rel } => f(TAG_DATABASE, rel.spcnode, rel.dbnode, rel.relnode, rel.forknum as u8, SIZE_SLOT),
            KeyKind::SlruDir { slru } => f(TAG_SLRU, slru as u32, SLRU_SUB_DIR, 0, 0, 0),
            KeyKind::SlruBlock { slru, segno, blkno } => f(TAG_SLRU, slru as u32, SLRU_SUB_SEGMENT, segno, 0, blkno.0),
            KeyKind::SlruSegmentSize { slru, segno } => f(TAG_SLRU, slru as u32, SLRU_SUB_SEGMENT, segno, 0, SIZE_SLOT),
            KeyKind::TwoPhaseDir => f(TAG_TWOPHASE, TWOPHASE_SUB_DIR, 0, 0, 0, 0),
            KeyKind::TwoPhaseFile { xid } => f(TAG_TWOPHASE, TWOPHASE_SUB_FILE, 0, 0, 0, xid),
            KeyKind::Checkpoint => f(TAG_CHECKPOINT, 0, 0, 0, 0, 0),
            KeyKind::ControlFile => f(TAG_CONTROL_FILE, 0, 0, 0, 0, 0),
            KeyKind::LastCommitTimestamp => f(TAG_LAST_COMMIT_TIMESTAMP, 0, 0, 0, 0, 0),
            KeyKind::LastRunningXacts => f(TAG_LAST_RUNNING_XACTS, 0, 0, 0, 0, 0),
            KeyKind::Max => f(TAG_MAX, u32::MAX, u32::MAX, u32::MAX, u8::MAX, u32::MAX),
        }
    }
}

impl fmt::Display for KeyKind {
    /// Names the thing as a user would look for it: a file path where there is one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyKind::DbDir => write!(f, "database directory"),
            KeyKind::RelMapFile { spcnode, dbnode } => write!(f, "pg_filenode.map of spc {spcnode} db {dbnode}"),
            KeyKind::RelDir { spcnode, dbnode } => write!(f, "relation directory of spc {spcnode} db {dbnode}"),
            KeyKind::RelBlock { rel, blkno } => write!(f, "{rel} block {blkno}"),
            KeyKind::RelSize { rel } => write!(f, "{rel} size"),
            KeyKind::SlruDir { slru } => write!(f, "{slru} directory"),
            KeyKind::SlruBlock { slru, segno, blkno } => write!(f, "{slru}/{segno:04X} block {blkno}"),
            KeyKind::SlruSegmentSize { slru, segno } => write!(f, "{slru}/{segno:04X} size"),
            KeyKind::TwoPhaseDir => write!(f, "pg_twophase directory"),
            KeyKind::TwoPhaseFile { xid } => write!(f, "pg_twophase/{xid:08X}"),
            KeyKind::Checkpoint => write!(f, "checkpoint record"),
            KeyKind::ControlFile => write!(f, "global/pg_control"),
            KeyKind::LastCommitTimestamp => write!(f, "last commit timestamp"),
            KeyKind::LastRunningXacts => write!(f, "last running-transactions record"),
            KeyKind::Max => write!(f, "end of key space"),
        }
    }
}

/// The columns of the layout table, before they are given meaning.
#[derive(Clone, Copy)]
struct Fields {
    tag: u8,
    a: u32,
    b: u32,
    c: u32,
    d: u8,
    e: u32,
}

impl Fields {
    const fn encode(self) -> [u8; KEY_SIZE_BYTES] {
        let (a, b, c, e) = (self.a.to_be_bytes(), self.b.to_be_bytes(), self.c.to_be_bytes(), self.e.to_be_bytes());
        [self.tag, a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], self.d, e[0], e[1], e[2], e[3]]
    }

    fn decode(bytes: &[u8; KEY_SIZE_BYTES]) -> Fields {
        let u32_at = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        Fields { tag: bytes[0], a: u32_at(1), b: u32_at(5), c: u32_at(9), d: bytes[13], e: u32_at(14) }
    }
}

/// Bytes that are not a key, or a `KeyKind` that cannot be one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("invalid key length: {len} bytes (expected {KEY_SIZE_BYTES})")]
    WrongLength { len: usize },
    #[error("unrecognized key kind tag: 0x{tag:02x}")]
    UnknownTag { tag: u8 },
    #[error("invalid fork number in relation key: {forknum}")]
    InvalidForkNumber { forknum: u8 },
    #[error("unrecognized SLRU kind in key: {value}")]
    UnknownSlruKind { value: u32 },
    #[error("unrecognized {space} key subkind: {value}")]
    UnknownSubkind { space: &'static str, value: u32 },
    #[error("malformed {kind} key: {} (its unused fields must be zero)", Hex(.bytes))]
    UnusedFieldsSet { kind: &'static str, bytes: [u8; KEY_SIZE_BYTES] },
    #[error("malformed key with tag 0xff: {} (only Key::MAX, all FF, has that tag)", Hex(.bytes))]
    NotMax { bytes: [u8; KEY_SIZE_BYTES] },
    #[error("cannot make a {kind} key for relnode 0 (InvalidOid): {rel}")]
    InvalidRelNode { kind: &'static str, rel: RelTag },
    #[error("cannot make a {kind} key for block number {blkno} (InvalidBlockNumber): it holds the size")]
    ReservedBlockNumber { kind: &'static str, blkno: BlockNumber },
    #[error("invalid key: {text:?} (expected {} hexadecimal digits)", 2 * KEY_SIZE_BYTES)]
    InvalidText { text: String },
}

/// A position in the pageserver's key space. See the module documentation for the layout.
///
/// The derived `Ord` compares the byte form, so sorting keys and sorting `to_bytes()` agree.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key([u8; KEY_SIZE_BYTES]);

impl Key {
    /// The smallest key, which is the database directory key.
    pub const MIN: Key = Key::db_dir();
    /// The end of the key space: greater than every other key, never holds a value.
    pub const MAX: Key = Key([0xff; KEY_SIZE_BYTES]);

    const fn from_fields(fields: Fields) -> Key {
        Key(fields.encode())
    }

    /// The list of databases.
    pub const fn db_dir() -> Key {
        Key::from_fields(Fields { tag: TAG_DB_DIR, a: 0, b: 0, c: 0, d: 0, e: 0 })
    }

    /// A database's `pg_filenode.map`. The global one is `relmap_file(1664, 0)`.
    pub const fn relmap_file(spcnode: Oid, dbnode: Oid) -> Key {
        Key::from_fields(Fields { tag: TAG_DATABASE, a: spcnode, b: dbnode, c: 0, d: DB_META_RELMAP, e: 0 })
    }

    /// The list of relations of one database.
    pub const fn rel_dir(spcnode: Oid, dbnode: Oid) -> Key {
        Key::from_fields(Fields { tag: TAG_DATABASE, a: spcnode, b: dbnode, c: 0, d: DB_META_RELDIR, e: 0 })
    }

    /// One page of a relation fork.
    ///
    /// # Panics
    /// If `rel.relnode` is 0 or `blkno` is `BlockNumber::INVALID`; PostgreSQL never writes
    /// either. For values from WAL or the network use `Key::try_from(KeyKind::RelBlock { .. })`.
    pub fn rel_block(rel: RelTag, blkno: BlockNumber) -> Key {
        Key::encodable(KeyKind::RelBlock { rel, blkno })
    }

    /// The size of a relation fork; it sorts directly after the fork's last possible block.
    ///
    /// # Panics
    /// If `rel.relnode` is 0. For values from WAL or the network use
    /// `Key::try_from(KeyKind::RelSize { .. })`.
    pub fn rel_size(rel: RelTag) -> Key {
        Key::encodable(KeyKind::RelSize { rel })
    }

    /// The list of segments of one SLRU.
    pub const fn slru_dir(slru: SlruKind) -> Key {
        Key::from_fields(Fields { tag: TAG_SLRU, a: slru as u32, b: SLRU_SUB_DIR, c: 0, d: 0, e: 0 })
    }

    /// One page of an SLRU segment.
    ///
    /// # Panics
    /// If `blkno` is `BlockNumber::INVALID`. For values from WAL or the network use
    /// `Key::try_from(KeyKind::SlruBlock { .. })`.
    pub fn slru_block(slru: SlruKind, segno: u32, blkno: BlockNumber) -> Key {
        Key::encodable(KeyKind::SlruBlock { slru, segno, blkno })
    }

    /// The size of an SLRU segment; it sorts directly after the segment's last possible block.
    pub const fn slru_segment_size(slru: SlruKind, segno: u32) -> Key {
        Key::from_fields(Fields { tag: TAG_SLRU, a: slru as u32, b: SLRU_SUB_SEGMENT, c: segno, d: 0, e: SIZE_SLOT })
    }

    /// The list of prepared transactions.
    pub const fn twophase_dir() -> Key {
        Key::from_fields(Fields { tag: TAG_TWOPHASE, a: TWOPHASE_SUB_DIR, b: 0, c: 0, d: 0, e: 0 })
    }

    /// The state file of prepared transaction `xid`.
    pub const fn twophase_file(xid: u32) -> Key {
        Key::from_fields(Fields { tag: TAG_TWOPHASE, a: TWOPHASE_SUB_FILE, b: 0, c: 0, d: 0, e: xid })
    }

    /// The latest checkpoint record.
    pub const fn checkpoint() -> Key {
        Key::from_fields(Fields { tag: TAG_CHECKPOINT, a: 0, b: 0, c: 0, d: 0, e: 0 })
    }

    /// `global/pg_control`.
    pub const fn control_file() -> Key {
        Key::from_fields(Fields { tag: TAG_CONTROL_FILE, a: 0, b: 0, c: 0, d: 0, e: 0 })
    }

    /// The timestamp of the last commit at or before an LSN.
    pub const fn last_commit_timestamp() -> Key {
        Key::from_fields(Fields { tag: TAG_LAST_COMMIT_TIMESTAMP, a: 0, b: 0, c: 0, d: 0, e: 0 })
    }

    /// The newest running-transactions record at or before an LSN.
    pub const fn last_running_xacts() -> Key {
        Key::from_fields(Fields { tag: TAG_LAST_RUNNING_XACTS, a: 0, b: 0, c: 0, d: 0, e: 0 })
    }

    /// The key for `kind`, panicking where `try_from` would fail; the panicking constructors
    /// are for callers that built the values themselves.
    fn encodable(kind: KeyKind) -> Key {
        Key::try_from(kind).unwrap_or_else(|err| panic!("{err}"))
    }

    /// The byte form, whose order is the key order.
    pub const fn to_bytes(self) -> [u8; KEY_SIZE_BYTES] {
        self.0
    }

    /// Parses and validates a byte form: exactly one row of the layout table, with every
    /// unused field at its fixed value.
    pub fn from_bytes(bytes: &[u8]) -> Result<Key, KeyError> {
        let bytes: &[u8; KEY_SIZE_BYTES] = bytes.try_into().map_err(|_| KeyError::WrongLength { len: bytes.len() })?;
        let kind = decode(bytes)?;
        // Decoding reads only the fields a kind uses; comparing with the re-encoding checks
        // the rest, so that no two byte strings decode to the same key.
        if kind.fields().encode() != *bytes {
            return Err(match kind {
                KeyKind::Max => KeyError::NotMax { bytes: *bytes },
                _ => KeyError::UnusedFieldsSet { kind: kind.name(), bytes: *bytes },
            });
        }
        Ok(Key(*bytes))
    }

    /// What this key names.
    pub fn kind(self) -> KeyKind {
        // A `Key` only ever holds an encoding that `from_bytes` accepts, so this cannot fail;
        // if it did, a key would have been built behind the validation's back.
        decode(&self.0).unwrap_or_else(|err| panic!("Key holds an invalid encoding: {err}"))
    }

    pub fn is_rel_block(self) -> bool {
        self.0[0] == TAG_DATABASE && self.relnode_field() != 0 && self.last_field() != SIZE_SLOT
    }

    pub fn is_rel_size(self) -> bool {
        self.0[0] == TAG_DATABASE && self.relnode_field() != 0 && self.last_field() == SIZE_SLOT
    }

    /// Whether the value under this key is one 8 KiB page: a relation or SLRU block, the
    /// kinds WAL redo works on.
    pub fn is_block(self) -> bool {
        matches!(self.kind(), KeyKind::RelBlock { .. } | KeyKind::SlruBlock { .. })
    }

    /// The relation fork of a relation block or size key.
    pub fn rel_tag(self) -> Option<RelTag> {
        match self.kind() {
            KeyKind::RelBlock { rel, .. } | KeyKind::RelSize { rel } => Some(rel),
            _ => None,
        }
    }

    /// The block number of a relation or SLRU block key.
    pub fn block_number(self) -> Option<BlockNumber> {
        match self.kind() {
            KeyKind::RelBlock { blkno, .. } | KeyKind::SlruBlock { blkno, .. } => Some(blkno),
            _ => None,
        }
    }

    /// The SLRU of an SLRU directory, block or segment size key.
    pub fn slru(self) -> Option<SlruKind> {
        match self.kind() {
            KeyKind::SlruDir { slru } | KeyKind::SlruBlock { slru, .. } | KeyKind::SlruSegmentSize { slru, .. } => Some(slru),
            _ => None,
        }
    }

    /// `(spcnode, dbnode)` of every key inside `KeyRange::database`: the database's
    /// relmapper file, its relation directory, and its relations' blocks and sizes.
    pub fn database(self) -> Option<(Oid, Oid)> {
        match self.kind() {
            KeyKind::RelMapFile { spcnode, dbnode } | KeyKind::RelDir { spcnode, dbnode } => Some((spcnode, dbnode)),
            KeyKind::RelBlock { rel, .. } | KeyKind::RelSize { rel } => Some((rel.spcnode, rel.dbnode)),
            _ => None,
        }
    }

    /// The smallest key greater than this one, so that `[k, k.next())` holds exactly `k`.
    /// `Key::MAX.next()` is `Key::MAX`: nothing follows the end of the key space.
    pub fn next(self) -> Key {
        match self.kind() {
            KeyKind::DbDir => Key::relmap_file(0, 0),
            KeyKind::RelMapFile { spcnode, dbnode } => Key::rel_dir(spcnode, dbnode),
            KeyKind::RelDir { spcnode, dbnode } => {
                Key::rel_block(RelTag { spcnode, dbnode, relnode: 1, forknum: ForkNumber::Main }, BlockNumber(0))
            }
            KeyKind::RelBlock { rel, blkno } if blkno.0 < MAX_BLOCK => Key::rel_block(rel, BlockNumber(blkno.0 + 1)),
            KeyKind::RelBlock { rel, .. } => Key::rel_size(rel),
            KeyKind::RelSize { rel } => after_rel_fork(rel),
            KeyKind::SlruDir { slru } => Key::slru_block(slru, 0, BlockNumber(0)),
            KeyKind::SlruBlock { slru, segno, blkno } if blkno.0 < MAX_BLOCK => Key::slru_block(slru, segno, BlockNumber(blkno.0 + 1)),
            KeyKind::SlruBlock { slru, segno, .. } => Key::slru_segment_size(slru, segno),
            KeyKind::SlruSegmentSize { slru, segno } => match segno.checked_add(1) {
                Some(segno) => Key::slru_block(slru, segno, BlockNumber(0)),
                None => after_slru(slru),
            },
            KeyKind::TwoPhaseDir => Key::twophase_file(0),
            KeyKind::TwoPhaseFile { xid } => xid.checked_add(1).map_or(Key::checkpoint(), Key::twophase_file),
            KeyKind::Checkpoint => Key::control_file(),
            KeyKind::ControlFile => Key::last_commit_timestamp(),
            KeyKind::LastCommitTimestamp => Key::last_running_xacts(),
            KeyKind::LastRunningXacts | KeyKind::Max => Key::MAX,
        }
    }

    fn relnode_field(self) -> u32 {
        u32::from_be_bytes([self.0[9], self.0[10], self.0[11], self.0[12]])
    }

    fn last_field(self) -> u32 {
        u32::from_be_bytes([self.0[14], self.0[15], self.0[16], self.0[17]])
    }
}

/// Reads the fields a kind uses and checks their values; `Key::from_bytes` checks the rest.
fn decode(bytes: &[u8; KEY_SIZE_BYTES]) -> Result<KeyKind, KeyError> {
    let f = Fields::decode(bytes);
    let kind = match f.tag {
        TAG_DB_DIR => KeyKind::DbDir,
        TAG_DATABASE if f.c == 0 => match f.d {
            DB_META_RELMAP => KeyKind::RelMapFile { spcnode: f.a, dbnode: f.b },
            DB_META_RELDIR => KeyKind::RelDir { spcnode: f.a, dbnode: f.b },
            other => return Err(KeyError::UnknownSubkind { space: "database metadata", value: other.into() }),
        },
        TAG_DATABASE => {
            let forknum = ForkNumber::from_u8(f.d).ok_or(KeyError::InvalidForkNumber { forknum: f.d })?;
            let rel = RelTag { spcnode: f.a, dbnode: f.b, relnode: f.c, forknum };
            match f.e {
                SIZE_SLOT => KeyKind::RelSize { rel },
                blkno => KeyKind::RelBlock { rel, blkno: BlockNumber(blkno) },
            }
        }
        TAG_SLRU => {
            let slru = SlruKind::from_u32(f.a).ok_or(KeyError::UnknownSlruKind { value: f.a })?;
            match (f.b, f.e) {
                (SLRU_SUB_DIR, _) => KeyKind::SlruDir { slru },
                (SLRU_SUB_SEGMENT, SIZE_SLOT) => KeyKind::SlruSegmentSize { slru, segno: f.c },
                (SLRU_SUB_SEGMENT, blkno) => KeyKind::SlruBlock { slru, segno: f.c, blkno: BlockNumber(blkno) },
                (other, _) => return Err(KeyError::UnknownSubkind { space: "SLRU", value: other }),
            }
        }
        TAG_TWOPHASE => match f.a {
            TWOPHASE_SUB_DIR => KeyKind::TwoPhaseDir,
            TWOPHASE_SUB_FILE => KeyKind::TwoPhaseFile { xid: f.e },
            other => return Err(KeyError::UnknownSubkind { space: "two-phase", value: other }),
        },
        TAG_CHECKPOINT => KeyKind::Checkpoint,
        TAG_CONTROL_FILE => KeyKind::ControlFile,
        TAG_LAST_COMMIT_TIMESTAMP => KeyKind::LastCommitTimestamp,
        TAG_LAST_RUNNING_XACTS => KeyKind::LastRunningXacts,
        TAG_MAX => KeyKind::Max,
        tag => return Err(KeyError::UnknownTag { tag }),
    };
    Ok(kind)
}

/// The first key after every key of relation fork `rel`.
fn after_rel_fork(rel: RelTag) -> Key {
    if let Some(forknum) = ForkNumber::from_u8(rel.forknum as u8 + 1) {
        Key::rel_block(RelTag { forknum, ..rel }, BlockNumber(0))
    } else if let Some(relnode) = rel.relnode.checked_add(1) {
        Key::rel_block(RelTag { relnode, forknum: ForkNumber::Main, ..rel }, BlockNumber(0))
    } else {
        after_database(rel.spcnode, rel.dbnode)
    }
}

/// The first key after every key of database `(spcnode, dbnode)`.
fn after_database(spcnode: Oid, dbnode: Oid) -> Key {
    if let Some(dbnode) = dbnode.checked_add(1) {
        Key::relmap_file(spcnode, dbnode)
    } else if let Some(spcnode) = spcnode.checked_add(1) {
        Key::relmap_file(spcnode, 0)
    } else {
        Key::slru_dir(SlruKind::ALL[0])
    }
}

/// The first key after every key of SLRU `slru`.
fn after_slru(slru: SlruKind) -> Key {
    slru.successor().map_or(Key::twophase_dir(), Key::slru_dir)
}

impl TryFrom<KeyKind> for Key {
    type Error = KeyError;

    /// Encodes `kind`, rejecting what the types allow but the layout reserves.
    fn try_from(kind: KeyKind) -> Result<Key, KeyError> {
        let name = kind.name();
        match kind {
            KeyKind::RelBlock { rel, .. } | KeyKind::RelSize { rel } if rel.relnode == 0 => {
                return Err(KeyError::InvalidRelNode { kind: name, rel });
            }
            KeyKind::RelBlock { blkno, .. } | KeyKind::SlruBlock { blkno, .. } if blkno == BlockNumber::INVALID => {
                return Err(KeyError::ReservedBlockNumber { kind: name, blkno });
            }
            _ => {}
        }
        Ok(Key::from_fields(kind.fields()))
    }
}

/// Formats bytes as uppercase hexadecimal.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02X}"))
    }
}

impl fmt::Display for Key {
    /// The byte form as 36 uppercase hex digits: sorts as the key does, and parses back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Hex(&self.0).fmt(f)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self}: {})", self.kind())
    }
}

impl FromStr for Key {
    type Err = KeyError;

    /// Parses the `Display` form, in either case.
    fn from_str(s: &str) -> Result<Key, KeyError> {
        let text = s.as_bytes();
        if text.len() != 2 * KEY_SIZE_BYTES || !text.iter().all(u8::is_ascii_hexdigit) {
            return Err(KeyError::InvalidText { text: s.to_string() });
        }
        let nibble = |c: u8| (c as char).to_digit(16).unwrap_or_default() as u8;
        let mut bytes = [0u8; KEY_SIZE_BYTES];
        for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
            *byte = (nibble(pair[0]) << 4) | nibble(pair[1]);
        }
        Key::from_bytes(&bytes)
    }
}

/// The keys `start <= key < end`. A range whose `start` is not below its `end` is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyRange {
    pub start: Key,
    pub end: Key,
}

impl KeyRange {
    /// Every key that can hold a value.
    pub const ALL: KeyRange = KeyRange { start: Key::MIN, end: Key::MAX };

    /// Just `key`. Empty for `Key::MAX`, which holds no value.
    pub fn single(key: Key) -> KeyRange {
        KeyRange { start: key, end: key.next() }
    }

    /// All keys of one relation fork: its blocks and its size, nothing else.
    ///
    /// # Panics
    /// If `rel.relnode` is 0, as `Key::rel_block` does.
    pub fn rel_fork(rel: RelTag) -> KeyRange {
        KeyRange { start: Key::rel_block(rel, BlockNumber(0)), end: after_rel_fork(rel) }
    }

    /// All keys of one database: its relmapper file, its relation directory, and every fork
    /// of every relation in it. Not the database directory entry, which lists all databases.
    pub fn database(spcnode: Oid, dbnode: Oid) -> KeyRange {
        KeyRange { start: Key::relmap_file(spcnode, dbnode), end: after_database(spcnode, dbnode) }
    }

    /// All keys of one SLRU: its directory, and every block and size of its segments.
    pub fn slru(slru: SlruKind) -> KeyRange {
        KeyRange { start: Key::slru_dir(slru), end: after_slru(slru) }
    }

    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.start <= *key && *key < self.end
    }

    /// Whether some key lies in both ranges.
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        !self.is_empty() && !other.is_empty() && self.start < other.end && other.start < self.end
    }
}

impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

#[cfg(test)]
mod tests;
