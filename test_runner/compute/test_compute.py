"""A stateless compute on a real pageserver: SQL, pgbench with a tiny buffer pool, crashes
of the compute and restarts of the pageserver.

Each compute is started by compute_ctl from a basebackup; permanent relations have no
local files and every page the buffer pool does not hold comes from the pageserver.
"""

from __future__ import annotations

import subprocess
import threading
import time

import psycopg
import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.logs import unexpected_lines
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until

# The minimum PostgreSQL accepts: 16 buffers of 8 KiB, and a local file cache of 128 pages.
TINY = {"shared_buffers": "128kB", "fjord.file_cache_size": "1MB"}


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def pgbench(ep: Endpoint, *args: str, timeout: int = 600) -> str:
    r = subprocess.run(
        [str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user, *args, "postgres"],
        capture_output=True, text=True, timeout=timeout,
    )
    assert r.returncode == 0, f"pgbench {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def smgr_status(ep: Endpoint) -> dict:
    with ep.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS fjord")
        cur = conn.execute("SELECT * FROM fjord.storage_manager()")
        return dict(zip([d.name for d in cur.description], cur.fetchone()))


def amcheck_all(ep: Endpoint, dbname: str = "postgres") -> int:
    """bt_index_check on every B-tree index; returns how many were checked."""
    with ep.connect(dbname) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        idx = conn.execute(
            "SELECT c.oid::regclass FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'btree' AND c.relpersistence <> 't'"
        ).fetchall()
        for (name,) in idx:
            conn.execute("SELECT bt_index_check(%s, true)", (name,))
    return len(idx)


def test_sql_on_a_stateless_compute(tmp_path, timeline):
    ep = Endpoint(tmp_path, timeline).start()
    status = smgr_status(ep)
    assert status["active"] and status["mode"] == "pageserver"
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, repeat('x', g % 100) FROM generate_series(1, 20000) g")
        conn.execute("CREATE INDEX t_v ON t (v)")
        conn.execute("DELETE FROM t WHERE id % 3 = 0")
        conn.execute("VACUUM t")
        assert conn.execute("SELECT count(*), sum(id) FROM t").fetchone() == (13334, sum(i for i in range(1, 20001) if i % 3))
        assert conn.execute("SELECT v FROM t WHERE id = 77").fetchone() == ("x" * 77,)
        conn.execute("CREATE DATABASE other")
        relfile = conn.execute("SELECT pg_relation_filepath('t')").fetchone()[0]
        assert conn.execute("SELECT pg_relation_size('t')").fetchone()[0] > 0
    # Permanent relations have no local files.
    assert not (ep.pgdata / relfile).exists()
    with ep.connect("other") as conn:
        conn.execute("CREATE TABLE o AS SELECT g FROM generate_series(1, 1000) g")
        assert conn.execute("SELECT count(*) FROM o").fetchone() == (1000,)
    # Temporary and unlogged relations live on local disk.
    with ep.connect() as conn:
        conn.execute("CREATE UNLOGGED TABLE u AS SELECT g FROM generate_series(1, 5000) g")
        conn.execute("CREATE TEMP TABLE tmp AS SELECT g FROM generate_series(1, 5000) g")
        assert conn.execute("SELECT (SELECT count(*) FROM u) + (SELECT count(*) FROM tmp)").fetchone() == (10000,)
        ufile = conn.execute("SELECT pg_relation_filepath('u')").fetchone()[0]
    assert (ep.pgdata / ufile).exists()
    assert smgr_status(ep)["pageserver_requests"] > 0
    assert amcheck_all(ep) > 0

    # A new compute on the same timeline sees everything committed.
    ep.stop()
    ep2 = Endpoint(tmp_path, timeline, "ep2").start()
    assert ep2.sql("SELECT count(*) FROM t")[0][0] == 13334
    assert ep2.sql("SELECT count(*) FROM o", dbname="other")[0][0] == 1000
    # An unlogged table comes back empty, as after a crash.
    assert ep2.sql("SELECT count(*) FROM u")[0][0] == 0
    assert unexpected_lines(ep2.pg_log_text()) == []


def test_pgbench_with_a_tiny_buffer_pool(tmp_path, timeline):
    ep = Endpoint(tmp_path, timeline, settings=TINY).start()
    pgbench(ep, "-i", "-s", "2", "-q")
    pgbench(ep, "-c", "4", "-t", "200", "-n")
    with ep.connect() as conn:
        accounts, history = conn.execute(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(delta) FROM pgbench_history)"
        ).fetchone()
        assert accounts == history
        assert conn.execute("SELECT count(*) FROM pgbench_history").fetchone() == (800,)
    status = smgr_status(ep)
    # With 16 buffers nearly every access reads from the pageserver.
    assert status["reads"] > 10000, status
    assert amcheck_all(ep) >= 3


