"""A running compute follows its pageserver to a new address (`fjord.pageserver_address` is
reloadable): no restart, no failed query, and no backend left reading from the old address.

The extension alone: the test itself changes the setting (`ALTER SYSTEM` and a reload), as
compute_ctl does with postgresql.conf when the storage controller moves a tenant
(test_runner/controller/test_compute_follows.py).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

from fixtures.compute import Endpoint, Timeline
from fixtures.postgres import free_port, wait_until

# A buffer pool and file cache far smaller than the table, so that every scan reads most of
# its pages from the pageserver; a timeout well below the test's length, so that the old
# behaviour (the address fixed at start) fails the query in the test's time instead of
# after the default 60 s; no autovacuum, so that the only backend reading while the
# pageserver is away (the one whose log line the test waits for) is the test's scan.
SMALL = {"shared_buffers": "128kB", "fjord.file_cache_size": "1MB", "fjord.pageserver_timeout": "20s",
         "autovacuum": "off"}
ROWS = 200_000
# A parallel plan for the scan: its workers never see a reload signalled (background workers
# ignore SIGHUP) and must find the new address themselves.
PARALLEL = ["SET parallel_setup_cost = 0", "SET parallel_tuple_cost = 0", "SET min_parallel_table_scan_size = 0",
            "SET max_parallel_workers_per_gather = 2"]


class Listener:
    """A TCP port that counts the connections it is offered and answers none: the old page
    service address, taken over after the move, so that a backend still dialling it is seen
    (its connection would hang in the handshake)."""

    def __init__(self, port: int):
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.1)
        self.accepted = 0
        self.stopped = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            self.accepted += 1
            self.conns.append(conn)

    def close(self):
        self.stopped.set()
        self.thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


def sum_in_background(conn) -> tuple[threading.Thread, dict]:
    """`SELECT sum(i) FROM big` on `conn` in a thread (started): the dict gets its `sum`, or
    the `error` it raised."""
    scan: dict = {}

    def run_scan():
        try:
            scan["sum"] = conn.execute("SELECT sum(i) FROM big").fetchone()[0]
        except Exception as e:  # noqa: BLE001 - reported by the caller's assertion
            scan["error"] = e
    t = threading.Thread(target=run_scan)
    t.start()
    return t, scan


def getpages(ps) -> float:
    return ps.metrics()["pageserver_getpage_seconds_count"]


def test_a_moved_pageserver_is_followed_on_reload(tmp_path, pageserver):
    tl = Timeline(tmp_path, pageserver)
    ep = Endpoint(tmp_path, tl, settings=SMALL).start()
    ep.sql(f"CREATE TABLE big AS SELECT i, repeat('x', 100) AS pad FROM generate_series(1, {ROWS}) i")
    ep.sql("CHECKPOINT")
    expected = ROWS * (ROWS + 1) // 2
    old_addr = f"127.0.0.1:{pageserver.pg_port}"

    # An idle backend with a connection to the old address, kept open.
    idle = ep.connect()
    assert idle.execute("SELECT sum(i) FROM big").fetchone()[0] == expected
    assert idle.execute("SHOW fjord.pageserver_address").fetchone()[0] == old_addr
    # The session that will change the setting, its catalogs read while the pageserver is
    # there (ALTER SYSTEM reads nothing else; it only writes postgresql.auto.conf).
    admin = ep.connect()
    admin.execute(f"ALTER SYSTEM SET fjord.pageserver_address = '{old_addr}'")

    # The scan's session, ready before the pageserver goes away (its catalogs read), with a
    # parallel plan.
    scanner = ep.connect()
    for setting in PARALLEL:
        scanner.execute(setting)
    plan = "\n".join(r[0] for r in scanner.execute("EXPLAIN SELECT sum(i) FROM big").fetchall())
    assert "Workers Planned: 2" in plan, plan

    # The pageserver goes away; the scan starts and waits on it (its leader; its parallel
    # workers, which never see a reload signalled, read the address from the files at each
    # failure, and find the new one as soon as ALTER SYSTEM has written it).
    pageserver.stop()
    t, scan = sum_in_background(scanner)
    # Its backend has tried the old address and is retrying (the client logs the outage
    # once, at LOG): it is inside the scan, across the switch.
    wait_until("the scan to wait on the stopped pageserver",
               lambda: "error" in scan or f"page service at {old_addr} failed" in ep.pg_log_text(), timeout_s=20)
    assert "error" not in scan, scan

    # The same work directory on other ports: the tenant "moved". Then the reload, as
    # pg_reload_conf() does it (SIGHUP to the postmaster); not through SQL: a backend asked
    # to run pg_reload_conf() may first need a catalog page from the stopped pageserver.
    pageserver.pg_port, pageserver.http_port = free_port(), free_port()
    pageserver.start()
    new_addr = f"127.0.0.1:{pageserver.pg_port}"
    admin.execute(f"ALTER SYSTEM SET fjord.pageserver_address = '{new_addr}'")
    os.kill(ep.postmaster_pid(), signal.SIGHUP)
    t.join(timeout=60)
    assert not t.is_alive(), "the scan did not end"
    assert scan.get("sum") == expected, scan
    # The leader and at least one parallel worker waited on the old address and read on from
    # the new one (the log's process ids).
    reconnected = {line.split("[")[1].split("]")[0] for line in ep.pg_log_text().splitlines()
                   if f"fjord: reconnected to pageserver at {new_addr}" in line}
    assert len(reconnected) >= 2, reconnected

    # Nothing may dial the old address any more: a listener takes it over and counts.
    old = Listener(int(old_addr.rsplit(":", 1)[1]))
    try:
        before = getpages(pageserver)
        # The idle backend's next query moves its connection and reads from the new one.
        assert idle.execute("SHOW fjord.pageserver_address").fetchone()[0] == new_addr
        assert idle.execute("SELECT sum(i) FROM big").fetchone()[0] == expected
        assert getpages(pageserver) > before, "the idle backend's scan read nothing from the new pageserver"
        assert f"page service moved from {old_addr} to {new_addr}" in ep.pg_log_text()
        # New backends start with the new address.
        assert ep.sql("SELECT sum(i) FROM big")[0][0] == expected
        assert old.accepted == 0, f"{old.accepted} connection(s) to the old address after the move"
    finally:
        old.close()
    idle.close()
    scanner.close()
    admin.close()


def test_a_scan_moves_with_its_readahead_in_flight(tmp_path, pageserver):
    """The same pageserver under another name (`localhost` instead of `127.0.0.1`): another
    address, so backends move, while the old connection stays up. A scan paused in the
    middle of the table, with readahead requests sent and not yet answered on the old
    connection, moves at its next read: those requests are sent again on the new one, and
    the sum is right."""
    tl = Timeline(tmp_path, pageserver)
    ep = Endpoint(tmp_path, tl, settings=SMALL).start()
    ep.sql(f"CREATE TABLE big AS SELECT i, repeat('x', 100) AS pad FROM generate_series(1, {ROWS}) i")
    ep.sql("CHECKPOINT")
    expected = ROWS * (ROWS + 1) // 2
    old_addr, new_addr = f"127.0.0.1:{pageserver.pg_port}", f"localhost:{pageserver.pg_port}"

    # The scan stops at the middle row until the test lets it go (an advisory lock).
    holder = ep.connect()
    holder.execute("SELECT pg_advisory_lock(1)")
    scan: dict = {}

    def run_scan():
        try:
            with ep.connect() as conn:
                scan["pid"] = conn.info.backend_pid
                conn.execute("SET max_parallel_workers_per_gather = 0")
                scan["sum"] = conn.execute(
                    "SELECT sum(i) FROM big WHERE i <> %s OR pg_advisory_lock_shared(1) IS NOT NULL", (ROWS // 2,)
                ).fetchone()[0]
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            scan["error"] = e
    t = threading.Thread(target=run_scan)
    t.start()
    wait_until("the scan to stop at the middle row",
               lambda: "error" in scan or holder.execute(
                   "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0] == 1)
    assert "error" not in scan, scan

    holder.execute(f"ALTER SYSTEM SET fjord.pageserver_address = '{new_addr}'")
    holder.execute("SELECT pg_reload_conf()")
    # Another existing backend sees the new value: the postmaster has signalled every
    # backend, the paused scan's included (a signal is handled before it runs on).
    other = ep.connect()
    wait_until("the reload to reach the backends",
               lambda: other.execute("SHOW fjord.pageserver_address").fetchone()[0] == new_addr)
    holder.execute("SELECT pg_advisory_unlock(1)")
    t.join(timeout=60)
    assert not t.is_alive(), "the scan did not end"
    assert scan.get("sum") == expected, scan

    moved = [line for line in ep.pg_log_text().splitlines()
             if f"[{scan['pid']}]" in line and f"page service moved from {old_addr} to {new_addr}; connection moved" in line]
    assert len(moved) == 1, moved
    resent = int(moved[0].split("connection moved, ")[1].split()[0])
    print(moved[0])
    assert resent > 0, f"no request was in flight when the scan moved: {moved[0]}"
    other.close()
    holder.close()


class Forwarder:
    """A TCP relay in front of the page service that can go silent: frozen, it stops passing
    bytes either way and closes nothing, as a host that lost power or a partition that drops
    packets looks to the compute."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.frozen = threading.Event()
        self.stopped = threading.Event()
        self.accepted = 0
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                client, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return  # closed
            self.accepted += 1
            server = socket.create_connection(("127.0.0.1", self.target_port))
            self.conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket):
        src.settimeout(0.1)
        while not self.stopped.is_set():
            if self.frozen.is_set():
                self.stopped.wait(0.05)
                continue
            try:
                data = src.recv(65536)
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            if not data:
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self):
        self.stopped.set()
        for c in self.conns:
            c.close()
        self.sock.close()


