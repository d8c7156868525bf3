"""Read replicas (`fjord endpoint start NAME --replica`) and points in time (`--at TIME`),
through the CLI, with real processes: a pageserver, three safekeepers, a primary compute and
hot standby computes that stream the committed WAL from the safekeepers, replay it on the
pages they hold and read every other page from the pageserver at their replay position.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest

from fixtures.cli import FjordRepo
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until

PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


@pytest.fixture
def repo(tmp_path: Path):
    r = FjordRepo(tmp_path / "repo").init()
    r.run("start")
    r.tenant = r.run("tenant", "create").stdout.strip()
    yield r
    r.cleanup()


def connect(connstr: str) -> psycopg.Connection:
    return psycopg.connect(connstr, autocommit=True)


def port_of(connstr: str) -> int:
    return int(re.search(r":(\d+)/", connstr).group(1))


def one(conn: psycopg.Connection, sql: str, *params):
    return conn.execute(sql, params).fetchone()[0]


def table_digest(conn: psycopg.Connection, table: str) -> str:
    """A digest of a table's rows in a fixed order: equal digests, equal contents."""
    h = hashlib.sha256()
    with conn.cursor() as cur:
        cur.execute(f"SELECT t::text FROM {table} t ORDER BY t::text")
        for (row,) in cur:
            h.update(row.encode())
            h.update(b"\n")
    return h.hexdigest()


def digests(conn: psycopg.Connection, tables=PGBENCH_TABLES) -> dict[str, str]:
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        return {t: table_digest(conn, t) for t in tables}
    finally:
        conn.execute("COMMIT")


def replay_lsn(conn: psycopg.Connection) -> str:
    return str(one(conn, "SELECT pg_last_wal_replay_lsn()"))


