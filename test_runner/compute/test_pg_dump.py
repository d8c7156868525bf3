"""The same workload on a plain PostgreSQL and on a compute must dump identically, and
every index of the compute must pass amcheck, also on a fresh compute that reads it all
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
    "TRUNCATE orders, items CASCADE",
    "INSERT INTO items (name, body) SELECT 'again ' || g, repeat('y', g % 3000) FROM generate_series(1, 5000) g",
    "CLUSTER items USING items_pkey",
    "REFRESH MATERIALIZED VIEW mv",
    "ALTER TABLE items ADD COLUMN extra int DEFAULT 7",
    "UPDATE items SET extra = id % 3 WHERE id % 2 = 0",
]


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

    # A fresh compute reads everything back from the pageserver.
    ep.stop()
    ep2 = Endpoint(tmp_path, tl, "ep2", settings={"shared_buffers": "1MB"}).start()
    assert_same_dump(dump(pg_bin_dir(), ep2.port, ep2.user), expected, "a fresh compute", tmp_path)
