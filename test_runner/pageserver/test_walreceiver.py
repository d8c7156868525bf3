"""The pageserver follows a live PostgreSQL's WAL over streaming replication.

A server's data directory is imported into a timeline while it is shut down; the server
then starts and the pageserver streams its WAL. Pages served by the pageserver must hold
the same tuples as the server's own pages (compared with pageinspect, so that hint bits,
which PostgreSQL sets without WAL, do not count), and streaming must survive a restart
of the server.
"""

from __future__ import annotations

import pytest

from fixtures.logs import unexpected_lines
from fixtures.pagestream import PageServiceClient, RelTag, lsn_int
from fixtures.postgres import wait_until

TENANT = "33333333333333333333333333333333"
TIMELINE = "44444444444444444444444444444444"


def timeline_status(ps):
    return ps.http("GET", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}")


def wait_for_ingest(ps, pg) -> int:
    """Waits until the pageserver has ingested everything the server wrote so far; returns
    that LSN. A small transaction after taking the LSN makes the stream go past it."""
    lsn = pg.sql("SELECT pg_current_wal_insert_lsn()")[0][0]
    pg.sql("SELECT txid_current()")
    wait_until(
        f"the pageserver to ingest WAL past {lsn}",
        lambda: lsn_int(timeline_status(ps)["last_record_lsn"]) > lsn_int(str(lsn)),
        timeout_s=60,
    )
    return lsn_int(str(lsn))


def compare_relation(ps, pg, relname: str, lsn: int, items_fn: str) -> int:
    """Every block of relname from the pageserver against the server's, by page items."""
    dboid, relfilenode, nblocks = pg.sql(
        "SELECT (SELECT oid FROM pg_database WHERE datname = current_database()), "
        "pg_relation_filenode(%s), pg_relation_size(%s) / 8192", relname, relname,
    )[0]
    rel = RelTag(1663, dboid, relfilenode)
    client = PageServiceClient.of(ps, TENANT, TIMELINE)
    assert client.nblocks(rel, lsn) == nblocks, relname
    with pg.connect() as conn:
        for blk in range(nblocks):
            page = client.get_page(rel, blk, lsn)
            if items_fn == "btree_items" and blk == 0:
                # The B-tree metapage has no items and no hint bits: compare it whole.
                raw = conn.execute("SELECT get_raw_page(%s, 0)", (relname,)).fetchone()[0]
                assert page == bytes(raw), f"{relname} metapage differs"
                continue
            ours = conn.execute(f"SELECT * FROM {items_fn}(%s)", (page,)).fetchall()
            theirs = conn.execute(f"SELECT * FROM {items_fn}(get_raw_page(%s, %s))", (relname, blk)).fetchall()
            assert ours == theirs, f"{relname} block {blk} differs"
            assert conn.execute("SELECT lsn FROM page_header(%s)", (page,)).fetchone() == \
                conn.execute("SELECT lsn FROM page_header(get_raw_page(%s, %s))", (relname, blk)).fetchone()
    client.close()
    return nblocks


# Expected: the source server the test restarts.
@pytest.mark.allowed_errors(r"FATAL:  the database system is starting up",
                            r"could not stream WAL from \S+: the server refused the connection: the database system is starting up")
