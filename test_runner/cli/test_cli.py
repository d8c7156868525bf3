"""The `fjord` CLI for real: repos, the pageserver process, tenants, branches, endpoints.

Every test runs the release binaries (`fjord`, `pageserver`, `compute_ctl`) on a repo in its
own directory with its own base port.
"""

from __future__ import annotations

import base64
import json

import re
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from fixtures.cli import PORTS_PER_REPO, FjordRepo, free_base_port
from fixtures.logs import unexpected_lines
from fixtures.pagestream import lsn_int
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until

HEX32 = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture
def repo_factory(tmp_path: Path):
    repos: list[FjordRepo] = []

    def make(name: str = "repo", base_port: int | None = None) -> FjordRepo:
        repo = FjordRepo(tmp_path / name, base_port)
        repos.append(repo)
        return repo

    yield make
    for r in repos:
        r.cleanup()


@pytest.fixture
def started_repo(repo_factory) -> FjordRepo:
    repo = repo_factory().init()
    repo.run("start")
    return repo


def timeline_lsn(repo: FjordRepo, tenant: str, timeline: str) -> str:
    return repo.http_json(f"/v1/tenant/{tenant}/timeline/{timeline}")["last_record_lsn"]


def test_init_start_tenant_branch_status_stop(repo_factory):
    repo = repo_factory()
    out = repo.init().run("status").stdout
    assert "pageserver  stopped" in out and "no endpoints" in out
    config = (repo.path / "config.toml").read_text()
    assert f"base_port = {repo.base_port}" in config and str(pg_bin_dir().resolve()) in config
    assert "already exists" in repo.fail("init", "--base-port", str(repo.base_port), "--pg-bin-dir", str(pg_bin_dir()))

    out = repo.run("start").stdout
    assert f"page service 127.0.0.1:{repo.base_port}" in out and repo.http_url() in out
    assert "already running" in repo.run("start").stdout
    assert repo.http_json("/v1/status")["status"] == "ok"

    created = repo.run("tenant", "create")
    tenant = created.stdout.strip()
    assert HEX32.match(tenant), created.stdout
    assert "branch main" in created.stderr and "(default tenant)" in created.stderr
    assert list((repo.path / "tmp").iterdir()) == [], "initdb's scratch directory is removed"
    state = repo.state()
    assert state["default_tenant"] == tenant
    main = state["tenants"][tenant]["branches"]["main"]
    assert repo.http_json(f"/v1/tenant/{tenant}/timeline")[0]["timeline_id"] == main

    second = repo.run("tenant", "create", "--tenant-id", "ab" * 16).stdout.strip()
    assert second == "ab" * 16 and repo.state()["default_tenant"] == tenant, "the first tenant stays the default"
    assert "409" in repo.fail("tenant", "create", "--tenant-id", "ab" * 16)
    assert "invalid tenant id" in repo.fail("tenant", "create", "--tenant-id", "xyz")
    assert sorted(repo.run("tenant", "list").stdout.splitlines()) == sorted([f"{tenant} (default)", "ab" * 16])

    lsn = timeline_lsn(repo, tenant, main)
    out = repo.run("branch", "create", "dev", "--from", "main").stdout
    assert f"branch dev created from main at {lsn}" in out
    dev = repo.state()["tenants"][tenant]["branches"]["dev"]
    out = repo.run("branch", "create", "old", "--from", "main", "--at", lsn).stdout
    assert f"at {lsn}" in out
    assert "already exists" in repo.fail("branch", "create", "dev")
    assert 'branch "nope" does not exist' in repo.fail("branch", "create", "x", "--from", "nope")
    assert "invalid branch name" in repo.fail("branch", "create", "a/b")
    assert "neither an LSN" in repo.fail("branch", "create", "y", "--at", "yesterday")
    assert "only ingested up to" in repo.fail("branch", "create", "z", "--at", "FF/0")

    tree = repo.run("branch", "list").stdout.splitlines()
    assert tree[0].startswith("main ") and f"{main}  LSN {lsn}" in tree[0]
    assert any(line.startswith("└ dev ") and dev in line and f"from main@{lsn}" in line for line in tree), tree
    assert any(line.startswith("└ old ") for line in tree), tree
    assert repo.run("branch", "list", "--tenant", "ab" * 16).stdout.startswith("main ")

    status = repo.run("status").stdout
    assert "pageserver  running" in status
    assert f"tenant {tenant} (default)" in status and f"tenant {'ab' * 16}" in status
    # The pageserver follows every branch's safekeepers from its creation; before a compute
    # wrote to it there is nothing to stream.
    assert re.search(rf"^  main\s+{main}  LSN {re.escape(lsn)}  wal receiver (starting|waiting)$", status, re.M), status
    assert "└ dev" in status

    assert "does not exist" in repo.fail("endpoint", "connstr", "nope")
    assert "does not exist" in repo.fail("endpoint", "stop", "nope")

    assert "pageserver stopped" in repo.run("stop").stdout
    assert not (repo.path / "pageserver.pid").exists()
    status = repo.run("status").stdout
    assert "pageserver  stopped" in status and f"tenant {tenant} (LSNs unknown" in status
    assert "pageserver was not running" in repo.run("stop").stdout

    # A restart finds the tenants and branches again.
    repo.run("start")
    assert f"{main}  LSN {lsn}" in repo.run("status").stdout
    repo.run("stop")
    assert unexpected_lines(repo.log("pageserver.log")) == []


