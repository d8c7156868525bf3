"""What crosses the wire: a whole cluster, each service on its own host
(`fixtures/netns.py`), recorded by a capture on the switch (every frame the bridge carries)
while pgbench runs, then searched for what must not travel in cleartext.

The cluster: a pageserver, three safekeepers, a compute and a read replica, each on its own
host, with authentication on. Besides pgbench, a table whose rows hold a marker computed by
the server (the SHA-256 of a random seed, in hex: the SQL text that makes it never carries
it, and the test's SQL goes through the compute's Unix socket anyway) goes to the
safekeepers and the pageserver as WAL records, and comes back as page images when the
replica, with tiny caches, reads it from the pageserver.

- `[tls-off]`: every token used (the computes', the pageserver's storage token for the
  safekeepers, the test's admin token), and the marker in the WAL the compute sends and in
  the pages the pageserver serves, are all FOUND: the capture sees the traffic.
- `[tls-on]`: none of them is found, and every connection with data on it speaks TLS from
  its start (or after PostgreSQL's `SSLRequest` and the server's `S`).

`test_the_capture_sees_every_byte_between_two_hosts` checks the capture itself.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import threading
import time

import pytest

from fixtures.auth import KeyPair
from fixtures.compute import Endpoint, Timeline, kill_all
from fixtures.netns import Network, TcpConnection
from fixtures.pageserver import Pageserver
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until
from fixtures.safekeeper import Safekeeper

# PostgreSQL's SSLRequest (length 8, code 80877103) and GSSENCRequest (code 80877104),
# which libpq may try first and the server refuses with `N`.
SSL_REQUEST = bytes.fromhex("0000000804d2162f")
GSSENC_REQUEST = bytes.fromhex("0000000804d21630")


def speaks_tls(c: TcpConnection) -> bool:
    """Whether the connection's bytes are TLS records from the start both ways: a
    handshake record (0x16, version 3.x) first, possibly after SSLRequest and `S` (and a
    refused GSSENCRequest before them)."""
    sent, received = c.sent, c.received
    if sent.startswith(GSSENC_REQUEST) and received.startswith(b"N"):
        sent, received = sent[len(GSSENC_REQUEST):], received[1:]
    if sent.startswith(SSL_REQUEST):
        if not received.startswith(b"S"):
            return False
        sent, received = sent[len(SSL_REQUEST):], received[1:]
    return sent[:2] == b"\x16\x03" and (not received or received[:2] == b"\x16\x03")


def test_the_capture_sees_every_byte_between_two_hosts(tmp_path):
    """Two hosts exchange a megabyte each way over one connection: the capture has it all,
    in order, attributed to the right ends; a frame between the switch and a host is seen
    too."""
    net = Network(tmp_path).start()
    try:
        a, b = net.host("a"), net.host("b")
        capture = net.capture()
        # An echo server on b; a client on a sends 1 MiB of random bytes and reads them back.
        payload_file = tmp_path / "payload"
        payload = os.urandom(1 << 20)
        payload_file.write_bytes(payload)
        server = subprocess.Popen([*b.wrap, "python3", "-c", ECHO, b.addr, "7000"], stdout=subprocess.PIPE)
        try:
            assert server.stdout.readline().strip() == b"listening"
            client = subprocess.run([*a.wrap, "python3", "-c", SEND, b.addr, "7000", str(payload_file)],
                                    capture_output=True, timeout=60)
            assert client.returncode == 0, client.stderr.decode()
        finally:
            server.kill()
            server.wait()
        capture.stop()
    finally:
        net.close()

    found = capture.find(payload[:4096])
    assert len(found) == 1, capture.connections()
    c = found[0]
    assert c.client[0] == a.addr and c.server == (b.addr, 7000), c
    assert c.sent == payload and c.received == payload, f"{c}: {c.gaps} gaps"
    assert capture.frames_dropped == 0, f"the kernel dropped {capture.frames_dropped} of {capture.frames_seen} frames"


ECHO = r"""
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
c, _ = s.accept()
while data := c.recv(65536):
    c.sendall(data)
"""

SEND = r"""
import socket, sys, threading
data = open(sys.argv[3], "rb").read()
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
t = threading.Thread(target=lambda: (c.sendall(data), c.shutdown(socket.SHUT_WR)))
t.start()
got = b""
while chunk := c.recv(65536):
    got += chunk
