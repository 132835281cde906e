"""A Danube admin client for the few admin calls Danube's broker tests make (through its
``danube-admin`` CLI): create a topic, set and read a subscription's failure policy, unload a
topic, list brokers and their topics.

The messages are declared here from Danube's admin protocol (package ``danube_admin``, the field
numbers and enum values of its ``DanubeAdmin.proto``), not taken from this project's stubs, so
the calls show that a Danube admin client is understood.
"""

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
_OPT = F.LABEL_OPTIONAL


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(
        name="conformance/danube_admin.proto", package="danube_admin", syntax="proto3"
    )

    def enum(name, values):
        e = fd.enum_type.add(name=name)
        for i, v in enumerate(values):
            e.value.add(name=v, number=i)

    enum("DispatchStrategy", ["NonReliable", "Reliable"])
    enum("SubscriptionBackoffStrategy", ["Fixed", "Exponential"])
    enum("SubscriptionPoisonPolicy", ["DeadLetter", "Block", "Drop"])

    def message(name, fields):
        m = fd.message_type.add(name=name)
        for number, (fname, ftype, type_name, optional) in enumerate(fields, 1):
            if fname is None:
                continue
            f = m.field.add(
                name=fname, number=number, label=F.LABEL_REPEATED if optional == "repeated" else _OPT, type=ftype
            )
            if type_name:
                f.type_name = f".danube_admin.{type_name}"
            if optional is True:  # proto3 optional: a synthetic oneof
                f.proto3_optional = True
                f.oneof_index = len(m.oneof_decl)
                m.oneof_decl.add(name=f"_{fname}")
        return m

    S, U32, U64, I32, E, M, B = (
        F.TYPE_STRING,
        F.TYPE_UINT32,
        F.TYPE_UINT64,
        F.TYPE_INT32,
        F.TYPE_ENUM,
        F.TYPE_MESSAGE,
        F.TYPE_BOOL,
    )
    message(
        "NewTopicRequest",
        [
            ("name", S, None, False),
            ("schema_subject", S, None, True),
            ("dispatch_strategy", E, "DispatchStrategy", False),
        ],
    )
    message("TopicResponse", [("success", B, None, False)])
    message("SubscriptionResponse", [("success", B, None, False)])
    message(
        "SubscriptionFailurePolicy",
        [
            ("max_redelivery_count", U32, None, False),
            ("ack_timeout_ms", U64, None, False),
            ("base_redelivery_delay_ms", U64, None, False),
            ("max_redelivery_delay_ms", U64, None, False),
            ("backoff_strategy", E, "SubscriptionBackoffStrategy", False),
            ("dead_letter_topic", S, None, True),
            ("poison_policy", E, "SubscriptionPoisonPolicy", False),
        ],
    )
    message(
        "SetSubscriptionFailurePolicyRequest",
        [
            ("topic", S, None, False),
            ("subscription", S, None, False),
            ("failure_policy", M, "SubscriptionFailurePolicy", False),
        ],
    )
    message("GetSubscriptionFailurePolicyRequest", [("topic", S, None, False), ("subscription", S, None, False)])
    message(
        "GetSubscriptionFailurePolicyResponse",
        [("failure_policy", M, "SubscriptionFailurePolicy", True), ("subscription_type", I32, None, False)],
    )
    message("Empty", [])
    message("TopicRequest", [("name", S, None, False)])
    message("BrokerRequest", [("broker_id", S, None, False)])
    message("BrokerInfo", [("broker_id", S, None, False)])  # (fields 2-6 unused here)
    message("BrokerListResponse", [("brokers", M, "BrokerInfo", "repeated")])
    message("TopicInfo", [("name", S, None, False), ("broker_id", S, None, False), ("delivery", S, None, False)])
    message("TopicInfoListResponse", [("topics", M, "TopicInfo", "repeated")])
    return fd


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_file())
MSG = {
    name: message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"danube_admin.{name}"))
    for name in (
        "NewTopicRequest",
        "TopicResponse",
        "SubscriptionResponse",
        "SubscriptionFailurePolicy",
        "SetSubscriptionFailurePolicyRequest",
        "GetSubscriptionFailurePolicyRequest",
        "GetSubscriptionFailurePolicyResponse",
        "Empty",
        "TopicRequest",
        "BrokerRequest",
        "BrokerListResponse",
        "TopicInfoListResponse",
    )
}
BACKOFF = {"fixed": 0, "exponential": 1}
POISON = {"dead_letter": 0, "block": 1, "drop": 2}


