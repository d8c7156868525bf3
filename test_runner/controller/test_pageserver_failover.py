"""Pageservers that act on the storage controller: they join it at start, attach only what it
places on them with the generations it issues, and take its orders. A tenant's attached
pageserver dies: the controller moves the tenant to its secondary with a raised generation,
the secondary loads it from remote storage and follows the safekeepers its remote index
names, and nothing committed is lost. A pageserver cut off rather than killed comes back
after the failover: it is ordered to detach and writes nothing under its old generation."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import uuid
from pathlib import Path

import pytest

from fixtures import logs
from fixtures.compute import Endpoint, Timeline
from fixtures.controller import Controller
from fixtures.pageserver import HttpError, Pageserver
from fixtures.postgres import wait_until


def controlled_pageserver(base_dir: Path, node_id: int, controller: Controller, remote: Path, extra: str = "") -> Pageserver:
    config = "\n".join([
        f'remote_storage = "file://{remote}"',
        f'controller_url = "https://{controller.addr}"',
        f"node_id = {node_id}",
    ]) + "\n" + extra
    ps = Pageserver(base_dir / f"ps{node_id}", config=config)
    ps.service_name = f"pageserver {node_id}"
    return ps


def held(ps: Pageserver) -> dict[str, dict]:
    """What the pageserver says it holds: tenant id -> {mode, generation}."""
    return {t["tenant_id"]: t for t in ps.http("GET", "/v1/location")["tenants"]}


def attached_with(ps: Pageserver, tenant: str, generation: int) -> bool:
    t = held(ps).get(tenant)
    return t is not None and t["mode"] == "attached" and t["generation"] == generation


def placement(c: Controller, tenant: str) -> dict:
    return c.http("GET", f"/v1/tenant/{tenant}")


def claims(remote: Path, tenant: str) -> dict[int, dict]:
    """The generation claims remote storage holds for `tenant`: number -> note."""
    d = remote / "tenants" / tenant / "generations"
    return {int(p.name, 16): json.loads(p.read_text()) for p in d.iterdir()} if d.exists() else {}


class Cluster:
    """A controller (its database a plain PostgreSQL), two pageservers joined to it sharing
    one remote storage, three safekeepers, and a tenant placed by the controller with a
    timeline bootstrapped on its attached pageserver."""

    def __init__(self, tmp_path: Path, pg_factory, safekeepers, ps_config: str = "", **controller_args):
        self.db = db = pg_factory("controller-db").initdb().start()
        self.controller = Controller(tmp_path, "a", db.conninfo, **controller_args).start()
        self.remote = tmp_path / "remote"
        self.remote.mkdir()
        self.ps = {i: controlled_pageserver(tmp_path, i, self.controller, self.remote, ps_config).start() for i in (1, 2)}
        self.safekeepers = safekeepers
        wait_until("both pageservers online", lambda: sorted(
            n["node_id"] for n in self.controller.http("GET", "/v1/node") if n["availability"] == "online") == [1, 2])
        self.tenant = uuid.uuid4().hex
        where = self.controller.http("POST", "/v1/tenant", {"tenant_id": self.tenant})
        assert where["generation"] == 1 and where["secondary"] is not None, where
        self.first = where["attached"]["node_id"]
        self.second = where["secondary"]["node_id"]
        wait_until("the controller's order to attach", lambda: attached_with(self.ps[self.first], self.tenant, 1))
        wait_until("the secondary's order", lambda: held(self.ps[self.second]).get(self.tenant, {}).get("mode") == "secondary")
        self.tl = Timeline(tmp_path, self.ps[self.first], tenant=self.tenant, create_tenant=False)


def commit_rows(ep: Endpoint, first: int, count: int) -> str:
    """Inserts rows first..first+count-1, one transaction each; the LSN after the last."""
    with ep.connect() as conn:
        for i in range(first, first + count):
            conn.execute("INSERT INTO t VALUES (%s, repeat('x', 200))", (i,))
        return conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]


def lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def test_a_dead_pageservers_tenant_fails_over_to_its_secondary(tmp_path, pg_factory, safekeepers):
    cl = Cluster(tmp_path, pg_factory, safekeepers)
    c = cl.controller
    c.allowed_errors += [f"pageserver {cl.first} is offline"]
    ps1, ps2 = cl.ps[cl.first], cl.ps[cl.second]
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers).start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    last = commit_rows(ep, 1, 200)
    # The safekeepers are recorded in the timeline's remote index: the next attachment
    # follows them from there.
    wait_until("the remote index to name the safekeepers", lambda: any(
        "wal_sources" in p.read_text() for p in (cl.remote / "tenants" / cl.tenant / "timelines" / cl.tl.timeline).glob("index_part.json-*")
        if "#" not in p.name))  # (`#`: an object the local store is still writing)

    ps1.kill()
    killed = time.monotonic()
    ps1.allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    wait_until("the failover", lambda: placement(c, cl.tenant)["attached"]["node_id"] == cl.second, timeout_s=30)
    moved = placement(c, cl.tenant)
    assert moved["generation"] == 2, moved
    wait_until("the secondary to attach with generation 2", lambda: attached_with(ps2, cl.tenant, 2), timeout_s=30)
    took = time.monotonic() - killed
    # It follows the safekeepers on its own (from the remote index) and has every commit.
    cl.tl.ps = ps2
    wait_until("the new attachment to ingest the last commit",
               lambda: lsn(cl.tl.status()["last_record_lsn"]) >= lsn(last), timeout_s=60)
    assert claims(cl.remote, cl.tenant)[2]["node_id"] == cl.second
    ep.kill()
    ep2 = Endpoint(tmp_path, cl.tl, name="ep2", safekeepers=cl.safekeepers).start()
    assert ep2.sql("SELECT count(*), min(id), max(id) FROM t") == [(200, 1, 200)]
    commit_rows(ep2, 201, 10)
    assert ep2.sql("SELECT count(*) FROM t") == [(210,)]
    print(f"failover: the secondary attached {took:.2f} s after the kill")


def test_a_cut_off_pageserver_comes_back_detached_and_writes_nothing(tmp_path, pg_factory, safekeepers):
    cl = Cluster(tmp_path, pg_factory, safekeepers)
    c = cl.controller
    c.allowed_errors += [f"pageserver {cl.first} is offline"]
    ps1, ps2 = cl.ps[cl.first], cl.ps[cl.second]
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers).start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    commit_rows(ep, 1, 100)

    ps1.pause()
    wait_until("the failover", lambda: placement(c, cl.tenant)["attached"]["node_id"] == cl.second, timeout_s=30)
    wait_until("the secondary to attach with generation 2", lambda: attached_with(ps2, cl.tenant, 2), timeout_s=30)
    cl.tl.ps = ps2
    ep.kill()
    ep2 = Endpoint(tmp_path, cl.tl, name="ep2", safekeepers=cl.safekeepers).start()
    last = commit_rows(ep2, 101, 100)
    objects = cl.remote / "tenants" / cl.tenant / "timelines" / cl.tl.timeline
    before = {p.name: p.stat().st_mtime_ns for p in objects.iterdir()}

    # The old one comes back: the controller's heartbeat finds it holding the tenant under
    # generation 1 and orders it to detach. Heartbeats that gave up while it was stopped
    # left their connections half way through the handshake.
    ps1.allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    ps1.resume()
    wait_until("the old attachment to be detached", lambda: "no longer served here" in ps1.log_text(), timeout_s=30)
    # (It may hold the tenant as its new secondary by now: it is online again.)
    assert held(ps1).get(cl.tenant, {}).get("mode") != "attached"
    # Nothing generation 2 wrote is gone, and generation 1 wrote nothing after it came back.
    after = {p.name: p.stat().st_mtime_ns for p in objects.iterdir()}
    assert {o for o in before if o.endswith("-00000002")} <= set(after)
    assert {(o, m) for o, m in after.items() if o.startswith("index_part.json-00000001")} <= set(before.items())
    assert ep2.sql("SELECT count(*) FROM t") == [(200,)]
    wait_until("generation 2 to ingest the last commit", lambda: lsn(cl.tl.status()["last_record_lsn"]) >= lsn(last))


def test_a_restarted_pageserver_rejoins_with_raised_generations(tmp_path, pg_factory, safekeepers):
    cl = Cluster(tmp_path, pg_factory, safekeepers)
    ps1 = cl.ps[cl.first]
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers).start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    commit_rows(ep, 1, 50)
    ps1.stop()
    ps1.start()
    # Re-attach raised the generation; nothing failed over (a restart is quicker than the
    # offline grace).
    wait_until("the re-attach", lambda: attached_with(ps1, cl.tenant, 2), timeout_s=30)
    assert placement(cl.controller, cl.tenant)["attached"]["node_id"] == cl.first
    assert sorted(claims(cl.remote, cl.tenant)) == [1, 2]
    assert ep.sql("SELECT count(*) FROM t") == [(50,)]
    commit_rows(ep, 51, 10)
    assert ep.sql("SELECT count(*) FROM t") == [(60,)]


def test_data_flows_while_the_controllers_database_is_down(tmp_path, pg_factory, safekeepers):
    """Only placement changes wait for the controller's database: commits, page reads and a
    compute's start (its basebackup) go on; once the database is back, a failover works."""
    cl = Cluster(tmp_path, pg_factory, safekeepers)
    c = cl.controller
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers).start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    commit_rows(ep, 1, 100)
    cl.db.allowed_errors += ["the database system is not yet accepting connections", "the database system is starting up"]
    c.allowed_errors += ["could not renew or take the leader lease", "heartbeat round", "the connection to the controller's database ended",
                         "no longer leads", f"pageserver {cl.first} is offline"]
    cl.db.stop("immediate")
    wait_until("the controller to report its database unreachable", lambda: c.status()["database"] != "ok")
    commit_rows(ep, 101, 100)
    ep.stop()
    ep.start()  # a basebackup from the pageserver, every page read from it afresh
    assert ep.sql("SELECT count(*) FROM t") == [(200,)]
    wait_until("the controller to stop believing it leads", lambda: c.status()["leader"] is False, timeout_s=30)
    cl.db.start()
    wait_until("the controller to lead again", lambda: c.status()["leader"], timeout_s=30)
    cl.ps[cl.first].kill()
    wait_until("the failover", lambda: placement(c, cl.tenant)["attached"]["node_id"] == cl.second, timeout_s=30)
    wait_until("the secondary to attach", lambda: attached_with(cl.ps[cl.second], cl.tenant, 2), timeout_s=30)
    cl.tl.ps = cl.ps[cl.second]
    ep.kill()
    ep2 = Endpoint(tmp_path, cl.tl, name="ep2", safekeepers=cl.safekeepers).start()
    assert ep2.sql("SELECT count(*) FROM t") == [(200,)]