def test_command_ids_survive_eviction(tmp_path, timeline):
    """An UPDATE in the transaction that inserted the rows, with pages evicted in between:
    if evicted pages came back without their cmin/cmax, the UPDATE would see (and update
    again) the row versions it has just written."""
    ep = Endpoint(tmp_path, timeline, settings=TINY).start()
    with ep.connect(autocommit=False) as conn:
        conn.execute("CREATE TABLE h (id int, x int)")
        conn.execute("INSERT INTO h SELECT g, 0 FROM generate_series(1, 30000) g")
        conn.execute("UPDATE h SET x = x + 1")
        conn.execute("UPDATE h SET x = x + 1 WHERE id % 2 = 0")
        assert conn.execute("SELECT sum(x), count(*) FROM h").fetchone() == (45000, 30000)
        conn.commit()
    assert ep.sql("SELECT sum(x), count(*) FROM h")[0] == (45000, 30000)
    assert smgr_status(ep)["eviction_images"] > 0


def test_kill9_compute_keeps_acknowledged_commits(tmp_path, timeline):
    ep = Endpoint(tmp_path, timeline, settings=TINY).start()
    ep.sql("CREATE TABLE ledger (id int PRIMARY KEY, pad text)")
    acked: list[int] = []
    stop = threading.Event()

    def writer():
        try:
            with ep.connect() as conn:
                i = 0
                while not stop.is_set():
                    i += 1
                    conn.execute("INSERT INTO ledger VALUES (%s, repeat('p', 200))", (i,))
                    acked.append(i)
        except psycopg.Error:
            pass  # the compute was killed under us

    t = threading.Thread(target=writer)
    t.start()
    wait_until("some commits", lambda: len(acked) > 300, timeout_s=120)
    ep.kill()
    stop.set()
    t.join()
    ep2 = Endpoint(tmp_path, timeline, "ep2").start()
    present = {r[0] for r in ep2.sql("SELECT id FROM ledger")}
    missing = [i for i in acked if i not in present]
    assert missing == [], f"{len(missing)} acknowledged commits lost, first {missing[:10]}"
    assert amcheck_all(ep2) >= 1


def test_pageserver_restart_under_load(tmp_path, timeline, pageserver):
    """A page request that fails for connection trouble is retried on a fresh connection until
    fjord.pageserver_timeout (60 s by default) has passed, so a pageserver that is down for a
    second costs time, never a failed transaction: pgbench must end with status 0 and no
    error at all, and keep committing after the restart. Read-write clients wait at their
    commits while the pageserver (the synchronous standby) is down and find their page
    service connections closed afterwards; a select-only client reads pages during the
    outage."""
    ep = Endpoint(tmp_path, timeline, settings=TINY).start()
    pgbench(ep, "-i", "-s", "1", "-q")
    results: dict = {}

    def load(name: str, *args: str):
        r = subprocess.run(
            [str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user,
             *args, "-T", "12", "-n", "postgres"],
            capture_output=True, text=True, timeout=300,
        )
        results[name] = (r.returncode, r.stdout + r.stderr)

    threads = [threading.Thread(target=load, args=("read-write", "-c", "2")),
               threading.Thread(target=load, args=("select-only", "-S", "-c", "1"))]
    for t in threads:
        t.start()
    time.sleep(3)
    pageserver.stop()
    time.sleep(1)
    pageserver.start()
    restarted_at = ep.sql("SELECT now()")[0][0]
    for t in threads:
        t.join()
    for name, (rc, out) in results.items():
        assert rc == 0, f"{name} pgbench exited with {rc}:\n{out}"
        assert "error" not in out.lower() and "abort" not in out.lower(), f"{name}:\n{out}"
    # Queries resume: the compute reconnects without a restart.
    with ep.connect() as conn:
        accounts, history = conn.execute(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(delta) FROM pgbench_history)"
        ).fetchone()
        assert accounts == history
        after = conn.execute("SELECT count(*) FROM pgbench_history WHERE mtime > %s", (restarted_at,)).fetchone()[0]
        assert after > 0, "pgbench committed nothing after the pageserver's restart"
    assert smgr_status(ep)["pageserver_reconnects"] >= 2


# The database's permanent relations in its default tablespace, every fork the pageserver
# stores (main, visibility map, init): what pg_database_size() counts on a compute.
REMOTE_RELATIONS_SIZE = (
    "SELECT coalesce(sum(pg_relation_size(c.oid, 'main') + pg_relation_size(c.oid, 'vm') "
    "+ pg_relation_size(c.oid, 'init')), 0)::bigint FROM pg_class c "
    "WHERE c.relpersistence = 'p' AND NOT c.relisshared AND c.reltablespace = 0 "
    "AND pg_relation_filenode(c.oid) IS NOT NULL"
)


