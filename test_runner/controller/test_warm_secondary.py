"""Warm secondaries: the attached pageserver publishes its tenant's heatmap (its layers, the
most recently read first) to object storage, and the secondary downloads them ahead of
need. On failover the new attachment takes those copies (the very objects its index names)
instead of downloading layers one by one as reads need them."""

from __future__ import annotations

import json

from fixtures import logs
from fixtures.compute import Endpoint
from fixtures.postgres import wait_until

from controller.test_pageserver_failover import Cluster, attached_with, held, lsn, placement

# Quick rounds for the test; no background jobs, so that no compaction replaces the layers
# between the secondary's last download and the kill.
WARM = "heatmap_period_ms = 300\nsecondary_download_period_ms = 300\nbackground_jobs_enabled = false\n"
SMALL = {"shared_buffers": "128kB", "fjord.file_cache_size": "1MB"}


def test_a_warm_secondary_takes_over_with_the_layers_on_disk(tmp_path, pg_factory, safekeepers):
    cl = Cluster(tmp_path, pg_factory, safekeepers, ps_config=WARM)
    c = cl.controller
    c.allowed_errors += [f"pageserver {cl.first} is offline"]
    ps1, ps2 = cl.ps[cl.first], cl.ps[cl.second]
    ep = Endpoint(tmp_path, cl.tl, safekeepers=cl.safekeepers, controller=c, settings=SMALL).start()
    ep.allowed_errors += [r"could not (connect|receive|send)", "reconnecting", "the page service at"]
    rows = 40_000
    ep.sql(f"CREATE TABLE big AS SELECT i, repeat('x', 200) AS pad FROM generate_series(1, {rows}) i")
    expected = rows * (rows + 1) // 2
    assert ep.sql("SELECT sum(i) FROM big")[0][0] == expected
    end = ep.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0]
    wait_until("the pageserver to ingest the load", lambda: lsn(cl.tl.status()["last_record_lsn"]) >= lsn(end), timeout_s=60)
    ps1.http("POST", f"{cl.tl.path}/checkpoint")
    wait_until("the uploads", lambda: cl.tl.status()["remote_storage"]["queued_operations"] == 0, timeout_s=60)
    uploaded = len([p for p in (cl.remote / "tenants" / cl.tenant / "timelines" / cl.tl.timeline).iterdir()
                    if not p.name.startswith("index_part")])
    assert uploaded > 0
    wait_until("the secondary to hold every layer warm",
               lambda: (held(ps2).get(cl.tenant, {}).get("warm") or {}).get("layers") == uploaded, timeout_s=60)
    assert (cl.remote / "tenants" / cl.tenant / "heatmap.json").exists()
    assert ps2.metrics()["pageserver_secondary_layers_downloaded_total"] >= uploaded

    # The tenant's own PITR window goes with it (in its timelines' remote indexes): the new
    # attachment's GC must not collect history the tenant keeps.
    ps1.http("PUT", f"/v1/tenant/{cl.tenant}/config", {"pitr_window": "30d"})
    # (An object the local store is still writing has a `#` in its name.)
    wait_until("the remote index to carry the tenant's settings", lambda: any(
        "tenant_config" in p.read_text() for p in (cl.remote / "tenants" / cl.tenant / "timelines" / cl.tl.timeline).glob("index_part.json-*")
        if "#" not in p.name))

    ps1.kill()
    ps1.allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    wait_until("the failover", lambda: placement(c, cl.tenant)["attached"]["node_id"] == cl.second, timeout_s=30)
    wait_until("the secondary to attach with generation 2", lambda: attached_with(ps2, cl.tenant, 2), timeout_s=30)
    cl.tl.ps = ps2
    # Every page of the table from the new attachment, through the compute's tiny caches.
    assert ep.sql("SELECT sum(i) FROM big")[0][0] == expected
    assert cl.tl.status()["remote_storage"]["layers_downloaded"] == 0, "a layer was downloaded on demand after the failover"
    assert f"{uploaded} taken from warm copies" in ps2.log_text()
    assert not (ps2.workdir / "secondary" / cl.tenant).exists(), "the warm copies are moved or removed at the attach"
    assert "30d" in json.dumps(ps2.http("GET", f"/v1/tenant/{cl.tenant}/config")), "the tenant's PITR window was lost"
