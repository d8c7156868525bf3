"""The fjord extension on a plain (local-storage) server: loading, SQL surface, hook path."""

from __future__ import annotations

import pytest
import psycopg

from fixtures.logs import unexpected_lines


def smgr_status(pg) -> dict:
    with pg.connect() as conn:
        cur = conn.execute("SELECT * FROM fjord.storage_manager()")
        names = [d.name for d in cur.description]
        return dict(zip(names, cur.fetchone()))


def test_create_extension_and_status(fjord_pg):
    fjord_pg.sql("CREATE EXTENSION fjord")
    assert fjord_pg.sql("SELECT extversion FROM pg_extension WHERE extname = 'fjord'") == [("0.1.0",)]
    assert fjord_pg.sql("SELECT fjord.version()") == [("0.1.0",)]
    status = smgr_status(fjord_pg)
    assert status["active"] is True, status
    assert status["mode"] == "pass-through"
    # Starting the server and connecting opened catalog relations through the hook.
    assert status["relations_opened"] > 0
    assert status["nblocks_calls"] > 0


def test_basic_sql_goes_through_the_hook(fjord_pg):
    fjord_pg.sql("CREATE EXTENSION fjord")
    before = smgr_status(fjord_pg)
    with fjord_pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g")
        conn.execute("CREATE INDEX ON t (v)")
        conn.execute("UPDATE t SET v = 'y' WHERE id % 10 = 0")
        conn.execute("DELETE FROM t WHERE id % 7 = 0")
        conn.execute("VACUUM t")
        assert conn.execute("SELECT count(*), count(*) FILTER (WHERE v = 'y') FROM t").fetchone() == (17143, 1715)
        conn.execute("CHECKPOINT")  # writes every dirty buffer through smgrwrite
        # An emptied heap lets VACUUM give its pages back (smgrtruncate); TRUNCATE, by
        # contrast, swaps in a new relfilenode (smgrcreate + smgrunlink).
        conn.execute("CREATE TABLE tail AS SELECT g FROM generate_series(1, 10000) g")
        conn.execute("DELETE FROM tail")
        conn.execute("VACUUM tail")
        assert conn.execute("SELECT pg_relation_size('tail')").fetchone() == (0,)
        conn.execute("TRUNCATE t")
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
        conn.execute("DROP TABLE t")
    after = smgr_status(fjord_pg)
    for counter in ("extends", "writes", "creates", "truncates", "unlinks"):
        assert after[counter] > before[counter], (counter, before, after)


def test_reads_after_restart_go_through_the_hook(fjord_pg):
    fjord_pg.sql("CREATE EXTENSION fjord")
    fjord_pg.sql("CREATE TABLE r AS SELECT g AS id FROM generate_series(1, 50000) g")
    fjord_pg.stop()
    fjord_pg.start()  # shared buffers are empty now: every page comes through smgrread
    assert fjord_pg.sql("SELECT sum(id) FROM r") == [(1250025000,)]
    status = smgr_status(fjord_pg)
    assert status["active"] and status["reads"] > 200, status
    assert unexpected_lines(fjord_pg.log_text()) == []


def test_without_preload_the_hook_is_inactive(pg_factory):
    # CREATE EXTENSION still works, but the storage manager is not installed and the
    # status says so: the tests above would fail on a server without the hook.
    pg = pg_factory("plain").initdb().start()
    pg.sql("CREATE EXTENSION fjord")
    status = smgr_status(pg)
    assert status["active"] is False
    assert status["mode"] == "inactive"
    assert status["relations_opened"] == 0


# Expected: the errors the test provokes.
@pytest.mark.allowed_errors(r'ERROR:  extension "fjord" already exists')
def test_extension_errors_are_clear(fjord_pg):
    fjord_pg.sql("CREATE EXTENSION fjord")
    with pytest.raises(psycopg.errors.DuplicateObject, match='extension "fjord" already exists'):
        fjord_pg.sql("CREATE EXTENSION fjord")
