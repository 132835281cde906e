"""A secure cluster: a real etcd and 2 broker subprocesses with mTLS + JWT + RBAC on both ports,
so every broker-to-broker call (danube.cluster.peers) has to be secure to work at all.

Covered: a client producing and consuming through a redirect (https URLs, TLS, client
certificate, token); admin calls sent to the broker that does not own the topic, forwarded to the
owner as the caller (token) or as the broker (a caller known by its certificate only); a topic
unload and a drain of the other broker forwarded to it.  Refusals: no role (at the broker asked),
and a caller whose binding the owner already dropped while the broker asked still allows it
(``rbac_refresh_seconds`` is long here, so that broker's view stays stale): the owner refuses the
forwarded call with PERMISSION_DENIED naming the caller — forwarding lends the caller nothing.
"""

from __future__ import annotations

import asyncio
import json
import os

import grpc
import pytest

from danube.model.segment_layout import SegmentLayout
from danube.proto.danube import DanubeApi_pb2 as dpb
from danube.proto.danube import DanubeApi_pb2_grpc as dpb_grpc
from danube.proto.danube_admin import admin_pb2 as apb
from danube.proto.danube_admin import admin_pb2_grpc as apb_grpc
from danube.proto.danube_scalable import scalable_pb2 as spb
from danube.proto.danube_scalable import scalable_pb2_grpc as spb_grpc
from danube.security.jwt import issue_token
from tests.support.certs import ClusterPki, make_cluster_pki
from tests.support.cluster import local_cluster, wait_until
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(150)]

SECRET = "cluster-secret-0123456789abcdef-012345"
TOPIC = "/default/secure-orders"


# ---------------------------------------------------------------- configuration


def _config(directory: str, pki: ClusterPki, *, jwt: bool = True, super_admins=("ops",)) -> str:
    auth: dict = {
        "mode": "tls",
        "tls": {"cert_file": pki.broker.cert, "key_file": pki.broker.key, "ca_file": pki.ca, "verify_client": True},
        "super_admins": list(super_admins),
        # a broker re-reads roles changed through another broker only this rarely: the test
        # relies on one broker's stale view (the refusal at the owner below)
        "rbac_refresh_seconds": 3600,
    }
    if jwt:
        secret = os.path.join(directory, "jwt-secret")
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(SECRET)
        auth["jwt"] = {"secret_key_file": secret, "issuer": "danube-auth"}
    path = os.path.join(directory, "broker.yml")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"auth": auth}, f)  # JSON is YAML
    return path


# ---------------------------------------------------------------- calls


def token(subject: str) -> str:
    return issue_token(subject, SECRET, issuer="danube-auth", expires_in_s=600)


class Secure:
    """gRPC calls to the cluster's brokers as a client with the CA, client-1's certificate and
    (optionally) a token."""

    def __init__(self, pki: ClusterPki) -> None:
        def read(path):
            with open(path, "rb") as f:
                return f.read()

        self.creds = grpc.ssl_channel_credentials(read(pki.ca), read(pki.client.key), read(pki.client.cert))

    async def call(self, url: str, stub, method: str, request, subject: str | None):
        metadata = (("authorization", f"Bearer {token(subject)}"),) if subject else ()
        async with grpc.aio.secure_channel(url.split("://", 1)[-1], self.creds) as channel:
            return await getattr(stub(channel), method)(request, timeout=30, metadata=metadata)

    async def security(self, url: str, method: str, doc: dict, subject: str | None = "ops") -> dict:
        metadata = (("authorization", f"Bearer {token(subject)}"),) if subject else ()
        async with grpc.aio.secure_channel(url.split("://", 1)[-1], self.creds) as channel:
            call = channel.unary_unary(f"/danube_admin.SecurityAdmin/{method}")
            reply = await call(json.dumps(doc).encode(), timeout=30, metadata=metadata)
        return json.loads(reply) if reply else {}

    async def refused(self, url, stub, method, request, subject) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await self.call(url, stub, method, request, subject)
        return info.value


