"""The same workload on a plain PostgreSQL and on a compute must dump identically, with the
table that has GIN, GiST, SP-GiST, BRIN and hash indexes populated; each of those indexes
must answer a query as a sequential scan does, and as on plain PostgreSQL; every B-tree
index of the compute must pass amcheck; all of it also on a fresh compute that reads it all
back from the pageserver."""

from __future__ import annotations

import difflib
import subprocess

from fixtures.compute import Endpoint, Timeline
from fixtures.paths import pg_bin_dir

WORKLOAD = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE EXTENSION IF NOT EXISTS btree_gist",
    "CREATE EXTENSION IF NOT EXISTS amcheck",
    "CREATE TABLE items (id bigserial PRIMARY KEY, name text NOT NULL, tags text[], doc jsonb, "
    "price numeric(12,2), body text, pt point, span int4range)",
    "INSERT INTO items (name, tags, doc, price, body, pt, span) "
    "SELECT 'item ' || g, ARRAY['t' || (g % 7), 'u' || (g % 11)], "
    "jsonb_build_object('g', g, 'sq', g * g), (g % 1000) / 7.0, repeat(md5(g::text), 1 + g % 200), "
    "point(g % 100, g / 100), int4range(g, g + g % 50 + 1) FROM generate_series(1, 20000) g",
    "CREATE INDEX items_name_trgm ON items USING gin (name gin_trgm_ops)",
    "CREATE INDEX items_tags ON items USING gin (tags)",
    "CREATE INDEX items_pt ON items USING gist (pt)",
    "CREATE INDEX items_span ON items USING spgist (span)",
    "CREATE INDEX items_price_brin ON items USING brin (price)",
    "CREATE INDEX items_name_hash ON items USING hash (name)",
    "CREATE INDEX items_doc ON items ((doc->>'g'))",
    "UPDATE items SET price = price + 1, tags = tags || 'updated'::text WHERE id % 5 = 0",
    "DELETE FROM items WHERE id % 13 = 0",
    "VACUUM items",
    "CREATE TABLE orders (id int PRIMARY KEY, item_id bigint REFERENCES items (id), qty int)",
    "INSERT INTO orders SELECT g, 1 + (g * 7) % 19999, g % 9 FROM generate_series(1, 15000) g WHERE (1 + (g * 7) % 19999) % 13 <> 0",
    "CREATE VIEW order_totals AS SELECT item_id, sum(qty) AS qty FROM orders GROUP BY item_id",
    "CREATE MATERIALIZED VIEW mv AS SELECT item_id, qty FROM order_totals WHERE qty > 10",
    "CREATE SEQUENCE s START 100",
    "SELECT nextval('s') FROM generate_series(1, 42)",
    # A truncated table gets a new relfilenode; items keeps its rows (and its indexes their
    # entries) for the comparisons below.
    "TRUNCATE orders",
    "INSERT INTO orders SELECT g, 1 + (g * 3) % 19999, g % 5 FROM generate_series(1, 8000) g WHERE (1 + (g * 3) % 19999) % 13 <> 0",
    "INSERT INTO items (name, tags, doc, price, body, pt, span) "
    "SELECT 'again ' || g, ARRAY['t' || (g % 5)], jsonb_build_object('g', -g), g % 300, repeat('y', g % 3000), "
    "point(g % 50, g % 70), int4range(g * 3, g * 3 + 10) FROM generate_series(1, 5000) g",
    "CLUSTER items USING items_pkey",
    "REFRESH MATERIALIZED VIEW mv",
    "ALTER TABLE items ADD COLUMN extra int DEFAULT 7",
    "UPDATE items SET extra = id % 3 WHERE id % 2 = 0",
    # CLUSTER rebuilt every index: rows inserted and moved after it go into the indexes one by
    # one (GIN's pending list, GiST and SP-GiST inserts, BRIN summaries, hash buckets), and
    # VACUUM removes the moved rows' old entries.
    "INSERT INTO items (name, tags, doc, price, body, pt, span) "
    "SELECT 'late ' || g, ARRAY['t' || (g % 3), 'late'], jsonb_build_object('g', 100000 + g), g % 100, md5(g::text), "
    "point(g % 40, g % 90), int4range(g * 5, g * 5 + 3) FROM generate_series(1, 3000) g",
    "UPDATE items SET pt = point(pt[0] + 1, pt[1]), span = int4range(lower(span) + 1, upper(span) + 1), "
    "tags = tags || 'moved'::text WHERE id % 17 = 0",
    "VACUUM items",
]


