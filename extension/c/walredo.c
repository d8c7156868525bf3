/*-------------------------------------------------------------------------
 *
 * walredo.c
 *	  fjord's WAL redo process: PostgreSQL's own redo routines, one page at
 *	  a time, for the pageserver.
 *
 * "postgres --wal-redo fjord" (patch 0002) loads this library and calls
 * WalRedoMain().  The process has no data directory, no postmaster and no
 * real shared memory: it sets up just enough of a standalone backend for
 * the resource managers' redo functions to run against a tiny buffer pool
 * backed by an in-memory storage manager, then serves requests on stdin and
 * answers on stdout.  The protocol is defined in proto/src/walredo.rs, the
 * one place both sides take it from:
 *
 *	 'B' begin:  rel (spc, db, rel u32; fork u8) blkno u32
 *	 'P' push:   rel blkno page[8192]   -- the base image
 *	 'A' apply:  start_lsn u64 (0 if unknown) end_lsn u64 record[xl_tot_len]
 *	 'G' get:    rel blkno              -- answered with the 8192-byte page
 *	 'M' mask:   rmid u8 blkno u32 page[8192] -- answered with the page after
 *				 the resource manager's rm_mask (what wal_consistency_checking
 *				 ignores: hint bits, unused space, page LSN and so on)
 *
 * Each message is a tag byte, a big-endian u32 payload length, then the
 * payload (integers big-endian).  Any error is FATAL: it is written to
 * stderr and the process exits; the pageserver reads the message and starts
 * a new process.  There is deliberately no error recovery here, so that a
 * failed redo can never leave half-applied state behind for the next page.
 *
 * Only the target block of a multi-block record is replayed: patch 0003's
 * redo_read_buffer_filter skips the others.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <unistd.h>

#include "access/clog.h"
#include "access/commit_ts.h"
#include "access/multixact.h"
#include "access/nbtree.h"
#include "access/subtrans.h"
#include "access/syncscan.h"
#include "access/twophase.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogprefetcher.h"
#include "access/xlogreader.h"
#include "access/xlogrecovery.h"
#include "access/xlogutils.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/autovacuum.h"
#include "postmaster/bgworker_internals.h"
#include "postmaster/bgwriter.h"
#include "postmaster/postmaster.h"
#include "replication/logicallauncher.h"
#include "replication/origin.h"
#include "replication/slot.h"
#include "replication/walreceiver.h"
#include "replication/walsender.h"
#include "storage/buf_internals.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
#include "storage/pg_shmem.h"
#include "storage/pmsignal.h"
#include "storage/predicate.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/procsignal.h"
#include "storage/sinvaladt.h"
#include "storage/smgr.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/ps_status.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#define REDO_BUFFERS 16			/* the buffer pool: a record touches few pages */
#define INMEM_PAGES_MAX 64		/* pages evicted from it during one request */

#define REL_TAG_BYTES 13
#define REL_BLOCK_BYTES (REL_TAG_BYTES + 4)

void		fjord_wal_redo_main(int argc, char *argv[]);

/* The block the current request rebuilds. */
static BufferTag target_tag;
static bool target_set = false;

static XLogReaderState *reader_state;

/*
 * The in-memory storage manager.  Pages written out of the tiny buffer pool
 * during a request land here; every request starts with it empty.  Reads of
 * pages never written return zeros: redo only reads the target (pushed or
 * initialized by the record) and side pages whose contents do not affect the
 * target (such as visibility map pages).
 */
typedef struct InmemPage
{
	BufferTag	tag;
	PGAlignedBlock data;
} InmemPage;

static InmemPage inmem_pages[INMEM_PAGES_MAX];
static int	inmem_used = 0;

static InmemPage *
inmem_lookup(SMgrRelation reln, ForkNumber forknum, BlockNumber blkno)
{
	for (int i = 0; i < inmem_used; i++)
	{
		BufferTag  *t = &inmem_pages[i].tag;

		if (RelFileNodeEquals(t->rnode, reln->smgr_rnode.node) &&
			t->forkNum == forknum && t->blockNum == blkno)
			return &inmem_pages[i];
	}
	return NULL;
}

static void
inmem_open(SMgrRelation reln)
{
}

static void
inmem_close(SMgrRelation reln, ForkNumber forknum)
{
}

static void
inmem_create(SMgrRelation reln, ForkNumber forknum, bool isRedo)
{
}

