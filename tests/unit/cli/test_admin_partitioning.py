"""`danube admin topics describe` on a partitioned topic: what a repartition waits for, printed."""

import json

from google.protobuf.json_format import MessageToDict

from danube.cli.admin import _partitioning
from danube.proto.danube_admin import admin_pb2 as pb


def test_describe_prints_what_the_cutover_waits_for_and_the_pending_holds():
    progress = {
        "waiting": [{"subscription": "billing", "partition": 1, "consumed": 1200, "old_end": 5400}],
        "pending": [
            {
                "to_version": 1,
                "to_partitions": 4,
                "subscriptions": ["audit"],
                "waiting": [{"subscription": "audit", "partition": 0, "consumed": 7, "old_end": 90}],
            }
        ],
    }
    marker = {"kind": "shrink", "from_partitions": 4, "to_partitions": 2, "phase": "cutover", "adoption_generation": 12}
    resp = pb.PartitioningResponse(
        name="/default/t",
        partitions=2,
        partitioning_version=2,
        generation=15,
        marker_json=json.dumps(marker),
        progress_json=json.dumps(progress),
    )
    data, lines = _partitioning(resp, MessageToDict)
    assert data["progress"] == progress
    assert "Cutover waits for subscription billing on partition 1: consumed below 1200, waits for 5400" in lines
    assert "Pending hold of the grow to 4 (version 1): audit" in lines
    assert "  holds subscription audit on partition 0: consumed below 7, waits for 90" in lines
    data, lines = _partitioning(pb.PartitioningResponse(name="/default/t", partitions=2), MessageToDict)
    assert data["progress"] == {} and not [line for line in lines if "waits" in line]
