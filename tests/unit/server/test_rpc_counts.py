"""Calls answered per method and status: Danube's label spelling, results, and no label from client input."""

import grpc

from danube.server.rpc_counts import UNKNOWN_METHOD, RpcCounts, method_labels


def test_method_labels_spell_danubes_services_and_methods():
    assert method_labels("/danube.ProducerService/SendMessage") == ("producer", "send_message")
    assert method_labels("/danube.ConsumerService/ReceiveMessages") == ("consumer", "receive_messages")
    assert method_labels("/danube_admin.TopicAdmin/DescribeTopic") == ("topic_admin", "describe_topic")
    assert method_labels("/danube_batch.BatchLane/Publish") == ("batch_lane", "publish")
    assert method_labels(UNKNOWN_METHOD) == ("unknown", "unknown")


def test_samples_count_each_method_and_code_with_danubes_result():
    counts = RpcCounts()
    for code in (grpc.StatusCode.OK, grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.CANCELLED):
        counts.observe("/danube.Discovery/TopicLookup", code)
    assert sorted(counts.samples()) == [
        ("discovery", "topic_lookup", "cancelled", "CANCELLED", 1),
        ("discovery", "topic_lookup", "error", "NOT_FOUND", 1),
        ("discovery", "topic_lookup", "ok", "OK", 2),
    ]
