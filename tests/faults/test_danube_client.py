"""The faults of test_official_client.py with the project's own client (``danube.client``, default
options, the batch lane straight to the owner): an unload, a SIGTERM and a kill -9 of the owner."""

from __future__ import annotations

import pytest

from tests.faults.support import TTL, apply_fault, owner_and_entry, run_danube_client, shared_config
from tests.support.cluster import local_cluster
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(240)]

BOUND_S = {"unload": 2.0, "rebalance": 2.0, "sigterm": 3.0, "kill9": TTL + 2 + 2.0, "sigstop": TTL + 2.5 + 3.0}


@pytest.mark.parametrize("fault", ["unload", "rebalance", "sigterm", "kill9", "sigstop"])
def test_danube_client_rides_through(tmp_path, fault):
    base = str(tmp_path)
    topic = f"/default/fault-{fault}"
    with local_cluster(base, config=shared_config(base), lease_ttl=TTL) as cluster:
        victim, entry = owner_and_entry(cluster, topic)
        outcome = run_danube_client(
            entry.url,
            topic,
            lambda: apply_fault(fault, cluster, topic, entry, victim),
            after_s=TTL + 3 if fault in ("kill9", "sigstop") else 1.5,
        )
        figures = outcome.check()
        print(f"{fault}: {figures}")
        assert figures["recover_s"] < BOUND_S[fault], figures
        if fault == "sigstop":  # the woken owner was fenced: it stored and acked nothing more
            assert victim.alive()
            assert "fenced" in victim.log(), victim.log()[-3000:]
