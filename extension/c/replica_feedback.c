/*
 * fjord: the primary holds back what its read replicas still read (hot standby
 * feedback without a walsender).
 *
 * In PostgreSQL a standby's hot standby feedback reaches the walsender that
 * streams to it, which sets the xmin of its PGPROC (or of its replication
 * slot), and VACUUM on the primary keeps every row version that xmin can still
 * see.  A fjord replica streams from the safekeepers, not from the primary:
 * the safekeepers relay each replica's feedback to the WAL proposer worker
 * (quorum's `Standbys` message), and the worker calls this file with the
 * oldest xmin of them all.  It holds that xmin in a temporary physical
 * replication slot, `fjord_replicas`, owned by the worker, which
 * ReplicationSlotsComputeRequiredXmin folds into the horizon that VACUUM and
 * HOT pruning respect, as a slot's xmin always is.  The slot is temporary:
 * PostgreSQL drops it when the worker exits, so a stopped proposer holds
 * nothing back, and it reserves no WAL (its restart_lsn stays invalid).  It
 * shows in pg_replication_slots.
 *
 * The xmins arrive as full transaction ids; one that is in the future or more
 * than 2^31 transactions old is not a valid horizon here (a replica of another
 * epoch, or a bug) and is ignored, as walsender.c ignores such feedback.
 *
 * Errors (no free slot, a slot of that name made by someone else) become a
 * WARNING and a false return: the WAL proposer must keep running.
 */
#include "postgres.h"

#include "access/transam.h"
#include "miscadmin.h"
#include "replication/slot.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/elog.h"
#include "utils/memutils.h"

bool		fjord_hold_replica_xmin(uint64 xmin, uint64 catalog_xmin);

#define FJORD_REPLICA_SLOT "fjord_replicas"

/* A full transaction id as a TransactionId if it is a usable horizon now. */
static TransactionId
horizon(uint64 full)
{
	FullTransactionId next = ReadNextFullTransactionId();
	uint64		next64 = U64FromFullTransactionId(next);

	if (full == 0 || full > next64 || next64 - full >= (UINT64CONST(1) << 31))
		return InvalidTransactionId;
	return XidFromFullTransactionId(FullTransactionIdFromU64(full));
}

/*
 * Makes the slot hold back `xmin` and `catalog_xmin` (full transaction ids; 0
 * for none).  Creates the slot on first use; does nothing if neither is set
 * and there is no slot yet.  Returns false (after a WARNING) if the horizon
 * could not be held.
 */
bool
fjord_hold_replica_xmin(uint64 xmin, uint64 catalog_xmin)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	TransactionId x = horizon(xmin);
	TransactionId cx = horizon(catalog_xmin);
	volatile bool ok = true;

	if (MyReplicationSlot == NULL && !TransactionIdIsValid(x) && !TransactionIdIsValid(cx))
		return true;

	PG_TRY();
	{
		bool		changed;

		if (MyReplicationSlot == NULL)
		{
			if (max_replication_slots <= 0)
				ereport(ERROR,
						(errmsg("max_replication_slots is 0, and read replicas' hot standby feedback needs one slot")));
			if (SearchNamedReplicationSlot(FJORD_REPLICA_SLOT, true) != NULL)
				ereport(ERROR,
						(errmsg("a replication slot named \"%s\" already exists and is not this worker's",
								FJORD_REPLICA_SLOT)));
			ReplicationSlotCreate(FJORD_REPLICA_SLOT, false, RS_TEMPORARY, false);
			ereport(LOG,
					(errmsg("fjord walproposer: holding back the xmin horizon for read replicas in temporary slot \"%s\"",
							FJORD_REPLICA_SLOT)));
		}
		SpinLockAcquire(&MyReplicationSlot->mutex);
		changed = MyReplicationSlot->data.xmin != x || MyReplicationSlot->data.catalog_xmin != cx;
		MyReplicationSlot->data.xmin = x;
		MyReplicationSlot->effective_xmin = x;
		MyReplicationSlot->data.catalog_xmin = cx;
		MyReplicationSlot->effective_catalog_xmin = cx;
		SpinLockRelease(&MyReplicationSlot->mutex);
		if (changed)
			ReplicationSlotsComputeRequiredXmin(false);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		LWLockReleaseAll();
		ereport(WARNING,
				(errmsg("fjord walproposer: could not hold back the xmin horizon for read replicas: %s",
						edata->message),
				 errhint("Queries on read replicas may be canceled by conflicts with recovery.")));
		FreeErrorData(edata);
		ok = false;
	}
	PG_END_TRY();
	return ok;
}
