"""The page service over TLS, with real processes: a plaintext client, a client of another
CA and one that expects another host are refused with a clear error and counted, while the
service goes on serving; a compute that trusts another CA fails its query at once with the
reason."""

from __future__ import annotations

import socket
import ssl

import psycopg
import pytest

from fixtures import tls
from fixtures.compute import Endpoint, Timeline
from fixtures.pagestream import PageServiceClient, PageServiceError
from fixtures.postgres import wait_until

TENANT = "11111111111111111111111111111111"
TIMELINE = "22222222222222222222222222222222"


def refusals(ps) -> dict[str, float]:
    prefix = 'pageserver_tls_handshake_failures_total{reason="'
    return {k[len(prefix):].split('"')[0]: v for k, v in ps.metrics().items()
            if k.startswith(prefix) and 'service="page_service"' in k}


def test_the_page_service_refuses_clients_without_the_clusters_tls(pageserver, tmp_path):
    ps = pageserver
    assert ps.tls is not None, "the fixture serves TLS by default"
    ps.http("POST", "/v1/tenant", {"tenant_id": TENANT})
    ps.http("POST", f"/v1/tenant/{TENANT}/timeline", {"timeline_id": TIMELINE})
    ps.allowed_errors += ["page service refused a client without TLS", "page service TLS handshake failed"]
    before = refusals(ps)

    # No TLS: the client's own protocol says why.
    with pytest.raises(PageServiceError) as e:
        PageServiceClient(ps.host, ps.pg_port, TENANT, TIMELINE)
    assert e.value.code == "protocol" and "requires TLS" in e.value.message, e.value

    # Trusting another CA, or expecting a certificate for another host: the client refuses.
    other = tls.Ca(tmp_path / "other-ca")
    with pytest.raises(ssl.SSLCertVerificationError):
        PageServiceClient(ps.host, ps.pg_port, TENANT, TIMELINE, ca=other.cert)
    context = ssl.create_default_context(cafile=str(ps.tls))
    with socket.create_connection((ps.host, ps.pg_port), timeout=30) as raw:
        with pytest.raises(ssl.SSLCertVerificationError, match="pageserver-2.example"):
            context.wrap_socket(raw, server_hostname="pageserver-2.example")

    # Each refusal is counted (the server notices a refused handshake when the client goes).
    def counted() -> bool:
        after = refusals(ps)
        grew = {r: after.get(r, 0) - before.get(r, 0) for r in after}
        return grew.get("plaintext") == 1 and grew.get("handshake", 0) + grew.get("closed", 0) == 2
    wait_until("the refusals to be counted", counted)
    assert "page service refused a client without TLS" in ps.log_text()

    # The service goes on serving clients of the cluster, by either name its certificate has.
    PageServiceClient.of(ps, TENANT, TIMELINE).close()
    PageServiceClient("localhost", ps.pg_port, TENANT, TIMELINE, ca=ps.tls).close()


def test_a_compute_that_trusts_another_ca_fails_its_query_with_the_reason(tmp_path, pageserver):
    other = tls.Ca(tmp_path / "other-ca")
    ep = Endpoint(tmp_path, Timeline(tmp_path, pageserver)).start()
    # A compute told to trust another cluster's CA: a backend's first page service
    # connection fails at once (no retries until fjord.pageserver_timeout).
    ep.sql("CREATE TABLE t AS SELECT 1 AS x")
    ca_file = ep.sql("SHOW fjord.tls_ca_file")[0][0]
    assert ca_file, "compute_ctl set the CA"
    ep.stop()
    ep.settings = {"fjord.tls_ca_file": str(other.cert)}
    # The backend's own start reads catalogs from the pageserver, so the connection itself
    # fails, with the reason (and so does the pageserver's WAL receiver's, which follows
    # this compute).
    reason = "not signed by the cluster CA"
    pageserver.allowed_errors += ["page service TLS handshake failed", reason]
    ep.allowed_errors += [reason]
    ep.start()
    with pytest.raises(psycopg.OperationalError, match=reason) as e:
        ep.sql("SELECT count(*) FROM t")
    assert "could not connect to the pageserver" in str(e.value) and "fjord.tls_ca_file" in str(e.value)
