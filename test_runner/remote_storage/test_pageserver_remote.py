"""The pageserver on object storage, through the `fjord` CLI: a pageserver that lost its disk
is rebuilt from object storage alone (the repo's local directory and MinIO), uploads that
survive a MinIO outage and a kill -9, and a local disk budget.

Data is compared with pg_dump (byte for byte) and pgbench's balance invariant."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from fixtures.cli import FjordRepo
from fixtures.logs import unexpected_lines
from fixtures.pagestream import lsn_int
from fixtures.paths import pg_bin_dir
from fixtures.pgbench import pgbench
from fixtures.postgres import wait_until
from fixtures.remote_index import local_objects, local_reader, newest_index_is_consistent


@pytest.fixture
def repos(tmp_path: Path):
    made: list[FjordRepo] = []

    def make(*init_args: str, env: dict[str, str] | None = None) -> FjordRepo:
        repo = FjordRepo(tmp_path / f"repo{len(made)}", env=env)
        made.append(repo)
        repo.init(*init_args)
        repo.run("start")
        return repo

    yield make
    for r in made:
        r.cleanup()


def connstr_parts(connstr: str) -> tuple[str, int]:
    """(user, port) of a postgresql://user@127.0.0.1:port/postgres string."""
    rest = connstr.split("://", 1)[1]
    user, hostport = rest.split("@", 1)
    return user, int(hostport.split("/", 1)[0].rsplit(":", 1)[1])


def dump(connstr: str) -> str:
    r = subprocess.run([str(pg_bin_dir() / "pg_dump"), "--no-owner", "-d", connstr], capture_output=True, text=True, check=True)
    # pg_dump guards its output with a random \restrict key per run.
    return "\n".join(line for line in r.stdout.splitlines() if not line.startswith(("\\restrict", "\\unrestrict")))


def balances(connstr: str) -> tuple:
    with psycopg.connect(connstr, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches), "
            "(SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history), "
            "(SELECT count(*) FROM pgbench_history)"
        ).fetchone()
    assert row[0] == row[1] == row[2] == row[3], f"pgbench's balance invariant is broken: {row}"
    return row


def run_pgbench(connstr: str, *args: str) -> None:
    """pgbench on the endpoint. Runs after `-i` pass `-n`: without it pgbench truncates
    pgbench_history first, and the balance invariant no longer holds."""
    user, port = connstr_parts(connstr)
    pgbench(port, user, *args)


def timelines(repo: FjordRepo, tenant: str) -> list[dict]:
    return repo.http_json(f"/v1/tenant/{tenant}/timeline")


def wait_ingested(repo: FjordRepo, tenant: str, connstr: str) -> None:
    """Waits until the pageserver has ingested everything the endpoint has flushed."""
    with psycopg.connect(connstr, autocommit=True) as conn:
        flushed = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
    wait_until("the pageserver to ingest the last commit",
               lambda: any(lsn_int(t["last_record_lsn"]) >= lsn_int(flushed) for t in timelines(repo, tenant)), timeout_s=60)


@pytest.mark.parametrize("storage", ["local", "minio"])
def test_a_pageserver_that_lost_its_disk_is_rebuilt_from_object_storage(repos, storage, request):
    if storage == "minio":
        minio = request.getfixturevalue("minio")
        repo = repos("--remote-storage", minio.url("fjord"), env=minio.env())
        list_objects = lambda: {k[len("fjord/"):]: size for k, size in minio.list_objects("fjord/")}  # noqa: E731
        read = lambda key: minio.get_object(f"fjord/{key}").decode()  # noqa: E731
    else:
        repo = repos()
        root = repo.path / "remote_storage"
        list_objects = lambda: local_objects(root)  # noqa: E731
        read = local_reader(root)
        assert f'remote_storage = "file://{repo.path.resolve()}/remote_storage"' in (repo.path / "config.toml").read_text()
    tenant = repo.run("tenant", "create").stdout.strip()
    main = repo.run("endpoint", "start", "main").stdout.strip()
    run_pgbench(main, "-i", "-s", "2", "-q")
    run_pgbench(main, "-n", "-T", "5", "-c", "2")
    with psycopg.connect(main, autocommit=True) as conn:
        conn.execute("CREATE TABLE big AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 50000) g")
    wait_ingested(repo, tenant, main)
    repo.run("branch", "create", "dev", "--from", "main")
    dev = repo.run("endpoint", "start", "dev", "--branch", "dev").stdout.strip()
    with psycopg.connect(dev, autocommit=True) as conn:
        conn.execute("DELETE FROM big WHERE g % 2 = 0")
    want_main, want_dev = dump(main), dump(dev)
    want_balances = balances(main)
    # A clean stop flushes and uploads what the pageserver ingested.
    repo.run("stop")
    assert newest_index_is_consistent(list_objects(), read, tenant) > 0

    shutil.rmtree(repo.path / "pageserver")
    (repo.path / "pageserver").mkdir()
    repo.run("start")
    assert "attaching tenant from remote storage" in repo.log("pageserver.log")
    for t in timelines(repo, tenant):
        assert t["remote_storage"]["generation"] >= 2, t
    main = repo.run("endpoint", "start", "main").stdout.strip()
    dev = repo.run("endpoint", "start", "dev", "--branch", "dev").stdout.strip()
    assert dump(main) == want_main
    assert dump(dev) == want_dev
    assert balances(main) == want_balances
    # And it goes on: writes after the rebuild are uploaded under the new generation.
    run_pgbench(main, "-n", "-T", "3", "-c", "2")
    balances(main)
    downloaded = sum(t["remote_storage"]["layers_downloaded"] for t in timelines(repo, tenant))
    assert downloaded > 0, "reads after the rebuild download layers"
    repo.run("stop")
    assert newest_index_is_consistent(list_objects(), read, tenant) > 0
    # A new branch's WAL receiver asks the safekeepers for WAL before its compute wrote any.
    allowed = [r"uploads not finished at shutdown", r"could not stream WAL from .*is ahead of the WAL flush position"]
    assert unexpected_lines(repo.log("pageserver.log"), allowed) == []


