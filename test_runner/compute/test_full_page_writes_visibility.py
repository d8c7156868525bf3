"""Full-page writes off and the visibility map (docs/decisions/0012-full-page-writes-off.md).

With full-page writes off every page the pageserver serves is rebuilt from records alone,
except where PostgreSQL forces an image. These tests drive the cases where a fork's size,
as ingest knows it, decides whether a visibility-map record starts from a zero page, and
then check that a compute that holds nothing reads exactly the bits the writer had, that
every block of every fork can be rebuilt, and that the pageserver can make an image of
every key it holds.
"""

from __future__ import annotations

import hashlib
import time

import psycopg
import pytest

from fixtures.compute import Endpoint, Timeline

# 16 buffers and a 1 MB file cache: pages leave both all the time.
TINY = {"shared_buffers": "128kB", "fjord.file_cache_size": "1MB", "autovacuum": "off"}
# Heap blocks per visibility-map page (8 KiB pages): map block 1 starts at heap block 32672.
HEAPBLOCKS_PER_PAGE = 32672


@pytest.fixture
def timeline(tmp_path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def lsn(conn: psycopg.Connection) -> str:
    return str(conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0])


def vm_digest(conn: psycopg.Connection, table: str) -> tuple[int, int, str]:
    """(heap blocks, all-visible blocks, digest of every block's two map bits)."""
    rows = conn.execute(f"SELECT blkno, all_visible, all_frozen FROM pg_visibility_map('{table}') ORDER BY blkno").fetchall()
    h = hashlib.sha256()
    for blkno, v, f in rows:
        h.update(f"{blkno}:{int(v)}{int(f)};".encode())
    return len(rows), sum(1 for r in rows if r[1]), h.hexdigest()


def wrong_bits(conn: psycopg.Connection, table: str) -> list:
    """Tuples the map says are all-visible (or all-frozen) but are not."""
    bad = conn.execute(f"SELECT 'visible', t_ctid FROM pg_check_visible('{table}')").fetchall()
    bad += conn.execute(f"SELECT 'frozen', t_ctid FROM pg_check_frozen('{table}')").fetchall()
    return bad


def read_every_fork(conn: psycopg.Connection, max_blocks: int = 5000) -> int:
    """Reads every block of every fork (of at most `max_blocks`) of every permanent relation
    of the database through the storage manager (pg_prewarm's read mode: smgrread, no buffer
    pool); returns blocks."""
    rels = conn.execute(
        "SELECT c.oid, f FROM pg_class c, unnest(ARRAY['main', 'vm', 'init']) f "
        "WHERE c.relpersistence = 'p' AND c.relkind IN ('r', 'i', 't', 'm', 'S') "
        "AND pg_relation_size(c.oid, f) BETWEEN 1 AND %s * 8192", (max_blocks,)).fetchall()
    total = 0
    for oid, fork in rels:
        total += conn.execute("SELECT pg_prewarm(%s::regclass, 'read', %s)", (oid, fork)).fetchone()[0]
    return total


def vacuum_until_truncated(conn: psycopg.Connection, below: int) -> int:
    """VACUUM until the heap is shorter than `below` blocks (a replica's hot standby
    feedback may hold the dead tuples for a moment); returns its length."""
    for _ in range(60):
        conn.execute("VACUUM v")
        pages = conn.execute("SELECT pg_relation_size('v') / 8192").fetchone()[0]
        if pages < below:
            return pages
        time.sleep(0.5)
    return pages


