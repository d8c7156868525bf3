"""WAL records longer than a message (`quorum::wire::WAL_BYTES_MAX`, 16 MiB) through a real
compute, three safekeepers and a pageserver (issue 14's hole 3).

A compute streams a record to the safekeepers in pieces as PostgreSQL flushes it, so a
safekeeper's WAL may end inside a record; elections, commits and syncs see only its boundary
LSN, the end of its last whole record. A compute killed in the middle of a long record must
leave a timeline the next compute starts on (its sync ends at a record boundary, so its
basebackup LSN is one the pageserver reaches), with every committed row.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.pagestream import lsn_int
from fixtures.postgres import wait_until


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def endpoint(tmp_path, tl, sks, name="ep") -> Endpoint:
    return Endpoint(tmp_path, tl, name, safekeepers=sks).start()


def sk_lsns(sk, tl) -> tuple[int, int, int]:
    s = sk.timeline(tl.tenant, tl.timeline)
    return lsn_int(s["flush_lsn"]), lsn_int(s["boundary_lsn"]), lsn_int(s["commit_lsn"])


def test_a_compute_killed_inside_a_long_record_leaves_a_timeline_that_starts(tmp_path, timeline, safekeepers):
    ep = endpoint(tmp_path, timeline, safekeepers)
    ep.sql("CREATE TABLE t (id int)")
    ep.sql("INSERT INTO t SELECT generate_series(1, 1000)")
    # A committed 20 MiB record, longer than a message, streams and commits.
    ep.sql("SELECT pg_logical_emit_message(true, 'p', repeat('x', 20 * 1024 * 1024))")
    ep.sql("INSERT INTO t VALUES (1001)")
    for sk in safekeepers:
        flush, boundary, commit = sk_lsns(sk, timeline)
        assert commit <= boundary <= flush

    # A 300 MiB record the compute dies inside: it is killed as soon as a safekeeper holds
    # WAL past its last whole record (PostgreSQL flushes the record in pieces while it is
    # being inserted), or after a few seconds if that was never seen.
    conn = ep.connect()
    errors: list[str] = []

    def emit():
        try:
            conn.execute("SELECT pg_logical_emit_message(false, 'p', repeat('y', 300 * 1024 * 1024))")
        except psycopg.Error as e:
            errors.append(str(e))

    writer = threading.Thread(target=emit, daemon=True)
    writer.start()
    seen_partial = []

    def partial():
        for sk in safekeepers:
            flush, boundary, _ = sk_lsns(sk, timeline)
            if flush > boundary:
                seen_partial.append((sk.addr, flush, boundary))
                return True
        return False

    try:
        wait_until("a safekeeper to hold part of the long record", partial, timeout_s=20, interval_s=0.01)
    except TimeoutError:
        pass
    ep.kill()
    writer.join(timeout=60)

    # The next compute's sync ends at a record boundary, its basebackup at an LSN the
    # pageserver reaches; every committed row is there, and it commits.
    ep2 = endpoint(tmp_path, timeline, safekeepers, name="ep2")
    assert ep2.sql("SELECT count(*), max(id) FROM t") == [(1001, 1001)]
    ep2.sql("INSERT INTO t VALUES (1002)")
    assert ep2.sql("SELECT count(*) FROM t") == [(1002,)]
    for sk in safekeepers:
        flush, boundary, commit = sk_lsns(sk, timeline)
        assert commit <= boundary <= flush
    print(f"partial record seen on a safekeeper before the kill: {seen_partial[:1]}")
