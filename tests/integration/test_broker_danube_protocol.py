"""A real broker process driven with the project's generated Danube stubs."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import grpc
import pytest

from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", params=["native", "grpcio"])
def broker(request):
    # Both gRPC servers the client port can run (docs/broker.md) pass the same tests.
    with running_broker("--sync", "interval", "--grpc-server", request.param) as b:
        yield b


def test_lookup_partitions_health(broker):
    with grpc.insecure_channel(broker.target) as ch:
        discovery = pb_grpc.DiscoveryStub(ch)
        r = discovery.TopicLookup(pb.TopicLookupRequest(request_id=7, topic="/default/x"))
        assert (r.request_id, r.response_type, r.broker_url, r.connect_url) == (
            7,
            pb.TopicLookupResponse.Connect,
            broker.url,
            broker.url,
        )
        assert list(discovery.TopicPartitions(pb.TopicLookupRequest(topic="/default/x")).partitions) == ["/default/x"]
        with pytest.raises(grpc.RpcError) as e:
            discovery.TopicLookup(pb.TopicLookupRequest(topic="x"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        health = pb_grpc.HealthCheckStub(ch)
        assert (
            health.HealthCheck(pb.HealthCheckRequest(client=pb.HealthCheckRequest.Producer, id=1)).status
            == pb.HealthCheckResponse.CLOSE
        )
        p = pb_grpc.ProducerServiceStub(ch).CreateProducer(
            pb.ProducerRequest(producer_name="hp", topic_name="/default/health", dispatch_strategy=pb.Reliable)
        )
        assert (
            health.HealthCheck(pb.HealthCheckRequest(client=pb.HealthCheckRequest.Producer, id=p.producer_id)).status
            == pb.HealthCheckResponse.OK
        )


def test_send_receive_ack_with_attributes_and_key(broker):
    topic = "/default/attrs"
    with grpc.insecure_channel(broker.target) as ch:
        producers, consumers = pb_grpc.ProducerServiceStub(ch), pb_grpc.ConsumerServiceStub(ch)
        p = producers.CreateProducer(
            pb.ProducerRequest(producer_name="p", topic_name=topic, dispatch_strategy=pb.Reliable)
        )
        c = consumers.Subscribe(pb.ConsumerRequest(topic_name=topic, consumer_name="c", subscription="s"))
        stream = consumers.ReceiveMessages(pb.ReceiveRequest(consumer_id=c.consumer_id))
        sent = pb.StreamMessage(
            request_id=5,
            msg_id=pb.MsgID(producer_id=p.producer_id, topic_name=topic),
            payload=b"hello",
            publish_time=1234,
            producer_name="p",
            attributes={"a": "1"},
            routing_key="k",
        )
        assert producers.SendMessage(sent).request_id == 5
        msg = next(stream)
        assert (msg.payload, msg.publish_time, msg.producer_name, dict(msg.attributes), msg.routing_key) == (
            b"hello",
            1234,
            "p",
            {"a": "1"},
            "k",
        )
        assert (msg.msg_id.producer_id, msg.msg_id.topic_name, msg.msg_id.broker_addr, msg.msg_id.topic_offset) == (
            p.producer_id,
            topic,
            broker.url,
            0,
        )
        assert msg.subscription_name == "s"
        consumers.Ack(pb.AckRequest(request_id=msg.request_id, msg_id=msg.msg_id, subscription_name="s"))
        stream.cancel()


def test_metrics_endpoint_has_danube_names(broker):
    body = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10).read().decode()
    for name in (
        "danube_topic_messages_in_total",
        "danube_topic_bytes_in_total",
        "danube_consumer_messages_out_total",
        "danube_producer_send_latency_ms_bucket",
        "danube_broker_topics_owned",
        "danube_wal_next_offset",
    ):
        assert name in body, name


@pytest.mark.parametrize(
    "text, sentence",
    [
        ("sync: sometimes\n", "sync: expected one of always|interval|never, got 'sometimes'"),
        (
            "sync: interval\nhttp2:\n  max_frame_sizee: 65536\n",
            "unknown key http2.max_frame_sizee: not a setting (did you mean max_frame_size?)",
        ),
    ],
)
def test_bad_config_exits_with_a_sentence_naming_the_key(tmp_path, text, sentence):
    # every other wrong key or value: tests/unit/test_settings.py
    cfg = tmp_path / "bad.yml"
    cfg.write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", "danube.cli.main", "broker", "--config", str(cfg), "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"bad configuration: {sentence}" in r.stderr, r.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was created
