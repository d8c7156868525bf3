"""Computes run with full-page writes off (docs/decisions/0012-full-page-writes-off.md).

The WAL then carries images only where PostgreSQL forces them, and every other page is
rebuilt by the pageserver from records alone: the visibility map's pages included, which
PostgreSQL extends without WAL and first sets bits on with a record that neither carries
an image nor initialises the page.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.paths import pg_bin_dir

# 16 buffers and a 128-page file cache: a table of a few hundred pages leaves both.
TINY = {"shared_buffers": "128kB", "fjord.file_cache_size": "1MB"}


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def wal_fpi_during_pgbench(ep: Endpoint) -> tuple[int, int, int]:
    """Full-page images, WAL bytes and transactions of a short pgbench read-write run."""
    before = ep.sql("SELECT wal_fpi, wal_bytes FROM pg_stat_wal")[0]
    r = subprocess.run(
        [str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user, "-t", "300", "-c", "2",
         "postgres"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # pgbench's backends report their WAL statistics as they exit: wait until they have.
    time.sleep(0.5)
    after = ep.sql("SELECT wal_fpi, wal_bytes FROM pg_stat_wal")[0]
    return after[0] - before[0], int(after[1] - before[1]), 600


def test_off_by_default_and_on_when_asked(tmp_path, timeline):
    ep = Endpoint(tmp_path, timeline, "ep").start()
    assert ep.sql("SHOW full_page_writes") == [("off",)]
    subprocess.run([str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user, "-i", "-s", "1",
                    "-q", "postgres"], check=True, capture_output=True, timeout=300)
    # A checkpoint makes every page's next change its first since the redo point: with
    # full-page writes on, each would be logged whole.
    ep.sql("CHECKPOINT")
    fpi_off, bytes_off, txns = wal_fpi_during_pgbench(ep)
    ep.stop()

    ep_on = Endpoint(tmp_path, timeline, "ep_on", settings={"full_page_writes": "on"}).start()
    assert ep_on.sql("SHOW full_page_writes") == [("on",)]
    ep_on.sql("CHECKPOINT")
    fpi_on, bytes_on, _ = wal_fpi_during_pgbench(ep_on)
    print(f"full-page writes off: {fpi_off} images, {bytes_off / txns:.0f} WAL bytes a transaction; "
          f"on: {fpi_on} images, {bytes_on / txns:.0f} bytes a transaction")
    # With them off, the only images are the ones PostgreSQL forces (none in pgbench's
    # transactions) and the compute's eviction images (none with a 128 MB pool).
    assert fpi_off == 0
    assert fpi_on > 50
    assert bytes_on > 2 * bytes_off
    ep_on.stop()


def assert_index_only_without_heap_fetches(ep: Endpoint) -> None:
    """An index-only scan of all of `t` that reads the map and never the heap."""
    with ep.connect() as conn:
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(id) FROM t WHERE id > 0").fetchall())
    assert "Index Only Scan" in plan and "Heap Fetches: 0" in plan, plan


def test_visibility_map_pages_are_rebuilt_without_images(tmp_path, timeline):
    """VACUUM sets all-visible bits on a new map page with a record that carries no image;
    a compute that does not hold the page reads it from the pageserver, whose redo must
    start from a zero page (without that: "no page image, and the oldest record does not
    initialize the page")."""
    ep = Endpoint(tmp_path, timeline, "ep", settings=TINY).start()
    ep.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    ep.sql("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 50000) g")
    ep.sql("VACUUM t")
    lsn = ep.sql("SELECT pg_current_wal_flush_lsn()")[0][0]
    ep.stop()

    # A new endpoint holds nothing: every map page comes from the pageserver.
    ep2 = Endpoint(tmp_path, timeline, "ep2", settings=TINY).start()
    ep2.sql("CREATE EXTENSION pg_visibility")
    all_visible, _ = ep2.sql("SELECT all_visible, all_frozen FROM pg_visibility_map_summary('t')")[0]
    pages = ep2.sql("SELECT pg_relation_size('t') / 8192")[0][0]
    assert all_visible == pages > 300, (all_visible, pages)
    assert_index_only_without_heap_fetches(ep2)
    # The same at the LSN right after the VACUUM, on a read-only endpoint.
    ep_at = Endpoint(tmp_path, timeline, "ep_at", settings=TINY, lsn=str(lsn)).start()
    assert_index_only_without_heap_fetches(ep_at)
    ep2.stop()
    ep_at.stop()
