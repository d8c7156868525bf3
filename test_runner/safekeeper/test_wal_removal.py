"""WAL removal on safekeepers, with real processes: a compute writing through three
safekeepers, a pageserver following them.

A safekeeper removes a WAL segment once it lies wholly below the lowest of the pageserver's
remote-consistent LSN (here, without object storage, its disk-consistent LSN), the peer
horizon (WAL every safekeeper has) and the commit LSN. So the WAL directories stay a few
segments large while the pageserver keeps up; a safekeeper that is down holds the others'
WAL at what it has (the peer horizon) until it is back and has caught up; and nothing any
component needs is removed: the data is intact after the pageserver and the compute restart,
and a client asking for removed WAL is refused rather than sent zeros.
"""

from __future__ import annotations

import struct
import subprocess
import time

import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.pagestream import lsn_int
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until

SEGMENT = 16 << 20
# The WAL a safekeeper may keep once everyone is caught up: the segment holding the
# removal horizon and the ones after it up to the end of WAL.
SEGMENTS_KEPT_MAX = 3


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def endpoint(tmp_path, tl, sks, name="ep") -> Endpoint:
    return Endpoint(tmp_path, tl, name, safekeepers=sks).start()


def status(sk, tl) -> dict:
    return sk.timeline(tl.tenant, tl.timeline)


def lsn(sk, tl, field: str) -> int:
    return lsn_int(status(sk, tl)[field])


def write_wal(ep: Endpoint, first_id: int, rows: int) -> int:
    """Inserts `rows` rows of about 1 kB (so about as many kB of WAL, more with full-page
    images) and returns the flushed WAL end."""
    ep.sql(
        "INSERT INTO t SELECT g, repeat(md5(g::text), 30) FROM generate_series(%s::int, %s::int) g",
        first_id, first_id + rows - 1,
    )
    return lsn_int(ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])


def durable_end(sk, tl) -> int:
    """A stopped safekeeper's flush LSN, from its `wal.end`: the header's end (end and
    beginning LSNs, generation, little endian, first), plus the batches in the journal after
    it (from offset 4096: generation, LSN, length, the bytes, a crc32c) that continue it in
    the header's generation (safekeeper/README.md, "On disk")."""
    data = (sk.timeline_dir(tl.tenant, tl.timeline) / "wal.end").read_bytes()
    end, _begin, generation = struct.unpack("<QQQ", data[:24])
    at = 4096
    while at + 28 <= len(data):
        gen, lsn, length = struct.unpack("<QQQ", data[at:at + 24])
        if gen != generation or lsn != end or length == 0:
            break
        end += length
        at += 24 + length + 4
    return end


def wait_all_have(sks, tl, end: int):
    wait_until(f"safekeepers {[sk.id for sk in sks]} to have the WAL up to {end:X}",
               lambda: all(lsn(sk, tl, "commit_lsn") >= end for sk in sks), timeout_s=120)


def wait_removed_down_to_bound(sks, tl):
    def small():
        return all(len(sk.segments(tl.tenant, tl.timeline)) <= SEGMENTS_KEPT_MAX for sk in sks)
    try:
        wait_until("the safekeepers to remove the WAL below the horizon", small, timeout_s=60)
    except TimeoutError:
        details = {sk.id: (sk.segments(tl.tenant, tl.timeline), status(sk, tl)) for sk in sks}
        raise AssertionError(f"WAL not removed: {details}") from None


