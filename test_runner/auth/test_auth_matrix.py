"""The authentication matrix (`test_runner/auth_matrix.md`) against real processes: every
route and protocol message of the pageserver and the safekeeper, called with each kind of
credential, must get the answer its cell says. One pageserver and one safekeeper, each
started once with authentication on; every mismatch is reported together, naming the row,
the column, what was expected and what came back.

A route or message in the source that the table does not list fails
`test_the_matrix_lists_every_route_and_message`, so a new one cannot go unchecked."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone
from typing import Callable

import pytest

from fixtures import auth_matrix as matrix
from fixtures import https
from fixtures.auth import KeyPair
from fixtures.compute import Timeline
from fixtures.pageserver import Pageserver
from fixtures.pagestream import ERROR_CODES, PROTOCOL_VERSION, RelTag, frame, lsn_int
from fixtures.pagestream import connect as pagestream_connect
from fixtures.postgres import free_port
from fixtures.safekeeper import Safekeeper

# Expected in these tests' logs: the refusals every cell of the matrix provokes.
pytestmark = pytest.mark.allowed_errors(
    r"safekeeper::access: refused", r"(management API|page service) refused a (request|client)",
    # the page service requests the matrix sends before a Hello, and the positions it reports
    # with tokens that may not move the removal horizon
    r"page service connection ended: protocol violation: expected Hello as the first message",
    r"safekeeper::replication: ignored the remote-consistent LSN",
)

SYSTEM_ID = 7_000_000_000_000_000_077


def new_id() -> str:
    return uuid.uuid4().hex


def check_rows(rows: list[matrix.Row], observe: Callable[[matrix.Row, str], tuple[str, str]]) -> None:
    """Runs every cell of `rows` through `observe(row, column) -> (outcome, detail)` and
    fails with all the cells whose outcome is not the table's."""
    assert rows, "no rows"
    wrong = []
    for row in rows:
        for column in matrix.COLUMNS:
            got, detail = observe(row, column)
            if got != row.cells[column]:
                wrong.append(f"{row} [{column}]: the table says {row.cells[column]}, got {got} ({detail})")
    assert not wrong, f"{len(wrong)} cells of {matrix.MATRIX.name} differ:\n" + "\n".join(wrong)


def test_the_matrix_lists_every_route_and_message():
    """Every route of both routers, every page service request, proposer message,
    replication command and standby message has a row, and every row names one that
    exists; the pageserver's module documentation lists every route too."""
    for (service, interface), in_source in matrix.operations_in_source().items():
        in_table = matrix.row_keys(service, interface)
        assert in_source - in_table == set(), f"{service} {interface}: no row in {matrix.MATRIX.name} for these"
        assert in_table - in_source == set(), f"{service} {interface}: rows for what the source does not have"
    assert matrix.undocumented_pageserver_routes() == set(), "routes missing from http.rs's documentation table"


# ---------------------------------------------------------------------------------------
# HTTP