def test_orders_and_joins_that_do_not_fit_are_refused(tmp_path, pg_factory, safekeepers):
    cl = Cluster(tmp_path, pg_factory, safekeepers)
    ps1 = cl.ps[cl.first]
    # An attach older than what is held, a generation on a detach, none on an attach.
    # An order to let go given at the generation held (or older) is stale: a deposed
    # leader's, or overtaken on the way.
    for body, code in [({"mode": "attached", "generation": 0}, 400), ({"mode": "attached"}, 400),
                       ({"mode": "elsewhere"}, 400), ({"mode": "attached", "generation": 1, "extra": 1}, 400),
                       ({"mode": "secondary", "generation": 1}, 409), ({"mode": "detached", "generation": 1}, 409)]:
        with pytest.raises(HttpError) as e:
            ps1.http("PUT", f"/v1/tenant/{cl.tenant}/location", body)
        assert e.value.status == code, (body, e.value.body)
    # Tenants come from the controller: the pageserver's own creation refuses.
    with pytest.raises(HttpError) as e:
        ps1.http("POST", "/v1/tenant", {"tenant_id": uuid.uuid4().hex})
    assert e.value.status == 409 and "storage controller" in e.value.body["error"]
    assert attached_with(ps1, cl.tenant, 1)


def test_a_pageserver_joins_only_as_itself(tmp_path, pg_factory):
    """Joining the controller as node N (registering its addresses, asking what it holds,
    which raises its tenants' generations) takes node N's own token: another pageserver's
    would let it take over N's address or churn N's tenants."""
    from fixtures.auth import KeyPair
    db = pg_factory("controller-db").initdb().start()
    keys = KeyPair(tmp_path / "keys")
    c = Controller(tmp_path, "a", db.conninfo, auth_public_key=keys.public_path).start()
    c.token = keys.admin()
    c.allowed_errors += ["refused POST", "refused GET"]
    node2 = {"node_id": 2, "http_addr": "127.0.0.1:1", "page_addr": "127.0.0.1:2"}
    wait_until("the controller to lead", lambda: c.status()["leader"])
    c.http("POST", "/v1/node", node2)
    one, two = keys.token("storage", node_id=1), keys.token("storage", node_id=2)
    for path, body in [("/v1/node", {**node2, "http_addr": "127.0.0.1:3"}), ("/v1/re-attach", {"node_id": 2})]:
        for token in (one, keys.storage(), keys.tenant(uuid.uuid4().hex)):
            with pytest.raises(urllib.error.HTTPError) as e:
                c.http("POST", path, body, token=token)
            assert e.value.code == 403, (path, e.value.read())
    assert c.http("POST", "/v1/re-attach", {"node_id": 2}, token=two) == {"tenants": []}
    assert c.http("POST", "/v1/node", {**node2, "http_addr": "127.0.0.1:3"}, token=two)["http_addr"] == "127.0.0.1:3"
    # Where a tenant is: its own token may ask, another tenant's not.
    t = uuid.uuid4().hex
    with pytest.raises(urllib.error.HTTPError) as e:
        c.http("GET", f"/v1/tenant/{t}", token=keys.tenant(uuid.uuid4().hex))
    assert e.value.code == 403
    with pytest.raises(urllib.error.HTTPError) as e:
        c.http("GET", f"/v1/tenant/{t}", token=keys.tenant(t))
    assert e.value.code == 404  # allowed, and not placed


