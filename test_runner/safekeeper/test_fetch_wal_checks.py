"""Record checks on the WAL a safekeeper serves a compute's WAL proposer (`FetchWal`) for a
safekeeper that lags behind, with real processes: a record damaged on the donor's
disk is never copied to the lagging safekeeper.

Which safekeeper is the donor is the election's choice: the voter with the most advanced log,
and among equals the last one in the compute's list to be counted. The test makes it
certain: the compute is elected by safekeepers 1 and 2 alone (3 is down), whose logs are
equal after compute_ctl's sync, so the donor is safekeeper 2, and the damage is put there.
"""

from __future__ import annotations

import re

from fixtures.compute import Endpoint, Timeline
from fixtures.logs import unexpected_lines
from fixtures.pagestream import lsn_int
from fixtures.postgres import wait_until

import pytest

SEG_BYTES = 16 << 20
REFUSED = r"failed verification and is not served to the proposer"


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def endpoint(tmp_path, tl, sks, name) -> Endpoint:
    return Endpoint(tmp_path, tl, name, None, safekeepers=sks).start()


def sk_lsn(sk, tl, field="flush_lsn") -> int:
    return lsn_int(sk.timeline(tl.tenant, tl.timeline)[field])


def corruption_count(sk, tl) -> float:
    """`safekeeper_wal_corruption_total` of the timeline (absent until the first)."""
    try:
        return sk.metric("safekeeper_wal_corruption_total", tl.tenant, tl.timeline)
    except KeyError:
        return 0


def segment_path(sk, tl, lsn: int):
    segno = lsn // SEG_BYTES
    return sk.timeline_dir(tl.tenant, tl.timeline) / f"00000001{segno // 0x100:08X}{segno % 0x100:08X}"


def wal_bytes(sk, tl, start: int, end: int) -> bytes:
    """The WAL `[start, end)` as stored in the safekeeper's segment files."""
    out = bytearray()
    at = start
    while at < end:
        upto = min(end, (at // SEG_BYTES + 1) * SEG_BYTES)
        with open(segment_path(sk, tl, at), "rb") as f:
            f.seek(at % SEG_BYTES)
            out += f.read(upto - at)
        at = upto
    return bytes(out)


# Expected: the record the test damages on the donor, refused to the proposer.
@pytest.mark.allowed_errors(r"failed verification and is not served to the proposer")
def test_a_record_damaged_on_the_donor_is_never_copied_to_a_lagging_safekeeper(tmp_path, timeline, safekeepers, pageserver):
    """Safekeeper 3 misses WAL that only safekeepers 1 and 2 have; a byte of a record in it is
    flipped on safekeeper 2 (page headers intact). The next compute, elected by 1 and 2 with 2
    as its donor, catches 3 up through `FetchWal` once 3 is back: safekeeper 2 refuses the
    piece that overlaps the damaged record (one ERROR naming its LSN and segment file,
    counted) and leaves it unanswered; the compute commits on and fetches that piece from
    safekeeper 1, so safekeeper 3 ends up with safekeeper 1's good bytes, never the damaged
    ones. With 2 stopped, a new compute elected by 1 and 3 has every committed row."""
    sk1, sk2, sk3 = safekeepers
    ep = endpoint(tmp_path, timeline, safekeepers, "ep")
    conn = ep.connect()
    conn.execute("CREATE TABLE t (x int, pad text)")
    start = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
    wait_until("every safekeeper to have the table", lambda: all(sk_lsn(sk, timeline) >= lsn_int(start) for sk in safekeepers), timeout_s=60)
    lagging_at = sk_lsn(sk3, timeline)
    sk3.stop()
    # About 3 MB of WAL before the record to damage and 1 MB after it, so that it lies in the
    # middle of several 1 MiB pieces of catch-up.
    rows = "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g"
    conn.execute(rows, (1, 25000))
    before = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
    # A row of 4000 incompressible bytes: toasted, records of about 2 KB.
    conn.execute("INSERT INTO t SELECT -1, string_agg(md5(g::text), '') FROM generate_series(1, 125) g")
    conn.execute(rows, (25001, 33000))
    end = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
    conn.close()
    assert lsn_int(before) - lsn_int(start) > 2 << 20, (start, before)
    wait_until("safekeepers 1 and 2 to have the WAL", lambda: min(sk_lsn(sk1, timeline), sk_lsn(sk2, timeline)) >= lsn_int(end), timeout_s=60)
    wait_until("the pageserver to ingest", lambda: lsn_int(timeline.status()["last_record_lsn"]) >= lsn_int(end), timeout_s=60)
    ep.stop()

    # Flip a byte inside the big row's records on safekeeper 2, away from page headers (the
    # safekeeper's storage checks those itself).
    pos = lsn_int(before) + 1000
    if pos % 8192 < 64:
        pos += 64
    sk2.stop()
    seg = segment_path(sk2, timeline, pos)
    data = bytearray(seg.read_bytes())
    data[pos % SEG_BYTES] ^= 0xFF
    seg.write_bytes(bytes(data))
    sk2.start()

    # Elected by 1 and 2 (3 is down): equal logs after compute_ctl's sync, so 2 is the donor.
    ep2 = endpoint(tmp_path, timeline, safekeepers, "ep2")
    sk3.start()
    wait_until("safekeeper 2 to refuse the damaged record", lambda: corruption_count(sk2, timeline) >= 1, timeout_s=90)
    found = [line for line in sk2.log_text().splitlines() if re.search(REFUSED, line)]
    assert found and all(" ERROR " in line and seg.name in line and timeline.timeline in line for line in found), found
    lsns = {lsn_int(m) for line in found for m in re.findall(r"WAL at ([0-9A-F]+/[0-9A-F]+) in segment file", line)}
    assert len(lsns) == 1, found
    bad = lsns.pop()
    assert lsn_int(before) <= bad <= pos, (before, bad, pos)
    # The compute is not held up: it commits while safekeeper 3 catches up.
    ep2.sql("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(33001, 33100) g")
    # The request left unanswered, the proposer asks another safekeeper at its next tick
    # (quorum's proposer passes over a source that left one unanswered): safekeeper 3
    # catches up from safekeeper 1's good copy, byte for byte, the damaged byte included.
    top = sk_lsn(sk1, timeline, "commit_lsn")
    wait_until("safekeeper 3 to catch up", lambda: sk_lsn(sk3, timeline) >= top, timeout_s=60)
    assert wal_bytes(sk3, timeline, lagging_at, top) == wal_bytes(sk1, timeline, lagging_at, top)
    assert wal_bytes(sk3, timeline, pos, pos + 1) != wal_bytes(sk2, timeline, pos, pos + 1)
    # Found and counted once; requests overlapping it again are refused from memory.
    assert corruption_count(sk2, timeline) == 1
    assert corruption_count(sk1, timeline) == corruption_count(sk3, timeline) == 0
    ep2.stop()

    # With safekeeper 2 away, safekeepers 1 and 3 are a majority: 3 really has the WAL.
    sk2.stop()
    ep3 = endpoint(tmp_path, timeline, safekeepers, "ep3")
    assert ep3.sql("SELECT count(*), sum(length(pad)) FROM t") == [(33101, 33100 * 32 + 4000)]
    ep3.sql("INSERT INTO t VALUES (-2, 'after')")
    assert ep3.sql("SELECT count(*) FROM t")[0][0] == 33102
    ep3.stop()

    assert unexpected_lines(sk2.log_text(), [REFUSED]) == []
    for sk in (sk1, sk3):
        assert unexpected_lines(sk.log_text()) == []
