"""Planned migration (`POST /v1/tenant/{id}/migrate`): a tenant moves between two live
pageservers while pgbench runs read-write against a compute with tiny caches (so its reads
go to the pageserver all along): the destination attaches with a raised generation and
catches up while the source keeps serving, computes are told the destination only then, and
the source becomes the secondary. No pgbench transaction fails, the compute never restarts,
and the balances hold. A destination that dies mid-way sends the tenant back to its source."""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.error

import pytest

from fixtures import logs
from fixtures.compute import Endpoint
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until

from controller.test_pageserver_failover import Cluster, attached_with, claims, held, placement

SMALL_CACHES = {"shared_buffers": "128kB", "fjord.file_cache_size": "1MB"}


def migrate(c, tenant: str, node: int) -> dict:
    return c.http("POST", f"/v1/tenant/{tenant}/migrate", {"node_id": node})


def migrated(c, tenant: str, to: int, source: int) -> bool:
    p = placement(c, tenant)
    return p.get("migration") is None and p["attached"]["node_id"] == to and (p.get("secondary") or {}).get("node_id") == source


class Pgbench:
    """pgbench read-write, run again and again (5 s each) until stopped; every run's exit
    status and output kept: a failed transaction aborts its client and fails the run."""

    def __init__(self, ep: Endpoint):
        self.ep = ep
        self.runs: list[subprocess.CompletedProcess] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self.stop.is_set():
            self.runs.append(subprocess.run(
                [str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(self.ep.port), "-U", self.ep.user,
                 "-c", "4", "-j", "2", "-T", "5", "-n", "postgres"], capture_output=True, text=True))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=60)

    def transactions(self) -> int:
        total = 0
        for r in self.runs:
            for line in r.stdout.splitlines():
                if line.startswith("number of transactions actually processed:"):
                    total += int(line.split(":")[1].split("/")[0])
        return total

    def failures(self) -> list[str]:
        return [f"rc={r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}" for r in self.runs
                if r.returncode != 0 or "aborted" in r.stderr or "number of failed transactions: 0" not in r.stdout]