def test_a_pageserver_that_cannot_join_is_failed_over(tmp_path, pg_factory, safekeepers):
    """A pageserver that answers heartbeats but never joins (its registration refused: it
    advertises the other node's page address) serves nothing: it counts as offline and its
    tenants fail over."""
    cl = Cluster(tmp_path, pg_factory, safekeepers)
    c = cl.controller
    ps1, ps2 = cl.ps[cl.first], cl.ps[cl.second]
    c.allowed_errors += [f"pageserver {cl.first} is offline"]
    ps1.stop()
    ps1.config_file.write_text(ps1.config_file.read_text() + f'advertise_pg_addr = "127.0.0.1:{ps2.pg_port}"\n')
    ps1.allowed_errors += ["waiting for the storage controller"]
    ps1.start()
    wait_until("the failover", lambda: placement(c, cl.tenant)["attached"]["node_id"] == cl.second, timeout_s=30)
    wait_until("the secondary to attach", lambda: attached_with(ps2, cl.tenant, 2), timeout_s=30)
    assert cl.tenant not in held(ps1)


def test_a_failed_attach_keeps_the_only_copy(tmp_path, pg_factory, safekeepers):
    """Object storage refuses writes (an outage) while a timeline is made and written: its
    layers exist only on the pageserver's disk. The pageserver restarts and its attach with
    the raised generation fails (the claim cannot be written): its local files stay (they
    were removed as "not held" before), and once object storage is back the attach uses
    them and every commit is there."""
    cl = Cluster(tmp_path, pg_factory, safekeepers)
    c = cl.controller
    ps1 = cl.ps[cl.first]

    def writable(yes: bool):
        for d in [cl.remote, *cl.remote.rglob("*")]:
            if d.is_dir():
                d.chmod(0o755 if yes else 0o555)
    writable(False)
    ps1.allowed_errors += [r"upload of \S+ failed", "could not attach with generation", r"failed \(attempt \d+\)", "Permission denied"]
    c.allowed_errors += ["ordering pageserver", f"pageserver {cl.first} is offline"]
    tl = Timeline(tmp_path, ps1, tenant=cl.tenant, create_tenant=False)
    ep = Endpoint(tmp_path, tl, safekeepers=cl.safekeepers).start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    commit_rows(ep, 1, 100)
    ps1.kill()
    ps1.start()
    wait_until("the attach with generation 2 to fail", lambda: "could not attach with generation 2" in ps1.log_text(), timeout_s=30)
    assert (ps1.workdir / "tenants" / cl.tenant / "timelines" / tl.timeline).is_dir(), "the only copy was removed"
    writable(True)
    wait_until("the attach with generation 2", lambda: attached_with(ps1, cl.tenant, 2), timeout_s=60)
    ep.kill()
    ep2 = Endpoint(tmp_path, tl, name="ep2", safekeepers=cl.safekeepers).start()
    assert ep2.sql("SELECT count(*) FROM t") == [(100,)]


