"""A compute started with `compute_ctl --controller` follows its tenant when the storage
controller moves it: asked where the tenant is at start, then polled; a move rewrites
postgresql.conf and reloads postgres, with no restart and no failed query. A controller
that stops answering changes nothing."""

from __future__ import annotations

import threading
import time
import urllib.error

import pytest

from fixtures.auth import KeyPair
from fixtures.compute import Endpoint, Timeline
from fixtures.controller import Controller
from fixtures.pageserver import Pageserver
from fixtures.postgres import free_port, wait_until
from fixtures.safekeeper import Safekeeper

# Small caches: the queries below read from the pageserver, so they cross the move.
SMALL = {"shared_buffers": "128kB", "fjord.file_cache_size": "1MB"}


def register(c: Controller, node_id: int, ps: Pageserver):
    c.http("POST", "/v1/node", {"node_id": node_id, "http_addr": f"127.0.0.1:{ps.http_port}",
                                "page_addr": f"127.0.0.1:{ps.pg_port}"})


def compute_token(c: Controller, keys: KeyPair, tenant: str) -> str:
    """The compute's own token (its tenant) if the controller takes it for the tenant's
    location, else an admin token (a controller that answers admins only)."""
    token = keys.tenant(tenant)
    try:
        c.http("GET", f"/v1/tenant/{tenant}", token=token)
        return token
    except urllib.error.HTTPError as e:
        assert e.code in (401, 403), e
        # The refusal of the question just asked, logged by the controller.
        c.allowed_errors.append(r"refused GET /v1/tenant/\w+ from \S+: a tenant token may not use the management API")
        return keys.admin()


class Load:
    """Queries in a loop on one connection until stopped: a read of the whole table (from
    the pageserver, through the small caches) and a write; every result checked, every
    failure kept."""

    def __init__(self, ep: Endpoint, expected: int):
        self.ep, self.expected = ep, expected
        self.done = 0
        self.errors: list[str] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        with self.ep.connect() as conn:
            while not self.stopped.is_set():
                try:
                    got = conn.execute("SELECT sum(i) FROM big").fetchone()[0]
                    if got != self.expected:
                        self.errors.append(f"sum {got}, expected {self.expected}")
                    conn.execute("INSERT INTO log VALUES (%s)", (self.done,))
                    self.done += 1
                except Exception as e:  # noqa: BLE001 - the test asserts there are none
                    self.errors.append(repr(e))
                    return

    def wait_for(self, more: int, what: str):
        target = self.done + more
        wait_until(what, lambda: self.errors or self.done >= target, timeout_s=60)
        assert not self.errors, self.errors

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=60)
        assert not self.errors, self.errors


def one_pageserver_cluster(tmp_path, pg_factory, keys):
    """A controller with authentication, one pageserver registered with it, and a tenant it
    placed there with a timeline: (controller, pageserver, timeline, placement)."""
    db = pg_factory("controller-db").initdb().start()
    ctl = Controller(tmp_path, "a", db.conninfo, auth_public_key=keys.public_path).start()
    ctl.token = keys.admin()
    # The pageserver is down between its stop and its start on the new ports, and a
    # heartbeat may fall into that gap (or outlast the offline grace on a slow machine):
    # the controller says so; its tenant has no secondary to fail over to.
    ctl.allowed_errors += [r"pageserver 1 is offline", r"has no (online )?secondary"]
    ps = Pageserver(tmp_path).start()
    tl = Timeline(tmp_path, ps)
    register(ctl, 1, ps)
    wait_until("the pageserver online", lambda: ctl.http("GET", "/v1/node")[0]["availability"] == "online")
    placed = ctl.http("POST", "/v1/tenant", {"tenant_id": tl.tenant})
    assert placed["attached"]["node_id"] == 1, placed
    return ctl, ps, tl, placed


