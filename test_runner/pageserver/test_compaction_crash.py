"""kill -9 of the pageserver in the middle of L0 compaction, at two moments: while the first
L1 layer is being written (a `*.___temp` file in the timeline directory), and after some L1
layers are in place but before the L0 layers they were made from are deleted (both levels
on disk, holding the same versions). After each kill the pageserver restarts on the same
directory; a read-only compute at the LSN of the last commit must see exactly the data it
saw before (pgbench's balances and a checksum of every account row), object storage's
newest index must name only objects that exist, and no leftover file may remain. Then one
compaction runs to the end, and finally a pageserver on an empty work directory, attached
from object storage alone, serves the same data.

Compaction is started through the HTTP API with background jobs off, so the test knows
when it runs; the moment to kill is found by watching the timeline directory, not by
timing, and an attempt whose compaction ended before the moment was seen (a fast
machine) is retried on the next one.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from fixtures.compute import Endpoint, Timeline
from fixtures.logs import unexpected_lines
from fixtures.pageserver import HttpError, Pageserver
from fixtures.pagestream import lsn_int
from fixtures.postgres import wait_until
from fixtures.pgbench import pgbench
from fixtures.remote_index import local_objects, local_reader, newest_index_is_consistent

COMPUTE = {"autovacuum": "off", "checkpoint_timeout": "1h", "max_wal_size": "4GB"}
TINY = {**COMPUTE, "shared_buffers": "128kB"}
L0_PREFIX = "000000000000000000000000000000000000-FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF__"
TEMP_SUFFIX = ".___temp"
# The kill -9s and the compute stopping while the receiver follows it.
# The WAL receiver losing its source when the test stops or kills it.
ALLOWED = [r"could not stream WAL from .*: (the server closed the connection|connect)"]


def config(remote: Path) -> str:
    # 256 KiB L0 layers (about a hundred of them for pgbench at scale 2), L1 layers of 1 MiB
    # (dozens written by one compaction), nothing scheduled by the pageserver itself.
    return f"""
