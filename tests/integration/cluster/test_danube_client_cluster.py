"""The real danube-client 0.5.0 against a 3-broker cluster: it starts at a broker that does not own
the topic and follows the Redirect (its own venv, scripts run as subprocesses)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import danube_client_venv as dc
from tests.support.cluster import local_cluster, lookup
from tests.support.etcd import requires_etcd
from tests.support.processes import stop_process
from tests.support.waiting import wait_until

pytestmark = [requires_etcd, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def client_python():
    try:
        return dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        pytest.skip(f"danube-client venv not available: {exc}")


def test_danube_client_follows_redirects_to_the_owner(client_python, tmp_path):
    topic = "/default/redirected"
    with local_cluster(str(tmp_path / "c")) as cluster:
        _, owner = asyncio.run(lookup(cluster.procs[0].url, topic))
        others = [p.url for p in cluster.procs if p.url != owner]
        ready = tmp_path / "ready"
        # the producer starts at one non-owner (creating the topic on its owner), the consumer at the other
        assert dc.run_script("produce.py", others[1], topic, "--count", "0", "--reliable")["sent"] == []
        consumer = dc.start_script(
            "consume.py", others[0], topic, "sub", "--count", "10", "--idle-timeout", "20", "--ready-file", str(ready)
        )
        try:

            def subscribed():
                assert consumer.poll() is None, consumer.communicate()
                return ready.exists()

            wait_until(subscribed, 60, "the consumer subscribed", 0.1)
            sent = dc.run_script("produce.py", others[1], topic, "--count", "10", "--reliable")["sent"]
            out, err = consumer.communicate(timeout=60)
        except BaseException:
            stop_process(consumer)
            raise
        result = dc.parse_result("consume.py", consumer.returncode, out, err)
        assert result["error"] is None
        assert [r[0] for r in result["received"]] == sent
        assert all(r[1] == topic for r in result["received"])
        for p in cluster.procs:  # the topic was only ever served by its owner
            if p.url != owner:
                assert f"topic {topic} served here" not in p.log()
