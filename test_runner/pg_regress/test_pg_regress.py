"""PostgreSQL's own regression suite against a server that routes storage through fjord.

The parallel schedule runs installcheck-style: pg_regress connects to our running server.
Twice: on a plain server with fjord's storage manager in pass-through mode, and on a
stateless compute with a small buffer pool, whose permanent relations live on a
pageserver. Any expected difference is listed in
test_runner/pg_regress/expected_failures.txt (pass-through) or
expected_failures_compute.txt (compute) with its reason; the goal is empty lists.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from fixtures.compute import Endpoint, Timeline
from fixtures.paths import pg_bin_dir, pg_regress_dir

HERE = Path(__file__).parent


def expected_failures(name: str = "expected_failures.txt") -> set[str]:
    path = HERE / name
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(line.split()[0])
    return names


def run_pg_regress(pg, outdir: Path) -> subprocess.CompletedProcess:
    regress = pg_regress_dir()
    outdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(regress / "pg_regress"),
        f"--inputdir={regress}",
        f"--bindir={pg_bin_dir()}",
        f"--dlpath={regress}",
        f"--outputdir={outdir}",
        f"--schedule={regress / 'parallel_schedule'}",
        "--max-concurrent-tests=20",
        "--host=127.0.0.1",
        f"--port={pg.port}",
        f"--user={pg.user}",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1800)


def failed_tests(stdout: str) -> set[str]:
    failed = set()
    for line in stdout.splitlines():
        # "not ok 12    + boolean    30 ms" or "test boolean ... FAILED" depending on version
        parts = line.replace("+", " ").split()
        if "FAILED" in parts and parts[0] == "test":
            failed.add(parts[1])
        elif line.lstrip().startswith("not ok") and len(parts) > 3:
            failed.add(parts[3])
        elif "FAILED" in parts and len(parts) > 1:
            failed.add(parts[0])
    return failed


def test_pg_regress_parallel_schedule(fjord_pg, tmp_path):
    fjord_pg.sql("CREATE EXTENSION fjord")
    before = fjord_pg.sql("SELECT active, reads, writes, extends FROM fjord.storage_manager()")[0]
    assert before[0] is True, "fjord's storage manager is not active"

    result = run_pg_regress(fjord_pg, tmp_path / "regress")
    print(result.stdout[-4000:])
    failed = failed_tests(result.stdout)
    unexpected = failed - expected_failures()
    diffs = tmp_path / "regress" / "regression.diffs"
    detail = diffs.read_text(errors="replace")[:20000] if diffs.exists() else result.stderr[-4000:]
    assert not unexpected, f"regression tests failed: {sorted(unexpected)}\n{detail}"
    assert result.returncode == 0 or failed <= expected_failures(), detail

    # The suite ran through the hook: it created, extended and wrote relations.
    after = fjord_pg.sql("SELECT active, reads, writes, extends FROM fjord.storage_manager()")[0]
    assert after[0] is True
    assert after[3] > before[3] + 1000, (before, after)


def test_pg_regress_on_a_compute(tmp_path, pageserver):
    tl = Timeline(tmp_path, pageserver)
    # A tiny buffer pool and a tiny local file cache: both evict all the time.
    ep = Endpoint(tmp_path, tl, settings={"shared_buffers": "1MB", "fjord.file_cache_size": "1MB"}).start()
    ep.sql("CREATE EXTENSION fjord")
    assert ep.sql("SELECT mode FROM fjord.storage_manager()")[0][0] == "pageserver"

    result = run_pg_regress(ep, tmp_path / "regress")
    print(result.stdout[-4000:])
    failed = failed_tests(result.stdout)
    expected = expected_failures("expected_failures_compute.txt")
    unexpected = failed - expected
    diffs = tmp_path / "regress" / "regression.diffs"
    detail = diffs.read_text(errors="replace")[:20000] if diffs.exists() else result.stderr[-4000:]
    assert not unexpected, f"regression tests failed on the compute: {sorted(unexpected)}\n{detail}"
    assert result.returncode == 0 or failed <= expected, detail
    reads = ep.sql("SELECT remote_requests FROM fjord.storage_manager()")[0][0]
    assert reads > 10000, reads
    hits, evictions = ep.sql("SELECT hits, evictions FROM fjord.file_cache_status()")[0]
    assert hits > 1000 and evictions > 1000, (hits, evictions)
