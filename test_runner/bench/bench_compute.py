"""pgbench on a fjord compute against plain PostgreSQL of the same build, in one run.

Run through scripts/bench-compute (which explains the flags). Both servers get the same
settings (shared_buffers, synchronous_commit=on; plain PostgreSQL with fsync=on); the
compute's permanent relations live on a pageserver on the same machine, its WAL goes to
three safekeepers (each commit waits for two of them to fsync it), as `fjord init` sets up,
and its local file cache has the default size. After the runs the endpoint is restarted and
select-only runs again with a progress line per second: a warm cache from the first second.
Each timed run starts from a settled system: plain PostgreSQL after a CHECKPOINT, fjord after
a CHECKPOINT, its pageserver's ingest of all WAL so far and compaction passes until none
leaves work for later (what its background jobs would otherwise do during the next run), so
that a run is not charged for the deferred work of the one before on either side. The time
each settle took is recorded.
With `--tls both`, the fjord side runs twice: everything above with TLS on every link (the
default), then, on a second cluster with TLS off, pgbench -i, read-write and select-only
again, each after the same settling; the TPS of both and their ratio are reported
(`--tls on` or `off` runs the first part only, with TLS so).
Prints a table, writes JSON and a markdown section.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from fixtures import https  # noqa: E402
from fixtures.compute import Endpoint, Timeline  # noqa: E402
from fixtures.pageserver import Pageserver  # noqa: E402
from fixtures.pagestream import lsn_int  # noqa: E402
from fixtures.paths import pg_bin_dir  # noqa: E402
from fixtures.pgbench import parse, pgbench  # noqa: E402
from fixtures.postgres import PgServer  # noqa: E402
from fixtures.safekeeper import Safekeeper  # noqa: E402


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 on), or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2:].split()


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) of a process and its children: those it reaped (cutime,
    cstime) and those alive now. A backend that exited but is not yet reaped is missed."""
    if pid is None or (st := _stat(pid)) is None:
        return 0.0
    ticks = int(st[11]) + int(st[12]) + int(st[13]) + int(st[14])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (child := _stat(int(entry.name))) is not None and int(child[1]) == pid:
            ticks += int(child[11]) + int(child[12])
    return ticks / CLK_TCK


def machine_cpu() -> dict:
    """The whole machine's CPU seconds so far (`/proc/stat`): busy (every state but idle and
    iowait) and stolen by the hypervisor, to tell a run slowed by something outside the
    measured processes from one whose processes did more work."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return {"busy": (user + nice + system + irq + softirq + steal) / CLK_TCK, "steal": steal / CLK_TCK}


def postmaster_pid(datadir: Path) -> int | None:
    try:
        return int((datadir / "postmaster.pid").read_text().split("\n")[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


INIT_PHASES = ("drop tables", "create tables", "client-side generate", "vacuum", "primary keys")


def init_phases(stderr: str) -> dict:
    """pgbench -i's own breakdown ("done in 1.54 s (drop tables 0.08 s, ...)"): seconds per phase."""
    done = re.search(r"done in [0-9.]+ s \((.*)\)", stderr)
    phases = dict(re.findall(r"([a-z -]+?) ([0-9.]+) s", done.group(1))) if done else {}
    return {k.strip(): float(v) for k, v in phases.items()}


def wal_written(port: int, user: str) -> tuple[int, int]:
    """The WAL insert position in bytes, and the full-page images counted in `pg_stat_wal`
    (backends report theirs when they exit)."""
    with psycopg.connect(host="127.0.0.1", port=port, user=user, dbname="postgres", autocommit=True) as conn:
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0]
        fpi = conn.execute("SELECT wal_fpi FROM pg_stat_wal").fetchone()[0]
    return int(lsn), int(fpi)


