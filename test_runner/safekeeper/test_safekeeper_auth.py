"""A safekeeper with authentication (`--auth-public-key`), as a real process, with tokens
made by PyJWT (`fixtures/auth.py`): an implementation independent of the Rust one.

Each of its three protocols is shown refusing requests without a token and with every
kind of bad token (counted by reason in `safekeeper_auth_failures_total`, each refusal
one WARN line in the log, nothing created), and accepting the tokens it should:
- the HTTP API: an admin token for everything but `/metrics` and `/v1/status`;
- replication (libpq through psycopg, the token as the password): a token that may read
  the timeline's WAL (the tenant's, storage, admin);
- a proposer's `Hello` (raw bytes of `quorum::wire` version 6): the tenant's token;
and the pageserver's WAL receiver giving the safekeeper the `FJORD_AUTH_TOKEN` of its
process, or failing with a message that says to set it.
"""

from __future__ import annotations

import json
import struct
import time
import urllib.error
import uuid
from email.message import Message

import psycopg
import pytest

from fixtures.auth import KeyPair, bad_tokens
from fixtures.compute import Timeline
from fixtures.logs import unexpected_lines
from fixtures.pageserver import Pageserver
from fixtures.postgres import wait_until
from fixtures.safekeeper import Safekeeper

# Expected in these tests' logs: the refusals the tests provoke.
pytestmark = pytest.mark.allowed_errors(r"safekeeper::access: refused", r"(management API|page service) refused a (request|client)", r"could not stream WAL from \S+: (the safekeeper requires a token|the server refused the connection: the token)")

SYSTEM_ID = 7_000_000_000_000_000_001
REASONS = ["missing", "malformed", "bad_signature", "expired", "forbidden", "wrong_tenant", "wrong_timeline"]
# What the safekeeper says for each reason (the auth crate's messages).
SAYS = {
    "missing": "authentication required",
    "malformed": "malformed token",
    "bad_signature": "signature does not verify",
    "expired": "the token expired",
    "forbidden": "may not",
    "wrong_tenant": "the token is for tenant",
    "wrong_timeline": "the token is for timeline",
}
# The refusal lines the safekeeper logs at WARN; anything else at WARN or ERROR is a bug.
REFUSED = [r"WARN .*safekeeper::access: refused: "]


@pytest.fixture
def sk(tmp_path, keys):
    s = Safekeeper(tmp_path / "safekeepers", 1, auth_public_key=keys.public_path).start()
    yield s
    s.kill()


@pytest.fixture
def ids() -> tuple[str, str]:
    return uuid.uuid4().hex, uuid.uuid4().hex


def http(sk: Safekeeper, method: str, path: str, body: dict | None = None, token: str = ""):
    """(status, body, headers) of a request, errors included; the headers' names are
    case-insensitive."""
    try:
        return 200, sk.http(method, path, body, token=token), Message()
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        return e.code, json.loads(text) if text.startswith("{") else text, e.headers


def refused_once(sk: Safekeeper, before: dict[str, float], reason: str) -> None:
    """Exactly one refusal, for `reason`, since `before`."""
    after = sk.auth_failures()
    assert {r: after[r] - before[r] for r in REASONS} == {r: float(r == reason) for r in REASONS}


def check_log(sk: Safekeeper, refusals: int, allowed: list[str] | None = None) -> None:
    """Exactly one WARN line per refusal, and no other WARN or ERROR but `allowed`."""
    text = sk.log_text()
    assert unexpected_lines(text, REFUSED + (allowed or [])) == []
    assert text.count("safekeeper::access: refused: ") == refusals, sk.log_tail()
    assert "authentication is on" in text and "authentication is off" not in text


def test_http_needs_an_admin_token(sk, keys, other_keys, ids):
    tenant, timeline = ids
    path = f"/v1/tenant/{tenant}/timeline/{timeline}"
    body = {"system_id": SYSTEM_ID}
    # Open, and every reason counted from the start.
    assert http(sk, "GET", "/v1/status")[0] == 200
    assert sk.auth_failures() == {r: 0.0 for r in REASONS}

    cases = [("no token", "", 401, "missing")] + [
        (name, token, 403 if name == "another tenant" else 401,
         {"another cluster's key": "bad_signature", "expired": "expired", "unsigned": "malformed",
          "garbage": "malformed", "another tenant": "forbidden"}[name])
        for name, token in bad_tokens(keys, other_keys, tenant, uuid.uuid4().hex)
    ] + [
        ("the tenant's own", keys.tenant(tenant), 403, "forbidden"),
        ("storage", keys.storage(), 403, "forbidden"),
    ]
    refusals = 0
    for name, token, code, reason in cases:
        for method, b in [("POST", body), ("GET", None)]:
            before = sk.auth_failures()
            status, answer, headers = http(sk, method, path, b, token=token)
            assert status == code, f"{name}: {method} answered {status} {answer}"
            assert SAYS[reason] in answer["error"], f"{name}: {answer}"
            assert (headers.get("WWW-Authenticate") == "Bearer") == (code == 401), headers
            refused_once(sk, before, reason)
            refusals += 1
    # Nothing happened: the timeline is not there.
    assert not (sk.datadir / tenant).exists()
    assert http(sk, "GET", path, token=keys.admin())[0] == 404

    status, answer, _ = http(sk, "POST", path, body, token=keys.admin())
    assert status == 200 and answer["created"] is True, answer
    assert sk.timeline_dir(tenant, timeline).is_dir()
    assert http(sk, "GET", path, token=keys.admin())[1]["commit_lsn"] == "0/0"
    check_log(sk, refusals)


