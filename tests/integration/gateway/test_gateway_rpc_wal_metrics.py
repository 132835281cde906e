"""Calls answered and WAL syncs on a real broker's metrics page, and in what `danube admin serve` makes
of them: after some publishes, a refused request on each port and a call of an unknown method, the page
counts them under Danube's ``danube_broker_rpc_total`` and ``danube_wal_flush_*``, and the gateway's
cluster, broker and topic JSON report them (no longer zero)."""

from __future__ import annotations

import asyncio
import urllib.parse
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from danube.client import DanubeClient
from danube.proto.danube import DanubeApi_pb2 as api
from danube.proto.danube_admin import admin_pb2 as admin_pb
from tests.support.broker import running_broker
from tests.support.gateway import running_gateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)
TOPIC = "/default/gw_rpc_wal"
ENC = urllib.parse.quote(TOPIC, safe="")


def _samples(metrics_port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _sum(samples, name: str, **labels) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


async def _traffic(broker) -> dict:
    client = DanubeClient.builder().service_url(broker.url).build()
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").with_reliable(True).build()
        await producer.create()
        for i in range(20):  # one at a time: each waits for its own sync (sync=always)
            await producer.send_and_wait(b"m-%d" % i)
    finally:
        await client.close()
    codes = {}
    async with grpc.aio.insecure_channel(broker.target) as channel:
        create = channel.unary_unary(
            "/danube.ProducerService/CreateProducer",
            request_serializer=api.ProducerRequest.SerializeToString,
            response_deserializer=api.ProducerResponse.FromString,
        )
        unknown = channel.unary_unary(
            "/danube.NoSuchService/Nothing", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        for name, call, request in (
            ("bad_topic", create, api.ProducerRequest(producer_name="x", topic_name="no ns")),
            ("unknown", unknown, b""),
        ):
            try:
                await call(request, timeout=15)
            except grpc.aio.AioRpcError as exc:
                codes[name] = exc.code()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        describe = channel.unary_unary(
            "/danube_admin.TopicAdmin/DescribeTopic",
            request_serializer=admin_pb.DescribeTopicRequest.SerializeToString,
            response_deserializer=admin_pb.DescribeTopicResponse.FromString,
        )
        try:
            await describe(admin_pb.DescribeTopicRequest(name="not a topic"), timeout=15)
        except grpc.aio.AioRpcError as exc:
            codes["admin_bad_topic"] = exc.code()
    return codes


def _assert_counted(samples) -> None:
    rpc = "danube_broker_rpc_total"
    assert _sum(samples, rpc, service="discovery", method="topic_lookup", result="ok") >= 1
    assert (
        _sum(samples, rpc, service="producer", method="create_producer", result="error", code="INVALID_ARGUMENT") == 1
    )
    assert _sum(samples, rpc, service="unknown", method="unknown", code="UNIMPLEMENTED") == 1
    assert _sum(samples, rpc, service="topic_admin", method="describe_topic", code="INVALID_ARGUMENT") == 1
    assert _sum(samples, rpc, result="ok") >= 2  # the producer's calls: however it sends, each counted once
    assert _sum(samples, rpc, result="error") == 3  # a closed publish stream is "cancelled", no error
    assert _sum(samples, "danube_wal_flush_total", topic=TOPIC) >= 1
    assert _sum(samples, "danube_wal_flush_latency_ms_count", topic=TOPIC) == _sum(
        samples, "danube_wal_flush_total", topic=TOPIC
    )
    assert _sum(samples, "danube_wal_flush_latency_ms_sum", topic=TOPIC) > 0
    assert _sum(samples, "danube_wal_sync_rounds_total") >= 1


def _eventually_counted(metrics_port) -> None:
    """A call is counted once its status is sent; the client can read its answer a moment before
    the server's interceptor records it, so the page is read again until every count is there."""

    def counted() -> bool:
        try:
            _assert_counted(_samples(metrics_port))
        except AssertionError:
            return False
        return True

    if not wait_until(counted, 10, "every call counted on the metrics page", interval=0.2):
        _assert_counted(_samples(metrics_port))


def test_metrics_page_and_gateway_report_calls_errors_and_wal_syncs(tmp_path):
    (tmp_path / "broker").mkdir()
    with running_broker("--sync", "always", data_dir=str(tmp_path / "broker")) as broker:
        codes = asyncio.run(_traffic(broker))
        assert codes == {
            "bad_topic": grpc.StatusCode.INVALID_ARGUMENT,
            "unknown": grpc.StatusCode.UNIMPLEMENTED,
            "admin_bad_topic": grpc.StatusCode.INVALID_ARGUMENT,
        }, codes

        _eventually_counted(broker.metrics_port)
        rpc = "danube_broker_rpc_total"

        with running_gateway(broker.admin_port, str(tmp_path)) as gw:

            def broker_stats():
                (b,) = gw.get("/ui/v1/cluster")["brokers"]
                return b if b["stats"]["rpc_total"] > 0 else None

            b = wait_until(broker_stats, 60, "the cluster page to count the broker's calls")
            stats = b["stats"]
            assert stats["rpc_errors_total"] >= 3, stats  # the two refused requests and the unknown method
            assert stats["errors_5xx_total"] == 0, stats  # refused requests and unknown methods: no server failure
            assert stats["rpc_errors_total"] < stats["rpc_total"], stats
            page = gw.get(f"/ui/v1/brokers/{urllib.parse.quote(b['broker_id'], safe='')}")["metrics"]
            assert page["rpc_total"] >= stats["rpc_total"] and page["rpc_errors_total"] >= 3, page
            assert page["wal_sync_rounds_total"] >= 1 and page["wal_sync_round_latency_ms_p95"] > 0, page
            # the gateway's own scrapes are no calls; its admin calls are: the count goes on rising
            wait_until(
                lambda: gw.get("/ui/v1/cluster")["brokers"][0]["stats"]["rpc_rate_1m"] > 0,
                60,
                "a call rate once two scrapes are in",
            )

            # the gateway's admin calls went through the admin port's grpc.aio server: counted there as ok
            admin_ok = _sum(
                _samples(broker.metrics_port),
                rpc,
                service="broker_admin",
                method="list_brokers",
                result="ok",
                code="OK",
            )
            assert admin_ok >= 1

            reliable = gw.get(f"/ui/v1/topics/{ENC}")["metrics"]["reliable"]
            assert reliable["wal_flush_total"] >= 1, reliable
            assert 0 < reliable["wal_flush_latency_ms_p50"] <= reliable["wal_flush_latency_ms_p99"], reliable


def test_grpc_aio_client_port_counts_the_same(tmp_path):
    """With ``grpc_server: grpcio`` the client port is a grpc.aio server: its interceptor counts alike."""
    with running_broker("--sync", "always", "--grpc-server", "grpcio", data_dir=str(tmp_path)) as broker:
        asyncio.run(_traffic(broker))
        _eventually_counted(broker.metrics_port)
