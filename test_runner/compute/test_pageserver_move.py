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
    scan: dict = {}

    def run_scan():
        try:
            scan["sum"] = scanner.execute("SELECT sum(i) FROM big").fetchone()[0]
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            scan["error"] = e
    t = threading.Thread(target=run_scan)
    t.start()
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