def run_suite(name: str, port: int, user: str, a, settle, after_init=None, cpu=None) -> dict:
    """pgbench -i, then read-write and select-only, each after `settle()`; `after_init` (if
    any) returns what to record right after the load, `cpu` (if any) the CPU seconds used so
    far per component, whose difference over each run is recorded per transaction."""
    res = {}
    t0 = time.monotonic()
    # Not the fixture's pgbench(): its phase breakdown goes to standard error.
    r = subprocess.run([str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U", user, "-i", "-s",
                        str(a.scale), "-q", "postgres"], capture_output=True, text=True, check=True)
    res["init_s"] = round(time.monotonic() - t0, 1)
    res["init_phases_s"] = init_phases(r.stderr)
    print(f"{name}: pgbench -i -s {a.scale} took {res['init_s']} s: {res['init_phases_s']}", flush=True)
    if after_init:
        res.update(after_init())
    for mode, extra in (("read-write", []), ("select-only", ["-S"])):
        t0 = time.monotonic()
        settle()
        settle_s = round(time.monotonic() - t0, 1)
        before = cpu() if cpu else {}
        wal_before = wal_written(port, user)
        machine_before = machine_cpu()
        out = pgbench(port, user, "-n", "-c", str(a.clients), "-j", str(a.clients), "-T", str(a.duration), *extra)
        res[mode] = parse(out)
        res[mode]["settle_s"] = settle_s
        txns = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
        time.sleep(0.3)  # the backends that just ended report their WAL statistics
        wal_after = wal_written(port, user)
        res[mode]["wal_bytes_per_txn"] = round((wal_after[0] - wal_before[0]) / max(txns, 1))
        res[mode]["fpi_per_1000_txn"] = round((wal_after[1] - wal_before[1]) * 1000 / max(txns, 1), 1)
        machine_after = machine_cpu()
        res[mode]["machine_busy_s"] = round(machine_after["busy"] - machine_before["busy"], 1)
        res[mode]["machine_steal_s"] = round(machine_after["steal"] - machine_before["steal"], 1)
        if cpu:
            after = cpu()
            res[mode]["cpu_ms_per_txn"] = {k: round((after[k] - before[k]) * 1000 / max(txns, 1), 3) for k in after}
        print(f"{name}: {mode}: {res[mode]}", flush=True)
    return res


# The cold scans' table: 3,000,000 rows unless `--scan-rows` says otherwise.
SCAN_ROWS = 3_000_000


def checkpoint(port: int, user: str) -> None:
    with psycopg.connect(host="127.0.0.1", port=port, user=user, dbname="postgres", autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def wait_for_ingest(tl: Timeline, lsn: int) -> float:
    """Waits until the pageserver has ingested the WAL up to `lsn`; returns the seconds."""
    t0 = time.monotonic()
    while lsn_int(tl.status()["last_record_lsn"]) < lsn:
        if time.monotonic() > t0 + 300:
            raise RuntimeError("the pageserver did not ingest the WAL within 300 s")
        time.sleep(0.05)
    return round(time.monotonic() - t0, 2)


def settle_fjord(ep: Endpoint, ps: Pageserver, tl: Timeline) -> None:
    """CHECKPOINT on the compute, then wait until the pageserver has ingested all WAL so far
    and run compaction passes (image layers where the delta depth asks for them, L0
    compaction) until one leaves no deep key range for later: the deferred work its
    background jobs would otherwise do during the next run (one pass rebuilds at most
    `image_creation_ranges_per_run` ranges)."""
    checkpoint(ep.port, ep.user)
    wait_for_ingest(tl, lsn_int(ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0]))
    for _ in range(100):
        req = urllib.request.Request(f"{ps.http_url}/v1/tenant/{tl.tenant}/timeline/{tl.timeline}/compact",
                                     method="POST", data=b"{}", headers={"Content-Type": "application/json"})
        if json.loads(https.urlopen(req, ps.tls, timeout=600).read())["image_ranges_deferred"] == 0:
            return
    raise RuntimeError("the pageserver still had deep key ranges to rebuild after 100 compaction passes")


def drop_from_os_cache(root: Path) -> int:
    """Evicts every file under `root` from the OS page cache (POSIX_FADV_DONTNEED; the
    files are ours, so no root is needed to drop caches). Returns the bytes covered."""
    total = 0
    for p in root.rglob("*"):
        if p.is_file():
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def create_scan_table(port: int, user: str) -> None:
    with psycopg.connect(f"host=127.0.0.1 port={port} user={user} dbname=postgres", autocommit=True) as conn:
        conn.execute("CREATE TABLE scan3m (id int, filler text)")
        conn.execute("INSERT INTO scan3m SELECT g, 'row ' || g FROM generate_series(1, %s::int) g", (SCAN_ROWS,))
        conn.execute("VACUUM (FREEZE) scan3m")
        conn.execute("CHECKPOINT")


