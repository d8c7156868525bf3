//! Reusing a compute's local file cache across a restart of its endpoint.
//!
//! The extension writes `<cache file>.index` after a clean shutdown (format and safety
//! argument: `proto::filecache`). Before postgres starts, [`prepare`] reads it, keeps only
//! entries that cannot be stale, and writes them as `<cache file>.ready`, which the
//! extension loads at start. Anything that does not match (another tenant or timeline, a
//! corrupt index, a pageserver that cannot say what changed) discards the whole cache:
//! the compute then starts with an empty one, which is only slower.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use proto::filecache::{SavedEntry, SavedIndex};
use proto::{Lsn, TenantId, TimelineId};

/// What changed on the timeline between two LSNs, as far as cached pages are concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// (spcnode, dbnode, relnode, fork, block) → the newest LSN at which the block changed.
    pub blocks: HashMap<(u32, u32, u32, u8, u32), Lsn>,
    /// (spcnode, dbnode, relnode, fork) → blocks at or past this number may have been
    /// truncated away, dropped or recreated (0: the whole fork).
    pub relations: HashMap<(u32, u32, u32, u8), u32>,
    /// (spcnode, dbnode) of databases created or dropped.
    pub databases: HashSet<(u32, u32)>,
}

/// Why entries were dropped, for the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    pub entries: Vec<SavedEntry>,
    /// Entries whose content may depend on WAL that was not durable at shutdown.
    pub not_durable: usize,
    /// Entries whose block changed after their content was stored.
    pub changed: usize,
}

/// The entries of `saved` that are still the newest version of their block at `start`,
/// given what changed between the oldest entry's LSN and `start`.
pub fn filter(saved: &SavedIndex, start: Lsn, changes: &Changes) -> Kept {
    let mut kept = Kept::default();
    for e in &saved.entries {
        if e.dep_lsn > saved.durable_lsn || e.dep_lsn > start {
            kept.not_durable += 1;
            continue;
        }
        let block = (e.spcnode, e.dbnode, e.relnode, e.forknum, e.blkno);
        let stale = changes.databases.contains(&(e.spcnode, e.dbnode))
            || changes.relations.get(&(e.spcnode, e.dbnode, e.relnode, e.forknum)).is_some_and(|&from| e.blkno >= from)
            || changes.blocks.get(&block).is_some_and(|&lsn| lsn > e.dep_lsn);
        if stale {
            kept.changed += 1;
        } else {
            kept.entries.push(*e);
        }
    }
    kept
}

/// Where the pageserver must start looking for changes: the oldest LSN any entry that may be
/// kept depends on, or, if later, the LSN as of which every entry is known to be its
/// block's version in the history the compute starts from. That is the index's valid-as-of
/// LSN (its shutdown checkpoint) only up to its durable LSN: every later history holds this
/// compute's WAL up to the durable LSN, but past it the branch may have gone on with
/// another compute's WAL, over the same LSNs and beyond the valid-as-of LSN
/// (`proto::filecache`). `None` when no entry can be kept.
pub fn changes_since(saved: &SavedIndex, start: Lsn) -> Option<Lsn> {
    let oldest = saved.entries.iter().map(|e| e.dep_lsn).filter(|&d| d <= saved.durable_lsn && d <= start).min()?;
    Some(oldest.max(saved.valid_lsn.min(saved.durable_lsn)))
}

pub fn saved_index_path(cache: &Path) -> PathBuf {
    suffixed(cache, ".index")
}

pub fn ready_index_path(cache: &Path) -> PathBuf {
    suffixed(cache, ".ready")
}

fn suffixed(cache: &Path, suffix: &str) -> PathBuf {
    let mut p = cache.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// What [`prepare`] did, for the log and the status report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No saved index (a first start, or the last stop was not clean).
    NothingSaved,
    /// The saved cache was discarded whole, and why.
    Discarded(String),
    /// `reused` of `saved` entries are handed to the extension; `asked_from` is where the
    /// question to the pageserver started (`None`: nothing needed asking).
    Reused { saved: usize, reused: usize, not_durable: usize, changed: usize, asked_from: Option<Lsn> },
}

