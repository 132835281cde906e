"""Security end to end: TLS, mTLS, JWT and RBAC with the real danube-client 0.5.0, danube.client
(batch lane) and `danube admin security`, against brokers started as subprocesses (both gRPC
servers).  Certificates are made in the test (tests/support/certs.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest

from danube.security.jwt import issue_token
from tests.support import danube_client_venv as dc
from tests.support.broker import running_broker
from tests.support.certs import make_pki

pytestmark = pytest.mark.timeout(240)

SECRET = "e2e-secret-0123456789abcdef-0123456789"


@pytest.fixture(scope="module")
def client_python():
    try:
        return dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        pytest.skip(f"danube-client venv not available: {exc}")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("secret") / "jwt-secret"
    path.write_text(SECRET)
    os.chmod(path, 0o600)
    return str(path)


def roundtrip(broker, topic, *args, count=3, timeout=90) -> dict:
    return dc.run_script("secure_roundtrip.py", broker.url, topic, "--count", str(count), *args, timeout=timeout)


def admin(broker, pki, token, *args) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "danube.cli.main",
        "admin",
        "--endpoint",
        f"127.0.0.1:{broker.admin_port}",
        "--tls-ca",
        pki.ca,
        "--token",
        token,
        "--timeout",
        "20",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def tls_args(pki):
    return ("--tls-cert", pki.server.cert, "--tls-key", pki.server.key)


# ---------------------------------------------------------------- TLS and mTLS


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_danube_client(client_python, pki):
    with running_broker(*tls_args(pki)) as broker:
        ok = roundtrip(broker, "/default/tls", "--ca", pki.ca)
        assert ok["error"] is None and ok["received"] == ok["sent"] == ["m-0", "m-1", "m-2"]
        # HTTP/2 over TLS: ALPN picks h2 (offered with http/1.1, as browsers and curl do), TLS 1.2+.
        import socket
        import ssl

        ctx = ssl.create_default_context(cafile=pki.ca)
        ctx.set_alpn_protocols(["http/1.1", "h2"])
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.selected_alpn_protocol() == "h2" and tls.version() in ("TLSv1.2", "TLSv1.3")
        old_tls = ssl.create_default_context(cafile=pki.ca)
        old_tls.minimum_version = old_tls.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as raw:
                old_tls.wrap_socket(raw, server_hostname="127.0.0.1").close()
        wrong_ca = roundtrip(broker, "/default/tls", "--ca", pki.other_ca, timeout=120)
        assert wrong_ca["error"] and wrong_ca["error"].startswith("UNAVAILABLE"), wrong_ca
        plain = roundtrip(broker, "/default/tls", timeout=120)  # no TLS at all
        assert plain["error"] and plain["error"].startswith("UNAVAILABLE"), plain


@pytest.mark.parametrize("server", ["native", "grpcio"])
def test_mtls_danube_client(client_python, pki, server):
    with running_broker(
        *tls_args(pki), "--tls-ca", pki.ca, "--tls-verify-client", "--super-admin", "client-1", "--grpc-server", server
    ) as broker:
        ok = roundtrip(broker, "/default/mtls", "--ca", pki.ca, "--cert", pki.client.cert, "--key", pki.client.key)
        assert ok["error"] is None and ok["received"] == ok["sent"], ok
        rogue = roundtrip(
            broker,
            "/default/mtls",
            "--ca",
            pki.ca,
            "--cert",
            pki.rogue_client.cert,
            "--key",
            pki.rogue_client.key,
            timeout=120,
        )
        assert rogue["error"] and rogue["error"].startswith("UNAVAILABLE"), rogue
        no_cert = roundtrip(broker, "/default/mtls", "--ca", pki.ca, timeout=120)
        assert no_cert["error"] and no_cert["error"].startswith("UNAVAILABLE"), no_cert


# ---------------------------------------------------------------- JWT and RBAC


@pytest.mark.parametrize("server", ["native", "grpcio"])
def test_jwt_and_rbac(client_python, pki, secret_file, server):
    admin_token = issue_token("ops", SECRET)
    with running_broker(
        *tls_args(pki), "--jwt-secret-file", secret_file, "--super-admin", "ops", "--grpc-server", server
    ) as broker:
        # Roles and bindings through the admin CLI (admin port: TLS + JWT too).
        done = admin(
            broker,
            pki,
            admin_token,
            "security",
            "roles",
            "create",
            "app",
            "--permission",
            "produce:/default/*",
            "--permission",
            "consume:/default/*",
            "--permission",
            "lookup:/default/*",
        )
        assert done.returncode == 0, done.stderr
        done = admin(
            broker,
            pki,
            admin_token,
            "security",
            "roles",
            "create",
            "reader",
            "--permission",
            "lookup:/default/*",
            "--permission",
            "consume:/default/*",
        )
        assert done.returncode == 0, done.stderr
        for subject, role in (("alice", "app"), ("bob", "reader")):
            done = admin(
                broker, pki, admin_token, "security", "bindings", "create", "--subject", subject, "--role", role
            )
            assert done.returncode == 0, done.stderr
        listed = admin(broker, pki, admin_token, "--output", "json", "security", "bindings", "list")
        assert '"alice"' in listed.stdout and '"reader"' in listed.stdout
        # A non-admin cannot manage security, and is told which permission it lacks.
        denied = admin(broker, pki, issue_token("alice", SECRET), "security", "roles", "list")
        assert denied.returncode == 1 and "permission_denied" in denied.stderr and "'admin'" in denied.stderr

        token = issue_token("alice", SECRET)
        ok = roundtrip(broker, "/default/jwt", "--ca", pki.ca, "--token", token)
        assert ok["error"] is None and ok["received"] == ok["sent"], ok

        expired = roundtrip(
            broker,
            "/default/jwt",
            "--ca",
            pki.ca,
            "--token",
            issue_token("alice", SECRET, now=time.time() - 7200, expires_in_s=60),
        )
        assert expired["error"].startswith("UNAUTHENTICATED") and "expired" in expired["error"], expired
        forged = roundtrip(
            broker, "/default/jwt", "--ca", pki.ca, "--token", issue_token("ops", "not-the-secret-0123456789abcdef-xyz")
        )
        assert forged["error"].startswith("UNAUTHENTICATED") and "signature" in forged["error"], forged
        missing = roundtrip(broker, "/default/jwt", "--ca", pki.ca)
        assert missing["error"].startswith("UNAUTHENTICATED") and "no credentials" in missing["error"], missing
        # bob may look up and consume but not produce: the producer is refused, naming the permission.
        bob = roundtrip(broker, "/default/jwt", "--ca", pki.ca, "--token", issue_token("bob", SECRET))
        assert bob["error"].startswith("PERMISSION_DENIED") and "'produce'" in bob["error"], bob
        outside = roundtrip(broker, "/private/jwt", "--ca", pki.ca, "--token", token)
        assert outside["error"].startswith("PERMISSION_DENIED") and "/private/jwt" in outside["error"], outside

        log = broker.log()
        assert SECRET not in log and token not in log and admin_token not in log
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        assert "danube_" in metrics and SECRET not in metrics and token not in metrics


def test_token_supplier_keeps_a_long_lived_producer_working(client_python, pki, secret_file, tmp_path):
    """Tokens live 3 s; the producer sends for about 6 s while the token file is rewritten every
    second: each call picks up the current token through with_token_supplier."""
    token_file = tmp_path / "token"

    def write_token():
        tmp = tmp_path / "token.tmp"
        tmp.write_text(issue_token("ops", SECRET, expires_in_s=3))
        os.replace(tmp, token_file)

    write_token()
    stop = threading.Event()

    def refresher():
        while not stop.wait(1.0):
            write_token()

    with running_broker(*tls_args(pki), "--jwt-secret-file", secret_file, "--super-admin", "ops") as broker:
        # A broker slow to start (a loaded machine) can outlive the first 3-s token: the client
        # must begin with a fresh one, as a supplier's user would have it.
        write_token()
        thread = threading.Thread(target=refresher, daemon=True)
        thread.start()
        try:
            result = roundtrip(
                broker,
                "/default/refresh",
                "--ca",
                pki.ca,
                "--token-file",
                str(token_file),
                "--delay-ms",
                "300",
                count=20,
                timeout=120,
            )
        finally:
            stop.set()
            thread.join(5)
        assert result["error"] is None and result["received"] == result["sent"] and len(result["sent"]) == 20, result


# ---------------------------------------------------------------- danube.client (batch lane)


@pytest.mark.parametrize("transport", ["grpc", "h2"])
def test_danube_client_batch_lane_with_tls_and_jwt(pki, secret_file, transport):
    from danube.client import DanubeClient, SubType
    from danube.errors import AuthenticationError, PermissionDeniedError

    async def run(url, token, count=2000):
        client = (
            DanubeClient.builder()
            .service_url(url)
            .with_mtls(pki.ca, pki.client.cert, pki.client.key)
            .with_token(token)
            .with_retry(give_up_after_s=3)
            .with_transport(transport)
            .build()
        )
        try:
            producer = client.new_producer().with_topic("/default/lane").with_name("p1").build()
            await producer.create()
            # the streams on the client's own HTTP/2 over TLS, or on grpc.aio's
            assert type(client.connection().batch_lane).__name__ == (
                "H2BatchLane" if transport == "h2" else "GrpcBatchLane"
            )
            consumer = (
                client.new_consumer()
                .with_topic("/default/lane")
                .with_consumer_name("c1")
                .with_subscription("s")
                .with_subscription_type(SubType.Exclusive)
                .build()
            )
            await consumer.subscribe()
            futures = [await producer.send(f"m-{i}".encode()) for i in range(count)]
            await asyncio.gather(*futures)
            got = []
            async for message in consumer:
                got.append(bytes(message.payload))
                await consumer.ack(message)
                if len(got) == count:
                    break
            await producer.close()
            await consumer.close()
            return got
        finally:
            await client.close()

    with running_broker(
        *tls_args(pki),
        "--tls-ca",
        pki.ca,
        "--tls-verify-client",
        "--jwt-secret-file",
        secret_file,
        "--super-admin",
        "ops",
    ) as broker:
        got = asyncio.run(run(broker.url, issue_token("ops", SECRET)))
        assert got == [f"m-{i}".encode() for i in range(2000)]
        # client-1's certificate is valid, but the token names carol, who holds no role.
        with pytest.raises(PermissionDeniedError, match="lookup"):
            asyncio.run(run(broker.url, issue_token("carol", SECRET), count=1))
        with pytest.raises(AuthenticationError, match="expired"):
            asyncio.run(run(broker.url, issue_token("ops", SECRET, now=time.time() - 7200, expires_in_s=5), count=1))


# ---------------------------------------------------------------- batch-lane streams, message by message


@pytest.mark.parametrize("server", ["native", "grpcio"])
def test_batch_lane_streams_are_checked_per_message(pki, secret_file, server):
    """A Publish stream that creates a producer on an allowed topic and then on a denied one, and a
    Publish naming another principal's producer id, end PERMISSION_DENIED; a Consume stream
    subscribing where it may not, too."""
    import grpc

    from danube import message_codec
    from danube.proto.danube_batch import batch_pb2 as bpb
    from danube.proto.danube_batch import batch_pb2_grpc as bgrpc

    admin_token = issue_token("ops", SECRET)
    with running_broker(
        *tls_args(pki), "--jwt-secret-file", secret_file, "--super-admin", "ops", "--grpc-server", server
    ) as broker:
        for args in (
            ("roles", "create", "app", "--permission", "produce:/default/*"),
            ("bindings", "create", "--subject", "alice", "--role", "app"),
            ("roles", "create", "reader", "--permission", "consume:/default/*"),
            ("bindings", "create", "--subject", "bob", "--role", "reader"),
        ):
            done = admin(broker, pki, admin_token, "security", *args)
            assert done.returncode == 0, done.stderr

        async def main():
            with open(pki.ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(f.read())

            def channel_for(subject):
                return grpc.aio.secure_channel(
                    broker.target,
                    grpc.composite_channel_credentials(
                        creds, grpc.access_token_call_credentials(issue_token(subject, SECRET))
                    ),
                )

            frame = message_codec.encode_record(b"x", publish_time=1, producer_id=0, key=None, attributes=None)

            async def publish(channel, requests):
                acks = []
                call = bgrpc.BatchLaneStub(channel).Publish(iter(requests))
                try:
                    async for ack in call:
                        acks.append(ack)
                except grpc.aio.AioRpcError as exc:
                    return acks, exc
                return acks, None

            def create(seq, topic):
                return bpb.PublishRequest(
                    sequence=seq,
                    create=bpb.ProducerSpec(topic=topic, producer_name="p", reliable=True),
                    frames=bytes(frame),
                )

            ops = channel_for("ops")
            acks, error = await publish(ops, [create(1, "/private/t")])
            assert error is None and acks and acks[0].producer_id, (acks, error)
            private_producer = acks[0].producer_id
            alice = channel_for("alice")
            acks, error = await publish(alice, [create(1, "/default/t")])
            assert error is None and len(acks) == 1
            acks, error = await publish(alice, [create(1, "/default/t2"), create(2, "/private/t")])
            assert error is not None and error.code() == grpc.StatusCode.PERMISSION_DENIED, error
            assert "'produce' on /private/t" in error.details()
            acks, error = await publish(
                alice, [bpb.PublishRequest(sequence=1, producer_id=private_producer, frames=bytes(frame))]
            )
            assert error is not None and error.code() == grpc.StatusCode.PERMISSION_DENIED, error
            call = bgrpc.BatchLaneStub(alice).Consume(
                iter(
                    [
                        bpb.ConsumeRequest(
                            subscribe=bpb.SubscribeSpec(topic="/default/t", subscription="s", consumer_name="c")
                        )
                    ]
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "'consume'" in info.value.details()

            def subscribe(topic):
                return bpb.ConsumeRequest(subscribe=bpb.SubscribeSpec(topic=topic, subscription="s", consumer_name="c"))

            # an ack inside a permitted Consume stream naming another principal's consumer is
            # checked too: the stream ends PERMISSION_DENIED instead of acking on /private/t
            private_stream = bgrpc.BatchLaneStub(ops).Consume()
            await private_stream.write(subscribe("/private/t"))
            private_consumer = (await asyncio.wait_for(private_stream.read(), 10)).subscribed.consumer_id
            assert private_consumer
            bob = channel_for("bob")
            call = bgrpc.BatchLaneStub(bob).Consume()
            await call.write(subscribe("/default/t"))
            assert (await asyncio.wait_for(call.read(), 10)).subscribed.consumer_id
            foreign_ack = bpb.AckBatch(consumer_id=private_consumer, ranges=[bpb.OffsetRange(first=0, last=0)])
            await call.write(bpb.ConsumeRequest(ack=foreign_ack))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(call.read(), 10)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "'consume'" in info.value.details()
            private_stream.cancel()
            for channel in (ops, alice, bob):
                await channel.close()

        asyncio.run(main())


def test_danube_produce_cli_with_tls_and_token(pki, secret_file):
    with running_broker(*tls_args(pki), "--jwt-secret-file", secret_file, "--super-admin", "ops") as broker:
        base = [
            sys.executable,
            "-m",
            "danube.cli.main",
            "produce",
            "--service-url",
            broker.url,
            "--topic",
            "/default/cli",
            "--count",
            "500",
            "--tls-ca",
            pki.ca,
        ]
        ok = subprocess.run([*base, "--token", issue_token("ops", SECRET)], capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0, ok.stderr
        env = dict(os.environ, DANUBE_TOKEN=issue_token("nobody", SECRET))
        denied = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env)
        assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr + denied.stdout, denied.stderr


def test_a_stalled_tls_handshake_is_closed_after_the_handshake_timeout(pki, tmp_path):
    import socket

    config = tmp_path / "broker.yml"
    config.write_text("http2:\n  handshake_timeout: 1\n")
    with running_broker("--config", str(config), *tls_args(pki)) as broker:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as raw:
            started = time.monotonic()
            assert raw.recv(1) == b""  # nothing sent: the broker closes it
            assert time.monotonic() - started < 5


# ---------------------------------------------------------------- scalable topics under RBAC


def test_scalable_topic_clients_need_only_their_topics_grants(pki, secret_file):
    """An application bound to produce/consume/lookup on one scalable topic publishes to and
    consumes from its segment topics (a grant on T covers T.seg.*); a subject with no role is
    refused; splitting needs admin."""
    from danube.client import DanubeClient
    from danube.client.scalable import QUEUE, STREAM, ScalableConsumer, ScalableProducer
    from danube.errors import PermissionDeniedError

    topic, keys_ = "/default/scaled", [f"k{i}" for i in range(8)]

    def client(url, subject):
        return (
            DanubeClient.builder()
            .service_url(url)
            .with_tls(pki.ca)
            .with_token(issue_token(subject, SECRET))
            .with_retry(give_up_after_s=3)
            .build()
        )

    async def app(url, count=200):
        c = client(url, "alice")
        try:
            ordered = await ScalableConsumer(c, topic, "ordered", "c1", kind=STREAM).subscribe()
            queue = await ScalableConsumer(c, topic, "work", "q1", kind=QUEUE).subscribe()
            await asyncio.wait_for(ordered.assignment_changed.wait(), 20)
            producer = await ScalableProducer(c, topic, "p1").create()
            for i in range(count):
                await producer.send(f"{keys_[i % len(keys_)]}:{i}".encode(), key=keys_[i % len(keys_)])
            await producer.flush()
            got = {"ordered": [], "queue": []}
            for name, consumer in (("ordered", ordered), ("queue", queue)):
                deadline = time.monotonic() + 30
                while len(got[name]) < count and time.monotonic() < deadline:
                    message = await consumer.receive(timeout=0.5)
                    if message is not None:
                        got[name].append(int(message.payload.split(b":")[1]))
                        await consumer.ack(message)
            return {name: sorted(v) for name, v in got.items()}
        finally:
            await c.close()

    async def stranger(url):
        c = client(url, "carol")
        try:
            await ScalableProducer(c, topic, "p2").create()
        finally:
            await c.close()

    admin_token = issue_token("ops", SECRET)
    with running_broker(*tls_args(pki), "--jwt-secret-file", secret_file, "--super-admin", "ops") as broker:
        for args in (
            (
                "security",
                "roles",
                "create",
                "scaled-app",
                "--permission",
                f"produce:{topic}",
                "--permission",
                f"consume:{topic}",
                "--permission",
                f"lookup:{topic}",
            ),
            ("security", "bindings", "create", "--subject", "alice", "--role", "scaled-app"),
            ("scalable-topics", "create", topic, "--segments", "2"),
        ):
            done = admin(broker, pki, admin_token, *args)
            assert done.returncode == 0, done.stderr
        got = asyncio.run(app(broker.url))
        assert got == {"ordered": list(range(200)), "queue": list(range(200))}
        with pytest.raises(PermissionDeniedError, match="lookup"):
            asyncio.run(stranger(broker.url))
        denied = admin(broker, pki, issue_token("alice", SECRET), "scalable-topics", "split", topic, "0")
        assert denied.returncode != 0 and "'admin'" in denied.stderr, denied.stderr