def http_call(service: Pageserver | Safekeeper, method: str, path: str, body: dict | None,
              token: str) -> tuple[int, str, str | None]:
    """(status, body text, WWW-Authenticate) of a request to the service's API (https with
    TLS on), error statuses included."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"{service.http_url}{path}", data=data, method=method, headers=headers)
    try:
        with https.urlopen(req, service.tls, timeout=60, opener=service.urlopen) as resp:
            return resp.status, resp.read().decode(errors="replace"), None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), e.headers.get("WWW-Authenticate")


# A request as a row's cell makes it: (method, path, body, the statuses of its usual answer).
Request = tuple[str, str, "dict | None", set[int]]


def http_outcome(service: Pageserver | Safekeeper, request: Request, token: str) -> tuple[str, str]:
    method, path, body, usual = request
    status, text, challenge = http_call(service, method, path, body, token)
    detail = f"{method} {path}: {status} {text[:300]}"
    if status == 401:
        return ("401" if challenge == "Bearer" else "401 without WWW-Authenticate: Bearer"), detail
    if status == 403:
        return "403", detail
    return ("ok" if status in usual else f"not refused, but {status} is not the usual {sorted(usual)}"), detail


# ---------------------------------------------------------------------------------------
# The pageserver

def pageserver_requests(ps: Pageserver, tl: Timeline, keys: KeyPair, lsn: str) -> dict[str, Callable[[str], Request]]:
    """Each HTTP row's request for a column (doing, as an admin, what the row assumes
    first): valid, so that a call let through gets the handler's usual answer."""
    t = tl.path
    dead = {"host": "127.0.0.1", "port": free_port(), "user": "fjord"}
    stranger = {"host": "127.0.0.1", "port": free_port(), "user": "fjord"}

    def registered(_column: str) -> None:
        ps.http("POST", f"{t}/wal_receiver", {"sources": [dead]})

    def lease_taken(column: str) -> None:
        # Another token (its own claims, so its own fingerprint) holds this lease.
        other = keys.token("tenant", tl.tenant, purpose="another holder")
        ps.http("POST", f"{t}/lsn_lease", {"holder": f"held-{column}", "lsn": lsn, "ttl_secs": 60}, token=other)

    def after(setup: Callable[[str], None], make: Callable[[str], Request]) -> Callable[[str], Request]:
        def request(column: str) -> Request:
            setup(column)
            return make(column)
        return request

    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ").replace(":", "%3A")
    fixed: dict[str, Request] = {
        "GET /v1/status": ("GET", "/v1/status", None, {200}),
        "GET /metrics": ("GET", "/metrics", None, {200}),
        "GET /v1/no_such_route (a path no route has)": ("GET", "/v1/no_such_route", None, {404}),
        "GET /v1/tenant": ("GET", "/v1/tenant", None, {200}),
        "GET /v1/tenant/{tenant}/timeline": ("GET", f"/v1/tenant/{tl.tenant}/timeline", None, {200}),
        f"GET {matrix.TIMELINE_ROUTE}": ("GET", t, None, {200}),
        f"GET {matrix.TIMELINE_ROUTE} (ids that do not parse)":
            ("GET", "/v1/tenant/not-a-tenant/timeline/not-a-timeline", None, {400}),
        f"POST {matrix.TIMELINE_ROUTE}/import": ("POST", f"{t}/import", {"pgdata": "/nonexistent"}, {409}),
        f"POST {matrix.TIMELINE_ROUTE}/evict_layers": ("POST", f"{t}/evict_layers", None, {200}),
        f"GET {matrix.TIMELINE_ROUTE}/basebackup": ("GET", f"{t}/basebackup?lsn={lsn}", None, {200}),
        "GET /v1/tenant/{tenant}/config": ("GET", f"/v1/tenant/{tl.tenant}/config", None, {200}),
        "PUT /v1/tenant/{tenant}/config": ("PUT", f"/v1/tenant/{tl.tenant}/config", {}, {200}),
        "GET /v1/location": ("GET", "/v1/location", None, {200}),
        # A pageserver without a storage controller takes no orders: 409 past authentication.
        "PUT /v1/tenant/{tenant}/location": ("PUT", f"/v1/tenant/{tl.tenant}/location", {"mode": "detached"}, {409}),
        f"POST {matrix.TIMELINE_ROUTE}/checkpoint": ("POST", f"{t}/checkpoint", None, {200}),
        f"POST {matrix.TIMELINE_ROUTE}/compact": ("POST", f"{t}/compact", {}, {200}),
        f"POST {matrix.TIMELINE_ROUTE}/gc": ("POST", f"{t}/gc", {}, {200}),
        f"GET {matrix.TIMELINE_ROUTE}/get_lsn_by_timestamp":
            ("GET", f"{t}/get_lsn_by_timestamp?timestamp={now}", None, {200}),
        f"GET {matrix.TIMELINE_ROUTE}/changed_blocks": ("GET", f"{t}/changed_blocks?from={lsn}&to={lsn}", None, {200}),
    }
    requests = {op: (lambda _column, r=r: r) for op, r in fixed.items()}
    requests |= {
        "POST /v1/tenant": lambda _c: ("POST", "/v1/tenant", {"tenant_id": new_id()}, {201}),
        "POST /v1/tenant/{tenant}/timeline":
            lambda _c: ("POST", f"/v1/tenant/{tl.tenant}/timeline", {"timeline_id": new_id()}, {201}),
        f"POST {matrix.TIMELINE_ROUTE}/wal_receiver (the registered sources)":
            after(registered, lambda _c: ("POST", f"{t}/wal_receiver", {"sources": [dead]}, {202})),
        f"POST {matrix.TIMELINE_ROUTE}/wal_receiver (other sources)":
            after(registered, lambda _c: ("POST", f"{t}/wal_receiver", {"sources": [stranger]}, {202})),
        f"POST {matrix.TIMELINE_ROUTE}/wal_receiver (with a token for the receiver)":
            after(registered, lambda _c: ("POST", f"{t}/wal_receiver",
                                          {"sources": [dead], "token": keys.token("storage", tl.tenant, tl.timeline)},
                                          {202})),
        f"DELETE {matrix.TIMELINE_ROUTE}/wal_receiver":
            after(registered, lambda _c: ("DELETE", f"{t}/wal_receiver", None, {200})),
        f"POST {matrix.TIMELINE_ROUTE}/lsn_lease":
            lambda c: ("POST", f"{t}/lsn_lease", {"holder": f"lease-{c}", "lsn": lsn, "ttl_secs": 60}, {200}),
        f"POST {matrix.TIMELINE_ROUTE}/lsn_lease (a holder whose lease another token took)":
            after(lease_taken, lambda c: ("POST", f"{t}/lsn_lease", {"holder": f"held-{c}", "lsn": lsn, "ttl_secs": 60},
                                          {200})),
    }
    return requests