def replication_conninfo(sk: Safekeeper, tenant: str, timeline: str) -> dict:
    # passfile: never a password from the test user's ~/.pgpass.
    return dict(host="127.0.0.1", port=sk.port, user="fjord", dbname=f"{tenant}/{timeline}", replication="true",
                connect_timeout=10, passfile="/dev/null", **sk.libpq_tls())


def test_replication_needs_a_token_that_may_read_the_timeline(sk, keys, other_keys, ids, monkeypatch):
    tenant, timeline = ids
    monkeypatch.delenv("PGPASSWORD", raising=False)
    sk.create_timeline(tenant, timeline, SYSTEM_ID, token=keys.admin())
    conninfo = replication_conninfo(sk, tenant, timeline)

    # libpq without a password gives up when asked for one: refused as sending none.
    before = sk.auth_failures()
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(**conninfo)
    wait_until("the refusal to be counted", lambda: sk.auth_failures()["missing"] == before["missing"] + 1)
    refused_once(sk, before, "missing")
    refusals = 1

    cases = [(name, token, {"another cluster's key": "bad_signature", "expired": "expired", "unsigned": "malformed",
                            "garbage": "malformed", "another tenant": "wrong_tenant"}[name])
             for name, token in bad_tokens(keys, other_keys, tenant, uuid.uuid4().hex)]
    cases.append(("another timeline's", keys.tenant(tenant, uuid.uuid4().hex), "wrong_timeline"))
    for name, token, reason in cases:
        before = sk.auth_failures()
        with pytest.raises(psycopg.OperationalError) as e:
            psycopg.connect(**conninfo, password=token)
        assert SAYS[reason] in str(e.value), f"{name}: {e.value}"
        refused_once(sk, before, reason)
        refusals += 1

    # A timeline the safekeeper does not have: without a token that is all a client learns.
    with pytest.raises(psycopg.OperationalError, match=SAYS["expired"]):
        psycopg.connect(**replication_conninfo(sk, tenant, uuid.uuid4().hex), password=keys.token("storage", expires_in=-3600))
    refusals += 1

    before = sk.auth_failures()
    for token in [keys.tenant(tenant), keys.tenant(tenant, timeline), keys.storage(), keys.admin()]:
        with psycopg.connect(**conninfo, password=token) as conn:
            row = conn.pgconn.exec_(b"IDENTIFY_SYSTEM")
            assert row.get_value(0, 0) == str(SYSTEM_ID).encode(), row.error_message
    assert sk.auth_failures() == before
    check_log(sk, refusals)


def hello(tenant: str, timeline: str, token: str) -> bytes:
    """A proposer's `Hello` in `quorum::wire` version 6 (its `Hello` is version 5's): version, tenant, timeline, system
    id, WAL segment size, name, token."""
    name, tok = b"test_auth", token.encode()
    payload = (struct.pack(">I", 6) + bytes.fromhex(tenant) + bytes.fromhex(timeline)
               + struct.pack(">QI", SYSTEM_ID, 16 << 20)
               + struct.pack(">I", len(name)) + name + struct.pack(">I", len(tok)) + tok)
    return b"H" + struct.pack(">I", len(payload)) + payload


def greet(sk: Safekeeper, tenant: str, timeline: str, token: str) -> tuple[bytes, bytes]:
    """Sends a Hello; (tag, payload) of the answer."""
    with sk.connect_raw() as s:
        s.sendall(hello(tenant, timeline, token))
        data = b""
        while len(data) < 5 or len(data) < 5 + struct.unpack(">I", data[1:5])[0]:
            chunk = s.recv(65536)
            assert chunk, f"the safekeeper closed without answering: {data!r}"
            data += chunk
        return data[:1], data[5:5 + struct.unpack(">I", data[1:5])[0]]


