"""The storage controller (`controller/`): real controllers against a real PostgreSQL, real
pageservers heartbeated over TLS. Placement, failover of a dead pageserver's tenants to
their secondaries with raised generations, a standby controller taking over from a killed
leader (and finishing a failover that began while none led), the database going away, and
bad input."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import uuid

import pytest

from fixtures import logs
from fixtures.auth import KeyPair
from fixtures.controller import Controller
from fixtures.pageserver import Pageserver
from fixtures.paths import fjord_bin_dir
from fixtures.postgres import wait_until


def tenant_id() -> str:
    return uuid.uuid4().hex


def leader_of(controllers: list[Controller]) -> Controller:
    """Waits until exactly one of `controllers` leads, and returns it."""
    found: list[Controller] = []

    def one():
        found[:] = [c for c in controllers if c.proc and c.status()["leader"]]
        return len(found) == 1
    wait_until("one controller to lead", one, timeout_s=30)
    return found[0]


def error_of(call) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as e:
        call()
    return e.value.code, e.value.read().decode()


def nodes(c: Controller) -> dict[int, dict]:
    return {n["node_id"]: n for n in c.http("GET", "/v1/node")}


def placements(c: Controller) -> dict[str, dict]:
    return {t["tenant_id"]: t for t in c.http("GET", "/v1/tenant")}


def wait_moved(c: Controller, away_from: int, what: str) -> float:
    """Waits until no tenant is attached to `away_from`; the seconds it took."""
    start = time.monotonic()
    wait_until(what, lambda: all(t["attached"]["node_id"] != away_from for t in placements(c).values()), timeout_s=60)
    return time.monotonic() - start


def register(c: Controller, node_id: int, ps: Pageserver):
    c.http("POST", "/v1/node", {"node_id": node_id, "http_addr": f"127.0.0.1:{ps.http_port}", "page_addr": f"127.0.0.1:{ps.pg_port}"})


def test_placement_failover_and_takeover(tmp_path, pg_factory):
    db = pg_factory("controller-db").initdb().start()
    a = Controller(tmp_path, "a", db.conninfo).start()
    b = Controller(tmp_path, "b", db.conninfo).start()
    leader = leader_of([a, b])
    standby = b if leader is a else a
    for c in (a, b):
        # The pageservers this test kills.
        c.allowed_errors += ["pageserver 1 is offline", "pageserver 2 is offline"]

    pageservers = {i: Pageserver(tmp_path / f"ps{i}").start() for i in (1, 2, 3)}
    for ps in pageservers.values():
        # The leader is killed below, possibly in the middle of a heartbeat's handshake.
        ps.allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    # Only the leader changes anything; the other names it.
    code, text = error_of(lambda: register(standby, 1, pageservers[1]))
    assert code == 503 and leader.addr in text, text
    for i, ps in pageservers.items():
        register(leader, i, ps)
    wait_until("every pageserver online", lambda: all(n["availability"] == "online" for n in nodes(leader).values()) and len(nodes(leader)) == 3)

    tenants = [tenant_id() for _ in range(6)]
    for t in tenants:
        loc = leader.http("POST", "/v1/tenant", {"tenant_id": t})
        assert loc["generation"] == 1 and loc["secondary"]["node_id"] != loc["attached"]["node_id"], loc
        assert loc["attached"]["page_addr"] == f"127.0.0.1:{pageservers[loc['attached']['node_id']].pg_port}"
    load = nodes(leader)
    assert sorted(n["attached"] for n in load.values()) == [2, 2, 2], load
    assert sorted(n["secondaries"] for n in load.values()) == [2, 2, 2], load
    # Any controller answers where a tenant is.
    assert standby.http("GET", f"/v1/tenant/{tenants[0]}") == leader.http("GET", f"/v1/tenant/{tenants[0]}")

    # kill -9 of pageserver 1 while another session holds the tenants table for longer than
    # the lease (a slow migration, a VACUUM FULL): the failover waits, the leader's
    # transactions time out instead of wedging it, and once the table is free pageserver
    # 1's tenants move to their secondaries, one generation up, each with a new secondary
    # on the one other live pageserver (what the controller saw when it chose, not what a
    # lapsed belief in its lease would say).
    before = placements(leader)
    blocker = db.connect()
    blocker.execute("BEGIN")
    blocker.execute("LOCK TABLE fjord_controller_tenants IN SHARE MODE")
    pageservers[1].kill()
    time.sleep(4)
    assert placements(leader) == before
    blocker.execute("COMMIT")
    for c in (a, b):
        # What the blocked table makes them say (their transactions time out).
        c.allowed_errors += ["heartbeat round: the controller's database", "could not renew or take the leader lease", "no longer leads"]
    db.allowed_errors += ["canceling statement due to lock timeout", "canceling statement due to statement timeout"]
    took = wait_moved(leader, 1, "pageserver 1's tenants to fail over")
    print(f"pageserver 1's tenants failed over {took:.2f} s after the tenants table was free")
    after = placements(leader)
    for t, old in before.items():
        new = after[t]
        if old["attached"]["node_id"] == 1:
            assert new["attached"]["node_id"] == old["secondary"]["node_id"], (old, new)
            assert new["generation"] == old["generation"] + 1
        else:
            assert new["attached"] == old["attached"] and new["generation"] == old["generation"]
    wait_until("every tenant's secondary on the other live pageserver",
               lambda: all(t["secondary"]["node_id"] == ({2, 3} - {t["attached"]["node_id"]}).pop()
                           for t in placements(leader).values() if t.get("secondary")) and
               all(t.get("secondary") for t in placements(leader).values()))
    assert nodes(leader)[1]["availability"] == "offline"
    assert "pageserver 1 is offline" in leader.log_text()

    # The leader and pageserver 2 die together: no controller leads while pageserver 2 is
    # dead. The standby takes over, loses no placement, and, once it has itself seen
    # pageserver 2 silent for the whole grace, moves its tenants to pageserver 3.
    before = placements(leader)
    # It led through the blocked table, unless its renewals starved (logged, allowed above).
    leader = leader_of([a, b])
    standby = b if leader is a else a
    leader.kill()
    pageservers[2].kill()
    new_leader = leader_of([standby])
    for t, now in placements(new_leader).items():
        old = before[t]
        assert now == old or (old["attached"]["node_id"] == 2 and now["attached"]["node_id"] == 3), (old, now)
    wait_moved(new_leader, 2, "pageserver 2's tenants to fail over under the new leader")
    final = placements(new_leader)
    assert {t["attached"]["node_id"] for t in final.values()} == {3}
    assert all(t.get("secondary") is None for t in final.values()), final
    for t, old in before.items():
        assert final[t]["generation"] == old["generation"] + (1 if old["attached"]["node_id"] == 2 else 0)

    # The database goes away: the controller says so, changes wait, nothing is lost; it
    # leads again once the database is back.
    db.allowed_errors += ["the database system is not yet accepting connections", "the database system is starting up"]
    db.stop("immediate")
    code, text = error_of(lambda: new_leader.http("GET", "/v1/tenant"))
    assert code == 503 and "database" in text, text
    wait_until("the controller to report its database unreachable", lambda: new_leader.status()["database"] != "ok")
    db.start()
    leader_of([new_leader])
    assert placements(new_leader) == final
    new_leader.allowed_errors += ["could not renew or take the leader lease", "heartbeat round", "the connection to the controller's database ended",
                                  "no longer leads"]


def test_a_paused_or_deposed_leader_changes_nothing(tmp_path, pg_factory):
    """The fence: a leader whose lease another instance holds changes nothing, even while
    it still believes it leads; a paused leader is replaced, and learns it on waking; a
    stopped one gives the lease up at once."""
    db = pg_factory("controller-db").initdb().start()
    # A long lease: the window in which the leader believes it leads after losing the
    # lease (until its next renewal) is seconds wide.
    a = Controller(tmp_path, "a", db.conninfo, lease_ms=30_000).start()
    leader_of([a])
    ps = Pageserver(tmp_path / "ps1").start()
    # A controller is paused below, possibly in the middle of a heartbeat's handshake.
    ps.allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    register(a, 1, ps)
    db.sql("UPDATE fjord_controller_leader SET holder = 'someone', address = 'elsewhere:1', expires_at = clock_timestamp() + interval '1 hour'")
    assert a.status()["leader"] is True  # its belief, until the next renewal
    other = Pageserver(tmp_path / "ps2").start()
    code, text = error_of(lambda: register(a, 2, other))
    assert code == 503, text
    assert db.sql("SELECT node_id FROM fjord_controller_nodes") == [(1,)]
    wait_until("the leader to learn it lost the lease", lambda: a.status()["leader"] is False, timeout_s=40)
    assert a.status()["leader_address"] == "elsewhere:1"
    code, text = error_of(lambda: register(a, 2, other))
    assert code == 503 and "elsewhere:1" in text, text
    a.allowed_errors.append("no longer leads")
    a.stop()

    # Paused: the standby takes over after the lease; woken, the old one does not lead.
    db.sql("UPDATE fjord_controller_leader SET expires_at = '-infinity'")
    b = Controller(tmp_path, "b", db.conninfo).start()
    c = Controller(tmp_path, "c", db.conninfo).start()
    first = leader_of([b, c])
    second = c if first is b else b
    first.pause()
    start = time.monotonic()
    leader_of([second])
    print(f"the standby led {time.monotonic() - start:.2f} s after the leader was paused")
    first.resume()
    wait_until("the woken controller not to lead", lambda: first.status()["leader"] is False)
    first.allowed_errors += ["no longer leads", "could not renew or take the leader lease"]
    # SIGTERM gives the lease up at once: the other leads well within a lease.
    first.stop()
    start = time.monotonic()
    second.stop()
    assert "stopping on SIGTERM" in second.log_text()
    assert db.sql("SELECT expires_at < clock_timestamp() FROM fjord_controller_leader") == [(True,)]


def test_bad_requests_change_nothing(tmp_path, pg_factory):
    db = pg_factory("controller-db").initdb().start()
    keys = KeyPair(tmp_path / "keys")
    c = Controller(tmp_path, "a", db.conninfo, auth_public_key=keys.public_path).start()
    c.token = keys.admin()
    leader_of([c])
    t = tenant_id()

    # Tokens: none, a tenant's, another key's are refused; /v1/status stays open.
    assert error_of(lambda: c.http("GET", "/v1/tenant", token=""))[0] == 401
    assert error_of(lambda: c.http("GET", "/v1/tenant", token=keys.token("tenant", tenant=t)))[0] == 403
    assert error_of(lambda: c.http("GET", "/v1/node", token=KeyPair(tmp_path / "other").admin()))[0] == 401
    assert c.http("GET", "/v1/status", token="")["leader"] is True
    # The API describes itself, openly: every route with its methods, bodies and the token.
    doc = c.http("GET", "/v1/openapi.json", token="")
    assert doc["openapi"].startswith("3."), doc.get("openapi")
    assert {p: sorted(ops) for p, ops in doc["paths"].items()} == {
        "/metrics": ["get"], "/v1/status": ["get"], "/v1/node": ["get", "post"], "/v1/tenant": ["get", "post"],
        "/v1/tenant/{tenant_id}": ["get"], "/v1/tenant/{tenant_id}/migrate": ["post"], "/v1/re-attach": ["post"]}
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert {"TenantLocation", "MigrateRequest", "NodeInfo", "ErrorBody"} <= set(doc["components"]["schemas"])
    # A migration's refusals: a tenant's token, an unknown tenant, a destination not online.
    assert error_of(lambda: c.http("POST", f"/v1/tenant/{t}/migrate", {"node_id": 1}, token=keys.token("tenant", tenant=t)))[0] == 403

    code, text = error_of(lambda: c.http("POST", "/v1/tenant", {"tenant_id": t}))
    assert code == 503 and "no pageserver is online" in text, text
    for bad in ({"node_id": 1, "http_addr": "nowhere", "page_addr": "127.0.0.1:1"},
                {"node_id": 1, "http_addr": "127.0.0.1:0", "page_addr": "127.0.0.1:1"},
                {"node_id": -1, "http_addr": "127.0.0.1:1", "page_addr": "127.0.0.1:1"},
                {"node_id": 1, "http_addr": "127.0.0.1:1", "page_addr": "127.0.0.1:1", "extra": 1},
                {"node_id": 1},
                {"node_id": 2**63, "http_addr": "127.0.0.1:1", "page_addr": "127.0.0.1:2"},
                {"node_id": 1, "http_addr": "a@b:1", "page_addr": "127.0.0.1:2"},
                {"node_id": 1, "http_addr": "x\n:1", "page_addr": "127.0.0.1:2"},
                {"node_id": 1, "http_addr": "::1:80", "page_addr": "127.0.0.1:2"},
                {"node_id": 1, "http_addr": "127.0.0.1:3", "page_addr": "127.0.0.1:3"}):
        code, text = error_of(lambda: c.http("POST", "/v1/node", bad))
        assert code == 400, (bad, code, text)
    assert c.http("GET", "/v1/node") == []
    assert db.sql("SELECT count(*) FROM fjord_controller_nodes") == [(0,)]
    assert error_of(lambda: c.http("GET", "/v1/tenant/not-a-tenant"))[0] == 400
    assert error_of(lambda: c.http("GET", f"/v1/tenant/{t}"))[0] == 404
    assert error_of(lambda: c.http("POST", "/v1/tenant", {"tenant_id": "zz"}))[0] == 400

    ps = Pageserver(tmp_path / "ps1").start()
    register(c, 1, ps)
    c.http("POST", "/v1/node", {"node_id": 9, "http_addr": "[::1]:7", "page_addr": "pageserver-9.example:8"})
    # Two ids for one pageserver would let a tenant's secondary be its attached pageserver.
    code, text = error_of(lambda: register(c, 2, ps))
    assert code == 409 and "node 1 already has" in text, text
    wait_until("the pageserver online", lambda: nodes(c)[1]["availability"] == "online")
    loc = c.http("POST", "/v1/tenant", {"tenant_id": t})
    assert loc["attached"]["node_id"] == 1 and loc.get("secondary") is None, loc
    code, text = error_of(lambda: c.http("POST", "/v1/tenant", {"tenant_id": t}))
    assert code == 409 and "already placed" in text
    assert c.http("GET", "/v1/tenant") == [loc]
    assert "refused GET /v1/tenant" in c.log_text()
    c.allowed_errors += ["refused ", "pageserver 9 is offline"]


def test_a_database_with_another_schema_is_refused(tmp_path, pg_factory):
    db = pg_factory("controller-db").initdb().start()
    db.sql("CREATE TABLE fjord_controller_schema (version integer NOT NULL)")
    db.sql("INSERT INTO fjord_controller_schema VALUES (99)")
    c = Controller(tmp_path, "a", db.conninfo)
    r = subprocess.run([str(fjord_bin_dir() / "storage_controller"), "--database", db.conninfo, "--listen", c.addr, *c.tls_args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "schema is version [99], this controller's 2: refusing to touch it" in r.stderr, r.stderr
    assert db.sql("SELECT version FROM fjord_controller_schema") == [(99,)]


def test_a_database_of_the_first_schema_is_upgraded_in_place(tmp_path, pg_factory):
    """A database made by a controller of schema version 1 (no planned migrations) keeps its
    nodes and placements and gains the migration columns, in one transaction at start."""
    db = pg_factory("controller-db").initdb().start()
    c = Controller(tmp_path, "a", db.conninfo).start()
    c.http("POST", "/v1/node", {"node_id": 7, "http_addr": "ps-7.example:1", "page_addr": "ps-7.example:2"})
    c.stop()
    t = "ab" * 16
    db.sql("INSERT INTO fjord_controller_tenants (tenant_id, generation, attached) VALUES (%s, 4, 7)", t)
    # Back to version 1, as such a controller left it.
    db.sql("ALTER TABLE fjord_controller_tenants DROP COLUMN migrating_from, DROP COLUMN cut_over_at, DROP COLUMN migration_started_at")
    db.sql("UPDATE fjord_controller_schema SET version = 1")
    c.start()
    assert "upgraded the controller's schema from version 1 to 2" in c.log_text()
    assert db.sql("SELECT version FROM fjord_controller_schema") == [(2,)]
    loc = c.http("GET", f"/v1/tenant/{t}")
    assert loc["generation"] == 4 and loc["attached"]["node_id"] == 7 and loc.get("migration") is None, loc
    c.allowed_errors += ["pageserver 7 is offline"]


def test_a_schema_upgrade_never_runs_under_a_controller_of_another_version(tmp_path, pg_factory):
    """A controller that finds the schema changed under it (another controller upgraded it)
    stops, its lease given up; one that would upgrade the schema while a controller of the
    old version still leads refuses to start."""
    db = pg_factory("controller-db").initdb().start()
    a = Controller(tmp_path, "a", db.conninfo).start()
    leader_of([a])
    a.proc.expect_exit(1)
    a.allowed_errors += ["schema is version 1 now", "this controller stops", "the leader lease task ended"]
    db.sql("UPDATE fjord_controller_schema SET version = 1")
    wait_until("the leader to stop", lambda: a.proc.poll() is not None, timeout_s=30)
    assert "the database's controller schema is version 1 now, this controller's 2: this controller stops" in a.log_text()
    # A controller of the old version leads (its lease live): no upgrade under it.
    db.sql("UPDATE fjord_controller_leader SET holder = 'old', address = '10.0.0.9:1234', "
           "expires_at = clock_timestamp() + interval '1 hour' WHERE id = 1")
    b = Controller(tmp_path, "b", db.conninfo)
    r = subprocess.run([str(fjord_bin_dir() / "storage_controller"), "--database", db.conninfo, "--listen", b.addr, *b.tls_args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "a controller (10.0.0.9:1234) leads with it" in r.stderr, r.stderr
    assert db.sql("SELECT version FROM fjord_controller_schema") == [(1,)]
    # Once that lease lapses, the upgrade goes ahead.
    db.sql("UPDATE fjord_controller_leader SET expires_at = '-infinity' WHERE id = 1")
    b.start()
    assert db.sql("SELECT version FROM fjord_controller_schema") == [(2,)]