# pg_class of template1 in a fresh initdb (a mapped relation: its file is its OID).
PG_CLASS = RelTag(1663, 1, 1259)
# Each page service request a row sends after (or instead of) the Hello: tag, body, the
# answer's tag.
PAGESTREAM_REQUESTS = {
    "GetPage": (b"p", PG_CLASS.pack() + struct.pack(">I", 0), b"P"),
    "Nblocks": (b"n", PG_CLASS.pack(), b"N"),
    "Exists": (b"e", PG_CLASS.pack(), b"E"),
    "DbSize": (b"d", struct.pack(">II", 1663, 1), b"D"),
    "GetSlruSegment": (b"s", struct.pack(">BI", 0, 0), b"S"),  # pg_xact segment 0
}


def recv_exact(s: socket.socket, n: int) -> bytes | None:
    """`n` bytes, or None if the connection ends first."""
    buf = b""
    while len(buf) < n:
        try:
            chunk = s.recv(n - len(buf))
        except (ConnectionResetError, ssl.SSLEOFError):
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


def recv_frame(s: socket.socket, length_counts_itself: bool = False) -> tuple[bytes, bytes] | None:
    """(tag, payload) of a `tag, u32 length, payload` frame (PostgreSQL's length counts
    itself), or None at the end of the connection."""
    head = recv_exact(s, 5)
    if head is None:
        return None
    body = recv_exact(s, struct.unpack(">I", head[1:])[0] - (4 if length_counts_itself else 0))
    return None if body is None else (head[:1], body)


def pagestream_outcome(ps: Pageserver, tl: Timeline, row: matrix.Row, token: str, lsn: int) -> tuple[str, str]:
    name = row.operation.split()[0]
    with pagestream_connect(ps.host, ps.pg_port, getattr(ps, "tls", None)) as s:
        def request() -> None:
            tag, body, _ = PAGESTREAM_REQUESTS[name]
            s.sendall(frame(tag, struct.pack(">QQQ", 1, lsn, lsn) + body))

        if "instead of a Hello" in row.operation:
            request()
            answer = recv_frame(s)
            if answer and answer[0] == b"X" and ERROR_CODES.get(struct.unpack(">QH", answer[1][:10])[1]) == "protocol":
                return "protocol", answer[1][10:].decode()
            return "served without a Hello", repr(answer)
        ids = bytes.fromhex(tl.tenant) + bytes.fromhex(tl.timeline)
        s.sendall(frame(b"h", struct.pack(">H", PROTOCOL_VERSION) + ids + token.encode()))
        answer = recv_frame(s)
        if answer is None:
            return "closed without an answer", ""
        tag, payload = answer
        if tag == b"X":
            code = ERROR_CODES.get(struct.unpack(">QH", payload[:10])[1])
            message = payload[10:].decode()
            if code != "unauthorized":
                return f"error {code}", message
            # Nothing more is answered on a refused connection.
            if name != "Hello":
                try:
                    request()
                except OSError:
                    pass
                later = recv_frame(s)
                if later is not None:
                    return "refused, then answered", repr(later)
            return "refused", message
        if tag != b"H":
            return f"unexpected answer {tag!r}", repr(payload)
        if name == "Hello":
            return "ok", "HelloOk"
        request()
        answer = recv_frame(s)
        want = PAGESTREAM_REQUESTS[name][2]
        if answer is not None and answer[0] == want:
            return "ok", f"{name} answered"
        return f"{name} not answered as usual", repr(answer)[:300]


