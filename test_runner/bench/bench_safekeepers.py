"""Commit latency and pgbench TPS: fjord with three safekeepers against plain PostgreSQL
with synchronous_commit=on, and against plain PostgreSQL with two synchronous standbys
(ANY 1 of 2: two copies on disk before a commit returns, as a majority of three
safekeepers gives), in one run.

Run through scripts/bench-safekeepers (which explains the flags). All servers: same build,
fsync=on, synchronous_commit=on, the same shared_buffers. The fjord compute's commits wait
for 2 of 3 safekeepers to make it durable (each writes a batch's WAL to its segment
and appends it to the journal in `wal.end` with one direct O_DSYNC write);
its own pg_wal is not fsynced (compute_ctl sets fsync=off with safekeepers: durability
comes from them, and a compute never restarts on its data directory).
Commit latency is pgbench with one client running a one-row INSERT; TPS is pgbench's
TPC-B-like script. Prints a table, writes JSON and a markdown section.

Two more rows take the storage device out, to tell the software's cost from the disk's:
plain PostgreSQL with fsync=off, and fjord with its safekeepers' data directories on tmpfs
(`/dev/shm`), where a write is durable at once and there is no device flush. Neither is a
setup anyone should run (a crash loses commits); they show what each side spends waiting
for and driving the one disk that, on a single machine, all of fjord's safekeepers share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.compute import Endpoint, Timeline  # noqa: E402
from fixtures.pageserver import Pageserver  # noqa: E402
from fixtures.paths import pg_bin_dir  # noqa: E402
from fixtures.pgbench import parse, pgbench  # noqa: E402
from fixtures.postgres import PgServer, free_port, standby, wait_until  # noqa: E402
from fixtures.safekeeper import Safekeeper  # noqa: E402


def run_suite(name: str, port: int, user: str, a, script: Path) -> dict:
    res = {}
    with_conn = ["-h", "127.0.0.1", "-p", str(port), "-U", user]
    subprocess.run([str(pg_bin_dir() / "psql"), *with_conn, "-d", "postgres", "-qc",
                    "CREATE TABLE IF NOT EXISTS commit_bench (x int)"], check=True, capture_output=True)
    pgbench(port, user, "-i", "-s", str(a.scale), "-q")
    out = pgbench(port, user, "-n", "-c", "1", "-T", str(a.duration), "-f", str(script))
    res["commit"] = parse(out)
    print(f"{name}: one-row INSERT, 1 client: {res['commit']}", flush=True)
    out = pgbench(port, user, "-n", "-c", str(a.clients), "-j", str(a.clients), "-T", str(a.duration))
    res["tpcb"] = parse(out)
    print(f"{name}: pgbench TPC-B-like, {a.clients} clients: {res['tpcb']}", flush=True)
    return res


def run_fjord(name: str, base: Path, sk_dir: Path, settings: dict, a, script: Path) -> dict:
    """`run_suite` on a new fjord endpoint, pageserver and three safekeepers whose data
    directories are under `sk_dir`."""
    with contextlib.ExitStack() as stop_at_exit:  # stops run in reverse: endpoint, safekeepers, pageserver
        ps = Pageserver(base, tls=a.tls).start()
        stop_at_exit.callback(ps.stop)
        sks = [Safekeeper(sk_dir, i, tls=a.tls).start() for i in (1, 2, 3)]
        for sk in sks:
            stop_at_exit.callback(sk.stop)
        tl = Timeline(base, ps)
        # compute_ctl turns local fsync off on a compute with safekeepers (its pg_wal is
        # not where durability comes from); the other settings are the same.
        ep = Endpoint(base, tl, settings={k: v for k, v in settings.items() if k != "fsync"}, safekeepers=sks).start()
        stop_at_exit.callback(ep.stop)
        return run_suite(name, ep.port, ep.user, a, script)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scale", type=int, default=5)
    p.add_argument("--duration", type=int, default=20)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--shared-buffers", default="128MB")
    p.add_argument("--json", required=True)
    p.add_argument("--markdown", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--flavor", required=True)
    # TLS on fjord's links (the default, as in a cluster `fjord init` makes) or off.
    p.add_argument("--no-tls", dest="tls", action="store_false")
    a = p.parse_args()

    settings = {"shared_buffers": a.shared_buffers, "synchronous_commit": "on", "fsync": "on", "max_connections": "50"}
    results = {}
    with tempfile.TemporaryDirectory(prefix="fjord-bench-sk-") as tmp:
        base = Path(tmp)
        script = base / "commit.sql"
        script.write_text("INSERT INTO commit_bench VALUES (1);\n")

        plain = PgServer(base, "plain", settings).initdb().start()
        try:
            results["plain"] = run_suite("plain", plain.port, plain.user, a, script)
        finally:
            plain.stop("fast")

        primary = PgServer(base, "primary", settings).initdb().start()
        standbys = []
        try:
            standbys = [standby(base, primary, n, settings) for n in ("s1", "s2")]
            primary.sql("ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (s1, s2)'")
            primary.sql("SELECT pg_reload_conf()")
            wait_until("both standbys to be synchronous candidates", lambda: primary.sql(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'quorum'")[0][0] == 2)
            results["plain_2_standbys"] = run_suite("plain + 2 sync standbys (ANY 1)", primary.port, primary.user, a, script)
        finally:
            for s in standbys:
                s.stop("immediate")
            primary.stop("fast")

        results["fjord"] = run_fjord("fjord (3 safekeepers)", base, base / "safekeepers", settings, a, script)

        unsafe = {**settings, "fsync": "off"}
        plain = PgServer(base, "plain-nofsync", unsafe).initdb().start()
        try:
            results["plain_no_fsync"] = run_suite("plain, fsync=off", plain.port, plain.user, a, script)
        finally:
            plain.stop("fast")
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            with tempfile.TemporaryDirectory(prefix="fjord-bench-sk-", dir="/dev/shm") as shm:
                results["fjord_tmpfs"] = run_fjord("fjord, safekeepers on tmpfs", base / "tmpfs", Path(shm), settings, a, script)
        else:
            print("no writable /dev/shm: the row with safekeepers on tmpfs is left out", flush=True)

    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "command": a.command, "flavor": a.flavor,
        "machine": f"{platform.machine()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores",
        "scale": a.scale, "duration_s": a.duration, "clients": a.clients, "shared_buffers": a.shared_buffers,
        **results,
    }
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    names = {"plain": "plain PostgreSQL, synchronous_commit=on",
             "plain_2_standbys": "plain PostgreSQL + 2 sync standbys (ANY 1)",
             "fjord": "fjord, 3 safekeepers (commit on 2)",
             "plain_no_fsync": "*no device flush:* plain PostgreSQL, fsync=off",
             "fjord_tmpfs": "*no device flush:* fjord, safekeepers on tmpfs"}
    lines = [
        f"Measured {result['date']} on {result['machine']}, PostgreSQL {a.flavor} flavor, all on one machine over "
        f"loopback, fsync=on, shared_buffers {a.shared_buffers}; commit latency = pgbench, 1 client, a one-row INSERT "
        f"per transaction; TPS = pgbench TPC-B-like at scale {a.scale}, {a.clients} clients; {a.duration} s per run. "
        f"Command: `{a.command}`.",
        "The last two rows are not setups to run (a crash loses commits): they take the disk out of both sides, to "
        "show what is the software's cost and what is the device's.",
        "",
        "| setup | commit latency ms | commits/s (1 client) | TPC-B TPS | TPC-B latency ms |",
        "|---|---|---|---|---|",
    ]
    for key, label in names.items():
        if key not in results:
            continue
        r = results[key]
        lines.append(f"| {label} | {r['commit']['latency_ms']:.3f} | {r['commit']['tps']:.0f} | "
                     f"{r['tpcb']['tps']:.0f} | {r['tpcb']['latency_ms']:.2f} |")
    Path(a.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
