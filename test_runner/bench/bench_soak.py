"""A soak: a whole fjord cluster under pgbench read-write for a long time, with a reading
every interval of what should stay flat (TPS, GetPage@LSN latency) and what may grow (disk
of each component, object storage, lags, background jobs of the pageserver).

Run through scripts/bench-soak (which explains the flags). The cluster is started with the
`fjord` CLI in a temporary repo (pageserver, three safekeepers, object storage in a
directory of the repo unless --remote-storage says otherwise, one endpoint), and
everything it started is stopped at the end, also on Ctrl-C, SIGTERM or an error.

A reading, every --interval seconds of pgbench's clock:
  - TPS and average latency over the interval (pgbench -P 1, summed per interval);
  - GetPage@LSN latency of the hottest page (pgbench_branches block 0, main fork) and of
    random pgbench_accounts pages, measured here through the page service at the
    pageserver's last record LSN: up to 200 requests each, fewer if they take more than a
    quarter of the interval (the number is recorded);
  - bytes on local disk of the pageserver's work directory and of each safekeeper's data
    directory, and in object storage when it is a directory;
  - the timeline's status (LSNs, layers, uploads) and the pageserver's counters of
    background jobs from /metrics (whichever exist).
The run fails only when something breaks: a process of the cluster dies, pgbench reports
an error or exits early, the page service answers with an error. Slowness is recorded,
never a failure. Prints a table, writes JSON (partial, with the failure, when it fails) and
a markdown section.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from fixtures.cli import FjordRepo  # noqa: E402
from fixtures.pagestream import PageServiceClient, PageServiceError, RelTag, lsn_int  # noqa: E402
from fixtures.paths import pg_bin_dir  # noqa: E402

MIB = 1024 * 1024
GETPAGE_REQUESTS = 200
# /metrics lines of background jobs: names with one of these parts, or these prefixes.
METRIC_PARTS = ("_runs", "_layers", "_bytes")
METRIC_PREFIXES = ("pageserver_compaction_", "pageserver_image_", "pageserver_gc_")
PROGRESS = re.compile(r"^progress: ([0-9.]+) s, ([0-9.]+) tps, lat ([0-9.]+) ms stddev [^,]*, (\d+) failed")


class SoakFailure(Exception):
    """Something broke: the benchmark stops and says what."""


class Interrupted(Exception):
    """SIGTERM or SIGHUP: stop like Ctrl-C."""


def on_signal(signum, _frame):
    raise Interrupted(f"stopped by signal {signal.Signals(signum).name}")


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} soak: {msg}", flush=True)


# --- pgbench ---------------------------------------------------------------------------

class Pgbench:
    """pgbench read-write in the background, its progress lines (-P 1) collected as they come.
    Its own session, so that a Ctrl-C reaches this program, which then stops it."""

    def __init__(self, connstr: str, clients: int, duration: int):
        cmd = [str(pg_bin_dir() / "pgbench"), "-n", "-c", str(clients), "-j", str(clients),
               "-T", str(duration), "-P", "1", connstr]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.cond = threading.Condition()
        # (time since start s, transactions in the line's second, average latency ms, failed)
        self.progress: list[tuple[float, float, float, int]] = []
        self.errors: list[str] = []  # stderr lines other than progress
        self.stdout: list[str] = []
        self.done = False
        self._threads = [threading.Thread(target=self._read_stderr, daemon=True),
                         threading.Thread(target=self._read_stdout, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_stderr(self) -> None:
        last_t = 0.0
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            m = PROGRESS.match(line)
            with self.cond:
                if m:
                    t, tps, lat, failed = float(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(4))
                    # pgbench's tps is transactions / time since its previous line.
                    self.progress.append((t, tps * (t - last_t), lat, failed))
                    last_t = t
                elif line.strip():
                    self.errors.append(line)
                self.cond.notify_all()
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))

    def broken(self) -> str | None:
        """Why pgbench's run is broken, if it is: an aborted client, an error, failures."""
        bad = [e for e in self.errors if "aborted" in e or "error" in e.lower()]
        if bad:
            return "pgbench reported errors:\n  " + "\n  ".join(self.errors[-20:])
        failed = sum(p[3] for p in self.progress)
        if failed:
            return f"pgbench counted {failed} failed transactions"
        return None

    def wait_for(self, t: float, deadline: float) -> int:
        """Waits until pgbench has reported progress at `t` seconds or more, or ended; returns
        how many progress lines there are by then. pgbench still running at `deadline`
        (time.monotonic()) means transactions hang: a failure."""
        with self.cond:
            while not self.done and not (self.progress and self.progress[-1][0] >= t - 0.5) and not self.broken():
                if time.monotonic() > deadline:
                    raise SoakFailure("pgbench has not ended 10 minutes after its duration: transactions hang")
                self.cond.wait(1.0)
            return len(self.progress)

    def finish(self) -> int:
        rc = self.proc.wait()
        for t in self._threads:
            t.join(10)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def summary(self) -> dict:
        out = "\n".join(self.stdout)
        tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
        lat = re.search(r"latency average = ([0-9.]+) ms", out)
        txs = re.search(r"number of transactions actually processed: (\d+)", out)
        return {"tps": float(tps.group(1)) if tps else None, "latency_ms": float(lat.group(1)) if lat else None,
                "transactions": int(txs.group(1)) if txs else None}


