"""Network partitions between real processes: a compute, a pageserver and three
safekeepers, each on its own host (a network namespace with its own address, 10.77.0.N,
`fixtures/netns.py`), with links cut, made lossy or slow in the switch between them.

- A compute cut from one safekeeper keeps committing: a majority is two of three. After
  the cut heals the safekeeper catches up, and holds the WAL: a fresh compute that cannot
  reach another safekeeper finds every acknowledged row.
- A compute cut from two safekeepers stops acknowledging commits: a commit whose client
  gives up waiting never reports success (the session ends, as the WAL proposer's
  documentation in extension/README.md says). Once healed, commits resume and no
  acknowledged row is lost.
- A pageserver cut from the safekeeper it streams from moves to another one (its lag probe
  finds a source with more WAL) and keeps ingesting: new rows are read back through a
  compute whose caches are too small to hold them.
- Lossy and slow links to the compute change its commit latency, not its results: the same
  transactions leave the same balances. The latencies are printed, never asserted.

A cut drops packets silently in the switch, both ways, the way a real partition does:
nobody gets an error, connections stall, and they resume when the cut heals.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

import psycopg
import pytest

from fixtures.compute import Endpoint, Timeline, kill_all
from fixtures.netns import Host, Network
from fixtures.pageserver import Pageserver
from fixtures.pagestream import lsn_int
from fixtures.postgres import wait_until
from fixtures.safekeeper import Safekeeper


@dataclass
class Cluster:
    net: Network
    compute_host: Host
    pageserver_host: Host
    sk_hosts: list[Host]
    ps: Pageserver
    sks: list[Safekeeper]
    tl: Timeline

    def endpoint(self, tmp_path, name: str = "ep", settings: dict[str, str] | None = None) -> Endpoint:
        ep = Endpoint(tmp_path, self.tl, name, settings, safekeepers=self.sks, **self.compute_host.compute_kw()).start()
        ep.sql("CREATE EXTENSION IF NOT EXISTS fjord")
        return ep

    def sk_lsn(self, sk: Safekeeper, field: str = "flush_lsn") -> int:
        return lsn_int(sk.timeline(self.tl.tenant, self.tl.timeline)[field])

    def wal_receiver(self) -> dict:
        return self.tl.status()["wal_receiver"]

    def check_services_alive(self) -> None:
        """No partition may crash a service: each is still running and never panicked."""
        assert self.ps.proc.poll() is None, f"the pageserver exited with {self.ps.proc.returncode}"
        assert "panicked" not in self.ps.log_text(), "the pageserver panicked"
        for sk in self.sks:
            assert sk.running(), f"safekeeper {sk.id} exited:\n{sk.log_tail()}"
            assert "panicked" not in sk.log_text(), f"safekeeper {sk.id} panicked"


@pytest.fixture
def cluster(tmp_path):
    """Five hosts on one switch (compute, pageserver, sk1..sk3), the services running on
    theirs, and a timeline created on the pageserver and the safekeepers."""
    net = Network(tmp_path).start()
    ps = None
    sks: list[Safekeeper] = []
    try:
        compute_host, pageserver_host = net.host("compute"), net.host("pageserver")
        sk_hosts = [net.host(f"sk{i}") for i in (1, 2, 3)]
        ps = Pageserver(tmp_path, **pageserver_host.service_kw()).start()
        for i, h in enumerate(sk_hosts, start=1):
            sks.append(Safekeeper(tmp_path / "safekeepers", i, **h.service_kw()).start())
        yield Cluster(net, compute_host, pageserver_host, sk_hosts, ps, sks, Timeline(tmp_path, ps))
    finally:
        # Every process before the namespaces' holders (conftest would kill the computes
        # only after this).
        kill_all()
        for sk in sks:
            sk.kill()
        if ps is not None:
            ps.kill()
        net.close()


class Ledger(threading.Thread):
    """Inserts ids, one autocommit transaction each, and remembers which commits were
    acknowledged. With `commit_timeout_s`, a commit not acknowledged by then is cancelled,
    as a client that gives up would; an id whose statement raised is not acknowledged, and
    the ledger reconnects."""

    def __init__(self, ep: Endpoint, commit_timeout_s: float | None = None):
        super().__init__(daemon=True)
        self.ep = ep
        self.commit_timeout_s = commit_timeout_s
        self.acked: list[int] = []
        self.failed: list[tuple[int, BaseException]] = []
        self.stopping = threading.Event()

    def run(self):
        next_id = 1
        conn = None
        while not self.stopping.is_set():
            try:
                if conn is None:
                    conn = self.ep.connect(connect_timeout=10)
                timer = threading.Timer(self.commit_timeout_s, conn.cancel) if self.commit_timeout_s else None
                if timer:
                    timer.start()
                try:
                    conn.execute("INSERT INTO ledger VALUES (%s)", (next_id,))
                finally:
                    if timer:
                        timer.cancel()
                self.acked.append(next_id)
            except psycopg.Error as e:
                self.failed.append((next_id, e))
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.1)
            next_id += 1
        if conn is not None:
            conn.close()

    def stop(self) -> list[int]:
        self.stopping.set()
        self.join(timeout=120)
        assert not self.is_alive(), "the ledger thread hangs"
        return self.acked


def check_ledger(ep: Endpoint, acked: list[int]) -> set[int]:
    """Every acknowledged id is in the table; returns the ids there."""
    present = {r[0] for r in ep.sql("SELECT id FROM ledger")}
    lost = sorted(set(acked) - present)
    assert not lost, f"{len(lost)} acknowledged commits lost, e.g. {lost[:10]}"
    return present


# Expected: the cut the test makes.
@pytest.mark.allowed_errors(r"walproposer.*could not connect to \S+: connection timed out")
def test_compute_cut_from_one_safekeeper_keeps_committing(tmp_path, cluster):
    c = cluster
    sk1, sk2, sk3 = c.sks
    ep = c.endpoint(tmp_path)
    ep.sql("CREATE TABLE ledger (id int PRIMARY KEY)")
    ledger = Ledger(ep)
    ledger.start()
    wait_until("the first commits", lambda: len(ledger.acked) >= 20)

    c.net.cut(c.compute_host, c.sk_hosts[0])
    at_cut = len(ledger.acked)
    wait_until("commits acknowledged with sk1 cut off", lambda: len(ledger.acked) >= at_cut + 200, timeout_s=60)
    # sk2 and sk3 acknowledged them: sk1, cut off, stays behind both.
    assert c.sk_lsn(sk1) < c.sk_lsn(sk2) and c.sk_lsn(sk1) < c.sk_lsn(sk3), \
        f"sk1 is cut off but has WAL up to {c.sk_lsn(sk1):X}, sk2 {c.sk_lsn(sk2):X}, sk3 {c.sk_lsn(sk3):X}"
    assert c.net.dropped_by_cuts() > 0, "the cut dropped no packets"

    c.net.heal(c.compute_host, c.sk_hosts[0])
    healed_at = len(ledger.acked)
    wait_until("commits after the heal", lambda: len(ledger.acked) >= healed_at + 20)
    acked = ledger.stop()
    assert not ledger.failed, f"commits failed with one safekeeper cut off: {ledger.failed[:5]}"
    wait_until("sk1 to catch up", lambda: c.sk_lsn(sk1) == c.sk_lsn(sk2) == c.sk_lsn(sk3), timeout_s=60)
    check_ledger(ep, acked)

    # sk1 really holds the WAL: with sk2 cut off from the compute's host, a fresh compute
    # syncs with sk1 and sk3 and finds every acknowledged row.
    ep.stop()
    c.net.cut(c.compute_host, c.sk_hosts[1])
    fresh = c.endpoint(tmp_path, "fresh")
    check_ledger(fresh, acked)
    fresh.sql("INSERT INTO ledger VALUES (-1)")
    print(f"one safekeeper cut off: {len(acked)} commits acknowledged, {len(acked) - at_cut} during the cut")
    c.check_services_alive()


# Expected: the waits the test cancels while cut off.
@pytest.mark.allowed_errors(r"WARNING:  canceling the wait for (the safekeepers|synchronous replication) and terminating")
def test_compute_cut_from_two_safekeepers_stops_acknowledging(tmp_path, cluster):
    c = cluster
    ep = c.endpoint(tmp_path)
    ep.sql("CREATE TABLE ledger (id int PRIMARY KEY)")
    # A client that waits at most a second for a commit, then cancels it.
    ledger = Ledger(ep, commit_timeout_s=1.0)
    ledger.start()
    wait_until("the first commits", lambda: len(ledger.acked) >= 20)

    c.net.cut(c.compute_host, c.sk_hosts[0])
    c.net.cut(c.compute_host, c.sk_hosts[1])
    # Once a commit failed after the cut, no later one can be acknowledged: its WAL,
    # written after the cut, would have to reach sk1 or sk2. (A commit that failed before,
    # on a slow machine, proves nothing.)
    failed_before_cut = len(ledger.failed)
    wait_until("a commit to time out", lambda: len(ledger.failed) > failed_before_cut, timeout_s=60)
    stalled_at = len(ledger.acked)
    time.sleep(4)
    assert len(ledger.acked) == stalled_at, \
        f"{len(ledger.acked) - stalled_at} commits acknowledged with only one safekeeper reachable"
    # What the client saw: the connection ended, never success.
    for _, e in ledger.failed:
        assert isinstance(e, psycopg.OperationalError), f"a cancelled commit raised {e!r}"
    wait_until("the cancel's warning in the compute's log",
               lambda: "canceling the wait for the safekeepers and terminating the connection" in ep.pg_log_text())
    failed_during_cut = [i for i, _ in ledger.failed[failed_before_cut:]]

    c.net.heal(c.compute_host, c.sk_hosts[0])
    c.net.heal(c.compute_host, c.sk_hosts[1])
    wait_until("commits to be acknowledged again", lambda: len(ledger.acked) >= stalled_at + 20, timeout_s=120)
    acked = ledger.stop()
    present = check_ledger(ep, acked)
    assert ep.proc.poll() is None, "the compute stopped"
    unknown_kept = sorted(set(failed_during_cut) & present)
    print(f"two safekeepers cut off: {stalled_at} acknowledged before, {len(failed_during_cut)} commits cancelled "
          f"during the cut ({len(unknown_kept)} of them, with an unknown outcome, are there after the heal), "
          f"{len(acked)} acknowledged in all")
    c.check_services_alive()


def test_pageserver_cut_from_its_safekeeper_fails_over(tmp_path, cluster):
    c = cluster
    # Too small caches to hold the table: its pages are read from the pageserver.
    ep = c.endpoint(tmp_path, settings={"shared_buffers": "1MB", "fjord.file_cache_size": "0"})
    ep.sql("CREATE TABLE t (batch int, pad text)")
    ep.sql("INSERT INTO t SELECT 0, repeat('x', 500) FROM generate_series(1, 2000)")

    def streaming():
        wr = c.wal_receiver()
        return wr if wr["connected"] and wr["state"] == "streaming" and wr["current_source_address"] else None
    before = wait_until("the pageserver to stream from a safekeeper", streaming)
    source = before["current_source_address"]
    source_host = next(h for sk, h in zip(c.sks, c.sk_hosts) if sk.addr == source)
    c.net.cut(c.pageserver_host, source_host)

    batches = [0]

    def moved():
        ep.sql("INSERT INTO t SELECT %s, repeat('y', 500) FROM generate_series(1, 100)", batches[-1] + 1)
        batches.append(batches[-1] + 1)
        wr = c.wal_receiver()
        return wr if wr["current_source_address"] not in (None, source) else None
    after = wait_until(f"the pageserver to leave {source}", moved, timeout_s=60, interval_s=0.2)
    assert after["lag_switches"] > before["lag_switches"], after
    assert f"switching WAL source from {source}" in c.ps.log_text()

    # Still cut off from `source`, it ingests everything the compute commits.
    ep.sql("INSERT INTO t SELECT -1, repeat('z', 500) FROM generate_series(1, 100)")
    flushed = lsn_int(ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])
    wait_until("the pageserver to ingest the compute's WAL",
               lambda: lsn_int(c.tl.status()["last_record_lsn"]) >= flushed, timeout_s=60)
    assert c.wal_receiver()["current_source_address"] != source
    requests_before = ep.sql("SELECT pageserver_requests FROM fjord.storage_manager()")[0][0]
    rows = dict(ep.sql("SELECT batch, count(*) FROM t GROUP BY batch"))
    assert rows == {0: 2000, -1: 100, **{b: 100 for b in batches[1:]}}, rows
    requests = ep.sql("SELECT pageserver_requests FROM fjord.storage_manager()")[0][0] - requests_before
    assert requests > 0, "the scan read nothing from the pageserver"
    print(f"pageserver cut from {source}: moved to {after['current_source_address']} after {len(batches) - 1} "
          f"batches; the scan made {requests} page requests")
    c.net.heal(c.pageserver_host, source_host)
    c.check_services_alive()


ACCOUNTS = 20
START_BALANCE = 1000
TRANSFERS = 100


def transfers(conn: psycopg.Connection, table: str) -> list[float]:
    """TRANSFERS transfers between ACCOUNTS accounts, the same ones every time (a fixed
    seed), one transaction each; returns each commit's latency in seconds."""
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, balance bigint NOT NULL)")
    conn.execute(f"INSERT INTO {table} SELECT g, {START_BALANCE} FROM generate_series(1, {ACCOUNTS}) g")
    rng = random.Random(14)
    latencies = []
    for _ in range(TRANSFERS):
        a, b = rng.sample(range(1, ACCOUNTS + 1), 2)
        amount = rng.randint(1, 50)
        started = time.monotonic()
        with conn.transaction():
            conn.execute(f"UPDATE {table} SET balance = balance - %s WHERE id = %s", (amount, a))
            conn.execute(f"UPDATE {table} SET balance = balance + %s WHERE id = %s", (amount, b))
        latencies.append(time.monotonic() - started)
    return latencies


