"""The POST endpoints: Danube's cluster, topic and schema actions (and the rebalance trigger).

Every name goes through the broker's own rules (``danube.metadata.keys``, the registry's subject
rule) before a call is made; the caller's token, when the gateway requires one, is what the broker
sees, so the broker's RBAC decides what this caller may do.
"""

from __future__ import annotations

import json

from danube.errors import InvalidArgumentError
from danube.gateway.backend import AdminBackend, pb, spb
from danube.gateway.errors import GatewayRequestError
from danube.metadata.keys import check_name, check_namespace, check_topic
from danube.schema.registry import check_subject  # the registry's one subject rule

COMPATIBILITY_MODES = ("NONE", "BACKWARD", "FORWARD", "FULL")


def parse_body(body: bytes) -> dict:
    try:
        doc = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise GatewayRequestError("the request body is not JSON") from None
    if not isinstance(doc, dict):
        raise GatewayRequestError("the request body must be a JSON object")
    return doc


def _str(doc: dict, key: str, required: bool = True) -> str | None:
    value = doc.get(key)
    if value is None or value == "":
        if required:
            raise GatewayRequestError(f"missing {key}")
        return None
    if not isinstance(value, str):
        raise GatewayRequestError(f"{key} must be a string")
    return value.strip()


def _int(doc: dict, key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise GatewayRequestError(f"{key} must be an integer from {lo} to {hi}")
    return value


def _bool(doc: dict, key: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise GatewayRequestError(f"{key} must be true or false")
    return value


def normalize_topic(topic: str, namespace: str | None) -> str:
    """Danube's forms: /ns/topic, ns/topic, or topic with "namespace"; then the broker's name rule."""
    if not topic.startswith("/"):
        parts = topic.split("/")
        if len(parts) == 2:
            topic = "/" + topic
        elif len(parts) == 1:
            if not namespace:
                raise InvalidArgumentError("missing namespace for topic without namespace")
            topic = f"/{check_namespace(namespace)}/{topic}"
    return check_topic(topic)


class Actions:
    def __init__(self, backend: AdminBackend) -> None:
        self.backend = backend

    async def cluster(self, doc: dict, token: str | None) -> dict:
        action = (_str(doc, "action") or "").lower()
        broker_id = _str(doc, "broker_id")
        if not broker_id:
            raise GatewayRequestError("missing broker_id")
        check_name("broker", broker_id)
        b = self.backend
        if action == "unload":
            include = [check_namespace(n) for n in doc.get("namespaces_include") or []]
            exclude = [check_namespace(n) for n in doc.get("namespaces_exclude") or []]
            timeout_s = _int(doc, "timeout_seconds", 60, 1, 3600)
            r = await b.call(
                b.brokers.UnloadBroker,
                pb.UnloadBrokerRequest(
                    broker_id=broker_id,
                    max_parallel=_int(doc, "max_parallel", 1, 1, 64),
                    namespaces_include=include,
                    namespaces_exclude=exclude,
                    dry_run=_bool(doc, "dry_run", False),
                    timeout_seconds=timeout_s,
                ),
                token=token,
                timeout=float(timeout_s or 60) + 5,
            )
            return {
                "success": r.started,
                "message": f"started={str(r.started).lower()} total={r.total} "
                f"succeeded={r.succeeded} failed={r.failed} pending={r.pending}",
                "failed_topics": list(r.failed_topics),
            }
        if action == "activate":
            r = await b.call(
                b.brokers.ActivateBroker,
                pb.ActivateBrokerRequest(
                    broker_id=broker_id, reason=_str(doc, "reason", required=False) or "admin_activate"
                ),
                token=token,
            )
            return {"success": r.success, "message": f"success={str(r.success).lower()}"}
        raise GatewayRequestError(f"unsupported action {action[:40]!r}: use unload or activate")

    async def rebalance(self, doc: dict, token: str | None) -> dict:
        b = self.backend
        request = pb.RebalanceRequest(dry_run=_bool(doc, "dry_run", False))
        max_moves = _int(doc, "max_moves", None, 1, 10_000)
        if max_moves is not None:
            request.max_moves = max_moves
        r = await b.call(b.brokers.TriggerRebalance, request, token=token, timeout=60.0)
        return {
            "success": r.success,
            "moves_executed": r.moves_executed,
            "error_message": "" if r.success else r.message,
            "message": r.message,
            "cv_before": r.cv_before,
            "cv_after_estimated": r.cv_after_estimated,
            "proposed_moves": [
                {
                    "topic_name": m.topic_name,
                    "from_broker": m.from_broker,
                    "to_broker": m.to_broker,
                    "estimated_load": m.estimated_load,
                    "reason": "",
                }
                for m in r.proposed_moves
            ],
        }

    async def topic(self, doc: dict, token: str | None) -> dict:
        action = (_str(doc, "action") or "").lower()
        name = normalize_topic(_str(doc, "topic") or "", _str(doc, "namespace", required=False))
        b = self.backend
        if action == "create":
            strategy_text = (_str(doc, "dispatch_strategy", required=False) or "non_reliable").lower()
            if strategy_text not in (
                "reliable",
                "reliable_dispatch",
                "reliable-dispatch",
                "non_reliable",
                "non-reliable",
                "nonreliable",
            ):
                raise GatewayRequestError("dispatch_strategy must be reliable or non_reliable")
            strategy = pb.Reliable if strategy_text.startswith("reliable") else pb.NonReliable
            subject = _str(doc, "schema_subject", required=False)
            if subject:
                check_subject(subject)
            partitions = _int(doc, "partitions", None, 0, 4096)  # 0 or absent: not partitioned
            if partitions:
                req = pb.PartitionedTopicRequest(base_name=name, partitions=partitions, dispatch_strategy=strategy)
                if subject:
                    req.schema_subject = subject
                r = await b.call(b.topics.CreatePartitionedTopic, req, token=token)
            else:
                req = pb.NewTopicRequest(name=name, dispatch_strategy=strategy)
                if subject:
                    req.schema_subject = subject
                r = await b.call(b.topics.CreateTopic, req, token=token)
        elif action == "delete":
            r = await b.call(b.topics.DeleteTopic, pb.TopicRequest(name=name), token=token)
        elif action == "unload":
            r = await b.call(b.topics.UnloadTopic, pb.TopicRequest(name=name), token=token)
        elif action == "unsubscribe":
            sub = check_name("subscription", _str(doc, "subscription"))
            r = await b.call(b.topics.Unsubscribe, pb.SubscriptionRequest(topic=name, subscription=sub), token=token)
        else:
            raise GatewayRequestError(f"unsupported action {action[:40]!r}: use create, delete, unload or unsubscribe")
        return {"success": r.success, "message": "ok" if r.success else "not_ok", "topic": name}

    async def schema(self, doc: dict, token: str | None) -> dict:
        action = (_str(doc, "action") or "").lower()
        subject = check_subject(_str(doc, "subject") or "")
        b = self.backend
        if action == "set_compatibility":
            mode = (_str(doc, "compatibility_mode") or "").upper()
            if mode not in COMPATIBILITY_MODES:
                raise GatewayRequestError(f"compatibility_mode must be one of {', '.join(COMPATIBILITY_MODES)}")
            r = await b.call(
                b.schemas.SetCompatibilityMode,
                spb.SetCompatibilityModeRequest(subject=subject, compatibility_mode=mode),
                token=token,
            )
        elif action == "delete_version":
            version = _int(doc, "version", None, 1, 2**31)
            if version is None:
                raise GatewayRequestError("Missing version for delete_version action")
            r = await b.call(
                b.schemas.DeleteSchemaVersion,
                spb.DeleteSchemaVersionRequest(subject=subject, version=version),
                token=token,
            )
        else:
            raise GatewayRequestError(f"unsupported action {action[:40]!r}: use set_compatibility or delete_version")
        return {"success": r.success, "message": "ok" if r.success else (r.message or "not_ok")}
