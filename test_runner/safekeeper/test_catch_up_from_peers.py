"""A safekeeper that lags behind the WAL the compute keeps is caught up by the same compute
in the same term, with real processes.

One safekeeper is stopped while the compute writes far more WAL than its pg_wal keeps
(`wal_keep_size = 48MB` and a small `max_wal_size` for this endpoint instead of compute_ctl's
1GB, set through the Endpoint fixture's `-c` overrides, which compute_ctl passes to postgres
after its own configuration; then CHECKPOINTs, which remove the old segments). Started again, the safekeeper needs WAL
the compute no longer has: the WAL proposer fetches it from the other safekeepers (in
bounded memory) and streams from pg_wal once the safekeeper is past the oldest segment
left, all in the same term, while the compute keeps committing. It then reaches the others'
commit LSN and is a full member: with one of the others stopped, commits go on.

A proposer that closed the lagging safekeeper's connection, leaving it behind until the
next compute's election, fails this test.
"""

from __future__ import annotations

import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.pagestream import lsn_int
from fixtures.postgres import wait_until

SEGMENT = 16 << 20
# pg_wal keeps little: checkpoints every few segments, and only 3 segments before the
# redo pointer. Not less: PostgreSQL removes segments whatever the safekeepers acknowledged,
# and with `wal_keep_size = 0` a checkpoint removed one the safekeepers had not all been sent
# yet (which no safekeeper has can never be committed: the proposer fails, `WalLost`).
SMALL_WAL = {"wal_keep_size": "48MB", "min_wal_size": "32MB", "max_wal_size": "64MB"}


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def status(sk, tl) -> dict:
    return sk.timeline(tl.tenant, tl.timeline)


def lsn(sk, tl, field: str) -> int:
    return lsn_int(status(sk, tl)[field])


def write_wal(ep: Endpoint, first_id: int, rows: int) -> int:
    """Inserts `rows` rows of about 1 kB and returns the flushed WAL end."""
    ep.sql(
        "INSERT INTO t SELECT g, repeat(md5(g::text), 30) FROM generate_series(%s::int, %s::int) g",
        first_id, first_id + rows - 1,
    )
    return lsn_int(ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])


def segment_name(lsn_value: int) -> str:
    segno = lsn_value // SEGMENT
    return f"00000001{segno >> 8:08X}{segno & 0xFF:08X}"


def test_a_lagging_safekeeper_is_caught_up_from_its_peers_without_a_new_compute(tmp_path, pageserver, timeline, safekeepers):
    sk1, sk2, sk3 = safekeepers
    tl = timeline
    ep = Endpoint(tmp_path, tl, "ep", settings=SMALL_WAL, safekeepers=safekeepers).start()
    ep.sql("CREATE TABLE t (id int, pad text)")
    next_id = 1
    end = write_wal(ep, next_id, 1000)
    next_id += 1000
    wait_until("all three to have the first rows", lambda: all(lsn(sk, tl, "commit_lsn") >= end for sk in safekeepers))
    postmaster = ep.postmaster_pid()
    term = status(sk1, tl)["term"]

    # sk3 stops; the compute writes about 160 MB and checkpoints, which removes the segment
    # holding sk3's end (and every other one before the last few) from its pg_wal.
    sk3_end = lsn(sk3, tl, "flush_lsn")
    sk3.stop()
    for _ in range(8):
        end = write_wal(ep, next_id, 20_000)
        next_id += 20_000
        ep.sql("CHECKPOINT")
    ep.sql("CHECKPOINT")
    pg_wal = sorted(p.name for p in (ep.pgdata / "pg_wal").iterdir() if len(p.name) == 24)
    assert pg_wal and pg_wal[0] > segment_name(sk3_end), f"pg_wal still has {segment_name(sk3_end)}: {pg_wal}"
    assert end - sk3_end > 5 * SEGMENT, f"sk3 lags only {end - sk3_end} bytes"

    # sk3 is back: the same compute catches it up while it goes on committing.
    sk3.start()
    committed = 0

    def caught_up():
        nonlocal next_id, committed
        ep.sql("INSERT INTO t VALUES (%s, 'while sk3 catches up')", next_id)
        next_id += 1
        committed += 1
        others = min(lsn(sk, tl, "commit_lsn") for sk in (sk1, sk2))
        return lsn(sk3, tl, "flush_lsn") >= others and lsn(sk3, tl, "commit_lsn") >= end
    wait_until("sk3 to reach the others' commit LSN", caught_up, timeout_s=120)
    assert committed > 0
    assert ep.postmaster_pid() == postmaster, "the compute was restarted"
    for sk in safekeepers:
        assert status(sk, tl)["term"] == term, f"safekeeper {sk.id} saw a new election: {status(sk, tl)}"
    log = ep.pg_log_text()
    assert f"catching up safekeeper {sk3.addr} from" in log and "with WAL fetched from safekeeper" in log, ep.log_tail()
    assert f"safekeeper {sk3.addr} caught up from" in log, ep.log_tail()
    assert "WARNING" not in log, ep.log_tail()

    # A full member: with sk1 stopped, sk2 and sk3 make commits durable.
    sk1.stop()
    ep.sql("INSERT INTO t VALUES (%s, 'with sk1 down')", next_id)
    next_id += 1
    end = lsn_int(ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])
    wait_until("sk3 to commit with sk2 alone", lambda: lsn(sk3, tl, "commit_lsn") >= end)
    count, total = ep.sql("SELECT count(*), sum(id) FROM t")[0]
    assert count == next_id - 1 and total == (next_id - 1) * next_id // 2
    for sk in (sk2, sk3):
        text = sk.log_text()
        assert " ERROR " not in text, sk.log_tail()
