"""pgbench on a fjord compute against plain PostgreSQL of the same build, in one run.

Run through scripts/bench-compute (which explains the flags). Both servers get the same
settings (shared_buffers, synchronous_commit=on; plain PostgreSQL with fsync=on); the
compute's permanent relations live on a pageserver on the same machine, its WAL goes to
three safekeepers (each commit waits for two of them to fsync it), as `fjord init` sets up,
and its local file cache has the default size. After the runs the endpoint is restarted and
select-only runs again with a progress line per second: a warm cache from the first second.
Prints a table, writes JSON and a markdown section.
"""

from __future__ import annotations

import argparse
import json
import re
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
from fixtures.postgres import PgServer  # noqa: E402
from fixtures.safekeeper import Safekeeper  # noqa: E402


def run_suite(name: str, port: int, user: str, a) -> dict:
    res = {}
    t0 = time.monotonic()
    pgbench(port, user, "-i", "-s", str(a.scale), "-q")
    res["init_s"] = round(time.monotonic() - t0, 1)
    print(f"{name}: pgbench -i -s {a.scale} took {res['init_s']} s", flush=True)
    for mode, extra in (("read-write", []), ("select-only", ["-S"])):
        out = pgbench(port, user, "-n", "-c", str(a.clients), "-j", str(a.clients), "-T", str(a.duration), *extra)
        res[mode] = parse(out)
        print(f"{name}: {mode}: {res[mode]}", flush=True)
    return res


def status(ep: Endpoint, function: str) -> dict:
    with ep.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS fjord")
        cur = conn.execute(f"SELECT * FROM fjord.{function}()")
        return dict(zip([d.name for d in cur.description], cur.fetchone()))


def after_restart(ep: Endpoint, a) -> dict:
    """Restarts the endpoint and runs select-only for 10 s, one progress line per second."""
    ep.stop()
    t0 = time.monotonic()
    ep.start()
    start_s = round(time.monotonic() - t0, 2)
    r = subprocess.run([str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user, "-n", "-S",
                        "-c", str(a.clients), "-j", str(a.clients), "-T", "10", "-P", "1", "postgres"],
                       capture_output=True, text=True, check=True)
    out = r.stdout
    # pgbench prints its progress lines on stderr.
    per_second = [float(x) for x in re.findall(r"progress: [0-9.]+ s, ([0-9.]+) tps", r.stderr)]
    lfc = status(ep, "file_cache_status")
    return {"restart_s": start_s, "tps_per_second": per_second, "restored_pages": lfc["restored"], **parse(out)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--duration", type=int, default=30)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--shared-buffers", default="16MB")
    p.add_argument("--json", required=True)
    p.add_argument("--markdown", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--flavor", required=True)
    a = p.parse_args()

    settings = {"shared_buffers": a.shared_buffers, "synchronous_commit": "on", "fsync": "on", "max_connections": "50"}
    with tempfile.TemporaryDirectory(prefix="fjord-bench-") as tmp:
        base = Path(tmp)
        plain = PgServer(base, "plain", settings).initdb().start()
        try:
            plain_res = run_suite("plain", plain.port, plain.user, a)
        finally:
            plain.stop("fast")
        ps = Pageserver(base).start()
        sks = [Safekeeper(base / "safekeepers", i).start() for i in (1, 2, 3)]
        ep = None
        try:
            tl = Timeline(base, ps)
            ep = Endpoint(base, tl, settings={k: v for k, v in settings.items() if k != "fsync"}, safekeepers=sks).start()
            fjord_res = run_suite("fjord", ep.port, ep.user, a)
            smgr, lfc = status(ep, "storage_manager"), status(ep, "file_cache_status")
            restart = after_restart(ep, a)
            print(f"fjord: select-only after a restart: {restart}", flush=True)
        finally:
            if ep:
                ep.stop()
            for sk in sks:
                sk.stop()
            ps.stop()

    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "command": a.command, "flavor": a.flavor,
        "machine": f"{platform.machine()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores",
        "scale": a.scale, "duration_s": a.duration, "clients": a.clients, "shared_buffers": a.shared_buffers,
        "plain": plain_res, "fjord": fjord_res, "fjord_storage_manager": smgr, "fjord_file_cache": lfc,
        "fjord_after_restart": restart,
    }
    Path(a.json).write_text(json.dumps(result, indent=2, default=str) + "\n")

    def ratio(mode: str, key: str):
        f, b = fjord_res[mode][key], plain_res[mode][key]
        return f"{f / b:.2f}" if f and b else "n/a"

    lines = [
        f"Measured {result['date']} on {result['machine']}, PostgreSQL {a.flavor} flavor, "
        f"pgbench scale {a.scale} (~{a.scale * 15} MB), {a.clients} clients, {a.duration} s per run, "
        f"shared_buffers {a.shared_buffers} on both. Command: `{a.command}`.",
        "",
        "| workload | plain TPS | fjord TPS | fjord/plain TPS | plain latency ms | fjord latency ms |",
        "|---|---|---|---|---|---|",
    ]
    for mode in ("read-write", "select-only"):
        lines.append(f"| {mode} | {plain_res[mode]['tps']:.0f} | {fjord_res[mode]['tps']:.0f} | {ratio(mode, 'tps')} | "
                     f"{plain_res[mode]['latency_ms']:.2f} | {fjord_res[mode]['latency_ms']:.2f} |")
    lines += ["", f"`pgbench -i`: plain {plain_res['init_s']} s, fjord {fjord_res['init_s']} s. "
              f"Page service requests during the fjord run: {smgr.get('remote_requests')}, "
              f"full-page images written at eviction: {smgr.get('eviction_images')}. "
              f"Local file cache: {lfc['hits']} hits, {lfc['misses']} misses, {lfc['used_pages']} pages used of "
              f"{lfc['size_bytes'] // 8192}.",
              "",
              f"Select-only right after a restart of the endpoint (stopped, started again in {restart['restart_s']} s, "
              f"{restart['restored_pages']} cached pages reused): {restart['tps']:.0f} TPS over 10 s; per second: "
              + ", ".join(f"{x:.0f}" for x in restart["tps_per_second"]) + "."]
    Path(a.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
