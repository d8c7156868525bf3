"""PostgreSQL's own regression suite against a server that routes storage through fjord.

The parallel schedule runs installcheck-style: pg_regress connects to our running server.
Any expected difference would be listed in test_runner/pg_regress/expected_failures.txt
with its reason; the list is empty and the goal is to keep it so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from fixtures.paths import pg_regress_dir

HERE = Path(__file__).parent


def expected_failures() -> set[str]:
    path = HERE / "expected_failures.txt"
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
        f"--bindir={pg.bin}",
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
