"""The WAL proposer's PostgreSQL side: the background worker, commits waiting for it
(patch 0008), backpressure, the status function and the settings' validation.

A dead address shows what a compute does while no safekeeper answers (commits wait; a
cancel or a statement timeout ends the wait and the session, never with the commit's success); three real safekeeper processes release
commits; a real compute whose pageserver stops following the safekeepers is throttled
(backpressure). Fencing and failures are in test_runner/safekeeper/.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.logs import unexpected_lines
from fixtures.pagestream import lsn_int
from fixtures.postgres import wait_until

TENANT = "0123456789abcdef0123456789abcdef"
TIMELINE = "fedcba9876543210fedcba9876543210"

# A port nothing listens on: connections are refused at once.
DEAD_SAFEKEEPER = "127.0.0.1:1"


def proposer_settings(safekeepers: str, **extra: str) -> dict[str, str]:
    return {
        "shared_preload_libraries": "'fjord'",
        "fjord.safekeepers": f"'{safekeepers}'",
        "fjord.tenant_id": f"'{TENANT}'",
        "fjord.timeline_id": f"'{TIMELINE}'",
        # What compute_ctl writes with safekeepers configured.
        "synchronous_standby_names": "'walproposer'",
        "synchronous_commit": "on",
        **extra,
    }


def local_conn(pg) -> psycopg.Connection:
    """A session whose commits do not wait for the safekeepers (synchronous_commit = local)."""
    conn = pg.connect()
    conn.execute("SET synchronous_commit = local")
    return conn


def status(pg) -> dict:
    with local_conn(pg) as conn:
        cur = conn.execute("SELECT * FROM fjord.walproposer_status()")
        return dict(zip([d.name for d in cur.description], cur.fetchone()))


def create_extension(pg):
    with local_conn(pg) as conn:
        conn.execute("CREATE EXTENSION fjord")


class BackgroundStatement:
    """Runs one statement in its own session on a thread, keeping its notices."""

    def __init__(self, pg, sql: str, setup: str | None = None):
        self.conn = pg.connect()
        if setup:
            self.conn.execute(setup)
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        self.notices: list[str] = []
        self.conn.add_notice_handler(lambda d: self.notices.append(f"{d.severity}: {d.message_primary}"))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(sql,), daemon=True)
        self.thread.start()

    def _run(self, sql: str):
        try:
            self.conn.execute(sql)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e

    def done(self) -> bool:
        return not self.thread.is_alive()

    def close(self):
        self.conn.close()


def worker_processes(pg) -> int:
    """Processes of this server titled "fjord walproposer" (a worker without a database
    connection is not in pg_stat_activity)."""
    postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])
    count = 0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                count += b"fjord walproposer" in (proc / "cmdline").read_bytes()
        except OSError:
            continue
    return count


def wait_event(pg, pid: int) -> tuple:
    with local_conn(pg) as conn:
        return conn.execute(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()


# Expected: the waits the test cancels.
@pytest.mark.allowed_errors(r"WARNING:  canceling the wait for (the safekeepers|synchronous replication) and terminating")
def test_dead_safekeepers_commit_waits_until_canceled(pg_factory):
    pg = pg_factory("dead", proposer_settings(DEAD_SAFEKEEPER)).initdb().start()
    create_extension(pg)
    # The worker runs and says what it is doing: it keeps electing (no safekeeper answers;
    # "start failed" would be a proposer that could not even start its threads).
    st = wait_until("the worker's state", lambda: (s := status(pg))["state"] in ("start failed", "electing") and s)
    assert st["safekeepers"] == DEAD_SAFEKEEPER
    assert st["wal_start_lsn"] is not None
    assert st["commit_lsn"] is None
    assert "fjord walproposer: starting for timeline" in pg.log_text()
    assert worker_processes(pg) == 1
    with local_conn(pg) as conn:
        conn.execute("CREATE TABLE t (id int)")

    # A commit waits: nothing confirms it.
    stmt = BackgroundStatement(pg, "INSERT INTO t VALUES (1)")
    wait_until("the commit to wait", lambda: wait_event(pg, stmt.pid) == ("IPC", "SyncRep"))
    time.sleep(2)
    assert not stmt.done(), "a commit returned without any safekeeper"

    # A cancel ends the wait and the session: the client must not see the commit succeed
    # (PostgreSQL alone would return success with a warning, for a row on no safekeeper).
    # The row committed locally; whether it is durable is what the warning says is unknown.
    unknown = "the outcome of this transaction is unknown"
    with local_conn(pg) as conn:
        conn.execute("SELECT pg_cancel_backend(%s)", (stmt.pid,))
    wait_until("the canceled commit to return", stmt.done, timeout_s=10)
    assert isinstance(stmt.error, psycopg.OperationalError), (stmt.error, stmt.notices)
    assert any(unknown in n for n in stmt.notices), stmt.notices
    assert stmt.conn.closed or stmt.conn.broken
    stmt.close()
    with local_conn(pg) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)

    # A statement timeout is a cancel too. PostgreSQL stops the timer before a statement's
    # own commit, so it reaches a commit wait inside a statement: a procedure's COMMIT.
    with local_conn(pg) as conn:
        conn.execute("CREATE PROCEDURE insert_and_commit(v int) LANGUAGE plpgsql AS $$ BEGIN INSERT INTO t VALUES (v); COMMIT; END $$")
    stmt = BackgroundStatement(pg, "CALL insert_and_commit(3)", setup="SET statement_timeout = 1000")
    wait_until("the timed-out commit to return", stmt.done, timeout_s=15)
    assert isinstance(stmt.error, psycopg.OperationalError), (stmt.error, stmt.notices)
    assert any(unknown in n for n in stmt.notices), stmt.notices
    stmt.close()

    # Termination ends a wait too, with the connection.
    stmt = BackgroundStatement(pg, "INSERT INTO t VALUES (2)")
    wait_until("the commit to wait", lambda: wait_event(pg, stmt.pid) == ("IPC", "SyncRep"))
    with local_conn(pg) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (stmt.pid,))
    wait_until("the terminated commit to return", stmt.done, timeout_s=10)
    stmt.close()
    assert "canceling the wait for synchronous replication and terminating connection" in pg.log_text()

    allowed = [
        "could not start the WAL proposer",
        unknown,
        "canceling the wait for synchronous replication",
        "terminating connection due to administrator command",
    ]
    assert unexpected_lines(pg.log_text(), allowed) == []


def test_real_safekeepers_release_commits(pg_factory, safekeepers):
    addrs = ",".join(sk.addr for sk in safekeepers)
    # The fixtures' safekeepers serve TLS: the proposer trusts their CA, as compute_ctl sets it.
    tls = {"fjord.tls_ca_file": f"'{safekeepers[0].tls}'"} if safekeepers[0].tls else {}
    pg = pg_factory("sk", proposer_settings(addrs, **tls)).initdb()
    out = pg.run(str(pg.bin / "pg_controldata"), "-D", str(pg.datadir)).stdout
    system_id = int(next(line.split(":", 1)[1] for line in out.splitlines() if line.startswith("Database system identifier")))
    for sk in safekeepers:
        sk.create_timeline(TENANT, TIMELINE, system_id)
    pg.start()
    create_extension(pg)
    wait_until("streaming", lambda: status(pg)["state"] == "streaming", timeout_s=60)
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int)")
        started = time.monotonic()
        for i in range(100):
            conn.execute("INSERT INTO t VALUES (%s)", (i,))
        # Released by the worker through patch 0008, woken by the commit hook: well below
        # the 25 ms that waiting for the worker's 50 ms poll would cost a commit on average.
        elapsed = time.monotonic() - started
        assert elapsed < 100 * 0.015, f"100 commits took {elapsed:.2f} s: released at the worker's poll, not woken by its latch"
        flushed = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    st = status(pg)
    assert st["term"] >= 1
    with local_conn(pg) as conn:
        assert conn.execute("SELECT %s::pg_lsn >= %s::pg_lsn", (st["commit_lsn"], str(flushed))).fetchone() == (True,)
    # Every safekeeper has the WAL (the commit LSN reaches them with the next append).
    for sk in safekeepers:
        wait_until(f"safekeeper {sk.id} to have the WAL", lambda sk=sk: lsn_int(sk.timeline(TENANT, TIMELINE)["flush_lsn"]) >= lsn_int(str(flushed)))
    assert unexpected_lines(pg.log_text()) == []


@pytest.mark.parametrize(
    "limits",
    [
        # In bytes alone: the 3 MB statement is over the limit at its commit.
        {"fjord.max_pageserver_lag": "1MB", "fjord.max_pageserver_lag_time": "0"},
        # In time alone: the statement's WAL, never applied, is soon older than the limit.
        {"fjord.max_pageserver_lag": "0", "fjord.max_pageserver_lag_time": "300ms"},
    ],
    ids=["bytes", "time"],
)
def test_backpressure_when_the_pageserver_stops_following(tmp_path, pageserver, safekeepers, limits):
    tl = Timeline(tmp_path, pageserver)
    ep = Endpoint(tmp_path, tl, settings=limits, safekeepers=safekeepers).start()
    ep.sql("CREATE EXTENSION IF NOT EXISTS fjord")
    ep.sql("CREATE TABLE small (id int)")
    receiver = f"/v1/tenant/{tl.tenant}/timeline/{tl.timeline}/wal_receiver"
    sources = pageserver.http("GET", f"/v1/tenant/{tl.tenant}/timeline/{tl.timeline}")["wal_receiver"]["sources"]
    wait_until("the pageserver's feedback to reach the compute",
               lambda: ep.sql("SELECT (fjord.walproposer_status()).pageserver_apply_lsn IS NOT NULL")[0][0])
    throttled_before = ep.sql("SELECT (fjord.walproposer_status()).throttled_waits")[0][0]
    # The pageserver stops following the safekeepers: its apply LSN stands still.
    pageserver.http("DELETE", receiver)
    # WAL the pageserver will not apply, older than the time limit by the next commit.
    ep.sql("INSERT INTO small VALUES (1)")
    time.sleep(0.5)
    stmt = BackgroundStatement(ep, "CREATE TABLE big AS SELECT g, repeat('x', 100) AS v FROM generate_series(1, 20000) g")
    wait_until("the commit to be throttled", lambda: wait_event(ep, stmt.pid) == ("Extension", "Extension"), timeout_s=30)
    time.sleep(1)
    assert not stmt.done(), f"a commit went through with the pageserver not following, over the limit {limits}"
    # It follows again: the lag shrinks and the commit returns by itself.
    pageserver.http("POST", receiver, {"sources": [{k: s[k] for k in ("host", "port", "user")} for s in sources]})
    wait_until("the throttled commit to return", stmt.done, timeout_s=60)
    assert stmt.error is None, stmt.error
    stmt.close()
    assert ep.sql("SELECT count(*) FROM big") == [(20000,)]
    assert ep.sql("SELECT (fjord.walproposer_status()).throttled_waits")[0][0] > throttled_before


# Expected: the warning the test asks for.
@pytest.mark.allowed_errors(r"WARNING:  fjord.safekeepers is set but commits will not wait")
def test_safekeepers_without_synchronous_standby_names_is_a_warning(pg_factory):
    pg = pg_factory("nosync", proposer_settings(DEAD_SAFEKEEPER, synchronous_standby_names="''")).initdb().start()
    assert "WARNING:  fjord.safekeepers is set but commits will not wait for the safekeepers" in pg.log_text()
    pg.sql("CREATE TABLE t AS SELECT 1 AS x")  # does not wait: nothing to wait for


def test_without_safekeepers_nothing_changes(fjord_pg):
    fjord_pg.sql("CREATE EXTENSION fjord")
    st = status(fjord_pg)
    assert st["state"] == "off" and st["safekeepers"] is None and st["commit_lsn"] is None
    assert worker_processes(fjord_pg) == 0
    fjord_pg.sql("CREATE TABLE t AS SELECT 1 AS x")  # commits do not wait
    assert unexpected_lines(fjord_pg.log_text()) == []


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"fjord.safekeepers": "'localhost'"}, 'fjord.safekeepers entry "localhost" is not host:port'),
        ({"fjord.safekeepers": "'a:1,,b:2'"}, 'fjord.safekeepers "a:1,,b:2" has an empty entry'),
        ({"fjord.safekeepers": "'a:0'"}, 'fjord.safekeepers entry "a:0" has an invalid port "0"'),
        ({"fjord.safekeepers": "'a:99999'"}, 'has an invalid port "99999"'),
        ({"fjord.safekeepers": "':5454'"}, 'fjord.safekeepers entry ":5454" has no valid host'),
        ({"fjord.safekeepers": "'::1:5454'"}, "write an IPv6 address as [addr]:port"),
        ({"fjord.safekeepers": "'a:1,a:1,b:1'"}, 'fjord.safekeepers names "a:1" twice'),
        ({"fjord.safekeepers": "'" + ",".join(f"h{i}:1" for i in range(9)) + "'"}, "names 9 safekeepers; at most 7"),
        ({"fjord.tenant_id": "''"}, "fjord.safekeepers is set but fjord.tenant_id is not"),
        ({"fjord.timeline_id": "'xyz'"}, 'fjord.timeline_id "xyz" is not a timeline id'),
    ],
)
# Expected: the invalid settings the test gives.
@pytest.mark.allowed_errors(r"FATAL:  fjord\.(safekeepers|timeline_id|tenant_id) ")
def test_invalid_settings_refuse_to_start(pg_factory, settings, message):
    pg = pg_factory("bad", {**proposer_settings("a:1,b:2,c:3"), **settings}).initdb()
    with pytest.raises(Exception):
        pg.start()
    log = pg.log_text()
    assert f"FATAL:  {message}" in log or (message in log and "FATAL" in log), log


# Expected: the warning the test asks for.
@pytest.mark.allowed_errors(r"WARNING:  fjord.safekeepers names an even number of safekeepers")
def test_even_number_of_safekeepers_is_a_warning(pg_factory):
    pg = pg_factory("even", proposer_settings("[::1]:1,127.0.0.1:1")).initdb().start()
    assert "WARNING:  fjord.safekeepers names an even number of safekeepers (2)" in pg.log_text()
    create_extension(pg)
    assert status(pg)["safekeepers"] == "[::1]:1,127.0.0.1:1"