/// Turns a saved index into a ready one for a compute of `tenant`/`timeline` that starts at
/// `start`, asking `changes(from, to, saved entries)` what changed in between. Never fails: every problem
/// discards the cache (with the reason in the outcome).
pub fn prepare(
    cache: &Path,
    tenant: TenantId,
    timeline: TimelineId,
    start: Lsn,
    changes: impl FnOnce(Lsn, Lsn, usize) -> anyhow::Result<Changes>,
) -> Outcome {
    let saved_path = saved_index_path(cache);
    let ready_path = ready_index_path(cache);
    let _ = std::fs::remove_file(&ready_path);
    let bytes = match std::fs::read(&saved_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Outcome::NothingSaved,
        Err(e) => return discard(&saved_path, format!("cannot read {}: {e}", saved_path.display())),
    };
    let saved = match SavedIndex::decode(&bytes) {
        Ok(s) => s,
        Err(e) => return discard(&saved_path, format!("{} is not usable: {e}", saved_path.display())),
    };
    if saved.tenant != tenant || saved.timeline != timeline {
        return discard(&saved_path, format!("it was saved for timeline {}/{}", saved.tenant, saved.timeline));
    }
    if saved.durable_lsn > start {
        // The safekeepers elected an end of WAL below what a majority had: not possible
        // unless they lost data. Trust nothing.
        return discard(&saved_path, format!("its durable LSN {} is past the start LSN {start}", saved.durable_lsn));
    }
    let (changed, asked_from) = match changes_since(&saved, start) {
        None => (Changes::default(), None),
        Some(from) if from >= start => (Changes::default(), None),
        Some(from) => match changes(from, start, saved.entries.len()) {
            Ok(c) => (c, Some(from)),
            Err(e) => return discard(&saved_path, format!("the pageserver cannot say what changed between {from} and {start}: {e:#}")),
        },
    };
    let kept = filter(&saved, start, &changed);
    let outcome = Outcome::Reused {
        saved: saved.entries.len(),
        reused: kept.entries.len(),
        not_durable: kept.not_durable,
        changed: kept.changed,
        asked_from,
    };
    let ready = SavedIndex { entries: kept.entries, ..saved };
    if let Err(e) = crashsafe::write_file_atomic(&ready_path, &ready.encode()) {
        return discard(&saved_path, format!("cannot write {}: {e}", ready_path.display()));
    }
    let _ = std::fs::remove_file(&saved_path);
    outcome
}