def vm_scenario(ep: Endpoint, restart) -> tuple[list, int]:
    """The writer's side of the two-map-page scenario (see the tests); returns the steps
    (name, LSN, the writer's map digest) and the final row count."""
    steps: list[tuple[str, str, tuple]] = []
    with ep.connect() as conn:
        for ext in ("pg_visibility", "pg_prewarm", "amcheck"):
            conn.execute(f"CREATE EXTENSION IF NOT EXISTS {ext}")
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE v (id int, pad text) WITH (fillfactor = 10, autovacuum_enabled = off)")
        with conn.cursor().copy("COPY v FROM STDIN (FREEZE)") as copy:
            for i in range(1, 33001):
                copy.write(f"{i}\t{'p' * 500}\n")
        conn.execute("COMMIT")
        pages = conn.execute("SELECT pg_relation_size('v') / 8192").fetchone()[0]
        assert pages > HEAPBLOCKS_PER_PAGE + 100, pages
        assert conn.execute("SELECT pg_relation_size('v', 'vm') / 8192").fetchone()[0] == 2
        conn.execute("CREATE INDEX v_id ON v (id)")
        steps.append(("frozen load", lsn(conn), vm_digest(conn, "v")))

        # Changes on both map pages, then VACUUM sets the bits again.
        conn.execute("DELETE FROM v WHERE id % 1000 = 7")
        conn.execute("VACUUM v")
        steps.append(("delete and vacuum", lsn(conn), vm_digest(conn, "v")))

        # Empty the tail: VACUUM marks the empty pages all-visible, then truncates the heap
        # below block 32672 and the map to one page: the second map page's last version
        # keeps its bits set for heap blocks that no longer exist.
        conn.execute("DELETE FROM v WHERE id > 32000")
        pages = vacuum_until_truncated(conn, HEAPBLOCKS_PER_PAGE)
        assert pages < HEAPBLOCKS_PER_PAGE, pages
        assert conn.execute("SELECT pg_relation_size('v', 'vm') / 8192").fetchone()[0] == 1
        steps.append(("truncated", lsn(conn), vm_digest(conn, "v")))

    # Ingest starts again from what is on disk: its fork sizes come from the store.
    restart()

    with ep.connect() as conn, ep.connect() as holder:
        # Grow past heap block 32672 again; the last rows come after a snapshot that keeps
        # them from being all-visible, so the second map page's old bits for them must not
        # come back.
        conn.execute("INSERT INTO v SELECT g, repeat('q', 500) FROM generate_series(40001, 40800) g")
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")
        conn.execute("INSERT INTO v SELECT g, repeat('r', 500) FROM generate_series(50001, 50200) g")
        conn.execute("DELETE FROM v WHERE id BETWEEN 50101 AND 50200")
        conn.execute("VACUUM v")
        pages = conn.execute("SELECT pg_relation_size('v') / 8192").fetchone()[0]
        assert pages > HEAPBLOCKS_PER_PAGE + 50, pages
        steps.append(("regrown under a snapshot", lsn(conn), vm_digest(conn, "v")))
        holder.execute("COMMIT")
        conn.execute("DELETE FROM v WHERE id % 100 = 3")
        conn.execute("VACUUM v")
        steps.append(("final", lsn(conn), vm_digest(conn, "v")))
        writer_bad = wrong_bits(conn, "v")
        count = conn.execute("SELECT count(*) FROM v").fetchone()[0]
    assert writer_bad == [], writer_bad
    return steps, count


def check_reader(ep: Endpoint, expected: tuple, count: int) -> None:
    """A compute that reads the table's map and pages: the writer's bits exactly, no bit
    for a tuple that is not all-visible, an index-only count equal to the rows'."""
    with ep.connect() as conn:
        got = vm_digest(conn, "v")
        # pg_check_visible's horizon on a hot standby is not the primary's (PostgreSQL 15
        # reports false positives there): the index-only count below is the check.
        bad = [] if ep.replica else wrong_bits(conn, "v")
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        ios = conn.execute("SELECT count(*) FROM v WHERE id > 0").fetchone()[0]
        blocks = read_every_fork(conn)
        conn.execute("SELECT bt_index_check('v_id', true)")
    print(f"{ep.name}: {blocks} blocks read; map {got}")
    assert bad == [], f"{ep.name}: the map says all-visible for tuples that are not: {bad[:10]}"
    assert got == expected, (ep.name, got, expected)
    assert ios == count, (ep.name, ios, count)


def test_visibility_map_after_truncation_restart_and_a_second_map_page(tmp_path, timeline, pageserver):
    """A table of 33,000 one-row pages (two map pages), loaded with COPY FREEZE (a
    `HEAP2_VISIBLE` per page at load time), then truncated by VACUUM below the second map
    page's first heap block (the map is cut to one page: the second's old bits must never
    come back), the pageserver killed (ingest's fork sizes rebuilt from the store), the
    table grown again past it with some rows a snapshot keeps from being all-visible, and
    VACUUMed. A fresh compute must read the writer's bits exactly, never a bit for a tuple
    that is not all-visible, and every block of every fork; a read-only compute at each
    step likewise; the pageserver must be able to make an image of every key."""
    ep = Endpoint(tmp_path, timeline, "ep", settings=TINY).start()

    def restart():
        pageserver.kill()
        pageserver.start()

    steps, count = vm_scenario(ep, restart)
    ep.stop()

    fresh = Endpoint(tmp_path, timeline, "fresh", settings=TINY).start()
    check_reader(fresh, steps[-1][2], count)
    fresh.stop()

    for i, (name, at, expected) in enumerate(steps[:-1]):
        past = Endpoint(tmp_path, timeline, f"at{i}", settings=TINY, lsn=at).start()
        with past.connect() as conn:
            got = vm_digest(conn, "v")
        past.stop()
        assert got == expected, (name, got, expected)

    # Image layers of every key at the newest LSN: every version chain must rebuild.
    pageserver.http("POST", f"{timeline.path}/compact", {"force_l0": True, "force_image_layers": True})


