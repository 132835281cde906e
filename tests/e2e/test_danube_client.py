"""End to end with the real danube-client 0.5.0 (its own venv, run as subprocess scripts)."""

from __future__ import annotations

import subprocess
import time

import grpc
import pytest

from tests.support import danube_client_venv as dc
from tests.support.broker import running_broker
from tests.support.processes import stop_process

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="session")
def client_python():
    try:
        return dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        pytest.skip(f"danube-client venv not available: {exc}")


@pytest.fixture()
def broker(client_python):
    with running_broker() as b:
        yield b


def start_consumer(broker, tmp_path, topic, sub, *args, name="consumer-1"):
    ready = tmp_path / f"ready-{name}-{sub}"
    proc = dc.start_script("consume.py", broker.url, topic, sub, "--name", name, "--ready-file", str(ready), *args)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate(timeout=10)
            result = dc.parse_result("consume.py", proc.returncode, out, err)
            return proc, result
        time.sleep(0.05)
    return proc, None


def finish(proc, timeout=60) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        out, err = proc.communicate()
        raise AssertionError(f"consumer timed out\nstdout:{out}\nstderr:{err[-4000:]}")
    return dc.parse_result("consume.py", proc.returncode, out, err)


def produce(broker, topic, count, *args):
    return dc.run_script("produce.py", broker.url, topic, "--count", str(count), *args)["sent"]


def payloads(result):
    return [r[0] for r in result["received"]]


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "non_reliable"])
def test_produce_consume_exclusive(broker, tmp_path, reliable):
    flag = ["--reliable"] if reliable else []
    topic = f"/default/basic-{'r' if reliable else 'nr'}"
    produce(broker, topic, 1, *flag, "--prefix", "before")  # creates the topic
    proc, early = start_consumer(broker, tmp_path, topic, "sub", "--count", "20")
    assert early is None, early
    sent = produce(broker, topic, 20, *flag)
    result = finish(proc)
    assert result["error"] is None
    assert payloads(result) == sent  # in order, nothing from before the subscription
    offsets = [r[2] for r in result["received"]]
    assert offsets == list(range(1, 21))
    assert all(r[1] == topic for r in result["received"])


def test_second_exclusive_consumer_is_rejected(broker, tmp_path):
    topic = "/default/excl"
    produce(broker, topic, 1, "--reliable")
    first, early = start_consumer(broker, tmp_path, topic, "only", "--idle-timeout", "8", name="c1")
    assert early is None
    try:
        second = dc.run_script("consume.py", broker.url, topic, "only", "--name", "c2", "--idle-timeout", "1")
        assert second["error"] is not None
        assert "exclusive" in second["error"] and "c1" in second["error"]
        sent = produce(broker, topic, 5, "--reliable")
        assert payloads(finish(first)) == sent  # the first consumer keeps working
    finally:
        stop_process(first)


def test_shared_subscription_round_robin(broker, tmp_path):
    topic = "/default/shared"
    produce(broker, topic, 1, "--reliable")
    # The idle timeout runs from the consumer's start: it must outlast the producer's start-up (a
    # Python process importing danube-client, seconds on a loaded machine).
    a, _ = start_consumer(broker, tmp_path, topic, "work", "--type", "shared", "--idle-timeout", "8", name="a")
    b, _ = start_consumer(broker, tmp_path, topic, "work", "--type", "shared", "--idle-timeout", "8", name="b")
    sent = produce(broker, topic, 40, "--reliable")
    ra, rb = finish(a), finish(b)
    got_a, got_b = payloads(ra), payloads(rb)
    assert sorted(got_a + got_b) == sorted(sent)  # each message exactly once
    assert len(got_a) >= 5 and len(got_b) >= 5, (len(got_a), len(got_b))


def test_failover_standby_takes_over(broker, tmp_path):
    topic = "/default/failover"
    produce(broker, topic, 1, "--reliable")
    active, _ = start_consumer(broker, tmp_path, topic, "fo", "--type", "failover", "--count", "10", name="active")
    standby, _ = start_consumer(
        broker, tmp_path, topic, "fo", "--type", "failover", "--idle-timeout", "6", name="standby"
    )
    sent = produce(broker, topic, 10, "--reliable")
    first = finish(active)
    assert payloads(first) == sent
    more = produce(broker, topic, 10, "--reliable", "--start", "10")
    second = finish(standby)
    assert payloads(second) == more  # the standby got nothing until the active one left


