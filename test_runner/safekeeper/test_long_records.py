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


# The inserting backend runs in slices this long between looks...
SLICE_S = 0.03
# ...and a look ends once every safekeeper's flush LSN has stayed put this many polls in a
# row (POLL_S apart), or after LOOK_MAX_S.
SETTLED_POLLS = 5
POLL_S = 0.04
LOOK_MAX_S = 2.0


def seen_partial_during_long_record(conn, safekeepers, tl, start: int, seen: list) -> bool:
    """Inserts a 300 MiB record starting at `start` on `conn`, running the inserting backend
    in short slices: SIGCONT, SLICE_S, SIGSTOP. PostgreSQL flushes a record this long in
    pieces while it is being inserted (at every WAL segment it fills, and whenever the WAL
    writer wakes), and while the backend is stopped nothing is added, so the WAL proposer
    sends what was flushed and the safekeepers settle; then each is looked at. True (with
    `seen` holding safekeeper, flush, boundary, start) once one holds WAL past `start` with its
    boundary at or before it, the backend left stopped for the caller to kill the compute;
    False if the insertion finished first. No race decides the outcome: only a record
    inserted within one slice could be missed, and 300 MiB takes many."""
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
            if settled_partial(lookers, start, seen):
                return True
        finally:
            if not seen:
                os.kill(pid, signal.SIGCONT)
    return False


def settled_partial(lookers: list[Looker], start: int, seen: list) -> bool:
    """Looks at every safekeeper until their flush LSNs stay put (or LOOK_MAX_S); True as
    soon as one holds WAL past `start` with its boundary at or before it."""
    last: list[int] | None = None
    still = 0
    deadline = time.monotonic() + LOOK_MAX_S
    while still < SETTLED_POLLS and time.monotonic() < deadline:
        looks = [lk.look() for lk in lookers]
        for lk, (flush, boundary) in zip(lookers, looks):
            if boundary <= start < flush:
                seen.append((lk.sk.addr, flush, boundary, start))
                return True
        flushes = [flush for flush, _ in looks]
        still = still + 1 if flushes == last else 0
        last = flushes
        time.sleep(POLL_S)
    return False


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
    # seen_partial_during_long_record). The stepping cannot miss that state unless a record
    # goes in within one slice; the next is tried then, and the test fails if none showed it.
    conn = ep.connect()
    backend = conn.info.backend_pid
    seen_partial: list[tuple[str, int, int, int]] = []
    for attempt in range(4):
        start = lsn_int(ep.sql("SELECT pg_current_wal_insert_lsn()")[0][0])
        if seen_partial_during_long_record(conn, safekeepers, timeline, start, seen_partial):
            break
        print(f"attempt {attempt}: the record at {start:X} went in within one slice")
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
