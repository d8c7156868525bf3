"""The local file cache (LFC): pages on the compute's disk between shared_buffers and the
pageserver (extension/src/file_cache.rs), its reuse after a restart, and readahead.

What is shown: reads of cached pages never reach the pageserver; a cache far smaller than
the data evicts and stays correct under pgbench; truncation and drops leave nothing stale;
a missing directory, a file of the wrong size and a file that cannot be sized each give a
clear log line and fall back to the pageserver.
"""

from __future__ import annotations

import resource
import threading

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
    assert after_smgr["pageserver_requests"] - before_smgr["pageserver_requests"] < 10, (before_smgr, after_smgr)
    assert after_lfc["used_pages"] >= pages
    rows = ep.sql("SELECT le_us, count FROM fjord.getpage_latency()")
    assert len(rows) == 18 and rows[-1][0] is None and sum(c for _, c in rows) > 0, rows


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


# --- Reuse after a restart -------------------------------------------------------------

CACHED = {"shared_buffers": "128kB", "fjord.file_cache_size": "64MB"}


def table_sums(ep: Endpoint, tables: list[str]) -> dict:
    with ep.connect() as conn:
        return {t: conn.execute(f"SELECT count(*), sum(hashtext(v)), sum(id) FROM {t}").fetchone() for t in tables}


def compute_ctl_log(ep: Endpoint) -> str:
    return ep.logfile.read_text(errors="replace")


def test_the_cache_survives_a_restart(tmp_path, timeline, safekeepers):
    ep = Endpoint(tmp_path, timeline, "ep", settings=CACHED, safekeepers=safekeepers).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t (id int, v text)")
        conn.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 50000) g")
        pages = conn.execute("SELECT pg_relation_size('t') / 8192").fetchone()[0]
    expected = table_sums(ep, ["t"])
    ep.stop()
    assert "saved the local file cache's index for the next start" in ep.pg_log_text()

    ep.start()
    assert "reusing" in compute_ctl_log(ep), compute_ctl_log(ep)[-3000:]
    st = lfc_status(ep)
    assert st["restored"] >= pages, (pages, st)
    before = smgr_status(ep)
    assert table_sums(ep, ["t"]) == expected
    assert table_sums(ep, ["t"]) == expected
    after, st2 = smgr_status(ep), lfc_status(ep)
    # Served from the cache from the first query: no page of t from the pageserver.
    assert after["pageserver_requests"] - before["pageserver_requests"] < 20, (before, after)
    assert st2["hits"] - st["hits"] >= 2 * pages, (st, st2)
    assert st2["checksum_failures"] == 0