def window_tps(progress: list, start: float, end: float) -> float | None:
    """Average TPS over the progress lines whose time is in (start, end]."""
    lines = [p for p in progress if start < p[0] <= end]
    if not lines:
        return None
    # The span the lines cover: from the line before the window's first (or 0) to its last.
    before = [p[0] for p in progress if p[0] <= start]
    span = lines[-1][0] - (before[-1] if before else 0.0)
    return sum(p[1] for p in lines) / span if span > 0 else None


# --- the cluster ---------------------------------------------------------------------------

def pid_alive(pid_file: Path, exe: str) -> bool:
    """The process in pid_file is alive, not a zombie, and runs the executable `exe`."""
    try:
        pid = int(pid_file.read_text())
        if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != exe:
            return False
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, ValueError, IndexError):
        return False


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tail(path: Path, n: int = 15) -> str:
    try:
        lines = ANSI.sub("", path.read_text(errors="replace")).splitlines()[-n:]
    except OSError:
        return f"  ({path.name}: not there)"
    return "\n".join(f"  {line}" for line in lines) or f"  ({path.name}: empty)"


class Cluster:
    def __init__(self, repo: FjordRepo, safekeepers: int):
        self.repo = repo
        self.safekeepers = safekeepers

    def processes(self) -> list[tuple[str, Path, str, Path]]:
        """(name, pid file, executable, log) of every process the benchmark relies on."""
        p = self.repo.path
        procs = [("pageserver", p / "pageserver.pid", "pageserver", p / "pageserver.log")]
        procs += [(f"safekeeper {i}", p / f"safekeeper{i}.pid", "safekeeper", p / f"safekeeper{i}.log")
                  for i in range(1, self.safekeepers + 1)]
        procs.append(("endpoint main (compute_ctl)", p / "endpoints/main/compute_ctl.pid", "compute_ctl",
                      p / "endpoints/main/postgres.log"))
        return procs

    def check_alive(self) -> None:
        dead = [name for name, pid_file, exe, _ in self.processes() if not pid_alive(pid_file, exe)]
        if dead:
            raise SoakFailure("not running any more: " + ", ".join(dead))

    def logs_tail(self) -> str:
        logs = [lp for _, _, _, lp in self.processes()] + [self.repo.path / "endpoints/main/compute_ctl.log"]
        return "\n".join(f"end of {lp.relative_to(self.repo.path)}:\n{tail(lp, 10)}" for lp in logs)

    def stop(self) -> None:
        """`fjord stop`, then SIGKILL for whatever still runs (FjordRepo.cleanup and the
        safekeepers by their pid files)."""
        self.repo.cleanup()
        for _, pid_file, exe, _ in self.processes():
            if pid_alive(pid_file, exe):
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass


def du(path: Path) -> int:
    """Bytes allocated on disk under path, as `du -s --block-size=1` counts them; files
    removed while it walks are skipped."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files, None]:
            try:
                total += os.lstat(os.path.join(root, name) if name else root).st_blocks * 512
            except OSError:
                pass
    return total


def background_metrics(text: str) -> dict[str, float]:
    """The pageserver's counters of background jobs in /metrics, summed over their labels:
    every `pageserver_*` series with _runs, _layers or _bytes in its name, and every
    compaction, image layer or GC series (histogram buckets left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("pageserver_"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            rest = rest.rsplit("}", 1)[-1]
        else:
            name, _, rest = line.partition(" ")
        if name.endswith("_bucket") or not (any(p in name for p in METRIC_PARTS) or name.startswith(METRIC_PREFIXES)):
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        out[name] = out.get(name, 0) + value
    return {k: int(v) if v == int(v) else v for k, v in sorted(out.items())}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


# --- one reading --------------------------------------------------------------------------

class Soak:
    def __init__(self, a, cluster: Cluster, tenant: str, timeline: str, rels: dict, remote_dir: Path | None):
        self.a = a
        self.cluster = cluster
        self.repo = cluster.repo
        self.tenant, self.timeline = tenant, timeline
        self.rels = rels
        self.remote_dir = remote_dir
        self.readings: list[dict] = []

    def status(self) -> dict | None:
        try:
            return self.repo.http_json(f"/v1/tenant/{self.tenant}/timeline/{self.timeline}")
        except (urllib.error.URLError, OSError) as e:
            self.cluster.check_alive()
            log(f"timeline status: no answer ({e}); the pageserver runs, so the reading goes on without it")
            return None

    def metrics(self) -> dict | None:
        try:
            with self.repo.urlopen(f"{self.repo.http_url()}/metrics", timeout=60) as r:
                return background_metrics(r.read().decode(errors="replace"))
        except (urllib.error.URLError, OSError) as e:
            self.cluster.check_alive()
            log(f"/metrics: no answer ({e})")
            return None

    def getpage(self, client: PageServiceClient, rel: RelTag, lsn: int, nblocks: int | None) -> dict:
        """Up to GETPAGE_REQUESTS reads of block 0 (nblocks None) or of random blocks, within
        a quarter of the interval."""
        lat: list[float] = []
        deadline = time.monotonic() + max(2.0, self.a.interval / 4)
        for _ in range(GETPAGE_REQUESTS):
            blk = 0 if nblocks is None else random.randrange(nblocks)
            t0 = time.perf_counter()
            client.get_page(rel, blk, lsn)
            lat.append((time.perf_counter() - t0) * 1e6)
            if time.monotonic() > deadline:
                break
        return {"n": len(lat), "p50_us": round(percentile(lat, 50)), "p99_us": round(percentile(lat, 99)),
                "max_us": round(max(lat))}

    def measure_getpage(self, lsn: int) -> dict:
        out = {}
        try:
            ca = self.repo.path / "tls" / "ca.crt"  # `fjord init` makes it unless --no-tls
            client = PageServiceClient("127.0.0.1", self.repo.base_port, self.tenant, self.timeline, timeout_s=300,
                                      token=self.repo.admin_token() or "", ca=ca if ca.exists() else None)
        except (OSError, ConnectionError) as e:
            self.cluster.check_alive()
            return {"error": f"page service: {e}"}
        try:
            out["hot"] = self.getpage(client, self.rels["branches"], lsn, None)
            nblocks = client.nblocks(self.rels["accounts"], lsn)
            out["random"] = self.getpage(client, self.rels["accounts"], lsn, nblocks)
            out["random"]["nblocks"] = nblocks
        except PageServiceError as e:
            raise SoakFailure(f"the page service answered GetPage@LSN {lsn:X} with an error: {e}") from e
        except (OSError, ConnectionError) as e:
            self.cluster.check_alive()
            out["error"] = f"page service: {e}"
        finally:
            client.close()
        return out

    def take(self, pgbench: Pgbench, lines: int, elapsed_wall: float) -> dict:
        progress = pgbench.progress[:lines]
        prev_end = self.readings[-1]["t_s"] if self.readings else 0.0
        end = progress[-1][0] if progress else 0.0
        mine = [p for p in progress if prev_end < p[0] <= end]
        txs = sum(p[1] for p in mine)
        r: dict = {
            "t_s": end, "wall_s": round(elapsed_wall, 1),
            "tps": round(window_tps(progress, prev_end, end) or 0.0, 1),
            "latency_ms": round(sum(p[1] * p[2] for p in mine) / txs, 2) if txs else None,
        }
        # The status, /metrics and disk first, close together; GetPage@LSN, which takes up to
        # half the interval, after them.
        self.cluster.check_alive()
        st = self.status()
        r["metrics"] = self.metrics()
        p = self.repo.path
        r["disk"] = {"pageserver": du(p / "pageserver"),
                     **{f"sk{i}": du(p / "safekeepers" / f"sk{i}") for i in range(1, self.cluster.safekeepers + 1)},
                     "object_storage": du(self.remote_dir) if self.remote_dir else None,
                     "free": shutil.disk_usage(p).free}
        if st:
            rs = st.get("remote_storage") or {}
            r["timeline"] = {
                "last_record_lsn": st["last_record_lsn"], "disk_consistent_lsn": st["disk_consistent_lsn"],
                "gc_cutoff_lsn": st.get("gc_cutoff_lsn"), "layers": st.get("layers"),
                "remote_consistent_lsn": rs.get("remote_consistent_lsn"), "bytes_uploaded": rs.get("bytes_uploaded"),
                "queued_operations": rs.get("queued_operations"), "layers_uploaded": rs.get("layers_uploaded"),
                "layers_downloaded": rs.get("layers_downloaded"), "resident_layer_bytes": rs.get("resident_layer_bytes"),
                "remote_last_error": rs.get("last_error"),
            }
            t0 = time.monotonic()
            r["getpage"] = self.measure_getpage(lsn_int(st["last_record_lsn"]))
            r["getpage"]["seconds"] = round(time.monotonic() - t0, 1)
        self.readings.append(r)
        return r


# --- output ---------------------------------------------------------------------------------

def mib(b) -> str:
    return "n/a" if b is None else f"{b / MIB:.1f}"


def lsn_gap_mib(hi: str | None, lo: str | None) -> str:
    return "n/a" if not hi or not lo else f"{(lsn_int(hi) - lsn_int(lo)) / MIB:.1f}"


def us(v) -> str:
    return "n/a" if v is None else f"{v:,}"


def getpage_cell(g: dict | None) -> str:
    if not g:
        return "n/a"
    return f"{us(g['p50_us'])} / {us(g['p99_us'])} ({g['n']})"


def row(r: dict, sks: int) -> str:
    tl = r.get("timeline") or {}
    gp = r.get("getpage") or {}
    d = r["disk"]
    lat = "n/a" if r["latency_ms"] is None else f"{r['latency_ms']:.2f}"
    return (f"| {r['t_s']:.0f} | {r['tps']:.0f} | {lat} | "
            f"{getpage_cell(gp.get('hot'))} | {getpage_cell(gp.get('random'))} | {tl.get('last_record_lsn', 'n/a')} | "
            f"{lsn_gap_mib(tl.get('last_record_lsn'), tl.get('disk_consistent_lsn'))} | "
            f"{lsn_gap_mib(tl.get('last_record_lsn'), tl.get('remote_consistent_lsn'))} | "
            f"{tl.get('queued_operations', 'n/a')} | {tl.get('layers', 'n/a')} | {mib(tl.get('resident_layer_bytes'))} | "
            f"{mib(d['pageserver'])} | "
            f"{' / '.join(mib(d[f'sk{i}']) for i in range(1, sks + 1))} | {mib(d['object_storage'])} |")


def summarize(readings: list[dict], progress: list, duration: int, sks: int) -> dict:
    end = progress[-1][0] if progress else 0.0
    window = min(300.0, duration / 6)
    first, last = window_tps(progress, 0.0, window), window_tps(progress, end - window, end)
    s: dict = {"window_s": window, "tps_first": round(first, 1) if first else first,
               "tps_last": round(last, 1) if last else last,
               "tps_ratio": round(last / first, 3) if first and last else None}
    comps = ["pageserver", *[f"sk{i}" for i in range(1, sks + 1)], "object_storage"]
    s["disk"] = {c: {"max": max((r["disk"][c] for r in readings if r["disk"][c] is not None), default=None),
                     "last": readings[-1]["disk"][c] if readings else None} for c in comps}
    resident = [r["timeline"]["resident_layer_bytes"] for r in readings
                if (r.get("timeline") or {}).get("resident_layer_bytes") is not None]
    s["resident_layer_bytes_max"] = max(resident, default=None)
    with_gp = [r for r in readings if (r.get("getpage") or {}).get("hot")]
    for kind in ("hot", "random"):
        s[f"getpage_{kind}_p99_us"] = {"first": with_gp[0]["getpage"][kind]["p99_us"] if with_gp else None,
                                       "last": with_gp[-1]["getpage"][kind]["p99_us"] if with_gp else None}
    with_tl = [r for r in readings if r.get("timeline")]
    if with_tl:
        s["last_record_lsn"] = {"first": with_tl[0]["timeline"]["last_record_lsn"],
                                "last": with_tl[-1]["timeline"]["last_record_lsn"]}
    with_m = [r for r in readings if r.get("metrics") is not None]
    s["metrics"] = {"first": with_m[0]["metrics"], "last": with_m[-1]["metrics"]} if with_m else None
    return s


def render(result: dict) -> str:
    a, s, sks = result["settings"], result["summary"], result["settings"]["safekeepers"]
    storage = ("a directory in the repo" if a["remote_storage"] is None else f"`{a['remote_storage']}`")
    budget = "none" if a["layer_disk_budget_bytes"] is None else f"{a['layer_disk_budget_bytes']:,} bytes"
    lines = [
        f"Measured {result['date']} on {result['machine']}, PostgreSQL {result['flavor']} flavor, pgbench scale "
        f"{a['scale']} (~{a['scale'] * 15} MB), read-write (TPC-B-like), {a['clients']} clients, {a['duration']} s, a "
        f"reading every {a['interval']} s; compute shared_buffers {result['compute']['shared_buffers']}, {sks} safekeepers, "
        f"object storage {storage}, layer disk budget {budget}. Command: `{result['command']}`.",
        "",
        f"At s: pgbench's clock at the end of the interval; TPS and latency over the interval. GetPage@LSN: µs "
        f"p50 / p99 (requests) at the pageserver's last record LSN; hot = pgbench_branches block 0, random = random "
        f"pgbench_accounts blocks. Not in layers, not uploaded: MiB of WAL from the disk-consistent and the "
        f"remote-consistent LSN to the last record LSN. Resident layers: MiB of layer files on the pageserver's "
        f"disk (what the layer disk budget bounds). Disk in MiB (`du`); safekeepers "
        f"{' / '.join(f'sk{i}' for i in range(1, sks + 1))}.",
        "",
        "| at s | TPS | latency ms | GetPage hot | GetPage random | last record LSN | not in layers | not uploaded | "
        "upload queue | layers | resident layers | pageserver | safekeepers | object storage |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *[row(r, sks) for r in result["readings"]],
        "",
    ]

    def f0(v):
        return "n/a" if v is None else f"{v:.0f}"

    w = s["window_s"]
    wname = "5 min" if w == 300 else f"{w:.0f} s (a sixth of the run)"
    ratio = "n/a" if s["tps_ratio"] is None else f"{s['tps_ratio']:.2f}"
    pg = result["pgbench"]
    lines.append(f"- TPS: first {wname} {f0(s['tps_first'])}, last {wname} {f0(s['tps_last'])}, last/first {ratio}; "
                 f"whole run {f0(pg['tps'])} ({pg['transactions']} transactions). `pgbench -i` took {result['init_s']} s.")
    gh, gr = s["getpage_hot_p99_us"], s["getpage_random_p99_us"]
    lines.append(f"- GetPage@LSN p99, first reading → last: hot page {us(gh['first'])} → {us(gh['last'])} µs, "
                 f"random page {us(gr['first'])} → {us(gr['last'])} µs.")
    names = {"pageserver": "pageserver", "object_storage": "object storage",
             **{f"sk{i}": f"safekeeper {i}" for i in range(1, sks + 1)}}
    lines.append("- Disk, max / at the end (MiB): " + ", ".join(
        f"{names[c]} {mib(v['max'])} / {mib(v['last'])}" for c, v in s["disk"].items() if v["last"] is not None) +
        f"; the pageserver's resident layer files at most {mib(s.get('resident_layer_bytes_max'))} MiB"
        f" (budget {budget}).")
    if "last_record_lsn" in s:
        lsns = s["last_record_lsn"]
        lines.append(f"- WAL: last record LSN {lsns['first']} → {lsns['last']} "
                     f"({lsn_gap_mib(lsns['last'], lsns['first'])} MiB between the first and the last reading).")
    m = s["metrics"]
    if m and m["last"]:
        changed = [f"`{k}` {m['first'].get(k, 'n/a')} → {v}" for k, v in m["last"].items() if m["first"].get(k) != v]
        same = [f"`{k}` {v}" for k, v in m["last"].items() if m["first"].get(k) == v]
        lines.append("- Pageserver series in `/metrics` (`pageserver_*` with _runs, _layers or _bytes, and compaction, "
                     "image and GC), first reading → last: " + (", ".join(changed) or "none changed") +
                     ("; unchanged: " + ", ".join(same) if same else "") + ".")
    else:
        lines.append("- Pageserver series of background jobs in `/metrics`: none.")
    return "\n".join(lines) + "\n"


# --- main -----------------------------------------------------------------------------------

def machine() -> str:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, {ram:.0f} GiB RAM"


def find_rels(connstr: str) -> dict:
    q = """SELECT COALESCE(NULLIF(c.reltablespace, 0), d.dattablespace), d.oid, pg_relation_filenode(c.oid)
             FROM pg_class c, pg_database d WHERE c.relname = %s AND d.datname = current_database()"""
    with psycopg.connect(connstr, autocommit=True) as conn:
        rels = {k: RelTag(*conn.execute(q, (f"pgbench_{k}",)).fetchone()) for k in ("branches", "accounts")}
        rels["shared_buffers"] = conn.execute("SHOW shared_buffers").fetchone()[0]
    return rels


def run(a, work: Path, result: dict) -> None:
    repo = FjordRepo(work / "repo")
    cluster = Cluster(repo, safekeepers=3)
    pgbench = None
    try:
        init = []
        if a.remote_storage:
            init += ["--remote-storage", a.remote_storage]
        if a.layer_disk_budget_bytes:
            init += ["--layer-disk-budget-bytes", str(a.layer_disk_budget_bytes)]
        log(f"fjord init in {repo.path} (base port {repo.base_port}), start, tenant create, endpoint start main")
        try:
            repo.init(*init)
            repo.run("start")
            tenant = repo.run("tenant", "create").stdout.strip()
            timeline = repo.state()["tenants"][tenant]["branches"]["main"]
            connstr = repo.run("endpoint", "start", "main").stdout.strip()
        except AssertionError as e:  # FjordRepo.run: a command failed; the message has its output
            raise SoakFailure(str(e)) from None
        if a.remote_storage is None:
            remote_dir = repo.path / "remote_storage"
        elif a.remote_storage.startswith("file://"):
            remote_dir = Path(a.remote_storage[len("file://"):])
        else:
            remote_dir = None  # S3: not measured

        log(f"pgbench -i -s {a.scale}")
        t0 = time.monotonic()
        r = subprocess.run([str(pg_bin_dir() / "pgbench"), "-i", "-s", str(a.scale), "-q", connstr],
                           capture_output=True, text=True)
        if r.returncode != 0:
            cluster.check_alive()
            raise SoakFailure(f"pgbench -i failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        result["init_s"] = round(time.monotonic() - t0, 1)
        rels = find_rels(connstr)
        result["compute"] = {"shared_buffers": rels.pop("shared_buffers")}
        result["relations"] = {k: vars(v) for k, v in rels.items()}
        log(f"pgbench -i took {result['init_s']} s; read-write for {a.duration} s, {a.clients} clients")

        soak = Soak(a, cluster, tenant, timeline, rels, remote_dir)
        result["readings"] = soak.readings
        sks = cluster.safekeepers
        print("| at s | TPS | lat ms | hot p50/p99 µs (n) | random p50/p99 µs (n) | LSN | not in layers | not uploaded | "
              "queue | layers | resident | pageserver | safekeepers | object storage |", flush=True)
        wall0 = time.monotonic()
        pgbench = Pgbench(connstr, a.clients, a.duration)
        k = 1
        while True:
            lines = pgbench.wait_for(k * a.interval, wall0 + a.duration + 600)
            why = pgbench.broken()
            if why:
                cluster.check_alive()
                raise SoakFailure(why)
            last_t = pgbench.progress[lines - 1][0] if lines else 0.0
            prev_t = soak.readings[-1]["t_s"] if soak.readings else 0.0
            if pgbench.done and last_t <= prev_t + 0.5:
                break
            reading = soak.take(pgbench, lines, time.monotonic() - wall0)
            print(row(reading, sks), flush=True)
            while k * a.interval <= reading["t_s"] + 0.5:
                k += 1
        rc = pgbench.finish()
        why = pgbench.broken()
        if rc != 0 or why:
            cluster.check_alive()
            raise SoakFailure(why or f"pgbench exited with status {rc}:\n" + "\n".join(pgbench.errors[-20:]))
        result["pgbench"] = pgbench.summary()
        result["pgbench_progress"] = [[t, round(n)] for t, n, _, _ in pgbench.progress]
        end = pgbench.progress[-1][0] if pgbench.progress else 0.0
        # pgbench may end before it prints its last second's progress line.
        if end < a.duration * 0.9 - 1:
            raise SoakFailure(f"pgbench stopped reporting progress at {end} s of {a.duration} s")
        cluster.check_alive()
        result["summary"] = summarize(soak.readings, pgbench.progress, a.duration, sks)
    except SoakFailure as e:
        raise SoakFailure(f"{e}\n\nend of the logs:\n{cluster.logs_tail()}\nfree disk: "
                          f"{shutil.disk_usage(work).free / MIB:.0f} MiB") from None
    finally:
        # A second Ctrl-C or SIGTERM must not cut the cleanup short (nor the `fjord stop` it runs).
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if pgbench:
            pgbench.stop()
        log("stopping the cluster (fjord stop)")
        cluster.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--duration", type=int, default=1800)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--interval", type=int, default=30)
    p.add_argument("--remote-storage", default=None)
    p.add_argument("--layer-disk-budget-bytes", type=int, default=None)
    p.add_argument("--work-dir", default=None, help="where the temporary repo goes (default: $TMPDIR)")
    p.add_argument("--json", required=True)
    p.add_argument("--markdown", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--flavor", required=True)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    result: dict = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "command": a.command, "flavor": a.flavor,
        "machine": machine(),
        "settings": {"scale": a.scale, "duration": a.duration, "clients": a.clients, "interval": a.interval,
                     "remote_storage": a.remote_storage, "layer_disk_budget_bytes": a.layer_disk_budget_bytes,
                     "safekeepers": 3, "getpage_requests": GETPAGE_REQUESTS},
        "readings": [],
    }
    work = Path(tempfile.mkdtemp(prefix="fjord-soak-", dir=a.work_dir))
    failure = None
    try:
        run(a, work, result)
    except SoakFailure as e:
        failure = str(e)
    except (KeyboardInterrupt, Interrupted) as e:
        failure = f"interrupted ({str(e) or 'Ctrl-C'})"
    except Exception as e:  # a bug here or a surprise from the environment: still a clear end
        traceback.print_exc()
        failure = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failure:
        result["failure"] = failure
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"bench-soak: FAILED after {len(result['readings'])} readings (partial results in {a.json}): "
              f"{failure}", file=sys.stderr, flush=True)
        sys.exit(1)
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    md = render(result)
    Path(a.markdown).write_text(md)
    print()
    print(md)


if __name__ == "__main__":
    main()