t.join()
assert got == data, len(got)
"""


@pytest.fixture(params=["tls-off", "tls-on"])
def tls(request) -> bool:
    return request.param == "tls-on"


def pgbench(ep: Endpoint, *args: str) -> str:
    """pgbench through the compute's Unix socket (the test's own traffic never crosses the
    switch); its output, or RuntimeError with both outputs."""
    r = subprocess.run([str(pg_bin_dir() / "pgbench"), "-h", str(ep.pgdata.absolute()), "-p", str(ep.port),
                        "-U", ep.user, *args, "postgres"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"pgbench {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def test_a_cluster_sends_no_token_page_or_wal_record_in_cleartext(tmp_path, tls, monkeypatch):
    keys = KeyPair(tmp_path / "keys")
    net = Network(tmp_path).start()
    ps = None
    sks: list[Safekeeper] = []
    capture = None
    try:
        ps_host = net.host("pageserver")
        sk_hosts = [net.host(f"sk{i}") for i in (1, 2, 3)]
        compute_host, replica_host = net.host("compute"), net.host("replica")
        # Everything from the first request on is recorded.
        capture = net.capture()

        admin = keys.admin()
        ps = Pageserver(tmp_path, auth_public_key=keys.public_path, tls=tls, **ps_host.service_kw())
        ps.token = admin
        ps.start()
        for i, h in enumerate(sk_hosts, start=1):
            sk = Safekeeper(tmp_path / "safekeepers", i, auth_public_key=keys.public_path, tls=tls, **h.service_kw())
            sk.token = admin
            sks.append(sk.start())
        tl = Timeline(tmp_path, ps)
        tl.create_on(sks)
        # What `fjord tenant create` does: the safekeepers registered as the WAL sources,
        # with a storage token the WAL receiver presents to them.
        storage = keys.token("storage", tl.tenant, tl.timeline)
        ps.http("POST", f"{tl.path}/wal_receiver",
                {"sources": [{"host": sk.host, "port": sk.port, "user": "fjord"} for sk in sks], "token": storage})

        # The computes' token (compute_ctl takes it from its environment).
        compute_token = keys.tenant(tl.tenant, tl.timeline)
        monkeypatch.setenv("FJORD_AUTH_TOKEN", compute_token)
        ep = Endpoint(tmp_path, tl, "ep", safekeepers=sks, **compute_host.compute_kw()).start()

        # pgbench read-write, and the marker rows written meanwhile.
        pgbench(ep, "-i", "-s", "1", "-q")
        seed = secrets.token_hex(8)
        marker = hashlib.sha256(f"fjord-capture-{seed}".encode()).hexdigest().encode()
        bench = threading.Thread(target=lambda: pgbench(ep, "-c", "2", "-T", "4"), daemon=True)
        bench.start()
        ep.sql("CREATE TABLE secret (id int, v text)")
        # Stored inline and uncompressed, as it comes: the WAL records and pages hold it.
        ep.sql("ALTER TABLE secret ALTER v SET STORAGE PLAIN")
        ep.sql("INSERT INTO secret SELECT i, repeat(encode(sha256(convert_to('fjord-capture-' || %s, 'UTF8')), 'hex'), 16)"
               " FROM generate_series(1, 400) i", seed)
        bench.join(timeout=120)
        ep.sql("CHECKPOINT")
        lsn = ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0]

        # A replica with tiny caches reads the rows back from the pageserver: page images.
        replica = Endpoint(tmp_path, tl, "replica", safekeepers=sks, replica=True,
                           settings={"shared_buffers": "1MB", "fjord.file_cache_size": "0"},
                           **replica_host.compute_kw()).start()
        wait_until("the replica to replay the marker rows",
                   lambda: replica.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn)[0][0], timeout_s=60)
        assert replica.sql("SELECT count(*), sum(length(v)) FROM secret") == [(400, 400 * 16 * 64)]
        replica.stop()
        ep.stop()
        capture.stop()
    finally:
        kill_all()
        for sk in sks:
            sk.kill()
        if ps is not None:
            ps.kill()
        if capture is not None:
            capture.stop()
        net.close()

    conns = [c for c in capture.connections() if c.sent or c.received]
    print(f"captured {capture.frames_seen} frames ({capture.frames_dropped} dropped), "
          f"{len(conns)} connections with data, {capture.bytes_total() >> 10} KiB")
    # A search of an incomplete capture would prove little.
    assert capture.frames_dropped == 0, f"the capture missed {capture.frames_dropped} frames"
    # The links the search covers, each with traffic on it.
    page_service = [c for c in conns if c.server == (ps.host, ps.pg_port)]
    proposer_or_replication = [c for c in conns if c.server in {(sk.host, sk.port) for sk in sks}]
    to_pageserver_http = [c for c in conns if c.server == (ps.host, ps.http_port)]
    for name, links in [("page service", page_service), ("safekeepers", proposer_or_replication),
                        ("pageserver HTTP", to_pageserver_http)]:
        assert sum(len(c.sent) + len(c.received) for c in links) > 0, f"no traffic captured on the {name} links"

    secrets_found = {
        "the admin token": capture.find(admin.encode()),
        "the pageserver's storage token": capture.find(storage.encode()),
        "the computes' token": capture.find(compute_token.encode()),
        "the marker in WAL sent to the safekeepers": [c for c in proposer_or_replication if marker in c.sent],
        "the marker in pages from the pageserver": [c for c in page_service if marker in c.received],
    }
    if not tls:
        # The capture sees what crosses the wire: in cleartext, every one of them is there.
        missing = [what for what, found in secrets_found.items() if not found]
        assert not missing, f"not found in the cleartext capture: {missing}"
    else:
        secrets_found["the marker, anywhere"] = capture.find(marker)
        leaked = {what: found for what, found in secrets_found.items() if found}
        assert not leaked, f"found in cleartext on the wire: {leaked}"
        plain = [c for c in conns if not speaks_tls(c)]
        assert not plain, f"connections that do not speak TLS: {plain}"