# Expected: the timeline the test's proposer writes without creating it.
@pytest.mark.allowed_errors(r"a proposer writes to a timeline this safekeeper has no record of")
def test_a_proposer_needs_a_token_for_its_timeline(sk, keys, other_keys, ids):
    tenant, timeline = ids
    cases = [("no token", "", "missing")] + [
        (name, token, {"another cluster's key": "bad_signature", "expired": "expired", "unsigned": "malformed",
                       "garbage": "malformed", "another tenant": "wrong_tenant"}[name])
        for name, token in bad_tokens(keys, other_keys, tenant, uuid.uuid4().hex)
    ] + [
        ("another timeline's", keys.tenant(tenant, uuid.uuid4().hex), "wrong_timeline"),
        ("storage", keys.storage(), "forbidden"),
    ]
    for name, token, reason in cases:
        before = sk.auth_failures()
        tag, payload = greet(sk, tenant, timeline, token)
        assert tag == b"x", f"{name}: {tag!r} {payload!r}"
        message = payload[4:].decode()
        assert SAYS[reason] in message, f"{name}: {message}"
        refused_once(sk, before, reason)
    # A refused Hello creates nothing (a Hello that is let in creates an unknown timeline,
    # as a learner).
    assert not (sk.datadir / tenant).exists()

    for token in [keys.tenant(tenant, timeline), keys.tenant(tenant), keys.admin()]:
        tag, payload = greet(sk, tenant, timeline, token)
        assert tag == b"h", payload
        assert struct.unpack(">IQ", payload) == (6, sk.id)
    status = sk.http("GET", f"/v1/tenant/{tenant}/timeline/{timeline}", token=keys.admin())
    assert status["learner"] is True and status["system_id"] == SYSTEM_ID, status
    check_log(sk, len(cases), [r"a proposer writes to a timeline this safekeeper has no record of"])


def test_the_pageserver_reads_wal_with_its_token(tmp_path, sk, keys, monkeypatch):
    """The WAL receiver answers the safekeeper's request for a password with the token
    registered with the timeline's sources, never with one of its process; without one it
    fails saying how to register one."""
    # A token in the pageserver's environment is not presented.
    monkeypatch.setenv("FJORD_AUTH_TOKEN", keys.storage())
    ps = Pageserver(tmp_path).start()
    try:
        tl = Timeline(tmp_path, ps)
        sk.create_timeline(tl.tenant, tl.timeline, int(tl.status()["system_id"]), token=keys.admin())
        before = sk.auth_failures()
        sources = [{"host": "127.0.0.1", "port": sk.port, "user": "fjord"}]
        ps.http("POST", f"{tl.path}/wal_receiver", {"sources": sources})

        def receiver():
            return tl.status().get("wal_receiver") or {}
        error = wait_until("the receiver to fail", lambda: receiver().get("last_error"))
        assert "the safekeeper requires a token: register the timeline's WAL sources with one" in error, error
        # The safekeeper saw a client that closed at the request for a password.
        wait_until("the refusal to be counted", lambda: sk.auth_failures()["missing"] > before["missing"])

        # Registered with a storage token for this timeline, the receiver gets in: what
        # keeps it from streaming now is only that this safekeeper has no WAL yet.
        token = keys.token("storage", tl.tenant, tl.timeline)
        ps.http("POST", f"{tl.path}/wal_receiver", {"sources": sources, "token": token})
        wait_until("the receiver to get past authentication", lambda: receiver().get("state") == "waiting")
        # Counted from here: the token-less receiver it replaced may have tried once more
        # before it stopped. The waiting receiver connects again every round, refused never.
        before = sk.auth_failures()
        time.sleep(1.5)
        assert sk.auth_failures() == before
        # A storage token for another timeline is refused by the safekeeper.
        other = keys.token("storage", tl.tenant, "ab" * 16)
        ps.http("POST", f"{tl.path}/wal_receiver", {"sources": sources, "token": other})
        wait_until("the refusal of another timeline's token",
                   lambda: sum(sk.auth_failures().values()) > sum(before.values()))
    finally:
        ps.stop()


# Expected: the positions the test reports on the pageserver's behalf.
@pytest.mark.allowed_errors(r"safekeeper::replication: ignored the remote-consistent LSN")
def test_only_the_pageserver_moves_the_removal_horizon(sk, keys, ids):
    """The remote-consistent LSN (fjord's `P` message on a replication connection) lets a
    safekeeper remove WAL: only a storage token (the pageserver's) may report it. A tenant's
    token, which a compute holds and which may read the timeline's WAL, reports a position
    far ahead: it is ignored (logged), and the horizon stays where it was."""
    tenant, timeline = ids
    sk.create_timeline(tenant, timeline, SYSTEM_ID, token=keys.admin())
    path = f"/v1/tenant/{tenant}/timeline/{timeline}"

    def reported() -> str:
        return sk.http("GET", path, token=keys.admin())["remote_consistent_lsn"]

    far = 0xFF << 32
    for token in [keys.tenant(tenant), keys.tenant(tenant, timeline), keys.admin()]:
        sk.report_remote_consistent_lsn(tenant, timeline, far, token=token)
        assert reported() == "0/0", "a token that is not the pageserver's moved the removal horizon"
        sk.report_remote_consistent_lsn(tenant, timeline, far, token=token, generation=7)
        assert reported() == "0/0", "a token that is not the pageserver's moved the removal horizon"
    assert sk.log_text().count("not a storage token") >= 6, sk.log_tail()
    # The pageserver's storage token does.
    sk.report_remote_consistent_lsn(tenant, timeline, 0x1000, token=keys.storage(), generation=1)
    assert reported() == "0/1000"