def failure_policy(
    max_redelivery_count,
    ack_timeout_ms,
    poison_policy,
    dead_letter_topic=None,
    *,
    base_redelivery_delay_ms=50,
    max_redelivery_delay_ms=50,
    backoff_strategy="fixed",
) -> dict:
    """Danube's ``fixed_failure_policy`` helper (its tests' defaults: fixed 50 ms backoff)."""
    return {
        "max_redelivery_count": max_redelivery_count,
        "ack_timeout_ms": ack_timeout_ms,
        "base_redelivery_delay_ms": base_redelivery_delay_ms,
        "max_redelivery_delay_ms": max_redelivery_delay_ms,
        "backoff_strategy": backoff_strategy,
        "dead_letter_topic": dead_letter_topic,
        "poison_policy": poison_policy,
    }


class AdminClient:
    def __init__(self, admin_url: str) -> None:
        self._channel = grpc.aio.insecure_channel(admin_url.split("://", 1)[-1])

    def _call(self, service, method, request, response):
        return self._channel.unary_unary(
            f"/danube_admin.{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=MSG[response].FromString,
        )(request, timeout=30)

    async def create_topic(self, topic: str, dispatch_strategy: str = "reliable") -> None:
        req = MSG["NewTopicRequest"](name=topic, dispatch_strategy=1 if dispatch_strategy == "reliable" else 0)
        await self._call("TopicAdmin", "CreateTopic", req, "TopicResponse")

    async def set_failure_policy(self, topic: str, subscription: str, policy: dict) -> None:
        """Danube's ``set_failure_policy`` helper: set it, read it back, every field equal."""
        msg = MSG["SubscriptionFailurePolicy"](
            max_redelivery_count=policy["max_redelivery_count"],
            ack_timeout_ms=policy["ack_timeout_ms"],
            base_redelivery_delay_ms=policy["base_redelivery_delay_ms"],
            max_redelivery_delay_ms=policy["max_redelivery_delay_ms"],
            backoff_strategy=BACKOFF[policy["backoff_strategy"]],
            poison_policy=POISON[policy["poison_policy"]],
        )
        if policy["dead_letter_topic"] is not None:
            msg.dead_letter_topic = policy["dead_letter_topic"]
        req = MSG["SetSubscriptionFailurePolicyRequest"](topic=topic, subscription=subscription, failure_policy=msg)
        await self._call("TopicAdmin", "SetSubscriptionFailurePolicy", req, "SubscriptionResponse")
        stored = await self.get_failure_policy(topic, subscription)
        assert stored == policy, f"stored failure policy {stored} != set {policy}"

    async def get_failure_policy(self, topic: str, subscription: str) -> dict | None:
        req = MSG["GetSubscriptionFailurePolicyRequest"](topic=topic, subscription=subscription)
        resp = await self._call(
            "TopicAdmin", "GetSubscriptionFailurePolicy", req, "GetSubscriptionFailurePolicyResponse"
        )
        if not resp.HasField("failure_policy"):
            return None
        p = resp.failure_policy
        return {
            "max_redelivery_count": p.max_redelivery_count,
            "ack_timeout_ms": p.ack_timeout_ms,
            "base_redelivery_delay_ms": p.base_redelivery_delay_ms,
            "max_redelivery_delay_ms": p.max_redelivery_delay_ms,
            "backoff_strategy": {v: k for k, v in BACKOFF.items()}[p.backoff_strategy],
            "dead_letter_topic": p.dead_letter_topic if p.HasField("dead_letter_topic") else None,
            "poison_policy": {v: k for k, v in POISON.items()}[p.poison_policy],
        }

    async def unload_topic(self, topic: str) -> None:
        await self._call("TopicAdmin", "UnloadTopic", MSG["TopicRequest"](name=topic), "TopicResponse")

    async def find_topic_assignment(self, topic: str) -> dict | None:
        """Danube's helper: the broker listing ``topic`` among its topics, with its delivery."""
        brokers = await self._call("BrokerAdmin", "ListBrokers", MSG["Empty"](), "BrokerListResponse")
        for broker in brokers.brokers:
            listed = await self._call(
                "TopicAdmin",
                "ListBrokerTopics",
                MSG["BrokerRequest"](broker_id=broker.broker_id),
                "TopicInfoListResponse",
            )
            for entry in listed.topics:
                if entry.name == topic:
                    return {"broker_id": entry.broker_id, "delivery": entry.delivery}
        return None

    async def close(self) -> None:
        await self._channel.close()