def timed_scan(port: int, user: str) -> float:
    with psycopg.connect(f"host=127.0.0.1 port={port} user={user} dbname=postgres", autocommit=True) as conn:
        conn.execute("SET max_parallel_workers_per_gather = 0")
        t0 = time.monotonic()
        n = conn.execute("SELECT count(*) FROM scan3m").fetchone()[0]
        took = time.monotonic() - t0
    assert n == SCAN_ROWS, n
    return round(took, 3)


def status(ep: Endpoint, function: str) -> dict:
    with ep.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS fjord")
        cur = conn.execute(f"SELECT * FROM fjord.{function}()")
        return dict(zip([d.name for d in cur.description], cur.fetchone()))


def restart_seconds(a) -> int:
    """How long select-only runs after the endpoint's restart: 10 s, or --duration if shorter."""
    return min(10, a.duration)


def after_restart(ep: Endpoint, a) -> dict:
    """Restarts the endpoint and runs select-only for `restart_seconds`, one progress line per
    second."""
    ep.stop()
    # `fjord endpoint stop` removes the stopped compute's data directory (the next start
    # fetches a new one); the fixture would remove it at start, inside the time measured.
    shutil.rmtree(ep.pgdata)
    t0 = time.monotonic()
    ep.start()
    start_s = round(time.monotonic() - t0, 2)
    with ep.connect() as conn:
        conn.execute("SELECT 1").fetchone()
    first_query_ms = round((time.monotonic() - t0) * 1000)
    report = json.loads((ep.dir / "status.json").read_text())
    r = subprocess.run([str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user, "-n", "-S",
                        "-c", str(a.clients), "-j", str(a.clients), "-T", str(restart_seconds(a)), "-P", "1", "postgres"],
                       capture_output=True, text=True, check=True)
    out = r.stdout
    # pgbench prints its progress lines on stderr.
    per_second = [float(x) for x in re.findall(r"progress: [0-9.]+ s, ([0-9.]+) tps", r.stderr)]
    lfc = status(ep, "file_cache_status")
    return {"restart_s": start_s, "first_query_ms": first_query_ms,
            "compute_ctl_ms": {k: report.get(k) for k in ("sync_ms", "basebackup_ms", "start_ms", "total_ms")},
            "tps_per_second": per_second, "restored_pages": lfc["restored"], **parse(out)}


def ps_checkpoint(ps: Pageserver, tl: Timeline) -> None:
    """Flushes the pageserver's in-memory layer to a file, so that the scan reads files."""
    req = urllib.request.Request(f"{ps.http_url}/v1/tenant/{tl.tenant}/timeline/{tl.timeline}/checkpoint",
                                 method="POST", data=b"")
    https.urlopen(req, ps.tls, timeout=300).read()