def test_two_repos_side_by_side(repo_factory):
    base = free_base_port(repos=2)
    a = repo_factory("a", base).init()
    b = repo_factory("b", base + PORTS_PER_REPO).init()
    a.run("start")
    b.run("start")
    tenant_a = a.run("tenant", "create").stdout.strip()
    tenant_b = b.run("tenant", "create").stdout.strip()
    assert tenant_a != tenant_b
    status_a, status_b = a.run("status").stdout, b.run("status").stdout
    assert f"tenant {tenant_a}" in status_a and tenant_b not in status_a
    assert f"tenant {tenant_b}" in status_b and tenant_a not in status_b
    assert f"127.0.0.1:{a.base_port}," in status_a and f"127.0.0.1:{b.base_port}," in status_b

    a.run("stop")
    assert "pageserver  stopped" in a.run("status").stdout
    assert "pageserver  running" in b.run("status").stdout
    b.run("stop")


# Expected: the first repo's services refuse the TLS handshakes of the clashing repo's CLI,
# which trusts another CA.
@pytest.mark.allowed_errors(r"TLS handshake with HTTP client 127\.0\.0\.1:\d+ failed")
def test_clear_errors(repo_factory, tmp_path):
    repo = repo_factory()
    assert "run `fjord init` first" in repo.fail("status")
    assert "at least 1024" in repo.fail("init", "--base-port", "80", "--pg-bin-dir", str(pg_bin_dir()))
    assert "cannot use" in repo.fail("init", "--pg-bin-dir", str(tmp_path / "nowhere"))
    # A PostgreSQL without the fjord extension (a distribution's, found through its pg_config
    # on PATH) is refused at init, not at the first endpoint start.
    stock = tmp_path / "stock" / "bin"
    stock.mkdir(parents=True)
    for tool in ("postgres", "initdb", "pg_isready"):
        (stock / tool).symlink_to(pg_bin_dir() / tool)
    (stock / "pg_config").write_text(f"#!/bin/sh\necho {tmp_path / 'stock' / 'lib'}\n")
    (stock / "pg_config").chmod(0o755)
    err = repo.fail("init", "--pg-bin-dir", str(stock))
    assert "has no fjord extension" in err and "stock/lib" in err, err
    assert not repo.path.exists(), "a refused init creates nothing"

    repo.init()
    assert "pageserver is not running" in repo.fail("tenant", "create")
    assert "pageserver is not running" in repo.fail("endpoint", "start", "ep")
    repo.run("start")
    assert "no tenant yet" in repo.fail("endpoint", "start", "ep")
    assert "no tenant yet" in repo.fail("branch", "create", "dev")
    assert "invalid endpoint name" in repo.fail("endpoint", "start", "../x")

    # A second repo on the same ports: the pageserver that answers is not ours.
    clash = repo_factory("clash", repo.base_port).init()
    assert "another repo" in clash.fail("start")
    repo.run("stop")