def test_streams_a_live_servers_wal(pageserver, pg_factory):
    pg = pg_factory("primary", {"autovacuum": "off"}).initdb()
    pageserver.http("POST", "/v1/tenant", {"tenant_id": TENANT})
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline", {"timeline_id": TIMELINE})
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/import", {"pgdata": str(pg.datadir)})
    pg.start()
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/wal_receiver",
                    {"host": "127.0.0.1", "port": pg.port, "user": pg.user, "plaintext": True})
    wait_until("the wal receiver to stream", lambda: timeline_status(pageserver)["wal_receiver"]["state"] == "streaming")

    with pg.connect() as conn:
        conn.execute("CREATE EXTENSION pageinspect")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
        conn.execute("UPDATE t SET v = 'updated' WHERE id % 7 = 0")
        conn.execute("DELETE FROM t WHERE id % 11 = 0")
        conn.execute("VACUUM t")
    lsn = wait_for_ingest(pageserver, pg)

    # pageinspect's heap_page_items takes raw bytes, so the pageserver's pages can be read
    # by the server itself. Everything but the infomask hint bits must match.
    with pg.connect() as conn:
        conn.execute(
            "CREATE FUNCTION heap_items(p bytea) RETURNS TABLE(lp smallint, lp_off smallint, lp_flags smallint, "
            "lp_len smallint, t_xmin xid, t_xmax xid, t_ctid tid, t_data bytea) LANGUAGE sql AS "
            "$$ SELECT lp, lp_off, lp_flags, lp_len, t_xmin, t_xmax, t_ctid, t_data FROM heap_page_items(p) $$"
        )
        conn.execute(
            "CREATE FUNCTION btree_items(p bytea) RETURNS TABLE(itemoffset smallint, ctid tid, itemlen smallint, "
            "data text) LANGUAGE sql AS $$ SELECT itemoffset, ctid, itemlen, data FROM bt_page_items(p) $$"
        )
    assert compare_relation(pageserver, pg, "t", lsn, "heap_items") > 100
    assert compare_relation(pageserver, pg, "t_pkey", lsn, "btree_items") > 10

    # The server restarts: the receiver reconnects and resumes where it was.
    pg.stop()
    pg.start()
    pg.sql("INSERT INTO t SELECT g, 'after restart' FROM generate_series(20001, 21000) g")
    lsn = wait_for_ingest(pageserver, pg)
    assert compare_relation(pageserver, pg, "t", lsn, "heap_items") > 100
    status = timeline_status(pageserver)
    assert status["wal_receiver"]["records_ingested"] > 1000

    # The server reports the pageserver as a standby with its positions.
    rows = pg.sql("SELECT application_name, state FROM pg_stat_replication")
    assert ("fjord_pageserver", "streaming") in rows
    # The receiver may ask while the server is still starting up, and retries.
    allowed = [r"could not stream WAL from .*: (the server closed the connection|connect|.*the database system is starting up)"]
    assert unexpected_lines(pageserver.log_text(), allowed) == []


def test_source_list_validation_failover_and_persistence(pageserver, pg_factory):
    """`{"sources": [...]}`: refused with a reason when invalid; a dead first source is
    passed over for a live second one; the list survives a pageserver restart."""
    from fixtures.pageserver import HttpError
    from fixtures.postgres import free_port

    pg = pg_factory("primary", {"autovacuum": "off"}).initdb()
    pageserver.http("POST", "/v1/tenant", {"tenant_id": TENANT})
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline", {"timeline_id": TIMELINE})
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/import", {"pgdata": str(pg.datadir)})
    pg.start()
    route = f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/wal_receiver"
    live = {"host": "127.0.0.1", "port": pg.port, "user": pg.user, "plaintext": True}
    dead = {"host": "127.0.0.1", "port": free_port(), "user": pg.user, "plaintext": True}
    refused = [
        ({"sources": []}, "sources must not be empty"),
        ({"sources": [live, dict(live, user="other")]}, f"duplicate source 127.0.0.1:{pg.port}: sources 0 and 1"),
        ({"sources": [dict(live, port=0)]}, "source 0 has an invalid port: 0"),
        ({"sources": [live], "mode": "x"}, "unknown field `mode`"),
    ]
    for body, message in refused:
        try:
            pageserver.http("POST", route, body)
            raise AssertionError(f"{body} was accepted")
        except HttpError as e:
            assert e.status == 400 and message in e.body["error"], (body, e)
    assert timeline_status(pageserver)["wal_receiver"] is None

    pageserver.http("POST", route, {"sources": [dead, live]})
    for restarted in (False, True):
        wait_until("the wal receiver to stream from the live source",
                   lambda: timeline_status(pageserver)["wal_receiver"]["state"] == "streaming")
        status = timeline_status(pageserver)["wal_receiver"]
        assert status["current_source"] == 1 and status["current_source_address"] == f"127.0.0.1:{pg.port}", status
        assert [(s["host"], s["port"]) for s in status["sources"]] == [("127.0.0.1", dead["port"]), ("127.0.0.1", pg.port)]
        wait_for_ingest(pageserver, pg)
        if not restarted:
            pageserver.stop()
            pageserver.start()
    allowed = [r"could not stream WAL from .*: connect"]
    assert unexpected_lines(pageserver.log_text(), allowed) == []
