"""Safekeepers under failure, with real processes on loopback: a compute whose WAL goes to
three safekeepers, a pageserver that follows them, and safekeepers killed, restarted,
corrupted and sent garbage while pgbench and a ledger of acknowledged commits run.

A commit is acknowledged only when a majority of safekeepers has its WAL on disk, so every
id the ledger saw acknowledged must be there at the end, also on a fresh compute (which
starts from the pageserver, which got its WAL from the safekeepers).
"""

from __future__ import annotations

import re
import socket
import ssl
import struct
import subprocess
import threading
import time

import psycopg
import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.logs import unexpected_lines
from fixtures.pagestream import lsn_int
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def endpoint(tmp_path, tl, sks, name="ep", settings=None) -> Endpoint:
    return Endpoint(tmp_path, tl, name, settings, safekeepers=sks).start()


def pgbench(ep: Endpoint, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user, *args, "postgres"],
        capture_output=True, text=True, timeout=timeout,
    )


class Ledger(threading.Thread):
    """Inserts ids one autocommit transaction at a time and remembers which commits were
    acknowledged; reconnects after errors (an id whose commit raised counts as not
    acknowledged)."""

    def __init__(self, ep: Endpoint):
        super().__init__(daemon=True)
        self.ep = ep
        self.acked: list[int] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self):
        next_id = 1
        conn = None
        while not self.stopping.is_set():
            try:
                if conn is None:
                    conn = self.ep.connect(connect_timeout=5)
                conn.execute("INSERT INTO ledger VALUES (%s)", (next_id,))
                self.acked.append(next_id)
            except psycopg.Error as e:
                self.errors.append(str(e).strip())
                conn = None
                time.sleep(0.2)
            next_id += 1

    def stop(self) -> list[int]:
        self.stopping.set()
        self.join(timeout=120)
        assert not self.is_alive(), "the ledger thread hangs"
        return self.acked


def check_ledger(ep: Endpoint, acked: list[int]):
    present = {r[0] for r in ep.sql("SELECT id FROM ledger")}
    lost = sorted(set(acked) - present)
    assert not lost, f"{len(lost)} acknowledged commits lost, e.g. {lost[:10]}"


def check_pgbench_consistent(ep: Endpoint):
    (a, h), = ep.sql("SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)")
    assert a == h, f"balances {a} differ from the history's deltas {h}"


def sk_lsn(sk, tl, field="flush_lsn") -> int:
    return lsn_int(sk.timeline(tl.tenant, tl.timeline)[field])


