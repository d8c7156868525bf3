"""Certificates rotated under load, and one about to expire.

- Rotation: a pageserver and three safekeepers with TLS on, a compute running pgbench
  read-write. The services' certificates and keys are replaced in place (each file written
  aside and renamed over it) by new ones from the same CA; each service picks them up by
  itself (its reloader looks at the files about once a second): a fresh handshake sees the
  new serial number on every port, and `/metrics` the new expiry. pgbench goes on for a few
  more seconds and ends with no failed transaction, and no established connection was
  dropped: the compute's page service connections never reconnected, its WAL proposer never
  restarted, and no safekeeper accepted a new proposer connection.
- Expiry: a certificate valid for ten more days makes the service log a WARN that says so
  (at the reload that picks it up) and shows its `not_after` in
  `fjord_tls_certificate_expiry_timestamp_seconds`.

The new certificates come from `fixtures/certs.py` (Python's `cryptography`, signed with the
test session's CA key), not from the services' own code.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import time

import pytest

from fixtures import certs
from fixtures.compute import Endpoint, Timeline
from fixtures.pageserver import Pageserver
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until
from fixtures.safekeeper import Safekeeper

tls = pytest.importorskip("fixtures.tls", reason="the services have no TLS yet (no fixtures/tls.py)")

EXPIRY_METRIC = "fjord_tls_certificate_expiry_timestamp_seconds"


def expiry_metric(http) -> float:
    """The expiry gauge from a service's `/metrics` (`http` is its fixture's `http`)."""
    for line in http("GET", "/metrics").splitlines():
        if line.startswith(EXPIRY_METRIC + " "):
            return float(line.split()[1])
    raise KeyError(f"no {EXPIRY_METRIC} in /metrics")


def storage_counters(ep: Endpoint) -> dict:
    """What would move if an established connection of the compute were dropped."""
    with ep.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS fjord")
        reconnects = conn.execute("SELECT pageserver_reconnects FROM fjord.storage_manager()").fetchone()[0]
        starts = conn.execute("SELECT proposer_starts FROM fjord.walproposer_status()").fetchone()[0]
    return {"pageserver_reconnects": reconnects, "proposer_starts": starts}


def test_certificates_replaced_under_pgbench(tmp_path):
    ca = tls.session_ca()
    ps = Pageserver(tmp_path).start()
    sks = [Safekeeper(tmp_path / "safekeepers", i).start() for i in (1, 2, 3)]
    tl = Timeline(tmp_path, ps)
    ep = Endpoint(tmp_path, tl, safekeepers=sks).start()
    pgbench = [str(pg_bin_dir() / "pgbench"), "-h", "127.0.0.1", "-p", str(ep.port), "-U", ep.user]
    subprocess.run([*pgbench, "-i", "-s", "1", "-q", "postgres"], check=True, capture_output=True, timeout=300)

    # The ports and what each serves now; a safekeeper's listener wants SSLRequest first.
    ports = [("pageserver page service", ps.host, ps.pg_port, False), ("pageserver HTTP", ps.host, ps.http_port, False)]
    for sk in sks:
        ports += [(f"safekeeper {sk.id}", sk.host, sk.port, True), (f"safekeeper {sk.id} HTTP", sk.host, sk.http_port, False)]
    old_serials = {name: certs.served_certificate(host, port, ca.cert, ssl_request).serial_number
                   for name, host, port, ssl_request in ports}
    old_expiry = [expiry_metric(s.http) for s in (ps, *sks)]
    before = storage_counters(ep)
    proposer_conns = [sk.metric_labelled("safekeeper_connections_total", 'kind="proposer"') for sk in sks]

    bench = subprocess.Popen([*pgbench, "-n", "-c", "4", "-j", "2", "-T", "15", "postgres"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        # New pairs from the same CA, valid for a year less a day (a not_after no pair had).
        new = {}
        for name, service in [("pageserver", ps), *((f"safekeeper-{sk.id}", sk) for sk in sks)]:
            issued = certs.issue(ca.cert, ca.key, name, ["localhost", "127.0.0.1"], datetime.timedelta(days=364))
            certs.replace_pair(service.tls_cert, service.tls_key, issued)
            new[name] = issued
        serial_of = {"pageserver": new["pageserver"].serial, **{f"safekeeper {sk.id}": new[f"safekeeper-{sk.id}"].serial for sk in sks}}

        def serving_new() -> bool:
            for name, host, port, ssl_request in ports:
                want = serial_of[name.removesuffix(" HTTP").removesuffix(" page service")]
                if certs.served_certificate(host, port, ca.cert, ssl_request).serial_number != want:
                    return False
            return True
        wait_until("every port to serve its new certificate", serving_new, timeout_s=30, interval_s=0.2)
        rotated_at = time.monotonic()
        for s, issued in [(ps, new["pageserver"]), *((sk, new[f"safekeeper-{sk.id}"]) for sk in sks)]:
            assert expiry_metric(s.http) == issued.not_after.timestamp(), f"{s.service_name}: the metric kept the old expiry"
        assert all(expiry_metric(s.http) != old for s, old in zip((ps, *sks), old_expiry))
        assert bench.poll() is None, "pgbench ended before the rotation was seen: the test saw no load across it"
        out, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 0, f"pgbench failed across the rotation:\n{out}\n{err}"
    assert time.monotonic() - rotated_at >= 2, "pgbench ran on for less than two seconds after the rotation"
    failed = re.search(r"number of failed transactions: (\d+)", out)
    assert failed is None or failed.group(1) == "0", out
    processed = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    assert processed > 0, out
    assert {name: certs.served_certificate(h, p, ca.cert, r).serial_number for name, h, p, r in ports} != old_serials

    # No established connection was dropped.
    assert storage_counters(ep) == before
    assert [sk.metric_labelled("safekeeper_connections_total", 'kind="proposer"') for sk in sks] == proposer_conns
    print(f"pgbench across the rotation: {processed} transactions, none failed")


# Expected: the warning the test provokes.
@pytest.mark.allowed_errors(r"the TLS certificate \S+ expires in \d+ days")
def test_a_certificate_about_to_expire_is_logged_and_shown_in_metrics(tmp_path):
    ca = tls.session_ca()
    ps = Pageserver(tmp_path).start()
    sk = Safekeeper(tmp_path / "safekeepers", 1).start()
    for service, name in ((ps, "pageserver"), (sk, "safekeeper-1")):
        issued = certs.issue(ca.cert, ca.key, name, ["localhost", "127.0.0.1"], datetime.timedelta(days=10, hours=1))
        certs.replace_pair(service.tls_cert, service.tls_key, issued)
        wait_until(f"{name} to show the new expiry",
                   lambda: expiry_metric(service.http) == issued.not_after.timestamp(), timeout_s=30, interval_s=0.2)
        wait_until(f"{name} to warn of the expiry",
                   lambda: re.search(r"WARN.*the TLS certificate \S+ expires in 10 days", service.log_text()), timeout_s=10)