def test_pageserver(tmp_path, keys, other_keys):
    ps = Pageserver(tmp_path, auth_public_key=keys.public_path).start()
    ps.token = keys.admin()
    try:
        tl = Timeline(tmp_path, ps)
        lsn = tl.status()["last_record_lsn"]
        tokens = matrix.credentials(keys, other_keys, tl.tenant, tl.timeline, new_id(), new_id())
        requests = pageserver_requests(ps, tl, keys, lsn)
        rows = matrix.rows_of("pageserver")
        http_ops = {r.operation for r in rows if r.interface == "http"}
        assert http_ops == set(requests), f"rows without a request: {http_ops - set(requests)}; " \
                                          f"requests without a row: {set(requests) - http_ops}"

        def observe(row: matrix.Row, column: str) -> tuple[str, str]:
            if row.interface == "http":
                return http_outcome(ps, requests[row.operation](column), tokens[column])
            return pagestream_outcome(ps, tl, row, tokens[column], lsn_int(lsn))

        check_rows(rows, observe)
    finally:
        ps.stop()


# ---------------------------------------------------------------------------------------
# The safekeeper

class Reported:
    """Remote-consistent LSNs to report, each higher than the last (the safekeeper keeps the
    highest it was told)."""

    def __init__(self):
        self.lsn = 0x100_0000

    def next(self) -> int:
        self.lsn += 0x100
        return self.lsn


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def moved(sk: Safekeeper, tenant: str, timeline: str, reported: int) -> tuple[str, str]:
    """`ok` if the safekeeper's remote-consistent LSN is now `reported`, else `ignored`."""
    now = lsn_int(sk.timeline(tenant, timeline)["remote_consistent_lsn"])
    return ("ok" if now == reported else "ignored"), f"reported {lsn_text(reported)}, the safekeeper has {lsn_text(now)}"