static bool
inmem_exists(SMgrRelation reln, ForkNumber forknum)
{
	return true;
}

static void
inmem_unlink(RelFileNodeBackend rnode, ForkNumber forknum, bool isRedo)
{
}

/* True if the page is the one this request rebuilds. */
static bool
is_target(SMgrRelation reln, ForkNumber forknum, BlockNumber blkno)
{
	return target_set && RelFileNodeEquals(target_tag.rnode, reln->smgr_rnode.node) &&
		target_tag.forkNum == forknum && target_tag.blockNum == blkno;
}

/*
 * Keeps a page written out of the buffer pool, if it is the target: it may be
 * read back later in the same request.  Every other page (visibility map and
 * free space map pages that redo touches on the side, init-mode buffers of
 * skipped blocks) is nobody's business and is dropped, so no request can run
 * out of slots however many side pages it touches.
 */
static void
inmem_store(SMgrRelation reln, ForkNumber forknum, BlockNumber blkno, char *buffer)
{
	InmemPage  *page;

	if (!is_target(reln, forknum, blkno))
		return;
	page = inmem_lookup(reln, forknum, blkno);
	if (page == NULL)
	{
		if (inmem_used >= INMEM_PAGES_MAX)
			ereport(FATAL,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("wal redo: more than %d pages kept while rebuilding one page",
							INMEM_PAGES_MAX)));
		page = &inmem_pages[inmem_used++];
		INIT_BUFFERTAG(page->tag, reln->smgr_rnode.node, forknum, blkno);
	}
	memcpy(page->data.data, buffer, BLCKSZ);
}

static void
inmem_extend(SMgrRelation reln, ForkNumber forknum, BlockNumber blkno,
			 char *buffer, bool skipFsync)
{
	inmem_store(reln, forknum, blkno, buffer);
}

static bool
inmem_prefetch(SMgrRelation reln, ForkNumber forknum, BlockNumber blkno)
{
	return true;
}

static void
inmem_read(SMgrRelation reln, ForkNumber forknum, BlockNumber blkno, char *buffer)
{
	InmemPage  *page = inmem_lookup(reln, forknum, blkno);

	if (page)
		memcpy(buffer, page->data.data, BLCKSZ);
	else
		MemSet(buffer, 0, BLCKSZ);
}

static void
inmem_write(SMgrRelation reln, ForkNumber forknum, BlockNumber blkno,
			char *buffer, bool skipFsync)
{
	inmem_store(reln, forknum, blkno, buffer);
}

static void
inmem_writeback(SMgrRelation reln, ForkNumber forknum, BlockNumber blkno,
				BlockNumber nblocks)
{
}

/*
 * The size of a fork as redo sees it.  The target's fork ends just past the
 * target block.  Every other fork is as large as can be: otherwise
 * XLogReadBufferExtended() and vm_extend() would "extend" the visibility map
 * or free space map block by block up to whatever block a record touches on
 * the side (for a 2 GB heap, the FSM page alone is past block 60).  Such
 * pages read as zeros and are dropped when written (see inmem_store).
 */
static BlockNumber
inmem_nblocks(SMgrRelation reln, ForkNumber forknum)
{
	if (target_set && RelFileNodeEquals(target_tag.rnode, reln->smgr_rnode.node) &&
		target_tag.forkNum == forknum)
		return target_tag.blockNum + 1;
	return MaxBlockNumber;
}

static void
inmem_truncate(SMgrRelation reln, ForkNumber forknum, BlockNumber old_blocks,
			   BlockNumber nblocks)
{
}

static void
inmem_immedsync(SMgrRelation reln, ForkNumber forknum)
{
}

static const f_smgr inmem_smgr = {
	.smgr_init = NULL,
	.smgr_shutdown = NULL,
	.smgr_open = inmem_open,
	.smgr_close = inmem_close,
	.smgr_create = inmem_create,
	.smgr_exists = inmem_exists,
	.smgr_unlink = inmem_unlink,
	.smgr_extend = inmem_extend,
	.smgr_prefetch = inmem_prefetch,
	.smgr_read = inmem_read,
	.smgr_write = inmem_write,
	.smgr_writeback = inmem_writeback,
	.smgr_nblocks = inmem_nblocks,
	.smgr_truncate = inmem_truncate,
	.smgr_immedsync = inmem_immedsync,
};

