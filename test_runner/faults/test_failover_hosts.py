"""Pageserver failover the way it runs: every service on its own host (a network namespace
with its own address, `fixtures/netns.py`), reached only through the addresses it
advertises. Two pageservers joined to the storage controller, three safekeepers, a compute
started with `compute_ctl --controller`; object storage is a directory both pageservers
reach (a shared filesystem); the controller's database listens on a Unix socket on the
controller's host.

- Under pgbench read-write, every process of the attached pageserver's host is killed
  (SIGKILL): the controller fails the tenant over to its secondary, which attaches and
  follows the safekeepers; the compute moves without a restart. No acknowledged commit is
  lost and pgbench's balances hold. The time from the kill to the first read of a page that
  is not in the compute's caches is printed (`scripts/bench-failover` measures it with the
  default timings).
- Split brain: the attached pageserver is cut off from everyone (a partition, not a
  kill). After the failover the cut heals: the old pageserver is ordered to let the tenant
  go, writes nothing under its old generation and deletes nothing the new one wrote, and
  the compute never reads from it again.
- A planned migration under pgbench read-write: no transaction fails, the compute moves
  to the destination's host without a restart, and the source becomes the secondary.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from fixtures import logs
from fixtures.compute import Endpoint, Timeline, kill_all
from fixtures.controller import Controller
from fixtures.netns import Host, Network
from fixtures.pageserver import Pageserver
from fixtures.paths import pg_bin_dir
from fixtures.postgres import PgServer, wait_until
from fixtures.safekeeper import Safekeeper

# Small caches: a scan of pgbench_accounts reads its pages from the pageserver.
SMALL = {"shared_buffers": "1MB", "fjord.file_cache_size": "1MB"}


def kill_host(host: Host) -> int:
    """SIGKILL to every process in `host`'s network namespace but the one that holds it:
    the host is gone as far as its services go. Returns how many were killed."""
    ns = os.readlink(f"/proc/{host.pid}/ns/net")
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == host.pid:
            continue
        try:
            if os.readlink(entry / "ns" / "net") == ns:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


class HostCluster:
    def __init__(self, tmp_path: Path, net: Network):
        self.tmp_path = tmp_path
        self.net = net
        self.remote = tmp_path / "remote"
        self.remote.mkdir()
        self.db = PgServer(tmp_path, "controller-db").initdb().start()
        # The controller's sessions end when the test tears the cluster down.
        self.db.allowed_errors.append("connection to client lost")
        controller_host = net.host("controller")
        # The database is on the controller's host: its Unix socket.
        dsn = f"host={self.db.datadir.parent} port={self.db.port} user={self.db.user} dbname=postgres"
        self.controller = Controller(tmp_path, "a", dsn, **controller_host.service_kw()).start()
        self.controller_host = controller_host
        self.ps_hosts = {i: net.host(f"ps{i}") for i in (1, 2)}
        self.ps: dict[int, Pageserver] = {}
        for i, h in self.ps_hosts.items():
            config = (f'remote_storage = "file://{self.remote}"\n'
                      f'controller_url = "https://{self.controller.addr}"\nnode_id = {i}\n')
            ps = Pageserver(tmp_path / f"ps{i}", config=config, **h.service_kw())
            ps.service_name = f"pageserver {i}"
            self.ps[i] = ps.start()
        self.sk_hosts = [net.host(f"sk{i}") for i in (1, 2, 3)]
        self.sks = [Safekeeper(tmp_path / "safekeepers", i, **h.service_kw()).start() for i, h in enumerate(self.sk_hosts, start=1)]
        self.compute_host = net.host("compute")
        wait_until("both pageservers online", lambda: sorted(
            n["node_id"] for n in self.controller.http("GET", "/v1/node") if n["availability"] == "online") == [1, 2], timeout_s=30)
        self.tenant = uuid.uuid4().hex
        where = self.controller.http("POST", "/v1/tenant", {"tenant_id": self.tenant})
        self.first, self.second = where["attached"]["node_id"], where["secondary"]["node_id"]
        wait_until("the attach", lambda: any(t["tenant_id"] == self.tenant and t["mode"] == "attached"
                                             for t in self.ps[self.first].http("GET", "/v1/location")["tenants"]))
        self.tl = Timeline(tmp_path, self.ps[self.first], tenant=self.tenant, create_tenant=False)

    def placement(self) -> dict:
        return self.controller.http("GET", f"/v1/tenant/{self.tenant}")

    def endpoint(self) -> Endpoint:
        ep = Endpoint(self.tmp_path, self.tl, settings=SMALL, safekeepers=self.sks, controller=self.controller,
                      **self.compute_host.compute_kw()).start()
        ep.allowed_errors += [r"could not (connect|receive|send)", "reconnecting", "the page service at"]
        return ep

    def close(self):
        kill_all()
        for sk in self.sks:
            sk.kill()
        for ps in self.ps.values():
            ps.kill()
        # Stopped, not killed: it ends its database sessions (and gives the lease up).
        self.controller.stop()


@pytest.fixture
def hosts(tmp_path):
    net = Network(tmp_path).start()
    cl = None
    try:
        cl = HostCluster(tmp_path, net)
        yield cl
    finally:
        if cl is not None:
            cl.close()
        else:
            kill_all()
        net.close()


def pgbench(ep: Endpoint, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(pg_bin_dir() / "pgbench"), "-h", str(ep.pgdata.absolute()), "-p", str(ep.port),
                           "-U", getpass.getuser(), *args, "postgres"], capture_output=True, text=True, timeout=timeout)


def pgbench_running(ep: Endpoint, seconds: int) -> subprocess.Popen:
    """pgbench read-write with 4 clients for `seconds`, in the background."""
    return subprocess.Popen([str(pg_bin_dir() / "pgbench"), "-h", str(ep.pgdata.absolute()), "-p", str(ep.port),
                             "-U", getpass.getuser(), "-c", "4", "-T", str(seconds), "-n", "postgres"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def balances_hold(ep: Endpoint) -> None:
    sums = ep.sql("SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),"
                  " (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)")[0]
    assert len(set(sums)) == 1, f"balances differ: accounts, branches, tellers, history = {sums}"


def first_read_after(ep: Endpoint, since: float) -> float:
    """Scans pgbench_accounts (pages not in the small caches) until a scan succeeds; the
    seconds from `since` to that success."""
    while True:
        try:
            with ep.connect(connect_timeout=30) as conn:
                conn.execute("SELECT sum(abalance) FROM pgbench_accounts").fetchone()
            return time.monotonic() - since
        except Exception:  # noqa: BLE001 - retried: the measure is until the first success
            time.sleep(0.05)


def test_a_killed_pageserver_host_fails_over_under_pgbench(hosts):
    cl = hosts
    cl.controller.allowed_errors += [f"pageserver {cl.first} is offline"]
    old = cl.ps[cl.first]
    old.allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    ep = cl.endpoint()
    r = pgbench(ep, "-i", "-s", "1", "-q")
    assert r.returncode == 0, r.stderr
    postmaster = ep.postmaster_pid()
    # pgbench for 20 s; its transactions count only if acknowledged (it reports failures).
    bench = pgbench_running(ep, 20)
    time.sleep(5)
    old.proc.expect_exit(-signal.SIGKILL)  # with everything else on its host
    killed_at = time.monotonic()
    assert kill_host(cl.ps_hosts[cl.first]) >= 1
    took = first_read_after(ep, killed_at)
    out, err = bench.communicate(timeout=600)
    assert bench.returncode == 0, f"pgbench failed:\n{out}\n{err}"
    assert "number of failed transactions: 0" in out or "failed" not in out, out
    assert cl.placement()["attached"]["node_id"] == cl.second
    assert ep.postmaster_pid() == postmaster, "the compute restarted"
    balances_hold(ep)
    print(f"hosts: first read of an uncached page {took:.2f} s after the pageserver host was killed")


def test_a_cut_off_pageserver_never_serves_or_writes_again(hosts):
    cl = hosts
    cl.controller.allowed_errors += [f"pageserver {cl.first} is offline"]
    old = cl.ps[cl.first]
    old.allowed_errors += [*logs.CLIENT_GONE_MID_HANDSHAKE, *logs.WAL_SOURCE_WENT_AWAY, "is active in another attachment",
                           "could not", "timed out", "failed"]
    ep = cl.endpoint()
    assert pgbench(ep, "-i", "-s", "1", "-q").returncode == 0
    r = pgbench(ep, "-c", "2", "-t", "200", "-n")
    assert r.returncode == 0, r.stderr
    old_host = cl.ps_hosts[cl.first]
    for h in [cl.ps_hosts[cl.second], cl.compute_host, cl.controller_host, *cl.sk_hosts]:
        cl.net.cut(old_host, h)
    wait_until("the failover", lambda: cl.placement()["attached"]["node_id"] == cl.second, timeout_s=60)
    r = pgbench(ep, "-c", "2", "-t", "200", "-n")
    assert r.returncode == 0, r.stderr
    objects = cl.remote / "tenants" / cl.tenant / "timelines" / cl.tl.timeline
    before = {p.name: p.stat().st_mtime_ns for p in objects.iterdir()}
    served_before = old.metrics().get("pageserver_getpage_seconds_count", 0)
    cl.net.heal_all()
    wait_until("the old pageserver to let the tenant go",
               lambda: "no longer served here" in old.log_text(), timeout_s=60)
    r = pgbench(ep, "-c", "2", "-t", "200", "-n")
    assert r.returncode == 0, r.stderr
    after = {p.name: p.stat().st_mtime_ns for p in objects.iterdir()}
    # Every layer the new generation's index names is there: the old one deleted nothing of
    # it. The old one wrote no index after it came back (layer uploads it had queued may
    # land under its own generation's keys: objects no index names, which overwrite nothing).
    generation = cl.placement()["generation"]
    index = json.loads((objects / f"index_part.json-{generation:08x}").read_text())["index"]
    missing = [n for n, layer in index["layers"].items() if not (objects / f"{n}-{layer['generation']:08x}").exists()]
    assert not missing, f"layers the new generation's index names are gone: {missing}"
    old_indexes = {(o, m) for o, m in after.items() if o.startswith("index_part.json-00000001")}
    assert old_indexes <= set(before.items()), "the old generation uploaded an index after the failover"
    balances_hold(ep)
    # The compute moved for good: the old pageserver served no page since the heal.
    assert old.metrics().get("pageserver_getpage_seconds_count", 0) == served_before


def test_a_planned_migration_between_hosts_fails_no_transaction(hosts):
    """`POST /v1/tenant/{id}/migrate` under pgbench read-write, each service on its own host:
    the destination host attaches and catches up while the source serves, the compute moves
    at the cutover, the source becomes the secondary; no transaction fails, no restart."""
    cl = hosts
    ep = cl.endpoint()
    r = pgbench(ep, "-i", "-s", "1", "-q")
    assert r.returncode == 0, r.stderr
    postmaster = ep.postmaster_pid()
    bench = pgbench_running(ep, 15)
    time.sleep(3)
    started = cl.controller.http("POST", f"/v1/tenant/{cl.tenant}/migrate", {"node_id": cl.second})
    assert started["generation"] == 2 and started["migration"]["from"]["node_id"] == cl.first, started
    wait_until("the migration to end", lambda: (lambda p: p.get("migration") is None and p["attached"]["node_id"] == cl.second
                                                 and (p.get("secondary") or {}).get("node_id") == cl.first)(cl.placement()),
               timeout_s=60)
    out, err = bench.communicate(timeout=600)
    assert bench.returncode == 0 and "aborted" not in err, f"pgbench failed:\n{out}\n{err}"
    assert "number of failed transactions: 0" in out, out
    assert ep.postmaster_pid() == postmaster, "the compute restarted"
    assert f"-> {cl.ps[cl.second].host}:" in ep.logfile.read_text(), "the compute did not move to the destination's host"
    balances_hold(ep)