async def grant_roles(c: Secure, cluster) -> None:
    """alice, carol and client-1 may administer, produce, consume and look up /default/*.  Set
    through each broker: a broker reloads at once what is changed through it (the others only
    every rbac_refresh_seconds, an hour here)."""
    grants = ["admin:/default/*", "produce:/default/*", "consume:/default/*", "lookup:/default/*"]
    for p in cluster.procs:
        await c.security(p.admin_url, "PutRole", {"name": "ns-admin", "permissions": grants})
        for subject in ("alice", "carol", "client-1"):
            await c.security(p.admin_url, "Bind", {"subject": subject, "roles": ["ns-admin"]})


def place(c: Secure, cluster, topic: str):
    """Place ``topic`` (a lookup at the first broker); (owner id, a broker that does not own it)."""
    asyncio.run(
        c.call(
            cluster.procs[0].url,
            dpb_grpc.DiscoveryStub,
            "TopicLookup",
            dpb.TopicLookupRequest(request_id=1, topic=topic),
            "alice",
        )
    )
    owner_id = wait_until(lambda: cluster.state()["assignments"].get(topic), 20, "placement")
    return owner_id, next(p for p in cluster.procs if p.broker_id != owner_id)


async def produce_and_consume(url: str, pki: ClusterPki, subject: str, payloads: list[bytes]) -> list[bytes]:
    from danube.client import DanubeClient, SubType

    client = (
        DanubeClient.builder()
        .service_url(url)
        .with_mtls(pki.ca, pki.client.cert, pki.client.key)
        .with_token(token(subject))
        .with_retry(give_up_after_s=20)
        .build()
    )
    try:
        producer = client.new_producer().with_topic(TOPIC).with_name("p").build()
        await producer.create()  # creates the topic on its first run
        consumer = (
            client.new_consumer()
            .with_topic(TOPIC)
            .with_consumer_name("c")
            .with_subscription("s")
            .with_subscription_type(SubType.Exclusive)
            .build()
        )
        await consumer.subscribe()
        await asyncio.gather(*[await producer.send(p) for p in payloads])
        got: list[bytes] = []
        async with asyncio.timeout(30):
            async for message in consumer:
                got.append(bytes(message.payload))
                await consumer.ack(message)
                if len(got) == len(payloads):
                    break
        await producer.close()
        await consumer.close()
        return got
    finally:
        await client.close()


# ---------------------------------------------------------------- the test