def ps_image_layers(ps: Pageserver, tl: Timeline) -> float:
    """Makes image layers over the whole key space (what the background jobs do where reads
    walk deep): the pageserver's counterpart of the shutdown checkpoint that wrote plain
    PostgreSQL's pages before its cold scan. Returns the seconds it took."""
    t0 = time.monotonic()
    req = urllib.request.Request(f"{ps.http_url}/v1/tenant/{tl.tenant}/timeline/{tl.timeline}/compact",
                                 method="POST", data=json.dumps({"force_image_layers": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    https.urlopen(req, ps.tls, timeout=600).read()
    return round(time.monotonic() - t0, 1)


def ps_metrics(ps: Pageserver) -> dict:
    """The pageserver's GetPage totals from /metrics: the count and the sums of the seconds,
    layers visited and records replayed."""
    text = https.urlopen(f"{ps.http_url}/metrics", ps.tls, timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"pageserver_getpage_(seconds|layers_visited|records_replayed)_(sum|count) ([0-9.e+-]+)$", line)
        if m:
            out[f"{m[1]}_{m[2]}"] = float(m[3])
    return out


def cold_scan(base: Path, ps: Pageserver, tl: Timeline, sks: list, settings: dict, name: str,
              diagnostics: Path | None = None) -> tuple[float, float, dict, int]:
    """A new endpoint (an empty file cache) scans the table with the pageserver's files out of
    the OS cache: the cold scan, then the same scan again (warm). Adds to the storage
    manager's counters what the cold scan cost the pageserver (`pageserver_*`, from /metrics)
    and the compute's GetPage latency histogram; with `diagnostics`, a scan slower than 3 s
    keeps both logs there."""
    ep = Endpoint(base, tl, name, settings={k: v for k, v in settings.items() if k != "fsync"}, safekeepers=sks)
    dropped = drop_from_os_cache(ps.workdir)
    t0 = time.monotonic()
    ep.start()
    start_s = time.monotonic() - t0
    try:
        before = ps_metrics(ps)
        cold = timed_scan(ep.port, ep.user)
        after = ps_metrics(ps)
        warm = timed_scan(ep.port, ep.user)
        smgr = status(ep, "storage_manager")
        with ep.connect() as conn:
            smgr["getpage_latency"] = {str(le): n for le, n in conn.execute("SELECT * FROM fjord.getpage_latency()") if n}
    finally:
        ep.stop()
    smgr["start_s"] = round(start_s, 3)
    smgr.update({f"pageserver_{k}": round(after.get(k, 0) - before.get(k, 0), 3) for k in after})
    if diagnostics and cold > 3:
        diagnostics.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        shutil.copy(ps.logfile, diagnostics / f"{stamp}-{name}-pageserver.log")
        for log in sorted(ep.dir.rglob("*.log")):
            shutil.copy(log, diagnostics / f"{stamp}-{name}-{log.name}")
        print(f"fjord: the {name} scan took {cold} s; logs kept in {diagnostics}", flush=True)
    return cold, warm, smgr, dropped


def fjord_tls_off_suite(base: Path, a, settings: dict) -> dict:
    """pgbench -i, read-write and select-only on a second cluster with TLS off, settled as
    the first."""
    base = base / "tls-off"
    ps = Pageserver(base, tls=False).start()
    sks = [Safekeeper(base / "safekeepers", i, tls=False).start() for i in (1, 2, 3)]
    ep = None
    try:
        tl = Timeline(base, ps)
        ep = Endpoint(base, tl, settings={k: v for k, v in settings.items() if k != "fsync"}, safekeepers=sks).start()
        return run_suite("fjord, TLS off", ep.port, ep.user, a, settle=lambda: settle_fjord(ep, ps, tl))
    finally:
        if ep:
            ep.stop()
        for sk in sks:
            sk.stop()
        ps.stop()


def main() -> None:
    global SCAN_ROWS
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--duration", type=int, default=30)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--shared-buffers", default="16MB")
    p.add_argument("--scan-rows", type=int, default=SCAN_ROWS)
    p.add_argument("--json", required=True)
    p.add_argument("--markdown", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--flavor", required=True)
    p.add_argument("--tls", choices=["on", "off", "both"], default="on")
    a = p.parse_args()
    tls = a.tls != "off"
    SCAN_ROWS = a.scan_rows

    settings = {"shared_buffers": a.shared_buffers, "synchronous_commit": "on", "fsync": "on", "max_connections": "50"}
    with tempfile.TemporaryDirectory(prefix="fjord-bench-") as tmp:
        base = Path(tmp)
        plain = PgServer(base, "plain", settings).initdb().start()
        try:
            plain_res = run_suite("plain", plain.port, plain.user, a, settle=lambda: checkpoint(plain.port, plain.user),
                                  cpu=lambda: {"postgres": cpu_seconds(postmaster_pid(plain.datadir))})
            create_scan_table(plain.port, plain.user)
            plain.stop("fast")
            dropped = drop_from_os_cache(plain.datadir)
            plain.start()
            plain_res["cold_scan_s"] = timed_scan(plain.port, plain.user)
            plain_res["warm_scan_s"] = timed_scan(plain.port, plain.user)
            print(f"plain: cold scan of {SCAN_ROWS} rows {plain_res['cold_scan_s']} s ({dropped >> 20} MB dropped from "
                  f"the OS cache), warm {plain_res['warm_scan_s']} s", flush=True)
        finally:
            plain.stop("fast")
        ps = Pageserver(base, tls=tls).start()
        sks = [Safekeeper(base / "safekeepers", i, tls=tls).start() for i in (1, 2, 3)]
        ep = None
        try:
            tl = Timeline(base, ps)
            ep = Endpoint(base, tl, settings={k: v for k, v in settings.items() if k != "fsync"}, safekeepers=sks).start()
            def throttled() -> dict:
                # Backpressure (fjord.max_pageserver_lag): commits held back while the
                # pageserver's ingest was behind, during the load.
                wp = status(ep, "walproposer_status")
                return {"init_throttled_ms": wp["throttled_ms"], "init_throttled_waits": wp["throttled_waits"]}

            def fjord_cpu() -> dict:
                return {
                    "compute": cpu_seconds(ep.postmaster_pid()),
                    "safekeepers": sum(cpu_seconds(sk.proc.pid if sk.proc else None) for sk in sks),
                    "pageserver": cpu_seconds(ps.proc.pid if ps.proc else None),
                }

            fjord_res = run_suite("fjord", ep.port, ep.user, a, settle=lambda: settle_fjord(ep, ps, tl), after_init=throttled,
                                  cpu=fjord_cpu)
            smgr, lfc = status(ep, "storage_manager"), status(ep, "file_cache_status")
            fjord_res["full_page_writes"] = ep.sql("SHOW full_page_writes")[0][0]
            restart = after_restart(ep, a)
            print(f"fjord: select-only after a restart: {restart}", flush=True)
            create_scan_table(ep.port, ep.user)
            loaded = lsn_int(ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])
            # Right after the load: the table's pages exist on the pageserver only as WAL
            # records (no image layer yet), and each is rebuilt by WAL redo. All of the load
            # is ingested first, so that the flush below (and the image layers after the
            # scan, made at the last flushed LSN) cover it whole. With the compute still up:
            # the flush LSN may include WAL after the last commit, which the safekeepers
            # release to the pageserver only once the compute's proposer announces it
            # committed; a compute stopped first may leave it for the next one's sync.
            fjord_res["scan_load_ingest_wait_s"] = wait_for_ingest(tl, loaded)
            ep.stop()
            ps_checkpoint(ps, tl)
            fjord_res["cold_scan_s"], fjord_res["warm_scan_s"], cold_smgr, dropped = cold_scan(base, ps, tl, sks, settings, "cold")
            print(f"fjord: cold scan of {SCAN_ROWS} rows right after the load {fjord_res['cold_scan_s']} s "
                  f"({dropped >> 20} MB dropped from the OS cache), warm {fjord_res['warm_scan_s']} s; prefetch "
                  f"{cold_smgr['prefetch_hits']} used of {cold_smgr['prefetch_requests']}; the pageserver finished "
                  f"ingesting the load {fjord_res['scan_load_ingest_wait_s']} s after the endpoint stopped", flush=True)
            # After the pageserver made its image layers (plain PostgreSQL's pages were written
            # by its shutdown checkpoint), restarted so that none of its in-memory caches
            # hold a page (plain PostgreSQL restarted too).
            ps_checkpoint(ps, tl)
            fjord_res["image_layers_s"] = ps_image_layers(ps, tl)
            ps.stop()
            ps.start()
            fjord_res["cold_scan_images_s"], _, images_smgr, dropped = cold_scan(base, ps, tl, sks, settings, "cold2",
                                                                                     Path(a.json).parent / "slow-scans")
            print(f"fjord: image layers made in {fjord_res['image_layers_s']} s; cold scan from them "
                  f"{fjord_res['cold_scan_images_s']} s ({dropped >> 20} MB dropped from the OS cache); endpoint start "
                  f"{images_smgr['start_s']} s, {images_smgr['pageserver_requests']} GetPage requests, pageserver "
                  f"{images_smgr.get('pageserver_seconds_count')} served in {images_smgr.get('pageserver_seconds_sum')} s",
                  flush=True)
        finally:
            if ep:
                ep.stop()
            for sk in sks:
                sk.stop()
            ps.stop()
        tls_off_res = fjord_tls_off_suite(base, a, settings) if a.tls == "both" else None

    result = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "command": a.command, "flavor": a.flavor,
        "machine": f"{platform.machine()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores",
        "scale": a.scale, "duration_s": a.duration, "clients": a.clients, "shared_buffers": a.shared_buffers,
        "tls": a.tls, "plain": plain_res, "fjord": fjord_res, "fjord_tls_off": tls_off_res, "fjord_storage_manager": smgr, "fjord_file_cache": lfc,
        "fjord_after_restart": restart, "cold_scan_prefetch": {k: cold_smgr[k] for k in ("prefetch_requests", "prefetch_hits", "prefetch_wasted")},
        "cold_scan_storage_manager": cold_smgr, "cold_scan_images_storage_manager": images_smgr,
    }
    Path(a.json).write_text(json.dumps(result, indent=2, default=str) + "\n")

    def ratio(mode: str, key: str):
        f, b = fjord_res[mode][key], plain_res[mode][key]
        return f"{f / b:.2f}" if f and b else "n/a"

    lines = [
        f"Measured {result['date']} on {result['machine']}, PostgreSQL {a.flavor} flavor, "
        f"pgbench scale {a.scale} (~{a.scale * 15} MB), {a.clients} clients, {a.duration} s per run, "
        f"shared_buffers {a.shared_buffers} on both, TLS {'on' if tls else 'off'} on every fjord link. Command: `{a.command}`. Before each run both sides settled "
        f"(plain PostgreSQL: CHECKPOINT, {plain_res['read-write']['settle_s']} s and {plain_res['select-only']['settle_s']} s; "
        f"fjord: CHECKPOINT, the pageserver's ingest of all WAL and compaction passes until none leaves work for later, "
        f"{fjord_res['read-write']['settle_s']} s and {fjord_res['select-only']['settle_s']} s).",
        "",
        "| workload | plain TPS | fjord TPS | fjord/plain TPS | plain latency ms | fjord latency ms |",
        "|---|---|---|---|---|---|",
    ]
    for mode in ("read-write", "select-only"):
        lines.append(f"| {mode} | {plain_res[mode]['tps']:.0f} | {fjord_res[mode]['tps']:.0f} | {ratio(mode, 'tps')} | "
                     f"{plain_res[mode]['latency_ms']:.2f} | {fjord_res[mode]['latency_ms']:.2f} |")

    if tls_off_res:
        def tls_cost(mode: str) -> str:
            on, off = fjord_res[mode], tls_off_res[mode]
            ratio = f"{on['tps'] / off['tps']:.3f}" if on["tps"] and off["tps"] else "n/a"
            return (f"{mode} {on['tps']:.0f} TPS with TLS, {off['tps']:.0f} without (x{ratio}; latency "
                    f"{on['latency_ms']:.2f} ms and {off['latency_ms']:.2f} ms)")
        lines += ["", "TLS on every link against a second cluster with TLS off (pgbench -i, then the same runs, each "
                  "after the same settling): " + "; ".join(tls_cost(m) for m in ("read-write", "select-only")) + "."]

    def wal(res: dict) -> str:
        rw = res["read-write"]
        return f"{rw['wal_bytes_per_txn']:,} bytes and {rw['fpi_per_1000_txn']} full-page images per 1,000 transactions"

    lines += ["", f"WAL per read-write transaction (`pg_current_wal_insert_lsn()` and `pg_stat_wal.wal_fpi` around the "
              f"run; full_page_writes on in plain PostgreSQL, as users run it, and {fjord_res['full_page_writes']} on the compute): plain "
              f"PostgreSQL {wal(plain_res)}; fjord {wal(fjord_res)} "
              f"(x{fjord_res['read-write']['wal_bytes_per_txn'] / max(plain_res['read-write']['wal_bytes_per_txn'], 1):.2f})."]

    def cpu(mode: str) -> str:
        p, f = plain_res[mode]["cpu_ms_per_txn"], fjord_res[mode]["cpu_ms_per_txn"]
        return (f"{mode}: plain PostgreSQL {p['postgres']}; fjord {sum(f.values()):.3f} = compute {f['compute']} + "
                f"three safekeepers {f['safekeepers']} + pageserver {f['pageserver']}")

    lines += ["", "CPU time per transaction in ms (user + system, from `/proc`, pgbench itself not counted; every "
              "process shares the same cores): " + "; ".join(cpu(m) for m in ("read-write", "select-only")) + "."]

    def machine(res: dict) -> str:
        return ", ".join(f"{m} {res[m]['machine_busy_s']} s ({res[m]['machine_steal_s']} s stolen)" for m in ("read-write", "select-only"))

    lines += ["", f"The whole machine's busy CPU time during each {a.duration} s run (of {a.duration * (os.cpu_count() or 1)} s "
              f"on {os.cpu_count()} cores, "
              f"everything counted, pgbench included; `/proc/stat`): plain PostgreSQL {machine(plain_res)}; "
              f"fjord {machine(fjord_res)}."]

    def phases(res: dict) -> str:
        return ", ".join(f"{k} {res['init_phases_s'][k]}" for k in INIT_PHASES if k in res["init_phases_s"])

    lines += ["", f"`pgbench -i`: plain {plain_res['init_s']} s ({phases(plain_res)}), fjord {fjord_res['init_s']} s "
              f"({phases(fjord_res)}; seconds, pgbench's own breakdown; commits held back by backpressure "
              f"while the pageserver's ingest was behind: {fjord_res['init_throttled_ms']} ms in "
              f"{fjord_res['init_throttled_waits']} waits). "
              f"Page service requests during the fjord run: {smgr.get('pageserver_requests')}, "
              f"full-page images written at eviction: {smgr.get('eviction_images')}. "
              f"Local file cache: {lfc['hits']} hits, {lfc['misses']} misses, {lfc['used_pages']} pages used of "
              f"{lfc['size_bytes'] // 8192}.",
              "",
              f"Select-only right after a restart of the endpoint (stopped, started again in {restart['restart_s']} s, "
              f"{restart['restored_pages']} cached pages reused): {restart['tps']:.0f} TPS over {restart_seconds(a)} s; per second: "
              + ", ".join(f"{x:.0f}" for x in restart["tps_per_second"]) + ". "
              f"From the start command to the first query's answer: {restart['first_query_ms']} ms (compute_ctl: "
              f"safekeeper sync {restart['compute_ctl_ms']['sync_ms']} ms, basebackup by "
              f"{restart['compute_ctl_ms']['basebackup_ms']} ms, postgres start {restart['compute_ctl_ms']['start_ms']} ms, "
              f"total {restart['compute_ctl_ms']['total_ms']} ms).",
              "",
              f"`SELECT count(*)` over {SCAN_ROWS:,} rows with a cold OS cache (the table's files, or the pageserver's, "
              f"evicted with `POSIX_FADV_DONTNEED`; fjord on a new endpoint, its file cache empty): plain "
              f"{plain_res['cold_scan_s']} s (after its shutdown checkpoint); fjord right after the load (once the "
              f"pageserver had ingested it, {fjord_res['scan_load_ingest_wait_s']} s after the endpoint stopped), every page "
              f"rebuilt from WAL, {fjord_res['cold_scan_s']} s "
              f"({fjord_res['cold_scan_s'] / plain_res['cold_scan_s']:.2f}x), and from image layers (made in "
              f"{fjord_res['image_layers_s']} s, pageserver restarted) {fjord_res['cold_scan_images_s']} s "
              f"({fjord_res['cold_scan_images_s'] / plain_res['cold_scan_s']:.2f}x); the same scan again (warm): plain "
              f"{plain_res['warm_scan_s']} s, fjord {fjord_res['warm_scan_s']} s. Pages prefetched during the first cold "
              f"scan: {cold_smgr['prefetch_hits']} used of {cold_smgr['prefetch_requests']} requested."]
    Path(a.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
