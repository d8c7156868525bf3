"""Certificates rotated under load, and one about to expire, on a cluster the `fjord` CLI
runs (TLS and authentication on, as `fjord init` makes them: a pageserver, three
safekeepers, an endpoint).

- Rotation: while pgbench read-write runs on the endpoint, the pageserver's and the
  safekeepers' certificates and keys are replaced in place by new ones that `fjord cert
  issue` makes from the cluster CA (each file written aside and renamed over the old one).
  Each service picks them up by itself (its reloader looks at the files about once a
  second): a fresh handshake on every port sees the new serial number, and `/metrics` the
  new expiry. pgbench goes on for a few more seconds and ends with no failed transaction,
  and no established connection was dropped: no page service connection of the compute
  failed (none logged), its WAL proposer never restarted, and no safekeeper accepted
  another proposer connection.
- Expiry: a certificate valid for ten days (`fjord cert issue --days 10`) makes the service
  log a WARN that says so when it loads it, and shows its `not_after` in
  `fjord_tls_certificate_expiry_timestamp_seconds`.

What each port serves is read with Python's `ssl` (`fixtures/certs.py`), trusting the
cluster CA only.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from fixtures import certs
from fixtures.cli import FjordRepo
from fixtures.paths import pg_bin_dir
from fixtures.postgres import wait_until

EXPIRY_METRIC = "fjord_tls_certificate_expiry_timestamp_seconds"
SAFEKEEPERS = (1, 2, 3)


@pytest.fixture
def repo(tmp_path: Path):
    repo = FjordRepo(tmp_path / "repo").init()
    try:
        repo.run("start")
        yield repo
    finally:
        repo.cleanup()


def ports(repo: FjordRepo) -> list[tuple[str, str, int, bool]]:
    """(service, what, port, whether SSLRequest goes first) for every TLS port."""
    b = repo.base_port
    out = [("pageserver", "page service", b, False), ("pageserver", "HTTP", b + 1, False)]
    for i in SAFEKEEPERS:
        out += [(f"safekeeper-{i}", "port", b + 2 * i, True), (f"safekeeper-{i}", "HTTP", b + 2 * i + 1, False)]
    return out


def serials(repo: FjordRepo) -> dict[tuple[str, str], int]:
    ca = repo.tls_ca()
    return {(service, what): certs.served_certificate("127.0.0.1", port, ca, ssl_request).serial_number
            for service, what, port, ssl_request in ports(repo)}


def expiry(repo: FjordRepo, http_port: int) -> float | None:
    """The expiry gauge in the `/metrics` of the service on `http_port`; None if absent."""
    with repo.urlopen(f"{repo.http_url(http_port)}/metrics", timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(EXPIRY_METRIC + " "):
                return float(line.split()[1])
    return None


def http_ports(repo: FjordRepo) -> dict[str, int]:
    return {"pageserver": repo.base_port + 1, **{f"safekeeper-{i}": repo.base_port + 2 * i + 1 for i in SAFEKEEPERS}}


def rotate(repo: FjordRepo, tmp: Path, service: str, days: int) -> certs.x509.Certificate:
    """`fjord cert issue` for `service` into a new directory, then the pair renamed over the
    service's files in the repo; the new certificate."""
    out = tmp / f"new-{service}-{time.monotonic_ns()}"
    repo.run("cert", "issue", "--name", service, "--host", "localhost", "--host", "127.0.0.1", "--out", str(out),
             "--days", str(days))
    cert_pem, key_pem = (out / f"{service}.crt").read_bytes(), (out / f"{service}.key").read_bytes()
    certs.replace_pair(repo.path / "tls" / f"{service}.crt", repo.path / "tls" / f"{service}.key", cert_pem, key_pem)
    return certs.load(out / f"{service}.crt")


def page_service_failures(repo: FjordRepo) -> int:
    """How often the endpoint's sessions logged a page service connection that failed (each
    then reconnects). `pageserver_reconnects` would not tell: it counts every session's
    first connection too."""
    return sum(len(re.findall(r"fjord: page service at \S+ failed", p.read_text(errors="replace")))
               for p in (repo.path / "endpoints").rglob("*.log"))


