"""Pageserver failover time: how long after the kill of a tenant's attached pageserver a
compute reads again, over repeated failovers, with the storage controller's default timings.

Run through scripts/bench-failover (which explains the flags). One cluster on this machine:
a plain PostgreSQL for the controller's database, one storage controller, two pageservers
joined to it sharing object storage in a directory, three safekeepers, and one compute
started with `compute_ctl --controller` and small caches (so that a scan reads its pages
from the pageserver). pgbench read-write runs against the compute throughout. Each round:

1. kill -9 the tenant's attached pageserver;
2. read one random pgbench_accounts row by its key (index and heap pages that the small
   caches almost never hold) until a read succeeds: the failover time is from the kill to
   that success (detection by the controller, the transaction that raises the generation,
   the secondary's attach and WAL catch-up, the compute's move). The same read's time on
   the healthy cluster is recorded before the first round, for comparison;
3. a full scan of pgbench_accounts right after that read: its time says how much of the
   tenant the new pageserver had on local disk (a warm secondary's copies) and how much
   it downloaded;
4. start the killed pageserver again (it joins as the tenant's new secondary) and wait for
   the placement to name it, and for it to hold warm copies of at least 90% of the bytes
   of the layers the tenant's newest index names (at most 120 s; the fraction reached is
   recorded), so that every round fails over to a warm secondary. The pageservers publish
   heatmaps every 5 s and warm every 2 s here (30 s and 10 s by default): the wait between
   rounds is shorter, the failover itself the same.

The run fails only when something breaks (a process of the cluster dies on its own, pgbench
fails, a scan errors after the failover, balances differ at the end); the times are
recorded, never judged. Prints a table, writes JSON and a markdown section.
"""

from __future__ import annotations

import argparse
import getpass
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.compute import Endpoint, Timeline  # noqa: E402
from fixtures.controller import Controller  # noqa: E402
from fixtures.pageserver import Pageserver  # noqa: E402
from fixtures.paths import pg_bin_dir  # noqa: E402
from fixtures.postgres import PgServer, wait_until  # noqa: E402
from fixtures.safekeeper import Safekeeper  # noqa: E402

