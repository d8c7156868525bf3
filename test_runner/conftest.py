"""pytest configuration for fjord's integration tests (see test_runner/README.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures import compute
from fixtures.auth import KeyPair
from fixtures.minio import MinioServer
from fixtures.pageserver import Pageserver
from fixtures.paths import pg_bin_dir
from fixtures.postgres import PgServer
from fixtures.safekeeper import Safekeeper


def pytest_sessionstart(session):
    if os.geteuid() == 0:
        pytest.exit("run the tests through ./scripts/test, which runs them as an unprivileged "
                    "user: postgres refuses to run as root", returncode=2)
    if not (pg_bin_dir() / "postgres").exists():
        pytest.exit(f"no PostgreSQL build at {pg_bin_dir()}; run ./scripts/setup first", returncode=2)


def pytest_terminal_summary(terminalreporter):
    """Names, pass or fail, the seeds tests drew for this run (`record_property` with a name
    ending in "seed"; the reports carry them from pytest-xdist's workers too)."""
    lines = [f"{r.nodeid}: {name} {value}" for reports in terminalreporter.stats.values() for r in reports
             if getattr(r, "when", None) == "call" for name, value in getattr(r, "user_properties", ())
             if name.endswith("seed")]
    if lines:
        terminalreporter.section("seeds drawn in this run")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _no_compute_outlives_its_test():
    """Computes are started by the tests themselves (fixtures.compute.Endpoint); whatever
    a test leaves running, pass or fail, is killed before the next one starts."""
    yield
    compute.kill_all()


@pytest.fixture
def keys(tmp_path: Path) -> KeyPair:
    """The cluster's key pair, for tests of authentication (fixtures/auth.py)."""
    return KeyPair(tmp_path / "keys")


@pytest.fixture
def other_keys(tmp_path: Path) -> KeyPair:
    """Another cluster's key pair: its tokens must be refused."""
    return KeyPair(tmp_path / "other-keys")


@pytest.fixture
def pg_factory(tmp_path: Path):
    """Makes PgServer instances in this test's directory and stops them all at the end."""
    servers: list[PgServer] = []

    def make(name: str = "pg", settings: dict[str, str] | None = None) -> PgServer:
        server = PgServer(tmp_path, name, settings)
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop("immediate")


@pytest.fixture
def fjord_pg(pg_factory) -> PgServer:
    """A running server from our build with the fjord library preloaded."""
    return pg_factory("fjord", {"shared_preload_libraries": "'fjord'"}).initdb().start()


@pytest.fixture
def pageserver(tmp_path: Path):
    """A running pageserver process with its own work directory and ports."""
    ps = Pageserver(tmp_path).start()
    yield ps
    ps.stop()


@pytest.fixture
def safekeepers(tmp_path: Path):
    """Three running safekeeper processes (ids 1..3); killed at the end of the test."""
    sks = [Safekeeper(tmp_path / "safekeepers", i).start() for i in (1, 2, 3)]
    yield sks
    for sk in sks:
        sk.kill()


@pytest.fixture
def minio(tmp_path: Path):
    """A running MinIO server with an empty bucket, for remote storage; stopped at the end."""
    server = MinioServer(tmp_path).start()
    yield server
    server.stop()
