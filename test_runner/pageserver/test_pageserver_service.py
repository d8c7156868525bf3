"""The pageserver as a process: management API, import, page service, restart."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from fixtures.logs import unexpected_lines
from fixtures.pageserver import HttpError
from fixtures.pagestream import PageServiceClient, PageServiceError, RelTag, lsn_int
from fixtures.paths import pg_bin_dir

TENANT = "11111111111111111111111111111111"
TIMELINE = "22222222222222222222222222222222"


def initdb(tmp_path: Path) -> Path:
    pgdata = tmp_path / "pgdata"
    subprocess.run(
        [str(pg_bin_dir() / "initdb"), "-D", str(pgdata), "--no-sync", "-E", "UTF8", "--locale=C", "-U", "fjord_admin"],
        check=True, capture_output=True,
    )
    return pgdata


def relation_files(pgdata: Path, dbnode: int) -> list[tuple[int, Path]]:
    """Main-fork files of plain numbered relations in base/<dbnode>."""
    out = []
    for f in sorted((pgdata / "base" / str(dbnode)).iterdir()):
        if re.fullmatch(r"\d+", f.name):
            out.append((int(f.name), f))
    return out


def test_import_and_serve_pages(pageserver, tmp_path):
    pgdata = initdb(tmp_path)
    assert pageserver.http("POST", "/v1/tenant", {"tenant_id": TENANT}) == {"tenant_id": TENANT}
    tl = pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline", {"timeline_id": TIMELINE})
    assert tl["timeline_id"] == TIMELINE and tl["last_record_lsn"] == "0/0"
    summary = pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/import", {"pgdata": str(pgdata)})
    lsn = lsn_int(summary["import_lsn"])
    status = pageserver.http("GET", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}")
    assert status["last_record_lsn"] == summary["import_lsn"]
    assert status["disk_consistent_lsn"] == summary["import_lsn"], "import is flushed to layer files"

    # Every block of every relation of template1 (database 1) comes back as on disk.
    client = PageServiceClient.of(pageserver, TENANT, TIMELINE)
    files = relation_files(pgdata, 1)
    assert len(files) > 100
    blocks = 0
    for relnode, path in files:
        data = path.read_bytes()
        rel = RelTag(1663, 1, relnode)
        assert client.nblocks(rel, lsn) == len(data) // 8192, path
        for blk in range(len(data) // 8192):
            assert client.get_page(rel, blk, lsn) == data[blk * 8192:(blk + 1) * 8192], (path, blk)
            blocks += 1
    assert blocks > 200

    with pytest.raises(PageServiceError) as e:
        client.get_page(RelTag(1663, 1, files[0][0]), 100000, lsn)
    assert e.value.code == "no_such_block" and "block 100000" in e.value.message
    client.close()

    metrics = pageserver.http("GET", "/metrics")
    assert f'pageserver_last_record_lsn{{tenant_id="{TENANT}",timeline_id="{TIMELINE}"}} {lsn}' in metrics

    # A restart loads the tenant from disk and serves the same pages.
    pageserver.stop()
    pageserver.start()
    assert pageserver.http("GET", "/v1/tenant") == [TENANT]
    client = PageServiceClient.of(pageserver, TENANT, TIMELINE)
    relnode, path = files[-1]
    assert client.get_page(RelTag(1663, 1, relnode), 0, lsn) == path.read_bytes()[:8192]
    client.close()
    assert unexpected_lines(pageserver.log_text()) == []


def test_branches_are_listed_with_their_ancestry(pageserver, tmp_path):
    pgdata = initdb(tmp_path)
    pageserver.http("POST", "/v1/tenant", {"tenant_id": TENANT})
    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline", {"timeline_id": TIMELINE})
    summary = pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/import", {"pgdata": str(pgdata)})
    with pytest.raises(HttpError) as e:
        pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/import", {"pgdata": str(pgdata)})
    assert e.value.status == 409 and "needs an empty timeline" in e.value.body["error"]
    with pytest.raises(HttpError) as e:
        pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline", {"timeline_id": TIMELINE})
    assert e.value.status == 409 and "already exists" in e.value.body["error"]

    child = pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline", {"ancestor_timeline_id": TIMELINE})
    assert child["ancestor_timeline_id"] == TIMELINE and child["ancestor_lsn"] == summary["import_lsn"]
    listed = {t["timeline_id"]: t for t in pageserver.http("GET", f"/v1/tenant/{TENANT}/timeline")}
    assert set(listed) == {TIMELINE, child["timeline_id"]}

    # The branch serves the parent's pages below the branch point.
    client = PageServiceClient.of(pageserver, TENANT, child["timeline_id"])
    relnode, path = relation_files(pgdata, 1)[0]
    assert client.get_page(RelTag(1663, 1, relnode), 0, lsn_int(summary["import_lsn"])) == path.read_bytes()[:8192]
    client.close()


def test_management_errors_are_clear(pageserver, tmp_path):
    pageserver.http("POST", "/v1/tenant", {"tenant_id": TENANT})
    cases = [
        ("POST", "/v1/tenant", {"tenant_id": TENANT}, 409, "already exists"),
        ("POST", "/v1/tenant", {"tenant_id": "xyz"}, 400, "invalid tenant id"),
        ("POST", "/v1/tenant", {"tenant": TENANT}, 400, "unknown field `tenant`"),
        ("GET", f"/v1/tenant/{'3' * 32}/timeline", None, 404, "not found"),
        ("GET", f"/v1/tenant/{TENANT}/timeline/{'4' * 32}", None, 404, "not found"),
        ("POST", f"/v1/tenant/{TENANT}/timeline", {"ancestor_lsn": "0/10"}, 400, "needs ancestor_timeline_id"),
        ("POST", f"/v1/tenant/{TENANT}/timeline", {"ancestor_timeline_id": "5" * 32}, 404, "not found"),
    ]
    for method, path, body, status, fragment in cases:
        with pytest.raises(HttpError) as e:
            pageserver.http(method, path, body)
        assert e.value.status == status, (path, body, e.value)
        if fragment:
            assert fragment in e.value.body.get("error", ""), (path, e.value.body)

    pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline", {"timeline_id": TIMELINE})
    with pytest.raises(HttpError) as e:
        pageserver.http("POST", f"/v1/tenant/{TENANT}/timeline/{TIMELINE}/import", {"pgdata": str(tmp_path / "nowhere")})
    assert e.value.status == 400 and "nowhere" in e.value.body["error"]

    # The page service refuses an unknown timeline by name.
    with pytest.raises(PageServiceError) as e:
        PageServiceClient.of(pageserver, TENANT, "6" * 32)
    assert e.value.code == "not_found" and "6" * 32 in e.value.message
