"""etcd faults under danube-client 0.5.0 (default options): etcd killed and restarted within the lease
ttl, and etcd away for longer than the ttl.  The brokers refuse writes while they cannot renew their
lease (they cannot know whether another broker took their topics); the client's sends are held by the
broker it came through and complete once etcd is back.  Nothing reaches the application, nothing acked
is lost, offsets stay continuous."""

from __future__ import annotations

import pytest

from tests.faults.support import TTL, apply_fault, owner_and_entry, run_official_client, shared_config
from tests.support.cluster import local_cluster
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(240)]


@pytest.mark.parametrize("fault", ["etcd_restart", "etcd_down"])
def test_official_client_rides_through_etcd_faults(tmp_path, fault):
    base = str(tmp_path)
    topic = f"/default/fault-{fault}"
    with local_cluster(base, config=shared_config(base), lease_ttl=TTL) as cluster:
        victim, entry = owner_and_entry(cluster, topic)
        outcome = run_official_client(base, entry.url, topic,
                                      lambda: apply_fault(fault, cluster, topic, entry, victim), after_s=TTL + 3)
        figures = outcome.check()
        print(f"{fault}: {figures}")
        assert all(p.alive() for p in cluster.procs)
