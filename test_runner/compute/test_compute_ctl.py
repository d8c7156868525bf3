"""compute_ctl as a process against a real pageserver: start from its basebackup, readiness,
report, signals, read-only at an LSN, errors.

No safekeepers here: compute_ctl points the pageserver's WAL receiver at the compute, which
streams its WAL straight to it. The safekeeper tests (`test_runner/safekeeper/`) and the CLI's
(`test_runner/cli/`) run compute_ctl with safekeepers and its sync.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from fixtures.compute import Timeline
from fixtures.pagestream import lsn_int
from fixtures.paths import fjord_bin_dir, pg_bin_dir
from fixtures.postgres import free_port, wait_until


@pytest.fixture
def timeline(tmp_path: Path, pageserver) -> Timeline:
    return Timeline(tmp_path, pageserver)


def compute_ctl_args(tl: Timeline, pgdata: Path, port: int, *extra: str, tenant: str | None = None) -> list[str]:
    return [
        str(fjord_bin_dir() / "compute_ctl"), "--pgdata", str(pgdata), "--pg-bin-dir", str(pg_bin_dir()),
        "--pageserver-http", tl.ps.http_url, "--pageserver-pg", f"127.0.0.1:{tl.ps.pg_port}",
        "--tenant", tenant or tl.tenant, "--timeline", tl.timeline, "--port", str(port),
        *(["--tls-ca", str(tl.ps.tls)] if tl.ps.tls else ["--no-tls"]), *extra,
    ]


def wal_sources(tl: Timeline) -> list[tuple[str, int, str]]:
    receiver = tl.status()["wal_receiver"]
    return [(s["host"], s["port"], s["user"]) for s in receiver["sources"]] if receiver else []


def test_compute_ctl_starts_reports_and_stops(timeline, tmp_path):
    pgdata, port = tmp_path / "compute" / "pgdata", free_port()
    status_file = tmp_path / "compute" / "status.json"
    start_lsn = timeline.status()["last_record_lsn"]
    log = open(tmp_path / "compute_ctl.log", "w")
    proc = subprocess.Popen(
        compute_ctl_args(timeline, pgdata, port, "-c", "work_mem=7MB", "--status-file", str(status_file)),
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    try:
        report = json.loads(proc.stdout.readline())
        assert report["state"] == "running" and report["port"] == port and report["lsn"] == start_lsn
        assert report["basebackup_bytes"] > 0
        for key in ("basebackup_ms", "start_ms", "total_ms"):
            assert isinstance(report[key], int)
        assert json.loads(status_file.read_text()) == report
        assert oct(pgdata.stat().st_mode & 0o777) == "0o700"

        conf = (pgdata / "postgresql.conf").read_text()
        assert f"fjord.tenant_id = '{timeline.tenant}'" in conf and "wal_keep_size = '1GB'" in conf
        assert (pgdata / "pg_ident.conf").read_text() == ""
        user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        with psycopg.connect(f"host=127.0.0.1 port={port} user={user} dbname=postgres", autocommit=True) as conn:
            assert conn.execute("SHOW work_mem").fetchone()[0] == "7MB"
            assert conn.execute("SHOW restart_after_crash").fetchone()[0] == "off"
            conn.execute("CREATE TABLE t AS SELECT 1 AS x")
            flushed = lsn_int(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        # The pageserver follows the compute, which compute_ctl named as its WAL source.
        assert wal_sources(timeline) == [("127.0.0.1", port, user)]
        wait_until("the pageserver to ingest the compute's WAL",
                   lambda: lsn_int(timeline.status()["last_record_lsn"]) >= flushed, timeout_s=60)

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


def test_compute_ctl_sigquit_is_an_immediate_shutdown(timeline, tmp_path):
    pgdata, port = tmp_path / "pgdata", free_port()
    proc = subprocess.Popen(compute_ctl_args(timeline, pgdata, port), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert json.loads(proc.stdout.readline())["state"] == "running"
        proc.send_signal(signal.SIGQUIT)
        proc.wait(timeout=60)
        assert "received immediate shutdown request" in (tmp_path / "postgres.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def leases(tl: Timeline, lsn: str) -> dict[str, str]:
    """The timeline's LSN leases in force, by holder (after taking one as "probe" at `lsn`)."""
    answer = tl.ps.http("POST", f"{tl.path}/lsn_lease", {"holder": "probe", "lsn": lsn, "ttl_secs": 60})
    return {lease["holder"]: lease["lsn"] for lease in answer["leases"] if lease["holder"] != "probe"}


def test_compute_ctl_at_lsn_is_read_only_and_not_followed(timeline, tmp_path):
    pgdata, port = tmp_path / "pgdata", free_port()
    lsn = timeline.status()["last_record_lsn"]
    proc = subprocess.Popen(compute_ctl_args(timeline, pgdata, port, "--lsn", lsn),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        report = json.loads(proc.stdout.readline())
        assert report["read_only"] is True and report["lsn"] == lsn
        with psycopg.connect(f"host=127.0.0.1 port={port} dbname=postgres") as conn:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute("CREATE TABLE t (x int)")
        assert wal_sources(timeline) == []
        # It leases its LSN from the pageserver's GC before its basebackup, and keeps it.
        held = leases(timeline, lsn)
        assert list(held.values()) == [lsn], held
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def run_compute_ctl(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_compute_ctl_errors_are_clear_and_change_nothing(timeline, tmp_path):
    port = free_port()

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "PG_VERSION").write_text("15\n")
    r = run_compute_ctl(compute_ctl_args(timeline, busy, port))
    assert r.returncode == 1 and "is not empty" in r.stderr, r.stderr
    assert [p.name for p in busy.iterdir()] == ["PG_VERSION"]

    # The server's own error message is shown, and the data directory is not left behind.
    missing = tmp_path / "missing"
    r = run_compute_ctl(compute_ctl_args(timeline, missing, port, tenant="33" * 16))
    assert r.returncode == 1 and "HTTP 404" in r.stderr and f"tenant {'33' * 16} not found" in r.stderr, r.stderr
    assert not missing.exists()

    # postgres refusing its configuration: the end of its log is in the error.
    bad = tmp_path / "bad" / "pgdata"
    r = run_compute_ctl(compute_ctl_args(timeline, bad, port, "-c", "shared_buffers=lots"))
    assert r.returncode == 1 and "postgres exited during startup" in r.stderr, r.stderr
    assert 'invalid value for parameter "shared_buffers"' in r.stderr, r.stderr
    assert not bad.exists()
    assert wal_sources(timeline) == []

    r = run_compute_ctl(compute_ctl_args(timeline, tmp_path / "x", port, tenant="nothex"))
    assert r.returncode == 2 and "invalid tenant id" in r.stderr, r.stderr