# Expected: the MinIO the test stops.
@pytest.mark.allowed_errors(r"remote storage operation failed, retrying: could not upload")
def test_uploads_retry_while_minio_is_down_and_nothing_is_lost(repos, minio):
    repo = repos("--remote-storage", minio.url("fjord"), env=minio.env())
    tenant = repo.run("tenant", "create").stdout.strip()
    main = repo.run("endpoint", "start", "main").stdout.strip()
    run_pgbench(main, "-i", "-s", "1", "-q")
    minio.stop()
    # Writes go on while object storage is down: the WAL is on the safekeepers.
    run_pgbench(main, "-n", "-T", "3", "-c", "2")
    with psycopg.connect(main, autocommit=True) as conn:
        conn.execute("CREATE TABLE during_outage AS SELECT g FROM generate_series(1, 100000) g")
        conn.execute("CHECKPOINT")
    want = dump(main)

    def failing():
        return any((t.get("remote_storage") or {}).get("last_error") for t in timelines(repo, tenant))
    # The pageserver flushes by size or when WAL pauses; then its upload fails and says so.
    wait_until("an upload to fail and the status to say so", failing, timeout_s=90)
    status = [t["remote_storage"] for t in timelines(repo, tenant)]
    assert any(s["failing_since_unix_s"] for s in status), status
    minio.start()

    def caught_up():
        return all(t["remote_storage"]["queued_operations"] == 0 and t["remote_storage"]["last_error"] is None for t in timelines(repo, tenant))
    wait_until("uploads to catch up after MinIO is back", caught_up, timeout_s=120)
    repo.run("stop")
    newest_index_is_consistent({k[len("fjord/"):]: s for k, s in minio.list_objects("fjord/")},
                               lambda key: minio.get_object(f"fjord/{key}").decode(), tenant)
    shutil.rmtree(repo.path / "pageserver")
    (repo.path / "pageserver").mkdir()
    repo.run("start")
    main = repo.run("endpoint", "start", "main").stdout.strip()
    assert dump(main) == want
    balances(main)