def connection_counters(repo: FjordRepo, connstr: str) -> dict:
    """What would move if an established connection were dropped: the compute's page
    service failures and WAL proposer starts, the safekeepers' proposer connections."""
    with psycopg.connect(connstr, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS fjord")
        out = {
            "page service failures": page_service_failures(repo),
            "proposer_starts": conn.execute("SELECT proposer_starts FROM fjord.walproposer_status()").fetchone()[0],
        }
    for service, port in http_ports(repo).items():
        if service.startswith("safekeeper"):
            with repo.urlopen(f"{repo.http_url(port)}/metrics", timeout=30) as resp:
                m = re.search(r'^safekeeper_connections_total\{kind="proposer"\} (\S+)$', resp.read().decode(), re.M)
            out[f"{service} proposer connections"] = float(m.group(1)) if m else 0.0
    return out


def test_certificates_replaced_under_pgbench(repo, tmp_path):
    repo.run("tenant", "create")
    connstr = repo.run("endpoint", "start", "main").stdout.strip()
    pgbench = [str(pg_bin_dir() / "pgbench")]
    subprocess.run([*pgbench, "-i", "-s", "1", "-q", connstr], check=True, capture_output=True, timeout=300)

    old_serials = serials(repo)
    old_expiry = {s: expiry(repo, port) for s, port in http_ports(repo).items()}
    before = connection_counters(repo, connstr)

    bench = subprocess.Popen([*pgbench, "-n", "-c", "4", "-j", "2", "-T", "12", connstr],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        new = {service: rotate(repo, tmp_path, service, days=364) for service in http_ports(repo)}

        def serving_new() -> bool:
            return all(serial == new[service].serial_number for (service, _), serial in serials(repo).items())
        wait_until("every port to serve its new certificate", serving_new, timeout_s=30, interval_s=0.2)
        rotated_at = time.monotonic()
        new_expiry = {s: expiry(repo, port) for s, port in http_ports(repo).items()}
        assert bench.poll() is None, "pgbench ended before every service served its new certificate"
        out, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
    assert bench.returncode == 0, f"pgbench failed across the rotation:\n{out}\n{err}"
    ran_on = time.monotonic() - rotated_at
    assert ran_on >= 2, f"pgbench ran on for only {ran_on:.1f} s after the rotation"
    failed = re.search(r"number of failed transactions: (\d+)", out)
    assert failed is None or failed.group(1) == "0", out
    processed = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    assert processed > 0, out
    assert all(old_serials[k] != v for k, v in serials(repo).items())

    # No established connection was dropped.
    assert connection_counters(repo, connstr) == before
    print(f"pgbench across the rotation: {processed} transactions, none failed; ran on {ran_on:.1f} s after it")

    # The expiry gauge followed the new certificates.
    missing = [s for s, v in {**old_expiry, **new_expiry}.items() if v is None]
    assert not missing, f"no {EXPIRY_METRIC} in the /metrics of {sorted(set(missing))}"
    for service, cert in new.items():
        assert new_expiry[service] == cert.not_valid_after_utc.timestamp() != old_expiry[service], service


# Expected: the warnings the test provokes.
@pytest.mark.allowed_errors(r"the TLS certificate \S+ expires in \d+ days")
def test_a_certificate_about_to_expire_is_logged_and_shown_in_metrics(repo, tmp_path):
    for service, port in http_ports(repo).items():
        if service not in ("pageserver", "safekeeper-1"):
            continue
        new = rotate(repo, tmp_path, service, days=10)
        log = "pageserver.log" if service == "pageserver" else f"{service.replace('-', '')}.log"
        wait_until(f"the {service} to warn of the expiry",
                   lambda: re.search(r"WARN.*the TLS certificate \S+ expires in (9|10) days", repo.log(log)), timeout_s=30)
        not_after = new.not_valid_after_utc.timestamp()
        wait_until(f"the {service} to show the new expiry", lambda: expiry(repo, port) == not_after, timeout_s=10,
                   interval_s=0.2)
