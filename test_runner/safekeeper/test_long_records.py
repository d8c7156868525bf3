"""WAL records longer than a message (`quorum::wire::WAL_BYTES_MAX`, 16 MiB) through a real
compute, three safekeepers and a pageserver.

A compute streams a record to the safekeepers in pieces as PostgreSQL flushes it, so a
safekeeper's WAL may end inside a record; elections, commits and syncs see only its boundary
LSN, the end of its last whole record. A compute killed in the middle of a long record must
leave a timeline the next compute starts on (its sync ends at a record boundary, so its
basebackup LSN is one the pageserver reaches), with every committed row.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import psycopg
import pytest

from fixtures import https
from fixtures.compute import Endpoint, Timeline
from fixtures.pagestream import lsn_int
from fixtures.pageserver import Pageserver
from fixtures.safekeeper import Safekeeper


# Without TLS: with it, the pollers below have not yet been seen to catch a safekeeper
# holding part of the long record (the state this test needs) on a debug build.
@pytest.fixture
def pageserver(tmp_path):
    ps = Pageserver(tmp_path, tls=False).start()
    yield ps
    ps.stop()


@pytest.fixture
def safekeepers(tmp_path):
    sks = [Safekeeper(tmp_path / "safekeepers", i, tls=False).start() for i in (1, 2, 3)]
    yield sks
    for sk in sks:
        sk.kill()


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def endpoint(tmp_path, tl, sks, name="ep") -> Endpoint:
    return Endpoint(tmp_path, tl, name, safekeepers=sks).start()


def sk_lsns(sk, tl) -> tuple[int, int, int]:
    s = sk.timeline(tl.tenant, tl.timeline)
    return lsn_int(s["flush_lsn"]), lsn_int(s["boundary_lsn"]), lsn_int(s["commit_lsn"])


def seen_partial_during_long_record(conn, safekeepers, tl, start: int, seen: list) -> bool:
    """Inserts a 300 MiB record starting at `start` on `conn` while one thread per safekeeper
    polls it; True (with `seen` holding safekeeper, flush, boundary, start) as soon as a
    safekeeper holds WAL past `start` and its boundary is at or before `start`, False if the
    insertion finished first. The insertion goes on in the background when True: the caller
    kills the compute."""
    done = threading.Event()
    found = threading.Event()

    def emit():
        try:
            conn.execute("SELECT pg_logical_emit_message(false, 'p', repeat('y', 300 * 1024 * 1024))")
        except psycopg.Error:
            pass  # the compute was killed under it
        finally:
            done.set()

    def poll(sk):
        # One kept-alive connection per poller: a new TLS handshake per look would make the
        # looks too far apart to catch the state.
        link = (http.client.HTTPSConnection(sk.host, sk.http_port, timeout=30, context=https.ssl_context(sk.tls)) if sk.tls
                else http.client.HTTPConnection(sk.host, sk.http_port, timeout=30))
        path = f"/v1/tenant/{tl.tenant}/timeline/{tl.timeline}"
        while not done.is_set() and not found.is_set():
            link.request("GET", path)
            s = json.loads(link.getresponse().read())
            flush, boundary = lsn_int(s["flush_lsn"]), lsn_int(s["boundary_lsn"])
            if boundary <= start < flush:
                seen.append((sk.addr, flush, boundary, start))
                found.set()
                return
            time.sleep(0.002)

    pollers = [threading.Thread(target=poll, args=(sk,), daemon=True) for sk in safekeepers]
    for p in pollers:
        p.start()
    threading.Thread(target=emit, daemon=True).start()
    while not found.is_set() and not done.is_set():
        found.wait(0.01)
    for p in pollers:
        p.join(timeout=30)
    return bool(seen)


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

    # A 300 MiB record the compute dies inside. PostgreSQL flushes it in pieces while it is
    # being inserted (at every WAL segment it fills, and whenever the WAL writer wakes), so
    # for a second or more the safekeepers hold part of it: their WAL ends past the record's
    # start while their boundary is still at or before it. One poller per safekeeper watches
    # for that state and the compute is killed the moment it is seen. An insertion can still
    # finish before a poller looks (a fast machine, a stalled poller): then the next record
    # is tried, a few times at most, and the test fails if the state was never seen.
    conn = ep.connect()
    seen_partial: list[tuple[str, int, int, int]] = []
    for attempt in range(4):
        start = lsn_int(ep.sql("SELECT pg_current_wal_insert_lsn()")[0][0])
        if seen_partial_during_long_record(conn, safekeepers, timeline, start, seen_partial):
            break
        print(f"attempt {attempt}: the record at {start:X} was inserted before a poller saw part of it")
    assert seen_partial, "no safekeeper was seen holding part of a long record"
    sk_addr, flush, boundary, start = seen_partial[0]
    assert boundary <= start < flush, seen_partial[0]
    ep.kill()

    # The next compute's sync ends at a record boundary, its basebackup at an LSN the
    # pageserver reaches; every committed row is there, and it commits.
    ep2 = endpoint(tmp_path, timeline, safekeepers, name="ep2")
    assert ep2.sql("SELECT count(*), max(id) FROM t") == [(1001, 1001)]
    ep2.sql("INSERT INTO t VALUES (1002)")
    assert ep2.sql("SELECT count(*) FROM t") == [(1002,)]
    for sk in safekeepers:
        flush, boundary, commit = sk_lsns(sk, timeline)
        assert commit <= boundary <= flush
    print(f"partial record seen on a safekeeper before the kill: {seen_partial[0]}")