background_jobs_enabled = false
remote_storage = "file://{remote}"
[storage]
checkpoint_distance_bytes = 262144
compaction_target_size_bytes = 1048576
"""


def layer_files(tl_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """(L0 layers, other layers, temporary files) in a timeline directory."""
    names = [p.name for p in tl_dir.iterdir()]
    temp = [n for n in names if n.endswith(TEMP_SUFFIX)]
    layers = [n for n in names if "__" in n and not n.endswith(TEMP_SUFFIX)]
    # An L0 layer is a delta layer (an LSN range) over the whole key space.
    l0 = [n for n in layers if n.startswith(L0_PREFIX) and "-" in n[len(L0_PREFIX):]]
    return l0, [n for n in layers if n not in l0], temp


def snapshot(ep: Endpoint) -> tuple:
    """pgbench's balances (checked to agree with the history) and a checksum of every
    account row."""
    (history, deltas, accounts, tellers, branches, rows, checksum), = ep.sql(
        "SELECT (SELECT count(*) FROM pgbench_history), (SELECT coalesce(sum(delta), 0) FROM pgbench_history), "
        "(SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(tbalance) FROM pgbench_tellers), "
        "(SELECT sum(bbalance) FROM pgbench_branches), (SELECT count(*) FROM pgbench_accounts), "
        "(SELECT sum(hashtext(a::text)::bigint) FROM pgbench_accounts a)"
    )
    assert deltas == accounts == tellers == branches, (deltas, accounts, tellers, branches)
    return history, deltas, rows, checksum


def compact_in_background(ps: Pageserver, tl: Timeline) -> tuple[threading.Thread, list]:
    """POSTs a forced compaction from a thread; its outcome (a response or an error) is
    appended to the returned list."""
    outcome: list = []

    def run():
        try:
            outcome.append(ps.http("POST", f"{tl.path}/compact", {"force_l0": True}))
        except (HttpError, OSError) as e:  # the kill cuts the request
            outcome.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_kill_9_during_compaction_loses_nothing(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    ps = Pageserver(tmp_path, config(remote)).start()
    tl = Timeline(tmp_path, ps)
    tl_dir = ps.workdir / "tenants" / tl.tenant / "timelines" / tl.timeline
    try:
        ep = Endpoint(tmp_path, tl, settings=COMPUTE).start()
        pgbench(ep.port, ep.user, "-i", "-s", "2", "-q")
        pgbench(ep.port, ep.user, "-n", "-c", "2", "-t", "1000")
        flush = ep.sql("SELECT pg_current_wal_flush_lsn()")[0][0]
        wait_until("the pageserver to ingest the last commit",
                   lambda: lsn_int(tl.status()["last_record_lsn"]) >= lsn_int(str(flush)), timeout_s=120)
        lsn = tl.status()["last_record_lsn"]
        want = snapshot(ep)
        ep.stop()
        l0, _, _ = layer_files(tl_dir)
        print(f"{len(l0)} L0 layers before compaction; data at {lsn}: {want}")
        assert len(l0) >= 20

        def check_after_restart(what: str, count: int) -> None:
            wait_until("the pageserver to replay its local WAL", lambda: lsn_int(tl.status()["last_record_lsn"]) >= lsn_int(lsn),
                       timeout_s=120)
            assert layer_files(tl_dir)[2] == [], f"leftover temporary files after {what}"
            reader = Endpoint(tmp_path, tl, f"check{count}", settings=TINY, lsn=lsn).start()
            assert snapshot(reader) == want, f"data changed after {what}"
            reader.stop()

        # The moments, from what is on disk and the L1 layers there before the compaction.
        def first_l1_being_written(l1_before: set[str]) -> bool:
            _, other, temp = layer_files(tl_dir)
            return bool(temp) and set(other) == l1_before

        def both_levels_on_disk(l1_before: set[str]) -> bool:
            l0, other, _ = layer_files(tl_dir)
            return len(set(other) - l1_before) >= 3 and len(l0) > 0

        kills = 0
        for what, moment in [("a kill while the first L1 layer is written", first_l1_being_written),
                             ("a kill with L0 and L1 layers on disk", both_levels_on_disk)]:
            for attempt in range(5):
                l1_before = set(layer_files(tl_dir)[1])
                thread, outcome = compact_in_background(ps, tl)
                seen = False
                while thread.is_alive() and not seen:
                    seen = moment(l1_before)
                    time.sleep(0.001)
                if seen:
                    ps.proc.kill()
                    ps.proc.wait()
                thread.join(timeout=120)
                l0, other, temp = layer_files(tl_dir)
                print(f"{what}, attempt {attempt}: killed={seen}; on disk {len(l0)} L0, {len(other)} other layers, "
                      f"{len(temp)} temporary; outcome {outcome}")
                # The index is written after the layers it names: consistent at any moment.
                newest_index_is_consistent(local_objects(remote), local_reader(remote), tl.tenant)
                if seen:
                    kills += 1
                    ps.start()
                    check_after_restart(what, kills)
                    break
                # Compaction finished before the moment: new L0 layers for the next attempt.
                assert not isinstance(outcome[0], Exception), outcome
                ep.start()
                pgbench(ep.port, ep.user, "-n", "-c", "2", "-t", "300")
                flush = ep.sql("SELECT pg_current_wal_flush_lsn()")[0][0]
                wait_until("the pageserver to ingest the last commit",
                           lambda: lsn_int(tl.status()["last_record_lsn"]) >= lsn_int(str(flush)), timeout_s=120)
                lsn, want = tl.status()["last_record_lsn"], snapshot(ep)
                ep.stop()
            else:
                raise AssertionError(f"five compactions ended before {what} could happen")
        assert kills == 2

        # One compaction to the end: the L0 layers go, the data stays.
        done = ps.http("POST", f"{tl.path}/compact", {"force_l0": True})
        assert done["l0_layers_removed"] > 0, done
        assert layer_files(tl_dir)[0] == []
        check_after_restart("the last compaction", kills + 1)
        ps.stop()
        newest_index_is_consistent(local_objects(remote), local_reader(remote), tl.tenant)
        assert unexpected_lines(ps.log_text(), ALLOWED) == []

        # A pageserver on an empty work directory, from object storage alone.
        shutil.rmtree(ps.workdir / "tenants")
        ps.start()
        assert "attaching tenant from remote storage" in ps.log_text()
        check_after_restart("the attach from object storage", kills + 2)
    finally:
        ps.stop()
