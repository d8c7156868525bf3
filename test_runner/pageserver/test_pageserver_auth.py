"""Tenant-scoped tokens on a real pageserver: the management API and the page service
accept a client only with a token signed by the cluster's key that grants what it asks;
every refusal is a clear error, logged and counted, and changes nothing."""

from __future__ import annotations

import uuid

import pytest

from fixtures.auth import KeyPair, bad_tokens
from fixtures.pageserver import HttpError, Pageserver
from fixtures.pagestream import PageServiceClient, PageServiceError

# Expected in these tests' logs: the refusals the tests provoke.
pytestmark = pytest.mark.allowed_errors(r"(management API|page service) refused a (request|client)")


def new_id() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def secured(tmp_path):
    keys = KeyPair(tmp_path / "keys")
    ps = Pageserver(tmp_path, auth_public_key=keys.public_path).start()
    ps.token = keys.admin()
    try:
        yield ps, keys, KeyPair(tmp_path / "other-keys")
    finally:
        ps.stop()


def refused(ps: Pageserver, method: str, path: str, token: str, body: dict | None = None) -> HttpError:
    with pytest.raises(HttpError) as e:
        ps.http(method, path, body, token=token)
    return e.value


def failures(ps: Pageserver, service: str) -> dict[str, float]:
    """pageserver_auth_failures_total of `service`, by reason."""
    out = {}
    for name, value in ps.metrics().items():
        if name.startswith("pageserver_auth_failures_total{") and f'service="{service}"' in name:
            out[name.split('reason="')[1].split('"')[0]] = value
    return out


def test_the_management_api_wants_an_admin_token_and_says_why(secured):
    ps, keys, other = secured
    tenant, other_tenant = new_id(), new_id()
    assert "authentication is on" in ps.log_text()

    # Liveness and metrics stay open.
    assert ps.http("GET", "/v1/status", token="")["status"] == "ok"
    assert "pageserver_auth_failures_total" in ps.http("GET", "/metrics", token="")

    # No token: 401, and nothing is created.
    e = refused(ps, "POST", "/v1/tenant", "", {"tenant_id": tenant})
    assert e.status == 401 and "authentication required" in e.body["error"], e
    # A tenant token is not a management token, even for its own tenant: 403.
    e = refused(ps, "POST", "/v1/tenant", keys.tenant(tenant), {"tenant_id": tenant})
    assert e.status == 403 and "may not use the management API" in e.body["error"], e
    for name, token in bad_tokens(keys, other, tenant, other_tenant):
        e = refused(ps, "POST", "/v1/tenant", token, {"tenant_id": tenant})
        assert e.status in (401, 403) and e.body["error"], (name, e)
    assert ps.http("GET", "/v1/tenant") == [], "no refused request created a tenant"

    ps.http("POST", "/v1/tenant", {"tenant_id": tenant})
    assert ps.http("GET", "/v1/tenant") == [tenant]

    counts = failures(ps, "http")
    assert counts["missing"] >= 1 and counts["forbidden"] >= 2 and counts["bad_signature"] >= 1, counts
    assert counts["expired"] >= 1 and counts["malformed"] >= 2, counts
    assert "management API refused a request" in ps.log_text()


def test_a_compute_token_reaches_its_own_timeline_only(secured):
    ps, keys, other = secured
    tenant, other_tenant = new_id(), new_id()
    ps.http("POST", "/v1/tenant", {"tenant_id": tenant})
    timeline = ps.http("POST", f"/v1/tenant/{tenant}/timeline", {})["timeline_id"]
    sibling = ps.http("POST", f"/v1/tenant/{tenant}/timeline", {})["timeline_id"]
    path = f"/v1/tenant/{tenant}/timeline/{timeline}"

    # The calls a compute makes take its tenant token, or one for the timeline.
    for token in (keys.tenant(tenant), keys.tenant(tenant, timeline)):
        assert ps.http("GET", path, token=token)["timeline_id"] == timeline
    e = refused(ps, "GET", path, keys.tenant(tenant, sibling))
    assert e.status == 403 and sibling in e.body["error"], e
    e = refused(ps, "GET", path, keys.tenant(other_tenant))
    assert e.status == 403 and f"the token is for tenant {other_tenant}" in e.body["error"], e
    # The rest of the API stays admin-only, even on the token's own timeline.
    e = refused(ps, "POST", f"{path}/checkpoint", keys.tenant(tenant))
    assert e.status == 403, e
    e = refused(ps, "GET", path, keys.storage())
    assert e.status == 403, e

    # The page service: a Hello without a token or with a wrong one is refused before the
    # timeline is looked up (the same answer for a timeline that does not exist).
    before = failures(ps, "page_service")
    for token, tl in [("", timeline), (keys.tenant(other_tenant), timeline), (other.tenant(tenant), timeline),
                      (keys.tenant(tenant, sibling), timeline), ("", new_id())]:
        with pytest.raises(PageServiceError) as e:
            PageServiceClient.of(ps, tenant, tl, token=token)
        assert e.value.code == "unauthorized" and e.value.message, e.value
    after = failures(ps, "page_service")
    assert sum(after.values()) - sum(before.values()) == 5, (before, after)
    assert after["wrong_tenant"] - before["wrong_tenant"] == 1 and after["bad_signature"] - before["bad_signature"] == 1
    assert "page service refused a client" in ps.log_text()

    PageServiceClient.of(ps, tenant, timeline, token=keys.tenant(tenant, timeline)).close()
