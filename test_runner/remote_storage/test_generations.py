"""Two attachments of one tenant, with real processes: pageservers sharing a `file://` object
storage, three safekeepers, a compute.

Each attach of a tenant claims the next *generation* in object storage. The safekeepers
remove WAL below the pageserver's remote-consistent LSN, so who may move it decides what WAL
survives:
- a superseded attachment (an older generation, still running) must not move it: the WAL
  the newest attachment still needs stays;
- a claim that never became active (its process died right after claiming) must not wedge
  the live attachment: its uploads, and the safekeepers' removal, go on.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.pagestream import lsn_int
from fixtures.pageserver import Pageserver
from fixtures.postgres import wait_until

SEGMENT = 16 << 20


@pytest.fixture
def remote_dir(tmp_path: Path) -> Path:
    d = tmp_path / "remote_storage"
    d.mkdir()
    return d


def start_pageserver(base: Path, remote_dir: Path) -> Pageserver:
    return Pageserver(base, config=f'remote_storage = "file://{remote_dir}"\n').start()


def timeline_status(ps: Pageserver, tl: Timeline) -> dict:
    return ps.http("GET", tl.path)


def write_wal(ep: Endpoint, first_id: int, rows: int) -> int:
    """Inserts `rows` rows of about 1 kB and returns the flushed WAL end."""
    ep.sql("INSERT INTO t SELECT g, repeat(md5(g::text), 30) FROM generate_series(%s::int, %s::int) g",
           first_id, first_id + rows - 1)
    return lsn_int(ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])


def follow(ps: Pageserver, tl: Timeline, sks) -> None:
    """Points `ps`'s WAL receiver at the safekeepers (what compute_ctl does at a start)."""
    ps.http("POST", f"{tl.path}/wal_receiver",
            {"sources": [{"host": "127.0.0.1", "port": sk.port, "user": "fjord"} for sk in sks]})


def uploaded_to(ps: Pageserver, tl: Timeline, end: int, timeout_s: float = 60) -> int:
    """Waits until `ps` ingested WAL up to `end` and uploaded it; its remote-consistent LSN."""
    def done():
        st = timeline_status(ps, tl)
        r = lsn_int(st["remote_storage"]["remote_consistent_lsn"])
        return lsn_int(st["last_record_lsn"]) >= end and r >= lsn_int(st["disk_consistent_lsn"]) > 0 and r
    return wait_until(f"the pageserver to ingest and upload up to {end:X}", done, timeout_s=timeout_s)


def sk_status(sk, tl: Timeline) -> dict:
    return sk.timeline(tl.tenant, tl.timeline)


# Expected: the superseded attachment the test makes.
@pytest.mark.allowed_errors(r"generation \d+ of this tenant is active in another attachment; this one \(\d+\) stops uploading", r"remote storage operation failed, retrying: superseded by generation", r"uploads not finished at shutdown")
def test_a_superseded_attachment_does_not_move_the_removal_horizon(tmp_path, remote_dir, safekeepers):
    ps1 = start_pageserver(tmp_path / "ps1", remote_dir)
    ps2 = None
    try:
        tl = Timeline(tmp_path, ps1)
        ep = Endpoint(tmp_path, tl, "ep", safekeepers=safekeepers).start()
        ep.sql("CREATE TABLE t (id int, pad text)")
        end = write_wal(ep, 1, 5_000)
        uploaded_to(ps1, tl, end)
        assert timeline_status(ps1, tl)["remote_storage"]["generation"] == 1

        # A second pageserver attaches the tenant (generation 2) and follows the same
        # safekeepers: the newest attachment.
        ps2 = start_pageserver(tmp_path / "ps2", remote_dir)
        assert timeline_status(ps2, tl)["remote_storage"]["generation"] == 2
        follow(ps2, tl, safekeepers)
        end = write_wal(ep, 5_001, 2_000)
        mine = uploaded_to(ps2, tl, end)
        # Once the safekeepers heard generation 2's position (a safekeeper that does not
        # know generations shows none), ps2 pauses: it still needs the WAL after `mine`.
        wait_until("every safekeeper to take generation 2's position",
                   lambda: all(sk_status(sk, tl).get("remote_consistent_generation", 2) == 2
                               and lsn_int(sk_status(sk, tl)["remote_consistent_lsn"]) >= mine for sk in safekeepers))
        os.kill(ps2.proc.pid, signal.SIGSTOP)
        try:
            # The compute writes on; ps1, superseded but running, ingests and flushes it.
            next_id = 7_001
            for _ in range(4):
                end = write_wal(ep, next_id, 15_000)
                next_id += 15_000
            assert end >= mine + 3 * SEGMENT
            wait_until("ps1 to ingest and flush everything", lambda: lsn_int(timeline_status(ps1, tl)["disk_consistent_lsn"]) >= end,
                       timeout_s=60)
            # Removal runs about once a second: give it a few rounds.
            time.sleep(3)
            for sk in safekeepers:
                st = sk_status(sk, tl)
                assert lsn_int(st["wal_begin_lsn"]) <= mine, (
                    f"safekeeper {sk.id} removed WAL the newest attachment needs (it resumes at {mine:X}) "
                    f"on the word of a superseded one: {st}")
            # ps1 found out that it is superseded and stopped publishing.
            st1 = timeline_status(ps1, tl)["remote_storage"]
            assert st1["superseded_by"] == 2, st1
            assert lsn_int(st1["remote_consistent_lsn"]) < end, st1
        finally:
            os.kill(ps2.proc.pid, signal.SIGCONT)
        # ps2 resumes and catches up: nothing it needed is gone.
        uploaded_to(ps2, tl, end, timeout_s=120)
        assert "has been removed" not in ps2.log_text()
        assert ep.sql("SELECT count(*) FROM t")[0][0] == next_id - 1
        ep.stop()
    finally:
        if ps2 is not None:
            ps2.stop()
        ps1.stop()