# One query per index of items, answered through that index (the plan must name it) and again
# by a sequential scan: the dump holds no index contents, so these are what compare them.
INDEX_QUERIES = {
    "items_name_trgm": "SELECT count(*), coalesce(sum(id), 0) FROM items WHERE name LIKE '%12%'",
    "items_tags": "SELECT count(*), coalesce(sum(id), 0) FROM items WHERE tags @> ARRAY['t2']",
    "items_pt": "SELECT count(*), coalesce(sum(id), 0) FROM items WHERE pt <@ box '((10,10),(30,60))'",
    "items_span": "SELECT count(*), coalesce(sum(id), 0) FROM items WHERE span && int4range(2900, 3100)",
    "items_price_brin": "SELECT count(*), coalesce(sum(id), 0) FROM items WHERE price BETWEEN 20 AND 25",
    "items_name_hash": "SELECT count(*), coalesce(sum(id), 0) FROM items WHERE name = 'late 777'",
    "items_doc": "SELECT count(*), coalesce(sum(id), 0) FROM items WHERE doc->>'g' IN ('777', '-777', '100777')",
}
SEQSCAN_ONLY = ["enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"]


def index_answers(conn) -> dict[str, tuple]:
    """Each INDEX_QUERIES answer through its index, checked against a sequential scan's and
    non-empty."""
    answers = {}
    for index, query in INDEX_QUERIES.items():
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + query).fetchall())
        assert index in plan, f"{index} is not used by {query}:\n{plan}"
        answer = conn.execute(query).fetchone()
        conn.execute("RESET enable_seqscan")
        for setting in SEQSCAN_ONLY:
            conn.execute(f"SET {setting} = off")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + query).fetchall())
        assert index not in plan, plan
        assert conn.execute(query).fetchone() == answer, f"{index} answers {answer} to {query}, a sequential scan does not"
        for setting in SEQSCAN_ONLY:
            conn.execute(f"RESET {setting}")
        assert answer[0] > 0, f"{query} finds no rows: it checks nothing"
        answers[index] = answer
    return answers


def dump(bin_dir, port: int, user: str) -> str:
    r = subprocess.run(
        [str(bin_dir / "pg_dump"), "-h", "127.0.0.1", "-p", str(port), "-U", user, "--no-sync", "postgres"],
        capture_output=True, text=True, check=True,
    )
    return r.stdout


def normalize(dump_text: str) -> str:
    """Drops pg_dump's random per-run \\restrict key and sorts the rows of each COPY block:
    the comparison is of contents, and the physical order of rows legitimately differs
    (free space maps are per server, and autovacuum runs when it likes)."""
    out: list[str] = []
    rows: list[str] | None = None
    for line in dump_text.splitlines():
        if line.startswith(("\\restrict ", "\\unrestrict ")):
            continue
        if rows is not None:
            if line == "\\.":
                out.extend(sorted(rows))
                out.append(line)
                rows = None
            else:
                rows.append(line)
            continue
        out.append(line)
        if line.startswith("COPY ") and line.endswith("FROM stdin;"):
            rows = []
    return "\n".join(out) + "\n"


def assert_same_dump(got: str, expected: str, what: str, save_dir=None) -> None:
    """Compares normalized dumps with a short unified diff (pytest's own diff of two large
    strings is far too slow)."""
    got, expected = normalize(got), normalize(expected)
    if got != expected and save_dir is not None:
        (save_dir / "expected.sql").write_text(expected)
        (save_dir / f"{what.replace(' ', '_')}.sql").write_text(got)
    if got != expected:
        diff = "".join(list(difflib.unified_diff(expected.splitlines(True), got.splitlines(True),
                                                 "plain", what, n=2))[:80])
        raise AssertionError(f"pg_dump of {what} differs from plain PostgreSQL's:\n{diff}")


def run(conn_factory):
    with conn_factory() as conn:
        for stmt in WORKLOAD:
            conn.execute(stmt)


def test_pg_dump_matches_plain_postgres(tmp_path, pg_factory, pageserver):
    plain = pg_factory("plain").initdb().start()
    run(plain.connect)
    expected = dump(pg_bin_dir(), plain.port, plain.user)
    # The comparison covers the indexed table with its rows: items is in the dump with all of them.
    items_rows = plain.sql("SELECT count(*) FROM items")[0][0]
    assert items_rows > 20000, items_rows
    copy = normalize(expected).split("COPY public.items ", 1)[1].split("\n\\.\n", 1)[0]
    assert copy.count("\n") == items_rows, (copy.count("\n"), items_rows)
    with plain.connect() as conn:
        expected_answers = index_answers(conn)

    tl = Timeline(tmp_path, pageserver)
    ep = Endpoint(tmp_path, tl, settings={"shared_buffers": "1MB"}).start()
    run(ep.connect)
    assert_same_dump(dump(pg_bin_dir(), ep.port, ep.user), expected, "the compute", tmp_path)

    with ep.connect() as conn:
        names = [r[0] for r in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'btree'").fetchall()]
        for name in names:
            conn.execute("SELECT bt_index_parent_check(%s, true)", (name,))
        assert conn.execute("SELECT count(*) FROM verify_heapam('items')").fetchone() == (0,)
        assert index_answers(conn) == expected_answers

    # A fresh compute reads everything back from the pageserver.
    ep.stop()
    ep2 = Endpoint(tmp_path, tl, "ep2", settings={"shared_buffers": "1MB"}).start()
    assert_same_dump(dump(pg_bin_dir(), ep2.port, ep2.user), expected, "a fresh compute", tmp_path)
    with ep2.connect() as conn:
        assert index_answers(conn) == expected_answers