static const f_smgr *
inmem_select(RelFileNodeBackend rnode)
{
	return &inmem_smgr;
}

/*
 * Shared memory, without sharing: the same structures that
 * CreateSharedMemoryAndSemaphores() (ipci.c) sets up, in malloc'd memory.
 * Nothing here is ever seen by another process, and nothing survives the
 * process: no System V segment, no DSM control segment, no files.  Parts
 * that need a data directory (async notify's SLRU scan) or DSM are skipped.
 */
static void
create_private_shared_memory(void)
{
	PGShmemHeader *hdr;
	Size		size;
	int			numSemas;

	size = CalculateShmemSize(&numSemas);
	/* Zeroed: ControlFile lives here and nothing fills it (no pg_control). */
	hdr = (PGShmemHeader *) calloc(1, size);
	if (hdr == NULL)
		ereport(FATAL,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("wal redo: could not allocate %zu bytes of private shared memory", size)));
	hdr->creatorPID = getpid();
	hdr->magic = PGShmemMagic;
	hdr->dsm_control = 0;
	hdr->device = 0;
	hdr->inode = 0;
	hdr->totalsize = size;
	hdr->freeoffset = MAXALIGN(sizeof(PGShmemHeader));
	UsedShmemSegAddr = hdr;
	InitShmemAccess(hdr);

	/*
	 * PGReserveSemaphores() stats the data directory (its inode seeds the
	 * semaphore keys).  We have none: lend it the working directory, then
	 * take it back so that any later attempt to touch a data directory fails
	 * loudly instead of using the wrong one.
	 */
	{
		char		cwd[MAXPGPATH];

		if (getcwd(cwd, sizeof(cwd)) == NULL)
			ereport(FATAL,
					(errcode_for_file_access(),
					 errmsg("wal redo: could not get the working directory: %m")));
		DataDir = cwd;
		PGReserveSemaphores(numSemas);
		DataDir = NULL;
	}
	InitShmemAllocation();
	CreateLWLocks();
	InitShmemIndex();
	dsm_shmem_init();
	XLOGShmemInit();
	XLogPrefetchShmemInit();
	XLogRecoveryShmemInit();
	CLOGShmemInit();
	CommitTsShmemInit();
	SUBTRANSShmemInit();
	MultiXactShmemInit();
	InitBufferPool();
	InitLocks();
	InitPredicateLocks();
	InitProcGlobal();
	CreateSharedProcArray();
	CreateSharedBackendStatus();
	TwoPhaseShmemInit();
	BackgroundWorkerShmemInit();
	CreateSharedInvalidationState();
	PMSignalShmemInit();
	ProcSignalShmemInit();
	CheckpointerShmemInit();
	AutoVacuumShmemInit();
	ReplicationSlotsShmemInit();
	ReplicationOriginShmemInit();
	WalSndShmemInit();
	WalRcvShmemInit();
	PgArchShmemInit();
	ApplyLauncherShmemInit();
	SnapMgrInit();
	BTreeShmemInit();
	SyncScanShmemInit();
	StatsShmemInit();
}

/* ---- reading requests ---- */

/*
 * Input is buffered: a page's request is one message per WAL record (a header and a
 * payload each), often hundreds of them (a freshly loaded heap page has about 200 inserts),
 * and reading each piece with its own read(2) cost two system calls per record. What the
 * buffer holds is consumed before the pipe is read again; a piece larger than the buffer
 * is read straight into its destination. The protocol is one request, then one answer, so
 * nothing is ever left in the buffer while the pageserver waits for a page.
 */
static char input_buf[64 * 1024];
static size_t input_pos;
static size_t input_len;