SMALL = {"shared_buffers": "1MB", "fjord.file_cache_size": "1MB"}


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--heartbeat-interval-ms", type=int, default=500)
    ap.add_argument("--offline-after-ms", type=int, default=2000)
    ap.add_argument("--warm-wait-s", type=float, default=120)
    ap.add_argument("--cold", action="store_true", help="secondaries keep no warm copies (the comparison)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--markdown", required=True)
    ap.add_argument("--command", default="scripts/bench-failover")
    ap.add_argument("--flavor", default="unknown")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="fjord-bench-failover-"))
    started: list = []
    result: dict = {"command": args.command, "flavor": args.flavor, "host": platform.node(), "rounds": [],
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "timings": {"heartbeat_interval_ms": args.heartbeat_interval_ms, "offline_after_ms": args.offline_after_ms},
                    "secondaries": "cold" if args.cold else "warm"}
    bench = None
    try:
        db = PgServer(base, "controller-db").initdb().start()
        started.append(db)
        ctl = Controller(base, "a", db.conninfo, heartbeat_interval_ms=args.heartbeat_interval_ms,
                         offline_after_ms=args.offline_after_ms).start()
        started.append(ctl)
        remote = base / "remote"
        remote.mkdir()
        ps = {}
        for i in (1, 2):
            config = (f'remote_storage = "file://{remote}"\ncontroller_url = "https://{ctl.addr}"\nnode_id = {i}\n'
                      "heatmap_period_ms = 5000\nsecondary_download_period_ms = 2000\n"
                      + ("secondary_disk_budget_bytes = 0\n" if args.cold else ""))
            ps[i] = Pageserver(base / f"ps{i}", config=config).start()
            started.append(ps[i])
        sks = [Safekeeper(base / "safekeepers", i).start() for i in (1, 2, 3)]
        started.extend(sks)
        wait_until("both pageservers online", lambda: sorted(
            n["node_id"] for n in ctl.http("GET", "/v1/node") if n["availability"] == "online") == [1, 2], timeout_s=60)
        tenant = uuid.uuid4().hex
        where = ctl.http("POST", "/v1/tenant", {"tenant_id": tenant})
        attached = where["attached"]["node_id"]
        wait_until("the attach", lambda: any(t["tenant_id"] == tenant and t["mode"] == "attached"
                                             for t in ps[attached].http("GET", "/v1/location")["tenants"]), timeout_s=60)
        tl = Timeline(base, ps[attached], tenant=tenant, create_tenant=False)
        ep = Endpoint(base, tl, settings=SMALL, safekeepers=sks, controller=ctl).start()
        started.append(ep)
        pgbench = [str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", getpass.getuser()]
        subprocess.run([*pgbench, "-i", "-q", "-s", str(args.scale), "postgres"], check=True, capture_output=True, timeout=1800)
        bench = subprocess.Popen([*pgbench, "-c", str(args.clients), "-T", "100000", "-n", "postgres"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        accounts = 100_000 * args.scale

        def point_read(conn) -> None:
            conn.execute("SELECT abalance FROM pgbench_accounts WHERE aid = %s", (random.randint(1, accounts),)).fetchone()
        healthy = []
        with ep.connect() as conn:
            for _ in range(50):
                t0 = time.monotonic()
                point_read(conn)
                healthy.append(time.monotonic() - t0)
        result["healthy_point_read_ms"] = {"p50": round(percentile(healthy, 50) * 1000, 2), "p99": round(percentile(healthy, 99) * 1000, 2)}
        def index_bytes() -> int:
            """The bytes of the layers the tenant's newest index names."""
            newest = max((p for p in (remote / "tenants" / tenant / "timelines").glob("*/index_part.json-*") if "#" not in p.name),
                         key=lambda p: p.name)
            return sum(layer["size_bytes"] for layer in json.loads(newest.read_text())["index"]["layers"].values())

        def warm_fraction(node: int) -> float:
            held = {t["tenant_id"]: t for t in ps[node].http("GET", "/v1/location")["tenants"]}
            warm = (held.get(tenant, {}).get("warm") or {}).get("bytes", 0)
            return warm / max(1, index_bytes())

        for r in range(1, args.rounds + 1):
            time.sleep(3)
            where = ctl.http("GET", f"/v1/tenant/{tenant}")
            victim = where["attached"]["node_id"]
            secondary = (where.get("secondary") or {}).get("node_id")
            deadline = time.monotonic() + args.warm_wait_s
            while not args.cold and secondary is not None and warm_fraction(secondary) < 0.9 and time.monotonic() < deadline:
                time.sleep(1)
            warm = round(warm_fraction(secondary), 3) if secondary is not None else 0.0
            ps[victim].kill()
            killed = time.monotonic()
            while True:
                try:
                    with ep.connect(connect_timeout=60) as conn:
                        point_read(conn)
                    break
                except Exception:  # noqa: BLE001 - retried until the first success
                    time.sleep(0.02)
            took = time.monotonic() - killed
            t0 = time.monotonic()
            with ep.connect() as conn:
                conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone()
            scan = time.monotonic() - t0
            after = ctl.http("GET", f"/v1/tenant/{tenant}")
            result["rounds"].append({"round": r, "seconds": round(took, 3), "scan_seconds": round(scan, 3), "warm_fraction": warm,
                                     "from": victim, "to": after["attached"]["node_id"], "generation": after["generation"]})
            print(f"round {r}: pageserver {victim} killed ({warm:.0%} of the tenant warm on the secondary); reads again after "
                  f"{took:.2f} s on pageserver {after['attached']['node_id']} (generation {after['generation']}); "
                  f"a full scan then took {scan:.2f} s", flush=True)
            if bench.poll() is not None:
                raise RuntimeError(f"pgbench ended during round {r}: {bench.communicate()}")
            ps[victim].start()
            wait_until("the killed pageserver to be the secondary again",
                       lambda: (ctl.http("GET", f"/v1/tenant/{tenant}").get("secondary") or {}).get("node_id") == victim, timeout_s=120)
        bench.terminate()
        out, err = bench.communicate(timeout=120)
        sums = ep.sql("SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches),"
                      " (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT coalesce(sum(delta), 0) FROM pgbench_history)")[0]
        if len(set(sums)) != 1:
            raise RuntimeError(f"balances differ after the failovers: {sums}")
        times = [x["seconds"] for x in result["rounds"]]
        scans = [x["scan_seconds"] for x in result["rounds"]]
        result["summary"] = {"rounds": len(times), "p50_s": percentile(times, 50), "p99_s": percentile(times, 99),
                             "min_s": min(times), "max_s": max(times), "mean_s": round(statistics.mean(times), 3),
                             "scan_p50_s": percentile(scans, 50), "scan_p99_s": percentile(scans, 99),
                             "warm_min": min(x["warm_fraction"] for x in result["rounds"])}
    except BaseException as e:
        result["failure"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        if bench is not None and bench.poll() is None:
            bench.kill()
        for s in reversed(started):
            try:
                s.kill() if hasattr(s, "kill") else s.stop()
            except Exception:  # noqa: BLE001 - best effort at the end
                pass
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    s = result["summary"]
    table = "\n".join(f"| {x['round']} | {x['from']} → {x['to']} | {x['generation']} | {x['warm_fraction']:.0%} | {x['seconds']:.2f} | "
                      f"{x['scan_seconds']:.2f} |" for x in result["rounds"])
    Path(args.markdown).write_text(
        f"{result['date']}, `{args.command}`, PostgreSQL {args.flavor}, heartbeat every {args.heartbeat_interval_ms} ms, "
        f"offline after {args.offline_after_ms} ms, pgbench scale {args.scale} with {args.clients} clients throughout.\n\n"
        f"Failover time (kill -9 of the attached pageserver to the first successful read of a random "
        f"`pgbench_accounts` row, whose pages the 1 MB caches almost never hold), {s['rounds']} rounds: "
        f"**p50 {s['p50_s']:.2f} s, p99 {s['p99_s']:.2f} s** (min {s['min_s']:.2f}, max {s['max_s']:.2f}). The same read on "
        f"the healthy cluster: p50 {result['healthy_point_read_ms']['p50']} ms, p99 {result['healthy_point_read_ms']['p99']} ms. "
        f"A full scan of `pgbench_accounts` right after that read: p50 {s['scan_p50_s']:.2f} s, p99 {s['scan_p99_s']:.2f} s, "
        + ("with cold secondaries (no warm copies: `--cold`).\n\n" if args.cold else
           f"with the secondary holding warm copies of at least {s['warm_min']:.0%} of the tenant's layer bytes at each kill.\n\n")
        + f"| round | pageserver | generation | warm | seconds | full scan, s |\n|---|---|---|---|---|---|\n{table}\n")
    print(f"failover: p50 {s['p50_s']:.2f} s, p99 {s['p99_s']:.2f} s over {s['rounds']} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