def test_pgbench_survives_safekeeper_restarts(tmp_path, timeline, safekeepers):
    ep = endpoint(tmp_path, timeline, safekeepers)
    ep.sql("CREATE TABLE ledger (id int PRIMARY KEY)")
    r = pgbench(ep, "-i", "-s", "1", "-q")
    assert r.returncode == 0, r.stderr
    ledger = Ledger(ep)
    ledger.start()
    bench = subprocess.Popen(
        [str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user, "-c", "2", "-T", "45", "postgres"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    for sk in safekeepers:
        time.sleep(4)
        sk.kill()
        before = len(ledger.acked)
        time.sleep(4)
        assert len(ledger.acked) > before, f"commits stopped with only safekeeper {sk.id} down"
        sk.start()
        # It catches up with the others.
        wait_until(f"safekeeper {sk.id} to catch up",
                   lambda: sk_lsn(sk, timeline) >= min(sk_lsn(o, timeline) for o in safekeepers if o is not sk) - 0,
                   timeout_s=60)
    out, err = bench.communicate(timeout=300)
    assert bench.returncode == 0, f"pgbench failed:\n{out}\n{err}"
    acked = ledger.stop()
    assert len(acked) > 50, f"only {len(acked)} ledger commits (errors: {ledger.errors[:5]})"
    assert not ledger.errors, f"the ledger saw errors with one safekeeper down at a time: {ledger.errors[:5]}"
    check_ledger(ep, acked)
    check_pgbench_consistent(ep)
    # A fresh compute starts where the safekeepers agree WAL ends, from the pageserver.
    ep.stop()
    ep2 = endpoint(tmp_path, timeline, safekeepers, name="ep2")
    check_ledger(ep2, acked)
    check_pgbench_consistent(ep2)


def test_commits_wait_without_a_majority(tmp_path, timeline, safekeepers):
    ep = endpoint(tmp_path, timeline, safekeepers)
    ep.sql("CREATE TABLE t (x int)")
    safekeepers[1].kill()
    safekeepers[2].kill()
    done = threading.Event()
    failure: list[BaseException] = []

    def insert():
        try:
            ep.sql("INSERT INTO t VALUES (1)")
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failure.append(e)
        done.set()

    threading.Thread(target=insert, daemon=True).start()
    assert not done.wait(5), "a commit was acknowledged with two of three safekeepers down"
    waiting = ep.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")[0][0]
    assert waiting == 1, "the commit should be waiting for the safekeepers"
    # Committed locally, but like any transaction waiting for synchronous replication it is
    # not visible to others until it is acknowledged.
    assert ep.sql("SELECT count(*) FROM t")[0][0] == 0
    safekeepers[1].start()
    assert done.wait(60), "the commit did not resume once a majority was back"
    assert not failure, failure
    ep.sql("INSERT INTO t VALUES (2)")
    assert ep.sql("SELECT count(*) FROM t")[0][0] == 2


# Expected: the fencing the test causes, and the stale insert's wait for the safekeepers,
# ended when the fenced compute shuts down (if it still waits then).
@pytest.mark.allowed_errors(r"WARNING:  fjord: this compute was fenced",
                            r"WARNING:  canceling the wait for synchronous replication and terminating connection")
def test_second_compute_fences_the_first(tmp_path, timeline, safekeepers):
    ep1 = endpoint(tmp_path, timeline, safekeepers, name="ep1")
    ep1.sql("CREATE TABLE t (who text)")
    ep1.sql("INSERT INTO t VALUES ('first')")
    conn1 = ep1.connect()
    ep1.proc.expect_exit()
    ep2 = endpoint(tmp_path, timeline, safekeepers, name="ep2")
    assert ep2.sql("SELECT who FROM t") == [("first",)]
    # The first compute's next commit cannot be acknowledged: it is told why and stops.
    with pytest.raises(psycopg.OperationalError):
        conn1.execute("INSERT INTO t VALUES ('stale')")
    wait_until("the fenced compute to stop", lambda: ep1.proc.poll() is not None, timeout_s=60)
    assert "fenced" in ep1.pg_log_text(), ep1.log_tail()
    ep2.sql("INSERT INTO t VALUES ('second')")
    assert sorted(ep2.sql("SELECT who FROM t")) == [("first",), ("second",)]


def test_lagging_safekeeper_catches_up(tmp_path, timeline, safekeepers):
    sk1, sk2, sk3 = safekeepers
    ep = endpoint(tmp_path, timeline, safekeepers)
    ep.sql("CREATE TABLE t (x int, pad text)")
    sk3.kill()
    ep.sql("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
    # A new compute starts while sk3 is down: sk3 now misses WAL from before that
    # compute's start, which the compute does not have; it is fetched from another
    # safekeeper.
    ep.stop()
    ep = endpoint(tmp_path, timeline, safekeepers, name="ep2")
    ep.sql("INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series(1, 20000) g")
    sk3.start()
    wait_until("sk3 to catch up", lambda: sk_lsn(sk3, timeline) == sk_lsn(sk1, timeline) == sk_lsn(sk2, timeline), timeout_s=60)
    # With sk1 down, sk2 and sk3 are a majority: sk3 really has the WAL.
    sk1.kill()
    ep.sql("INSERT INTO t VALUES (-1, 'after')")
    assert ep.sql("SELECT count(*) FROM t")[0][0] == 40001


# Expected: the control file the test corrupts.
@pytest.mark.allowed_errors(r"cannot load timeline: .*safekeeper.control is corrupt",
                            r"timeline \S+ is (unavailable|not available on this safekeeper)")
def test_corrupt_control_file_is_detected_not_served(tmp_path, timeline, safekeepers):
    sk1 = safekeepers[0]
    ep = endpoint(tmp_path, timeline, safekeepers)
    ep.sql("CREATE TABLE t (x int)")
    ep.sql("INSERT INTO t VALUES (1)")
    sk1.stop()
    control = sk1.timeline_dir(timeline.tenant, timeline.timeline) / "safekeeper.control"
    data = bytearray(control.read_bytes())
    data[len(data) // 2] ^= 0xFF
    control.write_bytes(bytes(data))
    sk1.start()
    status = sk1.timeline(timeline.tenant, timeline.timeline)
    assert "corrupt" in str(status).lower() or "checksum" in str(status).lower(), status
    assert control.read_bytes() == bytes(data), "the corrupt control file was changed"
    # The other two carry on.
    ep.sql("INSERT INTO t VALUES (2)")
    assert ep.sql("SELECT count(*) FROM t")[0][0] == 2
    assert "control" in sk1.log_text().lower()


# Expected: the segment the test corrupts.
@pytest.mark.allowed_errors(r"could not send WAL \S+: WAL segment")
def test_corrupt_wal_segment_is_detected_not_served(tmp_path, timeline, safekeepers):
    sk1 = safekeepers[0]
    # The segments smashed and streamed below must not be removed once the pageserver has
    # them (test_wal_removal.py tests removal).
    sk1.stop()
    sk1.wal_removal = False
    sk1.start()
    ep = endpoint(tmp_path, timeline, safekeepers)
    ep.sql("CREATE TABLE t (x int, pad text)")
    # More than two 16 MiB segments of WAL.
    ep.sql("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 300000) g")
    end = ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0]
    wait_until("every safekeeper to have the WAL", lambda: all(sk_lsn(sk, timeline) >= lsn_int(end) for sk in safekeepers), timeout_s=60)
    ep.stop()
    sk1.stop()
    tldir = sk1.timeline_dir(timeline.tenant, timeline.timeline)
    segments = sorted(p for p in tldir.iterdir() if len(p.name) == 24 and all(c in "0123456789ABCDEF" for c in p.name))
    assert len(segments) >= 3, [p.name for p in tldir.iterdir()]
    first, victim = segments[0], segments[1]
    # Smash the header of the third page of the second segment.
    data = bytearray(victim.read_bytes())
    data[2 * 8192:2 * 8192 + 4] = b"\xde\xad\xbe\xef"
    victim.write_bytes(bytes(data))
    sk1.start()
    # pg_receivewal starts after the last complete segment it has: give it a stand-in for
    # the first one, so that it asks for the second from its beginning.
    out = tmp_path / "receivewal"
    out.mkdir()
    (out / first.name).write_bytes(bytes(16 << 20))
    r = subprocess.run(
        [str(pg_bin_dir() / "pg_receivewal"), "-h", "127.0.0.1", "-p", str(sk1.port), "-U", "fjord",
         # pg_receivewal cannot name a database: the timeline goes in `options`.
         "-d", f"options='-c fjord.timeline={timeline.tenant}/{timeline.timeline}' {sk1.libpq_tls_conninfo()}", "-D", str(out),
         "--no-loop", "-n", "-v"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode != 0, f"corrupt WAL was streamed:\n{r.stdout}\n{r.stderr}"
    assert victim.name in r.stderr, r.stderr
    assert victim.name in sk1.log_text(), sk1.log_tail()
    # What was streamed stops before the smashed page.
    partial = out / (victim.name + ".partial")
    got = partial.read_bytes() if partial.exists() else b""
    assert b"\xde\xad\xbe\xef" not in got


# Expected: the malformed messages the test sends.
@pytest.mark.allowed_errors(r"connection ended with an error: (malformed greeting|a safekeeper serves only physical replication connections)")
def test_malformed_protocol_messages_get_clear_errors(tmp_path, timeline, safekeepers):
    sk = safekeepers[0]
    ep = endpoint(tmp_path, timeline, safekeepers)
    ep.sql("CREATE TABLE t (x int)")
    # The proposer protocol: a Hello with a truncated body.
    with sk.connect_raw() as s:
        s.sendall(b"H" + struct.pack(">I", 3) + b"\x00\x00\x00")
        reply = recv_all(s)
    assert reply[:1] == b"x", reply
    assert b"truncated" in reply, reply
    # An unknown message tag after a good start is refused the same way.
    with sk.connect_raw() as s:
        s.sendall(b"H" + struct.pack(">I", 0x7fffffff))
        reply = recv_all(s)
    assert reply[:1] == b"x" and b"too long" in reply, reply
    # The replication protocol: a startup packet without the replication parameter.
    with sk.connect_raw() as s:
        params = b"user\x00fjord\x00database\x00nonsense\x00\x00"
        s.sendall(struct.pack(">II", 8 + len(params), 196608) + params)
        reply = recv_all(s)
    assert reply[:1] == b"E", reply
    # Nothing changed: the safekeeper still serves, the compute still commits.
    assert sk.http("GET", "/v1/status")
    ep.sql("INSERT INTO t VALUES (1)")
    assert ep.sql("SELECT count(*) FROM t")[0][0] == 1


def recv_all(s: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            b = s.recv(65536)
        except (ConnectionResetError, socket.timeout, ssl.SSLError):
            break
        if not b:
            break
        chunks.append(b)
    return b"".join(chunks)


# Expected: the safekeeper whose data the test removes.
@pytest.mark.allowed_errors(r"a proposer writes to a timeline this safekeeper has no record of",
                            r"timeline \S+ is not available on this safekeeper")
def test_a_safekeeper_that_lost_its_disk_does_not_vote(tmp_path, timeline, safekeepers):
    """The reproduction of the blank-acceptor hole, with processes: rows acknowledged by
    safekeepers 1 and 2 while 3 is down; 1 loses its data directory; with 1 and 3 up and 2
    down, a blank 1 would vote with the lagging 3 and a new compute would start without the
    rows. Instead 1 comes back as a learner: no majority votes, the endpoint does not start
    and says why; once 2 is back, it starts with every row, and 1 catches up and votes again."""
    sk1, sk2, sk3 = safekeepers
    ep = endpoint(tmp_path, timeline, safekeepers)
    ep.sql("CREATE TABLE t (x int)")
    sk3.stop()
    for i in range(61):
        ep.sql(f"INSERT INTO t VALUES ({i})")
    ep.stop()
    sk1.stop()
    subprocess.run(["rm", "-rf", str(sk1.datadir)], check=True)
    sk1.datadir.mkdir()
    sk1.start()
    sk3.start()
    sk2.stop()

    ep2 = Endpoint(tmp_path, timeline, "ep2", safekeepers=safekeepers)
    # compute_ctl gives up after its 30 s sync timeout (the fixture reports its exit).
    with pytest.raises((RuntimeError, TimeoutError)) as failed:
        ep2.start(timeout_s=45)
    log = ep2.log_tail()
    assert "could not sync the safekeepers" in str(failed.value) + log, log
    assert "have no record of this timeline" in str(failed.value) + log, log
    st = sk1.timeline(timeline.tenant, timeline.timeline)
    assert st["learner"] is True and st["term"] == 0, st
    assert "created it as a learner" in sk1.log_text()

    sk2.start()
    ep2 = endpoint(tmp_path, timeline, safekeepers, name="ep3")
    assert ep2.sql("SELECT count(*) FROM t")[0][0] == 61
    ep2.sql("INSERT INTO t VALUES (61)")
    def voter():
        return sk1.timeline(timeline.tenant, timeline.timeline)["learner"] is False
    try:
        wait_until("safekeeper 1 to vote again", voter, timeout_s=20)
    except TimeoutError:
        # A learner joins only an election it saw begin (quorum's "Learners": an earlier
        # incarnation may have acknowledged WAL in one it did not see). If its connection
        # came after this compute's vote requests, it joins the next election: start one.
        ep2.stop()
        ep2 = endpoint(tmp_path, timeline, safekeepers, name="ep3b")
        ep2.sql("CREATE TABLE IF NOT EXISTS u (x int)")  # WAL, and so appends, in its term
        wait_until("safekeeper 1 to vote again after the next election", voter, timeout_s=60)
    # With 2 down again, 1 and 3 are a majority that has every row.
    ep2.stop()
    sk2.stop()
    ep4 = endpoint(tmp_path, timeline, safekeepers, name="ep4")
    assert ep4.sql("SELECT count(*) FROM t")[0][0] == 62


# Expected: the record the test damages, and the compute stopped while the pageserver is down.
@pytest.mark.allowed_errors(r"START_REPLICATION failed: WAL at \S+ is corrupt on this safekeeper",
                            r"failed verification and is not sent",
                            r"checkpoint before shutdown failed",
                            r"FATAL:  canceling authentication due to timeout")
def test_a_record_damaged_on_one_safekeeper_is_never_served(tmp_path, timeline, safekeepers, pageserver):
    """A byte flipped inside a WAL record in one of safekeeper 1's segment files, where the
    page headers are intact (so its storage's page checks pass): safekeeper 1 checks every
    record's CRC before sending it, so it sends the WAL before that record, then ends the
    stream with FATAL XX001, logs one ERROR naming the timeline, the LSN and the segment
    file, and counts it; the pageserver, which streams from safekeeper 1 first, takes the
    WAL from safekeeper 2 instead and never sees the bad bytes (no record fails to decode
    there); every row is there, read by a new compute."""
    sk1 = safekeepers[0]
    ep = endpoint(tmp_path, timeline, safekeepers)
    # One session throughout, its statements run once before the pageserver stops: their
    # catalog lookups and index pages are then cached, and the compute needs no page it
    # does not have while the pageserver is down.
    conn = ep.connect()
    conn.execute("CREATE TABLE t (x int, pad text)")
    big = "INSERT INTO t SELECT %s::int, string_agg(md5(g::text), '') FROM generate_series(1, 125) g"
    rows = "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g"
    conn.execute(rows, (1, 1000))
    conn.execute(big, (-2,))
    flushed = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
    wait_until("the pageserver to ingest", lambda: lsn_int(timeline.status()["last_record_lsn"]) >= lsn_int(flushed), timeout_s=60)
    pageserver.stop()
    # One big record (a row of 4000 incompressible bytes: toasted, chunks of ~2 KB), written
    # while the pageserver is down, so that it streams it after its restart.
    before = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
    conn.execute(big, (-1,))
    conn.execute(rows, (1001, 2000))
    end = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
    conn.close()
    wait_until("every safekeeper to have the WAL", lambda: all(sk_lsn(sk, timeline) >= lsn_int(end) for sk in safekeepers), timeout_s=60)
    ep.stop()
    # Flip a byte in the middle of the big record's data on safekeeper 1 (not in a page
    # header: the safekeeper checks those itself).
    pos = lsn_int(before) + 1000
    if pos % 8192 < 64:
        pos += 64
    sk1.stop()
    seg_size = 16 << 20
    tldir = sk1.timeline_dir(timeline.tenant, timeline.timeline)
    seg = tldir / f"00000001{(pos // seg_size) // 0x100:08X}{(pos // seg_size) % 0x100:08X}"
    data = bytearray(seg.read_bytes())
    data[pos % seg_size] ^= 0xFF
    seg.write_bytes(bytes(data))
    sk1.start()

    pageserver.start()
    wait_until("the pageserver to ingest past the damage", lambda: lsn_int(timeline.status()["last_record_lsn"]) >= lsn_int(end), timeout_s=120)
    assert timeline.status()["wal_receiver"]["state"] != "failed"

    # Safekeeper 1 found it, said where, counted it, and did not send it.
    found = [line for line in sk1.log_text().splitlines() if "failed verification and is not sent" in line]
    assert found, sk1.log_tail()
    assert all(" ERROR " in line and seg.name in line and timeline.timeline in line for line in found), found
    # The damaged record begins at or before the flipped byte, at most one record back.
    lsns = {lsn_int(m) for line in found for m in re.findall(r"WAL at ([0-9A-F]+/[0-9A-F]+) in segment file", line)}
    assert len(lsns) == 1 and lsn_int(before) <= lsns.pop() <= pos, found
    assert corruption_count(sk1, timeline) == len(found) >= 1
    assert corruption_count(safekeepers[1], timeline) == corruption_count(safekeepers[2], timeline) == 0
    # The pageserver was told (FATAL, SQLSTATE XX001: its log shows the message) and moved
    # on; no byte of the damaged record reached it, so none failed to decode there.
    ps_log = pageserver.log_text()
    told = rf"could not stream WAL from \S*{sk1.port}\S*: .*WAL at \S+ is corrupt on this safekeeper \(segment file {seg.name}\)"
    assert re.search(told, ps_log), ps_log[-3000:]
    assert "does not decode" not in ps_log, ps_log[-3000:]

    ep2 = endpoint(tmp_path, timeline, safekeepers, name="ep2")
    assert ep2.sql("SELECT count(*), sum(length(pad)) FROM t") == [(2002, 2000 * 32 + 2 * 4000)]
    ep2.stop()
    # The first compute stopped while the pageserver was down: its shutdown checkpoint's
    # connection could not start (no pages), or its statement ran into compute_ctl's 2 s
    # statement timeout, and compute_ctl shut it down without.
    down = [r"checkpoint before shutdown failed", r"FATAL:  canceling authentication due to timeout",
            r"ERROR:  canceling statement due to statement timeout"]
    assert unexpected_lines(ep.pg_log_text(), down) == []
    assert unexpected_lines(ep2.pg_log_text()) == []
    assert unexpected_lines(sk1.log_text(), [r"failed verification and is not sent"]) == []
    for sk in safekeepers[1:]:
        assert unexpected_lines(sk.log_text()) == []
    # Before the first compute commits, the safekeepers have no WAL to stream yet.
    no_wal_yet = r"is ahead of the WAL flush position of this server 0/0 \(the timeline's commit LSN\)"
    assert unexpected_lines(pageserver.log_text(), [told, no_wal_yet]) == []


def corruption_count(sk, tl) -> float:
    """`safekeeper_wal_corruption_total` of the timeline (absent until the first)."""
    try:
        return sk.metric("safekeeper_wal_corruption_total", tl.tenant, tl.timeline)
    except KeyError:
        return 0