/* One read(2) of up to len bytes into buf; 0 at end of input. */
static size_t
read_some(char *buf, size_t len, const char *what)
{
	for (;;)
	{
		ssize_t		n = read(STDIN_FILENO, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			ereport(FATAL,
					(errcode_for_file_access(),
					 errmsg("wal redo: could not read %s from stdin: %m", what)));
		return (size_t) n;
	}
}

/* The end of input in the middle of `what`: the pageserver closed the pipe. */
static void
end_of_input(const char *what, size_t done, size_t len)
{
	if (done == 0 && strcmp(what, "message header") == 0)
		proc_exit(0);			/* between messages: done */
	ereport(FATAL,
			(errcode(ERRCODE_PROTOCOL_VIOLATION),
			 errmsg("wal redo: unexpected end of input in %s after %zu of %zu bytes",
					what, done, len)));
}

static void
read_exact(char *buf, size_t len, const char *what)
{
	size_t		done = 0;

	while (done < len)
	{
		if (input_pos < input_len)
		{
			size_t		n = Min(len - done, input_len - input_pos);

			memcpy(buf + done, input_buf + input_pos, n);
			input_pos += n;
			done += n;
		}
		else if (len - done >= sizeof(input_buf))
		{
			size_t		n = read_some(buf + done, len - done, what);

			if (n == 0)
				end_of_input(what, done, len);
			done += n;
		}
		else
		{
			input_pos = 0;
			input_len = read_some(input_buf, sizeof(input_buf), what);
			if (input_len == 0)
				end_of_input(what, done, len);
		}
	}
}

static void
write_exact(const char *buf, size_t len)
{
	size_t		done = 0;

	while (done < len)
	{
		ssize_t		n = write(STDOUT_FILENO, buf + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			ereport(FATAL,
					(errcode_for_file_access(),
					 errmsg("wal redo: could not write the answer to stdout: %m")));
		done += n;
	}
}

static uint32
get_u32(const char *p)
{
	uint32		v;

	memcpy(&v, p, sizeof(v));
	return pg_ntoh32(v);
}

static uint64
get_u64(const char *p)
{
	uint64		v;

	memcpy(&v, p, sizeof(v));
	return pg_ntoh64(v);
}

/* Parses "rel blkno" at the start of a payload into a buffer tag. */
static void
parse_rel_block(const char *p, uint32 len, BufferTag *tag)
{
	RelFileNode rnode;
	uint8		fork;

	if (len < REL_BLOCK_BYTES)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: payload of %u bytes is too short for a relation block", len)));
	rnode.spcNode = get_u32(p);
	rnode.dbNode = get_u32(p + 4);
	rnode.relNode = get_u32(p + 8);
	fork = (uint8) p[12];
	if (fork > MAX_FORKNUM)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: invalid fork number %u", fork)));
	INIT_BUFFERTAG(*tag, rnode, (ForkNumber) fork, get_u32(p + 13));
}

static void
check_target(const BufferTag *tag, const char *what)
{
	if (!target_set || !BUFFERTAGS_EQUAL(*tag, target_tag))
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: %s for a block other than the one begun", what)));
}

/* ---- the requests ---- */

/* Forgets the fork sizes smgr cached for a relation (they depend on the target). */
static void
forget_cached_sizes(RelFileNode rnode)
{
	SMgrRelation reln = smgropen(rnode, InvalidBackendId);

	for (int fork = 0; fork <= MAX_FORKNUM; fork++)
		reln->smgr_cached_nblocks[fork] = InvalidBlockNumber;
}

static void
begin_redo(const char *p, uint32 len)
{
	SMgrRelation reln;
	ForkNumber	fork;
	BlockNumber first = 0;

	if (len != REL_BLOCK_BYTES)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: begin message has %u bytes, expected %d", len, REL_BLOCK_BYTES)));

	/*
	 * inmem_nblocks() answers differently for the target's fork than for any
	 * other, and smgr caches its answers while InRecovery: forget them for
	 * the old target's relation and the new one.
	 */
	if (target_set)
		forget_cached_sizes(target_tag.rnode);
	parse_rel_block(p, len, &target_tag);
	target_set = true;
	forget_cached_sizes(target_tag.rnode);

	/* Start clean: nothing of an earlier request may leak into this page. */
	inmem_used = 0;
	reln = smgropen(target_tag.rnode, InvalidBackendId);
	fork = target_tag.forkNum;
	DropRelFileNodeBuffers(reln, &fork, 1, &first);
}

static void
push_page(const char *p, uint32 len)
{
	BufferTag	tag;
	Buffer		buf;

	if (len != REL_BLOCK_BYTES + BLCKSZ)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: push message has %u bytes, expected %d", len, REL_BLOCK_BYTES + BLCKSZ)));
	parse_rel_block(p, len, &tag);
	check_target(&tag, "page pushed");
	buf = ReadBufferWithoutRelcache(tag.rnode, tag.forkNum, tag.blockNum,
									RBM_ZERO_AND_LOCK, NULL, true);
	memcpy(BufferGetPage(buf), p + REL_BLOCK_BYTES, BLCKSZ);
	MarkBufferDirty(buf);
	UnlockReleaseBuffer(buf);
}

/* Patch 0003's filter: replay touches only the target block. */
static bool
skip_other_blocks(XLogReaderState *record, uint8 block_id)
{
	RelFileNode rnode;
	ForkNumber	forknum;
	BlockNumber blkno;

	if (!XLogRecGetBlockTagExtended(record, block_id, &rnode, &forknum, &blkno, NULL))
		return true;
	return !(RelFileNodeEquals(rnode, target_tag.rnode) &&
			 forknum == target_tag.forkNum && blkno == target_tag.blockNum);
}

static void
apply_error_context(void *arg)
{
	XLogReaderState *record = (XLogReaderState *) arg;

	errcontext("wal redo of the record ending at %X/%X for block %u of rel %u/%u/%u fork %d",
			   LSN_FORMAT_ARGS(record->EndRecPtr), target_tag.blockNum,
			   target_tag.rnode.spcNode, target_tag.rnode.dbNode,
			   target_tag.rnode.relNode, target_tag.forkNum);
}

static void
apply_record(const char *p, uint32 len)
{
	XLogRecPtr	start_lsn,
				end_lsn;
	XLogRecord *record;
	DecodedXLogRecord *decoded;
	char	   *errormsg = NULL;
	ErrorContextCallback errcallback;
	uint32		rec_len;

	if (!target_set)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: record applied before any block was begun")));
	if (len < 16 + SizeOfXLogRecord)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: apply message of %u bytes is too short", len)));
	start_lsn = get_u64(p);
	end_lsn = get_u64(p + 8);
	rec_len = len - 16;

	/* Copy for alignment: the decoder reads the header in place. */
	record = (XLogRecord *) palloc(rec_len);
	memcpy(record, p + 16, rec_len);
	if (record->xl_tot_len != rec_len)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: record ending at %X/%X claims %u bytes but %u were sent",
						LSN_FORMAT_ARGS(end_lsn), record->xl_tot_len, rec_len)));
	if (record->xl_rmid > RM_MAX_BUILTIN_ID || RmgrTable[record->xl_rmid].rm_redo == NULL)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: record ending at %X/%X has unknown resource manager %u",
						LSN_FORMAT_ARGS(end_lsn), record->xl_rmid)));

	decoded = palloc(DecodeXLogRecordRequiredSpace(rec_len));
	if (!DecodeXLogRecord(reader_state, decoded, record, start_lsn, &errormsg))
		ereport(FATAL,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("wal redo: could not decode the record ending at %X/%X: %s",
						LSN_FORMAT_ARGS(end_lsn), errormsg ? errormsg : "unknown error")));
	reader_state->record = decoded;
	reader_state->ReadRecPtr = start_lsn;
	reader_state->EndRecPtr = end_lsn;

	errcallback.callback = apply_error_context;
	errcallback.arg = reader_state;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;

	RmgrTable[record->xl_rmid].rm_redo(reader_state);

	error_context_stack = errcallback.previous;
	reader_state->record = NULL;
	pfree(decoded);
	pfree(record);
}