def test_secure_cluster_forwards_as_the_caller_and_follows_redirects(tmp_path):
    pki = make_cluster_pki(str(tmp_path / "pki"))
    config = _config(str(tmp_path), pki)
    c = Secure(pki)
    with local_cluster(str(tmp_path / "c"), brokers=2, config=config) as cluster:
        procs = {p.broker_id: p for p in cluster.procs}
        assert all(p.url.startswith("https://") for p in cluster.procs)
        asyncio.run(grant_roles(c, cluster))
        first = cluster.procs[0]
        owner_id, other = place(c, cluster, TOPIC)
        owner = procs[owner_id]
        answer = asyncio.run(
            c.call(
                other.url,
                dpb_grpc.DiscoveryStub,
                "TopicLookup",
                dpb.TopicLookupRequest(request_id=2, topic=TOPIC),
                "alice",
            )
        )
        assert answer.response_type == dpb.TopicLookupResponse.Redirect
        assert answer.broker_url == owner.url == f"https://127.0.0.1:{owner.port}"
        registered = cluster.state()["registered"]
        assert all(info["admin_url"].startswith("https://") for info in registered.values()), registered

        # A client given the other broker follows the redirect with TLS, its certificate and token.
        payloads = [f"m-{i}".encode() for i in range(20)]
        assert asyncio.run(produce_and_consume(other.url, pki, "alice", payloads)) == payloads

        # Describe at the broker that does not own the topic: forwarded with alice's token ...
        described = asyncio.run(
            c.call(
                other.admin_url, apb_grpc.TopicAdminStub, "DescribeTopic", apb.DescribeTopicRequest(name=TOPIC), "alice"
            )
        )
        assert described.broker_id == owner_id and described.storage.next_offset == 20
        assert list(described.subscriptions) == ["s"]
        # ... and for a caller known by its client certificate only, as the broker itself.
        described = asyncio.run(
            c.call(
                other.admin_url, apb_grpc.TopicAdminStub, "DescribeTopic", apb.DescribeTopicRequest(name=TOPIC), None
            )
        )
        assert described.broker_id == owner_id

        # No role at all: refused by the broker asked, nothing forwarded.
        refused = asyncio.run(
            c.refused(
                other.admin_url, apb_grpc.TopicAdminStub, "DescribeTopic", apb.DescribeTopicRequest(name=TOPIC), "bob"
            )
        )
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "denied to 'bob'" in refused.details() and "at broker" not in refused.details()

        # carol loses her binding through the owner; the other broker's view is still the old one,
        # so it lets her call through and forwards it with her token: the owner refuses.
        asyncio.run(c.security(owner.admin_url, "Unbind", {"subject": "carol"}))
        refused = asyncio.run(
            c.refused(
                other.admin_url, apb_grpc.TopicAdminStub, "DescribeTopic", apb.DescribeTopicRequest(name=TOPIC), "carol"
            )
        )
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED, refused.details()
        assert refused.details().startswith(f"at broker {owner_id}: permission 'admin' on {TOPIC} denied to 'carol'")
        refused = asyncio.run(
            c.refused(other.admin_url, apb_grpc.TopicAdminStub, "UnloadTopic", apb.TopicRequest(name=TOPIC), "carol")
        )
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED and "denied to 'carol'" in refused.details()
        assert cluster.state()["assignments"][TOPIC] == owner_id  # nothing moved

        # Unload sent to the other broker: forwarded to the owner (as alice), the topic moves.
        asyncio.run(
            c.call(other.admin_url, apb_grpc.TopicAdminStub, "UnloadTopic", apb.TopicRequest(name=TOPIC), "alice")
        )
        wait_until(lambda: cluster.state()["assignments"].get(TOPIC) == other.broker_id, 20, "the move")

        # Drain the topic's new owner, asked of the first owner: forwarded to the broker drained.
        drained = asyncio.run(
            c.call(
                owner.admin_url,
                apb_grpc.BrokerAdminStub,
                "UnloadBroker",
                apb.UnloadBrokerRequest(broker_id=other.broker_id, timeout_seconds=30),
                "ops",
            )
        )
        assert drained.total >= 1 and drained.succeeded == drained.total and not drained.failed_topics, drained
        wait_until(lambda: cluster.state()["assignments"].get(TOPIC) == owner_id, 20, "the drain's move")
        asyncio.run(
            c.call(
                owner.admin_url,
                apb_grpc.BrokerAdminStub,
                "ActivateBroker",
                apb.ActivateBrokerRequest(broker_id=other.broker_id),
                "ops",
            )
        )

        # A scalable topic's split asked of the broker that is not its controller leader: forwarded to
        # the leader's client port as the broker (its token), the parent segment terminated at
        # whichever broker serves it.
        scalable = "/default/secure-scalable"
        asyncio.run(
            c.call(
                first.url,
                spb_grpc.ScalableTopicsStub,
                "CreateScalableTopic",
                spb.CreateScalableTopicRequest(topic=scalable, num_segments=1),
                "ops",
            )
        )
        leader_url = asyncio.run(
            c.call(
                first.url,
                spb_grpc.ScalableTopicsStub,
                "GetScalableTopic",
                spb.ScalableTopicRequest(topic=scalable),
                "ops",
            )
        ).controller_broker_url
        assert leader_url.startswith("https://")
        not_leader = next(p for p in cluster.procs if p.url != leader_url)
        asyncio.run(
            c.call(
                not_leader.url,
                spb_grpc.ScalableTopicsStub,
                "SplitSegment",
                spb.SplitSegmentRequest(topic=scalable, segment_id=0),
                "ops",
            )
        )
        layout = SegmentLayout.from_json(
            asyncio.run(
                c.call(
                    not_leader.url,
                    spb_grpc.ScalableTopicsStub,
                    "GetScalableTopic",
                    spb.ScalableTopicRequest(topic=scalable),
                    "ops",
                )
            ).metadata_json
        )
        assert sorted(s.segment_id for s in layout.active_segments) == [1, 2], layout

        # The client, still pointed at the drained broker, is redirected to where the topic is now;
        # the subscription continues after the 20 messages already acknowledged.
        more = [f"n-{i}".encode() for i in range(5)]
        assert asyncio.run(produce_and_consume(other.url, pki, "alice", more)) == more