# Expected: the endpoint the test starts with a bad setting.
@pytest.mark.allowed_errors(r'FATAL:  (configuration file ".*/endpoints/bad/pgdata/postgresql.conf" contains errors|invalid value for parameter "shared_buffers")')
def test_endpoint_mechanics_without_safekeepers(repo_factory):
    """Endpoint start/stop/list/connstr on a repo without safekeepers, whose computes stream
    WAL straight to the pageserver: the CLI's process handling, its refusals, a failed start,
    and `stop` stopping the endpoints before the pageserver."""
    repo = repo_factory().init("--safekeepers", "0")
    repo.run("start")
    tenant = repo.run("tenant", "create").stdout.strip()
    timeline = repo.state()["tenants"][tenant]["branches"]["main"]
    port = repo.base_port + 10
    started = repo.run("endpoint", "start", "ep")
    connstr = started.stdout.strip()
    assert connstr.endswith(f"@127.0.0.1:{port}/postgres") and "endpoint ep running on branch main" in started.stderr
    with connect(connstr) as conn:
        conn.execute("CREATE TABLE kept (x int)")
    # The CLI registers the compute as the pageserver's WAL source (an admin's call), and
    # compute_ctl asks for the same source once postgres runs.
    sources = repo.http_json(f"/v1/tenant/{tenant}/timeline/{timeline}")["wal_receiver"]["sources"]
    assert [(s["host"], s["port"]) for s in sources] == [("127.0.0.1", port)], sources
    assert re.search(rf"^ep\s+main\s+{port}\s+latest\s+running \(pid \d+\)", repo.run("endpoint", "list").stdout, re.M)
    assert "already running" in repo.fail("endpoint", "start", "ep")
    assert "already writes to branch main" in repo.fail("endpoint", "start", "other")
    assert 'branch "nope" does not exist' in repo.fail("endpoint", "start", "other", "--branch", "nope")

    assert "endpoint ep stopped" in repo.run("endpoint", "stop", "ep").stdout
    assert "endpoint ep was not running" in repo.run("endpoint", "stop", "ep").stdout
    # A failed start shows why and leaves no endpoint behind.
    err = repo.fail("endpoint", "start", "bad", "--branch", "main", "--port", str(port + 5), "-c", "shared_buffers=lots")
    assert "postgres exited during startup" in err and "shared_buffers" in err, err
    assert "bad" not in repo.state()["endpoints"]

    # Stateless: the restart refetches the data directory from the pageserver, which has the
    # table; the port stays.
    assert repo.run("endpoint", "start", "ep").stdout.strip() == connstr
    with connect(connstr) as conn:
        assert conn.execute("SELECT to_regclass('kept')::text").fetchone()[0] == "kept"
    assert "received fast shutdown request" in repo.log("endpoints/ep/postgres.log")

    out = repo.run("stop").stdout
    assert "endpoint ep stopped" in out and "pageserver stopped" in out
    assert "stopped" in repo.run("endpoint", "list").stdout
    log = repo.log("endpoints/ep/postgres.log")
    assert log.count("received fast shutdown request") == 2 and "received immediate shutdown request" not in log


# --- endpoints ------------------------------------------------------------------------------

def connect(connstr: str) -> psycopg.Connection:
    return psycopg.connect(connstr, autocommit=True)


