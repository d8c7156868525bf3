"""GetPage@LSN through a real pageserver's page service, with TLS on and off, in one run.

Run through scripts/bench-pageserver (`--tls on|off|both`), after its in-process benchmark.
A plain PostgreSQL of our build gets `pgbench -i -s SCALE` and is shut down; for each TLS
setting a pageserver process imports that data directory into a new timeline, and one page
service connection (`fixtures/pagestream.py`, with Python's `ssl` for TLS: the client is
the same on both sides) reads random `pgbench_accounts` blocks at the timeline's last
record LSN, one request at a time; the latency of each round trip is recorded after a
warm-up of as many reads (the pages then come from the pageserver's caches, so what
differs between the settings is the link). The client's own cost is in every number, the
same with TLS on and off.

Adds `page_service` to the JSON results file and a paragraph to the markdown section.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixtures.pageserver import Pageserver  # noqa: E402
from fixtures.pagestream import PageServiceClient, RelTag, lsn_int  # noqa: E402
from fixtures.pgbench import pgbench  # noqa: E402
from fixtures.postgres import PgServer  # noqa: E402

DEFAULT_TABLESPACE = 1663


def percentile(sorted_us: list[float], q: float) -> float:
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


def measure(base: Path, pgdata: Path, rel: RelTag, nblocks: int, samples: int, tls: bool) -> dict:
    """Imports `pgdata` into a new pageserver with TLS on or off and reads `samples` random
    blocks of `rel` after as many warm-up reads; the latencies in microseconds."""
    name = "tls-on" if tls else "tls-off"
    ps = Pageserver(base / name, tls=tls).start()
    try:
        tenant, timeline = uuid.uuid4().hex, uuid.uuid4().hex
        ps.http("POST", "/v1/tenant", {"tenant_id": tenant})
        ps.http("POST", f"/v1/tenant/{tenant}/timeline", {"timeline_id": timeline})
        ps.http("POST", f"/v1/tenant/{tenant}/timeline/{timeline}/import", {"pgdata": str(pgdata)})
        lsn = lsn_int(ps.http("GET", f"/v1/tenant/{tenant}/timeline/{timeline}")["last_record_lsn"])
        rng = random.Random(1)
        t0 = time.monotonic()
        client = PageServiceClient.of(ps, tenant, timeline)
        connect_ms = (time.monotonic() - t0) * 1000
        try:
            for _ in range(samples):
                client.get_page(rel, rng.randrange(nblocks), lsn)
            times = []
            for _ in range(samples):
                blk = rng.randrange(nblocks)
                t = time.perf_counter()
                client.get_page(rel, blk, lsn)
                times.append((time.perf_counter() - t) * 1e6)
        finally:
            client.close()
    finally:
        ps.stop()
    times.sort()
    return {"samples": samples, "p50_us": round(percentile(times, 0.5), 1), "p99_us": round(percentile(times, 0.99), 1),
            "max_us": round(times[-1], 1), "mean_us": round(statistics.fmean(times), 1),
            "connect_ms": round(connect_ms, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--tls", choices=["on", "off", "both"], default="both")
    p.add_argument("--json", required=True)
    p.add_argument("--markdown", required=True)
    a = p.parse_args()
    modes = {"on": [True], "off": [False], "both": [False, True]}[a.tls]

    with tempfile.TemporaryDirectory(prefix="fjord-bench-") as tmp:
        base = Path(tmp)
        pg = PgServer(base, "plain").initdb().start()
        try:
            pgbench(pg.port, pg.user, "-i", "-s", str(a.scale), "-q")
            with pg.connect() as conn:
                relnode, db, size = conn.execute(
                    "SELECT pg_relation_filenode('pgbench_accounts'), (SELECT oid FROM pg_database WHERE datname = "
                    "current_database()), pg_relation_size('pgbench_accounts')").fetchone()
        finally:
            pg.stop("fast")
        rel, nblocks = RelTag(DEFAULT_TABLESPACE, db, relnode), size // 8192
        results = {}
        for tls in modes:
            name = "tls_on" if tls else "tls_off"
            results[name] = measure(base, pg.datadir, rel, nblocks, a.samples, tls)
            print(f"page service, TLS {'on' if tls else 'off'}: GetPage@LSN {results[name]}", flush=True)

    data = json.loads(Path(a.json).read_text())
    data["page_service"] = {"pgbench_accounts_blocks": nblocks, **results}
    Path(a.json).write_text(json.dumps(data, indent=2) + "\n")

    def cell(name: str) -> str:
        r = results.get(name)
        return f"p50 {r['p50_us']:.0f} µs, p99 {r['p99_us']:.0f} µs (connect {r['connect_ms']:.1f} ms)" if r else "not run"
    line = (f"\nGetPage@LSN through the page service of a pageserver process (one connection on loopback, one "
            f"request at a time, {a.samples} random `pgbench_accounts` blocks of {nblocks} after as many warm-up "
            f"reads; the client is Python's, the same on both sides): TLS off {cell('tls_off')}; TLS on {cell('tls_on')}")
    if "tls_on" in results and "tls_off" in results:
        line += f" (p50 x{results['tls_on']['p50_us'] / results['tls_off']['p50_us']:.2f})"
    with open(a.markdown, "a") as md:
        md.write(line + ".\n")
    print(line.strip())


if __name__ == "__main__":
    main()