def test_mtls_only_cluster_needs_the_brokers_subject_as_an_admin(tmp_path):
    """No JWT: brokers call each other as their certificate's CN (danube-node).  Until RBAC lets
    that subject administer the cluster, the owner refuses forwarded calls, and both the start-up
    log and the refusal say what to configure."""
    pki = make_cluster_pki(str(tmp_path / "pki"))
    config = _config(str(tmp_path), pki, jwt=False, super_admins=("client-1",))
    c = Secure(pki)
    with local_cluster(str(tmp_path / "c"), brokers=2, config=config) as cluster:
        first = cluster.procs[0]
        asyncio.run(
            c.call(first.admin_url, apb_grpc.TopicAdminStub, "CreateTopic", apb.NewTopicRequest(name=TOPIC), None)
        )
        owner_id = wait_until(lambda: cluster.state()["assignments"].get(TOPIC), 20, "placement")
        other = next(p for p in cluster.procs if p.broker_id != owner_id)

        def other_sees_the_owner():  # its watched view, which decides whether it forwards
            listed = asyncio.run(
                c.call(
                    other.admin_url,
                    apb_grpc.TopicAdminStub,
                    "ListNamespaceTopics",
                    apb.NamespaceRequest(name="default"),
                    None,
                )
            )
            return any(t.name == TOPIC and t.broker_id == owner_id for t in listed.topics)

        wait_until(other_sees_the_owner, 20, f"{other.broker_id}'s view of the placement")
        for p in cluster.procs:
            assert "certificate subject 'danube-node' may not administer the cluster" in p.log()
        refused = asyncio.run(
            c.refused(
                other.admin_url, apb_grpc.TopicAdminStub, "DescribeTopic", apb.DescribeTopicRequest(name=TOPIC), None
            )
        )
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED, refused.details()
        assert f"at broker {owner_id}" in refused.details() and "denied to 'danube-node'" in refused.details()
        assert "auth.super_admins" in refused.details()

        async def grant():
            for p in cluster.procs:
                await c.security(p.admin_url, "PutRole", {"name": "brokers", "permissions": ["admin:*"]}, None)
                await c.security(p.admin_url, "Bind", {"subject": "danube-node", "roles": ["brokers"]}, None)

        asyncio.run(grant())
        described = asyncio.run(
            c.call(
                other.admin_url, apb_grpc.TopicAdminStub, "DescribeTopic", apb.DescribeTopicRequest(name=TOPIC), None
            )
        )
        assert described.broker_id == owner_id


def test_danube_client_from_pypi_follows_a_secure_redirect(tmp_path):
    """danube-client 0.5.0 given the broker that does not own the topic: it looks the topic up there,
    follows the https redirect with its CA, client certificate and token, produces and consumes."""
    from tests.support import danube_client_venv as dc

    try:
        dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        pytest.skip(f"danube-client venv not available: {exc}")
    pki = make_cluster_pki(str(tmp_path / "pki"))
    c = Secure(pki)
    token_file = tmp_path / "token"
    token_file.write_text(token("alice"))  # read by the script: a token never goes on a command line
    os.chmod(token_file, 0o600)
    with local_cluster(str(tmp_path / "c"), brokers=2, config=_config(str(tmp_path), pki)) as cluster:
        asyncio.run(grant_roles(c, cluster))
        topic = "/default/secure-pypi"
        _, other = place(c, cluster, topic)
        result = dc.run_script(
            "secure_roundtrip.py",
            other.url,
            topic,
            "--count",
            "5",
            "--ca",
            pki.ca,
            "--cert",
            pki.client.cert,
            "--key",
            pki.client.key,
            "--token-file",
            str(token_file),
            timeout=90,
        )
        assert result["error"] is None and result["received"] == result["sent"] == [f"m-{i}" for i in range(5)], result