def test_endpoint_lifecycle(started_repo):
    repo = started_repo
    tenant = repo.run("tenant", "create").stdout.strip()

    connstr = repo.run("endpoint", "start", "main").stdout.strip()
    port = repo.base_port + 10
    assert re.fullmatch(rf"postgresql://[^@]+@127\.0\.0\.1:{port}/postgres", connstr), connstr
    assert repo.run("endpoint", "connstr", "main").stdout.strip() == connstr
    with connect(connstr) as conn:
        conn.execute("CREATE TABLE t AS SELECT g AS x FROM generate_series(1, 1000) g")
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1000
    listing = repo.run("endpoint", "list").stdout
    assert re.search(rf"^main\s+main\s+{port}\s+latest\s+running", listing, re.M), listing
    assert "already running" in repo.fail("endpoint", "start", "main")
    assert "already writes to branch main" in repo.fail("endpoint", "start", "second")

    # Stateless: a restart refetches everything from the pageserver and keeps the port.
    assert "endpoint main stopped" in repo.run("endpoint", "stop", "main").stdout
    assert "stopped" in repo.run("endpoint", "list").stdout
    assert repo.run("endpoint", "start", "main").stdout.strip() == connstr
    with connect(connstr) as conn:
        assert conn.execute("SELECT sum(x) FROM t").fetchone()[0] == 500500
        conn.execute("INSERT INTO t VALUES (0)")
        flushed = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]

    # Three safekeepers run with the cluster; with one killed, commits go on.
    status = repo.run("status").stdout
    assert all(f"safekeeper {i} running" in status for i in (1, 2, 3)), status
    assert "safekeeper 2 stopped" in repo.run("safekeeper", "stop", "2", "--immediate").stdout
    with connect(connstr) as conn:
        conn.execute("CREATE TABLE during_outage AS SELECT 1 AS x")
        flushed = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
    assert "safekeeper 2 started" in repo.run("safekeeper", "start", "2").stdout
    assert "no safekeeper 7" in repo.fail("safekeeper", "start", "7")

    # A branch "now" starts at the pageserver's latest LSN: wait until it has main's last
    # commit (it follows the safekeepers' committed WAL).
    def ingested():
        return all(lsn_int(t["last_record_lsn"]) >= lsn_int(flushed) for t in repo.http_json(f"/v1/tenant/{tenant}/timeline"))
    wait_until("the pageserver to ingest main's last commit", ingested, timeout_s=60)

    # A branch gets its own endpoint and port, and sees main's data as of the branch point.
    repo.run("branch", "create", "dev", "--from", "main")
    dev = repo.run("endpoint", "start", "dev", "--branch", "dev").stdout.strip()
    assert dev.endswith(f":{port + 1}/postgres")
    with connect(dev) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1001
        conn.execute("DELETE FROM t")
    with connect(connstr) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1001, "a branch is a copy"

    assert "endpoint dev stopped" in repo.run("endpoint", "stop", "dev", "--mode", "immediate").stdout
    out = repo.run("stop").stdout
    assert "endpoint main stopped" in out and "pageserver stopped" in out
    assert "running" not in repo.run("endpoint", "list").stdout


# Expected: the test's write on the read-only endpoint.
@pytest.mark.allowed_errors(r"ERROR:  cannot execute CREATE TABLE in a read-only transaction")
def test_endpoint_at_past_lsn_is_read_only(started_repo):
    repo = started_repo
    tenant = repo.run("tenant", "create").stdout.strip()
    connstr = repo.run("endpoint", "start", "main").stdout.strip()
    with connect(connstr) as conn:
        before = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        conn.execute("CREATE TABLE later (x int)")
    main = repo.state()["tenants"][tenant]["branches"]["main"]
    assert "ends at" in repo.fail("endpoint", "start", "future", "--at", "FF/0")
    past = repo.run("endpoint", "start", "past", "--at", str(before)).stdout.strip()
    with connect(past) as conn:
        assert conn.execute("SELECT to_regclass('later')").fetchone()[0] is None
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE t (x int)")
    assert re.search(rf"^past\s+main\s+\d+\s+at {re.escape(str(before))}\s+running", repo.run("endpoint", "list").stdout, re.M)
    assert timeline_lsn(repo, tenant, main)  # the branch is still served
    repo.run("stop")


# Expected: the refusals the test provokes.
@pytest.mark.allowed_errors(r"(management API|page service) refused a (request|client)",
                            r"safekeeper::access: refused")
