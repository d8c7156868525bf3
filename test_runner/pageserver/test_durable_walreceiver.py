"""WAL the pageserver confirms as flushed survives `kill -9` of the pageserver.

The server waits for the pageserver as its synchronous standby (`synchronous_standby_names`
names the receiver's application_name, `fjord_pageserver`), so every commit returns only
after the pageserver said the commit's WAL is flushed, which it does after an fsync of its
local WAL, not after a layer flush. The pageserver is killed right after the last commit
(too soon for a layer flush), the server is stopped so it cannot send that WAL again, and
the pageserver restarts: it must restart the receiver from the persisted source, ingest
its local WAL, and serve every committed row through the page service. Then the server
comes back and streaming resumes from there. Also: the basebackup route answers a tar at
the last record LSN.
"""

from __future__ import annotations

import io
import struct
import tarfile
import time

from fixtures import https
from fixtures.logs import unexpected_lines
from fixtures.pagestream import PageServiceClient, RelTag, lsn_int
from fixtures.postgres import wait_until

TENANT = "55555555555555555555555555555555"
TIMELINE = "66666666666666666666666666666666"
ROWS = 200


def timeline_status(ps):
    return ps.http("GET", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}")


def heap_ids(page: bytes) -> list[int]:
    """The first int4 column of every normal tuple of a heap page."""
    (pd_lower,) = struct.unpack_from("<H", page, 12)
    ids = []
    for lp in range(24, pd_lower, 4):
        (word,) = struct.unpack_from("<I", page, lp)
        off, flags = word & 0x7FFF, (word >> 15) & 0x3
        if flags == 1:  # LP_NORMAL
            t_hoff = page[off + 22]
            ids.append(struct.unpack_from("<i", page, off + t_hoff)[0])
    return ids


def ids_in_pageserver(ps, rel: RelTag, lsn: int) -> list[int]:
    client = PageServiceClient.of(ps, TENANT, TIMELINE)
    ids = [i for blk in range(client.nblocks(rel, lsn)) for i in heap_ids(client.get_page(rel, blk, lsn))]
    client.close()
    return sorted(ids)


def test_confirmed_wal_survives_kill_9(pageserver, pg_factory):
    pg = pg_factory("primary", {
        "autovacuum": "off",
        "synchronous_standby_names": "'fjord_pageserver'",
        "synchronous_commit": "on",
    }).initdb()
    pageserver.http("POST", "/v1/tenant", {"tenant_id": TENANT})
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline", {"timeline_id": TIMELINE})
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/import", {"pgdata": str(pg.datadir)})
    pg.start()
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/wal_receiver",
                    {"host": "127.0.0.1", "port": pg.port, "user": pg.user, "plaintext": True})
    wait_until("the pageserver to be the synchronous standby",
               lambda: ("fjord_pageserver", "sync") in pg.sql("SELECT application_name, sync_state FROM pg_stat_replication"))

    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int, v text)")
        started = time.monotonic()
        for i in range(1, ROWS + 1):
            conn.execute("INSERT INTO t VALUES (%s, 'committed')", (i,))
        per_commit_ms = (time.monotonic() - started) * 1000 / ROWS
        commit_lsn = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
        dboid, relfilenode = conn.execute(
            "SELECT (SELECT oid FROM pg_database WHERE datname = current_database()), pg_relation_filenode('t')"
        ).fetchone()
    # Right after the last commit returned: no time for a layer flush.
    pageserver.proc.kill()
    pageserver.proc.wait()
    pg.stop("immediate")
    print(f"{per_commit_ms:.2f} ms per synchronous commit")
    assert per_commit_ms < 40, f"a synchronous commit took {per_commit_ms:.1f} ms: is it waiting for a layer flush?"

    pageserver.start()
    rel = RelTag(1663, dboid, relfilenode)
    # The receiver is restarted from its persisted source; it ingests the local WAL first,
    # then fails to connect to the stopped server.
    wait_until("the receiver to ingest the local WAL and try the server",
               lambda: (timeline_status(pageserver)["wal_receiver"] or {}).get("state") == "reconnecting", timeout_s=60)
    lsn = lsn_int(timeline_status(pageserver)["last_record_lsn"])
    assert lsn >= lsn_int(str(commit_lsn)) - 1024, f"ingested up to {lsn:X}, the last commit is at {commit_lsn}"

    assert ids_in_pageserver(pageserver, rel, lsn) == list(range(1, ROWS + 1))

    # The server comes back; streaming resumes where the local WAL ended.
    pg.start()
    wait_until("the receiver to stream again", lambda: timeline_status(pageserver)["wal_receiver"]["state"] == "streaming",
               timeout_s=60)
    pg.sql("INSERT INTO t SELECT g, 'after' FROM generate_series(%s::int, %s::int) g", ROWS + 1, ROWS + 100)
    flush = pg.sql("SELECT pg_current_wal_flush_lsn()")[0][0]
    wait_until("the pageserver to ingest the new rows",
               lambda: lsn_int(timeline_status(pageserver)["last_record_lsn"]) >= lsn_int(str(flush)), timeout_s=60)
    lsn = lsn_int(timeline_status(pageserver)["last_record_lsn"])
    assert ids_in_pageserver(pageserver, rel, lsn) == list(range(1, ROWS + 101))
    status = timeline_status(pageserver)["wal_receiver"]
    assert lsn_int(status["durable_lsn"]) >= lsn

    # A basebackup at the last record LSN.
    url = f"{pageserver.http_url}/v1/tenant/{TENANT}/timeline/{TIMELINE}/basebackup"
    with https.urlopen(url, pageserver.tls, timeout=60) as resp:
        assert resp.headers["Content-Type"] == "application/x-tar"
        bb_lsn = resp.headers["X-Fjord-Lsn"]
        tar = tarfile.open(fileobj=io.BytesIO(resp.read()))
    assert lsn_int(bb_lsn) >= lsn
    signal = tar.extractfile("fjord.signal").read().decode()
    assert signal.startswith(f"LSN: {bb_lsn}\nPREV LSN: ") and "none" not in signal, signal
    assert tar.getmember("global/pg_control").size == 8192

    # Stopping the receiver forgets its source.
    pageserver.http("DELETE", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/wal_receiver")
    assert timeline_status(pageserver)["wal_receiver"] is None
    allowed = [r"could not stream WAL from .*: (the server closed the connection|connect|.*the database system is starting up)"]
    assert unexpected_lines(pageserver.log_text(), allowed) == []