def lsn_int(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def wait_replayed(conn: psycopg.Connection, lsn: str, timeout_s: float = 60) -> None:
    wait_until(f"replay past {lsn}", lambda: lsn_int(replay_lsn(conn)) >= lsn_int(lsn), timeout_s=timeout_s, interval_s=0.02)


def pgbench(port: int, *args: str) -> str:
    r = subprocess.run([str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U", getpass.getuser(), *args, "postgres"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"pgbench {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


# Expected: the write the test tries on the replica.
@pytest.mark.allowed_errors(r"ERROR:  cannot execute INSERT in a read-only transaction")
def test_a_replica_follows_its_primary_and_refuses_writes(repo):
    primary = repo.run("endpoint", "start", "main").stdout.strip()
    with connect(primary) as p:
        p.execute("CREATE EXTENSION fjord")
        p.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        p.execute("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 1000) g")
        started = time.monotonic()
        replica = repo.run("endpoint", "start", "r1", "--replica").stdout.strip()
        start_s = time.monotonic() - started
        with connect(replica) as r:
            assert one(r, "SELECT pg_is_in_recovery()") is True
            # A replica opens for reads once consistent, at the newest running-transactions
            # record the pageserver has (here the branch's start), and replays what was
            # committed since: the rows are there once it has replayed past their commit.
            wait_replayed(r, str(one(p, "SELECT pg_current_wal_flush_lsn()")))
            assert one(r, "SELECT count(*) FROM t") == 1000
            # A row committed on the primary becomes visible on the replica.
            p.execute("INSERT INTO t VALUES (1001, 'new')")
            lsn = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
            wait_replayed(r, lsn)
            assert one(r, "SELECT v FROM t WHERE id = 1001") == "new"
            # Updates and deletes of rows whose pages the replica holds, and of others.
            p.execute("UPDATE t SET v = 'changed' WHERE id % 10 = 0")
            p.execute("DELETE FROM t WHERE id % 7 = 0")
            lsn = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
            wait_replayed(r, lsn)
            assert r.execute("SELECT id, v FROM t ORDER BY id").fetchall() == p.execute("SELECT id, v FROM t ORDER BY id").fetchall()
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                r.execute("INSERT INTO t VALUES (5000, 'no')")
            # Blocks not in the replica's buffers were left to the pageserver.
            skipped = one(r, "SELECT replay_skipped_blocks FROM fjord.storage_manager()")
            print(f"replay skipped {skipped} blocks")
    listing = repo.run("endpoint", "list").stdout
    assert re.search(r"^r1\s+main\s+\d+\s+replica\s+running", listing, re.M), listing
    # A writer is still refused beside the running one; a second replica is not.
    assert "already writes to branch main" in repo.fail("endpoint", "start", "w2")
    repo.run("endpoint", "start", "r2", "--replica")
    print(f"replica start took {start_s:.2f} s")


def test_replicas_match_the_primary_at_the_same_lsn_under_pgbench(repo):
    primary = repo.run("endpoint", "start", "main", "-c", "shared_buffers=16MB").stdout.strip()
    pport = port_of(primary)
    pgbench(pport, "-i", "-s", "2", "-q")
    # Three replicas with small buffer pools: most pages are not held, so most records are
    # left to the pageserver and most reads go there.
    replicas = [repo.run("endpoint", "start", f"r{i}", "--replica", "-c", "shared_buffers=2MB").stdout.strip() for i in range(3)]
    load = threading.Thread(target=pgbench, args=(pport, "-c", "4", "-T", "25", "-n"))
    load.start()
    try:
        compared = 0
        time.sleep(3)
        for i, rc in enumerate(replicas):
            with connect(rc) as r:
                # Freeze the replica at whatever it has replayed, read it, and read the same
                # LSN through a read-only compute at that LSN: both must show the same rows.
                r.execute("SELECT pg_wal_replay_pause()")
                wait_until("replay paused", lambda: one(r, "SELECT pg_get_wal_replay_pause_state()") == "paused")
                at = replay_lsn(r)
                mine = digests(r)
                static = repo.run("endpoint", "start", f"at{i}", "--at", at, "-c", "shared_buffers=2MB").stdout.strip()
                with connect(static) as s:
                    theirs = digests(s)
                repo.run("endpoint", "stop", f"at{i}")
                assert mine == theirs, f"replica r{i} at {at} differs from a compute at that LSN"
                r.execute("SELECT pg_wal_replay_resume()")
                compared += 1
                time.sleep(2)
        assert compared == 3
    finally:
        load.join()
    with connect(primary) as p:
        end = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
        expected = digests(p)
    for rc in replicas:
        with connect(rc) as r:
            wait_replayed(r, end)
            assert digests(r) == expected
            assert one(r, "SELECT sum(abalance) FROM pgbench_accounts") == one(r, "SELECT sum(delta) FROM pgbench_history")


def test_a_replica_starts_while_a_long_transaction_runs(repo):
    primary = repo.run("endpoint", "start", "main").stdout.strip()
    with connect(primary) as p, connect(primary) as long_tx:
        p.execute("CREATE TABLE t (id int, v text)")
        p.execute("INSERT INTO t VALUES (1, 'committed')")
        long_tx.execute("BEGIN")
        long_tx.execute("INSERT INTO t VALUES (2, 'in progress')")
        # The running-transactions record a replica starts from lists the open transaction
        # (PostgreSQL logs one at every checkpoint and every 15 s while WAL is written).
        p.execute("CHECKPOINT")
        replica = repo.run("endpoint", "start", "r1", "--replica").stdout.strip()
        with connect(replica) as r:
            assert r.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(1, "committed")]
            long_tx.execute("COMMIT")
            lsn = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
            wait_replayed(r, lsn)
            assert r.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(1, "committed"), (2, "in progress")]


# Expected: the pageserver the test kills and restarts; the safekeeper it stops, as libpq
# reports it in cleartext and over TLS (an EOF without TLS's close_notify), while the
# replica streams from it or while it connects to it.
@pytest.mark.allowed_errors(r"could not lease the replay position from the pageserver's GC: could not reach the pageserver",
                            r"FATAL:  could not receive data from WAL stream: (server closed the connection unexpectedly"
                            r"|SSL SYSCALL error: EOF detected|SSL connection has been closed unexpectedly)",
                            r"FATAL:  could not connect to the primary server: connection to server at \S+, port \d+ failed: "
                            r"server closed the connection unexpectedly")
def test_a_replica_survives_a_primary_restart_a_safekeeper_failure_and_a_pageserver_restart(repo):
    primary = repo.run("endpoint", "start", "main").stdout.strip()
    with connect(primary) as p:
        p.execute("CREATE TABLE t (id int)")
        p.execute("INSERT INTO t SELECT generate_series(1, 100)")
    # A small buffer pool and no local file cache: the replica reads most pages from the
    # pageserver.
    replica = repo.run("endpoint", "start", "r1", "--replica", "-c", "shared_buffers=1MB", "-c", "fjord.file_cache_size=0").stdout.strip()
    repo.run("endpoint", "stop", "main")
    primary = repo.run("endpoint", "start", "main").stdout.strip()
    with connect(primary) as p, connect(replica) as r:
        p.execute("INSERT INTO t SELECT generate_series(101, 200)")
        wait_replayed(r, str(one(p, "SELECT pg_current_wal_flush_lsn()")))
        assert one(r, "SELECT count(*) FROM t") == 200
        # The replica streams from the first safekeeper it reaches; stop the first one.
        repo.run("safekeeper", "stop", "1", "--immediate")
        p.execute("INSERT INTO t SELECT generate_series(201, 300)")
        wait_replayed(r, str(one(p, "SELECT pg_current_wal_flush_lsn()")))
        assert one(r, "SELECT count(*) FROM t") == 300
        repo.run("safekeeper", "start", "1")
        # The pageserver, killed and started again, follows the safekeepers again and
        # serves the replica's reads at its replay position.
        pid = int((repo.path / "pageserver.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_until("the pageserver to exit", lambda: not Path(f"/proc/{pid}").exists())
        repo.run("start")
        p.execute("CREATE TABLE t2 AS SELECT g AS id, md5(g::text) AS h FROM generate_series(1, 50000) g")
        p.execute("INSERT INTO t SELECT generate_series(301, 400)")
        wait_replayed(r, str(one(p, "SELECT pg_current_wal_flush_lsn()")))
        assert one(r, "SELECT count(*) FROM t") == 400
        assert r.execute("SELECT count(*), sum(id), max(h) FROM t2").fetchone() == p.execute("SELECT count(*), sum(id), max(h) FROM t2").fetchone()
    with connect(replica) as r:
        assert one(r, "SELECT count(*) FROM t") == 400


@pytest.fixture
def repo_without_auth(tmp_path: Path):
    # The WAL receiver that a POST restarts in a cluster with authentication finds no
    # token for the safekeepers; without authentication it needs none.
    r = FjordRepo(tmp_path / "repo").init("--no-auth")
    r.run("start")
    r.tenant = r.run("tenant", "create").stdout.strip()
    yield r
    r.cleanup()


def test_a_replica_keeps_visibility_map_clears_of_pages_it_evicted(repo_without_auth):
    """Heap redo clears visibility-map bits on a map page that is not a block of the record
    (`visibilitymap_pin`/`visibilitymap_clear` read it into a buffer and change it there,
    without stamping its LSN). Once that buffer and its file cache entry are gone, the
    replica must read the map page back at a version that includes the clear, even while
    the pageserver's ingest is behind: an index-only scan trusts the map and would count
    deleted rows."""
    repo = repo_without_auth
    # The primary keeps committing while the pageserver does not follow (no backpressure).
    primary = repo.run("endpoint", "start", "main", "-c", "fjord.max_pageserver_lag_time=0").stdout.strip()
    main = repo.state()["tenants"][repo.tenant]["branches"]["main"]
    timeline = f"/v1/tenant/{repo.tenant}/timeline/{main}"

    def ingested() -> int:
        return lsn_int(repo.http_json(timeline)["last_record_lsn"])

    def index_only(r: psycopg.Connection) -> None:
        for setting in ("enable_seqscan", "enable_bitmapscan"):
            r.execute(f"SET {setting} = off")
        r.execute("SET max_parallel_workers_per_gather = 0")

    with connect(primary) as p:
        for extension in ("fjord", "pg_prewarm", "pg_buffercache"):
            p.execute(f"CREATE EXTENSION {extension}")
        p.execute("CREATE TABLE t (id int PRIMARY KEY) WITH (autovacuum_enabled = off)")
        p.execute("INSERT INTO t SELECT generate_series(1, 20000)")
        # Four times the replica's shared_buffers and file cache together.
        p.execute("CREATE TABLE filler (id int, pad text) WITH (autovacuum_enabled = off)")
        p.execute("INSERT INTO filler SELECT g, repeat('x', 400) FROM generate_series(1, 16000) g")
        p.execute("VACUUM t")
        # The replica starts after all of this (at the checkpoint's running-transactions
        # record), so that none of it is replayed in its buffers: heap pages evicted there
        # with PD_ALL_VISIBLE after ingest stops would be read back only after it resumes.
        p.execute("CHECKPOINT")
        loaded = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
    wait_until("ingest of the load", lambda: ingested() >= lsn_int(loaded), timeout_s=60)
    replica = repo.run("endpoint", "start", "r1", "--replica", "-c", "shared_buffers=1MB", "-c", "fjord.file_cache_size=1").stdout.strip()
    with connect(replica) as r:
        wait_replayed(r, loaded)
        index_only(r)
        plan = one(r, "EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM t")[0]["Plan"]["Plans"][0]
        assert plan["Node Type"] == "Index Only Scan" and plan["Heap Fetches"] == 0, plan

    # Hold the pageserver's ingest back: its WAL receiver stops following the safekeepers.
    sources = [{k: s[k] for k in ("host", "port", "user")} for s in repo.http_json(timeline)["wal_receiver"]["sources"]]
    repo.http_delete(f"{timeline}/wal_receiver")
    resumer = threading.Thread(target=lambda: (time.sleep(2), repo.http_post(f"{timeline}/wal_receiver", {"sources": sources})))
    try:
        held_at = ingested()
        with connect(primary) as p:
            # Every page of t was all-visible: the first delete on each clears its map bit.
            p.execute("DELETE FROM t WHERE id % 2 = 0")
            deleted = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
        with connect(replica) as r:
            wait_replayed(r, deleted)
            # The map page leaves the buffer pool (written out), then the file cache.
            evictions = one(r, "SELECT evictions FROM fjord.file_cache_status()")
            r.execute("SELECT pg_prewarm('filler')")
            assert one(r, "SELECT evictions FROM fjord.file_cache_status()") - evictions > 256
            assert one(r, "SELECT count(*) FROM pg_buffercache WHERE relfilenode = pg_relation_filenode('t') AND relforknumber = 2") == 0
            assert ingested() == held_at < lsn_int(deleted), "the pageserver ingested WAL while its receiver was stopped"
            # The count may wait for the pageserver to ingest the DELETE: it resumes in 2 s.
            resumer.start()
            index_only(r)
            counted = one(r, "SELECT count(*) FROM t")
            assert counted == 10000, f"the replica counted {counted} rows where 10000 are left"
    finally:
        if resumer.ident is not None:
            resumer.join()
        else:
            repo.http_post(f"{timeline}/wal_receiver", {"sources": sources})


def test_endpoint_and_branch_at_a_time(repo):
    primary = repo.run("endpoint", "start", "main").stdout.strip()
    marks = []
    with connect(primary) as p:
        p.execute("CREATE TABLE t (id int, v text)")
        for i in range(3):
            p.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g", (i * 100 + 1, i * 100 + 100))
            time.sleep(1.1)
            at = datetime.now(timezone.utc)
            marks.append((at, table_digest(p, "t"), one(p, "SELECT count(*) FROM t")))
            time.sleep(1.1)
        p.execute("DELETE FROM t WHERE id % 2 = 0")
    # Wait until the pageserver has every commit (a time after its last known commit would
    # otherwise show its latest, not the time's).
    with connect(primary) as p:
        end = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
    main = repo.state()["tenants"][repo.tenant]["branches"]["main"]
    wait_until("ingest", lambda: lsn_int(repo.http_json(f"/v1/tenant/{repo.tenant}/timeline/{main}")["last_record_lsn"]) >= lsn_int(end))
    for i, (at, digest, count) in enumerate(marks):
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        ro = repo.run("endpoint", "start", f"past{i}", "--at", stamp).stdout.strip()
        with connect(ro) as c:
            assert one(c, "SELECT count(*) FROM t") == count
            assert table_digest(c, "t") == digest
        repo.run("endpoint", "stop", f"past{i}")
        repo.run("branch", "create", f"b{i}", "--from", "main", "--at", stamp)
        branch_ep = repo.run("endpoint", "start", f"onb{i}", "--branch", f"b{i}").stdout.strip()
        with connect(branch_ep) as c:
            assert table_digest(c, "t") == digest
            # Across a branch point: a time on the branch after its own writes.
            c.execute("INSERT INTO t VALUES (-1, 'on the branch')")
            time.sleep(1.1)
            on_branch = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            branch_digest = table_digest(c, "t")
            time.sleep(1.1)
            c.execute("INSERT INTO t VALUES (-2, 'later')")
            bend = str(one(c, "SELECT pg_current_wal_flush_lsn()"))
        tl = repo.state()["tenants"][repo.tenant]["branches"][f"b{i}"]
        wait_until("ingest", lambda: lsn_int(repo.http_json(f"/v1/tenant/{repo.tenant}/timeline/{tl}")["last_record_lsn"]) >= lsn_int(bend))
        repo.run("endpoint", "stop", f"onb{i}")
        ro = repo.run("endpoint", "start", f"bpast{i}", "--branch", f"b{i}", "--at", on_branch).stdout.strip()
        with connect(ro) as c:
            assert table_digest(c, "t") == branch_digest
        repo.run("endpoint", "stop", f"bpast{i}")
    # Errors that say what is wrong.
    assert "in the future" in repo.fail("endpoint", "start", "future", "--at", "2999-01-01T00:00:00Z")
    assert "before the oldest point" in repo.fail("branch", "create", "old", "--from", "b0", "--at", "2001-01-01T00:00:00Z")
    assert "neither an LSN" in repo.fail("endpoint", "start", "bad", "--at", "yesterday")


def test_the_primary_sees_its_replicas_and_keeps_what_their_snapshots_read(repo):
    primary = repo.run("endpoint", "start", "main").stdout.strip()
    # Any conflict with recovery cancels the replica's query at once: only the primary's
    # holding back the replica's xmin lets the snapshot below survive the VACUUM.
    replica = repo.run("endpoint", "start", "r1", "--replica", "-c", "max_standby_streaming_delay=0").stdout.strip()
    with connect(primary) as p, connect(replica) as r:
        p.execute("CREATE EXTENSION fjord")
        p.execute("CREATE TABLE t (id int, v text) WITH (autovacuum_enabled = off)")
        p.execute("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 1000) g")

        def listed():
            return p.execute("SELECT name, safekeeper, replay_lsn, replay_lag_bytes, xmin, last_report_ms FROM fjord.replicas()").fetchall()
        # pg_stat_replication's counterpart: the replica, where it streams from, how far it
        # replayed, and its xmin, which the primary holds in a temporary slot.
        wait_until("the replica listed on the primary with its xmin", lambda: [row[0] for row in listed() if row[4]] == ["r1"], timeout_s=30)
        name, safekeeper, replayed, lag, xmin, age_ms = listed()[0]
        assert re.fullmatch(r"127\.0\.0\.1:\d+", safekeeper), safekeeper
        assert lag >= 0 and age_ms < 10_000, (lag, age_ms)
        slot = p.execute("SELECT slot_type, temporary, xmin::text::bigint FROM pg_replication_slots WHERE slot_name = 'fjord_replicas'").fetchone()
        assert slot is not None and slot[0] == "physical" and slot[1] is True, slot

        wait_replayed(r, str(one(p, "SELECT pg_current_wal_flush_lsn()")))
        r.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert one(r, "SELECT count(*) FROM t") == 1000
        snapshot_xmin = int(one(r, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"))
        # The replica's feedback now names its snapshot's xmin (or an older one).
        wait_until("the primary to hold the snapshot's xmin",
                   lambda: 0 < (one(p, "SELECT min(xmin) FROM fjord.replicas()") or 0) <= snapshot_xmin, timeout_s=30)
        p.execute("DELETE FROM t")
        p.execute("VACUUM t")
        # VACUUM kept the deleted rows (the replica's snapshot sees them), so the replica
        # replays no conflict and its query keeps working past the VACUUM.
        assert one(p, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 't'") >= 1000
        wait_replayed(r, str(one(p, "SELECT pg_current_wal_flush_lsn()")))
        assert one(r, "SELECT count(*) FROM t") == 1000
        r.execute("COMMIT")
        assert one(r, "SELECT count(*) FROM t") == 0

        # With the snapshot gone, the horizon moves on and VACUUM removes the rows.
        def vacuumed():
            p.execute("VACUUM t")
            return one(p, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 't'") == 0
        wait_until("VACUUM to remove the rows once the replica let go", vacuumed, timeout_s=30, interval_s=0.5)

    # A stopped replica leaves the list, and holds nothing back.
    repo.run("endpoint", "stop", "r1")
    with connect(primary) as p:
        wait_until("the stopped replica to leave the list", lambda: listed() == [], timeout_s=30)
        wait_until("the slot to hold no xmin",
                   lambda: one(p, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'fjord_replicas' AND xmin IS NOT NULL") == 0,
                   timeout_s=30)


@pytest.fixture
def gc_repo(tmp_path: Path):
    """A repo whose GC may collect right up to the last record (no PITR window, no byte
    horizon) and whose computes' leases lapse 2 s after their last renewal, with a tenant:
    (repo, the main timeline's API path, gc), where gc() checkpoints, compacts and collects
    and returns the new cutoff."""
    repo = FjordRepo(tmp_path / "repo", env={"FJORD_REPLICA_LEASE_TTL_SECS": "2"}).init()
    (repo.path / "pageserver.toml").write_text("[storage]\ngc_horizon_bytes = 0\n")
    try:
        repo.run("start")
        tenant = repo.run("tenant", "create").stdout.strip()
        main = repo.state()["tenants"][tenant]["branches"]["main"]
        timeline = f"/v1/tenant/{tenant}/timeline/{main}"

        def gc() -> str:
            repo.http_post(f"{timeline}/checkpoint", {})
            repo.http_post(f"{timeline}/compact", {"force_l0": True, "force_image_layers": True})
            return repo.http_post(f"{timeline}/gc", {"pitr_window": "0s"})["cutoff_lsn"]
        yield repo, timeline, gc
    finally:
        repo.cleanup()


# Expected: the reads below the GC horizon of the replica the test leaves behind, its
# compute_ctl's lease refused for them, and its shutdown.
@pytest.mark.allowed_errors(r"requested LSN \S+ is below the garbage collection horizon",
                            r"could not lease the replay position from the pageserver's GC",
                            r"FATAL:  the database system is shutting down")
def test_gc_keeps_what_a_replica_reads_and_a_replica_left_behind_gets_a_clear_error(gc_repo):
    repo, timeline, gc = gc_repo
    primary = repo.run("endpoint", "start", "main").stdout.strip()
    with connect(primary) as p:
        p.execute("CREATE TABLE t (id int, x int) WITH (autovacuum_enabled = off)")
        p.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 100000) g")
    # A tiny buffer pool and no local file cache: the replica reads from the pageserver.
    # Replay waits for the replica's queries instead of cancelling them (the primary
    # holds back what the replica's snapshot reads once its hot standby feedback has
    # arrived; this covers the moment before). No parallel query: a failed read in the
    # leader ends its workers in ways (cannot attach, terminated) that vary run to run.
    replica = repo.run("endpoint", "start", "r1", "--replica", "-c", "shared_buffers=1MB", "-c", "fjord.file_cache_size=0",
                       "-c", "max_standby_streaming_delay=-1", "-c", "max_parallel_workers_per_gather=0").stdout.strip()
    with connect(primary) as p, connect(replica) as r:
        wait_replayed(r, str(one(p, "SELECT pg_current_wal_flush_lsn()")))
        r.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert one(r, "SELECT sum(x) FROM t") == 0
        for _ in range(3):
            p.execute("UPDATE t SET x = x + 1")
        end = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
        time.sleep(2)
        cutoff = gc()
        # GC did not pass the replica's replay position (its lease), and the replica's
        # old snapshot reads its rows as before.
        assert lsn_int(cutoff) <= lsn_int(replay_lsn(r)), (cutoff, replay_lsn(r))
        assert one(r, "SELECT sum(x) FROM t") == 0
        r.execute("COMMIT")
        wait_replayed(r, end)
        assert one(r, "SELECT sum(x) FROM t") == 3 * 100000
        # Freeze the replica and stop its compute_ctl (no more lease renewals): once the
        # lease lapses, GC passes it, and its reads fail with a clear error.
        r.execute("SELECT pg_wal_replay_pause()")
        wait_until("replay paused", lambda: one(r, "SELECT pg_get_wal_replay_pause_state()") == "paused")
        behind = replay_lsn(r)
        ctl = int((repo.path / "endpoints" / "r1" / "compute_ctl.pid").read_text())
        os.kill(ctl, signal.SIGSTOP)
        try:
            time.sleep(3)
            p.execute("UPDATE t SET x = x + 1")
            p.execute("UPDATE t SET x = x + 1")
            wait_until("GC past the replica", lambda: lsn_int(gc()) > lsn_int(behind), timeout_s=60, interval_s=0.5)
            with pytest.raises(psycopg.Error, match="garbage collection horizon"):
                r.execute("SELECT sum(x) FROM t").fetchone()
        finally:
            os.kill(ctl, signal.SIGCONT)


def test_a_compute_at_a_past_lsn_holds_gc_back_while_it_runs(gc_repo):
    """An `--at` compute reads every page at its LSN for as long as it runs: it leases that
    LSN before its basebackup and renews it, so GC never passes it and a long query
    started there reads the same rows from start to end."""
    repo, timeline, gc = gc_repo
    primary = repo.run("endpoint", "start", "main").stdout.strip()
    with connect(primary) as p:
        p.execute("CREATE TABLE t (id int, x int) WITH (autovacuum_enabled = off)")
        p.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 100000) g")
        at = str(one(p, "SELECT pg_current_wal_flush_lsn()"))
    old = repo.run("endpoint", "start", "old", "--at", at, "-c", "shared_buffers=1MB",
                   "-c", "fjord.file_cache_size=0").stdout.strip()
    leases = repo.http_post(f"{timeline}/lsn_lease", {"holder": "probe", "lsn": at, "ttl_secs": 1})["leases"]
    assert any(lease["holder"].startswith("endpoint old at ") and lease["lsn"] == at for lease in leases), leases
    with connect(primary) as p:
        for _ in range(3):
            p.execute("UPDATE t SET x = x + 1")
    time.sleep(3)  # longer than the lease's TTL: only renewals keep it
    cutoff = gc()
    assert lsn_int(cutoff) <= lsn_int(at), f"GC passed the running --at compute's LSN: cutoff {cutoff}, compute at {at}"
    with connect(old) as o:
        assert one(o, "SELECT sum(x) FROM t") == 0
    # Stopped, it holds nothing: GC goes past once the lease lapses.
    repo.run("endpoint", "stop", "old")
    wait_until("GC past the stopped compute's LSN", lambda: lsn_int(gc()) > lsn_int(at), timeout_s=60, interval_s=0.5)


def test_a_replica_sees_a_commit_that_raced_the_running_transactions_record(tmp_path, pageserver, safekeepers):
    """PostgreSQL writes a commit record, waits for it to be durable (here: two of three
    safekeepers), and only then takes the transaction out of the process array. A
    running-transactions record logged in between lists the transaction as running and
    gives a latestCompletedXid below it. A replica that started replay at that record never
    replayed the commit: its snapshots' xmax stayed at the transaction and the committed
    row was invisible until some newer transaction completed (seen in CI: a replica counted
    0 of 1000 rows after replaying past their commit). The pageserver now starts a
    replica's replay at the first such commit record before the running-transactions one."""
    from compute.test_walproposer import BackgroundStatement, wait_event
    from fixtures.compute import Endpoint, Timeline

    tl = Timeline(tmp_path, pageserver)
    ep = Endpoint(tmp_path, tl, safekeepers=safekeepers).start()
    # No autovacuum: a transaction completing after the commit would hide the bug.
    ep.sql("CREATE TABLE t (id int) WITH (autovacuum_enabled = off)")
    # Two safekeepers stop: the commit below is written but waits for the quorum, its
    # transaction still in the process array.
    stopped = safekeepers[1:]
    for sk in stopped:
        sk.proc.send_signal(signal.SIGSTOP)
    try:
        stmt = BackgroundStatement(ep, "INSERT INTO t VALUES (1)")
        wait_until("the commit to wait for the safekeepers", lambda: wait_event(ep, stmt.pid) == ("IPC", "SyncRep"))
        ep.sql("CHECKPOINT")  # its running-transactions record lists the INSERT as running
    finally:
        for sk in stopped:
            sk.proc.send_signal(signal.SIGCONT)
    wait_until("the commit to return", stmt.done, timeout_s=60)
    assert stmt.error is None, stmt.error
    stmt.close()
    end = ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0]
    wait_until("the pageserver to have the checkpoint", lambda: lsn_int(tl.status()["last_record_lsn"]) >= lsn_int(end))
    replica = Endpoint(tmp_path, tl, "replica", safekeepers=safekeepers, replica=True).start()
    with replica.connect() as r:
        wait_replayed(r, end)
        assert one(r, "SELECT count(*) FROM t") == 1