# Expected: the claim the test makes and abandons.
@pytest.mark.allowed_errors(r"generation \d+ of this tenant was claimed by another attachment that is not active yet",
                            r"generation \d+ stayed inactive for \d+s: taken for dead")
def test_a_claim_that_never_became_active_does_not_wedge_the_live_attachment(tmp_path, remote_dir, safekeepers):
    ps = start_pageserver(tmp_path / "ps1", remote_dir)
    try:
        tl = Timeline(tmp_path, ps)
        ep = Endpoint(tmp_path, tl, "ep", safekeepers=safekeepers).start()
        ep.sql("CREATE TABLE t (id int, pad text)")
        end = write_wal(ep, 1, 5_000)
        uploaded_to(ps, tl, end)
        # What a pageserver that claimed generation 2 and was killed at once leaves behind:
        # its claim, and nothing else (no index of its own).
        claim = remote_dir / "tenants" / tl.tenant / "generations" / "00000002"
        assert not claim.exists() and (claim.parent / "00000001").exists()
        claim.write_text(json.dumps({"pid": 4_000_000, "claimed_at_unix_s": int(time.time())}) + "\n")

        # The live pageserver goes on: new layers, L0 compaction (whose deletions a
        # superseded attachment must not make), uploads.
        next_id = 5_001
        for _ in range(3):
            end = write_wal(ep, next_id, 15_000)
            next_id += 15_000
            wait_until("the pageserver to ingest", lambda: lsn_int(timeline_status(ps, tl)["last_record_lsn"]) >= end, timeout_s=60)
            ps.http("POST", f"{tl.path}/checkpoint")
        ps.http("POST", f"{tl.path}/compact", {"force_l0": True})
        end = write_wal(ep, next_id, 15_000)
        next_id += 15_000
        mine = uploaded_to(ps, tl, end, timeout_s=90)
        st = timeline_status(ps, tl)["remote_storage"]
        assert st["superseded_by"] is None, st
        # It took the dead claim for dead and went on as generation 3, deletions included.
        st = wait_until("the deletions held back to run", lambda: (s := timeline_status(ps, tl)["remote_storage"])["objects_deleted"] > 0 and s,
                        timeout_s=30)
        assert st["generation"] == 3, st
        assert "taken for dead, this attachment goes on as generation 00000003" in ps.log_text()
        # The safekeepers take its position and remove the WAL below it.
        wait_until("the safekeepers to take the live attachment's position",
                   lambda: all(lsn_int(sk_status(sk, tl)["remote_consistent_lsn"]) >= mine for sk in safekeepers), timeout_s=60)
        wait_until("the safekeepers to remove WAL below it",
                   lambda: all(lsn_int(sk_status(sk, tl)["wal_begin_lsn"]) >= mine - SEGMENT for sk in safekeepers), timeout_s=60)
        assert ep.sql("SELECT count(*) FROM t")[0][0] == next_id - 1
        ep.stop()
    finally:
        ps.stop()
