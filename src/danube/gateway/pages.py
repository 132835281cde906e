"""The GET endpoints: Danube's gateway JSON (compatibility modes upper-case, as the broker's ListSubjects
and DescribeTopic spell them), built from admin gRPC calls and the brokers' metrics.

Field names follow Danube's gateway (and the fields Danube's Admin UI reads); fields this project adds
(storage, backlog, partitioning, balance, rebalancing history) are extra keys the UI ignores.  Partial
failures do not fail a page: they land in its ``errors`` list, as in Danube.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

from google.protobuf.json_format import MessageToDict

from danube.errors import DanubeError, InvalidArgumentError, NotFoundError
from danube.gateway.backend import AdminBackend, pb, spb
from danube.gateway.metrics import MetricsHub, clamp_range, metrics_page_url, parse_step, quantile
from danube.server import failure_policy_wire

SCHEMA_FIELDS = ("schema_subject", "schema_id", "schema_version", "schema_type", "compatibility_mode")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _dict(message) -> dict:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def _identity(b) -> dict:
    return {
        "broker_id": b.broker_id,
        "broker_addr": b.broker_addr,
        "broker_role": b.broker_role,
        "broker_status": b.broker_status,
    }


class Pages:
    def __init__(self, backend: AdminBackend, metrics: MetricsHub) -> None:
        self.backend = backend
        self.metrics = metrics

    # ------------------------------------------------------------ metrics targets

    def metric_targets(self, brokers) -> dict[str, str]:
        targets = {b.broker_id: metrics_page_url(b.metrics_addr) for b in brokers if b.metrics_addr}
        for i, url in enumerate(self.metrics.cfg.metrics_urls):
            targets.setdefault(f"metrics-url-{i}", metrics_page_url(url))
        return targets

    def _mini(self, info) -> dict:
        t = self.metrics.topic(info.name)
        return {
            "name": info.name,
            "delivery": info.delivery,
            "producers_connected": int(t.producers) if t else 0,
            "consumers_connected": int(t.consumers) if t else 0,
            "subscriptions": len(t.subscriptions) if t else 0,
            "backlog": int(t.backlog) if t else 0,
            "msg_in_total": int(t.msg_in) if t else 0,
        }

    # ------------------------------------------------------------ pages

    async def health(self) -> dict:
        try:
            await self.backend.leader()
            reachable = True
        except DanubeError:
            reachable = False
        return {"status": "ok", "leader_reachable": reachable}

    async def cluster(self) -> dict:
        brokers = await self.backend.list_brokers()
        errors: list[str] = []

        async def topics_of(b):
            try:
                return await self.backend.broker_topics(b.broker_id)
            except DanubeError as exc:
                errors.append(f"list_broker_topics failed for {b.broker_id}: {exc}")
                return []

        lists = await asyncio.gather(*(topics_of(b) for b in brokers))
        balance = await self._balance(errors)
        loads = {x["broker_id"]: x for x in (balance or {}).get("brokers", [])}
        out = []
        totals = {
            "broker_count": len(brokers),
            "topics_total": 0,
            "rpc_total": 0,
            "rpc_errors_total": 0,
            "active_connections": 0,
        }
        for b, topics in zip(brokers, lists):
            sample = self.metrics.latest.get(b.broker_id)
            conns = sample.totals()["active_connections"] if sample else 0
            stats = {
                "topics_owned": len(topics),
                "active_connections": conns,
                **self._rpc_stats(b.broker_id, sample),
            }
            totals["topics_total"] += len(topics)
            totals["active_connections"] += conns
            totals["rpc_total"] += stats["rpc_total"]
            totals["rpc_errors_total"] += stats["rpc_errors_total"]
            out.append(
                {
                    **_identity(b),
                    "admin_addr": b.admin_addr,
                    "metrics_addr": b.metrics_addr,
                    "stats": stats,
                    "load": loads.get(b.broker_id, {}).get("load"),
                    "is_leader": b.broker_role == "Cluster_Leader",
                }
            )
        errors += self.metrics.errors()
        return {"timestamp": now_iso(), "brokers": out, "totals": totals, "balance": balance, "errors": errors}

    def _rpc_stats(self, broker_id: str, sample) -> dict:
        """Calls answered by a broker (its ``danube_broker_rpc_total``): all, refused or failed, and
        the server's own failures, Danube's ``errors_5xx_total``."""
        return {
            "rpc_total": int(sample.rpc_total) if sample else 0,
            "rpc_rate_1m": self.metrics.rpc_rate(broker_id),
            "rpc_errors_total": int(sample.rpc_errors) if sample else 0,
            "errors_5xx_total": int(sample.rpc_server_errors) if sample else 0,
        }

    async def _balance(self, errors: list[str] | None = None) -> dict | None:
        try:
            resp = await self.backend.call(self.backend.brokers.GetClusterBalance, pb.ClusterBalanceRequest())
        except DanubeError as exc:
            code = getattr(exc, "grpc_code", None)
            if errors is not None and code is not None and code.name != "UNIMPLEMENTED":
                errors.append(f"cluster balance: {exc}")
            return None
        over, under = set(resp.overloaded), set(resp.underloaded)
        return {
            "coefficient_of_variation": resp.coefficient_of_variation,
            "mean_load": resp.mean_load,
            "max_load": resp.max_load,
            "min_load": resp.min_load,
            "std_deviation": resp.std_deviation,
            "broker_count": resp.active_brokers or len(resp.brokers),
            "assignment_strategy": resp.strategy,
            "cv_threshold": resp.cv_threshold,
            "brokers": [
                {
                    "broker_id": x.broker_id,
                    "load": x.load,
                    "topic_count": x.topic_count,
                    "is_overloaded": x.broker_id in over,
                    "is_underloaded": x.broker_id in under,
                }
                for x in resp.brokers
            ],
        }

    async def balance(self) -> dict:
        resp = await self._balance()
        if resp is None:
            raise NotFoundError("this broker reports no cluster balance (standalone broker)")
        return resp

    async def rebalancing_history(self, limit: int = 100) -> dict:
        resp = await self.backend.call(
            self.backend.brokers.GetRebalancingHistory, pb.RebalancingHistoryRequest(limit=limit)
        )
        return {"timestamp": now_iso(), "moves": [_dict(m) for m in resp.moves]}

    async def topics(self) -> dict:
        brokers = await self.backend.list_brokers()
        errors: list[str] = []

        async def one(b):
            try:
                return [self._mini(t) for t in await self.backend.broker_topics(b.broker_id)]
            except DanubeError as exc:
                errors.append(f"topics fetch failed for broker {b.broker_id}: {exc}")
                return []

        lists = await asyncio.gather(*(one(b) for b in brokers))
        return {
            "timestamp": now_iso(),
            "errors": errors + self.metrics.errors(),
            "brokers": [{"broker": _identity(b), "topics": t} for b, t in zip(brokers, lists)],
        }

    async def namespaces(self) -> dict:
        names = await self.backend.namespaces_list()
        errors: list[str] = []

        async def one(ns):
            try:
                topics = [t.name for t in await self.backend.namespace_topics(ns)]
            except DanubeError as exc:
                errors.append(f"list_topics failed for {ns}: {exc}")
                topics = []
            try:
                policies = (
                    await self.backend.call(self.backend.namespaces.GetNamespacePolicies, pb.NamespaceRequest(name=ns))
                ).policies
            except DanubeError as exc:
                errors.append(f"get_namespace_policies failed for {ns}: {exc}")
                policies = ""
            return {"name": ns, "topics": topics, "policies": policies}

        out = await asyncio.gather(*(one(ns) for ns in names))
        return {"timestamp": now_iso(), "namespaces": list(out), "errors": errors}

    async def broker(self, broker_id: str) -> dict:
        brokers = await self.backend.list_brokers()
        found = [b for b in brokers if b.broker_id == broker_id]
        if not found:
            raise NotFoundError("unknown broker")
        b = found[0]
        errors: list[str] = []
        try:
            infos = await self.backend.broker_topics(broker_id)
        except DanubeError as exc:
            errors.append(f"list_broker_topics failed: {exc}")
            infos = []
        sample = self.metrics.latest.get(broker_id)
        totals = sample.totals() if sample else {}
        if sample and sample.error:
            errors.append(f"metrics scrape failed: {sample.error}")
        return {
            "timestamp": now_iso(),
            "broker": {**_identity(b), "admin_addr": b.admin_addr},
            "metrics": {
                **self._rpc_stats(broker_id, sample),
                "topics_owned": len(infos),
                "inbound_bytes_total": int(totals.get("bytes_in_total", 0)),
                "outbound_bytes_total": int(totals.get("bytes_out_total", 0)),
                "active_connections": totals.get("active_connections", 0),
                "wal_sync_rounds_total": int(sample.wal_sync_rounds) if sample else 0,
                "wal_sync_round_latency_ms_p95": quantile(sample.wal_round_buckets, 0.95) if sample else 0.0,
                # the fields Danube's Admin UI reads on its broker page
                "producers_connected": int(sum(t.producers for t in sample.topics.values())) if sample else 0,
                "consumers_connected": int(sum(t.consumers for t in sample.topics.values())) if sample else 0,
            },
            "topics": [self._mini(t) for t in infos],
            "errors": errors,
        }

    async def topic(self, name: str) -> dict:
        b = self.backend
        try:
            desc, subs = await asyncio.gather(
                b.call(b.topics.DescribeTopic, pb.DescribeTopicRequest(name=name)),
                b.call(b.topics.ListSubscriptions, pb.TopicRequest(name=name)),
            )
        except NotFoundError as missing:
            return await self._partitioned(name, missing)  # the base name of a partitioned topic is no topic itself
        errors: list[str] = []
        sample = self.metrics.topic(name)
        subscriptions = []
        for sub in dict.fromkeys(subs.subscriptions):
            policy, sub_type = None, "Exclusive"
            try:
                r = await b.call(
                    b.topics.GetSubscriptionFailurePolicy,
                    pb.GetSubscriptionFailurePolicyRequest(topic=name, subscription=sub),
                )
                if r.HasField("failure_policy"):
                    policy = failure_policy_wire.to_json(r.failure_policy)
                sub_type = failure_policy_wire.SUB_TYPE_NAMES.get(r.subscription_type, "Exclusive")
            except DanubeError as exc:
                errors.append(f"failure policy of {sub}: {exc}")
            live = (sample.subscriptions.get(sub) if sample else None) or {}
            subscriptions.append(
                {
                    "name": sub,
                    "subscription_type": sub_type,
                    "failure_policy": policy,
                    "backlog": live.get("backlog", 0),
                    "unacked": live.get("unacked", 0),
                }
            )
        partitioning = None
        try:
            partitioning = _dict(await b.call(b.topics.DescribePartitioning, pb.TopicRequest(name=name)))
        except DanubeError:
            pass  # not a partitioned topic
        topic = {
            **{key: (getattr(desc, key) if desc.HasField(key) else None) for key in SCHEMA_FIELDS},
            "name": desc.name,
            "broker_id": desc.broker_id,
            "delivery": desc.delivery,
            "subscriptions": subscriptions,
            "storage": _dict(desc.storage) if desc.HasField("storage") else None,
            "partitioning": partitioning,
        }
        if sample is None:
            errors.append(f"no metrics for {name} yet (not loaded, or its broker's metrics port not scraped)")
        s = sample
        pub, disp = self.metrics.rates(name)
        reliable = None
        if s is not None and s.wal:
            reliable = {
                "wal_append_total": s.wal.get("next_offset", 0),
                "wal_append_bytes_total": 0,
                "wal_flush_total": int(s.wal_flush_total),
                "wal_flush_latency_ms_p50": quantile(s.wal_flush_buckets, 0.5),
                "wal_flush_latency_ms_p95": quantile(s.wal_flush_buckets, 0.95),
                "wal_flush_latency_ms_p99": quantile(s.wal_flush_buckets, 0.99),
                "cloud_upload_bytes_total": 0,
                "cloud_upload_objects_total": 0,
                **s.wal,
            }
        metrics = {
            "core": {
                "msg_in_total": int(s.msg_in) if s else 0,
                "msg_out_total": int(s.msg_out) if s else 0,
                "bytes_in_total": int(s.bytes_in) if s else 0,
                "bytes_out_total": int(s.bytes_out) if s else 0,
            },
            "active": {
                "producers": int(s.producers) if s else 0,
                "consumers": int(s.consumers) if s else 0,
                "subscriptions": len(subscriptions),
            },
            "rates": {"publish_rate_1m": pub, "dispatch_rate_1m": disp},
            "quality": {"send_ok_total": int(s.msg_in) if s else 0, "send_error_total": 0, "send_error_by_code": []},
            "latency_size": {
                "send_latency_ms_p50": quantile(s.latency_buckets, 0.5) if s else 0.0,
                "send_latency_ms_p95": quantile(s.latency_buckets, 0.95) if s else 0.0,
                "send_latency_ms_p99": quantile(s.latency_buckets, 0.99) if s else 0.0,
                "msg_size_bytes_avg": (s.bytes_in / s.msg_in) if s and s.msg_in else 0.0,
            },
            "reliable": reliable,
            # the fields Danube's Admin UI reads on its topic page
            "msg_in_total": int(s.msg_in) if s else 0,
            "msg_out_total": int(s.msg_out) if s else 0,
            "msg_backlog": int(s.backlog) if s else 0,
            "storage_bytes": int(desc.storage.segment_bytes) if desc.HasField("storage") else 0,
            "producers": int(s.producers) if s else 0,
            "consumers": int(s.consumers) if s else 0,
            "publish_rate_1m": pub,
            "dispatch_rate_1m": disp,
        }
        return {"timestamp": now_iso(), "topic": topic, "metrics": metrics, "errors": errors}

    async def _partitioned(self, name: str, missing: NotFoundError) -> dict:
        """A partitioned topic's base name: its partitioning and its partitions' summed figures."""
        b = self.backend
        try:
            part = await b.call(b.topics.DescribePartitioning, pb.TopicRequest(name=name))
        except DanubeError:
            raise missing from None  # no partitioned topic either: the broker's own NOT_FOUND
        names = [f"{name}-part-{i}" for i in range(part.partitions)]
        samples = [s for s in (self.metrics.topic(n) for n in names) if s is not None]

        def total(attr: str) -> int:
            return int(sum(getattr(s, attr) for s in samples))

        topic = {
            "name": name,
            "broker_id": None,
            "delivery": None,
            **dict.fromkeys(SCHEMA_FIELDS),
            "subscriptions": [],
            "storage": None,
            "partitioning": _dict(part),
            "partitions": names,
        }
        metrics = {
            "core": {
                "msg_in_total": total("msg_in"),
                "msg_out_total": total("msg_out"),
                "bytes_in_total": total("bytes_in"),
                "bytes_out_total": total("bytes_out"),
            },
            "active": {"producers": total("producers"), "consumers": total("consumers"), "subscriptions": 0},
            "rates": {"publish_rate_1m": 0.0, "dispatch_rate_1m": 0.0},
            "quality": {"send_ok_total": total("msg_in"), "send_error_total": 0, "send_error_by_code": []},
            "latency_size": {
                "send_latency_ms_p50": 0.0,
                "send_latency_ms_p95": 0.0,
                "send_latency_ms_p99": 0.0,
                "msg_size_bytes_avg": 0.0,
            },
            "reliable": None,
            "msg_backlog": total("backlog"),
        }
        return {
            "timestamp": now_iso(),
            "topic": topic,
            "metrics": metrics,
            "errors": ["a partitioned topic: figures are its partitions' sums; open a partition for details"],
        }

    async def series(self, name: str, query: dict) -> dict:
        def number(key):
            text = query.get(key)
            if text in (None, ""):
                return None
            try:
                return float(text)
            except ValueError:
                raise InvalidArgumentError(f"{key} must be unix seconds, got {text[:20]!r}") from None

        step = parse_step(query.get("step"))
        start, end = clamp_range(number("from"), number("to"), step, time.time())
        if self.metrics.cfg.prometheus_url:
            series, errors = await self.metrics.prometheus_series(name, start, end, step)
            return {"series": series, "errors": errors, "source": "prometheus"}
        data = self.metrics.history.series(name, start, end, step)
        return {
            "series": [{"name": k, "labels": None, "points": v} for k, v in data.items()],
            "errors": [],
            "source": "embedded",
        }

    # ------------------------------------------------------------ schemas

    async def schemas(self) -> dict:
        b = self.backend
        resp = await b.call(b.schemas.ListSubjects, spb.ListSubjectsRequest())
        out = [
            {
                "subject": s.subject,
                "schema_type": s.schema_type,
                "latest_version": s.latest_version,
                "compatibility_mode": s.compatibility_mode,
                "schema_id": s.schema_id,
                "tags": list(s.tags),
            }
            for s in resp.subjects
        ]
        out.sort(key=lambda x: x["schema_id"])
        return {"timestamp": now_iso(), "subjects": out}

    async def schema(self, subject: str) -> dict:
        b = self.backend
        latest, versions = await asyncio.gather(
            b.call(b.schemas.GetLatestSchema, spb.GetLatestSchemaRequest(subject=subject)),
            b.call(b.schemas.ListVersions, spb.ListVersionsRequest(subject=subject)),
        )
        try:
            definition = bytes(latest.schema_definition).decode("utf-8")
        except UnicodeDecodeError:
            definition = "binary schema definition"
        # GetLatestSchema answers the registry's lower-case mode; ListSubjects and DescribeTopic upper case
        mode = latest.compatibility_mode.upper()
        detail = {
            "schema_id": latest.schema_id,
            "version": latest.version,
            "subject": latest.subject,
            "schema_type": latest.schema_type,
            "schema_definition": definition,
            "description": latest.description,
            "created_at": latest.created_at,
            "created_by": latest.created_by,
            "tags": list(latest.tags),
            "fingerprint": latest.fingerprint,
            "compatibility_mode": mode,
        }
        return {
            "timestamp": now_iso(),
            "subject": subject,
            "schema_type": latest.schema_type,
            "compatibility_mode": mode,
            "latest": detail,
            "versions": [
                {
                    "version": v.version,
                    "created_at": v.created_at,
                    "created_by": v.created_by,
                    "description": v.description,
                    "fingerprint": v.fingerprint,
                    "schema_id": v.schema_id,
                }
                for v in versions.versions
            ],
        }
