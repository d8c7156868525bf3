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
import os
import signal
import threading
import time

import psycopg
import pytest

from fixtures import https
from fixtures.compute import Endpoint, Timeline
from fixtures.pagestream import lsn_int
from fixtures.safekeeper import Safekeeper


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def endpoint(tmp_path, tl, sks, name="ep") -> Endpoint:
    return Endpoint(tmp_path, tl, name, safekeepers=sks).start()


def sk_lsns(sk, tl) -> tuple[int, int, int]:
    s = sk.timeline(tl.tenant, tl.timeline)
    return lsn_int(s["flush_lsn"]), lsn_int(s["boundary_lsn"]), lsn_int(s["commit_lsn"])


class Looker:
    """Reads one safekeeper's flush and boundary LSNs over a kept-alive connection (a TLS
    handshake per look would dominate the looks' cost)."""

    def __init__(self, sk: Safekeeper, tl: Timeline):
        self.sk = sk
        self.path = f"/v1/tenant/{tl.tenant}/timeline/{tl.timeline}"
        self.link = (http.client.HTTPSConnection(sk.host, sk.http_port, timeout=30, context=https.ssl_context(sk.tls))
                     if sk.tls else http.client.HTTPConnection(sk.host, sk.http_port, timeout=30))

    def look(self) -> tuple[int, int]:
        self.link.request("GET", self.path)
        s = json.loads(self.link.getresponse().read())
        return lsn_int(s["flush_lsn"]), lsn_int(s["boundary_lsn"])


# The inserting backend runs in slices this long between looks.
SLICE_S = 0.03
# How long the safekeepers may take to receive what the stopped compute has flushed (the
# WAL proposer looks every 50 ms; a loaded machine makes it slower, never a failure).
CATCH_UP_MAX_S = 60.0


def seen_partial_during_long_record(conn, watcher, safekeepers, tl, start: int, seen: list) -> bool:
    """Inserts a 300 MiB record starting at `start` on `conn`, running the inserting backend
    in short slices: SIGCONT, SLICE_S, SIGSTOP. PostgreSQL flushes a record this long in
    pieces while it is being inserted (at every WAL segment it fills, and whenever the WAL
    writer wakes), and while the backend is stopped nothing is added. At each stop the
    compute's flush LSN is read on `watcher` (another connection); once it is past `start`,
    the record is flushed in part, and the test waits for a safekeeper to hold WAL up to it:
    True (with `seen` holding safekeeper, flush, boundary, start) once one holds WAL past
    `start` with its boundary at or before it, the backend left stopped for the caller to
    kill the compute. False only if the insertion finished within slices in which nothing
    of it was flushed. No timing decides it: the WAL proposer sends what is flushed, however
    long that takes on a loaded machine."""
    pid = conn.info.backend_pid
    done = threading.Event()

    def emit():
        try:
            conn.execute("SELECT pg_logical_emit_message(false, 'p', repeat('y', 300 * 1024 * 1024))")
        except psycopg.Error:
            pass  # the compute was killed under it
        finally:
            done.set()

    lookers = [Looker(sk, tl) for sk in safekeepers]
    threading.Thread(target=emit, daemon=True).start()
    while not done.is_set():
        time.sleep(SLICE_S)
        os.kill(pid, signal.SIGSTOP)
        try:
            if done.is_set():
                return False
            flushed = lsn_int(watcher.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0])
            if flushed > start and partial_on_a_safekeeper(lookers, start, flushed, seen):
                return True
        finally:
            if not seen:
                os.kill(pid, signal.SIGCONT)
    return False


def partial_on_a_safekeeper(lookers: list[Looker], start: int, flushed: int, seen: list) -> bool:
    """Waits until a safekeeper holds the WAL the stopped compute flushed (up to `flushed`,
    past `start`, inside the record), and records it in `seen`."""
    deadline = time.monotonic() + CATCH_UP_MAX_S
    while time.monotonic() < deadline:
        for lk in lookers:
            flush, boundary = lk.look()
            if boundary <= start < flush:
                seen.append((lk.sk.addr, flush, boundary, start))
                return True
        time.sleep(0.02)
    raise AssertionError(f"no safekeeper received the WAL the compute flushed up to {flushed:X} within {CATCH_UP_MAX_S} s")


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

    # A 300 MiB record the compute dies inside, killed while a safekeeper holds part of it:
    # WAL past the record's start, its boundary still at or before it (see
    # seen_partial_during_long_record). That misses it only if a record goes in while
    # nothing of it is flushed; the next is tried then, and the test fails if none showed it.
    conn = ep.connect()
    watcher = ep.connect()
    backend = conn.info.backend_pid
    seen_partial: list[tuple[str, int, int, int]] = []
    for attempt in range(4):
        start = lsn_int(ep.sql("SELECT pg_current_wal_insert_lsn()")[0][0])
        if seen_partial_during_long_record(conn, watcher, safekeepers, timeline, start, seen_partial):
            break
        print(f"attempt {attempt}: the record at {start:X} went in while nothing of it was flushed")
    assert seen_partial, "no safekeeper was seen holding part of a long record"
    sk_addr, flush, boundary, start = seen_partial[0]
    assert boundary <= start < flush, seen_partial[0]
    ep.kill()
    # The stopped backend would never notice its postmaster's death: it goes too.
    os.kill(backend, signal.SIGKILL)

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