# Expected: the safekeeper WAL torn by the kill the test sends.
@pytest.mark.allowed_errors(r"failed verification and is not served to the proposer")
def test_kill_9_during_uploads_loses_no_commit(repos):
    repo = repos()
    root = repo.path / "remote_storage"
    tenant = repo.run("tenant", "create").stdout.strip()
    main = repo.run("endpoint", "start", "main").stdout.strip()
    run_pgbench(main, "-i", "-s", "2", "-q")
    for _ in range(3):
        # Kill the pageserver while pgbench writes (and the pageserver flushes and uploads).
        user, port = connstr_parts(main)
        bench = subprocess.Popen([str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U", user,
                                  "-n", "-T", "4", "-c", "2", "postgres"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until("pgbench to run", lambda: bench.poll() is None, timeout_s=10)
        import time
        time.sleep(2)
        pid = int((repo.path / "pageserver.pid").read_text())
        # A pageserver that died on its own is a failure of its own, not of this kill.
        assert Path(f"/proc/{pid}").exists(), "the pageserver died before it was killed; its log ends:\n" + \
            "\n".join(repo.log("pageserver.log").splitlines()[-30:])
        os.kill(pid, signal.SIGKILL)
        # A process in uninterruptible sleep (a write under this test's I/O) dies only when
        # the write ends; `fjord start` before that saw it running and started nothing, and
        # pgbench waited for a pageserver that never came back (seen in CI).
        wait_until("the killed pageserver to be gone", lambda: not Path(f"/proc/{pid}").exists(), timeout_s=60)
        # Checked while the pageserver is dead (nothing writes objects), then it is started
        # again before pgbench is waited for: a transaction that was reading a page waits
        # for the pageserver (up to fjord.pageserver_timeout, 60 s), and waiting for pgbench
        # first raced that timeout.
        newest_index_is_consistent(local_objects(root), local_reader(root), tenant)
        repo.run("start")
        bench.wait(timeout=120)
    want = dump(main)
    want_balances = balances(main)
    wait_ingested(repo, tenant, main)
    repo.run("stop")
    newest_index_is_consistent(local_objects(root), local_reader(root), tenant)
    shutil.rmtree(repo.path / "pageserver")
    (repo.path / "pageserver").mkdir()
    repo.run("start")
    main = repo.run("endpoint", "start", "main").stdout.strip()
    assert dump(main) == want
    assert balances(main) == want_balances


# Expected: the budget the test sets below what reads need.
@pytest.mark.allowed_errors(r"downloading layer \S+ \(\d+ bytes\) with \d+ bytes of layer files on local disk")
def test_local_disk_stays_under_its_budget(repos):
    # Each batch ends with a clean pageserver restart, which flushes it into a layer of its
    # own (about 4 MiB); the budget holds one or two of them.
    budget = 6 * 1024 * 1024
    repo = repos("--layer-disk-budget-bytes", str(budget))
    tenant = repo.run("tenant", "create").stdout.strip()
    main = repo.run("endpoint", "start", "main").stdout.strip()
    for batch in range(4):
        with psycopg.connect(main, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE t{batch} AS SELECT g, md5(g::text) AS h FROM generate_series(1, 100000) g")
        wait_ingested(repo, tenant, main)
        pid = int((repo.path / "pageserver.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        wait_until("the pageserver to stop", lambda: not Path(f"/proc/{pid}").exists(), timeout_s=60)
        repo.run("start")

    def under_budget():
        return sum(t["remote_storage"]["resident_layer_bytes"] for t in timelines(repo, tenant)) <= budget
    wait_until("eviction to bring the layer files under the budget", under_budget, timeout_s=60)
    with psycopg.connect(main, autocommit=True) as conn:
        for batch in range(4):
            assert conn.execute(f"SELECT count(*), sum(g) FROM t{batch}").fetchone() == (100000, 5000050000)
    assert sum(t["remote_storage"]["layers_downloaded"] for t in timelines(repo, tenant)) > 0
    metrics = repo.urlopen(f"{repo.http_url()}/metrics", timeout=30).read().decode()
    evicted = [line for line in metrics.splitlines() if line.startswith("pageserver_evicted_layers_total ")]
    assert evicted and int(evicted[0].split()[1]) > 0, evicted
    wait_until("eviction to bring the layer files under the budget again", under_budget, timeout_s=60)
    repo.run("stop")


def test_a_pageserver_rebuilt_from_object_storage_serves_running_computes_again(repos):
    """kill -9 of the pageserver under a bank-transfer workload, its work directory emptied,
    `fjord start`: the computes that kept running are served again within seconds, without an
    endpoint restart (the rebuilt pageserver learns the timelines' WAL sources again from
    the CLI, which registers them), and nothing is lost."""
    import threading
    import time
    repo = repos()
    tenant = repo.run("tenant", "create").stdout.strip()
    # Small buffers and cache: nearly every read goes to the pageserver.
    main = repo.run("endpoint", "start", "main", "-c", "shared_buffers=1MB", "-c", "fjord.file_cache_size=1").stdout.strip()
    run_pgbench(main, "-i", "-s", "2", "-q")
    user, port = connstr_parts(main)
    bench = subprocess.Popen([str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U", user,
                              "-n", "-T", "6", "-c", "3", "postgres"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(2)
    pid = int((repo.path / "pageserver.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_until("the pageserver to die", lambda: not Path(f"/proc/{pid}").exists(), timeout_s=30)
    shutil.rmtree(repo.path / "pageserver")
    (repo.path / "pageserver").mkdir()
    repo.run("start")
    restarted = time.monotonic()
    assert "attaching tenant from remote storage" in repo.log("pageserver.log")

    # A new session on the compute that never restarted: a write, then a read of every
    # account page at the newest LSN, which needs the WAL ingested up to there.
    outcome: dict = {}

    def transfer_and_sum():
        try:
            with psycopg.connect(main, autocommit=True) as conn:
                conn.execute("SET statement_timeout = '30s'")
                conn.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")
                conn.execute("UPDATE pgbench_branches SET bbalance = bbalance + 1 WHERE bid = 1")
                conn.execute("UPDATE pgbench_tellers SET tbalance = tbalance + 1 WHERE tid = 1")
                conn.execute("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 1, now())")
                outcome["sum"] = conn.execute("SELECT sum(abalance) FROM pgbench_accounts").fetchone()[0]
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["error"] = e
        outcome["seconds"] = time.monotonic() - restarted
    worker = threading.Thread(target=transfer_and_sum, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert "error" not in outcome and "sum" in outcome, \
        f"the running compute was not served after the rebuild: {outcome.get('error', 'still waiting after 60 s')}"
    assert outcome["seconds"] < 30, outcome
    bench.wait(timeout=120)
    balances(main)
    wait_ingested(repo, tenant, main)
    assert all(t["wal_receiver"] for t in timelines(repo, tenant))
