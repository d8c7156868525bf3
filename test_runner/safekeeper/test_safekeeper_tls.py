"""The safekeepers' port with TLS on (the fixtures' default), against real processes: a
proposer and a replication client without TLS, a client that trusts another CA and one
that dials a name the certificate does not carry are each refused with a reason it shows,
logged and counted, while the safekeepers go on serving the cluster's compute."""

from __future__ import annotations

import socket
import struct

import psycopg
import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.postgres import wait_until
from fixtures.tls import Ca


def hello(tenant: str, timeline: str) -> bytes:
    """A proposer's `Hello` (quorum::wire, protocol version 6), no token."""
    name = b"plaintext proposer"
    payload = (struct.pack(">I", 6) + bytes.fromhex(tenant) + bytes.fromhex(timeline) + struct.pack(">QI", 7, 16 << 20)
               + struct.pack(">I", len(name)) + name + struct.pack(">I", 0))
    return b"H" + struct.pack(">I", len(payload)) + payload


# Expected: the refusals the test provokes.
@pytest.mark.allowed_errors(r"refused a connection to the TLS port")
def test_clients_without_tls_or_trust_are_refused_and_the_cluster_served(tmp_path, pageserver, safekeepers):
    assert all(sk.tls for sk in safekeepers), "the fixtures start safekeepers with TLS"
    tl = Timeline(tmp_path, pageserver)
    ep = Endpoint(tmp_path, tl, "ep", safekeepers=safekeepers).start()
    ep.sql("CREATE TABLE t (x int)")
    sk = safekeepers[0]
    before = sk.tls_failures()
    conninfo = dict(host="127.0.0.1", port=sk.port, user="fjord", dbname=f"{tl.tenant}/{tl.timeline}", replication="true",
                    connect_timeout=10, passfile="/dev/null")

    # A replication client without TLS: PostgreSQL's "SSL required"-style FATAL error.
    with pytest.raises(psycopg.OperationalError, match="SSL required: this safekeeper accepts only TLS connections"):
        psycopg.connect(**conninfo, sslmode="disable")
    # A proposer without TLS: the proposer protocol's Error (tag `x`) with the reason.
    with socket.create_connection(("127.0.0.1", sk.port), timeout=10) as s:
        s.sendall(hello(tl.tenant, tl.timeline))
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply[:1] == b"x" and b"accepts only TLS connections" in reply, reply
    # A client that trusts another CA.
    other = Ca(tmp_path / "other-ca")
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(**conninfo, sslmode="verify-full", sslrootcert=str(other.cert))
    # A client that dials a name the certificate does not carry.
    with pytest.raises(psycopg.OperationalError, match="does not match host name"):
        psycopg.connect(**{**conninfo, "host": "sk.elsewhere.example", "hostaddr": "127.0.0.1"},
                        sslmode="verify-full", sslrootcert=str(sk.tls))

    # Counted: the two without TLS, and the handshake the other CA's client aborted (libpq
    # checks the host name after a completed handshake, and then just closes).
    wait_until("the refusals to be counted", lambda: (
        (now := sk.tls_failures())["plaintext"] >= before["plaintext"] + 2 and now["handshake"] >= before["handshake"] + 1))
    assert sk.log_text().count("refused a connection to the TLS port") >= 3, sk.log_tail()
    # The cluster is served all along: the compute commits, and a client with the CA streams.
    ep.sql("INSERT INTO t VALUES (1)")
    assert ep.sql("SELECT count(*) FROM t")[0][0] == 1
    with psycopg.connect(**conninfo, **sk.libpq_tls()) as conn:
        row = conn.pgconn.exec_(b"IDENTIFY_SYSTEM")
        assert row.ntuples == 1, row.error_message