def test_a_replica_reads_the_same_visibility_map(tmp_path, timeline, pageserver, safekeepers):
    """The same scenario through safekeepers, with a replica with tiny caches replaying
    all of it from the start: its map must be the primary's, with no bit for a tuple that
    is not all-visible."""
    ep = Endpoint(tmp_path, timeline, "ep", settings=TINY, safekeepers=safekeepers).start()
    for ext in ("pg_visibility", "pg_prewarm", "amcheck", "bloom"):
        ep.sql(f"CREATE EXTENSION {ext}")
    ep.sql("CHECKPOINT")
    replica = Endpoint(tmp_path, timeline, "replica", settings=SMALL, safekeepers=safekeepers, replica=True).start()
    steps, count = vm_scenario(ep, lambda: None)
    end = steps[-1][1]
    from fixtures.postgres import wait_until
    wait_until("the replica to replay the workload",
               lambda: replica.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", end)[0][0], timeout_s=120)
    check_reader(replica, steps[-1][2], count)
    replica.stop()
    ep.stop()


def table_digests(conn: psycopg.Connection) -> dict[str, str]:
    """A digest of every user table's rows (in a fixed order)."""
    out = {}
    for (t,) in conn.execute("SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                             "WHERE c.relkind = 'r' AND n.nspname = 'public' ORDER BY 1").fetchall():
        h = hashlib.sha256()
        for (row,) in conn.execute(f"SELECT x::text FROM {t} x ORDER BY 1").fetchall():
            h.update(row.encode() + b"\n")
        out[t] = h.hexdigest()
    return out


def map_problems(conn: psycopg.Connection) -> list:
    bad = []
    for (t,) in conn.execute("SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                             "WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND n.nspname = 'public'").fetchall():
        bad += [(t, r) for r in wrong_bits(conn, t)]
    return bad


MIXED = [
    "CREATE EXTENSION IF NOT EXISTS bloom",
    "CREATE EXTENSION IF NOT EXISTS pg_visibility",
    "CREATE EXTENSION IF NOT EXISTS pg_prewarm",
    "CREATE EXTENSION IF NOT EXISTS amcheck",
    "CREATE TABLE m (id int PRIMARY KEY, p point, b box, a int[], doc tsvector, s text, h int, n int) "
    "WITH (autovacuum_enabled = off)",
    "CREATE INDEX m_gist ON m USING gist (p)",
    "CREATE INDEX m_gist_box ON m USING gist (b)",
    "CREATE INDEX m_spg ON m USING spgist (p)",
    "CREATE INDEX m_spg_text ON m USING spgist (s)",
    "CREATE INDEX m_gin ON m USING gin (a) WITH (fastupdate = on)",
    "CREATE INDEX m_gin_doc ON m USING gin (doc) WITH (fastupdate = off)",
    "CREATE INDEX m_brin ON m USING brin (id) WITH (pages_per_range = 2)",
    "CREATE INDEX m_hash ON m USING hash (h)",
    "CREATE INDEX m_bloom ON m USING bloom (h, n)",
    "INSERT INTO m SELECT g, point(g % 97, g % 89), box(point(g % 50, g % 40), point(g % 50 + 3, g % 40 + 2)), "
    "ARRAY[g % 13, g % 17, g], to_tsvector('simple', 'w' || (g % 211) || ' x' || (g % 7)), md5(g::text), g % 1000, g % 7 "
    "FROM generate_series(1, 12000) g",
    "UPDATE m SET s = s || 'u', a = a || 99, h = h + 1 WHERE id % 9 = 0",
    "DELETE FROM m WHERE id % 11 = 0",
    "VACUUM m",
    "INSERT INTO m SELECT g, point(g % 31, g % 37), box(point(1, 1), point(2, 2)), ARRAY[g], "
    "to_tsvector('simple', 'y' || g), md5(g::text) || 'z', g % 500, g % 5 FROM generate_series(20001, 26000) g",
    "DELETE FROM m WHERE id > 23000",
    "VACUUM m",
    # A map cut to nothing, then set again.
    "CREATE TABLE tv (id int, pad text) WITH (autovacuum_enabled = off)",
    "INSERT INTO tv SELECT g, repeat('t', 200) FROM generate_series(1, 8000) g",
    "VACUUM tv",
    "SELECT pg_truncate_visibility_map('tv')",
    "INSERT INTO tv SELECT g, repeat('u', 200) FROM generate_series(8001, 8400) g",
    "DELETE FROM tv WHERE id % 50 = 0",
    "VACUUM tv",
    # Truncated to nothing and grown again.
    "CREATE TABLE tt (id int PRIMARY KEY, pad text) WITH (autovacuum_enabled = off)",
    "INSERT INTO tt SELECT g, repeat('a', 300) FROM generate_series(1, 5000) g",
    "VACUUM tt",
    "DELETE FROM tt",
    "VACUUM tt",
    "INSERT INTO tt SELECT g, repeat('b', 300) FROM generate_series(1, 3000) g",
    "VACUUM tt",
    "DELETE FROM tt WHERE id % 3 = 0",
    # Rewrites and sequences.
    "CREATE TABLE r (id int, v text) WITH (autovacuum_enabled = off)",
    "INSERT INTO r SELECT g, md5(g::text) FROM generate_series(1, 5000) g",
    "CREATE INDEX r_id ON r (id)",
    "CLUSTER r USING r_id",
    "VACUUM FULL r",
    "VACUUM r",
    "CREATE SEQUENCE sq",
    "SELECT count(nextval('sq')) FROM generate_series(1, 1000)",
    "CREATE TABLE hashonly (k int) WITH (autovacuum_enabled = off)",
    "CREATE INDEX hashonly_k ON hashonly USING hash (k)",
    "INSERT INTO hashonly SELECT g % 3000 FROM generate_series(1, 30000) g",
    "DELETE FROM hashonly WHERE k % 4 = 0",
    "VACUUM hashonly",
]


# GIN's and the parallel vacuum's pins need more than 16 buffers.
SMALL = {**TINY, "shared_buffers": "1MB", "max_parallel_maintenance_workers": "0"}


def test_every_fork_rebuilds_after_a_mixed_workload(tmp_path, timeline, pageserver):
    """Every index kind, truncations, a map cut by pg_truncate_visibility_map, rewrites,
    sequences, and databases copied with both CREATE DATABASE strategies from a template
    with all-visible pages, all with full-page writes off and a tiny buffer pool. A fresh
    compute must read every block of every fork, the same rows, and no visibility-map bit
    for a tuple that is not all-visible; the pageserver must make an image of every key."""
    ep = Endpoint(tmp_path, timeline, "ep", settings=SMALL).start()
    with ep.connect() as conn:
        for stmt in MIXED:
            conn.execute(stmt)
    ep.sql("CREATE DATABASE tmpl")
    with ep.connect("tmpl") as conn:
        for ext in ("pg_visibility", "pg_prewarm", "amcheck"):
            conn.execute(f"CREATE EXTENSION {ext}")
        conn.execute("CREATE TABLE c (id int PRIMARY KEY, pad text) WITH (autovacuum_enabled = off)")
        conn.execute("INSERT INTO c SELECT g, repeat('c', 100) FROM generate_series(1, 20000) g")
        conn.execute("VACUUM c")
    ep.sql("CREATE DATABASE c_wal TEMPLATE tmpl STRATEGY wal_log")
    ep.sql("CREATE DATABASE c_file TEMPLATE tmpl STRATEGY file_copy")
    dbs = ["postgres", "tmpl", "c_wal", "c_file"]
    for db in ("c_wal", "c_file"):
        with ep.connect(db) as conn:
            conn.execute("DELETE FROM c WHERE id % 97 = 0")
            conn.execute("INSERT INTO c SELECT g, repeat('d', 100) FROM generate_series(30001, 31000) g")
            conn.execute("VACUUM c")
            conn.execute("DELETE FROM c WHERE id % 89 = 0")
    expected = {}
    for db in dbs:
        with ep.connect(db) as conn:
            expected[db] = table_digests(conn)
            assert map_problems(conn) == [], db
    ep.stop()

    fresh = Endpoint(tmp_path, timeline, "fresh", settings=SMALL).start()
    for db in dbs:
        with fresh.connect(db) as conn:
            blocks = read_every_fork(conn)
            got = table_digests(conn)
            bad = map_problems(conn)
            for (idx,) in conn.execute("SELECT c.oid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                                       "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'btree' "
                                       "AND c.relpersistence = 'p'").fetchall():
                conn.execute("SELECT bt_index_check(%s, true)", (idx,))
        print(f"{db}: {blocks} blocks read")
        assert bad == [], (db, bad[:10])
        assert got == expected[db], db
    fresh.stop()
    pageserver.http("POST", f"{timeline.path}/compact", {"force_l0": True, "force_image_layers": True})
