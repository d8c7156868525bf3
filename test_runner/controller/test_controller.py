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
    # Only the leader changes anything; the other names it.
    body = {"node_id": 1, "http_addr": f"127.0.0.1:{pageservers[1].http_port}", "page_addr": f"127.0.0.1:{pageservers[1].pg_port}"}
    code, text = error_of(lambda: standby.http("POST", "/v1/node", body))
    assert code == 503 and leader.addr in text, text
    for i, ps in pageservers.items():
        leader.http("POST", "/v1/node", {"node_id": i, "http_addr": f"127.0.0.1:{ps.http_port}", "page_addr": f"127.0.0.1:{ps.pg_port}"})
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

    # kill -9 of pageserver 1: its tenants move to their secondaries, one generation up,
    # each with a new secondary that is neither the new attached node nor the dead one.
    before = placements(leader)
    pageservers[1].kill()
    took = wait_moved(leader, 1, "pageserver 1's tenants to fail over")
    print(f"pageserver 1's tenants failed over {took:.2f} s after the kill")
    after = placements(leader)
    for t, old in before.items():
        new = after[t]
        if old["attached"]["node_id"] == 1:
            assert new["attached"]["node_id"] == old["secondary"]["node_id"], (old, new)
            assert new["generation"] == old["generation"] + 1
        else:
            assert new["attached"] == old["attached"] and new["generation"] == old["generation"]
        assert new["secondary"] is None or new["secondary"]["node_id"] not in (1, new["attached"]["node_id"]), new
    wait_until("no secondary on the dead pageserver",
               lambda: all((t.get("secondary") or {}).get("node_id") != 1 for t in placements(leader).values()))
    assert nodes(leader)[1]["availability"] == "offline"
    assert "pageserver 1 is offline" in leader.log_text()

    # The leader and pageserver 2 die together: no controller leads while pageserver 2 is
    # dead. The standby takes over, keeps every placement, and, once it has itself seen
    # pageserver 2 silent for the whole grace, moves its tenants to pageserver 3.
    before = placements(leader)
    leader.kill()
    pageservers[2].kill()
    new_leader = leader_of([standby])
    assert placements(new_leader) == before
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

    code, text = error_of(lambda: c.http("POST", "/v1/tenant", {"tenant_id": t}))
    assert code == 409 and "no pageserver is online" in text, text
    for bad in ({"node_id": 1, "http_addr": "nowhere", "page_addr": "127.0.0.1:1"},
                {"node_id": 1, "http_addr": "127.0.0.1:0", "page_addr": "127.0.0.1:1"},
                {"node_id": -1, "http_addr": "127.0.0.1:1", "page_addr": "127.0.0.1:1"},
                {"node_id": 1, "http_addr": "127.0.0.1:1", "page_addr": "127.0.0.1:1", "extra": 1},
                {"node_id": 1}):
        code, text = error_of(lambda: c.http("POST", "/v1/node", bad))
        assert code == 400, (bad, code, text)
    assert c.http("GET", "/v1/node") == []
    assert error_of(lambda: c.http("GET", "/v1/tenant/not-a-tenant"))[0] == 400
    assert error_of(lambda: c.http("GET", f"/v1/tenant/{t}"))[0] == 404
    assert error_of(lambda: c.http("POST", "/v1/tenant", {"tenant_id": "zz"}))[0] == 400

    ps = Pageserver(tmp_path / "ps1").start()
    c.http("POST", "/v1/node", {"node_id": 1, "http_addr": f"127.0.0.1:{ps.http_port}", "page_addr": f"127.0.0.1:{ps.pg_port}"})
    wait_until("the pageserver online", lambda: nodes(c)[1]["availability"] == "online")
    loc = c.http("POST", "/v1/tenant", {"tenant_id": t})
    assert loc["attached"]["node_id"] == 1 and loc.get("secondary") is None
    code, text = error_of(lambda: c.http("POST", "/v1/tenant", {"tenant_id": t}))
    assert code == 409 and "already placed" in text
    assert c.http("GET", "/v1/tenant") == [loc]
    assert "refused GET /v1/tenant" in c.log_text()
    c.allowed_errors.append("refused ")


def test_a_database_with_another_schema_is_refused(tmp_path, pg_factory):
    db = pg_factory("controller-db").initdb().start()
    db.sql("CREATE TABLE fjord_controller_schema (version integer NOT NULL)")
    db.sql("INSERT INTO fjord_controller_schema VALUES (99)")
    c = Controller(tmp_path, "a", db.conninfo)
    r = subprocess.run([str(fjord_bin_dir() / "storage_controller"), "--database", db.conninfo, "--listen", c.addr, *c.tls_args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "schema is version [99], this controller's 1: refusing to touch it" in r.stderr, r.stderr
    assert db.sql("SELECT version FROM fjord_controller_schema") == [(99,)]
