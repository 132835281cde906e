"""The load manager's and the rebalancer's metrics in a cluster broker's own Prometheus registry
(ClusterNode built with the broker's PrometheusMetrics, as danube.server.app does)."""

import asyncio

import pytest
from prometheus_client import generate_latest

from danube.broker import BrokerService
from danube.cluster.node import ClusterNode
from danube.cluster.rebalancing import RebalancingConfig
from danube.cluster.rebalancing.metrics import METRIC_NAMES, RebalancingMetrics
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.server.metrics import PrometheusMetrics
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory


@pytest.fixture
async def node(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    factory = StorageFactory(
        StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=str(tmp_path)), store, broker_id="b1"
    )
    metrics = PrometheusMetrics()
    broker = BrokerService(store, factory, broker_url="http://b1:6650", broker_id="b1", metrics=metrics)
    metrics.attach(broker)
    await broker.start()
    config = RebalancingConfig.for_aggressiveness(
        "aggressive", enabled=True, check_interval_seconds=3600, strategy="fair"
    )
    n = ClusterNode(
        store,
        broker,
        broker_id="b1",
        broker_url="http://b1:6650",
        lease_ttl_s=3,
        load_report_interval_s=0.2,
        lookup_timeout_s=5,
        rebalancing=config,
        metrics=metrics,
    )
    broker.cluster = n
    await n.start()
    for _ in range(100):
        if n.election.is_leader:
            break
        await asyncio.sleep(0.02)
    yield n, metrics
    await broker.stop()
    await n.stop()
    await store.close()


def scrape(metrics) -> str:
    return generate_latest(metrics.registry).decode()


async def test_every_rebalancing_metric_is_in_the_brokers_registry_once(node):
    n, metrics = node
    broker = n.broker
    await broker.lookup("/default/a")  # placed by this broker's (the leader's) load manager
    await broker.create_producer("/default/a", "p", reliable=True)
    await n.view.wait_for(lambda: "b1" in n.view.loads, 5)  # its first load report
    result = await n.rebalancer.run_cycle()  # one broker: skipped, but the gauges are set
    assert result.reason == "too few brokers"
    text = scrape(metrics)
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text, name
    assert text.count("# TYPE danube_broker_topics_owned ") == 1
    assert 'danube_topic_assignments_total{action="assign",broker_id="b1"} 1.0' in text
    assert 'danube_broker_topics_owned{broker_id="b1"} 1.0' in text
    assert 'danube_broker_cpu_usage{broker_id="b1"}' in text
    assert "danube_rebalancing_checks_total 1.0" in text and "danube_cluster_active_brokers 1.0" in text
    # a topic unloaded by its owner: unassigned there
    await n.unload("/default/a")
    assert 'danube_topic_assignments_total{action="unassign",broker_id="b1"} 1.0' in scrape(metrics)


async def test_the_leaders_counts_of_the_other_brokers_join_the_brokers_own_family(node):
    n, metrics = node
    rm = n.rebalancing_metrics
    rm.topics_owned_values = {"b1": 0.0, "b2": 7.0}
    text = scrape(metrics)
    assert 'danube_broker_topics_owned{broker_id="b2"} 7.0' in text
    assert 'danube_broker_topics_owned{broker_id="b1"} 0.0' in text  # its own: what it serves now
    n.election.is_leader = False  # a follower exports only its own count
    try:
        text = scrape(metrics)
        assert 'broker_id="b2"' not in text and 'danube_broker_topics_owned{broker_id="b1"} 0.0' in text
    finally:
        n.election.is_leader = True


def test_without_the_gauge_the_counts_are_kept_and_forgotten_when_deposed():
    rm = RebalancingMetrics(topics_owned_gauge=False)
    rm.brokers({"a": {"topics": [1, 2]}, "b": {"topics": []}}, {"a": 2})
    assert rm.topics_owned_values == {"a": 2.0, "b": 0.0}
    assert "danube_broker_topics_owned" not in generate_latest(rm.registry).decode()
    assert 'danube_broker_cpu_usage{broker_id="a"}' in generate_latest(rm.registry).decode()
    rm.forget_brokers()
    assert rm.topics_owned_values == {} and 'broker_id="a"' not in generate_latest(rm.registry).decode()