def test_a_planned_migration_under_pgbench_fails_no_transaction(tmp_path, pg_factory, safekeepers):
    cl = Cluster(tmp_path, pg_factory, safekeepers, cutover_grace_ms=1000)
    c = cl.controller
    a, b = cl.first, cl.second
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers, controller=c, settings=SMALL_CACHES).start()
    postmaster = ep.postmaster_pid()
    r = subprocess.run([str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user, "-i", "-s", "2",
                        "-q", "postgres"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    # Orders that do not fit change nothing.
    for body, code in [({"node_id": 99}, 409), ({"node_id": b, "x": 1}, 400), ({}, 400)]:
        with pytest.raises(urllib.error.HTTPError) as e:
            c.http("POST", f"/v1/tenant/{cl.tenant}/migrate", body)
        assert e.value.code == code, (body, e.value.read())
    with pytest.raises(urllib.error.HTTPError) as e:
        migrate(c, "0" * 32, b)
    assert e.value.code == 404
    assert migrate(c, cl.tenant, a)["generation"] == 1, "a tenant already there stays as it is"

    with Pgbench(ep) as load:
        time.sleep(2)
        started = migrate(c, cl.tenant, b)
        assert started["attached"]["node_id"] == b and started["generation"] == 2, started
        assert started["migration"]["from"]["node_id"] == a and started["migration"]["cut_over"] is False, started
        with pytest.raises(urllib.error.HTTPError) as e:
            migrate(c, cl.tenant, a)
        assert e.value.code == 409 and b"migrating" in e.value.read()
        wait_until("the migration to b to end", lambda: migrated(c, cl.tenant, b, a), timeout_s=60)
        wait_until("the source to hold the tenant as secondary", lambda: held(cl.ps[a]).get(cl.tenant, {}).get("mode") == "secondary",
                   timeout_s=30)
        assert attached_with(cl.ps[b], cl.tenant, 2)
        # And back, the other way, under the same load.
        assert migrate(c, cl.tenant, a)["generation"] == 3
        wait_until("the migration back to a to end", lambda: migrated(c, cl.tenant, a, b), timeout_s=60)
        runs_before = len(load.runs)
        wait_until("one more pgbench run after the moves", lambda: len(load.runs) > runs_before, timeout_s=30)

    assert load.failures() == [], load.failures()
    assert load.transactions() > 0
    assert ep.postmaster_pid() == postmaster, "the compute restarted"
    log = ep.logfile.read_text()
    page = {n["node_id"]: n["page_addr"] for n in c.http("GET", "/v1/node")}
    assert f"-> {page[b]}" in log and f"-> {page[a]}" in log, "the compute did not follow both moves"
    # Each attachment's claim names its node; the balances hold after every move.
    got = claims(cl.remote, cl.tenant)
    assert sorted(got) == [1, 2, 3] and got[2]["node_id"] == b and got[3]["node_id"] == a, got
    sums = ep.sql("SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),"
                  " (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT count(*) FROM pgbench_history)")[0]
    assert sums[0] == sums[1] == sums[2] and sums[3] == load.transactions(), sums
    text = c.log_text()
    assert text.count("cut over (it has caught up)") == 2 and text.count("holds it as its secondary") == 2, text[-3000:]


def test_a_migration_whose_destination_dies_goes_back_to_its_source(tmp_path, pg_factory, safekeepers):
    # A long grace keeps the migration open after its cutover, whenever the kill lands.
    cl = Cluster(tmp_path, pg_factory, safekeepers, cutover_grace_ms=60_000)
    c = cl.controller
    a, b = cl.first, cl.second
    c.allowed_errors += [f"pageserver {b} is offline"]
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers, controller=c, settings=SMALL_CACHES).start()
    ep.allowed_errors += [r"could not (connect|receive|send)", "reconnecting", "the page service at"]
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    ep.sql("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
    assert migrate(c, cl.tenant, b)["generation"] == 2
    wait_until("the destination to attach", lambda: attached_with(cl.ps[b], cl.tenant, 2), timeout_s=60)
    cl.ps[b].allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    cl.ps[b].kill()
    wait_until("the tenant to go back to its source", lambda: placement(c, cl.tenant)["attached"]["node_id"] == a, timeout_s=30)
    back = placement(c, cl.tenant)
    assert back["generation"] == 3 and back.get("migration") is None, back
    wait_until("the source to hold generation 3", lambda: attached_with(cl.ps[a], cl.tenant, 3), timeout_s=60)
    ep.sql("INSERT INTO t VALUES (5001, 'after')")
    assert ep.sql("SELECT count(*), max(id) FROM t") == [(5001, 5001)]


def test_a_migration_whose_destination_never_attaches_goes_back_to_its_source(tmp_path, pg_factory, safekeepers):
    """Object storage refuses writes, so the destination cannot claim its generation and
    never attaches; the migration is abandoned after its timeout and the tenant goes back to
    its source, one generation up, which attaches it once object storage takes writes again.
    Computes never left the source."""
    cl = Cluster(tmp_path, pg_factory, safekeepers, migration_timeout_ms=3000)
    c = cl.controller
    a, b = cl.first, cl.second
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers, controller=c, settings=SMALL_CACHES).start()
    ep.sql("CREATE TABLE t AS SELECT i FROM generate_series(1, 5000) i")

    def writable(yes: bool):
        for d in [cl.remote, *cl.remote.rglob("*")]:
            if d.is_dir():
                d.chmod(0o755 if yes else 0o555)
    for ps in cl.ps.values():
        ps.allowed_errors += [r"upload of \S+ failed", r"failed \(attempt \d+\)", "Permission denied", "could not publish the heatmap"]
    c.allowed_errors += ["ordering pageserver", "did not cut over within"]
    writable(False)
    try:
        assert migrate(c, cl.tenant, b)["generation"] == 2
        wait_until("the migration to be abandoned", lambda: "did not cut over within" in c.log_text(), timeout_s=60)
        back = placement(c, cl.tenant)
        assert back["attached"]["node_id"] == a and back["generation"] == 3 and back.get("migration") is None, back
    finally:
        writable(True)
    wait_until("the source to attach with generation 3", lambda: attached_with(cl.ps[a], cl.tenant, 3), timeout_s=60)
    assert ep.sql("SELECT count(*) FROM t") == [(5000,)]
    ep.sql("INSERT INTO t VALUES (5001)")
    assert ep.sql("SELECT count(*) FROM t") == [(5001,)]
    assert held(cl.ps[b]).get(cl.tenant, {}).get("mode") != "attached"
