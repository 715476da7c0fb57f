"""`pdrelay status` shows a kvstore's tier fill from its load report."""

from __future__ import annotations

from shared.cluster.bus.load import LoadReport, LoadSnapshot, TierFill
from shared.cluster.status import ClusterStatus, StatusRow, format_table


def test_status_lists_each_tier_of_a_kvstore() -> None:
    load = LoadSnapshot(
        free_pages=900,
        total_pages=1000,
        tiers=(TierFill("dram", 100 << 20, 1 << 30, 142), TierFill("disk", 1 << 30, 8 << 30, 1456)),
    )
    row = StatusRow(
        role="kvstore",
        instance_id="kvstore-1",
        state="ready",
        epoch=3,
        grpc="127.0.0.1:1",
        load=LoadReport(instance_id="kvstore-1", role="kvstore", epoch=3, seq=1, ts=0.0, load=load),
        load_age_s=0.1,
    )
    text = format_table(ClusterStatus(cluster="c", etcd_url="e", nats_url="n", rows=[row]))
    assert "kvstore-1 dram: 9.8% of 1.00 GiB (142 pages)" in text
    assert "kvstore-1 disk: 12.5% of 8.00 GiB (1456 pages)" in text
    assert "900/1000" in text
