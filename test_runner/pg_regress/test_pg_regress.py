"""PostgreSQL's own regression suite against a server that routes storage through fjord.

The parallel schedule runs installcheck-style: pg_regress connects to our running server.
Twice: on a plain server with fjord's storage manager in pass-through mode, and on a
stateless compute with a small buffer pool, whose permanent relations live on a
pageserver. Any expected difference is listed in
test_runner/pg_regress/expected_failures.txt (pass-through) or
expected_failures_compute.txt (compute) with its reason; the goal is empty lists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from fixtures.compute import Endpoint, Timeline
from fixtures.paths import pg_bin_dir, pg_regress_dir

# Expected in these tests' logs: the errors PostgreSQL's regression suite provokes on purpose,
# in its sessions and their parallel workers, and the subscription worker it stops (its
# expected output is the judge of them). PANIC lines, crashed processes and panics are not
# allowed.
pytestmark = [
    pytest.mark.allowed_errors(r"\] (\S+@regression )?(ERROR|WARNING):  ",
                               r"\] \S+@regression FATAL:  ",
                               r"FATAL:  terminating logical replication worker due to administrator command"),
    # The two heaviest loads of the suite (each runs PostgreSQL's parallel schedule, 20
    # sessions at a time): never at the same time, on one worker.
    pytest.mark.xdist_group("pg_regress"),
]

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


def scheduled_tests(schedule: Path) -> list[str]:
    """The names on the schedule's `test:` lines, in order."""
    names = []
    for line in schedule.read_text().splitlines():
        if line.startswith("test:"):
            names.extend(line[len("test:"):].split())
    return names


# PostgreSQL 15's pg_regress prints one line per test, "test NAME ... ok   12 ms" alone or
# "     NAME ... FAILED   12 ms" inside a parallel group (a test on the schedule's `ignore:`
# line that differs says "failed (ignored)"; a test whose process failed has the exit code
# before the time), then a summary between lines of "=".
RESULT = re.compile(r"^(?:test +| +)(\S+) +\.\.\. +(?:\S+ +)*?(ok|FAILED|failed \(ignored\))(?: .*)? +\d+ ms$")
SUMMARY = re.compile(
    r"^ (?:All (?P<all>\d+) tests passed"
    r"|(?P<p_ok>\d+) of (?P<p_total>\d+) tests passed, \d+ failed test\(s\) ignored"
    r"|(?P<f_failed>\d+) of (?P<f_total>\d+) tests failed(?:, (?P<f_ignored>\d+) of these failures ignored)?)\. $"
)


def results(stdout: str) -> dict[str, str]:
    """Test name -> "ok", "FAILED" or "failed (ignored)", from pg_regress's output."""
    out = {}
    for line in stdout.splitlines():
        m = RESULT.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def summary(stdout: str) -> tuple[int, int] | None:
    """(tests run, tests failed and not ignored) from pg_regress's summary line; None if it
    printed none (it stopped before the end)."""
    for line in stdout.splitlines():
        m = SUMMARY.match(line)
        if not m:
            continue
        if m.group("all"):
            return int(m.group("all")), 0
        if m.group("p_total"):
            return int(m.group("p_total")), 0
        ignored = int(m.group("f_ignored") or 0)
        return int(m.group("f_total")), int(m.group("f_failed")) - ignored
    return None


def check_run(result: subprocess.CompletedProcess, schedule: Path, expected: set[str], detail: str) -> None:
    """Every test of the schedule ran and has a result line, the summary agrees, no failure
    outside `expected`, and the exit status is the one those results give (0, or 1 with
    failures): a pg_regress that stops early, errors out (status 2) or skips tests fails."""
    got = results(result.stdout)
    failed = {name for name, status in got.items() if status == "FAILED"}
    unexpected = failed - expected
    assert not unexpected, f"regression tests failed: {sorted(unexpected)}\n{detail}"
    totals = summary(result.stdout)
    assert totals is not None, f"pg_regress printed no summary (exit status {result.returncode})\n{detail}"
    scheduled = scheduled_tests(schedule)
    missing = [name for name in scheduled if name not in got]
    assert not missing, f"{len(missing)} of {len(scheduled)} scheduled tests have no result: {missing[:20]}\n{detail}"
    assert totals == (len(got), len(failed)), (totals, len(got), sorted(failed))
    assert len(got) >= len(scheduled) >= 200, (len(got), len(scheduled))
    assert result.returncode == (1 if failed else 0), f"pg_regress exited with {result.returncode}\n{detail}"


def failure_detail(result: subprocess.CompletedProcess, tmp_path: Path) -> str:
    diffs = tmp_path / "regress" / "regression.diffs"
    text = diffs.read_text(errors="replace")[:20000] if diffs.exists() else ""
    return f"{text}\n--- stdout (end) ---\n{result.stdout[-3000:]}\n--- stderr (end) ---\n{result.stderr[-3000:]}"


def test_pg_regress_parallel_schedule(fjord_pg, tmp_path):
    fjord_pg.sql("CREATE EXTENSION fjord")
    before = fjord_pg.sql("SELECT active, reads, writes, extends FROM fjord.storage_manager()")[0]
    assert before[0] is True, "fjord's storage manager is not active"

    result = run_pg_regress(fjord_pg, tmp_path / "regress")
    print(result.stdout[-4000:])
    check_run(result, pg_regress_dir() / "parallel_schedule", expected_failures(), failure_detail(result, tmp_path))

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
    expected = expected_failures("expected_failures_compute.txt")
    check_run(result, pg_regress_dir() / "parallel_schedule", expected, failure_detail(result, tmp_path))
    reads = ep.sql("SELECT pageserver_requests FROM fjord.storage_manager()")[0][0]
    assert reads > 10000, reads
    hits, evictions = ep.sql("SELECT hits, evictions FROM fjord.file_cache_status()")[0]
    assert hits > 1000 and evictions > 1000, (hits, evictions)
