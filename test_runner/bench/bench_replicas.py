"""Read replica lag and read throughput, on a cluster started by the `fjord` CLI.

Run through scripts/bench-replicas (which explains the flags). A primary and one read
replica on one branch (pgbench data at the given scale), three safekeepers, one pageserver,
all on this machine:

- **lag**: four writers commit one-row inserts on the primary, together at a fixed rate,
  each numbering its rows and noting the moment each COMMIT returned; a poller on the
  replica reads each writer's newest visible row every 0.2 ms: lag = the moment a row
  became visible on the replica minus the moment its COMMIT returned. Measured at `--rate` commits/s alone, then with pgbench
  read-write (`-c 4`) running on the primary at the same time (the highest write rate the
  machine sustains).
- **read throughput**: pgbench select-only on the primary, then on the replica, same
  clients and duration.

The same again on plain PostgreSQL with a streaming standby (same build and settings, local
fsync on): the bar.

Prints a table, writes JSON and a markdown section.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from fixtures.cli import FjordRepo  # noqa: E402
from fixtures.pgbench import parse, pgbench  # noqa: E402
from fixtures.postgres import PgServer, standby  # noqa: E402


def lsn_int(lsn: str) -> int:
    hi, lo = str(lsn).split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def port_of(connstr: str) -> int:
    return int(connstr.rsplit(":", 1)[1].split("/")[0])


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def measure_lag(primary: str, replica: str, rate: float, seconds: float, writers: int = 4) -> dict:
    """Commits at `rate` per second in all for `seconds`, from `writers` connections (one
    connection cannot reach 1,000 commits/s when a commit takes over a millisecond); returns
    percentiles of the time from a COMMIT returning on the primary to its row being visible
    to a query on the replica, in ms. Each writer numbers its rows 0, 1, 2 ...; it commits
    them one after the other, so its rows become visible in that order."""
    pending: list[collections.deque] = [collections.deque() for _ in range(writers)]
    lags: list[float] = []
    lock = threading.Lock()
    done = threading.Event()
    counts = [0] * writers

    def poll() -> None:
        with psycopg.connect(replica, autocommit=True) as r:
            while not (done.is_set() and not any(pending)):
                # Visibility itself: each writer's newest row a query on the replica sees.
                rows = r.execute("SELECT w, coalesce((SELECT max(seq) FROM lag_probe WHERE writer = w), -1) "
                                 "FROM generate_series(0, %s) w", (writers - 1,)).fetchall()
                now = time.monotonic()
                with lock:
                    for w, visible in rows:
                        q = pending[w]
                        while q and q[0][0] <= visible:
                            lags.append((now - q.popleft()[1]) * 1000)
                time.sleep(0.0002)

    def write(w: int, start: float) -> None:
        interval = writers / rate
        with psycopg.connect(primary, autocommit=True) as p:
            n = 0
            while time.monotonic() - start < seconds:
                delay = start + (n + w / writers) * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                p.execute("INSERT INTO lag_probe VALUES (%s, %s)", (w, n))
                committed = time.monotonic()
                with lock:
                    pending[w].append((n, committed))
                n += 1
        counts[w] = n

    with psycopg.connect(primary, autocommit=True) as p:
        p.execute("DROP TABLE IF EXISTS lag_probe")
        p.execute("CREATE TABLE lag_probe (writer int, seq bigint, at timestamptz DEFAULT now(), PRIMARY KEY (writer, seq))")
        # The replica must know the table before it is polled.
        flushed = lsn_int(p.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0])
    with psycopg.connect(replica, autocommit=True) as r:
        while lsn_int(r.execute("SELECT pg_last_wal_replay_lsn()").fetchone()[0]) < flushed:
            time.sleep(0.01)
    poller = threading.Thread(target=poll)
    poller.start()
    start = time.monotonic()
    threads = [threading.Thread(target=write, args=(w, start)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    achieved = sum(counts) / (time.monotonic() - start)
    done.set()
    poller.join(timeout=120)
    return {
        "commits": sum(counts),
        "commits_per_s": round(achieved, 1),
        "lag_p50_ms": round(percentile(lags, 50), 2),
        "lag_p99_ms": round(percentile(lags, 99), 2),
        "lag_max_ms": round(max(lags), 2),
    }


def run_suite(name: str, primary: str, replica: str, pport: int, rport: int, user: str, a) -> dict:
    """Lag alone and beside pgbench read-write, then select-only on primary and replica."""
    res: dict = {}
    res["lag_alone"] = measure_lag(primary, replica, a.rate, a.duration)
    print(f"{name}: lag at {a.rate:.0f} commits/s: {res['lag_alone']}", flush=True)
    bench_out: dict = {}

    def background() -> None:
        bench_out["rw"] = parse(pgbench(pport, user, "-n", "-c", str(a.clients), "-j", str(a.clients), "-T", str(a.duration + 2)))

    t = threading.Thread(target=background)
    t.start()
    time.sleep(1)
    res["lag_under_pgbench"] = measure_lag(primary, replica, a.rate, a.duration)
    t.join()
    res["lag_under_pgbench"]["pgbench_rw_tps"] = bench_out["rw"]["tps"]
    print(f"{name}: lag at {a.rate:.0f} commits/s beside pgbench read-write: {res['lag_under_pgbench']}", flush=True)
    for which, port in (("primary", pport), ("replica", rport)):
        out = pgbench(port, user, "-n", "-S", "-c", str(a.clients), "-j", str(a.clients), "-T", str(a.duration))
        res[f"select_only_{which}"] = parse(out)
        print(f"{name}: select-only on the {which}: {res[f'select_only_{which}']}", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--duration", type=int, default=20)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rate", type=float, default=1000)
    p.add_argument("--shared-buffers", default="16MB")
    p.add_argument("--json", required=True)
    p.add_argument("--markdown", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--flavor", required=True)
    a = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="fjord-bench-replicas-") as tmp:
        repo = FjordRepo(Path(tmp) / "repo").init()
        try:
            repo.run("start")
            repo.run("tenant", "create")
            sb = f"shared_buffers={a.shared_buffers}"
            primary = repo.run("endpoint", "start", "main", "-c", sb).stdout.strip()
            pport = port_of(primary)
            user = primary.split("//")[1].split("@")[0]
            pgbench(pport, user, "-i", "-s", str(a.scale), "-q")
            t0 = time.monotonic()
            replica = repo.run("endpoint", "start", "replica", "--replica", "-c", sb).stdout.strip()
            start_s = round(time.monotonic() - t0, 2)
            rport = port_of(replica)
            print(f"replica started in {start_s} s", flush=True)
            res: dict = {"replica_start_s": start_s}

            res.update(run_suite("fjord", primary, replica, pport, rport, user, a))
        finally:
            repo.cleanup()

        # The bar: plain PostgreSQL and a streaming standby of it, same build and settings
        # (local fsync on, as a primary without safekeepers needs for durability).
        settings = {"shared_buffers": a.shared_buffers, "synchronous_commit": "on", "fsync": "on",
                    "hot_standby_feedback": "on", "wal_receiver_status_interval": "1s"}
        base = Path(tmp) / "plain"
        plain = PgServer(base, "primary", settings).initdb().start()
        plain_standby = None
        try:
            pgbench(plain.port, plain.user, "-i", "-s", str(a.scale), "-q")
            plain_standby = standby(base, plain, "standby", settings)
            connstr = "host=127.0.0.1 port={} user={} dbname=postgres"
            res["plain"] = run_suite("plain PostgreSQL", connstr.format(plain.port, plain.user),
                                     connstr.format(plain_standby.port, plain.user), plain.port, plain_standby.port, plain.user, a)
        finally:
            if plain_standby:
                plain_standby.stop("immediate")
            plain.stop("fast")

    ratio = res["select_only_replica"]["tps"] / res["select_only_primary"]["tps"]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": a.command,
        "flavor": a.flavor,
        "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores",
        "settings": {"scale": a.scale, "duration_s": a.duration, "clients": a.clients, "rate": a.rate, "shared_buffers": a.shared_buffers},
        **res,
        "replica_select_only_ratio": round(ratio, 2),
    }
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    pl = res["plain"]
    rows = []
    for label, r in (("fjord", res), ("plain PostgreSQL + streaming standby", pl)):
        la, lu = r["lag_alone"], r["lag_under_pgbench"]
        so_p, so_r = r["select_only_primary"], r["select_only_replica"]
        rows.append(f"| {label} | {la['commits_per_s']}/s: {la['lag_p50_ms']} / {la['lag_p99_ms']} / {la['lag_max_ms']} ms "
                    f"| {lu['commits_per_s']}/s beside {lu['pgbench_rw_tps']:.0f} tps: {lu['lag_p50_ms']} / {lu['lag_p99_ms']} / {lu['lag_max_ms']} ms "
                    f"| {so_p['tps']:.0f} / {so_r['tps']:.0f} ({so_r['tps'] / so_p['tps']:.2f}x) |")
    table = "\n".join(rows)
    md = f"""Measured {result['date']} with `{a.command}` (PostgreSQL {a.flavor} build; {result['machine']}; scale {a.scale},
shared_buffers {a.shared_buffers} on every server, {a.duration} s per run, {a.clients} pgbench clients; fjord: one
primary, one replica, three safekeepers and the pageserver on this machine; plain: a primary with local fsync and a
streaming standby, same build). Lag is from COMMIT returning on the primary (four writer connections, one-row
inserts) to the row being visible to a query on the replica (polled every 0.2 ms), p50 / p99 / max. fjord's replica started in {start_s} s.

| | lag alone | lag beside pgbench read-write | select-only TPS: primary / replica |
|---|---|---|---|
{table}
"""
    Path(a.markdown).write_text(md)
    print(md)


if __name__ == "__main__":
    main()
