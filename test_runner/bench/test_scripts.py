"""The scripts a person runs by hand, run at a tiny size so that none of them rots:
`scripts/quickstart` and every `scripts/bench-*`.

Each runs as a subprocess with directories of its own (its results in the test's directory,
never `target/bench` or `docs/benchmarks.md`; its servers under the test's `TMPDIR`), and
must exit 0, run to its end and write its numbers: the results file exists and the keys the
script documents hold numbers. Nothing is asserted about speed, and the debug build's numbers
mean nothing; they only have to be there. Afterwards no process it started may be left
running (the quickstart's cluster is stopped with `fjord stop`, as its last line says).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fixtures import services
from fixtures.cli import FjordRepo, free_base_port
from fixtures.paths import REPO_ROOT

SCRIPTS = REPO_ROOT / "scripts"

# Whole seconds of pgbench and friends: the smallest sizes the scripts take.
TINY = ("--scale", "1", "--duration", "2", "--clients", "2")


@pytest.fixture
def short_tmp():
    """A directory of the test with a short path, for the scripts' `TMPDIR`: the servers they
    start put their Unix sockets in their directories, and a socket's path has at most 107
    bytes."""
    path = Path(tempfile.mkdtemp(prefix="fjord-script-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_script(cwd: Path, tmp: Path, name: str, *args: str, timeout: float = 600) -> str:
    """Runs `scripts/NAME ARGS` in `cwd`, in a session of its own with `TMPDIR` set to `tmp`;
    fails with the end of its output unless it exits 0. Returns its output."""
    cmd = [str(SCRIPTS / name), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                            env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{name} did not finish within {timeout} s; the end of its output:\n{out[-4000:]}")
    print(out)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited with {proc.returncode}; the end of its output:\n{out[-4000:]}"
    return out


def processes_under(path: Path) -> list[str]:
    """The command lines of running processes that name a path under `path`."""
    return [f"{pid}: {cmdline}" for pid, cmdline in services.processes_under(path)]


def assert_nothing_left_running(path: Path) -> None:
    deadline = time.monotonic() + 30
    while (left := processes_under(path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "processes left running:\n" + "\n".join(left)


def assert_numbers(results: dict, *keys: str) -> None:
    """Each dotted key (`fjord.read-write.tps`) leads to a finite number in `results`."""
    for key in keys:
        value = results
        for part in key.split("."):
            assert isinstance(value, dict) and part in value, f"the results have no {key}: {json.dumps(results)[:2000]}"
            value = value[part]
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), \
            f"{key} is {value!r}, not a number"


def bench(tmp_path: Path, tmp: Path, name: str, *args: str) -> dict:
    """Runs `scripts/bench-NAME` with its results in the test's directory and `TMPDIR` set to
    `tmp`; returns the results."""
    out_dir = tmp_path / "results"
    run_script(tmp_path, tmp, f"bench-{name}", "--no-docs", "--out-dir", str(out_dir), *args)
    assert_nothing_left_running(tmp)
    assert_nothing_left_running(tmp_path)
    dated = list(out_dir.glob(f"{name}-*.json"))
    assert dated, f"bench-{name} wrote no dated copy of its results in {out_dir}"
    return json.loads((out_dir / f"{name}.json").read_text())


def test_quickstart_runs_a_cluster_and_prints_tps(tmp_path: Path, short_tmp: Path):
    repo = FjordRepo(tmp_path / "quickstart", base_port=free_base_port())
    try:
        out = run_script(tmp_path, short_tmp, "quickstart", "--skip-setup", "--repo", str(repo.path),
                         "--base-port", str(repo.base_port), "--scale", "1", "--duration", "2")
        tps = re.search(r"pgbench: ([0-9.]+) TPS", out)
        assert tps and float(tps.group(1)) > 0, f"the quickstart printed no TPS:\n{out[-2000:]}"
        assert "fjord is running" in out and "stop:" in out
        # The cluster it leaves running serves the endpoint it printed.
        connstr = repo.run("endpoint", "connstr", "main").stdout.strip()
        rows = subprocess.run([str(REPO_ROOT / "target/pg15/bin/psql"), connstr, "-Atc",
                               "SELECT count(*) FROM pgbench_branches"], capture_output=True, text=True, timeout=60)
        assert rows.stdout.strip() == "1", rows.stdout + rows.stderr
    finally:
        if (repo.path / "config.toml").exists():
            repo.run("stop")
    assert_nothing_left_running(tmp_path)


def test_bench_compute(tmp_path: Path, short_tmp: Path):
    r = bench(tmp_path, short_tmp, "compute", *TINY, "--scan-rows", "20000", "--tls", "both")
    assert r["scale"] == 1 and r["tls"] == "both"
    # The second cluster, with TLS off.
    assert_numbers(r, *(f"fjord_tls_off.{mode}.tps" for mode in ("read-write", "select-only")))
    for side in ("plain", "fjord"):
        assert_numbers(r, *(f"{side}.{mode}.{k}" for mode in ("read-write", "select-only") for k in ("tps", "latency_ms")),
                       f"{side}.init_s", f"{side}.cold_scan_s", f"{side}.warm_scan_s")
    assert_numbers(r, "fjord.cold_scan_images_s", "fjord_after_restart.tps", "fjord_after_restart.first_query_ms")


def test_bench_pageserver(tmp_path: Path, short_tmp: Path):
    r = bench(tmp_path, short_tmp, "pageserver", *TINY, "--samples", "20", "--no-build")
    assert r["workload"]["scale"] == 1
    assert_numbers(r, *(f"ingest.{part}.{k}" for part in ("pgbench_init", "pgbench_run") for k in ("wal_bytes", "mib_per_s")),
                   "getpage.image_hit.p50_us", "getpage.hottest_page.latency.p99_us", "compaction_s", "image_layers_s",
                   "layer_bytes.written_per_wal_byte_before_compaction", "layer_bytes.written_per_wal_byte_after_compaction")
    # Through a pageserver process's page service, with TLS off and on (`--tls both`, the default).
    assert_numbers(r, *(f"page_service.{tls}.{k}" for tls in ("tls_off", "tls_on") for k in ("p50_us", "p99_us")))
    assert [c["records"] for c in r["getpage"]["redo"]] == [1, 10, 100]
    for case in r["getpage"]["redo"]:
        assert_numbers(case, "records_found", "latency.p50_us")


def test_bench_replicas(tmp_path: Path, short_tmp: Path):
    r = bench(tmp_path, short_tmp, "replicas", *TINY, "--rate", "100")
    for side in ("", "plain."):
        assert_numbers(r, *(f"{side}{k}" for k in ("lag_alone.lag_p50_ms", "lag_alone.commits_per_s",
                                                   "lag_under_pgbench.lag_p99_ms", "lag_under_pgbench.pgbench_rw_tps",
                                                   "select_only_primary.tps", "select_only_replica.tps")))
    assert_numbers(r, "replica_start_s", "replica_select_only_ratio")


def test_bench_safekeepers(tmp_path: Path, short_tmp: Path):
    r = bench(tmp_path, short_tmp, "safekeepers", *TINY, "--shared-buffers", "16MB")
    assert r["scale"] == 1
    # The rows on tmpfs are left out where /dev/shm is not writable.
    sides = ["plain", "plain_2_standbys", "fjord", "plain_no_fsync"] + (["fjord_tmpfs"] if os.access("/dev/shm", os.W_OK) else [])
    assert_numbers(r, *(f"{side}.{run}.{k}" for side in sides for run in ("commit", "tpcb") for k in ("tps", "latency_ms")))


def test_bench_soak(tmp_path: Path, short_tmp: Path):
    r = bench(tmp_path, short_tmp, "soak", "--scale", "1", "--duration", "6", "--interval", "2", "--clients", "2",
              "--work-dir", str(short_tmp))
    assert r["settings"]["scale"] == 1
    # One every 2 s; the last may fall on pgbench's end, where its last progress line may be missing.
    assert len(r["readings"]) >= 2, f"{len(r['readings'])} readings in 6 s at one every 2 s"
    for reading in r["readings"]:
        assert_numbers(reading, "tps", "latency_ms")
    assert_numbers(r, "pgbench.tps", "pgbench.transactions", "summary.tps_first", "summary.tps_last",
                   "summary.disk.pageserver.max", "summary.disk.sk1.max", "summary.disk.object_storage.max",
                   "summary.getpage_hot_p99_us.last", "summary.getpage_random_p99_us.last")


def test_bench_failover(tmp_path: Path, short_tmp: Path):
    r = bench(tmp_path, short_tmp, "failover", "--rounds", "2", "--scale", "1", "--clients", "2", "--warm-wait-s", "30")
    assert [x["round"] for x in r["rounds"]] == [1, 2]
    # Each round moved the tenant to the other pageserver, one generation up.
    assert r["rounds"][0]["to"] == r["rounds"][1]["from"] and r["rounds"][1]["to"] == r["rounds"][0]["from"]
    assert r["rounds"][1]["generation"] > r["rounds"][0]["generation"]
    assert_numbers(r, "summary.p50_s", "summary.p99_s")