def test_authentication_is_on_by_default(started_repo, tmp_path):
    """`fjord init` makes a key pair and every process gets a token of its own: a compute
    (page service, safekeepers, the pageserver's API), a read replica (its WAL from the
    safekeepers), the pageserver (WAL from the safekeepers). A client without a token, or
    with one that does not grant what it asks, is refused with the reason."""
    from fixtures.auth import KeyPair

    repo = started_repo
    assert "auth = true" in (repo.path / "config.toml").read_text()
    assert (repo.path / "auth_private_key.pem").stat().st_mode & 0o777 == 0o600
    tenant = repo.run("tenant", "create").stdout.strip()
    main = repo.state()["tenants"][tenant]["branches"]["main"]

    primary = repo.run("endpoint", "start", "main").stdout.strip()
    with connect(primary) as conn:
        conn.execute("CREATE TABLE t AS SELECT g AS x FROM generate_series(1, 100) g")
    replica = repo.run("endpoint", "start", "r", "--replica").stdout.strip()
    with connect(primary) as conn:
        conn.execute("INSERT INTO t VALUES (101)")
    with connect(replica) as conn:
        wait_until("the replica to see the new row",
                   lambda: conn.execute("SELECT count(*) FROM t").fetchone()[0] == 101, timeout_s=60)

    # The pageserver's API: 401 without a token, 403 for a tenant token on a management
    # route, a tenant's token for its own timeline, and none from another key.
    timeline_path = f"/v1/tenant/{tenant}/timeline/{main}"
    assert repo.http_status("/v1/tenant", token="") == 401
    assert repo.http_status("/v1/status", token="") == 200
    tenant_token = repo.run("auth", "token").stdout.strip()
    assert repo.http_status("/v1/tenant", token=tenant_token) == 403
    assert repo.http_json(timeline_path, token=tenant_token)["timeline_id"] == main
    branch_token = repo.run("auth", "token", "--branch", "main").stdout.strip()
    assert repo.http_json(timeline_path, token=branch_token)["timeline_id"] == main
    assert repo.http_status(timeline_path, token=KeyPair(tmp_path / "stranger").tenant(tenant)) == 401
    assert "nope" in repo.fail("auth", "token", "--branch", "nope")
    # A pageserver's own token (for `pageserver --controller --node-id 3`): a storage token
    # naming the node, which the management API refuses like any storage token.
    node_token = repo.run("auth", "token", "--pageserver", "3").stdout.strip()
    claims = json.loads(base64.urlsafe_b64decode(node_token.split(".")[1] + "=="))
    assert (claims["scope"], claims["node_id"], claims.get("tenant_id")) == ("storage", 3, None)
    assert repo.http_status("/v1/tenant", token=node_token) == 403

    # A safekeeper's API wants a token too.
    sk_http = f"{repo.http_url(repo.base_port + 3)}/v1/tenant/{tenant}/timeline/{main}"
    with pytest.raises(urllib.error.HTTPError) as e:
        repo.urlopen(sk_http, timeout=10)
    assert e.value.code == 401
    req = urllib.request.Request(sk_http, headers={"Authorization": f"Bearer {repo.admin_token()}"})
    with repo.urlopen(req, timeout=10) as r:
        assert r.status == 200

    assert "authentication is on" in repo.log("pageserver.log")
    metrics = repo.urlopen(f"{repo.http_url()}/metrics", timeout=10).read().decode()
    assert re.search(r'pageserver_auth_failures_total\{reason="missing",service="http"\} [1-9]', metrics), metrics
    repo.run("stop")


def test_a_repo_without_authentication_says_so(repo_factory):
    repo = repo_factory()
    out = repo.run("init", "--base-port", str(repo.base_port), "--pg-bin-dir", str(pg_bin_dir()), "--no-auth").stdout
    assert "authentication OFF" in out, out
    assert not (repo.path / "auth_private_key.pem").exists()
    assert "runs without authentication" in repo.fail("auth", "token", "--admin")