def test_database_size_comes_from_the_pageserver(tmp_path, timeline, pageserver):
    """pg_database_size() on a compute (patch 0007's hook) is the pageserver's count of the
    database's stored forks: it agrees with the sum of pg_relation_size over the database's
    permanent relations (free space maps are local files, counted by neither), and it grows
    by a bulk insert's size."""
    ep = Endpoint(tmp_path, timeline, settings=TINY).start()

    def sizes() -> tuple[int, int]:
        with ep.connect() as conn:
            conn.execute("CHECKPOINT")
            return conn.execute(f"SELECT pg_database_size(current_database()), ({REMOTE_RELATIONS_SIZE})").fetchone()

    db, rels = sizes()
    # initdb's catalogs: several megabytes, none of them local files on a compute.
    assert db > 4 * 1024 * 1024, db
    assert abs(db - rels) <= 256 * 1024, (db, rels)

    ep.sql("CREATE TABLE bulk (id int, pad text)")
    ep.sql("INSERT INTO bulk SELECT g, repeat('b', 200) FROM generate_series(1, 40000) g")
    ep.sql("VACUUM bulk")
    table = ep.sql("SELECT pg_relation_size('bulk')")[0][0]
    assert table > 8 * 1024 * 1024, table
    db2, rels2 = sizes()
    assert abs(db2 - rels2) <= 256 * 1024, (db2, rels2)
    assert db2 - db >= table, (db, db2, table)
    print(f"pg_database_size {db} -> {db2}, relations {rels} -> {rels2}, bulk {table}")


# Expected: the error the test provokes.
@pytest.mark.allowed_errors(r"FATAL:  fjord: could not reach the pageserver")
def test_unreachable_pageserver_is_a_clear_error(tmp_path, timeline, pageserver):
    ep = Endpoint(tmp_path, timeline, settings={**TINY, "fjord.pageserver_timeout": "2s"}).start()
    ep.sql("CREATE TABLE big AS SELECT g, repeat('z', 500) AS pad FROM generate_series(1, 5000) g")
    pageserver.stop()
    with pytest.raises(psycopg.Error) as e:
        ep.sql("SELECT count(*) FROM big")
    assert "could not reach the pageserver" in str(e.value)
    # The compute stays up and works again once the pageserver is back.
    pageserver.start()
    assert ep.sql("SELECT count(*) FROM big")[0][0] == 5000


@pytest.mark.parametrize("persistence", ["", "UNLOGGED"])
def test_index_builds_larger_than_the_buffer_pool(tmp_path, timeline, persistence):
    """GiST, SP-GiST and GIN build without WAL and log the index at the end; pages that
    leave a 64-buffer pool mid-build must come back as they left (an image at eviction
    for permanent indexes; local files for an unlogged table's). 16 buffers are too few
    for a GIN build ("no unpinned buffers available", as on plain PostgreSQL), and 32 were
    once too few too, with autovacuum working on the new table at the same time."""
    ep = Endpoint(tmp_path, timeline, settings={"shared_buffers": "512kB"}).start()
    with ep.connect() as conn:
        conn.execute(f"CREATE {persistence} TABLE geo AS SELECT g AS id, point(g % 317, g / 317) AS p, "
                     "ARRAY[g % 13, g % 17] AS a FROM generate_series(1, 60000) g")
        conn.execute("CREATE INDEX geo_gist ON geo USING gist (p)")
        conn.execute("CREATE INDEX geo_spgist ON geo USING spgist (p)")
        conn.execute("CREATE INDEX geo_gin ON geo USING gin (a)")
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = on")
        box = conn.execute("SELECT count(*) FROM geo WHERE p <@ box '((10,10),(50,50))'").fetchone()[0]
        arr = conn.execute("SELECT count(*) FROM geo WHERE a @> ARRAY[5]").fetchone()[0]
        conn.execute("SET enable_seqscan = on")
        conn.execute("SET enable_indexscan = off")
        conn.execute("SET enable_bitmapscan = off")
        assert conn.execute("SELECT count(*) FROM geo WHERE p <@ box '((10,10),(50,50))'").fetchone()[0] == box
        assert conn.execute("SELECT count(*) FROM geo WHERE a @> ARRAY[5]").fetchone()[0] == arr
        assert box > 0 and arr > 60000 // 13
        index_file = conn.execute("SELECT pg_relation_filepath('geo_gist')").fetchone()[0]
    assert (ep.pgdata / index_file).exists() == (persistence == "UNLOGGED")
    assert unexpected_lines(ep.pg_log_text()) == []


def test_databases_created_and_dropped(tmp_path, timeline):
    ep = Endpoint(tmp_path, timeline, settings=TINY).start()
    for i in range(3):
        ep.sql(f"CREATE DATABASE d{i}")
        ep.sql("CREATE TABLE t AS SELECT g FROM generate_series(1, 2000) g", dbname=f"d{i}")
        assert ep.sql("SELECT count(*) FROM t", dbname=f"d{i}")[0][0] == 2000
        ep.sql(f"DROP DATABASE d{i}")
    ep.sql("CREATE DATABASE d0")
    assert ep.sql("SELECT count(*) FROM pg_class WHERE relname = 't'", dbname="d0")[0][0] == 0
