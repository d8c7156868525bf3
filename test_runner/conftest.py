"""pytest configuration for fjord's integration tests (see test_runner/README.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures import services
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


pytest_plugins = ["pytester"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "allowed_errors(*regexes): log lines matching any of these are expected in this "
                   "test's service logs (fixtures/services.py)")


# Every service a test starts is registered with the test's registry (fixtures/services.py).
# When the test body ends, pass or fail, the registry ends what still runs, then checks how
# every process ended and scans every log; a problem fails the test (in its call phase, so
# that its directory and logs are kept). Services started or left over outside the call
# phase (a fixture whose setup failed) are checked after the teardown.

@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    allowed = [regex for mark in item.iter_markers("allowed_errors") for regex in mark.args]
    services.begin(allowed)
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    try:
        result = yield
    except BaseException:
        reg = services.current()
        problems = reg.finish() if reg is not None else []
        if problems:
            item.add_report_section("call", "services", "\n\n".join(problems))
        raise
    reg = services.current()
    problems = reg.finish() if reg is not None else []
    if problems:
        pytest.fail("how the services ended, or their logs, say something went wrong:\n\n"
                    + "\n\n".join(problems), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    problems = services.end()
    # A process of the test's own that outlived it (a daemon the CLI started, a child a
    # test spawned) would go on knocking at ports a later test reuses: it is killed here,
    # and fails the test that left it.
    tmp_path = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if tmp_path is not None:
        problems += [f"still running after the test, now killed: pid {pid}: {cmdline}"
                     for pid, cmdline in services.kill_leftovers(Path(tmp_path))]
    if problems:
        pytest.fail("services started outside the test body ended badly or logged errors:\n\n"
                    + "\n\n".join(problems), pytrace=False)
    return result


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
