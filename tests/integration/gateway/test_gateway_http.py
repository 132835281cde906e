"""`danube admin serve` against a real broker: Danube's gateway routes and JSON shapes, pages filled
from the admin gRPC API and the broker's metrics port (the embedded history, no Prometheus), actions,
and the guards (names, sizes, content type, Host, Origin, CORS, token, read-only)."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.parse

import pytest

from danube.client import DanubeClient, SubType
from tests.support.broker import running_broker
from tests.support.gateway import running_gateway
from tests.support.waiting import wait_until

TOPIC = "/default/gw_orders"
ENC = urllib.parse.quote(TOPIC, safe="")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    base = tmp_path_factory.mktemp("gateway")
    (base / "broker").mkdir()
    with running_broker(data_dir=str(base / "broker")) as broker:
        with running_gateway(broker.admin_port, str(base)) as gateway:
            yield broker, gateway


async def _produce_and_subscribe(url: str, count: int):
    client = DanubeClient.builder().service_url(url).build()
    consumer = (
        client.new_consumer()
        .with_topic(TOPIC)
        .with_consumer_name("c1")
        .with_subscription("audit")
        .with_subscription_type(SubType.Shared)
        .with_reliable()
        .build()
    )
    await consumer.subscribe()
    producer = client.new_producer().with_topic(TOPIC).with_name("p1").with_linger_ms(1).build()
    await producer.create()
    for round_ in range(4):  # spread over time so the history holds more than one scrape
        futures = [await producer.send(b"order-%d" % i) for i in range(count // 4)]
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        await asyncio.sleep(0.7)
    # the subscription stays open (not acked): the page shows a producer, a consumer and a backlog
    return client, producer, consumer


def test_pages_show_the_broker_its_topic_and_live_metrics(stack):
    broker, gw = stack
    assert gw.get("/ui/v1/health") == {"status": "ok", "leader_reachable": True}

    loop = asyncio.new_event_loop()
    client, producer, consumer = loop.run_until_complete(_produce_and_subscribe(broker.url, 40))
    try:
        cluster = gw.get("/ui/v1/cluster")
        assert set(cluster) >= {"timestamp", "brokers", "totals", "errors"}
        (b,) = cluster["brokers"]
        assert set(b) >= {"broker_id", "broker_addr", "broker_role", "broker_status", "admin_addr", "stats"}
        assert b["broker_addr"] == broker.url and b["broker_role"] == "Cluster_Leader"
        assert b["metrics_addr"] == f"http://127.0.0.1:{broker.metrics_port}"
        assert cluster["totals"]["broker_count"] == 1
        assert cluster["totals"]["topics_total"] == b["stats"]["topics_owned"] >= 1

        def topic_page():
            page = gw.get(f"/ui/v1/topics/{ENC}")
            return page if page["metrics"]["core"]["msg_in_total"] == 40 else None

        page = wait_until(topic_page, 30, "the topic page to show the 40 messages")
        assert page["topic"]["name"] == TOPIC and page["topic"]["delivery"] == "Reliable"
        (audit,) = page["topic"]["subscriptions"]
        assert (audit["name"], audit["subscription_type"]) == ("audit", "Shared")
        policy = audit["failure_policy"]
        assert policy["backoff_strategy"] in ("fixed", "exponential"), policy
        assert policy["poison_policy"] in ("dead_letter", "block", "drop"), policy
        assert isinstance(policy["max_redelivery_count"], int) and isinstance(policy["ack_timeout_ms"], int)
        assert policy["poison_policy"] == "block"  # the default policy
        m = page["metrics"]
        assert m["active"] == {"producers": 1, "consumers": 1, "subscriptions": 1}
        assert m["core"]["bytes_in_total"] > 0
        assert m["msg_backlog"] >= 0 and m["latency_size"]["msg_size_bytes_avg"] > 0
        assert set(m) >= {"core", "active", "rates", "quality", "latency_size", "reliable"}

        topics = gw.get("/ui/v1/topics")
        (entry,) = topics["brokers"]
        assert entry["broker"]["broker_id"] == b["broker_id"]
        mine = [t for t in entry["topics"] if t["name"] == TOPIC]
        assert mine and mine[0]["producers_connected"] == 1 and mine[0]["subscriptions"] == 1

        bpage = gw.get(f"/ui/v1/brokers/{urllib.parse.quote(b['broker_id'])}")
        assert bpage["broker"]["broker_id"] == b["broker_id"]
        assert TOPIC in [t["name"] for t in bpage["topics"]]
        assert bpage["metrics"]["inbound_bytes_total"] >= m["core"]["bytes_in_total"]

        ns = gw.get("/ui/v1/namespaces")
        default = [n for n in ns["namespaces"] if n["name"] == "default"]
        assert default and TOPIC in default[0]["topics"] and isinstance(default[0]["policies"], str)

        now = int(time.time())

        def rates():
            s = gw.get(f"/ui/v1/topics/{ENC}/series?from={now - 120}&to={now + 5}&step=1s")
            series = {x["name"]: x["points"] for x in s["series"]}
            return series if any(v > 0 for _, v in series["publish_rate_1m"]) else None

        series = wait_until(rates, 30, "a publish rate in the embedded history")
        assert set(series) >= {"publish_rate_1m", "dispatch_rate_1m", "bytes_in_rate_1m", "bytes_out_rate_1m"}
        assert all(isinstance(t, int) and t <= now + 5 for t, _ in series["publish_rate_1m"])
    finally:
        loop.run_until_complete(producer.close())
        loop.run_until_complete(consumer.close())
        loop.run_until_complete(client.close())
        loop.close()


def test_topic_actions_create_unload_delete(stack):
    _, gw = stack
    name = "/default/gw_made_here"
    status, doc, _ = gw.request(
        "POST",
        "/ui/v1/topics/actions",
        {"action": "create", "topic": "gw_made_here", "namespace": "default", "dispatch_strategy": "reliable"},
    )
    assert (status, doc["success"]) == (200, True), doc
    ns = gw.get("/ui/v1/namespaces")
    assert name in [t for n in ns["namespaces"] for t in n["topics"]]
    assert gw.get(f"/ui/v1/topics/{urllib.parse.quote(name, safe='')}")["topic"]["delivery"] == "Reliable"

    status, doc, _ = gw.request("POST", "/ui/v1/topics/actions", {"action": "create", "topic": name})
    assert status == 409 and doc["code"] == "AlreadyExists", doc
    status, doc, _ = gw.request("POST", "/ui/v1/topics/actions", {"action": "delete", "topic": name})
    assert (status, doc["success"]) == (200, True), doc
    ns = gw.get("/ui/v1/namespaces")
    assert name not in [t for n in ns["namespaces"] for t in n["topics"]]
    status, doc, _ = gw.request("GET", f"/ui/v1/topics/{urllib.parse.quote(name, safe='')}")
    assert status == 404 and doc["error"]


def test_a_partitioned_topic_has_a_page_under_its_base_name(stack):
    _, gw = stack
    status, doc, _ = gw.request(
        "POST", "/ui/v1/topics/actions", {"action": "create", "topic": "/default/gw_parted", "partitions": 2}
    )
    assert (status, doc["success"]) == (200, True), doc
    page = gw.get("/ui/v1/topics/%2Fdefault%2Fgw_parted")
    assert page["topic"]["partitioning"]["partitions"] == 2
    assert page["topic"]["partitions"] == ["/default/gw_parted-part-0", "/default/gw_parted-part-1"]
    assert gw.get("/ui/v1/topics/%2Fdefault%2Fgw_parted-part-1")["topic"]["name"] == "/default/gw_parted-part-1"


def test_schema_pages_and_actions(stack):
    import json

    import grpc

    from danube.proto.danube_schema import SchemaRegistry_pb2 as spb
    from danube.proto.danube_schema import SchemaRegistry_pb2_grpc as spb_grpc

    broker, gw = stack
    v1 = {"type": "record", "name": "Paid", "fields": [{"name": "id", "type": "long"}]}
    v2 = {**v1, "fields": v1["fields"] + [{"name": "note", "type": "string", "default": ""}]}
    with grpc.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        registry = spb_grpc.SchemaRegistryStub(channel)
        for doc in (v1, v2):
            registry.RegisterSchema(
                spb.RegisterSchemaRequest(
                    subject="gw-paid", schema_type="avro", schema_definition=json.dumps(doc).encode()
                ),
                timeout=30,
            )
    status, doc, _ = gw.request(
        "POST", "/ui/v1/topics/actions", {"action": "create", "topic": "/default/gw_paid", "schema_subject": "gw-paid"}
    )
    assert (status, doc["success"]) == (200, True), doc
    subjects = gw.get("/ui/v1/schemas")["subjects"]
    (paid,) = [x for x in subjects if x["subject"] == "gw-paid"]
    assert (paid["schema_type"], paid["latest_version"]) == ("avro", 2)
    detail = gw.get("/ui/v1/schemas/gw-paid")
    assert json.loads(detail["latest"]["schema_definition"]) == v2
    assert [v["version"] for v in detail["versions"]] == [1, 2]
    topic = gw.get("/ui/v1/topics/%2Fdefault%2Fgw_paid")["topic"]
    assert (topic["schema_subject"], topic["schema_version"], topic["compatibility_mode"]) == ("gw-paid", 2, "BACKWARD")
    # the broker binds the subject at create, each partition following its partitioned topic
    status, doc, _ = gw.request(
        "POST",
        "/ui/v1/topics/actions",
        {"action": "create", "topic": "/default/gw_paid_parted", "partitions": 2, "schema_subject": "gw-paid"},
    )
    assert (status, doc["success"]) == (200, True), doc
    part = gw.get("/ui/v1/topics/%2Fdefault%2Fgw_paid_parted-part-1")["topic"]
    assert (part["schema_subject"], part["schema_type"]) == ("gw-paid", "avro")
    status, doc, _ = gw.request(
        "POST",
        "/ui/v1/topics/actions",
        {"action": "create", "topic": "/default/gw_unpaid", "schema_subject": "gw-none"},
    )
    assert status == 404 and "gw-none" in doc["message"], doc
    status, _, _ = gw.request("GET", "/ui/v1/topics/%2Fdefault%2Fgw_unpaid")
    assert status == 404  # refused before anything was created

    status, doc, _ = gw.request(
        "POST",
        "/ui/v1/schemas/actions",
        {"action": "set_compatibility", "subject": "gw-paid", "compatibility_mode": "full"},
    )
    assert (status, doc["success"]) == (200, True), doc
    assert gw.get("/ui/v1/schemas/gw-paid")["compatibility_mode"] == "FULL"
    status, doc, _ = gw.request(
        "POST",
        "/ui/v1/schemas/actions",
        {"action": "set_compatibility", "subject": "gw-paid", "compatibility_mode": "LAX"},
    )
    assert status == 400 and "compatibility_mode" in doc["message"]
    status, doc, _ = gw.request(
        "POST", "/ui/v1/schemas/actions", {"action": "delete_version", "subject": "gw-paid", "version": 1}
    )
    assert (status, doc["success"]) == (200, True), doc
    assert [v["version"] for v in gw.get("/ui/v1/schemas/gw-paid")["versions"]] == [2]
    status, doc, _ = gw.request("POST", "/ui/v1/schemas/actions", {"action": "delete_version", "subject": "gw-paid"})
    assert status == 400 and "version" in doc["message"]


def test_cluster_action_refuses_unknown_action_and_bad_broker_id(stack):
    _, gw = stack
    status, doc, _ = gw.request("POST", "/ui/v1/cluster/actions", {"action": "explode", "broker_id": "b1"})
    assert status == 400 and "unsupported action" in doc["message"]
    status, doc, _ = gw.request("POST", "/ui/v1/cluster/actions", {"action": "unload", "broker_id": "../etc"})
    assert status == 400 and "invalid broker name" in doc["message"]
    status, doc, _ = gw.request("POST", "/ui/v1/cluster/actions", {"action": "unload"})
    assert status == 400 and doc["message"] == "missing broker_id"


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"action": "create", "topic": "/default/../x"}, "invalid topic name"),
        ({"action": "create", "topic": "/default/a b"}, "invalid topic name"),
        ({"action": "create", "topic": "lonely"}, "missing namespace"),
        ({"action": "create", "topic": "/default/x", "partitions": -1}, "partitions must be"),
        ({"action": "create", "topic": "/default/x", "dispatch_strategy": "maybe"}, "dispatch_strategy"),
        ({"action": "drop_all", "topic": "/default/x"}, "unsupported action"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_topic_actions_are_refused_with_a_message(stack, body, fragment):
    _, gw = stack
    status, doc, _ = gw.request("POST", "/ui/v1/topics/actions", body)
    assert status == 400 and fragment in doc["message"], (status, doc)


def test_bad_reads_are_clear_errors(stack):
    _, gw = stack
    status, doc, _ = gw.request("GET", "/ui/v1/topics/%2Fdefault%2F..%2Fx")
    assert status == 400 and "invalid topic name" in doc["error"]
    status, doc, _ = gw.request("GET", f"/ui/v1/topics/{ENC}/series?step=0s")
    assert status == 400 and "step" in doc["error"]
    status, doc, _ = gw.request("GET", f"/ui/v1/topics/{ENC}/series?from=1&to=9999999999&step=0.001")
    assert status == 400 and "points" in doc["error"]
    status, doc, _ = gw.request("GET", "/ui/v1/schemas/nope-subject")
    assert status == 404 and doc["code"] == "NotFound"
    assert gw.request("GET", "/ui/v1/nothing-here")[0] == 404
    assert gw.request("DELETE", "/ui/v1/topics")[0] == 405


def test_guards_content_type_size_host_origin_and_cors_off(stack):
    _, gw = stack
    status, doc, _ = gw.request(
        "POST",
        "/ui/v1/topics/actions",
        b'{"action":"unload","topic":"/default/x"}',
        headers={"Content-Type": "text/plain"},
    )
    assert status == 415
    status, doc, _ = gw.request("POST", "/ui/v1/topics/actions", b"x" * (65 * 1024))
    assert status == 413
    status, doc, headers = gw.request("GET", "/ui/v1/health", headers={"Origin": "http://evil.example"})
    assert status == 403 and "cross-origin" in doc["error"]
    status, _, headers = gw.request("GET", "/ui/v1/health", headers={"Origin": gw.url})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:  # DNS rebinding: a foreign Host
        s.sendall(b"GET /ui/v1/health HTTP/1.1\r\nHost: rebound.example:8080\r\nConnection: close\r\n\r\n")
        reply = s.makefile("rb").read()
    assert reply.startswith(b"HTTP/1.1 403")
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:  # an oversized head
        s.sendall(b"GET /ui/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        reply = s.makefile("rb").read()
    assert reply.startswith(b"HTTP/1.1 431")


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        return s.makefile("rb").read()


def test_http_framing_keep_alive_chunked_and_garbage(stack):
    _, gw = stack
    two = _raw(
        gw.port,
        b"GET /ui/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        b"GET /ui/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert two.count(b"HTTP/1.1 200 OK") == 2 and two.count(b'"leader_reachable":true') == 2
    chunked = _raw(
        gw.port,
        b"POST /ui/v1/topics/actions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    )
    assert chunked.startswith(b"HTTP/1.1 411")
    assert _raw(gw.port, b"HELLO\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert _raw(gw.port, b"GET / HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n").startswith(b"HTTP/1.1 400")
    page = _raw(gw.port, b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert page.startswith(b"HTTP/1.1 200") and b"Content-Security-Policy: default-src 'self'" in page
    assert _raw(gw.port, b"GET /static/../app.py HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 404"
    )


def test_token_cors_and_read_only_options(stack, tmp_path):
    broker, _ = stack
    with running_gateway(
        broker.admin_port,
        str(tmp_path),
        "--cors-allow-origin",
        "http://ui.example",
        env={"DANUBE_ADMIN_TOKEN": "gateway-token"},
    ) as gw:
        body = {"action": "create", "topic": "/default/gw_token"}
        status, doc, _ = gw.request("POST", "/ui/v1/topics/actions", body)
        assert status == 401 and "Authorization: Bearer" in doc["message"]
        status, doc, _ = gw.request(
            "POST", "/ui/v1/topics/actions", body, headers={"Authorization": "Bearer caller-token"}
        )
        assert (status, doc["success"]) == (200, True), doc
        status, _, headers = gw.request("GET", "/ui/v1/health", headers={"Origin": "http://ui.example"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://ui.example"
        status, _, _ = gw.request("GET", "/ui/v1/health", headers={"Origin": "http://other.example"})
        assert status == 403
    with running_gateway(broker.admin_port, str(tmp_path), "--read-only") as gw:
        status, doc, _ = gw.request("POST", "/ui/v1/topics/actions", {"action": "delete", "topic": "/default/gw_token"})
        assert status == 403 and "read-only" in doc["message"]
        assert "/default/gw_token" in [t for n in gw.get("/ui/v1/namespaces")["namespaces"] for t in n["topics"]]