fn discard(saved_path: &Path, why: String) -> Outcome {
    let _ = std::fs::remove_file(saved_path);
    Outcome::Discarded(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(relnode: u32, blkno: u32, slot: u32, dep: u64) -> SavedEntry {
        SavedEntry { spcnode: 1663, dbnode: 5, relnode, forknum: 0, blkno, slot, page_crc: slot, dep_lsn: Lsn(dep) }
    }

    fn saved(entries: Vec<SavedEntry>) -> SavedIndex {
        SavedIndex {
            tenant: TenantId::from_bytes([1; 16]),
            timeline: TimelineId::from_bytes([2; 16]),
            slots: 64,
            durable_lsn: Lsn(1000),
            valid_lsn: Lsn::INVALID,
            entries,
        }
    }

    #[test]
    fn only_durable_unchanged_entries_are_kept() {
        let s = saved(vec![
            entry(10, 0, 0, 100),  // unchanged
            entry(10, 1, 1, 100),  // changed after its LSN
            entry(10, 2, 2, 500),  // changed before its LSN: the page has it
            entry(11, 0, 3, 100),  // its fork truncated to 0 blocks
            entry(12, 5, 4, 100),  // its fork cut at block 5
            entry(12, 4, 5, 100),  // below the cut
            entry(13, 0, 6, 1001), // past the durable LSN
        ]);
        let mut c = Changes::default();
        c.blocks.insert((1663, 5, 10, 0, 1), Lsn(200));
        c.blocks.insert((1663, 5, 10, 0, 2), Lsn(400));
        c.relations.insert((1663, 5, 11, 0), 0);
        c.relations.insert((1663, 5, 12, 0), 5);
        let kept = filter(&s, Lsn(2000), &c);
        let slots: Vec<u32> = kept.entries.iter().map(|e| e.slot).collect();
        assert_eq!(slots, vec![0, 2, 5]);
        assert_eq!((kept.not_durable, kept.changed), (1, 3));
        assert_eq!(changes_since(&s, Lsn(2000)), Some(Lsn(100)));

        c.databases.insert((1663, 5));
        assert!(filter(&s, Lsn(2000), &c).entries.is_empty());
    }

    #[test]
    fn the_valid_lsn_narrows_the_question_only_up_to_the_durable_lsn() {
        // Saved at a shutdown checkpoint at 900 with WAL durable up to 1000: every later
        // history holds this compute's WAL up to 1000, so every entry is its block's version
        // at 900 there too, and only (900, S] is asked.
        let s = SavedIndex { valid_lsn: Lsn(900), ..saved(vec![entry(10, 0, 0, 100), entry(10, 1, 1, 800)]) };
        assert_eq!(changes_since(&s, Lsn(2000)), Some(Lsn(900)));

        // The shutdown checkpoint at 1200 is past the durable LSN 1000 (a sync before the
        // stop that timed out, a fenced compute's shutdown): the branch may go on from 1000
        // with another compute's WAL, below 1200 and past it, so (1000, S] is asked, also
        // for a start below the checkpoint.
        let s = SavedIndex { valid_lsn: Lsn(1200), ..saved(vec![entry(10, 0, 0, 100), entry(10, 1, 1, 900), entry(13, 0, 2, 1001)]) };
        assert_eq!(changes_since(&s, Lsn(2000)), Some(Lsn(1000)));
        assert_eq!(changes_since(&s, Lsn(1100)), Some(Lsn(1000)));
        let kept = filter(&s, Lsn(1100), &Changes::default());
        assert_eq!((kept.entries.len(), kept.not_durable), (2, 1));

        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("file_cache");
        let another_compute_wrote_at = |lsn: u64| {
            move |from: Lsn, to: Lsn, _| {
                assert_eq!(from, Lsn(1000), "asked from {from} to {to}");
                let mut c = Changes::default();
                c.blocks.insert((1663, 5, 10, 0, 1), Lsn(lsn));
                Ok(c)
            }
        };
        // Another compute's change at 1050, below this compute's checkpoint and below the
        // start: found, the entry goes.
        std::fs::write(saved_index_path(&cache), s.encode()).unwrap();
        let outcome = prepare(&cache, s.tenant, s.timeline, Lsn(1100), another_compute_wrote_at(1050));
        assert_eq!(outcome, Outcome::Reused { saved: 3, reused: 1, not_durable: 1, changed: 1, asked_from: Some(Lsn(1000)) });
        // Its change at 1050 with the start past the checkpoint: found as well.
        std::fs::write(saved_index_path(&cache), s.encode()).unwrap();
        let outcome = prepare(&cache, s.tenant, s.timeline, Lsn(2000), another_compute_wrote_at(1050));
        assert_eq!(outcome, Outcome::Reused { saved: 3, reused: 1, not_durable: 1, changed: 1, asked_from: Some(Lsn(1000)) });
        // A start at the durable LSN (a clean stop: the safekeepers had all this compute's
        // WAL that matters): the branch is this compute's history up to it, nothing to ask.
        std::fs::write(saved_index_path(&cache), s.encode()).unwrap();
        let outcome = prepare(&cache, s.tenant, s.timeline, Lsn(1000), |_, _, _| unreachable!("nothing to ask"));
        assert_eq!(outcome, Outcome::Reused { saved: 3, reused: 2, not_durable: 1, changed: 0, asked_from: None });
    }

    #[test]
    fn prepare_discards_on_any_mismatch_and_uses_the_index_once() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("file_cache");
        let s = saved(vec![entry(10, 0, 0, 100), entry(10, 1, 1, 100)]);
        let (tenant, timeline) = (s.tenant, s.timeline);

        assert_eq!(prepare(&cache, tenant, timeline, Lsn(2000), |_, _, _| unreachable!()), Outcome::NothingSaved);

        std::fs::write(saved_index_path(&cache), s.encode()).unwrap();
        let other = TimelineId::from_bytes([9; 16]);
        assert!(matches!(prepare(&cache, tenant, other, Lsn(2000), |_, _, _| unreachable!()), Outcome::Discarded(_)));
        assert!(!saved_index_path(&cache).exists() && !ready_index_path(&cache).exists());

        std::fs::write(saved_index_path(&cache), b"garbage").unwrap();
        assert!(matches!(prepare(&cache, tenant, timeline, Lsn(2000), |_, _, _| unreachable!()), Outcome::Discarded(_)));

        std::fs::write(saved_index_path(&cache), s.encode()).unwrap();
        let failed = prepare(&cache, tenant, timeline, Lsn(2000), |_, _, _| anyhow::bail!("below the GC cutoff"));
        assert!(matches!(failed, Outcome::Discarded(ref why) if why.contains("below the GC cutoff")), "{failed:?}");

        std::fs::write(saved_index_path(&cache), s.encode()).unwrap();
        let outcome = prepare(&cache, tenant, timeline, Lsn(2000), |from, to, _| {
            assert_eq!((from, to), (Lsn(100), Lsn(2000)));
            let mut c = Changes::default();
            c.blocks.insert((1663, 5, 10, 0, 1), Lsn(1500));
            Ok(c)
        });
        assert_eq!(outcome, Outcome::Reused { saved: 2, reused: 1, not_durable: 0, changed: 1, asked_from: Some(Lsn(100)) });
        assert!(!saved_index_path(&cache).exists());
        let ready = SavedIndex::decode(&std::fs::read(ready_index_path(&cache)).unwrap()).unwrap();
        assert_eq!(ready.entries, vec![entry(10, 0, 0, 100)]);
    }
}
