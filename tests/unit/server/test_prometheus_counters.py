"""The broker's hot counters kept as plain integers and exported when Prometheus scrapes."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from danube.server.metrics import PrometheusMetrics


def samples(metrics: PrometheusMetrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_published_delivered_and_acked_counts_and_the_latency_histogram():
    m = PrometheusMetrics()
    m.published("/default/a", 2, 100, 0.3)
    m.published("/default/a", 1, 50, 0.5)  # on a bucket's bound: counted in it (le)
    m.published("/default/a", 1, 10, 7000.0)  # beyond the last bound: +Inf only
    m.published("/default/b", 5, 500, 3.0)
    m.delivered("/default/a", "s", 3, 150)
    m.delivered("/default/a", "s", 1, 10)
    m.acked("/default/a", "s", 4)
    m.acked("/default/a", "t", 1)
    got = samples(m)
    a = (("topic", "/default/a"),)
    assert got[("danube_topic_messages_in_total", a)] == 4
    assert got[("danube_topic_bytes_in_total", a)] == 160
    assert got[("danube_topic_messages_in_total", (("topic", "/default/b"),))] == 5
    assert got[("danube_producer_send_latency_ms_bucket", (("le", "0.25"), ("topic", "/default/a")))] == 0
    assert got[("danube_producer_send_latency_ms_bucket", (("le", "0.5"), ("topic", "/default/a")))] == 2
    assert got[("danube_producer_send_latency_ms_bucket", (("le", "5000.0"), ("topic", "/default/a")))] == 2
    assert got[("danube_producer_send_latency_ms_bucket", (("le", "+Inf"), ("topic", "/default/a")))] == 3
    assert got[("danube_producer_send_latency_ms_count", a)] == 3
    assert abs(got[("danube_producer_send_latency_ms_sum", a)] - 7000.8) < 1e-9
    s = (("subscription", "s"), ("topic", "/default/a"))
    assert got[("danube_consumer_messages_out_total", s)] == 4
    assert got[("danube_consumer_bytes_out_total", s)] == 160
    assert got[("danube_subscription_acks_total", s)] == 4
    assert got[("danube_subscription_acks_total", (("subscription", "t"), ("topic", "/default/a")))] == 1


def test_counts_survive_the_topic_closing_as_labelled_counters_do():
    m = PrometheusMetrics()
    m.published("/default/a", 2, 100, 1.0)
    m.topic_closed("/default/a")
    m.published("/default/a", 1, 10, 1.0)
    assert samples(m)[("danube_topic_messages_in_total", (("topic", "/default/a"),))] == 3


def test_a_subscriptions_counts_added_to_in_place_are_exported_with_the_calls():
    m = PrometheusMetrics()
    row = m.subscription_counts("/default/a", "s")  # (what a subscription keeps and adds to)
    row[0] += 2
    row[1] += 20
    row[2] += 2
    m.delivered("/default/a", "s", 1, 5)
    m.acked("/default/a", "s", 1)
    assert m.subscription_counts("/default/a", "s") is row
    got = samples(m)
    s = (("subscription", "s"), ("topic", "/default/a"))
    assert got[("danube_consumer_messages_out_total", s)] == 3
    assert got[("danube_consumer_bytes_out_total", s)] == 25
    assert got[("danube_subscription_acks_total", s)] == 3


async def test_a_commit_adds_its_batches_to_the_topics_row_once_each_latency_observed():
    import asyncio

    from danube.broker.memory_storage import MemoryTopicStorage
    from danube.broker.policies import TopicPolicies
    from danube.broker.stats import MetricsSink
    from danube.broker.topic import Topic
    from danube.message_codec import encode_record

    m = PrometheusMetrics()
    topic = Topic(
        "/default/a",
        reliable=False,
        storage=MemoryTopicStorage("/default/a", max_bytes=1 << 20),
        policies=TopicPolicies(),
        metrics=m,
    )
    frames = [bytearray(encode_record(b"x" * n, publish_time=1)) for n in (1, 2, 3)]
    futures = [topic.publish_nowait(None, f) for f in frames]  # one turn: one commit of three batches
    await asyncio.gather(*futures)
    row = m.published_counts("/default/a")  # (what the topic's commit queue keeps and adds to)
    assert row[:2] == [3, sum(len(f) for f in frames)]
    assert sum(row[3:]) == 3  # one latency observation per batch
    assert samples(m)[("danube_producer_send_latency_ms_count", (("topic", "/default/a"),))] == 3
    m.published("/default/a", 1, 10, 1.0)
    assert m.published_counts("/default/a") is row and row[0] == 4

    class OnlyPublished(MetricsSink):  # a sink that overrides only the per-batch call is called per batch
        def published(self, topic, count, nbytes, latency_ms):
            pass

    assert OnlyPublished().published_counts("/default/a") is None
    assert MetricsSink().published_counts("/default/a") is not None  # the no-op sink's scratch row