def test_key_shared_with_filters(broker, tmp_path):
    topic = "/default/keyed"
    produce(broker, topic, 1, "--reliable")
    eu, _ = start_consumer(
        broker, tmp_path, topic, "ks", "--type", "key_shared", "--filters", "eu-*", "--idle-timeout", "8", name="eu"
    )
    us, _ = start_consumer(
        broker, tmp_path, topic, "ks", "--type", "key_shared", "--filters", "us-*", "--idle-timeout", "8", name="us"
    )
    sent = produce(broker, topic, 30, "--reliable", "--keys", "eu-west,us-east,eu-north")
    r_eu, r_us = finish(eu), finish(us)
    assert {r[3] for r in r_eu["received"]} == {"eu-west", "eu-north"}
    assert {r[3] for r in r_us["received"]} == {"us-east"}
    assert sorted(payloads(r_eu) + payloads(r_us)) == sorted(p.split("@")[0] for p in sent)


def test_partitioned_producer_and_consumer(broker, tmp_path):
    topic = "/default/parts"
    produce(broker, topic, 3, "--reliable", "--partitions", "3", "--prefix", "warm")
    proc, _ = start_consumer(broker, tmp_path, topic, "p", "--type", "shared", "--count", "30")
    sent = produce(broker, topic, 30, "--reliable", "--partitions", "3")
    result = finish(proc)
    assert sorted(payloads(result)) == sorted(sent)
    assert {r[1] for r in result["received"]} == {f"{topic}-part-{i}" for i in range(3)}


def test_nack_with_delay_redelivers(broker, tmp_path):
    topic = "/default/nacked"
    produce(broker, topic, 1, "--reliable")
    proc, _ = start_consumer(broker, tmp_path, topic, "n", "--count", "6", "--nack-delay-ms", "1500")
    sent = produce(broker, topic, 3, "--reliable")
    result = finish(proc)
    assert sorted(result["nacked"]) == sorted(sent)
    assert sorted(result["acked"]) == sorted(sent)
    for p in sent:
        first, second = result["times"][p]
        assert second - first >= 1.4, (p, second - first)


def test_restart_resumes_at_cursor(broker, tmp_path):
    topic = "/default/resume"
    produce(broker, topic, 1, "--reliable")
    proc, _ = start_consumer(broker, tmp_path, topic, "r", "--count", "40", "--ack-first", "25")
    sent = produce(broker, topic, 40, "--reliable")
    first = finish(proc)
    assert payloads(first) == sent
    assert first["acked"] == sent[:25]
    assert broker.stop() == 0  # SIGTERM: clean exit
    broker.start()
    proc, _ = start_consumer(broker, tmp_path, topic, "r", "--count", "15")
    again = finish(proc)
    assert payloads(again) == sent[25:]  # no acked message comes back, no unacked one is lost


def test_restart_mid_stream_with_live_clients(broker, tmp_path):
    topic = "/default/live"
    produce(broker, topic, 1, "--reliable")
    # redeliveries across the restart are allowed (checked below), so count distinct payloads
    consumer, _ = start_consumer(broker, tmp_path, topic, "live", "--count", "60", "--distinct", "--idle-timeout", "30")
    producer = dc.start_script("produce.py", broker.url, topic, "--count", "60", "--reliable", "--delay-ms", "50")
    time.sleep(1.5)
    broker.restart()
    out, err = producer.communicate(timeout=120)
    sent = dc.parse_result("produce.py", producer.returncode, out, err)["sent"]
    result = finish(consumer, timeout=120)
    got = payloads(result)
    assert set(got) == set(sent), (sorted(set(sent) - set(got)), broker.log()[-3000:])
    # a message may come twice only if its ack had not completed when it came again
    for payload, times in result["times"].items():
        acked_at = result["ack_times"][payload]
        assert all(t < acked_at for t in times[1:]), f"{payload} came back after it was acked"


def test_bad_input_gets_clear_status(broker):

    from danube.proto.danube import DanubeApi_pb2 as pb
    from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

    produce(broker, "/default/bad", 2, "--reliable")
    with grpc.insecure_channel(broker.target) as channel:
        producers = pb_grpc.ProducerServiceStub(channel)
        consumers = pb_grpc.ConsumerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            producers.SendMessage(pb.StreamMessage(msg_id=pb.MsgID(producer_id=12345), payload=b"x"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "producer" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            producers.CreateProducer(pb.ProducerRequest(producer_name="p", topic_name="no-slash"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "/namespace/topic" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            list(consumers.ReceiveMessages(pb.ReceiveRequest(consumer_id=999)))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "consumer" in e.value.details()
        created = producers.CreateProducer(
            pb.ProducerRequest(producer_name="big", topic_name="/default/bad", dispatch_strategy=pb.Reliable)
        )
        with pytest.raises(grpc.RpcError) as e:
            producers.SendMessage(
                pb.StreamMessage(
                    msg_id=pb.MsgID(producer_id=created.producer_id), payload=b"x" * (10 * 1024 * 1024 + 1)
                )
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_message_size" in e.value.details()
    # the broker keeps serving and the stored data is intact
    proc = dc.start_script("consume.py", broker.url, "/default/bad", "again", "--count", "3")
    time.sleep(2)
    sent = produce(broker, "/default/bad", 3, "--reliable", "--start", "2")
    assert payloads(finish(proc)) == sent