def test_a_drop_after_a_restart_drops_the_reused_pages(tmp_path, timeline, safekeepers):
    """Pages reused from before a restart count toward their fork like stored ones: a
    table dropped before anything read it again (no size cached) loses them all."""
    ep = Endpoint(tmp_path, timeline, "ep", settings=CACHED, safekeepers=safekeepers).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE keep (id int, v text)")
        conn.execute("CREATE TABLE gone (id int, v text)")
        for t in ("keep", "gone"):
            conn.execute(f"INSERT INTO {t} SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
        pages = conn.execute("SELECT pg_relation_size('gone') / 8192").fetchone()[0]
    expected = table_sums(ep, ["keep"])
    ep.stop()
    ep.start()
    st = lfc_status(ep)
    assert st["restored"] >= 2 * pages, (pages, st)
    with ep.connect() as conn:
        conn.execute("DROP TABLE gone")
    st2 = lfc_status(ep)
    assert st2["invalidations"] - st["invalidations"] >= pages, (pages, st, st2)
    # The DROP itself reads and stores a few catalog pages.
    assert st2["used_pages"] <= st["used_pages"] - pages + 20, (pages, st, st2)
    assert table_sums(ep, ["keep"]) == expected


def test_writes_the_cache_did_not_see_are_never_served(tmp_path, timeline, safekeepers):
    """Another endpoint writes to the branch between two starts of the first: every block
    it changed, truncated or dropped must come from the pageserver, not the cache."""
    ep1 = Endpoint(tmp_path, timeline, "ep1", settings=CACHED, safekeepers=safekeepers).start()
    with ep1.connect() as conn:
        for t in ("a", "b", "c", "d"):
            conn.execute(f"CREATE TABLE {t} (id int, v text) WITH (autovacuum_enabled = off)")
            conn.execute(f"INSERT INTO {t} SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
    table_sums(ep1, ["a", "b", "c", "d"])  # every page in the cache
    ep1.stop()

    ep2 = Endpoint(tmp_path, timeline, "ep2", settings=CACHED, safekeepers=safekeepers).start()
    with ep2.connect() as conn:
        conn.execute("UPDATE a SET v = 'changed' WHERE id % 7 = 0")
        conn.execute("DELETE FROM b WHERE id > 100")
        conn.execute("VACUUM b")
        conn.execute("INSERT INTO b SELECT g, 'again' || g FROM generate_series(101, 20000) g")
        conn.execute("DROP TABLE c")
        conn.execute("CREATE TABLE c (id int, v text)")
        conn.execute("INSERT INTO c SELECT g, 'new' || g FROM generate_series(1, 20000) g")
    expected = table_sums(ep2, ["a", "b", "c", "d"])
    ep2.stop()

    ep1.start()
    log = compute_ctl_log(ep1)
    assert "reusing" in log, log[-3000:]
    st = lfc_status(ep1)
    assert st["restored"] > 0, st
    assert table_sums(ep1, ["a", "b", "c", "d"]) == expected
    with ep1.connect() as conn:
        assert conn.execute("SELECT count(*) FROM a WHERE v = 'changed'").fetchone() == (20000 // 7,)
        assert conn.execute("SELECT count(*) FROM b WHERE v LIKE 'again%'").fetchone() == (19900,)
    assert lfc_status(ep1)["checksum_failures"] == 0
    assert amcheck_all(ep1) >= 0


# Expected: ep1 stops with two of three safekeepers down: its shutdown checkpoint cannot be
# acknowledged and times out.
@pytest.mark.allowed_errors(r"checkpoint before shutdown failed",
                            r"ERROR:  canceling statement due to statement timeout")
def test_a_cache_saved_past_the_durable_wal_misses_no_write_of_another_endpoint(tmp_path, timeline, safekeepers):
    """ep1 stops with WAL that no majority of safekeepers has (its shutdown checkpoint far
    past the durable LSN); the branch continues from the durable WAL with ep2's commits.
    The cached pages are current only as of the WAL the branch and ep1 share: every change
    ep2 made to them must be asked for, or ep1 serves its old pages and its next change to
    such a page logs a full-page image that erases ep2's committed update."""
    sk1, sk2, sk3 = safekeepers
    ep1 = Endpoint(tmp_path, timeline, "ep1", settings=CACHED, safekeepers=safekeepers).start()
    with ep1.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS fjord")
        # fillfactor 50: every update stays on its row's page (HOT), ~90 rows a page.
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text) WITH (fillfactor = 50, autovacuum_enabled = off)")
        conn.execute("INSERT INTO t SELECT g, 'old' FROM generate_series(1, 5000) g")
        pages = conn.execute("SELECT pg_relation_size('t') / 8192").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM t WHERE v = 'old'").fetchone() == (5000,)  # hint bits set
        conn.execute("CHECKPOINT")  # every page of t in the cache
        conn.execute("CREATE TABLE bulk (id int, v text) WITH (autovacuum_enabled = off)")
        # The LSN the cache's index will be saved with as durable covers t's pages.
        flushed = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
        wait_until("the WAL proposer's commit LSN to pass the checkpoint", lambda: conn.execute(
            "SELECT commit_lsn::pg_lsn >= %s FROM fjord.walproposer_status()", (flushed,)).fetchone()[0])
        durable = conn.execute("SELECT commit_lsn FROM fjord.walproposer_status()").fetchone()[0]

    # Two of three safekeepers down: ep1's WAL from here on never reaches a majority.
    sk2.stop()
    sk3.stop()
    with ep1.connect() as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("INSERT INTO bulk SELECT g, md5(g::text) FROM generate_series(1, 60000) g")
    ep1.stop()  # nothing it wrote since reaches a majority; the shutdown is clean all the same
    assert "saved the local file cache's index for the next start" in ep1.pg_log_text()

    # The branch goes on from the durable WAL without ep1's tail (sk1, which has some of
    # it, is down: the majority of sk2 and sk3 elects ep2), and ep2 updates t.
    sk1.stop()
    sk2.start()
    sk3.start()
    ep2 = Endpoint(tmp_path, timeline, "ep2", settings=CACHED, safekeepers=safekeepers).start()
    with ep2.connect() as conn:
        assert conn.execute("SELECT count(*) FROM bulk").fetchone() == (0,)
        conn.execute("UPDATE t SET v = 'ep2' WHERE id % 50 = 0")
    ep2.stop()
    sk1.start()

    ep1.start()
    log = compute_ctl_log(ep1)
    assert "reusing" in log, log[-3000:]
    with ep1.connect() as conn:
        seen_by_ep1 = conn.execute("SELECT count(*) FROM t WHERE v = 'ep2'").fetchone()[0]
        # A change to every page of t: each logs a full-page image of what ep1 holds.
        conn.execute("UPDATE t SET v = 'ep1' WHERE id % 50 = 1")
    ep1.stop()
    fresh = Endpoint(tmp_path, timeline, "fresh", settings=CACHED, safekeepers=safekeepers).start()
    with fresh.connect() as conn:
        committed = conn.execute("SELECT count(*) FILTER (WHERE v = 'ep2'), count(*) FILTER (WHERE v = 'ep1') FROM t").fetchone()
    assert (seen_by_ep1, committed) == (100, (100, 100)), (
        f"ep1 saw {seen_by_ep1} of ep2's 100 updated rows; after ep1's update the branch has {committed} "
        f"(ep2's, ep1's) of (100, 100); t has {pages} pages, ep1 was durable up to {durable}\n{log[-2000:]}")


# Expected: the damaged and foreign caches the test makes.
@pytest.mark.allowed_errors(r"local file cache .* starts empty, the saved one is discarded",
                            r"WARNING:  fjord: page in slot \d+ of the local file cache .* fails its check")
def test_a_damaged_or_foreign_cache_is_never_served(tmp_path, timeline, safekeepers):
    ep = Endpoint(tmp_path, timeline, "ep", settings=CACHED, safekeepers=safekeepers).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t (id int, v text)")
        conn.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
    expected = table_sums(ep, ["t"])
    ep.stop()
    cache = ep.dir / "file_cache"
    index = ep.dir / "file_cache.index"
    saved = index.read_bytes()

    # Pages damaged on disk: each fails its checksum and is read from the pageserver.
    size = cache.stat().st_size
    with open(cache, "r+b") as f:
        for off in range(0, size, 1 << 20):
            f.seek(off)
            f.write(b"\xff" * (1 << 20))
    ep.start()
    assert lfc_status(ep)["restored"] > 0
    assert table_sums(ep, ["t"]) == expected
    assert lfc_status(ep)["checksum_failures"] > 100
    assert "fails its checksum; reading it from the pageserver" in ep.pg_log_text()
    ep.stop()

    # A damaged index: discarded whole.
    index.write_bytes(saved[:100] + bytes([saved[100] ^ 1]) + saved[101:])
    ep.start()
    assert "the saved one is discarded" in compute_ctl_log(ep)
    assert lfc_status(ep)["restored"] == 0
    assert table_sums(ep, ["t"]) == expected
    ep.stop()

    # An index saved for another timeline (a branch's endpoint given the parent's cache).
    branch = Timeline(tmp_path, timeline.ps, ancestor=timeline)
    eb = Endpoint(tmp_path, branch, "eb", settings=CACHED, safekeepers=safekeepers)
    eb.dir.mkdir(parents=True, exist_ok=True)
    (eb.dir / "file_cache").write_bytes(cache.read_bytes())
    (eb.dir / "file_cache.index").write_bytes((ep.dir / "file_cache.index").read_bytes())
    eb.start()
    assert "it was saved for timeline" in compute_ctl_log(eb)
    assert lfc_status(eb)["restored"] == 0
    assert table_sums(eb, ["t"]) == expected


# --- Readahead ---------------------------------------------------------------------------


def test_a_sequential_scan_reads_ahead(tmp_path, timeline):
    ep = Endpoint(tmp_path, timeline, "writer", settings={"shared_buffers": "1MB"}).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t (id int, v text)")
        conn.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 100000) g")
        pages = conn.execute("SELECT pg_relation_size('t') / 8192").fetchone()[0]
        expected = conn.execute("SELECT count(*), sum(hashtext(v)) FROM t").fetchone()
    ep.stop()

    # A new endpoint: nothing cached, every page of t comes from the pageserver.
    reader = Endpoint(tmp_path, timeline, "reader", settings={"shared_buffers": "1MB"}).start()
    before = smgr_status(reader)
    with reader.connect() as conn:
        assert conn.execute("SELECT count(*), sum(hashtext(v)) FROM t").fetchone() == expected
    after = smgr_status(reader)
    hits = after["prefetch_hits"] - before["prefetch_hits"]
    assert hits >= pages * 0.9, (pages, before, after)
    assert after["prefetch_wasted"] - before["prefetch_wasted"] < pages * 0.05, (before, after)
    reader.stop()

    # Off: the same scan, one round trip per page.
    off = Endpoint(tmp_path, timeline, "off", settings={"shared_buffers": "1MB", "fjord.readahead": "0"}).start()
    with off.connect() as conn:
        assert conn.execute("SELECT count(*), sum(hashtext(v)) FROM t").fetchone() == expected
    assert smgr_status(off)["prefetch_requests"] == 0


def test_readahead_never_serves_a_page_changed_after_its_request(tmp_path, timeline):
    """Scans race with updates in other sessions under a tiny buffer pool and cache, so
    prefetched pages are often overtaken by newer versions; every result must be exact."""
    ep = Endpoint(tmp_path, timeline, settings={"shared_buffers": "128kB", "fjord.file_cache_size": "1MB"}).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
        conn.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 20000) g")
    stop = threading.Event()
    errors: list[BaseException] = []

    def updater(k: int):
        try:
            with ep.connect() as c:
                while not stop.is_set():
                    # Each statement adds 1 to a quarter of the rows: 5000 to sum(n).
                    c.execute("UPDATE t SET n = n + 1 WHERE id %% 4 = %s", (k,))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=updater, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    try:
        with ep.connect() as conn:
            for _ in range(15):
                count, total = conn.execute("SELECT count(*), sum(n) FROM t").fetchone()
                assert count == 20000
                # Each completed UPDATE adds 5000; a scan sees whole statements only.
                assert total % 5000 == 0, total
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert not errors, errors
    st = smgr_status(ep)
    assert st["prefetch_hits"] > 0, st


def test_the_automatic_size_is_kept_across_restarts(tmp_path, timeline, safekeepers):
    """With the default size (-1), a restart keeps the existing file's size even though the
    free disk changed, so the saved cache is not discarded as the wrong size."""
    ep = Endpoint(tmp_path, timeline, "ep", settings={"shared_buffers": "128kB"}, safekeepers=safekeepers).start()
    with ep.connect() as conn:
        conn.execute("CREATE TABLE t AS SELECT g AS id, md5(g::text) AS v FROM generate_series(1, 20000) g")
    size = lfc_status(ep)["size_bytes"]
    ep.stop()
    # Use some of the disk (the file cache's own pages already did).
    (tmp_path / "ballast").write_bytes(b"\0" * (64 << 20))
    ep.start()
    st = lfc_status(ep)
    assert st["size_bytes"] == size and st["restored"] > 0, (size, st)
    assert "contents are discarded" not in ep.pg_log_text()
