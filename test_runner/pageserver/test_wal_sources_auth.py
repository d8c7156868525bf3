"""Who may say where a timeline's WAL comes from, and which credential the pageserver's WAL
receiver hands to it.

The receiver answers a source's cleartext password request with a token. If a compute's
tenant token could point the receiver at any host and port, a server of the compute's
choosing would receive that token; it was the pageserver's `storage` token, which reads
every tenant's WAL. Now only an admin registers a timeline's sources (with a storage token
narrowed to the timeline, which the receiver presents); a tenant token may only restart the
registered ones."""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid

import jwt
import pytest

from fixtures.auth import KeyPair
from fixtures.pageserver import HttpError, Pageserver
from fixtures.postgres import PgServer


class PasswordTrap:
    """A TCP server that speaks just enough of PostgreSQL's protocol to ask every client for
    a cleartext password, and keeps what it was given."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.passwords: list[str] = []
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                try:
                    conn.settimeout(5)
                    (length,) = struct.unpack("!I", self._read(conn, 4))
                    self._read(conn, length - 4)  # the startup message
                    conn.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword
                    tag = self._read(conn, 1)
                    (length,) = struct.unpack("!I", self._read(conn, 4))
                    body = self._read(conn, length - 4)
                    if tag == b"p":
                        self.passwords.append(body.rstrip(b"\0").decode(errors="replace"))
                except (OSError, struct.error, ConnectionError):
                    pass

    @staticmethod
    def _read(conn: socket.socket, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = conn.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A secured pageserver with a tenant whose timeline has data (imported from initdb).
    It runs with a `storage` token in its environment, as pageservers were given one."""
    keys = KeyPair(tmp_path / "keys")
    monkeypatch.setenv("FJORD_AUTH_TOKEN", keys.storage())
    # Without TLS: the traps are plaintext servers (with TLS the pageserver would refuse
    # them before any password, which tests nothing about which token it sends).
    ps = Pageserver(tmp_path, auth_public_key=keys.public_path, tls=False).start()
    ps.token = keys.admin()
    pg = PgServer(tmp_path).initdb()
    tenant, timeline = uuid.uuid4().hex, uuid.uuid4().hex
    ps.http("POST", "/v1/tenant", {"tenant_id": tenant})
    ps.http("POST", f"/v1/tenant/{tenant}/timeline", {"timeline_id": timeline})
    ps.http("POST", f"/v1/tenant/{tenant}/timeline/{timeline}/import", {"pgdata": str(pg.datadir)})
    traps = [PasswordTrap(), PasswordTrap()]
    try:
        yield ps, keys, tenant, timeline, traps
    finally:
        for t in traps:
            t.close()
        ps.stop()


def source(trap: PasswordTrap) -> dict:
    return {"host": "127.0.0.1", "port": trap.port, "user": "fjord"}


def refused(ps: Pageserver, method: str, path: str, token: str, body: dict | None = None) -> HttpError:
    with pytest.raises(HttpError) as e:
        ps.http(method, path, body, token=token)
    return e.value


def test_a_compute_token_cannot_point_the_wal_receiver_at_its_own_server(cluster):
    ps, keys, tenant, timeline, (trap, _) = cluster
    path = f"/v1/tenant/{tenant}/timeline/{timeline}/wal_receiver"
    compute = keys.tenant(tenant, timeline)
    # Both shapes of the request, from the timeline's own compute token.
    for body in (source(trap), {"sources": [source(trap)]}):
        try:
            ps.http("POST", path, body, token=compute)
            accepted = True
        except HttpError as e:
            accepted = False
            assert e.status == 403 and "registered WAL sources" in e.body["error"], e
        # Give a receiver that was started time to connect and answer the password request.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not trap.passwords:
            time.sleep(0.05)
        leaked = [jwt.decode(p, options={"verify_signature": False}) for p in trap.passwords]
        assert not trap.passwords, f"the pageserver sent a token to a server of the compute's choosing: {leaked}"
        assert not accepted, "a tenant token set the timeline's WAL sources"
    assert trap.connections == 0
    # Nor may it give the receiver a token, or stop it.
    e = refused(ps, "POST", path, compute, {"sources": [source(trap)], "token": compute})
    assert e.status == 403, e
    e = refused(ps, "DELETE", path, compute)
    assert e.status == 403 and "admin" in e.body["error"], e


def test_registered_sources_get_the_narrowed_token_and_a_compute_restarts_only_them(cluster):
    ps, keys, tenant, timeline, (registered, stranger) = cluster
    path = f"/v1/tenant/{tenant}/timeline/{timeline}/wal_receiver"
    narrowed = keys.token("storage", tenant, timeline)
    ps.http("POST", path, {"sources": [source(registered)], "token": narrowed})
    wait = time.monotonic() + 10
    while time.monotonic() < wait and not registered.passwords:
        time.sleep(0.05)
    # The receiver presents the token registered with the sources, never the process's own.
    assert registered.passwords and set(registered.passwords) == {narrowed}, registered.passwords
    # The wal_receiver.json that holds it is the pageserver user's alone.
    persisted = ps.workdir / "tenants" / tenant / "timelines" / timeline / "wal_receiver.json"
    assert persisted.stat().st_mode & 0o077 == 0, oct(persisted.stat().st_mode)

    compute = keys.tenant(tenant, timeline)
    # The compute may ask again for the registered source (compute_ctl does at every start)...
    ps.http("POST", path, {"sources": [source(registered)]}, token=compute)
    # ...but not for another one, alone or beside the registered one.
    for body in ({"sources": [source(stranger)]}, {"sources": [source(registered), source(stranger)]}, source(stranger)):
        e = refused(ps, "POST", path, compute, body)
        assert e.status == 403 and f"127.0.0.1:{stranger.port} is not one of" in e.body["error"], e
    time.sleep(1)
    assert stranger.connections == 0
    status = ps.http("GET", f"/v1/tenant/{tenant}/timeline/{timeline}", token=compute)["wal_receiver"]
    assert [s["port"] for s in status["sources"]] == [registered.port], status
    # The admin changes them.
    ps.http("POST", path, {"sources": [source(stranger)], "token": narrowed})
    wait = time.monotonic() + 10
    while time.monotonic() < wait and not stranger.passwords:
        time.sleep(0.05)
    assert set(stranger.passwords) == {narrowed}
    ps.http("DELETE", path)


# Expected: the refusal the test checks.
@pytest.mark.allowed_errors(r"could not stream WAL from \S+: the safekeeper requires a token")
def test_a_source_registered_without_a_token_is_not_given_the_process_token(cluster):
    """A source registered without a token is given none, never a token of the pageserver's
    process. Without safekeepers, `fjord endpoint start` registers exactly such a source:
    the compute's own walsender, a server the compute's SQL superuser controls (it can
    write pg_hba.conf with COPY, reload, and terminate the walsender so that the receiver
    reconnects and answers a cleartext password request). The fixture's pageserver has a
    storage token in its environment, which reads every tenant's WAL."""
    ps, keys, tenant, timeline, (walsender, _) = cluster
    path = f"/v1/tenant/{tenant}/timeline/{timeline}/wal_receiver"
    # What `fjord endpoint start` sends with `--safekeepers 0` (an admin call, no token).
    ps.http("POST", path, source(walsender))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not walsender.passwords:
        time.sleep(0.05)
    given = [jwt.decode(p, options={"verify_signature": False}) for p in walsender.passwords]
    wide = [c for c in given if not (c.get("tenant_id") == tenant and c.get("timeline_id") == timeline)]
    assert not wide, f"a source registered without a token (a compute's walsender) was given the pageserver's own token: {wide}"
