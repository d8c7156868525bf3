"""The local file cache (LFC): pages on the compute's disk between shared_buffers and the
pageserver (extension/src/file_cache.rs).

What is shown: reads of cached pages never reach the pageserver; a cache far smaller than
the data evicts and stays correct under pgbench; truncation and drops leave nothing stale;
a missing directory, a file of the wrong size and a file that cannot be sized each give a
clear log line and fall back to the pageserver.
"""

from __future__ import annotations

import resource

import pytest

from compute.test_compute import amcheck_all, pgbench, smgr_status
from fixtures.compute import Endpoint, Timeline
from fixtures.postgres import wait_until


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def lfc_status(ep: Endpoint) -> dict:
    with ep.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS fjord")
        cur = conn.execute("SELECT * FROM fjord.file_cache_status()")
        return dict(zip([d.name for d in cur.description], cur.fetchone()))


def test_cached_pages_are_read_without_the_pageserver(tmp_path, timeline):
    ep = Endpoint(tmp_path, timeline, settings={"shared_buffers": "128kB", "fjord.file_cache_size": "64MB"}).start()
    st = lfc_status(ep)
    assert st["enabled"] and st["size_bytes"] == 64 << 20, st
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 50000) g")
        pages = conn.execute("SELECT pg_relation_size('t') / 8192").fetchone()[0]
        expected = conn.execute("SELECT count(*), sum(hashtext(v)) FROM t").fetchone()
    before_smgr, before_lfc = smgr_status(ep), lfc_status(ep)
    with ep.connect() as conn:
        for _ in range(3):
            assert conn.execute("SELECT count(*), sum(hashtext(v)) FROM t").fetchone() == expected
    after_smgr, after_lfc = smgr_status(ep), lfc_status(ep)
    # Three scans of a table 25 times larger than shared_buffers: every page from the
    # cache, none from the pageserver.
    assert after_lfc["hits"] - before_lfc["hits"] >= 3 * pages * 0.9, (pages, before_lfc, after_lfc)
    assert after_smgr["remote_requests"] - before_smgr["remote_requests"] < 10, (before_smgr, after_smgr)
    assert after_lfc["used_pages"] >= pages


def test_a_tiny_file_cache_evicts_and_stays_correct(tmp_path, timeline):
    # 1 MB: 128 pages, far below pgbench's 2 x 16 MB; most reads go to the pageserver.
    ep = Endpoint(tmp_path, timeline, settings={"shared_buffers": "128kB", "fjord.file_cache_size": "1MB"}).start()
    pgbench(ep, "-i", "-s", "2", "-q")
    pgbench(ep, "-c", "4", "-t", "300", "-n")
    with ep.connect() as conn:
        accounts, history, branches, tellers = conn.execute(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(delta) FROM pgbench_history), "
            "(SELECT sum(bbalance) FROM pgbench_branches), (SELECT sum(tbalance) FROM pgbench_tellers)"
        ).fetchone()
        assert accounts == history == branches == tellers
    st = lfc_status(ep)
    assert st["enabled"] and st["evictions"] > 1000 and st["hits"] > 0, st
    assert st["used_pages"] <= 128
    assert amcheck_all(ep) >= 3
    assert "the local file cache is full (1 MB)" in ep.pg_log_text()


def test_truncation_and_drops_leave_no_stale_pages(tmp_path, timeline):
    ep = Endpoint(tmp_path, timeline, settings={"shared_buffers": "128kB", "fjord.file_cache_size": "64MB"}).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t (id int, v text) WITH (autovacuum_enabled = off)")
        conn.execute("INSERT INTO t SELECT g, 'old' || g FROM generate_series(1, 20000) g")
        assert conn.execute("SELECT count(*) FROM t WHERE v LIKE 'old%'").fetchone() == (20000,)
        # VACUUM cuts the empty tail off; new rows extend the table again over the same
        # block numbers, which the cache had with the old rows.
        conn.execute("DELETE FROM t WHERE id > 100")
        size_before = conn.execute("SELECT pg_relation_size('t')").fetchone()[0]
        conn.execute("VACUUM t")
        assert conn.execute("SELECT pg_relation_size('t')").fetchone()[0] < size_before / 10
        inv = lfc_status(ep)["invalidations"]
        assert inv > 0
        conn.execute("INSERT INTO t SELECT g, 'new' || g FROM generate_series(101, 20000) g")
        assert conn.execute("SELECT count(*) FILTER (WHERE v LIKE 'old%'), count(*) FROM t").fetchone() == (100, 20000)
        assert conn.execute("SELECT count(*) FROM t WHERE v = 'old' || id").fetchone() == (100,)
        conn.execute("CREATE DATABASE other")
    with ep.connect("other") as conn:
        conn.execute("CREATE TABLE o AS SELECT g FROM generate_series(1, 30000) g")
        assert conn.execute("SELECT sum(g) FROM o").fetchone() == (sum(range(30001)),)
    used = lfc_status(ep)["used_pages"]
    with ep.connect() as conn:
        conn.execute("DROP DATABASE other")
        conn.execute("DROP TABLE t")
    st = lfc_status(ep)
    assert st["used_pages"] < used - 100, (used, st)
    assert amcheck_all(ep) >= 0


def test_a_missing_directory_turns_the_cache_off_with_a_log_line(tmp_path, timeline):
    path = tmp_path / "no-such-dir" / "cache"
    ep = Endpoint(tmp_path, timeline, settings={"fjord.file_cache_path": str(path)}).start()
    assert ep.sql("SELECT count(*) FROM pg_class")[0][0] > 100
    assert not lfc_status(ep)["enabled"]
    assert f'the local file cache is off: its directory "{path.parent}" does not exist' in ep.pg_log_text()


def test_a_cache_file_of_the_wrong_size_is_discarded(tmp_path, timeline):
    path = tmp_path / "cache"
    path.write_bytes(b"\xab" * 12345)
    ep = Endpoint(tmp_path, timeline, settings={"fjord.file_cache_path": str(path), "fjord.file_cache_size": "8MB"}).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 10000) g")
        assert conn.execute("SELECT sum(g) FROM t").fetchone() == (sum(range(10001)),)
    assert lfc_status(ep)["enabled"]
    assert path.stat().st_size == 8 << 20
    assert "has 12345 bytes, 8388608 expected" in ep.pg_log_text()


def test_a_cache_file_that_cannot_be_sized_turns_the_cache_off(tmp_path, timeline):
    # A file size limit below the cache's size (RLIMIT_FSIZE, as a full or small disk
    # would): the file cannot be made that large. PostgreSQL ignores SIGXFSZ.
    limit = 64 << 20
    ep = Endpoint(tmp_path, timeline, settings={"fjord.file_cache_size": "256MB"},
                  preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 10000) g")
        assert conn.execute("SELECT sum(g) FROM t").fetchone() == (sum(range(10001)),)
    assert not lfc_status(ep)["enabled"]
    wait_until("the log line", lambda: "the local file cache is off: cannot size" in ep.pg_log_text())