def test_safekeepers_remove_wal_nobody_needs(tmp_path, pageserver, timeline, safekeepers):
    sk1, sk2, sk3 = safekeepers
    tl = timeline
    ep = endpoint(tmp_path, tl, safekeepers)
    ep.sql("CREATE TABLE t (id int, pad text)")

    # Five times about 20 MB of WAL: at least six segments are written on every safekeeper.
    next_id = 1
    for _ in range(5):
        end = write_wal(ep, next_id, 20_000)
        next_id += 20_000
    wait_all_have(safekeepers, tl, end)
    assert end // SEGMENT >= 6, f"only {end:X} of WAL written"
    # The pageserver flushes its layers when WAL pauses and tells its safekeeper how far they
    # go; the WAL proposer relays that and the peer horizon to all three, which then
    # remove everything but the last few segments.
    wait_removed_down_to_bound(safekeepers, tl)
    for sk in safekeepers:
        st = status(sk, tl)
        begin = lsn_int(st["wal_begin_lsn"])
        assert begin % SEGMENT == 0 and begin >= (end // SEGMENT - SEGMENTS_KEPT_MAX + 1) * SEGMENT, st
        assert lsn_int(st["remote_consistent_lsn"]) >= begin and lsn_int(st["peer_horizon_lsn"]) >= begin, st
        assert lsn_int(st["wal_removal_horizon_lsn"]) >= begin, st
        assert st["wal_disk_bytes"] == len(sk.segments(tl.tenant, tl.timeline)) * SEGMENT, st
        assert sk.metric("safekeeper_wal_segments_removed_total", tl.tenant, tl.timeline) >= 3
        assert sk.metric("safekeeper_wal_disk_bytes", tl.tenant, tl.timeline) == st["wal_disk_bytes"]
        assert "removed WAL segments" in sk.log_text()

    # A client asking for removed WAL is refused, not sent zeros. pg_receivewal starts after
    # the last complete segment it has: a stand-in for the first segment of the timeline
    # makes it ask for the second from its beginning, which is gone.
    begin = lsn(sk1, tl, "wal_begin_lsn")
    first_segno = 1
    assert (first_segno + 1) * SEGMENT < begin
    out = tmp_path / "receivewal"
    out.mkdir()
    (out / f"00000001{first_segno >> 8:08X}{first_segno & 0xFF:08X}").write_bytes(bytes(SEGMENT))
    r = subprocess.run(
        [str(pg_bin_dir() / "pg_receivewal"), "-h", "127.0.0.1", "-p", str(sk1.port), "-U", "fjord",
         "-d", f"options='-c fjord.timeline={tl.tenant}/{tl.timeline}' {sk1.libpq_tls_conninfo()}", "-D", str(out), "--no-loop",
         "-n"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode != 0, f"removed WAL was streamed:\n{r.stdout}\n{r.stderr}"
    assert "is not available here (WAL begins at" in r.stderr, r.stderr
    assert not any(p.name.endswith(".partial") for p in out.iterdir()), list(out.iterdir())

    # sk3 stops: the others keep everything sk3 lacks (the peer horizon holds at what it
    # had acknowledged), although the pageserver moves on.
    sk3.stop()
    sk3_end = durable_end(sk3, tl)
    for _ in range(3):
        end = write_wal(ep, next_id, 20_000)
        next_id += 20_000
    wait_all_have([sk1, sk2], tl, end)
    wait_until("the pageserver's remote-consistent LSN to pass sk3's end",
               lambda: all(lsn(sk, tl, "remote_consistent_lsn") > sk3_end + 2 * SEGMENT for sk in (sk1, sk2)), timeout_s=60)
    for sk in (sk1, sk2):
        st = status(sk, tl)
        assert lsn_int(st["peer_horizon_lsn"]) <= sk3_end, st
        assert lsn_int(st["wal_begin_lsn"]) <= sk3_end, f"safekeeper {sk.id} removed WAL sk3 needs: {st}"
        assert len(sk.segments(tl.tenant, tl.timeline)) > SEGMENTS_KEPT_MAX, sk.segments(tl.tenant, tl.timeline)

    # sk3 is back: it catches up (from the compute's WAL), and then all three remove again.
    sk3.start()
    wait_until("sk3 to catch up", lambda: lsn(sk3, tl, "flush_lsn") >= end, timeout_s=120)
    wait_removed_down_to_bound(safekeepers, tl)

    # Nothing anyone needs was removed: after a restart of the pageserver (which resumes
    # from its own state) a new compute (which syncs the safekeepers first) sees every row.
    count, total = ep.sql("SELECT count(*), sum(id) FROM t")[0]
    assert count == next_id - 1 and total == (next_id - 1) * next_id // 2
    ep.stop()
    pageserver.stop()
    pageserver.start()
    ep2 = endpoint(tmp_path, tl, safekeepers, name="ep2")
    assert ep2.sql("SELECT count(*), sum(id) FROM t")[0] == (count, total)
    ep2.sql("INSERT INTO t VALUES (-1, 'after')")
    assert ep2.sql("SELECT count(*) FROM t")[0][0] == count + 1
    for sk in safekeepers:
        text = sk.log_text()
        assert "has been removed" not in text and " ERROR " not in text, sk.log_tail()
    assert "not available here" not in pageserver.log_text()



def test_a_replica_finds_the_wal_its_basebackup_starts_from(tmp_path, pageserver, timeline, safekeepers):
    """A replica's basebackup starts at the newest running-transactions record, which
    PostgreSQL logs at checkpoints and every 15 s while WAL is written; its WAL streams from
    the safekeepers from there. The pageserver's layers can be uploaded segments past that
    record meanwhile, and the safekeepers removed that WAL: a replica started under writes
    failed with "requested WAL ... is not available" (seen in CI beside pgbench). The
    pageserver now tells them to keep the WAL from that record on."""
    tl = timeline
    ep = endpoint(tmp_path, tl, safekeepers)
    ep.sql("CREATE TABLE t (id int, pad text)")
    ep.sql("CHECKPOINT")  # a running-transactions record here
    # About 50 MB: three segments and more past the record, written faster than the next
    # record comes (15 s) on any machine this runs on, though it may come.
    end = write_wal(ep, 1, 50_000)
    wait_all_have(safekeepers, tl, end)
    wait_until("the pageserver's layers to reach the end of WAL", lambda: lsn_int(pageserver.http(
        "GET", f"/v1/tenant/{tl.tenant}/timeline/{tl.timeline}")["disk_consistent_lsn"]) >= end, timeout_s=120)
    time.sleep(2)  # the reports reach the safekeepers, which remove what they may
    replica = Endpoint(tmp_path, tl, "replica", safekeepers=safekeepers, replica=True).start()
    start = [line for line in replica.logfile.read_text().splitlines() if "basebackup unpacked" in line][-1]
    print(f"the replica's basebackup: {start}; the safekeepers' WAL begins at",
          [status(sk, tl)["wal_begin_lsn"] for sk in safekeepers])
    # It replays the 50 MB from its start to catch up.
    wait_until("the replica to see every row", lambda: replica.sql("SELECT count(*) FROM t") == [(50_000,)], timeout_s=120)
    wal_begin = max(lsn(sk, tl, "wal_begin_lsn") for sk in safekeepers)
    basebackup_lsn = lsn_int(start.split('lsn=Some("')[1].split('"')[0])
    assert wal_begin <= basebackup_lsn, (start, wal_begin)
    ep.sql("INSERT INTO t VALUES (-1, 'after')")
    wait_until("the replica to see a new row", lambda: replica.sql("SELECT count(*) FROM t WHERE id = -1") == [(1,)])