def test_a_read_waiting_on_a_silent_pageserver_moves_on_reload(tmp_path, pageserver):
    """The old pageserver goes silent (no answer, no close) with a scan's reads in flight on
    it; the compute is then told the new address. The reads waiting for an answer move at
    once, instead of waiting out fjord.pageserver_timeout (20 s here) and failing."""
    tl = Timeline(tmp_path, pageserver)
    ep = Endpoint(tmp_path, tl, settings=SMALL).start()
    ep.sql(f"CREATE TABLE big AS SELECT i, repeat('x', 100) AS pad FROM generate_series(1, {ROWS}) i")
    ep.sql("CHECKPOINT")
    expected = ROWS * (ROWS + 1) // 2
    direct = f"127.0.0.1:{pageserver.pg_port}"
    relay = Forwarder(pageserver.pg_port)
    try:
        admin = ep.connect()
        admin.execute(f"ALTER SYSTEM SET fjord.pageserver_address = '127.0.0.1:{relay.port}'")
        admin.execute("SELECT pg_reload_conf()")
        scanner = ep.connect()
        scanner.execute("SET max_parallel_workers_per_gather = 0")
        wait_until("the reload to reach the scanner",
                   lambda: scanner.execute("SHOW fjord.pageserver_address").fetchone()[0] == f"127.0.0.1:{relay.port}")
        assert scanner.execute("SELECT sum(i) FROM big").fetchone()[0] == expected
        assert relay.accepted > 0, "the scan did not read through the relay"

        relay.frozen.set()
        t, scan = sum_in_background(scanner)
        # Its reads are stuck on the silent relay (nothing fails: no error, no close).
        t.join(timeout=2)
        assert t.is_alive() and not scan, scan
        admin.execute(f"ALTER SYSTEM SET fjord.pageserver_address = '{direct}'")
        os.kill(ep.postmaster_pid(), signal.SIGHUP)
        told = time.monotonic()
        t.join(timeout=60)
        took = time.monotonic() - told
        assert scan.get("sum") == expected, scan
        # Moved when told, not when the wait gave up (that fails the query at 20 s).
        assert "while the page service moved" in ep.pg_log_text()
        print(f"a read stuck on a silent pageserver moved {took:.2f} s after the reload")
        scanner.close()
        admin.close()
    finally:
        relay.close()