static void
get_page(const char *p, uint32 len)
{
	BufferTag	tag;
	Buffer		buf;
	PGAlignedBlock page;

	if (len != REL_BLOCK_BYTES)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: get message has %u bytes, expected %d", len, REL_BLOCK_BYTES)));
	parse_rel_block(p, len, &tag);
	check_target(&tag, "page requested");
	buf = ReadBufferWithoutRelcache(tag.rnode, tag.forkNum, tag.blockNum,
									RBM_NORMAL, NULL, true);
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	memcpy(page.data, BufferGetPage(buf), BLCKSZ);
	UnlockReleaseBuffer(buf);
	write_exact(page.data, BLCKSZ);
}

/* Applies a resource manager's rm_mask to a page: for consistency checks. */
static void
mask_page(const char *p, uint32 len)
{
	uint8		rmid;
	PGAlignedBlock page;

	if (len != 1 + 4 + BLCKSZ)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: mask message has %u bytes, expected %d", len, 1 + 4 + BLCKSZ)));
	rmid = (uint8) p[0];
	if (rmid > RM_MAX_BUILTIN_ID || RmgrTable[rmid].rm_mask == NULL)
		ereport(FATAL,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("wal redo: resource manager %u has no mask function", rmid)));
	memcpy(page.data, p + 5, BLCKSZ);
	RmgrTable[rmid].rm_mask(page.data, get_u32(p + 1));
	write_exact(page.data, BLCKSZ);
}

