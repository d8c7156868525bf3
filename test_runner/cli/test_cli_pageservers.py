"""`fjord init --pageservers N`: one command runs a cluster with a storage controller (and its
database), N pageservers joined to it and the safekeepers; a tenant is placed by the
controller, an endpoint follows it through a pageserver's crash without a restart, `fjord
status` shows where it went, `fjord pageserver add` grows the cluster, and `fjord stop`
stops everything. A repo with one pageserver stays what it always was."""

from __future__ import annotations

import re
import time
from pathlib import Path

import psycopg
import pytest

from fixtures import logs, services
from fixtures.cli import FjordRepo
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until


@pytest.fixture
def repo_factory(tmp_path: Path):
    repos: list[FjordRepo] = []

    def make(name: str = "repo") -> FjordRepo:
        repo = FjordRepo(tmp_path / name)
        repos.append(repo)
        return repo

    yield make
    for r in repos:
        r.cleanup()


def attached_node(repo: FjordRepo, tenant: str) -> int:
    """The pageserver `fjord status` says the tenant is attached to."""
    m = re.search(rf"^tenant {tenant}.*: attached to pageserver (\d+)", repo.run("status").stdout, re.M)
    assert m, repo.run("status").stdout
    return int(m.group(1))


def test_a_cluster_of_pageservers_with_one_command(repo_factory):
    repo = repo_factory().init("--pageservers", "2")
    config = (repo.path / "config.toml").read_text()
    assert "pageservers = 2" in config and "[controller]" in config, config
    out = repo.run("start").stdout
    assert "storage controller started" in out and "pageserver 2 started" in out, out
    assert f"page service 127.0.0.1:{repo.base_port}," in out, "pageserver 1 keeps the ports of a one-pageserver repo"
    assert "every pageserver online" in out, out
    status = repo.run("status").stdout
    assert "storage controller   running" in status and "leading" in status, status
    assert re.search(r"^pageserver 2 .*online, page service 127\.0\.0\.1:\d+", status, re.M), status

    created = repo.run("tenant", "create")
    tenant = created.stdout.strip()
    assert "secondary on pageserver" in created.stderr, created.stderr
    first = attached_node(repo, tenant)
    other = 3 - first
    status = repo.run("status").stdout
    assert re.search(rf"^pageserver {other} .*secondary: {tenant}", status, re.M), status

    # Small caches: the reads after the crash go to a pageserver.
    connstr = repo.run("endpoint", "start", "main", "-c", "shared_buffers=128kB", "-c", "fjord.file_cache_size=1MB").stdout.strip()
    with psycopg.connect(connstr, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
        started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    # The timeline's remote index names its safekeepers: the attachment after a failover
    # follows them from there.
    remote = repo.path / "remote_storage" / "tenants" / tenant
    wait_until("the remote index to name the safekeepers",
               lambda: any("wal_sources" in p.read_text() for p in remote.glob("timelines/*/index_part.json-*") if "#" not in p.name))

    repo.allowed_errors += [f"pageserver {first} is offline", r"could not (connect|receive|send)", "reconnecting",
                            "the page service at", *logs.CLIENT_GONE_MID_HANDSHAKE]
    assert "killed" in repo.run("pageserver", "stop", str(first), "--immediate").stdout
    killed = time.monotonic()
    # The same endpoint, no restart: the read waits for the failover, then the write.
    with psycopg.connect(connstr, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '60s'")
        assert conn.execute("SELECT count(*), sum(id) FROM t").fetchone() == (5000, 5000 * 5001 // 2)
        took = time.monotonic() - killed
        conn.execute("INSERT INTO t VALUES (5001, 'after the failover')")
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 5001
        assert conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == started, "the compute restarted"
    assert took < 30, f"the first read after the crash took {took:.1f} s"
    assert attached_node(repo, tenant) == other
    status = repo.run("status").stdout
    assert re.search(rf"^pageserver {first} +stopped, OFFLINE", status, re.M), status
    assert re.search(rf"^pageserver {other} .*attached: {tenant} \(generation 2\)", status, re.M), status
    assert "running" in repo.run("endpoint", "list").stdout

    out = repo.run("pageserver", "add").stdout
    assert "pageserver 3 started" in out and "pageserver 3 is online" in out, out
    assert "pageservers = 3" in (repo.path / "config.toml").read_text()
    assert (repo.path / "tls" / "pageserver-3.crt").exists()
    # The tenant lost its secondary with the crash; the new pageserver is the one online.
    wait_until("the tenant's new secondary",
               lambda: re.search(rf"^pageserver 3 .*secondary: {tenant}", repo.run("status").stdout, re.M))
    assert "no pageserver 4" in repo.fail("pageserver", "start", "4")

    # A planned migration to the new pageserver, the endpoint reading on without a restart.
    out = repo.run("tenant", "migrate", "--to", "3").stdout
    assert f"moving from pageserver {other} to pageserver 3" in out and "done" in out, out
    assert attached_node(repo, tenant) == 3
    assert re.search(rf"^pageserver {other} .*secondary: {tenant}", repo.run("status").stdout, re.M)
    with psycopg.connect(connstr, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 5001
        assert conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == started, "the compute restarted"
    assert "already" in repo.run("tenant", "migrate", "--to", "3").stdout
    assert "not online" in repo.fail("tenant", "migrate", "--to", str(first))

    out = repo.run("stop").stdout
    for what in ("endpoint main", "storage controller", f"pageserver {other}", "pageserver 3", "safekeeper 3",
                 "controller database"):
        assert f"{what} stopped" in out, out
    assert services.processes_under(repo.path) == [], "fjord stop leaves no process"
    print(f"fjord pageserver stop --immediate: the endpoint's first read came {took:.2f} s later")


def test_one_pageserver_is_the_repo_it_always_was(repo_factory):
    """`--pageservers 1` (the default) writes the same config.toml as before, runs no
    controller, and refuses what needs one with a hint; numbers the ports cannot hold are
    refused before anything is made; a stopped cluster grows without starting anything."""
    plain = repo_factory("plain").init()
    one = repo_factory("one").init("--pageservers", "1")
    text = lambda r: (r.path / "config.toml").read_text().replace(str(r.path), "REPO").replace(str(r.base_port), "BASE")
    assert text(plain) == text(one)
    assert "pageservers" not in text(one) and "controller" not in text(one)
    assert not (one.path / "controller_db").exists()
    err = one.fail("pageserver", "add")
    assert "no storage controller" in err and "fjord init --pageservers 2" in err, err
    assert "no pageserver 2" in one.fail("pageserver", "stop", "2")
    assert "no storage controller" in one.fail("tenant", "migrate", "--to", "2")

    # In a stopped cluster `pageserver add` only records the new one: nothing runs alone.
    stopped = repo_factory("stopped").init("--pageservers", "2")
    assert "starts and joins it with `fjord start`" in stopped.run("pageserver", "add").stdout
    assert "pageservers = 3" in (stopped.path / "config.toml").read_text()
    assert services.processes_under(stopped.path) == []

    bad = repo_factory("bad")
    args = ("init", "--base-port", str(bad.base_port), "--pg-bin-dir", str(pg_bin_dir()))
    assert "16" in bad.fail(*args, "--pageservers", "16")
    err = bad.fail(*args, "--controller-database", "host=db")
    assert "--pageservers 2" in err, err
    assert not bad.path.exists(), "a refused init creates nothing"
