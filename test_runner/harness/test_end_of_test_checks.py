"""The end-of-test checks of fixtures/services.py, on real services: tests run by an inner
pytest (the `pytester` plugin, in a subprocess) with this suite's conftest.py, and what it
reports for each."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

TEST_RUNNER = Path(__file__).resolve().parents[1]

INNER = r'''
import signal
import subprocess

import pytest

from fixtures.postgres import PgServer, wait_until
from fixtures.safekeeper import Safekeeper


def abort_from_outside(proc):
    """SIGABRT from another process, as a crash would: not through the fixture."""
    subprocess.run(["kill", "-ABRT", str(proc.pid)], check=True)
    wait_until("the process to end", lambda: proc.poll() is not None)


def test_a_safekeeper_that_dies_on_its_own(tmp_path):
    sk = Safekeeper(tmp_path, 1).start()
    abort_from_outside(sk.proc)


def test_a_safekeeper_killed_and_restarted_by_the_test(tmp_path):
    sk = Safekeeper(tmp_path, 1).start()
    sk.kill()
    sk.start()
    sk.proc.kill()
    sk.proc.wait()
    sk.start()


def test_a_safekeeper_that_dies_before_the_test_kills_it(tmp_path):
    sk = Safekeeper(tmp_path, 1).start()
    abort_from_outside(sk.proc)
    sk.kill()
    sk.start()


def test_an_expected_exit(tmp_path):
    sk = Safekeeper(tmp_path, 1).start()
    sk.proc.expect_exit()
    abort_from_outside(sk.proc)


def test_an_error_in_a_log(tmp_path):
    pg = PgServer(tmp_path).initdb().start()
    with pytest.raises(Exception):
        pg.sql("SELECT no_such_function_here()")


@pytest.mark.allowed_errors(r"function no_such_function_here\(\) does not exist")
def test_an_allowed_error_in_a_log(tmp_path):
    pg = PgServer(tmp_path).initdb().start()
    with pytest.raises(Exception):
        pg.sql("SELECT no_such_function_here()")
'''


def test_the_end_of_test_check_reports_what_the_test_did_not_intend(pytester, monkeypatch):
    pytester.makeconftest((TEST_RUNNER / "conftest.py").read_text())
    pytester.makeini((TEST_RUNNER / "pytest.ini").read_text())
    pytester.makepyfile(test_inner=INNER)
    monkeypatch.setenv("PYTHONPATH", str(TEST_RUNNER))
    # A short base directory: postgres' Unix socket path must fit in 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="fjord-checks-"))
    try:
        result = pytester.runpytest_subprocess("-p", "no:xdist", f"--basetemp={base}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result.assert_outcomes(passed=3, failed=3)
    failed = sorted(line.split("::")[1].split(" ")[0] for line in result.outlines if line.startswith("FAILED "))
    assert failed == ["test_a_safekeeper_that_dies_before_the_test_kills_it", "test_a_safekeeper_that_dies_on_its_own",
                      "test_an_error_in_a_log"], result.stdout.str()
    # Each failure names the service, the status and the log's end (the safekeeper's
    # startup lines are in it).
    result.stdout.fnmatch_lines([
        "*test_a_safekeeper_that_dies_on_its_own*",
        "*safekeeper 1 (pid *) was killed by SIGABRT on its own; its log ends:*",
    ])
    result.stdout.fnmatch_lines([
        "*test_a_safekeeper_that_dies_before_the_test_kills_it*",
        "*safekeeper 1 (pid *) was killed by SIGABRT on its own; its log ends:*",
    ])
    result.stdout.fnmatch_lines([
        "*test_an_error_in_a_log*",
        "*postgres pg: 1 unexpected line(s) in *postgres.log:*",
        "*ERROR:  function no_such_function_here() does not exist*",
    ])
