"""A new relation never takes the relfilenode of a live one (patch 0010).

PostgreSQL picks a new relation's relfilenode from the OID counter and takes it as free
when no local file has its name. A compute has no local files for permanent relations,
so after OID wraparound a new relation could get the relfilenode of a rewritten table
(whose relfilenode differs from its OID) and share its pages on the pageserver. The
test puts the OID counter back on such a relfilenode, as wraparound would
(`fjord.set_next_oid_for_testing`), and creates a relation.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from fixtures.cli import FjordRepo


@pytest.fixture
def repo(tmp_path: Path):
    r = FjordRepo(tmp_path / "repo").init()
    r.run("start")
    r.run("tenant", "create")
    yield r
    r.cleanup()


# Expected: the testing function the test calls without fjord.testing_functions.
@pytest.mark.allowed_errors(r"ERROR:  fjord.set_next_oid_for_testing\(\) is a testing function")
def test_a_new_relation_does_not_take_the_relfilenode_of_a_live_one_after_oid_wraparound(repo):
    main = repo.run("endpoint", "start", "main", "-c", "fjord.testing_functions=on").stdout.strip()
    with psycopg.connect(main, autocommit=True) as c:
        c.execute("CREATE EXTENSION fjord")
        c.execute("CREATE TABLE t AS SELECT g AS id, md5(g::text) AS h FROM generate_series(1, 10000) g")
        want = c.execute("SELECT count(*), sum(id), max(h) FROM t").fetchone()
        # A rewrite gives t a new relfilenode, different from its OID.
        c.execute("VACUUM FULL t")
        oid, filenode = c.execute("SELECT 't'::regclass::oid::bigint, pg_relation_filenode('t')::bigint").fetchone()
        assert filenode != oid
        # The rewrite's transient table had that number as its OID; its dead catalog row
        # must go, as it long would have by the time the counter wrapped around.
        c.execute("VACUUM pg_class")
        # The counter comes back to that relfilenode, as after wraparound; the next
        # relation's OID (and so its relfilenode) would be it.
        c.execute("SELECT fjord.set_next_oid_for_testing(%s::oid)", (filenode,))
        c.execute("CREATE TABLE u (x int)")
        u_filenode = c.execute("SELECT pg_relation_filenode('u')::bigint").fetchone()[0]
        assert u_filenode != filenode, "the new table took the live table's relfilenode"
        c.execute("INSERT INTO u VALUES (1)")
        assert c.execute("SELECT count(*) FROM u").fetchone()[0] == 1
        assert c.execute("SELECT count(*), sum(id), max(h) FROM t").fetchone() == want
    # And so after a restart, from the pageserver alone.
    repo.run("endpoint", "stop", "main")
    main = repo.run("endpoint", "start", "main").stdout.strip()
    with psycopg.connect(main, autocommit=True) as c:
        assert c.execute("SELECT count(*), sum(id), max(h) FROM t").fetchone() == want
        assert c.execute("SELECT count(*) FROM u").fetchone()[0] == 1
        # Without the setting, the testing function is refused.
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="testing function"):
            c.execute("SELECT fjord.set_next_oid_for_testing(20000::oid)")
