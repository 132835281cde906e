"""`danube admin serve` in front of a 2-broker cluster (real etcd): both brokers with their roles and
advertised metrics pages, topics on the broker that owns each, the balance report, the rebalancing
history, and a drain planned (dry run) through the cluster action."""

from __future__ import annotations

import grpc
import pytest

from danube.proto.danube_admin import admin_pb2 as pb
from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc
from tests.support.cluster import local_cluster
from tests.support.etcd import requires_etcd
from tests.support.gateway import running_gateway
from tests.support.waiting import wait_until

pytestmark = [requires_etcd, pytest.mark.timeout(180)]


def test_gateway_over_a_cluster(tmp_path):
    with local_cluster(str(tmp_path / "c"), brokers=2, metrics=True) as cluster:
        procs = {p.broker_id: p for p in cluster.procs}
        with grpc.insecure_channel(f"127.0.0.1:{cluster.procs[0].admin_port}") as channel:
            topics = pb_grpc.TopicAdminStub(channel)
            for i in range(4):
                topics.CreateTopic(pb.NewTopicRequest(name=f"/default/gw_c{i}"), timeout=30)
        with running_gateway(cluster.procs[1].admin_port, str(tmp_path)) as gw:
            page = gw.get("/ui/v1/cluster")
            assert sorted(b["broker_id"] for b in page["brokers"]) == sorted(procs)
            assert [b["broker_role"] for b in page["brokers"]].count("Cluster_Leader") == 1
            for b in page["brokers"]:
                assert b["metrics_addr"] == f"http://127.0.0.1:{procs[b['broker_id']].metrics_port}"

            def placed():
                doc = gw.get("/ui/v1/topics")
                owners = {t["name"]: e["broker"]["broker_id"] for e in doc["brokers"] for t in e["topics"]}
                return owners if all(f"/default/gw_c{i}" in owners for i in range(4)) else None

            owners = wait_until(placed, 30, "all four topics placed on a broker")
            for name, owner in owners.items():
                if name.startswith("/default/gw_c"):
                    assert gw.get("/ui/v1/topics/" + name.replace("/", "%2F"))["topic"]["broker_id"] == owner
            wait_until(lambda: gw.get("/ui/v1/cluster")["totals"]["topics_total"] >= 4, 30, "the totals")

            balance = gw.get("/ui/v1/cluster/balance")
            assert sorted(b["broker_id"] for b in balance["brokers"]) == sorted(procs)
            assert isinstance(gw.get("/ui/v1/cluster/rebalancing-history")["moves"], list)

            victim = sorted(procs)[0]
            status, doc, _ = gw.request(
                "POST", "/ui/v1/cluster/actions", {"action": "unload", "broker_id": victim, "dry_run": True}
            )
            assert status == 200, doc
            mine = sum(1 for o in owners.values() if o == victim)
            assert f"total={mine}" in doc["message"] or f"total={mine + 1}" in doc["message"], (doc, owners)
            status, doc, _ = gw.request("POST", "/ui/v1/cluster/rebalance", {"dry_run": True})
            assert status == 200 and isinstance(doc["proposed_moves"], list), doc