def expected_balances() -> list[tuple[int, int]]:
    balances = {i: START_BALANCE for i in range(1, ACCOUNTS + 1)}
    rng = random.Random(14)
    for _ in range(TRANSFERS):
        a, b = rng.sample(range(1, ACCOUNTS + 1), 2)
        amount = rng.randint(1, 50)
        balances[a] -= amount
        balances[b] += amount
    return sorted(balances.items())


def test_slow_and_lossy_links_change_latency_not_results(tmp_path, cluster):
    c = cluster
    ep = c.endpoint(tmp_path)
    conn = ep.connect()
    links = {
        "clean": lambda: None,
        # The switch drops a tenth of the compute's packets, each way.
        "lossy": lambda: c.net.set_loss(c.compute_host, 10),
        # 256 kbit/s each way between the compute and the switch: every commit's WAL
        # crosses it three times (once per safekeeper).
        "slow": lambda: c.net.set_rate(c.compute_host, 256),
    }
    for name, impair in links.items():
        c.net.heal_all()
        impair()
        latencies = sorted(transfers(conn, f"accounts_{name}"))
        balances = ep.sql(f"SELECT id, balance FROM accounts_{name} ORDER BY id")
        assert balances == expected_balances(), f"the {name} link changed the balances"
        assert sum(b for _, b in balances) == ACCOUNTS * START_BALANCE
        dropped, held_back = c.net.dropped_by_loss(), c.net.rate_limited(c.compute_host)
        # The impairment was real.
        if name == "lossy":
            assert dropped > 0, "the lossy link dropped no packets"
        if name == "slow":
            assert held_back > 0, "the rate limit never held a packet back"
        print(f"{name} link: commit latency p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
              f"p99 {latencies[int(len(latencies) * 0.99) - 1] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms; "
              f"{dropped} packets dropped, {held_back} held back by the rate limit")
    c.net.heal_all()
    # Every safekeeper holds the same WAL in the end.
    wait_until("the safekeepers to agree",
               lambda: len({c.sk_lsn(sk) for sk in c.sks}) == 1 and c.sk_lsn(c.sks[0]) > 0, timeout_s=60)
    conn.close()
    c.check_services_alive()