/* The largest message: a maximal WAL record plus its two LSNs. */
/* PostgreSQL 15 caps a record at 1020 MB (XLogRecordMaxSize, private to xloginsert.c). */
#define WAL_RECORD_BYTES_MAX (1020 * 1024 * 1024)
#define MESSAGE_BYTES_MAX (WAL_RECORD_BYTES_MAX + 16)

void
fjord_wal_redo_main(int argc, char *argv[])
{
	MemoryContext message_context;
	char	   *payload = NULL;
	uint32		payload_cap = 0;

	/* A standalone process with a tiny buffer pool and one PGPROC. */
	InitializeGUCOptions();
	SetConfigOption("shared_buffers", "16", PGC_POSTMASTER, PGC_S_ARGV);
	SetConfigOption("max_connections", "1", PGC_POSTMASTER, PGC_S_ARGV);
	SetConfigOption("max_worker_processes", "0", PGC_POSTMASTER, PGC_S_ARGV);
	SetConfigOption("max_wal_senders", "0", PGC_POSTMASTER, PGC_S_ARGV);
	SetConfigOption("max_prepared_transactions", "0", PGC_POSTMASTER, PGC_S_ARGV);
	SetConfigOption("dynamic_shared_memory_type", "mmap", PGC_POSTMASTER, PGC_S_ARGV);
	SetConfigOption("log_min_messages", "warning", PGC_SUSET, PGC_S_ARGV);
	NBuffers = REDO_BUFFERS;
	num_temp_buffers = 4;
	InitializeMaxBackends();
	InitializeShmemGUCs();

	smgr_select_hook = inmem_select;
	redo_read_buffer_filter = skip_other_blocks;

	create_private_shared_memory();
	PgStartTime = GetCurrentTimestamp();
	InitAuxiliaryProcess();
	SetProcessingMode(NormalProcessing);
	BaseInit();

	/* Redo routines assume they run in recovery. */
	InRecovery = true;

	CurrentResourceOwner = ResourceOwnerCreate(NULL, "wal redo");
	for (int rmid = 0; rmid <= RM_MAX_BUILTIN_ID; rmid++)
	{
		if (RmgrTable[rmid].rm_redo != NULL && RmgrTable[rmid].rm_startup != NULL)
			RmgrTable[rmid].rm_startup();
	}
	reader_state = XLogReaderAllocate(wal_segment_size, NULL, XL_ROUTINE(), NULL);
	if (reader_state == NULL)
		ereport(FATAL,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("wal redo: could not allocate a WAL reader")));

	message_context = AllocSetContextCreate(TopMemoryContext, "wal redo message",
											ALLOCSET_DEFAULT_SIZES);
	set_ps_display("idle");

	for (;;)
	{
		char		header[5];
		uint32		len;

		MemoryContextReset(message_context);
		MemoryContextSwitchTo(message_context);

		read_exact(header, sizeof(header), "message header");
		len = get_u32(header + 1);
		if (len > MESSAGE_BYTES_MAX)
			ereport(FATAL,
					(errcode(ERRCODE_PROTOCOL_VIOLATION),
					 errmsg("wal redo: message of %u bytes exceeds the limit of %u", len,
							(uint32) MESSAGE_BYTES_MAX)));
		if (len > payload_cap)
		{
			MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

			if (payload)
				pfree(payload);
			payload_cap = Max(len, 2 * payload_cap);
			payload = palloc(payload_cap);
			MemoryContextSwitchTo(old);
		}
		read_exact(payload, len, "message payload");

		switch (header[0])
		{
			case 'B':
				begin_redo(payload, len);
				break;
			case 'P':
				push_page(payload, len);
				break;
			case 'A':
				apply_record(payload, len);
				break;
			case 'G':
				get_page(payload, len);
				break;
			case 'M':
				mask_page(payload, len);
				break;
			default:
				ereport(FATAL,
						(errcode(ERRCODE_PROTOCOL_VIOLATION),
						 errmsg("wal redo: unrecognized message tag: %u", (unsigned char) header[0])));
		}
	}
}