def test_a_compute_follows_its_tenant_through_a_failover_under_writes(tmp_path, pg_factory, safekeepers):
    """The whole path: a compute started with `--controller` writes and reads (small caches,
    so reads go to the pageserver) while the attached pageserver is killed; the controller
    fails the tenant over, the secondary attaches and follows the safekeepers, the compute
    learns the new address and moves. No restart of the compute, no failed statement, every
    acknowledged row there. Prints the time from the kill to the first read served after it."""
    cl = Cluster(tmp_path, pg_factory, safekeepers)
    c = cl.controller
    c.allowed_errors += [f"pageserver {cl.first} is offline"]
    ps1 = cl.ps[cl.first]
    ps1.allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    settings = {"shared_buffers": "128kB", "fjord.file_cache_size": "1MB"}
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers, controller=c, settings=settings).start()
    ep.allowed_errors += [r"could not (connect|receive|send)", "reconnecting", "the page service at"]
    ep.sql("CREATE TABLE big (i int, pad text)")
    ep.sql("INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
    postmaster = ep.postmaster_pid()
    acked: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def writer():
        with ep.connect() as conn:
            i = 1_000_000
            while not stop.is_set():
                i += 1
                try:
                    conn.execute("INSERT INTO big VALUES (%s, 'w')", (i,))
                    acked.append(i)
                except Exception as e:  # noqa: BLE001 - every failure is a finding
                    errors.append(f"insert {i}: {e}")
                    return
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    wait_until("writes to flow", lambda: len(acked) > 50)
    ps1.kill()
    killed = time.monotonic()
    with ep.connect() as conn:
        # Every read of the table goes to a pageserver (the caches hold a few pages).
        total = conn.execute("SELECT count(*) FROM big").fetchone()[0]
    took = time.monotonic() - killed
    wait_until("writes to flow on the new pageserver", lambda: len(acked) > 0 and errors == [] and
               placement(c, cl.tenant)["attached"]["node_id"] == cl.second, timeout_s=60)
    before = len(acked)
    wait_until("more writes", lambda: len(acked) > before + 50 or errors, timeout_s=60)
    stop.set()
    w.join(timeout=60)
    assert errors == [], errors
    assert ep.postmaster_pid() == postmaster, "the compute restarted"
    assert total >= 20000
    rows = {r[0] for r in ep.sql("SELECT i FROM big WHERE i > 1000000")}
    assert set(acked) <= rows, f"{len(set(acked) - rows)} acknowledged rows lost"
    print(f"failover under writes: first read served {took:.2f} s after the kill; {len(acked)} rows written, none lost")