@pytest.mark.parametrize("with_safekeepers", [False, True], ids=["followed_by_the_pageserver", "with_safekeepers"])
def test_compute_follows_its_tenant_to_a_new_pageserver(tmp_path, pg_factory, keys, monkeypatch, with_safekeepers):
    """Without safekeepers the pageserver follows the compute's WAL (and is its
    synchronous standby: commits wait while it moves); with them, it follows the
    safekeepers. Either way compute_ctl tells the pageserver at its new address where the
    WAL is, as at start."""
    ctl, ps, tl, placed = one_pageserver_cluster(tmp_path, pg_factory, keys)

    monkeypatch.setenv("FJORD_AUTH_TOKEN", compute_token(ctl, keys, tl.tenant))
    sks = [Safekeeper(tmp_path / "safekeepers", i).start() for i in (1, 2, 3)] if with_safekeepers else None
    ep = Endpoint(tmp_path, tl, settings=SMALL, controller=ctl, safekeepers=sks)
    # The controller stopped at the end: compute_ctl says, once, that it keeps the last
    # location (the WARN line of `watch_controller`).
    ep.allowed_errors += [r"WARN .*could not reach the storage controller at \S+: .*; keeping page service"]
    ep.start()
    old_addr = f"127.0.0.1:{ps.pg_port}"
    assert ep.sql("SHOW fjord.pageserver_address")[0][0] == old_addr
    assert "the storage controller places the tenant at page service " + old_addr in ep.logfile.read_text()
    rows = 30_000
    ep.sql(f"CREATE TABLE big AS SELECT i, repeat('x', 100) AS pad FROM generate_series(1, {rows}) i")
    ep.sql("CREATE TABLE log (n int)")
    load = Load(ep, rows * (rows + 1) // 2)
    load.wait_for(2, "queries before the move")

    # The pageserver moves to new ports (same work directory) and registers them again.
    ps.stop()
    ps.pg_port, ps.http_port = free_port(), free_port()
    ps.start()
    new_addr = f"127.0.0.1:{ps.pg_port}"
    register(ctl, 1, ps)
    moved = f"tenant moved: page service {old_addr} -> {new_addr}"
    wait_until("compute_ctl to move postgres", lambda: moved in ep.logfile.read_text(), timeout_s=20)
    line = next(l for l in ep.logfile.read_text().splitlines() if moved in l)
    assert "INFO" in line and f"generation={placed['generation']}" in line and f"127.0.0.1:{ps.http_port}" in line, line
    wait_until("the pageserver at its new address to be told where the WAL is",
               lambda: f"the pageserver at https://127.0.0.1:{ps.http_port} follows this compute's WAL" in ep.logfile.read_text())
    wait_until("postgres to read the new address",
               lambda: ep.sql("SHOW fjord.pageserver_address")[0][0] == new_addr, timeout_s=10)
    load.wait_for(3, "queries after the move")

    # The controller goes away: the compute keeps serving from the last location.
    ctl.stop()
    wait_until("compute_ctl to notice the controller is gone",
               lambda: "could not reach the storage controller" in ep.logfile.read_text(), timeout_s=10)
    load.wait_for(3, "queries without a controller")
    load.stop()
    text = ep.logfile.read_text()
    assert text.count("could not reach the storage controller") == 1, "logged once, not at every poll"
    assert ep.sql("SHOW fjord.pageserver_address")[0][0] == new_addr
    assert ep.sql("SELECT count(*) FROM log")[0][0] == load.done
    assert ep.proc.poll() is None, "compute_ctl exited"


def test_an_address_set_by_hand_is_named_instead_of_silently_winning(tmp_path, pg_factory, keys, monkeypatch):
    """`ALTER SYSTEM SET fjord.pageserver_address` (postgresql.auto.conf) would win over the
    address compute_ctl writes into postgresql.conf: compute_ctl refuses to pretend it moved,
    says why once, and moves once the override is reset. `-c fjord.pageserver_address` with
    `--controller` is refused at start."""
    ctl, ps, tl, _ = one_pageserver_cluster(tmp_path, pg_factory, keys)
    monkeypatch.setenv("FJORD_AUTH_TOKEN", compute_token(ctl, keys, tl.tenant))

    bad = Endpoint(tmp_path, tl, name="bad", settings={"fjord.pageserver_address": "127.0.0.1:1"}, controller=ctl)
    bad.allowed_errors += ["cannot go with --controller"]
    # (The fixture's wait reports compute_ctl's exit as its last error when it gives up.)
    with pytest.raises(TimeoutError, match="cannot go with --controller"):
        bad.start(timeout_s=5)

    ep = Endpoint(tmp_path, tl, settings=SMALL, controller=ctl)
    ep.allowed_errors += [r"WARN .*could not reach the storage controller", r"sets fjord.pageserver_address \(ALTER SYSTEM\)"]
    ep.start()
    old_addr = f"127.0.0.1:{ps.pg_port}"
    ep.sql("CREATE TABLE t AS SELECT i FROM generate_series(1, 1000) i")
    admin = ep.connect()
    admin.execute(f"ALTER SYSTEM SET fjord.pageserver_address = '{old_addr}'")

    ps.stop()
    ps.pg_port, ps.http_port = free_port(), free_port()
    ps.start()
    new_addr = f"127.0.0.1:{ps.pg_port}"
    register(ctl, 1, ps)
    wait_until("compute_ctl to name the override", lambda: "sets fjord.pageserver_address (ALTER SYSTEM)" in ep.logfile.read_text(),
               timeout_s=20)
    time.sleep(1)  # several polls: said once
    assert ep.logfile.read_text().count("sets fjord.pageserver_address (ALTER SYSTEM)") == 1
    admin.execute("ALTER SYSTEM RESET fjord.pageserver_address")
    wait_until("compute_ctl to move postgres", lambda: f"tenant moved: page service {old_addr} -> {new_addr}" in ep.logfile.read_text(),
               timeout_s=20)
    wait_until("postgres to read the new address", lambda: admin.execute("SHOW fjord.pageserver_address").fetchone()[0] == new_addr)
    assert admin.execute("SELECT count(*) FROM t").fetchone()[0] == 1000
    admin.close()
