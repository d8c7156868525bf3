/*
 * fjord: the redo filter of a read replica (a hot standby compute).
 *
 * A replica holds few pages: those in shared_buffers and in its local file
 * cache.  It replays a WAL record only on blocks in shared_buffers; every other
 * block is left to the pageserver, which has the same WAL and serves the page
 * at the LSN the replica asks for.  For a skipped block the filter, still
 * holding the buffer mapping partition lock (so that no backend can load the
 * block between the lookup and the bookkeeping), calls into the Rust side to
 *   - raise the block's last-written LSN to the record's end, so that a later
 *     read asks the pageserver for a version that includes the record;
 *   - drop the block from the local file cache, whose copy is now stale;
 *   - raise the cached relation size if the record extends the relation.
 * A backend that loads the block afterwards sees all of that.  A backend that
 * loaded it before finds it in the buffer table, and the record is replayed
 * on it as on any standby (after its read completes).
 *
 * Blocks the record rebuilds whole (initialized by it, or restored from a
 * full-page image) are replayed: that costs no read.  Init forks (unlogged
 * relations) are local files and always replayed.
 *
 * Installed by the extension's _PG_init in a compute that uses the pageserver;
 * only the startup process of a hot standby ever calls it (a primary started
 * from fjord.signal replays nothing).
 */
#include "postgres.h"

#include "access/xlogreader.h"
#include "access/xlogrecord.h"
#include "access/xlogutils.h"
#include "common/relpath.h"
#include "storage/buf_internals.h"
#include "storage/lwlock.h"

/* Rust: the bookkeeping for a block whose replay was skipped (src/replica.rs) */
extern void fjord_replica_block_skipped(Oid spcnode, Oid dbnode, Oid relnode,
										int forknum, BlockNumber blkno,
										XLogRecPtr end_lsn);

void		fjord_replica_install_filter(void);

static bool
fjord_replica_filter(XLogReaderState *record, uint8 block_id)
{
	RelFileNode rnode;
	ForkNumber	forknum;
	BlockNumber blkno;
	DecodedBkpBlock *block;
	BufferTag	tag;
	uint32		hash;
	LWLock	   *partition;
	int			buf_id;

	if (!XLogRecGetBlockTagExtended(record, block_id, &rnode, &forknum, &blkno, NULL))
		return false;
	if (forknum != MAIN_FORKNUM && forknum != VISIBILITYMAP_FORKNUM)
		return false;
	block = XLogRecGetBlock(record, block_id);
	if ((block->flags & BKPBLOCK_WILL_INIT) != 0 || block->apply_image)
		return false;

	INIT_BUFFERTAG(tag, rnode, forknum, blkno);
	hash = BufTableHashCode(&tag);
	partition = BufMappingPartitionLock(hash);
	LWLockAcquire(partition, LW_SHARED);
	buf_id = BufTableLookup(&tag, hash);
	if (buf_id < 0)
		fjord_replica_block_skipped(rnode.spcNode, rnode.dbNode, rnode.relNode,
									(int) forknum, blkno, record->EndRecPtr);
	LWLockRelease(partition);
	return buf_id < 0;
}

void
fjord_replica_install_filter(void)
{
	redo_read_buffer_filter = fjord_replica_filter;
}