def test_the_pageserver_does_not_inherit_a_token_from_the_callers_environment(repo_factory):
    """`fjord start` gives the pageserver no token of its own and removes one the caller
    exported (an operator's admin token for curl or psql): a token in the pageserver's
    environment is one a source registered without a token could be handed (without
    safekeepers: the compute's own walsender, which the compute's superuser controls)."""
    repo = repo_factory().init("--safekeepers", "0")
    repo.env = {"FJORD_AUTH_TOKEN": repo.admin_token()}
    repo.run("start")
    pid = int((repo.path / "pageserver.pid").read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    inherited = [e.split(b"=", 1)[0].decode() for e in environ if e.startswith(b"FJORD_AUTH_TOKEN=")]
    assert not inherited, "the pageserver started by `fjord start` holds the caller's FJORD_AUTH_TOKEN"


def _cmdline(pid_file: Path) -> list[str]:
    pid = int(pid_file.read_text())
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_tls_is_on_by_default_with_a_certificate_per_service(repo_factory, tmp_path):
    repo = repo_factory()
    out = repo.init("--safekeepers", "1").run("status").stdout
    tls = repo.path / "tls"
    names = ["ca", "pageserver", "safekeeper-1"]
    for name in names:
        assert (tls / f"{name}.crt").stat().st_mode & 0o777 == 0o644
        assert (tls / f"{name}.key").stat().st_mode & 0o777 == 0o600, f"{name}.key is readable by others"
    assert f"tls         on, cluster CA {tls / 'ca.crt'}; pageserver expires in 36" in out, out
    assert "tls = true" in (repo.path / "config.toml").read_text()

    repo.run("start")
    ps = _cmdline(repo.path / "pageserver.pid")
    for flag, value in [("--tls-cert", "pageserver.crt"), ("--tls-key", "pageserver.key"), ("--tls-ca", "ca.crt")]:
        assert ps[ps.index(flag) + 1] == str(tls / value), ps
    sk = _cmdline(repo.path / "safekeeper1.pid")
    assert sk[sk.index("--tls-cert") + 1] == str(tls / "safekeeper-1.crt") and "--tls-ca" not in sk, sk

    # A certificate for a service on another host, from the repo's CA; never overwritten.
    out_dir = tmp_path / "issued"
    repo.run("cert", "issue", "--name", "safekeeper-9", "--host", "sk9.internal", "--host", "10.1.2.3", "--out", str(out_dir))
    assert (out_dir / "safekeeper-9.key").stat().st_mode & 0o777 == 0o600
    key = (out_dir / "safekeeper-9.key").read_bytes()
    err = repo.fail("cert", "issue", "--name", "safekeeper-9", "--host", "x", "--out", str(out_dir))
    assert "already exists: it is never overwritten" in err, err
    assert (out_dir / "safekeeper-9.key").read_bytes() == key
    # A CA of one's own, and a certificate from it.
    repo.run("cert", "ca", "--out", str(tmp_path / "own"))
    repo.run("cert", "issue", "--name", "ps", "--host", "localhost", "--out", str(tmp_path / "own"), "--ca-dir", str(tmp_path / "own"))
    assert (tmp_path / "own" / "ps.crt").exists() and (tmp_path / "own" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert "no CA in" in repo.fail("cert", "issue", "--name", "x", "--host", "h", "--out", str(tmp_path / "o"), "--ca-dir", str(tmp_path))


def test_a_repo_without_tls_says_so_and_one_made_before_tls_keeps_working(repo_factory):
    repo = repo_factory("notls")
    out = repo.run("init", "--base-port", str(repo.base_port), "--pg-bin-dir", str(pg_bin_dir()), "--safekeepers", "0", "--no-tls").stdout
    assert "TLS OFF" in out, out
    assert not (repo.path / "tls").exists()
    assert "tls         off (fjord init --no-tls)" in repo.run("status").stdout
    assert "no CA in" in repo.fail("cert", "issue", "--name", "x", "--host", "h", "--out", str(repo.path / "x"))

    # A repo made before TLS existed: no tls setting in config.toml, no tls/ directory.
    config = repo.path / "config.toml"
    config.write_text(config.read_text().replace("tls = false\n", ""))
    assert "tls         off (the repo was made before TLS existed)" in repo.run("status").stdout
    r = repo.run("start")
    assert "made before TLS existed" in r.stderr and "the pageserver runs with --no-tls" in r.stderr, r.stderr
    assert "--no-tls" in _cmdline(repo.path / "pageserver.pid")
