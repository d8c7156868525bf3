"""compute_ctl as a process: start from a basebackup, readiness, report, signals, errors.

The pageserver's HTTP API is played by a small stand-in that serves a tar of an initdb'd
data directory, so that compute_ctl's own mechanics are tested whatever the state of the
real basebackup. The stand-in's "basebackup" holds relation files, so the computes here run
without the fjord library (`-c shared_preload_libraries=`) and without waiting for a
synchronous standby: what is under test is compute_ctl, not the extension.
test_runner/cli/ runs compute_ctl against the real pageserver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from fixtures.paths import fjord_bin_dir, pg_bin_dir
from fixtures.postgres import free_port
from fixtures.standin_pageserver import LSN, TENANT, TIMELINE, StandInPageserver, initdb_source

# Settings that take the extension and the synchronous pageserver out of the picture.
STANDALONE = ["-c", "shared_preload_libraries=", "-c", "synchronous_standby_names="]


@pytest.fixture
def fake_pageserver(tmp_path: Path):
    ps = StandInPageserver(initdb_source(tmp_path / "source"))
    yield ps
    ps.close()


def compute_ctl_args(ps: StandInPageserver, pgdata: Path, port: int, *extra: str, tenant: str = TENANT) -> list[str]:
    return [
        str(fjord_bin_dir() / "compute_ctl"), "--pgdata", str(pgdata), "--pg-bin-dir", str(pg_bin_dir()),
        "--pageserver-http", ps.url, "--pageserver-pg", "127.0.0.1:1", "--tenant", tenant,
        "--timeline", TIMELINE, "--port", str(port), *extra,
    ]


def test_compute_ctl_starts_reports_and_stops(fake_pageserver, tmp_path):
    pgdata, port = tmp_path / "compute" / "pgdata", free_port()
    status_file = tmp_path / "compute" / "status.json"
    log = open(tmp_path / "compute_ctl.log", "w")
    proc = subprocess.Popen(
        compute_ctl_args(fake_pageserver, pgdata, port, *STANDALONE, "-c", "work_mem=7MB", "--status-file", str(status_file)),
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    try:
        report = json.loads(proc.stdout.readline())
        assert report["state"] == "running" and report["port"] == port and report["lsn"] == LSN
        assert report["basebackup_bytes"] > 1_000_000
        for key in ("basebackup_ms", "start_ms", "total_ms"):
            assert isinstance(report[key], int)
        assert json.loads(status_file.read_text()) == report
        assert oct(pgdata.stat().st_mode & 0o777) == "0o700"

        conf = (pgdata / "postgresql.conf").read_text()
        assert f"fjord.tenant_id = '{TENANT}'" in conf and "wal_keep_size = '1GB'" in conf
        assert (pgdata / "pg_ident.conf").read_text() == ""
        user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        with psycopg.connect(f"host=127.0.0.1 port={port} user={user} dbname=postgres") as conn:
            assert conn.execute("SHOW work_mem").fetchone()[0] == "7MB"
            assert conn.execute("SHOW restart_after_crash").fetchone()[0] == "off"
        assert fake_pageserver.wal_receiver_requests == [{"host": "127.0.0.1", "port": port, "user": user}]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "a fast shutdown ends with postgres' exit code 0"
        final = json.loads(status_file.read_text())
        assert final["state"] == "exited" and final["exit"] == "exit code 0"
        postgres_log = (tmp_path / "compute" / "postgres.log").read_text()
        assert "received fast shutdown request" in postgres_log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_compute_ctl_sigquit_is_an_immediate_shutdown(fake_pageserver, tmp_path):
    pgdata, port = tmp_path / "pgdata", free_port()
    proc = subprocess.Popen(compute_ctl_args(fake_pageserver, pgdata, port, *STANDALONE), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert json.loads(proc.stdout.readline())["state"] == "running"
    proc.send_signal(signal.SIGQUIT)
    proc.wait(timeout=60)
    assert "received immediate shutdown request" in (tmp_path / "postgres.log").read_text()


def test_compute_ctl_at_lsn_is_read_only_and_not_followed(fake_pageserver, tmp_path):
    pgdata, port = tmp_path / "pgdata", free_port()
    proc = subprocess.Popen(
        compute_ctl_args(fake_pageserver, pgdata, port, "-c", "shared_preload_libraries=", "--lsn", LSN),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        report = json.loads(proc.stdout.readline())
        assert report["read_only"] is True
        with psycopg.connect(f"host=127.0.0.1 port={port} dbname=postgres") as conn:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute("CREATE TABLE t (x int)")
        assert fake_pageserver.wal_receiver_requests == []
        # It leases its LSN from the pageserver's GC before its basebackup, and keeps it.
        assert fake_pageserver.lease_requests and all(r["lsn"] == LSN for r in fake_pageserver.lease_requests)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def run_compute_ctl(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_compute_ctl_errors_are_clear_and_change_nothing(fake_pageserver, tmp_path):
    port = free_port()

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "PG_VERSION").write_text("15\n")
    r = run_compute_ctl(compute_ctl_args(fake_pageserver, busy, port))
    assert r.returncode == 1 and "is not empty" in r.stderr, r.stderr
    assert [p.name for p in busy.iterdir()] == ["PG_VERSION"]

    # The server's own error message is shown, and the data directory is not left behind.
    missing = tmp_path / "missing"
    r = run_compute_ctl(compute_ctl_args(fake_pageserver, missing, port, tenant="33" * 16))
    assert r.returncode == 1 and "HTTP 404" in r.stderr and "timeline not found" in r.stderr, r.stderr
    assert not missing.exists()

    # postgres refusing its configuration: the end of its log is in the error.
    bad = tmp_path / "bad" / "pgdata"
    r = run_compute_ctl(compute_ctl_args(fake_pageserver, bad, port, *STANDALONE, "-c", "shared_buffers=lots"))
    assert r.returncode == 1 and "postgres exited during startup" in r.stderr, r.stderr
    assert 'invalid value for parameter "shared_buffers"' in r.stderr, r.stderr
    assert not bad.exists()
    assert fake_pageserver.wal_receiver_requests == []

    r = run_compute_ctl(compute_ctl_args(fake_pageserver, tmp_path / "x", port, tenant="nothex"))
    assert r.returncode == 2 and "invalid tenant id" in r.stderr, r.stderr