def proposer_frame(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack(">I", len(payload)) + payload


def proposer_hello(tenant: str, timeline: str, token: str) -> bytes:
    """`quorum::wire` version 6's Hello: version, tenant, timeline, system id, segment
    size, name, token."""
    name, tok = b"auth_matrix", token.encode()
    return proposer_frame(b"H", struct.pack(">I", 6) + bytes.fromhex(tenant) + bytes.fromhex(timeline)
                          + struct.pack(">QI", SYSTEM_ID, 16 << 20)
                          + struct.pack(">I", len(name)) + name + struct.pack(">I", len(tok)) + tok)


class Refused(Exception):
    """A proposer message answered `Error` after the `Hello` was let in."""


class Terms:
    """Election terms for the proposer rows, each higher than the last."""

    def __init__(self):
        self.term = 0

    def next(self) -> int:
        self.term += 1
        return self.term


def proposer_answer(s: socket.socket, tags: bytes) -> tuple[bytes, bytes] | None:
    """The next message with a tag in `tags` or `x` (Error), skipping what the safekeeper
    sends unasked (`Feedback`, `Standbys`)."""
    while True:
        answer = recv_frame(s)
        if answer is None or answer[0] in tags or answer[0] == b"x":
            return answer


def proposer_outcome(sk: Safekeeper, tenant: str, timeline: str, row: matrix.Row, token: str, terms: Terms,
                     reported: Reported) -> tuple[str, str]:
    name = row.operation.split()[0]
    with sk.connect_raw(timeout=30) as s:
        s.sendall(proposer_hello(tenant, timeline, token))
        answer = recv_frame(s)
        if answer is None:
            return "closed without an answer", ""
        if answer[0] == b"x":
            message = answer[1][4:].decode(errors="replace")
            # Nothing more is answered on a refused connection.
            try:
                s.sendall(proposer_frame(b"G", struct.pack(">Q", 1)))
            except OSError:
                pass
            later = recv_frame(s)
            return ("refused" if later is None else "refused, then answered"), message
        if answer[0] != b"h":
            return f"unexpected answer {answer[0]!r}", repr(answer[1])
        if name == "Hello":
            return "ok", "HelloOk"

        def exchange(tag: bytes, payload: bytes, reply: bytes) -> bytes:
            s.sendall(proposer_frame(tag, payload))
            got = proposer_answer(s, reply)
            if got is not None and got[0] == b"x":
                raise Refused(got[1][4:].decode(errors="replace"))
            if got is None or got[0] != reply:
                raise AssertionError(f"{tag!r} answered {got!r}, expected {reply!r}")
            return got[1]

        try:
            if name == "Greeting":
                exchange(b"G", struct.pack(">Q", 1), b"g")
                return "ok", "GreetingReply"
            term = terms.next()
            vote = exchange(b"V", struct.pack(">QQ", term, term), b"v")
            if name == "VoteRequest":
                return "ok", "Vote"
            if name == "FetchWal":
                # An acceptor without WAL sends none; one of an older term is answered Rejected.
                exchange(b"F", struct.pack(">QQQ", term - 1, 0, 0), b"r")
                return "ok", "Rejected"
            granted, boundary = vote[8], struct.unpack(">Q", vote[17:25])[0]
            if not granted:
                return "vote not granted", repr(vote)
            history = struct.pack(">IQQ", 1, term, boundary)
            exchange(b"E", struct.pack(">QQQQ", term, boundary, boundary, term) + history, b"k")
            if name == "Elected":
                return "ok", "ElectedAck"
            relayed = reported.next() if "remote-consistent" in row.operation else 0
            exchange(b"A", struct.pack(">QQQQQQ", term, boundary, 0, 0, 0, relayed), b"a")
            if not relayed:
                return "ok", "AppendAck"
            return moved(sk, tenant, timeline, relayed)
        except Refused as e:
            return "refused", f"{name}: {e}"
        except AssertionError as e:
            return f"{name} not answered as usual", str(e)


class Replication:
    """A minimal client of the safekeeper's replication protocol: startup, the token as the
    password, simple queries, streaming."""

    def __init__(self, sk: Safekeeper, tenant: str, timeline: str):
        self.s = sk.connect_raw(timeout=30)
        params = b"".join(k + b"\0" + v + b"\0" for k, v in [
            (b"user", b"fjord"), (b"database", f"{tenant}/{timeline}".encode()), (b"replication", b"true"),
            (b"application_name", b"auth_matrix")]) + b"\0"
        self.s.sendall(struct.pack(">II", 8 + len(params), 196608) + params)

    def close(self) -> None:
        self.s.close()

    def recv(self) -> tuple[bytes, bytes] | None:
        return recv_frame(self.s, length_counts_itself=True)

    def send(self, tag: bytes, body: bytes) -> None:
        self.s.sendall(tag + struct.pack(">I", len(body) + 4) + body)

    @staticmethod
    def error(body: bytes) -> tuple[str, str]:
        """(SQLSTATE, message) of an ErrorResponse."""
        fields = {f[:1]: f[1:].decode(errors="replace") for f in body.split(b"\0") if f}
        return fields.get(b"C", "?"), fields.get(b"M", "")

    def until(self, tags: bytes) -> tuple[bytes, bytes] | None:
        """Reads up to the next message with a tag in `tags` or an ErrorResponse."""
        while True:
            m = self.recv()
            if m is None or m[0] in tags or m[0] == b"E":
                return m


def replication_outcome(sk: Safekeeper, tenant: str, timeline: str, row: matrix.Row, token: str,
                        reported: Reported) -> tuple[str, str]:
    c = Replication(sk, tenant, timeline)
    try:
        m = c.recv()
        if m is None or m[0] != b"R" or struct.unpack(">I", m[1][:4])[0] != 3:
            return "no request for a password", repr(m)
        c.send(b"p", token.encode() + b"\0")
        m = c.until(b"R")
        if m is None:
            return "closed without an answer", ""
        if m[0] == b"E":
            code, message = Replication.error(m[1])
            return code, message
        if c.until(b"Z") is None:
            return "no ReadyForQuery", ""
        op = row.operation
        if op.startswith("FJORD_REMOTE_CONSISTENT_LSN"):
            relayed = reported.next()
            c.send(b"Q", f"FJORD_REMOTE_CONSISTENT_LSN 1 {lsn_text(relayed)}\0".encode())
            m = c.until(b"C")
            if m is not None and m[0] == b"E":
                code, message = Replication.error(m[1])
                unmoved = moved(sk, tenant, timeline, relayed)[0] == "ignored"
                return (code if unmoved else f"{code}, yet moved"), message
            if m is None:
                return "no CommandComplete", ""
            return moved(sk, tenant, timeline, relayed)
        if op in ("IDENTIFY_SYSTEM", "SHOW wal_segment_size"):
            c.send(b"Q", op.encode() + b"\0")
            m = c.until(b"D")
            if m is None or m[0] != b"D":
                return f"{op} not answered as usual", repr(m)
            return "ok", m[1].decode(errors="replace")
        c.send(b"Q", b"START_REPLICATION 0/0\0")
        m = c.until(b"W")
        if m is None or m[0] != b"W":
            return "streaming did not start", repr(m)
        relayed = 0
        if op.startswith("CopyData 'r'"):
            c.send(b"d", b"r" + struct.pack(">QQQqB", 0, 0, 0, 0, 0))
        elif op.startswith("CopyData 'h'"):
            c.send(b"d", b"h" + struct.pack(">qIIII", 0, 0, 0, 0, 0))
        elif op.startswith("CopyData 'P'"):
            relayed = reported.next()
            c.send(b"d", b"P" + struct.pack(">IQ", 1, relayed))
        # CopyDone: the safekeeper answers it once it has handled what came before.
        c.send(b"c", b"")
        m = c.until(b"c")
        if m is not None and m[0] == b"E":
            return Replication.error(m[1])
        if m is None or m[0] != b"c":
            return "streaming did not end as usual", repr(m)
        if not relayed:
            return "ok", "streamed"
        return moved(sk, tenant, timeline, relayed)
    finally:
        c.close()


def safekeeper_requests(tenant: str, timeline: str) -> dict[str, Request]:
    path = f"/v1/tenant/{tenant}/timeline/{timeline}"
    return {
        "GET /v1/status": ("GET", "/v1/status", None, {200}),
        "GET /metrics": ("GET", "/metrics", None, {200}),
        "GET /v1/tenant/{tenant_id}/timeline/{timeline_id}": ("GET", path, None, {200}),
        "POST /v1/tenant/{tenant_id}/timeline/{timeline_id}": ("POST", path, {"system_id": SYSTEM_ID}, {200}),
        "GET /v1/no_such_route (a path no route has)": ("GET", "/v1/no_such_route", None, {404}),
    }


def test_safekeeper(tmp_path, keys, other_keys):
    sk = Safekeeper(tmp_path, 1, auth_public_key=keys.public_path).start()
    sk.token = keys.admin()
    try:
        tenant, timeline = new_id(), new_id()
        sk.create_timeline(tenant, timeline, SYSTEM_ID)
        tokens = matrix.credentials(keys, other_keys, tenant, timeline, new_id(), new_id())
        requests = safekeeper_requests(tenant, timeline)
        rows = matrix.rows_of("safekeeper")
        http_ops = {r.operation for r in rows if r.interface == "http"}
        assert http_ops == set(requests), f"rows without a request: {http_ops - set(requests)}; " \
                                          f"requests without a row: {set(requests) - http_ops}"
        terms, reported = Terms(), Reported()

        def observe(row: matrix.Row, column: str) -> tuple[str, str]:
            token = tokens[column]
            if row.interface == "http":
                return http_outcome(sk, requests[row.operation], token)
            if row.interface == "proposer":
                return proposer_outcome(sk, tenant, timeline, row, token, terms, reported)
            return replication_outcome(sk, tenant, timeline, row, token, reported)

        check_rows(rows, observe)
    finally:
        sk.kill()
